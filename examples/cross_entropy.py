"""Cross-entropy forward: loss[r] = logsumexp(logits[r, :]) - logits[r, target[r]], for any vocabulary size.

Large vocabularies: one program per row streams the row in BLOCK-wide chunks with an online logsumexp (a
running maximum, the sum rescaled when it grows), so the logits are read exactly once. Up to 8192: ROWS rows
per program held as in examples/_rows.py, the target's logit picked by a masked sum (no gather). Rows whose target
is `ignore_index` get a loss of 0, as in torch. The logsumexp is returned too (what a backward pass needs).

    python examples/cross_entropy.py     # compile for sm_90a without a GPU; check against torch and time with one
"""
import torch
from _rows import load_row, mapping as rows_mapping, row_max, row_sum

import mgjit


@mgjit.kernel
def cross_entropy_kernel(logits, target, loss, lse, ignore_index, BLOCK: mgjit.constexpr):
    row = mgjit.program_id(0)
    n = logits.shape[1]
    m = -float("inf")
    s = 0.0
    for c0 in range(0, n, BLOCK):
        v = logits[row, mgjit.ds(c0, BLOCK)].astype(mgjit.float32)
        v = mgjit.where(c0 + mgjit.arange(BLOCK) < n, v, -float("inf"))
        m_new = mgjit.maximum(m, v.max())
        s = s * mgjit.exp(m - m_new) + mgjit.exp(v - m_new).sum()
        m = m_new
    row_lse = m + mgjit.log(s)
    t = target[row]
    picked = logits[row, t].astype(mgjit.float32)
    lse[row] = row_lse
    loss[row] = mgjit.where(t == ignore_index, 0.0, row_lse - picked)


@mgjit.kernel
def cross_entropy_rows(logits, target, loss, lse, ignore_index, ROWS: mgjit.constexpr, PARTS: mgjit.constexpr):
    row0 = mgjit.program_id(0) * ROWS
    rows = mgjit.ds(row0, ROWS)
    v = load_row(logits, rows, PARTS, -float("inf"))
    m = row_max(v)
    t = target[rows]
    e = ()
    hits = ()
    c0 = 0
    for p in mgjit.static_range(len(PARTS)):
        e = e + (mgjit.exp(v[p] - m[:, None]),)
        hits = hits + (mgjit.where(c0 + mgjit.arange(PARTS[p])[None, :] == t[:, None], v[p], 0.0),)
        c0 += PARTS[p]
    row_lse = m + mgjit.log(row_sum(e))
    lse[rows] = row_lse
    loss[rows] = mgjit.where(t == ignore_index, 0.0, row_lse - row_sum(hits))


def block_for(n: int) -> int:
    """The chunk width: the row rounded up to a power of two, at most 8192 (64 f32 per thread)."""
    return min(8192, 1 << max(n - 1, 0).bit_length())


def mapping(n: int) -> tuple[str, dict]:
    """Rows that fit in registers go several to a program (examples/_rows.py); longer ones stream."""
    kind, cfg = rows_mapping(n)
    return ("rows", cfg) if kind == "rows" else ("stream", {"BLOCK": block_for(n)})


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row losses (reduction='none') and logsumexps of torch.nn.functional.cross_entropy(logits, target)."""
    assert logits.ndim == 2 and target.shape == (logits.shape[0],)
    rows = logits.shape[0]
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device) if out is None else out
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        kind, cfg = mapping(logits.shape[1])
        if kind == "rows":
            cross_entropy_rows[(-(-rows // cfg["ROWS"]),)](logits, target, loss, lse, ignore_index, **cfg)
        else:
            cross_entropy_kernel[(rows,)](logits, target, loss, lse, ignore_index, **cfg)
    return loss, lse


# ---- what the harness needs

def setup(device):
    logits = torch.randn(4096, 32000, device=device, dtype=torch.bfloat16) * 4
    target = torch.randint(0, 32000, (4096,), device=device)
    if device != "meta":
        target[::97] = -100
    return (logits, target), torch.empty(4096, device=device, dtype=torch.float32)


def compile(logits, labels, out, target):
    kind, cfg = mapping(logits.shape[1])
    kernel = cross_entropy_rows if kind == "rows" else cross_entropy_kernel
    return kernel.compile(logits, labels, out, out, -100, **cfg, target=target)


def run(logits, labels, out):
    cross_entropy(logits, labels, out=out)


def reference(logits, target):
    return torch.nn.functional.cross_entropy(logits.float(), target, reduction="none", ignore_index=-100)


if __name__ == "__main__":
    from _harness import main
    main(name="cross_entropy", setup=setup, compile=compile, run=run, reference=reference, rtol=1e-3, atol=1e-3)

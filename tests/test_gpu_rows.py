"""The row kernels of examples/ on awkward shapes on the GPU: the wrappers as users call them (the mapping the
autotuner picks), every candidate mapping forced (the autotuner may pick any), ragged and odd lengths, rows
that start anywhere in a 16-byte chunk, every float dtype, strided rows, empty batches; against torch on fresh
random inputs with the outputs poisoned first."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import _rows  # noqa: E402
import cross_entropy as ce  # noqa: E402
import fused_elementwise as fe  # noqa: E402
import layernorm as ln  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402

pytestmark = pytest.mark.gpu

LENGTHS = [1, 3, 17, 127, 128, 1000, 4097, 5000, 8192, 8193, 32000, 100003, 262144]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rel(out, ref) -> float:
    assert torch.isfinite(out).all(), "an output element was not written (NaN poison left) or overflowed"
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def tol(dtype, n) -> float:
    """Long f32 sums round more (the sums' order differs from torch's)."""
    return TOL[dtype] * 2 * max(1.0, n / 8192) ** 0.5


def rows_for(n: int) -> int:
    return max(3, min(333, (1 << 22) // n))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", LENGTHS)
def test_softmax(n, dtype):
    x = torch.randn(rows_for(n), n, device="cuda", dtype=dtype) * 3
    out = torch.full_like(x, float("nan"))
    sm.softmax(x, out)
    assert rel(out, torch.softmax(x.double(), 1)) < tol(dtype, n)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", LENGTHS)
def test_rmsnorm_and_layernorm(n, dtype):
    x = torch.randn(rows_for(n), n, device="cuda", dtype=dtype) + 0.3
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    out = torch.full_like(x, float("nan"))
    rms.rmsnorm(x, w, 1e-6, out)
    assert rel(out, torch.nn.functional.rms_norm(x.double(), (n,), w.double(), 1e-6)) < tol(dtype, n)
    out.fill_(float("nan"))
    ln.layernorm(x, w, b, 1e-5, out)
    assert rel(out, torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)) < tol(dtype, n)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [2, 100, 4097, 32000, 50257, 128256, 262144])
def test_cross_entropy(n, dtype):
    m = rows_for(n)
    logits = torch.randn(m, n, device="cuda", dtype=dtype) * 4
    target = torch.randint(0, n, (m,), device="cuda")
    target[::5] = -100
    loss = torch.full((m,), float("nan"), device="cuda")
    got, lse = ce.cross_entropy(logits, target, out=loss)
    ref = torch.nn.functional.cross_entropy(logits.double(), target, reduction="none", ignore_index=-100)
    assert rel(got, ref) < 1e-4 * max(1.0, n / 8192) ** 0.5
    assert rel(lse, torch.logsumexp(logits.double(), 1)) < 1e-5 * max(1.0, n / 8192) ** 0.5
    loss.fill_(float("nan"))  # the losses alone: mappings that write no logsumexp, tuned apart
    assert ce.cross_entropy(logits, target, out=loss, return_lse=False) is loss
    assert rel(loss, ref) < 1e-4 * max(1.0, n / 8192) ** 0.5


@pytest.mark.parametrize("n", [3, 300, 4097, 20000, 50257])
def test_cross_entropy_near_zero(n):
    """Targets that dominate their rows (logits of 0.75 to 100 over the rest): every loss within 1e-6 of torch's
    (a lg2.approx's error), none negative, on every mapping (the exps' shift rounds: `shifted_loss`)."""
    m = 40
    top = torch.arange(1, m + 1, device="cuda", dtype=torch.float32) * 2.5 + 0.5
    x = (top[:, None] - 40.0 - torch.arange(n, device="cuda") % 300).to(torch.bfloat16)
    target = torch.randint(0, n, (m,), device="cuda")
    x[torch.arange(m, device="cuda"), target] = top.to(torch.bfloat16)
    want = torch.nn.functional.cross_entropy(x.double(), target, reduction="none")
    for config in ce.mapping(n, 2):
        loss, lse = (torch.full((m,), float("nan"), device="cuda") for _ in range(2))
        ce.run_mapping(config, x, target, loss, lse)
        assert (loss >= 0).all() and (loss.double() - want).abs().max().item() < 1e-6, config


# Each candidate mapping forced: rows per program (short rows also in two arrays: 33 as 32 + 1, 150 as 128 + 32,
# 260 as 256 + 4; or three: 50 as 32 + 16 + 8, 300 as 256 + 32 + 16, 1100 as 1024 + 64 + 16), rows wider than 2048
# columns four a program (a row a warp), two warpgroups, segments over clusters of several shapes; aligned rows of
# two parts of different widths (264 as 256 + 128, 520, 1032), the narrower loaded to reduce where the wider's rows
# do (infer.Inference.place_reduced); rows of three or four parts also held in one padded array (777, 1800).
FORCED = [(1, torch.bfloat16), (3, torch.float16), (9, torch.bfloat16), (33, torch.bfloat16), (50, torch.float32),
          (77, torch.bfloat16), (150, torch.float16), (260, torch.bfloat16), (264, torch.bfloat16),
          (300, torch.bfloat16), (520, torch.float16), (777, torch.float16), (1032, torch.bfloat16),
          (1100, torch.float16), (1800, torch.bfloat16), (2304, torch.bfloat16), (3001, torch.float32),
          (4097, torch.bfloat16), (5000, torch.float16), (9000, torch.float32), (32000, torch.bfloat16),
          (100003, torch.float32), (262144, torch.bfloat16)]


@pytest.mark.parametrize("n,dtype", FORCED, ids=str)
def test_every_candidate_mapping(n, dtype):
    m = 37
    x = torch.randn(m, n, device="cuda", dtype=dtype) * 2
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    target = torch.randint(0, n, (m,), device="cuda")
    xd = x.double()
    for config in _rows.candidates(n):
        opts, grid = config.launch_kwargs(), _rows.grid(m, config, x.device)
        out = torch.full_like(x, float("nan"))
        sm.softmax_kernel[grid](x, out, x, out, **opts)
        assert rel(out, torch.softmax(xd, 1)) < tol(dtype, n), config
        out.fill_(float("nan"))
        ln.layernorm_rows[grid](x, w, b, out, x, out, x, x, eps=1e-5, **opts)
        assert rel(out, torch.nn.functional.layer_norm(xd, (n,), w.double(), b.double(), 1e-5)) < tol(dtype, n), config
        out.fill_(float("nan"))
        rms.rmsnorm_kernel[grid](x, w, out, x, out, x, eps=1e-6, **opts)
        assert rel(out, torch.nn.functional.rms_norm(xd, (n,), w.double(), 1e-6)) < tol(dtype, n), config
        loss, lse = (torch.full((m,), float("nan"), device="cuda") for _ in range(2))
        ce.cross_entropy_rows[grid](x, target, loss, lse, -100, x, loss, loss, **opts)
        assert rel(lse, torch.logsumexp(xd, 1)) < 1e-5 * max(1.0, n / 8192) ** 0.5, config


@pytest.mark.parametrize("n,dtype", [(1100, torch.float32), (1600, torch.bfloat16), (2304, torch.float16),
                                     (3000, torch.bfloat16)], ids=str)
def test_every_cross_entropy_mapping(n, dtype):
    """Cross-entropy's own twins beside the shared mappings (targets' logits gathered first, EARLY; one row a program
    at FULL_OCC CTAs an SM) on 37 rows (the last program's rows partly past the end), every fifth target ignored,
    outputs poisoned."""
    m = 37
    logits = torch.randn(m, n, device="cuda", dtype=dtype) * 4
    target = torch.randint(0, n, (m,), device="cuda")
    target[::5] = -100
    xd = logits.double()
    ref = torch.nn.functional.cross_entropy(xd, target, reduction="none", ignore_index=-100)
    configs = ce.mapping(n, logits.element_size())
    assert any(c.kwargs["EARLY"] for c in configs) and any(c.kwargs["OCC"] == ce.FULL_OCC for c in configs)
    for config in configs:
        loss, lse = (torch.full((m,), float("nan"), device="cuda") for _ in range(2))
        ce.run_mapping(config, logits, target, loss, lse)
        assert rel(loss, ref) < 1e-4, config
        assert rel(lse, torch.logsumexp(xd, 1)) < 1e-5, config


@pytest.mark.parametrize("n,dtype", [(1, torch.bfloat16), (5, torch.float16), (9, torch.bfloat16),
                                     (33, torch.float16), (77, torch.bfloat16), (255, torch.float16),
                                     (511, torch.float32), (1023, torch.bfloat16)], ids=str)
def test_every_staged_mapping(n, dtype):
    """Softmax's, RMSNorm's and layernorm's mappings with staged stores (_rows.staging), persistent ones too, on
    333 rows, or 2500 where programs hold 1024 (_rows.MAX_ROWS), the last program's rows partly past the end,
    against torch, outputs poisoned."""
    m = 2500 if n < 8 else 333
    x = torch.randn(m, n, device="cuda", dtype=dtype) * 2
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    xd = x.double()
    staged = [c for c in sm.mapping(n) if c.kwargs.get("STAGED")]
    assert staged
    for config in staged:
        out = torch.full_like(x, float("nan"))
        sm.softmax_kernel[_rows.grid(m, config, x.device)](x, out, x, out, **config.launch_kwargs())
        assert rel(out, torch.softmax(xd, 1)) < tol(dtype, n), config
    for config in (c for c in rms.rmsnorm_mapping(n) if c.kwargs.get("STAGED")):
        out = torch.full_like(x, float("nan"))
        rms.rmsnorm_kernel[_rows.grid(m, config, x.device)](x, w, out, x, out, x, eps=1e-6, **config.launch_kwargs())
        assert rel(out, torch.nn.functional.rms_norm(xd, (n,), w.double(), 1e-6)) < tol(dtype, n), config
    for config in (c for c in ln.layernorm_mapping(n) if c.kwargs.get("STAGED")):
        out = torch.full_like(x, float("nan"))
        ln.layernorm_rows[_rows.grid(m, config, x.device)](x, w, b, out, x, out, x, x, eps=1e-5,
                                                            **config.launch_kwargs())
        ref = torch.nn.functional.layer_norm(xd, (n,), w.double(), b.double(), 1e-5)
        assert rel(out, ref) < tol(dtype, n), config


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [2500, 1000003])
def test_every_flat_mapping(m, dtype):
    """Softmax's, RMSNorm's and layernorm's flat mappings of rows of one column (examples/_rows_piped.py FLAT_ROWS
    rows a program as whole lines, the rows past the last whole line by the program holding them), against torch,
    outputs poisoned; and the wrappers over the same rows strided (held rows)."""
    from _rows_piped import piped_views
    x = torch.randn(m, 1, device="cuda", dtype=dtype) * 2
    w, b = torch.randn(1, device="cuda", dtype=dtype), torch.randn(1, device="cuda", dtype=dtype)
    xd, item = x.double(), x.element_size()
    out = torch.full_like(x, float("nan"))
    cases = [(sm.softmax_kernel, (x, out), (), {}, sm.mapping(1, None, item), torch.softmax(xd, 1)),
             (rms.rmsnorm_kernel, (x, w, out), (w,), {"eps": 1e-6}, rms.rmsnorm_mapping(1, None, item, (item,)),
              torch.nn.functional.rms_norm(xd, (1,), w.double(), 1e-6)),
             (ln.layernorm_rows, (x, w, b, out), (w, b), {"eps": 1e-5},
              ln.layernorm_mapping(1, None, item, (item,) * 2),
              torch.nn.functional.layer_norm(xd, (1,), w.double(), b.double(), 1e-5))]
    for kernel, args, weights, constexprs, configs, ref in cases:
        _, views = piped_views((x, out), weights)
        flat = [c for c in configs if c.kwargs["FLAT"]]
        assert len(flat) == 3
        for config in flat:
            out.fill_(float("nan"))
            kernel[_rows.grid(m, config, x.device)](*args, *views, **constexprs, **config.launch_kwargs())
            assert rel(out, ref) < TOL[dtype], (kernel.name, config)
    strided = torch.randn(m, 2, device="cuda", dtype=dtype)[:, :1]
    assert rel(sm.softmax(strided), torch.ones_like(strided)) < TOL[dtype]
    assert rel(ln.layernorm(strided, w, b), b.expand_as(strided)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (8192, 8191), (3, 5, 7), (1000, 4097), (333, 4101)])
def test_fused_elementwise(shape, dtype):
    x, y, z = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    out = torch.full_like(x, float("nan"))
    fe.fused(x, y, z, out)
    assert rel(out, fe.reference(x, y, z)) < TOL[dtype] * 2


@pytest.mark.parametrize("dim", [0, 1])
def test_softmax_over_any_dimension_and_norms_without_weights(dim):
    x = torch.randn(300, 4097, 3, device="cuda", dtype=torch.bfloat16) * 3
    out = torch.full_like(x, float("nan"))
    assert sm.softmax(x, out, dim=dim) is out and rel(out, torch.softmax(x.double(), dim)) < 2e-2
    x2 = x[..., 0]
    assert rel(ln.layernorm(x2, None, None), torch.nn.functional.layer_norm(x2.double(), (4097,))) < 2e-2
    assert rel(rms.rmsnorm(x2, None), torch.nn.functional.rms_norm(x2.double(), (4097,), None, 1e-6)) < 2e-2


def test_fused_elementwise_past_two_to_the_31_elements():
    """A contiguous range of 2**31 elements or more goes to the kernel in pieces (fe.FLAT_SPAN): sizes travel as
    32-bit ints, and it was refused at launch. Checked where the pieces meet and at the end (16 GiB on the GPU)."""
    n = 2 ** 31 + 4097
    x, y, z = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.full_like(x, float("nan"))
    fe.fused(x, y, z, out)
    for at in (0, fe.FLAT_SPAN - 5000, 2 * fe.FLAT_SPAN - 5000, n - 10000):
        window = slice(at, at + 10000)
        assert rel(out[window], fe.reference(x[window], y[window], z[window])) < 2e-2, at
    assert not out.isnan().any()


def test_fused_elementwise_on_strided_rows():
    base = torch.randn(3, 500, 4101, device="cuda", dtype=torch.bfloat16)
    x, y, z = base[0, :, 3:4100], base[1, :, 1:4098], base[2, :, :4097]  # rows misaligned, differently
    out = torch.full((500, 4097), float("nan"), device="cuda", dtype=torch.bfloat16)
    fe.fused(x, y, z, out)
    assert rel(out, fe.reference(x, y, z)) < 2e-2


@pytest.mark.parametrize("n", [4000, 8193, 40000])
def test_strided_rows_and_empty_batches(n):
    base = torch.randn(64, n + 1000, device="cuda", dtype=torch.bfloat16)
    x = base[:, 3:3 + n]  # rows n + 1000 elements apart, starting 6 bytes in: nothing is 16-byte aligned
    out = torch.full((64, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    sm.softmax(x, out)
    assert rel(out, torch.softmax(x.double(), 1)) < 2e-2
    out_view = torch.full((64, n + 7), float("nan"), device="cuda", dtype=torch.bfloat16)[:, 5:5 + n]
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    rms.rmsnorm(x, w, 1e-6, out_view)
    assert rel(out_view, torch.nn.functional.rms_norm(x.double(), (n,), w.double(), 1e-6)) < 2e-2
    assert sm.softmax(torch.empty(0, 100, device="cuda")).shape == (0, 100)
    assert rms.rmsnorm(torch.empty(0, 7, device="cuda"), torch.ones(7, device="cuda")).shape == (0, 7)
    assert ln.layernorm(torch.empty(0, 9000, device="cuda"), torch.ones(9000, device="cuda"),
                        torch.ones(9000, device="cuda")).shape == (0, 9000)
    loss, lse = ce.cross_entropy(torch.empty(0, 5, device="cuda"), torch.empty(0, dtype=torch.long, device="cuda"))
    assert loss.shape == lse.shape == (0,)


# Piped rows (examples/_rows_piped.py), softmax, cross-entropy, rmsnorm and layernorm: every candidate forced, over
# more rows than the programs' rings hold (each slot reused), rows starting anywhere in a line, and a tensor whose last
# line is partial (its last row's envelope patched from the tensor); up to the longest row one CTA pipes (16385).
PIPED = [(5000, torch.float16), (6001, torch.float32), (8193, torch.bfloat16), (12289, torch.bfloat16),
         (16385, torch.bfloat16)]


# Rows piped over clusters of 2 to 16 CTAs, the last segment shorter than the others where the lines allow (the norms
# too, each CTA with its segment of the weights stashed, read through windows that follow each row's start).
PIPED_CLUSTERS = [(16386, torch.float32, 1001), (20000, torch.float16, 1001), (32000, torch.bfloat16, 1001),
                  (50257, torch.bfloat16, 701), (65536, torch.float32, 301), (100000 - 7, torch.bfloat16, 301),
                  (128256, torch.bfloat16, 101), (150000, torch.bfloat16, 61), (150000, torch.float32, 61),
                  (200000, torch.float16, 61), (230000, torch.bfloat16, 61), (262144, torch.bfloat16, 61)]


@pytest.mark.parametrize("n,dtype,m", [(n, dtype, 3001) for n, dtype in PIPED] + PIPED_CLUSTERS, ids=str)
def test_every_piped_mapping(n, dtype, m):
    from _rows_piped import lines, weight_rows
    x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
    assert (m * n) % 256 or n % 256 == 0
    xd = x.double()
    target = torch.randint(0, n, (m,), device="cuda")
    target[::7] = -100
    ref_loss = torch.nn.functional.cross_entropy(xd, target, reduction="none", ignore_index=-100)
    configs = [c for c in sm.mapping(n, None, x.element_size()) if c.kwargs["PIPE"]]
    assert configs
    for config in configs:
        grid = _rows.grid(m, config, x.device)
        out = torch.full_like(x, float("nan"))
        sm.softmax_kernel[grid](x, out, lines(x), lines(out), **config.launch_kwargs())
        assert rel(out, torch.softmax(xd, 1)) < tol(dtype, n), config
    for config in ce.mapping(n, x.element_size()):
        if not config.kwargs["PIPE"]:
            continue
        loss, lse = (torch.full((m,), float("nan"), device="cuda") for _ in range(2))
        ce.run_mapping(config, x, target, loss, lse)
        assert rel(lse, torch.logsumexp(xd, 1)) < 1e-5 * max(1.0, n / 8192) ** 0.5, config
        assert rel(loss, ref_loss) < 1e-4 * max(1.0, n / 8192) ** 0.5, config
    w = torch.randn(n, device="cuda", dtype=dtype)
    ref = torch.nn.functional.rms_norm(xd, (n,), w.double(), 1e-6)
    for config in rms.rmsnorm_mapping(n, None, x.element_size(), (w.element_size(),)):
        if not config.kwargs["PIPE"]:
            continue
        out = torch.full_like(x, float("nan"))
        rms.rmsnorm_kernel[_rows.grid(m, config, x.device)](x, w, out, lines(x), lines(out), weight_rows(w), eps=1e-6,
                                                            **config.launch_kwargs())
        assert rel(out, ref) < tol(dtype, n), config
    b = torch.randn(n, device="cuda", dtype=dtype)
    # Deviations from a mean far from 0: the envelope's fill (the previous row's mean) must leave nothing in the
    # variance. Every third row near 0, the others 20 higher, every fifth 60 more: a row
    # far from its fill is read again. Row 4 holds a NaN, which must reach no other row.
    i = torch.arange(m, device="cuda")
    x = x + (20 * (i % 3 != 0) + 60 * (i % 5 == 0))[:, None]
    x[4, 3] = float("nan")
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    for config in ln.layernorm_mapping(n, None, x.element_size(), (w.element_size(),) * 2):
        if not config.kwargs["PIPE"]:
            continue
        out = torch.full_like(x, float("nan"))
        ln.layernorm_rows[_rows.grid(m, config, x.device)](x, w, b, out, lines(x), lines(out), weight_rows(w),
                                                           weight_rows(b), eps=1e-5, **config.launch_kwargs())
        assert out[4].isnan().all(), config
        assert rel(out[i != 4], ref[i != 4]) < tol(dtype, n), config


@pytest.mark.parametrize("n", [4095, 5003, 16385, 50257, 230000])
def test_norms_with_float32_weights_of_bf16_rows(n):
    """Norm weights kept in float32 beside bf16 rows (as models keep them): the wrappers, and every piped mapping
    forced (the weights stashed in float32, fewer slots fitting beside them), against torch in float64."""
    from _rows_piped import lines, weight_rows
    m = 301
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) + 0.3
    w, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    ref_rms = torch.nn.functional.rms_norm(x.double(), (n,), w.double(), 1e-6)
    ref_ln = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    out = torch.full_like(x, float("nan"))
    rms.rmsnorm(x, w, 1e-6, out)
    assert rel(out, ref_rms) < tol(x.dtype, n)
    out.fill_(float("nan"))
    ln.layernorm(x, w, b, 1e-5, out)
    assert rel(out, ref_ln) < tol(x.dtype, n)
    for config in rms.rmsnorm_mapping(n, None, 2, (4,)):
        if config.kwargs["PIPE"]:
            out.fill_(float("nan"))
            rms.rmsnorm_kernel[_rows.grid(m, config, x.device)](x, w, out, lines(x), lines(out), weight_rows(w),
                                                                eps=1e-6, **config.launch_kwargs())
            assert rel(out, ref_rms) < tol(x.dtype, n), config
    for config in ln.layernorm_mapping(n, None, 2, (4, 4)):
        if config.kwargs["PIPE"]:
            out.fill_(float("nan"))
            ln.layernorm_rows[_rows.grid(m, config, x.device)](x, w, b, out, lines(x), lines(out), weight_rows(w),
                                                               weight_rows(b), eps=1e-5, **config.launch_kwargs())
            assert rel(out, ref_ln) < tol(x.dtype, n), config


def test_in_place_softmax_is_not_tuned_on_its_own_output():
    x = torch.randn(300, 5000, device="cuda") * 3
    ref = torch.softmax(x.double(), 1)
    sm.softmax(x, x)
    assert rel(x, ref) < 1e-5


@pytest.mark.parametrize("n", [8193, 50257])
def test_a_tuned_shape_runs_in_place(n):
    """Once a shape is tuned, a call with out=x launches the tuned mapping (examples/_rows_launch.py, tuned_launch): piped
    rows over one CTA or a cluster, which read their neighbours' columns and drop them, must still give x's own
    rows."""
    x = torch.randn(200, n, device="cuda", dtype=torch.bfloat16) * 3 + 0.5
    w, b = torch.randn(n, device="cuda", dtype=x.dtype), torch.randn(n, device="cuda", dtype=x.dtype)
    for call, reference in ((lambda t, out: sm.softmax(t, out), lambda t: torch.softmax(t, 1)),
                            (lambda t, out: rms.rmsnorm(t, w, 1e-6, out),
                             lambda t: torch.nn.functional.rms_norm(t, (n,), w.double(), 1e-6)),
                            (lambda t, out: ln.layernorm(t, w, b, 1e-5, out),
                             lambda t: torch.nn.functional.layer_norm(t, (n,), w.double(), b.double(), 1e-5))):
        call(x, torch.empty_like(x))  # tunes the shape
        y = x.clone()
        call(y, y)
        assert rel(y, reference(x.double())) < tol(x.dtype, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_longer_than_a_cluster_stream(dtype):
    n = 300001
    x = torch.randn(5, n, device="cuda", dtype=dtype) * 3
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    out = torch.full_like(x, float("nan"))
    sm.softmax(x, out)
    assert rel(out, torch.softmax(x.double(), 1)) < tol(dtype, n)
    ln.layernorm(x, w, b, 1e-5, out)
    assert rel(out, torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)) < tol(dtype, n)


@pytest.mark.parametrize("n,dtype", [(77, torch.bfloat16), (4095, torch.bfloat16), (8191, torch.float16),
                                     (4097, torch.float32)], ids=str)
def test_persistent_norms(n, dtype):
    """The norms' persistent grids forced: more row groups than programs (each loops over two or three, the last
    program's partial), the weights read once per program into shared memory."""
    x = torch.randn(1, n, device="cuda", dtype=dtype)
    for index, mapping in ((0, rms.rmsnorm_mapping), (1, ln.layernorm_mapping)):
        for config in [c for c in mapping(n) if c.kwargs["PERSIST"]]:
            m = _rows.grid(1 << 30, config, x.device)[0] * config.kwargs["ROWS"] * 2 + 3
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 2 + 0.3
            w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
            out = torch.full_like(x, float("nan"))
            grid, opts = _rows.grid(m, config, x.device), config.launch_kwargs()
            if index == 0:
                rms.rmsnorm_kernel[grid](x, w, out, x, out, x, eps=1e-6, **opts)
                ref = torch.nn.functional.rms_norm(x.double(), (n,), w.double(), 1e-6)
            else:
                ln.layernorm_rows[grid](x, w, b, out, x, out, x, x, eps=1e-5, **opts)
                ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
            assert rel(out, ref) < tol(dtype, n), config


@pytest.mark.parametrize("n,dtype", [(1000, torch.float32), (5000, torch.float32), (2047, torch.bfloat16)], ids=str)
def test_layernorm_of_rows_far_from_zero(n, dtype):
    """Every held layernorm mapping forced on rows whose means lie far from 0 beside rows near it (held rows of
    examples/layernorm.py ONE_PASS_WIDTH columns or more take one pass where every mean of a program is near 0, and
    their deviations again where one is not): within a float32 mean's own rounding of torch."""
    m = 37
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    x[::3] += 1000.0
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    for config in [c for c in ln.layernorm_mapping(n) if not c.kwargs["BLOCK"] and not c.kwargs["PIPE"]]:
        out = torch.full_like(x, float("nan"))
        ln.layernorm_rows[_rows.grid(m, config, x.device)](x, w, b, out, x, out, x, x, eps=1e-5,
                                                          **config.launch_kwargs())
        assert rel(out, ref) < max(TOL[dtype], 2e-4), config

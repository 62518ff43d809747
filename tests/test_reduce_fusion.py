"""Row reductions combined before their butterflies (ops/reductions.py `_fuse_partials`): `a.sum(1) + b.sum(1)`
over arrays whose rows cross the same lanes and warps adds the two threads' partials first and crosses the lanes
and warps once (rows within a warp reduce apart, as before). Run from the sm_90a PTX on tests/ptx_sim.py against
torch, beside twins the fusion must leave alone: a result used twice, a combination in another block (a loop's
body), an array whose warps hold copies of its rows (their copies must not be added), and the PTX counts of
shuffles and barriers each pays."""
import sys
from pathlib import Path

import pytest
import torch

import mgjit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402

ROWS = 2


@mgjit.kernel
def row_stats(x, out, MODE: mgjit.constexpr):
    """out[:, 0] a row's sum, out[:, 1] its maximum, over columns 0-1535 of x held as a 1024- and a 512-wide array
    (each row over two warps); out[:, 2] and out[:, 3] per MODE."""
    rows = mgjit.ds(mgjit.program_id(0) * ROWS, ROWS)
    a = x[rows, mgjit.ds(0, 1024)]
    b = x[rows, mgjit.ds(1024, 512)]
    c = x[rows, mgjit.ds(1536, 8)]  # 8 columns: two lanes a row in every warp, another pattern than a's and b's
    s = a.sum(axis=1) + b.sum(axis=1)
    out[rows, 0] = s
    out[rows, 1] = mgjit.maximum(a.max(axis=1), b.max(axis=1))
    if MODE == "chain":  # three sums, the third of another lane pattern
        out[rows, 2] = a.sum(axis=1) + b.sum(axis=1) + c.sum(axis=1)
        out[rows, 3] = (a * a).sum(axis=1) + (b * b).sum(axis=1)  # fma chains' partials
    elif MODE == "twice":  # a's sum also stored: left whole
        sa = a.sum(axis=1)
        out[rows, 2] = sa + b.sum(axis=1)
        out[rows, 3] = sa
    elif MODE == "loop":  # combined in a loop's body, where the lanes would diverge from the sums' block
        sa = a.sum(axis=1)
        sb = b.sum(axis=1)
        acc = mgjit.zeros((ROWS,), mgjit.float32)
        for _ in range(2):
            acc = acc + (sa + sb)
        out[rows, 2] = acc
        out[rows, 3] = mgjit.minimum(a.min(axis=1), b.min(axis=1))


def reference(x: torch.Tensor, mode: str) -> torch.Tensor:
    a, b, c = x[:, :1024], x[:, 1024:1536], x[:, 1536:1544]
    ref = torch.full((x.shape[0], 4), float("nan"))
    ref[:, 0] = a.sum(1) + b.sum(1)
    ref[:, 1] = torch.maximum(a.max(1).values, b.max(1).values)
    if mode == "chain":
        ref[:, 2] = a.sum(1) + b.sum(1) + c.sum(1)
        ref[:, 3] = (a * a).sum(1) + (b * b).sum(1)
    elif mode == "twice":
        ref[:, 2] = a.sum(1) + b.sum(1)
        ref[:, 3] = a.sum(1)
    else:
        ref[:, 2] = 2 * (a.sum(1) + b.sum(1))
        ref[:, 3] = torch.minimum(a.min(1).values, b.min(1).values)
    return ref


def run_ptx(mode: str, x: torch.Tensor) -> tuple[torch.Tensor, str]:
    out = torch.full((x.shape[0], 4), float("nan"))
    compiled = row_stats.compile(x, out, MODE=mode, target="sm_90a")
    dev = ptx_sim.Device()
    for t in (x, out):
        dev.place(t)
    dev.run(compiled, (x.shape[0] // ROWS,), x, out)
    return dev.fetch(out), compiled.ptx


@pytest.mark.parametrize("mode", ["chain", "twice", "loop"])
def test_fused_row_reductions_match_torch(mode):
    x = torch.randn(2 * ROWS, 1600) * 3
    got, _ = run_ptx(mode, x)
    torch.testing.assert_close(got, reference(x, mode), rtol=1e-5, atol=1e-4)
    interpreted = torch.full((x.shape[0], 4), float("nan"))
    row_stats.interpret[(x.shape[0] // ROWS,)](x, interpreted, MODE=mode)
    torch.testing.assert_close(interpreted, reference(x, mode), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mode,shuffles,barriers", [("chain", (21, 8), 10), ("twice", (20, 8), 8),
                                                    ("loop", (25, 10), 10)])
def test_rows_of_two_arrays_cross_their_lanes_and_warps_once(mode, shuffles, barriers):
    """a and b lay each of the 2 rows over the 4 warps (a thread holds both rows), so a reduction is one butterfly
    over 5 lane bits whose first step halves the two rows (`_transposed_across_lanes`: 5 butterfly shuffles, then 2
    by index that bring each row's result back; 10 butterfly shuffles plainly) and one exchange between the warps
    (2 bar.syncs); a fused pair pays that once where two reductions paid it twice. "chain": the sums, the maxima,
    the chain's first two sums and the sums of squares fused (4 x (5 + 2) shuffles, 4 x 2 barriers), c's sum apart
    (its rows in every warp, over 2 lanes: 1 shuffle, no exchange) and moved into a's rows' layout through shared
    memory (2 barriers). "twice": the sums and maxima fused, a's stored sum whole and so b's beside it (4
    reductions). "loop": the sums, maxima and minima fused, the two sums the loop's body adds apart (5)."""
    _, ptx = run_ptx(mode, torch.randn(ROWS, 1600))
    assert (ptx.count("shfl.sync.bfly"), ptx.count("shfl.sync.idx")) == shuffles
    assert ptx.count("bar.sync") == barriers


@mgjit.kernel
def rows_in_warps(x, out):
    """Rows a warp holds whole (8 rows of 256 + 128 columns): their reductions stay apart (a fused one keeps the
    partials live longer for only shuffles saved: ops/reductions.py `_set_partial`)."""
    rows = mgjit.ds(mgjit.program_id(0) * 8, 8)
    out[rows] = x[rows, mgjit.ds(0, 256)].sum(axis=1) + x[rows, mgjit.ds(256, 128)].sum(axis=1)


def test_rows_within_warps_reduce_apart():
    x, out = torch.randn(8, 384), torch.full((8,), float("nan"))
    compiled = rows_in_warps.compile(x, out, target="sm_90a")
    assert compiled.ptx.count("shfl.sync.bfly") == 2 * 4 and "bar.sync" not in compiled.ptx  # 16 lanes a row
    dev = ptx_sim.Device()
    for t in (x, out):
        dev.place(t)
    dev.run(compiled, (1,), x, out)
    torch.testing.assert_close(dev.fetch(out), x.sum(1), rtol=1e-5, atol=1e-4)


@mgjit.kernel
def spread_rows(x, y, out):
    """A row of 1024 columns over the whole warpgroup (its sum crosses the warps) and a row of 16 columns that
    every warp holds a copy of (its copies must not be added): one exchange for the first, none for the second."""
    a = x[mgjit.ds(0, 1024)]
    b = x[mgjit.ds(1024, 512)]
    c = y[mgjit.ds(0, 16)]
    out[0] = a.sum() + b.sum()
    out[1] = a.sum() + c.sum()


def test_rows_over_warps_exchange_once_and_copies_stay_apart():
    x, y = torch.randn(1536), torch.randn(16)
    out = torch.full((2,), float("nan"))
    compiled = spread_rows.compile(x, y, out, target="sm_90a")
    dev = ptx_sim.Device()
    for t in (x, y, out):
        dev.place(t)
    dev.run(compiled, (1,), x, y, out)
    ref = torch.stack([x.sum(), x[:1024].sum() + y.sum()])
    torch.testing.assert_close(dev.fetch(out), ref, rtol=1e-5, atol=1e-4)
    # out[0]: one butterfly (5 shuffles) and one exchange (two barriers) for both arrays; out[1]: a's own (5, two),
    # c's rows over 4 lanes (2 shuffles) and no exchange. Each reduction apart: 17 shuffles, 6 barriers.
    assert compiled.ptx.count("shfl.sync.bfly") == 12 and compiled.ptx.count("bar.sync") == 4


@mgjit.kernel
def sums_of_squares(x, out, ROWS_HELD: mgjit.constexpr, COLS: mgjit.constexpr):
    rows = mgjit.ds(mgjit.program_id(0) * ROWS_HELD, ROWS_HELD)
    v = x[rows, mgjit.ds(0, COLS)]
    out[rows] = (v * v).sum(axis=1)


@pytest.mark.parametrize("rows,cols", [(128, 32), (256, 16), (512, 8), (1, 4096)])
def test_a_threads_fma_chains_are_shared_out_among_its_rows(rows, cols):
    """A sum of squares takes 8 fma chains a thread (ops/reductions.py PRODUCT_CHAINS), shared out among the rows
    it holds, as 8 multiplies and fmas for the rest of the 32 products a thread holds here, whatever its rows. Each
    row of a thread took up to 8 chains of its own before, a multiply and an add for each of its first 8 products
    (rows of 32 columns: 32 mul.rn.f32 and 36 add.rn.f32 in the PTX; now 8, 24 fma.rn.f32 and 12). The sums are
    torch's, from the PTX on the simulator."""
    x = torch.randn(2 * rows, cols)
    out = torch.full((2 * rows,), float("nan"))
    compiled = sums_of_squares.compile(x, out, ROWS_HELD=rows, COLS=cols, target="sm_90a")
    assert (compiled.ptx.count("mul.rn.f32"), compiled.ptx.count("fma.rn.f32")) == (8, 24)
    dev = ptx_sim.Device()
    dev.run(compiled, (2,), x, out)
    torch.testing.assert_close(dev.fetch(out), (x.double() ** 2).sum(1).float(), rtol=1e-5, atol=1e-5)

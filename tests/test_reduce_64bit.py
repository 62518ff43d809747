"""Reductions of float64 and int64 arrays (ops/reductions.py): shfl.sync moves 32-bit registers, so a 64-bit value
crosses lanes as its two halves (lower/emit.py `shfl`) and warps through 8-byte SMEM slots. Row reductions (over
lanes, transposed or plain, and over warps) and whole-array ones, run from their sm_90a PTX on tests/ptx_sim.py and
in the interpreter, against torch: maxima and minima exactly (NaN and infinities among the values), int64 sums
exactly (values past 2**32, so that a lost upper half shows, and sums that wrap), float64 sums to float64
rounding (a float32 accumulator would be 1e-7 off). Elementwise float64 maximum and minimum (lower/emit.py
`_f64_extremum`, which reductions combine with) exactly as torch's; of +0 and -0 either, as torch's own
maximum gives."""
import sys
from pathlib import Path

import pytest
import torch

import mgjit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402


@mgjit.kernel
def row_reductions(x, xi, sums, maxima, minima, isums, imaxima, total, itotal, ROWS: mgjit.constexpr,
                   W: mgjit.constexpr):
    rows = mgjit.ds(mgjit.program_id(0) * ROWS, ROWS)
    a = x[rows, mgjit.ds(0, W)]
    b = xi[rows, mgjit.ds(0, W)]
    sums[rows] = a.sum(axis=1)
    maxima[rows] = a.max(axis=1)
    minima[rows] = a.min(axis=1)
    isums[rows] = b.sum(axis=1)
    imaxima[rows] = b.max(axis=1)
    total[mgjit.program_id(0)] = mgjit.sum(mgjit.where(a == a, a, 0.0))
    itotal[mgjit.program_id(0)] = mgjit.min(b)


# (ROWS, W): float64 rows of W columns are W / 2 lanes of 16 bytes.
SHAPES = [(16, 64),    # 4 rows a thread over 32 lanes: the transposed butterfly (shfl.sync.idx)
          (2, 64),     # one row a thread
          (2, 2048),   # rows across the warps: the SMEM exchange
          (64, 8)]     # rows over 4 lanes


def _inputs(rows: int, width: int, programs: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(programs * rows, width, dtype=torch.float64) * 1e3 + 1.0
    x[1, 3] = float("nan")
    x[0, width - 1] = float("inf")
    x[programs * rows - 1, 0] = float("-inf")
    xi = torch.randint(-(1 << 40), 1 << 40, (programs * rows, width), dtype=torch.int64)
    xi[0, :] = (1 << 62) + torch.arange(width)  # a sum that wraps past 2**63
    return x, xi


def _expected(x: torch.Tensor, xi: torch.Tensor, programs: int) -> list[torch.Tensor]:
    finite = torch.where(x == x, x, torch.zeros_like(x))
    return [x.sum(1), x.max(1).values, x.min(1).values, xi.sum(1), xi.max(1).values,
            finite.reshape(programs, -1).sum(1), xi.reshape(programs, -1).min(1).values]


def _outputs(rows: int, programs: int, device: str = "cpu") -> list[torch.Tensor]:
    """row_reductions' outputs, poisoned."""
    f64 = dict(dtype=torch.float64, device=device)
    i64 = dict(dtype=torch.int64, device=device)
    return [torch.full((programs * rows,), float("nan"), **f64) for _ in range(3)] + [
        torch.full((programs * rows,), -7, **i64) for _ in range(2)] + [
        torch.full((programs,), float("nan"), **f64), torch.full((programs,), -7, **i64)]


def _check(got: list[torch.Tensor], x: torch.Tensor, xi: torch.Tensor, programs: int) -> None:
    sums, maxima, minima, isums, imaxima, total, itotal = got
    want = _expected(x, xi, programs)
    finite = x.isfinite().all(1)
    torch.testing.assert_close(sums[finite], want[0][finite], rtol=1e-13, atol=1e-9)
    assert torch.equal(sums.isnan(), want[0].isnan())
    torch.testing.assert_close(maxima, want[1], equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(minima, want[2], equal_nan=True, rtol=0, atol=0)
    assert torch.equal(isums, want[3]) and torch.equal(imaxima, want[4]) and torch.equal(itotal, want[6])
    assert torch.equal(total.isinf(), want[5].isinf())
    torch.testing.assert_close(total[~total.isinf()], want[5][~want[5].isinf()], rtol=1e-13, atol=1e-9,
                               equal_nan=True)


def _nan_rows(rows: int, width: int, programs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with a NaN each at a fresh random column (float64 maxima and minima combine a compare, a NaN test and
    one select, lower/emit.py `_f64_extremum`: a NaN must win from either side at every level), but for a row of
    infinities and one of zeros of both signs."""
    x, xi = _inputs(rows, width, programs)
    x[torch.arange(x.shape[0]), torch.randint(0, width, (x.shape[0],))] = float("nan")
    x[-1] = torch.where(torch.rand(width) < 0.5, float("inf"), float("-inf"))
    x[-2] = torch.where(torch.rand(width) < 0.5, 0.0, -0.0)
    return x, xi


@pytest.mark.parametrize("rows,width", SHAPES)
@pytest.mark.parametrize("inputs", [_inputs, _nan_rows])
def test_64_bit_reductions_over_lanes_and_warps(rows, width, inputs):
    programs = 3
    x, xi = inputs(rows, width, programs)
    outs = _outputs(rows, programs)
    compiled = row_reductions.compile(x, xi, *outs, ROWS=rows, W=width, target="sm_90a")
    dev = ptx_sim.Device()
    for t in (x, xi, *outs):
        dev.place(t)
    dev.run(compiled, (programs,), x, xi, *outs)
    interpreted = [torch.full_like(t, -3) for t in outs]
    row_reductions.interpret[(programs,)](x, xi, *interpreted, ROWS=rows, W=width)
    for got in ([dev.fetch(t) for t in outs], interpreted):
        _check(got, x, xi, programs)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,width", SHAPES)
@pytest.mark.parametrize("inputs", [_inputs, _nan_rows])
def test_64_bit_reductions_on_the_gpu(rows, width, inputs):
    programs = 3
    x, xi = inputs(rows, width, programs)
    outs = _outputs(rows, programs, "cuda")
    row_reductions[(programs,)](x.cuda(), xi.cuda(), *outs, ROWS=rows, W=width)
    _check([t.cpu() for t in outs], x, xi, programs)


@mgjit.kernel
def extrema(a, b, hi, lo, N: mgjit.constexpr):
    x, y = a[mgjit.ds(0, N)], b[mgjit.ds(0, N)]
    hi[mgjit.ds(0, N)] = mgjit.maximum(x, y)
    lo[mgjit.ds(0, N)] = mgjit.minimum(x, y)


def test_float64_maximum_and_minimum_as_torchs():
    """Every pair of NaN, +-inf, +-1 and +-0, from the sm_90a PTX and in the interpreter."""
    special = torch.tensor([float("nan"), -float("inf"), -1.0, -0.0, 0.0, 1.0, float("inf")], dtype=torch.float64)
    a, b = special.repeat_interleave(len(special)), special.repeat(len(special))
    a, b = torch.cat([a, torch.zeros(64 - len(a), dtype=torch.float64)]), torch.cat([b, torch.randn(64 - len(b))
                                                                                        .double()])
    want = [torch.maximum(a, b), torch.minimum(a, b)]
    outs = [torch.full_like(a, 7.0) for _ in range(2)]
    compiled = extrema.compile(a, b, *outs, N=64, target="sm_90a")
    dev = ptx_sim.Device()
    for t in (a, b, *outs):
        dev.place(t)
    dev.run(compiled, (1,), a, b, *outs)
    interpreted = [torch.full_like(a, 7.0) for _ in range(2)]
    extrema.interpret[(1,)](a, b, *interpreted, N=64)
    for got in ([dev.fetch(t) for t in outs], interpreted):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)

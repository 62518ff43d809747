"""Row reductions whose threads hold several rows, each row across several lanes (ops/reductions.py
`_transposed_across_lanes`): the butterfly's first steps halve the rows a thread holds (each lane keeps one of a
pair and sends the other), and each row's result comes back to every lane by a shuffle by index. Run from the
sm_90a PTX on tests/ptx_sim.py against torch for sums (float32 and int32), maxima and minima (with NaN and
infinities among the values), on shapes that take the transposed butterfly and on shapes that keep the plain one
(one row a thread, rows over two lanes, more rows a thread than MAX_TRANSPOSED_GROUPS)."""
import sys
from pathlib import Path

import pytest
import torch

import mgjit
from mgjit.ops.reduction_exchange import halvings as _halvings

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402


@mgjit.kernel
def row_reductions(x, xi, copy, sums, maxima, minima, isums, ROWS: mgjit.constexpr, W: mgjit.constexpr):
    """The rows are stored too (`copy`), as a row kernel stores them: so laid out with lanes along the rows (rows
    only reduced are held a row a thread: ops/gmem.py)."""
    rows = mgjit.ds(mgjit.program_id(0) * ROWS, ROWS)
    a = x[rows, mgjit.ds(0, W)]
    copy[rows, mgjit.ds(0, W)] = a
    sums[rows] = a.sum(axis=1)
    maxima[rows] = a.max(axis=1)
    minima[rows] = a.min(axis=1)
    isums[rows] = xi[rows, mgjit.ds(0, W)].sum(axis=1)


# (ROWS, W, transposed): float32 rows of W columns are W / 4 lanes of 16 bytes, so a warp holds 128 / W rows at a
# time and a thread ROWS / 4 / (128 / W) of them.
SHAPES = [(32, 128, True),   # 8 rows a thread over 32 lanes
          (16, 128, True),   # 4 over 32
          (8, 128, True),    # 2 over 32
          (16, 64, True),    # 2 over 16
          (64, 64, True),    # 8 over 16
          (128, 32, True),   # 8 over 8
          (4, 128, False),   # 1 row a thread
          (128, 128, False),  # 32 rows a thread: more than MAX_TRANSPOSED_GROUPS
          (256, 8, False)]   # 4 over 2 lanes: one step, cheaper plain


@pytest.mark.parametrize("rows,width,transposed", SHAPES)
def test_rows_of_several_a_thread_reduce_across_lanes_transposed(rows, width, transposed):
    programs = 2
    x = torch.randn(programs * rows, width) * 4
    x[1, 3] = float("nan")  # a maximum and a minimum of a row with NaN are NaN (torch's too)
    x[2, :] = float("-inf")
    x[3, width - 1] = float("inf")
    xi = torch.randint(-1000, 1000, (programs * rows, width), dtype=torch.int32)
    outs = [torch.full_like(x, float("nan"))] + [torch.full((programs * rows,), float("nan")) for _ in range(3)] + [
        torch.full((programs * rows,), -7, dtype=torch.int32)]
    compiled = row_reductions.compile(x, xi, *outs, ROWS=rows, W=width, target="sm_90a")
    assert ("shfl.sync.idx" in compiled.ptx) == transposed
    dev = ptx_sim.Device()
    for t in (x, xi, *outs):
        dev.place(t)
    dev.run(compiled, (programs,), x, xi, *outs)
    copy, sums, maxima, minima, isums = (dev.fetch(t) for t in outs)
    assert torch.equal(copy.nan_to_num(), x.nan_to_num())
    finite = x.isfinite().all(1)
    torch.testing.assert_close(sums[finite], x[finite].sum(1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(maxima, x.max(1).values, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(minima, x.min(1).values, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(isums, xi.sum(1, dtype=torch.int32))


def test_halvings_are_taken_where_they_cost_less():
    """The cost model's choices: none for one group or a non-power of two, none over one or two lane bits, at most
    two halvings (MAX_HALVINGS), none past 16 groups (MAX_TRANSPOSED_GROUPS)."""
    assert [_halvings(1, 5), _halvings(3, 5), _halvings(8, 1), _halvings(8, 2), _halvings(32, 5)] == [0] * 5
    assert [_halvings(2, 5), _halvings(2, 3), _halvings(4, 5), _halvings(8, 5), _halvings(16, 3)] == [1, 0, 2, 2, 2]

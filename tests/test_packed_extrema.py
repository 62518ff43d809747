"""A float32 max or min of bf16 or f16 widened (ops/reductions.py `_narrow_pairs`): the thread combines its
elements two to an instruction (max.NaN.bf16x2 on the words they were loaded in) where a word's halves fall in one
group, and one at a time where they do not (a reduction along the axis the words run along). Interpreted and run
from the sm_90a PTX on tests/ptx_sim.py against torch, exactly, NaN, infinities and signed zeros among the
inputs (which zero a max of -0.0 and 0.0 gives is not compared: torch's reductions do not order them)."""
import sys
from pathlib import Path

import pytest
import torch

import mgjit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402


@mgjit.kernel
def extrema(x, y, whole, rows, cols, both):
    """x: (32, 256), y: (4, 256) of bf16 or f16; whole: max and min of x; rows: x's row maxima; cols: x's column
    minima (the words' halves in two groups); both: the max of x and y as a tuple."""
    a = x[mgjit.ds(0, 32), mgjit.ds(0, 256)].astype(mgjit.float32)
    b = y[mgjit.ds(0, 4), mgjit.ds(0, 256)].astype(mgjit.float32)
    whole[0] = a.max()
    whole[1] = a.min()
    rows[mgjit.ds(0, 32)] = a.max(axis=1)
    cols[mgjit.ds(0, 256)] = a.min(axis=0)
    both[0] = mgjit.max((a, b))


def inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random rows with NaN in one row, infinities, signed zeros and ties (values drawn from few)."""
    x = (torch.randn(32, 256) * 100).to(dtype)
    x[3] = torch.randint(-3, 3, (256,)).to(dtype)  # ties
    x[5, 17], x[9, 200], x[9, 201] = float("inf"), float("-inf"), float("-inf")
    x[11] = torch.where(torch.rand(256) < 0.5, -0.0, 0.0).to(dtype)
    x[20, torch.randint(0, 256, (1,))] = float("nan")
    y = (torch.randn(4, 256) * 100).to(dtype)
    return x, y


def reference(x, y):
    a, b = x.float(), y.float()
    return (torch.stack([a.amax(), a.amin()]), a.amax(1), a.amin(0), torch.stack([a.amax(), b.amax()]).amax()[None])


def outputs():
    return [torch.full((n,), 7.0) for n in (2, 32, 256, 1)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_packed_extrema_match_torch(dtype):
    x, y = inputs(dtype)
    want = reference(x, y)
    assert want[0].isnan().all() and not want[2].isnan().all()  # NaN reaches the whole and one column only
    got = outputs()
    extrema.interpret[(1,)](x, y, *got)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    compiled = extrema.compile(x, y, *outputs(), target="sm_90a")
    pair = "bf16x2" if dtype == torch.bfloat16 else "f16x2"
    assert compiled.ptx.count(f"max.NaN.{pair}") >= 8 and compiled.ptx.count(f"min.NaN.{pair}") >= 8
    dev = ptx_sim.Device()
    got = outputs()
    for t in (x, y, *got):
        dev.place(t)
    dev.run(compiled, (1,), x, y, *got)
    for g, w in zip(got, want):
        torch.testing.assert_close(dev.fetch(g), w, rtol=0, atol=0, equal_nan=True)
    blackwell = extrema.compile(x, y, *outputs(), target="sm_100a")  # ptxas takes the pairs there too
    assert blackwell.ptx.count(f"max.NaN.{pair}") == compiled.ptx.count(f"max.NaN.{pair}")

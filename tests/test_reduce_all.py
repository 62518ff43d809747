"""mgjit.sum / max / min of a tuple of arrays (ops/reductions.py ReduceAll): every element of arrays of any shapes
and layouts (tiled, replicated, splat), one scalar, the threads combining once. Interpreted and run from the
sm_90a PTX on tests/ptx_sim.py against torch; the PTX pays one butterfly and one exchange between warps for all
the arrays; errors name the line."""
import inspect
import sys
from pathlib import Path

import pytest
import torch

import mgjit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402


@mgjit.kernel
def tuple_stats(x, y, out, KIND: mgjit.constexpr, WIDE: mgjit.constexpr):
    """Arrays of 32 and 4 rows of a line (tiled), 16 elements (replicated over the warpgroup's threads) and a
    splat; a sum of squares (fma chains) beside them."""
    a = x[mgjit.ds(0, 32), mgjit.ds(0, WIDE)]
    b = x[mgjit.ds(32, 4), mgjit.ds(0, WIDE)]
    c = y[mgjit.ds(0, 16)]
    if KIND == "sum":
        out[0] = mgjit.sum((a, b, c))
        out[1] = mgjit.sum((a * a, b * b))
        out[2] = mgjit.sum((a, mgjit.full((8,), 2.0)))
        out[3] = mgjit.sum((c,))
    elif KIND == "max":
        out[0] = mgjit.max((a, b, c))
        out[1] = mgjit.max((b, mgjit.full((4,), 100.0)))
    else:
        out[0] = mgjit.min((c, b, a))
        out[1] = mgjit.min((y[mgjit.ds(0, 16)].astype(mgjit.int32), (b * 8.0).astype(mgjit.int32))).astype(
            mgjit.float32)


def reference(x, y, kind, wide):
    a, b, c = x[:32, :wide], x[32:36, :wide], y[:16]
    if kind == "sum":
        return torch.stack([a.sum() + b.sum() + c.sum(), (a * a).sum() + (b * b).sum(), a.sum() + 16, c.sum()])
    if kind == "max":
        return torch.stack([torch.stack([a.max(), b.max(), c.max()]).max(), torch.tensor(100.0)])
    return torch.stack([torch.stack([a.min(), b.min(), c.min()]).min(),
                        torch.minimum(c.int().min(), (b * 8).int().min()).float()])


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("wide", [256, 64])
def test_tuple_reductions_match_torch(kind, wide):
    x, y = torch.randn(36, 256) * 3, torch.randn(16) * 5
    ref = reference(x, y, kind, wide)
    out = torch.full((4,), float("nan"))
    tuple_stats.interpret[(1,)](x, y, out, KIND=kind, WIDE=wide)
    assert torch.allclose(out[:len(ref)], ref, rtol=1e-5, atol=1e-3)
    compiled = tuple_stats.compile(x, y, out, KIND=kind, WIDE=wide, target="sm_90a")
    got = torch.full((4,), float("nan"))
    dev = ptx_sim.Device()
    for t in (x, y, got):
        dev.place(t)
    dev.run(compiled, (1,), x, y, got)
    assert torch.allclose(dev.fetch(got)[:len(ref)], ref, rtol=1e-5, atol=1e-3)


@mgjit.kernel
def separate_sums(x, out):
    a = x[mgjit.ds(0, 32), mgjit.ds(0, 256)]
    b = x[mgjit.ds(32, 4), mgjit.ds(0, 256)]
    c = x[mgjit.ds(36, 1), mgjit.ds(0, 256)]
    out[0] = a.sum() + b.sum() + c.sum()


@mgjit.kernel
def one_sum(x, out):
    a = x[mgjit.ds(0, 32), mgjit.ds(0, 256)]
    b = x[mgjit.ds(32, 4), mgjit.ds(0, 256)]
    c = x[mgjit.ds(36, 1), mgjit.ds(0, 256)]
    out[0] = mgjit.sum((a, b, c))


def test_the_threads_combine_once_for_every_array():
    """Summed as a tuple, three arrays pay one butterfly and one exchange between warps (two barriers). Summed
    apart, the first two, whose elements cross the same lanes and warps, are combined thread by thread before one
    butterfly and one exchange (ops/reductions.py `_fuse_partials`), and the third, a row that each warp holds a
    copy of, pays its own butterfly (its copies must not be added)."""
    x, out = torch.randn(37, 256), torch.zeros(1)
    apart = separate_sums.compile(x, out, target="sm_90a").ptx
    fused = one_sum.compile(x, out, target="sm_90a").ptx
    assert fused.count("bar.sync") == 2 and apart.count("bar.sync") == 4
    assert fused.count("shfl.sync") == 5 and apart.count("shfl.sync") == 10
    interpreted = torch.zeros(1)
    one_sum.interpret[(1,)](x, interpreted)
    assert torch.allclose(interpreted, x.sum(), rtol=1e-5, atol=1e-3)


@mgjit.kernel
def with_axis(x, out):
    a = x[mgjit.ds(0, 256)]
    out[mgjit.ds(0, 256)] = mgjit.sum((a, a), axis=0)  # ERR


@mgjit.kernel
def with_scalar(x, out):
    out[0] = mgjit.sum((x[mgjit.ds(0, 128)], x[0]))  # ERR


@mgjit.kernel
def mixed_dtypes(x, out):
    out[0] = mgjit.sum((x[mgjit.ds(0, 128)], x[mgjit.ds(0, 128)].astype(mgjit.int32)))  # ERR


@mgjit.kernel
def bool_rows(x, out):
    out[0] = (x[mgjit.ds(0, 128)] > 0).max().astype(mgjit.float32)  # ERR


@pytest.mark.parametrize("kernel,phrase", [
    (bool_rows, "reductions over bool arrays are not supported"),
    (with_axis, "sum of a tuple of arrays reduces every element to one scalar: it takes no axis or keepdims"),
    (with_scalar, "sum of a tuple reduces one or more arrays, got [(128,), 'a scalar']"),
    (mixed_dtypes, "sum of a tuple reduces arrays of one dtype, got ['float32', 'int32']")],
    ids=lambda v: getattr(v, "name", None))
def test_errors_name_the_line(kernel, phrase):
    """Compiled and interpreted alike (a bool reduction the interpreter ran used to compile to an error only)."""
    lines, first = inspect.getsourcelines(kernel.fn)
    line = first + next(i for i, text in enumerate(lines) if text.rstrip().endswith("# ERR"))
    with pytest.raises(mgjit.CompileError) as info:
        kernel.compile(torch.zeros(4096), torch.zeros(256), target="sm_90a")
    assert phrase in str(info.value) and info.value.loc.line == line
    with pytest.raises(mgjit.CompileError) as info:
        kernel.interpret[(1,)](torch.zeros(4096), torch.zeros(256))
    assert phrase in str(info.value) and info.value.loc.line == line

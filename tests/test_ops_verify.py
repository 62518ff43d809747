"""Verifiers of the elementwise and reduction families refuse what would compile to the wrong program: an axis
that does not exist (it used to be taken modulo the rank, reducing another axis) and a bool array negated (it
used to compile silently). Each error names the user's line; the forms that are valid still compute what torch
computes (run by the interpreter)."""
import inspect

import pytest

import mgjit

torch = pytest.importorskip("torch")


def line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@mgjit.kernel
def sum_axis(x, out, AXIS: mgjit.constexpr):
    v = x[mgjit.ds(0, 128)]
    out[0] = v.sum(axis=AXIS)


@mgjit.kernel
def max_axis_2d(x, out, AXIS: mgjit.constexpr):
    v = x[mgjit.ds(0, 64), mgjit.ds(0, 32)]
    out[mgjit.ds(0, 64)] = v.max(axis=AXIS)


@pytest.mark.parametrize("kernel,axis,rank", [(sum_axis, 1, 1), (sum_axis, -2, 1), (max_axis_2d, 2, 2),
                                              (max_axis_2d, -3, 2), (max_axis_2d, (0, 5), 2)])
def test_an_axis_the_array_does_not_have_is_an_error_at_its_line(kernel, axis, rank):
    x = torch.zeros(64, 32) if rank == 2 else torch.zeros(128)
    with pytest.raises(mgjit.CompileError) as info:
        kernel.compile(x, torch.zeros(64), AXIS=axis, target="sm_90a")
    err = info.value
    assert err.loc.line == line_of(kernel.fn, "axis=AXIS") and err.loc.file == kernel.source.file
    bad = axis[1] if isinstance(axis, tuple) else axis
    assert f"over axis {bad}: a rank-{rank} array has axes {-rank}..{rank - 1}" in str(err)


@pytest.mark.parametrize("axis", [-1, 1])
def test_negative_axes_count_from_the_end(axis):
    x = torch.randn(64, 32)
    out = torch.full((64,), float("nan"))
    max_axis_2d.interpret[(1,)](x, out, AXIS=axis)
    torch.testing.assert_close(out, x.max(dim=1).values)
    s = torch.full((1,), float("nan"))
    v = torch.randn(128)
    sum_axis.interpret[(1,)](v, s, AXIS=-1)
    torch.testing.assert_close(s[0], v.sum(), rtol=1e-5, atol=1e-5)


@mgjit.kernel
def negate_mask(x, out, BLOCK: mgjit.constexpr):
    m = x[mgjit.ds(0, BLOCK)] > 0.0
    out[mgjit.ds(0, BLOCK)] = (-m).astype(mgjit.float32)


@mgjit.kernel
def invert_mask(x, out, BLOCK: mgjit.constexpr):
    m = x[mgjit.ds(0, BLOCK)] > 0.0
    out[mgjit.ds(0, BLOCK)] = (~m).astype(mgjit.float32)


def test_negating_a_bool_array_is_an_error_at_its_line():
    x = torch.zeros(256)
    with pytest.raises(mgjit.CompileError, match=r"negating a bool array is not defined.*use ~x") as info:
        negate_mask.compile(x, x, BLOCK=256, target="sm_90a")
    assert info.value.loc.line == line_of(negate_mask.fn, "(-m)")
    with pytest.raises(RuntimeError, match="Negation.*on a bool tensor is not supported"):
        -(x > 0)  # torch refuses it too
    x = torch.randn(256)
    out = torch.full_like(x, float("nan"))
    invert_mask.interpret[(1,)](x, out, BLOCK=256)
    torch.testing.assert_close(out, (~(x > 0)).float())

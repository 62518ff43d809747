"""GMEM gathers (ops/gmem_gather.py): `x[rows, cols]` with integer arrays among the indices, against torch's
indexing, in the interpreter and from the sm_90a PTX (tests/ptx_sim.py), outputs poisoned first, indices drawn
fresh with some outside the tensor (negative ones too: outside, not counted from the end)."""
import sys
from pathlib import Path

import pytest
import torch

import mgjit
from mgjit.dtypes import from_torch
from mgjit.interpret.numerics import storage_dtype

sys.path.insert(0, str(Path(__file__).parent))
import ptx_sim  # noqa: E402


@mgjit.kernel
def gather_pairs(x, rows, cols, out, N: mgjit.constexpr, OTHER: mgjit.constexpr):
    w = mgjit.ds(mgjit.program_id(0) * N, N)
    out[w] = mgjit.load(x, (rows[w], cols[w]), other=OTHER)


@mgjit.kernel
def gather_grid(x, rows, cols, out, R: mgjit.constexpr, C: mgjit.constexpr):
    """Rows by columns, broadcast: out[i, j] = x[rows[i], cols[j]]; then x[rows[0], cols] (a scalar and an array)."""
    r = rows[mgjit.ds(0, R)]
    c = cols[mgjit.ds(0, C)]
    out[mgjit.ds(0, R), mgjit.ds(0, C)] = x[r[:, None], c[None, :]]
    out[R, mgjit.ds(0, C)] = x[rows[0], c]


@mgjit.kernel
def gather_flat(x, idx, out, N: mgjit.constexpr):
    out[mgjit.ds(0, N)] = x[idx[mgjit.ds(0, N)].astype(mgjit.int32) * 2 + 1]


def reference(x: torch.Tensor, *index: torch.Tensor, other=0) -> torch.Tensor:
    """torch's indexing, with `other` where an index is outside (negative ones too); as bits (torch indexes no
    float8 tensor by a mask)."""
    idx = torch.broadcast_tensors(*index)
    inside = torch.ones(idx[0].shape, dtype=torch.bool)
    for i, n in zip(idx, x.shape):
        inside &= (i >= 0) & (i < n)
    bits = storage_dtype(from_torch(x.dtype))
    out = torch.tensor([other], dtype=x.dtype).view(bits).expand(idx[0].shape).clone()
    out[inside] = x.view(bits)[tuple(i[inside] for i in idx)]
    return out.view(x.dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    bits = storage_dtype(from_torch(a.dtype))
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def random(shape, dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return (torch.randn(shape) * 3).to(dtype)
    return torch.randint(-100, 100, shape, dtype=dtype)


def run(kernel, grid, *args, simulate: bool, **constexprs):
    """Run `kernel` interpreted or from its PTX on the simulator; its last tensor argument (the output) as it
    left it."""
    if not simulate:
        kernel.interpret[grid](*args, **constexprs)
        return args[-1]
    compiled = kernel.compile(*args, **constexprs, target="sm_90a")
    dev = ptx_sim.Device()
    dev.run(compiled, grid, *args)
    return dev.fetch(args[-1])


@pytest.mark.parametrize("simulate", [False, True], ids=["interpreted", "ptx"])
@pytest.mark.parametrize("dtype,other", [(torch.bfloat16, -1.5), (torch.float32, 0.0), (torch.int8, 7),
                                         (torch.int32, -3), (torch.float64, float("-inf")), (torch.float16, 2.0),
                                         (torch.float8_e4m3fn, 0.0), (torch.float8_e5m2, -2.0)], ids=str)
def test_gather_pairs_match_torch(dtype, other, simulate):
    """Two programs of 256 (row, column) pairs from a transposed view (strides (1, 37)): in-bounds pairs read
    their element, pairs with an index outside (below zero or past the end, on either axis) read `other`."""
    x = random((37, 50), dtype).t()
    n = 256
    rows = torch.randint(-3, x.shape[0] + 3, (2 * n,), dtype=torch.int64)
    cols = torch.randint(-3, x.shape[1] + 3, (2 * n,), dtype=torch.int32)
    out = torch.full((2 * n,), 99, dtype=dtype)
    got = run(gather_pairs, (2,), x, rows, cols, out, simulate=simulate, N=n, OTHER=other)
    want = reference(x, rows, cols, other=other)
    assert ((rows < 0) | (rows >= x.shape[0]) | (cols < 0) | (cols >= x.shape[1])).any()
    assert same_bits(got, want)


@pytest.mark.parametrize("simulate", [False, True], ids=["interpreted", "ptx"])
def test_gather_broadcasts_its_indices(simulate):
    """x[r[:, None], c[None, :]] is a (16, 64) grid of gathered elements; x[rows[0], c] mixes a scalar index with
    an array. Zero where an index is outside."""
    x = random((40, 300), torch.bfloat16)
    rows = torch.randint(-2, 42, (16,), dtype=torch.int32)
    rows[0] = 5
    cols = torch.randint(-2, 302, (64,), dtype=torch.int32)
    out = torch.full((17, 64), float("nan"), dtype=torch.bfloat16)
    got = run(gather_grid, (1,), x, rows, cols, out, simulate=simulate, R=16, C=64)
    assert same_bits(got[:16], reference(x, rows[:, None], cols[None, :]))
    assert same_bits(got[16], reference(x, torch.tensor(5), cols))


@pytest.mark.parametrize("simulate", [False, True], ids=["interpreted", "ptx"])
def test_gather_from_computed_indices_of_a_1d_tensor(simulate):
    x = random((1000,), torch.float32)
    idx = torch.randint(-10, 520, (512,), dtype=torch.int16)
    out = torch.full((512,), float("nan"))
    got = run(gather_flat, (1,), x, idx, out, simulate=simulate, N=512)
    assert same_bits(got, reference(x, idx.int() * 2 + 1))


@mgjit.kernel
def gather_with_window(x, rows, out):
    out[mgjit.ds(0, 16)] = x[rows[mgjit.ds(0, 16)], mgjit.ds(0, 16)]


@mgjit.kernel
def gather_with_bools(x, rows, out):
    out[mgjit.ds(0, 16)] = x[rows[mgjit.ds(0, 16)] > 0, 0]


@mgjit.kernel
def gather_unbroadcastable(x, rows, out):
    out[mgjit.ds(0, 16)] = x[rows[mgjit.ds(0, 16)], rows[mgjit.ds(0, 8)]]


@mgjit.kernel
def scatter(x, rows, out):
    out[rows[mgjit.ds(0, 16)], 0] = x[0, mgjit.ds(0, 16)]


@pytest.mark.parametrize("kernel,message", [
    (gather_with_window, "x is gathered (indexed with an integer array), so every axis takes an integer array or "
                         "scalar; axis 1 takes a ds"),
    (gather_with_bools, "gather index of axis 0 of x must be an integer array or scalar, got bool"),
    (gather_unbroadcastable, "the gather indices of x do not broadcast to one shape: [(16,), (8,)]"),
    (scatter, "storing into out at integer-array indices (a scatter) is not supported"),
], ids=lambda k: getattr(k, "__name__", ""))
def test_gather_errors_name_the_line(kernel, message):
    x, rows, out = torch.zeros(16, 16), torch.zeros(16, dtype=torch.int32), torch.zeros(16, 16)
    with pytest.raises(mgjit.CompileError) as e:
        kernel.compile(x, rows, out, target="sm_90a")
    assert message in str(e.value) and "test_gmem_gather.py" in str(e.value), str(e.value)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,other", [(torch.bfloat16, float("-inf")), (torch.float32, 0.0), (torch.int8, -7),
                                         (torch.float64, 1.5)], ids=str)
def test_gather_on_the_gpu(dtype, other):
    """On the GPU, fresh indices (some outside) into a transposed view, output poisoned: as torch indexes."""
    x = random((300, 77), dtype).cuda().t()
    n = 1024
    rows = torch.randint(-5, x.shape[0] + 5, (8 * n,), device="cuda")
    cols = torch.randint(-5, x.shape[1] + 5, (8 * n,), device="cuda", dtype=torch.int32)
    out = torch.full((8 * n,), 99, dtype=dtype, device="cuda")
    gather_pairs[(8,)](x, rows, cols, out, N=n, OTHER=other)
    torch.cuda.synchronize()
    assert same_bits(out.cpu(), reference(x.cpu(), rows.cpu(), cols.cpu(), other=other))


@pytest.mark.parametrize("simulate", [False, True], ids=["interpreted", "ptx"])
def test_gather_of_one_float8_element_inside(simulate):
    """One pair inside a float8 tensor, the rest outside: the interpreter moves the elements as bits (torch's
    masked assignment of one float8 element raised NotImplementedError, found by the differential fuzzer)."""
    x = random((37, 50), torch.float8_e4m3fn)
    rows = torch.full((256,), -1, dtype=torch.int32)
    cols = torch.full((256,), 3, dtype=torch.int32)
    rows[17] = 5
    out = torch.zeros(256, dtype=torch.float8_e4m3fn)
    got = run(gather_pairs, (1,), x, rows, cols, out, simulate=simulate, N=256, OTHER=1.5)
    assert same_bits(got, reference(x, rows, cols, other=1.5))

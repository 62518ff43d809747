"""SMEM read back into registers, on the GPU: through every swizzle, in a transposed view, after TMA."""
import pytest

import mgjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@mgjit.kernel
def roundtrip(x, out, outT, R: mgjit.constexpr, C: mgjit.constexpr, SW: mgjit.constexpr):
    s = mgjit.smem((R, C), x.dtype, swizzle=SW)
    s[...] = x[mgjit.ds(0, R), mgjit.ds(0, C)]
    out[mgjit.ds(0, R), mgjit.ds(0, C)] = s[...] * 2
    outT[mgjit.ds(0, C), mgjit.ds(0, R)] = s.T[...]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("swizzle", [None, 32, 64, 128])
def test_store_then_read_back(dtype, swizzle):
    cols = 64 if dtype.itemsize == 2 else 32
    x = torch.randn(64, cols, device="cuda", dtype=dtype)
    out = torch.full_like(x, float("nan"))
    out_t = torch.full((cols, 64), float("nan"), device="cuda", dtype=dtype)
    roundtrip[(1,)](x, out, out_t, R=64, C=cols, SW=swizzle)
    assert torch.equal(out, x * 2) and torch.equal(out_t, x.t())


@mgjit.kernel
def tma_then_read(x, out, R: mgjit.constexpr, C: mgjit.constexpr):
    s = mgjit.smem((R, C), x.dtype, swizzle=128)
    bar = mgjit.barrier(1)
    r0 = mgjit.program_id(0) * R
    mgjit.copy_async(x, (r0, 0), s, barrier=bar[0])
    bar[0].wait()
    out[mgjit.ds(r0, R), mgjit.ds(0, C)] = s[...] + 1.0


def test_tma_load_then_read_back_with_ragged_rows():
    x = torch.randn(200, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    tma_then_read[(4,)](x, out, R=64, C=64)
    assert torch.equal(out, x + 1.0)

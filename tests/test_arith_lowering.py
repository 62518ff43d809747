"""Arithmetic the lowering shapes for the hardware, checked on the CPU: the PTX compiled for sm_90a runs in
tests/ptx_sim.py and must give what torch gives, and the instructions it uses are checked on the PTX.

- A float32 sum of a product takes one fma an element (in chains, then a tree), not a multiply and an add.
- bf16 widens to f32 by shifting its bits (a loaded pair: one mask, one shift), not through cvt.f32.bf16."""
import re
import sys
from pathlib import Path

import pytest

import mgjit

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402

N = 4096  # 32 elements a thread of one warpgroup


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MGJIT_CACHE_DIR", str(tmp_path_factory.mktemp("arith-lowering-cache")))
        yield


@mgjit.kernel
def sums_of_products(a, b, out, BLOCK: mgjit.constexpr):
    x = a[mgjit.ds(0, BLOCK)].astype(mgjit.float32)
    y = b[mgjit.ds(0, BLOCK)].astype(mgjit.float32)
    out[0] = (x * y).sum()
    out[1] = (x * x).sum()
    out[2] = (x * 3.0).sum()
    out[3] = (x + y).sum()


def simulate(kernel, *args, **constexprs):
    compiled = kernel.compile(*args, **constexprs, target="sm_90a")
    dev = ptx_sim.Device()
    for t in args:
        dev.place(t)
    dev.run(compiled, (1,), *args)
    return compiled, dev


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sum_of_products_takes_one_fma_an_element(dtype):
    a, b = torch.randn(N).to(dtype), torch.randn(N).to(dtype)
    out = torch.full((4,), float("nan"))
    compiled, dev = simulate(sums_of_products, a, b, out, BLOCK=N)
    got = dev.fetch(out).double()
    x, y = a.double(), b.double()
    want = torch.stack([(x * y).sum(), (x * x).sum(), (x * 3).sum(), (x + y).sum()])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (got, want)
    # Three products of 32 elements a thread in 8 chains each: 24 fmas and 8 multiplies apiece; the plain sum
    # multiplies nothing.
    assert len(re.findall(r"\bfma\.rn\.f32\b", compiled.ptx)) == 3 * 24
    assert len(re.findall(r"\bmul(\.rn)?\.f32\b", compiled.ptx)) == 3 * 8


@mgjit.kernel
def widen(x, out, BLOCK: mgjit.constexpr):
    w = mgjit.ds(mgjit.program_id(0) * BLOCK, BLOCK)
    out[w] = x[w].astype(mgjit.float32)


def test_bf16_widens_to_f32_by_shifting_its_bits():
    """Every class of bf16 value (zeros, subnormals, normals, the largest, infinities, NaNs with payloads) widens
    to the f32 torch gives, bit for bit."""
    bits = torch.tensor([0x0000, 0x8000, 0x0001, 0x807F, 0x3F80, 0xC2F7, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0,
                         0x7F81, 0xFFC1], dtype=torch.int32).to(torch.int16)  # wraps the high ones
    x = torch.cat([bits, torch.randint(-2 ** 15, 2 ** 15, (2048 - len(bits),), dtype=torch.int16)]).view(
        torch.bfloat16)
    out = torch.zeros(2048)
    compiled = widen.compile(x, out, BLOCK=1024, target="sm_90a")
    dev = ptx_sim.Device()
    dev.place(x)
    dev.place(out)
    dev.run(compiled, (2,), x, out)
    assert torch.equal(dev.fetch(out).view(torch.int32), x.float().view(torch.int32))
    assert "cvt.f32.bf16" not in compiled.ptx
    assert re.search(r"\band\.b32\s+%r\d+, %r\d+, -65536;", compiled.ptx)

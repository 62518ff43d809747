"""The PTX simulator (tests/ptx_sim.py) runs what LLVM links in from libdevice out of line: float64 pow calls
`__internal_accurate_pow` (.param variables passed and returned, the callee's registers its own), float64 sin and
cos read the module's table `__cudart_sin_cos_coeffs` and reduce their argument with fmas that must round once.
From the sm_90a PTX against torch in float64; fuzzed kernels using them were counted as beyond the simulator, as
was one whose int16 additions LLVM packed in pairs (add.s16x2)."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import mgjit

torch = pytest.importorskip("torch")
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent / "tools")]
import fuzz  # noqa: E402
import fuzz_gen  # noqa: E402
import ptx_arith  # noqa: E402
import ptx_sim  # noqa: E402

N = 256


@mgjit.kernel
def float64_math(x, y, z, out):
    a = x[mgjit.ds(0, N)]
    out[0, mgjit.ds(0, N)] = a ** y[mgjit.ds(0, N)]
    out[1, mgjit.ds(0, N)] = mgjit.sin(z[mgjit.ds(0, N)])
    out[2, mgjit.ds(0, N)] = mgjit.cos(z[mgjit.ds(0, N)])


def test_float64_pow_sin_and_cos_from_their_ptx():
    x = torch.rand(N, dtype=torch.float64) * 4 + 0.01
    y = (torch.rand(N, dtype=torch.float64) - 0.5) * 12
    z = (torch.rand(N, dtype=torch.float64) - 0.5) * torch.logspace(0, 6, N, dtype=torch.float64)
    out = torch.full((3, N), float("nan"), dtype=torch.float64)
    compiled = float64_math.compile(x, y, z, out, target="sm_90a")
    assert "call.uni" in compiled.ptx and "__cudart_sin_cos_coeffs" in compiled.ptx
    dev = ptx_sim.Device()
    for t in (x, y, z, out):
        dev.place(t)
    dev.run(compiled, (1,), x, y, z, out)
    got = dev.fetch(out)
    # libdevice: pow within 2 ulps, sin and cos within 2 (double-rounded fmas put cos 128 ulps off: tried)
    torch.testing.assert_close(got, torch.stack([x ** y, torch.sin(z), torch.cos(z)]), rtol=5e-16, atol=5e-16)


def test_float64_fma_rounds_once():
    a, b, c = np.array([1 + 2.0 ** -52]), np.array([1 - 2.0 ** -52]), np.array([-1.0])
    assert a * b + c == 0.0  # a * b rounds to 1 first
    assert ptx_arith.exact_fma(a, b, c)[0] == -(2.0 ** -104)
    assert np.signbit(ptx_arith.exact_fma(np.array([-0.0]), np.array([1.0]), np.array([-0.0]))[0])
    assert not np.signbit(ptx_arith.exact_fma(np.array([2.0]), np.array([3.0]), np.array([-6.0]))[0])
    assert ptx_arith.exact_fma(np.array([1e308]), np.array([10.0]), np.array([0.0]))[0] == np.inf
    assert np.isnan(ptx_arith.exact_fma(np.array([np.inf]), np.array([0.0]), np.array([1.0]))[0])


def test_packed_16_bit_integer_arithmetic_from_its_ptx(tmp_path):
    """The fuzzer's seed 60158, whose int16 additions LLVM packs in pairs (add.s16x2): each half apart, as the
    interpreter computes them."""
    launch = fuzz.Launch(fuzz_gen.generate(60158), str(tmp_path), "k")
    inputs, outputs = launch.tensors()
    compiled = launch.kernel.compile(*launch.args(inputs, outputs), target="sm_90a", **launch.consts)
    assert re.search(r"\b(add|sub|min|max)\.[su]16x2\b", compiled.ptx)
    outcome = fuzz.check(fuzz_gen.generate(60158), str(tmp_path), "k", ptx=True)
    assert outcome.status == "ok", (outcome.category, outcome.detail)

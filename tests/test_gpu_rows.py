"""The row kernels of examples/ on awkward shapes: every mapping (several rows per program, one row, chunked long
rows), ragged and odd lengths, every float dtype, strided rows, against torch on fresh random inputs with the
outputs poisoned first."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import cross_entropy as ce  # noqa: E402
import fused_elementwise as fe  # noqa: E402
import layernorm as ln  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402

pytestmark = pytest.mark.gpu

LENGTHS = [1, 3, 17, 128, 1000, 4097, 8192, 8193, 32000, 100003]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rel(out, ref) -> float:
    assert torch.isfinite(out).all(), "an output element was not written (NaN poison left) or overflowed"
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def rows_for(n: int) -> int:
    return max(3, min(333, (1 << 22) // n))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", LENGTHS)
def test_softmax(n, dtype):
    x = torch.randn(rows_for(n), n, device="cuda", dtype=dtype) * 3
    out = torch.full_like(x, float("nan"))
    sm.softmax(x, out)
    assert rel(out, torch.softmax(x.float(), 1)) < TOL[dtype] * 2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", LENGTHS)
def test_rmsnorm_and_layernorm(n, dtype):
    x = torch.randn(rows_for(n), n, device="cuda", dtype=dtype) + 0.3
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    out = torch.full_like(x, float("nan"))
    rms.rmsnorm(x, w, 1e-6, out)
    assert rel(out, torch.nn.functional.rms_norm(x.float(), (n,), w.float(), 1e-6)) < TOL[dtype] * 2
    out.fill_(float("nan"))
    ln.layernorm(x, w, b, 1e-5, out)
    assert rel(out, torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)) < TOL[dtype] * 2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [2, 100, 4097, 32000, 50257, 128256])
def test_cross_entropy(n, dtype):
    m = rows_for(n)
    logits = torch.randn(m, n, device="cuda", dtype=dtype) * 4
    target = torch.randint(0, n, (m,), device="cuda")
    target[::5] = -100
    loss = torch.full((m,), float("nan"), device="cuda")
    got, lse = ce.cross_entropy(logits, target, out=loss)
    ref = torch.nn.functional.cross_entropy(logits.float(), target, reduction="none", ignore_index=-100)
    assert rel(got, ref) < 1e-4
    assert rel(lse, torch.logsumexp(logits.float(), 1)) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (8192, 8191), (3, 5, 7), (1000, 4097)])
def test_fused_elementwise(shape, dtype):
    x, y, z = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    out = torch.full_like(x, float("nan"))
    fe.fused(x, y, z, out)
    assert rel(out, fe.reference(x, y, z)) < TOL[dtype] * 2


def test_strided_rows_and_empty_batches():
    base = torch.randn(64, 5000, device="cuda", dtype=torch.bfloat16)
    x = base[:, 3:4003]  # rows 5000 elements apart, starting 6 bytes in: nothing is 16-byte aligned
    out = torch.full((64, 4000), float("nan"), device="cuda", dtype=torch.bfloat16)
    sm.softmax(x, out)
    assert rel(out, torch.softmax(x.float(), 1)) < 2e-2
    assert sm.softmax(torch.empty(0, 100, device="cuda")).shape == (0, 100)
    assert rms.rmsnorm(torch.empty(0, 7, device="cuda"), torch.ones(7, device="cuda")).shape == (0, 7)

"""Small launches of the Hopper matmul, softmax and the row examples (rows that start anywhere in a 16-byte
chunk, rows split over a cluster) for compute-sanitizer (memcheck, racecheck):
    compute-sanitizer --tool memcheck python3 tests/sanitize_kernels.py
Exits non-zero if a result is wrong."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
from matmul_hopper import matmul  # noqa: E402
from test_gpu_core import softmax_kernel  # noqa: E402
import cross_entropy as ce  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402

a = torch.randn(200, 136, device="cuda", dtype=torch.bfloat16)
b = torch.randn(136, 300, device="cuda", dtype=torch.bfloat16)
c = matmul(a, b, {"STAGES": 2})
err = ((c.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
x = torch.randn(33, 1000, device="cuda")
y = torch.full_like(x, float("nan"))
softmax_kernel[(33,)](x, y, BLOCK=1024)
torch.cuda.synchronize()
ok = err < 1e-2 and torch.allclose(y, torch.softmax(x, 1), atol=1e-6)
print("matmul rel err", err, "softmax ok", ok)
for n in (77, 4097, 40000):  # several rows per program, one misaligned row, a row over a cluster
    for t in (torch.bfloat16, torch.float32):
        xr = torch.randn(7, n, device="cuda", dtype=t)
        w = torch.randn(n, device="cuda", dtype=t)
        out = sm.softmax(xr)
        out2 = rms.rmsnorm(xr, w)
        loss, _ = ce.cross_entropy(xr, torch.randint(0, n, (7,), device="cuda"))
        torch.cuda.synchronize()
        rows_ok = (torch.allclose(out.float(), torch.softmax(xr.float(), 1), atol=1e-2)
                   and torch.isfinite(out2).all().item() and torch.isfinite(loss).all().item())
        print("rows", n, t, "ok", rows_ok)
        ok = ok and rows_ok
sys.exit(0 if ok else 1)

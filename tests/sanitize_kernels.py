"""Small launches of the Hopper matmul and softmax for compute-sanitizer (memcheck, racecheck):
    compute-sanitizer --tool memcheck python3 tests/sanitize_kernels.py
Exits non-zero if a result is wrong."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
from matmul_hopper import matmul  # noqa: E402
from test_gpu_core import softmax_kernel  # noqa: E402

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
sys.exit(0 if ok else 1)

"""GPU: the Hopper matmul (examples/matmul_hopper.py) autotuned over a small space with the rules of
benchmarks/autotune_matmul.py picks a config whose output matches torch, and a second tuner over the same
kernel reads the winner from disk instead of timing anything."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import autotune_matmul as bench  # noqa: E402
from mgjit.autotune import Config, CudaEventTimer, expand_space  # noqa: E402

import mgjit  # noqa: E402

# 18 candidates: BK=32 breaks the 128-byte swizzle (9), BN=256 with 5 stages is over the shared-memory
# budget whatever the epilogue (so are a few more with the TMA-store epilogue); the rest compile and are timed.
SPACE = dict(BM=[128], BN=[128, 192, 256], BK=[32, 64], STAGES=[3, 4, 5], GROUP_M=[8])
RULES = [bench.wgmma_shape, bench.swizzle_width, bench.smem_budget]
M, N, K = 1000, 3000, 2000  # ragged in M and N for every tile of the space


class CountingTimer:
    def __init__(self):
        self.inner, self.calls = CudaEventTimer(), 0
        self.device = torch.cuda.get_device_name()

    def __call__(self, run):
        self.calls += 1
        return self.inner(run)


def inputs():
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    return a, b, c


def assert_matches_torch(a, b, c):
    ref = a.float() @ b.float()
    assert not c.isnan().any(), "some of the poisoned output was never written"
    assert ((c.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_autotuned_hopper_matmul_is_correct_and_its_winner_persists(monkeypatch, tmp_path):
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    configs = expand_space(SPACE)
    kernel = bench.fresh_kernel()
    tuned = mgjit.autotune(configs=configs, key=["a", "b"], rules=RULES)(kernel)

    a, b, c = inputs()
    tuned[bench.grid](*bench.kernel_args(a, b, c))
    assert_matches_torch(a, b, c)
    report = tuned.tuning_report()
    print(report)
    rows = {row.config: row for row in report.rows}
    assert rows[Config(BM=128, BN=256, BK=64, STAGES=5, GROUP_M=8)].pruned.startswith("smem-budget: ")
    assert all(row.pruned.startswith("swizzle-width: ") for row in report.rows if row.config.kwargs["BK"] == 32)
    kept = [config for config in configs if all(rule(config, {"a": a, "c": c}) is None for rule in RULES)]
    assert len(kept) >= 4
    timed = [row for row in report.rows if row.ms is not None]
    assert [row.config for row in timed] == kept and all(0 < row.ms < 10 for row in timed)
    assert report.winner.ms == min(row.ms for row in timed)
    assert report.compile_seconds > 0 and report.timing_seconds > 0
    winner = report.winner.config

    # Fresh inputs and a poisoned output through the tuned launch path (the memoized winner).
    a, b, c = inputs()
    tuned[bench.grid](*bench.kernel_args(a, b, c))
    assert_matches_torch(a, b, c)

    # A second tuner over the same kernel stands for a new process: the store has every result.
    timer = CountingTimer()
    again = mgjit.autotune(configs=configs, key=["a", "b"], rules=RULES, timer=timer)(kernel)
    a, b, c = inputs()
    again[bench.grid](*bench.kernel_args(a, b, c))
    assert timer.calls == 0
    assert_matches_torch(a, b, c)
    report2 = again.tuning_report()
    assert report2.winner.config == winner
    assert all(row.stored for row in report2.rows if row.ms is not None)
    assert report2.compile_seconds == report2.timing_seconds == 0.0

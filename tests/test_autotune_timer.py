"""The default CUDA-event timer (GPU only; skipped without one) and the Run it is handed."""
import pytest
import test_autotune_fakes
import torch
from mgjit.autotune import Config, CudaEventTimer, Run, autotune
from mgjit.autotune.timing import device_name
from test_autotune_fakes import FakeKernel

cache_dirs = test_autotune_fakes.cache_dirs  # the shared fixture

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_run_calls_setup_then_launch():
    calls = []
    run = Run(Config(BM=64), lambda: calls.append("setup"), lambda: calls.append("launch"))
    run()
    assert calls == ["setup", "launch"]


def test_device_name_prefers_the_timers_own():
    class Timer:
        device = "H100-ish"

    assert device_name(Timer()) == "H100-ish"
    assert device_name(lambda run: 0.0) == (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")


def test_default_timer_refuses_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="torch sees no CUDA device; pass timer="):
        CudaEventTimer()(lambda: None)


def test_timer_rejects_inconsistent_rep_bounds():
    with pytest.raises(ValueError, match="min_reps <= max_reps"):
        CudaEventTimer(min_reps=10, max_reps=5)


@pytest.mark.gpu
@gpu
def test_cuda_event_timer_orders_work_and_leaves_setup_untimed():
    timer = CudaEventTimer(warmup_ms=5, rep_ms=20)
    a = {n: torch.randn(n, n, device="cuda", dtype=torch.float16) for n in (1024, 4096)}
    small = timer(lambda: a[1024] @ a[1024])
    large = timer(lambda: a[4096] @ a[4096])
    assert 0 < small < large  # 64x the flops
    assert 10 * small < large or small < 0.05  # tiny launches are latency-bound

    # A setup that copies 512 MB (~0.3 ms at 3+ TB/s) must not show in the time of a ~0.02 ms launch.
    big, copy = torch.empty(128 << 20, device="cuda"), torch.ones(128 << 20, device="cuda")
    with_setup = timer(Run(Config(BM=1), lambda: big.copy_(copy), lambda: a[1024] @ a[1024]))
    assert with_setup < small * 1.5 + 0.01
    assert timer.device == torch.cuda.get_device_name()


@pytest.mark.gpu
@gpu
def test_a_gpu_sweep_with_the_default_timer_picks_the_least_work(cache_dirs):
    # The fake launch multiplies (32 BN)^2 matrices: 8x the work per step of BN, and large enough (30 us for
    # the least) that a GPU still raising its clocks from idle cannot reorder them (it did at 16 BN).
    mats = {n: torch.randn(n, n, device="cuda", dtype=torch.float16) for n in (2048, 4096, 8192)}
    kernel = FakeKernel(cache_dirs / "kernels",
                        body=lambda named, c: named["c"].copy_((mats[c["BN"] * 32] @ mats[c["BN"] * 32])[:256, :256]))
    matmul = autotune(configs=[Config(BM=64, BN=bn, BK=64, STAGES=2) for bn in (256, 64, 128)], key=["M"],
                      restore=["c"], jobs=1)(kernel)
    c = torch.zeros(256, 256, device="cuda", dtype=torch.float16)
    matmul[(1,)](c, c, c, 256, 256, 64)
    report = matmul.tuning_report()
    assert report.winner.config.kwargs["BN"] == 64
    ms = {row.config.kwargs["BN"]: row.ms for row in report.rows}
    assert ms[64] < ms[128] < ms[256]
    assert report.device == torch.cuda.get_device_name()

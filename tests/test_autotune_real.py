"""The autotuner over a real `@mgjit.kernel`: compile-time pruning on the CPU (target named), and a real
sweep with the default CUDA-event timer on a GPU."""
import pytest
import torch

pytest.importorskip("mgjit.jit", reason="the compiler core (mgjit.jit) is not there yet")

from mgjit.autotune import Config  # noqa: E402

import mgjit  # noqa: E402

CONFIGS = [Config(BLOCK=1000, ALPHA=2.0), Config(BLOCK=1024, ALPHA=2.0), Config(BLOCK=4096, ALPHA=2.0),
           Config(BLOCK=4096, ALPHA=2.0, num_warpgroups=2), Config(BLOCK=32768, ALPHA=2.0)]


@mgjit.autotune(configs=CONFIGS, key=["n"], restore=["x"])
@mgjit.kernel
def axpy(x, y, n, BLOCK: mgjit.constexpr, ALPHA: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    x[mgjit.ds(start, BLOCK)] = x[mgjit.ds(start, BLOCK)] * ALPHA + y[mgjit.ds(start, BLOCK)]


def test_real_compile_errors_and_ptxas_spills_prune_in_parallel(monkeypatch, tmp_path):
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    n = 1 << 16
    x, y = torch.ones(n), torch.ones(n)
    outcomes = axpy.compile_all(x, y, n, target="sm_90a", jobs=2)
    reasons = [o.pruned for o in outcomes]
    assert reasons[0].startswith(f"layout: {__file__}:")
    assert reasons[0].endswith("register array dimensions must be powers of two, got shape (1000,)")
    assert reasons[1] is None and reasons[2] is None and reasons[3] is None
    # 32K fp32 over 128 threads cannot live in registers: refused before ptxas, at the line that loads it.
    assert reasons[4].startswith(f"registers: {__file__}:") and "256 registers in each thread" in reasons[4]
    survivors = [o.compiled for o in outcomes if o.compiled is not None]
    assert [c.threads for c in survivors] == [128, 128, 256]
    assert all(c.target == "sm_90a" for c in survivors)
    # The first survivor compiled in this process; the others in workers, read back from the disk cache.
    assert [c.from_cache for c in survivors] == [False, True, True]


@mgjit.autotune(configs=[Config(BLOCK=4096), Config(BLOCK=16384)], key=["n"], restore=["x"])
@mgjit.kernel
def scale_by_sum(x, y, n, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    a = x[mgjit.ds(start, BLOCK)]
    x[mgjit.ds(start, BLOCK)] = a * 2.0 + y[mgjit.ds(start, BLOCK)] * a.sum()


def test_ptxas_spills_prune(monkeypatch, tmp_path):
    """Two 16K fp32 arrays live at once over 128 threads fit no register budget: ptxas spills, the config goes."""
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    x = torch.ones(1 << 16)
    reasons = [o.pruned for o in scale_by_sum.compile_all(x, x, 1 << 16, target="sm_90a", jobs=1)]
    assert reasons[0] is None
    assert reasons[1].startswith("ptxas: ") and reasons[1].endswith(" bytes spilled")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_sweep_on_the_gpu_restores_in_place_arguments_and_is_remembered(monkeypatch, tmp_path):
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    n = 1 << 24
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    expected = x * 2.0 + y

    def grid(meta):
        return (meta["n"] // meta["BLOCK"],)

    axpy[grid](x, y, n)
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    report = axpy.tuning_report()
    print(report)
    timed = [row for row in report.rows if row.ms is not None]
    assert len(timed) == 3 and all(0 < row.ms < 5 for row in timed)
    assert report.winner.config in CONFIGS[1:4]
    assert report.device == torch.cuda.get_device_name()

    # A second tuner over the same kernel (a new process, as far as the store is concerned) times nothing.
    again = mgjit.autotune(configs=CONFIGS, key=["n"], restore=["x"],
                           timer=CountingTimer())(axpy.kernel)
    again[grid](x, y, n)
    assert again.timer.calls == 0
    assert again.tuning_report().winner.config == report.winner.config


class CountingTimer:
    def __init__(self):
        from mgjit.autotune import CudaEventTimer

        self.inner, self.calls = CudaEventTimer(), 0
        self.device = torch.cuda.get_device_name()

    def __call__(self, run):
        self.calls += 1
        return self.inner(run)

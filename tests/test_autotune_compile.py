"""Parallel compilation of candidates: forked workers compile, the disk cache carries the result back."""
import os
import warnings

import pytest
import test_autotune_fakes
import torch
import mgjit
from mgjit.autotune import Config, autotune, compile_pool
from mgjit.autotune.compile_pool import compile_configs, default_jobs
from test_autotune_fakes import FakeKernel, FakeTimer
from test_fuzz_regressions import bytes_through_a_vector, mask_or_max
from test_occupancy import two_rows_softmax

cache_dirs = test_autotune_fakes.cache_dirs  # the shared fixture

CONFIGS = [Config(BM=bm, BN=bn, BK=64, STAGES=s) for bm in (64, 128) for bn in (128, 256, 512) for s in (2, 8)]
ARGS = (torch.ones(256, 64), torch.ones(64, 256), torch.zeros(256, 256), 256, 256, 64)


def expected_reason(config):
    c = config.kwargs
    if (c["BM"] + c["BN"]) * c["BK"] * 2 * c["STAGES"] > 227 * 1024:
        return "smem-budget"
    return "ptxas: 64 bytes spilled" if c["BN"] == 512 else None


@pytest.mark.skipif(not compile_pool.can_fork(), reason="needs fork")
def test_children_compile_and_the_parent_gets_cache_hits(tmp_path):
    kernel = FakeKernel(tmp_path)
    outcomes = compile_configs(kernel, ARGS, {}, CONFIGS, jobs=3)
    assert [o.config for o in outcomes] == CONFIGS
    for outcome in outcomes:
        reason = expected_reason(outcome.config)
        if reason is None:
            assert outcome.pruned is None and outcome.compiled.target == "sm_90a"
        else:
            assert outcome.compiled is None and outcome.pruned.startswith(reason)
    # One compile in the parent (it resolves the target and warms the compiler), all others in children;
    # the parent compiled each child's survivor and spilling config again as a cache hit.
    pids = kernel.compiled_by_pid()
    assert kernel.misses == 1 and pids.count(os.getpid()) == 1
    assert len(pids) == sum(expected_reason(c) != "smem-budget" for c in CONFIGS)
    assert len(set(pids)) >= 2
    assert kernel.hits == sum(expected_reason(c) != "smem-budget" for c in CONFIGS[1:])


def test_serial_when_fork_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_pool, "can_fork", lambda: False)
    kernel = FakeKernel(tmp_path)
    outcomes = compile_configs(kernel, ARGS, {}, CONFIGS, jobs=4)
    assert set(kernel.compiled_by_pid()) == {os.getpid()}
    assert kernel.hits == 0 and kernel.misses == len(CONFIGS)
    assert [o.pruned is None for o in outcomes] == [expected_reason(c) is None for c in CONFIGS]


def test_the_parent_resolves_the_target_for_the_children(tmp_path):
    kernel = FakeKernel(tmp_path)
    outcomes = compile_configs(kernel, ARGS, {}, CONFIGS, target="sm_100a", jobs=2)
    assert {o.compiled.target for o in outcomes if o.compiled is not None} == {"sm_100a"}


@pytest.mark.skipif(not compile_pool.can_fork(), reason="needs fork")
def test_an_unexpected_compiler_failure_in_a_child_is_raised_by_the_parent(tmp_path):
    kernel = FakeKernel(tmp_path, crash_on=dict(BM=128, BN=256, STAGES=2))
    with pytest.raises(ValueError, match="internal compiler error"):
        compile_configs(kernel, ARGS, {}, CONFIGS, jobs=2)


@pytest.mark.skipif(not compile_pool.can_fork(), reason="needs fork")
def test_a_sweep_compiles_in_parallel_and_times_in_the_parent(cache_dirs):
    kernel = FakeKernel(cache_dirs / "kernels")
    timer = FakeTimer(kernel, lambda c: c.kwargs["BM"] / c.kwargs["BN"])
    matmul = autotune(configs=CONFIGS, key=["M", "N", "K"], timer=timer, jobs=2)(kernel)
    matmul[(1,)](*ARGS)
    assert len(set(kernel.compiled_by_pid())) >= 2
    assert timer.timed == [c for c in CONFIGS if expected_reason(c) is None]
    assert matmul.tuning_report().winner.config == Config(BM=64, BN=256, BK=64, STAGES=2)

    outcomes = matmul.compile_all(*ARGS, target="sm_90a", jobs=2)
    assert [o.config for o in outcomes] == CONFIGS
    assert [o.pruned is None for o in outcomes] == [expected_reason(c) is None for c in CONFIGS]


def test_default_jobs(monkeypatch):
    monkeypatch.setenv("MGJIT_AUTOTUNE_JOBS", "5")
    assert default_jobs() == 5
    monkeypatch.setenv("MGJIT_AUTOTUNE_JOBS", "zero")
    with pytest.raises(ValueError, match="MGJIT_AUTOTUNE_JOBS must be a positive int; got 'zero'"):
        default_jobs()
    monkeypatch.delenv("MGJIT_AUTOTUNE_JOBS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert default_jobs() == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert default_jobs() == len(os.sched_getaffinity(0))


@mgjit.kernel
def held_rows(x, out, OCC: mgjit.constexpr):
    """Two 8192-column bf16 rows per program: spills when asked for 4 CTAs per SM (128 registers a thread)."""
    mgjit.min_ctas_per_sm(OCC)
    two_rows_softmax(x, out)
    tile = mgjit.smem((64, 64), x.dtype, swizzle=128)  # read transposed: a BankConflictWarning in every compile
    tile[...] = x[mgjit.ds(0, 64), mgjit.ds(0, 64)]
    mgjit.cta_sync()
    out[mgjit.ds(0, 64), mgjit.ds(0, 64)] = tile.T[...]


@pytest.mark.parametrize("jobs,dtype", [(1, torch.bfloat16), (2, torch.float16)])
def test_only_the_kept_configs_warnings_reach_the_caller(cache_dirs, capfd, jobs, dtype):
    """A config pruned for spilling gives no PtxasWarning (its spill is the prune reason); a kept config's
    warnings still reach the caller, also when a forked worker compiled it first. (A dtype of its own per case:
    a compile this process already made warns no more.)"""
    x = torch.empty(64, 8192, dtype=dtype)
    configs = [Config(OCC=1), Config(OCC=4), Config(OCC=2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcomes = compile_configs(held_rows, (x, x), {}, configs, target="sm_90a", jobs=jobs)
    assert [o.pruned is not None for o in outcomes] == [False, True, False]
    assert outcomes[1].pruned.startswith("ptxas:") and "spilled" in outcomes[1].pruned
    assert not [w for w in caught if issubclass(w.category, mgjit.PtxasWarning)], [str(w.message) for w in caught]
    assert len([w for w in caught if issubclass(w.category, mgjit.BankConflictWarning)]) == 2  # OCC=1 and 2
    assert "Warning" not in capfd.readouterr().err


@pytest.mark.skipif(not compile_pool.can_fork(), reason="needs fork")
def test_a_config_that_aborts_the_compiler_is_pruned_and_the_sweep_goes_on(cache_dirs, monkeypatch):
    """An LLVM fatal error aborts the process compiling: a multiprocessing.Pool worker that died so lost its config
    and the sweep waited for it forever. Now that config is pruned with what LLVM printed, a warning says the
    compiler crashed, and the other configs compile (a worker replaces the dead one). Planted: the byte packing
    that LLVM aborted on, which only the mask configs use, with the pipeline unguarded (as with a build of MLIR
    that lacks crash recovery: mgjit.mlir._crash_recovery)."""
    from mgjit import mlir
    from mgjit.lower.emit import Emitter
    monkeypatch.setattr(Emitter, "pack_i32", bytes_through_a_vector)
    monkeypatch.setattr(mlir, "_recovery", ())
    x, out = torch.randint(0, 256, (24, 34), dtype=torch.uint8), torch.empty(6, 3, 16, dtype=torch.uint8)
    configs = [Config(MASK=False, SHIFT=s) for s in (0, 1)] + [Config(MASK=True, SHIFT=0)] + \
        [Config(MASK=False, SHIFT=s) for s in (2, 3)]
    crashed = r"mask_or_max with Config\(MASK=True, SHIFT=0\) took the compiler's process down \(killed by SIGABRT: "
    with pytest.warns(RuntimeWarning, match=crashed + "LLVM ERROR: Cannot select"):
        outcomes = compile_configs(mask_or_max, (x, out), {}, configs, target="sm_90a", jobs=2)
    assert [o.config for o in outcomes] == configs
    assert outcomes[2].compiled is None and outcomes[2].pruned.startswith(
        "internal error: the compiler's process died (killed by SIGABRT: LLVM ERROR: Cannot select"), outcomes[2]
    assert all(o.compiled is not None and o.compiled.spills == 0 for i, o in enumerate(outcomes) if i != 2)

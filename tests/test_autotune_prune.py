"""Pruning before timing: user predicates, compile errors with their rule, and the ptxas report."""
import pytest
import test_autotune_fakes
import torch
from mgjit.autotune import Config, autotune, divisible
from mgjit.autotune.prune import apply_user_pruning, compile_error_reason, resource_reason
from test_autotune_fakes import FakeKernel, FakeTimer

from mgjit.errors import CompileError, Loc

cache_dirs = test_autotune_fakes.cache_dirs  # the shared fixture


def test_resource_reason_thresholds():
    assert resource_reason(registers=168, spills=0, threads=384) is None  # 64512 registers: fits
    assert resource_reason(registers=255, spills=0, threads=128) is None
    assert resource_reason(registers=128, spills=8, threads=128) == "ptxas: 8 bytes spilled"
    assert resource_reason(registers=256, spills=0, threads=128) == "ptxas: 256 registers per thread > 255"
    assert resource_reason(registers=172, spills=0, threads=384) == \
        "ptxas: 172 registers x 384 threads = 66048 > 65536 per SM"


def test_compile_error_reason_names_the_rule_and_the_kernel_line(tmp_path):
    source = tmp_path / "kern.py"
    source.write_text("x = 1\n    smem = alloc(BM, BK)\n")
    error = CompileError("needs 300000 bytes of shared memory; the limit is 232448",
                         Loc(str(source), 2, function="matmul"), rule="smem-budget")
    assert compile_error_reason(error) == (f"smem-budget: {source}:2 (in matmul): needs 300000 bytes of "
                                           f"shared memory; the limit is 232448")
    assert compile_error_reason(CompileError("bad")) == "compile error: bad"


def test_user_pruning_order_and_reasons():
    configs = [Config(BM=bm, BN=bn) for bm in (64, 128) for bn in (64, 128)]

    def keep_square(configs, named):
        return [c for c in configs if c.kwargs["BM"] == c.kwargs["BN"]]

    dropped = apply_user_pruning(configs, {"M": 192}, keep_square, [divisible("M", "BM")])
    assert dropped == {configs[1]: "prune_configs (keep_square) removed it",
                       configs[2]: "prune_configs (keep_square) removed it",
                       configs[3]: "divisibility: M=192 is not a multiple of BM=128"}
    with pytest.raises(ValueError, match="must return a subset"):
        apply_user_pruning(configs, {}, lambda cs, named: [Config(BM=1, BN=1)], [])
    with pytest.raises(TypeError, match="must return a reason str or None"):
        apply_user_pruning(configs, {}, None, [lambda c, named: False])
    with pytest.raises(KeyError, match=r"the config has no 'BX'"):
        apply_user_pruning(configs, {"M": 1}, None, [divisible("M", "BX")])


def test_pruned_configs_are_never_timed_and_rule_pruned_ones_never_compiled(cache_dirs):
    configs = [Config(BM=bm, BN=bn, BK=64, STAGES=s, num_warpgroups=wg)
               for bm in (64, 96, 128) for bn in (128, 512) for s in (2, 8) for wg in (1, 3)]

    def registers(c, wg):
        if (c["BM"], c["BN"], c["STAGES"], wg) == (128, 128, 2, 3):
            return 200  # x 384 threads: over the SM's register file
        return 300 if (c["BM"], c["BN"], c["STAGES"]) == (64, 128, 8) else 128

    kernel = FakeKernel(cache_dirs / "kernels", registers=registers)
    timer = FakeTimer(kernel, lambda c: float(c.kwargs["BM"] * c.kwargs["STAGES"]))
    matmul = autotune(configs=configs, key=["M"], rules=[divisible("M", "BM")], timer=timer, jobs=1)(kernel)
    a = torch.ones(256, 64)
    matmul[(1,)](a, a, a, 256, 128, 64)
    reasons = {row.config: row.pruned for row in matmul.tuning_report().rows}

    def reason(bm, bn, stages, wg):
        return reasons[Config(BM=bm, BN=bn, BK=64, STAGES=stages, num_warpgroups=wg)]

    for wg in (1, 3):
        assert reason(64, 512, 8, wg).startswith("smem-budget: kernel needs 589824 bytes")
        for bn in (128, 512):
            for stages in (2, 8):
                assert reason(96, bn, stages, wg) == "divisibility: M=256 is not a multiple of BM=96"
    assert reason(64, 512, 2, 1) == reason(128, 512, 2, 3) == "ptxas: 64 bytes spilled"
    assert reason(128, 128, 8, 1).startswith("smem-budget: kernel needs 262144 bytes")
    assert reason(64, 128, 8, 3) == "ptxas: 300 registers per thread > 255"
    assert reason(128, 128, 2, 3) == "ptxas: 200 registers x 384 threads = 76800 > 65536 per SM"
    survivors = [Config(BM=64, BN=128, BK=64, STAGES=2, num_warpgroups=1),
                 Config(BM=64, BN=128, BK=64, STAGES=2, num_warpgroups=3),
                 Config(BM=128, BN=128, BK=64, STAGES=2, num_warpgroups=1)]
    assert [c for c in configs if reasons[c] is None] == survivors
    assert timer.timed[:len(survivors)] == survivors  # one pass over the survivors, in order
    assert set(timer.timed) == set(survivors)  # then close finalists again: never a pruned config
    assert kernel.misses == len(configs) - 8  # the 8 BM=96 configs never reached the compiler
    assert matmul.tuning_report().winner.config == survivors[0]  # tied with survivors[1]: earlier wins

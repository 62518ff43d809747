"""CPU: the search space of benchmarks/autotune_matmul.py (the autotuned Hopper matmul): its rules, their
agreement with the compiler's own shared-memory count and budget check, and the script's --dry-run."""
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("mgjit.jit", reason="the compiler core (mgjit.jit) is not there yet")

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
sys.path.insert(0, BENCHMARKS)
import autotune_matmul as bench  # noqa: E402
from mgjit.autotune import Config  # noqa: E402

from mgjit.errors import CompileError  # noqa: E402

BF16 = {"a": torch.empty(1, 1, dtype=torch.bfloat16), "c": torch.empty(1, 1, dtype=torch.bfloat16)}
OVER = Config(BM=128, BN=256, BK=64, STAGES=5, GROUP_M=8)  # over the budget with either epilogue


def test_the_default_space_keeps_a_few_dozen_configs_with_a_reason_for_each_drop():
    candidates, kept, dropped = bench.build_space("default", BF16)
    epilogue = bench.tma_store(candidates[0], BF16)  # the kernel's default: an SMEM-staged TMA store
    assert (len(candidates), len(kept), len(dropped)) == ((120, 38, 82) if epilogue else (120, 40, 80))
    rules = {}
    for reason in dropped.values():
        rules[reason.split(":")[0]] = rules.get(reason.split(":")[0], 0) + 1
    assert rules == {"swizzle-width": 40, "smem-budget": 34 if epilogue else 32, "pipeline-depth": 8}
    for config in kept:
        k = config.kwargs
        assert k["BM"] == 128 and k["BN"] in (64, 128, 192, 256) and k["BK"] in (64, 128)
        assert sum(bench.smem_bytes(config, BF16)) + bench.SMEM_RESERVE <= bench.SMEM_LIMIT
        assert k["STAGES"] * k["BK"] >= bench.MIN_K_IN_FLIGHT
    # The TMA-store epilogue: two 64 x 64 chunk buffers for each of the two consumers.
    assert dropped[OVER] == (f"smem-budget: kernel needs {245760 + 32768 * epilogue + 1024} bytes of shared "
                             f"memory (ring 245760, epilogue {32768 * epilogue}, 1024 reserved), the limit is 232448")
    assert dropped[Config(BM=128, BN=64, BK=32, STAGES=2, GROUP_M=8)] == (
        "swizzle-width: BK=32 rows are 64 bytes, not a multiple of the 128-byte swizzle")
    assert 20 <= len(bench.build_space("full", BF16)[1]) <= 50
    assert len(bench.build_space("quick", BF16)[1]) == 4


def test_the_epilogue_is_a_dimension_of_its_own_space():
    kept = bench.build_space("epilogue", BF16)[1]
    direct = [c for c in kept if not c.kwargs["TMA_STORE"]]
    staged = [c for c in kept if c.kwargs["TMA_STORE"]]
    assert (len(direct), len(staged)) == (40, 38)  # direct stores leave room for deeper rings
    assert Config(BM=128, BN=192, BK=64, STAGES=5, GROUP_M=8, TMA_STORE=False) in direct
    assert Config(BM=128, BN=192, BK=64, STAGES=5, GROUP_M=8, TMA_STORE=True) not in staged


def test_rules_take_the_element_sizes_from_the_operands():
    fp8 = {"a": torch.empty(1, 1, dtype=torch.float8_e4m3fn), "c": torch.empty(1, 1, dtype=torch.bfloat16)}
    config = Config(BM=128, BN=256, BK=64, STAGES=5, GROUP_M=8, TMA_STORE=True)
    assert bench.swizzle_width(config, fp8).startswith("swizzle-width: BK=64 rows are 64 bytes")
    assert bench.smem_bytes(config, fp8) == (5 * (128 * 64 + 64 * 256), 2 * 2 * 64 * 64 * 2)
    assert bench.smem_budget(config, fp8) is None and bench.smem_budget(config, BF16) is not None
    assert bench.wgmma_shape(Config(BM=64, BN=256, BK=64, STAGES=4, GROUP_M=8), fp8).startswith("wgmma-shape: ")


@pytest.mark.parametrize("tma_store", [True, False])
def test_the_smem_rule_agrees_with_the_compiler(monkeypatch, tmp_path, tma_store):
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    x = torch.empty(1024, 1024, dtype=torch.bfloat16)
    kernel = bench.fresh_kernel()
    configs = [Config(**c.kwargs, TMA_STORE=tma_store) for c in bench.build_space("quick", BF16)[1]]
    for config in configs:
        compiled = kernel.compile(*bench.kernel_args(x, x, x), target="sm_90a", **config.launch_kwargs())
        # The compiler adds its mbarriers to the rule's count, within the rule's reserve.
        assert 0 <= compiled.smem_bytes - sum(bench.smem_bytes(config, BF16)) <= bench.SMEM_RESERVE, config
    over = Config(**OVER.kwargs, TMA_STORE=tma_store)
    assert bench.smem_budget(over, BF16) is not None
    with pytest.raises(CompileError) as error:
        kernel.compile(*bench.kernel_args(x, x, x), target="sm_90a", **over.launch_kwargs())
    assert error.value.rule == "smem-budget"


def test_the_dry_run_compiles_the_quick_space(tmp_path):
    env = {**os.environ, "MGJIT_AUTOTUNE_JOBS": "2", "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "autotune_matmul.py"), "--dry-run", "--quick",
                           "--shapes", "1000x3000x2000", "--json", str(tmp_path / "dry.json")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "space 'quick': 4 candidates, 4 kept by the rules, 0 dropped" in done.stdout
    assert "1000x3000x2000: 4/4 compiled for sm_90a" in done.stdout
    assert "over-budget config BM=128 BN=256 BK=64 STAGES=5 GROUP_M=8: rejected by the compiler" in done.stdout

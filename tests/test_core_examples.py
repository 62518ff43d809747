"""The examples run as scripts: compile-only on a machine without a GPU (the GPU is hidden here, so this is a
CPU test everywhere), and check-and-time on a GPU machine (marked gpu)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mgjit

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# script -> the kernel it compiles
SCRIPTS = {"vector_add.py": "add_kernel", "softmax.py": "softmax_kernel", "rmsnorm.py": "rmsnorm_kernel",
           "layernorm.py": "layernorm_rows", "cross_entropy.py": "cross_entropy_rows",
           "fused_elementwise.py": "fused_flat"}


def run_scripts(env: dict, *extra_args: str) -> dict[str, subprocess.CompletedProcess]:
    """Run every example at once (they are mostly waiting on imports and ptxas) and collect the results."""
    procs = {name: subprocess.Popen([sys.executable, str(EXAMPLES / name), *extra_args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
             for name in SCRIPTS}
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        out[name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    return out


def core_files() -> list[tuple]:
    """(path, size, mtime) of mgjit's sources: cache keys cover them, so an edit during a test changes keys."""
    root = Path(mgjit.__file__).parent
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*.py"))


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    """Each script twice against one fresh cache: the first run compiles, the second hits."""
    cache = tmp_path_factory.mktemp("examples-cache")
    env = {"MGJIT_CACHE_DIR": str(cache), "CUDA_VISIBLE_DEVICES": ""}
    before = core_files()
    runs = cache, run_scripts(env), run_scripts(env)
    return runs + (core_files() == before,)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_example_compiles_without_a_gpu(cpu_runs, script):
    cache, first, second, core_unchanged = cpu_runs
    for run in (first[script], second[script]):
        assert run.returncode == 0, run.stderr
        out = run.stdout
        assert f"== mgjit example: {script[:-3]} ==" in out
        assert re.search(rf"^kernel +{SCRIPTS[script]}$", out, re.M)
        assert re.search(r"^target +sm_90a$", out, re.M)
        assert re.search(r"^resources +\d+ registers, 0 bytes spilled, \d+ bytes dynamic smem, 128 threads$", out,
                         re.M)
        assert re.search(r"^ptxas +Used \d+ registers", out, re.M)
        assert f"kernel @{SCRIPTS[script]}(" in out and "TiledLayout(" in out  # the IR, with layouts
        assert "no GPU: compiled for sm_90a, not run" in out
    key = re.search(r"^key +([0-9a-f]{64})$", first[script].stdout, re.M).group(1)
    assert (cache / key[:2] / key).is_dir()
    assert re.search(r"^cache +compiled in [\d.]+ s: ", first[script].stdout, re.M)
    if not core_unchanged:
        pytest.skip("mgjit's sources were edited between the two runs, which changes every key")
    assert re.search(rf"^cache +cache hit: {re.escape(str(cache / key[:2] / key))}$", second[script].stdout, re.M)


def test_example_compiles_for_blackwell(tmp_path):
    env = {"MGJIT_CACHE_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, str(EXAMPLES / "softmax.py"), "--target", "sm_100a"], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.search(r"^target +sm_100a$", run.stdout, re.M)
    assert "compiled for sm_100a, not run" in run.stdout


def test_matmul_example_compiles_without_a_gpu(tmp_path):
    """examples/matmul_hopper.py has its own driver; without a GPU it compiles its default config."""
    env = {"MGJIT_CACHE_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, str(EXAMPLES / "matmul_hopper.py")], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.search(r"CompiledKernel\(matmul_kernel, sm_90a, registers=\d+, spills=0, ", run.stdout), run.stdout


@pytest.mark.gpu
def test_examples_check_and_time_on_a_gpu(tmp_path):
    runs = run_scripts({"MGJIT_CACHE_DIR": str(tmp_path)})
    for script, run in runs.items():
        assert run.returncode == 0, f"{script}:\n{run.stdout}\n{run.stderr}"
        assert re.search(r"^check +max abs error \S+ vs torch .*: OK$", run.stdout, re.M), run.stdout
        assert re.search(r"^time +[\d.]+ us \(.*\), \d+ GB/s", run.stdout, re.M), run.stdout

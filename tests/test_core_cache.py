"""CPU tests of how the core uses the cache: what goes into a key, hits across processes, and what a new
process imports on the way (a hit and `import mgjit` must never load MLIR).

Kernels whose source the tests change live in files written under tmp_path and run with exec, the way a
notebook re-runs a cell: a redefined helper or global must change its callers' keys.
"""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mgjit

torch = pytest.importorskip("torch")

MODULE_V1 = '''\
import mgjit

SCALE = 2.0
OFFSET = 1.0


@mgjit.device
def helper(v):
    return v * SCALE


@mgjit.kernel
def kern(x, out, BLOCK: mgjit.constexpr):
    i = mgjit.program_id(0) * BLOCK
    out[mgjit.ds(i, BLOCK)] = helper(x[mgjit.ds(i, BLOCK)]) + OFFSET
'''

HELPER_V2 = '''\
@mgjit.device
def helper(v):
    return v - SCALE
'''

# The child process: load the module file, compile, report what it saw (and what it imported) as JSON.
CHILD = '''\
import importlib.util, json, sys
import torch
import mgjit
spec = importlib.util.spec_from_file_location("kmod", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
x = torch.zeros(4096)
c = mod.kern.compile(x, torch.empty_like(x), BLOCK=1024, target="sm_90a")
print(json.dumps({"key": c.key, "from_cache": c.from_cache, "registers": c.registers,
                  "mlir": sorted(m for m in sys.modules if "mlir" in m),
                  "cuda_initialized": torch.cuda.is_initialized()}))
'''


def array_ops(ir_text: str) -> list[str]:
    """The kinds of the binary ops on float32 arrays in printed IR, in order."""
    return re.findall(r"binary \{kind=(\w+)\}\([^)]*\) : float32\[", ir_text)


def core_files() -> list[tuple]:
    """(path, size, mtime) of mgjit's sources: cache keys cover them, so an edit during a test changes keys."""
    root = Path(mgjit.__file__).parent
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*.py"))


def run_python(code: str, *args: str, env: dict | None = None) -> str:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def exec_file(path, ns: dict) -> dict:
    """Run a source file in `ns` (like a notebook cell): inspect finds the source through the file name."""
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(d))
    return d


@pytest.fixture
def module_file(tmp_path):
    path = tmp_path / "kmod.py"
    path.write_text(MODULE_V1)
    return path


def test_import_mgjit_is_light():
    out = run_python(textwrap.dedent('''\
        import json, sys
        import mgjit
        print(json.dumps({"mlir": sorted(m for m in sys.modules if "mlir" in m),
                          "torch": "torch" in sys.modules,
                          "cuda": sorted(m for m in sys.modules if m.startswith("cuda"))}))
        '''))
    seen = json.loads(out)
    assert seen == {"mlir": [], "torch": False, "cuda": []}


def test_hit_in_a_new_process_never_imports_mlir(cache_dir, module_file):
    """Two processes compile the same kernel with the same arguments: the second one hits the first's entry.
    (Both are children: this process fingerprints mgjit's sources once, which a concurrent edit would stale.)"""
    core = core_files()
    env = {"MGJIT_CACHE_DIR": str(cache_dir)}
    first, second = (json.loads(run_python(CHILD, str(module_file), env=env)) for _ in range(2))
    if core_files() != core:
        pytest.skip("mgjit's sources were edited during the test, which changes every key")
    assert first["from_cache"] is False and first["mlir"] != []  # a compile loads the MLIR bindings
    assert second["key"] == first["key"]
    assert second["from_cache"] is True
    assert second["registers"] == first["registers"] > 0
    assert second["mlir"] == []  # neither the bindings nor mgjit's shim over them
    assert second["cuda_initialized"] is False


def test_same_call_twice_hits_the_disk_cache_from_a_new_kernel_object(cache_dir, module_file):
    ns = exec_file(module_file, {"__name__": "kmod"})
    x = torch.zeros(4096)
    first = ns["kern"].compile(x, x, BLOCK=1024, target="sm_90a")
    again = mgjit.kernel(ns["kern"].fn).compile(x, x, BLOCK=1024, target="sm_90a")
    assert (first.from_cache, again.from_cache) == (False, True)
    assert again.key == first.key and again.cubin == first.cubin and again.ir == first.ir
    assert (cache_dir / first.key[:2] / first.key).is_dir()


def test_key_covers_constexprs_dtypes_alignment_and_target(cache_dir, module_file):
    kern = exec_file(module_file, {"__name__": "kmod"})["kern"]
    x = torch.zeros(4096)
    x16 = torch.zeros(4096, dtype=torch.float16)
    unaligned = torch.zeros(4097)[1:]
    variants = {
        "base": kern.compile(x, x, BLOCK=1024, target="sm_90a"),
        "constexpr": kern.compile(x, x, BLOCK=512, target="sm_90a"),
        "dtype": kern.compile(x16, x16, BLOCK=1024, target="sm_90a"),
        "alignment": kern.compile(unaligned, x, BLOCK=1024, target="sm_90a"),
        "target": kern.compile(x, x, BLOCK=1024, target="sm_100a"),
    }
    keys = {name: c.key for name, c in variants.items()}
    assert len(set(keys.values())) == len(keys), keys
    assert not any(c.from_cache for c in variants.values())
    # The same call gives the same key, and sizes are not part of it (they are runtime values).
    assert kern.compile(torch.zeros(8192), torch.zeros(8192), BLOCK=1024, target="sm_90a").key == keys["base"]
    spec = variants["base"].meta["specialization"]
    assert spec == ("x: float32[rank 1, align 16, unit-stride, last%16], "
                    "out: float32[rank 1, align 16, unit-stride, last%16], BLOCK=1024")
    assert "x: float16[rank 1, align 16" in variants["dtype"].meta["specialization"]
    assert "x: float32[rank 1, align 4, unit-stride" in variants["alignment"].meta["specialization"]
    assert variants["target"].meta["target"] == "sm_100a"


def test_redefined_helper_changes_the_callers_key(cache_dir, module_file, tmp_path):
    ns = exec_file(module_file, {"__name__": "kmod"})
    kern = ns["kern"]
    x = torch.zeros(4096)
    v1_source_key = kern.source_key()
    v1 = kern.compile(x, x, BLOCK=1024, target="sm_90a")
    assert array_ops(v1.ir) == ["mul", "add"]  # helper's v * SCALE, then + OFFSET

    # Re-run only the helper's "cell" with a new body: the kernel object defined earlier notices.
    cell = tmp_path / "cell2.py"
    cell.write_text(HELPER_V2)
    exec_file(cell, ns)
    assert kern.source_key() != v1_source_key
    v2 = kern.compile(x, x, BLOCK=1024, target="sm_90a")
    assert v2.key != v1.key and not v2.from_cache
    assert array_ops(v2.ir) == ["sub", "add"]

    # Re-running the whole original module gives the original key back: a hit.
    ns2 = exec_file(module_file, {"__name__": "kmod"})
    assert ns2["kern"].source_key() == v1_source_key
    again = ns2["kern"].compile(x, x, BLOCK=1024, target="sm_90a")
    assert again.key == v1.key and again.from_cache


@pytest.mark.parametrize("name", ["OFFSET", "SCALE"])  # read by the kernel itself / by its helper
def test_changed_global_changes_the_key(cache_dir, module_file, name):
    ns = exec_file(module_file, {"__name__": "kmod"})
    kern = ns["kern"]
    x = torch.zeros(4096)
    before = kern.compile(x, x, BLOCK=1024, target="sm_90a")
    ns[name] = 5.0
    after = kern.compile(x, x, BLOCK=1024, target="sm_90a")
    assert after.key != before.key and not after.from_cache
    assert "value=5.0" in after.ir and "value=5.0" not in before.ir
    ns[name] = {"OFFSET": 1.0, "SCALE": 2.0}[name]  # a new object with the old value: the old key again
    assert kern.compile(x, x, BLOCK=1024, target="sm_90a").key == before.key

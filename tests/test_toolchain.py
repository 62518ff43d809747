"""What the compiler does around ptxas and MLIR, and the limits it enforces before them: bounded waits,
fingerprints by content, scratch files that do not outlive a killed compile, clear errors for what cannot
compile (a hung ptxas, missing bindings, an array that cannot fit in registers, a constant too wide for its
type, a Unicode kernel name), and ptxas' warnings shown as Python warnings naming the kernel."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import mgjit
from mgjit import toolchain

torch = pytest.importorskip("torch")


@pytest.fixture
def fresh_toolchain():
    """Clear the toolchain's per-process memos around a test that changes MGJIT_PTXAS."""
    toolchain.ptxas_path.cache_clear()
    toolchain.compiler_fingerprint.cache_clear()
    yield
    toolchain.ptxas_path.cache_clear()
    toolchain.compiler_fingerprint.cache_clear()


def run(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@mgjit.kernel
def add_one(x, out, BLOCK: mgjit.constexpr):
    i = mgjit.program_id(0) * BLOCK
    out[mgjit.ds(i, BLOCK)] = x[mgjit.ds(i, BLOCK)] + 1.0


def test_a_hung_ptxas_is_a_compile_error_that_names_the_limit(tmp_path, monkeypatch, fresh_toolchain):
    real = toolchain.ptxas_path()
    fake = tmp_path / "ptxas"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *--version*) exec {real} --version;; esac\nsleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setenv("MGJIT_PTXAS", str(fake))
    monkeypatch.setenv("MGJIT_PTXAS_TIMEOUT", "1")
    toolchain.ptxas_path.cache_clear()
    x = torch.zeros(4096)
    start = time.monotonic()
    with pytest.raises(mgjit.CompileError, match=r"did not finish within 1 s \(MGJIT_PTXAS_TIMEOUT\)"):
        add_one.compile(x, x, BLOCK=256, target="sm_90a")
    assert time.monotonic() - start < 30


def test_missing_mlir_bindings_name_the_variable(tmp_path):
    script = tmp_path / "mlir_missing.py"
    script.write_text(textwrap.dedent("""\
        import torch, mgjit
        @mgjit.kernel
        def k(x, BLOCK: mgjit.constexpr):
            x[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)]
        try:
            k.compile(torch.zeros(128), BLOCK=128)
        except mgjit.CompileError as e:
            print("CompileError:", e)
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MGJIT_MLIR_PACKAGE": "no_such", "MGJIT_CACHE_DIR": str(tmp_path)})
    assert "CompileError: the MLIR Python bindings could not be imported from MGJIT_MLIR_PACKAGE=no_such" \
        in done.stdout, done.stdout + done.stderr


def test_the_fingerprint_is_content_not_location(tmp_path, monkeypatch, fresh_toolchain):
    """Two installs of the same version share keys: the fingerprint hashes what mgjit and ptxas are."""
    original = toolchain.compiler_fingerprint()
    copy = tmp_path / "ptxas-copy"
    shutil.copyfile(toolchain.ptxas_path(), copy)  # another path and another mtime, the same binary
    copy.chmod(0o755)
    monkeypatch.setenv("MGJIT_PTXAS", str(copy))
    toolchain.ptxas_path.cache_clear()
    toolchain.compiler_fingerprint.cache_clear()
    assert toolchain.compiler_fingerprint() == original
    with open(copy, "ab") as f:  # a different binary
        f.write(b"\0")
    os.utime(copy)
    toolchain.compiler_fingerprint.cache_clear()
    assert toolchain.compiler_fingerprint() != original
    # mgjit's own sources: copied elsewhere with new times, the same digest.
    package = Path(mgjit.__file__).parent
    shutil.copytree(package, tmp_path / "site" / "mgjit", ignore=shutil.ignore_patterns("__pycache__"))
    proc = run(f"""
        import sys; sys.path.insert(0, {str(tmp_path / 'site')!r})
        import mgjit.toolchain as t; print(t.__file__); print(t.compiler_fingerprint()[0])
        """)
    copied_file, digest = proc.stdout.split()
    assert copied_file.startswith(str(tmp_path)) and digest == original[0]


def test_scratch_files_left_by_a_killed_compile_are_swept(tmp_path, monkeypatch):
    # A temporary directory of this test's own: other processes of this user compile meanwhile (a second suite).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    scratch = Path(toolchain._scratch_dir())
    assert scratch.name == f"mgjit-{os.getuid()}" and (scratch.stat().st_mode & 0o777) == 0o700
    stale, fresh = scratch / "ptxas-killed", scratch / "ptxas-running"
    for d in (stale, fresh):
        d.mkdir(exist_ok=True)
        (d / "k.ptx").write_text("// left behind")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    # Other processes (the suite's killed-compile and concurrency tests) may have left fresh entries of
    # their own: this compile must leave nothing beside them.
    before = {p.name for p in scratch.iterdir()} - {stale.name}
    x = torch.zeros(4096)
    add_one.compile(x, x, BLOCK=512, target="sm_90a")  # a fresh specialization: runs ptxas
    assert not stale.exists() and fresh.exists()
    shutil.rmtree(fresh)
    left = {p.name for p in scratch.iterdir() if p.name.startswith("ptxas-")} - before
    assert not left  # its own files are gone


def _line(fn, text: str) -> int:
    import inspect
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@mgjit.kernel
def elementwise(x, out, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, BLOCK)]
    out[mgjit.ds(0, BLOCK)] = v * 2.0


@pytest.mark.parametrize("block", [2**20, 2**16, 2**15])
def test_an_array_too_large_for_registers_is_refused_where_it_is_made(block):
    x = torch.zeros(block)
    start = time.monotonic()
    with pytest.raises(mgjit.CompileError) as info:
        elementwise.compile(x, x, BLOCK=block, target="sm_90a")
    assert time.monotonic() - start < 10  # refused before lowering and ptxas, not after minutes of spilling
    err = info.value
    assert err.rule == "registers" and err.loc.line == _line(elementwise.fn, "v = x[")
    assert f"{block // 128 * 32 // 32} registers in each thread" in str(err) and "more than the 255" in str(err)


def test_the_largest_array_that_fits_compiles():
    x = torch.zeros(2**14)  # 128 floats per thread
    c = elementwise.compile(x, x, BLOCK=2**14, target="sm_90a")
    assert c.registers <= 255


def test_a_performance_loss_ptxas_reports_as_info_is_a_warning():
    """ptxas gives serialized wgmmas (C7515, each wgmma waiting for the one before: a large slowdown) as an info
    line, not a warning: it reaches the user all the same; the other info lines do not."""
    c7515 = ("(C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma "
             "instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in "
             "the function 'k' in line 698")
    c7508 = "(C7508) Potential Performance Loss: setmaxnreg ignored in the function 'k'"
    report = toolchain.parse_report("\n".join([
        f"ptxas info    : {c7515}", "ptxas info    : 0 bytes gmem", "ptxas info    : Compiling entry function 'k'",
        f"ptxas warning : {c7508}", "ptxas info    : Used 168 registers, used 16 barriers"]))
    assert report.warnings == [c7515, c7508]


@mgjit.kernel
def spills(x, out, BLOCK: mgjit.constexpr):
    a = x[mgjit.ds(0, BLOCK)]
    b = mgjit.exp(a) * mgjit.sin(a) + mgjit.cos(a) * mgjit.tanh(a)
    c = mgjit.erf(b) + a.sum()
    out[mgjit.ds(0, BLOCK)] = c * b + a


def test_spills_are_a_warning_naming_the_kernel_and_again_on_a_cache_hit():
    x = torch.zeros(2**15)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        c = spills.compile(x, x, BLOCK=2**14, target="sm_90a")
    if c.spills == 0:
        pytest.skip("this ptxas does not spill here")
    texts = [str(w.message) for w in seen if issubclass(w.category, mgjit.PtxasWarning)]
    assert texts and texts[0].startswith("spills (sm_90a): ptxas:") and "spill stores" in texts[0]
    assert seen[0].filename == spills.source.file and seen[0].lineno == _line(spills.fn, "def spills")
    proc_code = f"""
        import sys, warnings; sys.path.insert(0, {os.path.dirname(__file__)!r})
        warnings.simplefilter("always")
        import torch, test_toolchain as t
        x = torch.zeros(2**15)
        c = t.spills.compile(x, x, BLOCK=2**14, target="sm_90a")
        print(c.from_cache)
        """
    proc = run(proc_code)
    assert proc.stdout.strip() == "True" and "PtxasWarning: spills (sm_90a): ptxas:" in proc.stderr


@mgjit.kernel
def wide_constant(x, out, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)] + 2**70


def test_a_constant_too_wide_for_its_type_is_an_error_at_its_line():
    x = torch.zeros(1024, dtype=torch.int32)
    with pytest.raises(mgjit.CompileError) as info:
        wide_constant.compile(x, x, BLOCK=256, target="sm_90a")
    assert info.value.loc.line == _line(wide_constant.fn, "2**70")
    assert "does not fit in int32" in str(info.value)


def test_a_unicode_kernel_name_compiles(tmp_path):
    path = tmp_path / "unicode_kernel.py"
    path.write_text(textwrap.dedent("""\
        import mgjit

        @mgjit.kernel
        def größe(x, out, BLOCK: mgjit.constexpr):
            out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)]
        """), encoding="utf-8")
    import importlib.util
    spec = importlib.util.spec_from_file_location("unicode_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.zeros(1024)
    c = module.größe.compile(x, x, BLOCK=256, target="sm_90a")
    from mgjit import abi
    assert c.name == "größe" and f".entry {abi.symbol('größe')}(" in c.ptx
    assert abi.symbol("größe").isascii() and abi.symbol("add_one") == "add_one"


def test_num_warpgroups_outside_1_to_4_is_refused():
    with pytest.raises(mgjit.LaunchError, match=r"num_warpgroups must be an int in 1..4.*got 0"):
        mgjit.kernel(num_warpgroups=0)(add_one.fn)
    x = torch.zeros(4096)
    with pytest.raises(mgjit.LaunchError, match=r"got 5"):
        add_one.compile(x, x, BLOCK=256, num_warpgroups=5)


def test_a_hung_c_compiler_is_stopped_and_named(tmp_path, monkeypatch):
    """Every subprocess mgjit runs has a bounded wait: the C launcher's build too (it used to wait forever).
    The build's error is what `fastlaunch.load()` records before falling back to the Python launcher."""
    from mgjit import fastlaunch
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\nsleep 60\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setattr(fastlaunch, "_BUILD_TIMEOUT_S", 1)
    monkeypatch.setattr(fastlaunch, "_configured", None)
    monkeypatch.setattr(fastlaunch, "_cache_dir", lambda: tmp_path / "launcher")
    start = time.monotonic()
    with pytest.raises(RuntimeError) as failure:
        fastlaunch.module()
    assert time.monotonic() - start < 30
    assert str(failure.value) == f"building the C launcher with {cc} did not finish within 1 s"

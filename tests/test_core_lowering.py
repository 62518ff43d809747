"""CPU tests of lowering: MLIR text, PTX and the ptxas report of real kernels, compiled without a GPU for
sm_90a and sm_100a. Each kernel is compiled once per module (fixtures)."""
import os
import re
import subprocess
import sys

import pytest

import mgjit

torch = pytest.importorskip("torch")


@mgjit.kernel
def add_kernel(x, y, out, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    out[mgjit.ds(start, BLOCK)] = x[mgjit.ds(start, BLOCK)] + y[mgjit.ds(start, BLOCK)]


@mgjit.kernel
def copy_kernel(x, out, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    out[mgjit.ds(start, BLOCK)] = x[mgjit.ds(start, BLOCK)]


@mgjit.kernel
def softmax_kernel(x, out, BLOCK: mgjit.constexpr):
    row = mgjit.program_id(0)
    v = x[row, mgjit.ds(0, BLOCK)].astype(mgjit.float32)
    cols = mgjit.arange(BLOCK)
    v = mgjit.where(cols < x.shape[1], v, -float("inf"))
    e = mgjit.exp(v - v.max())
    out[row, mgjit.ds(0, BLOCK)] = (e / e.sum()).astype(out.dtype)


@mgjit.kernel
def erf_kernel(x, out, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    out[mgjit.ds(start, BLOCK)] = mgjit.erf(x[mgjit.ds(start, BLOCK)])


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    """A cache of this module's own, so that every compile below is a fresh one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MGJIT_CACHE_DIR", str(tmp_path_factory.mktemp("core-lowering-cache")))
        yield


@pytest.fixture(scope="module")
def vadd(private_cache):
    x = torch.zeros(1 << 16)
    return add_kernel.compile(x, x, x, BLOCK=1024, target="sm_90a")


@pytest.fixture(scope="module")
def softmax_bf16(private_cache):
    x = torch.zeros(64, 1000, dtype=torch.bfloat16)
    return softmax_kernel.compile(x, torch.empty_like(x), BLOCK=1024, target="sm_90a")


@pytest.fixture(scope="module")
def softmax_sm100(private_cache):
    x = torch.zeros(64, 1000, dtype=torch.bfloat16)
    return softmax_kernel.compile(x, torch.empty_like(x), BLOCK=1024, target="sm_100a")


@pytest.fixture(scope="module")
def erf_f32(private_cache):
    x = torch.zeros(1 << 16)
    return erf_kernel.compile(x, x, BLOCK=512, target="sm_90a")


def global_accesses(ptx: str) -> set[str]:
    return set(re.findall(r"\b(?:ld|st)\.global(?:\.\w+)+", ptx))


def test_vector_add_uses_16_byte_accesses(vadd):
    assert global_accesses(vadd.ptx) == {"ld.global.v4.b32", "st.global.v4.b32"}
    # 1024 float32 over 128 threads: 8 per thread, 2 loads of 16 bytes per input and 2 stores.
    assert len(re.findall(r"ld\.global\.v4\.b32", vadd.ptx)) == 4
    assert len(re.findall(r"st\.global\.v4\.b32", vadd.ptx)) == 2
    assert ".entry add_kernel(" in vadd.ptx and ".target sm_90a" in vadd.ptx


def test_unaligned_view_gives_aligned_accesses(private_cache):
    """A view starting at element 1 of a float32 tensor is 4-byte aligned only: x is read 4 bytes at a time
    (aligned, with nothing to shift: cheaper than 16-byte chunks shifted between lanes), with no bounds test
    where a block is inside the tensor; the aligned output is written 16 bytes at a time."""
    base = torch.zeros((1 << 16) + 1)
    x = base[1:]
    assert x.data_ptr() % 16 == 4
    c = copy_kernel.compile(x, torch.zeros(1 << 16), BLOCK=1024, target="sm_90a")
    assert global_accesses(c.ptx) == {"ld.global.b32", "st.global.v4.b32"}
    assert "shfl" not in c.ptx and "prmt" not in c.ptx
    assert "x: float32[rank 1, align 4, unit-stride" in c.meta["specialization"]
    aligned = copy_kernel.compile(torch.zeros(1 << 16), torch.zeros(1 << 16), BLOCK=1024, target="sm_90a")
    assert global_accesses(aligned.ptx) == {"ld.global.v4.b32", "st.global.v4.b32"}
    assert "shfl" not in aligned.ptx
    assert aligned.key != c.key


def test_transposed_view_gives_scalar_accesses(private_cache):
    """A last stride other than 1 means no contiguous vectors at all."""
    xt = torch.zeros(1024, 64, dtype=torch.bfloat16).t()
    c = softmax_kernel.compile(xt, torch.zeros(64, 1024, dtype=torch.bfloat16), BLOCK=1024, target="sm_90a")
    loads = {a for a in global_accesses(c.ptx) if a.startswith("ld")}
    assert loads == {"ld.global.b16"}
    # Its row stride is 1 element (2 bytes), so the alignment shrinks too, and it is not unit-stride.
    assert "x: bfloat16[rank 2, align 2, last%16]" in c.meta["specialization"]


def test_softmax_bf16_reduces_with_shuffles_and_smem(softmax_bf16):
    ptx = softmax_bf16.ptx
    assert "shfl.sync.bfly" in ptx  # across lanes
    assert re.search(r"\bbar\.sync\b", ptx)  # across the warps of the warpgroup, through SMEM
    assert "ex2.approx" in ptx  # exp through the hardware approximation
    assert ".shared" in ptx
    # bf16 loads of 8 elements = 16 bytes.
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx
    assert softmax_bf16.smem_bytes > 0


def test_erf_links_libdevice(erf_f32):
    ptx = erf_f32.ptx
    assert "__nv_erff" not in ptx  # resolved and inlined from libdevice, not left as an external call
    assert ".extern .func" not in ptx
    assert not re.search(r"\bcall(\.uni)?\b", ptx)
    # libdevice's erff is a polynomial: far more arithmetic than the kernel itself.
    assert len(re.findall(r"\bfma\.rn\.f32\b", ptx)) >= 8


@pytest.mark.parametrize("fixture,target", [("softmax_bf16", "sm_90a"), ("softmax_sm100", "sm_100a")])
def test_ptxas_report_is_parsed(request, fixture, target):
    c = request.getfixturevalue(fixture)
    assert c.target == target
    assert f"for '{target}'" in c.ptxas_report
    m = re.search(r"Used (\d+) registers", c.ptxas_report)
    assert m and c.registers == int(m.group(1)) > 0
    assert c.spills == 0
    assert c.meta["registers"] == c.registers and c.meta["spills"] == 0
    assert c.threads == 128
    assert f".target {target}" in c.ptx
    assert c.cubin[:4] == b"\x7fELF"


def test_sm100_uses_a_newer_ptx_isa(softmax_bf16, softmax_sm100):
    def isa(ptx):
        return tuple(map(int, re.search(r"^\.version (\d+)\.(\d+)", ptx, re.M).groups()))
    assert isa(softmax_sm100.ptx) > isa(softmax_bf16.ptx) >= (8, 0)


def test_mlir_text(softmax_bf16, softmax_sm100):
    for c, target in ((softmax_bf16, "sm_90a"), (softmax_sm100, "sm_100a")):
        assert "gpu.module @mgjit" in c.mlir
        assert re.search(r'#nvvm\.target<[^>]*chip = "' + target + '"', c.mlir)
        assert "llvm.func @softmax_kernel(" in c.mlir
        assert "gpu.kernel" in c.mlir and "nvvm.kernel" in c.mlir


def test_inspect_shows_ir_and_ptxas(private_cache):
    x = torch.zeros(64, 1000, dtype=torch.bfloat16)
    text = softmax_kernel.inspect(x, torch.empty_like(x), BLOCK=1024, target="sm_90a")
    assert text.startswith("CompiledKernel(softmax_kernel, sm_90a, registers=")
    assert "--- IR (layouts inferred) ---\nkernel @softmax_kernel(" in text
    assert "= reduce {kind=max, axes=(0,)}" in text and "TiledLayout(" in text
    assert "Used " in text and " registers" in text


def test_unknown_target_is_a_compile_error(private_cache):
    x = torch.zeros(1024)
    with pytest.raises(mgjit.CompileError, match=r"unknown target 'sm_80'"):
        copy_kernel.compile(x, x, BLOCK=1024, target="sm_80")


FORK_AFTER_COMPILE = '''\
import gc, os, signal, sys
import torch
import mgjit


@mgjit.kernel
def copy_kernel(x, out, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)]


@mgjit.kernel
def bad_kernel(out):
    out[mgjit.ds(0, 1000)] = 1.0  # fails in lowering, after its MLIR context exists


x = torch.zeros(1024)
copy_kernel.compile(x, x, BLOCK=1024)
try:
    bad_kernel.compile(x)
except mgjit.CompileError as e:
    saved = e
saved.cycle = saved  # the error (and through its traceback, the context) waits for the cycle collector
del saved
pid = os.fork()  # as autotune's compile pool does
if pid == 0:
    signal.alarm(10)  # a hang ends in SIGALRM (a healthy compile takes well under a second)
    gc.collect()  # collects the parent's MLIR context in the child
    copy_kernel.compile(x, x, BLOCK=512)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit", os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))
'''


def test_forked_child_can_collect_the_parents_mlir_context(tmp_path):
    script = tmp_path / "fork_after_compile.py"
    script.write_text(FORK_AFTER_COMPILE)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MGJIT_CACHE_DIR": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "child exit 0"

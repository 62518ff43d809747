"""CPU tests of the Blackwell path: TMEM references, tcgen05 MMA and TMEM loads, compiled for sm_100a.

There is no Blackwell GPU here, so these check what can be checked without one: the examples compile to cubins
for sm_100a with no spills; their PTX holds the tcgen05 instructions with the expected shapes, CTA groups and
instruction descriptors; layout inference gives every MMA shape/collective combination its TMEM layout and the
matching register layout; and bad kernels are CompileErrors naming the kernel line. Inference-only tests drive
the frontend directly (no MLIR, no ptxas). Two GPU tests: one runs on a Hopper (launching a Blackwell kernel
stops with a LaunchError), one on a Blackwell (the example's three variants against torch).
"""
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mgjit
from mgjit import dtypes, frontend, infer, ir, ops
from mgjit.layouts import TCGEN05, WGMMA
from mgjit.mma_descriptors import Major, Tcgen05InstrDescriptor
from mgjit.tmem_layouts import TMEMLayoutKind, m64_collective_register_layout

torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BF16, F32 = dtypes.bfloat16, dtypes.float32


def load_example(name: str):
    """examples/<name>.py as a module (the examples directory is not a package: the modules it imports, _device
    and the like, are found on sys.path, as the examples run as scripts find them)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = load_example("matmul_blackwell")


def line_of(kernel, text: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def trace(kernel, params, consts) -> ir.Kernel:
    k = frontend.trace(mgjit.source.SourceFunction(kernel.fn), params, consts, kernel.num_warpgroups)
    infer.infer_layouts(k)
    return k


def tensor(name, dtype=BF16):
    return ir.Param(name, "tensor", dtype, 2)


MATMUL_PARAMS = [tensor("a"), tensor("b"), tensor("c")]


# ---------------------------------------------------------------------------------------------- the examples

@pytest.fixture(scope="module")
def built():
    """The example's three variants, compiled for sm_100a exactly as its script does (meta tensors)."""
    (a, b), out = example.setup("meta")
    return dict(zip(example.CONFIGS, example.compile(a, b, out, target="sm_100a"), strict=True))


@pytest.mark.parametrize("variant", list(example.CONFIGS))
def test_example_compiles_for_sm100a_without_spills(built, variant):
    c = built[variant]
    assert c.target == "sm_100a"
    assert "for 'sm_100a'" in c.ptxas_report
    assert c.cubin[:4] == b"\x7fELF"
    assert c.spills == 0 and "0 bytes spill stores, 0 bytes spill loads" in c.ptxas_report
    assert 0 < c.registers <= 168
    assert re.search(r"^\.target sm_100a$", c.ptx, re.M)
    assert c.smem_bytes <= 232448
    assert c.meta["cluster"] == ([2, 1, 1] if variant == "2cta" else [1, 1, 1])


def idesc(m, n):
    return Tcgen05InstrDescriptor(m, n, BF16, BF16, F32, Major.K, Major.MN).encode()


# variant -> (CTA group, the instruction's M and N, tcgen05.mma per K tile of BK = 64, TMEM columns allocated)
EXPECTED = {"1cta": (1, 128, 256, 4, 256), "2cta": (2, 256, 256, 4, 256), "m64": (1, 64, 64, 8, 64)}


@pytest.mark.parametrize("variant", list(example.CONFIGS))
def test_example_ptx_has_tcgen05_with_the_expected_shapes(built, variant):
    ptx = built[variant].ptx
    group, m, n, per_k_tile, columns = EXPECTED[variant]
    g = f"cta_group::{group}"
    assert re.search(rf"tcgen05\.alloc\.{g}\.sync\.aligned\.shared::cta\.b32 \[%r\d+\], {columns};", ptx)
    assert f"tcgen05.relinquish_alloc_permit.{g}.sync.aligned;" in ptx
    assert re.search(rf"tcgen05\.dealloc\.{g}\.sync\.aligned\.b32 %r\d+, {columns};", ptx)
    mmas = re.findall(rf"@%p\d+ tcgen05\.mma\.{g}\.kind::f16 \[%r\d+\], %rd\d+, %rd\d+, %r\d+, %p\d+;", ptx)
    assert mmas and len(mmas) % per_k_tile == 0, mmas
    assert "tcgen05.mma" not in ptx.replace(f"tcgen05.mma.{g}.kind::f16", "")
    # The instruction descriptor (M >> 4 at bit 24, N >> 3 at bit 17, bf16 x bf16 -> f32, B N-major).
    assert re.search(rf"mov\.b32\s+%r\d+, {idesc(m, n)};", ptx), idesc(m, n)
    commit = f"tcgen05.commit.{g}.mbarrier::arrive::one.shared::cluster"
    if group == 2:
        assert re.search(rf"{re.escape(commit)}\.multicast::cluster\.b64 \[%r\d+\], %rs\d+;", ptx)
        assert "cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
        assert "mapa.shared::cluster.u32" in ptx and "barrier.cluster.wait.acquire.aligned" in ptx
    else:
        assert re.search(rf"{re.escape(commit)}\.b64 \[%r\d+\];", ptx)
        assert "cta_group::2" not in ptx and "multicast" not in ptx
    # The epilogue: 16x256b loads of 32 registers, then one wait that the loaded registers pass through.
    loads = re.findall(r"tcgen05\.ld\.sync\.aligned\.16x256b\.x8\.b32 \{(?:%r\d+, ){31}%r\d+\}, \[%r\d+\];", ptx)
    assert len(loads) == (2 if variant == "m64" else 8)
    assert "tcgen05.wait::ld.sync.aligned;" in ptx
    assert "tcgen05.fence::before_thread_sync;" in ptx and "tcgen05.fence::after_thread_sync;" in ptx


def test_epilogue_through_smem_and_tma_or_straight_to_gmem(built):
    for c in built.values():  # TMEM -> registers -> swizzled SMEM -> TMA store, two tiles in flight
        assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in c.ptx
        assert "cp.async.bulk.wait_group.read 1;" in c.ptx and "st.shared.b32" in c.ptx
    (a, b), out = example.setup("meta")
    direct = example.matmul_kernel.compile(a, b, out, **example.CONFIGS["1cta"], TMA_STORE=False, target="sm_100a")
    assert direct.spills == 0
    assert "bulk_group" not in direct.ptx and re.search(r"@%p\d+ st\.global\.b32", direct.ptx)


def test_m64_collective_variant_compiles():
    """2-CTA M = 128: each CTA's 64-row accumulator in the m64-collective layout, read whole into registers."""
    (a, b), out = example.setup("meta")
    cfg = {**example.CONFIGS["2cta"], "BM": 64, "BN": 128}
    c = example.matmul_kernel.compile(a, b, out, **cfg, target="sm_100a", cluster=(2, 1, 1))
    assert c.spills == 0
    assert re.search(rf"mov\.b32\s+%r\d+, {idesc(128, 128)};", c.ptx)
    assert "tcgen05.mma.cta_group::2.kind::f16" in c.ptx
    assert len(re.findall(r"tcgen05\.ld\.sync\.aligned\.16x256b\.x8\.b32", c.ptx)) == 2
    assert "tmem_layout=m64 collective, cta_group=2" in c.ir


def test_half_lane_mma_writes_two_lane_halves(built):
    """M = 64: two MMAs per K step whose D addresses differ by 16 lanes (16 << 16)."""
    ptx = built["m64"].ptx
    d = re.findall(r"tcgen05\.mma\.cta_group::1\.kind::f16 \[(%r\d+)\]", ptx)
    assert len(set(d)) == 2
    hi = sorted(set(d))
    assert any(re.search(rf"add\.s32\s+{re.escape(x)}, {re.escape(y)}, 1048576;", ptx) for x in hi for y in hi)


def test_example_ir_shows_tmem_layouts_and_mma_shapes(built):
    text = built["2cta"].ir
    assert re.search(r"tmem_alloc \{shape=\(128, 256\), dtype=float32, packing=1, collective=True\}\(\) : "
                     r"ref<tmem, float32\[128,256\], collective> TMEMLayout\(kind=<TMEMLayoutKind\.DEFAULT", text)
    assert "tcgen05_mma {m=256, n=256, k=64, kind=f16, tmem_layout=default, cta_group=2, a=smem}" in text
    assert "tcgen05_commit {cta_group=2}" in text
    assert re.search(r"tma_load \{descriptor=\d, collective=True\}", text)
    assert "tmem_dealloc(" in text.splitlines()[-2]
    m64 = built["m64"].ir
    assert "tcgen05_mma {m=64, n=128, k=64, kind=f16, tmem_layout=half-lane, cta_group=1, a=smem}" in m64


def test_example_runs_as_a_script_without_a_gpu(built):
    """Compile-only for sm_100a without a GPU (the fixture filled this session's cache: usually hits)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, str(EXAMPLES / "matmul_blackwell.py")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "== mgjit example: matmul_blackwell ==" in out
    assert len(re.findall(r"^target +sm_100a$", out, re.M)) == 3
    assert len(re.findall(r"^resources +\d+ registers, 0 bytes spilled, \d+ bytes dynamic smem, 128 threads$", out,
                          re.M)) == 3
    assert len(re.findall(r"^cache +(cache hit|compiled in [\d.]+ s): ", out, re.M)) == 3
    assert "no GPU: compiled for sm_100a, not run" in out


# ---------------------------------------------------------------------------------------------- inference

COMBOS = [  # (rows per CTA, collective) -> MMA M, TMEM layout, register layout of a TMEM load of (rows, 128)
    (128, False, 128, TMEMLayoutKind.DEFAULT, TCGEN05),
    (64, False, 64, TMEMLayoutKind.HALF_LANE, WGMMA),
    (128, True, 256, TMEMLayoutKind.DEFAULT, TCGEN05),
    (64, True, 128, TMEMLayoutKind.M64_COLLECTIVE, m64_collective_register_layout(128, 32)),
]


@pytest.mark.parametrize("rows,collective,m,kind,registers", COMBOS,
                         ids=[f"{'2cta' if c[1] else '1cta'}-M{c[2]}" for c in COMBOS])
def test_inferred_tmem_layout_per_mma_shape(rows, collective, m, kind, registers):
    cfg = dict(BM=rows, BN=128, BK=64, STAGES=2, COLLECTIVE=collective, EPI_N=64, TMA_STORE=True)
    k = trace(example.matmul_kernel, MATMUL_PARAMS, cfg)
    (alloc,) = [op for op in k.walk() if isinstance(op, ops.TmemAlloc)]
    assert alloc.result.layout.kind is kind and alloc.result.layout.shape == (rows, 128)
    (mma,) = [op for op in k.walk() if isinstance(op, ops.Tcgen05Mma)]
    assert mma.mnk == (m, 128, 64)
    assert mma.attrs()["tmem_layout"] == kind.value and mma.attrs()["cta_group"] == (2 if collective else 1)
    loads = [op for op in k.walk() if isinstance(op, ops.TmemLoad)]
    assert loads and all(op.result.layout == registers for op in loads)
    text = ir.format_kernel(k)
    assert f"tcgen05_mma {{m={m}, n=128, k=64, kind=f16, tmem_layout={kind.value}" in text
    assert all(op.cta_group == (2 if collective else 1) for op in k.walk() if isinstance(op, ops.Tcgen05Commit))


@mgjit.kernel
def tmem_roundtrip(x, y, ROWS: mgjit.constexpr, COLS: mgjit.constexpr, DT: mgjit.constexpr,
                   PACKING: mgjit.constexpr):
    t = mgjit.tmem((ROWS, COLS), DT, packing=PACKING)
    t.store(x[0:ROWS, 0:COLS])
    y[0:ROWS, 0:COLS] = t.load() + t.load()


@pytest.mark.parametrize("rows,cols,dt,packing,layout", [
    (128, 64, BF16, 2, TCGEN05), (128, 64, BF16, 1, TCGEN05), (128, 64, F32, 1, TCGEN05), (64, 128, BF16, 2, WGMMA),
    (64, 64, F32, 1, WGMMA)])
def test_tmem_store_and_load_use_the_matching_register_layout(rows, cols, dt, packing, layout):
    k = trace(tmem_roundtrip, [tensor("x", dt), tensor("y", dt)],
              dict(ROWS=rows, COLS=cols, DT=dt, PACKING=packing))
    (alloc,) = [op for op in k.walk() if isinstance(op, ops.TmemAlloc)]
    assert alloc.result.type.packing == packing
    assert [op.result.layout for op in k.walk() if isinstance(op, ops.TmemLoad)] == [layout, layout]
    (store,) = [op for op in k.walk() if isinstance(op, ops.TmemStore)]
    assert store.operands[1].layout == layout
    assert isinstance(store.operands[1].owner, ops.Load)  # loaded straight into the layout: no relayout
    assert not any(isinstance(op, ops.Relayout) for op in k.walk())


def test_tmem_roundtrip_compiles_with_st_and_ld_shapes():
    x = torch.empty(128, 64, dtype=torch.bfloat16, device="meta")
    c = tmem_roundtrip.compile(x, x, ROWS=128, COLS=64, DT=mgjit.bfloat16, PACKING=1, target="sm_100a")
    assert c.spills == 0
    # Unpacked 16-bit data: one element per column, two per register through .pack::16b / .unpack::16b.
    assert re.search(r"tcgen05\.st\.sync\.aligned\.16x128b\.x\d+\.unpack::16b\.b32 \[%r\d+\]", c.ptx)
    assert re.search(r"tcgen05\.ld\.sync\.aligned\.16x128b\.x\d+\.pack::16b\.b32", c.ptx)
    assert "tcgen05.wait::st.sync.aligned;" in c.ptx
    # 64 unpacked bf16 columns are 64 TMEM columns; packed two to a column they are 32 (the smallest allocation).
    assert re.search(r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32 \[%r\d+\], 64;", c.ptx)
    packed = tmem_roundtrip.compile(x, x, ROWS=128, COLS=64, DT=mgjit.bfloat16, PACKING=2, target="sm_100a")
    assert re.search(r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32 \[%r\d+\], 32;", packed.ptx)
    assert re.search(r"tcgen05\.st\.sync\.aligned\.16x128b\.x\d+\.b32 \[%r\d+\]", packed.ptx)  # no unpacking
    assert "pack::16b" not in packed.ptx


@mgjit.kernel
def mma_kinds(a, b, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr, A_TMEM: mgjit.constexpr):
    b_s = mgjit.smem((BN, BK), b.dtype, swizzle=128)
    bar = mgjit.barrier(1, arrivals=2)
    done = mgjit.barrier(1, arrivals=1)
    acc = mgjit.tmem((BM, BN), mgjit.float32)
    if A_TMEM:
        a_t = mgjit.tmem((BM, BK), a.dtype)
        a_t.store(a[0:BM, 0:BK])
        bar[0].arrive()
        mgjit.copy_async(b, (0, 0), b_s, barrier=bar[0])
        bar[0].wait()
        mgjit.tcgen05_mma(acc, a_t, b_s.T, accumulate=False)
    else:
        a_s = mgjit.smem((BM, BK), a.dtype, swizzle=128)
        mgjit.copy_async(a, (0, 0), a_s, barrier=bar[0])
        mgjit.copy_async(b, (0, 0), b_s, barrier=bar[0])
        bar[0].wait()
        mgjit.tcgen05_mma(acc, a_s, b_s.T, accumulate=False)
    mgjit.tcgen05_commit(done[0])
    done[0].wait()
    c[0:BM, 0:BN] = acc[:, 0:BN].load()


@pytest.mark.parametrize("dtype,kind,a_tmem", [
    (torch.float32, "tf32", False), (torch.float8_e4m3fn, "f8f6f4", False), (torch.float16, "f16", False),
    (torch.bfloat16, "f16", True)])
def test_mma_kinds_and_a_from_tmem_compile(dtype, kind, a_tmem):
    x = torch.empty(256, 256, dtype=dtype, device="meta")
    out = torch.empty(256, 256, dtype=torch.float32, device="meta")
    bk = 128 // x.element_size()  # one 128-byte swizzle row
    c = mma_kinds.compile(x, x, out, BM=128, BN=128, BK=bk, A_TMEM=a_tmem, target="sm_100a")
    assert c.spills == 0
    a = r"\[%r\d+\]" if a_tmem else r"%rd\d+"
    mmas = re.findall(rf"tcgen05\.mma\.cta_group::1\.kind::{kind} \[%r\d+\], {a}, %rd\d+, %r\d+, %p\d+;", c.ptx)
    assert len(mmas) == bk * x.element_size() // 32  # one instruction per 32 bytes of K
    desc = Tcgen05InstrDescriptor(128, 128, mgjit.dtypes.from_torch(dtype), mgjit.dtypes.from_torch(dtype), F32,
                                  Major.K, Major.K)
    assert re.search(rf"mov\.b32\s+%r\d+, {desc.encode()};", c.ptx)


# ---------------------------------------------------------------------------------------------- errors

def assert_error_at(excinfo, kernel, text, rule, phrase):
    e = excinfo.value
    assert e.loc is not None and e.loc.line == line_of(kernel, text), (e.loc, str(e))
    assert e.rule == rule, (e.rule, str(e))
    assert re.search(phrase, e.message), e.message
    assert text in str(e)  # the message quotes the kernel's source line


@mgjit.kernel
def bad_tmem(x, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    acc = mgjit.tmem((ROWS, COLS), mgjit.float32)
    x[0:ROWS, 0:COLS] = acc.load()


@pytest.mark.parametrize("rows,cols,rule,phrase", [
    (128, 96, "tmem-alloc", r"power of two in 32\.\.512 columns.*occupies 96 columns"),
    (128, 1024, "tmem-layout", r"needs 1024 TMEM columns, more than the 512"),
    (96, 128, "tmem-layout", r"128 rows .* or 64 rows .*got 96"),
    (64, 96, "tmem-alloc", r"half-lane layout .* occupies 48 columns"),
    (64, 32, "tmem-alloc", r"occupies 16 columns; .* at least 32"),
])
def test_bad_tmem_shapes_are_compile_errors(rows, cols, rule, phrase):
    with pytest.raises(mgjit.CompileError) as excinfo:
        trace(bad_tmem, [tensor("x", F32)], dict(ROWS=rows, COLS=cols))
    assert_error_at(excinfo, bad_tmem, "acc = mgjit.tmem((ROWS, COLS), mgjit.float32)", rule, phrase)


def test_tcgen05_compiled_for_sm90a_is_a_compile_error():
    x = torch.empty(128, 128, dtype=torch.float32, device="meta")
    with pytest.raises(mgjit.CompileError) as excinfo:
        bad_tmem.compile(x, ROWS=128, COLS=128, target="sm_90a")
    assert_error_at(excinfo, bad_tmem, "acc = mgjit.tmem((ROWS, COLS), mgjit.float32)", "target-arch",
                    r"needs sm_100a \(Blackwell\).*compiled for sm_90a \(Hopper\)")


def test_example_compiled_for_sm90a_is_a_compile_error():
    (a, b), out = example.setup("meta")
    with pytest.raises(mgjit.CompileError) as excinfo:
        example.matmul_kernel.compile(a, b, out, **example.CONFIGS["1cta"], target="sm_90a")
    assert excinfo.value.rule == "target-arch" and "needs sm_100a (Blackwell)" in str(excinfo.value)
    assert excinfo.value.loc.line == line_of(example.matmul_kernel, "acc = mgjit.tmem(")


def test_collective_kernel_needs_a_cluster_of_pairs():
    (a, b), out = example.setup("meta")
    with pytest.raises(mgjit.CompileError, match=r"cluster of an even number of CTAs") as excinfo:
        example.matmul_kernel.compile(a, b, out, **example.CONFIGS["2cta"], target="sm_100a")
    assert excinfo.value.rule == "cta-group"


@mgjit.kernel
def bad_mma(a, b, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr, COLLECTIVE: mgjit.constexpr):
    a_s = mgjit.smem((BM, BK), a.dtype, swizzle=128)
    b_s = mgjit.smem((BK, BN), b.dtype, swizzle=128)
    acc = mgjit.tmem((BM, 128), mgjit.float32, collective=COLLECTIVE)
    mgjit.tcgen05_mma(acc, a_s, b_s)
    c[0:BM, 0:128] = acc.load()


@pytest.mark.parametrize("a_dtype,bm,bn,bk,collective,phrase", [
    (BF16, 128, 64, 64, False, r"shapes do not chain: acc \(128, 128\), a \(128, 64\), b \(64, 64\)"),
    (BF16, 128, 128, 64, True, r"per CTA: acc \(M/2, N\), a \(M/2, K\), b \(K, N/2\)"),
    (dtypes.float8_e4m3fn, 128, 128, 128, False, r"A is float8_e4m3fn \(kind f8f6f4\) but B is bfloat16"),
])
def test_bad_mma_shapes_are_compile_errors(a_dtype, bm, bn, bk, collective, phrase):
    with pytest.raises(mgjit.CompileError) as excinfo:
        trace(bad_mma, [tensor("a", a_dtype), tensor("b"), tensor("c", F32)],
              dict(BM=bm, BN=bn, BK=bk, COLLECTIVE=collective))
    assert_error_at(excinfo, bad_mma, "mgjit.tcgen05_mma(acc, a_s, b_s)", "tcgen05-shape", phrase)


@mgjit.kernel
def tmem_in_loop(x, n):
    for _ in range(n):
        t = mgjit.tmem((128, 32), mgjit.float32)
        x[0:128, 0:32] = t.load()


@mgjit.kernel
def mixed_groups(x):
    t = mgjit.tmem((128, 32), mgjit.float32)
    u = mgjit.tmem((128, 32), mgjit.float32, collective=True)
    x[0:128, 0:32] = t.load() + u.load()


@mgjit.kernel
def barrier_after_tmem(x):
    t = mgjit.tmem((128, 32), mgjit.float32, collective=True)
    bars = mgjit.barrier(1)
    mgjit.tcgen05_commit(bars[0])
    x[0:128, 0:32] = t.load()


@mgjit.kernel
def slice_half_lane(x):
    t = mgjit.tmem((64, 64), mgjit.float32)
    x[0:64, 0:32] = t[:, 0:32].load()


@pytest.mark.parametrize("kernel,params,text,rule,phrase", [
    (tmem_in_loop, [tensor("x", F32), ir.Param("n", "scalar", dtypes.int32)],
     "t = mgjit.tmem((128, 32), mgjit.float32)", "tmem-alloc", r"at the kernel's top level"),
    (mixed_groups, [tensor("x", F32)], "u = mgjit.tmem((128, 32), mgjit.float32, collective=True)", "cta-group",
     r"one CTA group"),
    (barrier_after_tmem, [tensor("x", F32)], "bars = mgjit.barrier(1)", "cta-group", r"allocate barriers before"),
    (slice_half_lane, [tensor("x", F32)], "x[0:64, 0:32] = t[:, 0:32].load()", "tmem-layout",
     r"column slices are taken of 128-row"),
])
def test_kernel_wide_tmem_rules_are_compile_errors(kernel, params, text, rule, phrase):
    with pytest.raises(mgjit.CompileError) as excinfo:
        trace(kernel, params, {})
    assert_error_at(excinfo, kernel, text, rule, phrase)


# ---------------------------------------------------------------------------------------------- GPU

def _capability():
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


@pytest.mark.gpu
def test_blackwell_kernel_on_hopper_stops_before_launch():
    """On a Hopper GPU a kernel that uses tcgen05 raises a LaunchError naming sm_100a, and launches nothing."""
    if _capability() != (9, 0):
        pytest.skip("needs a Hopper GPU (sm_90)")
    a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    c = torch.full((256, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    for variant in example.CONFIGS:
        with pytest.raises(mgjit.LaunchError, match=r"needs sm_100a \(Blackwell\); this GPU is sm_90 ") as excinfo:
            example.matmul(a, b, out=c, variant=variant)
        assert "acc = mgjit.tmem(" in str(excinfo.value)  # the kernel line that needs Blackwell
    torch.cuda.synchronize()
    assert c.isnan().all()  # nothing ran


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(example.CONFIGS))
@pytest.mark.parametrize("m,n,k", [(256, 256, 64), (1000, 3000, 2000), (4096, 4096, 4096)])
def test_blackwell_matmul_matches_torch(variant, m, n, k):
    if _capability() != (10, 0):
        pytest.skip("needs a Blackwell GPU (sm_100)")
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    example.matmul(a, b, out=c, variant=variant)
    ref = a.float() @ b.float()
    assert not c.isnan().any()
    assert ((c.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2

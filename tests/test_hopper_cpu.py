"""Hopper machinery on the CPU: the example matmul's PTX and ptxas report for sm_90a, and bad
configurations rejected before ptxas with the kernel's line and the broken rule."""
import inspect
import math
import os
import re
import sys

import pytest

import mgjit

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import matmul_hopper as mh  # noqa: E402

BF16 = torch.bfloat16


def _compile(config: dict, dtype=BF16, **extra):
    x = torch.empty(4096, 4096, dtype=dtype)
    out = torch.empty(4096, 4096, dtype=BF16)
    scale, bias = torch.empty(1), torch.empty(4096, dtype=BF16)
    return mh.matmul_kernel.compile(x, x, out, scale, bias, out, out, **{**mh.DEFAULT_CONFIG, **config}, **extra,
                                    target="sm_90a")


@pytest.fixture(scope="module")
def default_kernel():
    return _compile({})


def test_ptx_has_the_hopper_instructions(default_kernel):
    ptx = default_kernel.ptx
    for instr in ("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "cp.async.bulk.tensor.2d.shared::cluster",
                  "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx", "wgmma.wait_group.sync.aligned 1",
                  "setmaxnreg.inc.sync.aligned.u32 232", "setmaxnreg.dec.sync.aligned.u32 40",
                  "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group", "cp.async.bulk.wait_group.read 0",
                  "fence.proxy.async.shared::cta"):
        assert instr in ptx, instr
    assert ".param .align 64 .b8" in ptx  # TMA descriptors passed by value


@pytest.mark.parametrize("config", [{}, {"TMA_STORE": False, "STAGES": 4}, {"BN": 128, "STAGES": 4},
                                    {"BN": 64, "STAGES": 6}, {"BIAS": True, "ACTIVATION": "gelu"}])
def test_ptxas_reports_no_spills(config):
    c = _compile(config)
    assert c.spills == 0, c.ptxas_report
    assert 0 < c.registers <= 168
    assert c.smem_bytes <= 232448


@pytest.mark.parametrize("dtype,bk,instr", [(torch.float8_e4m3fn, 128, "m64n256k32.f32.e4m3.e4m3"),
                                            (torch.float32, 32, "m64n256k8.f32.tf32.tf32"),
                                            (torch.float16, 64, "m64n256k16.f32.f16.f16")])
def test_other_input_types(dtype, bk, instr):
    c = _compile({"BK": bk, "TMA_STORE": False, "STAGES": 3}, dtype=dtype, B_KMAJOR=True)
    assert instr in c.ptx and c.spills == 0


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@mgjit.kernel
def tile_kernel(a, c, ROWS: mgjit.constexpr, COLS: mgjit.constexpr, ACC_N: mgjit.constexpr,
                SWIZZLE: mgjit.constexpr, STAGES: mgjit.constexpr):
    a_s = mgjit.smem((STAGES, ROWS, COLS), a.dtype, swizzle=SWIZZLE)  # the tile under test
    x_s = mgjit.smem((64, 64), a.dtype, swizzle=128)
    b_s = mgjit.smem((64, ACC_N), a.dtype, swizzle=128)
    bars = mgjit.barrier(1, arrivals=3)
    mgjit.copy_async(a, (0, 0), a_s[0], barrier=bars[0])
    mgjit.copy_async(a, (0, 0), x_s, barrier=bars[0])
    mgjit.copy_async(a, (0, 0), b_s, barrier=bars[0])
    bars[0].wait()
    acc = mgjit.zeros((64, ACC_N), mgjit.float32)
    acc = mgjit.wgmma(acc, x_s, b_s)
    mgjit.wgmma_wait(0)
    c[mgjit.ds(0, 64), mgjit.ds(0, ACC_N)] = acc


def _bad(**cfg):
    base = dict(ROWS=64, COLS=64, ACC_N=64, SWIZZLE=128, STAGES=1)
    x = torch.empty(256, 256, dtype=BF16)
    with pytest.raises(mgjit.CompileError) as info:
        tile_kernel.compile(x, torch.empty(256, 256), **{**base, **cfg}, target="sm_90a")
    return info.value


def test_a_good_tile_kernel_compiles():
    x = torch.empty(256, 256, dtype=BF16)
    c = tile_kernel.compile(x, torch.empty(256, 256), ROWS=64, COLS=64, ACC_N=64, SWIZZLE=128, STAGES=1)
    assert "wgmma.mma_async.sync.aligned.m64n64k16" in c.ptx and c.spills == 0


@mgjit.kernel
def swizzled_operands_kernel(a, c, SWIZZLE: mgjit.constexpr):
    a_s = mgjit.smem((64, 64), a.dtype, swizzle=SWIZZLE)
    b_s = mgjit.smem((64, 64), a.dtype, swizzle=SWIZZLE)
    bars = mgjit.barrier(1, arrivals=2)
    mgjit.copy_async(a, (0, 0), a_s, barrier=bars[0])
    mgjit.copy_async(a, (0, 0), b_s, barrier=bars[0])
    bars[0].wait()
    acc = mgjit.wgmma(mgjit.zeros((64, 64), mgjit.float32), a_s, b_s)
    mgjit.wgmma_wait(0)
    c[mgjit.ds(0, 64), mgjit.ds(0, 64)] = acc


@pytest.mark.parametrize("swizzle,code", [(128, 1), (64, 2), (32, 3)])
def test_wgmma_operands_of_every_swizzle_lower(swizzle, code):
    """The 64B and 32B swizzle codes set bit 63 of the SMEM descriptor: its constant is an i64 past 2^63 - 1."""
    x = torch.empty(256, 256, dtype=BF16)
    c = swizzled_operands_kernel.compile(x, torch.empty(256, 256), SWIZZLE=swizzle, target="sm_90a")
    constants = {int(v) % 2 ** 64 for v in re.findall(r"or\.b64\s+%rd\d+, %rd\d+, (-?\d+);", c.ptx)}
    assert constants and {v >> 62 for v in constants} == {code}


def test_swizzle_wider_than_the_tile_row():
    err = _bad(COLS=32)  # 32 bf16 = 64-byte rows under a 128-byte swizzle
    assert err.rule == "swizzle-width"
    assert err.loc.line == _line_of(tile_kernel.fn, "a_s = mgjit.smem")
    assert "128B swizzle" in str(err) and "64 bytes" in str(err)


def test_shared_memory_over_the_device_limit():
    err = _bad(ROWS=256, COLS=128, STAGES=4)  # 4 x 64 KiB
    assert err.rule == "smem-budget"
    assert err.loc.line == _line_of(tile_kernel.fn, "a_s = mgjit.smem")
    assert "232448" in str(err)


def test_wgmma_shape_the_hardware_lacks():
    err = _bad(ACC_N=320)  # N = 320 > 256
    assert err.rule == "wgmma-shape"
    assert err.loc.line == _line_of(tile_kernel.fn, "acc = mgjit.wgmma")
    assert "N a multiple of 8 in 8..256" in str(err)


def test_tile_rows_not_a_multiple_of_8():
    err = _bad(ROWS=60)  # also what makes a K-major B's N (its rows) not a multiple of 8
    assert err.rule == "swizzle-width"
    assert "multiple of 8 rows" in str(err)


def test_tma_box_limit():
    err = _bad(ROWS=512)
    assert err.rule == "tma-box"
    assert err.loc.line == _line_of(tile_kernel.fn, "mgjit.copy_async")


def test_fp8_operand_must_be_k_major():
    x = torch.empty(4096, 4096, dtype=torch.float8_e4m3fn)
    with pytest.raises(mgjit.CompileError) as info:
        mh.matmul_kernel.compile(x, x, x, x, x, x, x, **{**mh.DEFAULT_CONFIG, "BK": 128, "TMA_STORE": False})
    assert info.value.rule == "wgmma-shape" and "K-major" in str(info.value)


def test_wgmma_compiled_for_blackwell_is_a_compile_error():
    """Blackwell has tcgen05, not wgmma: compiling a wgmma kernel for sm_100a stops at the wgmma line, naming the
    target it needs (a launch on a Blackwell GPU turns this into a LaunchError naming sm_90a)."""
    x = torch.empty(256, 256, dtype=BF16)
    with pytest.raises(mgjit.CompileError) as info:
        tile_kernel.compile(x, torch.empty(256, 256), ROWS=64, COLS=64, ACC_N=64, SWIZZLE=128, STAGES=1,
                            target="sm_100a")
    err = info.value
    assert err.rule == "target-arch" and err.required_target == "sm_90a"
    assert err.loc.line == _line_of(tile_kernel.fn, "acc = mgjit.wgmma")
    assert "needs sm_90a (Hopper): the warpgroup MMA (wgmma) exists only there" in str(err)
    assert "compiled for sm_100a (Blackwell)" in str(err)


def test_tma_needs_aligned_rows():
    base = torch.empty(256, 333, dtype=BF16)  # 666-byte rows
    with pytest.raises(mgjit.CompileError) as info:
        tile_kernel.compile(base, torch.empty(256, 256), ROWS=64, COLS=64, ACC_N=64, SWIZZLE=128, STAGES=1)
    assert info.value.rule == "tma-alignment" and "`a`" in str(info.value)


def test_pipeline_helper_compiles_without_spills():
    sys.path.insert(0, os.path.dirname(__file__))
    from test_gpu_matmul import pipe_matmul, ws_pipe_matmul
    x = torch.empty(1024, 1024, dtype=BF16)
    for kernel in (pipe_matmul, ws_pipe_matmul):
        c = kernel.compile(x, x, x, BM=128, BN=128, BK=64, STAGES=4, target="sm_90a")
        assert c.spills == 0 and "wgmma.mma_async" in c.ptx and "mbarrier.try_wait" in c.ptx
    ws = ws_pipe_matmul.compile(x, x, x, BM=128, BN=128, BK=64, STAGES=4)
    assert "mbarrier.arrive.shared::cta" in ws.ptx  # consumers release slots to the producer


@mgjit.kernel(num_warpgroups=2)
def ws_registers_kernel(a, b, c, BK: mgjit.constexpr):
    acc = mgjit.zeros((64, 64), mgjit.float32)
    for k, a_t, b_t in mgjit.pipeline(4, mgjit.tile(a, (0, 0), (64, BK), (0, BK)),
                                      mgjit.tile(b, (0, 0), (BK, 64), (BK, 0)), stages=2,
                                      warp_specialize=True, registers=(40, 232)):
        acc = mgjit.wgmma(acc, a_t, b_t)
    c[mgjit.ds(0, 64), mgjit.ds(0, 64)] = acc.astype(c.dtype)


def test_pipeline_registers_with_state_leaving_the_loop_is_an_error():
    x = torch.empty(256, 256, dtype=BF16)
    with pytest.raises(mgjit.CompileError) as info:
        ws_registers_kernel.compile(x, x, x, BK=64)
    assert info.value.rule == "registers" and "`acc`" in str(info.value)
    assert info.value.loc.line == _line_of(ws_registers_kernel.fn, "for k, a_t, b_t")


def test_wgmma_a_from_registers_loads_straight_into_the_fragment_layout():
    sys.path.insert(0, os.path.dirname(__file__))
    from test_gpu_matmul import a_from_registers
    x, y = torch.empty(256, 64, dtype=BF16), torch.empty(64, 128, dtype=BF16)
    c = a_from_registers.compile(x, y, torch.empty(256, 128), K=64, N=128)
    assert c.spills == 0
    instr = next(line for line in c.ptx.splitlines() if "wgmma.mma_async" in line)
    assert "m64n128k16.f32.bf16.bf16" in instr and instr.count("%r") >= 64 + 4
    load = next(line for line in c.ir.splitlines() if "= load" in line)
    assert "Tiling((64, 8)(16, 8)(8, 8)(2))" in load  # the WGMMA layout: no relayout of A


def test_multicast_copy_and_cluster_barrier():
    sys.path.insert(0, os.path.dirname(__file__))
    from test_gpu_matmul import multicast_copy
    x = torch.empty(256, 64, dtype=BF16)
    c = multicast_copy.compile(x, x, R=64, C=64, cluster=(2, 1, 1), target="sm_90a")
    assert "mbarrier::complete_tx::bytes.multicast::cluster" in c.ptx and "%cluster_ctarank" in c.ptx
    assert "barrier.cluster.arrive.release.aligned" in c.ptx and c.meta["cluster"] == [2, 1, 1]
    with pytest.raises(mgjit.CompileError) as info:
        multicast_copy.compile(x, x, R=64, C=64)  # no cluster
    assert info.value.rule == "cluster" and info.value.loc.line == _line_of(multicast_copy.fn, "multicast=True")
    with pytest.raises(mgjit.CompileError, match="multiples of 8 rows"):
        multicast_copy.compile(x, x, R=8, C=64, cluster=(2, 1, 1))


@pytest.mark.parametrize("lands", ["late", "early"])
@pytest.mark.parametrize("grid,cluster,axes", [((4, 2, 1), (2, 2, 1), "xy"), ((2, 3, 1), (2, 3, 1), "yx"),
                                               ((2, 2, 2), (1, 2, 2), "zy")])
def test_multicast_along_cluster_axes_from_its_ptx(grid, cluster, axes, lands):
    """copy_async(multicast=axis): each CTA copies its part of the tile to the CTAs along one axis of the cluster,
    named by a mask built from its rank; on the PTX simulator, which refuses a mask that names CTAs outside the
    cluster, and whose barriers never complete if a part goes astray."""
    sys.path.insert(0, os.path.dirname(__file__))
    import ptx_sim
    from test_gpu_matmul import multicast_axes, multicast_axes_expected
    r, c = 96, 64
    x = torch.randn(math.prod(grid) * r, c, dtype=BF16)
    out = torch.full((2 * math.prod(grid) * r, c), float("nan"), dtype=BF16)
    compiled = multicast_axes.compile(x, out, R=r, C=c, CLUSTER=cluster, AXES=tuple(axes), cluster=cluster,
                                      target="sm_90a")
    dev = ptx_sim.Device()
    dev.lands = lands
    dev.run(compiled, grid, x, out, cluster=cluster)
    assert torch.equal(dev.fetch(out), multicast_axes_expected(x, grid, cluster, axes, r))


def test_multicast_along_an_axis_the_cluster_lacks():
    sys.path.insert(0, os.path.dirname(__file__))
    from test_gpu_matmul import multicast_axes
    x = torch.empty(1024, 64, dtype=BF16)
    with pytest.raises(mgjit.CompileError, match=r"along the cluster's y axis: expected at least 2 of them in the "
                                                 r"cluster \(4, 1, 1\), got 1") as info:
        multicast_axes.compile(x, x, R=64, C=64, CLUSTER=(4, 1, 1), AXES=("x", "y"), cluster=(4, 1, 1))
    assert info.value.rule == "cluster" and info.value.loc.line == _line_of(multicast_axes.fn, "multicast=AXES[i]")
    with pytest.raises(mgjit.CompileError, match="multicast= a static bool or a cluster axis"):
        multicast_axes.compile(x, x, R=64, C=64, CLUSTER=(4, 1, 1), AXES=("x", "w"), cluster=(4, 1, 1))
    with pytest.raises(mgjit.CompileError, match="split over the 4 CTAs it goes to: 24 rows"):
        multicast_axes.compile(x, x, R=24, C=64, CLUSTER=(4, 1, 1), AXES=("x", "x"), cluster=(4, 1, 1))


@mgjit.kernel
def smem_roundtrip(x, out, R: mgjit.constexpr, C: mgjit.constexpr, SW: mgjit.constexpr):
    s = mgjit.smem((R, C), x.dtype, swizzle=SW)
    s[...] = x[mgjit.ds(0, R), mgjit.ds(0, C)]
    out[mgjit.ds(0, R), mgjit.ds(0, C)] = s[...] * 2
    out2 = s.T[...]  # a transposed view reads the stored tile with its indices swapped
    out[mgjit.ds(R, C), mgjit.ds(0, R)] = out2


@pytest.mark.parametrize("dtype,swizzle", [(BF16, 128), (torch.float32, None), (BF16, None), (torch.float32, 64)])
def test_smem_reads_into_registers_with_16_byte_accesses(dtype, swizzle):
    x = torch.empty(256, 64, dtype=dtype)
    c = smem_roundtrip.compile(x, x, R=64, C=64, SW=swizzle, target="sm_90a")
    assert "ld.shared.v4.b32" in c.ptx and "st.shared.v4.b32" in c.ptx and c.spills == 0
    assert "smem_load" in c.ir


@mgjit.kernel
def wgmma_types(a, c, ACC: mgjit.constexpr):
    a_s = mgjit.smem((64, 128), a.dtype, swizzle=128)
    bars = mgjit.barrier(1)
    mgjit.copy_async(a, (0, 0), a_s, barrier=bars[0])
    bars[0].wait()
    acc = mgjit.wgmma(mgjit.zeros((64, 64), ACC), a_s, a_s.T)
    mgjit.wgmma_wait(0)
    c[mgjit.ds(0, 64), mgjit.ds(0, 64)] = acc.astype(c.dtype)


@pytest.mark.parametrize("dtype,acc", [(torch.float16, mgjit.float16), (torch.int8, mgjit.int32)])
def test_wgmma_types_the_lowering_lacks_are_compile_errors(dtype, acc):
    """The ISA has f16 accumulators and int8 operands, the lowering does not (it emits .f32 only and has no
    integer wgmma): a CompileError at the wgmma, not an internal error from MLIR or a KeyError."""
    x = torch.empty(256, 128, dtype=dtype)
    with pytest.raises(mgjit.CompileError) as info:
        wgmma_types.compile(x, torch.empty(256, 64), ACC=acc, target="sm_90a")
    assert info.value.rule == "wgmma-shape" and info.value.loc.line == _line_of(wgmma_types.fn, "acc = mgjit.wgmma")
    assert "into a float32 accumulator" in str(info.value)


@mgjit.kernel
def causal_scores(q, k, out, BN: mgjit.constexpr, D: mgjit.constexpr):
    q_s = mgjit.smem((64, D), q.dtype, swizzle=128)
    k_s = mgjit.smem((BN, D), k.dtype, swizzle=128)
    bar = mgjit.barrier(1, arrivals=2)
    mgjit.copy_async(q, (0, 0), q_s, barrier=bar[0])
    mgjit.copy_async(k, (0, 0), k_s, barrier=bar[0])
    bar[0].wait()
    s = mgjit.wgmma(mgjit.zeros((64, BN), mgjit.float32), q_s, k_s.T)
    mgjit.wgmma_wait(0)
    rows, cols = mgjit.arange(64), mgjit.arange(BN)
    s = mgjit.where(rows[:, None] >= cols[None, :], s, -float("inf"))  # the causal mask of attention
    out[mgjit.ds(0, 64), mgjit.ds(0, BN)] = s - s.max(axis=1, keepdims=True)


def test_a_mask_takes_the_accumulators_layout_not_the_other_way_round():
    """Masking a wgmma result moves the cheap operand (the iotas the mask is built from are computed in the
    accumulator's layout), never the accumulator through shared memory."""
    from mgjit import frontend, infer, ir, ops
    from mgjit.layouts import SplatLayout, WGMMA
    from mgjit.source import SourceFunction
    params = [ir.Param("q", "tensor", mgjit.bfloat16, 2), ir.Param("k", "tensor", mgjit.bfloat16, 2),
              ir.Param("out", "tensor", mgjit.float32, 2)]
    k = frontend.trace(SourceFunction(causal_scores.fn), params, {"BN": 128, "D": 64}, 1)
    infer.infer_layouts(k)
    relayouts = [op for op in k.walk() if isinstance(op, ops.Relayout)]
    assert all(isinstance(op.operands[0].layout, SplatLayout) for op in relayouts)  # only the zeros' splat
    selects = [op for op in k.walk() if isinstance(op, ops.Select)]
    assert [op.result.layout for op in selects] == [WGMMA]
    x = torch.empty(256, 64, dtype=BF16)
    c = causal_scores.compile(x, x, torch.empty(64, 128), BN=128, D=64, target="sm_90a")
    assert c.smem_bytes < 64 * 128 * 4  # no f32 scores through shared memory


@mgjit.kernel
def scratch_heavy(x, out, R: mgjit.constexpr):
    big = mgjit.smem((200, 128, 4), mgjit.float32)  # 409600 bytes: over budget by itself
    v = x[mgjit.ds(0, 128), mgjit.ds(0, R)]
    out[mgjit.ds(0, R)] = v.sum(axis=0)


@mgjit.kernel
def scratch_over(x, out, R: mgjit.constexpr):
    tile = mgjit.smem((227, 256), mgjit.float32)  # 232448 bytes: the whole budget
    v = x[mgjit.ds(0, R)]
    out[mgjit.ds(0, R)] = v * v.sum()  # a reduction across warps needs a few bytes of scratch


def test_scratch_shared_memory_counts_in_the_budget():
    """The scratch of a cross-warp reduction counts like a buffer: going over names that line, at compile time
    (it used to compile and fail at launch)."""
    x = torch.empty(128, 8192)
    with pytest.raises(mgjit.CompileError) as info:
        scratch_over.compile(x.view(-1), torch.empty(8192), R=4096, target="sm_90a")
    err = info.value
    assert err.rule == "smem-budget" and err.loc.line == _line_of(scratch_over.fn, "v * v.sum()")
    assert "scratch" in str(err) and "232448" in str(err)
    with pytest.raises(mgjit.CompileError) as info:
        scratch_heavy.compile(x, torch.empty(8192), R=128, target="sm_90a")
    assert info.value.rule == "smem-budget" and info.value.loc.line == _line_of(scratch_heavy.fn, "big = mgjit.smem")


@mgjit.kernel
def _staged_stores(x, out, SECOND_WRITE: mgjit.constexpr, LOOP: mgjit.constexpr):
    """A tile written from registers once, then stored by TMA in four boxes (and, SECOND_WRITE, written again
    before the last two); or (LOOP) written and stored at each iteration of a loop."""
    buf = mgjit.smem((4, 64, 64), x.dtype)
    if LOOP:
        for i in range(x.shape[0] // 64):
            buf[0][...] = x[mgjit.ds(i * 64, 64), mgjit.ds(0, 64)]
            mgjit.store_async(out, (i * 64, 0), buf[0])
            mgjit.store_async_wait(0)
    else:
        for k in mgjit.static_range(4):
            buf[k][...] = x[mgjit.ds(k * 64, 64), mgjit.ds(0, 64)]
        for k in mgjit.static_range(4):
            if SECOND_WRITE and k == 2:
                buf[3][...] = x[mgjit.ds(0, 64), mgjit.ds(0, 64)]
            mgjit.store_async(out, (k * 64, 0), buf[k])
    mgjit.store_async_wait(0)


@pytest.mark.parametrize("second_write,loop,fences", [(False, False, 1), (True, False, 2), (False, True, 1)])
def test_tma_stores_fence_only_after_smem_writes(second_write, loop, fences):
    """A TMA store fences the async proxy and meets the warpgroup where a thread may have written SMEM since the
    last fence: once before a run of stores of a tile written once (a piped row's lines went out after a fence
    and a bar.sync each), again after a write between them, and at each iteration of a loop that writes."""
    x = torch.empty(256, 64, dtype=BF16)
    ptx = _staged_stores.compile(x, x, SECOND_WRITE=second_write, LOOP=loop, target="sm_90a").ptx
    assert ptx.count("fence.proxy.async.shared::cta") == fences
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group") == (1 if loop else 4)


def test_tma_stores_run_interpreted_after_one_fence():
    x = torch.randn(256, 64).to(BF16)
    for loop in (False, True):
        out = torch.zeros_like(x)
        _staged_stores.interpret[(1,)](x, out, SECOND_WRITE=False, LOOP=loop)
        assert torch.equal(out, x)

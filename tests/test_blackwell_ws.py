"""Warp roles, cluster launch control and the warp-specialized persistent Blackwell matmul (examples/
matmul_blackwell_ws.py), on the CPU: the matmul interpreted against torch in every format, CTA group and
schedule (static, and CLC with several numbers of resident clusters), compiled for sm_100a without spills;
warp roles and CLC on small kernels whose results say what ran where; the mistakes both can be written with.
Two GPU tests: on a Hopper, launching the Blackwell kernels stops with a LaunchError naming sm_100a; on a
Blackwell, the matmul against torch.
"""
import os
import re
import subprocess
import sys

import pytest
import torch

import mgjit
import ptx_sim
from test_blackwell import EXAMPLES, line_of, load_example

ws = load_example("matmul_blackwell_ws")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "some of the poisoned output was never written"
    return ((out.double() - ref).norm() / ref.norm()).item()


def interpret_matmul(variant: str, m: int, n: int, k: int, clc: bool, sms: int, **options) -> float:
    fmt = variant.split("-")[0]
    a, b, sa, sb = ws.make_inputs(m, n, k, fmt, "cpu")
    c = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    cfg = ws.CONFIGS[variant]
    grid, cluster = ws.launch_shape(m, n, cfg, clc, sms)
    sfa, sfb = (mgjit.blocked_scales(sa), mgjit.blocked_scales(sb)) if sa is not None else (a, a)
    ws.matmul_ws_kernel.interpret(**options)[grid](a, b, c, sfa, sfb, **cfg, CLC=clc, cluster=cluster)
    return rel_err(c, ws.reference(a, b, sa, sb))


# Shapes: bf16 ragged in M, N and K (TMA fills zeros and drops what falls outside); the scaled formats whole
# 128-row tiles of scales. Two persistent CTAs (pairs) take several tiles each, through both accumulators.
SHAPES = {"bf16": (300, 520, 200), "mxfp8": (256, 384, 256), "nvfp4": (256, 384, 512)}


@pytest.mark.parametrize("clc", [False, True], ids=["static", "clc"])
@pytest.mark.parametrize("variant", list(ws.CONFIGS))
def test_ws_matmul_matches_torch(variant, clc):
    """bf16 output of f32 accumulation: a few bf16 units of the last place (relative error 5e-3 over the tensor)."""
    m, n, k = SHAPES[variant.split("-")[0]]
    if variant.endswith("2cta"):
        m *= 2
    assert interpret_matmul(variant, m, n, k, clc, sms=4) < 5e-3


@pytest.mark.parametrize("variant,clc,options", [
    ("bf16", True, dict(policy="random", seed=1, resident=2)),
    ("bf16-2cta", False, dict(policy="random", seed=2)),
    ("mxfp8", True, dict(policy="eager", resident=3)),
    ("nvfp4-2cta", True, dict(policy="random", seed=3, resident=6)),  # every request fails
])
def test_ws_matmul_under_other_schedules(variant, clc, options):
    m, n, k = SHAPES[variant.split("-")[0]]
    assert interpret_matmul(variant, m * (2 if variant.endswith("2cta") else 1), n, k, clc, sms=2, **options) < 5e-3


def test_ws_wrapper_under_mgjit_interpret(monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    a, b, sa, sb = ws.make_inputs(256, 256, 256, "nvfp4", "cpu")
    out = ws.matmul(a, b, sa, sb, clc=True)
    assert rel_err(out, ws.reference(a, b, sa, sb)) < 5e-3
    x, y, _, _ = ws.make_inputs(200, 136, 72, "bf16", "cpu")
    assert rel_err(ws.matmul(x, y, variant="bf16-2cta", sms=2), ws.reference(x, y, None, None)) < 5e-3
    with pytest.raises(ValueError, match="takes both scale matrices"):
        ws.matmul(a, b)


def test_quantize_round_trips_within_the_formats_precision():
    x = torch.randn(128, 256)
    for fmt, tolerance in (("mxfp8", 0.07), ("nvfp4", 0.2)):
        data, scales = ws.quantize(x, fmt)
        assert rel_err(ws.dequantize(data, scales), x.double()) < tolerance


# ---------------------------------------------------------------------------------------------- sm_100a

@pytest.fixture(scope="module")
def built():
    (a, b, sa, sb), out = ws.setup("meta")
    kernels = ws.compile(a, b, sa, sb, out, target="sm_100a")
    return {(variant, clc): c for (variant, clc), c in zip(
        [(v, clc) for v in ws.CONFIGS for clc in (False, True)], kernels, strict=True)}


def test_ws_matmul_compiles_for_sm100a_without_spills(built):
    for (variant, clc), c in built.items():
        assert c.spills == 0 and "0 bytes spill stores, 0 bytes spill loads" in c.ptxas_report, (variant, clc)
        assert c.threads == 384 and c.registers <= 168 and c.smem_bytes <= 232448
        assert c.meta["cluster"] == ([2, 1, 1] if variant.endswith("2cta") else [1, 1, 1])


def test_ws_matmul_ptx(built):
    scaled = built["nvfp4-2cta", True].ptx
    assert "tcgen05.mma.cta_group::2.kind::mxf4nvf4.block_scale.scale_vec::4X" in scaled
    assert "tcgen05.cp.cta_group::2.32x128b.warpx4" in scaled
    assert ("clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.multicast::cluster::all"
            ".b128") in scaled
    assert "clusterlaunchcontrol.query_cancel.is_canceled.pred.b128" in scaled
    # The epilogues of both CTAs free the accumulator on the leader's barrier.
    assert "mbarrier.arrive.release.cluster.shared::cluster.b64" in scaled
    static = built["bf16", False].ptx
    assert "clusterlaunchcontrol" not in static and "cta_group::2" not in static
    assert re.search(r"tcgen05\.mma\.cta_group::1\.kind::f16 \[%r\d+\], %rd\d+, %rd\d+, %r\d+, %p\d+;", static)
    ir = built["bf16", True].ir
    assert "warp_split {warps=[0, 1, 2]}" in ir and "tmem_index(" in ir


def test_ws_matmul_compiled_for_sm90a_is_a_compile_error():
    x = torch.empty(256, 256, dtype=torch.bfloat16, device="meta")
    with pytest.raises(mgjit.CompileError, match=r"needs sm_100a \(Blackwell\)") as excinfo:
        ws.matmul_ws_kernel.compile(x, x, x, x, x, **ws.CONFIGS["bf16"], CLC=False, target="sm_90a")
    assert excinfo.value.rule == "target-arch"


def test_ws_example_runs_as_a_script_without_a_gpu(built):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, str(EXAMPLES / "matmul_blackwell_ws.py")], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    assert len(re.findall(r"^target +sm_100a$", run.stdout, re.M)) == 2 * len(ws.CONFIGS)
    assert len(re.findall(r"^resources +\d+ registers, 0 bytes spilled", run.stdout, re.M)) == 2 * len(ws.CONFIGS)


# ---------------------------------------------------------------------------------------------- warp roles

@mgjit.kernel
def ping_pong(x, y, N: mgjit.constexpr):
    """Warp 0 and warp 1 of one warpgroup take turns: each waits for the other's arrival before its next step,
    so that they can only finish if they run side by side."""
    ping = mgjit.barrier(1)
    pong = mgjit.barrier(1)
    if mgjit.warp_id() == 0:
        for i in range(N):
            if i > 0:
                pong[0].wait()
            y[i] = x[i] * 2.0
            ping[0].arrive()
    if mgjit.warp_id() == 1:
        for i in range(N):
            ping[0].wait()
            y[N + i] = y[i] + 1.0  # what warp 0 stored before its arrival
            pong[0].arrive()


def test_warp_roles_run_side_by_side():
    x = torch.randn(16)
    y = torch.full((32,), float("nan"))
    for policy, seed in (("late", 0), ("eager", 0), ("random", 5)):
        ping_pong.interpret(policy=policy, seed=seed)[(1,)](x, y, N=16)
        assert torch.equal(y, torch.cat([x * 2, x * 2 + 1]))
    c = ping_pong.compile(x, y, N=16, target="sm_90a")  # warp roles are not Blackwell's alone
    assert c.spills == 0
    assert "warp_split {warps=[0, 1]}" in c.ir


@mgjit.kernel(num_warpgroups=2)
def roles_in_one_branch(x, y):
    """Warpgroup 0 gives its work to warp 0 (a producer's copies); warpgroup 1 counts. `done` differs between the
    branches: the then-branch's is the one from before its roles (what a role assigns stays in it)."""
    done = 0
    if mgjit.warpgroup_id() == 0:
        if mgjit.warp_id() == 0:
            y[0] = x[0] * 2.0
            done = 5  # noqa: F841 (stays in the role)
    else:
        done = 3
    y[1 + mgjit.warpgroup_id()] = done.astype(mgjit.float32)


def test_a_branch_may_end_in_warp_roles_where_another_assigns():
    """The join of `done` after the if is made before the branch's roles, not after them (a compile error that
    named the if's last line once)."""
    x = torch.randn(1)
    y = torch.full((3,), float("nan"))
    roles_in_one_branch.interpret[(1,)](x, y)
    assert y.tolist() == [x.item() * 2.0, 0.0, 3.0]
    dev = ptx_sim.Device()
    y = torch.full((3,), float("nan"))
    dev.run(roles_in_one_branch.compile(x, y, target="sm_90a"), (1,), x, y)
    assert dev.fetch(y).tolist() == [x.item() * 2.0, 0.0, 3.0]


@mgjit.kernel
def roles_end_a_tmem_kernel(x, y):
    acc = mgjit.tmem((128, 128), mgjit.float32)  # noqa: F841 (allocated: the kernel ends by freeing it)
    if mgjit.warp_id() == 0:
        y[0] = x[0] + 1.0
    if mgjit.warp_id() == 2:
        y[1] = x[1] * 2.0


def test_warp_roles_may_end_a_kernel_that_frees_tensor_memory():
    """The kernel's TMEM deallocation follows the roles (every warp meets there), not an error at the def line."""
    x = torch.randn(2)
    y = torch.full((2,), float("nan"))
    roles_end_a_tmem_kernel.interpret[(1,)](x, y)
    assert torch.equal(y, torch.stack([x[0] + 1, x[1] * 2]))
    c = roles_end_a_tmem_kernel.compile(x, y, target="sm_100a")
    assert c.spills == 0
    assert c.ir.index("warp_split {warps=[0, 2]}") < c.ir.index("tmem_dealloc")


@mgjit.device
def wait_on(bar):
    bar.wait()


@mgjit.kernel
def helper_waits(x, N: mgjit.constexpr):
    bars = mgjit.barrier(1)
    for i in range(N):
        bars[0].arrive()
        wait_on(bars[0])  # in the caller's phase of the barrier, handing the next one back
        x[i] = x[i] + 1.0


def test_barrier_waits_inside_device_helpers_track_the_callers_phase():
    """A helper waits on phase i % 2 at step i: had it lost the phase, the second wait would never end."""
    x = torch.zeros(3)
    helper_waits.interpret[(1,)](x, N=3)
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert helper_waits.compile(x, N=3, target="sm_90a").spills == 0


@mgjit.kernel(num_warpgroups=2)
def role_race(a, c, WAIT: mgjit.constexpr):
    """Warp 0 loads a tile, warp 1 multiplies it: only after waiting on the copy's barrier when WAIT."""
    a_s = mgjit.smem((128, 64), a.dtype, swizzle=128)
    full = mgjit.barrier(1)
    done = mgjit.barrier(1)
    acc = mgjit.tmem((128, 128), mgjit.float32)
    if mgjit.warpgroup_id() == 0:
        if mgjit.warp_id() == 0:
            mgjit.copy_async(a, (0, 0), a_s, barrier=full[0])
        if mgjit.warp_id() == 1:
            if WAIT:
                full[0].wait()
            mgjit.tcgen05_mma(acc, a_s, a_s.T, accumulate=False)
            mgjit.tcgen05_commit(done[0])
    else:
        done[0].wait()
        c[0:128, 0:128] = acc.load()


def test_the_checker_sees_across_warp_roles():
    a = torch.randn(128, 64, dtype=torch.bfloat16)
    c = torch.full((128, 128), float("nan"))
    role_race.interpret[(1,)](a, c, WAIT=True)
    assert rel_err(c, a.double() @ a.double().T) < 1e-6
    with pytest.raises(mgjit.InterpretError, match=r"this tcgen05_mma reads SMEM .* TMA copy") as excinfo:
        role_race.interpret[(1,)](a, c, WAIT=False)
    assert excinfo.value.check == "tma-incomplete"
    assert excinfo.value.loc.line == line_of(role_race, "mgjit.tcgen05_mma(acc, a_s, a_s.T, accumulate=False)")


@mgjit.kernel
def bad_roles(x, CASE: mgjit.constexpr):
    bars = mgjit.barrier(1)
    if CASE == "array":
        if mgjit.warp_id() == 0:
            x[0:128] = x[0:128] + 1.0
    if CASE == "else":
        if mgjit.warp_id() == 0:
            bars[0].arrive()
        else:
            bars[0].arrive()
    if CASE == "after":
        if mgjit.warp_id() == 0:
            bars[0].arrive()
        x[0] = 1.0
    if CASE == "barrier":
        if mgjit.warp_id() == 1:
            more = mgjit.barrier(1)
    if CASE == "arithmetic":
        w = mgjit.warp_id() + 1


@pytest.mark.parametrize("case,text,phrase", [
    ("array", "x[0:128] = x[0:128] + 1.0", r"register array spans the 128 threads .* cannot compute with one"),
    ("else", "        else:", r"a warp's role has no `else`"),
    ("after", "x[0] = 1.0", r"warp roles\) end their block"),
    ("barrier", "more = mgjit.barrier(1)", r"`barrier_alloc` cannot be in one warp's role"),
    ("arithmetic", "w = mgjit.warp_id() + 1", r"used only as `if mgjit.warp_id\(\) == w:`"),
])
def test_warp_role_mistakes_are_compile_errors(case, text, phrase):
    with pytest.raises(mgjit.CompileError) as excinfo:
        bad_roles.compile(torch.empty(128, device="meta"), CASE=case)
    e = excinfo.value
    assert re.search(phrase, e.message), e.message
    expected = line_of(bad_roles, text) + (1 if case == "else" else 0)
    assert e.loc.line in (expected, line_of(bad_roles, text)), str(e)


# ---------------------------------------------------------------------------------------------- CLC

@mgjit.kernel
def clc_owners(owner):
    """owner[tile] = the program that computed it: its own tile, then every tile its requests cancelled."""
    response = mgjit.smem((2,), mgjit.int64)
    bar = mgjit.barrier(1)
    tile = mgjit.program_id(0)
    valid = tile >= 0
    for _ in range(mgjit.num_programs(0)):
        if valid:
            owner[tile] = mgjit.program_id(0)
            mgjit.clc_try_cancel(response, barrier=bar[0])
            bar[0].wait()
            canceled, (first, _, _) = mgjit.clc_query(response)
            tile, valid = first, canceled


@pytest.mark.parametrize("resident,expected", [
    (1, [0, 0, 0, 0, 0, 0]),  # the first cluster runs alone and cancels every other
    (3, [0, 1, 2, 0, 0, 0]),  # three run from the start; the first cancels the rest before the others ask
    (6, [0, 1, 2, 3, 4, 5]),  # all run: every request fails
])
def test_clc_cancels_the_clusters_that_have_not_launched(resident, expected):
    owner = torch.full((6,), -1, dtype=torch.int32)
    clc_owners.interpret(resident=resident)[(6,)](owner)
    assert owner.tolist() == expected


@mgjit.kernel
def clc_mistakes(out, CASE: mgjit.constexpr):
    response = mgjit.smem((2,), mgjit.int64)
    bar = mgjit.barrier(1)
    mgjit.clc_try_cancel(response, barrier=bar[0])
    if CASE == "unwaited":
        canceled, _ = mgjit.clc_query(response)
    bar[0].wait()
    canceled, _ = mgjit.clc_query(response)
    if CASE == "again":
        mgjit.clc_try_cancel(response, barrier=bar[0])
        bar[0].wait()
    out[0] = canceled.astype(mgjit.int32)


def test_clc_mistakes_are_interpreter_errors():
    out = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(mgjit.InterpretError, match=r"after the CTA read a failed response") as excinfo:
        clc_mistakes.interpret[(1,)](out, CASE="again")
    assert excinfo.value.check == "clc-after-failure"
    assert excinfo.value.loc.line == line_of(clc_mistakes, "        mgjit.clc_try_cancel(response, barrier=bar[0])")
    with pytest.raises(mgjit.InterpretError, match=r"try_cancel response") as excinfo:
        clc_mistakes.interpret[(1,)](out, CASE="unwaited")
    assert excinfo.value.check == "tma-incomplete"
    clc_mistakes.interpret[(2,)](out, CASE="ok")
    assert out.tolist() == [1]  # the first of two clusters cancels the second


@mgjit.kernel
def clc_bad_response(out):
    response = mgjit.smem((4,), mgjit.int64)
    bar = mgjit.barrier(1)
    mgjit.clc_try_cancel(response, barrier=bar[0])


def test_clc_needs_a_16_byte_response_and_blackwell():
    out = torch.empty(1, device="meta")
    with pytest.raises(mgjit.CompileError, match=r"16-byte SMEM buffer") as excinfo:
        clc_bad_response.compile(out, target="sm_100a")
    assert excinfo.value.loc.line == line_of(clc_bad_response, "mgjit.clc_try_cancel(")
    with pytest.raises(mgjit.CompileError, match=r"needs sm_100a \(Blackwell\): cluster launch control exists only"):
        clc_owners.compile(torch.empty(6, dtype=torch.int32, device="meta"), target="sm_90a")
    c = clc_owners.compile(torch.empty(6, dtype=torch.int32, device="meta"), target="sm_100a")
    assert c.spills == 0
    assert "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.b128" in c.ptx
    assert "clusterlaunchcontrol.query_cancel.get_first_ctaid::x.b32.b128" in c.ptx


# ---------------------------------------------------------------------------------------------- GPU

def _capability():
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


@pytest.mark.gpu
def test_ws_and_scaled_kernels_on_hopper_stop_before_launch():
    """On a Hopper GPU each Blackwell kernel (warp roles with tcgen05, block scaling, CLC) raises a LaunchError
    naming sm_100a and the kernel line that needs it, and launches nothing."""
    if _capability() != (9, 0):
        pytest.skip("needs a Hopper GPU (sm_90)")
    for fmt, variant, clc in (("bf16", "bf16", False), ("mxfp8", "mxfp8-2cta", True), ("nvfp4", "nvfp4", True)):
        a, b, sa, sb = ws.make_inputs(256, 256, 256, fmt, "cuda")
        c = torch.full((256, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
        with pytest.raises(mgjit.LaunchError, match=r"needs sm_100a \(Blackwell\); this GPU is sm_90 "):
            ws.matmul(a, b, sa, sb, out=c, variant=variant, clc=clc)
        torch.cuda.synchronize()
        assert c.isnan().all()  # nothing ran


@pytest.mark.gpu
@pytest.mark.parametrize("clc", [False, True], ids=["static", "clc"])
@pytest.mark.parametrize("variant", list(ws.CONFIGS))
def test_ws_matmul_on_blackwell_matches_torch(variant, clc):
    if _capability() != (10, 0):
        pytest.skip("needs a Blackwell GPU (sm_100)")
    fmt = variant.split("-")[0]
    for m, n, k in ((256, 256, 256), (1024, 3072, 2048), (4096, 4096, 4096)):
        a, b, sa, sb = ws.make_inputs(m, n, k, fmt, "cuda")
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        ws.matmul(a, b, sa, sb, out=c, variant=variant, clc=clc)
        assert rel_err(c, ws.reference(a, b, sa, sb)) < 1e-2

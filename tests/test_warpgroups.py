"""Barriers between warpgroups (mgjit.cta_sync, mgjit.named_barrier), which warpgroups run a GMEM store, and the
code after a warp-specialized pipeline: IR, PTX, the interpreter's model (ordering, deadlocks, miscounts) and the
compile-time errors and warnings, on the CPU."""
import inspect
import warnings

import pytest

import mgjit

torch = pytest.importorskip("torch")


def line_of(kernel, text: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@mgjit.kernel(num_warpgroups=2)
def take_turns(x, out, N: mgjit.constexpr, ORDERED: mgjit.constexpr = True, START: mgjit.constexpr = True):
    """Two warpgroups update one SMEM tile in turn, handing it over on named barriers (a ping-pong)."""
    tile = mgjit.smem((128,), mgjit.float32)
    turn = mgjit.named_barrier(2, warpgroups=2)
    wg = mgjit.warpgroup_id()
    if wg == 0:
        tile[...] = x[mgjit.ds(0, 128)]
    elif START:
        turn[0].arrive()  # warpgroup 0 goes first
    for i in range(N):
        if ORDERED:
            turn[wg].sync()  # wait for my turn
        tile[...] = tile[...] * 2.0 + wg.astype(mgjit.float32)
        if ORDERED:
            turn[1 - wg].arrive()  # hand over
    mgjit.cta_sync()
    if wg == 0:
        out[mgjit.ds(0, 128)] = tile[...]


def turns_reference(x, n):
    for _ in range(n):
        x = (x * 2) * 2 + 1
    return x


@pytest.mark.parametrize("policy", ["late", "eager", "random"])
def test_named_barriers_hand_a_tile_between_warpgroups(policy):
    x = torch.randn(128)
    out = torch.full((128,), float("nan"))
    take_turns.interpret(policy=policy, seed=5)[(1,)](x, out, N=3)
    torch.testing.assert_close(out, turns_reference(x, 3))


def test_named_barriers_lower_to_bar_arrive_and_bar_sync_with_their_own_ids():
    x = torch.empty(128)
    ptx = take_turns.compile(x, x, N=3, target="sm_90a").ptx
    bars = [line.split("//")[0].strip() for line in ptx.splitlines() if line.strip().startswith("bar.")]
    assert any(b.startswith("bar.arrive %r") and b.endswith(", 256;") for b in bars)
    assert any(b.startswith("bar.sync %r") and b.endswith(", 256;") for b in bars)
    assert "bar.sync 0;" in bars  # cta_sync
    ir = take_turns.compile(x, x, N=3, target="sm_90a").ir
    assert "named_barrier_alloc {count=2, warpgroups=2}" in ir and "named_barrier_sync" in ir


def test_ids_follow_the_warpgroups_own_barriers():
    from mgjit import frontend, ir, ops
    from mgjit.ops.warpgroups import named_barrier_ids
    params = [ir.Param("x", "tensor", mgjit.float32, 1), ir.Param("out", "tensor", mgjit.float32, 1)]
    k = frontend.trace(mgjit.source.SourceFunction(take_turns.fn), params, {"N": 2, "ORDERED": True, "START": True}, 2)
    (alloc,) = [op for op in k.walk() if isinstance(op, ops.NamedBarrierAlloc)]
    assert named_barrier_ids(k) == {id(alloc): 3}  # 0: the CTA's, 1 and 2: each warpgroup's own


def test_a_missing_turn_is_a_race():
    x = torch.randn(128)
    with pytest.raises(mgjit.InterpretError) as info:
        take_turns.interpret[(1,)](x, torch.empty(128), N=3, ORDERED=False)
    assert info.value.check == "smem-unordered"
    assert info.value.loc.line == line_of(take_turns, "tile[...] = tile[...] * 2.0")


def test_a_missing_first_arrival_is_a_deadlock_naming_both_waits():
    x = torch.randn(128)
    with pytest.raises(mgjit.InterpretError) as info:
        take_turns.interpret[(1,)](x, torch.empty(128), N=3, START=False)
    err = info.value
    assert err.check == "deadlock" and err.loc.line == line_of(take_turns, "turn[wg].sync()")
    assert "named barrier slot 0" in str(err) and "named barrier slot 1" in str(err)
    assert "0 of 2 warpgroups" not in str(err) and "1 of 2 warpgroups have arrived (warpgroups [0])" in str(err)


@mgjit.kernel(num_warpgroups=2)
def first_turn_by_itself(x, out):
    """The hardware counts threads: warpgroup 0 may arrive on its own barrier and then sync on it (FA3's way of
    taking the first turn of a ping-pong), and warpgroup 1 waits for warpgroup 0's hand-over."""
    tile = mgjit.smem((128,), mgjit.float32)
    turn = mgjit.named_barrier(2)
    wg = mgjit.warpgroup_id()
    if wg == 0:
        turn[0].arrive()
        turn[0].sync()
        tile[...] = x[mgjit.ds(0, 128)]
        turn[1].arrive()
    else:
        turn[1].sync()
        out[mgjit.ds(0, 128)] = tile[...] + 1.0


def test_a_warpgroup_may_arrive_before_it_syncs():
    x = torch.randn(128)
    out = torch.full((128,), float("nan"))
    first_turn_by_itself.interpret[(1,)](x, out)
    assert torch.equal(out, x + 1)


@mgjit.kernel(num_warpgroups=3)
def share_through_smem(x, out, SYNC: mgjit.constexpr):
    """Warpgroup 2 reads what warpgroup 0 stored: ordered by the CTA-wide barrier."""
    tile = mgjit.smem((128,), mgjit.float32)
    wg = mgjit.warpgroup_id()
    if wg == 0:
        tile[...] = x[mgjit.ds(0, 128)] + 1.0
    if SYNC:
        mgjit.cta_sync()
    if wg == 2:
        out[mgjit.ds(0, 128)] = tile[...]


def test_cta_sync_orders_smem_between_warpgroups():
    x = torch.randn(128)
    out = torch.full((128,), float("nan"))
    share_through_smem.interpret[(1,)](x, out, SYNC=True)
    assert torch.equal(out, x + 1)
    with pytest.raises(mgjit.InterpretError) as info:
        share_through_smem.interpret[(1,)](x, out, SYNC=False)
    assert info.value.check == "smem-unordered"


@mgjit.kernel(num_warpgroups=2)
def too_many(x, COUNT: mgjit.constexpr):
    a = mgjit.named_barrier(8)
    b = mgjit.named_barrier(COUNT)


@mgjit.kernel(num_warpgroups=2)
def in_a_branch(x):
    if mgjit.warpgroup_id() == 0:
        a = mgjit.named_barrier(1)


@mgjit.kernel(num_warpgroups=2)
def for_three(x):
    a = mgjit.named_barrier(1, warpgroups=3)


@pytest.mark.parametrize("kernel,args,text,phrase", [
    (too_many, {"COUNT": 6}, "b = mgjit.named_barrier", "11 of them taken"),
    (in_a_branch, {}, "a = mgjit.named_barrier", "at the top of the kernel"),
    (for_three, {}, "a = mgjit.named_barrier", "1..2 warpgroups"),
])
def test_named_barrier_errors_name_the_line(kernel, args, text, phrase):
    with pytest.raises(mgjit.CompileError) as info:
        kernel.compile(torch.empty(128), **args, target="sm_90a")
    assert info.value.loc.line == line_of(kernel, text) and phrase in str(info.value)


def test_sixteen_barriers_fit():
    too_many.compile(torch.empty(128), COUNT=5, target="sm_90a")


# ---------------------------------------------------------------------------------------------- the GMEM rule

@mgjit.kernel(num_warpgroups=3)
def stores(x, out):
    v = x[mgjit.ds(0, 128)]  # every warpgroup loads its own copy: no warning
    out[mgjit.ds(0, 128)] = v  # every warpgroup stores the same window
    wg = mgjit.warpgroup_id()
    if wg == 1:
        out[mgjit.ds(128, 128)] = v  # one warpgroup
    if wg > 0:
        out[mgjit.ds(256, 128)] = v  # warpgroups 1 and 2, one window
        out[mgjit.ds(256 + wg * 128, 128)] = v  # a window per warpgroup
    else:
        for i in range(2):
            out[mgjit.ds(768 + i * 128, 128)] = v  # warpgroup 0 only
    for t in range(wg, 3, 3):
        out[mgjit.ds(1024 + t * 128, 128)] = v  # warpgroups take turns: a window each, by the loop's start


def test_a_store_that_several_warpgroups_repeat_is_a_warning_at_its_line():
    x = torch.randn(1024)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stores.interpret[(1,)](x, torch.empty(1408))
    found = sorted((w.lineno, str(w.message)) for w in caught if issubclass(w.category, mgjit.CompileWarning))
    assert [line for line, _ in found] == [line_of(stores, "# every warpgroup stores"),
                                           line_of(stores, "# warpgroups 1 and 2")]
    assert "warpgroups [0, 1, 2] all run this GMEM store" in found[0][1]
    assert "warpgroups [1, 2]" in found[1][1]


@mgjit.kernel(num_warpgroups=2)
def after_pipeline(a, b, c, ran, BK: mgjit.constexpr):
    acc = mgjit.zeros((64, 64), mgjit.float32)
    for k, a_t, b_t in mgjit.pipeline(a.shape[1] // BK, mgjit.tile(a, (0, 0), (64, BK), (0, BK)),
                                      mgjit.tile(b, (0, 0), (BK, 64), (BK, 0)), stages=2, warp_specialize=True):
        acc = mgjit.wgmma(acc, a_t, b_t)
    ran[mgjit.warpgroup_id()] = 1.0  # which warpgroups run the code after the pipeline
    c[mgjit.ds(0, 64), mgjit.ds(0, 64)] = acc.astype(c.dtype)


def test_code_after_a_warp_specialized_pipeline_runs_in_the_consumers_only():
    a, b = torch.randn(64, 256, dtype=torch.bfloat16), torch.randn(256, 64, dtype=torch.bfloat16)
    c = torch.full((64, 64), float("nan"), dtype=torch.bfloat16)
    ran = torch.zeros(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mgjit.CompileWarning)  # one warpgroup stores c: no warning
        after_pipeline.interpret[(1,)](a, b, c, ran, BK=64)
    assert ran.tolist() == [0.0, 1.0]
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1)

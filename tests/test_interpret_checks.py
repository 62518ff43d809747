"""The interpreter's checker: each check fires on a deliberately broken kernel, naming the line that breaks
the rule and the other line involved, and stays silent on the same kernel written correctly (every example
and GPU-test kernel runs silently in test_interpret_kernels.py)."""
import inspect

import pytest
import torch

import mgjit
from mgjit import Check, InterpretError, ops

BF16 = torch.bfloat16


def line_of(kernel, text: str, nth: int = 0) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + [i for i, line in enumerate(lines) if text in line][nth]


def expect(excinfo, kernel, check: Check, at: str, related: tuple[str, ...] = ()):
    """The error is `check`, at the line containing `at`, and names the lines containing each of `related`."""
    e = excinfo.value
    assert e.check == check, str(e)
    assert e.loc.file == inspect.getsourcefile(kernel.fn) and e.loc.line == line_of(kernel, at), str(e)
    for text in related:
        assert line_of(kernel, text) in [r.line for r in e.related], str(e)
    assert at in str(e)


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# ---------------------------------------------------------------------------------------------- a TMA/wgmma ring

@mgjit.kernel
def ring(a, b, c, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr, STAGES: mgjit.constexpr,
         WAIT_FULL: mgjit.constexpr = True, WAIT_MMA: mgjit.constexpr = True, ARRIVALS: mgjit.constexpr = 2,
         SLOTS: mgjit.constexpr = 0, READ_EARLY: mgjit.constexpr = False):
    m0 = mgjit.program_id(0) * BM
    n0 = mgjit.program_id(1) * BN
    a_s = mgjit.smem((STAGES, BM, BK), a.dtype, swizzle=128)
    b_s = mgjit.smem((STAGES, BK, BN), b.dtype, swizzle=128)
    full = mgjit.barrier(STAGES, arrivals=ARRIVALS)
    k_tiles = mgjit.cdiv(a.shape[1], BK)
    for s in mgjit.static_range(STAGES - 1):
        if s < k_tiles:
            mgjit.copy_async(a, (m0, s * BK), a_s[s], barrier=full[s])
            mgjit.copy_async(b, (s * BK, n0), b_s[s], barrier=full[s])
    acc = mgjit.zeros((BM, BN), mgjit.float32)
    for k in range(k_tiles):
        slot = k % (SLOTS or STAGES)
        if WAIT_FULL:
            full[slot].wait()
        acc = mgjit.wgmma(acc, a_s[slot], b_s[slot])
        if WAIT_MMA:
            mgjit.wgmma_wait(1)
        nk = k + STAGES - 1
        if nk < k_tiles:
            mgjit.copy_async(a, (m0, nk * BK), a_s[nk % STAGES], barrier=full[nk % STAGES])
            mgjit.copy_async(b, (nk * BK, n0), b_s[nk % STAGES], barrier=full[nk % STAGES])
    if READ_EARLY:
        c[mgjit.ds(m0, BM), mgjit.ds(n0, BN)] = acc.astype(c.dtype)
    mgjit.wgmma_wait(0)
    c[mgjit.ds(m0, BM), mgjit.ds(n0, BN)] = acc.astype(c.dtype)


def run_ring(**config):
    a = torch.randn(128, 320, dtype=BF16)
    b = torch.randn(320, 128, dtype=BF16)
    c = torch.full((128, 128), float("nan"), dtype=BF16)
    ring.interpret[(1, 1)](a, b, c, **{**dict(BM=128, BN=128, BK=64, STAGES=3), **config})
    return a, b, c


def test_the_ring_is_silent_and_right():
    a, b, c = run_ring()
    assert rel_err(c, a.float() @ b.float()) < 1e-2


def test_a_wgmma_on_a_slot_whose_copy_was_not_waited_for():
    with pytest.raises(InterpretError) as excinfo:
        run_ring(WAIT_FULL=False)
    expect(excinfo, ring, Check.TMA_INCOMPLETE, "acc = mgjit.wgmma(acc, a_s[slot], b_s[slot])",
           ("mgjit.copy_async(a, (m0, s * BK), a_s[s], barrier=full[s])",))


def test_a_copy_into_a_slot_an_unretired_wgmma_reads():
    with pytest.raises(InterpretError) as excinfo:
        run_ring(WAIT_MMA=False)
    expect(excinfo, ring, Check.IN_FLIGHT_WRITE,
           "mgjit.copy_async(a, (m0, nk * BK), a_s[nk % STAGES], barrier=full[nk % STAGES])",
           ("acc = mgjit.wgmma(acc, a_s[slot], b_s[slot])",))


def test_reading_a_wgmma_accumulator_before_its_wait():
    with pytest.raises(InterpretError) as excinfo:
        run_ring(READ_EARLY=True)
    expect(excinfo, ring, Check.ACCUMULATOR_READ, "c[mgjit.ds(m0, BM), mgjit.ds(n0, BN)] = acc.astype(c.dtype)",
           ("acc = mgjit.wgmma(acc, a_s[slot], b_s[slot])",))


def test_fewer_arrivals_than_the_count_is_a_deadlock_that_names_them():
    with pytest.raises(InterpretError) as excinfo:
        run_ring(ARRIVALS=3)
    expect(excinfo, ring, Check.BARRIER_COUNT, "full[slot].wait()",
           ("mgjit.copy_async(a, (m0, s * BK), a_s[s], barrier=full[s])",
            "mgjit.copy_async(b, (s * BK, n0), b_s[s], barrier=full[s])"))
    assert "has 2 of its 3 arrivals" in str(excinfo.value)


def test_more_arrivals_than_the_count():
    with pytest.raises(InterpretError) as excinfo:
        run_ring(ARRIVALS=1)
    expect(excinfo, ring, Check.BARRIER_COUNT, "mgjit.copy_async(b, (s * BK, n0), b_s[s], barrier=full[s])",
           ("mgjit.copy_async(a, (m0, s * BK), a_s[s], barrier=full[s])",))


def test_more_arrivals_than_the_count_under_an_eager_schedule_skip_a_phase():
    """Completed at once, each copy completes a phase of its own: the barrier passes the phase the wait wants
    and the wait never returns, as on the hardware with that timing."""
    a, b = torch.randn(128, 320, dtype=BF16), torch.randn(320, 128, dtype=BF16)
    c = torch.empty(128, 128, dtype=BF16)
    with pytest.raises(InterpretError) as excinfo:
        ring.interpret(policy="eager")[(1, 1)](a, b, c, BM=128, BN=128, BK=64, STAGES=3, ARRIVALS=1)
    expect(excinfo, ring, Check.DEADLOCK, "full[slot].wait()")
    assert "phase of parity 0 (it has completed 2 phases" in str(excinfo.value)


def test_an_smem_index_past_the_stages():
    with pytest.raises(InterpretError) as excinfo:
        run_ring(SLOTS=4)
    expect(excinfo, ring, Check.OUT_OF_BOUNDS, "full[slot].wait()",
           ("full = mgjit.barrier(STAGES, arrivals=ARRIVALS)",))
    assert "index 3 is outside this barrier array of 3" in str(excinfo.value)


@mgjit.kernel
def store_slot(x, i):
    t = mgjit.smem((2, 64, 64), x.dtype)
    t[i][...] = x[0:64, 0:64]


def test_an_smem_index_past_the_buffer():
    store_slot.interpret[(1,)](torch.randn(64, 64), 1)
    with pytest.raises(InterpretError) as excinfo:
        store_slot.interpret[(1,)](torch.randn(64, 64), 2)
    expect(excinfo, store_slot, Check.OUT_OF_BOUNDS, "t[i][...] = x[0:64, 0:64]",
           ("t = mgjit.smem((2, 64, 64), x.dtype)",))
    assert "index 2 is outside this SMEM buffer of 2" in str(excinfo.value)


# ---------------------------------------------------------------------------------------------- warp specialization

@mgjit.kernel(num_warpgroups=3)
def producer_consumer(a, b, c, BK: mgjit.constexpr, STAGES: mgjit.constexpr, RELEASE: mgjit.constexpr = True,
                      GROW: mgjit.constexpr = 232):
    """Warpgroup 0 loads, warpgroups 1 and 2 each multiply 64 rows: launched with 384 threads, the CTA has 168
    registers per thread to share, and 40 + 232 + 232 uses all of them."""
    a_s = mgjit.smem((STAGES, 2, 64, BK), a.dtype, swizzle=128)
    b_s = mgjit.smem((STAGES, BK, 64), b.dtype, swizzle=128)
    full = mgjit.barrier(STAGES, arrivals=3)
    empty = mgjit.barrier(STAGES, arrivals=2)
    k_tiles = mgjit.cdiv(a.shape[1], BK)
    wg = mgjit.warpgroup_id()
    if wg == 0:
        mgjit.set_max_registers(40, increase=False)
        for k in range(k_tiles):
            slot = k % STAGES
            if k >= STAGES:
                empty[slot].wait()
            mgjit.copy_async(a, (0, k * BK), a_s[slot][0], barrier=full[slot])
            mgjit.copy_async(a, (64, k * BK), a_s[slot][1], barrier=full[slot])
            mgjit.copy_async(b, (k * BK, 0), b_s[slot], barrier=full[slot])
    else:
        mgjit.set_max_registers(GROW, increase=True)
        acc = mgjit.zeros((64, 64), mgjit.float32)
        for k in range(k_tiles):
            slot = k % STAGES
            full[slot].wait()
            acc = mgjit.wgmma(acc, a_s[slot][wg - 1], b_s[slot])
            mgjit.wgmma_wait(0)
            if RELEASE:
                empty[slot].arrive()
        c[mgjit.ds((wg - 1) * 64, 64), 0:64] = acc.astype(c.dtype)


def run_producer_consumer(**config):
    a, b = torch.randn(128, 512, dtype=BF16), torch.randn(512, 64, dtype=BF16)
    c = torch.full((128, 64), float("nan"), dtype=BF16)
    producer_consumer.interpret[(1,)](a, b, c, **{**dict(BK=64, STAGES=2), **config})
    return a, b, c


def test_producer_consumer_is_silent_and_right():
    a, b, c = run_producer_consumer()
    assert rel_err(c, a.float() @ b.float()) < 1e-2


def test_a_deadlock_lists_every_wait_with_its_line_and_phase():
    with pytest.raises(InterpretError) as excinfo:
        run_producer_consumer(RELEASE=False)
    expect(excinfo, producer_consumer, Check.DEADLOCK, "empty[slot].wait()", ("full[slot].wait()",))
    text = str(excinfo.value)
    assert f"warpgroup 0 waits at line {line_of(producer_consumer, 'empty[slot].wait()')}" in text
    for wg in (1, 2):
        assert f"warpgroup {wg} waits at line {line_of(producer_consumer, 'full[slot].wait()')}" in text
    assert "phase of parity 0 (it has completed 0 phases" in text  # the producer's first wait on empty
    assert "phase of parity 1 (it has completed 1 phases" in text  # the consumers' second lap around full


def test_set_max_registers_beyond_the_register_file_never_returns():
    """40 + 240 + 240 registers per thread are more than the 3 x 168 the CTA has: the second consumer's
    setmaxnreg.inc waits for registers nobody will free."""
    with pytest.raises(InterpretError) as excinfo:
        run_producer_consumer(GROW=240)
    e = excinfo.value
    assert e.check == Check.DEADLOCK
    assert line_of(producer_consumer, "mgjit.set_max_registers(GROW, increase=True)") in [e.loc.line] + [
        r.line for r in e.related]
    assert "set_max_registers(240) for 9216 more registers; the CTA's pool has 7168 free" in str(e)


def test_set_max_registers_that_shrinks_with_increase():
    with pytest.raises(InterpretError) as excinfo:
        run_producer_consumer(GROW=160)
    expect(excinfo, producer_consumer, Check.REGISTERS, "mgjit.set_max_registers(GROW, increase=True)")
    assert "fewer registers than the 168 it has" in str(excinfo.value)


# ---------------------------------------------------------------------------------------------- SMEM stores

@mgjit.kernel
def staged(x, y, w, FENCE: mgjit.constexpr = True, WAIT: mgjit.constexpr = True, FINAL: mgjit.constexpr = True):
    t = mgjit.smem((64, 64), x.dtype, swizzle=128)
    w_s = mgjit.smem((64, 64), w.dtype, swizzle=128)
    bar = mgjit.barrier(1)
    mgjit.copy_async(w, (0, 0), w_s, barrier=bar[0])
    t[...] = x[0:64, 0:64]
    if FENCE:
        mgjit.fence_async_shared()
    bar[0].wait()
    acc = mgjit.wgmma(mgjit.zeros((64, 64), mgjit.float32), t, w_s)
    mgjit.wgmma_wait(0)
    t[...] = acc.astype(x.dtype)
    mgjit.store_async(y, (0, 0), t)
    if WAIT:
        mgjit.store_async_wait(0)
    t[...] = (acc * 2).astype(x.dtype)
    mgjit.store_async(y, (64, 0), t)
    if FINAL:
        mgjit.store_async_wait(0)


def run_staged(**config):
    x, w = torch.randn(64, 64, dtype=BF16), torch.randn(64, 64, dtype=BF16)
    y = torch.full((128, 64), float("nan"), dtype=BF16)
    staged.interpret[(1,)](x, y, w, **config)
    return x, w, y


def test_stores_fenced_then_read_by_wgmma_and_tma_are_silent_and_right():
    x, w, y = run_staged()
    ref = x.float() @ w.float()
    assert rel_err(y[:64], ref) < 1e-2 and rel_err(y[64:], 2 * ref) < 1e-2


def test_a_wgmma_reading_stores_without_a_fence():
    with pytest.raises(InterpretError) as excinfo:
        run_staged(FENCE=False)
    expect(excinfo, staged, Check.SMEM_UNORDERED, "acc = mgjit.wgmma(mgjit.zeros((64, 64), mgjit.float32), t, w_s)",
           ("t[...] = x[0:64, 0:64]",))


def test_a_store_into_a_tile_a_tma_store_still_reads():
    with pytest.raises(InterpretError) as excinfo:
        run_staged(WAIT=False)
    expect(excinfo, staged, Check.IN_FLIGHT_WRITE, "t[...] = (acc * 2).astype(x.dtype)",
           ("mgjit.store_async(y, (0, 0), t)",))


def test_exiting_while_a_tma_store_reads_shared_memory():
    with pytest.raises(InterpretError) as excinfo:
        run_staged(FINAL=False)
    expect(excinfo, staged, Check.ASYNC_AT_EXIT, "mgjit.store_async(y, (64, 0), t)")


# ---------------------------------------------------------------------------------------------- TMEM and tcgen05

@mgjit.kernel
def blackwell_tile(a, b, c, WAIT: mgjit.constexpr = True, COMMIT_FIRST: mgjit.constexpr = False):
    a_s = mgjit.smem((128, 64), a.dtype, swizzle=128)
    b_s = mgjit.smem((64, 128), b.dtype, swizzle=128)
    bar = mgjit.barrier(1, arrivals=2)
    done = mgjit.barrier(1)
    acc = mgjit.tmem((128, 128), mgjit.float32)
    mgjit.copy_async(a, (0, 0), a_s, barrier=bar[0])
    mgjit.copy_async(b, (0, 0), b_s, barrier=bar[0])
    bar[0].wait()
    if COMMIT_FIRST:
        mgjit.tcgen05_commit(done[0])
    mgjit.tcgen05_mma(acc, a_s, b_s, accumulate=False)
    if not COMMIT_FIRST:
        mgjit.tcgen05_commit(done[0])
    if WAIT:
        done[0].wait()
        c[0:128, 0:128] = acc.load()


@mgjit.kernel
def blackwell_ring(a, b, c, STAGES: mgjit.constexpr, WAIT_EMPTY: mgjit.constexpr = True):
    a_s = mgjit.smem((STAGES, 128, 64), a.dtype, swizzle=128)
    b_s = mgjit.smem((STAGES, 64, 128), b.dtype, swizzle=128)
    full = mgjit.barrier(STAGES, arrivals=2)
    empty = mgjit.barrier(STAGES, arrivals=1)
    done = mgjit.barrier(1)
    acc = mgjit.tmem((128, 128), mgjit.float32)
    for k in range(mgjit.cdiv(a.shape[1], 64)):
        slot = k % STAGES
        if WAIT_EMPTY:
            if k >= STAGES:
                empty[slot].wait()
        mgjit.copy_async(a, (0, k * 64), a_s[slot], barrier=full[slot])
        mgjit.copy_async(b, (k * 64, 0), b_s[slot], barrier=full[slot])
        full[slot].wait()
        mgjit.tcgen05_mma(acc, a_s[slot], b_s[slot], accumulate=k > 0)
        mgjit.tcgen05_commit(empty[slot])
    mgjit.tcgen05_commit(done[0])
    done[0].wait()
    c[0:128, 0:128] = acc.load()


def test_a_tcgen05_ring_is_silent_and_right():
    a, b = torch.randn(128, 320, dtype=BF16), torch.randn(320, 128, dtype=BF16)
    c = torch.full((128, 128), float("nan"))
    blackwell_ring.interpret[(1,)](a, b, c, STAGES=2)
    assert rel_err(c, a.float() @ b.float()) < 1e-5


def test_a_copy_into_a_slot_an_unfinished_tcgen05_mma_reads():
    a, b = torch.randn(128, 320, dtype=BF16), torch.randn(320, 128, dtype=BF16)
    c = torch.empty(128, 128)
    with pytest.raises(InterpretError) as excinfo:
        blackwell_ring.interpret[(1,)](a, b, c, STAGES=2, WAIT_EMPTY=False)
    expect(excinfo, blackwell_ring, Check.IN_FLIGHT_WRITE,
           "mgjit.copy_async(a, (0, k * 64), a_s[slot], barrier=full[slot])",
           ("mgjit.tcgen05_mma(acc, a_s[slot], b_s[slot], accumulate=k > 0)",))


def run_blackwell_tile(**config):
    a, b = torch.randn(128, 64, dtype=BF16), torch.randn(64, 128, dtype=BF16)
    c = torch.full((128, 128), float("nan"))
    blackwell_tile.interpret[(1,)](a, b, c, **config)
    return a, b, c


def test_a_tcgen05_tile_is_silent_and_right():
    a, b, c = run_blackwell_tile()
    assert rel_err(c, a.float() @ b.float()) < 1e-5


def test_loading_an_accumulator_its_commit_does_not_cover():
    """The commit before the MMA completes first: waiting on it says nothing about the MMA."""
    with pytest.raises(InterpretError) as excinfo:
        run_blackwell_tile(COMMIT_FIRST=True)
    expect(excinfo, blackwell_tile, Check.ACCUMULATOR_READ, "c[0:128, 0:128] = acc.load()",
           ("mgjit.tcgen05_mma(acc, a_s, b_s, accumulate=False)",))


def test_freeing_tensor_memory_an_mma_still_writes():
    with pytest.raises(InterpretError) as excinfo:
        run_blackwell_tile(WAIT=False)
    e = excinfo.value
    assert e.check == Check.TMEM_LIFETIME
    assert e.loc.line == line_of(blackwell_tile, "def blackwell_tile")  # where the kernel ends, its TMEM is freed
    assert line_of(blackwell_tile, "mgjit.tcgen05_mma(acc, a_s, b_s, accumulate=False)") in [r.line for r in e.related]


@mgjit.kernel
def tmem_copy(x, y):
    t = mgjit.tmem((128, 64), mgjit.float32)
    u = t[:, 32:64]
    u.store(x[0:128, 0:32])
    y[0:128, 0:32] = u.load()


SM100 = tmem_copy.interpret(target="sm_100a")


def tmem_copy_program(x, y):
    """tmem_copy's IR, as SM100 runs it, for edits that stand for a broken compiler pass."""
    runtime, consts = tmem_copy._bind([x, y], {})
    specs = mgjit.specialize.of_arguments("tmem_copy", tmem_copy.runtime_names, runtime, {})
    return SM100.program(tmem_copy._specialization(specs, consts, "sm_100a", 1, (1, 1, 1)))


def test_a_tmem_store_before_the_allocation():
    """A pass that moved the allocation after the first use of the memory (the IR is the interpreter's input)."""
    x, y = torch.randn(128, 32), torch.empty(128, 32)
    body = tmem_copy_program(x, y).body.ops
    alloc = next(op for op in body if isinstance(op, ops.TmemAlloc))
    store = next(op for op in body if isinstance(op, ops.TmemStore))
    body.remove(alloc)
    body.insert(body.index(store) + 1, alloc)
    try:
        with pytest.raises(InterpretError) as excinfo:
            SM100[(1,)](x, y)
    finally:
        body.remove(alloc)
        body.insert(0, alloc)
    expect(excinfo, tmem_copy, Check.TMEM_LIFETIME, "u.store(x[0:128, 0:32])")
    assert "before its allocation" in str(excinfo.value)
    SM100[(1,)](x, y)  # restored, it runs
    assert torch.equal(y, x)


def test_a_tmem_access_outside_the_allocation():
    """A pass that moved a column slice past the end of the kernel's 64 columns."""
    x, y = torch.randn(128, 32), torch.empty(128, 32)
    body = tmem_copy_program(x, y).body.ops
    sliced = next(op for op in body if isinstance(op, ops.TmemSlice))
    sliced.start = 48
    try:
        with pytest.raises(InterpretError) as excinfo:
            SM100[(1,)](x, y)
    finally:
        sliced.start = 32
    expect(excinfo, tmem_copy, Check.OUT_OF_BOUNDS, "u.store(x[0:128, 0:32])")
    assert "columns 48..79" in str(excinfo.value)


# ---------------------------------------------------------------------------------------------- relaxed arrivals

@mgjit.kernel(num_warpgroups=2)
def handoff(x, y, RELAXED: mgjit.constexpr):
    """Warpgroup 0 stores a tile and arrives (on its own CTA's barrier, through the cluster path); warpgroup 1 waits
    and reads it. A relaxed arrival releases no stores: the read is unordered."""
    t = mgjit.smem((64, 64), x.dtype)
    bar = mgjit.barrier(1, arrivals=1)
    if mgjit.warpgroup_id() == 0:
        t[...] = x[0:64, 0:64]
        bar[0].arrive(cta=mgjit.cluster_rank(), relaxed=RELAXED)
    else:
        bar[0].wait()
        y[0:64, 0:64] = t[...]


@pytest.mark.parametrize("relaxed", [False, True])
def test_a_relaxed_arrival_orders_no_stores(relaxed):
    x, y = torch.randn(64, 64, dtype=BF16), torch.full((64, 64), float("nan"), dtype=BF16)
    if not relaxed:
        handoff.interpret[(2,)](x, y, RELAXED=False, cluster=(2, 1, 1))
        assert torch.equal(x, y)
        return
    with pytest.raises(InterpretError) as excinfo:
        handoff.interpret[(2,)](x, y, RELAXED=True, cluster=(2, 1, 1))
    expect(excinfo, handoff, Check.SMEM_UNORDERED, "y[0:64, 0:64] = t[...]", ("t[...] = x[0:64, 0:64]",))


def test_relaxed_arrivals_skip_the_cluster_fence_in_ptx():
    x = torch.empty(64, 64, dtype=BF16)
    for relaxed, text in ((False, "mbarrier.arrive.release.cluster.shared::cluster.b64"),
                          (True, "mbarrier.arrive.shared::cluster.b64")):
        ptx = handoff.compile(x, x, RELAXED=relaxed, cluster=(2, 1, 1), target="sm_90a").ptx
        assert text in ptx and ptx.count("mbarrier.arrive") == 1, relaxed


def test_relaxed_needs_a_remote_arrival():
    @mgjit.kernel
    def local(x):
        bar = mgjit.barrier(1, arrivals=1)
        bar[0].arrive(relaxed=True)

    with pytest.raises(mgjit.CompileError, match="relaxed=True is for an arrival on another CTA"):
        local.compile(torch.empty(4), target="sm_90a")


# ---------------------------------------------------------------------------------------------- cluster exchanges

@mgjit.kernel(num_warpgroups=2)
def exchange_then_read(x, y, SYNC: mgjit.constexpr):
    """Warpgroup 0 stores a tile; both warpgroups exchange a value over the cluster; warpgroup 1 reads the tile.
    Between CTAs an exchange waits for the values alone (st.async and an mbarrier): it orders no store, so only
    a cluster_sync makes the read safe."""
    t = mgjit.smem((64, 64), x.dtype)
    if mgjit.warpgroup_id() == 0:
        t[...] = x[0:64, 0:64]
    total = mgjit.cluster_reduce(mgjit.cluster_rank().astype(mgjit.float32), "sum")
    if SYNC:
        mgjit.cluster_sync()
    if mgjit.warpgroup_id() == 1:
        y[0:64, 0:64] = (t[...].astype(mgjit.float32) + total).astype(y.dtype)


@pytest.mark.parametrize("sync", [True, False])
def test_an_exchange_between_ctas_orders_no_stores(sync):
    x, y = torch.randn(64, 64, dtype=BF16), torch.full((64, 64), float("nan"), dtype=BF16)
    if sync:
        exchange_then_read.interpret[(2,)](x, y, SYNC=True, cluster=(2, 1, 1))
        assert torch.equal(y, (x.float() + 2.0).to(BF16))  # ranks 0, 0, 1, 1: one per warpgroup
        return
    with pytest.raises(InterpretError) as excinfo:
        exchange_then_read.interpret[(2,)](x, y, SYNC=False, cluster=(2, 1, 1))
    expect(excinfo, exchange_then_read, Check.SMEM_UNORDERED,
           "y[0:64, 0:64] = (t[...].astype(mgjit.float32) + total).astype(y.dtype)", ("t[...] = x[0:64, 0:64]",))

"""Atomics and semaphores on the CPU (ops/atomics.py): the GPU tests' kernels interpreted against the same
checks, the PTX each ordering and scope lowers to, the errors for what the hardware lacks, and the
interpreter's scheduling of CTAs that wait on each other."""
import inspect

import pytest
import torch

import mgjit
import test_gpu_atomics as ga


def test_cross_cta_counter():
    count = torch.zeros(1, dtype=torch.int32)
    tickets = torch.full((37,), -1, dtype=torch.int32)
    ga.cross_cta_counter.interpret[(37,)](count, tickets)
    assert count.item() == 37 and torch.equal(tickets.sort().values, torch.arange(37, dtype=torch.int32))


@pytest.mark.parametrize("kind,dtype", ga.KINDS, ids=lambda v: str(v).removeprefix("torch."))
def test_atomic_kinds(kind, dtype):
    x, values, old = ga.atomic_inputs(kind, dtype, 5, 256, "cpu")
    ga.atomic_kinds.interpret[(5,)](x, values, old, KIND=kind, BLOCK=256)
    ga.check_kind(kind, x, values, old)


def test_atomics_are_exact_in_program_order():
    """The interpreter runs CTAs in order: CTA i's old values are the sum of the rows before it."""
    x, values, old = ga.atomic_inputs("add", torch.float32, 4, 128, "cpu")
    ga.atomic_kinds.interpret[(4,)](x, values, old, KIND="add", BLOCK=128)
    expected = torch.zeros(4, 128)
    for i in range(1, 4):
        expected[i] = expected[i - 1] + values[i - 1]
    assert torch.equal(old, expected) and torch.equal(x, expected[3] + values[3])


@pytest.mark.parametrize("rows,chunks,ctas", [(7, 5, 13), (3, 8, 10), (5, 2, 9), (4, 4, 4)])
@pytest.mark.parametrize("policy", ["late", "random"])
def test_stream_k_reduction(rows, chunks, ctas, policy):
    """CTA 0 holds the first chunk of a row that later CTAs finish: its semaphore wait blocks until the
    scheduler has started them, as the GPU runs them side by side."""
    x = torch.randn(rows, chunks * 128)
    out, flags = ga.row_sums(x, ctas, 128, launch=ga.stream_k_row_sums.interpret(policy=policy, seed=3))
    torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-4)
    assert not flags.any()


@mgjit.kernel
def arrival(counter, order):
    """order[program] = how many programs took a ticket before it."""
    order[mgjit.program_id(0)] = mgjit.atomic_add(counter, 0, 1)


def test_the_random_schedule_launches_the_grid_in_an_order_of_its_own():
    """Programs run in program order under the late and eager schedules; the random one launches them in an order
    drawn from its seed (a GPU promises none), so that CTAs handing work to each other through GMEM are checked
    for depending on one: each order a permutation, seeds apart giving others."""
    orders = []
    for policy, seed in [("late", 0), ("eager", 0)] + [("random", s) for s in range(4)]:
        order = torch.full((16,), -1, dtype=torch.int32)
        arrival.interpret(policy=policy, seed=seed)[(16,)](torch.zeros(1, dtype=torch.int32), order)
        assert sorted(order.tolist()) == list(range(16)), (policy, seed)
        orders.append(order.tolist())
    assert orders[0] == orders[1] == list(range(16))
    assert len({tuple(o) for o in orders[2:]}) == 4 and list(range(16)) not in orders[2:]


@mgjit.kernel
def waits_forever(flags):
    mgjit.semaphore_wait(flags, mgjit.program_id(0), 1)


def test_a_wait_nobody_signals_is_a_deadlock_naming_the_semaphore():
    flags = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(mgjit.InterpretError) as info:
        waits_forever.interpret[(2,)](flags)
    assert info.value.check == "deadlock"
    assert "semaphore at [0] to reach 1 (it holds 0)" in str(info.value)
    assert "semaphore at [1] to reach 1 (it holds 0)" in str(info.value)


@mgjit.kernel
def clc_after_a_semaphore(owner, flags):
    """CTA 0 waits until CTA 1 has run; then every CTA takes tiles by cancelling clusters not yet launched."""
    response = mgjit.smem((2,), mgjit.int64)
    bar = mgjit.barrier(1)
    pid = mgjit.program_id(0)
    if pid == 0:
        mgjit.semaphore_wait(flags, 0, 1)
    if pid == 1:
        mgjit.semaphore_signal(flags, 0)
    tile = pid
    valid = tile >= 0
    for _ in range(mgjit.num_programs(0)):
        if valid:
            owner[tile] = pid + 10 * (owner[tile] + 1)  # owner[tile] was -1: pid, if the tile is owned once
            mgjit.clc_try_cancel(response, barrier=bar[0])
            bar[0].wait()
            canceled, (first, _, _) = mgjit.clc_query(response)
            tile, valid = first, canceled


@pytest.mark.parametrize("policy", ["late", "eager"])
def test_a_semaphore_launches_the_next_cluster_which_cluster_launch_control_then_cannot_cancel(policy):
    """With one cluster resident, CTA 0's wait launches CTA 1 beside it: CTA 1 runs its own tile (no try_cancel
    takes it from it), and the tiles of the clusters cancelled before they launched are taken by CTAs 0 and 1
    (each exactly once: a cancelled cluster never runs). In program order: the random schedule launches the
    clusters in an order of its own, where a try_cancel may take CTA 1 before it runs and leave CTA 0 waiting."""
    owner = torch.full((6,), -1, dtype=torch.int32)
    clc_after_a_semaphore.interpret(policy=policy, seed=1)[(6,)](owner, torch.zeros(1, dtype=torch.int32))
    assert owner[:2].tolist() == [0, 1] and set(owner[2:].tolist()) <= {0, 1}, owner.tolist()


def test_a_wait_outside_the_tensor_is_an_error():
    with pytest.raises(mgjit.InterpretError) as info:
        waits_forever.interpret[(3,)](torch.zeros(2, dtype=torch.int32))
    assert info.value.check == "out-of-bounds" and "outside the tensor of shape (2,)" in str(info.value)


@mgjit.kernel
def ordered(x, flags, out, SEM: mgjit.constexpr, SCOPE: mgjit.constexpr):
    o = mgjit.atomic_add(x, 0, 1.0, sem=SEM, scope=SCOPE)
    mgjit.semaphore_signal(flags, 0, 2, scope=SCOPE)
    mgjit.semaphore_wait(flags, 1, 3, scope=SCOPE)
    out[0] = o


@pytest.mark.parametrize("sem,scope", [("relaxed", "cta"), ("acquire", "cluster"), ("release", "gpu"),
                                       ("acq_rel", "sys")])
def test_ordering_and_scope_reach_the_ptx(sem, scope):
    f, i = torch.zeros(4), torch.zeros(4, dtype=torch.int32)
    ptx = ordered.compile(f, i, f, SEM=sem, SCOPE=scope, target="sm_90a").ptx
    assert f"atom.{sem}.{scope}.global.add.f32" in ptx
    assert f"red.release.{scope}.global.add.u32" in ptx  # the signal: no old value waited for
    assert f"ld.acquire.{scope}.global.b32" in ptx and "nanosleep" in ptx and "%globaltimer" in ptx


def test_array_atomics_lower_to_vector_instructions_and_have_no_spills():
    x, values, old = ga.atomic_inputs("add", torch.float32, 2, 512, "cpu")
    c = ga.atomic_kinds.compile(x, values, old, KIND="add", BLOCK=512, target="sm_90a")
    assert "atom.relaxed.gpu.global.v4.f32.add" in c.ptx and c.spills == 0
    for kind, dtype, instr in [("cas", torch.float16, "cas.b16"), ("max", torch.int64, "max.s64"),
                               ("add", torch.bfloat16, "add.noftz.bf16"), ("xchg", torch.float64, "exch.b64")]:
        x, values, old = ga.atomic_inputs(kind, dtype, 2, 256, "cpu")
        assert f"atom.relaxed.gpu.global.{instr}" in ga.atomic_kinds.compile(x, values, old, KIND=kind, BLOCK=256,
                                                                              target="sm_90a").ptx


@mgjit.kernel
def float_min(x):
    mgjit.atomic_min(x, 0, 1.0)  # ERR


@mgjit.kernel
def bad_sem(x):
    mgjit.atomic_add(x, 0, 1, sem="seq_cst")  # ERR


@mgjit.kernel
def float_semaphore(x):
    mgjit.semaphore_signal(x, 0)  # ERR


@mgjit.kernel
def window_semaphore(x):
    mgjit.semaphore_wait(x, mgjit.ds(0, 4), 1)  # ERR


@mgjit.kernel
def wrong_shape(x):
    mgjit.atomic_add(x, mgjit.ds(0, 128), mgjit.zeros((64,), mgjit.int32))  # ERR


@mgjit.kernel
def wrong_dtype(x):
    mgjit.atomic_xchg(x, 0, mgjit.program_id(0).astype(mgjit.int64))  # ERR


@pytest.mark.parametrize("kernel,dtype,phrase", [
    (float_min, torch.float32, "atomic min is not available on float32: the hardware has it on int32, int64"),
    (bad_sem, torch.int32, "sem must be one of 'relaxed', 'acquire', 'release', 'acq_rel'"),
    (float_semaphore, torch.float32, "a semaphore is an int32 cell, x holds float32"),
    (window_semaphore, torch.int32, "works on one int32 cell: index it with integers"),
    (wrong_shape, torch.int32, "cannot broadcast shape (64,) to (128,)"),
    (wrong_dtype, torch.int32, "the value is int64 but x holds int32")], ids=lambda v: getattr(v, "name", None))
def test_errors_name_the_line(kernel, dtype, phrase):
    lines, first = inspect.getsourcelines(kernel.fn)
    line = first + next(i for i, text in enumerate(lines) if text.rstrip().endswith("# ERR"))
    with pytest.raises(mgjit.CompileError) as info:
        kernel.compile(torch.zeros(256, dtype=dtype), target="sm_90a")
    assert phrase in str(info.value) and info.value.loc.line == line and info.value.loc.file == __file__


# ---- GMEM that CTAs hand each other: the race checker (interpret/checker.py GmemWrites)

@mgjit.kernel
def hand_off(data, flag, out, SEM: mgjit.constexpr):
    """CTA 0 stores a row and signals; CTA 1 waits for the signal and reads the row."""
    if mgjit.program_id(0) == 0:
        data[mgjit.ds(0, 128)] = mgjit.arange(128).astype(mgjit.float32)  # STORE
        mgjit.atomic_add(flag, 0, 1, sem=SEM)
    else:
        mgjit.semaphore_wait(flag, 0, 1)
        out[mgjit.ds(0, 128)] = data[mgjit.ds(0, 128)]  # LOAD


@mgjit.kernel
def last_one_sums(pieces, count, out, SEM: mgjit.constexpr):
    """Each CTA stores its piece and counts itself in; the last to arrive sums every piece (the cross-entropy
    fix-up's pattern, examples/cross_entropy.py finish_piece)."""
    p = mgjit.program_id(0)
    pieces[p, mgjit.ds(0, 128)] = mgjit.arange(128).astype(mgjit.float32) + p  # STORE
    if mgjit.atomic_add(count, 0, 1, sem=SEM) == mgjit.num_programs(0) - 1:
        total = mgjit.zeros((128,), mgjit.float32)
        for q in range(mgjit.num_programs(0)):
            total = total + pieces[q, mgjit.ds(0, 128)]  # LOAD
        out[mgjit.ds(0, 128)] = total


def marked_line(kernel, mark: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, text in enumerate(lines) if text.rstrip().endswith(f"# {mark}"))


@pytest.mark.parametrize("policy", ["late", "eager", "random"])
def test_gmem_handed_over_by_release_and_acquire(policy):
    """A release signal and an acquire wait (or acq_rel counts) order the stores before the other CTA's loads:
    the results hold and nothing is reported, under every schedule."""
    out = torch.zeros(128)
    hand_off.interpret(policy=policy, seed=3)[(2,)](torch.zeros(128), torch.zeros(1, dtype=torch.int32), out,
                                                  SEM="release")
    assert torch.equal(out, torch.arange(128.0))
    out = torch.zeros(128)
    last_one_sums.interpret(policy=policy, seed=3)[(5,)](torch.zeros(5, 128), torch.zeros(1, dtype=torch.int32),
                                                       out, SEM="acq_rel")
    assert torch.equal(out, 5 * torch.arange(128.0) + 10)


@pytest.mark.parametrize("kernel,sem,grid", [(hand_off, "relaxed", 2), (last_one_sums, "relaxed", 5),
                                             (last_one_sums, "release", 5)], ids=["signal", "count", "no-acquire"])
def test_gmem_of_another_cta_read_without_acquiring_it(kernel, sem, grid):
    """A relaxed signal (or a count whose last arriver does not acquire) orders nothing: the GPU may let the
    reader see the old bytes. The interpreter reports the load, naming the other CTA's store, though its run
    happened to see the new values."""
    args = (torch.zeros(128), torch.zeros(1, dtype=torch.int32)) if kernel is hand_off else \
        (torch.zeros(grid, 128), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(mgjit.InterpretError) as info:
        kernel.interpret[(grid,)](*args, torch.zeros(128), SEM=sem)
    err = info.value
    assert err.check == mgjit.Check.GMEM_UNORDERED and "reads GMEM that CTA (0, 0, 0)" in str(err)
    assert err.loc.line == marked_line(kernel, "LOAD") and err.related[0].line == marked_line(kernel, "STORE")


@mgjit.kernel(num_warpgroups=2)
def between_warpgroups(data, out, SYNC: mgjit.constexpr):
    """Warpgroup 0 stores a row of GMEM that warpgroup 1 then reads."""
    if mgjit.warpgroup_id() == 0:
        data[mgjit.ds(0, 128)] = mgjit.arange(128).astype(mgjit.float32)  # STORE
    if SYNC:
        mgjit.cta_sync()
    if mgjit.warpgroup_id() == 1:
        out[mgjit.ds(0, 128)] = data[mgjit.ds(0, 128)]  # LOAD


def test_gmem_between_warpgroups_of_a_cta_needs_a_barrier():
    out = torch.zeros(128)
    between_warpgroups.interpret[(1,)](torch.zeros(128), out, SYNC=True)
    assert torch.equal(out, torch.arange(128.0))
    with pytest.raises(mgjit.InterpretError, match=r"reads GMEM that CTA \(0, 0, 0\) \(warpgroup 0\) stores, and "
                                                   r"nothing orders .*mgjit\.cta_sync") as info:
        between_warpgroups.interpret(policy="eager")[(1,)](torch.zeros(128), torch.zeros(128), SYNC=False)
    assert info.value.loc.line == marked_line(between_warpgroups, "LOAD")

"""The phases the frontend tracks for mbarrier arrays (`bars[i].wait()` waits for the slot's current phase): right for
every slot of arrays up to 64 barriers, interpreted and from the sm_90a PTX on the simulator; a larger array is
refused at the user's line; and the wait on a runtime slot shifts the phase mask without guarding the amount. Also
the warpgroup index of a kernel of several warpgroups, which the lowering broadcasts from each warp's lane 0."""
import os
import re
import sys

import pytest

import mgjit

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(__file__))
import ptx_sim  # noqa: E402


@mgjit.kernel
def rounds_on_every_slot(out, N: mgjit.constexpr, ROUNDS: mgjit.constexpr):
    """ROUNDS times over the N slots: each slot's barrier completes a phase, and the wait asks for that phase
    (a wrong parity is a wait for a phase that never completes, or a pass before its arrival)."""
    bars = mgjit.barrier(N, arrivals=1)
    done = 0
    for r in range(ROUNDS):
        for i in range(N):
            bars[i].arrive()
            bars[i].wait()
            done += i + 1
    out[0] = done


@pytest.mark.parametrize("slots", [1, 31, 32, 33, 64])
def test_every_slot_of_an_array_up_to_64_waits_for_its_own_phase(slots):
    want = 3 * slots * (slots + 1) // 2
    out = torch.zeros(1, dtype=torch.int32)
    rounds_on_every_slot.interpret[(1,)](out, N=slots, ROUNDS=3)
    assert out.item() == want
    dev = ptx_sim.Device()
    out = torch.zeros(1, dtype=torch.int32)
    dev.run(rounds_on_every_slot.compile(out, N=slots, ROUNDS=3, target="sm_90a"), (1,), out)
    assert dev.fetch(out).item() == want


def test_an_array_of_more_than_64_barriers_is_refused_at_its_line():
    with pytest.raises(mgjit.CompileError, match="at most 64 barriers .* got 65") as info:
        rounds_on_every_slot.compile(torch.zeros(1, dtype=torch.int32), N=65, ROUNDS=1, target="sm_90a")
    assert "bars = mgjit.barrier(N, arrivals=1)" in str(info.value)


@mgjit.kernel
def ring_in_order(out, order, steps, N: mgjit.constexpr):
    """Arrive on and wait for slots in an order read from memory: slots that only the run knows."""
    bars = mgjit.barrier(N, arrivals=1)
    for i in range(steps):
        slot = order[i]
        bars[slot].arrive()
        bars[slot].wait()
    out[0] = steps


@pytest.mark.parametrize("slots,width", [(8, 32), (40, 64)])
def test_a_wait_on_a_runtime_slot_shifts_the_phase_mask_unguarded(slots, width):
    """The slot, reduced to the mask's width, is a shift amount in range: no compare of it against the width and
    no select (the guard a shift by a runtime amount otherwise gets, 5 SASS instructions a wait)."""
    order = torch.randint(0, slots, (4 * slots,), dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    compiled = ring_in_order.compile(out, order, order.numel(), N=slots, target="sm_90a")
    assert re.search(rf"and\.b(32|64)\s+%(r|rd)\d+, %(r|rd)\d+, {width - 1};", compiled.ptx)
    assert not re.search(rf"setp\.\w+\.[us](32|64)\s+%p\d+, %(r|rd)\d+, {width};", compiled.ptx)
    assert "selp" not in compiled.ptx
    dev = ptx_sim.Device()
    dev.run(compiled, (1,), out, order, order.numel())
    assert dev.fetch(out).item() == order.numel()


@mgjit.kernel(num_warpgroups=4)
def warpgroup_ids(out):
    wg = mgjit.warpgroup_id()
    out[mgjit.ds(wg * 128, 128)] = mgjit.arange(128) * 0 + wg


@pytest.mark.parametrize("warpgroups", [1, 4])
def test_each_warpgroup_knows_its_index(warpgroups):
    out = torch.full((4 * 128,), -1, dtype=torch.int32)
    compiled = warpgroup_ids.compile(out, num_warpgroups=warpgroups, target="sm_90a")
    assert ("shfl.sync.idx.b32" in compiled.ptx) == (warpgroups > 1)  # one broadcast at the entry, where it helps
    dev = ptx_sim.Device()
    dev.run(compiled, (1,), out)
    want = torch.arange(4).repeat_interleave(128).to(torch.int32)
    want[warpgroups * 128:] = -1
    assert torch.equal(dev.fetch(out), want)

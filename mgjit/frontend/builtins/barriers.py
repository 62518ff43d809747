"""mbarriers and the async-proxy fence: `bars = mgjit.barrier(count, arrivals)`, `bars[i].arrive()` (on this
CTA's barrier, or with `cta=r` on the barrier of the cluster's CTA of rank r), `bars[i].wait()` (on the phase
the trace tracks per slot), `mgjit.fence_async_shared()`."""
from __future__ import annotations

from typing import Any

from ... import dtypes, ir, language as lang, ops
from ..registry import builtin, method
from ..semantics import Semantics
from ..values import Barriers, BarrierSlot, Tensor


@builtin(lang.barrier, unit="mbarrier")
def barrier(t: Semantics, args: list, kwargs: dict) -> Barriers:
    count = args[0] if args else kwargs.get("count", 1)
    arrivals = args[1] if len(args) > 1 else kwargs.get("arrivals", 1)
    if not all(isinstance(v, int) for v in (count, arrivals)):
        raise t.error("barrier count and arrivals must be static ints")
    op = t.builder.add(ops.BarrierAlloc(count, arrivals, t.builder.loc))
    return Barriers(t, op.result, count)


@builtin(lang.fence_async_shared)
def fence_async_shared(t: Semantics, args: list, kwargs: dict) -> None:
    t.builder.add(ops.FenceAsyncShared(t.builder.loc))


@method(Barriers, "__getitem__")
def slot(t: Semantics, bars: Barriers, index: Any) -> BarrierSlot:
    return BarrierSlot(bars, index)


def slot_ref(t: Semantics, slot: BarrierSlot) -> tuple[ir.Value, Tensor]:
    """The reference to one barrier of the array (what the ops on it take), and its int32 index."""
    i = t.cast(t.to_tensor(slot.index), dtypes.int32)
    return t.builder.add(ops.RefIndex(slot.barriers.value, i.value, t.builder.loc)).result, i


@method(BarrierSlot, "arrive")
def arrive(t: Semantics, slot: BarrierSlot, args: list, kwargs: dict) -> None:
    if args or set(kwargs) - {"cta", "relaxed"}:
        raise t.error("barrier.arrive() takes no arguments but cta= and relaxed=")
    relaxed = kwargs.get("relaxed", False)
    if not isinstance(relaxed, bool):
        raise t.error(f"barrier.arrive(relaxed=...) takes a static bool, got {relaxed!r}")
    if relaxed and "cta" not in kwargs:
        raise t.error("relaxed=True is for an arrival on another CTA's barrier (cta=): a local arrival releases "
                      "at CTA scope and costs no fence")
    ref, _ = slot_ref(t, slot)
    if "cta" in kwargs:  # on the barrier of the cluster's CTA of rank `cta`
        rank = t.cast(t.to_tensor(kwargs["cta"]), dtypes.int32)
        t.builder.add(ops.BarrierArriveCluster(ref, rank.value, t.builder.loc, relaxed))
        return
    t.builder.add(ops.BarrierArrive(ref, t.builder.loc))


@method(BarrierSlot, "wait")
def wait(t: Semantics, slot: BarrierSlot, args: list, kwargs: dict) -> None:
    """Wait for the slot's current phase, then flip the phase bit the trace keeps for it."""
    if args or kwargs:
        raise t.error("barrier.wait() takes no arguments")
    ref, index = slot_ref(t, slot)
    mask = t.scope[slot.barriers.phase_var]
    # The slot's bit of the mask. The index, reduced to the mask's width, is a shift amount in range (a slot past
    # the array is out of bounds anyway), so the shifts need no guard for amounts past the width: in a matmul's
    # k-loop that guard was 5 of the consumer's instructions.
    bit = t.cast(t.binary("and", index, mask.dtype.bits - 1), mask.dtype)
    phase = t.cast(t.binary("and", t.binary("shr", mask, bit), 1), dtypes.int32)
    t.builder.add(ops.BarrierWait(ref, phase.value, t.builder.loc))
    t.scope[slot.barriers.phase_var] = t.binary("xor", mask, t.binary("shl", t.to_tensor(1, mask.dtype), bit))

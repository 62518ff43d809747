"""Warpgroups and their warps: `mgjit.warpgroup_id()`, `mgjit.set_max_registers(n, increase=...)` (setmaxnreg,
for warp specialization), `mgjit.warp_id()`, which only `if mgjit.warp_id() == w:` (a warp's role, traced by
control.py) compares, and the barriers between warpgroups: `mgjit.cta_sync()` and `nb = mgjit.named_barrier(count,
warpgroups)` with `nb[i].sync()` and `nb[i].arrive()`."""
from __future__ import annotations

from typing import Any

from ... import dtypes, language as lang, ops
from ...errors import Rule
from ...layouts import THREADS_PER_WARPGROUP
from ...ops.warpgroups import HARDWARE_BARRIERS
from ...targets import CTAS_PER_SM, THREADS_PER_SM
from ..registry import builtin, method
from ..semantics import Semantics
from ..values import NamedBarriers, NamedBarrierSlot, Tensor, WarpIndex


@builtin(lang.warpgroup_id, positional=(0, 0))
def warpgroup_id(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return t.emit(ops.WarpgroupId(t.builder.loc))


@builtin(lang.warp_id, positional=(0, 0))
def warp_id(t: Semantics, args: list, kwargs: dict) -> WarpIndex:
    return WarpIndex(t)


@builtin(lang.set_max_registers, unit="setmaxnreg")
def set_max_registers(t: Semantics, args: list, kwargs: dict) -> None:
    count = args[0] if args else kwargs.get("count")
    increase = kwargs.get("increase", True)
    if not isinstance(count, int):
        raise t.error("set_max_registers takes a static register count")
    t.builder.add(ops.SetMaxRegisters(count, bool(increase), t.builder.loc))


@builtin(lang.min_ctas_per_sm, positional=(1, 1))
def min_ctas_per_sm(t: Semantics, args: list, kwargs: dict) -> None:
    count = args[0]
    if not isinstance(count, int) or isinstance(count, bool):
        raise t.error(f"min_ctas_per_sm takes a static int (a literal or a constexpr), got {count!r}")
    threads = t.num_warpgroups * THREADS_PER_WARPGROUP
    most = min(CTAS_PER_SM, THREADS_PER_SM // threads)
    if not 1 <= count <= most:
        raise t.error(f"min_ctas_per_sm expected 1..{most} (an SM holds {THREADS_PER_SM} threads and {CTAS_PER_SM} "
                      f"CTAs; this kernel has {threads} threads per CTA), got {count}", rule=Rule.REGISTERS)
    asked = t.occupancy.get("count")
    if asked is not None and asked != count:
        raise t.error(f"min_ctas_per_sm asked for {count} CTAs per SM, but {t.occupancy['loc']} asked for {asked}: "
                      f"a kernel has one occupancy", rule=Rule.REGISTERS)
    t.occupancy.update(count=count, loc=t.builder.loc)


@builtin(lang.cta_sync, positional=(0, 0))
def cta_sync(t: Semantics, args: list, kwargs: dict) -> None:
    if kwargs:
        raise t.error("cta_sync() takes no arguments")
    t.builder.add(ops.CtaSync(t.builder.loc))


@builtin(lang.named_barrier, positional=(0, 2))
def named_barrier(t: Semantics, args: list, kwargs: dict) -> NamedBarriers:
    bound = dict(zip(("count", "warpgroups"), args))
    for k, v in kwargs.items():
        if k not in ("count", "warpgroups") or k in bound:
            raise t.error(f"named_barrier(count=1, warpgroups=2) got an unexpected or repeated argument `{k}`")
        bound[k] = v
    count, warpgroups = bound.get("count", 1), bound.get("warpgroups", 2)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (count, warpgroups)):
        raise t.error("named_barrier's count and warpgroups must be static ints")
    if not 1 <= warpgroups <= t.num_warpgroups:
        raise t.error(f"a named barrier waits for 1..{t.num_warpgroups} warpgroups (the kernel has "
                      f"{t.num_warpgroups}), got warpgroups={warpgroups}")
    if t.builder.block is not t.builder.top:
        raise t.error("allocate named barriers at the top of the kernel, outside runtime loops and branches "
                      "(their hardware ids are fixed for the whole kernel)")
    taken = 1 + t.num_warpgroups + sum(op.count for op in t.builder.top.ops if isinstance(op, ops.NamedBarrierAlloc))
    if count < 1 or taken + count > HARDWARE_BARRIERS:
        raise t.error(f"a CTA has {HARDWARE_BARRIERS} hardware barriers, {taken} of them taken (the CTA's, one per "
                      f"warpgroup, and named barriers allocated earlier): named_barrier(count={count}) does not fit")
    op = t.builder.add(ops.NamedBarrierAlloc(count, warpgroups, t.builder.loc))
    return NamedBarriers(op.result, count, warpgroups)


@method(NamedBarriers, "__getitem__")
def named_slot(t: Semantics, bars: NamedBarriers, index: Any) -> NamedBarrierSlot:
    if isinstance(index, int) and not 0 <= index < bars.count:
        raise t.error(f"index {index} is outside this array of {bars.count} named barriers")
    return NamedBarrierSlot(bars, index)


def _slot_op(t: Semantics, slot: NamedBarrierSlot, op_class: type, name: str, args: list, kwargs: dict) -> None:
    if args or kwargs:
        raise t.error(f"named barrier .{name}() takes no arguments")
    index = t.cast(t.to_tensor(slot.index), dtypes.int32)
    if index.shape:
        raise t.error("a named barrier's index is a scalar")
    t.builder.add(op_class(slot.barriers.value, index.value, t.builder.loc))


@method(NamedBarrierSlot, "sync")
def named_sync(t: Semantics, slot: NamedBarrierSlot, args: list, kwargs: dict) -> None:
    """Arrive and wait until the barrier's phase has all its warpgroups."""
    _slot_op(t, slot, ops.NamedBarrierSync, "sync", args, kwargs)


@method(NamedBarrierSlot, "arrive")
def named_arrive(t: Semantics, slot: NamedBarrierSlot, args: list, kwargs: dict) -> None:
    """Arrive without waiting."""
    _slot_op(t, slot, ops.NamedBarrierArrive, "arrive", args, kwargs)

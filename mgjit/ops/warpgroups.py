"""Warpgroups of a CTA: WarpgroupId (which warpgroup this thread is in), SetMaxRegisters (setmaxnreg: hand
registers between warpgroups with different roles, as warp-specialized kernels do), and the barriers between
warpgroups: CtaSync (every warpgroup of the CTA meets, bar.sync 0) and named barriers (NamedBarrierAlloc,
NamedBarrierArrive, NamedBarrierSync: bar.arrive / bar.sync with an id and a count of threads, so that some
warpgroups order their work against others, as ping-pong schedules do).

Hardware barrier ids: 0 is the CTA's, 1 + w the private one of warpgroup w (Context.warpgroup_barrier), and
named barriers take the ids after those, in the order the kernel allocates them (`named_barrier_ids`).
"""
from __future__ import annotations

from typing import Generator

import torch

from .. import dtypes, infer, interpret, ir, lower
from ..errors import Check, Loc, Rule
from ..interpret.checker import join
from ..interpret.machine import NamedBarrier
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import Op, RefType, ScalarType, Value, check, is_int_scalar
from ..layouts import THREADS_PER_WARPGROUP
from .control import For, If
from .elementwise import Binary, Cast, Compare
from .gmem import Store
from .program import Constant
from .tma import TmaStore

HARDWARE_BARRIERS = 16  # bar.sync ids 0..15 per CTA


class WarpgroupId(Op):
    name = "warpgroup_id"

    def __init__(self, loc: Loc | None):
        super().__init__([], [ScalarType(dtypes.int32)], loc)


class SetMaxRegisters(Op):
    name = "set_max_registers"
    requires = "setmaxnreg"

    def __init__(self, count: int, increase: bool, loc: Loc | None):
        super().__init__([], [], loc)
        self.count = count
        self.increase = increase

    def attrs(self):
        return {"count": self.count, "increase": self.increase}

    def verify(self):
        if not (24 <= self.count <= 256 and self.count % 8 == 0):
            raise self.error(f"set_max_registers takes a multiple of 8 in 24..256, got {self.count}",
                             rule=Rule.REGISTERS)


class CtaSync(Op):
    """Every warpgroup of the CTA meets here (bar.sync 0): what one wrote to SMEM before it, any other may read
    after it."""

    name = "cta_sync"

    def __init__(self, loc: Loc | None):
        super().__init__([], [], loc)


class NamedBarrierAlloc(Op):
    """`count` named barriers, each completing a phase once `warpgroups` whole warpgroups have arrived on it."""

    name = "named_barrier_alloc"

    def __init__(self, count: int, warpgroups: int, loc: Loc | None):
        super().__init__([], [RefType("named_barrier", dtypes.int32, 1, (count,))], loc)
        self.count = count
        self.warpgroups = warpgroups

    def attrs(self):
        return {"count": self.count, "warpgroups": self.warpgroups}

    def verify(self):
        check(self.count >= 1 and self.warpgroups >= 1, self,
              f"named barriers need count >= 1 and warpgroups >= 1, got {self.count} and {self.warpgroups}")


class _NamedBarrierOp(Op):
    """An op on barrier `index` (a runtime int) of a named-barrier array."""

    def __init__(self, barriers: Value, index: Value, loc: Loc | None):
        super().__init__([barriers, index], [], loc)

    def verify(self):
        bars, index = self.operands
        check(isinstance(bars.type, RefType) and bars.type.space == "named_barrier", self,
              "expected a named-barrier array (mgjit.named_barrier(...))")
        check(is_int_scalar(index), self, "a named barrier's index is an integer scalar")


class NamedBarrierArrive(_NamedBarrierOp):
    """Arrive on a named barrier without waiting (bar.arrive): releases what this warpgroup did before it to the
    warpgroups that wait for the phase."""

    name = "named_barrier_arrive"


class NamedBarrierSync(_NamedBarrierOp):
    """Arrive on a named barrier and wait for its phase to complete (bar.sync)."""

    name = "named_barrier_sync"


infer.rule(WarpgroupId, SetMaxRegisters, CtaSync, NamedBarrierAlloc, NamedBarrierArrive,
           NamedBarrierSync)(infer.no_arrays)


def named_barrier_ids(kernel: ir.Kernel) -> dict[int, int]:
    """The first hardware barrier id of each NamedBarrierAlloc (by id(op)), in program order after the ids the
    CTA and the warpgroups' private barriers take. Raises the CompileError of the one that does not fit."""
    first, out = 1 + kernel.num_warpgroups, {}
    for op in kernel.walk():
        if isinstance(op, NamedBarrierAlloc):
            if first + op.count > HARDWARE_BARRIERS:
                raise op.error(f"a CTA has {HARDWARE_BARRIERS} hardware barriers: id 0 for the CTA, "
                               f"{kernel.num_warpgroups} for its warpgroups' own use, {first - 1 - kernel.num_warpgroups} "
                               f"named barriers allocated before this line; {op.count} more do not fit")
            out[id(op)] = first
            first += op.count
    return out


# ---------------------------------------------------------------------------------------------- lowering

@lower.rule(WarpgroupId)
def _warpgroup_id(op: WarpgroupId, ctx: lower.Context) -> None:
    ctx.set(op.result, ctx.wg_id)


@lower.rule(SetMaxRegisters)
def _set_max_registers(op: SetMaxRegisters, ctx: lower.Context) -> None:
    ctx.e.asm_void(f"setmaxnreg.{'inc' if op.increase else 'dec'}.sync.aligned.u32 {op.count};", "", [])


@lower.rule(CtaSync)
def _cta_sync(op: CtaSync, ctx: lower.Context) -> None:
    """It meets the warpgroup too: a read of SMEM right after it needs no barrier of its own (piped rows met the
    CTA and then their warpgroup, back to back, on every row)."""
    ctx.e.asm_void("bar.sync 0;", "", [])
    ctx.met()


@lower.rule(NamedBarrierAlloc)
def _named_barrier_alloc(op: NamedBarrierAlloc, ctx: lower.Context) -> None:
    ctx.set(op.result, named_barrier_ids(ctx.kernel)[id(op)])  # the first id: static, nothing to initialise


def _named_barrier(op: _NamedBarrierOp, ctx: lower.Context, instruction: str) -> None:
    e = ctx.e
    alloc = op.operands[0].owner
    barrier_id = e.addi(e.i32(ctx.get(op.operands[0])), ctx.get(op.operands[1]))
    e.asm_void(f"{instruction} $0, {alloc.warpgroups * THREADS_PER_WARPGROUP};", "r", [barrier_id])


@lower.rule(NamedBarrierArrive)
def _named_barrier_arrive(op: NamedBarrierArrive, ctx: lower.Context) -> None:
    _named_barrier(op, ctx, "bar.arrive")


@lower.rule(NamedBarrierSync)
def _named_barrier_sync(op: NamedBarrierSync, ctx: lower.Context) -> None:
    _named_barrier(op, ctx, "bar.sync")


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(WarpgroupId)
def _interp_warpgroup_id(op: WarpgroupId, wg: Warpgroup) -> None:
    wg.set(op.result, torch.tensor(wg.index, dtype=torch.int32))


@interpret.rule(SetMaxRegisters)
def _interp_set_max_registers(op: SetMaxRegisters, wg: Warpgroup) -> Generator[Wait, None, None]:
    """setmaxnreg changes no value, but it is checked: .dec may not raise the warpgroup's count nor .inc lower
    it, and .inc waits until the CTA's pool (what the CTA launched with, less what the other warpgroups hold)
    can pay for it, so that asking for more than the register file has is a deadlock naming this line."""
    pool = wg.cta.registers
    current = pool.counts[wg.index]
    if (op.count < current) if op.increase else (op.count > current):
        verb, way = ("increase", "fewer") if op.increase else ("decrease", "more")
        raise wg.error(op, Check.REGISTERS, f"set_max_registers({op.count}, increase={op.increase}) would "
                       f"{verb} this warpgroup to {way} registers than the {current} it has")

    def describe() -> str:
        more = (op.count - pool.counts[wg.index]) * THREADS_PER_WARPGROUP
        return (f"set_max_registers({op.count}) for {more} more registers; the CTA's pool has {pool.free} free "
                f"(the warpgroups hold {pool.counts} per thread)")

    yield Wait(op.loc, lambda: pool.available(wg.index, op.count), describe, lambda: pool.set(wg.index, op.count))


@interpret.rule(CtaSync)
def _interp_cta_sync(op: CtaSync, wg: Warpgroup) -> Generator[Wait, None, None]:
    yield wg.rendezvous(op, wg.cta.sync)


@interpret.rule(NamedBarrierAlloc)
def _interp_named_barrier_alloc(op: NamedBarrierAlloc, wg: Warpgroup) -> None:
    wg.set(op.result, op)


def _interp_barrier(op: _NamedBarrierOp, wg: Warpgroup) -> NamedBarrier:
    """The named barrier an op addresses, its index checked against the array's size."""
    alloc = wg.get(op.operands[0], op)
    index = int(wg.scalar(op.operands[1], op))
    if not 0 <= index < alloc.count:
        raise wg.error(op, Check.OUT_OF_BOUNDS, f"index {index} is outside this array of {alloc.count} named "
                       f"barriers", (alloc.loc,))
    return wg.cta.named_barrier_array(alloc)[index]


@interpret.rule(NamedBarrierArrive)
def _interp_named_barrier_arrive(op: NamedBarrierArrive, wg: Warpgroup) -> None:
    _interp_barrier(op, wg).arrive(wg.index, wg.clock)


@interpret.rule(NamedBarrierSync)
def _interp_named_barrier_sync(op: NamedBarrierSync, wg: Warpgroup) -> Generator[Wait, None, None]:
    bar = _interp_barrier(op, wg)
    phase = bar.arrive(wg.index, wg.clock)

    def describe() -> str:
        return (f"{bar.describe()} to complete phase {phase}: {len(bar.arrived)} of {bar.count} warpgroups have "
                f"arrived (warpgroups {sorted(bar.arrived)})")

    yield Wait(op.loc, lambda: bar.phase > phase, describe, lambda: join(wg.clock, bar.released[phase]))


# ---------------------------------------------------------------------------------------------- the GMEM rule
# Every warpgroup of a CTA runs every statement that is not under a branch on mgjit.warpgroup_id(). A GMEM
# load so run gives each warpgroup its own copy (costing bandwidth, nothing else); a GMEM store so run writes
# its window once per warpgroup, which is a duplicate at best and a race when their values differ. The
# compiler warns about a store (plain or TMA) that two or more warpgroups may run at a window that does not
# depend on the warpgroup.

_UNKNOWN = object()
_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
         "floordiv": lambda a, b: a // b if b else _UNKNOWN, "mod": lambda a, b: a % b if b else _UNKNOWN,
         "min": min, "max": max, "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b}
_COMPARE = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
            "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


def _fold(op: Op, env: dict[int, object], warpgroup: int) -> object:
    """The value of a scalar op that depends only on constants and the warpgroup, else _UNKNOWN."""
    if isinstance(op, WarpgroupId):
        return warpgroup
    if isinstance(op, Constant):
        return op.value if isinstance(op.value, (bool, int)) else _UNKNOWN
    args = [env.get(v.id, _UNKNOWN) for v in op.operands]
    if any(a is _UNKNOWN for a in args) or op.results[0].is_array:
        return _UNKNOWN
    if isinstance(op, Binary) and op.kind in _FOLD:
        return _FOLD[op.kind](*args)
    if isinstance(op, Compare):
        return _COMPARE[op.kind](*args)
    if isinstance(op, Cast) and not op.result.dtype.is_float:
        return bool(args[0]) if op.result.dtype == dtypes.bool_ else int(args[0])
    return _UNKNOWN


def _runners(kernel: ir.Kernel) -> dict[int, set[int]]:
    """For each op (by id), the warpgroups that may run it: branch conditions on the warpgroup are folded."""
    runners: dict[int, set[int]] = {}

    def walk(block: ir.Block, env: dict[int, object], w: int) -> None:
        for op in block.ops:
            runners.setdefault(id(op), set()).add(w)
            if isinstance(op, If):
                cond = env.get(op.operands[0].id, _UNKNOWN)
                for taken, region in zip((True, False), op.regions):
                    if cond is _UNKNOWN or bool(cond) == taken:
                        walk(region, env, w)
            else:
                for region in op.regions:
                    walk(region, env, w)
            if len(op.results) == 1 and not op.regions:
                env[op.results[0].id] = _fold(op, env, w)

    for w in range(kernel.num_warpgroups):
        walk(kernel.body, {}, w)
    return runners


def _warpgroup_dependent(kernel: ir.Kernel) -> set[int]:
    """The values (by id) that may differ between the warpgroups of a CTA: those computed from the warpgroup id,
    or chosen by a branch on one, or carried through a loop from one, or a loop's index where its start or step
    is one (warpgroups that take turns: `range(wg, n, 2)`)."""
    tainted: set[int] = set()
    while True:
        before = len(tainted)
        for op in kernel.walk():
            if isinstance(op, WarpgroupId) or any(v.id in tainted for v in op.operands):
                tainted.update(r.id for r in op.results)
            for region in op.regions:
                yielded = region.ops[-1].operands if region.ops else []
                if isinstance(op, If):
                    tainted.update(r.id for r, y in zip(op.results, yielded) if y.id in tainted)
                if isinstance(op, For):
                    lower, _, step = op.operands[:3]
                    if lower.id in tainted or step.id in tainted:
                        tainted.add(region.args[0].id)
                    for arg, init, y, r in zip(region.args[1:], op.inits, yielded, op.results):
                        if init.id in tainted or y.id in tainted:
                            tainted.update((arg.id, r.id))
        if len(tainted) == before:
            return tainted


def replicated_stores(kernel: ir.Kernel) -> list[tuple[Op, list[int]]]:
    """GMEM stores (plain and TMA) that several warpgroups may run at one window, each with those warpgroups."""
    if kernel.num_warpgroups == 1:
        return []
    runners, dependent = _runners(kernel), _warpgroup_dependent(kernel)
    out = []
    for op in kernel.walk():
        if isinstance(op, (Store, TmaStore)) and len(runners.get(id(op), ())) > 1:
            window = op.coords if isinstance(op, TmaStore) else op.starts
            if not any(v.id in dependent for v in window):
                out.append((op, sorted(runners[id(op)])))
    return out

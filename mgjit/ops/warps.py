"""Warps of a warpgroup with roles of their own: WarpSplit (`if mgjit.warp_id() == w:` blocks), as a
warp-specialized Blackwell kernel gives one warp its TMA copies and another its MMAs.

A WarpSplit holds one region per warp of the warpgroup (0..3, empty where a warp has no role): warp w runs
region w, the warpgroup's other warps skip it, and they meet again after the split. The regions hold scalar
work and what one thread issues for its warp (TMA copies, mbarrier arrivals and waits, tcgen05 MMAs, copies and
commits, cluster launch control): inside, the thread that issues is the warp's lane 0 instead of the
warpgroup's thread 0. Register arrays, which span the warpgroup's 128 threads, and everything that
synchronises the warpgroup or the CTA cannot be in a warp's region (the verifier says which op).

The frontend puts the `if mgjit.warp_id() == w:` blocks of a block into one WarpSplit, which must end its block:
the warps run their roles concurrently, so nothing may follow that the roles would have to wait for.
"""
from __future__ import annotations

from typing import Generator

from .. import infer, interpret, lower
from ..errors import Loc, Rule
from ..interpret.checker import join
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import ArrayType, Block, Op
from ..layouts import WARPS_PER_WARPGROUP
from .barriers import BarrierAlloc
from .clusters import ClusterSync
from .tma import TmaStore, TmaStoreWait
from .tmem import TmemAlloc, TmemDealloc
from .warpgroups import SetMaxRegisters

# Ops that involve every thread of the warpgroup or of the CTA (bar.sync, .sync.aligned warpgroup instructions):
# a warp alone would wait for the others forever.
_WARPGROUP_OPS = (BarrierAlloc, ClusterSync, SetMaxRegisters, TmaStore, TmaStoreWait, TmemAlloc, TmemDealloc)


class WarpSplit(Op):
    """Region w is run by warp w of the warpgroup alone (regions of warps without a role hold only their Yield)."""

    name = "warp_split"

    def __init__(self, loc: Loc | None):
        super().__init__([], [], loc, [Block() for _ in range(WARPS_PER_WARPGROUP)])
        for region in self.regions:
            region.parent = self

    @property
    def roles(self) -> list[tuple[int, Block]]:
        """(warp, region) of each warp with a role."""
        return [(w, region) for w, region in enumerate(self.regions) if len(region.ops) > 1]

    def attrs(self):
        return {"warps": [w for w, _ in self.roles]}

    def verify(self):
        for _, region in self.roles:
            for op in region.walk():
                if isinstance(op, _WARPGROUP_OPS + (WarpSplit,)):
                    what = "another warp split" if isinstance(op, WarpSplit) else f"`{op.name}`"
                    raise op.error(f"{what} cannot be in one warp's role: it involves every thread of the warpgroup "
                                   "or the CTA; move it out of the `if mgjit.warp_id() == ...` block",
                                   rule=Rule.WARP_ROLE)
                values = [*op.operands, *op.results]
                if any(isinstance(v.type, ArrayType) for v in values):
                    raise op.error("a register array spans the 128 threads of a warpgroup, so one warp's role cannot "
                                   "compute with one: keep arrays outside `if mgjit.warp_id() == ...` blocks",
                                   rule=Rule.WARP_ROLE)


@infer.rule(WarpSplit)
def _infer_warp_split(op: WarpSplit, inf: infer.Inference) -> None:
    for region in op.regions:
        inf.block(region)


@lower.rule(WarpSplit)
def _warp_split(op: WarpSplit, ctx: lower.Context) -> None:
    """One scf.if per role on the warp index. While a role lowers, ctx.wg_tid is the thread's lane: the ops
    that let one thread issue for its group (thread 0 of `wg_tid`) then elect the warp's lane 0."""
    e = ctx.e
    group_tid = ctx.wg_tid
    try:
        ctx.wg_tid = ctx.lane
        with ctx.branches() as start:
            for warp, region in op.roles:
                start()
                e.only_if(e.cmpi("eq", ctx.warp, e.i32(warp)), lambda: lower.lower_ops(ctx, region.ops[:-1]))
    finally:
        ctx.wg_tid = group_tid


# ---------------------------------------------------------------------------------------------- interpreter
# Each role runs as an agent of its own (its clock, its SMEM stores), interleaved by this rule: the warpgroup's
# coroutine blocks until every role is done, on a wait that is ready when any role can go on. The roles start
# with the warpgroup's clock and it takes theirs back at the end.

class _Role:
    def __init__(self, wg: Warpgroup, warp: int, region: Block):
        self.warp = warp
        self.agent = Warpgroup(wg.run, wg.cluster, wg.cta, wg.index, wg.engine)
        self.agent.env = wg.env  # SSA values have unique ids: the roles and the warpgroup share one table
        self.agent.agent = ("warp", wg.cta.rank, wg.index, warp)
        self.agent.clock = dict(wg.clock)
        # A split run again (in a loop) continues the role's count of its accesses, which the clock has seen.
        self.agent.events = self.agent.clock.get(self.agent.agent, 0)
        self.steps = self.agent.region(region, [])
        self.wait: Wait | None = None

    def advance(self) -> bool:
        """Run until the role blocks (True) or ends (False)."""
        if self.wait is not None:
            if self.wait.acquire:
                self.wait.acquire()
            self.wait = None
        while True:
            try:
                wait = next(self.steps)
            except StopIteration:
                return False
            if not wait.ready():
                self.wait = wait
                return True
            if wait.acquire:
                wait.acquire()


@interpret.rule(WarpSplit)
def _interp_warp_split(op: WarpSplit, wg: Warpgroup) -> Generator[Wait, None, None]:
    roles = [_Role(wg, warp, region) for warp, region in op.roles]
    running = list(roles)
    while running:
        order = list(running)
        if wg.engine.policy == "random":
            wg.run.rng.shuffle(order)
        for role in order:
            if role.wait is None or role.wait.ready():
                if not role.advance():
                    running.remove(role)
        blocked = [r for r in running if r.wait is not None and not r.wait.ready()]
        if blocked and len(blocked) == len(running):
            first = blocked[0].wait
            yield Wait(first.loc, lambda: any(r.wait.ready() for r in blocked),
                       lambda: "; ".join(f"warp {r.warp} at line {r.wait.loc.line if r.wait.loc else '?'}: "
                                         f"{r.wait.describe()}" for r in blocked),
                       barrier=first.barrier, cross_cta=any(r.wait.cross_cta for r in blocked))
    for role in roles:
        join(wg.clock, role.agent.clock)

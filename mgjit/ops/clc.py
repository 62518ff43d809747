"""Cluster launch control (Blackwell): ClcTryCancel (clusterlaunchcontrol.try_cancel: ask the GPU for a cluster of
this grid that has not launched yet, cancelling its launch) and ClcQuery (clusterlaunchcontrol.query_cancel: did
it, and which was it). A persistent kernel launched with one cluster per tile uses them to schedule tiles
dynamically: each running cluster takes over clusters that would otherwise wait for an SM.

The response is 16 bytes of SMEM, written asynchronously and completed on an mbarrier like a TMA copy: the op
arms the barrier with the response's bytes (one arrival), and the response may be read once the barrier's phase
completes. With multicast=True the response goes to every CTA of the cluster: each CTA arms its own barrier,
and the cluster's rank-0 CTA issues the request. After a CTA has seen a failed response it must not ask again
(undefined behaviour in PTX; the interpreter reports it).

The interpreter's model (`ClusterLaunches`): the grid's clusters launch in order (x fastest; under the random
schedule, in an order drawn from its seed, as a GPU promises none); the first `resident`
clusters (an option of `kernel.interpret`, default 1) are running from the start, every other one launches when the
interpreter starts it (when those before it are done, or beside them when every running warpgroup is blocked and one
waits on a semaphore: interpret/scheduler.run_grid). A try_cancel, when it completes, cancels the first cluster in
launch order that has not launched and was not cancelled before, and that cluster never runs. With the default, the
first cluster takes over every tile of the grid that it asks for; `resident` equal to the number of clusters makes
every request fail.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

from .. import dtypes, infer, interpret, lower
from ..errors import Check, InterpretError, Loc
from ..interpret.checker import Access, check_read, check_write
from ..interpret.scheduler import AsyncOp, Warpgroup
from ..ir import Op, ScalarType, Value, check, is_ref
from .clusters import cluster_ctarank
from .smem import shared_address, tile_of, tile_ranges

RESPONSE_BYTES = 16


def _check_response(op: Op, v: Value) -> None:
    check(is_ref(v, "smem") and not v.type.transposed and tile_of(v.type).nbytes == RESPONSE_BYTES
          and v.type.swizzle is None, op,
          f"a cluster launch control response is a {RESPONSE_BYTES}-byte SMEM buffer, e.g. mgjit.smem((2,), "
          f"mgjit.int64) (or resp[i] of mgjit.smem((n, 2), mgjit.int64)), got {v.type}")


class ClcTryCancel(Op):
    """clusterlaunchcontrol.try_cancel into `response`, completing on `barrier` (armed here with 16 bytes)."""

    name = "clc_try_cancel"
    requires = "clc"

    def __init__(self, response: Value, barrier: Value, multicast: bool, loc: Loc | None):
        super().__init__([response, barrier], [], loc)
        self.multicast = multicast

    def attrs(self):
        return {"multicast": self.multicast}

    def verify(self):
        _check_response(self, self.operands[0])
        check(is_ref(self.operands[1], "barrier") and self.operands[1].type.rank == 0, self,
              "the response completes on one barrier: index the barrier array, e.g. bars[slot]")


class ClcQuery(Op):
    """(canceled, x, y, z): whether the response cancelled a cluster, and the program id of its first CTA
    (-1 on each axis when it did not)."""

    name = "clc_query"
    requires = "clc"

    def __init__(self, response: Value, loc: Loc | None):
        super().__init__([response], [ScalarType(dtypes.bool_)] + [ScalarType(dtypes.int32)] * 3, loc)

    def verify(self):
        _check_response(self, self.operands[0])


infer.rule(ClcTryCancel, ClcQuery)(infer.no_arrays)


# ---------------------------------------------------------------------------------------------- lowering

@lower.rule(ClcTryCancel)
def _clc_try_cancel(op: ClcTryCancel, ctx: lower.Context) -> None:
    e = ctx.e
    response = shared_address(ctx, ctx.get(op.operands[0]).offset)
    bar = shared_address(ctx, ctx.get(op.operands[1]).offset)
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    e.asm_void(f"@$0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$1], {RESPONSE_BYTES};", "b,r", [elected, bar])
    issuer, multicast = elected, ""
    if op.multicast:
        issuer = e.andi(elected, e.cmpi("eq", cluster_ctarank(ctx), e.i32(0)))
        multicast = ".multicast::cluster::all"
    e.asm_void(f"@$0 clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes{multicast}.b128 "
               "[$1], [$2];", "b,r,r", [issuer, response, bar])


@lower.rule(ClcQuery)
def _clc_query(op: ClcQuery, ctx: lower.Context) -> None:
    e = ctx.e
    response = shared_address(ctx, ctx.get(op.operands[0]).offset)
    i64, i32 = e.int_type(64), e.int_type(32)
    lo, hi = e.asm("ld.shared.v2.b64 {$0, $1}, [$2];", "=l,=l,r", [response], [i64, i64], side_effects=True)
    ids = " ".join(f"mov.s32 ${i + 1}, -1; @p clusterlaunchcontrol.query_cancel.get_first_ctaid::{axis}.b32.b128 "
                   f"${i + 1}, r;" for i, axis in enumerate("xyz"))
    canceled, x, y, z = e.asm(
        "{ .reg .b128 r; .reg .pred p; mov.b128 r, {$4, $5}; "
        f"clusterlaunchcontrol.query_cancel.is_canceled.pred.b128 p, r; selp.u32 $0, 1, 0, p; {ids} }}",
        "=r,=r,=r,=r,l,l", [lo, hi], [i32] * 4)
    ctx.set(op.results[0], e.cmpi("ne", canceled, e.i32(0)))
    for result, value in zip(op.results[1:], (x, y, z)):
        ctx.set(result, value)


# ---------------------------------------------------------------------------------------------- interpreter
# The response the interpreter writes (the hardware's encoding is opaque): four int32 words, (1, x, y, z) when a
# cluster whose first CTA is (x, y, z) was cancelled, (0, 0, 0, 0) when none was.

class ClusterLaunches:
    """The grid's clusters in launch order (x fastest, or drawn from `shuffle`, a random.Random), which have
    launched, and which a try_cancel cancelled."""

    def __init__(self, grid: tuple[int, int, int], cluster: tuple[int, int, int], resident: int,
                 shuffle: Any = None):
        (gx, gy, gz), (cx, cy, cz) = grid, cluster
        self.origins = [(x, y, z) for z in range(0, gz, cz) for y in range(0, gy, cy) for x in range(0, gx, cx)]
        if shuffle is not None:
            shuffle.shuffle(self.origins)
        self.launched = max(resident, 1)  # clusters [0, launched) of the order have launched
        self.cancelled: set[int] = set()
        self.failed_seen: set[tuple[int, int, int]] = set()  # CTAs that read a failed response

    def __iter__(self):
        """The clusters to run, in order: those no try_cancel cancelled (each launches as it starts)."""
        for i, origin in enumerate(self.origins):
            if i not in self.cancelled:
                self.launched = max(self.launched, i + 1)
                yield origin

    def try_cancel(self) -> tuple[int, int, int] | None:
        """Cancel the first cluster that has not launched; its first CTA, or None when every one has."""
        for i in range(self.launched, len(self.origins)):
            if i not in self.cancelled:
                self.cancelled.add(i)
                return self.origins[i]
        return None


_requests = itertools.count()


@interpret.rule(ClcTryCancel)
def _interp_clc_try_cancel(op: ClcTryCancel, wg: Warpgroup) -> None:
    """Every CTA arms its barrier (for multicast: its own; rank 0 alone issues). The response's bytes count as
    written by an unfinished copy until it lands: reading them before the barrier's wait is a race."""
    cta, cluster = wg.cta, wg.cluster
    response = wg.get(op.operands[0], op)
    ref = wg.get(op.operands[1], op)
    ref.get(cta).arrive(wg.clock, op.loc, tx=RESPONSE_BYTES)
    if op.multicast and cta.rank != 0:
        return
    launches: ClusterLaunches = wg.run.launches
    if cta.program_id in launches.failed_seen:
        raise InterpretError("this try_cancel comes after the CTA read a failed response: asking again after a "
                             "failure is undefined behaviour (stop asking once clc_query says none was cancelled)",
                             op.loc, Check.CLC_AFTER_FAILURE)
    (start, end), = tile_ranges(response)  # a response is 16 contiguous bytes
    landing = []
    for t in (cluster.ctas if op.multicast else [cta]):
        check_write(t.smem_records, start, end, wg.clock, op.loc, "this try_cancel's response")
        bar = ref.get(t)
        access = Access(start, end, "tma", bar.key, None, op.loc, "try_cancel response")
        t.smem_records.add(access)
        landing.append((t, bar, access))
    clock = dict(wg.clock)

    def land() -> None:
        origin = launches.try_cancel()
        words = torch.tensor([1, *origin] if origin is not None else [0, 0, 0, 0], dtype=torch.int32)
        for t, bar, access in landing:
            t.smem[start:end] = words.view(torch.uint8)
            access.count = bar.completed + 1
            bar.complete_tx(RESPONSE_BYTES, clock, op.loc)

    wg.engine.issue(AsyncOp(("clc", next(_requests)), op.loc, "try_cancel", land, tuple(t for t, _, _ in landing)))


@interpret.rule(ClcQuery)
def _interp_clc_query(op: ClcQuery, wg: Warpgroup) -> None:
    response = wg.get(op.operands[0], op)
    (start, end), = tile_ranges(response)  # a response is 16 contiguous bytes
    check_read(wg.cta.smem_records, start, end, wg.clock, op.loc, "this clc_query", async_proxy=False)
    words = wg.cta.smem[start:end].clone().view(torch.int32).tolist()
    canceled = words[0] == 1
    if not canceled:
        wg.run.launches.failed_seen.add(wg.cta.program_id)
    values: list[Any] = [canceled, *(words[1:] if canceled else [-1, -1, -1])]
    for result, value in zip(op.results, values):
        wg.set(result, torch.tensor(value, dtype=torch.bool if result.dtype == dtypes.bool_ else torch.int32))

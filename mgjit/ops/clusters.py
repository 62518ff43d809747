"""Clusters: ClusterRank (this CTA's rank in its cluster), ClusterSync (a barrier across every thread of
every CTA of the cluster, with release/acquire ordering) and ClusterReduce (a value combined over every
warpgroup of the cluster, through distributed shared memory).
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Generator

import torch

from .. import dtypes, infer, interpret, lower
from ..errors import Loc
from ..interpret import numerics
from ..interpret.machine import Cluster
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import Op, ScalarType, Value, check
from ..layouts import SplatLayout
from ..lower.context import element_offsets
from .arrays import linear_index
from .reductions import REDUCE_KINDS, combine
from .smem import shared_address


class ClusterRank(Op):
    name = "cluster_rank"
    requires = "cluster"

    def __init__(self, loc: Loc | None):
        super().__init__([], [ScalarType(dtypes.int32)], loc)


class ClusterSync(Op):
    """A barrier across every thread of every CTA in the cluster (release/acquire ordering)."""

    name = "cluster_sync"
    requires = "cluster"

    def __init__(self, loc: Loc | None):
        super().__init__([], [], loc)


class ClusterReduce(Op):
    """x (a scalar or an array) combined elementwise by `kind` (sum, max, min) over every warpgroup of every CTA
    of the cluster; each gets the same bits. It synchronises the cluster (every warpgroup must reach it)."""

    name = "cluster_reduce"
    requires = "cluster"

    def __init__(self, kind: str, x: Value, ctas: int, loc: Loc | None):
        super().__init__([x], [x.type], loc)
        self.kind = kind
        self.ctas = ctas  # CTAs in the cluster the kernel is compiled for

    def attrs(self):
        return {"kind": self.kind, "ctas": self.ctas}

    def verify(self):
        x = self.operands[0]
        check(self.kind in REDUCE_KINDS, self, f"unknown reduction {self.kind}; expected one of {REDUCE_KINDS}")
        check(x.dtype in (dtypes.float32, dtypes.int32), self,
              f"cluster_reduce combines float32 or int32 values, got {x.dtype.name}; use .astype()")


infer.rule(ClusterRank, ClusterSync)(infer.no_arrays)


@infer.rule(ClusterReduce)
def _infer_cluster_reduce(op: ClusterReduce, inf: infer.Inference) -> None:
    if op.result.is_array:
        inf.set_layout(op.result, op.operands[0].layout, op)


# ---------------------------------------------------------------------------------------------- lowering

def cluster_ctarank(ctx: lower.Context) -> Any:
    """%cluster_ctarank: the rank of this CTA in its cluster (i32)."""
    return ctx.e.asm("mov.u32 $0, %cluster_ctarank;", "=r", [], [ctx.e.int_type(32)])[0]


def pair_leader_rank(ctx: lower.Context) -> Any:
    """The cluster rank of this CTA pair's leader (the even one), for 2-CTA (collective) work."""
    return ctx.e.andi(cluster_ctarank(ctx), ctx.e.i32(~1))


@lower.rule(ClusterRank)
def _cluster_rank(op: ClusterRank, ctx: lower.Context) -> None:
    ctx.set(op.result, cluster_ctarank(ctx))


def cluster_barrier(ctx: lower.Context) -> None:
    ctx.e.asm_void("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;", "", [])


@lower.rule(ClusterSync)
def _cluster_sync(op: ClusterSync, ctx: lower.Context) -> None:
    cluster_barrier(ctx)


@lower.rule(ClusterReduce)
def _cluster_reduce(op: ClusterReduce, ctx: lower.Context) -> None:
    """Every warpgroup owns a slot (cluster rank × warpgroups + its index) of a scratch buffer that sits at the
    same offset in every CTA's shared memory; each element's first holder writes it into its slot in every CTA
    (mapa + st.shared::cluster), the cluster synchronises, and every thread combines the slots of the elements
    it holds in slot order. A second barrier keeps the slots from being written again (a loop) or their CTA
    from exiting while another CTA still reads them. Compiled for one CTA, the same goes through the CTA's own
    shared memory and bar.sync, with no cluster instruction."""
    e = ctx.e
    x, out = op.operands[0], op.result
    dtype = x.dtype
    lowered = ctx.get(x)
    tiled = x.is_array and not isinstance(lowered.layout, SplatLayout)
    if tiled:
        layout, shape = lowered.layout, lowered.shape
        thread = ctx.thread_index(layout, shape)
        places = [linear_index(ctx, [e.addi(t, e.i32(k)) for t, k in zip(thread, off)], shape)
                  for off in element_offsets(layout, shape)]
        values, count, writer = lowered.elems, math.prod(shape), ctx.is_primary(layout)
    else:
        places, count = [e.i32(0)], 1
        values = [lowered.elems[0] if x.is_array else lowered]
        writer = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    slots = op.ctas * ctx.kernel.num_warpgroups
    scratch = ctx.alloc_shared(slots * count * 4, 16)
    rank = cluster_ctarank(ctx) if op.ctas > 1 else e.i32(0)
    mine = e.addi(e.muli(rank, e.i32(ctx.kernel.num_warpgroups)), ctx.wg_id)
    i32 = e.int_type(32)
    barrier = cluster_barrier if op.ctas > 1 else (lambda ctx: ctx.e.asm_void("bar.sync 0;", "", []))
    for place, v in zip(places, values):
        offset = e.addi(e.i32(scratch), e.muli(e.addi(e.muli(mine, e.i32(count)), place), e.i32(4)))
        bits = e.bitcast(v, i32) if dtype.is_float else v
        local = shared_address(ctx, offset)
        if op.ctas == 1:
            e.asm_void("@$0 st.shared.b32 [$1], $2;", "b,r,r", [writer, local, bits])
            continue
        for peer in range(op.ctas):
            remote = e.asm("mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", [local, e.i32(peer)], [i32])[0]
            e.asm_void("@$0 st.shared::cluster.b32 [$1], $2;", "b,r,r", [writer, remote, bits])
    barrier(ctx)
    t = e.type(dtype)
    combined = []
    for place in places:
        acc = None
        for s in range(slots):
            v = e.smem_load(t, e.addi(e.i32(scratch), e.muli(e.addi(e.i32(s * count), place), e.i32(4))))
            acc = v if acc is None else combine(ctx, op.kind, dtype, acc, v)
        combined.append(acc)
    barrier(ctx)
    if not x.is_array:
        ctx.set(out, combined[0])
    else:
        ctx.set(out, lower.Frag(lowered.layout, lowered.shape, dtype, combined))


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(ClusterRank)
def _interp_cluster_rank(op: ClusterRank, wg: Warpgroup) -> None:
    wg.set(op.result, torch.tensor(wg.cta.rank, dtype=torch.int32))


# What the warpgroups of a cluster wrote for each ClusterReduce execution: (id(op), barrier generation) ->
# {(CTA rank, warpgroup index): value}.
_EXCHANGES: "weakref.WeakKeyDictionary[Cluster, dict]" = weakref.WeakKeyDictionary()


@interpret.rule(ClusterReduce)
def _interp_cluster_reduce(op: ClusterReduce, wg: Warpgroup) -> Generator[Wait, None, None]:
    """Combined in slot order (CTA rank, then warpgroup), one operation at a time, as the lowering does."""
    sync = wg.cluster.sync
    exchanges = _EXCHANGES.setdefault(wg.cluster, {})
    key = (id(op), sync.generation)
    box = exchanges.setdefault(key, {})
    box[(wg.cta.rank, wg.index)] = torch.as_tensor(wg.get(op.operands[0], op)).clone()
    yield wg.rendezvous(op, sync)
    values = [box[k] for k in sorted(k for k in box if k != "read")]
    acc = values[0]
    for v in values[1:]:
        if op.kind == "sum":
            acc = acc + v
        else:
            acc = (torch.maximum if op.kind == "max" else torch.minimum)(acc, v)
    box["read"] = box.get("read", 0) + 1
    if box["read"] == len(values):  # the last reader of this execution's values
        del exchanges[key]
    wg.set(op.result, acc.to(numerics.torch_dtype(op.result.dtype)))


@interpret.rule(ClusterSync)
def _interp_cluster_sync(op: ClusterSync, wg: Warpgroup) -> Generator[Wait, None, None]:
    yield wg.rendezvous(op, wg.cluster.sync)

"""Clusters: ClusterRank (this CTA's rank in its cluster), ClusterSync (a barrier across every thread of
every CTA of the cluster, with release/acquire ordering), ClusterReduce (a value combined over every
warpgroup of the cluster, through distributed shared memory) and ClusterGather (values as every warpgroup of
the cluster holds them, several in one exchange).

An exchange between the CTAs of a cluster costs no cluster barrier: every warpgroup writes its slot in every CTA
with st.async, which counts its bytes on the receiving CTA's mbarrier, and each CTA waits on its own mbarrier for
all of them. A scalar's copies go out from as many lanes at once (one thread writing them in turn, 16 CTAs of two
values a row, held bf16 layernorm rows of 262144 to 0.67 of copy bandwidth; 0.81 this way). A barrier.cluster
(whose release is a MEMBAR.ALL.GPU in SASS) would wait for every load and store the CTA has in flight: the stores
of the last row and the loads of the next, in a kernel that prefetches. The
exchanges of a kernel share two mbarriers and each has two slot buffers, picked by the parity of a counter of
the exchanges run so far (a hidden variable of the trace, carried through loops: the `count` operand). Buffer
and mbarrier k are written again two exchanges later, and a CTA gets there only after every CTA wrote its slots
of the exchange between, which each does after a bar.sync of its CTA that follows its reads of exchange k. The
mbarriers are initialised at the kernel's entry, followed by a relaxed cluster arrive; the first exchange waits
on that barrier (where nothing else in the kernel uses cluster barriers), so the entry does not delay the
kernel's first loads.
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any, Callable, Generator

import torch

from .. import dtypes, infer, interpret, ir, lower
from ..errors import Loc
from ..interpret import numerics
from ..interpret.machine import Cluster
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import Op, ScalarType, Value, check
from ..layouts import SplatLayout
from ..lower.context import element_offsets
from .arrays import linear_index
from .control import in_loop
from .reduction_exchange import combine
from .reductions import REDUCE_KINDS
from .smem import shared_address


# What exchanges move: 32-bit values as one word a slot, 64-bit ones as two (`_held`)
EXCHANGED = (dtypes.float32, dtypes.int32, dtypes.float64, dtypes.int64)


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
    of the cluster; each gets the same bits. Every warpgroup must reach it: each waits for all the others' values
    (and for nothing else: it is no memory barrier)."""

    name = "cluster_reduce"
    requires = "cluster"

    def __init__(self, kind: str, x: Value, ctas: int, loc: Loc | None, count: Value | None = None):
        super().__init__([x] + ([count] if count is not None else []), [x.type], loc)
        self.kind = kind
        self.ctas = ctas  # CTAs in the cluster the kernel is compiled for

    @property
    def values(self) -> list[Value]:
        return self.operands[:1]

    def attrs(self):
        return {"kind": self.kind, "ctas": self.ctas}

    def verify(self):
        x = self.operands[0]
        check(self.kind in REDUCE_KINDS, self, f"unknown reduction {self.kind}; expected one of {REDUCE_KINDS}")
        check(x.dtype in EXCHANGED, self,
              f"cluster_reduce combines float32, int32, float64 or int64 values, got {x.dtype.name}; use .astype()")
        _verify_count(self)


class ClusterGather(Op):
    """Each of `values` (scalars or arrays of EXCHANGED dtypes) as every warpgroup of every CTA of the cluster holds
    it, exchanged in one round: the results are value 0 in every slot, then value 1 in every slot, ...; slot =
    CTA rank × warpgroups + warpgroup index. Every warpgroup gets the same bits. Every warpgroup must reach it
    (it waits for all the others' values, and for nothing else)."""

    name = "cluster_gather"
    requires = "cluster"

    def __init__(self, values: list[Value], ctas: int, warpgroups: int, loc: Loc | None, count: Value | None = None):
        super().__init__(values + ([count] if count is not None else []),
                         [v.type for v in values for _ in range(ctas * warpgroups)], loc)
        self.ctas = ctas
        self.warpgroups = warpgroups

    @property
    def values(self) -> list[Value]:
        return self.operands[:len(self.results) // self.slots]

    @property
    def slots(self) -> int:
        return self.ctas * self.warpgroups

    def attrs(self):
        return {"ctas": self.ctas, "warpgroups": self.warpgroups}

    def verify(self):
        check(bool(self.values), self, "cluster_gather needs at least one value")
        for x in self.values:
            check(x.dtype in EXCHANGED, self, f"cluster_gather exchanges float32, int32, float64 or int64 values, got "
                  f"{x.dtype.name}; use .astype()")
        _verify_count(self)


def _verify_count(op: Op) -> None:
    """An exchange between CTAs takes the count of exchanges run before it (an int32 scalar), and only it."""
    counted = len(op.operands) > len(op.values)
    check(counted == (op.ctas > 1), op,
          f"an exchange over {op.ctas} CTAs expected {'a' if op.ctas > 1 else 'no'} count of earlier exchanges, "
          f"got {'one' if counted else 'none'}")
    if counted:
        count = op.operands[-1]
        check(not count.is_array and count.dtype == dtypes.int32, op,
              f"the count of earlier exchanges is an int32 scalar, got {count.type}")


infer.rule(ClusterRank, ClusterSync)(infer.no_arrays)


@infer.rule(ClusterReduce)
def _infer_cluster_reduce(op: ClusterReduce, inf: infer.Inference) -> None:
    if op.result.is_array:
        inf.set_layout(op.result, op.operands[0].layout, op)


@infer.rule(ClusterGather)
def _infer_cluster_gather(op: ClusterGather, inf: infer.Inference) -> None:
    for i, x in enumerate(op.values):
        if x.is_array:
            for r in op.results[i * op.slots:(i + 1) * op.slots]:
                inf.set_layout(r, x.layout, op)


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


@dataclasses.dataclass
class _Held:
    """A value as an exchange moves it: its 32-bit elements, where each goes in a slot, how many a slot holds,
    which threads write them, how to rebuild a value of its type from elements, whether every thread of the
    warpgroup holds it (a scalar, a splat), and whether its elements are 64-bit ones split (`split`: each as its
    low and high words, in places 2p and 2p + 1)."""
    values: list
    places: list
    count: int
    writer: Any
    rebuild: Callable[[list], Any]
    uniform: bool = False
    split: bool = False


def _held(ctx: lower.Context, x: Value) -> _Held:
    held = _held_elements(ctx, x)
    if x.dtype.bits != 64:
        return held
    e = ctx.e
    low_places = [e.muli(place, e.i32(2)) for place in held.places]
    return dataclasses.replace(held, values=[w for v in held.values for w in e.halves(v)], count=2 * held.count,
                               places=[p for low in low_places for p in (low, e.addi(low, e.i32(1)))], split=True)


def _held_elements(ctx: lower.Context, x: Value) -> _Held:
    e = ctx.e
    lowered = ctx.get(x)
    if x.is_array and not isinstance(lowered.layout, SplatLayout):
        layout, shape = lowered.layout, lowered.shape
        thread = ctx.thread_index(layout, shape)
        places = [linear_index(ctx, [e.addi(t, e.i32(k)) for t, k in zip(thread, off)], shape)
                  for off in element_offsets(layout, shape)]
        return _Held(lowered.elems, places, math.prod(shape), ctx.is_primary(layout),
                     lambda elems: lower.Frag(lowered.layout, lowered.shape, x.dtype, elems))
    value = lowered.elems[0] if x.is_array else lowered
    rebuild = (lambda elems: lower.Frag(lowered.layout, lowered.shape, x.dtype, elems)) if x.is_array \
        else (lambda elems: elems[0])
    return _Held([value], [e.i32(0)], 1, e.cmpi("eq", ctx.wg_tid, e.i32(0)), rebuild, uniform=True)


def _exchange(ctx: lower.Context, op: Op) -> list[tuple[_Held, list[list]]]:
    """Every warpgroup's elements of each of op's values: for each value, its _Held and, per element it holds,
    the element in every slot (slot order). Each element's first holder writes it into its warpgroup's slot in
    every CTA's shared memory, and every thread reads the slots of the elements it holds once all were written:
    within one CTA after a bar.sync, between CTAs through st.async and an mbarrier (see the module's doc)."""
    e = ctx.e
    slots = op.ctas * ctx.kernel.num_warpgroups
    held = [_held(ctx, x) for x in op.values]
    bases, total = [], 0
    for h in held:
        bases.append(total)
        total += slots * h.count
    if in_loop(ctx.kernel, op):  # this CTA has read what the last run (one CTA) or the one before (a cluster) wrote
        e.asm_void("bar.sync 0;", "", [])
    if op.ctas == 1:
        buffer = e.i32(ctx.alloc_shared(total * 4, 16))
        _write_slots(ctx, op, held, bases, buffer, None)
        e.asm_void("bar.sync 0;", "", [])
    else:
        count = ctx.get(op.operands[-1])
        which = e.andi(count, e.i32(1))
        buffer = e.addi(e.i32(ctx.alloc_shared(2 * total * 4, 16)), e.muli(which, e.i32(total * 4)))
        barrier = shared_address(ctx, e.addi(e.i32(_exchange_barriers(ctx)), e.muli(which, e.i32(8))))
        if _arrives_at_entry(ctx.kernel):  # the first exchange waits until every CTA initialised its mbarriers
            e.asm_void("{ .reg .pred first; setp.eq.u32 first, $0, 0; @first barrier.cluster.wait.aligned; }",
                       "r", [count])
        e.asm_void(f"@$0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$1], {total * 4};", "b,r",
                   [e.cmpi("eq", ctx.tid, e.i32(0)), barrier])
        _write_slots(ctx, op, held, bases, buffer, barrier)
        e.asm_void("{ .reg .pred done; WAIT: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [$0], $1; "
                   "@!done bra WAIT; }", "r,r", [barrier, e.andi(e.divui(count, e.i32(2)), e.i32(1))])
    out = []
    for h, base, x in zip(held, bases, op.values):
        t = e.type(x.dtype)
        words = [[e.smem_load(e.int_type(32) if h.split else t, _slot_address(ctx, h, buffer, base, e.i32(s), place))
                  for s in range(slots)] for place in h.places]
        if h.split:  # each element's two words, joined again slot by slot
            words = [[e.joined(low, high, t) for low, high in zip(lows, highs)]
                     for lows, highs in zip(words[::2], words[1::2])]
        out.append((h, words))
    return out


def _slot_address(ctx: lower.Context, h: _Held, buffer: Any, base: int, slot: Any, place: Any) -> Any:
    """The SMEM byte offset of element `place` of a value in `slot` of an exchange's buffer."""
    e = ctx.e
    return e.addi(buffer, e.muli(e.addi(e.i32(base), e.addi(e.muli(slot, e.i32(h.count)), place)), e.i32(4)))


def _write_slots(ctx: lower.Context, op: Op, held: list[_Held], bases: list[int], buffer: Any,
                 barrier: Any) -> None:
    """This warpgroup's elements into its slot: of this CTA's buffer (barrier None), or of every CTA's, each
    write counted on that CTA's mbarrier (st.async). A scalar (every thread of the warpgroup holds it) goes to
    the CTAs from as many lanes of its first warp, one st.async each, rather than from one thread in turn."""
    e = ctx.e
    i32 = e.int_type(32)
    mine = e.addi(e.muli(cluster_ctarank(ctx) if op.ctas > 1 else e.i32(0), e.i32(ctx.kernel.num_warpgroups)),
                  ctx.wg_id)
    mapa = "mapa.shared::cluster.u32 $0, $1, $2;"
    if barrier is not None and any(h.uniform for h in held):
        lane_peer = e.remui(ctx.wg_tid, e.i32(op.ctas))  # lanes past the cluster's CTAs: a valid rank, no write
        lane_writes = e.cmpi("ult", ctx.wg_tid, e.i32(op.ctas))
        lane_barrier = e.asm(mapa, "=r,r,r", [barrier, lane_peer], [i32])[0]
    arrays = barrier is not None and not all(h.uniform for h in held)
    peers = [] if not arrays else [(e.i32(p), e.asm(mapa, "=r,r,r", [barrier, e.i32(p)], [i32])[0])
                                   for p in range(op.ctas)]
    for h, base in zip(held, bases):
        for place, v in zip(h.places, h.values):
            bits = e.bitcast(v, i32) if str(v.type) == "f32" else v
            local = shared_address(ctx, _slot_address(ctx, h, buffer, base, mine, place))
            if barrier is None:
                e.asm_void("@$0 st.shared.b32 [$1], $2;", "b,r,r", [h.writer, local, bits])
            elif h.uniform:  # lane p of the first warp writes CTA p's copy
                remote = e.asm(mapa, "=r,r,r", [local, lane_peer], [i32])[0]
                e.asm_void("@$0 st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [$1], $2, [$3];",
                           "b,r,r,r", [lane_writes, remote, bits, lane_barrier])
                continue
            for peer, peer_barrier in peers:
                remote = e.asm(mapa, "=r,r,r", [local, peer], [i32])[0]
                e.asm_void("@$0 st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [$1], $2, [$3];",
                           "b,r,r,r", [h.writer, remote, bits, peer_barrier])


def _arrives_at_entry(kernel: ir.Kernel) -> bool:
    """Whether the entry only arrives at the cluster barrier after initialising the exchanges' mbarriers (and the
    first exchange waits): where nothing else in the kernel uses the cluster barrier, whose arrivals and waits
    must alternate. Otherwise the entry waits too."""
    return kernel.cta_group == 1 and not any(isinstance(o, ClusterSync) for o in kernel.walk())


def _exchange_barriers(ctx: lower.Context) -> int:
    """The SMEM offset of the two mbarriers every exchange between CTAs counts its bytes on, initialised (one
    arrival: the expect_tx) at the kernel's entry, made visible to the cluster, and arrived at."""
    if ctx.exchange_barriers is None:
        e = ctx.e
        ctx.exchange_barriers = ctx.alloc_shared(16, 8)
        with ctx.at_entry():
            base = shared_address(ctx, e.i32(ctx.exchange_barriers))
            first = e.cmpi("eq", ctx.tid, e.i32(0))
            for k in range(2):
                e.asm_void("@$0 mbarrier.init.shared::cta.b64 [$1], 1;", "b,r", [first, e.addi(base, e.i32(8 * k))])
            e.asm_void("fence.mbarrier_init.release.cluster;", "", [])
            e.asm_void("barrier.cluster.arrive.relaxed.aligned;", "", [])
            if not _arrives_at_entry(ctx.kernel):
                e.asm_void("barrier.cluster.wait.aligned;", "", [])
    return ctx.exchange_barriers


@lower.rule(ClusterReduce)
def _cluster_reduce(op: ClusterReduce, ctx: lower.Context) -> None:
    """Each element combined over the slots in slot order."""
    ((held, per_element),) = _exchange(ctx, op)
    combined = []
    for slots in per_element:
        acc = slots[0]
        for v in slots[1:]:
            acc = combine(ctx, op.kind, op.result.dtype, acc, v)
        combined.append(acc)
    ctx.set(op.result, held.rebuild(combined))


@lower.rule(ClusterGather)
def _cluster_gather(op: ClusterGather, ctx: lower.Context) -> None:
    for i, (held, per_element) in enumerate(_exchange(ctx, op)):
        for s in range(op.slots):
            ctx.set(op.results[i * op.slots + s], held.rebuild([slots[s] for slots in per_element]))


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(ClusterRank)
def _interp_cluster_rank(op: ClusterRank, wg: Warpgroup) -> None:
    wg.set(op.result, torch.tensor(wg.cta.rank, dtype=torch.int32))


# What the warpgroups of a cluster wrote for each exchange (ClusterReduce or ClusterGather execution):
# (id(op), barrier generation) -> {(CTA rank, warpgroup index): its operands' values}.
_EXCHANGES: "weakref.WeakKeyDictionary[Cluster, dict]" = weakref.WeakKeyDictionary()


def _interp_exchange(op: Op, wg: Warpgroup) -> Generator[Wait, None, list[list[torch.Tensor]]]:
    """Every warpgroup's values of op's operands, in slot order (CTA rank, then warpgroup), once every
    warpgroup of the cluster has given its own. Between CTAs it orders nothing else (the lowering waits on an
    mbarrier for the values alone): each warpgroup leaves with the clock it came with, not the cluster's join."""
    sync = wg.cluster.sync
    exchanges = _EXCHANGES.setdefault(wg.cluster, {})
    key = (id(op), sync.generation)
    box = exchanges.setdefault(key, {})
    box[(wg.cta.rank, wg.index)] = [torch.as_tensor(wg.get(x, op)).clone() for x in op.values]
    clock = dict(wg.clock)
    yield wg.rendezvous(op, sync)
    if op.ctas > 1:
        wg.clock = clock
    slots = [box[k] for k in sorted(k for k in box if k != "read")]
    box["read"] = box.get("read", 0) + 1
    if box["read"] == len(slots):  # the last reader of this execution's values
        del exchanges[key]
    return slots


@interpret.rule(ClusterReduce)
def _interp_cluster_reduce(op: ClusterReduce, wg: Warpgroup) -> Generator[Wait, None, None]:
    """Combined in slot order, one operation at a time, as the lowering does."""
    values = [slot[0] for slot in (yield from _interp_exchange(op, wg))]
    acc = values[0]
    for v in values[1:]:
        if op.kind == "sum":
            acc = acc + v
        else:
            acc = (torch.maximum if op.kind == "max" else torch.minimum)(acc, v)
    wg.set(op.result, acc.to(numerics.torch_dtype(op.result.dtype)))


@interpret.rule(ClusterGather)
def _interp_cluster_gather(op: ClusterGather, wg: Warpgroup) -> Generator[Wait, None, None]:
    slots = yield from _interp_exchange(op, wg)
    for i in range(len(op.values)):
        for s, values in enumerate(slots):
            wg.set(op.results[i * op.slots + s], values[i])


@interpret.rule(ClusterSync)
def _interp_cluster_sync(op: ClusterSync, wg: Warpgroup) -> Generator[Wait, None, None]:
    yield wg.rendezvous(op, wg.cluster.sync)

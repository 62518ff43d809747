"""Running the warpgroups of a cluster: each warpgroup is a Python generator over the kernel's IR that yields a
`Wait` where it may block; the scheduler interleaves them cooperatively, completes asynchronous operations
(TMA copies, wgmma groups, tcgen05 MMAs and commits) at points of its choosing between their issue and the
waits that need them, and reports a deadlock when every warpgroup is blocked and nothing is in flight.

The grid runs one cluster at a time (`run_grid`), in launch order (program order; under the random schedule an
order drawn from its seed; a cluster that cluster launch control cancelled never runs: ops/clc.py), except that a
cluster blocked on a semaphore (a wait on GMEM that only another CTA can satisfy) has the next cluster launched
beside it: CTAs that wait on later ones run as they would with the whole grid resident.

Schedules (`policy`): "late" (the default) completes async work only when no warpgroup can run, so that a
missing wait reads stale data and a premature write lands before the reader; "eager" completes each operation
as it is issued; "random" interleaves warpgroups and completions at random from a seed. The checker does not
depend on the schedule: its verdicts come from happens-before, not from what happened to run first.
"""
from __future__ import annotations

import collections
import dataclasses
import random
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator

import torch

from .. import ir
from ..errors import Check, InterpretError, Loc
from .checker import Clock
from .machine import CTA, Barrier, Cluster, Rendezvous

if TYPE_CHECKING:
    from .launch import Run

POLICIES = ("late", "eager", "random")


@dataclasses.dataclass
class Wait:
    """Where a warpgroup blocks: it goes on once `ready()`, first calling `acquire()` (which takes the clock the
    wait synchronises with). `describe()` says what it waits for, in a deadlock report."""

    loc: Loc | None
    ready: Callable[[], bool]
    describe: Callable[[], str]
    acquire: Callable[[], None] | None = None
    barrier: Barrier | None = None
    cross_cta: bool = False  # on GMEM that another CTA of the grid may change (a semaphore)


class Pending:
    """A register array an async MMA (wgmma) is still computing. The warpgroup may hand it on (to the next MMA
    of the chain, through a loop) but not read it until a wait has retired its group (`key` at `seq`)."""

    def __init__(self, key: tuple, seq: int, loc: Loc | None):
        self.key = key
        self.seq = seq
        self.loc = loc
        self.value: torch.Tensor | None = None


@dataclasses.dataclass
class AsyncOp:
    """An operation issued to an async unit. Operations of one `queue` complete in issue order; `complete` does
    the work and signals completion; `ctas` are those whose shared memory it reads or writes."""

    queue: tuple
    loc: Loc | None
    what: str
    complete: Callable[[], None]
    ctas: tuple[CTA, ...] = ()
    seq: int = 0  # issue order over all queues


class Engine:
    """The async operations in flight, and when they complete."""

    def __init__(self, policy: str, rng: random.Random):
        self.policy = policy
        self.rng = rng
        self.queues: dict[tuple, collections.deque[AsyncOp]] = {}
        self.issued = 0
        self.counts: collections.Counter[tuple] = collections.Counter()  # operations issued per queue
        self.done: collections.Counter[tuple] = collections.Counter()  # operations completed per queue

    def next_in(self, queue: tuple) -> int:
        """The ordinal (from 1) the next operation issued to `queue` will have: what a clock's component for
        that queue must reach for the operation to be known complete."""
        return self.counts[queue] + 1

    def issue(self, op: AsyncOp) -> None:
        self.issued += 1
        op.seq = self.issued
        self.counts[op.queue] += 1
        self.queues.setdefault(op.queue, collections.deque()).append(op)
        if self.policy == "eager":
            self.complete(op.queue)

    def in_flight(self, queue: tuple) -> int:
        return len(self.queues.get(queue, ()))

    def all(self) -> Iterator[AsyncOp]:
        return (op for q in self.queues.values() for op in q)

    def busy(self) -> bool:
        return any(self.queues.values())

    def complete(self, queue: tuple) -> None:
        q = self.queues[queue]
        op = q[0]
        op.complete()
        q.popleft()
        self.done[queue] += 1
        if not q:
            del self.queues[queue]

    def complete_one(self) -> None:
        """Complete the oldest operation at the head of a queue (a random one under the random schedule)."""
        heads = [q[0] for q in self.queues.values()]
        op = self.rng.choice(heads) if self.policy == "random" else min(heads, key=lambda o: o.seq)
        self.complete(op.queue)


class Warpgroup:
    """One warpgroup of one CTA running the kernel: its values, its clock and its generator over the IR."""

    def __init__(self, run: Run, cluster: Cluster, cta: CTA, index: int, engine: Engine):
        self.run = run
        self.engine = engine
        self.cluster = cluster
        self.cta = cta
        self.index = index
        self.env: dict[int, Any] = dict(run.params)
        self.agent = ("wg", cta.rank, index)
        self.gmem_agent = ("gmem", cta.program_id, index)  # its GMEM stores (checker.GmemWrites), grid-wide
        self.clock: Clock = {}
        self.events = 0  # this warpgroup's SMEM stores and TMEM loads so far (its own clock component)
        self.gmem_stores = 0

    def event(self) -> int:
        """Count one of this warpgroup's own accesses that others must be ordered after; returns its count."""
        self.events += 1
        self.clock[self.agent] = self.events
        return self.events

    def gmem_store(self, view: torch.Tensor, loc: Loc | None) -> None:
        """Record a plain store of this warpgroup to the GMEM elements of `view`."""
        self.gmem_stores += 1
        self.clock[self.gmem_agent] = self.gmem_stores
        self.run.gmem.store(view, self.gmem_agent, self.gmem_stores, loc, self.cta.program_id, self.index)

    # -- values
    def get(self, v: ir.Value, op: ir.Op) -> Any:
        """The value of `v` as `op` reads it: an MMA result still in flight is an error."""
        x = self.env[v.id]
        if isinstance(x, Pending):
            if self.clock.get(x.key, 0) >= x.seq:
                return x.value
            raise InterpretError("this reads the accumulator of an asynchronous wgmma before a wgmma_wait has "
                                 "retired it: the tensor cores may still be writing it", op.loc,
                                 Check.ACCUMULATOR_READ, (x.loc,) if x.loc else ())
        return x

    def raw(self, v: ir.Value) -> Any:
        """The value of `v` as it is, in flight or not (for ops that only pass it on)."""
        return self.env[v.id]

    def set(self, v: ir.Value, x: Any) -> None:
        self.env[v.id] = x

    def scalar(self, v: ir.Value, op: ir.Op) -> int | float | bool:
        return self.get(v, op).item()

    # -- running IR
    def program(self) -> Generator[Wait, None, None]:
        yield from self.ops(self.run.kernel.body.ops)

    def ops(self, ops: list[ir.Op]) -> Generator[Wait, None, None]:
        from . import RULES
        for op in ops:
            fn = RULES.get(type(op))
            if fn is None:
                raise op.error(f"internal error: no interpreter rule for `{op.name}`")
            step = fn(op, self)
            if step is not None:
                yield from step

    def region(self, block: ir.Block, args: list[Any]) -> Generator[Wait, None, list[Any]]:
        """Run a region (a loop body or an if branch) on `args`; returns what its Yield yields."""
        for a, x in zip(block.args, args):
            self.env[a.id] = x
        yield from self.ops(block.ops[:-1])
        return [self.raw(v) for v in block.ops[-1].operands]

    def wait_async(self, op: ir.Op, queue: tuple, pending: int, what: str) -> Wait:
        """Block until at most `pending` operations of `queue` are in flight; then this warpgroup knows the
        others are done (its clock's `queue` component advances to the count retired)."""
        def acquire():
            self.clock[queue] = max(self.clock.get(queue, 0), self.engine.done[queue])
        return Wait(op.loc, lambda: self.engine.in_flight(queue) <= pending,
                    lambda: f"{what}({pending}) with {self.engine.in_flight(queue)} in flight", acquire)

    def rendezvous(self, op: ir.Op, sync: Rendezvous) -> Wait:
        generation = sync.arrive(self)
        return Wait(op.loc, lambda: sync.generation > generation,
                    lambda: f"{sync.what}: {len(sync.arrived)} of {sync.members} warpgroups have arrived")

    def error(self, op: ir.Op, check: Check, message: str, related: tuple = ()) -> InterpretError:
        return InterpretError(message, op.loc, check, tuple(r for r in related if r))

    def where(self) -> str:
        return f"CTA {self.cta.program_id} warpgroup {self.index}"


class ClusterRun:
    """One cluster of the grid being run: its warpgroups, where each is blocked, and its async engine."""

    def __init__(self, run: Run, cluster: Cluster):
        self.cluster = cluster
        self.engine = Engine(run.policy, run.rng)
        self.wgs = [Warpgroup(run, cluster, cta, i, self.engine) for cta in cluster.ctas
                    for i in range(cta.num_warpgroups)]
        self.gens = [wg.program() for wg in self.wgs]
        self.waits: list[Wait | None] = [None] * len(self.wgs)
        self.live = set(range(len(self.wgs)))

    def step(self, run: Run) -> bool:
        """Run every warpgroup that can go on until it blocks or ends; whether any could."""
        order = sorted(self.live)
        if self.engine.policy == "random":
            run.rng.shuffle(order)
        progressed = False
        for i in order:
            wait = self.waits[i]
            if wait is not None:
                if not wait.ready():
                    continue
                if wait.acquire:
                    wait.acquire()
                self.waits[i] = None
            progressed = True
            try:
                while True:
                    wait = next(self.gens[i])
                    if not wait.ready():
                        self.waits[i] = wait
                        break
                    if wait.acquire:
                        wait.acquire()
            except StopIteration:
                self.live.discard(i)
                _exit(self.engine, self.wgs[i])
            if self.engine.policy == "random" and self.engine.busy() and run.rng.random() < 0.5:
                self.engine.complete_one()
        return progressed

    def finish(self) -> None:
        while self.engine.busy():
            self.engine.complete_one()
        for cta in self.cluster.ctas:
            _check_barriers_at_exit(cta)


def run_grid(run: Run, clusters: Iterator[Cluster]) -> None:
    """Run the grid's clusters one at a time, each to its end, its warpgroups interleaved. `clusters` yields them
    in launch order, each launched as it is taken (Run.clusters: one that cluster launch control cancelled before
    then never comes). When every warpgroup of the clusters running is blocked, nothing is in flight and one of
    them waits on a semaphore (which only another CTA can signal), the next cluster starts beside them, as the
    GPU runs CTAs side by side; a kernel whose CTAs wait on each other thus runs as long as the whole grid could
    be resident at once."""
    running: list[ClusterRun] = []
    for cluster in clusters:
        running.append(ClusterRun(run, cluster))
        while running:
            progressed = False
            for active in running:
                progressed = active.step(run) or progressed
            for active in [a for a in running if not a.live]:
                active.finish()
                running.remove(active)
            if progressed:
                continue
            busy = next((a for a in running if a.engine.busy()), None)
            if busy is not None:
                busy.engine.complete_one()
            elif running and any(a.waits[i].cross_cta for a in running for i in a.live):
                break  # only another CTA can go on: start the next cluster
            elif running:
                raise _deadlock(running)
    if running:
        raise _deadlock(running)


def _exit(engine: Engine, wg: Warpgroup) -> None:
    """A warpgroup ran off the end: it no longer takes part in CTA or cluster barriers. When a CTA's last
    warpgroup exits its shared memory is gone: nothing in flight may still use it."""
    cta = wg.cta
    cta.sync.leave()
    wg.cluster.sync.leave()
    cta.exited += 1
    if cta.exited < cta.num_warpgroups:
        return
    for op in engine.all():
        if cta in op.ctas:
            raise InterpretError(f"CTA {cta.program_id} exits while the {op.what} still uses its shared memory: "
                                 f"wait for it before the kernel ends", op.loc, Check.ASYNC_AT_EXIT)


def _check_barriers_at_exit(cta: CTA) -> None:
    for bars in cta.barriers.values():
        for bar in bars:
            if bar.pending != bar.count or bar.tx:
                got = bar.count - bar.pending
                raise InterpretError(f"the kernel ends with {bar.describe()} part-way through phase "
                                     f"{bar.completed}: {got} of {bar.count} arrivals, {bar.tx} TMA bytes "
                                     f"outstanding; each phase needs exactly {bar.count} arrivals", bar.loc,
                                     Check.BARRIER_COUNT, tuple(a for a in bar.arrivals if a))


def _deadlock(running: list[ClusterRun]) -> InterpretError:
    """Every warpgroup is blocked. The error is at a wait that is not on a barrier if there is one (a
    rendezvous or a register request: the likelier cause), and names the others. When all wait on barriers
    and one of those has a phase part-way through, its arrivals do not match its count."""
    pairs = [(wg, w) for a in running for wg, w in zip(a.wgs, a.waits) if w is not None]
    blocked = sorted(pairs, key=lambda b: b[1].barrier is not None)
    lines = "\n".join(f"  {wg.where()} waits at line {w.loc.line if w.loc else '?'}: {w.describe()}"
                      for wg, w in blocked)
    first = blocked[0][1]
    related = tuple(w.loc for _, w in blocked[1:] if w.loc)
    partial = [(w, w.barrier) for _, w in blocked if w.barrier is not None
               and (w.barrier.pending != w.barrier.count or w.barrier.tx)]
    if first.barrier is not None and partial:
        w, bar = partial[0]
        got = bar.count - bar.pending
        return InterpretError(f"deadlock: {bar.describe()} has {got} of its {bar.count} arrivals "
                              f"({bar.tx} TMA bytes outstanding) in phase {bar.completed} and nothing left "
                              f"to arrive: the arrivals do not match the barrier's count. Blocked:\n{lines}",
                              w.loc, Check.BARRIER_COUNT, tuple(a for a in bar.arrivals if a) + related)
    return InterpretError(f"deadlock: every warpgroup is blocked and nothing is in flight:\n{lines}", first.loc,
                          Check.DEADLOCK, related)

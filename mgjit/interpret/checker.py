"""The race checker: happens-before through vector clocks, and the accesses to SMEM and TMEM that must be
ordered by it.

Every warpgroup carries a clock: a dict from a component to a count. Components name what a warpgroup can
know has happened: ("wg", cta, wg) counts that warpgroup's SMEM stores, ("bar", cta, alloc, slot) the phases
a barrier completed, and ("wgmma" | "tma_store" | "mma", cta, wg) the async operations of one queue known to
be complete. Barriers, CTA and cluster barriers, and waits on async queues pass clocks along (an arrival
releases the arriver's clock into the barrier's phase, a wait acquires it), so an access is ordered after
another exactly when the reader's clock has reached the count the other recorded.

`Records` keeps, per memory, the latest accesses to each byte (SMEM) or column (TMEM) range that later
accesses must be ordered against. The checks raise InterpretError naming both lines. Timing plays no part:
a race is reported whether or not the scheduler happened to order the two accesses safely this time.

GMEM (`GmemWrites`): a warpgroup's plain stores count in its own component ("gmem", program id, warpgroup), and
each element remembers its last store. A load must know that store: its own, or one that a barrier of the CTA or
cluster, or a release atomic that its CTA's acquire read from (an atomic's cell keeps the GMEM part of the clocks
released into it), ordered before. A relaxed atomic orders nothing. A load is checked against the stores the
interpreter ran before it: an unordered store that happens to run after the load goes unreported in that run
(the random schedule's launch orders cover both). TMA stores are not tracked.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import torch

from ..errors import Check, InterpretError, Loc

Clock = dict


def join(into: Clock, other: Clock) -> None:
    """Make `into` know everything `other` knows."""
    for key, count in other.items():
        if into.get(key, 0) < count:
            into[key] = count


@dataclasses.dataclass
class Access:
    """One access to a range of a memory: `kind` is "tma" (a TMA copy writes it), "store" (ordinary stores),
    "read" (an async op reads it) or "mma" (a tcgen05 MMA writes it). A later access is ordered after this one
    once its clock has `key` at `count` or more; count None: a TMA copy still in flight (never ordered)."""

    start: int
    end: int
    kind: str
    key: tuple
    count: int | None
    loc: Loc | None
    what: str
    fenced: bool = True


class Records:
    def __init__(self):
        self.entries: list[Access] = []

    def overlapping(self, start: int, end: int) -> Iterator[Access]:
        return (a for a in self.entries if a.start < end and start < a.end)

    def add(self, access: Access) -> None:
        """Record `access`, dropping what it supersedes: the accesses of the range it covers that a write
        (which has been checked to be ordered after them) makes irrelevant."""
        if access.kind == "read":  # a later read of one queue supersedes its earlier ones
            self.entries = [a for a in self.entries if not (a.kind == "read" and a.key == access.key
                                                            and (a.start, a.end) == (access.start, access.end))]
        else:
            self.entries = [a for a in self.entries if not (access.start <= a.start and a.end <= access.end)]
        self.entries.append(access)


def _ordered(clock: Clock, access: Access) -> bool:
    return access.count is not None and clock.get(access.key, 0) >= access.count


def check_read(records: Records, start: int, end: int, clock: Clock, loc: Loc | None, reader: str,
               space: str = "SMEM", async_proxy: bool = True) -> None:
    """`reader` reads [start, end) for a warpgroup whose clock is `clock`: an async unit (wgmma, tcgen05 MMA,
    TMA store), or with async_proxy=False the warpgroup's own threads (which need no proxy fence)."""
    for a in records.overlapping(start, end):
        if a.kind == "tma" and not _ordered(clock, a):
            state = "is still in flight" if a.count is None else "has not been waited for"
            raise InterpretError(f"{reader} reads {space} bytes {a.start}..{a.end} that the {a.what} writes, and "
                                 f"that copy {state}: wait on its barrier (in this warpgroup, or in one that "
                                 f"then arrives on a barrier this one waits on) before reading the tile", loc,
                                 Check.TMA_INCOMPLETE, (a.loc,) if a.loc else ())
        if a.kind == "store" and not _ordered(clock, a):
            raise InterpretError(f"{reader} reads {space} bytes that the {a.what} writes from another warpgroup "
                                 f"with nothing (a barrier) ordering the store before the read", loc,
                                 Check.SMEM_UNORDERED, (a.loc,) if a.loc else ())
        if async_proxy and a.kind == "store" and not a.fenced:
            raise InterpretError(f"{reader} reads {space} through the async proxy, but the {a.what} that wrote it "
                                 f"was not followed by mgjit.fence_async_shared(): the tensor cores or the TMA "
                                 f"engine may read the old bytes", loc, Check.SMEM_UNORDERED,
                                 (a.loc,) if a.loc else ())


def check_write(records: Records, start: int, end: int, clock: Clock, loc: Loc | None, writer: str,
                space: str = "SMEM", queue: tuple | None = None) -> None:
    """`writer` writes [start, end): every async op that reads (or writes) it must be known to be done, but for
    those of the writer's own async `queue`, which run in order before it."""
    for a in records.overlapping(start, end):
        if a.kind in ("read", "mma") and a.key != queue and not _ordered(clock, a):
            verb = "reads" if a.kind == "read" else "writes"
            raise InterpretError(f"{writer} writes {space} {a.start}..{a.end} that the {a.what} still {verb} "
                                 f"(it is in flight: wait for it first)", loc, Check.IN_FLIGHT_WRITE,
                                 (a.loc,) if a.loc else ())


def check_result_read(records: Records, start: int, end: int, clock: Clock, loc: Loc | None, reader: str) -> None:
    """A warpgroup reads TMEM columns [start, end) that an MMA may write: the MMA must be known complete."""
    for a in records.overlapping(start, end):
        if a.kind == "mma" and not _ordered(clock, a):
            raise InterpretError(f"{reader} reads the accumulator that the {a.what} writes before that MMA is "
                                 f"known to be complete: wait on the barrier of a tcgen05_commit issued after it",
                                 loc, Check.ACCUMULATOR_READ, (a.loc,) if a.loc else ())


def check_freed(records: Records, clock: Clock, loc: Loc | None, space: str) -> None:
    """`space` is freed: no async op may still access it (or it would after the deallocation)."""
    for a in records.entries:
        if a.kind in ("read", "mma") and not _ordered(clock, a):
            raise InterpretError(f"{space} is deallocated here while the {a.what} may still access it: wait for "
                                 f"it (on the barrier of a commit issued after it) first", loc, Check.TMEM_LIFETIME,
                                 (a.loc,) if a.loc else ())


def fence(records: Records, key: tuple) -> None:
    """fence.proxy.async by the warpgroup whose stores carry `key`: its earlier stores become visible to the
    async proxy."""
    for a in records.entries:
        if a.kind == "store" and a.key == key:
            a.fenced = True


class GmemWrites:
    """A launch's plain stores to GMEM and the clocks its release atomics left in their cells (the module's doc).
    Tensors are tracked by storage and element size: views of one storage in another dtype are not compared."""

    def __init__(self):
        self.shadows: dict[tuple, torch.Tensor] = {}  # (storage, element size) -> the last store to each element
        self.events: list[tuple] = [()]  # a store's number -> (its clock component, count, line, CTA, warpgroup)
        self.cells: dict[tuple, Clock] = {}  # (storage, element size, element) -> GMEM clock released there

    @staticmethod
    def _elements(view: torch.Tensor) -> tuple[tuple, torch.Tensor]:
        """(the storage's key, the storage indices of the view's elements)."""
        index = torch.tensor(view.storage_offset(), dtype=torch.int64)
        for size, stride in zip(view.shape, view.stride()):
            index = index.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
        return (view.untyped_storage().data_ptr(), view.element_size()), index.reshape(-1)

    def store(self, view: torch.Tensor, key: tuple, count: int, loc: Loc | None, cta: tuple, wg: int) -> None:
        storage, index = self._elements(view)
        shadow = self.shadows.get(storage)
        if shadow is None:
            shadow = self.shadows[storage] = torch.zeros(view.untyped_storage().nbytes() // storage[1],
                                                         dtype=torch.int32)
        self.events.append((key, count, loc, cta, wg))
        shadow[index] = len(self.events) - 1

    def check_load(self, view: torch.Tensor, clock: Clock, loc: Loc | None, reader: str, cta: tuple) -> None:
        """`reader` (a warpgroup of CTA `cta` whose clock is `clock`, or the TMA copy it issues) reads the view's
        elements."""
        self._check_read(*self._elements(view), clock, loc, reader, cta)

    def check_gather(self, ref: torch.Tensor, picked: tuple[torch.Tensor, ...], clock: Clock, loc: Loc | None,
                     reader: str, cta: tuple) -> None:
        """As check_load, for the elements of `ref` at the index tensors `picked` (one an axis)."""
        index = torch.tensor(ref.storage_offset(), dtype=torch.int64)
        for i, stride in zip(picked, ref.stride()):
            index = index + i * stride
        self._check_read((ref.untyped_storage().data_ptr(), ref.element_size()), index.reshape(-1), clock, loc,
                         reader, cta)

    def _check_read(self, storage: tuple, index: torch.Tensor, clock: Clock, loc: Loc | None, reader: str,
                    cta: tuple) -> None:
        shadow = self.shadows.get(storage)
        if shadow is None:
            return
        for event in shadow[index].unique().tolist():
            if not event:
                continue
            key, count, store_loc, writer, wg = self.events[event]
            if clock.get(key, 0) < count:
                remedy = ("a barrier of the CTA (mgjit.cta_sync) between them does" if writer == cta else
                          "the writer's atomic with sem='release' (or 'acq_rel') and an atomic with sem='acquire' "
                          "(or 'acq_rel') or a semaphore wait of this CTA on the same cell do (a relaxed atomic "
                          "does not), or a cluster_sync where both CTAs are of one cluster")
                raise InterpretError(f"{reader} reads GMEM that CTA {writer} (warpgroup {wg}) stores, and nothing "
                                     f"orders that store before this read: {remedy}", loc, Check.GMEM_UNORDERED,
                                     (store_loc,) if store_loc else ())

    def _cell(self, view: torch.Tensor) -> list[tuple]:
        storage, index = self._elements(view)
        return [(*storage, i) for i in index.tolist()]

    def release(self, view: torch.Tensor, clock: Clock) -> None:
        """An atomic with release ordering on the view's cells: they keep the GMEM part of `clock`."""
        gmem = {k: v for k, v in clock.items() if k[0] == "gmem"}
        for cell in self._cell(view):
            join(self.cells.setdefault(cell, {}), gmem)

    def acquire(self, view: torch.Tensor, clock: Clock) -> None:
        """An atomic or semaphore wait with acquire ordering on the view's cells: `clock` learns what was released
        into them."""
        for cell in self._cell(view):
            join(clock, self.cells.get(cell, {}))

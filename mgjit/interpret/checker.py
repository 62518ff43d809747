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
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

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

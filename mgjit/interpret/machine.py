"""The memory and synchronisation state of the CTAs of one cluster: SMEM as bytes, mbarriers, named barriers,
tensor memory, the register pool that set_max_registers draws from, and the CTA-wide and cluster-wide barriers.

SMEM starts filled with 0xFF bytes (NaN in every float type), TMEM cells likewise, so that a read of memory
nothing wrote shows in the numbers as well as in the checker.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import DType
from ..errors import Check, InterpretError, Loc
from ..layouts import THREADS_PER_WARPGROUP
from ..targets import REGISTERS_PER_SM
from ..tmem_layouts import TMEM_COLUMNS, TMEM_LANES
from . import numerics
from .checker import Clock, Records, join

if TYPE_CHECKING:
    from .scheduler import Warpgroup

POISON = 0xFF
# setmaxnreg moves registers between the warpgroups of a CTA within what the CTA was launched with; a kernel
# that uses it runs with its whole cap at entry (setmaxnreg needs one), which for T threads and n CTAs asked to fit
# on an SM (mgjit.min_ctas_per_sm) is the SM's register file / (n T) per thread in steps of 8, at most 256
# (setmaxnreg's range). Modelled as that cap.
SETMAXNREG_MAX = 256


class Barrier:
    """One mbarrier: a phase completes once it has seen `count` arrivals and its transaction count is back to
    zero; waiters acquire the clock the phase's arrivals released."""

    def __init__(self, count: int, loc: Loc | None, slot: int, key: tuple):
        self.count = count
        self.loc = loc
        self.slot = slot
        self.key = key
        self.pending = count
        self.tx = 0
        self.completed = 0
        self.clock: Clock = {}
        self.released: Clock = {}
        self.arrivals: list[Loc | None] = []

    def describe(self) -> str:
        where = f" allocated at line {self.loc.line}" if self.loc else ""
        return f"barrier slot {self.slot}{where} (arrivals={self.count})"

    def arrive(self, clock: Clock, loc: Loc | None, tx: int = 0) -> None:
        """One arrival (with `tx` expected transaction bytes, for a TMA copy's arrive.expect_tx)."""
        if self.pending == 0:
            raise InterpretError(
                f"an arrival on {self.describe()} whose phase {self.completed} already has all {self.count} "
                f"arrivals and waits only for TMA bytes: the barrier counts fewer arrivals than arrive on it",
                loc, Check.BARRIER_COUNT, tuple(a for a in self.arrivals if a))
        self.tx += tx
        self.pending -= 1
        self.arrivals.append(loc)
        join(self.clock, clock)
        self._maybe_complete(loc)

    def complete_tx(self, nbytes: int, clock: Clock, loc: Loc | None) -> None:
        self.tx -= nbytes
        join(self.clock, clock)
        self._maybe_complete(loc)

    def _maybe_complete(self, loc: Loc | None) -> None:
        if self.pending:
            return
        if self.tx < 0:
            raise InterpretError(f"{self.describe()} received {-self.tx} more TMA bytes than its arrivals expect "
                                 f"in phase {self.completed}", loc, Check.BARRIER_COUNT,
                                 tuple(a for a in self.arrivals if a))
        if self.tx:
            return
        self.completed += 1
        self.clock[self.key] = self.completed
        self.released, self.clock = self.clock, {}
        self.pending = self.count
        self.arrivals = []

    def passed(self, parity: int) -> bool:
        """mbarrier.try_wait.parity: the phase of this parity has completed (the current one has the other)."""
        return self.completed % 2 != parity


@dataclasses.dataclass(frozen=True)
class BarrierRef:
    """A reference to barriers: the BarrierAlloc op, and the slot once indexed. Each CTA has its own barriers of
    an allocation (`get` finds this CTA's or a peer's)."""

    alloc: Any
    slot: int | None = None

    def get(self, cta: "CTA") -> Barrier:
        return cta.barrier_array(self.alloc)[self.slot]


class NamedBarrier:
    """One named barrier between warpgroups (bar.sync / bar.arrive with an id and a thread count): a phase
    completes once `count` warpgroups' worth of threads have arrived, whether they wait there (sync) or not
    (arrive), and whoever they are (the hardware counts threads: a warpgroup may arrive, then sync, to complete
    a phase of two); those that wait go on with the clocks every arrival of the phase released."""

    def __init__(self, count: int, loc: Loc | None, slot: int):
        self.count = count
        self.loc = loc
        self.slot = slot
        self.phase = 0
        self.arrived: list[int] = []  # the warpgroup of each arrival of this phase
        self.clock: Clock = {}
        self.released: dict[int, Clock] = {}  # phase -> what its arrivals released

    def describe(self) -> str:
        where = f" allocated at line {self.loc.line}" if self.loc else ""
        return f"named barrier slot {self.slot}{where} (warpgroups={self.count})"

    def arrive(self, index: int, clock: Clock) -> int:
        """Warpgroup `index` arrives with its clock; returns the phase it arrived in."""
        phase = self.phase
        self.arrived.append(index)
        join(self.clock, clock)
        if len(self.arrived) == self.count:
            self.released[phase] = self.clock
            self.clock, self.arrived = {}, []
            self.phase += 1
        return phase


class Rendezvous:
    """A barrier for whole warpgroups (bar.sync 0 of a CTA, barrier.cluster of a cluster): it releases everyone
    once every warpgroup that has not exited has arrived, and leaves each with the join of their clocks."""

    def __init__(self, members: int, what: str):
        self.members = members
        self.what = what
        self.arrived: list[Warpgroup] = []
        self.generation = 0

    def arrive(self, wg: Warpgroup) -> int:
        self.arrived.append(wg)
        generation = self.generation
        self._maybe_release()
        return generation

    def leave(self) -> None:
        self.members -= 1
        self._maybe_release()

    def _maybe_release(self) -> None:
        if not self.arrived or len(self.arrived) < self.members:
            return
        clock: Clock = {}
        for wg in self.arrived:
            join(clock, wg.clock)
        for wg in self.arrived:
            wg.clock = dict(clock)
        self.arrived = []
        self.generation += 1


class Tmem:
    """A CTA's tensor memory: 128 lanes x 512 columns of 32-bit cells once allocated, the allocation's state,
    and the accesses to it that later ones must be ordered after."""

    def __init__(self):
        self.cells: torch.Tensor | None = None
        self.columns = 0
        self.state = "unallocated"  # "allocated", "deallocated"
        self.dealloc_loc: Loc | None = None
        self.records = Records()

    def allocate(self, columns: int) -> None:
        self.cells = torch.full((TMEM_LANES, TMEM_COLUMNS), -1, dtype=torch.int32)
        self.columns = columns
        self.state = "allocated"

    def free(self, loc: Loc | None) -> None:
        self.state = "deallocated"
        self.dealloc_loc = loc

    def check(self, loc: Loc | None, what: str, lanes: torch.Tensor, columns: torch.Tensor,
              first: int, last: int) -> None:
        """`what` touches cells (lanes, columns) of the reference whose columns are [first, last)."""
        if self.state != "allocated":
            when = "before its allocation" if self.state == "unallocated" else "after its deallocation"
            raise InterpretError(f"{what} accesses tensor memory {when}", loc, Check.TMEM_LIFETIME,
                                 (self.dealloc_loc,) if self.dealloc_loc else ())
        lo, hi = max(first, 0), min(last, self.columns)
        if lanes.numel() and (int(lanes.min()) < 0 or int(lanes.max()) >= TMEM_LANES or int(columns.min()) < lo
                              or int(columns.max()) >= hi):
            raise InterpretError(f"{what} touches TMEM lanes {int(lanes.min())}..{int(lanes.max())}, columns "
                                 f"{int(columns.min())}..{int(columns.max())}: outside its reference (columns "
                                 f"{first}..{last - 1}) or the {self.columns} columns allocated", loc,
                                 Check.OUT_OF_BOUNDS)


class RegisterPool:
    """setmaxnreg: a CTA starts with `per_thread` registers for each of its threads; .dec gives a warpgroup's
    surplus back to the pool and .inc waits until the pool can pay for the increase."""

    def __init__(self, warpgroups: int, ctas_per_sm: int = 1):
        threads = warpgroups * THREADS_PER_WARPGROUP
        self.per_thread = min(SETMAXNREG_MAX, REGISTERS_PER_SM // (threads * ctas_per_sm) // 8 * 8)
        self.counts = [self.per_thread] * warpgroups
        self.free = 0

    def available(self, wg: int, count: int) -> bool:
        return (count - self.counts[wg]) * THREADS_PER_WARPGROUP <= self.free

    def set(self, wg: int, count: int) -> None:
        self.free -= (count - self.counts[wg]) * THREADS_PER_WARPGROUP
        self.counts[wg] = count


class CTA:
    def __init__(self, program_id: tuple[int, int, int], rank: int, num_warpgroups: int, smem_bytes: int,
                 ctas_per_sm: int = 1):
        self.program_id = program_id
        self.rank = rank
        self.smem = torch.full((smem_bytes,), POISON, dtype=torch.uint8)
        self.smem_records = Records()
        self.scopes: dict[Any, dict[int, tuple]] = {}  # scoped SMEM buffers' users (ops/smem_scopes.py)
        self.barriers: dict[int, list[Barrier]] = {}  # id(BarrierAlloc) -> its barriers
        self.named_barriers: dict[int, list[NamedBarrier]] = {}  # id(NamedBarrierAlloc) -> its barriers
        self.tmem = Tmem()
        self.registers = RegisterPool(num_warpgroups, ctas_per_sm)
        self.sync = Rendezvous(num_warpgroups, "bar.sync 0 (every warpgroup of the CTA)")
        self.num_warpgroups = num_warpgroups
        self.exited = 0

    def read_smem(self, addresses: torch.Tensor, dtype: DType) -> torch.Tensor:
        """The elements of `dtype` at these byte addresses (any shape of them)."""
        view = self.smem.view(numerics.storage_dtype(dtype))
        return numerics.from_bits(view[addresses // dtype.itemsize], dtype)

    def write_smem(self, addresses: torch.Tensor, values: torch.Tensor, dtype: DType) -> None:
        view = self.smem.view(numerics.storage_dtype(dtype))
        view[addresses // dtype.itemsize] = numerics.to_bits(values, dtype).expand(addresses.shape)

    def barrier_array(self, op: Any) -> list[Barrier]:
        """The barriers of a BarrierAlloc, created (initialised) the first time a warpgroup reaches it."""
        bars = self.barriers.get(id(op))
        if bars is None:
            bars = [Barrier(op.arrivals, op.loc, i, ("bar", self.rank, id(op), i)) for i in range(op.count)]
            self.barriers[id(op)] = bars
        return bars

    def named_barrier_array(self, op: Any) -> list[NamedBarrier]:
        """The named barriers of a NamedBarrierAlloc (they need no initialisation: made on first use)."""
        bars = self.named_barriers.get(id(op))
        if bars is None:
            bars = [NamedBarrier(op.warpgroups, op.loc, i) for i in range(op.count)]
            self.named_barriers[id(op)] = bars
        return bars


class Cluster:
    def __init__(self, ctas: list[CTA], shape: tuple[int, int, int]):
        self.ctas = ctas
        self.shape = shape
        self.sync = Rendezvous(sum(c.num_warpgroups for c in ctas), "barrier.cluster (every warpgroup of the cluster)")

"""The cluster side of tests/ptx_sim.py: mbarriers, and the turns a cluster's CTAs take."""
from __future__ import annotations

from ptx_arith import SimError


class MBarrier:
    """An mbarrier: a phase completes when all `count` arrivals came and the bytes expected (expect_tx) arrived
    (complete_tx); bytes may arrive before they are expected, while the phase still waits for arrivals."""

    def __init__(self, count: int):
        self.count, self.pending, self.tx, self.completed = count, count, 0, 0

    def arrive(self, expect_tx: int = 0) -> None:
        self.tx += expect_tx
        self.pending -= 1
        if self.pending < 0:
            raise SimError("more arrivals at an mbarrier than its count")
        self._complete()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._complete()

    def _complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count
        elif self.pending == 0 and self.tx < 0:
            raise SimError(f"{-self.tx} more bytes arrived at an mbarrier than its phase expected")


def run_cluster(ctas: list) -> None:
    """Run a cluster's CTAs in turns: each until it waits. Those at a cluster barrier go on once all are there;
    those spinning on an mbarrier are tried again each turn, until a turn in which every CTA spins and none
    completed an mbarrier phase (a deadlock)."""
    running = {cta.rank: cta.run() for cta in ctas}
    waits: dict[int, str | None] = {rank: None for rank in running}
    while running:
        before = [sum(b.completed for b in cta.mbarriers.values()) for cta in ctas]
        for rank in list(running):
            if waits[rank] == "cluster":
                continue
            try:
                waits[rank] = next(running[rank])
            except StopIteration:
                del running[rank], waits[rank]
        at_barrier = [r for r in running if waits[r] == "cluster"]
        if at_barrier and len(at_barrier) == len(running):
            if len(running) != len(ctas):
                raise SimError("a CTA exited while the others of its cluster wait at a barrier")
            waits = {r: None for r in running}
        elif running and not at_barrier and before == [sum(b.completed for b in c.mbarriers.values()) for c in ctas]:
            raise SimError("every CTA of the cluster waits on an mbarrier phase that cannot complete")

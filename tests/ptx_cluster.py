"""The synchronisation side of tests/ptx_sim.py: named barriers, mbarriers, the instructions that reach another
CTA's shared memory (mapa, st.async), and the turns a cluster's CTAs take."""
from __future__ import annotations

import numpy as np
from ptx_arith import SimError, as_uint
from ptx_memory import unordered


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
    those spinning on an mbarrier are tried again each turn, until a turn in which every CTA is stuck (ran nothing)
    or at the barrier and none completed an mbarrier phase (a deadlock)."""
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
        elif running and all(waits[r] in ("stuck", "cluster") for r in running) and \
                before == [sum(b.completed for b in c.mbarriers.values()) for c in ctas]:
            raise SimError("every CTA of the cluster waits on an mbarrier phase that cannot complete")


class ClusterOps:
    """The CTA's (tests/ptx_sim.py) named barrier, mbarrier, st.async and mapa instructions: its registers, memory
    and cluster are the CTA's own."""

    def named_barrier(self, opcode: str, ops, run, active) -> str | None:
        """bar.sync / bar.arrive / barrier.sync / barrier.arrive id[, count]: `count` threads (default: every
        thread of the CTA) arrive at barrier id, those that sync wait there (`held`) until the count is reached,
        which lets every waiter go (`released`, wherever it waits: warpgroups hand a barrier to each other from
        different instructions, one arriving, the other syncing)."""
        self.held = np.zeros(self.threads, dtype=bool)
        self.released = np.zeros(self.threads, dtype=bool)
        if opcode.startswith("bar.warp"):  # bar.warp.sync: its lanes met before it ran (CTA._joins_later)
            return None
        sync = ".sync" in opcode
        ids = self.per_thread(ops[0])
        count = int(self.value(ops[1])) if len(ops) > 1 else int(active.sum())
        for i in np.unique(ids[run]):
            lanes = run & (ids == i)
            arrived, waiters, together = self.named.setdefault(int(i), [0, np.zeros_like(lanes), np.zeros_like(lanes)])
            arrived += int(lanes.sum())
            if sync:
                waiters = waiters | lanes
            together = together | lanes
            if arrived > count:
                raise SimError(f"{opcode} {i}: {arrived} threads arrived, more than its count {count}")
            if arrived == count:
                self.released |= waiters
                if self.races:
                    self.races.barrier(together)
                del self.named[int(i)]
            else:
                self.named[int(i)] = [arrived, waiters, together]
                if sync:
                    self.held |= lanes
        return "hold" if self.held.any() else None

    def mbarrier(self, parts, ops, run):
        """mbarrier.init / arrive[.expect_tx] / try_wait.parity; "spin" where a wait fails for a running thread
        (`spinning`: those threads)."""
        parts = unordered(parts)
        idx = np.nonzero(run)[0]
        if parts[1] == "init":
            for off in np.unique(self.address(ops[0])[idx]):
                self.mbarriers[int(off)] = MBarrier(int(self.value(ops[1])))
            return None
        if parts[1] == "arrive" and parts[2] == "expect_tx":
            addr = self.address(ops[1])
            for lane in idx:
                self._barrier(*self.peer(int(addr[lane]))).arrive(int(self.value(ops[2])))
            return None
        if parts[1] == "arrive" and parts[2] in ("shared::cta", "shared::cluster", "b64") and len(ops) == 2:
            addr = self.address(ops[1])  # a plain arrival (a consumer giving a slot back), here or at a peer
            for lane in idx:
                self._barrier(*self.peer(int(addr[lane]))).arrive()
            return None
        if parts[1] == "try_wait" and parts[2] == "parity":
            addr = self.address(ops[1])
            for off in np.unique(addr[idx]):  # the TMA loads completing this mbarrier land now, at the latest
                self.land_loads(int(off))
            parity = self.per_thread(ops[2])
            done = np.zeros(self.threads, dtype=bool)
            for lane in idx:
                done[lane] = self._barrier(self, int(addr[lane])).completed % 2 != int(parity[lane]) % 2
            self.write(ops[0], done, run)
            self.spinning = run & ~done
            return "spin" if not done[idx].all() else None
        raise SimError(f"the simulator does not know {'.'.join(parts)}")

    def _barrier(self, cta: "ClusterOps", offset: int) -> MBarrier:
        if offset not in cta.mbarriers:
            raise SimError(f"no mbarrier was initialised at shared offset {offset} of CTA rank {cta.rank}")
        return cta.mbarriers[offset]

    def st_async(self, ops, run) -> None:
        """st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [addr], value, [bar]: the store, its bytes
        counted on the receiving CTA's mbarrier."""
        addr, bar = self.address(ops[0]), self.address(ops[2])
        data = np.zeros((self.threads, 4), dtype=np.uint8)
        val = self.per_thread(ops[1], 32).astype(np.uint64)
        for b in range(4):
            data[:, b] = ((val >> np.uint64(8 * b)) & np.uint64(255)).astype(np.uint8)
        for lane in np.nonzero(run)[0]:
            cta, _ = self.peer(int(addr[lane]))
            holder, offset = self.peer(int(bar[lane]))
            if cta is not holder:
                raise SimError("st.async to one CTA counted on another CTA's mbarrier")
            one = np.zeros(self.threads, dtype=bool)
            one[lane] = True
            self._write("shared::cluster", addr, data, one)
            self._barrier(holder, offset).complete_tx(4)

    def peer(self, address: int) -> tuple["ClusterOps", int]:
        """(the CTA, the offset in its shared memory) of a shared::cluster address: mapa's, which carries the
        CTA's rank + 1 above bit 24, or one of this CTA's own shared::cta addresses (0 there), which PTX lets a
        shared::cluster operand take."""
        rank = (address >> 24) - 1
        if rank >= len(self.cluster):
            raise SimError(f"a shared::cluster address {hex(address)} of a CTA rank outside the cluster")
        return (self if rank < 0 else self.cluster[rank]), address & ((1 << 24) - 1)

    def op_mapa(self, parts, ops, run):
        addr = as_uint(self.value(ops[1]), 32)
        rank = as_uint(self.value(ops[2]), 32) + np.uint64(1)
        self.write(ops[0], (rank << np.uint64(24)) | (addr & np.uint64((1 << 24) - 1)), run)


"""Memory for tests/ptx_sim.py: global memory as one byte arena (a misaligned or stray access raises, as the
hardware faults) and the bounds of a CTA's shared memory."""
from __future__ import annotations

import numpy as np
from ptx_arith import SimError


class Memory:
    """Global memory: a byte arena at address `base`."""

    def __init__(self, size: int, base: int = 1 << 32, fill: int = 0xA5):
        self.base = base
        self.bytes = np.full(size, fill, dtype=np.uint8)
        self.allocations: list[tuple[int, int]] = []  # offsets [lo, hi) a load may touch; none: anywhere
        self.writes = np.zeros(size, dtype=np.int32)  # how many stores wrote each byte

    def offsets(self, addrs: np.ndarray, nbytes: int) -> np.ndarray:
        addrs = addrs.astype(np.uint64)
        if (addrs % np.uint64(nbytes)).any():
            raise SimError(f"a {nbytes}-byte access at a misaligned address {hex(int(addrs[addrs % nbytes != 0][0]))}")
        off = addrs.astype(np.int64) - self.base
        if (off < 0).any() or (off + nbytes > len(self.bytes)).any():
            raise SimError("an access outside global memory")
        return off

    def check_store(self, off: np.ndarray, nbytes: int) -> None:
        """Stores of `nbytes` at arena offsets `off` must each lie inside one placed tensor (where any is placed): a
        store past a tensor's end lands in its neighbour or in no allocation, which a GPU may not fault on."""
        if not self.allocations or not len(off):
            return
        inside = np.zeros(len(off), dtype=bool)
        for lo, hi in self.allocations:
            inside |= (off >= lo) & (off + nbytes <= hi)
        if not inside.all():
            raise SimError(f"a store of {nbytes} bytes outside every tensor, at arena offset {int(off[~inside][0])}")

    def place(self, t, offset: int) -> int:
        """Copy a CPU tensor's storage to arena offset `offset` (its first element there); its address."""
        raw = t.detach().contiguous().view(-1).view(__import__("torch").uint8).numpy() if t.is_contiguous() else None
        if raw is None:
            raise SimError("place() takes contiguous tensors; make views of a placed base")
        self.bytes[offset:offset + len(raw)] = raw
        return self.base + offset

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        return self.bytes[addr - self.base:addr - self.base + nbytes].copy()


def shared_offsets(addr: np.ndarray, nbytes: int, size: int) -> np.ndarray:
    off = addr.astype(np.int64)
    if (off % nbytes).any():
        raise SimError("a misaligned shared-memory access")
    if (off < 0).any() or (off + nbytes > size).any():
        raise SimError(f"an access outside shared memory ({size} bytes): {int(off.min())}..{int(off.max()) + nbytes}")
    return off


class SmemRaces:
    """Happens-before of a CTA's plain shared-memory accesses, as racecheck sees them: a thread reading a byte
    that a thread of another warp stored, or storing a byte that one read, must have passed a bar.sync with it
    since. (Lanes of one warp are taken as ordered; accesses through the async proxy, mbarriers or other CTAs are
    not tracked: a kernel using them is not checked.)"""

    def __init__(self, threads: int, size: int):
        self.epoch = 0  # barrier instances so far
        self.together = np.zeros((threads, threads), dtype=np.int64)  # the last instance both threads passed
        self.writer = np.full(size, -1, dtype=np.int64)
        self.written = np.zeros(size, dtype=np.int64)  # the epoch a byte was stored in
        warps = -(-threads // 32)
        self.reader = np.full((warps, size), -1, dtype=np.int32)  # a lane of each warp that read a byte
        self.read = np.zeros((warps, size), dtype=np.int32)  # the epoch it read it in

    def barrier(self, threads: np.ndarray) -> None:
        """A barrier instance that `threads` (a mask) passed together."""
        self.epoch += 1
        idx = np.nonzero(threads)[0]
        self.together[np.ix_(idx, idx)] = self.epoch

    def store(self, lane: int, offset: int, nbytes: int) -> None:
        readers = self.reader[:, offset:offset + nbytes]
        others = (readers >= 0) & (np.arange(len(readers))[:, None] != lane // 32)
        read = self.read[:, offset:offset + nbytes]
        if others.any() and (self.together[lane, readers[others]] <= read[others]).any():
            raise SimError(f"a shared-memory race: thread {int(lane)} stores bytes at {int(offset)} that thread "
                           f"{int(readers[others][0])} read with no bar.sync between them")
        self.writer[offset:offset + nbytes] = lane
        self.written[offset:offset + nbytes] = self.epoch

    def load(self, lanes: np.ndarray, offsets: np.ndarray, nbytes: int) -> None:
        for lane, o in zip(lanes, offsets):
            w = self.writer[o:o + nbytes]
            stored = w >= 0
            other = stored & (w // 32 != lane // 32)
            if other.any() and (self.together[lane, w[other]] <= self.written[o:o + nbytes][other]).any():
                first = int(w[other][0])
                raise SimError(f"a shared-memory race: thread {int(lane)} reads bytes at {int(o)} that thread {first} "
                               f"stored with no bar.sync between them")
            self.reader[lane // 32, o:o + nbytes] = lane
            self.read[lane // 32, o:o + nbytes] = self.epoch


ORDERING = {"weak", "relaxed", "acquire", "release", "acq_rel", "volatile", "cta", "cluster", "gpu", "sys"}


def unordered(parts: list[str]) -> list[str]:
    """An instruction's name without its memory ordering and scope: one thread at a time, the simulator's
    accesses are all sequentially consistent."""
    return [p for p in parts if p not in ORDERING]

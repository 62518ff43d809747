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
        raise SimError("an access outside shared memory")
    return off

"""The tcgen05 side of tests/ptx_sim.py: tensor memory (TMEM, 128 lanes of 512 32-bit columns a CTA), its
allocation, the dense MMAs into it (tcgen05.mma kind::f16, one CTA or a CTA pair), their commits to mbarriers,
and tcgen05.ld / tcgen05.st between TMEM and registers. No Blackwell GPU is lent to this project: this is where
mgjit's sm_100a kernels run at all.

The facts it rests on, each from the PTX ISA (9.7.16): a TMEM address holds its lane in bits 16-31 and its
column in bits 0-15; the instruction descriptor's fields (Table 42: D type bits 4-5, A and B types 7-9 and
10-12, negations 13-14, transposes 15-16, N >> 3 in 17-22, M >> 4 in 24-28); an M = 128 MMA writes row r of D to
lane r, an M = 64 one rows 16q..16q + 15 to lanes 32q..32q + 15 of each quarter q; a CTA pair's MMA (M = 256)
takes A's rows and B's columns half from each CTA's shared memory at the same offsets and writes each CTA's rows
to its own TMEM; each warp reaches the 32 lanes of its quarter, and tcgen05.ld/st shapes give lane l's register r
the cell `_CELLS` says. Shared-memory operands are addressed as for wgmma (mgjit.mma_descriptors, checked on
Hopper GPUs). An MMA runs at its issue; a commit arrives at once.
"""
from __future__ import annotations

import re

import numpy as np
from ptx_arith import SimError, as_uint, narrow_to_f32

from mgjit.mma_descriptors import Major, decode_smem_descriptor, operand_address

LANES, COLUMNS = 128, 512
_F16_KIND_TYPES = {0: "f16", 1: "bf16"}  # Table 42, kind::f16: A and B type codes


def _cells(shape: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(lane, column) offsets of each thread's registers for a tcgen05.ld/st shape repeated n times (.xN), shape
    (32, registers): 32x32b: lane l, column r; the 16-lane shapes fold a warp over 16 lanes."""
    regs = {"32x32b": n, "16x64b": n, "16x128b": 2 * n, "16x256b": 4 * n}[shape]
    lane, r = np.arange(32)[:, None], np.arange(regs)[None, :]
    if shape == "32x32b":
        return np.broadcast_to(lane, (32, regs)), np.broadcast_to(r, (32, regs))
    if shape == "16x64b":
        return np.broadcast_to(lane // 4 + 8 * (lane % 2), (32, regs)), (lane // 2) % 2 + 2 * r
    if shape == "16x128b":
        return lane // 4 + 8 * (r % 2), lane % 4 + 4 * (r // 2)
    return lane // 4 + 8 * ((r // 2) % 2), r % 2 + 2 * (lane % 4) + 8 * (r // 4)


class Tcgen05Ops:
    """The CTA's (tests/ptx_sim.py) tcgen05 instructions; `tmem` is its tensor memory, `tmem_used` the columns
    tcgen05.alloc handed out."""

    def op_tcgen05(self, parts, ops, run):
        kind = parts[1]
        if kind.startswith(("fence", "wait")) or kind in ("relinquish_alloc_permit", "dealloc"):
            return
        if not run.any():
            return
        if kind == "alloc":
            self._alloc(ops, run)
        elif kind == "mma":
            self._mma(parts, ops, run)
        elif kind == "commit":
            self._commit(parts, ops, run)
        elif kind in ("ld", "st") and not any(p.startswith(("pack", "unpack")) for p in parts):
            self._move(kind, parts, ops, run)
        else:
            raise SimError(f"the simulator does not know {'.'.join(parts)}")

    def _alloc(self, ops, run):
        """tcgen05.alloc [dst], ncols (a warp, sync.aligned): ncols columns, their address stored at dst."""
        columns = int(self.value(ops[1]))
        if columns < 32 or columns & (columns - 1) or self.tmem_used + columns > COLUMNS:
            raise SimError(f"tcgen05.alloc of {columns} columns with {self.tmem_used} of {COLUMNS} in use")
        lane = int(np.nonzero(run)[0][0])
        one = np.zeros(self.threads, dtype=bool)
        one[lane] = True
        data = np.zeros((self.threads, 4), dtype=np.uint8)
        data[lane] = np.frombuffer(np.uint32(self.tmem_used).tobytes(), dtype=np.uint8)
        self._write("shared", self.address(ops[0]), data, one)
        self.tmem_used += columns

    def _operand(self, cta, descriptor: int, major: Major, rows: int, t: str) -> np.ndarray:
        d = decode_smem_descriptor(descriptor, tcgen05=True)
        mn, k = np.meshgrid(np.arange(rows), np.arange(16), indexing="ij")
        offsets = np.asarray(operand_address(d, major, mn, k, 16), dtype=np.int64)
        if offsets.min() < 0 or offsets.max() + 2 > len(cta.smem):
            raise SimError("a tcgen05.mma operand outside shared memory")
        bits = cta.smem[offsets].astype(np.uint16) | (cta.smem[offsets + 1].astype(np.uint16) << 8)
        return narrow_to_f32(bits, t)

    def _mma(self, parts, ops, run):
        """tcgen05.mma.cta_group::G.kind::f16 [d], a_desc, b_desc, idesc, enable_input_d: D (+)= A B^T."""
        group = int(re.search(r"cta_group::(\d)", ".".join(parts)).group(1))
        if "kind::f16" not in parts or ops[1].startswith("["):
            raise SimError(f"the simulator models tcgen05.mma kind::f16 from shared memory, got {'.'.join(parts)}")
        for lane in np.nonzero(run)[0]:
            value = lambda op: int(np.broadcast_to(np.asarray(self.value(op)), (self.threads,))[lane])  # noqa: E731
            a_desc, b_desc, idesc = (value(op) for op in ops[1:4])
            taddr = int(np.broadcast_to(as_uint(self.value(ops[0].strip("[]")), 32), (self.threads,))[lane])
            accumulate = bool(value(ops[4]))
            m, n = ((idesc >> 24) & 0x1F) << 4, ((idesc >> 17) & 0x3F) << 3
            if (idesc >> 4) & 3 != 1 or idesc & 0xF or (idesc >> 13) & 3:
                raise SimError(f"the simulator models dense unnegated f32-accumulating MMAs, idesc {idesc:#x}")
            a_type, b_type = _F16_KIND_TYPES[(idesc >> 7) & 7], _F16_KIND_TYPES[(idesc >> 10) & 7]
            a_major, b_major = (Major.MN if idesc >> bit & 1 else Major.K for bit in (15, 16))
            if group == 1 and m in (64, 128):
                ctas, rows = [self], m
            elif group == 2 and m == 256 and self.rank % 2 == 0:
                ctas, rows = [self, self.cluster[self.rank + 1]], 128
            else:
                raise SimError(f"the simulator models M = 64 and 128 on one CTA, 256 on a pair's leader: got M = {m} "
                               f"on cta_group::{group} from CTA rank {self.rank}")
            a = np.concatenate([self._operand(c, a_desc, a_major, rows, a_type) for c in ctas])
            b = np.concatenate([self._operand(c, b_desc, b_major, n // len(ctas), b_type) for c in ctas])
            d = a.astype(np.float64) @ b.astype(np.float64).T
            for i, cta in enumerate(ctas):
                cta._accumulate(taddr, d[i * rows:(i + 1) * rows], accumulate)

    def _accumulate(self, taddr: int, d: np.ndarray, accumulate: bool) -> None:
        """D's rows (this CTA's) into TMEM at taddr: M = 128 row r in lane r, M = 64 row r in lane
        32 * (r // 16) + r % 16 (the lane field then picks the half of each quarter)."""
        lane0, col0 = taddr >> 16, taddr & 0xFFFF
        rows = np.arange(len(d))
        lanes = lane0 + (rows if len(d) == 128 else 32 * (rows // 16) + rows % 16)
        if lanes.max() >= LANES or col0 + d.shape[1] > self.tmem_used:
            raise SimError(f"a tcgen05.mma writes TMEM lanes {lanes.min()}..{lanes.max()}, columns {col0}.."
                           f"{col0 + d.shape[1] - 1} of {self.tmem_used} allocated")
        cells = self.tmem[lanes[:, None], col0 + np.arange(d.shape[1])[None, :]]
        old = cells.view(np.float32).astype(np.float64) if accumulate else 0.0
        self.tmem[lanes[:, None], col0 + np.arange(d.shape[1])[None, :]] = \
            (d + old).astype(np.float32).view(np.uint32)

    def _commit(self, parts, ops, run):
        """tcgen05.commit ... mbarrier::arrive::one [bar] (multicast: at the same offset in each CTA of the mask):
        one arrival once the issuing thread's MMAs are done, which here they are."""
        addr = self.address(ops[0])
        for lane in np.nonzero(run)[0]:
            _, offset = self.peer(int(addr[lane]))
            if "multicast::cluster" in parts:
                mask = int(as_uint(np.broadcast_to(np.asarray(self.value(ops[1])), (self.threads,))[lane], 16))
                targets = [c for r, c in enumerate(self.cluster) if mask >> r & 1]
            else:
                targets = [self]
            for cta in targets:
                self._barrier(cta, offset).arrive()

    def _move(self, kind: str, parts, ops, run):
        """tcgen05.ld {regs}, [taddr] / tcgen05.st [taddr], {regs} (.sync.aligned, each warp wholly): the cells of
        the shape (`_cells`) within the warp's quarter of the lanes."""
        shape, reps = parts[4], int(parts[5][1:])
        regs_op, addr_op = (ops[0], ops[1]) if kind == "ld" else (ops[1], ops[0])
        regs = [r.strip() for r in regs_op.strip("{}").split(",")]
        lanes, cols = _cells(shape, reps)
        if lanes.shape[1] != len(regs):
            raise SimError(f"tcgen05.{kind}.{shape}.x{reps} moves {lanes.shape[1]} registers a thread, got {len(regs)}")
        taddr = np.broadcast_to(as_uint(self.value(addr_op.strip("[]")), 32), (self.threads,))
        values = None if kind == "ld" else [np.broadcast_to(as_uint(self.value(r), 32), (self.threads,)) for r in regs]
        out = [np.zeros(self.threads, dtype=np.uint32) for _ in regs]
        for warp in np.unique(np.nonzero(run)[0] // 32):
            threads = slice(32 * warp, 32 * warp + 32)
            if not run[threads].all() or (taddr[threads] != taddr[32 * warp]).any():
                raise SimError(f"tcgen05.{kind} run by part of warp {warp}, or at addresses that differ in it")
            lane0, col0 = int(taddr[32 * warp]) >> 16, int(taddr[32 * warp]) & 0xFFFF
            quarter = 32 * (warp % 4)
            if not quarter <= lane0 < quarter + 32 or lane0 + lanes.max() >= quarter + 32:
                raise SimError(f"warp {warp} reaches TMEM lanes {quarter}..{quarter + 31}, not lane {lane0}")
            if col0 + cols.max() >= self.tmem_used:
                raise SimError(f"tcgen05.{kind} of columns up to {col0 + cols.max()}, {self.tmem_used} allocated")
            for i in range(len(regs)):
                at = (lane0 + lanes[:, i], col0 + cols[:, i])
                if kind == "ld":
                    out[i][threads] = self.tmem[at]
                else:
                    self.tmem[at] = values[i][threads]
        if kind == "ld":
            for r, v in zip(regs, out):
                self.write(r, v, run)

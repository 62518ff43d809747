"""The tcgen05 side of tests/ptx_sim.py: tensor memory (TMEM, 128 lanes of 512 32-bit columns a CTA), its
allocation, the MMAs into it (tcgen05.mma kind::f16, and the block-scaled kind::mxf8f6f4 and kind::mxf4nvf4; one
CTA or a CTA pair), the copies of block scales into it (tcgen05.cp 32x128b.warpx4), commits to mbarriers, and
tcgen05.ld / tcgen05.st between TMEM and registers. No Blackwell GPU is lent to this project: this is where
mgjit's sm_100a kernels run at all.

The facts it rests on, each from the PTX ISA (9.7.16): a TMEM address holds its lane in bits 16-31 and its
column in bits 0-15; the instruction descriptor's fields (Table 42: D type bits 4-5, A and B types 7-9 and
10-12, negations 13-14, transposes 15-16, N >> 3 in 17-22, M >> 4 in 24-28); an M = 128 MMA writes row r of D to
lane r, an M = 64 one rows 16q..16q + 15 to lanes 32q..32q + 15 of each quarter q; a CTA pair's MMA (M = 256)
takes A's rows and B's columns half from each CTA's shared memory at the same offsets and writes each CTA's rows
to its own TMEM; each warp reaches the 32 lanes of its quarter, and tcgen05.ld/st shapes give lane l's register r
the cell `_CELLS` says. Block scaling (9.7.16.10.7): an instruction of K values and scale_vec::S scales each row
of A and each column of B by S scales, one per K / S values, from bytes id .. id + S - 1 of one 32-bit TMEM word,
the IDs in the instruction descriptor (A's bits 29-30, B's 4-5; bit 23 the scale type, 0 ue4m3, 1 ue8m0); row m
of A reads lane m, its word column + m // 32; the rows of partition p read column n of B's scales in lane
32p + n % 32, column + n // 32. tcgen05.cp 32x128b.warpx4 copies 32 rows of 16 bytes (a K-major unswizzled
descriptor) to lanes r of every partition, the row's four words to four columns. Shared-memory operands are
addressed as for wgmma (mgjit.mma_descriptors, checked on Hopper GPUs). An MMA or a copy runs at its issue; a
commit arrives at once.
"""
from __future__ import annotations

import re

import numpy as np
from ptx_arith import SimError
from ptx_wgmma import smem_operand, widen

from mgjit.mma_descriptors import Major, decode_smem_descriptor, operand_address

LANES, COLUMNS = 128, 512
# Instruction descriptor A and B type codes by kind (Table 42 and its block-scaled form), and the K of one
# instruction in values.
_KIND_TYPES = {"f16": {0: "f16", 1: "bf16"}, "mxf8f6f4": {0: "e4m3", 1: "e5m2"}, "mxf4nvf4": {1: "e2m1"}}
_KIND_K = {"f16": 16, "mxf8f6f4": 32, "mxf4nvf4": 64}


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
        elif kind == "cp":
            self._cp(parts, ops, run)
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

    def _mma(self, parts, ops, run):
        """tcgen05.mma.cta_group::G.kind::K[.block_scale.scale_vec::SX] [d], a_desc, b_desc, idesc,
        [[scale_a], [scale_b],] enable_input_d: D (+)= A B^T, A and B scaled by blocks in the block-scaled kinds."""
        joined = ".".join(parts)
        group = int(re.search(r"cta_group::(\d)", joined).group(1))
        kind = re.search(r"kind::(\w+)", joined).group(1)
        vec = re.search(r"scale_vec::(\d)X", joined)
        if kind not in _KIND_K or (kind != "f16") != bool(vec) or ops[1].startswith("["):
            raise SimError(f"the simulator models tcgen05.mma kind::f16, and kind::mxf8f6f4 and mxf4nvf4 block-scaled, "
                           f"from shared memory, got {joined}")
        k = _KIND_K[kind]
        for lane in np.nonzero(run)[0]:
            value = lambda op: int(self.per_thread(op)[lane])  # noqa: E731
            address = lambda op: int(self.per_thread(op.strip("[]"), 32)[lane])  # noqa: E731
            a_desc, b_desc, idesc = (value(op) for op in ops[1:4])
            taddr, accumulate = address(ops[0]), bool(value(ops[-1]))
            m, n = ((idesc >> 24) & 0x1F) << 4, ((idesc >> 17) & 0x3F) << 3
            if idesc & 0xF or (idesc >> 13) & 3 or idesc >> 31 or (not vec and (idesc >> 4) & 3 != 1):
                raise SimError(f"the simulator models dense unnegated MMAs into f32, idesc {idesc:#x}")
            types = _KIND_TYPES[kind]
            if (idesc >> 7) & 7 not in types or (idesc >> 10) & 7 not in types:
                raise SimError(f"idesc {idesc:#x} names A and B type codes {(idesc >> 7) & 7}, {(idesc >> 10) & 7}, "
                               f"not among kind::{kind}'s {sorted(types)}")
            a_type, b_type = types[(idesc >> 7) & 7], types[(idesc >> 10) & 7]
            a_major, b_major = (Major.MN if idesc >> bit & 1 else Major.K for bit in (15, 16))
            if group == 1 and (m in (64, 128) and not vec or m == 128):
                ctas, rows = [self], m
            elif group == 2 and m == 256 and self.rank % 2 == 0:
                ctas, rows = [self, self.cluster[self.rank + 1]], 128
            else:
                raise SimError(f"the simulator models M = 64 (dense) and 128 on one CTA, 256 on a pair's leader: got "
                               f"M = {m} on cta_group::{group} from CTA rank {self.rank}")
            a = [self._operand(c, a_desc, a_major, rows, k, a_type) for c in ctas]
            b = np.concatenate([self._operand(c, b_desc, b_major, n // len(ctas), k, b_type) for c in ctas])
            for cta, a_rows in zip(ctas, a):
                if vec:
                    d = cta._scaled_product(a_rows, b, int(vec.group(1)), idesc, address(ops[4]), address(ops[5]))
                else:
                    d = a_rows @ b.T
                cta._accumulate(taddr, d, accumulate)

    @staticmethod
    def _operand(cta, descriptor: int, major: Major, rows: int, k: int, t: str) -> np.ndarray:
        d = decode_smem_descriptor(descriptor, tcgen05=True)
        return smem_operand(cta.smem, d, major, rows, k, t, "a tcgen05.mma operand")[0].astype(np.float64)

    def _scaled_product(self, a: np.ndarray, b: np.ndarray, vec: int, idesc: int, a_scales: int,
                        b_scales: int) -> np.ndarray:
        """This CTA's rows of (A * its scales) @ (B * its scales)^T, the scales from this CTA's TMEM."""
        rows, n, k = len(a), len(b), a.shape[1]
        ue8m0 = (idesc >> 23) & 1
        a_bytes = self._scale_bytes(a_scales, np.arange(rows), np.arange(rows) // 32, (idesc >> 29) & 3, vec, ue8m0)
        a = a * np.repeat(a_bytes, k // vec, axis=1)
        d = np.empty((rows, n))
        cols = np.arange(n)
        for p in range(rows // 32):
            part = slice(32 * p, 32 * p + 32)
            b_bytes = self._scale_bytes(b_scales, 32 * p + cols % 32, cols // 32, (idesc >> 4) & 3, vec, ue8m0)
            d[part] = a[part] @ (b * np.repeat(b_bytes, k // vec, axis=1)).T
        return d

    def _scale_bytes(self, taddr: int, lanes: np.ndarray, columns: np.ndarray, first: int, count: int,
                     ue8m0: int) -> np.ndarray:
        """Scales `first` .. `first + count - 1` of the TMEM words at (lanes, columns) from taddr, as float64
        (len(lanes), count): ue8m0 2 ** (e - 127), e = 255 NaN; else ue4m3, as e4m3."""
        lanes, columns = (taddr >> 16) + lanes, (taddr & 0xFFFF) + columns
        if first + count > 4 or lanes.max() >= LANES or columns.max() >= self.tmem_used:
            raise SimError(f"block scales {first}..{first + count - 1} of TMEM lanes up to {lanes.max()}, columns up "
                           f"to {columns.max()} ({self.tmem_used} allocated)")
        words = self.tmem[lanes, columns].astype(np.uint32)[:, None]
        codes = (words >> (8 * np.arange(first, first + count, dtype=np.uint32))) & 0xFF
        if ue8m0:
            return np.where(codes == 255, np.nan, np.exp2(codes.astype(np.float64) - 127))
        return widen(codes, "e4m3").astype(np.float64)

    def _cp(self, parts, ops, run):
        """tcgen05.cp.cta_group::G.32x128b.warpx4 [taddr], s_desc: 32 rows of 16 bytes from shared memory (a K-major
        unswizzled descriptor), row r's four words to lane r of every 32-lane partition, columns from taddr's.
        Issued by one thread; for G = 2 by the pair's leader, each CTA copying its own shared memory to its own
        TMEM."""
        joined = ".".join(parts)
        group = int(re.search(r"cta_group::(\d)", joined).group(1))
        if "32x128b" not in parts or "warpx4" not in parts:
            raise SimError(f"the simulator models tcgen05.cp 32x128b.warpx4, got {joined}")
        for lane in np.nonzero(run)[0]:
            taddr = int(self.per_thread(ops[0].strip("[]"), 32)[lane])
            desc = int(self.per_thread(ops[1])[lane])
            if group == 2 and self.rank % 2:
                raise SimError(f"tcgen05.cp.cta_group::2 issued by CTA rank {self.rank}, not a pair's leader")
            d = decode_smem_descriptor(desc, tcgen05=True)
            r, j = np.meshgrid(np.arange(32), np.arange(16), indexing="ij")
            offsets = np.asarray(operand_address(d, Major.K, r, j, 8), dtype=np.int64)
            lane0, col0 = taddr >> 16, taddr & 0xFFFF
            for cta in [self] if group == 1 else [self, self.cluster[self.rank + 1]]:
                if lane0 or col0 + 4 > cta.tmem_used or offsets.min() < 0 or offsets.max() >= len(cta.smem):
                    raise SimError(f"tcgen05.cp to TMEM lane {lane0}, columns {col0}..{col0 + 3} "
                                   f"({cta.tmem_used} allocated), from shared memory {offsets.min()}..{offsets.max()}")
                words = cta.smem[offsets].reshape(32, 4, 4).astype(np.uint32)
                words = words[..., 0] | words[..., 1] << 8 | words[..., 2] << 16 | words[..., 3] << 24
                for q in range(4):
                    cta.tmem[32 * q + np.arange(32)[:, None], col0 + np.arange(4)[None, :]] = words

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
                mask = int(self.per_thread(ops[1], 16)[lane])
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
        taddr = self.per_thread(addr_op.strip("[]"), 32)
        values = None if kind == "ld" else [self.per_thread(r, 32) for r in regs]
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

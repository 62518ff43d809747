"""The wgmma side of tests/ptx_sim.py: warpgroup MMAs (wgmma.mma_async m64nNk16 of 16-bit floats, m64nNk32 of fp8,
m64nNk8 of tf32 (float32 with its low 13 mantissa bits dropped), into float32 accumulators; A and B from
shared-memory descriptors, or a 16-bit A from registers) and their fences, groups and waits.

PTX gives registers sequential meaning (ptxas waits where an accumulator is touched in flight), so an MMA runs at
its issue. Its shared-memory operands are read at the issue too, but the hardware may read them until
wgmma.wait_group says the group is done: the bytes an MMA read are kept and compared then, and a kernel that
refilled an operand's slot before that wait (a slot given back one MMA too early, with TMA loads landing at
their issue: tests/ptx_tma.py) raises. The operand addressing of a descriptor is mgjit's model of the canonical
layouts (mgjit.mma_descriptors.operand_address, checked on GPUs); the fragments of registers are the ISA's
figures, written here.
"""
from __future__ import annotations

import re

import numpy as np
from ptx_arith import SimError, narrow_to_f32

from mgjit.mma_descriptors import Major, decode_smem_descriptor, operand_address

OPERAND_BITS = {"tf32": 32, "bf16": 16, "f16": 16, "e4m3": 8, "e5m2": 8, "e2m1": 4}
_WGMMA_TYPES = ("tf32", "bf16", "f16", "e4m3", "e5m2")
_TF32_MASK = np.uint32(0xFFFFE000)  # tf32 keeps float32's sign, exponent and top 10 mantissa bits (truncated)
# e2m1 by its 3 magnitude bits (two exponent bits of bias 1, one mantissa bit); bit 3 is the sign.
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def widen(bits: np.ndarray, t: str) -> np.ndarray:
    """float32 values of operand elements' bits."""
    if t == "tf32":
        return (bits.astype(np.uint32) & _TF32_MASK).view(np.float32)
    if OPERAND_BITS[t] == 16:
        return narrow_to_f32(bits, t)
    if t == "e2m1":
        return np.where(bits & 8, -1.0, 1.0).astype(np.float32) * _E2M1[bits & 7]
    import torch
    fp8 = torch.float8_e4m3fn if t == "e4m3" else torch.float8_e5m2
    return torch.from_numpy(bits.astype(np.uint8)).view(fp8).float().numpy()


def smem_operand(smem: np.ndarray, d, major: Major, rows: int, k: int, t: str, what: str):
    """An MMA operand's (rows, k) elements as float32, read from shared memory through its decoded descriptor d
    (e2m1 two to a byte along K, the even one in the low nibble), and (the byte offsets read, their bytes)."""
    mn, kk = np.meshgrid(np.arange(rows), np.arange(k), indexing="ij")
    bits = OPERAND_BITS[t]
    size = max(1, bits // 8)
    offsets = np.asarray(operand_address(d, major, mn, kk, bits), dtype=np.int64)
    at = offsets[..., None] + np.arange(size)
    if offsets.min() < 0 or at.max() >= len(smem):
        raise SimError(f"{what} outside shared memory ({len(smem)} bytes): {int(offsets.min())}..{int(at.max()) + 1}")
    raw = smem[at]
    if bits == 4:
        codes = (raw[..., 0] >> (4 * (kk % 2))) & 0xF
    else:  # little-endian bytes
        codes = sum(raw[..., i].astype(np.uint32) << np.uint32(8 * i) for i in range(size))
    return widen(codes, t), (at.reshape(-1), raw.reshape(-1).copy())


def _fragment(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of each thread's i-th float32 accumulator of an m64nN tile, shape (128, N / 2): warp w holds
    rows 16w..16w + 15; each 8-column block gives a thread 4 registers, two columns of a row and the same two
    8 rows below."""
    t = np.arange(128)[:, None]
    i = np.arange(n // 2)[None, :]
    warp, lane, block, within = t // 32, t % 32, i // 4, i % 4
    return 16 * warp + lane // 4 + 8 * (within // 2), 8 * block + 2 * (lane % 4) + within % 2


def _a_fragment() -> tuple[np.ndarray, np.ndarray]:
    """(row, k) of each half of a thread's 4 A registers of 16-bit elements (m64k16), shape (128, 8): register j
    holds two neighbours in K, rows 8 apart for odd j, K 8 further for j >= 2."""
    t = np.arange(128)[:, None]
    h = np.arange(8)[None, :]
    j, half = h // 2, h % 2
    warp, lane = t // 32, t % 32
    return 16 * warp + lane // 4 + 8 * (j % 2), 2 * (lane % 4) + half + 8 * (j // 2)


class WgmmaOps:
    """The CTA's (tests/ptx_sim.py) wgmma instructions; `wgmma_groups` holds, per warpgroup, the shared-memory
    bytes its MMAs in flight read, by commit group."""

    def op_wgmma(self, parts, ops, run):
        kind = parts[1]
        groups = self._warpgroups(run, kind)
        if kind == "fence":
            return
        if kind == "commit_group":
            for wg in groups:
                self.wgmma_groups.setdefault(wg, [[]]).append([])
            return
        if kind == "wait_group":
            keep = int(self.value(ops[0]))
            for wg in groups:
                self._wgmma_wait(wg, keep)
            return
        if kind != "mma_async":
            raise SimError(f"the simulator does not know {'.'.join(parts)}")
        shape = re.fullmatch(r"m64n(\d+)k(\d+)", parts[4])
        d_type, a_type, b_type = parts[5:8]
        if not shape or d_type != "f32" or a_type not in _WGMMA_TYPES or b_type not in _WGMMA_TYPES or \
                int(shape[2]) * OPERAND_BITS[a_type] != 256 or OPERAND_BITS[a_type] != OPERAND_BITS[b_type]:
            raise SimError(f"the simulator models wgmma of tf32 (k8), 16-bit floats (k16) and fp8 (k32) into f32, got "
                           f"{'.'.join(parts)}")
        n, k = int(shape[1]), int(shape[2])
        d_regs = [r.strip() for r in ops[0].strip("{}").split(",")]
        from_registers = ops[1].startswith("{")
        # d, a, b-desc, scale-d, imm-scale-a, imm-scale-b, then for 16-bit inputs imm-trans-a (a in shared
        # memory) and imm-trans-b: fp8 operands are K-major, with no transpose operands
        negate = [int(self.value(op)) for op in ops[4:6]]
        trans = [int(self.value(op)) for op in ops[6:]] if OPERAND_BITS[a_type] == 16 else [0, 0]
        trans_a, trans_b = (0, trans[0]) if from_registers else trans[:2]
        if len(d_regs) != n // 2:
            raise SimError(f"wgmma m64n{n} takes {n // 2} float32 accumulators a thread, got {len(d_regs)}")
        rows, cols = _fragment(n)
        for wg in groups:
            lanes = slice(128 * wg, 128 * wg + 128)
            first = 128 * wg
            accumulate = bool(self.per_thread(ops[3])[first])  # scale-d
            b, b_read = self._smem_operand(self._uniform(ops[2], wg), Major.MN if trans_b else Major.K, n, k,
                                           b_type)
            if from_registers:
                if k != 16:
                    raise SimError(f"the simulator models A in registers for 16-bit floats, got {a_type}")
                a = self._register_a(ops[1], wg, a_type)
                reads = [b_read]
            else:
                a, a_read = self._smem_operand(self._uniform(ops[1], wg), Major.MN if trans_a else Major.K, 64, k,
                                               a_type)
                reads = [a_read, b_read]
            d = np.zeros((64, n))
            if accumulate:
                for i, r in enumerate(d_regs):
                    d[rows[:, i], cols[:, i]] = self.reg(r)[lanes].view(np.float32)
            d = (negate[0] * negate[1] * a.astype(np.float64) @ b.astype(np.float64).T + d).astype(np.float32)
            for i, r in enumerate(d_regs):
                mask = np.zeros(self.threads, dtype=bool)
                mask[lanes] = True
                value = np.zeros(self.threads, dtype=np.float32)
                value[lanes] = d[rows[:, i], cols[:, i]]
                self.write(r, value.view(np.uint32), mask)
            self.wgmma_groups.setdefault(wg, [[]])[-1].extend(reads)

    def op_setmaxnreg(self, parts, ops, run):
        """A warpgroup's register budget: the simulator's registers are unbounded."""
        self._warpgroups(run, "setmaxnreg")

    def _warpgroups(self, run: np.ndarray, kind: str) -> list[int]:
        """The warpgroups running a .sync.aligned wgmma instruction: each wholly."""
        groups = []
        for wg in np.unique(np.nonzero(run)[0] // 128):
            if not run[128 * wg:128 * wg + 128].all():
                raise SimError(f"{kind} run by only some threads of warpgroup {wg}")
            groups.append(int(wg))
        return groups

    def _uniform(self, op: str, wg: int) -> int:
        values = self.per_thread(op)[128 * wg:128 * wg + 128]
        if (values != values[0]).any():
            raise SimError(f"a wgmma descriptor {op} that differs between the threads of warpgroup {wg}")
        return int(values[0])

    def _smem_operand(self, descriptor: int, major: Major, rows: int, k: int, t: str):
        """An operand's (rows, k) elements as float32 from its descriptor, and (its byte offsets, their bytes)."""
        return smem_operand(self.smem, decode_smem_descriptor(descriptor, tcgen05=False), major, rows, k, t,
                            "a wgmma operand")

    def _register_a(self, op: str, wg: int, t: str) -> np.ndarray:
        regs = [r.strip() for r in op.strip("{}").split(",")]
        if len(regs) != 4:
            raise SimError(f"wgmma with A in registers takes 4 of them a thread (m64k16), got {len(regs)}")
        rows, ks = _a_fragment()
        a = np.zeros((64, 16), dtype=np.float32)  # m64k16
        for j, r in enumerate(regs):
            word = self.per_thread(r, 32)[128 * wg:128 * wg + 128].astype(np.uint32)
            for half in range(2):
                bits = (word >> np.uint32(16 * half)) & 0xFFFF
                a[rows[:, 2 * j + half], ks[:, 2 * j + half]] = narrow_to_f32(bits, t)
        return a

    def _wgmma_wait(self, wg: int, keep: int) -> None:
        """wgmma.wait_group keep: the warpgroup's committed groups but the newest `keep` are done; the bytes each
        of their MMAs read must still be there."""
        groups = self.wgmma_groups.get(wg, [[]])
        committed, current = groups[:-1], groups[-1]
        done = committed[:max(len(committed) - keep, 0)]
        for group in done:
            for offsets, data in group:
                if (self.smem[offsets] != data).any():
                    raise SimError(f"a wgmma operand of warpgroup {wg} in shared memory changed before the "
                                   "wgmma.wait_group that completes it (its slot given back, or written, too early)")
        self.wgmma_groups[wg] = committed[len(done):] + [current]

"""The arithmetic half of tests/ptx_sim.py: integer, float and conversion instructions over the threads of a
CTA (numpy arrays), as a mixin of its CTA class, and the bit-level helpers they share."""
from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np

PAIRS = ("bf16x2", "f16x2")  # two 16-bit floats in a 32-bit register, the first the low half
INT = {8: (np.uint8, np.int8), 16: (np.uint16, np.int16), 32: (np.uint32, np.int32), 64: (np.uint64, np.int64)}


class SimError(Exception):
    pass


class Arithmetic:
    """Instruction handlers `op_<name>(parts, operands, threads that run it)`; the CTA provides value, per_thread,
    fvalue, write and threads."""

    def _int_binary(self, parts, ops, run, fn):
        t = parts[-1]
        if t == "pred":
            self.write(ops[0], fn(self.value(ops[1]), self.value(ops[2])), run)
            return
        if t in ("s16x2", "u16x2"):  # add.s16x2, min.u16x2 (sm_90): each 16-bit half of the words apart
            words = [np.broadcast_to(as_uint(self.value(o), 32), (self.threads,)).astype(np.uint64) for o in ops[1:3]]
            out = np.zeros(self.threads, dtype=np.uint64)
            for shift in (0, 16):
                a, b = (as_int((w >> np.uint64(shift)) & np.uint64(0xFFFF), 16, t[0] == "s") for w in words)
                with np.errstate(over="ignore"):
                    out |= wrap(fn(a, b), 16).astype(np.uint64) << np.uint64(shift)
            self.write(ops[0], out, run)
            return
        bits = int(t[1:])
        signed = t[0] == "s"
        a, b = as_int(self.value(ops[1]), bits, signed), as_int(self.value(ops[2]), bits, signed)
        with np.errstate(over="ignore"):
            self.write(ops[0], wrap(fn(a, b), bits), run)

    def op_add(self, parts, ops, run):
        if parts[-1] in PAIRS:
            return self._narrow_pair_arith(parts, ops, run, lambda a, b: a + b)
        if is_float(parts[-1]):
            return self._float(parts, ops, run, lambda a, b: a + b)
        self._int_binary(parts, ops, run, lambda a, b: a + b)

    def op_sub(self, parts, ops, run):
        if parts[-1] in PAIRS:
            return self._narrow_pair_arith(parts, ops, run, lambda a, b: a - b)
        if is_float(parts[-1]):
            return self._float(parts, ops, run, lambda a, b: a - b)
        self._int_binary(parts, ops, run, lambda a, b: a - b)

    def op_mul(self, parts, ops, run):
        t = parts[-1]
        if t in PAIRS:
            return self._narrow_pair_arith(parts, ops, run, lambda a, b: a * b)
        if is_float(t):
            return self._float(parts, ops, run, lambda a, b: a * b)
        bits = int(t[1:])
        signed = t[0] == "s"
        if "hi" in parts:
            a, b = (np.broadcast_to(as_int(self.value(o), bits, signed), (self.threads,)) for o in ops[1:3])
            self.write(ops[0], np.array([((int(x) * int(y)) >> bits) & ((1 << bits) - 1) for x, y in zip(a, b)],
                                        dtype=np.uint64), run)
            return
        a, b = as_int(self.value(ops[1]), bits, signed), as_int(self.value(ops[2]), bits, signed)
        with np.errstate(over="ignore"):
            self.write(ops[0], wrap(a * b, 2 * bits if "wide" in parts else bits), run)

    def op_mad(self, parts, ops, run):
        t = parts[-1]
        if is_float(t):
            return self.op_fma(parts, ops, run)
        bits = int(t[1:])
        signed = t[0] == "s"
        if "hi" in parts or "cc" in parts:
            return self._mad_carry(parts, ops, run, False)
        a, b = as_int(self.value(ops[1]), bits, signed), as_int(self.value(ops[2]), bits, signed)
        wide = "wide" in parts
        c = as_int(self.value(ops[3]), 2 * bits if wide else bits, signed)
        with np.errstate(over="ignore"):
            if a.dtype != c.dtype:
                a, b, c = (np.asarray(v).astype(np.int64).view(np.uint64) if np.asarray(v).dtype.kind == "i"
                           else v for v in (a, b, c))
            self.write(ops[0], wrap(a * b + c, 2 * bits if wide else bits), run)

    def op_madc(self, parts, ops, run):
        self._mad_carry(parts, ops, run, True)

    def _mad_carry(self, parts, ops, run, carry_in: bool):
        """mad.lo/.hi with .cc (the carry out of the add into the threads' carry flag) and madc (the carry flag
        added in): the multiword products of libdevice's argument reduction (sinf, cosf)."""
        bits = int(parts[-1][1:])
        signed = parts[-1][0] == "s"
        a, b = (np.broadcast_to(as_int(self.value(o), bits, signed), (self.threads,)) for o in ops[1:3])
        c = self.per_thread(ops[3], bits)
        flag = self.carry_flag()
        mask = (1 << bits) - 1
        out, carry = np.zeros(self.threads, dtype=np.uint64), flag.copy()
        for i in np.flatnonzero(run):
            product = int(a[i]) * int(b[i])
            half = (product >> bits) & mask if "hi" in parts else product & mask
            total = half + int(c[i]) + (int(flag[i]) if carry_in else 0)
            out[i], carry[i] = total & mask, total >> bits
        self.write(ops[0], out, run)
        if "cc" in parts:
            flag[run] = carry[run]

    def carry_flag(self) -> np.ndarray:
        """The threads' carry flags (CC.CF), set by .cc instructions and read by the c-suffixed ones."""
        if getattr(self, "_carry", None) is None:
            self._carry = np.zeros(self.threads, dtype=np.uint64)
        return self._carry

    def op_and(self, parts, ops, run):
        self._int_binary(parts, ops, run, lambda a, b: a & b)

    def op_or(self, parts, ops, run):
        self._int_binary(parts, ops, run, lambda a, b: a | b)

    def op_xor(self, parts, ops, run):
        self._int_binary(parts, ops, run, lambda a, b: a ^ b)

    def op_not(self, parts, ops, run):
        t = parts[-1]
        if t == "pred":
            self.write(ops[0], ~np.asarray(self.value(ops[1]), dtype=bool), run)
            return
        bits = int(t[1:])
        self.write(ops[0], wrap(~as_int(self.value(ops[1]), bits, False), bits), run)

    def op_neg(self, parts, ops, run):
        t = parts[-1]
        if is_float(t):
            x = -self.fvalue(ops[1], t)
            self.write(ops[0], from_float(x, t, parts) if t == "bf16" else x, run)
            return
        bits = int(t[1:])
        self.write(ops[0], wrap(-as_int(self.value(ops[1]), bits, True), bits), run)

    def op_shl(self, parts, ops, run):
        bits = int(parts[-1][1:])
        a, n = as_uint(self.value(ops[1]), bits), as_uint(self.value(ops[2]), 32)
        out = np.where(n >= np.uint64(bits), np.uint64(0), a << np.minimum(n, np.uint64(bits - 1)))
        self.write(ops[0], wrap(out, bits), run)

    def op_shr(self, parts, ops, run):
        t = parts[-1]
        bits, signed = int(t[1:]), t[0] == "s"
        n = as_uint(self.value(ops[2]), 32)
        if signed:
            a = as_int(self.value(ops[1]), bits, True)
            out = a >> np.minimum(n, np.uint64(bits - 1)).astype(np.int64)
        else:
            a = as_uint(self.value(ops[1]), bits)
            out = np.where(n >= np.uint64(bits), np.uint64(0), a >> np.minimum(n, np.uint64(bits - 1)))
        self.write(ops[0], wrap(out, bits), run)

    def op_shf(self, parts, ops, run):
        a, b = as_uint(self.value(ops[1]), 32), as_uint(self.value(ops[2]), 32)
        c = as_uint(self.value(ops[3]), 32)
        n = np.minimum(c, np.uint64(32)) if parts[2] == "clamp" else c & np.uint64(31)
        both = (b << np.uint64(32)) | a
        if parts[1] == "r":
            out = np.where(n >= np.uint64(32), b, both >> np.minimum(n, np.uint64(31)))
        else:
            out = np.where(n >= np.uint64(32), a, (both << np.minimum(n, np.uint64(31))) >> np.uint64(32))
        self.write(ops[0], wrap(out, 32), run)

    def op_prmt(self, parts, ops, run):
        if len(parts) != 2:
            raise SimError(f"prmt mode {parts[1]}")
        a, b, c = (self.per_thread(o, 32) for o in ops[1:4])
        both = [(int(y) << 32) | int(x) for x, y in zip(a, b)]
        out = []
        for v, sel in zip(both, c):
            d = 0
            for i in range(4):
                nib = (int(sel) >> (4 * i)) & 15
                byte = (v >> (8 * (nib & 7))) & 255
                if nib & 8:
                    byte = 255 if byte & 128 else 0
                d |= byte << (8 * i)
            out.append(d)
        self.write(ops[0], np.array(out, dtype=np.uint64), run)

    def op_bfe(self, parts, ops, run):
        t = parts[-1]
        bits, signed = int(t[1:]), t[0] == "s"
        a = [int(v) for v in self.per_thread(ops[1], bits)]
        pos = [int(v) & 255 for v in self.per_thread(ops[2], 32)]
        ln = [int(v) & 255 for v in self.per_thread(ops[3], 32)]
        out = []
        for x, p, n in zip(a, pos, ln):
            field = 0 if p >= bits else (x >> p) & ((1 << min(n, bits)) - 1)
            if signed and n and (field >> (n - 1)) & 1:
                field -= 1 << n
            out.append(field & ((1 << bits) - 1))
        self.write(ops[0], np.array(out, dtype=np.uint64), run)

    def op_bfi(self, parts, ops, run):
        """bfi.bN d, a, b, pos, len: b with its bits pos .. pos + len - 1 taken from a's lowest bits."""
        bits = int(parts[-1][1:])
        a, b = ([int(v) for v in self.per_thread(o, bits)] for o in ops[1:3])
        pos, ln = ([int(v) & 255 for v in self.per_thread(o, 32)]
                   for o in ops[3:5])
        out = []
        for x, y, p, n in zip(a, b, pos, ln):
            field = ((1 << min(n, bits)) - 1) << p & ((1 << bits) - 1)
            out.append((y & ~field | x << p & field) & ((1 << bits) - 1))
        self.write(ops[0], np.array(out, dtype=np.uint64), run)

    def op_min(self, parts, ops, run):
        self._extremum(parts, ops, run, fmin_nan, np.fmin, np.minimum)

    def op_max(self, parts, ops, run):
        self._extremum(parts, ops, run, fmax_nan, np.fmax, np.maximum)

    def _extremum(self, parts, ops, run, nan_propagating, nan_ignoring, integer):
        """min/max; `.relu` (LLVM folds max(x, 0) into it) also clamps the result at 0 (NaN kept)."""
        relu = (lambda f: lambda a, b: _relu(f(a, b))) if "relu" in parts else (lambda f: f)
        if parts[-1] in PAIRS:  # each half apart (a reduction of bf16 pairs in their loaded words)
            return self._narrow_pair(parts, ops, run, relu(nan_propagating if "NaN" in parts else nan_ignoring))
        if parts[-1] in ("f16", "bf16"):
            return self._narrow_float(parts, ops, run, relu(nan_propagating if "NaN" in parts else nan_ignoring))
        if is_float(parts[-1]):
            return self._float(parts, ops, run, relu(nan_propagating))
        self._int_binary(parts, ops, run, relu(integer))

    def _narrow_float(self, parts, ops, run, fn):
        """A 16-bit float instruction (LLVM narrows max(f32(a), f32(b)) of bf16 a and b to max.bf16): computed
        in f32, where min and max are exact, and rounded back."""
        a, b = (narrow_to_f32(self.value(o), parts[-1]) for o in ops[1:3])
        self.write(ops[0], from_float(fn(a, b), parts[-1], parts), run)

    def _narrow_pair_arith(self, parts, ops, run, fn):
        """add/sub/mul/fma .rn on bf16x2 or f16x2 (LLVM pairs the halves of a loaded word): each half computed in
        f64, where a sum or product of two 16-bit floats is exact (an fma rounds there once more, harmlessly for
        these widths), and rounded once to its type."""
        t = parts[-1][:-2]

        def half(*args):
            with np.errstate(all="ignore"):
                y = fn(*(a.astype(np.float64) for a in args))
            return from_float(y, "bf16", parts) if t == "bf16" else np.asarray(y).astype(np.float16).view(np.uint16)
        self._per_half(ops, run, t, half)

    def _narrow_pair(self, parts, ops, run, fn):
        """`_narrow_float` on the low and the high halves of 32-bit operands."""
        t = parts[-1][:-2]
        self._per_half(ops, run, t, lambda x, y: from_float(fn(x, y), t, parts))

    def _per_half(self, ops, run, t, half):
        """ops[0] = the 16-bit results of `half` (the bits of one half) over the low and the high halves of the
        32-bit operands ops[1:], each half widened from `t` to f32."""
        words = [as_uint(self.value(o), 32).astype(np.uint32) for o in ops[1:]]
        halves = []
        for shift in (0, 16):
            args = [narrow_to_f32((w >> np.uint32(shift)) & np.uint32(0xFFFF), t) for w in words]
            halves.append(np.asarray(half(*args)).astype(np.uint32))
        self.write(ops[0], (halves[0] | halves[1] << np.uint32(16)).astype(np.uint64), run)

    def op_setp(self, parts, ops, run):
        cmp, t = parts[1], parts[-1]
        outs = ops[0].split("|")
        if is_float(t):
            a, b = (self.fvalue(o, t) for o in ops[1:3])
            unordered = np.isnan(a) | np.isnan(b)
            base = cmp[:-1] if cmp.endswith("u") and cmp not in ("nu",) else cmp
            table = {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b,
                     "num": ~unordered, "nan": unordered}
            r = table[base] if base in table else None
            if r is None:
                raise SimError(f"setp.{cmp}")
            r = r | unordered if cmp.endswith("u") and cmp not in ("num",) else (r & ~unordered if base == "ne" else r)
        else:
            bits = int(t[1:]) if t != "pred" else 1
            signed = t[0] == "s"
            a, b = (as_int(self.value(o), bits, signed) for o in ops[1:3])
            ua, ub = (as_int(self.value(o), bits, False) for o in ops[1:3])
            table = {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b,
                     "lo": ua < ub, "ls": ua <= ub, "hi": ua > ub, "hs": ua >= ub}
            r = table[cmp]
        self.write(outs[0].strip(), r, run)
        if len(outs) > 1:
            self.write(outs[1].strip(), ~np.asarray(r), run)

    def op_selp(self, parts, ops, run):
        c = np.asarray(self.value(ops[3]), dtype=bool)
        t = parts[-1]
        if t.startswith("f"):
            a, b = (np.broadcast_to(self.fvalue(o, t), (self.threads,)) for o in ops[1:3])
        else:
            dt = bits_dtype(t)
            a, b = (np.broadcast_to(np.asarray(self.value(o, dt)), (self.threads,)) for o in ops[1:3])
        self.write(ops[0], np.where(c, a, b), run)

    def op_cvt(self, parts, ops, run):
        if parts[-2] in FP8_PAIRS:  # cvt.rn.satfinite.e4m3x2.f32 d, a, b: a to the upper byte, b to the lower
            hi, lo = (to_fp8(self.fvalue(o, "f32"), parts[-2][:-2]) for o in ops[1:3])
            self.write(ops[0], (hi << np.uint16(8)) | lo, run)
            return
        if parts[-1] in FP8_PAIRS:  # cvt.rn.f16x2.e4m3x2 d, a: the upper byte to the upper half
            pair = as_uint(self.value(ops[1]), 16)
            hi, lo = (from_fp8((pair >> np.uint64(k)) & np.uint64(255), parts[-1][:-2]) for k in (8, 0))
            narrow = parts[-2][:-2]
            hi, lo = (from_float(v, narrow, parts).astype(np.uint32) for v in (hi, lo))
            self.write(ops[0], (hi << np.uint32(16)) | lo, run)
            return
        if parts[-2] in ("f16x2", "bf16x2"):  # cvt.rn.f16x2.f32 d, a, b: a to the upper half, b to the lower
            narrow = parts[-2][:-2]
            hi, lo = (from_float(self.fvalue(o, "f32"), narrow, parts).astype(np.uint32) for o in ops[1:3])
            self.write(ops[0], (hi << np.uint32(16)) | lo, run)
            return
        types = [p for p in parts[1:] if re.fullmatch(r"(u|s|b|f|bf)\d+", p)]
        dst, src = types[0], types[1]
        x = self.value(ops[1])
        if src.startswith("f") or src.startswith("bf"):
            xf = narrow_to_f32(x, src) if src in ("f16", "bf16") else self.fvalue(ops[1], src)
            self.write(ops[0], from_float(xf, dst, parts), run)
            return
        bits = int(src[1:])
        xi = as_int(x, bits, src[0] == "s")
        if dst.startswith("f") or dst.startswith("bf"):
            self.write(ops[0], from_float(xi.astype(np.float64), dst, parts), run)
            return
        self.write(ops[0], _extended(wrap(xi, int(dst[1:])), dst), run)

    def _float(self, parts, ops, run, fn):
        if parts[-1] == "bf16":  # computed in f64 (a sum or product of two bf16 is exact there), rounded once
            a, b = (self.fvalue(o, "bf16").astype(np.float64) for o in ops[1:3])
            with np.errstate(all="ignore"):
                self.write(ops[0], from_float(fn(a, b), "bf16", parts), run)
            return
        dt = float_dtype(parts[-1])
        a, b = (self.fvalue(o, parts[-1]) for o in ops[1:3])
        with np.errstate(all="ignore"):
            self.write(ops[0], fn(a, b).astype(dt), run)

    def op_div(self, parts, ops, run):
        if not is_float(parts[-1]):
            return self._int_division(parts, ops, run, remainder=False)
        self._float(parts, ops, run, lambda a, b: a / b)

    def op_rem(self, parts, ops, run):
        self._int_division(parts, ops, run, remainder=True)

    def _int_division(self, parts, ops, run, remainder: bool):
        """Truncating integer division; by zero, as the hardware does it: all ones (the remainder: the dividend)."""
        t = parts[-1]
        bits, signed = int(t[1:]), t[0] == "s"
        a, b = (np.broadcast_to(as_int(self.value(o), bits, signed), (self.threads,)) for o in ops[1:3])
        out = []
        for x, y in zip(a.tolist(), b.tolist()):
            q = -1 if y == 0 else abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
            out.append((x - q * y if y and remainder else x if remainder else q) & ((1 << bits) - 1))
        self.write(ops[0], wrap(np.array(out, dtype=np.uint64), bits), run)

    def op_fma(self, parts, ops, run):
        if parts[-1] in PAIRS:
            return self._narrow_pair_arith(parts, ops, run, lambda a, b, c: a * b + c)
        a, b, c = (self.fvalue(o, parts[-1]).astype(np.float64) for o in ops[1:4])
        with np.errstate(all="ignore"):
            y = exact_fma(a, b, c) if parts[-1] == "f64" else a * b + c
        self.write(ops[0], from_float(y, "bf16", parts) if parts[-1] == "bf16" else y.astype(float_dtype(parts[-1])),
                   run)

    def _unary(self, parts, ops, run, fn):
        """A float instruction of one operand in its type (f32, or f64: rsqrt.approx.f64, sqrt.rn.f64, rcp.rn.f64),
        computed in f64."""
        t = "f64" if parts[-1] == "f64" else "f32"
        x = self.fvalue(ops[1], t)
        with np.errstate(all="ignore"):
            self.write(ops[0], fn(x.astype(np.float64)).astype(float_dtype(t)), run)

    def op_ex2(self, parts, ops, run):
        if "ftz" not in parts:
            self._unary(parts, ops, run, np.exp2)
            return
        tiny = np.finfo(np.float32).tiny

        def ex2_ftz(x):  # subnormal inputs and results flush to zero
            y = np.exp2(np.where(np.abs(x) < tiny, 0.0, x))
            return np.where(y < tiny, 0.0, y)
        self._unary(parts, ops, run, ex2_ftz)

    def op_lg2(self, parts, ops, run):
        self._unary(parts, ops, run, np.log2)

    def op_rcp(self, parts, ops, run):
        self._unary(parts, ops, run, lambda x: 1.0 / x)

    def op_rsqrt(self, parts, ops, run):
        self._unary(parts, ops, run, lambda x: 1.0 / np.sqrt(x))

    def op_sqrt(self, parts, ops, run):
        self._unary(parts, ops, run, np.sqrt)

    def op_abs(self, parts, ops, run):
        if is_float(parts[-1]):
            x = np.abs(self.fvalue(ops[1], parts[-1]))
            self.write(ops[0], from_float(x, "bf16", parts) if parts[-1] == "bf16" else x, run)
        else:
            bits = int(parts[-1][1:])
            self.write(ops[0], wrap(np.abs(as_int(self.value(ops[1]), bits, True)), bits), run)

    def op_cvta(self, parts, ops, run):
        self.write(ops[0], self.value(ops[1]), run)

    def op_clz(self, parts, ops, run):
        bits = int(parts[-1][1:])
        x = self.per_thread(ops[1], bits)
        self.write(ops[0], np.array([bits - int(v).bit_length() for v in x], dtype=np.uint32), run)

    def op_popc(self, parts, ops, run):
        bits = int(parts[-1][1:])
        x = self.per_thread(ops[1], bits)
        self.write(ops[0], np.array([bin(int(v)).count("1") for v in x], dtype=np.uint32), run)

    def op_copysign(self, parts, ops, run):
        """copysign.f32 d, a, b: b with the sign of a (PTX's operand order is C's reversed)."""
        a, b = (self.fvalue(o, parts[-1]) for o in ops[1:3])
        self.write(ops[0], np.copysign(b, a), run)


def _relu(x):
    return np.where(x < 0, np.zeros_like(x), x)


def fmin_nan(a, b):
    return np.where(np.isnan(a) | np.isnan(b), np.nan, np.minimum(a, b))


def exact_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fma.rn.f64: a * b + c rounded once (numpy's a * b + c rounds twice, which libdevice's argument reductions,
    built on exact fmas, do not survive: cos came out 128 ulps off). Exactly, in fractions, where all three are
    finite; a zero sum takes a * b + c's sign rules (+0 unless both terms are -0)."""
    a, b, c = np.broadcast_arrays(a, b, c)
    with np.errstate(all="ignore"):
        y = a * b + c
    for i in np.nonzero(np.isfinite(a) & np.isfinite(b) & np.isfinite(c))[0]:
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        if exact == 0:
            y[i] = a[i] * b[i] + c[i] if a[i] * b[i] == 0 and c[i] == 0 else 0.0
            continue
        try:
            y[i] = float(exact)  # int / int: correctly rounded, subnormals too
        except OverflowError:
            y[i] = math.inf if exact > 0 else -math.inf
    return y


def fmax_nan(a, b):
    return np.where(np.isnan(a) | np.isnan(b), np.nan, np.maximum(a, b))


FP8_PAIRS = ("e4m3x2", "e5m2x2")


def _fp8_dtype(kind: str):
    import torch
    return {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[kind]


def to_fp8(x: np.ndarray, kind: str) -> np.ndarray:
    """f32 values as fp8 bits, rounded to nearest even, finite overflow and infinities saturated (satfinite)."""
    import torch
    t = torch.from_numpy(np.array(x, dtype=np.float32))
    big = torch.finfo(_fp8_dtype(kind)).max
    t = torch.where(t.isnan(), t, t.clamp(-big, big))
    return t.to(_fp8_dtype(kind)).view(torch.uint8).numpy().astype(np.uint16)


def from_fp8(bits: np.ndarray, kind: str) -> np.ndarray:
    import torch
    raw = torch.from_numpy(np.ascontiguousarray(bits, dtype=np.uint8))
    return raw.view(_fp8_dtype(kind)).float().numpy()


def is_float(t: str) -> bool:
    return t.startswith("f") or t == "bf16"


def float_dtype(t: str):
    return {"f32": np.float32, "f64": np.float64, "f16": np.float16}[t]


def bits_dtype(t: str):
    if t == "pred":
        return np.bool_
    if t.startswith("f"):
        return float_dtype(t)
    return INT[int(t[1:])][0]


def as_uint(x, bits: int) -> np.ndarray:
    """The low `bits` bits of an operand (floats by their bits, bools as 0/1), as uint64."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        x = x.view(np.uint32)
    elif x.dtype == np.float64:
        x = x.view(np.uint64)
    elif x.dtype == np.float16:
        x = x.view(np.uint16)
    elif x.dtype == np.bool_:
        x = x.astype(np.uint8)
    elif x.dtype.kind == "i":
        x = x.astype(np.int64).view(np.uint64) if x.ndim else np.array(int(x) & (2**64 - 1), dtype=np.uint64)
    x = x.astype(np.uint64)
    return x if bits == 64 else x & np.uint64((1 << bits) - 1)


def as_int(x, bits: int, signed: bool) -> np.ndarray:
    """An integer operand: uint64 (wrapping arithmetic) when unsigned, sign-extended int64 when signed."""
    u = as_uint(x, bits)
    if not signed:
        return u
    if bits == 64:
        return u.view(np.int64) if u.ndim else np.array(u).view(np.int64)
    v = u.astype(np.int64)
    return np.where(v >= (1 << (bits - 1)), v - (1 << bits), v)


def wrap(x, bits: int) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return x
    u = x.astype(np.int64).view(np.uint64) if x.dtype.kind == "i" else x.astype(np.uint64)
    return (u if bits == 64 else u & np.uint64((1 << bits) - 1)).astype(INT[bits][0])


def convert_bits(v: np.ndarray, dtype) -> np.ndarray:
    """A value moved into a register of another type: bits are kept (mov, loads), bools become 0/1."""
    if dtype == np.bool_:
        return v.astype(bool)
    if v.dtype == np.bool_:
        return v.astype(dtype)
    if np.dtype(dtype).kind == "f":
        bits = np.dtype(dtype).itemsize * 8
        return as_uint(v, bits).astype(INT[bits][0]).view(dtype)
    bits = np.dtype(dtype).itemsize * 8
    return as_uint(v, bits).astype(dtype)


def narrow_to_f32(x, t: str) -> np.ndarray:
    """The f32 value of 16-bit float bits (t: "f16" or "bf16")."""
    if t == "bf16":
        return (np.asarray(x).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return np.asarray(x).astype(np.uint16).view(np.float16).astype(np.float32)


_TO_INTEGRAL = {"rni": np.rint, "rmi": np.floor, "rpi": np.ceil, "rzi": np.trunc}


def from_float(x: np.ndarray, dst: str, parts) -> np.ndarray:
    integral = [_TO_INTEGRAL[p] for p in parts if p in _TO_INTEGRAL]  # cvt.rmi.f32.f32: floor, in the float type
    if integral and dst in ("f32", "f64"):
        with np.errstate(all="ignore"):
            x = integral[0](x)
    if dst == "f32":
        return x.astype(np.float32)
    if dst == "f64":
        return x.astype(np.float64)
    if dst == "f16":
        return x.astype(np.float32).astype(np.float16).view(np.uint16)
    if dst == "bf16":
        import torch
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).view(
            torch.int16).numpy().view(np.uint16)
    bits = int(dst[1:])
    with np.errstate(all="ignore"):
        r = (integral[0] if integral else np.trunc)(x)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dst[0] == "s" else (0, (1 << bits) - 1)
    # NaN: the most negative integer (H100, cvt.rzi.s32.f64 and cvt.rzi.s64.f32, seen by the GPU fuzzer).
    r = np.where(np.isnan(r), float(lo), r)
    kind = np.int64 if dst[0] == "s" else np.uint64
    # float(hi) of 64 bits rounds up to 2**63 (2**64), past the integer type: the top saturates apart.
    top = r >= float(hi)
    clipped = np.where(top, 0.0, np.clip(r, lo, hi)).astype(kind)
    return _extended(wrap(np.where(top, np.array(hi, dtype=kind), clipped), bits), dst)


def _extended(x: np.ndarray, dst: str) -> np.ndarray:
    """A conversion's integer result as the register receives it: a signed type narrower than the register
    (cvt.s8.s32 into a 16-bit register) sign-extended, as PTX extends it; an unsigned one zero-extended."""
    return as_int(x, int(dst[1:]), True) if dst[0] == "s" else x


def atomic_result(kind: str, t: str, old: int, value: int, compare: int | None) -> int:
    """The bits an atomic of `kind` on type t (u32, s64, f32, noftz f16/bf16, b16...) leaves in memory; floats add
    exactly and round once."""
    bits = int(t.lstrip("bfus"))
    mask = (1 << bits) - 1
    if kind == "exch":
        return value
    if kind == "cas":
        return value if old == compare else old
    if t[0] in "us" and kind == "add":
        return (old + value) & mask
    if t[0] in "us" and kind in ("min", "max"):
        a, b = (x - (1 << bits) if t[0] == "s" and x >> (bits - 1) else x for x in (old, value))
        return (min(a, b) if kind == "min" else max(a, b)) & mask
    if t[0] != "f" and t != "bf16" or kind != "add":
        raise SimError(f"the simulator does not know atom.{kind}.{t}")
    total = np.array([_to_float(old, t) + _to_float(value, t)])
    return int(as_uint(from_float(total, t, ()) if t in ("f16", "bf16") else total.astype(float_dtype(t)), bits)[0])


def _to_float(bits: int, t: str) -> float:
    if t == "bf16":
        return float(np.array([bits << 16], dtype=np.uint32).view(np.float32)[0])
    width = {"f16": np.uint16, "f32": np.uint32, "f64": np.uint64}[t]
    return float(np.array([bits], dtype=width).view(float_dtype(t))[0])

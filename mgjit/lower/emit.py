"""Emitter: the MLIR ops the lowering rules need, as small typed calls (through the shim's bindings).

Every method appends at the current insertion point. `libdevice(...)` declares the function it calls on first
use; the driver links libdevice into exactly the kernels that declared one.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import dtypes
from ..dtypes import DType

_DYNAMIC_INDEX = -2147483648  # llvm.getelementptr's marker for an index given as an operand
# fp8 has no arithmetic below PTX: values are converted to f32 (through f16x2) and back with cvt.rn.satfinite.
_FP8 = {d.mlir: d for d in dtypes.ALL if d.is_float and d.bits == 8 and not d.storage_only}  # e8m0, e2m1: bytes (i8)
_FP8_PTX = {"float8_e4m3fn": "e4m3x2", "float8_e5m2": "e5m2x2"}


class Emitter:
    def __init__(self, m, module, func_block, gpu_module_block):
        self.m = m  # the shim's namespace: ir, arith, scf, llvm, nvvm, gpu
        self.module = module
        self.gpu_block = gpu_module_block
        self.libdevice_decls: set[str] = set()
        self.ir = m.ir
        self.ip = [m.ir.InsertionPoint.at_block_terminator(func_block)]

    # -- insertion points
    def push(self, ip) -> None:
        self.ip.append(ip)
        ip.__enter__()

    def pop(self) -> None:
        self.ip.pop().__exit__(None, None, None)

    # -- structured branches
    def if_else(self, cond, types: list, then: Callable[[], list], otherwise: Callable[[], list]) -> list:
        """The values (of `types`) that `then()` yields where cond holds and `otherwise()` yields elsewhere, each
        emitted in its own block of one scf.if."""
        if_op = self.m.scf.IfOp(cond, types, has_else=True)
        for block, body in ((if_op.then_block, then), (if_op.else_block, otherwise)):
            self.push(self.ir.InsertionPoint(block))
            try:
                self.m.scf.yield_(body())
            finally:
                self.pop()
        return list(if_op.results)

    def only_if(self, cond, emit: Callable[[], None]) -> None:
        """Emit what `emit` emits inside `if cond` (a branch: threads for which it is false skip it)."""
        if_op = self.m.scf.IfOp(cond, [], has_else=False)
        self.push(self.ir.InsertionPoint(if_op.then_block))
        try:
            emit()
            self.m.scf.yield_([])
        finally:
            self.pop()

    # -- types
    def type(self, dtype: DType):
        ir = self.ir
        if dtype.is_float:
            return {"f32": ir.F32Type, "f16": ir.F16Type, "bf16": ir.BF16Type, "f64": ir.F64Type}[dtype.mlir].get() \
                if dtype.mlir in ("f32", "f16", "bf16", "f64") else ir.Type.parse(dtype.mlir)
        return ir.IntegerType.get_signless(dtype.bits)

    def int_type(self, bits: int):
        return self.ir.IntegerType.get_signless(bits)

    # -- constants
    def const(self, value: int | float | bool, dtype: DType):
        t = self.type(dtype)
        ir = self.ir
        if dtype.is_float:
            value = float(value)
            if dtype.mlir in _FP8 and value == value:  # saturated, as conversions to fp8 are
                value = max(-dtype.max_finite, min(dtype.max_finite, value))
            attr = ir.FloatAttr.get(t, value)
        else:
            v = int(value)
            if dtype == dtypes.bool_:
                v = 1 if v else 0
            elif v >= 2 ** (dtype.bits - 1):  # two's complement: a 64-bit descriptor may set bit 63
                v -= 2 ** dtype.bits
            attr = ir.IntegerAttr.get(t, v)
        return self.m.arith.constant(t, attr)

    def i32(self, v: int):
        return self.const(v, dtypes.int32)

    def i64(self, v: int):
        return self.const(v, dtypes.int64)

    def const_bool(self, v: bool):
        return self.const(v, dtypes.bool_)

    # -- integer arithmetic (used for indices everywhere)
    def addi(self, a, b): return self.m.arith.addi(a, b)
    def subi(self, a, b): return self.m.arith.subi(a, b)
    def muli(self, a, b): return self.m.arith.muli(a, b)
    def divui(self, a, b): return self.m.arith.divui(a, b)
    def remui(self, a, b): return self.m.arith.remui(a, b)
    def andi(self, a, b): return self.m.arith.andi(a, b)
    def ori(self, a, b): return self.m.arith.ori(a, b)

    def cmpi(self, pred: str, a, b):
        return self.m.arith.cmpi(getattr(self.m.arith.CmpIPredicate, pred), a, b)

    def cmpf(self, pred: str, a, b):
        fp8 = self.fp8_of(a)
        if fp8 is not None:  # widening is exact
            a, b = self.cast(a, fp8, dtypes.float32), self.cast(b, fp8, dtypes.float32)
        return self.m.arith.cmpf(getattr(self.m.arith.CmpFPredicate, pred), a, b)

    def select(self, c, a, b): return self.m.arith.select(c, a, b)

    def ext_i64(self, v, signed: bool = True):
        t = self.int_type(64)
        return self.m.arith.extsi(t, v) if signed else self.m.arith.extui(t, v)

    def zext(self, v, bits: int): return self.m.arith.extui(self.int_type(bits), v)
    def trunc(self, v, bits: int): return self.m.arith.trunci(self.int_type(bits), v)
    def bitcast(self, v, t): return self.m.arith.bitcast(t, v)

    def halves(self, x) -> tuple[Any, Any]:
        """A 64-bit value (i64 or f64) as its (low, high) 32-bit words: what shuffles and exchanges move."""
        word = x if str(x.type) == "i64" else self.bitcast(x, self.int_type(64))
        return self.trunc(word, 32), self.trunc(self.m.arith.shrui(word, self.i64(32)), 32)

    def joined(self, low, high, t):
        """The 64-bit value of type t (i64 or f64) whose 32-bit words are low and high."""
        word = self.ori(self.zext(low, 64), self.m.arith.shli(self.zext(high, 64), self.i64(32)))
        return word if str(t) == "i64" else self.bitcast(word, t)

    def pack_i32(self, parts: Sequence[Any]):
        """Narrow integers (lowest first) → one i32: 16-bit halves through a vector bitcast, bytes shifted and or'ed
        in. LLVM's NVPTX backend cannot select a vector of bytes built from sign-extended compares (`where(m == 0,
        255, 0)` on uint8: "Cannot select: i8 = sign_extend", an abort that took the Python process with it; fuzz
        seed 88218). Or'ed bytes also take fewer SASS instructions (64x128 tiles stored, nvdisasm: fp8 496 -> 488,
        bool 312 -> 296, uint8 328 -> 296)."""
        if self.ir.IntegerType(parts[0].type).width == 8:
            word = self.zext(parts[0], 32)
            for i, x in enumerate(parts[1:], 1):
                word = self.ori(word, self.m.arith.shli(self.zext(x, 32), self.i32(8 * i)))
            return word
        vec_t = self.ir.VectorType.get([len(parts)], parts[0].type)
        vec = self.m.llvm.mlir_undef(vec_t)
        for i, x in enumerate(parts):
            vec = self.m.llvm.insertelement(vec, x, self.i32(i))
        return self.m.llvm.bitcast(self.int_type(32), vec)

    def unpack_i32(self, word, bits: int) -> list:
        n = 32 // bits
        vec = self.m.llvm.bitcast(self.ir.VectorType.get([n], self.int_type(bits)), word)
        return [self.m.llvm.extractelement(vec, self.i32(i)) for i in range(n)]

    @staticmethod
    def unpacked_from(x) -> tuple[Any, int] | None:
        """(the i32 word, which of its halves) where x is a 16-bit element `unpack_i32` took from a word (through
        a bitcast to its own type), else None."""
        def producer(v):
            owner = getattr(v, "owner", None)
            return getattr(owner, "operation", owner) if owner is not None and hasattr(owner, "name") else None
        op = producer(x)
        if op is not None and op.name == "arith.bitcast":
            op = producer(op.operands[0])
        if op is None or op.name != "llvm.extractelement":
            return None
        vector, index = producer(op.operands[0]), producer(op.operands[1])
        if vector is None or vector.name != "llvm.bitcast" or index is None or index.name != "arith.constant":
            return None
        if str(vector.operands[0].type) != "i32":  # a wider word's halves are not a pair's (the shift and mask)
            return None
        return vector.operands[0], int(index.attributes["value"].value)

    # -- special registers
    def _sreg(self, name: str):
        return getattr(self.m.nvvm, f"read_ptx_sreg_{name}")(results=[self.int_type(32)])

    def tid_x(self): return self._sreg("tid_x")
    def ctaid(self, axis: int): return self._sreg(f"ctaid_{'xyz'[axis]}")
    def nctaid(self, axis: int): return self._sreg(f"nctaid_{'xyz'[axis]}")

    # -- inline PTX
    def asm(self, text: str, constraints: str, operands: Sequence[Any], results: Sequence[Any],
            side_effects: bool = False) -> list[Any]:
        """Inline PTX returning len(results) values of the given MLIR types."""
        llvm = self.m.llvm
        if len(results) == 1:
            out = llvm.inline_asm(results[0], list(operands), text, constraints, has_side_effects=side_effects)
            return [out]
        struct = self.ir.Type.parse("!llvm.struct<(" + ", ".join(str(t) for t in results) + ")>")
        out = llvm.inline_asm(struct, list(operands), text, constraints, has_side_effects=side_effects)
        return [llvm.extractvalue(t, out, [i]) for i, t in enumerate(results)]

    def asm_void(self, text: str, constraints: str, operands: Sequence[Any]) -> None:
        self.m.llvm.inline_asm(None, list(operands), text, constraints, has_side_effects=True)

    def opaque(self, value):
        """An i32 value LLVM cannot see through, read where it is used: what is computed from it stays there
        (LLVM neither hoists it out of a loop nor merges it with the same computation elsewhere)."""
        return self.asm("mov.b32 $0, $1;", "=r,r", [value], [self.int_type(32)], side_effects=True)[0]

    # -- pointers and memory
    def ptr_to_int(self, p):
        return self.m.llvm.ptrtoint(self.int_type(64), p)

    def smem_base(self):
        return self.m.llvm.mlir_addressof(self.ir.Type.parse("!llvm.ptr<3>"), "__mgjit_smem")

    def smem_ptr(self, byte_offset):
        i8 = self.int_type(8)
        return self.m.llvm.getelementptr(self.ir.Type.parse("!llvm.ptr<3>"), self.smem_base(), [byte_offset],
                                         [_DYNAMIC_INDEX], i8, 0)

    def smem_store(self, value, byte_offset) -> None:
        if self.fp8_of(value) is not None:  # LLVM has no fp8 type: memory holds its byte
            value = self.bitcast(value, self.int_type(8))
        self.m.llvm.store(value, self.smem_ptr(byte_offset))

    def smem_load(self, t, byte_offset):
        if str(t) in _FP8:
            return self.bitcast(self.m.llvm.load(self.int_type(8), self.smem_ptr(byte_offset)), t)
        return self.m.llvm.load(t, self.smem_ptr(byte_offset))

    # -- floating point
    def fp8_of(self, x) -> "dtypes.DType | None":
        """The fp8 dtype of an MLIR value, None if it is not fp8."""
        return _FP8.get(str(x.type))

    def fbinary(self, kind: str, a, b):
        arith = self.m.arith
        fp8 = self.fp8_of(a)
        if fp8 is not None:  # in f32, rounded once
            f32 = dtypes.float32
            return self.cast(self.fbinary(kind, self.cast(a, fp8, f32), self.cast(b, fp8, f32)), f32, fp8)
        if kind in ("min", "max") and str(a.type) == "f64":
            return self._f64_extremum(kind, a, b)
        return {"add": arith.addf, "sub": arith.subf, "mul": arith.mulf, "div": arith.divf,
                "min": arith.minimumf, "max": arith.maximumf}[kind](a, b)

    def _f64_extremum(self, kind: str, a, b):
        """max or min of two float64 values: NaN where either is; of +0 and -0, either (torch's CPU maximum gives
        the first or the second, as its loop is vectorized or not). sm_90 has no max.NaN.f64, and llvm.maximum.f64
        orders the zeros too, in 9 PTX instructions (4 selects of register pairs), where a compare or'd with a NaN
        test and one select do."""
        first = self.ori(self.cmpf("OGT" if kind == "max" else "OLT", a, b), self.cmpf("UNO", a, a))
        return self.select(first, a, b)

    def ibinary(self, kind: str, a, b, signed: bool):
        """Integer arithmetic on the operands' width, with PTX's answers where LLVM's would be poison: x // 0 is
        all ones and x % 0 is x, MIN // -1 wraps, a shift by the width or more (an amount read unsigned) shifts
        everything out. The guards fold away where the divisor or amount is a constant in range."""
        arith = self.m.arith
        if kind in ("floordiv", "mod", "shl", "shr"):
            return self._guarded(kind, a, b, signed)
        table = {"add": arith.addi, "sub": arith.subi, "mul": arith.muli, "and": arith.andi, "or": arith.ori,
                 "xor": arith.xori, "shl": arith.shli,
                 "floordiv": arith.divsi if signed else arith.divui, "mod": arith.remsi if signed else arith.remui,
                 "min": arith.minsi if signed else arith.minui, "max": arith.maxsi if signed else arith.maxui,
                 "shr": arith.shrsi if signed else arith.shrui}
        return table[kind](a, b)

    def _guarded(self, kind: str, a, b, signed: bool):
        arith = self.m.arith
        t = a.type
        const = lambda v: arith.constant(t, v)  # noqa: E731
        if kind in ("shl", "shr"):
            width = self.ir.IntegerType(t).width
            if width == 64:
                # PTX's shl/shr.b64 take a 32-bit amount. LLVM folded a guard around arith's shift into PTX's
                # clamp of the amount to 64 but truncated the amount first (1 << (1 + INT64_MIN) shifted by 1),
                # and ptxas folds a constant amount of 64 as 0 (35 << -1 gave 35 on an H200, fuzz seed 51045): the
                # shift is inline PTX that LLVM cannot rewrite, given an amount below 64, and the guard selects
                # what an amount of 64 or more leaves (0, or a signed value's sign).
                out_of_range = self.cmpi("uge", b, const(64))
                amount = self.trunc(self.select(out_of_range, const(63 if kind == "shr" and signed else 0), b), 32)
                op = "shl.b64" if kind == "shl" else "shr.s64" if signed else "shr.u64"
                shifted = self.asm(f"{op} $0, $1, $2;", "=l,l,r", [a, amount], [t])[0]
                return shifted if kind == "shr" and signed else self.select(out_of_range, const(0), shifted)
            out_of_range = self.cmpi("uge", b, const(width))
            amount = self.select(out_of_range, const(0), b)
            if kind == "shl":
                return self.select(out_of_range, const(0), arith.shli(a, amount))
            if signed:  # everything shifted out leaves copies of the sign
                return arith.shrsi(a, self.select(out_of_range, const(width - 1), amount))
            return self.select(out_of_range, const(0), arith.shrui(a, amount))
        zero = self.cmpi("eq", b, const(0))
        special = self.ori(zero, self.cmpi("eq", b, const(-1))) if signed else zero
        safe = self.select(special, const(1), b)
        if kind == "floordiv":  # b == -1: the quotient is -a (wrapping for MIN)
            q = (arith.divsi if signed else arith.divui)(a, safe)
            q = self.select(self.cmpi("eq", b, const(-1)), self.subi(const(0), a), q) if signed else q
            return self.select(zero, const(-1), q)
        r = (arith.remsi if signed else arith.remui)(a, safe)  # b == -1 leaves no remainder; b == 0 leaves a
        return self.select(zero, a, r)

    def f32_asm(self, instr: str, x):
        f32 = self.ir.F32Type.get()
        return self.asm(f"{instr} $0, $1;", "=f,f", [x], [f32])[0]

    def fma(self, a, b, c, bits: int = 32):
        """a * b + c in f32 (or f64), rounded once."""
        reg = "d" if bits == 64 else "f"
        return self.asm(f"fma.rn.f{bits} $0, $1, $2, $3;", f"={reg},{reg},{reg},{reg}", [a, b, c], [a.type])[0]

    def libdevice(self, name: str, args: Sequence[Any], result_type):
        """Call a libdevice function (declared on first use; libdevice is linked when any is used)."""
        if name not in self.libdevice_decls:
            arg_types = ", ".join(str(a.type) for a in args)
            decl = self.ir.Operation.parse(f"llvm.func @{name}({arg_types}) -> {result_type}")
            self.ir.InsertionPoint.at_block_begin(self.gpu_block).insert(decl)
            self.libdevice_decls.add(name)
        return self.m.llvm.call(result_type, list(args), [], [], callee=name)

    def cast(self, x, src: DType, dst: DType):
        """Convert between dtypes: floats round to nearest even (fp8 saturates finite: cvt.rn.satfinite), floats
        to integers truncate toward zero (saturating, NaN to 0), integers extend by the source's signedness."""
        arith = self.m.arith
        if src == dst:
            return x
        f32 = dtypes.float32
        if src.mlir in _FP8:  # fp8 widens exactly to f16, then converts from there
            return self.cast(self._from_fp8(x, src), dtypes.float16, dst)
        if dst.mlir in _FP8:
            return self._to_fp8(self.cast(x, src, f32) if src != f32 else x, dst)
        t = self.type(dst)
        if dst == dtypes.bool_:
            zero = self.const(0, src)
            return self.cmpf("UNE", x, zero) if src.is_float else self.cmpi("ne", x, zero)
        if src.is_float and dst.is_float:
            if src.bits == dst.bits:  # f16 <-> bf16: exactly to f32, then rounded once
                return arith.truncf(t, arith.extf(self.type(f32), x))
            if src == dtypes.bfloat16 and dst.bits > 16:
                wide = self._bf16_to_f32(x)
                return wide if dst == f32 else arith.extf(t, wide)
            return arith.extf(t, x) if dst.bits > src.bits else arith.truncf(t, x)
        if src.is_float:
            return self._float_to_int(x if src.bits >= 32 else arith.extf(self.type(f32), x),
                                      src if src.bits >= 32 else f32, dst)
        if dst.is_float:
            return arith.sitofp(t, x) if src.is_signed else arith.uitofp(t, x)
        if dst.bits > src.bits:
            return arith.extsi(t, x) if src.is_signed else arith.extui(t, x)
        if dst.bits < src.bits:
            return arith.trunci(t, x)
        return x

    def _bf16_to_f32(self, x):
        """A bf16 widened to f32 exactly, as its bits shifted up by 16; where it was unpacked from a loaded 32-bit
        pair, from the word itself (the high half masked, the low shifted: an instruction each), where
        cvt.f32.bf16 of the unpacked halves took ptxas three for the pair (bf16 layernorm rows of 50257: 18
        instructions an element, 1.5 of them this)."""
        arith, i32 = self.m.arith, self.int_type(32)
        packed = self.unpacked_from(x)
        if packed is None:
            bits = arith.shli(arith.extui(i32, self.bitcast(x, self.int_type(16))), self.i32(16))
        elif packed[1] == 0:
            bits = arith.shli(packed[0], self.i32(16))
        else:
            bits = arith.andi(packed[0], self.i32(-65536))
        return self.bitcast(bits, self.type(dtypes.float32))

    def _float_to_int(self, x, src: DType, dst: DType):
        """cvt.rzi to the destination's own width: toward zero, saturated to its range, NaN to 0 (arith's
        fptosi is poison out of range, and LLVM converts to i8 through s16, wrapping instead of saturating). The
        hardware's cvt gives NaN the most negative integer (H100: s32 from f64, s64 from f32): a select makes it
        0, as the interpreter and the language say."""
        width = max(dst.bits, 16)
        kind = f"{'s' if dst.is_signed else 'u'}{dst.bits}"
        regs = {16: "h", 32: "r", 64: "l"}
        y = self.asm(f"cvt.rzi.{kind}.f{src.bits} $0, $1;", f"={regs[width]},{'f' if src.bits == 32 else 'd'}", [x],
                     [self.int_type(width)])[0]
        zero = self.m.arith.constant(self.int_type(width), self.ir.IntegerAttr.get(self.int_type(width), 0))
        y = self.select(self.m.arith.cmpf(self.m.arith.CmpFPredicate.UNO, x, x), zero, y)
        return self.trunc(y, dst.bits) if dst.bits < width else y

    def _to_fp8(self, x32, dst: DType):
        """f32 → fp8: one cvt converts a pair (here the pair 0, x; x lands in the low byte)."""
        zero = self.const(0.0, dtypes.float32)
        pair = self.asm(f"cvt.rn.satfinite.{_FP8_PTX[dst.name]}.f32 $0, $1, $2;", "=h,f,f", [zero, x32],
                        [self.int_type(16)])[0]
        return self.bitcast(self.trunc(pair, 8), self.type(dst))

    def _from_fp8(self, x, src: DType):
        """fp8 → f16, exactly (the pair's high byte is 0)."""
        byte = self.zext(self.bitcast(x, self.int_type(8)), 16)
        pair = self.asm(f"cvt.rn.f16x2.{_FP8_PTX[src.name]} $0, $1;", "=r,h", [byte], [self.int_type(32)])[0]
        return self.bitcast(self.trunc(pair, 16), self.type(dtypes.float16))

    # -- warp shuffles
    def shfl(self, x, kind: str, offset):
        """x from lane `offset` below this one ("up"), above it ("down"), lane ^ offset ("bfly") or lane `offset`
        ("idx"), across the whole warp; a lane with no such lane keeps its own x. `offset`: an int, or an i32
        value."""
        ir = self.ir
        offset = self.i32(offset) if isinstance(offset, int) else offset
        if str(x.type) in ("f64", "i64"):  # shfl.sync moves a 32-bit register: a 64-bit value goes as two halves
            return self.joined(*(self.shfl(h, kind, offset) for h in self.halves(x)), x.type)
        attr = ir.Attribute.parse(f"#nvvm<shfl_kind {kind}>")
        clamp = 0 if kind == "up" else 0x1F  # "up" counts from lane 0, the others up to lane 31
        return self.m.nvvm.shfl_sync(self.i32(-1), x, offset, self.i32(clamp), attr, results=[x.type])

    def shfl_bfly(self, x, offset: int):
        return self.shfl(x, "bfly", offset)

    def shfl_idx(self, x, lane):
        """x from lane `lane` (an i32 value, any lane of the warp)."""
        return self.shfl(x, "idx", lane)


class Index:
    """An i32 MLIR value with Python's integer operators, so that index arithmetic written for ints (tiles.py)
    emits the same arithmetic in a kernel. Indices are non-negative: // % >> are the unsigned operations.
    Python ints mix in as constants."""

    def __init__(self, e: Emitter, value):
        self.e = e
        self.value = value

    def _v(self, x):
        return x.value if isinstance(x, Index) else self.e.i32(x) if isinstance(x, int) else x

    def _op(self, fn, a, b) -> "Index":
        return Index(self.e, fn(self._v(a), self._v(b)))

    def __add__(self, o): return self._op(self.e.addi, self, o)
    def __radd__(self, o): return self._op(self.e.addi, o, self)
    def __mul__(self, o): return self._op(self.e.muli, self, o)
    def __rmul__(self, o): return self._op(self.e.muli, o, self)
    def __floordiv__(self, o): return self._op(self.e.divui, self, o)
    def __mod__(self, o): return self._op(self.e.remui, self, o)
    def __and__(self, o): return self._op(self.e.andi, self, o)
    def __xor__(self, o): return self._op(self.e.m.arith.xori, self, o)
    def __lshift__(self, o): return self._op(self.e.m.arith.shli, self, o)
    def __rshift__(self, o): return self._op(self.e.m.arith.shrui, self, o)

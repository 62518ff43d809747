"""GMEM windows: Load and Store of a window of static sizes at runtime starts in a tensor argument.

Each thread moves the elements its layout gives it. Consecutive elements of a register's vector that are
contiguous in memory go as one access of up to 16 bytes when the launch's specialization proves it legal:
unit last stride, base and row strides aligned, the window's start and the last dimension's size divisible
by the access width (so that one bounds check covers the whole access). Every access is predicated on the
window being inside the tensor: ragged edges need no code from the user, and elements outside read as zero.
A load is a free anchor for layout inference: it can deliver any layout its users need.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import dtypes, infer, interpret, ir, lower
from ..dtypes import DType
from ..errors import Loc, Rule
from ..interpret import numerics
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, RefType, ScalarType, Value, check, is_int_scalar
from ..layouts import LayoutError, SplatLayout, TiledLayout, blocked
from ..lower.context import LoweredRef, element_offsets, num_elems, splat_to
from .control import For
from .elementwise import Binary, Cast
from .program import Constant


class _GmemAccess(Op):
    """Shared shape logic of Load and Store: a window of static `sizes` at runtime `starts`; squeezed dims
    (integer indices) are dropped from the register array's shape."""

    @property
    def ref(self) -> Value:
        return self.operands[0]

    def _init_window(self, sizes: tuple[int, ...], squeeze: tuple[bool, ...]):
        self.sizes = sizes
        self.squeeze = squeeze

    @property
    def window_shape(self) -> tuple[int, ...]:
        return tuple(s for s, q in zip(self.sizes, self.squeeze) if not q)

    def attrs(self):
        return {"sizes": self.sizes, "squeeze": tuple(int(q) for q in self.squeeze)}

    def _verify_window(self, ref: Value, starts: Sequence[Value]):
        check(isinstance(ref.type, RefType) and ref.type.space == "gmem", self, "expected a GMEM reference")
        check(len(starts) == ref.type.rank == len(self.sizes), self,
               f"a reference of rank {ref.type.rank} needs {ref.type.rank} indices, got {len(starts)}")
        for s in starts:
            check(is_int_scalar(s), self, f"indices must be integer scalars, got {s.type}")


class Load(_GmemAccess):
    """Elements outside the tensor read as zero."""

    name = "load"
    free_anchor = True

    def __init__(self, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...], squeeze: tuple[bool, ...],
                 loc: Loc | None):
        shape = tuple(s for s, q in zip(sizes, squeeze) if not q)
        rtype = ArrayType(shape, ref.dtype) if shape else ScalarType(ref.dtype)
        super().__init__([ref, *starts], [rtype], loc)
        self._init_window(sizes, squeeze)

    @property
    def starts(self) -> list[Value]:
        return self.operands[1:]

    def verify(self):
        self._verify_window(self.ref, self.starts)


class Store(_GmemAccess):
    name = "store"

    def __init__(self, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...], squeeze: tuple[bool, ...],
                 value: Value, loc: Loc | None):
        super().__init__([ref, *starts, value], [], loc)
        self._init_window(sizes, squeeze)

    @property
    def starts(self) -> list[Value]:
        return self.operands[1:-1]

    @property
    def value(self) -> Value:
        return self.operands[-1]

    def verify(self):
        self._verify_window(self.ref, self.starts)
        shape = self.value.type.shape if self.value.is_array else ()
        check(shape == self.window_shape, self,
               f"storing an array of shape {shape} into a window of shape {self.window_shape}")
        check(self.value.dtype == self.ref.dtype, self,
               f"storing {self.value.dtype.name} into a {self.ref.dtype.name} reference; use .astype()")


infer.rule(Load)(infer.free_anchor_layout)
infer.rule(Store)(infer.no_arrays)


# ---------------------------------------------------------------------------------------------- lowering

def int_divisor(ctx: lower.Context, v: ir.Value) -> int:
    """The largest power of two (<= 16) known to divide integer scalar `v` at compile time."""
    return _divisor(ctx, v, 0)


def _divisor(ctx: lower.Context, v: ir.Value, depth: int) -> int:
    if depth > 16:
        return 1
    if v.id in ctx.specs and isinstance(ctx.specs[v.id], int):
        return ctx.specs[v.id]
    op = v.owner
    if isinstance(op, ir.Block) and isinstance(op.parent, For) and v is op.args[0]:
        loop = op.parent  # the induction variable: lower + i * step
        return min(_divisor(ctx, loop.operands[0], depth + 1), _divisor(ctx, loop.operands[2], depth + 1))
    if isinstance(op, Constant):
        n = abs(int(op.value))
        return 16 if n == 0 else min(16, n & -n)
    if isinstance(op, Cast):
        return _divisor(ctx, op.operands[0], depth + 1)
    if isinstance(op, Binary):
        a, b = (_divisor(ctx, x, depth + 1) for x in op.operands)
        if op.kind in ("add", "sub"):
            return min(a, b)
        if op.kind == "mul":
            return min(16, a * b)
        if op.kind == "shl" and isinstance(op.operands[1].owner, Constant):
            return min(16, a << int(op.operands[1].owner.value))
    return 1


def _access_width(ctx: lower.Context, op: Op, ref: LoweredRef, layout: TiledLayout, shape: tuple[int, ...]) -> int:
    rank = len(op.sizes)
    if not ref.spec.unit_stride or op.squeeze[rank - 1] or not shape or layout.vector_dim is None:
        return 1
    entries = layout.tiling.dim_strides(len(shape))
    vdim, vstride = entries[len(entries) + layout.vector_dim]
    if vdim != len(shape) - 1 or vstride != 1:
        return 1
    itemsize = ref.dtype.itemsize
    w = min(layout.vector_length, max(16 // itemsize, 1), max(ref.spec.align // itemsize, 1),
            int_divisor(ctx, op.starts[rank - 1]), ref.spec.size_div)
    # Every other tiled dim along the last axis must step in whole accesses.
    for (d, s), size in zip(entries, layout.tiled_shape(shape)):
        if d == len(shape) - 1 and size > 1 and s % w and s != 1:
            return 1
    return max(w, 1)


def _element_addresses(ctx: lower.Context, op: Op, ref: LoweredRef, layout, shape: tuple[int, ...]):
    """Per held element: (i64 byte address, i1 in-bounds predicate).

    Each thread's base address is computed once; an element's address is that base plus its offset in bytes,
    a constant along a contiguous last dimension (which ptxas folds into the access) and one product per
    distinct offset along the others. An element is in bounds when its index along every dimension is below
    that dimension's size (indices are unsigned there, so a negative start masks too)."""
    e = ctx.e
    rank = len(op.sizes)
    arr_dims = [d for d in range(rank) if not op.squeeze[d]]
    starts = [ctx.get(s) for s in op.starts]
    thread = ctx.thread_index(layout, shape) if shape else []
    base_idx = list(starts)
    for a, d in enumerate(arr_dims):
        base_idx[d] = e.addi(starts[d], thread[a])
    isz = ref.dtype.itemsize
    contiguous = ref.spec.unit_stride
    stride_bytes = [e.muli(ref.strides[d], e.i64(isz)) if not (d == rank - 1 and contiguous) else None
                    for d in range(rank)]
    base = ref.ptr
    for d in range(rank):
        idx64 = e.ext_i64(base_idx[d])
        base = e.addi(base, e.muli(idx64, e.i64(isz)) if stride_bytes[d] is None else e.muli(idx64, stride_bytes[d]))
    offsets = element_offsets(layout, shape) if shape else [()]
    steps: dict[tuple[int, int], Any] = {}  # (dim, offset) -> its i64 byte offset along a strided dim
    inside: dict[tuple[int, int], Any] = {}  # (dim, offset) -> i1
    out = []
    for off in offsets:
        by_dim = {d: off[arr_dims.index(d)] for d in arr_dims}
        addr, pred, constant = base, None, 0
        for d in range(rank):
            k = by_dim.get(d, 0)
            if (d, k) not in inside:
                idx = e.addi(base_idx[d], e.i32(k)) if k else base_idx[d]
                inside[(d, k)] = e.cmpi("ult", idx, ref.sizes[d])
            pred = inside[(d, k)] if pred is None else e.andi(pred, inside[(d, k)])
            if not k:
                continue
            if stride_bytes[d] is None:
                constant += k * isz
            else:
                if (d, k) not in steps:
                    steps[(d, k)] = e.muli(stride_bytes[d], e.i64(k))
                addr = e.addi(addr, steps[(d, k)])
        out.append((e.addi(addr, e.i64(constant)) if constant else addr, pred))
    return out


def _to_bits(e, x, dtype: DType):
    """An element as an integer of its storage width."""
    bits = dtype.storage_bits
    if dtype == dtypes.bool_:
        return e.zext(x, 8)
    if dtype.is_float:
        return e.bitcast(x, e.int_type(bits))
    return x


def from_bits(e, x, dtype: DType):
    if dtype == dtypes.bool_:
        return e.cmpi("ne", x, e.const(0, dtypes.int8))
    if dtype.is_float:
        return e.bitcast(x, e.type(dtype))
    return x


def pack_words(e, elems, dtype: DType) -> list:
    """Elements (one access) → 32-bit words (or one narrower integer for accesses under 32 bits)."""
    bits = dtype.storage_bits
    ints = [_to_bits(e, x, dtype) for x in elems]
    if bits == 64:
        words = []
        for x in ints:
            words.append(e.trunc(x, 32))
            words.append(e.trunc(e.m.arith.shrui(x, e.i64(32)), 32))
        return words
    per_word = 32 // bits
    if per_word == 1:
        return ints
    # Narrow elements go through a vector<per_word x iN> bitcast: one register move, not shifts and ors.
    return [e.pack_i32(ints[i:i + per_word]) for i in range(0, len(ints), per_word)]


def unpack_words(e, words, dtype: DType, count: int) -> list:
    bits = dtype.storage_bits
    if bits == 64:
        out = []
        for lo, hi in zip(words[0::2], words[1::2]):
            x = e.ori(e.zext(lo, 64), e.m.arith.shli(e.zext(hi, 64), e.i64(32)))
            out.append(from_bits(e, x, dtype))
        return out
    per_word = 32 // bits
    if per_word == 1:
        return [from_bits(e, w, dtype) for w in words][:count]
    out = [x for w in words for x in e.unpack_i32(w, bits)]
    return [from_bits(e, x, dtype) for x in out[:count]]


def _access_suffix(total_bits: int) -> tuple[str, int]:
    """The ld/st type suffix and the number of 32-bit registers for one access of `total_bits` (>= 32)."""
    n = total_bits // 32
    return (f".v{n}.b32" if n > 1 else ".b32"), n


def _load_access(ctx: lower.Context, addr, pred, dtype: DType, count: int) -> list:
    e = ctx.e
    total = count * dtype.storage_bits
    if total < 32:  # one or two narrow elements: a 16-bit register, no conversions around the access
        suffix = ".b16" if total == 16 else ".u8"
        half = e.asm(f"mov.b16 $0, 0; @$1 ld.global{suffix} $0, [$2];", "=h,b,l", [pred, addr], [e.int_type(16)],
                     side_effects=True)[0]
        return _unpack_narrow(e, half if total == 16 else e.trunc(half, 8), dtype, count)
    suffix, n = _access_suffix(total)
    outs = ", ".join(f"${i}" for i in range(n))
    dst = f"{{{outs}}}" if n > 1 else outs
    zero = " ".join(f"mov.b32 ${i}, 0;" for i in range(n))
    text = f"{zero} @${n} ld.global{suffix} {dst}, [${n + 1}];"
    constraints = ",".join(["=r"] * n + ["b", "l"])
    words = e.asm(text, constraints, [pred, addr], [e.int_type(32)] * n, side_effects=True)
    return unpack_words(e, words, dtype, count)


def _unpack_narrow(e, word, dtype: DType, count: int) -> list:
    bits = dtype.storage_bits
    out = []
    for j in range(count):
        x = e.m.arith.shrui(word, e.const(j * bits, _int_of(word, e))) if j else word
        if word.type != e.int_type(bits):
            x = e.trunc(x, bits)
        out.append(from_bits(e, x, dtype))
    return out


def _int_of(word, e) -> DType:
    width = e.ir.IntegerType(word.type).width
    return {8: dtypes.int8, 16: dtypes.int16, 32: dtypes.int32}[width]


def _store_access(ctx: lower.Context, addr, pred, elems, dtype: DType) -> None:
    e = ctx.e
    total = len(elems) * dtype.storage_bits
    if total < 32:  # one or two narrow elements, through a 16-bit register
        ints = [_to_bits(e, x, dtype) for x in elems]
        half = ints[0] if total == 16 and len(ints) == 1 else None
        if half is None:
            half = e.zext(ints[0], 16) if ints[0].type != e.int_type(16) else ints[0]
            for j, x in enumerate(ints[1:], 1):
                half = e.ori(half, e.m.arith.shli(e.zext(x, 16), e.const(j * dtype.storage_bits, dtypes.int16)))
        suffix = ".b16" if total == 16 else ".u8"
        e.asm_void(f"@$0 st.global{suffix} [$1], $2;", "b,l,h", [pred, addr, half])
        return
    suffix, n = _access_suffix(total)
    words = pack_words(e, elems, dtype)
    srcs = ", ".join(f"${i + 2}" for i in range(n))
    src = f"{{{srcs}}}" if n > 1 else srcs
    e.asm_void(f"@$0 st.global{suffix} [$1], {src};", ",".join(["b", "l"] + ["r"] * n), [pred, addr, *words])


@lower.rule(Load)
def _load(op: Load, ctx: lower.Context) -> None:
    ref: LoweredRef = ctx.get(op.ref)
    out = op.result
    dtype = ref.dtype
    if not out.is_array:
        ((addr, pred),) = _element_addresses(ctx, op, ref, None, ())
        ctx.set(out, _load_access(ctx, addr, pred, dtype, 1)[0])
        return
    layout, shape = out.layout, out.type.shape
    w = _access_width(ctx, op, ref, layout, shape)
    addrs = _element_addresses(ctx, op, ref, layout, shape)
    elems = []
    for i in range(0, len(addrs), w):
        addr, pred = addrs[i]
        elems.extend(_load_access(ctx, addr, pred, dtype, w))
    ctx.set(out, lower.Frag(layout, shape, dtype, elems))


@lower.rule(Store)
def _store(op: Store, ctx: lower.Context) -> None:
    ref: LoweredRef = ctx.get(op.ref)
    value = op.value
    dtype = ref.dtype
    e = ctx.e
    if not value.is_array:
        ((addr, pred),) = _element_addresses(ctx, op, ref, None, ())
        pred = e.andi(pred, e.cmpi("eq", ctx.wg_tid, e.i32(0)))
        _store_access(ctx, addr, pred, [ctx.get(value)], dtype)
        return
    frag = ctx.frag(value)
    shape = frag.shape
    if isinstance(frag.layout, SplatLayout):
        try:
            frag = splat_to(ctx, frag, blocked(shape, dtype))
        except LayoutError as err:
            raise op.error(str(err), rule=Rule.LAYOUT) from None
    layout = frag.layout
    w = _access_width(ctx, op, ref, layout, shape)
    addrs = _element_addresses(ctx, op, ref, layout, shape)
    primary = ctx.is_primary(layout)
    assert len(addrs) == num_elems(layout, shape)
    for i in range(0, len(addrs), w):
        addr, pred = addrs[i]
        _store_access(ctx, addr, e.andi(pred, primary), frag.elems[i:i + w], dtype)


# ---------------------------------------------------------------------------------------------- interpreter

def window_slices(shape: Sequence[int], starts: Sequence[int], sizes: Sequence[int]) -> tuple[tuple, tuple] | None:
    """The part of a window of `sizes` at `starts` inside a tensor of `shape`: (its slices in the tensor, its
    slices in the window), or None when none of it is inside. An index is inside when 0 <= i < size, which is
    the lowering's unsigned `i < size` test."""
    inner, outer = [], []
    for n, start, size in zip(shape, starts, sizes):
        lo, hi = max(start, 0), min(start + size, n)
        if lo >= hi:
            return None
        inner.append(slice(lo, hi))
        outer.append(slice(lo - start, hi - start))
    return tuple(inner), tuple(outer)


def _window(op: _GmemAccess, wg: Warpgroup) -> tuple[torch.Tensor, tuple | None]:
    ref = wg.get(op.ref, op)
    starts = [int(wg.scalar(s, op)) for s in op.starts]
    return ref, window_slices(ref.shape, starts, op.sizes)


@interpret.rule(Load)
def _interp_load(op: Load, wg: Warpgroup) -> None:
    ref, inside = _window(op, wg)
    out = torch.zeros(op.sizes, dtype=numerics.torch_dtype(op.ref.dtype))
    if inside is not None:
        out[inside[1]] = ref[inside[0]]
    wg.set(op.result, out.reshape(op.window_shape))


@interpret.rule(Store)
def _interp_store(op: Store, wg: Warpgroup) -> None:
    ref, inside = _window(op, wg)
    if inside is not None:
        ref[inside[0]] = wg.get(op.value, op).reshape(op.sizes)[inside[1]]

"""GMEM windows: Load and Store of a window of static sizes at runtime starts in a tensor argument.

Each thread moves the elements its layout gives it. Consecutive elements of a register's vector that are
contiguous in memory (a unit last stride) go as one access of up to 16 bytes:
- when the launch's specialization proves every such access aligned (base and row strides, the window's
  start), as plain vector accesses; a row whose length is not a multiple of the access ends inside one, which
  is loaded whole with the part past the end masked, and stored element by element;
- otherwise (a row of 4097 bf16 starts at a different offset in every 16-byte chunk) as aligned chunks with
  the bytes shifted into place at run time, at any row length, dtype and row stride (see below).
Every access is predicated on the window being inside the tensor: ragged edges need no code from the user, and
elements outside read as zero. A load never touches an aligned chunk of 16 bytes or less that holds no element
inside the tensor. A load is a free anchor for layout inference: it can deliver any layout its users need.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import torch

from .. import dtypes, infer, interpret, ir, lower
from ..dtypes import DType
from ..errors import Loc, Rule
from ..interpret import numerics
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, RefType, ScalarType, Value, check, is_int_scalar
from ..layouts import LANES_PER_WARP, LayoutError, SplatLayout, TiledLayout, blocked
from ..lower.context import LoweredRef, element_offsets, num_elems, splat_to
from ..lower.words import from_bits, funnel, merge_below, pack_words, slot, to_bits, unpack_words
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


def _vector_width(ctx: lower.Context, op: Op, ref: LoweredRef, layout: TiledLayout,
                  shape: tuple[int, ...]) -> tuple[int, int]:
    """(w, align): how many consecutive elements of a register's vector go as one access (1: one element per
    access), and the power of two of bytes that every such access's address is known to be a multiple of."""
    rank = len(op.sizes)
    itemsize = ref.dtype.itemsize
    if not ref.spec.unit_stride or op.squeeze[rank - 1] or not shape or layout.vector_dim is None:
        return 1, itemsize
    entries = layout.tiling.dim_strides(len(shape))
    vdim, vstride = entries[len(entries) + layout.vector_dim]
    if vdim != len(shape) - 1 or vstride != 1:
        return 1, itemsize
    w = min(layout.vector_length, max(16 // itemsize, 1))
    # Every other tiled dim along the last axis must step in whole accesses.
    for (d, s), size in zip(entries, layout.tiled_shape(shape)):
        if d == len(shape) - 1 and size > 1 and s % w and s != 1:
            return 1, itemsize
    align = min(16, ref.spec.align, int_divisor(ctx, op.starts[rank - 1]) * itemsize)
    if align < w * itemsize < 4:  # too narrow to shift within 32-bit words: narrower aligned accesses
        w = max(align // itemsize, 1)
    return w, max(align, itemsize)


@dataclasses.dataclass
class _Element:
    addr: Any  # i64 byte address
    inside: Any  # i1: the element is inside the tensor
    rows: Any  # i1: every index but the last is inside the tensor; None when there is none
    col: Any  # i32 index along the last dimension


def _element_addresses(ctx: lower.Context, op: Op, ref: LoweredRef, layout, shape: tuple[int, ...],
                       step: int = 1) -> list[_Element | None]:
    """Where each held element lives and whether it is inside the tensor (only every `step`-th one: None for
    the others, whose addresses and bounds a store works out where it needs them, not kept in registers).

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
    index: dict[tuple[int, int], Any] = {}  # (dim, offset) -> i32 index
    inside: dict[tuple[int, int], Any] = {}  # (dim, offset) -> i1
    rows_inside: dict[tuple[int, ...], Any] = {}  # offsets along every dim but the last -> i1
    out: list[_Element | None] = []
    for i, off in enumerate(offsets):
        if i % step:
            out.append(None)
            continue
        by_dim = {d: off[arr_dims.index(d)] for d in arr_dims}
        addr, constant = base, 0
        for d in range(rank):
            k = by_dim.get(d, 0)
            if (d, k) not in inside:
                index[(d, k)] = e.addi(base_idx[d], e.i32(k)) if k else base_idx[d]
                inside[(d, k)] = e.cmpi("ult", index[(d, k)], ref.sizes[d])
            if not k:
                continue
            if stride_bytes[d] is None:
                constant += k * isz
            else:
                if (d, k) not in steps:
                    steps[(d, k)] = e.muli(stride_bytes[d], e.i64(k))
                addr = e.addi(addr, steps[(d, k)])
        ks = tuple(by_dim.get(d, 0) for d in range(rank))
        if ks[:-1] not in rows_inside:
            rows_inside[ks[:-1]] = _all(e, [inside[(d, k)] for d, k in enumerate(ks[:-1])])
        rows, last = rows_inside[ks[:-1]], (rank - 1, ks[-1])
        out.append(_Element(e.addi(addr, e.i64(constant)) if constant else addr,
                            inside[last] if rows is None else e.andi(rows, inside[last]), rows, index[last]))
    return out


def _all(e, preds: Sequence[Any]) -> Any:
    """The conjunction of i1 values (None stands for true)."""
    out = None
    for p in preds:
        if p is not None:
            out = p if out is None else e.andi(out, p)
    return out


def _not(e, p) -> Any:
    return e.m.arith.xori(p, e.const_bool(True))


def _any_inside(e, rows, lo, hi, n) -> Any:
    """i1: some column of lo..hi (i32, lo <= hi, either may be negative) of a row is inside the tensor."""
    return _all(e, [rows, e.cmpi("sge", hi, e.i32(0)), e.cmpi("slt", lo, n)])


def _access_suffix(total_bits: int) -> tuple[str, int]:
    """The ld/st type suffix and the number of 32-bit registers for one access of `total_bits` (>= 32)."""
    n = total_bits // 32
    return (f".v{n}.b32" if n > 1 else ".b32"), n


def _load_words(e, addr, pred, n: int) -> list:
    """n 32-bit words from addr (aligned to 4n bytes), zeros where pred is false."""
    suffix, _ = _access_suffix(32 * n)
    outs = ", ".join(f"${i}" for i in range(n))
    dst = f"{{{outs}}}" if n > 1 else outs
    zero = " ".join(f"mov.b32 ${i}, 0;" for i in range(n))
    text = f"{zero} @${n} ld.global{suffix} {dst}, [${n + 1}];"
    return e.asm(text, ",".join(["=r"] * n + ["b", "l"]), [pred, addr], [e.int_type(32)] * n, side_effects=True)


def _store_bytes(e, addr, pred, data: Sequence[Any], nbytes: int) -> None:
    """Store `nbytes` (1, 2, 4, 8 or 16) at addr (aligned to them) where pred holds: data is nbytes // 4
    words, or one i16 holding 1 or 2 bytes."""
    if nbytes < 4:
        e.asm_void(f"@$0 st.global.{'b16' if nbytes == 2 else 'u8'} [$1], $2;", "b,l,h", [pred, addr, data[0]])
        return
    suffix, n = _access_suffix(8 * nbytes)
    srcs = ", ".join(f"${i + 2}" for i in range(n))
    src = f"{{{srcs}}}" if n > 1 else srcs
    e.asm_void(f"@$0 st.global{suffix} [$1], {src};", ",".join(["b", "l"] + ["r"] * n), [pred, addr, *data])


def _load_access(ctx: lower.Context, addr, pred, dtype: DType, count: int) -> list:
    e = ctx.e
    total = count * dtype.storage_bits
    if total < 32:  # one or two narrow elements: a 16-bit register, no conversions around the access
        suffix = ".b16" if total == 16 else ".u8"
        half = e.asm(f"mov.b16 $0, 0; @$1 ld.global{suffix} $0, [$2];", "=h,b,l", [pred, addr], [e.int_type(16)],
                     side_effects=True)[0]
        return _unpack_narrow(e, half if total == 16 else e.trunc(half, 8), dtype, count)
    return unpack_words(e, _load_words(e, addr, pred, total // 32), dtype, count)


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
        ints = [to_bits(e, x, dtype) for x in elems]
        half = ints[0] if total == 16 and len(ints) == 1 else None
        if half is None:
            half = e.zext(ints[0], 16) if ints[0].type != e.int_type(16) else ints[0]
            for j, x in enumerate(ints[1:], 1):
                half = e.ori(half, e.m.arith.shli(e.zext(x, 16), e.const(j * dtype.storage_bits, dtypes.int16)))
        _store_bytes(e, addr, pred, [half], total // 8)
        return
    _store_bytes(e, addr, pred, pack_words(e, elems, dtype), total // 8)


def _only_if(e, cond, emit: Callable[[], None]) -> None:
    """Emit what `emit` emits inside `if cond` (a branch: threads for which it is false skip it)."""
    if_op = e.m.scf.IfOp(cond, [], has_else=False)
    e.push(e.ir.InsertionPoint(if_op.then_block))
    try:
        emit()
        e.m.scf.yield_([])
    finally:
        e.pop()


# -- accesses whose alignment is known only at run time
# A row of 4097 bf16 starts 2 bytes further into a 16-byte chunk than the row before it. Its accesses still
# move whole aligned chunks: a load reads the chunks its elements straddle (the next one from the next lane,
# which read it anyway) and funnel-shifts its elements out of them; a store rotates its elements to where
# they sit in the chunks, takes the bytes of the chunk's start from the previous lane and stores whole chunks.
# What no whole chunk covers (the first and last chunk of a lane run, a row's ends) goes as naturally aligned
# pieces of 1 to 8 bytes, and elements partly outside the tensor one by one, behind a branch.

def _lane_links(layout: TiledLayout, shape: tuple[int, ...]) -> int:
    """A 32-bit mask with bit l set when lane l - 1 holds the register vector that ends right before lane l's
    (the same indices but the last, which is one vector length less). Lane offsets add to register and warp
    offsets, so one mask holds for every register and warp."""
    vl = layout.vector_length
    first = tuple(0 for _ in layout.registers_shape(shape))
    index = [layout.element_index(shape, lane, first, 0) for lane in range(LANES_PER_WARP)]
    mask = 0
    for lane in range(1, LANES_PER_WARP):
        a, b = index[lane - 1], index[lane]
        if a[:-1] == b[:-1] and a[-1] + vl == b[-1]:
            mask |= 1 << lane
    return mask


def _lane_bit(ctx: lower.Context, mask: int) -> Any:
    """i1: bit `lane` of a constant mask."""
    e = ctx.e
    return e.cmpi("ne", e.andi(e.m.arith.shrui(e.i32(mask), ctx.lane), e.i32(1)), e.i32(0))


def _runs(layout: TiledLayout, count: int, w: int) -> list[list[int]]:
    """The first element of each access, grouped by register (the accesses of a register follow each other
    in memory)."""
    vl = layout.vector_length
    return [list(range(r, r + vl, w)) for r in range(0, count, vl)]


def _skew(e, el: _Element, nbytes: int, itemsize: int) -> tuple[Any, Any]:
    """(bytes, elements) by which an access starts past an nbytes boundary."""
    skew = e.andi(e.trunc(el.addr, 32), e.i32(nbytes - 1))
    return skew, e.m.arith.shrui(skew, e.i32(itemsize.bit_length() - 1))


def _chunk(e, addr, nbytes: int) -> Any:
    return e.andi(addr, e.i64(-nbytes))


def _load_shifted(ctx: lower.Context, ref: LoweredRef, layout: TiledLayout, shape: tuple[int, ...], w: int,
                  align: int, els: list[_Element]) -> list:
    e = ctx.e
    dtype, isz = ref.dtype, ref.dtype.itemsize
    nbytes, n = w * isz, ref.sizes[-1]
    links = _lane_links(layout, shape) >> 1  # bit l: lane l + 1 holds the vector after lane l's
    next_linked = _lane_bit(ctx, links) if links else None
    zero = e.const(0, dtype)
    out = []
    for run in _runs(layout, len(els), w):
        skew, lead = _skew(e, els[run[0]], nbytes, isz)
        chunks = []
        for i in run:  # the chunk each access starts in: columns col - lead .. col - lead + w - 1
            lo = e.subi(els[i].col, lead)
            pred = _any_inside(e, els[i].rows, lo, e.addi(lo, e.i32(w - 1)), n)
            chunks.append(_load_words(e, _chunk(e, els[i].addr, nbytes), pred, nbytes // 4))
        last = els[run[-1]]
        lo = e.addi(e.subi(last.col, lead), e.i32(w))  # the chunk after: the last access's tail
        need = e.andi(e.cmpi("ne", skew, e.i32(0)), _any_inside(e, last.rows, lo, e.addi(last.col, e.i32(w - 1)), n))
        after = e.addi(_chunk(e, last.addr, nbytes), e.i64(nbytes))
        if next_linked is None:
            chunks.append(_load_words(e, after, need, nbytes // 4))
        else:
            from_next = [e.shfl(x, "down", 1) for x in chunks[0]]
            own = _load_words(e, after, e.andi(need, _not(e, next_linked)), nbytes // 4)
            chunks.append([e.select(next_linked, a, b) for a, b in zip(from_next, own)])
        for j, i in enumerate(run):
            vals = unpack_words(e, funnel(e, chunks[j], chunks[j + 1], skew, align), dtype, w)
            out.extend(e.select(els[i + k].inside, v, zero) for k, v in enumerate(vals))
    return out


def _store_shifted(ctx: lower.Context, ref: LoweredRef, layout: TiledLayout, shape: tuple[int, ...], w: int,
                   align: int, els: list[_Element], elems: list, primary) -> None:
    e = ctx.e
    dtype, isz = ref.dtype, ref.dtype.itemsize
    nbytes, n = w * isz, ref.sizes[-1]
    links = _lane_links(layout, shape)
    prev_linked = _lane_bit(ctx, links) if links else None
    next_linked = _lane_bit(ctx, links >> 1) if links >> 1 else None
    no = e.const_bool(False)
    for run in _runs(layout, len(els), w):
        skew, lead = _skew(e, els[run[0]], nbytes, isz)
        aligned = e.cmpi("eq", skew, e.i32(0))
        rotation = e.andi(e.subi(e.i32(nbytes), skew), e.i32(nbytes - 1))
        # Each access's bytes as they sit in memory: its head at [skew, nbytes) of its first chunk, its tail at
        # [0, skew) of the next.
        packed, rotated = [], []
        for i in run:
            packed.append(pack_words(e, elems[i:i + w], dtype))
            rotated.append(funnel(e, packed[-1], packed[-1], rotation, align))
        whole, full, chunks, spans = [], [], [], []
        for j, i in enumerate(run):
            el = els[i]
            spans.append(_span(e, el, n))
            lo, hi = spans[j]
            whole.append(_all(e, [el.rows, e.cmpi("sle", lo, e.i32(0)), e.cmpi("sge", hi, e.i32(w))]))
            # the elements before it in its first chunk, -lead .. -1, are inside
            before = _all(e, [el.rows, e.cmpi("sle", e.addi(lo, lead), e.i32(0)), e.cmpi("sge", hi, e.i32(0))])
            if j:
                prev, linked = rotated[j - 1], before
            elif prev_linked is not None:
                prev, linked = [e.shfl(x, "up", 1) for x in rotated[-1]], e.andi(prev_linked, before)
            else:
                prev, linked = None, no
            data = rotated[j] if prev is None else merge_below(e, prev, rotated[j], skew, align)
            full.append(_all(e, [whole[j], primary, e.ori(aligned, linked)]))
            chunks.append(_chunk(e, el.addr, nbytes))
            _store_bytes(e, chunks[j], full[j], data, nbytes)
        edges = []  # (head, tail, loose) of each access: what the whole chunks did not store
        for j, i in enumerate(run):
            if j + 1 < len(run):
                next_full = full[j + 1]
            elif next_linked is not None:
                flag = e.shfl(e.zext(full[0], 32), "down", 1)
                next_full = e.andi(next_linked, e.cmpi("ne", flag, e.i32(0)))
            else:
                next_full = no
            head = _all(e, [whole[j], primary, _not(e, full[j])])
            tail = _all(e, [whole[j], primary, _not(e, aligned), _not(e, next_full)])
            edges.append((head, tail, e.andi(_not(e, whole[j]), primary)))

        def pieces(run=run, skew=skew, packed=packed, rotated=rotated, chunks=chunks, edges=edges, spans=spans):
            for j, i in enumerate(run):
                head, tail, loose = edges[j]
                _store_pieces(e, chunks[j], rotated[j], skew, head, tail, nbytes, align)
                _store_elementwise(e, els[i], spans[j], loose, packed[j], w, isz)
        _only_if(e, functools.reduce(e.ori, [p for edge in edges for p in edge]), pieces)


def _span(e, first: _Element, n) -> tuple[Any, Any]:
    """(lo, hi): element k of the access that starts at `first` is inside its row when lo <= k < hi.

    Stores test their bounds this way, not as `col + k < n`: the compiler would match those indices with the
    ones a kernel computed for its own masks and keep all of them in registers until the store."""
    return e.subi(e.i32(0), first.col), e.subi(n, first.col)


def _store_elementwise(e, first: _Element, span: tuple[Any, Any], pred, words: list, w: int, itemsize: int) -> None:
    """Store the elements of an access (packed in words) that are inside the tensor, one by one, where pred
    holds. Their addresses are computed here, inside the branch that needs them."""
    lo, hi = span
    pred = _all(e, [pred, first.rows])
    for k in range(w):
        inside = e.andi(e.cmpi("sle", lo, e.i32(k)), e.cmpi("sgt", hi, e.i32(k)))
        _store_bytes(e, e.addi(first.addr, e.i64(k * itemsize)), e.andi(pred, inside),
                     slot(e, words, k * itemsize, itemsize), itemsize)


def _store_pieces(e, chunk, rotated: list, skew, head, tail, nbytes: int, align: int) -> None:
    """Store an access's head (bytes [skew, nbytes) of its chunk) where `head` holds and its tail (bytes
    [0, skew) of the next chunk) where `tail` holds, as naturally aligned pieces: the binary digits of their
    lengths, the head's smallest first, the tail's largest first."""
    head_bytes = e.subi(e.i32(nbytes), skew)
    p = align
    while p < nbytes:
        pos = e.addi(skew, e.andi(head_bytes, e.i32(p - 1)))
        _store_bytes(e, e.addi(chunk, e.ext_i64(pos)), e.andi(head, _bit_set(e, head_bytes, p)),
                     slot(e, rotated, pos, p), p)
        pos = e.andi(skew, e.i32(-2 * p))
        _store_bytes(e, e.addi(chunk, e.ext_i64(e.addi(pos, e.i32(nbytes)))), e.andi(tail, _bit_set(e, skew, p)),
                     slot(e, rotated, pos, p), p)
        p *= 2


def _bit_set(e, x, bit: int) -> Any:
    return e.cmpi("ne", e.andi(x, e.i32(bit)), e.i32(0))


@lower.rule(Load)
def _load(op: Load, ctx: lower.Context) -> None:
    ref: LoweredRef = ctx.get(op.ref)
    out = op.result
    dtype = ref.dtype
    e = ctx.e
    if not out.is_array:
        (el,) = _element_addresses(ctx, op, ref, None, ())
        ctx.set(out, _load_access(ctx, el.addr, el.inside, dtype, 1)[0])
        return
    layout, shape = out.layout, out.type.shape
    w, align = _vector_width(ctx, op, ref, layout, shape)
    els = _element_addresses(ctx, op, ref, layout, shape)
    if w > 1 and align < w * dtype.itemsize:
        elems = _load_shifted(ctx, ref, layout, shape, w, align, els)
    else:
        elems = []
        zero = e.const(0, dtype)
        for i in range(0, len(els), w):
            vals = _load_access(ctx, els[i].addr, els[i].inside, dtype, w)
            if ref.spec.size_div < w:  # a row that ends inside this access: the rest reads as zero
                vals = [v if not k else e.select(els[i + k].inside, v, zero) for k, v in enumerate(vals)]
            elems.extend(vals)
    ctx.set(out, lower.Frag(layout, shape, dtype, elems))


@lower.rule(Store)
def _store(op: Store, ctx: lower.Context) -> None:
    ref: LoweredRef = ctx.get(op.ref)
    value = op.value
    dtype = ref.dtype
    e = ctx.e
    if not value.is_array:
        (el,) = _element_addresses(ctx, op, ref, None, ())
        _store_access(ctx, el.addr, e.andi(el.inside, e.cmpi("eq", ctx.wg_tid, e.i32(0))), [ctx.get(value)], dtype)
        return
    frag = ctx.frag(value)
    shape = frag.shape
    if isinstance(frag.layout, SplatLayout):
        try:
            frag = splat_to(ctx, frag, blocked(shape, dtype))
        except LayoutError as err:
            raise op.error(str(err), rule=Rule.LAYOUT) from None
    layout = frag.layout
    w, align = _vector_width(ctx, op, ref, layout, shape)
    els = _element_addresses(ctx, op, ref, layout, shape, step=w)
    primary = ctx.is_primary(layout)
    assert len(els) == num_elems(layout, shape)
    if w > 1 and align < w * dtype.itemsize:
        _store_shifted(ctx, ref, layout, shape, w, align, els, frag.elems, primary)
        return
    if ref.spec.size_div >= w:  # every access is wholly inside a row or wholly outside
        for i in range(0, len(els), w):
            _store_access(ctx, els[i].addr, e.andi(els[i].inside, primary), frag.elems[i:i + w], dtype)
        return
    # A row may end inside an access: whole accesses go as one store, the others element by element.
    loose, packed, spans = [], [], []
    n, isz = ref.sizes[-1], dtype.itemsize
    for i in range(0, len(els), w):
        el = els[i]
        spans.append(_span(e, el, n))
        lo, hi = spans[-1]
        whole = _all(e, [el.rows, e.cmpi("sle", lo, e.i32(0)), e.cmpi("sge", hi, e.i32(w)), primary])
        packed.append(pack_words(e, frag.elems[i:i + w], dtype))
        _store_bytes(e, el.addr, whole, packed[-1], w * isz)
        loose.append(_all(e, [_not(e, whole), e.cmpi("slt", lo, e.i32(w)), e.cmpi("sgt", hi, e.i32(0)), primary]))

    def elementwise():
        for a, i in enumerate(range(0, len(els), w)):
            _store_elementwise(e, els[i], spans[a], loose[a], packed[a], w, isz)
    _only_if(e, functools.reduce(e.ori, loose), elementwise)


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

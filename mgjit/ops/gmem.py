"""GMEM windows: Load and Store of a window of static sizes at runtime starts in a tensor argument.

Each thread moves the elements its layout gives it. Consecutive elements of a register's vector that are
contiguous in memory (a unit last stride) go as one access of up to 16 bytes:
- when the launch's specialization proves every such access aligned (base and row strides, the window's
  start), as plain vector accesses; a row whose length is not a multiple of the access ends inside one, which
  is loaded whole with the part past the end masked, and stored element by element;
- otherwise, as aligned accesses of the alignment the specialization does prove where it is 4 bytes or more
  (the 4 f32 of a misaligned row one by one), and below that (a row of 4097 bf16 starts at a different offset
  in every 32-bit word) as aligned 32-bit words with the bytes shifted into place at run time, at any row
  length, dtype and row stride (mgjit/ops/gmem_access.py); loads of such rows anchor layouts of accesses that narrow
  (`anchored_access_bytes`), so a warp's lanes still move contiguous bytes.
Every access is predicated on the window being inside the tensor: ragged edges need no code from the user, and
elements outside read as zero (or as the load's `other`: `mgjit.load(x, index, other=-inf)`, selected only where
the window is not wholly inside; a window at a fixed or stepped start whose first 7/8 of columns are inside tests
only the rest). A load never touches an aligned chunk of 16 bytes or less that holds no element
inside the tensor. 16-bit elements with a fill join those paths as the words they were loaded in, so that a word
read whole stays one register (widened an instruction a half, a maximum two halves at a time). A load is a free
anchor for layout inference: it can deliver any layout its users need.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import torch

from .. import infer, interpret, ir, lower
from ..errors import Loc, Rule
from ..interpret import numerics
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, RefType, ScalarType, Value, check, is_int_scalar
from ..layouts import THREADS_PER_WARPGROUP, LayoutError, SplatLayout, TiledLayout, blocked
from ..lower.context import LoweredRef, element_offsets, num_elems, splat_to
from ..lower.words import pack_words, unpack_words
from ..specialize import TensorSpec
from .control import For
from .elementwise import Binary, Cast
from .gmem_flat import stages, store_staged, warp_rows
from .gmem_access import (_all, _Element, _load_access, _span, _store_access, _store_bytes, _store_shuffled_words,
                          _store_elementwise, _store_unaligned_access, _store_whole_or_elementwise,
                          _word_loads, _WordBases, fill_bits, lanes_along_rows, word_links)
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
    """Elements outside the tensor read as `other` (zero unless `mgjit.load(x, index, other=v)` says)."""

    name = "load"
    free_anchor = True

    def __init__(self, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...], squeeze: tuple[bool, ...],
                 loc: Loc | None, other: int | float = 0):
        shape = tuple(s for s, q in zip(sizes, squeeze) if not q)
        rtype = ArrayType(shape, ref.dtype) if shape else ScalarType(ref.dtype)
        super().__init__([ref, *starts], [rtype], loc)
        self._init_window(sizes, squeeze)
        self.other = other

    @property
    def fills_zero(self) -> bool:
        """Elements outside read as +0 (what a predicated-off access leaves): no select is needed."""
        return self.other == 0 and math.copysign(1.0, self.other) > 0

    def attrs(self):
        return super().attrs() if self.fills_zero else {**super().attrs(), "other": self.other}

    @property
    def starts(self) -> list[Value]:
        return self.operands[1:]

    def verify(self):
        self._verify_window(self.ref, self.starts)


class Store(_GmemAccess):
    """`staged`: through shared memory where it can be (ops/gmem_flat.py); a lowering choice, the same values."""

    name = "store"

    def __init__(self, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...], squeeze: tuple[bool, ...],
                 value: Value, loc: Loc | None, staged: bool = False):
        super().__init__([ref, *starts, value], [], loc)
        self._init_window(sizes, squeeze)
        self.staged = staged

    def attrs(self):
        return {**super().attrs(), "staged": True} if self.staged else super().attrs()

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


# Narrowed accesses (4 bytes of bf16 a lane) leave a warp 64 columns a row: rows of 128 to 1024 spread over the
# warps took a cross-warp reduction each, a bar.sync and a round trip through shared memory, for as few as 128
# elements. Where each warp holds at least two rows, warps go along the rows instead (PTX instructions an element,
# 64 rows: softmax 127 34.1 -> 24.1, 511 28.3 -> 18.7; rmsnorm 255 25.6 -> 20.7; layernorm 511 32.7 -> 27.5; H200,
# kernel alone: softmax 127 0.59 -> 0.82, 255 0.55 -> 0.86, 511 0.72 -> 0.92, rmsnorm 255 0.69 -> 0.87, layernorm
# 255 0.55 -> 0.86). With fewer rows a norm's weights would be read by every warp: layernorm over 4 rows of 1023
# went 29.0 -> 32.4.
NARROW_ROWS_PER_WARP = 2
# Where a kernel stores no array of the rows' shape (cross-entropy: only a row's statistics leave it), a warp's
# lanes go along a narrowed row only as far as one 32-byte sector, or as leaves each thread this many rows, and
# along the rows after that: fewer shuffles a reduction (PTX instructions an element, cross-entropy 127 29.2 ->
# 16.9; H200, kernel alone, 127 0.45 -> 0.66, 255 0.59 -> 0.66; one row a thread, 255 0.59). Stored rows keep a
# warp's lanes along them: rows of odd length are not 32-byte aligned, so a store of 32 or 64 bytes a row
# straddles sectors (softmax 127 0.77 -> 0.49, 255 0.87 -> 0.75; rmsnorm 127 0.82 -> 0.50).
NARROW_THREAD_ROWS = 2
# Where a row is at most this many bytes wide and no array of the rows' shape is stored from registers (none is
# stored, or only staged: ops/gmem_flat.py), a lane holds a row's elements whole, up to 16 bytes an access (shifted
# into place where rows start inside a word): a row's reduction takes no shuffle, or one or two. H200, bf16
# cross-entropy, tuned (the rows held as two arrays, 9 as 8 + 1): 5 columns 0.65 -> 0.85 of copy bandwidth, 9 0.50
# -> 0.91, 17 0.88, 33 0.58 -> 0.80 (PTX instructions an element at 9: 35.3 -> 13.4); 128 bytes measured no better
# (65: 0.73 against 0.71). Rows stored from registers keep the narrowed accesses: softmax over bf16 rows of 9 held
# as 8 + 1 ran 0.47 stored from them, 0.37 from 16-byte ones (kernel alone).
SHORT_ROW_BYTES = 64


def anchored_access_bytes(spec: TensorSpec | None) -> int:
    """The accesses a load of a tensor so specialized anchors its layout in: 16 bytes, or for 8- and 16-bit rows
    that the specialization cannot align to 16 bytes (odd lengths), as wide as the alignment allows and at least
    a 32-bit word. The lanes of a warp then move contiguous bytes with each instruction. In the 16-byte layout a
    lane's narrowed or shifted accesses lie 16 bytes apart, so every instruction writes each 32-byte sector in
    pieces: rows of 4097 bf16 ran softmax and RMSNorm at 0.77 and 0.79 of copy bandwidth that way, 0.93 in 32-bit
    words (H100, benchmarks/RESULTS.md)."""
    if spec is None or not spec.unit_stride or spec.dtype.itemsize >= 4 or spec.align >= 16:
        return 16
    return max(spec.align, 4)


@infer.rule(Load)
def _infer_load(op: Load, inf: infer.Inference) -> None:
    """A free anchor, in accesses of `anchored_access_bytes`, or 16 bytes for short rows not stored
    (SHORT_ROW_BYTES)."""
    result = op.results[0]
    width = anchored_access_bytes(inf.specs.get(op.ref.id))
    if not result.is_array or id(op) in inf.overrides or width == 16:
        infer.free_anchor_layout(op, inf)
        return
    shape = result.type.shape
    stores = [o for o in inf.kernel.walk() if isinstance(o, Store) and o.window_shape == shape]
    if (len(shape) == 2 and shape[-1] * result.type.dtype.itemsize <= SHORT_ROW_BYTES
            and all(o.staged for o in stores)):
        infer.free_anchor_layout(op, inf)
        return
    stored = bool(stores)
    try:
        layout = blocked(result.type.shape, result.type.dtype, access_bytes=width, rows_per_warp=NARROW_ROWS_PER_WARP,
                         thread_rows=0 if stored else NARROW_THREAD_ROWS)
        inf.set_layout(result, layout, op)
    except LayoutError as e:
        raise op.error(str(e), rule=Rule.LAYOUT) from None


@infer.rule(Store)
def _infer_store(op: Store, inf: infer.Inference) -> None:
    """No array of its own; a stored array copied over threads is spread (`infer.spread_stored`)."""
    infer.spread_stored(op, inf, op.value)


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
                  shape: tuple[int, ...]) -> tuple[int, int, bool]:
    """(w, align, narrowed): how many consecutive elements of a register's vector go as one access (1: one
    element per access), the power of two of bytes that every such access's address is known to be a multiple
    of, and whether the alignment made the accesses narrower than the layout allows."""
    rank = len(op.sizes)
    itemsize = ref.dtype.itemsize
    if not ref.spec.unit_stride or op.squeeze[rank - 1] or not shape or layout.vector_dim is None:
        return 1, itemsize, False
    entries = layout.tiling.dim_strides(len(shape))
    vdim, vstride = entries[len(entries) + layout.vector_dim]
    if vdim != len(shape) - 1 or vstride != 1:
        return 1, itemsize, False
    w = min(layout.vector_length, max(16 // itemsize, 1))
    # Every other tiled dim along the last axis must step in whole accesses.
    for (d, s), size in zip(entries, layout.tiled_shape(shape)):
        if d == len(shape) - 1 and size > 1 and s % w and s != 1:
            return 1, itemsize, False
    align = min(16, ref.spec.align, int_divisor(ctx, op.starts[rank - 1]) * itemsize)
    narrowed = align < w * itemsize and (align >= 4 or w * itemsize < 4)
    if narrowed:
        # Aligned accesses of `align` bytes (4 f32 of a misaligned row one by one): they cost no shifting. Below
        # 4 bytes, accesses too narrow to shift within 32-bit words too.
        w = max(align // itemsize, 1)
    return w, max(align, itemsize), narrowed


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
                            inside[last] if rows is None else e.andi(rows, inside[last]), rows, index[last],
                            addr, constant))
    return out


def _window_inside(ctx: lower.Context, op: Op, ref: LoweredRef, columns: tuple[int, int]) -> Any:
    """i1, the same in every thread: the window's columns [lo, hi) (relative to its start along the last
    dimension), in every row of it, lie wholly inside the tensor. The end is compared as start <= n - hi:
    start + hi wraps past 2**31 - 1 (a start read from memory, 2147483647, passed for a window inside, and its
    unchecked loads read far past the tensor)."""
    e = ctx.e
    conds = []
    last = len(op.sizes) - 1
    for d, (start, size, n) in enumerate(zip(op.starts, op.sizes, ref.sizes)):
        lo, hi = columns if d == last else (0, size)
        s = ctx.get(start)
        conds += [e.cmpi("sge", s, e.i32(-lo)), e.cmpi("sle", s, e.subi(n, e.i32(hi)))]
    return _all(e, conds)


@functools.lru_cache(maxsize=256)
def column_split(layout: TiledLayout, shape: tuple[int, ...], w: int, window_columns: int,
                 squeezed_last: bool) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(hi, head, tail): the accesses of `w` elements of an array in `layout` (the Frag indices of their first
    elements) split into those whose columns, over all the warpgroup's threads, lie in the window's first
    `hi` <= 7/8 of its columns, and the rest. Where a row ends in the window's last eighth (rows of 4095 in a
    window of 4096), only the tail's accesses need bounds tests. (Each head or tail empty: no split.)"""
    every = tuple(range(0, num_elems(layout, shape), w))
    if squeezed_last or not shape:
        return window_columns, every, ()
    offsets = element_offsets(layout, shape)
    first = next(iter(layout.registers(shape)))
    spread = [layout.element_index(shape, tid, first, 0)[-1] for tid in range(THREADS_PER_WARPGROUP)]
    last = max(spread) - spread[0] + w  # past the columns of an access's threads, from its first thread's first
    bound = window_columns - window_columns // 8
    head = tuple(i for i in every if offsets[i][-1] + last <= bound)
    tail = tuple(i for i in every if offsets[i][-1] + last > bound)
    if min(spread) != spread[0] or not head or not tail:
        return window_columns, every, ()
    return max(offsets[i][-1] + last for i in head), head, tail


def _inside_or_checked(ctx: lower.Context, op: Op, ref: LoweredRef, layout: TiledLayout, shape: tuple[int, ...],
                       w: int, emit: Callable[[bool, tuple], list], types: list) -> list:
    """What `emit(checked, accesses)` yields for every access of `w` elements of an array in `layout` (in Frag
    order), under one branch that every thread takes alike: unchecked (no bounds test per access or element)
    where the whole window lies inside the tensor; else, where the head of its column_split does (a window at a
    fixed or stepped start), the head unchecked and the tail checked; else all checked. One branch, not one per
    group of columns: ptxas waits for a branch's loads where it joins, so loads under consecutive branches took a
    memory latency each (branches for columns up to 1/2, 3/4 and 7/8 of a window of 4096 and the rest: softmax
    over rows of 4097 0.94 -> 0.70 of copy bandwidth, H200)."""
    e = ctx.e
    hi, head, tail = column_split(layout, shape, w, op.sizes[-1], bool(op.squeeze[-1]))
    every = tuple(sorted(head + tail))
    if not _fixed_or_stepped(op.starts[-1]):
        tail = ()

    def split_checked() -> list:
        values = dict(zip(head, _per_access(emit(False, head), len(head))))
        values.update(zip(tail, _per_access(emit(True, tail), len(tail))))
        return [v for i in every for v in values[i]]

    def checked() -> list:
        if not tail:
            return emit(True, every)
        return e.if_else(_window_inside(ctx, op, ref, (0, hi)), types, split_checked, lambda: emit(True, every))

    return e.if_else(_window_inside(ctx, op, ref, (0, op.sizes[-1])), types, lambda: emit(False, every), checked)


def _fixed_or_stepped(start: Value) -> bool:
    """Whether a window's start is a constant or a loop's induction variable: a row's parts, or its chunks in
    turn. Only those windows take a head path. Where the start comes from the CTA (a row split over a cluster),
    the third path cost registers and no row ended in a head: softmax over rows of 50257 on 7 CTAs, 127 -> 159
    registers, 0.67 -> 0.55 of copy bandwidth; over rows of 8193 on 2, 0.79 -> 0.76 (H200)."""
    owner = start.owner
    return isinstance(owner, Constant) or (isinstance(owner, ir.Block) and isinstance(owner.parent, For)
                                           and start is owner.args[0])


def _per_access(values: list, accesses: int) -> list[list]:
    per = len(values) // accesses if accesses else 0
    return [values[k * per:(k + 1) * per] for k in range(accesses)]


@lower.rule(Load)
def _load(op: Load, ctx: lower.Context) -> None:
    ref: LoweredRef = ctx.get(op.ref)
    out = op.result
    dtype = ref.dtype
    e = ctx.e
    fill = e.const(op.other, dtype)  # what elements outside read as
    bits = 0 if op.fills_zero else fill_bits(op.other, dtype)  # its bits, which a predicated-off access reads
    if not out.is_array:
        (el,) = _element_addresses(ctx, op, ref, None, ())
        ctx.set(out, _load_access(ctx, el.addr, el.inside, dtype, 1, bits)[0])
        return
    layout, shape = out.layout, out.type.shape
    w, align, narrowed = _vector_width(ctx, op, ref, layout, shape)
    els = _element_addresses(ctx, op, ref, layout, shape)
    unaligned = w > 1 and align < w * dtype.itemsize
    ragged = ref.spec.size_div < w  # a row may end inside an access: the rest reads as zero

    def plain(checked: bool, accesses: Sequence[int]) -> list:
        elems = []
        for i in accesses:
            # an access whose first element is inside may reach past the row's end (ragged): the rest reads as fill
            limit = _span(e, els[i], ref.sizes[-1])[1] if checked and ragged else None
            elems.extend(_load_access(ctx, els[i].addr, els[i].inside if checked else None, dtype, w, bits, limit))
        return elems

    def shifted(checked: bool, accesses: Sequence[int]) -> list:
        part = [el for i in accesses for el in els[i:i + w]]
        if checked and w * dtype.itemsize <= 4:  # one word an access: element by element (see _store)
            return [_load_access(ctx, el.addr, el.inside, dtype, 1, bits)[0] for el in part]
        return _word_loads(ctx, ref, w, part, checked, fill, bases)

    emit = shifted if unaligned else plain
    bases = _WordBases(e, els if unaligned else ())  # shared by the paths of _inside_or_checked
    # Bounds tests per word or element, or a fill preset: skip them where the window (or its head) is inside.
    # Plain accesses that read zero outside test once per access and fill in the loaded words past a row's end
    # (_load_access), unbranched even where ragged: the paths around a norm's weight vector, which ends inside an
    # access, took 127 registers against 95 (layernorm over bf16 rows of 8191 on two warpgroups; 8193 over 2 CTAs
    # 128 -> 101, RMSNorm 0.68 -> 0.75 of copy bandwidth on an H200).
    if not op.fills_zero and dtype.bits == 16 and w % 2 == 0:
        # 16-bit elements with a fill (a maximum's -inf) join the paths as the words they were loaded in (pairs of
        # one access), so that a word read whole on the unchecked path stays one register: its halves widen to f32
        # an instruction each, and a maximum takes them two at a time (ops/reductions.py), where halves joined
        # apart took a repack each. Kernel alone, bf16, H200: cross-entropy 4095 0.87 -> 0.93, 8191 0.86 -> 0.92,
        # softmax 8191 on two warpgroups 0.79 -> 0.82 (4097 on one 0.93 -> 0.90, which the tuner does not pick).
        # Zero-filled loads (a norm's sum) kept apart: joined as words, rmsnorm 8191 ran 0.83 -> 0.78.
        def as_words(checked: bool, accesses: Sequence[int]) -> list:  # a word a pair, as loaded
            elems = emit(checked, accesses)
            return [word for k in range(0, len(elems), 2) for word in pack_words(e, elems[k:k + 2], dtype)]

        words = _inside_or_checked(ctx, op, ref, layout, shape, w, as_words, [e.int_type(32)] * (len(els) // 2))
        elems = unpack_words(e, words, dtype, len(els))
    elif unaligned or narrowed or not op.fills_zero:
        elems = _inside_or_checked(ctx, op, ref, layout, shape, w, emit, [e.type(dtype)] * len(els))
    else:
        elems = emit(True, range(0, len(els), w))
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
    w, align, narrowed = _vector_width(ctx, op, ref, layout, shape)
    isz = dtype.itemsize
    unaligned = w > 1 and align < w * isz
    ragged = ref.spec.size_div < w  # a row may end inside an access

    def registers() -> None:
        els = _element_addresses(ctx, op, ref, layout, shape, step=w)
        primary = ctx.is_primary(layout)
        assert len(els) == num_elems(layout, shape)

        bases = _WordBases(e, els if unaligned else ())  # shared by the paths of _inside_or_checked
        # 16-bit words of rows that start inside a word, each warp holding whole rows (several a warp): the aligned
        # word of a lane's second element and the next lane's first, joined by a shuffle, where two 2-byte halves
        # went. Kernel alone, bf16, H200: softmax 255 (16 rows a program) 0.87 -> 0.93, 1023 (8) 0.91 -> 0.97;
        # RMSNorm 255 0.87 -> 0.91, 1023 0.94 -> 0.96; layernorm 255 0.86 -> 0.88, 1023 0.83 -> 0.85; 127 unchanged
        # (its words lie in the checked tail). A row spread over warps (one a CTA) lost: softmax 4097 0.91 -> 0.87,
        # 8191 0.92 -> 0.86.
        shuffled = (unaligned and w == isz == 2 and not layout.replicated and lanes_along_rows(layout, shape, w)
                    and warp_rows(layout, shape) is not None)

        def emit(checked: bool, accesses: Sequence[int]) -> list:
            part = [el for i in accesses for el in els[i:i + w]]
            values = [v for i in accesses for v in frag.elems[i:i + w]]

            def whole(el: _Element, words: list, pred) -> None:
                if unaligned:
                    _store_unaligned_access(e, el, words, pred, isz, bases)
                else:
                    _store_bytes(e, el.addr, pred, words, w * isz)

            if not checked and shuffled:
                links = word_links(layout, shape, w, tuple(accesses))
                _store_shuffled_words(ctx, part[::w], [pack_words(e, values[i:i + w], dtype)[0]
                                                       for i in range(0, len(part), w)], links, bases)
            elif not checked:  # these accesses' columns are inside the tensor: every access is whole
                only = primary if layout.replicated else None
                for i in range(0, len(part), w):
                    whole(part[i], pack_words(e, values[i:i + w], dtype), only)
            elif unaligned and w * isz <= 4:
                # An access of one shifted word is two 2-byte stores unless its row starts on a word: element by
                # element, unbranched, with no fallback branch over all accesses (rows of 8193 bf16 split over 2
                # CTAs, the second's window crossing the row's end: softmax 0.65 -> 0.77 of copy bandwidth, H100).
                n = ref.sizes[-1]
                for i in range(0, len(part), w):
                    _store_elementwise(e, part[i], _span(e, part[i], n), primary,
                                       pack_words(e, values[i:i + w], dtype), w, isz)
            elif unaligned or ragged:  # whole accesses as one, the others element by element
                _store_whole_or_elementwise(ctx, ref, w, part, values, primary, whole)
            else:  # every access is wholly inside a row or wholly outside
                for i in range(0, len(part), w):
                    _store_access(ctx, part[i].addr, e.andi(part[i].inside, primary), values[i:i + w], dtype)
            return []

        if unaligned or narrowed or ragged:  # bounds tests per word or element: skipped where the window is inside
            _inside_or_checked(ctx, op, ref, layout, shape, w, emit, [])
        else:
            emit(True, range(0, len(els), w))

    if op.staged and stages(op.sizes, ref, layout, shape):
        store_staged(ctx, op, ref, frag, _element_addresses(ctx, op, ref, layout, shape), registers)
    else:
        registers()


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
    # The fill converted as fill_bits converts it for the GPU (torch.tensor rounds past the dtype's range, where
    # torch.full raises: other=-inf of float8_e4m3fn is -448 on both, 1e6 of float16 inf).
    fill = torch.tensor([op.other], dtype=numerics.torch_dtype(op.ref.dtype))
    out = fill.expand(op.sizes).clone()
    if inside is not None:
        wg.run.gmem.check_load(ref[inside[0]], wg.clock, op.loc, "this load", wg.cta.program_id)
        out[inside[1]] = ref[inside[0]]
    wg.set(op.result, out.reshape(op.window_shape))


@interpret.rule(Store)
def _interp_store(op: Store, wg: Warpgroup) -> None:
    ref, inside = _window(op, wg)
    if inside is not None:
        ref[inside[0]] = wg.get(op.value, op).reshape(op.sizes)[inside[1]]
        wg.gmem_store(ref[inside[0]], op.loc)

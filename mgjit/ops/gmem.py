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
elements outside read as zero (or as the load's `other`: `mgjit.load(x, index, other=-inf)`). Loads shifted into
place from words test per word or element, so they skip those tests under one branch where the window is wholly
inside (a window at a fixed or stepped start whose first 7/8 of columns are inside tests only the rest); plain
accesses test once an access, unbranched. A load never touches an aligned chunk of 16 bytes or less that holds no
element inside the tensor. 16-bit elements with a fill are joined as the words they were loaded in, so that a word
read whole stays one register (widened an instruction a half, a maximum two halves at a time). A load is a free
anchor for layout inference: it can deliver any layout its users need.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch

from .. import infer, interpret, lower
from ..errors import Loc, Rule
from ..interpret import numerics
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, RefType, ScalarType, Value, check, is_int_scalar
from ..layouts import LANES_PER_WARP, SECTOR_BYTES, LayoutError, SplatLayout, TiledLayout, blocked, warps_hold_rows
from ..lower.context import LoweredRef, num_elems, splat_to
from ..lower.words import pack_words, unpack_words
from ..specialize import TensorSpec
from .gmem_flat import stages, store_staged, warp_rows
from .arrays import Broadcast
from .reductions import Reduce
from .gmem_access import (_Element, _load_access, _span, _store_access, _store_bytes, _store_shuffled_words,
                          _store_elementwise, _store_unaligned_access, _store_whole_or_elementwise,
                          _word_loads, _WordBases, fill_bits, lanes_along_rows, word_links)
from .gmem_window import (LOWERED_WITH_LEADER, _element_addresses, _followers, _inside_or_checked, _LoadPaths,
                          _vector_width)


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


class StorePart(NamedTuple):
    """One array of a store and its own window: the store's, narrowed along the last axis to the array's columns
    (its start an IR value of the window's start plus the widths before it)."""

    starts: list[Value]
    sizes: tuple[int, ...]
    squeeze: tuple[bool, ...]
    value: Value


class Store(_GmemAccess):
    """`values`: one array (or scalar) of the window's shape, or several side by side along its last axis
    (`mgjit.store(x, index, (a, b))`, a row held as two arrays), each at its own column start (`column_starts`:
    the window's, then one IR value each for the others). `staged`: through shared memory where it can be
    (ops/gmem_flat.py), the arrays as one run; a lowering choice, the same values."""

    name = "store"

    def __init__(self, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...], squeeze: tuple[bool, ...],
                 values: Sequence[Value], loc: Loc | None, staged: bool = False,
                 column_starts: Sequence[Value] = ()):
        super().__init__([ref, *starts, *values, *column_starts], [], loc)
        self._init_window(sizes, squeeze)
        self.staged = staged
        self.count = len(values)

    def attrs(self):
        attrs = super().attrs()
        if self.count > 1:
            attrs["arrays"] = self.count
        return {**attrs, "staged": True} if self.staged else attrs

    @property
    def starts(self) -> list[Value]:
        return self.operands[1:1 + len(self.sizes)]

    @property
    def values(self) -> list[Value]:
        first = 1 + len(self.sizes)
        return self.operands[first:first + self.count]

    def parts(self) -> list[StorePart]:
        """Each array with its own window."""
        if self.count == 1:
            return [StorePart(self.starts, self.sizes, self.squeeze, self.values[0])]
        starts = self.starts
        columns = [starts[-1], *self.operands[1 + len(self.sizes) + self.count:]]
        return [StorePart([*starts[:-1], c], (*self.sizes[:-1], v.type.shape[-1]), self.squeeze, v)
                for c, v in zip(columns, self.values)]

    def verify(self):
        self._verify_window(self.ref, self.starts)
        check(len(self.operands) == 1 + len(self.sizes) + 2 * self.count - 1, self,
              f"expected a column start for each of the {self.count} arrays but the first, got "
              f"{len(self.operands) - 1 - len(self.sizes) - self.count}")
        for part in self.parts():
            window = tuple(s for s, q in zip(part.sizes, part.squeeze) if not q)
            shape = part.value.type.shape if part.value.is_array else ()
            check(shape == window, self, f"storing an array of shape {shape} into a window of shape {window}")
            check(part.value.dtype == self.ref.dtype, self,
                  f"storing {part.value.dtype.name} into a {self.ref.dtype.name} reference; use .astype()")
        if self.count > 1:
            check(not self.squeeze[-1] and sum(p.sizes[-1] for p in self.parts()) == self.sizes[-1], self,
                  f"arrays side by side fill the window's last axis of {self.sizes[-1]}, got widths "
                  f"{[p.sizes[-1] for p in self.parts()]}")


# Narrowed accesses (4 bytes of bf16 a lane) leave a warp 64 columns a row: rows of 128 to 1024 spread over the
# warps took a cross-warp reduction each, a bar.sync and a round trip through shared memory, for as few as 128
# elements. Where each warp holds at least two rows, warps go along the rows instead (PTX instructions an element,
# 64 rows: softmax 127 34.1 -> 24.1, 511 28.3 -> 18.7; rmsnorm 255 25.6 -> 20.7; layernorm 511 32.7 -> 27.5; H200,
# kernel alone: softmax 127 0.59 -> 0.82, 255 0.55 -> 0.86, 511 0.72 -> 0.92, rmsnorm 255 0.69 -> 0.87, layernorm
# 255 0.55 -> 0.86). With fewer rows a norm's weights would be read by every warp: layernorm over 4 rows of 1023
# went 29.0 -> 32.4.
NARROW_ROWS_PER_WARP = 2
# Where a kernel stores no array of the rows' shape (cross-entropy: only a row's statistics leave it) and its rows
# are not held a row a thread (ROW_ACCESS_LINES: where warps hold whole rows and no long vector is broadcast along
# them), a warp's lanes go along a narrowed row only as far as one 32-byte sector, or as leaves each thread this
# many rows, and along the rows after that: fewer shuffles a reduction (PTX instructions an element, cross-entropy
# 127 29.2 -> 16.9; H200, kernel alone, 127 0.45 -> 0.66, 255 0.59 -> 0.66; one row a thread, 255 0.59). Stored
# rows keep a warp's lanes along them: rows of odd length are not 32-byte aligned, so a store of 32 or 64 bytes a
# row straddles sectors (softmax 127 0.77 -> 0.49, 255 0.87 -> 0.75; rmsnorm 127 0.82 -> 0.50), except rows of at
# most SHORT_ROW_BYTES, where the narrowing pays for the straddling (H200, tuned, bf16 rows of 50: softmax 0.89 ->
# 1.00, RMSNorm 0.88 -> 0.97, layernorm 0.75 -> 0.90; 5, 17, 33, 65 and 127 within 0.01 either way).
NARROW_THREAD_ROWS = 2
# Where a row is at most this many bytes wide and no array of the rows' shape is stored from registers (none is
# stored, or only staged: ops/gmem_flat.py), a lane holds a row's elements whole, up to 16 bytes an access (shifted
# into place where rows start inside a word): a row's reduction takes no shuffle, or one or two. H200, bf16
# cross-entropy, tuned (the rows held as two arrays, 9 as 8 + 1): 5 columns 0.65 -> 0.85 of copy bandwidth, 9 0.50
# -> 0.91, 17 0.88, 33 0.58 -> 0.80 (PTX instructions an element at 9: 35.3 -> 13.4; at 64 bytes, 65 0.71, at 128
# 0.73). Softmax over rows of 65 held as 64 + 1, stored staged: 33.4 -> 19.1 PTX instructions an element at 128
# bytes (0.92 of copy bandwidth, tuned). Rows stored from registers keep the narrowed accesses: softmax over bf16
# rows of 9 held as 8 + 1 ran 0.47 stored from them, 0.37 from 16-byte ones (kernel alone).
SHORT_ROW_BYTES = 128


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


# Rows a kernel only reduces along their last axis (cross-entropy: a row's statistics alone leave it; or rows of at
# most a sector, stored staged) are held a row a thread where each warp holds whole rows: a warp's lanes go along a
# row in 16-byte accesses only as far as leaves each thread one row, and along the rows after that. A row's
# reduction then takes few shuffles or none, and a row's own work (its target's logit, its logsumexp, its
# one-column part) is done by few lanes, not repeated by 8 or 16. A warp's access still spans at most
# ROW_ACCESS_LINES lines of 128 bytes: a row of 128 bytes or more takes at least 4 lanes, a shorter one a lane
# for each sector. PTX instructions an element, bf16 cross-entropy, 64 rows of 65 held as 64 + 1: 15.4 -> 11.3;
# 128 aligned, 32 rows: 13.1 -> 7.5. H200, tuned (call 2 of the thirty-sixth session, bf16): cross-entropy 17 /
# 33 / 65 / 128 / 256 / 512 / 1024 0.87 / 0.80 / 0.74 / 0.83 / 0.78 / 0.75 / 0.82 -> 0.94 / 0.90 / 0.86 / 0.91 /
# 0.92 / 0.93 / 0.93; softmax, RMSNorm, layernorm over rows of 17 (staged) 0.96 / 0.94 / 0.88 -> 1.01 / 0.99 /
# 0.93. Staged rows of 65 held with 2 lanes a row lost (softmax 0.95 -> 0.76), as did float32 rows of 17 held a
# row a lane (a warp's access over 17 lines: 0.92 -> 0.88). Each vector broadcast along the rows (a norm's weight,
# a GEMV's activation row) costs a thread the columns it holds of a row; where those come to more than
# HELD_VECTOR_ELEMENTS, the rows keep their lanes along them: layernorm's weight, bias and padding mask over rows of
# 16 columns a lane come to 48 (0.88 -> 0.93 above); a decode GEMV's 4 rows of 2048 held a row a warp, 64 an
# activation row (77 registers -> 137 for one, 161 -> 253 for three).
ROW_ACCESS_LINES = 8
LINE_BYTES = 128
HELD_VECTOR_ELEMENTS = 48
# Aligned rows stored and reduced along them (softmax, the norms) that `blocked` would split over warps (512 bf16
# columns or more: 2 warps a row, 4 at 1024) are held whole by warps wherever each can hold WARP_ROWS of them
# (`_warp_rows_layout`). A row's reduction then stays in its warp, and a row held as arrays of several widths (800 as
# 512 + 256 + 32) reduces into row vectors of one layout, where the 512-column array's had another (converted
# through shared memory, a bar.sync each way). PTX instructions an element (tools/ptx_profile.py, bf16): softmax 800
# 19.7 -> 15.5 (4 rows a program), 16.5 -> 12.3 (8); layernorm 800 28.1 -> 25.4, 22.1 -> 18.5; float32 softmax 256
# 16.0 -> 10.2. H200, tuned, bf16: softmax 800 0.92 -> 1.02 of copy bandwidth, RMSNorm 800 and 1600 0.98 -> 1.02,
# layernorm 768 0.94 -> 1.01, 800 0.78 -> 0.97, 1600 0.85 -> 0.87; 512, 1024, 2304, 4096 and cross-entropy (held a
# row a thread) within 0.01. Float32 was not timed.
WARP_ROWS = 1


def _held_rows_layout(shape: tuple[int, ...], dtype, stores: list, users: list[Op]) -> TiledLayout | None:
    """The layout of loaded rows held a row a thread (ROW_ACCESS_LINES), or None where it does not apply; `users`:
    the kernel's reductions and broadcasts (and stores), `stores` those of an array of `shape`."""
    if len(shape) != 2 or not warps_hold_rows(shape, dtype, 16, 1):
        return None
    row_bytes = shape[-1] * dtype.itemsize
    if stores and not (row_bytes <= SECTOR_BYTES and all(o.staged for o in stores)):
        return None
    axes = {r.axes for r in users if isinstance(r, Reduce) and r.operands[0].type.shape == shape}
    if axes != {(1,)}:
        return None
    rows_an_access = ROW_ACCESS_LINES * LINE_BYTES // min(row_bytes, LINE_BYTES)
    layout = blocked(shape, dtype, rows_per_warp=1, thread_rows=1, row_lanes=max(LANES_PER_WARP // rows_an_access, 1))
    lanes = layout.tiling.tiles[1][-1] // layout.tiling.tiles[-1][-1]  # along a row
    return layout if _row_vectors_fit(shape, users, lanes) else None


def _warp_rows_layout(shape: tuple[int, ...], dtype, users: list[Op], stored: bool) -> TiledLayout | None:
    """The layout of 16-byte-aligned loaded rows reduced along them, each warp holding WARP_ROWS or more whole (their
    columns repeated in registers), where `blocked` would split them over warps, or, rows also `stored`
    (`_narrow_rows_layout`), leave warps holding copies; else None. Vectors broadcast along the rows cost a lane as
    in `_held_rows_layout`."""
    if len(shape) != 2:
        return None
    if (1,) not in {r.axes for r in users if isinstance(r, Reduce) and r.operands[0].type.shape == shape}:
        return None
    default = blocked(shape, dtype)
    if default.tiling.tiles[1][-1] >= shape[-1]:  # a warp already goes along whole rows
        return _narrow_rows_layout(shape, dtype, users) if stored and default.replicated else None
    if not warps_hold_rows(shape, dtype, 16, WARP_ROWS):
        return None
    return blocked(shape, dtype, rows_per_warp=WARP_ROWS) if _row_vectors_fit(shape, users, LANES_PER_WARP) else None


def _narrow_rows_layout(shape: tuple[int, ...], dtype, users: list[Op]) -> TiledLayout | None:
    """Where 16-byte accesses put several rows in a warp and leave warps holding copies (too few rows to go round:
    4 rows of 128 bf16 in two warps, twice), accesses narrow enough that a warp's lanes go along one row and every
    warp holds rows of its own (8 bytes a lane: each thread still makes one access), so that the rows' statistics
    land where a wider array's of the same rows do (a warp's rows: 1600 columns held as 1024 + 512 + 128, four rows
    a program, combined their three arrays' statistics and broadcast them back with no relayout); else None. H200,
    bf16, kernel alone (benchmarks/rows_ab.py, with `Broadcast.takes_any_layout`): layernorm 1600 four a program
    0.74 -> 0.96 of copy bandwidth, 800 0.79 -> 0.95, softmax 1600 0.86 -> 0.92. Rows only reduced
    (cross-entropy's) keep the copies: over 1600 columns four a program they ran 0.86 -> 0.82 so placed."""
    access = 8
    while access >= max(4, dtype.itemsize):
        if warps_hold_rows(shape, dtype, access, WARP_ROWS):
            layout = blocked(shape, dtype, access_bytes=access, rows_per_warp=WARP_ROWS)
            if not layout.replicated and layout.tiling.tiles[1][-1] >= shape[-1]:
                return layout if _row_vectors_fit(shape, users, LANES_PER_WARP) else None
        access //= 2
    return None


def _row_vectors_fit(shape: tuple[int, ...], users: list[Op], lanes: int) -> bool:
    """Whether the vectors `users` broadcast along rows of `shape` cost a lane at most HELD_VECTOR_ELEMENTS where
    `lanes` lanes go along a row (each holds a row's columns of each vector that its lanes hold)."""
    vectors = sum(1 for b in users if isinstance(b, Broadcast) and b.results[0].type.shape == shape and _along_rows(b))
    return vectors * shape[-1] // lanes <= HELD_VECTOR_ELEMENTS


def _along_rows(b: Broadcast) -> bool:
    """Whether a broadcast to 2D repeats a vector of a row's columns along the rows (w[None, :])."""
    src = dict(zip(b.dims, b.operands[0].type.shape))
    return src.get(1, 1) > 1 and src.get(0, 1) == 1


@infer.rule(Load)
def _infer_load(op: Load, inf: infer.Inference) -> None:
    """Rows held a row a thread (`_held_rows_layout`), else a free anchor, in accesses of `anchored_access_bytes`,
    or 16 bytes for short rows not stored (SHORT_ROW_BYTES)."""
    result = op.results[0]
    if not result.is_array or id(op) in inf.overrides:
        infer.free_anchor_layout(op, inf)
        return
    shape = result.type.shape
    users = [o for o in inf.kernel.walk() if isinstance(o, (Store, Reduce, Broadcast))]  # one walk for the three
    stores = [o for o in users if isinstance(o, Store) and any(v.is_array and v.type.shape == shape for v in o.values)]
    held = _held_rows_layout(shape, result.type.dtype, stores, users)
    if held is not None:
        inf.set_layout(result, held, op)
        return
    width = anchored_access_bytes(inf.specs.get(op.ref.id))
    if width == 16:
        warp_rows_layout = _warp_rows_layout(shape, result.type.dtype, users, bool(stores))
        if warp_rows_layout is None:
            infer.free_anchor_layout(op, inf)
        else:
            inf.set_layout(result, warp_rows_layout, op)
        return
    row_bytes = shape[-1] * result.type.dtype.itemsize
    if len(shape) == 2 and row_bytes <= SHORT_ROW_BYTES and all(o.staged for o in stores):
        infer.free_anchor_layout(op, inf)
        return
    # Rows stored from registers keep a warp's lanes along them unless they are short (NARROW_THREAD_ROWS).
    thread_rows = 0 if stores and row_bytes > SHORT_ROW_BYTES else NARROW_THREAD_ROWS
    try:
        layout = blocked(shape, result.type.dtype, access_bytes=width, rows_per_warp=NARROW_ROWS_PER_WARP,
                         thread_rows=thread_rows)
        inf.set_layout(result, layout, op)
    except LayoutError as e:
        raise op.error(str(e), rule=Rule.LAYOUT) from None


@infer.rule(Store)
def _infer_store(op: Store, inf: infer.Inference) -> None:
    """No array of its own; a stored array copied over threads is spread (`infer.spread_stored`)."""
    for value in op.values:
        infer.spread_stored(op, inf, value)


# ---------------------------------------------------------------------------------------------- lowering

def _load_paths(op: Load, ctx: lower.Context) -> _LoadPaths:
    ref: LoweredRef = ctx.get(op.ref)
    out = op.result
    dtype = ref.dtype
    e = ctx.e
    fill = e.const(op.other, dtype)  # what elements outside read as
    bits = 0 if op.fills_zero else fill_bits(op.other, dtype)  # its bits, which a predicated-off access reads
    layout, shape = out.layout, out.type.shape
    w, align, _ = _vector_width(ctx, op, ref, layout, shape)
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
    window = (ref, layout, shape, w)
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

        def finish_words(words: list) -> None:
            ctx.set(out, lower.Frag(layout, shape, dtype, unpack_words(e, words, dtype, len(els))))
        return _LoadPaths(unaligned, as_words, range(0, len(els), w), [e.int_type(32)] * (len(els) // 2),
                          finish_words, window)
    return _LoadPaths(unaligned, emit, range(0, len(els), w), [e.type(dtype)] * len(els),
                      lambda elems: ctx.set(out, lower.Frag(layout, shape, dtype, elems)), window)


@lower.rule(Load)
def _load(op: Load, ctx: lower.Context) -> None:
    """Plain accesses test once an access (a compare, and the fill preset) and take no branch: a branch's loads
    are waited for where it joins, so a row held as several arrays took a memory latency an array, each array's
    arithmetic scheduled before the next one's loads. Kernel alone, bf16, H200, four rows a program of 2048 + 128
    columns: cross-entropy 2100 0.82 -> 0.96, 2112 0.77 -> 0.95, softmax 2100 0.81 -> 1.01 (a Triton kernel
    reading such rows ran 0.96); one a program, cross-entropy 3000 (2048 + 1024) 0.89 -> 0.97, 5000 0.90 -> 0.98.
    Plain accesses reading zero outside fill the loaded words past a row's end (_load_access), even where ragged:
    the paths around a norm's weight vector, which ends inside an access, took 127 registers against 95 (layernorm
    over bf16 rows of 8191 on two warpgroups). Words shifted into place test per word or element, which cost more
    than the latency where unbranched (cross-entropy 1001 0.92 -> 0.74, 4097 0.91 -> 0.80): they skip the tests
    where the window (or its head) is inside, and the loads that follow them (`_followers`, a row's other arrays)
    go out in each of their paths, tested and unbranched, so that no path waits for its shift before they do."""
    if id(op) in ctx.analyses.setdefault(LOWERED_WITH_LEADER, set()):
        return
    if not op.result.is_array:
        ref: LoweredRef = ctx.get(op.ref)
        bits = 0 if op.fills_zero else fill_bits(op.other, ref.dtype)
        (el,) = _element_addresses(ctx, op, ref, None, ())
        ctx.set(op.result, _load_access(ctx, el.addr, el.inside, ref.dtype, 1, bits)[0])
        return
    paths = _load_paths(op, ctx)
    if not paths.shifted:
        paths.finish(paths.emit(True, paths.every))
        return
    group, constants = _followers(op, ctx)
    lower.lower_ops(ctx, constants)  # the followers' starts (lowered again where they stand: a constant each)
    followers = [_load_paths(f, ctx) for f in group]
    also = (lambda: [v for f in followers for v in f.emit(True, f.every)], [t for f in followers for t in f.types])
    values = _inside_or_checked(ctx, op, *paths.window, paths.emit, paths.types, also)
    paths.finish(values[:len(paths.types)])
    values = values[len(paths.types):]
    for f in followers:
        f.finish(values[:len(f.types)])
        values = values[len(f.types):]
    ctx.analyses[LOWERED_WITH_LEADER].update(id(f) for f in group)


@lower.rule(Store)
def _store(op: Store, ctx: lower.Context) -> None:
    """Each array from registers (`_store_registers`), or staged: all of them as one run where they can be."""
    ref: LoweredRef = ctx.get(op.ref)
    e = ctx.e
    parts = op.parts()
    if not parts[0].value.is_array:
        (el,) = _element_addresses(ctx, op, ref, None, ())
        _store_access(ctx, el.addr, e.andi(el.inside, e.cmpi("eq", ctx.wg_tid, e.i32(0))),
                      [ctx.get(parts[0].value)], ref.dtype)
        return
    frags = [_stored_frag(ctx, op, part.value, ref.dtype) for part in parts]

    def registers() -> None:
        for part, frag in zip(parts, frags):
            _store_registers(ctx, part, ref, frag)

    if op.staged and stages(op, ref, [frag.layout for frag in frags]):
        store_staged(ctx, op, ref, [(frag, _element_addresses(ctx, part, ref, frag.layout, frag.shape))
                                    for part, frag in zip(parts, frags)], registers)
    else:
        registers()


def _stored_frag(ctx: lower.Context, op: Store, value: Value, dtype) -> lower.Frag:
    """A stored array's registers; a splat's spread over the threads."""
    frag = ctx.frag(value)
    if isinstance(frag.layout, SplatLayout):
        try:
            frag = splat_to(ctx, frag, blocked(frag.shape, dtype))
        except LayoutError as err:
            raise op.error(str(err), rule=Rule.LAYOUT) from None
    return frag


def _store_registers(ctx: lower.Context, window: StorePart, ref: LoweredRef, frag: lower.Frag) -> None:
    """One array of a store into its window, each thread its own elements, in the widest accesses that the
    alignment allows (see the module)."""
    e = ctx.e
    dtype = ref.dtype
    layout, shape = frag.layout, frag.shape
    w, align, narrowed = _vector_width(ctx, window, ref, layout, shape)
    isz = dtype.itemsize
    unaligned = w > 1 and align < w * isz
    ragged = ref.spec.size_div < w  # a row may end inside an access
    els = _element_addresses(ctx, window, ref, layout, shape, step=w)
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
        _inside_or_checked(ctx, window, ref, layout, shape, w, emit, [])
    else:
        emit(True, range(0, len(els), w))


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


def _window(op: _GmemAccess, wg: Warpgroup, part: StorePart | None = None) -> tuple[torch.Tensor, tuple | None]:
    """(op's tensor, `window_slices` of its window or of one array's part of it)."""
    ref = wg.get(op.ref, op)
    window = part or op
    starts = [int(wg.scalar(s, op)) for s in window.starts]
    return ref, window_slices(ref.shape, starts, window.sizes)


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
    for part in op.parts():
        ref, inside = _window(op, wg, part)
        if inside is not None:
            ref[inside[0]] = wg.get(part.value, op).reshape(part.sizes)[inside[1]]
            wg.gmem_store(ref[inside[0]], op.loc)

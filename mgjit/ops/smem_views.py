"""Views of SMEM buffers: RefIndex (`buf[slot]`, also of barrier arrays), RefSlice (`tile[a:b]`,
`tile[:, mgjit.ds(i, 64)]`), RefTranspose (`tile.T`) and RefWindow (`tile.window(start, shape)`), each the same
bytes as the tile it is cut from, read and written through smem.py's addressing.

A view keeps what its tile's storage allows (`tiles.Tile.view`): slices start and end on whole units of it, and
`base_alignment` says what the SMEM offset of a view's first element is known to be a multiple of (TMA copies
need 128 bytes, swizzled MMA operands the swizzle's repeat). A window ignores the tile's shape and takes its
elements in storage order, so it needs a tile stored as one run (unswizzled, every row after the one before).
"""
from __future__ import annotations

import dataclasses
import math

from .. import infer, interpret, lower, tiles
from ..dtypes import DType
from ..errors import Check, InterpretError, Loc, Rule
from ..interpret.machine import BarrierRef
from ..interpret.scheduler import Warpgroup
from ..ir import Op, RefType, Value, check, is_int_scalar, is_ref
from .elementwise import Binary
from .program import Constant
from .smem import SmemAlloc, SmemTile, tile_alignment, tile_of


class RefIndex(Op):
    """`ref[i]`: drop the leading dimension of an SMEM or barrier reference at a runtime index (a stage of a
    buffer, or a row of an unswizzled 2D tile)."""

    name = "ref_index"

    def __init__(self, ref: Value, index: Value, loc: Loc | None):
        t = ref.type
        storage = t.storage if t.rank > 2 else None  # a stage keeps the plane it was cut from; a row is contiguous
        super().__init__([ref, index], [RefType(t.space, t.dtype, t.rank - 1, t.shape[1:], t.swizzle, False, storage)],
                         loc)

    def verify(self):
        t = self.operands[0].type
        check(t.space in ("smem", "barrier") and t.rank >= 1 and not t.transposed, self,
               f"only SMEM and barrier references can be indexed by a stage, got {t}")
        check(is_int_scalar(self.operands[1]), self, "a stage index must be an integer scalar")
        if t.space == "smem" and t.rank == 2 and t.swizzle:
            raise self.error(f"a {t.swizzle}B-swizzled tile stores its rows in 8-row atoms: index the stages of a "
                             f"buffer, and take rows of a 2D tile as a slice of multiples of 8 "
                             f"(tile[mgjit.ds(r, 8)])", rule=Rule.SMEM_SLICE)

    def view_extent(self) -> tuple[Value, int, Value | None, int, int] | None:
        return (self.operands[0], 0, *affine(self.operands[1]), 1)

    def stage_of(self) -> Value | None:
        return self.operands[0]


def affine(index: Value, depth: int = 0) -> tuple[Value | None, int]:
    """(base, offset): an integer index as a runtime value plus a static one (None: the index is static), through
    adds and subtractions of constants, so that `buf[first + j]` and `buf[first + k]` are told apart."""
    op = index.owner
    if isinstance(op, Constant):
        return None, op.value
    if depth < 8 and isinstance(op, Binary) and op.kind in ("add", "sub"):
        a, b = op.operands
        if isinstance(b.owner, Constant):
            base, offset = affine(a, depth + 1)
            return base, offset + (b.owner.value if op.kind == "add" else -b.owner.value)
        if op.kind == "add" and isinstance(a.owner, Constant):
            base, offset = affine(b, depth + 1)
            return base, offset + a.owner.value
    return index, 0


class RefSlice(Op):
    """`ref[..., start:start + size, ...]` along one dimension of an SMEM reference: a view of the same bytes
    (`tiles.Tile.view`). `start` is a static int or a runtime integer scalar (an operand); either way a multiple
    of the granule its tile's storage allows along that dimension (`tiles.Tile.granule`)."""

    name = "ref_slice"

    def __init__(self, ref: Value, dim: int, start: Value | int, size: int, loc: Loc | None):
        t = ref.type
        shape = list(t.shape)
        shape[dim] = size
        view = tile_of(t).view(stored_dim(t, dim), size)
        super().__init__([ref] + ([start] if isinstance(start, Value) else []),
                         [dataclasses.replace(t, shape=tuple(shape), storage=view.storage)], loc)
        self.dim = dim
        self.size = size
        self.start = start if isinstance(start, int) else None

    def attrs(self):
        return {"dim": self.dim, "size": self.size, **({"start": self.start} if self.start is not None else {})}

    def view_extent(self) -> tuple[Value, int, Value | None, int, int] | None:
        base, offset = (None, self.start) if self.start is not None else affine(self.operands[1])
        return self.operands[0], self.dim, base, offset, self.size

    def verify(self):
        t = self.operands[0].type
        check(is_ref(self.operands[0], "smem"), self, "only SMEM tiles are sliced")
        check(len(self.operands) == 1 or is_int_scalar(self.operands[1]), self, "a slice starts at an integer")
        stored = tile_of(t)
        dim = stored_dim(t, self.dim)
        rank = len(stored.shape)
        if dim < rank - 2 and dim != 0:
            raise self.error(f"only the first of a buffer's stage dimensions can be sliced (shape {t.shape}); index "
                             f"the ones before it first: buf[s, a:b]", rule=Rule.SMEM_SLICE)
        extent, granule = stored.shape[dim], stored.granule(dim)
        for what, n in (("size", self.size), ("start", self.start)):
            if n is not None and n % granule:
                raise self.error(f"{_slice_rule(stored, dim, t.dtype)}, got {what} {n}", rule=Rule.SMEM_SLICE)
        start = self.start or 0
        if not (self.size > 0 and start >= 0 and start + self.size <= extent):
            raise self.error(f"the slice {start}:{start + self.size} is outside dimension {self.dim} of the SMEM tile "
                             f"(shape {t.shape})", rule=Rule.SMEM_SLICE)


def stored_dim(t: RefType, dim: int) -> int:
    """The dimension of the stored tile that logical dimension `dim` of a reference is (a transposed view
    swaps the two)."""
    dim %= t.rank
    return 1 - dim if t.transposed else dim


def _slice_rule(stored: tiles.Tile, dim: int, dtype: DType) -> str:
    """What the storage of `stored` allows a view along `dim` to start at and span."""
    granule = stored.granule(dim)
    if dim == len(stored.shape) - 1 and stored.swizzle:
        return (f"slicing a {stored.swizzle}B-swizzled tile along its minor dimension needs multiples of {granule} "
                f"{dtype.name} (one column block)")
    if dim == len(stored.shape) - 1:
        return (f"slicing an unswizzled tile along its minor dimension needs multiples of {granule} {dtype.name} "
                f"(16 bytes)")
    return (f"slicing a {stored.swizzle}B-swizzled tile along its rows needs multiples of {granule} rows "
            f"(the swizzle atom)")


class RefTranspose(Op):
    """`ref.T`: the same 2D SMEM tile read with its dimensions swapped (an MN-major MMA operand)."""

    name = "ref_transpose"

    def __init__(self, ref: Value, loc: Loc | None):
        t = ref.type
        super().__init__([ref], [dataclasses.replace(t, shape=(t.shape[1], t.shape[0]), transposed=not t.transposed)],
                         loc)

    def verify(self):
        t = self.operands[0].type
        check(t.space == "smem" and t.rank == 2, self, f".T applies to 2D SMEM tiles, got {t}")


class RefWindow(Op):
    """`tile.window(start, shape)`: the tile's elements in storage order (row-major, stage after stage) from
    element `start` on, as a row-major tile of `shape`: rows of a view may begin anywhere in the tile's rows. A
    runtime start is a multiple of 16 bytes, as a slice's is (examples/_rows_piped.py reads a weight vector laid
    out once at a shift that differs by row)."""

    name = "ref_window"

    def __init__(self, ref: Value, start: Value | int, shape: tuple[int, ...], loc: Loc | None):
        t = ref.type
        super().__init__([ref] + ([start] if isinstance(start, Value) else []),
                         [RefType("smem", t.dtype, len(shape), tuple(shape))], loc)
        self.start = start if isinstance(start, int) else None

    def attrs(self):
        return {"shape": self.result.type.shape, **({"start": self.start} if self.start is not None else {})}

    def verify(self):
        t = self.operands[0].type
        check(is_ref(self.operands[0], "smem"), self, "only SMEM tiles have windows")
        check(len(self.operands) == 1 or is_int_scalar(self.operands[1]), self, "a window starts at an integer")
        stored = tile_of(t)
        elements = math.prod(t.shape)
        if t.swizzle or t.transposed or stored.spans() != [(0, elements * stored.itemsize)]:
            raise self.error(f"a window takes a tile's elements in storage order, which needs them stored as one "
                             f"run: an unswizzled tile, not transposed, not a column view, got {t}",
                             rule=Rule.SMEM_SLICE)
        size, granule = math.prod(self.result.type.shape), stored.granule(-1)  # 16 bytes: unswizzled
        if self.start is not None and self.start % granule:
            raise self.error(f"a window starts on 16 bytes, a multiple of {granule} {t.dtype.name}, got start "
                             f"{self.start}", rule=Rule.SMEM_SLICE)
        start = self.start or 0
        if not (start >= 0 and start + size <= elements):
            raise self.error(f"the window of {size} elements from {start} is outside the SMEM tile's {elements} "
                             f"(shape {t.shape})", rule=Rule.SMEM_SLICE)


def base_alignment(ref: Value) -> int:
    """What the SMEM offset of a reference's first element is known to be a multiple of: its buffer's alignment,
    reduced by the offsets of the stages and views taken on the way (a runtime index or start by its stride)."""
    op = ref.owner
    if isinstance(op, SmemAlloc):
        return tile_alignment(op.result.type)
    if isinstance(op, RefTranspose):
        return base_alignment(op.operands[0])
    parent = op.operands[0]
    stored = tile_of(parent.type)
    if isinstance(op, RefWindow):
        step = op.start * stored.itemsize if op.start is not None else 16
        return math.gcd(base_alignment(parent), step)
    if isinstance(op, RefIndex):
        step = stored.dim_stride(0)
    else:
        dim = stored_dim(parent.type, op.dim)
        step = stored.dim_stride(dim) * (op.start if op.start is not None else stored.granule(dim))
    return math.gcd(base_alignment(parent), step)


infer.rule(RefIndex, RefSlice, RefTranspose, RefWindow)(infer.no_arrays)


# ---------------------------------------------------------------------------------------------- lowering

@lower.rule(RefIndex)
def _ref_index(op: RefIndex, ctx: lower.Context) -> None:
    e = ctx.e
    src: SmemTile = ctx.get(op.operands[0])
    t = op.operands[0].type
    stride = 8 if t.space == "barrier" else tile_of(t).dim_stride(0)
    ctx.set(op.result, SmemTile(e.addi(src.offset, e.muli(ctx.get(op.operands[1]), e.i32(stride))), op.result.type))


@lower.rule(RefSlice)
def _ref_slice(op: RefSlice, ctx: lower.Context) -> None:
    e = ctx.e
    src: SmemTile = ctx.get(op.operands[0])
    t = op.operands[0].type
    stride = tile_of(t).dim_stride(stored_dim(t, op.dim))
    if op.start is not None:
        offset = e.addi(src.offset, e.i32(op.start * stride)) if op.start else src.offset
    else:
        offset = e.addi(src.offset, e.muli(ctx.get(op.operands[1]), e.i32(stride)))
    ctx.set(op.result, SmemTile(offset, op.result.type))


@lower.rule(RefTranspose)
def _ref_transpose(op: RefTranspose, ctx: lower.Context) -> None:
    ctx.set(op.result, SmemTile(ctx.get(op.operands[0]).offset, op.result.type))

@lower.rule(RefWindow)
def _ref_window(op: RefWindow, ctx: lower.Context) -> None:
    e = ctx.e
    src: SmemTile = ctx.get(op.operands[0])
    itemsize = tile_of(op.operands[0].type).itemsize
    if op.start is not None:
        offset = e.addi(src.offset, e.i32(op.start * itemsize)) if op.start else src.offset
    else:
        offset = e.addi(src.offset, e.muli(ctx.get(op.operands[1]), e.i32(itemsize)))
    ctx.set(op.result, SmemTile(offset, op.result.type))


# ---------------------------------------------------------------------------------------------- interpreter

def _allocation(ref: Value) -> Op | None:
    """The op that allocated the buffer a reference views."""
    op = ref.owner
    while isinstance(op, (RefIndex, RefSlice, RefTranspose, RefWindow)):
        op = op.operands[0].owner
    return op if isinstance(op, Op) else None


def _out_of_bounds(op: Op, message: str, check_: Check = Check.OUT_OF_BOUNDS) -> InterpretError:
    alloc = _allocation(op.operands[0])
    return InterpretError(message, op.loc, check_, (alloc.loc,) if alloc is not None and alloc.loc else ())


@interpret.rule(RefIndex)
def _interp_ref_index(op: RefIndex, wg: Warpgroup) -> None:
    src = wg.get(op.operands[0], op)
    index = int(wg.scalar(op.operands[1], op))
    t = op.operands[0].type
    if not 0 <= index < t.shape[0]:
        what = "barrier array" if t.space == "barrier" else "SMEM buffer"
        raise _out_of_bounds(op, f"index {index} is outside this {what} of {t.shape[0]} (shape {t.shape})")
    if t.space == "barrier":
        wg.set(op.result, BarrierRef(src.alloc, index))
    else:
        wg.set(op.result, SmemTile(src.offset + index * tile_of(t).dim_stride(0), op.result.type))


@interpret.rule(RefSlice)
def _interp_ref_slice(op: RefSlice, wg: Warpgroup) -> None:
    """A runtime start must land where the storage allows a view to start, and the view inside the tile."""
    src = wg.get(op.operands[0], op)
    t = op.operands[0].type
    stored, dim = tile_of(t), stored_dim(t, op.dim)
    start = op.start if op.start is not None else int(wg.scalar(op.operands[1], op))
    if start % stored.granule(dim):
        raise _out_of_bounds(op, f"{_slice_rule(stored, dim, t.dtype)}: this runtime start is {start}",
                             Check.SMEM_SLICE)
    if not 0 <= start <= stored.shape[dim] - op.size:
        raise _out_of_bounds(op, f"the slice {start}:{start + op.size} is outside dimension {op.dim} of the SMEM tile "
                                 f"(shape {t.shape})")
    wg.set(op.result, SmemTile(src.offset + start * stored.dim_stride(dim), op.result.type))


@interpret.rule(RefTranspose)
def _interp_ref_transpose(op: RefTranspose, wg: Warpgroup) -> None:
    wg.set(op.result, SmemTile(wg.get(op.operands[0], op).offset, op.result.type))

@interpret.rule(RefWindow)
def _interp_ref_window(op: RefWindow, wg: Warpgroup) -> None:
    """A runtime start must land on 16 bytes, and the window inside the tile."""
    src = wg.get(op.operands[0], op)
    t = op.operands[0].type
    start = op.start if op.start is not None else int(wg.scalar(op.operands[1], op))
    granule, size = tile_of(t).granule(-1), math.prod(op.result.type.shape)
    if start % granule:
        raise _out_of_bounds(op, f"a window starts on 16 bytes, a multiple of {granule} {t.dtype.name}: this runtime "
                                 f"start is {start}", Check.SMEM_SLICE)
    if not 0 <= start <= math.prod(t.shape) - size:
        raise _out_of_bounds(op, f"the window of {size} elements from {start} is outside the SMEM tile's "
                                 f"{math.prod(t.shape)} (shape {t.shape})")
    wg.set(op.result, SmemTile(src.offset + start * tile_of(t).itemsize, op.result.type))

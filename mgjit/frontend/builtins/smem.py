"""Shared memory: `mgjit.smem(shape, dtype, swizzle)` buffers, `with mgjit.scoped_smem(...) as buf:` buffers
of one block, a stage of one (`buf[slot]`), views of the same bytes (`buf[s, a:b]`, `tile[:, mgjit.ds(i, 64)]`,
`tile.window(start, shape)`), its transpose (`tile.T`), and whole-tile moves between registers and SMEM
(`tile[...] = x`, `x = tile[...]`)."""
from __future__ import annotations

from typing import Any, Callable

from ... import dtypes, language as lang, ops
from ...dtypes import DType
from ...errors import Rule
from ..registry import attribute, builtin, context, method
from ..semantics import Semantics
from ..values import Expanded, SmemRef, SmemScope, Tensor


def _buffer(t: Semantics, args: list, kwargs: dict, what: str) -> tuple[tuple[int, ...], DType, int | None]:
    """The (shape, dtype, swizzle) of an `mgjit.smem`/`mgjit.scoped_smem` call, checked."""
    if len(args) > 3 or set(kwargs) - {"shape", "dtype", "swizzle"}:
        raise t.error(f"bad call: mgjit.{what}(shape, dtype, swizzle=None)")
    shape = args[0] if args else kwargs.get("shape")
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
    swizzle = args[2] if len(args) > 2 else kwargs.get("swizzle")
    shape = (shape,) if isinstance(shape, int) else tuple(shape or ())
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise t.error(f"mgjit.{what} needs a static shape of positive ints, got {shape}")
    if not isinstance(dtype, DType):
        raise t.error(f"mgjit.{what} needs an mgjit dtype, got {dtype!r}")
    if swizzle not in (None, 32, 64, 128):
        raise t.error(f"swizzle must be None, 32, 64 or 128 bytes, got {swizzle!r}", rule=Rule.SWIZZLE_WIDTH)
    if swizzle is not None:
        row_bytes = shape[-1] * dtype.bits // 8
        if row_bytes % swizzle:
            raise t.error(f"a {swizzle}B swizzle needs tile rows that are a multiple of {swizzle} bytes; "
                          f"rows of {shape[-1]} x {dtype.name} are {row_bytes} bytes "
                          f"(the swizzle is wider than the tile row)", rule=Rule.SWIZZLE_WIDTH)
        if len(shape) < 2 or shape[-2] % 8:
            raise t.error(f"a swizzled tile has a multiple of 8 rows, got shape {shape}", rule=Rule.SWIZZLE_WIDTH)
    return shape, dtype, swizzle


@builtin(lang.smem)
def smem(t: Semantics, args: list, kwargs: dict) -> SmemRef:
    shape, dtype, swizzle = _buffer(t, args, kwargs, "smem")
    return SmemRef(t, t.builder.add(ops.SmemAlloc(shape, dtype, swizzle, t.builder.loc)).result)


@context(lang.scoped_smem)
def scoped_smem(t: Semantics, args: list, kwargs: dict) -> tuple[SmemRef, Callable[[], None]]:
    """A buffer for the `with` block (ScopedSmemAlloc), freed where the block ends (SmemFree)."""
    shape, dtype, swizzle = _buffer(t, args, kwargs, "scoped_smem")
    alloc = t.builder.add(ops.ScopedSmemAlloc(shape, dtype, swizzle, t.builder.loc)).result
    scope = SmemScope(t.builder.loc)

    def leave() -> None:
        t.builder.add(ops.SmemFree(alloc, t.builder.loc))
        scope.end = t.builder.loc

    return SmemRef(t, alloc, scope), leave


@method(SmemRef, "__getitem__")
def index(t: Semantics, ref: SmemRef, index: Any) -> SmemRef | Tensor:
    """`tile[...]`: the whole tile, into registers. Otherwise a view: integer indices take stages (leading
    dimensions, first), then a slice (`a:b` with static bounds, or `mgjit.ds(start, SIZE)` with a runtime start)
    or `:` per dimension."""
    if index is Ellipsis:
        return t.emit(ops.SmemLoad(ref.value, t.builder.loc))
    entries = index if isinstance(index, tuple) else (index,)
    if len(entries) > len(ref.shape):
        raise t.error(f"{len(entries)} indices for an SMEM tile of shape {ref.shape}")
    value, dim, sliced = ref.value, 0, False
    for entry in entries:
        if isinstance(entry, (slice, lang.ds)):
            extent = value.type.shape[dim]
            start, size = _slice(t, entry, extent)
            if not (isinstance(start, int) and start == 0 and size == extent):
                value = t.builder.add(ops.RefSlice(value, dim, start, size, t.builder.loc)).result
            dim, sliced = dim + 1, True
            continue
        if sliced or entry is Ellipsis or entry is None:
            raise t.error("an SMEM view takes integer indices of its stages first, then slices: buf[s, a:b, :]")
        i = t.cast(t.to_tensor(entry), dtypes.int32)
        value = t.builder.add(ops.RefIndex(value, i.value, t.builder.loc)).result
    return SmemRef(t, value, ref.scope)


def _slice(t: Semantics, entry: slice | lang.ds, extent: int) -> tuple[Any, int]:
    """(start: an int or an int32 IR value, static size) of a slice of an SMEM dimension of `extent`."""
    usage = ("an SMEM tile is sliced with static bounds (tile[a:b]) or a static size from a runtime start "
             "(tile[mgjit.ds(start, SIZE)])")
    if isinstance(entry, lang.ds):
        start, size = entry.start, entry.size
    else:
        if entry.step not in (None, 1):
            raise t.error(f"{usage}; steps are not supported", rule=Rule.SMEM_SLICE)
        start = 0 if entry.start is None else entry.start
        stop = extent if entry.stop is None else entry.stop
        if not (isinstance(start, int) and isinstance(stop, int)):
            raise t.error(usage, rule=Rule.SMEM_SLICE)
        size = stop - start
    if not isinstance(size, int) or isinstance(size, bool):
        raise t.error(usage, rule=Rule.SMEM_SLICE)
    return _start(t, start, "slice", usage), size


def _start(t: Semantics, start: Any, what: str, usage: str) -> Any:
    """Where a view (a slice, a window) starts: an int, or a runtime scalar as an int32 IR value."""
    if isinstance(start, (Tensor, Expanded)):
        if start.shape:
            raise t.error(f"a {what} starts at a scalar", rule=Rule.SMEM_SLICE)
        return t.cast(t.to_tensor(start), dtypes.int32).value
    if not isinstance(start, int) or isinstance(start, bool):
        raise t.error(usage, rule=Rule.SMEM_SLICE)
    return start


@method(SmemRef, "window")
def window(t: Semantics, ref: SmemRef, args: list, kwargs: dict) -> SmemRef:
    """`tile.window(start, shape)`: the tile's elements in storage order from element `start` (an int, or a
    runtime scalar on 16 bytes) as a tile of the static `shape` (smem_views.RefWindow)."""
    if len(args) + len(kwargs) != 2 or set(kwargs) - {"start", "shape"} or len(args) > 2:
        raise t.error("bad call: tile.window(start, shape)", rule=Rule.SMEM_SLICE)
    start = args[0] if args else kwargs["start"]
    shape = args[1] if len(args) > 1 else kwargs["shape"]
    shape = (shape,) if isinstance(shape, int) else tuple(shape) if isinstance(shape, (tuple, list)) else None
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise t.error(f"a window has a static shape of positive ints, got {args[1:] or kwargs.get('shape')!r}",
                      rule=Rule.SMEM_SLICE)
    start = _start(t, start, "window", f"a window starts at an int or a runtime scalar, got {start!r}")
    return SmemRef(t, t.builder.add(ops.RefWindow(ref.value, start, shape, t.builder.loc)).result, ref.scope)


@method(SmemRef, "__setitem__")
def store(t: Semantics, ref: SmemRef, index: Any, value: Any) -> None:
    """`tile[...] = x`: the whole tile (or view), from registers."""
    if index is not Ellipsis:
        raise t.error("an SMEM tile is written whole: tile[...] = array (a view of it: tile[a:b][...] = array)")
    if not isinstance(value, (Tensor, Expanded)):
        value = t.to_tensor(value, ref.dtype)
    if tuple(value.shape) != ref.shape or isinstance(value, Expanded):  # a keepdims result of the tile's shape
        value = t.broadcast_to(value, ref.shape)
    t.builder.add(ops.SmemStore(ref.value, value.value, t.builder.loc))


@attribute(SmemRef, "T")
def transpose(t: Semantics, ref: SmemRef) -> SmemRef:
    """`tile.T`: the tile read transposed (an MMA operand)."""
    return SmemRef(t, t.builder.add(ops.RefTranspose(ref.value, t.builder.loc)).result, ref.scope)

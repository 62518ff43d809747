"""GMEM windows: `x[i, ds(j, N)]` loads a window of a tensor argument into registers (`mgjit.load(x, index,
other=v)` too, with v where the window lies outside the tensor), `x[...] = v` stores one (Load, Store in
ops/gmem.py). With integer arrays among the indices, `x[rows, cols]` gathers (Gather in ops/gmem_gather.py)."""
from __future__ import annotations

from typing import Any

from ... import dtypes, ir, language as lang, ops
from ...errors import CompileError
from ..registry import builtin, method
from ..semantics import Semantics, broadcast_shape
from ..values import Expanded, Ref, Tensor


def window(t: Semantics, ref: Ref, index: Any) -> tuple[list[ir.Value], tuple[int, ...], tuple[bool, ...]]:
    """The int32 starts, the sizes and the squeezed axes of the window `ref[index]`."""
    index = index if isinstance(index, tuple) else (index,)
    if len(index) != ref.ndim:
        raise t.error(f"{ref.name} has rank {ref.ndim} but is indexed with {len(index)} indices")
    starts, sizes, squeeze = [], [], []
    for axis, item in enumerate(index):
        if isinstance(item, lang.ds):
            start, size = item.start, item.size
            if isinstance(size, Tensor) or not isinstance(size, int) or size <= 0:
                raise t.error(f"ds size must be a positive static int (a constexpr), got {size!r}")
            sizes.append(size)
            squeeze.append(False)
        elif isinstance(item, slice):
            if item.step not in (None, 1):
                raise t.error("strided slices of references are not supported")
            if item.stop is None or isinstance(item.stop, Tensor) or isinstance(item.start, Tensor):
                raise t.error(f"slice of axis {axis} of {ref.name} needs static bounds; "
                              "use mgjit.ds(start, SIZE) with a constexpr SIZE")
            start = item.start or 0
            sizes.append(item.stop - start)
            squeeze.append(False)
            if sizes[-1] <= 0:
                raise t.error(f"empty slice {item.start}:{item.stop} of axis {axis}")
        elif isinstance(item, (int, Tensor)) and not isinstance(item, bool):
            start = item
            sizes.append(1)
            squeeze.append(True)
        else:
            raise t.error(f"cannot index a reference with {type(item).__name__} {item!r}")
        starts.append(_start(t, axis, start))
    return starts, tuple(sizes), tuple(squeeze)


def _start(t: Semantics, axis: int, start: Any) -> ir.Value:
    """A window's start along `axis` as an int32 value."""
    s = t.to_tensor(start)
    if not s.dtype.is_int or s.shape:
        raise t.error(f"index of axis {axis} must be an integer scalar, got {s.value.type}")
    if s.dtype != dtypes.int32:
        s = t.cast(s, dtypes.int32)
    return s.value


def _is_array(item: Any) -> bool:
    return isinstance(item, (Tensor, Expanded)) and bool(item.shape)


def gather_indices(t: Semantics, ref: Ref, index: tuple) -> list[ir.Value]:
    """The int32 index arrays of the gather `ref[index]`, each axis's index (an integer array or scalar) broadcast
    to their common shape."""
    if len(index) != ref.ndim:
        raise t.error(f"{ref.name} has rank {ref.ndim} but is indexed with {len(index)} indices")
    shape: tuple[int, ...] = ()
    for axis, item in enumerate(index):
        if isinstance(item, (lang.ds, slice)):
            raise t.error(f"{ref.name} is gathered (indexed with an integer array), so every axis takes an integer "
                          f"array or scalar; axis {axis} takes a {type(item).__name__}: index it with an array of "
                          f"its positions (mgjit.arange) broadcast against the others")
        is_int = (item.dtype.is_int and item.dtype != dtypes.bool_ if isinstance(item, (Tensor, Expanded))
                  else isinstance(item, int) and not isinstance(item, bool))
        if not is_int:
            raise t.error(f"gather index of axis {axis} of {ref.name} must be an integer array or scalar, got "
                          f"{item.dtype.name if isinstance(item, (Tensor, Expanded)) else type(item).__name__}")
        try:
            shape = broadcast_shape(shape, tuple(getattr(item, "shape", ())))
        except ValueError:
            shapes = [tuple(getattr(i, "shape", ())) for i in index]
            raise t.error(f"the gather indices of {ref.name} do not broadcast to one shape: {shapes}") from None
    return [t.broadcast_to(t.cast(item, dtypes.int32), shape).value for item in index]


@method(Ref, "__getitem__")
def load(t: Semantics, ref: Ref, index: Any, other: int | float = 0) -> Tensor:
    index = index if isinstance(index, tuple) else (index,)
    if any(_is_array(item) for item in index):
        return t.emit(ops.Gather(ref.value, gather_indices(t, ref, index), t.builder.loc, other=other))
    starts, sizes, squeeze = window(t, ref, index)
    return t.emit(ops.Load(ref.value, starts, sizes, squeeze, t.builder.loc, other=other))


@builtin(lang.load, positional=(2, 2))
def load_other(t: Semantics, args: list, kwargs: dict) -> Tensor:
    if set(kwargs) - {"other"}:
        raise t.error(f"mgjit.load(x, index, other=0) takes other=, got {sorted(set(kwargs) - {'other'})}")
    ref, index = args
    if not isinstance(ref, Ref):
        raise t.error(f"mgjit.load reads a tensor argument of the kernel (GMEM), got {getattr(ref, 'kind', ref)!r}")
    return load(t, ref, index, _fill(t, ref, kwargs.get("other", 0)))


def _fill(t: Semantics, ref: Ref, other: Any) -> int | float:
    """`other` as a value of ref's dtype: a static number that the dtype holds (floats round to it)."""
    if isinstance(other, (Tensor, Expanded)) or not isinstance(other, (bool, int, float)):
        raise t.error(f"mgjit.load: other must be a static number (a Python int or float, or a constexpr), got "
                      f"{getattr(other, 'kind', type(other).__name__)}")
    dtype = ref.dtype
    if dtype.storage_only and other != 0:
        raise t.error(f"mgjit.load: other={other!r} for {ref.name}, a {dtype.name} reference: its elements are moved "
                      f"as bytes, not numbers, so only other=0 fills it")
    if dtype.is_float:
        return float(other)
    if isinstance(other, float) and not other.is_integer():
        raise t.error(f"mgjit.load: other={other!r} is not a value of {ref.name}'s dtype {dtype.name}")
    low, high = dtype.int_range
    if not low <= int(other) <= high:
        raise t.error(f"mgjit.load: other={other!r} is outside the range of {ref.name}'s dtype {dtype.name} "
                      f"({low} to {high})")
    return int(other)


@builtin(lang.store, positional=(3, 3))
def store_staged(t: Semantics, args: list, kwargs: dict) -> None:
    if set(kwargs) - {"staged"}:
        raise t.error(f"mgjit.store(x, index, value, staged=False) takes staged=, got "
                      f"{sorted(set(kwargs) - {'staged'})}")
    ref, index, value = args
    if not isinstance(ref, Ref):
        raise t.error(f"mgjit.store writes a tensor argument of the kernel (GMEM), got {getattr(ref, 'kind', ref)!r}")
    staged = kwargs.get("staged", False)
    if not isinstance(staged, (bool, int)):
        raise t.error(f"mgjit.store: staged must be a static bool (a Python bool or a constexpr), got "
                      f"{getattr(staged, 'kind', type(staged).__name__)}")
    store(t, ref, index, value, bool(staged))


@method(Ref, "__setitem__")
def store(t: Semantics, ref: Ref, index: Any, value: Any, staged: bool = False) -> None:
    if any(_is_array(item) for item in (index if isinstance(index, tuple) else (index,))):
        raise t.error(f"storing into {ref.name} at integer-array indices (a scatter) is not supported; store "
                      f"windows (mgjit.ds)")
    starts, sizes, squeeze = window(t, ref, index)
    shape = tuple(s for s, q in zip(sizes, squeeze) if not q)
    if isinstance(value, (tuple, list)):
        _store_side_by_side(t, ref, index, starts, sizes, squeeze, list(value), staged)
        return
    if not isinstance(value, (Tensor, Expanded)):  # a Python number is converted to the reference's dtype
        value = t.cast(value, ref.dtype)
    if value.dtype != ref.dtype:
        raise t.error(f"storing {value.dtype.name} into {ref.name}, a {ref.dtype.name} reference; "
                      f"convert with .astype({ref.name}.dtype)")
    if tuple(value.shape) != shape or isinstance(value, Expanded):  # a keepdims result of the window's shape
        try:
            value = t.broadcast_to(value, shape)
        except CompileError:
            raise t.error(f"storing an array of shape {tuple(value.shape)} into a window of shape {shape}")
    t.builder.add(ops.Store(ref.value, starts, sizes, squeeze, [value.value], t.builder.loc, staged=staged))


def _store_side_by_side(t: Semantics, ref: Ref, index: Any, starts: list[ir.Value], sizes: tuple[int, ...],
                        squeeze: tuple[bool, ...], values: list, staged: bool) -> None:
    """`x[index] = (a, b, ...)`: arrays side by side along the window's last axis, their widths adding up to its
    size (a row held as two arrays, 9 columns as 8 + 1), as one store (staged: one run)."""
    shape = tuple(s for s, q in zip(sizes, squeeze) if not q)
    index = index if isinstance(index, tuple) else (index,)
    if not values or squeeze[-1]:
        raise t.error(f"storing a tuple of arrays side by side into {ref.name} takes at least one array and a window "
                      f"whose last index is a range (mgjit.ds or a slice), got {len(values)} arrays and "
                      f"{'an integer' if squeeze[-1] else 'a range'} last index")
    arrays = []
    for k, v in enumerate(values):
        if not isinstance(v, (Tensor, Expanded)) or len(v.shape) != len(shape):
            got = f"shape {tuple(v.shape)}" if isinstance(v, (Tensor, Expanded)) else type(v).__name__
            raise t.error(f"storing arrays side by side into {ref.name}'s window of shape {shape}: each is an array "
                          f"of rank {len(shape)}, got {got} at position {k}")
        if v.dtype != ref.dtype:
            raise t.error(f"storing {v.dtype.name} into {ref.name}, a {ref.dtype.name} reference (array {k} of the "
                          f"tuple); convert with .astype({ref.name}.dtype)")
        part = (*shape[:-1], v.shape[-1])
        if tuple(v.shape) != part or isinstance(v, Expanded):
            try:
                v = t.broadcast_to(v, part)
            except CompileError:
                raise t.error(f"storing an array of shape {tuple(v.shape)} into the rows of a window of shape "
                              f"{shape}") from None
        arrays.append(v)
    widths = [v.shape[-1] for v in arrays]
    if sum(widths) != shape[-1]:
        raise t.error(f"arrays stored side by side into {ref.name} fill the window's last axis of {shape[-1]}, got "
                      f"widths {widths} (adding up to {sum(widths)})")
    last = index[-1]
    first = last.start if isinstance(last, lang.ds) else (last.start or 0)
    columns, offset = [], 0
    for width in widths[:-1]:
        offset += width
        columns.append(_start(t, len(sizes) - 1, t.apply_binop("add", first, offset)))
    t.builder.add(ops.Store(ref.value, starts, sizes, squeeze, [v.value for v in arrays], t.builder.loc,
                            staged=staged, column_starts=columns))

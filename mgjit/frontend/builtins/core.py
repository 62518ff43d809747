"""Builtins every target has: grid indices, arrays made from nothing (arange, zeros, full), elementwise math,
where, minimum/maximum, cdiv, reductions and casts — the builtins and the array methods (`x.sum()`,
`x.astype(...)`, `x[:, None]`) that trace them.
"""
from __future__ import annotations

import math
from typing import Any

from ... import dtypes, language as lang, ops
from ...ops.elementwise import FTZ_UNARY
from ..registry import builtin, method
from ..semantics import Semantics, python_scalar_dtype
from ..values import Expanded, Tensor


def _grid_axis(t: Semantics, name: str, args: list) -> int:
    if not isinstance(args[0], int):
        raise t.error(f"mgjit.{name} axis must be a static int")
    return args[0]


@builtin(lang.program_id, positional=(1, 1))
def program_id(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return t.emit(ops.ProgramId(_grid_axis(t, "program_id", args), t.builder.loc))


@builtin(lang.num_programs, positional=(1, 1))
def num_programs(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return t.emit(ops.NumPrograms(_grid_axis(t, "num_programs", args), t.builder.loc))


@builtin(lang.arange, positional=(1, 2))
def arange(t: Semantics, args: list, kwargs: dict) -> Tensor:
    start, stop = (0, args[0]) if len(args) == 1 else args
    if not all(isinstance(v, int) for v in (start, stop)):
        raise t.error("arange bounds must be static ints (constexprs)")
    return t.emit(ops.Iota(start, stop - start, t.builder.loc))


def _splat(t: Semantics, args: list, kwargs: dict, value: Any, dtype: Any) -> Tensor:
    shape = args[0] if args else kwargs.get("shape")
    shape = (shape,) if isinstance(shape, int) else tuple(shape) if isinstance(shape, (tuple, list)) else shape
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d > 0 for d in shape):
        raise t.error(f"array shapes must be static positive ints, got {shape}")
    if dtype is None:
        dtype = value.dtype if isinstance(value, Tensor) else python_scalar_dtype(value)
    scalar = t.cast(t.to_tensor(value, dtype), dtype)
    if not shape:  # shape (): a runtime scalar (a 0-d array is one)
        return scalar
    return t.emit(ops.Splat(scalar.value, shape, t.builder.loc))


@builtin(lang.zeros)
def zeros(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return _splat(t, args, kwargs, 0, args[1] if len(args) > 1 else kwargs.get("dtype", dtypes.float32))


@builtin(lang.full)
def full(t: Semantics, args: list, kwargs: dict) -> Tensor:
    if len(args) < 2 and "value" not in kwargs:
        raise t.error("mgjit.full(shape, value, dtype=None) needs a value")
    value = args[1] if len(args) > 1 else kwargs["value"]
    return _splat(t, args, kwargs, value, args[2] if len(args) > 2 else kwargs.get("dtype"))


@builtin(lang.where, positional=(3, 3))
def where(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return t.select(*args)


@builtin(lang.minimum, positional=(2, 2))
def minimum(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return t.binary("min", args[0], args[1])


@builtin(lang.maximum, positional=(2, 2))
def maximum(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return t.binary("max", args[0], args[1])


@builtin(lang.cdiv, positional=(2, 2))
def cdiv(t: Semantics, args: list, kwargs: dict) -> Any:
    a, b = args
    return t.apply_binop("floordiv", t.apply_binop("sub", t.apply_binop("add", a, b), 1), b)


def _math(name: str):
    takes = {"ftz"} if name in FTZ_UNARY else set()

    def call(t: Semantics, args: list, kwargs: dict) -> Any:
        if set(kwargs) - takes:
            allowed = f"takes {', '.join(f'{k}=' for k in sorted(takes))}" if takes else "takes no keywords"
            raise t.error(f"mgjit.{name} {allowed}, got {sorted(set(kwargs) - takes)}")
        ftz = kwargs.get("ftz", False)
        if not isinstance(ftz, bool):
            raise t.error(f"mgjit.{name}: ftz must be a static True or False, got {getattr(ftz, 'kind', ftz)!r}")
        x = args[0]
        if not isinstance(x, (Tensor, Expanded)):  # a compile-time number: Python's math
            try:
                return 1 / math.sqrt(x) if name == "rsqrt" else getattr(math, {"abs": "fabs"}.get(name, name))(x)
            except Exception as e:
                raise t.error(f"compile-time mgjit.{name}({x!r}) failed: {e}") from None
        return t.unary(name, x, ftz)
    return call


for _marker, _name in lang.UNARY_BUILTINS.items():
    builtin(_marker, positional=(1, 1))(_math(_name))


@builtin(lang.fma, positional=(3, 3))
def fma(t: Semantics, args: list, kwargs: dict) -> Any:
    if not any(isinstance(x, (Tensor, Expanded)) for x in args):  # compile-time numbers
        a, b, c = args
        return a * b + c
    return t.fma(*args)


# ---------------------------------------------------------------------------------------------- reductions

def reduce(t: Semantics, kind: str, x: Any, axis: Any, keepdims: bool) -> Tensor | Expanded:
    x = t.to_tensor(x)
    if not x.shape:
        raise t.error(f"{kind} needs an array, got a scalar")
    rank = len(x.shape)
    if axis is None:
        axes = tuple(range(rank))
    else:
        axes = tuple(axis if isinstance(axis, (tuple, list)) else (axis,))
        if not all(isinstance(a, int) for a in axes):
            raise t.error(f"reduction axes must be static integers, got {axis!r}")
    op = ops.Reduce(kind, x.value, axes, t.builder.loc)  # checks the axes and counts negative ones
    out, axes = t.emit(op), op.axes
    if keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        dims = tuple(i for i in range(rank) if i not in axes)
        return Expanded(out, shape, dims) if dims else out
    return out


def _reduction(name: str):
    def call(t: Semantics, args: list, kwargs: dict) -> Tensor | Expanded:
        axis = args[1] if len(args) > 1 else kwargs.get("axis")
        if isinstance(args[0], tuple):
            return reduce_all(t, name, args[0], axis, kwargs.get("keepdims", False))
        return reduce(t, name, args[0], axis, kwargs.get("keepdims", False))
    return call


def reduce_all(t: Semantics, kind: str, xs: tuple, axis: Any, keepdims: bool) -> Tensor:
    """mgjit.sum((a, b, ...)): every element of every array, one scalar (ops/reductions.py ReduceAll)."""
    if axis is not None or keepdims:
        raise t.error(f"{kind} of a tuple of arrays reduces every element to one scalar: it takes no axis or "
                      "keepdims")
    arrays = [t.to_tensor(x) for x in xs]
    if not arrays or any(not x.shape for x in arrays):
        raise t.error(f"{kind} of a tuple reduces one or more arrays, got "
                      f"{[tuple(x.shape) if x.shape else 'a scalar' for x in arrays]}")
    return t.emit(ops.ReduceAll(kind, [x.value for x in arrays], t.builder.loc))


for _marker, _name in lang.REDUCE_BUILTINS.items():
    builtin(_marker, positional=(1, 2))(_reduction(_name))


def _reduction_method(name: str):
    def call(t: Semantics, x: Tensor, args: list, kwargs: dict) -> Tensor | Expanded:
        if len(args) > 2 or set(kwargs) - {"axis", "keepdims"}:
            raise t.error(f"x.{name}(axis=None, keepdims=False) takes an axis and keepdims")
        axis = args[0] if args else kwargs.get("axis")
        keepdims = args[1] if len(args) > 1 else kwargs.get("keepdims", False)
        return reduce(t, name, x, axis, keepdims)
    return call


for _name in lang.REDUCE_BUILTINS.values():
    method(Tensor, _name)(_reduction_method(_name))


@method(Expanded, *lang.REDUCE_BUILTINS.values())
def _reduce_expanded(t: Semantics, x: Expanded, args: list, kwargs: dict) -> None:
    raise t.error(f"reduce the array before expanding it to shape {x.shape}")


# ---------------------------------------------------------------------------------------------- casts and views

@method(Tensor, "astype", "to")
@method(Expanded, "astype", "to")
def astype(t: Semantics, x: Tensor | Expanded, args: list, kwargs: dict) -> Tensor | Expanded:
    if len(args) + len(kwargs) != 1 or set(kwargs) - {"dtype"}:
        raise t.error("astype(dtype) takes one mgjit dtype, such as mgjit.float32")
    return t.cast(x, args[0] if args else kwargs["dtype"])


@method(Tensor, "__getitem__")
def expand(t: Semantics, x: Tensor, index: Any) -> Tensor | Expanded:
    """`x[:, None]`: the array viewed with extra size-1 dimensions; `x[a:b, c:]`: the block between static
    bounds (a chunk of a wgmma accumulator is a selection of its registers)."""
    index = index if isinstance(index, tuple) else (index,)
    x, index = _sliced(t, x, index)
    if all(isinstance(item, slice) for item in index) and len(index) <= len(x.shape):
        return x  # slices only: the block itself
    shape, dims, src_dim = [], [], 0
    for item in index:
        if item is None:
            shape.append(1)
        elif isinstance(item, slice) and item == slice(None):
            if src_dim >= len(x.shape):
                raise t.error(f"too many indices for an array of shape {x.shape}")
            dims.append(len(shape))
            shape.append(x.shape[src_dim])
            src_dim += 1
        else:
            raise t.error("register arrays take `:`, static slices `a:b` and `None` (to add dimensions) as indices; "
                          "load windows from references instead")
    for d in x.shape[src_dim:]:
        dims.append(len(shape))
        shape.append(d)
    return Expanded(x, tuple(shape), tuple(dims))


def _sliced(t: Semantics, x: Tensor, index: tuple) -> tuple[Tensor, tuple]:
    """x cut to the static slices among `index` (an ArraySlice), and the index with them made `:`."""
    if sum(item is not None for item in index) > len(x.shape):
        return x, index  # too many indices: `expand` says so
    starts, sizes, rest, dim = [0] * len(x.shape), list(x.shape), [], 0
    for item in index:
        if isinstance(item, slice) and item != slice(None):
            n = x.shape[dim]
            bounds = (item.start, item.stop, item.step)
            if not all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in bounds):
                raise t.error("a register array's slice bounds must be static ints (literals, constexprs), got a "
                              "runtime value: load the window from a reference instead")
            if item.step not in (None, 1):
                raise t.error(f"register arrays take slices of step 1, got step {item.step}")
            start, stop, _ = item.indices(n)
            if stop <= start:
                raise t.error(f"the slice {item.start}:{item.stop} of a dimension of {n} elements is empty")
            starts[dim], sizes[dim] = start, stop - start
            item = slice(None)
        rest.append(item)
        dim += item is not None
    if sizes == list(x.shape):
        return x, tuple(rest)
    return t.emit(ops.ArraySlice(x.value, tuple(starts), tuple(sizes), t.builder.loc)), tuple(rest)

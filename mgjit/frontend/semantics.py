"""The semantics of the language's values, below every statement and builtin: the tracer's state (where IR
goes, the scope, what the kernel collects for its launch), its errors, and how numbers and arrays combine —
Python numbers as weak-typed constants, dtype promotion, numpy broadcasting, elementwise operators.
"""
from __future__ import annotations

import ast
import functools
from typing import Any, Callable, Sequence

from .. import dtypes, ir, ops
from ..dtypes import DType
from ..errors import CompileError, Rule
from ..ops.elementwise import FLOAT_ONLY_UNARY, INT_ONLY_UNARY
from ..source import SourceFunction, closure_vars
from .values import Builder, Expanded, Tensor


def python_scalar_dtype(value: Any) -> DType:
    """The dtype a Python number takes in a kernel."""
    if isinstance(value, bool):
        return dtypes.bool_
    if isinstance(value, int):
        return dtypes.int32 if -2**31 <= value < 2**31 else dtypes.int64
    return dtypes.float32


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcast of two shapes; ValueError where they do not broadcast."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise ValueError
        out.append(max(x, y))
    return tuple(out[::-1])


_PY_BINOPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "pow": lambda a, b: a ** b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << b, "shr": lambda a, b: a >> b}
# Arithmetic on two bools: + is or and * is and (torch, numpy); the rest has no bool meaning.
_BOOL_ARITHMETIC = {"add": "or", "mul": "and", "sub": None, "floordiv": None, "mod": None, "shl": None, "shr": None,
                    "pow": None}
_OPERATOR = {"sub": "-", "floordiv": "//", "mod": "%", "shl": "<<", "shr": ">>", "pow": "**"}
_PY_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


class Semantics:
    """The tracer's state and value semantics. `Tracer` (tracer.py) adds statements and expressions; the
    builtins and the value methods (builtins/) receive it as `t`."""

    def __init__(self, source: SourceFunction, builder: Builder, scope: dict[str, Any], depth: int = 0,
                 parent: "Semantics | None" = None):
        self.src = source
        self.builder = builder
        self.scope = scope
        # Kernel-wide state shared with inlined helpers.
        self.tma_descriptors: list[ir.TmaDescriptor] = parent.tma_descriptors if parent else []
        self.num_warpgroups: int = parent.num_warpgroups if parent else 1
        self.cluster: tuple[int, int, int] = parent.cluster if parent else (1, 1, 1)
        self.param_index: dict[str, int] = parent.param_index if parent else {}
        # The buffers the compiler appends as hidden parameters (mgjit.print's records, the profiler's spans), by
        # name, and whether this compile records `mgjit.trace` spans (see builtins/debug.py).
        self.hidden_buffers: dict[str, Any] = parent.hidden_buffers if parent else {}
        self.profile: bool = parent.profile if parent else False
        # What mgjit.min_ctas_per_sm asked for, kernel-wide: {"count": n, "loc": where} (builtins/warpgroups.py).
        self.occupancy: dict[str, Any] = parent.occupancy if parent else {}
        self.globals = source.fn.__globals__
        self.closure = closure_vars(source.fn)
        self.depth = depth
        self.node: ast.AST | None = None

    # -- what the statement layer provides (tracer.py)
    def expr(self, node: ast.expr) -> Any:
        raise NotImplementedError

    def stmt(self, node: ast.stmt) -> None:
        raise NotImplementedError

    def assign(self, target: ast.expr, value: Any) -> None:
        raise NotImplementedError

    def run_body(self, stmts: Sequence[ast.stmt]) -> None:
        for stmt in stmts:
            self.stmt(stmt)

    # -- errors and locations
    def error(self, message: str, node: ast.AST | None = None, rule: Rule | str | None = None) -> CompileError:
        node = node or self.node
        return CompileError(message, self.src.loc(node) if node is not None else None, rule)

    def at(self, node: ast.AST) -> None:
        """Trace what follows as the code of `node` (its line in errors and in the ops' locations)."""
        self.node = node
        self.builder.loc = self.src.loc(node)

    # -- values
    def to_tensor(self, x: Any, like: DType | None = None) -> Tensor:
        if isinstance(x, Tensor):
            return x
        if isinstance(x, Expanded):
            return x.tensor
        if isinstance(x, (bool, int, float)):
            # A Python number takes `like` within its kind (an int with an int8 array is int8, a float with a
            # bf16 array bf16), never a lower kind: with a bool array an int stays an int (torch's rule).
            dtype = python_scalar_dtype(x)
            if like is not None and not isinstance(x, bool) and (
                    like.is_float or (not isinstance(x, float) and like != dtypes.bool_)):
                dtype = like
            value = float(x) if dtype.is_float else int(x)
            return Tensor(self, self.builder.add(ops.Constant(value, dtype, self.builder.loc)).result)
        raise self.error(f"expected a number or a runtime value, got {type(x).__name__} {x!r}")

    def emit(self, op: ir.Op) -> Tensor:
        """Add an op of one result; the result, as a Tensor."""
        return Tensor(self, self.builder.add(op).result)

    def cast(self, x: Tensor | Any, dtype: DType) -> Tensor:
        if not isinstance(dtype, DType):
            raise self.error(f"astype expects an mgjit dtype such as mgjit.float32, got {dtype!r}")
        if isinstance(x, Expanded):
            return Expanded(self.cast(x.tensor, dtype), x.shape, x.dims)
        x = self.to_tensor(x, dtype)
        if x.dtype == dtype:
            return x
        return self.emit(ops.Cast(x.value, dtype, self.builder.loc))

    def broadcast_to(self, x: Tensor | Expanded, shape: tuple[int, ...]) -> Tensor:
        if isinstance(x, Expanded):
            src, dims, own = x.tensor, x.dims, x.shape
        else:
            src, own = x, x.shape
            dims = tuple(range(len(shape) - len(own), len(shape)))
        if own == shape and not isinstance(x, Expanded):
            return src
        # The operand's size-1 dimensions that stretch are squeezed out; the rest map to result dims.
        stretched = tuple(i for i, d in enumerate(dims) if src.shape[i] == 1 and shape[d] != 1)
        if stretched:
            src = self.emit(ops.Squeeze(src.value, stretched, self.builder.loc))
            dims = tuple(d for i, d in enumerate(dims) if i not in stretched)
        if not src.shape:
            return self.emit(ops.Splat(src.value, shape, self.builder.loc))
        for n, d in zip(src.shape, dims):
            if n != shape[d]:
                raise self.error(f"cannot broadcast shape {own} to {shape}")
        return self.emit(ops.Broadcast(src.value, shape, dims, self.builder.loc))

    def _operands(self, *xs: Any, within: tuple[int, ...] = ()) -> list[Tensor]:
        """Promote operands to one dtype and one shape (numpy broadcasting, also against the shape `within`;
        Python numbers are weak: they take the dtype of the runtime operands)."""
        typed = [x for x in xs if isinstance(x, (Tensor, Expanded))]
        if not typed:
            raise self.error("internal error: no runtime operand")
        like = functools.reduce(dtypes.promote, (x.dtype for x in typed))
        xs = [x if isinstance(x, (Tensor, Expanded)) else self.to_tensor(x, like) for x in xs]
        dtype = functools.reduce(dtypes.promote, (x.dtype for x in xs))
        shapes = [tuple(x.shape) for x in xs]
        try:
            shape = functools.reduce(broadcast_shape, shapes, within)
        except ValueError:
            raise self.error(f"shapes {' and '.join(map(str, shapes))} do not broadcast") from None
        return [self.cast(self.broadcast_to(x, shape) if (s != shape or isinstance(x, Expanded)) else x, dtype)
                for x, s in zip(xs, shapes)]

    def _on_view(self, fn, *xs: Any) -> Expanded | None:
        """Elementwise work on expanded views and scalars stays on the view (no materialised size-1 dims)."""
        views = [x for x in xs if isinstance(x, Expanded)]
        if not views or any(isinstance(x, Tensor) and x.shape for x in xs):
            return None
        v0 = views[0]
        if any(v.shape != v0.shape or v.dims != v0.dims for v in views):
            return None
        out = fn(*(x.tensor if isinstance(x, Expanded) else x for x in xs))
        return Expanded(out, v0.shape, v0.dims)

    # -- elementwise operators
    def binary(self, kind: str, a: Any, b: Any) -> Tensor:
        view = self._on_view(lambda x, y: self.binary(kind, x, y), a, b)
        if view is not None:
            return view
        a, b = self._operands(a, b)
        if a.dtype == dtypes.bool_ and kind in _BOOL_ARITHMETIC:  # torch's and numpy's meaning of bool + bool
            if _BOOL_ARITHMETIC[kind] is None:
                raise self.error(f"`{_OPERATOR[kind]}` on bool values is not supported; use & | ^ ~ on bools, or "
                                 "convert them with .astype(mgjit.int32) first")
            kind = _BOOL_ARITHMETIC[kind]
        if kind == "div" and not a.dtype.is_float:
            a, b = self.cast(a, dtypes.float32), self.cast(b, dtypes.float32)
        if kind == "pow" and not a.dtype.is_float:
            raise self.error("** on integer arrays is not supported; cast to a float type first")
        return self.emit(ops.Binary(kind, a.value, b.value, self.builder.loc))

    def apply_binop(self, op: str, a: Any, b: Any) -> Any:
        """A binary operator: folded in Python on compile-time values, traced on runtime ones."""
        if not isinstance(a, (Tensor, Expanded)) and not isinstance(b, (Tensor, Expanded)):
            try:
                return _PY_BINOPS[op](a, b)
            except Exception as e:
                raise self.error(f"compile-time {op} of {a!r} and {b!r} failed: {e}") from None
        return self.binary(op, a, b)

    def apply_compare(self, kind: str, a: Any, b: Any) -> Any:
        """A comparison: decided in Python on compile-time values, traced on runtime ones."""
        if not isinstance(a, (Tensor, Expanded)) and not isinstance(b, (Tensor, Expanded)):
            return _PY_COMPARE[kind](a, b)
        return self.compare(kind, a, b)

    def compare(self, kind: str, a: Any, b: Any) -> Tensor:
        view = self._on_view(lambda x, y: self.compare(kind, x, y), a, b)
        if view is not None:
            return view
        a, b = self._operands(a, b)
        return self.emit(ops.Compare(kind, a.value, b.value, self.builder.loc))

    def unary(self, kind: str, x: Any, ftz: bool = False) -> Tensor:
        if isinstance(x, Expanded):
            return Expanded(self.unary(kind, x.tensor, ftz), x.shape, x.dims)
        x = self.to_tensor(x)
        if kind in FLOAT_ONLY_UNARY and not x.dtype.is_float:
            x = self.cast(x, dtypes.float32)
        if kind in INT_ONLY_UNARY and (not x.dtype.is_int or x.dtype == dtypes.bool_):
            raise self.error(f"mgjit.{kind} needs an integer array or scalar, got {x.dtype.name}")
        if kind == "not" and x.dtype != dtypes.bool_ and not x.dtype.is_int:
            raise self.error(f"~ needs a bool or integer operand, got {x.dtype.name}")
        if ftz and x.dtype == dtypes.float64:
            raise self.error(f"mgjit.{kind}(x, ftz=True) applies to float32 and narrower floats, got float64")
        return self.emit(ops.Unary(kind, x.value, self.builder.loc, ftz=ftz))

    def fma(self, a: Any, b: Any, c: Any) -> Tensor:
        """a * b + c rounded once; integer operands are converted to float32 (like exp and the other math)."""
        a, b, c = self._operands(a, b, c)
        if not a.dtype.is_float:
            a, b, c = (self.cast(x, dtypes.float32) for x in (a, b, c))
        return self.emit(ops.Fma(a.value, b.value, c.value, self.builder.loc))

    def select(self, cond: Any, a: Any, b: Any) -> Tensor:
        if not isinstance(a, (Tensor, Expanded)) and not isinstance(b, (Tensor, Expanded)):
            dtype = dtypes.promote(python_scalar_dtype(a), python_scalar_dtype(b))
            a, b = self.to_tensor(a, dtype), self.to_tensor(b, dtype)
        cond = cond if isinstance(cond, (Tensor, Expanded)) else self.to_tensor(bool(cond))
        if cond.dtype != dtypes.bool_:
            raise self.error(f"the condition of where must be a bool array, got {cond.dtype.name}")
        # One shape for all three, so that a size-1 view of a value (v[None, :]) broadcasts along the
        # condition's dimensions too, not only the other value's.
        values = [tuple(x.shape) for x in (a, b) if isinstance(x, (Tensor, Expanded))]
        try:
            shape = functools.reduce(broadcast_shape, values, tuple(cond.shape))
        except ValueError:
            raise self.error(f"the condition of where has shape {tuple(cond.shape)}, which does not broadcast "
                             f"with {' and '.join(map(str, values))}") from None
        a, b = self._operands(a, b, within=shape)
        cond = self.broadcast_to(cond, shape) if (tuple(cond.shape) != shape or isinstance(cond, Expanded)) else cond
        return self.emit(ops.Select(cond.value, a.value, b.value, self.builder.loc))

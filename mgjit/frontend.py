"""Python source → IR. An interpreter over the function's AST: Python values (constexprs, shapes, dtypes)
are evaluated at compile time, IR values flow through `Tensor` and `Ref` wrappers, `for`/`if` on runtime
values become structured IR, and `@mgjit.device` helpers are inlined. Anything outside the language is a
CompileError naming the file, line and construct.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import itertools
import math
from typing import Any, Callable, Sequence

from . import dtypes, ir, language as lang, ops
from .ops.elementwise import FLOAT_ONLY_UNARY
from .dtypes import DType
from .errors import CompileError, Loc
from .source import DeviceFunction, SourceFunction, closure_vars


# ---------------------------------------------------------------------------------------------- source







# ---------------------------------------------------------------------------------------------- builder

class Builder:
    """Appends ops to the current block, stamping each with the location being traced."""

    def __init__(self, block: ir.Block):
        self.block = block
        self.loc: Loc | None = None
        self.top = block  # the kernel's body
        self._hoisted = 0

    def add(self, op: ir.Op) -> ir.Op:
        op.loc = op.loc or self.loc
        op.verify()
        self.block.ops.append(op)
        return op

    def add_at_top(self, op: ir.Op) -> ir.Op:
        """Add an op of the kernel's arguments alone (a tensor's size) at the start of the kernel, where it
        dominates every use, whichever loop or branch first asked for it."""
        op.loc = op.loc or self.loc
        op.verify()
        self.top.ops.insert(self._hoisted, op)
        self._hoisted += 1
        return op


# ---------------------------------------------------------------------------------------------- tensors

def _python_scalar_dtype(value: Any) -> DType:
    if isinstance(value, bool):
        return dtypes.bool_
    if isinstance(value, int):
        return dtypes.int32 if -2**31 <= value < 2**31 else dtypes.int64
    return dtypes.float32


class _Operators:
    """Python operators on runtime values (and expanded views), emitting IR through the tracer."""

    tracer: "Tracer"

    def __add__(self, o): return self.tracer.binary("add", self, o)
    def __radd__(self, o): return self.tracer.binary("add", o, self)
    def __sub__(self, o): return self.tracer.binary("sub", self, o)
    def __rsub__(self, o): return self.tracer.binary("sub", o, self)
    def __mul__(self, o): return self.tracer.binary("mul", self, o)
    def __rmul__(self, o): return self.tracer.binary("mul", o, self)
    def __truediv__(self, o): return self.tracer.binary("div", self, o)
    def __rtruediv__(self, o): return self.tracer.binary("div", o, self)
    def __floordiv__(self, o): return self.tracer.binary("floordiv", self, o)
    def __rfloordiv__(self, o): return self.tracer.binary("floordiv", o, self)
    def __mod__(self, o): return self.tracer.binary("mod", self, o)
    def __rmod__(self, o): return self.tracer.binary("mod", o, self)
    def __pow__(self, o): return self.tracer.binary("pow", self, o)
    def __and__(self, o): return self.tracer.binary("and", self, o)
    def __rand__(self, o): return self.tracer.binary("and", o, self)
    def __or__(self, o): return self.tracer.binary("or", self, o)
    def __ror__(self, o): return self.tracer.binary("or", o, self)
    def __xor__(self, o): return self.tracer.binary("xor", self, o)
    def __lshift__(self, o): return self.tracer.binary("shl", self, o)
    def __rshift__(self, o): return self.tracer.binary("shr", self, o)
    def __neg__(self): return self.tracer.unary("neg", self)
    def __pos__(self): return self
    def __abs__(self): return self.tracer.unary("abs", self)
    def __invert__(self): return self.tracer.unary("not", self)
    def __lt__(self, o): return self.tracer.compare("lt", self, o)
    def __le__(self, o): return self.tracer.compare("le", self, o)
    def __gt__(self, o): return self.tracer.compare("gt", self, o)
    def __ge__(self, o): return self.tracer.compare("ge", self, o)
    def __eq__(self, o): return self.tracer.compare("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return self.tracer.compare("ne", self, o)  # type: ignore[override]
    __hash__ = object.__hash__



class Tensor(_Operators):
    """A scalar or register array during tracing, with Python operators that emit IR."""

    def __init__(self, tracer: "Tracer", value: ir.Value):
        self.tracer = tracer
        self.value = value

    @property
    def dtype(self) -> DType:
        return self.value.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.type.shape if self.value.is_array else ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __bool__(self):
        raise self.tracer.error("a runtime value has no truth value at compile time; use it in an `if` "
                                "statement directly or use mgjit.where for arrays")

    def __getitem__(self, index):
        return self.tracer.expand(self, index)

    # methods
    def astype(self, dtype: DType) -> "Tensor":
        return self.tracer.cast(self, dtype)

    to = astype

    def sum(self, axis=None, keepdims=False): return self.tracer.reduce("sum", self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return self.tracer.reduce("max", self, axis, keepdims)
    def min(self, axis=None, keepdims=False): return self.tracer.reduce("min", self, axis, keepdims)


class Expanded(_Operators):
    """`x[:, None]` or a keepdims reduction: an array viewed with extra size-1 dimensions. It exists only to
    be broadcast against another array (where a size-1 dimension costs nothing)."""

    def __init__(self, tensor: Tensor, shape: tuple[int, ...], dims: tuple[int, ...]):
        self.tensor = tensor
        self.shape = shape
        self.dims = dims  # result dimension of each dimension of `tensor`
        self.dtype = tensor.dtype
        self.tracer = tensor.tracer

    def astype(self, dtype: DType) -> "Expanded":
        return self.tracer.cast(self, dtype)

    to = astype

    def _reduce_error(self, *_, **__):
        raise self.tracer.error(f"reduce the array before expanding it to shape {self.shape}")

    sum = max = min = _reduce_error




class Ref:
    """A GMEM reference (a tensor argument) during tracing."""

    def __init__(self, tracer: "Tracer", value: ir.Value, name: str):
        self.tracer = tracer
        self.value = value
        self.name = name
        self._dims: list[Tensor] | None = None

    @property
    def dtype(self) -> DType:
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return self.value.type.rank

    @property
    def shape(self) -> tuple[Tensor, ...]:
        if self._dims is None:
            b = self.tracer.builder
            self._dims = [Tensor(self.tracer, b.add_at_top(ops.RefDim(self.value, i, b.loc)).result)
                          for i in range(self.ndim)]
        return tuple(self._dims)

    def __getitem__(self, index):
        return self.tracer.load(self, index)

    def __setitem__(self, index, value):
        self.tracer.store(self, index, value)


class _StaticRef:
    """During tracing, a reference with a static shape (shared or tensor memory)."""

    def __init__(self, tracer: "Tracer", value: ir.Value):
        self.tracer = tracer
        self.value = value

    @property
    def dtype(self) -> DType:
        return self.value.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.type.shape)


class SmemRef(_StaticRef):
    """A shared-memory buffer or a view of one during tracing."""

    @property
    def T(self) -> "SmemRef":
        b = self.tracer.builder
        return SmemRef(self.tracer, b.add(ops.RefTranspose(self.value, b.loc)).result)

    def __setitem__(self, index, value) -> None:
        t = self.tracer
        if index is not Ellipsis:
            raise t.error("an SMEM tile is written whole: tile[...] = array")
        if not isinstance(value, (Tensor, Expanded)):
            value = t.to_tensor(value, self.dtype)
        if tuple(value.shape) != self.shape:
            value = t._broadcast_to(value, self.shape)
        t.builder.add(ops.SmemStore(self.value, value.value, t.builder.loc))

    def __getitem__(self, index) -> "SmemRef | Tensor":
        t = self.tracer
        if index is Ellipsis:  # the whole tile, into registers
            return t._emit(ops.SmemLoad(self.value, t.builder.loc))
        if isinstance(index, tuple):
            raise t.error("SMEM buffers are indexed by one stage index at a time (buf[slot])")
        i = t.cast(t.to_tensor(index), dtypes.int32)
        return SmemRef(t, t.builder.add(ops.RefIndex(self.value, i.value, t.builder.loc)).result)


class Barriers:
    """An array of mbarriers. Each keeps a phase bit per slot in a hidden variable of the trace, so that
    `bars[i].wait()` waits for the right phase without the user tracking it (carried through loops/ifs)."""

    _ids = 0

    def __init__(self, tracer: "Tracer", value: ir.Value, count: int):
        self.value = value
        self.count = count
        Barriers._ids += 1
        self.phase_var = f"$phase{Barriers._ids}"
        tracer.scope[self.phase_var] = tracer.to_tensor(0)

    def __getitem__(self, index) -> "BarrierSlot":
        return BarrierSlot(self, index)


class BarrierSlot:
    def __init__(self, barriers: Barriers, index: Any):
        self.barriers = barriers
        self.index = index

    def _ref(self, t: "Tracer") -> tuple[ir.Value, Tensor]:
        i = t.cast(t.to_tensor(self.index), dtypes.int32)
        return t.builder.add(ops.RefIndex(self.barriers.value, i.value, t.builder.loc)).result, i


class TmemRef(_StaticRef):
    """A tensor-memory reference during tracing: `ref.load()`, `ref.store(x)`, `ref[:, a:b]` (static columns)."""

    def load(self) -> Tensor:
        t = self.tracer
        return t._emit(ops.TmemLoad(self.value, t.builder.loc))

    def store(self, value: Any) -> None:
        t = self.tracer
        if not isinstance(value, (Tensor, Expanded)):
            value = t.to_tensor(value, self.dtype)
        if value.dtype != self.dtype:
            raise t.error(f"storing {value.dtype.name} into a {self.dtype.name} TMEM reference; convert with "
                          f".astype(mgjit.{self.dtype.name})")
        if tuple(value.shape) != self.shape or isinstance(value, Expanded):
            value = t._broadcast_to(value, self.shape)
        t.builder.add(ops.TmemStore(self.value, value.value, t.builder.loc))

    def __getitem__(self, index) -> "TmemRef":
        t = self.tracer
        usage = "a TMEM reference is sliced by columns with static bounds: ref[:, a:b] or ref[:, mgjit.ds(a, SIZE)]"
        if not (isinstance(index, tuple) and len(index) == 2 and isinstance(index[0], slice)
                and index[0] == slice(None)):
            raise t.error(usage)
        col = index[1]
        if isinstance(col, lang.ds):
            start, size = col.start, col.size
        elif isinstance(col, slice) and col.step in (None, 1) and not isinstance(col.stop, Tensor):
            start = 0 if col.start is None else col.start
            size = (self.shape[1] if col.stop is None else col.stop) - start if isinstance(start, int) else None
        else:
            raise t.error(usage)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, size)):
            raise t.error(usage)
        return TmemRef(t, t.builder.add(ops.TmemSlice(self.value, start, size, t.builder.loc)).result)


# ---------------------------------------------------------------------------------------------- tracer

class _Return(Exception):
    def __init__(self, value, node: ast.AST):
        self.value = value
        self.node = node


_ALLOWED_PY_BUILTINS = {"range", "len", "int", "float", "bool", "min", "max", "abs", "tuple", "list",
                        "isinstance", "enumerate", "zip", "True", "False", "None", "print"}


class Tracer:
    """Walks one kernel's AST (and the helpers it calls) emitting IR into a Builder."""

    def __init__(self, source: SourceFunction, builder: Builder, scope: dict[str, Any], depth: int = 0,
                 parent: "Tracer | None" = None):
        self.src = source
        self.builder = builder
        self.scope = scope
        # Kernel-wide state shared with inlined helpers.
        self.tma_descriptors: list[ir.TmaDescriptor] = parent.tma_descriptors if parent else []
        self.num_warpgroups: int = parent.num_warpgroups if parent else 1
        self.cluster: tuple[int, int, int] = parent.cluster if parent else (1, 1, 1)
        self.param_index: dict[str, int] = parent.param_index if parent else {}
        self.globals = source.fn.__globals__
        self.closure = closure_vars(source.fn)
        self.depth = depth
        self.node: ast.AST | None = None

    # -- errors and locations
    def error(self, message: str, node: ast.AST | None = None, rule: str | None = None) -> CompileError:
        node = node or self.node
        return CompileError(message, self.src.loc(node) if node is not None else None, rule)

    def _at(self, node: ast.AST):
        self.node = node
        self.builder.loc = self.src.loc(node)

    # -- value helpers
    def to_tensor(self, x: Any, like: DType | None = None) -> Tensor:
        if isinstance(x, Tensor):
            return x
        if isinstance(x, Expanded):
            return x.tensor
        if isinstance(x, (bool, int, float)):
            dtype = _python_scalar_dtype(x)
            if like is not None and (like.is_float or not isinstance(x, float)) and not isinstance(x, bool):
                dtype = like
            value = float(x) if dtype.is_float else int(x)
            return Tensor(self, self.builder.add(ops.Constant(value, dtype, self.builder.loc)).result)
        raise self.error(f"expected a number or a runtime value, got {type(x).__name__} {x!r}")

    def _emit(self, op: ir.Op) -> Tensor:
        return Tensor(self, self.builder.add(op).result)

    def cast(self, x: Tensor | Any, dtype: DType) -> Tensor:
        if not isinstance(dtype, DType):
            raise self.error(f"astype expects an mgjit dtype such as mgjit.float32, got {dtype!r}")
        if isinstance(x, Expanded):
            return Expanded(self.cast(x.tensor, dtype), x.shape, x.dims)
        x = self.to_tensor(x, dtype)
        if x.dtype == dtype:
            return x
        return self._emit(ops.Cast(x.value, dtype, self.builder.loc))

    def _broadcast_to(self, x: Tensor | Expanded, shape: tuple[int, ...]) -> Tensor:
        if isinstance(x, Expanded):
            src, dims, own = x.tensor, x.dims, x.shape
        else:
            src, own = x, x.shape
            dims = tuple(range(len(shape) - len(own), len(shape)))
        if own == shape and not isinstance(x, Expanded):
            return src
        if not src.shape:
            return self._emit(ops.Splat(src.value, shape, self.builder.loc))
        # Drop the size-1 dimensions of the operand that broadcast; the rest map to result dims.
        keep = [(i, d) for i, d in enumerate(dims)]
        for i, d in keep:
            if src.shape[i] != shape[d]:
                raise self.error(f"cannot broadcast shape {own} to {shape}")
        return self._emit(ops.Broadcast(src.value, shape, tuple(d for _, d in keep), self.builder.loc))

    def _operands(self, a: Any, b: Any) -> tuple[Tensor, Tensor]:
        """Promote two operands to one dtype and one shape (numpy broadcasting; Python numbers are weak)."""
        if not isinstance(a, (Tensor, Expanded)) and not isinstance(b, (Tensor, Expanded)):
            raise self.error("internal error: no runtime operand")
        if not isinstance(a, (Tensor, Expanded)):
            a = self.to_tensor(a, b.dtype)
        if not isinstance(b, (Tensor, Expanded)):
            b = self.to_tensor(b, a.dtype)
        dtype = dtypes.promote(a.dtype, b.dtype)
        shape_a, shape_b = tuple(a.shape), tuple(b.shape)
        try:
            shape = tuple(_broadcast_shape(shape_a, shape_b))
        except ValueError:
            raise self.error(f"shapes {shape_a} and {shape_b} do not broadcast") from None
        a = self._broadcast_to(a, shape) if (shape_a != shape or isinstance(a, Expanded)) else a
        b = self._broadcast_to(b, shape) if (shape_b != shape or isinstance(b, Expanded)) else b
        return self.cast(a, dtype), self.cast(b, dtype)

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

    def binary(self, kind: str, a: Any, b: Any) -> Tensor:
        view = self._on_view(lambda x, y: self.binary(kind, x, y), a, b)
        if view is not None:
            return view
        a, b = self._operands(a, b)
        if kind == "div" and not a.dtype.is_float:
            a, b = self.cast(a, dtypes.float32), self.cast(b, dtypes.float32)
        if kind == "pow" and not a.dtype.is_float:
            raise self.error("** on integer arrays is not supported; cast to a float type first")
        return self._emit(ops.Binary(kind, a.value, b.value, self.builder.loc))

    def compare(self, kind: str, a: Any, b: Any) -> Tensor:
        view = self._on_view(lambda x, y: self.compare(kind, x, y), a, b)
        if view is not None:
            return view
        a, b = self._operands(a, b)
        return self._emit(ops.Compare(kind, a.value, b.value, self.builder.loc))

    def unary(self, kind: str, x: Any) -> Tensor:
        if isinstance(x, Expanded):
            return Expanded(self.unary(kind, x.tensor), x.shape, x.dims)
        x = self.to_tensor(x)
        if kind in FLOAT_ONLY_UNARY and not x.dtype.is_float:
            x = self.cast(x, dtypes.float32)
        if kind == "not" and x.dtype != dtypes.bool_ and not x.dtype.is_int:
            raise self.error(f"~ needs a bool or integer operand, got {x.dtype.name}")
        return self._emit(ops.Unary(kind, x.value, self.builder.loc))

    def select(self, cond: Any, a: Any, b: Any) -> Tensor:
        if not isinstance(a, (Tensor, Expanded)) and not isinstance(b, (Tensor, Expanded)):
            dtype = dtypes.promote(_python_scalar_dtype(a), _python_scalar_dtype(b))
            a, b = self.to_tensor(a, dtype), self.to_tensor(b, dtype)
        a, b = self._operands(a, b)
        cond = cond if isinstance(cond, (Tensor, Expanded)) else self.to_tensor(bool(cond))
        if cond.dtype != dtypes.bool_:
            raise self.error(f"the condition of where must be a bool array, got {cond.dtype.name}")
        shape = tuple(_broadcast_shape(tuple(cond.shape), a.shape))
        cond = self._broadcast_to(cond, shape) if (tuple(cond.shape) != shape or isinstance(cond, Expanded)) else cond
        a, b = self._broadcast_to(a, shape), self._broadcast_to(b, shape)
        return self._emit(ops.Select(cond.value, a.value, b.value, self.builder.loc))

    def reduce(self, kind: str, x: Any, axis: Any, keepdims: bool) -> Tensor | Expanded:
        x = self.to_tensor(x)
        if not x.shape:
            raise self.error(f"{kind} needs an array, got a scalar")
        rank = len(x.shape)
        if axis is None:
            axes = tuple(range(rank))
        else:
            axes = tuple(a % rank for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
            if not all(isinstance(a, int) for a in axes):
                raise self.error(f"reduction axes must be static integers, got {axis!r}")
        out = self._emit(ops.Reduce(kind, x.value, tuple(sorted(set(axes))), self.builder.loc))
        if keepdims:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
            dims = tuple(i for i in range(rank) if i not in axes)
            return Expanded(out, shape, dims) if dims else out
        return out

    def expand(self, x: Tensor, index: Any) -> Expanded:
        index = index if isinstance(index, tuple) else (index,)
        shape, dims, src_dim = [], [], 0
        for item in index:
            if item is None:
                shape.append(1)
            elif isinstance(item, slice) and item == slice(None):
                if src_dim >= len(x.shape):
                    raise self.error(f"too many indices for an array of shape {x.shape}")
                dims.append(len(shape))
                shape.append(x.shape[src_dim])
                src_dim += 1
            else:
                raise self.error("register arrays support only `:` and `None` in indexing (to add dimensions); "
                                 "load windows from references instead")
        for d in x.shape[src_dim:]:
            dims.append(len(shape))
            shape.append(d)
        return Expanded(x, tuple(shape), tuple(dims))

    # -- GMEM windows
    def _window(self, ref: Ref, index: Any) -> tuple[list[ir.Value], tuple[int, ...], tuple[bool, ...]]:
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != ref.ndim:
            raise self.error(f"{ref.name} has rank {ref.ndim} but is indexed with {len(index)} indices")
        starts, sizes, squeeze = [], [], []
        for axis, item in enumerate(index):
            if isinstance(item, lang.ds):
                start, size = item.start, item.size
                if isinstance(size, Tensor) or not isinstance(size, int) or size <= 0:
                    raise self.error(f"ds size must be a positive static int (a constexpr), got {size!r}")
                sizes.append(size)
                squeeze.append(False)
            elif isinstance(item, slice):
                if item.step not in (None, 1):
                    raise self.error("strided slices of references are not supported")
                if item.stop is None or isinstance(item.stop, Tensor) or isinstance(item.start, Tensor):
                    raise self.error(f"slice of axis {axis} of {ref.name} needs static bounds; "
                                     "use mgjit.ds(start, SIZE) with a constexpr SIZE")
                start = item.start or 0
                sizes.append(item.stop - start)
                squeeze.append(False)
                if sizes[-1] <= 0:
                    raise self.error(f"empty slice {item.start}:{item.stop} of axis {axis}")
            elif isinstance(item, (int, Tensor)) and not isinstance(item, bool):
                start = item
                sizes.append(1)
                squeeze.append(True)
            else:
                raise self.error(f"cannot index a reference with {type(item).__name__} {item!r}")
            s = self.to_tensor(start)
            if not s.dtype.is_int or s.shape:
                raise self.error(f"index of axis {axis} must be an integer scalar, got {s.value.type}")
            if s.dtype != dtypes.int32:
                s = self.cast(s, dtypes.int32)
            starts.append(s.value)
        return starts, tuple(sizes), tuple(squeeze)

    def load(self, ref: Ref, index: Any) -> Tensor:
        starts, sizes, squeeze = self._window(ref, index)
        return self._emit(ops.Load(ref.value, starts, sizes, squeeze, self.builder.loc))

    def store(self, ref: Ref, index: Any, value: Any) -> None:
        starts, sizes, squeeze = self._window(ref, index)
        shape = tuple(s for s, q in zip(sizes, squeeze) if not q)
        if not isinstance(value, (Tensor, Expanded)):
            value = self.to_tensor(value, ref.dtype)
        if value.dtype != ref.dtype:
            raise self.error(f"storing {value.dtype.name} into {ref.name}, a {ref.dtype.name} reference; "
                             f"convert with .astype({ref.name}.dtype)")
        if tuple(value.shape) != shape:
            try:
                value = self._broadcast_to(value, shape)
            except CompileError:
                raise self.error(f"storing an array of shape {tuple(value.shape)} into a window of shape {shape}")
        self.builder.add(ops.Store(ref.value, starts, sizes, squeeze, value.value, self.builder.loc))

    # -- statements
    def run_body(self, stmts: Sequence[ast.stmt]) -> None:
        for stmt in stmts:
            self.stmt(stmt)

    def stmt(self, node: ast.stmt) -> None:
        self._at(node)
        method = getattr(self, f"stmt_{type(node).__name__}", None)
        if method is None:
            raise self.error(f"`{type(node).__name__}` statements are not supported in mgjit kernels", node)
        method(node)

    def stmt_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # docstring
        self.expr(node.value)

    def stmt_Pass(self, node: ast.Pass) -> None:
        pass

    def stmt_Assign(self, node: ast.Assign) -> None:
        value = self.expr(node.value)
        for target in node.targets:
            self.assign(target, value)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            raise self.error("a bare annotation declares nothing in a kernel; assign a value")
        self.assign(node.target, self.expr(node.value))

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.error(f"operator {type(node.op).__name__} is not supported")
        if isinstance(node.target, ast.Name):
            current = self.lookup(node.target.id, node.target)
            self.assign(node.target, self.apply_binop(op, current, self.expr(node.value)))
        elif isinstance(node.target, ast.Subscript):
            ref = self.expr(node.target.value)
            index = self.subscript_index(node.target.slice)
            if not isinstance(ref, Ref):
                raise self.error("augmented assignment to an element works on references only")
            self.store(ref, index, self.apply_binop(op, self.load(ref, index), self.expr(node.value)))
        else:
            raise self.error("unsupported augmented assignment target")

    def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.scope[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (Tensor, Ref)) or not isinstance(value, (tuple, list)):
                raise self.error("only static tuples can be unpacked")
            if len(value) != len(target.elts):
                raise self.error(f"cannot unpack {len(value)} values into {len(target.elts)} names")
            for t, v in zip(target.elts, value):
                self.assign(t, v)
        elif isinstance(target, ast.Subscript):
            ref = self.expr(target.value)
            if isinstance(ref, SmemRef):
                ref[self.subscript_index(target.slice)] = value
                return
            if not isinstance(ref, Ref):
                raise self.error("only references (tensor arguments) can be assigned to by index; register "
                                 "arrays are values — build a new one with mgjit.where")
            self.store(ref, self.subscript_index(target.slice), value)
        else:
            raise self.error(f"cannot assign to {type(target).__name__}")

    def stmt_Return(self, node: ast.Return) -> None:
        if self.depth == 0 and node.value is not None:
            raise self.error("a kernel cannot return a value; store results into an output argument")
        raise _Return(self.expr(node.value) if node.value is not None else None, node)

    def stmt_Assert(self, node: ast.Assert) -> None:
        cond = self.expr(node.test)
        if isinstance(cond, (Tensor, Expanded)):
            raise self.error("assert needs a compile-time condition (on constexprs and shapes)")
        if not cond:
            msg = self.expr(node.msg) if node.msg is not None else "assertion failed"
            raise self.error(f"static assertion failed: {msg}")

    def stmt_While(self, node: ast.While) -> None:
        raise self.error("while loops are not supported; use `for i in range(...)`")

    def stmt_If(self, node: ast.If) -> None:
        cond = self.expr(node.test)
        if not isinstance(cond, (Tensor, Expanded)):
            self.run_body(node.body if cond else node.orelse)
            return
        if cond.shape:
            raise self.error("an `if` condition must be a scalar; for arrays use mgjit.where")
        if cond.dtype != dtypes.bool_:
            cond = self.compare("ne", cond, 0)
        assigned = sorted(_assigned_names(node.body) | _assigned_names(node.orelse) | _hidden(self.scope))

        def trace_branch(stmts) -> dict[str, Any]:
            saved_block, saved_scope = self.builder.block, self.scope
            self.scope = dict(saved_scope)
            block = ir.Block()
            self.builder.block = block
            try:
                self.run_body(stmts)
            except _Return as r:
                raise self.error("return inside a runtime `if` is not supported; assign to a variable "
                                 "and return after the `if`", r.node)
            finally:
                self.builder.block, out_scope = saved_block, self.scope
                self.scope = saved_scope
            return {"block": block, "scope": out_scope}

        if_loc = self.src.loc(node)
        then_, else_ = trace_branch(node.body), trace_branch(node.orelse)
        results = []
        for name in assigned:
            in_then, in_else = name in then_["scope"], name in else_["scope"]
            if not (in_then and in_else):
                continue  # defined on one path only: not visible after the if
            a, b = then_["scope"][name], else_["scope"][name]
            if a is b:
                continue
            if not isinstance(a, (Tensor, Expanded)) and not isinstance(b, (Tensor, Expanded)):
                if a == b:
                    self.scope[name] = a
                    continue
            results.append((name, a, b))
        types = []
        for i, (name, a, b) in enumerate(results):
            a, b = self._join_branch_values(name, a, b, then_["block"], else_["block"])
            results[i] = (name, a, b)
            types.append(a.value.type)
        op = ops.If(cond.value, types, if_loc)
        op.regions[0].ops = then_["block"].ops
        op.regions[1].ops = else_["block"].ops
        op.regions[0].ops.append(ops.Yield([a.value for _, a, _ in results], if_loc))
        op.regions[1].ops.append(ops.Yield([b.value for _, _, b in results], if_loc))
        self.builder.add(op)
        for (name, _, _), r in zip(results, op.results):
            self.scope[name] = Tensor(self, r)

    def _join_branch_values(self, name, a, b, then_block, else_block) -> tuple[Tensor, Tensor]:
        saved = self.builder.block
        try:
            ta_dtype = a.dtype if isinstance(a, (Tensor, Expanded)) else None
            tb_dtype = b.dtype if isinstance(b, (Tensor, Expanded)) else None
            dtype = dtypes.promote(ta_dtype or _python_scalar_dtype(a), tb_dtype or _python_scalar_dtype(b))
            out = []
            for v, block in ((a, then_block), (b, else_block)):
                self.builder.block = block
                if not isinstance(v, (Tensor, Expanded)) and not isinstance(v, (int, float, bool)):
                    raise self.error(f"`{name}` holds a {type(v).__name__} on one branch of a runtime `if`; "
                                     "only numbers and arrays can differ between branches")
                out.append(self.cast(self.to_tensor(v, dtype), dtype))
        finally:
            self.builder.block = saved
        if out[0].shape != out[1].shape:
            raise self.error(f"`{name}` has shape {out[0].shape} on one branch and {out[1].shape} on the other")
        return out[0], out[1]

    def stmt_For(self, node: ast.For) -> None:
        if node.orelse:
            raise self.error("for ... else is not supported")
        if not (isinstance(node.iter, ast.Call)):
            raise self.error("mgjit loops iterate over range(...) or mgjit.static_range(...)")
        fn = self.expr(node.iter.func)
        if fn is lang.pipeline:
            return self._pipeline(node)
        args = [self.expr(a) for a in node.iter.args]
        if node.iter.keywords:
            raise self.error("range takes no keyword arguments")
        if fn is lang.static_range:
            if any(isinstance(a, Tensor) for a in args):
                raise self.error("static_range bounds must be compile-time values")
            for i in range(*args):
                self.assign(node.target, i)
                self.run_body(node.body)
            return
        if fn is not builtins.range:
            raise self.error("mgjit loops iterate over range(...) or mgjit.static_range(...)")
        if not isinstance(node.target, ast.Name):
            raise self.error("the loop variable must be a single name")
        if not 1 <= len(args) <= 3:
            raise self.error("range takes 1 to 3 arguments")
        lower, upper, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
        if not isinstance(step, Tensor) and step <= 0:
            raise self.error("range steps must be positive (count upwards); a runtime step must be positive too")
        bound_dtype = dtypes.int32
        bounds = [self.cast(self.to_tensor(v, bound_dtype), bound_dtype) for v in (lower, upper, step)]
        for b in bounds:
            if not b.dtype.is_int or b.shape:
                raise self.error(f"range bounds must be integer scalars, got {b.value.type}")
        carried = [n for n in sorted(_assigned_names(node.body) | _hidden(self.scope))
                   if n in self.scope and n != node.target.id]
        inits = {n: self.scope[n] for n in carried}
        for n, v in inits.items():
            if not isinstance(v, (Tensor, int, float, bool)):
                raise self.error(f"`{n}` is reassigned in a runtime loop but holds a {type(v).__name__}; only "
                                 "numbers and arrays can be carried through a loop")
        init_types = {n: (v.dtype if isinstance(v, Tensor) else _python_scalar_dtype(v)) for n, v in inits.items()}
        for _ in range(3):  # carried dtypes settle after a promotion or two (e.g. `acc = 0` then `acc += x_f32`)
            op, yielded = self._trace_loop(node, bounds, carried, inits, init_types)
            new_types = {n: dtypes.promote(init_types[n], y.dtype) for n, y in zip(carried, yielded)}
            if new_types == init_types:
                break
            init_types = new_types
        else:
            raise self.error("loop-carried variables do not settle on a dtype")
        for n, y in zip(carried, yielded):
            init = inits[n]
            init_shape = init.shape if isinstance(init, Tensor) else ()
            if y.shape != init_shape:
                raise self.error(f"`{n}` changes shape in the loop from {init_shape} to {y.shape}; initialise it "
                                 f"with the loop's shape (e.g. mgjit.zeros({y.shape}, ...))")
        body_scope_names = set(_assigned_names(node.body))
        self.builder.add(op)
        for n in body_scope_names - set(carried):
            self.scope.pop(n, None)
        self.scope.pop(node.target.id, None)
        for n, r in zip(carried, op.results):
            self.scope[n] = Tensor(self, r)

    def _trace_loop(self, node, bounds, carried, inits, init_types):
        init_values = [self.cast(self.to_tensor(inits[n], init_types[n]), init_types[n]) for n in carried]
        op = ops.For(bounds[0].value, bounds[1].value, bounds[2].value, [v.value for v in init_values],
                    self.builder.loc)
        body = op.body
        saved_block, saved_scope = self.builder.block, self.scope
        self.scope = dict(saved_scope)
        self.builder.block = body
        try:
            self.scope[node.target.id] = Tensor(self, body.args[0])
            for n, arg in zip(carried, body.args[1:]):
                self.scope[n] = Tensor(self, arg)
            try:
                self.run_body(node.body)
            except _Return as r:
                raise self.error("return inside a runtime loop is not supported", r.node)
            self._at(node)
            yielded = []
            for n in carried:
                v = self.scope[n]
                if isinstance(v, Expanded):
                    raise self.error(f"`{n}` is an expanded view and cannot be carried through a loop")
                if not isinstance(v, (Tensor, int, float, bool)):
                    raise self.error(f"`{n}` becomes a {type(v).__name__} in the loop; it must stay a number or array")
                t = self.to_tensor(v, init_types[n])
                yielded.append(t)
            casted = [self.cast(t, dtypes.promote(init_types[n], t.dtype)) for n, t in zip(carried, yielded)]
            body.ops.append(ops.Yield([t.value for t in casted], self.builder.loc))
        finally:
            self.builder.block, self.scope = saved_block, saved_scope
        return op, yielded

    # -- expressions
    def expr(self, node: ast.expr) -> Any:
        saved = self.node
        self._at(node)
        method = getattr(self, f"expr_{type(node).__name__}", None)
        if method is None:
            raise self.error(f"`{type(node).__name__}` expressions are not supported in mgjit kernels", node)
        out = method(node)
        self.node = saved
        if saved is not None:
            self.builder.loc = self.src.loc(saved)
        return out

    def expr_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def expr_Name(self, node: ast.Name) -> Any:
        return self.lookup(node.id, node)

    def lookup(self, name: str, node: ast.AST) -> Any:
        if name in self.scope:
            return self.scope[name]
        if name in self.closure:
            return self.closure[name]
        if name in self.globals:
            return self.globals[name]
        if name in _ALLOWED_PY_BUILTINS and hasattr(builtins, name):
            return getattr(builtins, name)
        raise self.error(f"name `{name}` is not defined (a variable first assigned inside a runtime loop or on "
                         "one branch of a runtime `if` is not visible after it)", node)

    def expr_Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.expr(e) for e in node.elts)

    expr_List = expr_Tuple

    def expr_Attribute(self, node: ast.Attribute) -> Any:
        obj = self.expr(node.value)
        if isinstance(obj, BarrierSlot):
            if node.attr not in ("wait", "arrive"):
                raise self.error(f"a barrier has the methods wait() and arrive(), not `{node.attr}`")
            return _SlotMethod(obj, node.attr)
        if isinstance(obj, SmemRef):
            if node.attr in ("T", "shape", "dtype"):
                return getattr(obj, node.attr)
            raise self.error(f"SMEM buffers have no attribute `{node.attr}`")
        if isinstance(obj, (Tensor, Ref, Expanded)):
            if node.attr in ("dtype", "shape", "ndim", "astype", "to", "sum", "max", "min"):
                return getattr(obj, node.attr)
            raise self.error(f"runtime values have no attribute `{node.attr}`")
        try:
            return getattr(obj, node.attr)
        except AttributeError:
            raise self.error(f"{type(obj).__name__} has no attribute `{node.attr}`") from None

    def subscript_index(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Tuple):
            return tuple(self.subscript_index(e) for e in node.elts)
        if isinstance(node, ast.Slice):
            return slice(*(self.expr(p) if p is not None else None for p in (node.lower, node.upper, node.step)))
        return self.expr(node)

    def expr_Subscript(self, node: ast.Subscript) -> Any:
        obj = self.expr(node.value)
        index = self.subscript_index(node.slice)
        if isinstance(obj, (Ref, Tensor, SmemRef, Barriers, TmemRef)):
            return obj[index]
        if isinstance(obj, (tuple, list, dict)):
            if isinstance(index, Tensor):
                raise self.error("a static sequence cannot be indexed with a runtime value")
            return obj[index]
        raise self.error(f"cannot index a {type(obj).__name__}")

    def expr_BinOp(self, node: ast.BinOp) -> Any:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.error(f"operator {type(node.op).__name__} is not supported")
        return self.apply_binop(op, self.expr(node.left), self.expr(node.right))

    def apply_binop(self, op: str, a: Any, b: Any) -> Any:
        if not isinstance(a, (Tensor, Expanded)) and not isinstance(b, (Tensor, Expanded)):
            try:
                return _PY_BINOPS[op](a, b)
            except Exception as e:
                raise self.error(f"compile-time {op} of {a!r} and {b!r} failed: {e}") from None
        return self.binary(op, a, b)

    def expr_UnaryOp(self, node: ast.UnaryOp) -> Any:
        x = self.expr(node.operand)
        if not isinstance(x, (Tensor, Expanded)):
            return {ast.USub: lambda v: -v, ast.UAdd: lambda v: +v, ast.Not: lambda v: not v,
                    ast.Invert: lambda v: ~v}[type(node.op)](x)
        if isinstance(node.op, ast.Not):
            raise self.error("`not` on a runtime value is not supported; use `~` (or == 0)")
        if isinstance(node.op, ast.UAdd):
            return x
        return self.unary("neg" if isinstance(node.op, ast.USub) else "not", x)

    def expr_Compare(self, node: ast.Compare) -> Any:
        if len(node.ops) != 1:
            values = [self.expr(node.left)] + [self.expr(c) for c in node.comparators]
            if any(isinstance(v, (Tensor, Expanded)) for v in values):
                raise self.error("chained comparisons of runtime values are not supported; combine two "
                                 "comparisons with &")
            for op, a, b in zip(node.ops, values, values[1:]):
                kind = _CMPOPS.get(type(op))
                if kind is None or not _PY_CMP[kind](a, b):
                    if kind is None:
                        raise self.error(f"comparison {type(op).__name__} is not supported in a chain")
                    return False
            return True
        kind = _CMPOPS.get(type(node.ops[0]))
        a, b = self.expr(node.left), self.expr(node.comparators[0])
        if not isinstance(a, (Tensor, Expanded)) and not isinstance(b, (Tensor, Expanded)):
            if isinstance(node.ops[0], (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
                return {ast.Is: lambda: a is b, ast.IsNot: lambda: a is not b, ast.In: lambda: a in b,
                        ast.NotIn: lambda: a not in b}[type(node.ops[0])]()
            return _PY_CMP[kind](a, b)
        if kind is None:
            raise self.error(f"comparison {type(node.ops[0]).__name__} is not supported on runtime values")
        return self.compare(kind, a, b)

    def expr_BoolOp(self, node: ast.BoolOp) -> Any:
        values = [self.expr(v) for v in node.values]
        if any(isinstance(v, (Tensor, Expanded)) for v in values):
            raise self.error("`and`/`or` need compile-time values; for runtime conditions use & and |")
        out = values[0]
        for v in values[1:]:
            out = (out and v) if isinstance(node.op, ast.And) else (out or v)
        return out

    def expr_IfExp(self, node: ast.IfExp) -> Any:
        cond = self.expr(node.test)
        if isinstance(cond, (Tensor, Expanded)):
            return self.select(cond, self.expr(node.body), self.expr(node.orelse))
        return self.expr(node.body) if cond else self.expr(node.orelse)

    def expr_JoinedStr(self, node: ast.JoinedStr) -> Any:
        parts = []
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                parts.append(format(self.expr(v.value)))
            else:
                parts.append(self.expr(v))
        return "".join(map(str, parts))

    def expr_Call(self, node: ast.Call) -> Any:
        fn = self.expr(node.func)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                args.extend(self.expr(a.value))
            else:
                args.append(self.expr(a))
        kwargs = {k.arg: self.expr(k.value) for k in node.keywords if k.arg is not None}
        self._at(node)
        return self.call(fn, args, kwargs, node)

    def call(self, fn: Any, args: list, kwargs: dict, node: ast.Call) -> Any:
        if isinstance(fn, lang.Builtin):
            return self.call_builtin(fn, args, kwargs)
        if inspect.ismethod(fn) and isinstance(fn.__self__, (Tensor, Ref, TmemRef)):
            return fn(*args, **kwargs)
        if isinstance(fn, _SlotMethod):
            return self.barrier_method(fn.slot, fn.method, args, kwargs)
        if fn is lang.ds:
            try:
                return lang.ds(*args, **kwargs)
            except TypeError as e:
                raise self.error(f"bad mgjit.ds(...): {e}") from None
        if isinstance(fn, DeviceFunction):
            return self.inline(fn, args, kwargs, node)
        if hasattr(fn, "__mgjit_kernel__"):
            raise self.error(f"{fn.__name__} is an @mgjit.kernel; helpers called from kernels are @mgjit.device")
        if fn is builtins.print:
            raise self.error("print is not supported inside kernels")
        if fn in (builtins.min, builtins.max) and any(isinstance(a, (Tensor, Expanded)) for a in args):
            if len(args) != 2 or kwargs:
                raise self.error(f"{fn.__name__} on runtime values takes exactly two arguments")
            return self.binary(fn.__name__, args[0], args[1])
        if fn is builtins.abs and args and isinstance(args[0], Tensor):
            return self.unary("abs", args[0])
        if fn in (builtins.float, builtins.int, builtins.bool) and args and isinstance(args[0], Tensor):
            target = {builtins.float: dtypes.float32, builtins.int: dtypes.int32, builtins.bool: dtypes.bool_}[fn]
            return self.cast(args[0], target)
        if isinstance(fn, type) and issubclass(fn, DType):
            raise self.error("dtypes are not callable")
        if fn is builtins.range:
            raise self.error("range(...) can only be iterated by a for loop")
        if any(isinstance(a, (Tensor, Ref, Expanded)) for a in [*args, *kwargs.values()]):
            name = getattr(fn, "__name__", repr(fn))
            raise self.error(f"`{name}` is a plain Python function and cannot take runtime values; decorate it "
                             "with @mgjit.device to call it from a kernel")
        if callable(fn) and (fn in vars(builtins).values() or getattr(fn, "__module__", "") in ("math", "builtins")):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                raise self.error(f"compile-time call of {getattr(fn, '__name__', fn)} failed: {e}") from None
        raise self.error(f"calling {getattr(fn, '__name__', repr(fn))} is not supported in kernels (only mgjit "
                         "builtins, @mgjit.device functions and compile-time math)")

    def call_builtin(self, fn: lang.Builtin, args: list, kwargs: dict) -> Any:
        b = self.builder

        def want(n_min: int, n_max: int):
            if not n_min <= len(args) <= n_max:
                raise self.error(f"mgjit.{fn.name} takes {n_min}..{n_max} positional arguments, got {len(args)}")

        if fn in (lang.program_id, lang.num_programs):
            want(1, 1)
            if not isinstance(args[0], int):
                raise self.error(f"mgjit.{fn.name} axis must be a static int")
            cls = ops.ProgramId if fn is lang.program_id else ops.NumPrograms
            return self._emit(cls(args[0], b.loc))
        if fn is lang.warpgroup_id:
            want(0, 0)
            return self._emit(ops.WarpgroupId(b.loc))
        if fn in lang.UNARY_BUILTINS:
            want(1, 1)
            if not isinstance(args[0], (Tensor, Expanded)):
                try:
                    return getattr(math, {"abs": "fabs", "rsqrt": "sqrt"}.get(fn.name, fn.name))(args[0]) \
                        if fn.name != "rsqrt" else 1 / math.sqrt(args[0])
                except Exception as e:
                    raise self.error(f"compile-time mgjit.{fn.name}({args[0]!r}) failed: {e}") from None
            return self.unary(fn.name, args[0])
        if fn in lang.REDUCE_BUILTINS:
            want(1, 2)
            axis = args[1] if len(args) > 1 else kwargs.get("axis")
            return self.reduce(fn.name, args[0], axis, kwargs.get("keepdims", False))
        if fn in (lang.minimum, lang.maximum):
            want(2, 2)
            return self.binary("min" if fn is lang.minimum else "max", args[0], args[1])
        if fn is lang.where:
            want(3, 3)
            return self.select(*args)
        if fn is lang.cdiv:
            want(2, 2)
            return self.apply_binop("floordiv", self.apply_binop("sub", self.apply_binop("add", args[0], args[1]), 1),
                                    args[1])
        if fn is lang.arange:
            want(1, 2)
            start, stop = (0, args[0]) if len(args) == 1 else args
            if not all(isinstance(v, int) for v in (start, stop)):
                raise self.error("arange bounds must be static ints (constexprs)")
            return self._emit(ops.Iota(start, stop - start, b.loc))
        if fn in (lang.zeros, lang.full):
            shape = args[0] if args else kwargs.get("shape")
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
            if not all(isinstance(d, int) and d > 0 for d in shape):
                raise self.error(f"array shapes must be static positive ints, got {shape}")
            if fn is lang.zeros:
                value, dtype = 0, (args[1] if len(args) > 1 else kwargs.get("dtype", dtypes.float32))
            else:
                value = args[1] if len(args) > 1 else kwargs["value"]
                dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
            if dtype is None:
                dtype = value.dtype if isinstance(value, Tensor) else _python_scalar_dtype(value)
            scalar = self.cast(self.to_tensor(value, dtype), dtype)
            return self._emit(ops.Splat(scalar.value, shape, b.loc))
        if fn is lang.static_range:
            raise self.error("static_range can only be iterated by a for loop")
        if fn in _HOPPER_BUILTINS:
            return getattr(self, f"builtin_{fn.name}")(args, kwargs)
        if fn in _BLACKWELL_BUILTINS:
            return getattr(self, f"builtin_{fn.name}")(args, kwargs)
        raise self.error(f"mgjit.{fn.name} is not supported here")

    # -- Hopper builtins
    def builtin_smem(self, args: list, kwargs: dict) -> SmemRef:
        shape = args[0] if args else kwargs.get("shape")
        dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
        swizzle = args[2] if len(args) > 2 else kwargs.get("swizzle")
        shape = (shape,) if isinstance(shape, int) else tuple(shape or ())
        if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            raise self.error(f"mgjit.smem needs a static shape of positive ints, got {shape}")
        if not isinstance(dtype, DType):
            raise self.error(f"mgjit.smem needs an mgjit dtype, got {dtype!r}")
        if swizzle not in (None, 32, 64, 128):
            raise self.error(f"swizzle must be None, 32, 64 or 128 bytes, got {swizzle!r}", rule="swizzle-width")
        if swizzle is not None:
            row_bytes = shape[-1] * dtype.bits // 8
            if row_bytes % swizzle:
                raise self.error(f"a {swizzle}B swizzle needs tile rows that are a multiple of {swizzle} bytes; "
                                 f"rows of {shape[-1]} x {dtype.name} are {row_bytes} bytes "
                                 f"(the swizzle is wider than the tile row)", rule="swizzle-width")
            if len(shape) < 2 or shape[-2] % 8:
                raise self.error(f"a swizzled tile has a multiple of 8 rows, got shape {shape}", rule="swizzle-width")
        return SmemRef(self, self.builder.add(ops.SmemAlloc(shape, dtype, swizzle, self.builder.loc)).result)

    def builtin_barrier(self, args: list, kwargs: dict) -> Barriers:
        count = args[0] if args else kwargs.get("count", 1)
        arrivals = args[1] if len(args) > 1 else kwargs.get("arrivals", 1)
        if not all(isinstance(v, int) for v in (count, arrivals)):
            raise self.error("barrier count and arrivals must be static ints")
        op = self.builder.add(ops.BarrierAlloc(count, arrivals, self.builder.loc))
        return Barriers(self, op.result, count)

    def barrier_method(self, slot: BarrierSlot, method: str, args: list, kwargs: dict) -> None:
        if args or kwargs:
            raise self.error(f"barrier.{method}() takes no arguments")
        ref, index = slot._ref(self)
        if method == "arrive":
            self.builder.add(ops.BarrierArrive(ref, self.builder.loc))
            return None
        mask = self.scope[slot.barriers.phase_var]
        phase = self.binary("and", self.binary("shr", mask, index), 1)
        self.builder.add(ops.BarrierWait(ref, phase.value, self.builder.loc))
        self.scope[slot.barriers.phase_var] = self.binary("xor", mask, self.binary("shl", 1, index))
        return None

    def builtin_copy_async(self, args: list, kwargs: dict) -> None:
        if len(args) != 3 or set(kwargs) - {"collective", "multicast"} != {"barrier"}:
            raise self.error("copy_async(src, coords, dst, barrier=bars[i]) takes a tensor, a tuple of element "
                             "coordinates, an SMEM tile and a barrier slot")
        collective = kwargs.get("collective", False)
        multicast = kwargs.get("multicast", False)
        if not isinstance(collective, bool) or not isinstance(multicast, bool):
            raise self.error("copy_async's collective= and multicast= must be static bools")
        ctas = self.cluster[0] * self.cluster[1] * self.cluster[2]
        if multicast and ctas < 2:
            raise self.error("copy_async(multicast=True) delivers a tile to every CTA of a cluster: launch and "
                             "compile with cluster=(n, 1, 1), n >= 2", rule="cluster")
        if multicast and collective:
            raise self.error("copy_async takes collective= or multicast=, not both")
        src, coords, dst = args
        bar = kwargs["barrier"]
        if not isinstance(src, Ref):
            raise self.error("copy_async copies from a tensor argument of the kernel")
        if not isinstance(dst, SmemRef):
            raise self.error("copy_async copies into an SMEM tile (mgjit.smem(...)[slot])")
        if not isinstance(bar, BarrierSlot):
            raise self.error("copy_async completes on one barrier slot: barrier=bars[i]")
        coords = coords if isinstance(coords, (tuple, list)) else (coords,)
        if len(coords) != src.ndim:
            raise self.error(f"{src.name} has rank {src.ndim}; copy_async needs {src.ndim} coordinates")
        split = ctas if multicast else 1
        if multicast and (dst.shape[0] % split or (dst.value.type.swizzle and (dst.shape[0] // split) % 8)):
            raise self.error(f"a multicast tile's rows are split over the cluster's {split} CTAs: {dst.shape[0]} rows "
                             f"must divide into parts that are multiples of 8 rows", rule="cluster")
        descriptor = self._tma_descriptor(src, dst, rows_split=split)
        starts = [self.cast(self.to_tensor(c), dtypes.int32).value for c in coords]
        ref, _ = bar._ref(self)
        if collective:  # the arrival and bytes count on the barrier of the 2-CTA pair's leader CTA
            self.builder.add(ops.TmaLoadCollective(src.value, starts, dst.value, ref, descriptor, self.builder.loc))
        else:
            self.builder.add(ops.TmaLoad(src.value, starts, dst.value, ref, descriptor, self.builder.loc,
                                        multicast=split if multicast else 0))
        return None

    def _tma_descriptor(self, tensor: Ref, tile: SmemRef, rows_split: int = 1) -> int:
        """Register (once) the host-built TMA descriptor for copies between `tensor` and tiles like `tile`
        (or 1/rows_split of their rows, for multicast)."""
        shape = (tile.shape[0] // rows_split, *tile.shape[1:])
        if len(shape) != tensor.ndim:
            raise self.error(f"the SMEM tile {shape} must have the rank of {tensor.name} ({tensor.ndim})")
        swizzle = tile.value.type.swizzle or 0
        inner = shape[-1] if not swizzle else swizzle * 8 // tile.dtype.bits
        box = (*shape[:-1], inner)
        if any(b > 256 for b in box):
            raise self.error(f"a TMA box has at most 256 elements per dimension, got {box}", rule="tma-box")
        if (box[-1] * tile.dtype.bits // 8) % 16:
            raise self.error(f"the innermost TMA box dimension must be a multiple of 16 bytes, got {box[-1]} x "
                             f"{tile.dtype.name}", rule="tma-box")
        desc = ir.TmaDescriptor(self.param_index[tensor.name], box, swizzle)
        if desc not in self.tma_descriptors:
            self.tma_descriptors.append(desc)
        return self.tma_descriptors.index(desc)

    def builtin_tile(self, args: list, kwargs: dict) -> TileSpec:
        names = ("tensor", "origin", "block", "step", "swizzle")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in bound:
                raise self.error(f"tile() got an unexpected or repeated argument `{k}`")
            bound[k] = v
        if not {"tensor", "origin", "block", "step"} <= set(bound):
            raise self.error("tile(tensor, origin, block, step, swizzle=None) needs the first four arguments")
        tensor = bound["tensor"]
        if not isinstance(tensor, Ref):
            raise self.error("tile() takes a tensor argument of the kernel")
        origin, block, step = (tuple(bound[k]) if isinstance(bound[k], (tuple, list)) else (bound[k],)
                               for k in ("origin", "block", "step"))
        if not len(origin) == len(block) == len(step) == tensor.ndim:
            raise self.error(f"tile() needs origin, block and step of rank {tensor.ndim} for {tensor.name}")
        if not all(isinstance(x, int) and x > 0 for x in block) or not all(isinstance(x, int) for x in step):
            raise self.error("tile() block and step must be static ints (constexprs)")
        swizzle = bound.get("swizzle")
        if swizzle is None:
            row = block[-1] * tensor.dtype.bits // 8
            swizzle = next((sw for sw in (128, 64, 32) if row % sw == 0 and len(block) >= 2 and block[-2] % 8 == 0),
                           None)
        return TileSpec(tensor, origin, block, step, swizzle)

    def _pipeline(self, node: ast.For) -> None:
        """Expand `for k, *tiles in mgjit.pipeline(...)` into a TMA ring, by building the loop as Python AST from
        a template and tracing it: the user's body is spliced in unchanged."""
        call = node.iter
        args = [self.expr(a) for a in call.args]
        kwargs = {k.arg: self.expr(k.value) for k in call.keywords}
        unknown = set(kwargs) - {"stages", "release", "warp_specialize", "registers"}
        if unknown:
            raise self.error(f"pipeline() has no argument {sorted(unknown)[0]!r}")
        if len(args) < 2 or not all(isinstance(t, TileSpec) for t in args[1:]):
            raise self.error("pipeline(steps, mgjit.tile(...), ...) takes a step count and at least one tile")
        steps, specs = args[0], args[1:]
        stages = kwargs.get("stages", 2)
        release = kwargs.get("release", 1)
        ws = bool(kwargs.get("warp_specialize", False))
        registers = kwargs.get("registers")
        if not isinstance(stages, int) or stages < 2:
            raise self.error(f"pipeline stages must be a static int >= 2, got {stages!r}")
        if not isinstance(release, int) or not 0 <= release < stages:
            raise self.error(f"pipeline release must be a static int in 0..stages-1, got {release!r}")
        target = node.target
        if not (isinstance(target, ast.Tuple) and len(target.elts) == 1 + len(specs)
                and all(isinstance(e, ast.Name) for e in target.elts)):
            raise self.error(f"write `for k, {', '.join(f'tile{i}' for i in range(len(specs)))} in mgjit.pipeline(...)`: "
                             "one name for the step and one per tile")
        if ws and self.num_warpgroups < 2:
            raise self.error("a warp-specialized pipeline needs num_warpgroups >= 2 (one producer, the rest consume)")
        if ws and registers:
            leaving = sorted(n for n in _assigned_names(node.body) if n in self.scope)
            if leaving:
                raise self.error(f"registers={registers} caps the producer warpgroup, but `{leaving[0]}` is carried "
                                 "out of the pipeline and would live in the producer too (it would spill); drop "
                                 "registers= or keep such values inside the loop body", rule="registers")
        p = f"__p{next(_pipeline_ids)}_"
        sc = self.scope
        sc[p + "steps"] = steps
        sc[p + "full"] = self.builtin_barrier([stages, len(specs)], {})
        if ws:
            sc[p + "empty"] = self.builtin_barrier([stages, self.num_warpgroups - 1], {})
        for i, spec in enumerate(specs):
            sc[f"{p}t{i}"] = spec.tensor
            sc[f"{p}buf{i}"] = self.builtin_smem([(stages, *spec.block), spec.tensor.dtype, spec.swizzle], {})
            for d, o in enumerate(spec.origin):
                sc[f"{p}o{i}_{d}"] = o
        for name, value in (("copy", lang.copy_async), ("wait", lang.wgmma_wait), ("range", builtins.range),
                            ("static", lang.static_range), ("wg", lang.warpgroup_id), ("maxreg", lang.set_max_registers)):
            sc[p + name] = value

        def copies(step: str, slot: str, indent: str) -> list[str]:
            out = []
            for i, spec in enumerate(specs):
                coords = ", ".join(f"{p}o{i}_{d} + ({step}) * {spec.step[d]}" for d in range(len(spec.block)))
                out.append(f"{indent}{p}copy({p}t{i}, ({coords},), {p}buf{i}[{slot}], barrier={p}full[{slot}])")
            return out

        k_name = target.elts[0].id
        bind = [f"{t.id} = {p}buf{i}[{p}slot]" for i, t in enumerate(target.elts[1:])]
        consumer = [f"for {k_name} in {p}range({p}steps):", f"    {p}slot = {k_name} % {stages}",
                    f"    {p}full[{p}slot].wait()", *(f"    {b}" for b in bind), "    __BODY__",
                    f"    {p}wait({release})"]
        if ws:
            consumer += [f"    if {k_name} >= {release}:", f"        {p}empty[({k_name} - {release}) % {stages}].arrive()",
                         f"{p}wait(0)"]
            lo, hi = registers if registers else (None, None)
            lines = [f"if {p}wg() == 0:"] + ([f"    {p}maxreg({lo}, increase=False)"] if lo else []) + [
                f"    for {p}k in {p}range({p}steps):", f"        {p}slot = {p}k % {stages}",
                f"        if {p}k >= {stages}:", f"            {p}empty[{p}slot].wait()",
                *copies(f"{p}k", f"{p}slot", "        "), "else:"] + (
                [f"    {p}maxreg({hi}, increase=True)"] if hi else []) + [f"    {line}" for line in consumer]
        else:
            consumer += [f"    {p}next = {k_name} + {stages - 1}", f"    if {p}next < {p}steps:",
                         *copies(f"{p}next", f"{p}next % {stages}", "        "), f"{p}wait(0)"]
            lines = [f"for {p}s in {p}static({stages - 1}):", f"    if {p}s < {p}steps:",
                     *copies(f"{p}s", f"{p}s", "        "), *consumer]
        tree = ast.parse("\n".join(lines))
        for n in ast.walk(tree):
            if hasattr(n, "lineno"):
                n.lineno, n.col_offset = node.lineno, node.col_offset
                n.end_lineno, n.end_col_offset = node.lineno, node.col_offset

        class Splice(ast.NodeTransformer):
            def visit_Expr(self, e):
                if isinstance(e.value, ast.Name) and e.value.id == "__BODY__":
                    return node.body
                return e

        tree = Splice().visit(tree)
        self.run_body(tree.body)
        for name in [n for n in sc if n.startswith(p)]:
            del sc[name]

    def builtin_store_async(self, args: list, kwargs: dict) -> None:
        if len(args) != 3 or set(kwargs) - {"reduce"}:
            raise self.error("store_async(dst, coords, src, reduce=None) takes a tensor, a tuple of element "
                             "coordinates and an SMEM tile")
        dst, coords, src = args
        if not isinstance(dst, Ref) or not isinstance(src, SmemRef):
            raise self.error("store_async copies an SMEM tile into a tensor argument of the kernel")
        coords = coords if isinstance(coords, (tuple, list)) else (coords,)
        if len(coords) != dst.ndim:
            raise self.error(f"{dst.name} has rank {dst.ndim}; store_async needs {dst.ndim} coordinates")
        descriptor = self._tma_descriptor(dst, src)
        starts = [self.cast(self.to_tensor(c), dtypes.int32).value for c in coords]
        self.builder.add(ops.TmaStore(dst.value, starts, src.value, descriptor, kwargs.get("reduce"),
                                     self.builder.loc))

    def builtin_store_async_wait(self, args: list, kwargs: dict) -> None:
        pending = args[0] if args else kwargs.get("pending", 0)
        if not isinstance(pending, int) or not 0 <= pending <= 7:
            raise self.error(f"store_async_wait takes a static count 0..7, got {pending!r}")
        self.builder.add(ops.TmaStoreWait(pending, self.builder.loc))

    def builtin_wgmma(self, args: list, kwargs: dict) -> Tensor:
        if len(args) != 3 or kwargs:
            raise self.error("wgmma(acc, a, b) takes the accumulator and two SMEM tiles")
        acc, a, b = args
        if not isinstance(acc, Tensor) or not acc.shape:
            raise self.error("the wgmma accumulator must be a register array (e.g. mgjit.zeros((BM, BN), mgjit.float32))")
        if not isinstance(b, SmemRef):
            raise self.error("wgmma operand b must be an SMEM tile")
        if not isinstance(a, SmemRef) and not (isinstance(a, Tensor) and a.shape):
            raise self.error("wgmma operand a must be an SMEM tile or a register array")
        return self._emit(ops.Wgmma(acc.value, a.value, b.value, self.builder.loc))

    def builtin_wgmma_wait(self, args: list, kwargs: dict) -> None:
        pending = args[0] if args else kwargs.get("pending", 0)
        if not isinstance(pending, int):
            raise self.error("wgmma_wait takes a static number of pending groups")
        # Every 32-bit register array in scope goes through the wait, so no read of an accumulator can be
        # scheduled before the tensor cores are done with it.
        names = [n for n, v in self.scope.items() if isinstance(v, Tensor) and v.shape and v.dtype.bits == 32]
        op = self.builder.add(ops.WgmmaWait(pending, [self.scope[n].value for n in names], self.builder.loc))
        for n, r in zip(names, op.results):
            self.scope[n] = Tensor(self, r)
        return None

    def builtin_cluster_rank(self, args: list, kwargs: dict) -> Tensor:
        return self._emit(ops.ClusterRank(self.builder.loc))

    def builtin_cluster_sync(self, args: list, kwargs: dict) -> None:
        self.builder.add(ops.ClusterSync(self.builder.loc))

    def builtin_cluster_reduce(self, args: list, kwargs: dict) -> Tensor:
        x = args[0] if args else kwargs.get("x")
        kind = args[1] if len(args) > 1 else kwargs.get("kind")
        if kind not in lang.REDUCE_BUILTINS.values():
            raise self.error(f"cluster_reduce(x, kind): kind is one of {sorted(lang.REDUCE_BUILTINS.values())}, "
                             f"got {kind!r}")
        x = self.to_tensor(x)
        if x.dtype not in (dtypes.float32, dtypes.int32):
            raise self.error(f"cluster_reduce combines float32 or int32 values, got {x.dtype.name}; use .astype()")
        ctas = self.cluster[0] * self.cluster[1] * self.cluster[2]
        return self._emit(ops.ClusterReduce(kind, x.value, ctas, self.builder.loc))

    def builtin_fence_async_shared(self, args: list, kwargs: dict) -> None:
        self.builder.add(ops.FenceAsyncShared(self.builder.loc))

    def builtin_set_max_registers(self, args: list, kwargs: dict) -> None:
        count = args[0] if args else kwargs.get("count")
        increase = kwargs.get("increase", True)
        if not isinstance(count, int):
            raise self.error("set_max_registers takes a static register count")
        self.builder.add(ops.SetMaxRegisters(count, bool(increase), self.builder.loc))

    # -- Blackwell builtins
    def builtin_tmem(self, args: list, kwargs: dict) -> TmemRef:
        usage = "tmem(shape, dtype=mgjit.float32, collective=False, packing=None)"
        if len(args) > 2 or set(kwargs) - {"shape", "dtype", "collective", "packing"}:
            raise self.error(f"bad call: {usage}")
        shape = args[0] if args else kwargs.get("shape")
        dtype = args[1] if len(args) > 1 else kwargs.get("dtype", dtypes.float32)
        collective = kwargs.get("collective", False)
        packing = kwargs.get("packing")
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise self.error(f"mgjit.tmem needs a static shape of positive ints, got {shape}")
        if not isinstance(dtype, DType):
            raise self.error(f"mgjit.tmem needs an mgjit dtype, got {dtype!r}")
        if not isinstance(collective, bool):
            raise self.error(f"mgjit.tmem's collective= must be a static bool, got {collective!r}")
        if packing is None:  # as many elements as fill a 32-bit column (1 for float32 accumulators)
            packing = 32 // dtype.bits if dtype.bits in (8, 16, 32) else 1
        if not isinstance(packing, int) or isinstance(packing, bool):
            raise self.error(f"mgjit.tmem's packing= must be a static int, got {packing!r}")
        op = self.builder.add(ops.TmemAlloc(shape, dtype, packing, collective, self.builder.loc))
        return TmemRef(self, op.result)

    def builtin_tcgen05_mma(self, args: list, kwargs: dict) -> None:
        if len(args) != 3 or set(kwargs) - {"accumulate"}:
            raise self.error("tcgen05_mma(acc, a, b, accumulate=True) takes a TMEM accumulator, an SMEM tile or TMEM "
                             "reference, and an SMEM tile")
        acc, a, b = args
        if not isinstance(acc, TmemRef):
            raise self.error("the tcgen05_mma accumulator must be a TMEM reference "
                             "(mgjit.tmem((M, N), mgjit.float32))")
        if not isinstance(a, (SmemRef, TmemRef)):
            raise self.error("tcgen05_mma operand a must be an SMEM tile or a TMEM reference")
        if not isinstance(b, SmemRef):
            raise self.error("tcgen05_mma operand b must be an SMEM tile")
        accumulate = kwargs.get("accumulate", True)
        if isinstance(accumulate, Expanded) or (isinstance(accumulate, Tensor) and accumulate.shape):
            raise self.error("accumulate= must be a scalar: a bool or a runtime condition such as k > 0")
        flag = self.cast(self.to_tensor(accumulate), dtypes.bool_)
        self.builder.add(ops.Tcgen05Mma(acc.value, a.value, b.value, flag.value, self.builder.loc))

    def builtin_tcgen05_commit(self, args: list, kwargs: dict) -> None:
        bar = args[0] if len(args) == 1 and not kwargs else kwargs.get("barrier") if not args else None
        if not isinstance(bar, BarrierSlot) or set(kwargs) - {"barrier"}:
            raise self.error("tcgen05_commit(bars[i]) takes one barrier slot")
        ref, _ = bar._ref(self)
        self.builder.add(ops.Tcgen05Commit(ref, self.builder.loc))

    def inline(self, fn: DeviceFunction, args: list, kwargs: dict, node: ast.Call) -> Any:
        if self.depth > 32:
            raise self.error(f"device function {fn.__name__} recurses too deeply (recursion is not supported)")
        src = fn.source
        sig = inspect.signature(fn.fn)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise self.error(f"bad call of {fn.__name__}: {e}") from None
        bound.apply_defaults()
        tracer = Tracer(src, self.builder, dict(bound.arguments), self.depth + 1, parent=self)
        saved_loc = self.builder.loc
        try:
            tracer.run_body(src.node.body)
            result = None
        except _Return as r:
            result = r.value
        finally:
            self.builder.loc = saved_loc
        return result


@dataclasses.dataclass(frozen=True)
class TileSpec:
    """mgjit.tile(...): the block of `tensor` at origin + k * step, for mgjit.pipeline."""

    tensor: Ref
    origin: tuple
    block: tuple[int, ...]
    step: tuple[int, ...]
    swizzle: int | None


_pipeline_ids = itertools.count(1)


class _SlotMethod:
    def __init__(self, slot: BarrierSlot, method: str):
        self.slot = slot
        self.method = method


_HOPPER_BUILTINS = (lang.smem, lang.barrier, lang.copy_async, lang.wgmma, lang.wgmma_wait, lang.fence_async_shared,
                    lang.set_max_registers, lang.store_async, lang.store_async_wait, lang.tile, lang.cluster_rank,
                    lang.cluster_sync, lang.cluster_reduce)
_BLACKWELL_BUILTINS = (lang.tmem, lang.tcgen05_mma, lang.tcgen05_commit)


def _finish_tmem(body: ir.Block, builder: Builder, loc: Loc) -> int:
    """Tensor memory's kernel-wide rules, and its deallocation (TmemDealloc) where the kernel ends; returns the
    kernel's CTA group (2 when its tensor memory serves 2-CTA MMAs)."""
    allocs = [op for op in body.walk() if isinstance(op, ops.TmemAlloc)]
    if not allocs:
        return 1
    top = {id(op) for op in body.ops}
    for op in allocs:
        if id(op) not in top:
            raise op.error("mgjit.tmem allocates tensor memory for the whole kernel: call it at the kernel's top "
                           "level, not inside a runtime `for` or `if`", rule="tmem-alloc")
    first = allocs[0]
    for op in allocs[1:]:
        if op.result.type.collective != first.result.type.collective:
            raise op.error(f"a kernel's tcgen05 instructions all use one CTA group (PTX ISA): this TMEM reference has "
                           f"collective={op.result.type.collective}, the one at line {first.loc.line} "
                           f"collective={first.result.type.collective}", rule="cta-group")
    if first.result.type.collective:
        for op in body.ops[body.ops.index(first) + 1:]:
            if isinstance(op, ops.BarrierAlloc):
                raise op.error("in a 2-CTA (collective) kernel allocate barriers before tensor memory: the TMEM "
                               "allocation synchronises the CTA pair, which makes the initialised barriers visible "
                               "to the peer CTA", rule="cta-group")
    builder.add(ops.TmemDealloc([op.result for op in allocs], loc))
    return 2 if first.result.type.collective else 1


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> list[int]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise ValueError
        out.append(max(x, y))
    return out[::-1]


def _hidden(scope: dict[str, Any]) -> set[str]:
    """Variables the trace keeps for the user (barrier phases), carried through loops and ifs like theirs."""
    return {n for n in scope if n.startswith("$")}


def _assigned_names(stmts: Sequence[ast.stmt]) -> set[str]:
    names = set()
    for stmt in stmts:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
    return names


_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
           ast.Mod: "mod", ast.Pow: "pow", ast.BitAnd: "and", ast.BitOr: "or", ast.BitXor: "xor",
           ast.LShift: "shl", ast.RShift: "shr"}
_PY_BINOPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "pow": lambda a, b: a ** b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << b, "shr": lambda a, b: a >> b}
_CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_PY_CMP = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
           "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


# ---------------------------------------------------------------------------------------------- entry

def trace(source: SourceFunction, params: list[ir.Param], constexprs: dict[str, Any],
          num_warpgroups: int, cluster: tuple[int, int, int] = (1, 1, 1)) -> ir.Kernel:
    """Build the IR of one specialization of a kernel."""
    body = ir.Block()
    builder = Builder(body)
    args: list[ir.Value] = []
    scope: dict[str, Any] = dict(constexprs)
    tracer = Tracer(source, builder, scope)
    tracer.num_warpgroups = num_warpgroups
    tracer.cluster = cluster
    for i, p in enumerate(params):
        tracer.param_index[p.name] = i
        if p.kind == "tensor":
            v = ir.Value(ir.RefType("gmem", p.dtype, p.rank))
            scope[p.name] = Ref(tracer, v, p.name)
        else:
            v = ir.Value(ir.ScalarType(p.dtype))
            scope[p.name] = Tensor(tracer, v)
        args.append(v)
    try:
        tracer.run_body(source.node.body)
    except _Return:
        pass
    except RecursionError:
        raise tracer.error("the kernel is nested too deeply to compile") from None
    cta_group = _finish_tmem(body, builder, source.loc(source.node))
    kernel = ir.Kernel(source.name, params, args, body, num_warpgroups, source.loc(source.node),
                       tracer.tma_descriptors, cta_group)
    ir.verify(kernel)
    return kernel

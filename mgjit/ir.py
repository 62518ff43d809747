"""mgjit's IR: typed SSA values, one class per op, structured control flow, a printer and a verifier.

Values are scalars (uniform across the threads of a warpgroup), register arrays (static shape, dtype and,
after layout inference, a layout) and references to memory. Every op records the user source location it
came from, so any later stage can raise a CompileError that names the kernel's file and line.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import ClassVar, Iterator, Sequence

from . import dtypes
from .dtypes import DType
from .errors import CompileError, Loc
from .layouts import Layout


# ---------------------------------------------------------------------------------------------- types

@dataclasses.dataclass(frozen=True)
class ScalarType:
    dtype: DType

    def __str__(self) -> str:
        return self.dtype.name


@dataclasses.dataclass(frozen=True)
class ArrayType:
    shape: tuple[int, ...]
    dtype: DType

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True)
class RefType:
    """A reference to memory. GMEM references have runtime sizes and strides (passed at launch)."""

    space: str  # "gmem" (later "smem", "tmem")
    dtype: DType
    rank: int

    def __str__(self) -> str:
        return f"ref<{self.space}, {self.dtype.name}, rank {self.rank}>"


Type = ScalarType | ArrayType | RefType


# ---------------------------------------------------------------------------------------------- values, ops

class Value:
    _ids = itertools.count()

    def __init__(self, type: Type, owner: "Op | Block | None" = None):
        self.type = type
        self.owner = owner
        self.layout: Layout | None = None
        self.id = next(Value._ids)

    @property
    def is_array(self) -> bool:
        return isinstance(self.type, ArrayType)

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.id}: {self.type}"


class Op:
    """Base of every IR op. Subclasses set `name` and implement `verify`."""

    name: ClassVar[str] = "?"

    def __init__(self, operands: Sequence[Value], result_types: Sequence[Type], loc: Loc | None,
                 regions: Sequence["Block"] = ()):
        self.operands = list(operands)
        self.results = [Value(t, self) for t in result_types]
        self.loc = loc
        self.regions = list(regions)

    @property
    def result(self) -> Value:
        (r,) = self.results
        return r

    def attrs(self) -> dict[str, object]:
        """Attributes shown by the printer (and part of equality of IR text)."""
        return {}

    def verify(self) -> None:
        pass

    def error(self, message: str, rule: str | None = None) -> CompileError:
        return CompileError(message, self.loc, rule)


class Block:
    def __init__(self, arg_types: Sequence[Type] = ()):
        self.args = [Value(t, self) for t in arg_types]
        self.ops: list[Op] = []
        self.parent: Op | None = None  # the op whose region this block is

    def walk(self) -> Iterator[Op]:
        for op in self.ops:
            yield op
            for region in op.regions:
                yield from region.walk()


@dataclasses.dataclass
class Param:
    """A kernel parameter as the launcher passes it."""

    name: str
    kind: str  # "tensor" or "scalar"
    dtype: DType
    rank: int = 0


@dataclasses.dataclass
class Kernel:
    """A whole kernel in IR: its runtime parameters (one Value each) and its body."""

    name: str
    params: list[Param]
    args: list[Value]
    body: Block
    num_warpgroups: int
    loc: Loc

    def walk(self) -> Iterator[Op]:
        return self.body.walk()


def _check(cond: bool, op: Op, message: str) -> None:
    if not cond:
        raise op.error(message)


def _is_int_scalar(v: Value) -> bool:
    return isinstance(v.type, ScalarType) and v.dtype.is_int


# ---- scalars and kernel geometry

class Constant(Op):
    name = "constant"

    def __init__(self, value: int | float | bool, dtype: DType, loc: Loc | None):
        super().__init__([], [ScalarType(dtype)], loc)
        self.value = value

    def attrs(self):
        return {"value": self.value}


class ProgramId(Op):
    name = "program_id"

    def __init__(self, axis: int, loc: Loc | None):
        super().__init__([], [ScalarType(dtypes.int32)], loc)
        self.axis = axis

    def attrs(self):
        return {"axis": self.axis}

    def verify(self):
        _check(self.axis in (0, 1, 2), self, f"program_id axis must be 0, 1 or 2, got {self.axis}")


class NumPrograms(ProgramId):
    name = "num_programs"


class WarpgroupId(Op):
    name = "warpgroup_id"

    def __init__(self, loc: Loc | None):
        super().__init__([], [ScalarType(dtypes.int32)], loc)


class RefDim(Op):
    """The runtime size of one dimension of a GMEM reference."""

    name = "ref_dim"

    def __init__(self, ref: Value, axis: int, loc: Loc | None):
        super().__init__([ref], [ScalarType(dtypes.int32)], loc)
        self.axis = axis

    def attrs(self):
        return {"axis": self.axis}

    def verify(self):
        rank = self.operands[0].type.rank
        _check(0 <= self.axis < rank, self, f"axis {self.axis} is out of range for a reference of rank {rank}")


# ---- elementwise (on scalars and arrays alike)

UNARY_KINDS = ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos", "not")
FLOAT_ONLY_UNARY = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos")
BINARY_KINDS = ("add", "sub", "mul", "div", "floordiv", "mod", "min", "max", "and", "or", "xor", "shl", "shr", "pow")
COMPARE_KINDS = ("lt", "le", "gt", "ge", "eq", "ne")


def _same_shape(op: Op, values: Sequence[Value]) -> None:
    shapes = {v.type.shape if v.is_array else () for v in values}
    _check(len(shapes) == 1, op, f"operand shapes differ: {sorted(shapes)} (broadcasts are explicit in the IR)")


class Unary(Op):
    name = "unary"

    def __init__(self, kind: str, x: Value, loc: Loc | None):
        super().__init__([x], [x.type], loc)
        self.kind = kind

    def attrs(self):
        return {"kind": self.kind}

    def verify(self):
        x = self.operands[0]
        _check(self.kind in UNARY_KINDS, self, f"unknown unary op {self.kind}")
        if self.kind in FLOAT_ONLY_UNARY:
            _check(x.dtype.is_float, self, f"{self.kind} needs a floating-point operand, got {x.dtype.name}")


class Binary(Op):
    name = "binary"

    def __init__(self, kind: str, a: Value, b: Value, loc: Loc | None):
        super().__init__([a, b], [a.type], loc)
        self.kind = kind

    def attrs(self):
        return {"kind": self.kind}

    def verify(self):
        a, b = self.operands
        _check(self.kind in BINARY_KINDS, self, f"unknown binary op {self.kind}")
        _same_shape(self, [a, b])
        _check(a.dtype == b.dtype, self, f"operand dtypes differ: {a.dtype.name} and {b.dtype.name}")
        if self.kind in ("and", "or", "xor", "shl", "shr"):
            _check(a.dtype.is_int, self, f"{self.kind} needs integer operands, got {a.dtype.name}")


class Compare(Op):
    name = "compare"

    def __init__(self, kind: str, a: Value, b: Value, loc: Loc | None):
        rtype = ArrayType(a.type.shape, dtypes.bool_) if a.is_array else ScalarType(dtypes.bool_)
        super().__init__([a, b], [rtype], loc)
        self.kind = kind

    def attrs(self):
        return {"kind": self.kind}

    def verify(self):
        a, b = self.operands
        _check(self.kind in COMPARE_KINDS, self, f"unknown comparison {self.kind}")
        _same_shape(self, [a, b])
        _check(a.dtype == b.dtype, self, f"operand dtypes differ: {a.dtype.name} and {b.dtype.name}")


class Select(Op):
    name = "select"

    def __init__(self, cond: Value, a: Value, b: Value, loc: Loc | None):
        super().__init__([cond, a, b], [a.type], loc)

    def verify(self):
        cond, a, b = self.operands
        _check(cond.dtype == dtypes.bool_, self, f"the condition of where must be bool, got {cond.dtype.name}")
        _same_shape(self, [cond, a, b])
        _check(a.dtype == b.dtype, self, f"where's branches differ in dtype: {a.dtype.name} and {b.dtype.name}")


class Cast(Op):
    name = "cast"

    def __init__(self, x: Value, dtype: DType, loc: Loc | None):
        rtype = ArrayType(x.type.shape, dtype) if x.is_array else ScalarType(dtype)
        super().__init__([x], [rtype], loc)

    def attrs(self):
        return {"to": self.results[0].dtype.name}


# ---- array construction, shape ops, reductions

class Splat(Op):
    """An array whose every element is one scalar."""

    name = "splat"

    def __init__(self, x: Value, shape: tuple[int, ...], loc: Loc | None):
        super().__init__([x], [ArrayType(shape, x.dtype)], loc)

    def verify(self):
        _check(isinstance(self.operands[0].type, ScalarType), self, "splat takes a scalar")


class Iota(Op):
    """arange: element i of a 1D int32 array is start + i."""

    name = "iota"

    def __init__(self, start: int, size: int, loc: Loc | None):
        super().__init__([], [ArrayType((size,), dtypes.int32)], loc)
        self.start = start

    def attrs(self):
        return {"start": self.start}


class Broadcast(Op):
    """Broadcast `x` to `shape`; `dims[i]` is the result dimension that operand dimension i becomes."""

    name = "broadcast"

    def __init__(self, x: Value, shape: tuple[int, ...], dims: tuple[int, ...], loc: Loc | None):
        super().__init__([x], [ArrayType(shape, x.dtype)], loc)
        self.dims = dims

    def attrs(self):
        return {"dims": self.dims}

    def verify(self):
        src = self.operands[0].type.shape
        shape = self.results[0].type.shape
        _check(len(src) == len(self.dims), self, f"broadcast dims {self.dims} do not match operand rank {len(src)}")
        for d, n in zip(self.dims, src):
            _check(shape[d] == n, self, f"cannot broadcast a dimension of {n} to {shape[d]}")


REDUCE_KINDS = ("sum", "max", "min")


class Reduce(Op):
    name = "reduce"

    def __init__(self, kind: str, x: Value, axes: tuple[int, ...], loc: Loc | None):
        shape = tuple(d for i, d in enumerate(x.type.shape) if i not in axes)
        rtype = ArrayType(shape, x.dtype) if shape else ScalarType(x.dtype)
        super().__init__([x], [rtype], loc)
        self.kind = kind
        self.axes = axes

    def attrs(self):
        return {"kind": self.kind, "axes": self.axes}

    def verify(self):
        _check(self.kind in REDUCE_KINDS, self, f"unknown reduction {self.kind}")
        rank = len(self.operands[0].type.shape)
        _check(all(0 <= a < rank for a in self.axes), self, f"reduction axes {self.axes} out of range for rank {rank}")


class Relayout(Op):
    """Move an array into another register layout (inserted by layout inference; visible in the IR)."""

    name = "relayout"

    def __init__(self, x: Value, layout: Layout, loc: Loc | None):
        super().__init__([x], [x.type], loc)
        self.results[0].layout = layout


# ---- GMEM access

class _GmemAccess(Op):
    """Shared shape logic of Load and Store: a window of static `sizes` at runtime `starts`; squeezed dims
    (integer indices) are dropped from the register array's shape."""

    def _init_window(self, sizes: tuple[int, ...], squeeze: tuple[bool, ...]):
        self.sizes = sizes
        self.squeeze = squeeze

    @property
    def window_shape(self) -> tuple[int, ...]:
        return tuple(s for s, q in zip(self.sizes, self.squeeze) if not q)

    def attrs(self):
        return {"sizes": self.sizes, "squeeze": tuple(int(q) for q in self.squeeze)}

    def _verify_window(self, ref: Value, starts: Sequence[Value]):
        _check(isinstance(ref.type, RefType) and ref.type.space == "gmem", self, "expected a GMEM reference")
        _check(len(starts) == ref.type.rank == len(self.sizes), self,
               f"a reference of rank {ref.type.rank} needs {ref.type.rank} indices, got {len(starts)}")
        for s in starts:
            _check(_is_int_scalar(s), self, f"indices must be integer scalars, got {s.type}")


class Load(_GmemAccess):
    name = "load"

    def __init__(self, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...], squeeze: tuple[bool, ...],
                 other: Value, loc: Loc | None):
        shape = tuple(s for s, q in zip(sizes, squeeze) if not q)
        rtype = ArrayType(shape, ref.dtype) if shape else ScalarType(ref.dtype)
        super().__init__([ref, *starts, other], [rtype], loc)
        self._init_window(sizes, squeeze)

    @property
    def ref(self) -> Value:
        return self.operands[0]

    @property
    def starts(self) -> list[Value]:
        return self.operands[1:-1]

    @property
    def other(self) -> Value:
        return self.operands[-1]

    def verify(self):
        self._verify_window(self.ref, self.starts)
        _check(self.other.dtype == self.ref.dtype, self, "the fill value must have the reference's dtype")


class Store(_GmemAccess):
    name = "store"

    def __init__(self, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...], squeeze: tuple[bool, ...],
                 value: Value, loc: Loc | None):
        super().__init__([ref, *starts, value], [], loc)
        self._init_window(sizes, squeeze)

    @property
    def ref(self) -> Value:
        return self.operands[0]

    @property
    def starts(self) -> list[Value]:
        return self.operands[1:-1]

    @property
    def value(self) -> Value:
        return self.operands[-1]

    def verify(self):
        self._verify_window(self.ref, self.starts)
        shape = self.value.type.shape if self.value.is_array else ()
        _check(shape == self.window_shape, self,
               f"storing an array of shape {shape} into a window of shape {self.window_shape}")
        _check(self.value.dtype == self.ref.dtype, self,
               f"storing {self.value.dtype.name} into a {self.ref.dtype.name} reference; use .astype()")


# ---- structured control flow

class For(Op):
    """`for iv in range(lower, upper, step)`; the body's block args are (iv, *carried), it ends in Yield."""

    name = "for"

    def __init__(self, lower: Value, upper: Value, step: Value, inits: Sequence[Value], loc: Loc | None):
        body = Block([lower.type, *(v.type for v in inits)])
        super().__init__([lower, upper, step, *inits], [v.type for v in inits], loc, [body])
        body.parent = self

    @property
    def body(self) -> Block:
        return self.regions[0]

    @property
    def inits(self) -> list[Value]:
        return self.operands[3:]

    def verify(self):
        for v in self.operands[:3]:
            _check(_is_int_scalar(v), self, f"range bounds must be integers, got {v.type}")


class If(Op):
    """Two regions, each ending in Yield of the op's results."""

    name = "if"

    def __init__(self, cond: Value, result_types: Sequence[Type], loc: Loc | None):
        super().__init__([cond], result_types, loc, [Block(), Block()])

    def verify(self):
        cond = self.operands[0]
        _check(isinstance(cond.type, ScalarType), self,
               "an `if` condition must be a scalar; for arrays use mgjit.where")


class Yield(Op):
    name = "yield"

    def __init__(self, values: Sequence[Value], loc: Loc | None):
        super().__init__(values, [], loc)


# ---------------------------------------------------------------------------------------------- verifier

def verify(kernel: Kernel) -> None:
    """Check every op's own rules and that every operand is defined before use, in scope."""

    def check_block(block: Block, visible: set[int]):
        visible = visible | {a.id for a in block.args}
        for op in block.ops:
            for v in op.operands:
                if v.id not in visible:
                    raise op.error(f"internal error: operand %{v.id} of {op.name} is not defined before its use")
            op.verify()
            for region in op.regions:
                check_block(region, visible)
            visible |= {r.id for r in op.results}

    check_block(kernel.body, {a.id for a in kernel.args})


# ---------------------------------------------------------------------------------------------- printer

def format_kernel(kernel: Kernel, layouts: bool = True) -> str:
    """The kernel as readable text; value numbers are renumbered from 0 so the text is stable."""
    names: dict[int, str] = {}

    def name(v: Value) -> str:
        if v.id not in names:
            names[v.id] = f"%{len(names)}"
        return names[v.id]

    def typ(v: Value) -> str:
        text = str(v.type)
        if layouts and v.layout is not None:
            text += f" {v.layout!r}"
        return text

    lines = []
    params = ", ".join(f"{name(a)}: {a.type} ({p.name})" for a, p in zip(kernel.args, kernel.params))
    lines.append(f"kernel @{kernel.name}({params}) warpgroups={kernel.num_warpgroups} {{")

    def emit(block: Block, indent: str):
        for op in block.ops:
            lhs = ", ".join(name(r) for r in op.results)
            attrs = op.attrs()
            attr_text = (" {" + ", ".join(f"{k}={v}" for k, v in attrs.items()) + "}") if attrs else ""
            operands = ", ".join(name(v) for v in op.operands)
            types = ", ".join(typ(r) for r in op.results)
            loc = f"  # line {op.loc.line}" if op.loc else ""
            text = f"{indent}{lhs + ' = ' if lhs else ''}{op.name}{attr_text}({operands})"
            if types:
                text += f" : {types}"
            lines.append(text + loc)
            for i, region in enumerate(op.regions):
                args = ", ".join(f"{name(a)}: {typ(a)}" for a in region.args)
                lines.append(f"{indent}  ^region{i}({args}):")
                emit(region, indent + "    ")

    emit(kernel.body, "  ")
    lines.append("}")
    return "\n".join(lines)

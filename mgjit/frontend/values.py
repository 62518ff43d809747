"""The values a kernel's Python code handles while it is traced: `Tensor` (a scalar or register array, whose
Python operators emit IR), `Expanded` (an array viewed with extra size-1 dimensions, for broadcasting), `Ref` (a
tensor argument), the SMEM and TMEM references and the mbarriers; and the `Builder` that appends ops where the
trace is.

A value here is data and its plain attributes (`attributes`). What it does beyond arithmetic (indexing,
methods such as `bars[i].wait()` or `acc.load()`) is registered beside the builtins of its hardware unit
(`registry.method`), so that one table says what each value supports.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from .. import ir, ops
from ..dtypes import DType, int32, int64
from ..errors import CompileError, Loc, Rule


class Builder:
    """Appends ops to the current block, stamping each with the location being traced."""

    def __init__(self, block: ir.Block):
        self.block = block
        self.loc: Loc | None = None
        self.top = block  # the kernel's body
        self._hoisted = 0

    def add(self, op: ir.Op) -> ir.Op:
        op.loc = op.loc or self.loc
        if self.block.ops and isinstance(self.block.ops[-1], ops.WarpSplit):
            raise op.error("the `if mgjit.warp_id() == w:` blocks (warp roles) end their block: the warps run them "
                           "side by side, so nothing may follow them there; move this before the first of them",
                           rule=Rule.WARP_ROLE)
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


class Trace(Protocol):
    """What a value needs of the trace that made it (semantics.Semantics is one): its operators emit IR there."""

    builder: Builder
    scope: dict[str, Any]

    def binary(self, kind: str, a: Any, b: Any) -> Any: ...
    def unary(self, kind: str, x: Any) -> Any: ...
    def compare(self, kind: str, a: Any, b: Any) -> Any: ...
    def to_tensor(self, x: Any, like: DType | None = None) -> "Tensor": ...
    def error(self, message: str) -> CompileError: ...


class Traced:
    """Base of the values the trace makes. `kind` names the value in messages; `attributes` are the plain
    attributes a kernel may read (everything else it may do is registered in `registry`)."""

    kind = "a runtime value"
    attributes: tuple[str, ...] = ()


class Shape(tuple):
    """`x.shape` as a kernel reads it: a tuple that says whose shape it is (`of`), for the message of an index
    past its end."""

    of: str

    def __new__(cls, dims: tuple, of: str):
        shape = super().__new__(cls, dims)
        shape.of = of
        return shape


class _Operators:
    """Python operators on runtime values (and expanded views), emitting IR through the tracer."""

    tracer: "Trace"

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


class _Wrapped(Traced):
    """A traced value that wraps one IR value, made by (and calling back into) `tracer`."""

    def __init__(self, tracer: "Trace", value: ir.Value):
        self.tracer = tracer
        self.value = value

    @property
    def dtype(self) -> DType:
        return self.value.dtype


class Tensor(_Operators, _Wrapped):
    """A scalar or register array during tracing."""

    attributes = ("dtype", "shape", "ndim")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.type.shape if self.value.is_array else ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __bool__(self):
        raise self.tracer.error("a runtime value has no truth value at compile time; use it in an `if` "
                                "statement directly or use mgjit.where for arrays")


class Expanded(_Operators, Traced):
    """`x[:, None]` or a keepdims reduction: an array viewed with extra size-1 dimensions. It exists only to
    be broadcast against another array (where a size-1 dimension costs nothing)."""

    kind = "an expanded array view"
    attributes = ("dtype", "shape", "ndim")

    def __init__(self, tensor: Tensor, shape: tuple[int, ...], dims: tuple[int, ...]):
        self.tensor = tensor
        self.shape = shape
        self.dims = dims  # result dimension of each dimension of `tensor`
        self.dtype = tensor.dtype
        self.tracer = tensor.tracer

    @property
    def ndim(self) -> int:
        return len(self.shape)


class Ref(_Wrapped):
    """A GMEM reference (a tensor argument) during tracing."""

    kind = "a tensor argument"
    attributes = ("dtype", "shape", "ndim")

    def __init__(self, tracer: "Trace", value: ir.Value, name: str):
        super().__init__(tracer, value)
        self.name = name
        self._dims: list[Tensor] | None = None

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


class _StaticRef(_Wrapped):
    """During tracing, a reference with a static shape (shared or tensor memory)."""

    attributes = ("dtype", "shape")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.type.shape)


class SmemScope:
    """The `with mgjit.scoped_smem(...)` block that allocated a buffer: where it began and, once left, ended."""

    def __init__(self, begin: Loc | None):
        self.begin = begin
        self.end: Loc | None = None


class SmemRef(_StaticRef):
    """A shared-memory buffer or a view of one during tracing. A buffer of a `with mgjit.scoped_smem(...)` block
    (and every view of it) carries that block's `scope`: once the block is left its bytes belong to later
    scopes, and using it is an error."""

    kind = "an SMEM buffer"

    def __init__(self, tracer: "Trace", value: ir.Value, scope: SmemScope | None = None):
        self.scope = scope
        super().__init__(tracer, value)

    @property
    def value(self) -> ir.Value:
        if self.scope is not None and self.scope.end is not None:
            begin, end = self.scope.begin, self.scope.end
            raise CompileError(f"this uses the SMEM buffer of the `with mgjit.scoped_smem(...)` at line "
                               f"{begin.line if begin else '?'} after that block ended (line {end.line}): its bytes "
                               f"now belong to the scopes that follow", self.tracer.builder.loc)
        return self._value

    @value.setter
    def value(self, value: ir.Value) -> None:
        self._value = value


class TmemRef(_StaticRef):
    """A tensor-memory reference during tracing."""

    kind = "a TMEM reference"


class WarpIndex:
    """`mgjit.warp_id()`: the warp's index in its warpgroup, which only an `if mgjit.warp_id() == w:` compares (a
    runtime value that differs between the warps of a warpgroup would break the warpgroup's uniform scalars)."""

    def __init__(self, tracer: "Trace"):
        self.tracer = tracer

    def __eq__(self, other):  # type: ignore[override]
        if isinstance(other, int) and not isinstance(other, bool) and 0 <= other < 4:
            return WarpCondition(other)
        raise self.tracer.error(f"mgjit.warp_id() is compared with a static warp number 0..3, got {other!r}")

    def _misuse(self, *_):
        raise self.tracer.error("mgjit.warp_id() is used only as `if mgjit.warp_id() == w:` (a warp's role)")

    __getattr__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = _misuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __floordiv__ = __mod__ = _misuse
    __hash__ = object.__hash__


@dataclasses.dataclass(frozen=True)
class WarpCondition:
    """`mgjit.warp_id() == warp`: the condition of warp `warp`'s role."""

    warp: int


class Barriers(Traced):
    """An array of mbarriers. Each keeps a phase bit per slot in a hidden variable of the trace, so that
    `bars[i].wait()` waits for the right phase without the user tracking it (carried through loops/ifs)."""

    kind = "a barrier array"
    _ids = 0

    def __init__(self, tracer: "Trace", value: ir.Value, count: int):
        self.value = value
        self.count = count
        Barriers._ids += 1
        self.phase_var = f"$phase{Barriers._ids}"
        # One bit a slot: an int32 for up to 32 slots, an int64 for up to 64 (BarrierAlloc refuses more).
        tracer.scope[self.phase_var] = tracer.to_tensor(0, int32 if count <= 32 else int64)


class BarrierSlot(Traced):
    """`bars[i]`: one mbarrier of an array."""

    kind = "a barrier"

    def __init__(self, barriers: Barriers, index: Any):
        self.barriers = barriers
        self.index = index


class NamedBarriers(Traced):
    """An array of named barriers between warpgroups (`mgjit.named_barrier(count, warpgroups)`)."""

    kind = "a named-barrier array"

    def __init__(self, value: ir.Value, count: int, warpgroups: int):
        self.value = value
        self.count = count
        self.warpgroups = warpgroups


class NamedBarrierSlot(Traced):
    """`nbars[i]`: one named barrier of an array."""

    kind = "a named barrier"

    def __init__(self, barriers: NamedBarriers, index: Any):
        self.barriers = barriers
        self.index = index

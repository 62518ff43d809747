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
    """A reference to memory. GMEM references have runtime sizes and strides (passed at launch); SMEM
    references have a static shape, an optional swizzle (bytes) and may be a transposed view; a barrier
    reference is an array of mbarriers (rank 1) or one of them (rank 0)."""

    space: str  # "gmem", "smem" or "barrier"
    dtype: DType
    rank: int
    shape: tuple[int, ...] | None = None
    swizzle: int | None = None
    transposed: bool = False

    def __str__(self) -> str:
        if self.space == "gmem":
            return f"ref<gmem, {self.dtype.name}, rank {self.rank}>"
        extra = (f", swizzle {self.swizzle}" if self.swizzle else "") + (", transposed" if self.transposed else "")
        return f"ref<{self.space}, {self.dtype.name}[{','.join(map(str, self.shape or ()))}]{extra}>"


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


@dataclasses.dataclass(frozen=True)
class TmaDescriptor:
    """A TMA descriptor the launcher builds from a tensor argument: a box of `box` elements (outermost
    first) with `swizzle` bytes of swizzle (0: none). It reaches the kernel as a 128-byte parameter."""

    param: int  # index of the tensor among the kernel's parameters
    box: tuple[int, ...]
    swizzle: int


@dataclasses.dataclass
class Kernel:
    """A whole kernel in IR: its runtime parameters (one Value each) and its body."""

    name: str
    params: list[Param]
    args: list[Value]
    body: Block
    num_warpgroups: int
    loc: Loc
    tma_descriptors: list["TmaDescriptor"] = dataclasses.field(default_factory=list)

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


# ---- Hopper: shared memory, mbarriers, TMA, wgmma

def _is_ref(v: Value, space: str) -> bool:
    return isinstance(v.type, RefType) and v.type.space == space


class SmemAlloc(Op):
    """A static shared-memory buffer, allocated for the whole kernel (leading dims are usually stages)."""

    name = "smem_alloc"

    def __init__(self, shape: tuple[int, ...], dtype: DType, swizzle: int | None, loc: Loc | None):
        super().__init__([], [RefType("smem", dtype, len(shape), shape, swizzle)], loc)

    def attrs(self):
        t = self.result.type
        return {"shape": t.shape, "dtype": t.dtype.name, "swizzle": t.swizzle}


class BarrierAlloc(Op):
    """`count` mbarriers, each expecting `arrivals` arrivals per phase; initialised at kernel start."""

    name = "barrier_alloc"

    def __init__(self, count: int, arrivals: int, loc: Loc | None):
        super().__init__([], [RefType("barrier", dtypes.int64, 1, (count,))], loc)
        self.count = count
        self.arrivals = arrivals

    def attrs(self):
        return {"count": self.count, "arrivals": self.arrivals}

    def verify(self):
        _check(self.count >= 1 and 1 <= self.arrivals < 2**20, self,
               f"barriers need count >= 1 and 1 <= arrivals < 2**20, got {self.count} and {self.arrivals}")


class RefIndex(Op):
    """`ref[i]`: drop the leading dimension of an SMEM or barrier reference at a runtime index."""

    name = "ref_index"

    def __init__(self, ref: Value, index: Value, loc: Loc | None):
        t = ref.type
        shape = t.shape[1:]
        super().__init__([ref, index], [RefType(t.space, t.dtype, t.rank - 1, shape, t.swizzle)], loc)

    def verify(self):
        t = self.operands[0].type
        _check(t.space in ("smem", "barrier") and t.rank >= 1 and not t.transposed, self,
               f"only SMEM and barrier references can be indexed by a stage, got {t}")
        _check(_is_int_scalar(self.operands[1]), self, "a stage index must be an integer scalar")


class RefTranspose(Op):
    """`ref.T`: the same 2D SMEM tile read with its dimensions swapped (an MN-major MMA operand)."""

    name = "ref_transpose"

    def __init__(self, ref: Value, loc: Loc | None):
        t = ref.type
        super().__init__([ref], [RefType("smem", t.dtype, 2, (t.shape[1], t.shape[0]), t.swizzle, not t.transposed)],
                         loc)

    def verify(self):
        t = self.operands[0].type
        _check(t.space == "smem" and t.rank == 2, self, f".T applies to 2D SMEM tiles, got {t}")


class TmaLoad(Op):
    """Copy a tile of a GMEM tensor at `coords` into an SMEM tile with the TMA engine; completion is
    signalled on `barrier` (which the op arms with the byte count). Out-of-bounds elements read as zero."""

    name = "tma_load"

    def __init__(self, src: Value, coords: Sequence[Value], dst: Value, barrier: Value, descriptor: int,
                 loc: Loc | None):
        super().__init__([src, *coords, dst, barrier], [], loc)
        self.descriptor = descriptor  # index into Kernel.tma_descriptors

    @property
    def src(self) -> Value:
        return self.operands[0]

    @property
    def coords(self) -> list[Value]:
        return self.operands[1:-2]

    @property
    def dst(self) -> Value:
        return self.operands[-2]

    @property
    def barrier(self) -> Value:
        return self.operands[-1]

    def attrs(self):
        return {"descriptor": self.descriptor}

    def verify(self):
        _check(_is_ref(self.src, "gmem"), self, "TMA copies from a GMEM tensor argument")
        _check(_is_ref(self.dst, "smem") and not self.dst.type.transposed, self,
               "TMA copies into an SMEM tile (not a transposed view)")
        _check(_is_ref(self.barrier, "barrier") and self.barrier.type.rank == 0, self,
               "a TMA copy completes on one barrier: index the barrier array, e.g. bars[slot]")
        _check(len(self.coords) == self.src.type.rank == self.dst.type.rank, self,
               f"a rank-{self.src.type.rank} tensor needs {self.src.type.rank} coordinates and an SMEM tile of "
               f"that rank, got {len(self.coords)} and rank {self.dst.type.rank}")
        _check(self.src.dtype == self.dst.dtype, self,
               f"TMA cannot convert: {self.src.dtype.name} tensor into a {self.dst.dtype.name} tile")


class BarrierArrive(Op):
    name = "barrier_arrive"

    def __init__(self, barrier: Value, loc: Loc | None):
        super().__init__([barrier], [], loc)

    def verify(self):
        _check(_is_ref(self.operands[0], "barrier") and self.operands[0].type.rank == 0, self,
               "arrive on one barrier: index the barrier array")


class BarrierWait(Op):
    """Wait until the barrier completes the phase with parity `phase` (tracked by the frontend)."""

    name = "barrier_wait"

    def __init__(self, barrier: Value, phase: Value, loc: Loc | None):
        super().__init__([barrier, phase], [], loc)

    def verify(self):
        _check(_is_ref(self.operands[0], "barrier") and self.operands[0].type.rank == 0, self,
               "wait on one barrier: index the barrier array")


class Wgmma(Op):
    """acc + a @ b on the warpgroup's tensor cores, issued asynchronously (complete with WgmmaWait).
    `a` and `b` are SMEM tiles (a: (M, K), b: (K, N), either may be a transposed view); acc is (M, N)."""

    name = "wgmma"

    def __init__(self, acc: Value, a: Value, b: Value, loc: Loc | None):
        super().__init__([acc, a, b], [acc.type], loc)

    def verify(self):
        from . import mma_descriptors as md
        acc, a, b = self.operands
        _check(acc.is_array and len(acc.type.shape) == 2, self, "the wgmma accumulator is a 2D register array")
        for name, v in (("a", a), ("b", b)):
            _check(_is_ref(v, "smem") and v.type.rank == 2, self, f"wgmma operand {name} must be a 2D SMEM tile")
            _check(v.type.swizzle is not None, self, f"wgmma operand {name} needs a swizzled SMEM tile "
                   "(mgjit.smem(..., swizzle=32/64/128))")
        (m, n), (ma, k), (kb, nb) = acc.type.shape, a.type.shape, b.type.shape
        _check(m == ma and n == nb and k == kb, self,
               f"wgmma shapes do not chain: acc {acc.type.shape}, a {a.type.shape}, b {b.type.shape}")
        if m % 64:
            raise self.error(f"a warpgroup's wgmma accumulator has a multiple of 64 rows, got {m}", rule="wgmma-shape")
        _check(a.dtype == b.dtype, self, f"wgmma operands differ in dtype: {a.dtype.name} and {b.dtype.name}")
        a_major = md.Major.MN if a.type.transposed else md.Major.K
        b_major = md.Major.K if b.type.transposed else md.Major.MN
        k_step = 256 // a.dtype.bits
        if k % k_step:
            raise self.error(f"the K extent of wgmma tiles must be a multiple of {k_step} for {a.dtype.name}, "
                             f"got {k}", rule="wgmma-shape")
        try:
            md.check_wgmma_shape(64, n, k_step, a.dtype, acc.dtype, a_major, b_major)
            for v in (a, b):
                rows, cols = v.type.shape if not v.type.transposed else v.type.shape[::-1]
                md.check_swizzle(v.type.swizzle)
                if (cols * v.dtype.bits // 8) % v.type.swizzle:
                    raise md.DescriptorError(
                        f"a {v.type.swizzle}B-swizzled tile needs rows that are a multiple of {v.type.swizzle} "
                        f"bytes, got {cols} x {v.dtype.name} = {cols * v.dtype.bits // 8} bytes")
        except md.DescriptorError as e:
            raise self.error(str(e), rule="wgmma-shape") from None


class WgmmaWait(Op):
    """Wait until at most `pending` wgmma groups are in flight. The arrays it carries (accumulators) are
    returned as its results, so no read of them can be scheduled before the wait."""

    name = "wgmma_wait"

    def __init__(self, pending: int, arrays: Sequence[Value], loc: Loc | None):
        super().__init__(arrays, [a.type for a in arrays], loc)
        self.pending = pending

    def attrs(self):
        return {"pending": self.pending}

    def verify(self):
        _check(0 <= self.pending <= 7, self, f"wgmma_wait takes 0..7 pending groups, got {self.pending}")


class FenceAsyncShared(Op):
    """Order this thread's ordinary SMEM writes before later reads by the TMA engine or tensor cores."""

    name = "fence_async_shared"

    def __init__(self, loc: Loc | None):
        super().__init__([], [], loc)


class SetMaxRegisters(Op):
    name = "set_max_registers"

    def __init__(self, count: int, increase: bool, loc: Loc | None):
        super().__init__([], [], loc)
        self.count = count
        self.increase = increase

    def attrs(self):
        return {"count": self.count, "increase": self.increase}

    def verify(self):
        if not (24 <= self.count <= 256 and self.count % 8 == 0):
            raise self.error(f"set_max_registers takes a multiple of 8 in 24..256, got {self.count}",
                             rule="registers")


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

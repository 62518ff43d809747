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
        _check(isinstance(ref.type, RefType) and ref.type.space == "gmem", self, "expected a GMEM reference")
        _check(len(starts) == ref.type.rank == len(self.sizes), self,
               f"a reference of rank {ref.type.rank} needs {ref.type.rank} indices, got {len(starts)}")
        for s in starts:
            _check(_is_int_scalar(s), self, f"indices must be integer scalars, got {s.type}")


class Load(_GmemAccess):
    """Elements outside the tensor read as zero."""

    name = "load"

    def __init__(self, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...], squeeze: tuple[bool, ...],
                 loc: Loc | None):
        shape = tuple(s for s, q in zip(sizes, squeeze) if not q)
        rtype = ArrayType(shape, ref.dtype) if shape else ScalarType(ref.dtype)
        super().__init__([ref, *starts], [rtype], loc)
        self._init_window(sizes, squeeze)

    @property
    def starts(self) -> list[Value]:
        return self.operands[1:]

    def verify(self):
        self._verify_window(self.ref, self.starts)


class Store(_GmemAccess):
    name = "store"

    def __init__(self, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...], squeeze: tuple[bool, ...],
                 value: Value, loc: Loc | None):
        super().__init__([ref, *starts, value], [], loc)
        self._init_window(sizes, squeeze)

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
                 loc: Loc | None, multicast: int = 0):
        super().__init__([src, *coords, dst, barrier], [], loc)
        self.descriptor = descriptor  # index into Kernel.tma_descriptors
        # With multicast=n, each of the cluster's n CTAs copies 1/n of the tile's rows to all of them.
        self.multicast = multicast

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
        return {"descriptor": self.descriptor, **({"multicast": self.multicast} if self.multicast else {})}

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


class SmemStore(Op):
    """Write a register array into a whole SMEM tile (swizzled as the tile is), for TMA or MMA to read."""

    name = "smem_store"

    def __init__(self, tile: Value, value: Value, loc: Loc | None):
        super().__init__([tile, value], [], loc)

    def verify(self):
        tile, value = self.operands
        _check(_is_ref(tile, "smem") and not tile.type.transposed, self, "store into an SMEM tile (not a transposed view)")
        shape = value.type.shape if value.is_array else ()
        _check(shape == tile.type.shape, self, f"storing an array of shape {shape} into an SMEM tile of shape "
               f"{tile.type.shape}")
        _check(value.dtype == tile.dtype, self, f"storing {value.dtype.name} into a {tile.dtype.name} SMEM tile; "
               "use .astype()")


class TmaStore(Op):
    """Copy an SMEM tile to the tile of a GMEM tensor at `coords` with the TMA engine (or add it there, with
    reduce="add"); asynchronous: complete with TmaStoreWait before the tile is written again."""

    name = "tma_store"

    def __init__(self, dst: Value, coords: Sequence[Value], src: Value, descriptor: int, reduce: str | None,
                 loc: Loc | None):
        super().__init__([dst, *coords, src], [], loc)
        self.descriptor = descriptor
        self.reduce = reduce

    @property
    def coords(self) -> list[Value]:
        return self.operands[1:-1]

    def attrs(self):
        return {"descriptor": self.descriptor, "reduce": self.reduce}

    def verify(self):
        dst, src = self.operands[0], self.operands[-1]
        _check(_is_ref(dst, "gmem") and _is_ref(src, "smem") and not src.type.transposed, self,
               "a TMA store goes from an SMEM tile to a GMEM tensor")
        _check(len(self.coords) == dst.type.rank == src.type.rank, self,
               f"a rank-{dst.type.rank} tensor needs {dst.type.rank} coordinates and an SMEM tile of that rank")
        _check(dst.dtype == src.dtype, self, f"TMA cannot convert: {src.dtype.name} tile into {dst.dtype.name}")
        _check(self.reduce in (None, "add", "min", "max"), self, f"TMA reductions are add, min, max; got {self.reduce}")


class TmaStoreWait(Op):
    """Wait until at most `pending` TMA store groups of this warpgroup still read their SMEM source."""

    name = "tma_store_wait"

    def __init__(self, pending: int, loc: Loc | None):
        super().__init__([], [], loc)
        self.pending = pending

    def attrs(self):
        return {"pending": self.pending}


class ClusterRank(Op):
    name = "cluster_rank"

    def __init__(self, loc: Loc | None):
        super().__init__([], [ScalarType(dtypes.int32)], loc)


class ClusterSync(Op):
    """A barrier across every thread of every CTA in the cluster (release/acquire ordering)."""

    name = "cluster_sync"

    def __init__(self, loc: Loc | None):
        super().__init__([], [], loc)


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
    `b` is an SMEM tile (K, N) (or a transposed view); `a` is an SMEM tile (M, K) or a 16-bit register
    array (M, K) in the WGMMA layout; acc is (M, N)."""

    name = "wgmma"

    def __init__(self, acc: Value, a: Value, b: Value, loc: Loc | None):
        super().__init__([acc, a, b], [acc.type], loc)

    def verify(self):
        from . import mma_descriptors as md
        acc, a, b = self.operands

        def need(cond: bool, message: str) -> None:
            if not cond:
                raise self.error(message, rule="wgmma-shape")

        need(acc.is_array and len(acc.type.shape) == 2, "the wgmma accumulator is a 2D register array")
        a_in_registers = a.is_array
        if a_in_registers:
            need(len(a.type.shape) == 2 and a.dtype.bits == 16,
                 f"wgmma A from registers is a 2D f16/bf16 array, got {a.type}")
        for name, v in ((("b", b),) if a_in_registers else (("a", a), ("b", b))):
            need(_is_ref(v, "smem") and v.type.rank == 2, f"wgmma operand {name} must be a 2D SMEM tile")
            need(v.type.swizzle is not None, f"wgmma operand {name} needs a swizzled SMEM tile "
                 "(mgjit.smem(..., swizzle=32/64/128))")
        (m, n), (ma, k), (kb, nb) = acc.type.shape, a.type.shape, b.type.shape
        need(m == ma and n == nb and k == kb,
             f"wgmma shapes do not chain: acc {acc.type.shape}, a {a.type.shape}, b {b.type.shape}")
        if m % 64:
            raise self.error(f"a warpgroup's wgmma accumulator has a multiple of 64 rows, got {m}", rule="wgmma-shape")
        need(a.dtype == b.dtype, f"wgmma operands differ in dtype: {a.dtype.name} and {b.dtype.name}")
        a_major = md.Major.MN if (not a_in_registers and a.type.transposed) else md.Major.K
        b_major = md.Major.K if b.type.transposed else md.Major.MN
        k_step = 256 // a.dtype.bits
        if k % k_step:
            raise self.error(f"the K extent of wgmma tiles must be a multiple of {k_step} for {a.dtype.name}, "
                             f"got {k}", rule="wgmma-shape")
        try:
            md.check_wgmma_shape(64, n, k_step, a.dtype, acc.dtype, a_major, b_major)
            for v in ((b,) if a_in_registers else (a, b)):
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


# ---- Blackwell: tensor memory (TMEM), tcgen05 MMA, TMA loads of a 2-CTA pair

@dataclasses.dataclass(frozen=True)
class TmemRefType(RefType):
    """A (rows, cols) array in tensor memory: `packing` elements share a 32-bit column; `collective` marks a
    kernel whose tcgen05 instructions are 2-CTA (cta_group::2; PTX allows one CTA group per kernel). The TMEM
    layout follows from the type (`tmem_layout`): 128 rows default; 64 rows half-lane, or m64 collective."""

    packing: int = 1
    collective: bool = False

    def __str__(self) -> str:
        extra = (f", packing {self.packing}" if self.packing != 1 else "") + (", collective" if self.collective else "")
        return f"ref<tmem, {self.dtype.name}[{','.join(map(str, self.shape or ()))}]{extra}>"


def tmem_layout(t: TmemRefType):
    """The TMEMLayout of a TMEM reference type; raises TMEMLayoutError for what TMEM cannot hold."""
    from .tmem_layouts import infer_tmem_layout
    rows, cols = t.shape
    return infer_tmem_layout(rows, cols, t.dtype.bits, t.collective, t.packing)


def _tmem_layout_of(op: Op, t: TmemRefType):
    from .tmem_layouts import TMEMLayoutError
    try:
        return tmem_layout(t)
    except TMEMLayoutError as e:
        raise op.error(str(e), rule="tmem-layout") from None


def kernel_cta_group(kernel: "Kernel") -> int:
    """2 if the kernel's tensor memory is allocated for 2-CTA MMAs, else 1."""
    return 2 if any(isinstance(op, TmemAlloc) and op.result.type.collective for op in kernel.walk()) else 1


class TmemAlloc(Op):
    """Tensor memory for the whole kernel. Warp 0 allocates every TMEM reference of the kernel at the first
    TmemAlloc (one tcgen05.alloc, then relinquish_alloc_permit); TmemDealloc frees it at the end."""

    name = "tmem_alloc"

    def __init__(self, shape: tuple[int, ...], dtype: DType, packing: int, collective: bool, loc: Loc | None):
        t = TmemRefType("tmem", dtype, len(shape), tuple(shape), packing=packing, collective=collective)
        super().__init__([], [t], loc)

    @property
    def columns(self) -> int:
        return tmem_layout(self.result.type).columns

    def attrs(self):
        t = self.result.type
        return {"shape": t.shape, "dtype": t.dtype.name, "packing": t.packing, "collective": t.collective}

    def verify(self):
        from .tmem_layouts import TMEM_COLUMNS, TMEMLayoutError, tmem_alloc_columns
        t = self.result.type
        if len(t.shape) != 2:
            raise self.error(f"a TMEM reference is 2D (rows, cols), got shape {t.shape}", rule="tmem-layout")
        layout = _tmem_layout_of(self, t)
        try:
            tmem_alloc_columns(layout.columns, exact=True)
        except TMEMLayoutError:
            raise self.error(
                f"tcgen05.alloc allocates a power of two in 32..{TMEM_COLUMNS} columns, but a "
                f"{t.shape[0]}x{t.shape[1]} {t.dtype.name} reference in the {layout.kind.value} layout with packing {t.packing} occupies "
                f"{layout.columns} columns; give it a power-of-two number of columns, at least 32",
                rule="tmem-alloc") from None


class TmemSlice(Op):
    """`ref[:, start:start + size]`: static column range of a 128-row (default layout) TMEM reference."""

    name = "tmem_slice"

    def __init__(self, ref: Value, start: int, size: int, loc: Loc | None):
        t = ref.type
        super().__init__([ref], [dataclasses.replace(t, shape=(t.shape[0], size))], loc)
        self.start = start
        self.size = size

    def attrs(self):
        return {"start": self.start, "size": self.size}

    def verify(self):
        t = self.operands[0].type
        _check(_is_ref(self.operands[0], "tmem"), self, "only TMEM references are sliced by columns")
        if t.shape[0] != 128:
            raise self.error(f"column slices are taken of 128-row TMEM references (the default layout); a "
                             f"{t.shape[0]}-row reference folds its columns over lanes, load it whole",
                             rule="tmem-layout")
        if not (self.size > 0 and 0 <= self.start and self.start + self.size <= t.shape[1]):
            raise self.error(f"columns {self.start}:{self.start + self.size} are outside the {t.shape[1]} columns "
                             "of the TMEM reference", rule="tmem-layout")
        if self.start % t.packing or self.size % t.packing:
            raise self.error(f"a TMEM slice covers whole 32-bit columns: start and size must be multiples of the "
                             f"packing {t.packing}, got {self.start} and {self.size}", rule="tmem-layout")


class TmemLoad(Op):
    """TMEM → registers (tcgen05.ld, then tcgen05.wait::ld) by one warpgroup, in the register layout that
    matches the reference's TMEM layout (TCGEN05, WGMMA for half-lane, or the m64-collective one)."""

    name = "tmem_load"

    def __init__(self, ref: Value, loc: Loc | None):
        super().__init__([ref], [ArrayType(tuple(ref.type.shape), ref.dtype)], loc)

    def verify(self):
        _check(_is_ref(self.operands[0], "tmem"), self, "tmem_load reads a TMEM reference")


class TmemStore(Op):
    """Registers → TMEM (tcgen05.st, tcgen05.wait::st) by one warpgroup; visible to MMAs it issues next."""

    name = "tmem_store"

    def __init__(self, ref: Value, value: Value, loc: Loc | None):
        super().__init__([ref, value], [], loc)

    def verify(self):
        ref, value = self.operands
        _check(_is_ref(ref, "tmem"), self, "tmem_store writes a TMEM reference")
        shape = value.type.shape if value.is_array else ()
        _check(shape == tuple(ref.type.shape), self,
               f"storing an array of shape {shape} into a TMEM reference of shape {tuple(ref.type.shape)}")
        _check(value.dtype == ref.dtype, self,
               f"storing {value.dtype.name} into a {ref.dtype.name} TMEM reference; use .astype()")


class Tcgen05Mma(Op):
    """acc = a @ b (+ acc when `accumulate`), on the tensor cores, issued by one thread and asynchronous (its
    completion is signalled by Tcgen05Commit). acc is a TMEM reference; a an SMEM tile or a TMEM reference;
    b an SMEM tile; SMEM tiles may be transposed views. A 2-CTA (collective) MMA takes each CTA's share:
    acc (M/2, N), a (M/2, K), b (K, N/2); the pair's leader CTA issues it."""

    name = "tcgen05_mma"

    def __init__(self, acc: Value, a: Value, b: Value, accumulate: Value, loc: Loc | None):
        super().__init__([acc, a, b, accumulate], [], loc)

    @property
    def collective(self) -> bool:
        return self.operands[0].type.collective

    @property
    def mnk(self) -> tuple[int, int, int]:
        """The MMA's M (both CTAs' rows for a 2-CTA MMA), N and K."""
        (rows, n), k = self.operands[0].type.shape, self.operands[1].type.shape[1]
        return rows * (2 if self.collective else 1), n, k

    def attrs(self):
        from . import mma_descriptors as md
        m, n, k = self.mnk
        out = {"m": m, "n": n, "k": k}
        try:
            out["kind"] = md.tcgen05_kind(self.operands[1].dtype).value
            out["tmem_layout"] = tmem_layout(self.operands[0].type).kind.value
        except Exception:  # an op that failed verification is still printable
            pass
        out["cta_group"] = 2 if self.collective else 1
        out["a"] = self.operands[1].type.space
        return out

    def verify(self):
        from . import mma_descriptors as md
        from .tmem_layouts import TMEMLayoutError, check_tcgen05_shape
        acc, a, b, accumulate = self.operands
        _check(_is_ref(acc, "tmem") and acc.type.rank == 2, self,
               "the tcgen05_mma accumulator must be a TMEM reference (mgjit.tmem((M, N), mgjit.float32))")
        _check((_is_ref(a, "smem") or _is_ref(a, "tmem")) and a.type.rank == 2, self,
               "tcgen05_mma operand a must be a 2D SMEM tile or a TMEM reference")
        _check(_is_ref(b, "smem") and b.type.rank == 2, self, "tcgen05_mma operand b must be a 2D SMEM tile")
        _check(isinstance(accumulate.type, ScalarType) and accumulate.dtype == dtypes.bool_, self,
               "accumulate= must be a bool (a constant or a runtime condition such as k > 0)")
        for name, v in (("a", a), ("b", b)):
            if v.type.space == "smem":
                _check(v.type.swizzle is not None, self, f"tcgen05_mma operand {name} needs a swizzled SMEM tile "
                       "(mgjit.smem(..., swizzle=32/64/128))")
        collective = acc.type.collective
        (rows, n), (ra, k), (kb, nb) = acc.type.shape, a.type.shape, b.type.shape
        n_cta = n // 2 if collective else n
        if ra != rows or kb != k or nb != n_cta:
            per_cta = " per CTA: acc (M/2, N), a (M/2, K), b (K, N/2)" if collective else ""
            raise self.error(f"tcgen05_mma shapes do not chain{per_cta}: acc {acc.type.shape}, a {a.type.shape}, "
                             f"b {b.type.shape}", rule="tcgen05-shape")
        if acc.type.packing != 1:
            raise self.error("an MMA accumulator is stored one element per 32-bit column: allocate it with packing=1",
                             rule="tcgen05-shape")
        if a.type.space == "tmem":
            if a.type.collective != collective:
                raise self.error("operand a in TMEM and the accumulator belong to different CTA groups",
                                 rule="cta-group")
            if a.type.shape[0] != 128 or a.type.packing != 32 // a.dtype.bits:
                raise self.error(f"an A operand in TMEM has 128 rows and is packed {32 // a.dtype.bits} to a column "
                                 f"(mgjit.tmem((128, K), {a.dtype.name})), got {a.type}", rule="tcgen05-shape")
        m = rows * (2 if collective else 1)
        try:
            kind = md.tcgen05_kind(a.dtype)
            k_step = kind.instruction_k
            if k % k_step:
                raise md.DescriptorError(f"the K extent of tcgen05 tiles must be a multiple of {k_step} for "
                                         f"{a.dtype.name} (32 bytes per instruction), got {k}")
            a_major = md.Major.K if not a.type.transposed else md.Major.MN  # (a TMEM operand is never transposed)
            b_major = md.Major.K if b.type.transposed else md.Major.MN
            pieces = tmem_layout(acc.type).mma_pieces()
            if collective and len(pieces) != 1:
                raise md.DescriptorError(f"a 2-CTA MMA writes its accumulator with one instruction: N <= 256, got {n}")
            for piece in pieces:
                check_tcgen05_shape(m, piece.n, k_step, kind, collective)
                md.Tcgen05InstrDescriptor(m, piece.n, a.dtype, b.dtype, acc.dtype, a_major, b_major)
            for v in (a, b):
                if v.type.space != "smem":
                    continue
                cols = (v.type.shape[::-1] if v.type.transposed else v.type.shape)[1]
                md.check_swizzle(v.type.swizzle)
                if (cols * v.dtype.bits // 8) % v.type.swizzle:
                    raise md.DescriptorError(
                        f"a {v.type.swizzle}B-swizzled tile needs rows that are a multiple of {v.type.swizzle} "
                        f"bytes, got {cols} x {v.dtype.name} = {cols * v.dtype.bits // 8} bytes")
            per_row = b.type.swizzle * 8 // b.dtype.bits
            if b_major is md.Major.MN and any(p.col_start % per_row for p in pieces):
                raise md.DescriptorError(f"this accumulator takes {len(pieces)} MMAs of N = {pieces[0].n}; with an "
                                         f"N-major B each must start on a {b.type.swizzle}B swizzle column "
                                         f"({per_row} elements)")
        except (md.DescriptorError, TMEMLayoutError) as e:
            raise self.error(str(e), rule="tcgen05-shape") from None


class Tcgen05Commit(Op):
    """Arrive once on `barrier` when every tcgen05 MMA the issuing thread started before it has completed
    (tcgen05.commit ... mbarrier::arrive::one); in a 2-CTA kernel the arrival goes to both CTAs of the pair.
    `cta_group` is the kernel's, set by layout inference."""

    name = "tcgen05_commit"

    def __init__(self, barrier: Value, loc: Loc | None):
        super().__init__([barrier], [], loc)
        self.cta_group: int | None = None

    def attrs(self):
        return {"cta_group": self.cta_group} if self.cta_group else {}

    def verify(self):
        _check(_is_ref(self.operands[0], "barrier") and self.operands[0].type.rank == 0, self,
               "tcgen05_commit arrives on one barrier: index the barrier array, e.g. bars[slot]")


class TmemDealloc(Op):
    """The end of the kernel's tensor memory: every thread is done with it, warp 0 frees it."""

    name = "tmem_dealloc"

    def __init__(self, refs: Sequence[Value], loc: Loc | None):
        super().__init__(refs, [], loc)


class TmaLoadCollective(TmaLoad):
    """A TMA load by one CTA of a 2-CTA pair into its own SMEM whose arrival and bytes are counted on the
    barrier at the same offset in the pair's leader CTA (even cluster rank), where the 2-CTA MMA waits."""

    name = "tma_load"

    def attrs(self):
        return {**super().attrs(), "collective": True}


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

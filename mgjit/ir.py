"""mgjit's IR core: typed SSA values, the Op base class, blocks, kernels, the verifier driver and the printer.

Values are scalars (uniform across the threads of a warpgroup), register arrays (static shape, dtype and,
after layout inference, a layout) and references to memory. Every op records the user source location it
came from, so any later stage can raise a CompileError that names the kernel's file and line.

The ops themselves live by family in `mgjit/ops/`, each beside its verifier and its inference, lowering and
interpreter rules; this module knows none of them.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, ClassVar, Iterator, Sequence

from .dtypes import DType
from .errors import CompileError, Loc, Rule
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
    references have a static shape, an optional swizzle (bytes), may be a transposed view, and may be a view
    cut from a larger tile whose plane (rows, cols) is `storage` (tiles.Tile); a barrier reference is an array
    of mbarriers (rank 1) or one of them (rank 0)."""

    space: str  # "gmem", "smem" or "barrier"
    dtype: DType
    rank: int
    shape: tuple[int, ...] | None = None
    swizzle: int | None = None
    transposed: bool = False
    storage: tuple[int, int] | None = None

    def __str__(self) -> str:
        if self.space == "gmem":
            return f"ref<gmem, {self.dtype.name}, rank {self.rank}>"
        extra = ((f", swizzle {self.swizzle}" if self.swizzle else "") + (", transposed" if self.transposed else "")
                 + (f", in {self.storage[0]}x{self.storage[1]}" if self.storage else ""))
        return f"ref<{self.space}, {self.dtype.name}[{','.join(map(str, self.shape or ()))}]{extra}>"


@dataclasses.dataclass(frozen=True)
class TmemRefType(RefType):
    """A (rows, cols) array in tensor memory, or (stages, rows, cols) of them: `packing` elements share a 32-bit
    column; `collective` marks a kernel whose tcgen05 instructions are 2-CTA (cta_group::2; PTX allows one CTA
    group per kernel); `scales` marks block scales for a block-scaled MMA. The TMEM layout follows from the type
    (`tmem_layout`): 128 rows default; 64 rows half-lane, or m64 collective; scales their own."""

    packing: int = 1
    collective: bool = False
    scales: bool = False

    def __str__(self) -> str:
        extra = (f", packing {self.packing}" if self.packing != 1 else "") + (", collective" if self.collective else "")
        extra += ", scales" if self.scales else ""
        return f"ref<tmem, {self.dtype.name}[{','.join(map(str, self.shape or ()))}]{extra}>"


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
    """Base of every IR op. Subclasses set `name`, implement `verify`, and may declare:

    - `requires`: the hardware unit the op needs (a name in `targets.UNITS`), checked against the target
      before lowering;
    - traits read by layout inference: `elementwise` (each result element comes from the operand elements
      at the same index), `free_anchor` (the result can be produced in any register layout at no cost, so a
      conflict moves the anchor instead of inserting a relayout), `index_only` (a free anchor that carries
      indices, not data: data layouts win over it), `free_with_operand` (the result can take any layout at no
      cost when its operand can take the corresponding one: a broadcast of an iota; or whatever its operand's
      layout, where `takes_any_layout`: a broadcast of a few elements every thread holds), `reduces_rows` (a
      reduction over the last axis: its result lands in another layout when its operand's free anchors are placed
      in one that reduces there, `layouts.blocked_reducing_to`), `joins_yields` (each
      result is the matching operand of the Yield that ends each of the op's regions: an if), and `costs_in(layout)`
      (whether the op makes its result in `layout` at a cost its own layout avoids: a shared-memory read with
      bank conflicts);
    - a trait read by the lowering: `thread_smem` ("store": the op's threads write an SMEM tile from registers;
      "load": its threads read one into registers, after the warpgroup's earlier such stores), so that a read
      meets the warpgroup (a barrier) only where a store came since it last met, and a store only where a read
      did; and `releases_smem`: one thread of the op's warpgroup learns that SMEM the async proxy read may be
      written (a TMA store wait), so that the others' next store meets the warpgroup first.
    """

    name: ClassVar[str] = "?"
    requires: ClassVar[str | None] = None
    elementwise: ClassVar[bool] = False
    free_anchor: ClassVar[bool] = False
    index_only: ClassVar[bool] = False
    free_with_operand: ClassVar[bool] = False
    reduces_rows: ClassVar[bool] = False
    joins_yields: ClassVar[bool] = False
    takes_any_layout: ClassVar[bool] = False
    thread_smem: ClassVar[str | None] = None
    releases_smem: ClassVar[bool] = False

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

    def costs_in(self, layout: Any) -> bool:
        """Whether making the result in register layout `layout` costs more than in the op's own (layout
        inference prefers a common layout in which no free anchor does)."""
        return False

    def stage_of(self) -> Value | None:
        """The SMEM view whose stage (a whole index of its leading dimension) this op's result is; None for other
        ops. Two stages of one view coincide or share no element (the lowering's barriers use it)."""
        return None

    def view_extent(self) -> tuple[Value, int, Value | None, int, int] | None:
        """(view, dim, base, offset, size) where this op's result is the elements base + offset to base + offset +
        size along dimension dim of SMEM view `view` (base a runtime index, or None: 0; offset and size static),
        so that the lowering's barriers tell such views of one view apart; None otherwise."""
        return None

    def error(self, message: str, rule: Rule | None = None) -> CompileError:
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
    """A whole kernel in IR: its parameters (one Value each) and its body. `cta_group` is 2 when the
    kernel's tensor memory serves 2-CTA (collective) MMAs: PTX allows one CTA group per kernel, so the
    frontend decides it once, for the whole kernel."""

    name: str
    params: list[Param]
    args: list[Value]
    body: Block
    num_warpgroups: int
    loc: Loc
    tma_descriptors: list["TmaDescriptor"] = dataclasses.field(default_factory=list)
    cta_group: int = 1
    # The buffers the compiler appended as hidden parameters, by name ("print": mgjit.print's records,
    # "profile": mgjit.trace's spans): each {"param": its index in `params`, ...the tables the host decodes it
    # with}, JSON data that a compiled kernel's metadata carries to the launcher (see mgjit/hidden.py).
    hidden_buffers: dict[str, dict] = dataclasses.field(default_factory=dict)
    # CTAs asked to fit on one SM at once (mgjit.min_ctas_per_sm): ptxas caps each thread's registers to match.
    min_ctas_per_sm: int = 1

    def walk(self) -> Iterator[Op]:
        return self.body.walk()


# ---------------------------------------------------------------------------------------------- checks ops share

def check(cond: bool, op: Op, message: str, rule: Rule | None = None) -> None:
    """Raise the op's CompileError with `message` unless `cond`."""
    if not cond:
        raise op.error(message, rule)


def is_int_scalar(v: Value) -> bool:
    return isinstance(v.type, ScalarType) and v.dtype.is_int


def is_ref(v: Value, space: str) -> bool:
    return isinstance(v.type, RefType) and v.type.space == space


def same_shape(op: Op, values: Sequence[Value]) -> None:
    shapes = {v.type.shape if v.is_array else () for v in values}
    check(len(shapes) == 1, op, f"operand shapes differ: {sorted(shapes)} (broadcasts are explicit in the IR)")


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
            for r in op.results:
                if not isinstance(r.type, RefType) and r.dtype.storage_only:
                    raise op.error(f"{r.dtype.name} is a block-scaling storage type: TMA, SMEM and the tensor cores "
                                   "move it, registers do not compute with it")
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
    occupancy = f" min_ctas_per_sm={kernel.min_ctas_per_sm}" if kernel.min_ctas_per_sm > 1 else ""
    lines.append(f"kernel @{kernel.name}({params}) warpgroups={kernel.num_warpgroups}{occupancy} {{")

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

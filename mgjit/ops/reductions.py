"""Reductions over axes of a register array: Reduce (sum, max, min), and Squeeze (dropping axes of size 1: the
same layout rule, no arithmetic).

The result's layout is the operand's with the reduced axes removed (the threads that held different parts of them
now hold copies). Lowering combines, in order: the elements one thread holds that differ only along reduced axes;
then across lanes with butterfly shuffles (one per bit of each lane dimension that indexes a reduced axis); then
across warps through a small SMEM scratch owned by the warpgroup (both in reduction_exchange.py). Narrow floats
accumulate in f32, narrow integers in int32. A float32 sum of a product (`(x * y).sum()`, a sum of squares) takes
the thread's elements as fma chains of the factors: one instruction an element, rounded once. A float32 max or min
of bf16 or f16 widened (`x.astype(float32).max()`, exact, so the order is the narrow one's) takes the thread's
elements as the 32-bit words they were loaded in, two to a max.NaN.bf16x2: half an instruction an element.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from .. import dtypes, infer, interpret, lower
from ..errors import Loc, Rule
from ..interpret import numerics
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, ScalarType, Value, check
from ..layouts import LANES_PER_WARP, SPLAT, WARPS_PER_WARPGROUP, LayoutError, SplatLayout, TiledLayout
from ..lower.context import Deferred, element_offsets
from .elementwise import Binary, Cast
from .reduction_exchange import across_lanes, across_warps, balanced, combine

REDUCE_KINDS = ("sum", "max", "min")


def _check_reducible(op: Reduce | ReduceAll) -> None:
    """Bool arrays are refused where the op is built, so that a kernel the interpreter runs compiles too (their
    sum has no bool result; cast to an integer type)."""
    dtype = op.operands[0].dtype
    check(dtype != dtypes.bool_, op, "reductions over bool arrays are not supported; cast to an integer type first")


class Reduce(Op):
    name = "reduce"

    def __init__(self, kind: str, x: Value, axes: tuple[int, ...], loc: Loc | None):
        """`axes` as the user wrote them: negative ones count from the end (-1 is the last axis); one that
        names no axis of `x` is left as it is, for `verify` to refuse."""
        rank = len(x.type.shape)
        self.requested = tuple(axes)
        axes = tuple(sorted({a + rank if -rank <= a < 0 else a for a in axes}))
        shape = tuple(d for i, d in enumerate(x.type.shape) if i not in axes)
        rtype = ArrayType(shape, x.dtype) if shape else ScalarType(x.dtype)
        super().__init__([x], [rtype], loc)
        self.kind = kind
        self.axes = axes

    def attrs(self):
        return {"kind": self.kind, "axes": self.axes}

    @property
    def free_with_operand(self) -> bool:
        """Over the last axis, of size 1 (a row's one-column part, 9 columns held as 8 + 1): nothing moves between
        threads, so the operand can be placed in the layout a user wants the result in, that axis added
        (`TiledLayout.with_unit_axis`), and the row's statistics of both parts meet without a relayout."""
        return self._row_width() == 1

    @property
    def reduces_rows(self) -> bool:
        """Over the last axis, wider than one column: a row's statistics from parts of different widths (264
        columns as 256 + 128) meet where the operand is placed in a layout reducing to the other part's
        (infer.Inference.place_reduced)."""
        return self._row_width() > 1

    def _row_width(self) -> int:
        """The columns a reduction over the last axis of a 2D or higher array takes together; 0 for any other."""
        shape = self.operands[0].type.shape
        return shape[-1] if len(shape) >= 2 and self.axes == (len(shape) - 1,) else 0

    def verify(self):
        check(self.kind in REDUCE_KINDS, self, f"unknown reduction {self.kind}")
        rank = len(self.operands[0].type.shape)
        bad = [a for a in self.requested if not -rank <= a < rank]
        check(not bad, self, f"{self.kind} over axis {bad[0] if bad else 0}: a rank-{rank} array has axes "
                             f"{-rank}..{rank - 1}")
        _check_reducible(self)


class Squeeze(Op):
    """`x` without its axes `axes`, each of size 1: what a real (1, n) array broadcast to (m, n) becomes first
    (Broadcast maps operand dimensions to result dimensions of the same size)."""

    name = "squeeze"

    def __init__(self, x: Value, axes: tuple[int, ...], loc: Loc | None):
        shape = tuple(d for i, d in enumerate(x.type.shape) if i not in axes)
        super().__init__([x], [ArrayType(shape, x.dtype) if shape else ScalarType(x.dtype)], loc)
        self.axes = tuple(sorted(axes))

    def attrs(self):
        return {"axes": self.axes}

    def verify(self):
        shape = self.operands[0].type.shape
        check(all(0 <= a < len(shape) and shape[a] == 1 for a in self.axes), self,
              f"squeeze drops axes of size 1; axes {self.axes} of shape {shape}")


class ReduceAll(Op):
    """Every element of several arrays (of one dtype, any shapes and layouts) combined by `kind` into one scalar:
    each thread combines what it holds of all of them first, then the warpgroup's threads combine once (one
    butterfly over the lanes, one exchange between the warps), where reducing each array and combining the
    scalars pays those steps once an array."""

    name = "reduce_all"

    def __init__(self, kind: str, xs: list[Value], loc: Loc | None):
        super().__init__(list(xs), [ScalarType(xs[0].dtype)], loc)
        self.kind = kind

    def attrs(self):
        return {"kind": self.kind}

    def verify(self):
        check(self.kind in REDUCE_KINDS, self, f"unknown reduction {self.kind}")
        check(all(x.is_array for x in self.operands), self,
              f"{self.kind} of a tuple reduces arrays, got {[str(x.type) for x in self.operands]}")
        dtypes_ = sorted({x.dtype.name for x in self.operands})
        check(len(dtypes_) == 1, self, f"{self.kind} of a tuple reduces arrays of one dtype, got {dtypes_}; use "
                                       ".astype()")
        _check_reducible(self)


infer.rule(ReduceAll)(infer.no_arrays)


@infer.rule(Reduce)
@infer.rule(Squeeze)
def _infer_reduce(op: Reduce | Squeeze, inf: infer.Inference) -> None:
    src = op.operands[0]
    if not op.result.is_array:
        return
    if isinstance(src.layout, SplatLayout):
        inf.set_layout(op.result, SPLAT, op)
        return
    placed = inf.overrides.get(id(op))
    if placed is not None and isinstance(placed, TiledLayout):  # a Reduce over a unit last axis (free_with_operand)
        try:
            wanted = placed.with_unit_axis(len(op.result.type.shape))
        except LayoutError:
            wanted = None
        if wanted is not None:
            inf.move_or_relayout(op, 0, wanted)
            inf.set_layout(op.result, placed, op)
            return
    try:
        layout = src.layout.reduce(op.axes, len(src.type.shape))
    except LayoutError as e:
        raise op.error(f"cannot reduce axes {op.axes} of this array's layout: {e}", rule=Rule.LAYOUT) from None
    inf.set_layout(op.result, layout, op)


# ---------------------------------------------------------------------------------------------- lowering

def accumulator(dtype):
    """What a reduction combines in: f32 for floats up to 32 bits, int32 for integers up to 32 bits (extended by
    their signedness: shuffles move 32-bit registers, and a wrapped sum truncates to the same value)."""
    if dtype.bits >= 32 and dtype != dtypes.float32:
        return dtype
    return dtypes.float32 if dtype.is_float else dtypes.int32


def _splat_sum(ctx: lower.Context, x, count: int, acc_dtype):
    """The sum of `count` copies of x (a splat's elements): one multiply."""
    n = ctx.e.const(count, acc_dtype)
    return combine(ctx, "mul", acc_dtype, x, n) if acc_dtype.is_float else ctx.e.muli(x, n)


@lower.rule(Reduce)
def _reduce(op: Reduce, ctx: lower.Context) -> None:
    e = ctx.e
    src = ctx.frag(op.operands[0])
    out = op.result
    dtype = src.dtype
    acc_dtype = accumulator(dtype)
    reduced_count = math.prod(src.shape[a] for a in op.axes)

    if src.is_splat:
        x = e.cast(src.elems[0], dtype, acc_dtype)
        if op.kind == "sum":
            x = _splat_sum(ctx, x, reduced_count, acc_dtype)
        x = e.cast(x, acc_dtype, dtype)
        ctx.set(out, x if not out.is_array else lower.Frag(out.layout, out.type.shape, dtype, [x]))
        return

    partial = Partial(op.kind, acc_dtype, dtype, src.layout, op.axes, len(src.shape),
                      _thread_groups(ctx, op.kind, acc_dtype, op.operands[0], src, op.axes))
    _set_partial(ctx, op, partial)


@dataclasses.dataclass(frozen=True)
class Partial:
    """A reduction's thread-local step done (step 1: `groups`, this thread's combined elements by their offset
    along the kept axes), its lanes and warps not yet combined; of an array in `layout`, of rank `rank`."""

    kind: str
    acc_dtype: Any
    dtype: Any
    layout: TiledLayout
    axes: tuple[int, ...]
    rank: int
    groups: dict

    def joins(self, other: "Partial") -> bool:
        """Whether the two combine thread by thread before one butterfly and one exchange: the same reduction of
        the same rows, whose elements cross the same lanes and warps (then each array's own combination is
        exact, a sum's too) and leave each row's result in the same threads."""
        return ((self.kind, self.acc_dtype, self.dtype, self.axes, self.rank) ==
                (other.kind, other.acc_dtype, other.dtype, other.axes, other.rank)
                and self.layout.reduced_lane_dims(self.axes, self.rank) ==
                other.layout.reduced_lane_dims(other.axes, other.rank)
                and self.layout.reduced_warp_dims(self.axes, self.rank) ==
                other.layout.reduced_warp_dims(other.axes, other.rank)
                and self.result_layout() == other.result_layout() and self.groups.keys() == other.groups.keys())

    def result_layout(self) -> TiledLayout | None:
        """The layout the reduction leaves its result in (None: every axis reduced, a scalar)."""
        return None if len(self.axes) == self.rank else self.layout.reduce(self.axes, self.rank)


def _set_partial(ctx: lower.Context, op: Op, partial: Partial) -> None:
    """The result of a reduction (or of two combined, `_fuse_partials`): finished now, or left `Deferred` where
    its one user combines it with another reduction in the same block (`_fusable`) and its rows cross warps. Rows
    within a warp save only shuffles, and the partials kept live longer cost registers: layernorm over 4 rows of
    800 a program (512 + 256 + 128 columns, a row a warp) went 18.6 -> 17.0 PTX instructions an element but 80
    -> 81 registers, 6 -> 5 CTAs an SM, 0.95 -> 0.92 of copy bandwidth (H200, kernel alone), so those finish
    where they are, as before."""
    out = op.result
    if id(op) in _fusable(ctx) and partial.layout.reduced_warp_dims(partial.axes, partial.rank):
        ctx.set(out, Deferred(partial, lambda: _finish(ctx, partial, out)))
    else:
        ctx.set(out, _finish(ctx, partial, out))


def _finish(ctx: lower.Context, partial: Partial, out: Value) -> Any:
    """Steps 2 to 4: the butterflies across lanes, the exchange across warps, the groups laid out in the result's
    register order."""
    e = ctx.e
    layout, acc_dtype = partial.layout, partial.acc_dtype
    groups = across_lanes(ctx, partial.kind, acc_dtype, partial.groups,
                           layout.reduced_lane_dims(partial.axes, partial.rank))
    warp_dims = layout.reduced_warp_dims(partial.axes, partial.rank)
    if warp_dims:
        groups = across_warps(ctx, partial.kind, acc_dtype, groups, warp_dims, out)
    if not out.is_array:
        (x,) = groups.values()
        return e.cast(x, acc_dtype, partial.dtype)
    elems = [e.cast(groups[off], acc_dtype, partial.dtype) for off in element_offsets(out.layout, out.type.shape)]
    return lower.Frag(out.layout, out.type.shape, partial.dtype, elems)


# The binary op that combines two results of each reduction kind (`held[0].sum(1) + held[1].sum(1)`,
# `mgjit.maximum(a.max(1), b.max(1))`).
COMBINED_BY = {"sum": "add", "max": "max", "min": "min"}


def _fusable(ctx: lower.Context) -> set[int]:
    """The ids of the Reduce ops, and of the Binary ops combining two reductions, whose result's one use is a
    Binary that combines it with another reduction of its kind in the same block: their last steps wait for that
    user (`_fuse_partials`), which may combine the thread-local partials first and cross the lanes and warps
    once: one exchange through shared memory (two bar.syncs) instead of one an array. PTX instructions an element
    (bf16, tools/ptx_profile.py), one row a program: layernorm 3000 (2048 + 1024) 18.3 -> 16.8, 2304 19.2 -> 17.3;
    softmax 2100 (2048 + 128) 15.2 -> 13.1, 4097 18.7 -> 17.7. H200, kernel alone (benchmarks/rows_ab.py, two
    rounds): layernorm 3000 0.99 -> 1.00, softmax 2100 0.96 -> 0.975, 4097 0.945 -> 0.955."""
    known = ctx.analyses.get("fusable reductions")
    if known is not None:
        return known
    users: dict[int, list[tuple[Op, int]]] = {}
    blocks: dict[int, int] = {}

    def visit(block) -> None:
        for o in block.ops:
            blocks[id(o)] = id(block)
            for v in o.operands:
                users.setdefault(v.id, []).append((o, id(block)))
            for region in o.regions:
                visit(region)
    visit(ctx.kernel.body)

    def kind_of(o: Op) -> str | None:
        if isinstance(o, Reduce):
            return o.kind
        if isinstance(o, Binary):
            return next((k for k, b in COMBINED_BY.items() if b == o.kind), None)
        return None

    fusable = set()
    for o in ctx.kernel.walk():
        kind = kind_of(o)
        if kind is None:
            continue
        uses = users.get(o.result.id, [])
        if len(uses) != 1:
            continue
        user, block = uses[0]
        if isinstance(user, Binary) and user.kind == COMBINED_BY[kind] and block == blocks[id(o)] and \
                all(isinstance(v.owner, Op) and kind_of(v.owner) == kind for v in user.operands):
            fusable.add(id(o))
    ctx.analyses["fusable reductions"] = fusable
    return fusable


@lower.fusion(Binary)
def _fuse_partials(op: Binary, ctx: lower.Context) -> bool:
    """Two reductions' results combined (`a.sum(1) + b.sum(1)`), both still `Deferred` partials that join
    (`Partial.joins`): their thread-local groups combined here, and the lanes and warps crossed once for both."""
    a, b = (ctx.peek(v) for v in op.operands)
    if not (isinstance(a, Deferred) and isinstance(b, Deferred)
            and isinstance(a.partial, Partial) and isinstance(b.partial, Partial)):
        return False
    pa, pb = a.partial, b.partial  # deferred only where this op combines their kind (`_fusable`)
    # Narrow results (a bf16 sum) round each reduction on its own, as the interpreter does
    if pa.acc_dtype != pa.dtype or not pa.joins(pb):
        return False
    if op.result.is_array and op.result.layout != pa.result_layout():
        return False
    groups = {k: combine(ctx, pa.kind, pa.acc_dtype, v, pb.groups[k]) for k, v in pa.groups.items()}
    _set_partial(ctx, op, dataclasses.replace(pa, groups=groups))
    return True


def _thread_groups(ctx: lower.Context, kind: str, acc_dtype, array: Value, src: lower.Frag,
                   axes: tuple[int, ...]) -> dict[tuple, Any]:
    """Step 1, within the thread: the held elements of `array` (lowered: `src`) grouped by their offset along the
    kept axes, each group combined as a balanced tree; a sum of a product as fma chains (`_factors`), a max or min
    of widened bf16 or f16 over their loaded words (`_narrow_pairs`)."""
    e = ctx.e
    keep = [d for d in range(len(src.shape)) if d not in axes]
    keys = [tuple(off[d] for d in keep) for off in element_offsets(src.layout, src.shape)]
    factors = _factors(kind, array, ctx, src)
    pairs = None if factors else _narrow_pairs(kind, array, ctx, src, keys)
    if pairs is not None:
        return _pair_groups(ctx, kind, keys, *pairs)
    held: dict[tuple, list] = {}
    for key, x in zip(keys, factors or src.elems):
        held.setdefault(key, []).append(x if factors else e.cast(x, src.dtype, acc_dtype))
    groups: dict[tuple, Any] = {}
    for key, xs in held.items():
        if factors:  # chains shared out among the groups: theirs run side by side too
            xs = _product_chains(e, xs, -(-PRODUCT_CHAINS // len(held)))
        groups[key] = balanced(xs, lambda a, b: combine(ctx, kind, acc_dtype, a, b))
    return groups


@lower.rule(ReduceAll)
def _reduce_all(op: ReduceAll, ctx: lower.Context) -> None:
    """Each array's elements this thread holds combined (`_thread_groups`; a sum counts a replicated element in
    its first holder only, a splat in the warpgroup's first thread, times its count), the arrays' partials
    combined, then one butterfly over every lane and one exchange between the warpgroup's warps."""
    e = ctx.e
    dtype = op.operands[0].dtype
    acc_dtype = accumulator(dtype)
    zero = e.const(0, acc_dtype)
    partials = []
    for x in op.operands:
        src = ctx.frag(x)
        axes = tuple(range(len(src.shape)))
        if src.is_splat:
            v, holder = e.cast(src.elems[0], dtype, acc_dtype), e.cmpi("eq", ctx.wg_tid, e.i32(0))
            if op.kind == "sum":
                v = _splat_sum(ctx, v, math.prod(src.shape), acc_dtype)
        else:
            (v,) = _thread_groups(ctx, op.kind, acc_dtype, x, src, axes).values()
            holder = ctx.is_primary(src.layout) if src.layout.replicated else None
        if op.kind == "sum" and holder is not None:
            v = e.select(holder, v, zero)
        partials.append(v)
    partial = balanced(partials, lambda a, b: combine(ctx, op.kind, acc_dtype, a, b))
    groups = across_lanes(ctx, op.kind, acc_dtype, {(): partial}, [(1, LANES_PER_WARP)])
    groups = across_warps(ctx, op.kind, acc_dtype, groups, [(1, WARPS_PER_WARPGROUP)], op.result)
    ctx.set(op.result, e.cast(groups[()], acc_dtype, dtype))


# fma chains a thread's products are summed in, shared out among the rows it holds (`_thread_groups`): 8 at once
# hide the latency, then a tree sums each row's
PRODUCT_CHAINS = 8


def _factors(kind: str, x: Value, ctx: lower.Context, src: lower.Frag) -> list[tuple] | None:
    """For a float32 sum of a product x * y, the (x, y) element pairs of the product in src's register order,
    so that the thread's partial sums take one fma an element instead of a multiply and an add (and round once
    an element, not twice); None for any other reduction, or factors in other layouts than the product's."""
    product = x.owner
    if not (kind == "sum" and src.dtype == dtypes.float32 and isinstance(product, Binary)
            and product.kind == "mul"):
        return None
    frags = [ctx.frag(v) for v in product.operands]
    if not all(f.is_splat or (f.layout == src.layout and len(f.elems) == len(src.elems)) for f in frags):
        return None
    columns = [[f.elems[0]] * len(src.elems) if f.is_splat else f.elems for f in frags]
    return list(zip(*columns))


def _narrow_pairs(kind: str, x: Value, ctx: lower.Context, src: lower.Frag,
                  keys: list[tuple]) -> tuple[Any, list] | None:
    """For a float32 max or min of an array widened from bf16 or f16, (the narrow dtype, the 32-bit words that
    hold the thread's elements two by two, in src's register order), where every word holds a pair of elements
    of one group (the same offset along the kept axes) as its low and high halves; else None."""
    cast = x.owner
    if not (kind in ("max", "min") and src.dtype == dtypes.float32 and isinstance(cast, Cast)
            and cast.operands[0].dtype in (dtypes.bfloat16, dtypes.float16) and len(src.elems) % 2 == 0):
        return None
    narrow = ctx.frag(cast.operands[0])
    if narrow.is_splat or narrow.layout != src.layout or len(narrow.elems) != len(src.elems):
        return None
    words = []
    for i in range(0, len(narrow.elems), 2):
        low, high = ctx.e.unpacked_from(narrow.elems[i]), ctx.e.unpacked_from(narrow.elems[i + 1])
        if low is None or high is None or low[0] != high[0] or (low[1], high[1]) != (0, 1) or keys[i] != keys[i + 1]:
            return None
        words.append(low[0])
    return cast.operands[0].dtype, words


def _pair_groups(ctx: lower.Context, kind: str, keys: list[tuple], narrow, words: list) -> dict[tuple, Any]:
    """`_thread_groups` over loaded words of two narrow floats: each group's words combined as vectors of two
    (max.NaN.bf16x2, a balanced tree), then its two halves widened to float32 and combined."""
    e = ctx.e
    pair_type = e.ir.VectorType.get([2], e.type(narrow))
    held: dict[tuple, list] = {}
    for i, word in enumerate(words):
        held.setdefault(keys[2 * i], []).append(e.m.llvm.bitcast(pair_type, word))
    groups: dict[tuple, Any] = {}
    for key, xs in held.items():
        pair = balanced(xs, lambda a, b: e.fbinary(kind, a, b))
        halves = e.unpack_i32(e.m.llvm.bitcast(e.int_type(32), pair), 16)
        low, high = (e.cast(e.bitcast(h, e.type(narrow)), narrow, dtypes.float32) for h in halves)
        groups[key] = e.fbinary(kind, low, high)
    return groups


def _product_chains(e, pairs: list[tuple], count: int) -> list:
    """Partial sums of the products of `pairs`, up to `count` of them, each a chain of fmas: k products take
    k + count - 1 instructions with the tree after them, 2k - 1 where each is a chain of its own."""
    chains = [e.fbinary("mul", x, y) for x, y in pairs[:count]]
    for i, (x, y) in enumerate(pairs[count:]):
        chains[i % count] = e.fma(x, y, chains[i % count])
    return chains


@lower.rule(Squeeze)
def _squeeze(op: Squeeze, ctx: lower.Context) -> None:
    """Each result element is the one element the thread holds at the same offsets along the kept axes."""
    src = ctx.frag(op.operands[0])
    out = op.result
    if src.is_splat:
        x = src.elems[0]
        ctx.set(out, lower.Frag(out.layout, out.type.shape, src.dtype, [x]) if out.is_array else x)
        return
    keep = [d for d in range(len(src.shape)) if d not in op.axes]
    held = {tuple(off[d] for d in keep): x for off, x in zip(element_offsets(src.layout, src.shape), src.elems)}
    if not out.is_array:
        ctx.set(out, held[()])
        return
    elems = [held[off] for off in element_offsets(out.layout, out.type.shape)]
    ctx.set(out, lower.Frag(out.layout, out.type.shape, src.dtype, elems))


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(Squeeze)
def _interp_squeeze(op: Squeeze, wg: Warpgroup) -> None:
    x = wg.get(op.operands[0], op)
    wg.set(op.result, x.reshape(op.result.type.shape if op.result.is_array else ()))


def _interp_reduced(op: Reduce | ReduceAll, x: Value, axes: tuple[int, ...], wg: Warpgroup) -> torch.Tensor:
    """x reduced over `axes` by op's kind in the accumulation dtype (f32 for narrow floats); a splat's sum is one
    multiply (its first element, the count of the reduced elements), as the lowering computes it. Integer sums
    wrap."""
    wide = numerics.widen(wg.get(x, op), x.dtype)
    if isinstance(x.layout, SplatLayout):
        first = wide.reshape(-1)[0]
        return first * math.prod(x.type.shape[a] for a in axes) if op.kind == "sum" else first
    if op.kind == "sum":
        return wide.sum(dim=axes, dtype=wide.dtype)
    return (torch.amax if op.kind == "max" else torch.amin)(wide, dim=axes)


def _set_narrowed(op: Reduce | ReduceAll, y: torch.Tensor, wg: Warpgroup) -> None:
    """The result, rounded once from the accumulation dtype to the operands'."""
    dtype = op.operands[0].dtype
    wg.set(op.result, numerics.round_float(y, dtype) if dtype.is_float else y.to(numerics.torch_dtype(dtype)))


@interpret.rule(Reduce)
def _interp_reduce(op: Reduce, wg: Warpgroup) -> None:
    """In the accumulation dtype, rounded once (`_interp_reduced`)."""
    y = _interp_reduced(op, op.operands[0], op.axes, wg)
    if isinstance(op.operands[0].layout, SplatLayout) and op.result.is_array:
        y = y.expand(op.result.type.shape)
    _set_narrowed(op, y, wg)


@interpret.rule(ReduceAll)
def _interp_reduce_all(op: ReduceAll, wg: Warpgroup) -> None:
    """Each array reduced in the accumulation dtype (`_interp_reduced`), then the arrays combined, rounded once."""
    parts = [_interp_reduced(op, x, tuple(range(len(x.type.shape))), wg) for x in op.operands]
    y = parts[0]
    for part in parts[1:]:
        y = y + part if op.kind == "sum" else (torch.maximum if op.kind == "max" else torch.minimum)(y, part)
    _set_narrowed(op, y, wg)

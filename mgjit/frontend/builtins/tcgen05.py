"""Blackwell's tensor memory and MMA: `mgjit.tmem(...)` references (`ref.load()`, `ref.store(x)`,
`ref[:, a:b]`, a stage `ref[i]` of a staged one), `mgjit.tcgen05_mma` (block-scaled with `a_scale=`/`b_scale=`),
`mgjit.tcgen05_copy` (block scales from SMEM into TMEM) and `mgjit.tcgen05_commit`; and the kernel-wide TMEM
rules, checked once the kernel is traced (`finish`)."""
from __future__ import annotations

from typing import Any

from ... import dtypes, ir, language as lang, ops
from ...dtypes import DType
from ...errors import Loc, Rule
from ..registry import builtin, method
from ..semantics import Semantics
from ..values import BarrierSlot, Expanded, SmemRef, Tensor, TmemRef
from .barriers import slot_ref


@builtin(lang.tmem, unit="tcgen05")
def tmem(t: Semantics, args: list, kwargs: dict) -> TmemRef:
    usage = "tmem(shape, dtype=mgjit.float32, collective=False, packing=None, scales=False)"
    if len(args) > 2 or set(kwargs) - {"shape", "dtype", "collective", "packing", "scales"}:
        raise t.error(f"bad call: {usage}")
    shape = args[0] if args else kwargs.get("shape")
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype", dtypes.float32)
    collective = kwargs.get("collective", False)
    packing = kwargs.get("packing")
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise t.error(f"mgjit.tmem needs a static shape of positive ints, got {shape}")
    if not isinstance(dtype, DType):
        raise t.error(f"mgjit.tmem needs an mgjit dtype, got {dtype!r}")
    if not isinstance(collective, bool):
        raise t.error(f"mgjit.tmem's collective= must be a static bool, got {collective!r}")
    if packing is None:  # as many elements as fill a 32-bit column (1 for float32 accumulators)
        packing = 32 // dtype.bits if dtype.bits in (8, 16, 32) else 1
    if not isinstance(packing, int) or isinstance(packing, bool):
        raise t.error(f"mgjit.tmem's packing= must be a static int, got {packing!r}")
    scales = kwargs.get("scales", False)
    if not isinstance(scales, bool):
        raise t.error(f"mgjit.tmem's scales= must be a static bool, got {scales!r}")
    op = t.builder.add(ops.TmemAlloc(shape, dtype, packing, collective, t.builder.loc, scales=scales))
    return TmemRef(t, op.result)


@method(TmemRef, "load")
def load(t: Semantics, ref: TmemRef, args: list, kwargs: dict) -> Tensor:
    if args or kwargs:
        raise t.error("a TMEM reference's load() takes no arguments")
    return t.emit(ops.TmemLoad(ref.value, t.builder.loc))


@method(TmemRef, "store")
def store(t: Semantics, ref: TmemRef, args: list, kwargs: dict) -> None:
    if len(args) + len(kwargs) != 1 or set(kwargs) - {"value"}:
        raise t.error("a TMEM reference's store(value) takes one array or number")
    value = args[0] if args else kwargs["value"]
    if not isinstance(value, (Tensor, Expanded)):
        value = t.to_tensor(value, ref.dtype)
    if value.dtype != ref.dtype:
        raise t.error(f"storing {value.dtype.name} into a {ref.dtype.name} TMEM reference; convert with "
                      f".astype(mgjit.{ref.dtype.name})")
    if tuple(value.shape) != ref.shape or isinstance(value, Expanded):
        value = t.broadcast_to(value, ref.shape)
    t.builder.add(ops.TmemStore(ref.value, value.value, t.builder.loc))


@method(TmemRef, "__getitem__")
def columns(t: Semantics, ref: TmemRef, index: Any) -> TmemRef:
    """`ref[:, a:b]` or `ref[:, mgjit.ds(a, SIZE)]`: static columns of the reference; `ref[stage]`: one stage of a
    staged (stages, rows, cols) reference."""
    if len(ref.shape) == 3:
        if isinstance(index, (tuple, slice)):
            raise t.error("a staged TMEM reference (stages, rows, cols) is indexed by one stage: ref[stage]")
        i = t.cast(t.to_tensor(index), dtypes.int32)
        return TmemRef(t, t.builder.add(ops.TmemIndex(ref.value, i.value, t.builder.loc)).result)
    usage = "a TMEM reference is sliced by columns with static bounds: ref[:, a:b] or ref[:, mgjit.ds(a, SIZE)]"
    if not (isinstance(index, tuple) and len(index) == 2 and isinstance(index[0], slice)
            and index[0] == slice(None)):
        raise t.error(usage)
    col = index[1]
    if isinstance(col, lang.ds):
        start, size = col.start, col.size
    elif isinstance(col, slice) and col.step in (None, 1) and not isinstance(col.stop, Tensor):
        start = 0 if col.start is None else col.start
        size = (ref.shape[1] if col.stop is None else col.stop) - start if isinstance(start, int) else None
    else:
        raise t.error(usage)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, size)):
        raise t.error(usage)
    return TmemRef(t, t.builder.add(ops.TmemSlice(ref.value, start, size, t.builder.loc)).result)


@builtin(lang.tcgen05_mma, unit="tcgen05")
def tcgen05_mma(t: Semantics, args: list, kwargs: dict) -> None:
    if len(args) != 3 or set(kwargs) - {"accumulate", "a_scale", "b_scale"}:
        raise t.error("tcgen05_mma(acc, a, b, accumulate=True, a_scale=None, b_scale=None) takes a TMEM "
                      "accumulator, an SMEM tile or TMEM reference, an SMEM tile, and for a block-scaled MMA two "
                      "TMEM scale references")
    acc, a, b = args
    if not isinstance(acc, TmemRef):
        raise t.error("the tcgen05_mma accumulator must be a TMEM reference (mgjit.tmem((M, N), mgjit.float32))")
    if not isinstance(a, (SmemRef, TmemRef)):
        raise t.error("tcgen05_mma operand a must be an SMEM tile or a TMEM reference")
    if not isinstance(b, SmemRef):
        raise t.error("tcgen05_mma operand b must be an SMEM tile")
    accumulate = kwargs.get("accumulate", True)
    if isinstance(accumulate, Expanded) or (isinstance(accumulate, Tensor) and accumulate.shape):
        raise t.error("accumulate= must be a scalar: a bool or a runtime condition such as k > 0")
    flag = t.cast(t.to_tensor(accumulate), dtypes.bool_)
    scales = [kwargs.get("a_scale"), kwargs.get("b_scale")]
    if scales != [None, None] and not all(isinstance(v, TmemRef) for v in scales):
        raise t.error("a block-scaled tcgen05_mma takes both a_scale= and b_scale=, TMEM references of scales "
                      "(mgjit.tmem(..., scales=True))")
    scale_values = [v.value for v in scales] if scales[0] is not None else [None, None]
    t.builder.add(ops.Tcgen05Mma(acc.value, a.value, b.value, flag.value, t.builder.loc, *scale_values))


@builtin(lang.tcgen05_copy, unit="tcgen05")
def tcgen05_copy(t: Semantics, args: list, kwargs: dict) -> None:
    if len(args) != 2 or kwargs or not isinstance(args[0], TmemRef) or not isinstance(args[1], SmemRef):
        raise t.error("tcgen05_copy(scales_tmem, scales_smem) copies an SMEM tile of block scales into a TMEM scale "
                      "reference")
    t.builder.add(ops.Tcgen05Copy(args[0].value, args[1].value, t.builder.loc))


@builtin(lang.tcgen05_commit, unit="tcgen05")
def tcgen05_commit(t: Semantics, args: list, kwargs: dict) -> None:
    bar = args[0] if len(args) == 1 and not kwargs else kwargs.get("barrier") if not args else None
    if not isinstance(bar, BarrierSlot) or set(kwargs) - {"barrier"}:
        raise t.error("tcgen05_commit(bars[i]) takes one barrier slot")
    ref, _ = slot_ref(t, bar)
    t.builder.add(ops.Tcgen05Commit(ref, t.builder.loc))


def finish(body: ir.Block, loc: Loc) -> int:
    """Tensor memory's kernel-wide rules, and its deallocation (TmemDealloc) where the kernel ends; returns the
    kernel's CTA group (2 when its tensor memory serves 2-CTA MMAs). The deallocation may follow warp roles that
    end the kernel (which the Builder refuses for the user's ops): every warp meets the others there, as the
    deallocation synchronises the CTA before warp 0 frees the columns."""
    allocs = [op for op in body.walk() if isinstance(op, ops.TmemAlloc)]
    if not allocs:
        return 1
    top = {id(op) for op in body.ops}
    for op in allocs:
        if id(op) not in top:
            raise op.error("mgjit.tmem allocates tensor memory for the whole kernel: call it at the kernel's top "
                           "level, not inside a runtime `for` or `if`", rule=Rule.TMEM_ALLOC)
    first = allocs[0]
    for op in allocs[1:]:
        if op.result.type.collective != first.result.type.collective:
            raise op.error(f"a kernel's tcgen05 instructions all use one CTA group (PTX ISA): this TMEM reference has "
                           f"collective={op.result.type.collective}, the one at line {first.loc.line} "
                           f"collective={first.result.type.collective}", rule=Rule.CTA_GROUP)
    if first.result.type.collective:
        for op in body.ops[body.ops.index(first) + 1:]:
            if isinstance(op, ops.BarrierAlloc):
                raise op.error("in a 2-CTA (collective) kernel allocate barriers before tensor memory: the TMEM "
                               "allocation synchronises the CTA pair, which makes the initialised barriers visible "
                               "to the peer CTA", rule=Rule.CTA_GROUP)
    dealloc = ops.TmemDealloc([op.result for op in allocs], loc)
    dealloc.verify()
    body.ops.append(dealloc)
    return 2 if first.result.type.collective else 1

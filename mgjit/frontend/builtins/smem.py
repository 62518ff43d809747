"""Shared memory: `mgjit.smem(shape, dtype, swizzle)` buffers, a stage of one (`buf[slot]`), its transpose
(`tile.T`), and whole-tile moves between registers and SMEM (`tile[...] = x`, `x = tile[...]`)."""
from __future__ import annotations

from typing import Any

from ... import dtypes, language as lang, ops
from ...dtypes import DType
from ...errors import Rule
from ..registry import attribute, builtin, method
from ..semantics import Semantics
from ..values import Expanded, SmemRef, Tensor


@builtin(lang.smem)
def smem(t: Semantics, args: list, kwargs: dict) -> SmemRef:
    shape = args[0] if args else kwargs.get("shape")
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
    swizzle = args[2] if len(args) > 2 else kwargs.get("swizzle")
    shape = (shape,) if isinstance(shape, int) else tuple(shape or ())
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise t.error(f"mgjit.smem needs a static shape of positive ints, got {shape}")
    if not isinstance(dtype, DType):
        raise t.error(f"mgjit.smem needs an mgjit dtype, got {dtype!r}")
    if swizzle not in (None, 32, 64, 128):
        raise t.error(f"swizzle must be None, 32, 64 or 128 bytes, got {swizzle!r}", rule=Rule.SWIZZLE_WIDTH)
    if swizzle is not None:
        row_bytes = shape[-1] * dtype.bits // 8
        if row_bytes % swizzle:
            raise t.error(f"a {swizzle}B swizzle needs tile rows that are a multiple of {swizzle} bytes; "
                          f"rows of {shape[-1]} x {dtype.name} are {row_bytes} bytes "
                          f"(the swizzle is wider than the tile row)", rule=Rule.SWIZZLE_WIDTH)
        if len(shape) < 2 or shape[-2] % 8:
            raise t.error(f"a swizzled tile has a multiple of 8 rows, got shape {shape}", rule=Rule.SWIZZLE_WIDTH)
    return SmemRef(t, t.builder.add(ops.SmemAlloc(shape, dtype, swizzle, t.builder.loc)).result)


@method(SmemRef, "__getitem__")
def index(t: Semantics, ref: SmemRef, index: Any) -> SmemRef | Tensor:
    """`buf[slot]`: one stage of a buffer; `tile[...]`: the whole tile, into registers."""
    if index is Ellipsis:
        return t.emit(ops.SmemLoad(ref.value, t.builder.loc))
    if isinstance(index, tuple):
        raise t.error("SMEM buffers are indexed by one stage index at a time (buf[slot])")
    i = t.cast(t.to_tensor(index), dtypes.int32)
    return SmemRef(t, t.builder.add(ops.RefIndex(ref.value, i.value, t.builder.loc)).result)


@method(SmemRef, "__setitem__")
def store(t: Semantics, ref: SmemRef, index: Any, value: Any) -> None:
    """`tile[...] = x`: the whole tile, from registers."""
    if index is not Ellipsis:
        raise t.error("an SMEM tile is written whole: tile[...] = array")
    if not isinstance(value, (Tensor, Expanded)):
        value = t.to_tensor(value, ref.dtype)
    if tuple(value.shape) != ref.shape:
        value = t.broadcast_to(value, ref.shape)
    t.builder.add(ops.SmemStore(ref.value, value.value, t.builder.loc))


@attribute(SmemRef, "T")
def transpose(t: Semantics, ref: SmemRef) -> SmemRef:
    """`tile.T`: the tile read transposed (an MMA operand)."""
    return SmemRef(t, t.builder.add(ops.RefTranspose(ref.value, t.builder.loc)).result)

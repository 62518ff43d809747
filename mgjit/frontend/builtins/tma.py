"""The TMA engine: `copy_async` (GMEM tile → SMEM, completing on a barrier; multicast over a cluster, or
counted on the 2-CTA pair's leader), `store_async` (SMEM → GMEM, optionally reducing), `store_async_wait`,
`prefetch_async` (a tile into L2) and `gather_async` (rows picked by an index array → SMEM). Each tensor copied
gets one host-built TMA descriptor per box shape, which the launch passes to the kernel; `tma_bounded` makes
stores go through a copy of it built on the device, with smaller dimensions."""
from __future__ import annotations

import math
from typing import Any

from ... import dtypes, ir, language as lang, ops
from ...errors import Rule
from ...ops.smem import tile_of
from ...ops.tma import TMA_GMEM_START_ALIGN
from ..registry import builtin
from ..semantics import Semantics
from ..values import BarrierSlot, Expanded, Ref, SmemRef, Tensor, Traced
from .barriers import slot_ref

CLUSTER_AXES = ("x", "y", "z")  # copy_async(multicast=axis): the CTAs of the cluster along one axis


def tma_descriptor(t: Semantics, tensor: Ref, tile: ir.RefType, rows_split: int = 1, rows: int | None = None) -> int:
    """Register (once) the host-built TMA descriptor for copies between `tensor` and tiles typed `tile` (or
    1/rows_split of their rows, for multicast; or boxes of `rows` rows, for a gather); its index among the
    kernel's descriptors."""
    stored = tile_of(tile)
    if len(stored.shape) != tensor.ndim:
        raise t.error(f"the SMEM tile {tuple(tile.shape)} must have the rank of {tensor.name} ({tensor.ndim})")
    box = stored.tma_box(rows_split)
    if rows is not None:
        box = (rows, *box[1:])
    if any(b > 256 for b in box):
        raise t.error(f"a TMA box has at most 256 elements per dimension, got {box}", rule=Rule.TMA_BOX)
    if (box[-1] * tile.dtype.bits // 8) % 16:
        raise t.error(f"the innermost TMA box dimension must be a multiple of 16 bytes, got {box[-1]} x "
                      f"{tile.dtype.name}", rule=Rule.TMA_BOX)
    desc = ir.TmaDescriptor(t.param_index[tensor.name], box, tile.swizzle or 0)
    if desc not in t.tma_descriptors:
        t.tma_descriptors.append(desc)
    return t.tma_descriptors.index(desc)


def _coords(t: Semantics, tensor: Ref, coords: Any, what: str) -> list[ir.Value]:
    coords = coords if isinstance(coords, (tuple, list)) else (coords,)
    if len(coords) != tensor.ndim:
        raise t.error(f"{tensor.name} has rank {tensor.ndim}; {what} needs {tensor.ndim} coordinates")
    return [t.cast(t.to_tensor(c), dtypes.int32).value for c in coords]


@builtin(lang.copy_async, unit="tma")
def copy_async(t: Semantics, args: list, kwargs: dict) -> None:
    if len(args) != 3 or set(kwargs) - {"collective", "multicast"} != {"barrier"}:
        raise t.error("copy_async(src, coords, dst, barrier=bars[i]) takes a tensor, a tuple of element "
                      "coordinates, an SMEM tile and a barrier slot")
    collective = kwargs.get("collective", False)
    multicast = kwargs.get("multicast", False)
    if not isinstance(collective, bool) or not (isinstance(multicast, bool) or multicast in CLUSTER_AXES):
        raise t.error(f"copy_async's collective= must be a static bool and multicast= a static bool or a cluster "
                      f"axis ('x', 'y' or 'z'), got collective={collective!r}, multicast={multicast!r}")
    ctas = t.cluster[0] * t.cluster[1] * t.cluster[2]
    axis = CLUSTER_AXES.index(multicast) if isinstance(multicast, str) else None
    split = (ctas if axis is None else t.cluster[axis]) if multicast else 1
    if multicast and split < 2:
        what = "every CTA of a cluster" if axis is None else f"the CTAs along the cluster's {multicast} axis"
        raise t.error(f"copy_async(multicast={multicast!r}) delivers a tile to {what}: expected at least 2 of them "
                      f"in the cluster {tuple(t.cluster)}, got {split} (launch and compile with a larger "
                      f"cluster=)", rule=Rule.CLUSTER)
    if multicast and collective:
        raise t.error("copy_async takes collective= or multicast=, not both")
    src, coords, dst = args
    bar = kwargs["barrier"]
    if not isinstance(src, Ref):
        raise t.error("copy_async copies from a tensor argument of the kernel")
    if not isinstance(dst, SmemRef):
        raise t.error("copy_async copies into an SMEM tile (mgjit.smem(...)[slot])")
    if not isinstance(bar, BarrierSlot):
        raise t.error("copy_async completes on one barrier slot: barrier=bars[i]")
    if multicast and (dst.shape[0] % split or (dst.value.type.swizzle and (dst.shape[0] // split) % 8)):
        raise t.error(f"a multicast tile's rows are split over the {split} CTAs it goes to: {dst.shape[0]} rows "
                      f"must divide into parts that are multiples of 8 rows", rule=Rule.CLUSTER)
    descriptor = tma_descriptor(t, src, dst.value.type, rows_split=split)
    last = coords[-1] if isinstance(coords, (tuple, list)) and coords else coords
    if isinstance(last, int) and last * src.dtype.bits // 8 % TMA_GMEM_START_ALIGN:
        raise t.error(f"copy_async's box starts at element {last} of {src.name}'s innermost dimension, "
                      f"{last * src.dtype.bits // 8} bytes in: the TMA engine starts a box on a multiple of "
                      f"{TMA_GMEM_START_ALIGN} bytes there (the GPU faults with an illegal instruction)",
                      rule=Rule.TMA_ALIGNMENT)
    starts = _coords(t, src, coords, "copy_async")
    ref, _ = slot_ref(t, bar)
    if collective:  # the arrival and bytes count on the barrier of the 2-CTA pair's leader CTA
        t.builder.add(ops.TmaLoadCollective(src.value, starts, dst.value, ref, descriptor, t.builder.loc))
    else:
        t.builder.add(ops.TmaLoad(src.value, starts, dst.value, ref, descriptor, t.builder.loc,
                                  multicast=split if multicast else 0,
                                  stride=None if axis is None else math.prod(t.cluster[:axis])))


class BoundedRef(Traced):
    """`tma_bounded(x, shape, descriptors, slot)`: tensor x as TMA stores see it, its dimensions cut to `shape`."""

    kind = "a TMA-bounded tensor"

    def __init__(self, ref: Ref, shape: list[Any], descriptors: Ref, slot: Any):
        self.ref, self.shape, self.descriptors, self.slot = ref, shape, descriptors, slot


@builtin(lang.tma_bounded, positional=(2, 4))  # its op comes with the store (unit "tma")
def tma_bounded(t: Semantics, args: list, kwargs: dict) -> BoundedRef:
    named = dict(zip(("x", "shape", "descriptors", "slot"), args), **kwargs)
    if set(named) != {"x", "shape", "descriptors", "slot"}:
        raise t.error("tma_bounded(x, shape, descriptors, slot) takes a tensor, its sizes (None keeps one), a uint8 "
                      "tensor of 128-byte descriptor slots and a slot index")
    x, shape, descriptors = named["x"], named["shape"], named["descriptors"]
    shape = list(shape) if isinstance(shape, (tuple, list)) else [shape]
    if not isinstance(x, Ref) or not isinstance(descriptors, Ref):
        raise t.error("tma_bounded bounds a tensor argument, with descriptors built in another tensor argument")
    if len(shape) != x.ndim:
        raise t.error(f"{x.name} has rank {x.ndim}: tma_bounded takes {x.ndim} sizes (None keeps one)")
    if descriptors.dtype != dtypes.uint8 or descriptors.ndim != 1:
        raise t.error(f"tma_bounded builds descriptors in a 1-D uint8 tensor of 128-byte slots; {descriptors.name} "
                      f"is a rank-{descriptors.ndim} {descriptors.dtype.name} tensor", rule=Rule.TMA_ALIGNMENT)
    sizes = [None if d is None else t.cast(t.to_tensor(d), dtypes.int32) for d in shape]
    return BoundedRef(x, sizes, descriptors, t.cast(t.to_tensor(named["slot"]), dtypes.int32))


@builtin(lang.store_async, unit="tma")
def store_async(t: Semantics, args: list, kwargs: dict) -> None:
    if len(args) != 3 or set(kwargs) - {"reduce"}:
        raise t.error("store_async(dst, coords, src, reduce=None) takes a tensor, a tuple of element "
                      "coordinates and an SMEM tile")
    dst, coords, src = args
    bounded = dst if isinstance(dst, BoundedRef) else None
    dst = bounded.ref if bounded else dst
    if not isinstance(dst, Ref) or not isinstance(src, SmemRef):
        raise t.error("store_async copies an SMEM tile into a tensor argument of the kernel")
    descriptor = tma_descriptor(t, dst, src.value.type)
    starts = _coords(t, dst, coords, "store_async")
    cut = None
    if bounded:
        cut = t.builder.add(ops.TmaDescriptorCut(dst.value, bounded.descriptors.value, bounded.slot.value,
                                                 [d.value if d is not None else None for d in bounded.shape],
                                                 descriptor, t.builder.loc)).result
    t.builder.add(ops.TmaStore(dst.value, starts, src.value, descriptor, kwargs.get("reduce"), t.builder.loc,
                               cut=cut))


@builtin(lang.store_async_wait, unit="tma")
def store_async_wait(t: Semantics, args: list, kwargs: dict) -> None:
    pending = args[0] if args else kwargs.get("pending", 0)
    if not isinstance(pending, int) or not 0 <= pending <= 7:
        raise t.error(f"store_async_wait takes a static count 0..7, got {pending!r}")
    t.builder.add(ops.TmaStoreWait(pending, t.builder.loc))


@builtin(lang.prefetch_async, unit="tma")
def prefetch_async(t: Semantics, args: list, kwargs: dict) -> None:
    if len(args) != 3 or kwargs:
        raise t.error("prefetch_async(src, coords, tile) takes a tensor, a tuple of element coordinates, and an SMEM "
                      "tile (the one a later copy_async fills) or a static block shape")
    src, coords, like = args
    if not isinstance(src, Ref):
        raise t.error("prefetch_async reads a tensor argument of the kernel")
    if isinstance(like, SmemRef):
        tile = like.value.type
    elif isinstance(like, (tuple, list)) and like and all(isinstance(d, int) and d > 0 for d in like):
        tile = ir.RefType("smem", src.dtype, len(like), tuple(like))
    else:
        raise t.error(f"prefetch_async's third argument is an SMEM tile or a static block shape, got {like!r}")
    if tile.dtype != src.dtype:
        raise t.error(f"prefetch_async of a {src.dtype.name} tensor as a {tile.dtype.name} tile")
    descriptor = tma_descriptor(t, src, tile)
    t.builder.add(ops.TmaPrefetch(src.value, _coords(t, src, coords, "prefetch_async"), tile, descriptor,
                                  t.builder.loc))


@builtin(lang.gather_async, unit="tma")
def gather_async(t: Semantics, args: list, kwargs: dict) -> None:
    if len(args) != 4 or set(kwargs) != {"barrier"}:
        raise t.error("gather_async(src, rows, col, dst, barrier=bars[i]) takes a 2D tensor, an int32 array of row "
                      "indices, the first column, an SMEM tile and a barrier slot")
    src, rows, col, dst = args
    bar = kwargs["barrier"]
    if not isinstance(src, Ref) or src.ndim != 2:
        raise t.error("gather_async reads rows of a 2D tensor argument of the kernel")
    if not isinstance(dst, SmemRef) or len(dst.shape) != 2:
        raise t.error("gather_async copies into a 2D SMEM tile")
    if not isinstance(bar, BarrierSlot):
        raise t.error("gather_async completes on one barrier slot: barrier=bars[i]")
    if not isinstance(rows, (Tensor, Expanded)) or rows.shape != (dst.shape[0],):
        raise t.error(f"gather_async's rows are an array of {dst.shape[0]} row indices (one per row of the tile), "
                      f"got {rows!r}")
    index = t.cast(t.to_tensor(rows), dtypes.int32)
    start = t.cast(t.to_tensor(col), dtypes.int32)
    descriptor = tma_descriptor(t, src, dst.value.type, rows=1)
    ref, _ = slot_ref(t, bar)
    t.builder.add(ops.TmaGather(src.value, index.value, start.value, dst.value, ref, descriptor, t.builder.loc))

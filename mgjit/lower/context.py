"""The lowering context: MLIR builder state and the lowered form of every IR value.

A scalar lowers to one MLIR value (the same in every thread). A register array lowers to a `Frag`: its
layout plus one MLIR scalar per element that this thread holds, in the order of the layout's registers
and vector slots (a splat array holds one value). A tensor argument lowers to a `LoweredRef`. A value may be
`Deferred`: its last instructions are emitted where it is first asked for, so that a fusion (`lower.fusion`)
can still fold it into its one user.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Iterator, Sequence

from .. import ir, targets
from ..dtypes import DType
from ..layouts import (LANES_PER_WARP, THREADS_PER_WARPGROUP, WARPS_PER_WARPGROUP, Layout, Replicated,
                       SplatLayout, TiledLayout, blocked)
from ..specialize import TensorSpec
from .emit import Emitter


@dataclasses.dataclass
class Frag:
    """A register array as this thread holds it."""

    layout: Layout
    shape: tuple[int, ...]
    dtype: DType
    elems: list[Any]  # MLIR values; one for a splat

    @property
    def is_splat(self) -> bool:
        return isinstance(self.layout, SplatLayout)

    def elem(self, i: int) -> Any:
        return self.elems[0] if self.is_splat else self.elems[i]


@dataclasses.dataclass
class Deferred:
    """A value whose rule stopped short of its last instructions: `finish()` emits them and returns the lowered
    value, run by the first `Context.get` of it (at its user, in its own block: `lower.fusion` rules defer only
    there). Until then a fusion of its user may take `partial` instead (ops/reductions.py: the thread-local sums
    of row reductions added before one butterfly, not after one each)."""

    partial: Any
    finish: Callable[[], Any]


@dataclasses.dataclass
class LoweredRef:
    ptr: Any  # i64 address of element 0
    sizes: list[Any]  # i32
    strides: list[Any]  # i64, in elements
    spec: TensorSpec
    dtype: DType


class Context:
    def __init__(self, kernel: ir.Kernel, emitter: Emitter, specs: dict[int, Any], target: targets.Target,
                 rematerialize: bool = False):
        self.kernel = kernel
        # Recompute the SMEM addresses of register arrays' loads and stores at each use rather than keep them
        # live: LLVM hoists them out of loops, where they stay live beside the accumulators and ptxas spills
        # them rather than recompute them (compiler.py lowers again so when ptxas spilled). wgmma descriptors
        # are a base plus offsets added inside each wgmma's asm, with or without this.
        self.rematerialize = rematerialize
        self.e = emitter
        self.specs = specs  # ir.Value.id -> TensorSpec (tensors) or int divisor (int scalars)
        self.target = target
        self.values: dict[int, Any] = {}
        self.analyses: dict[str, Any] = {}  # facts of the whole kernel a rule works out once (by the rule's module)
        self.tma_descriptors: list[Any] = []  # i64 generic addresses of the descriptor parameters
        self.smem_bytes = 0
        self.tmem: Any = None  # the kernel's tensor-memory allocation, made at its first TmemAlloc
        self.smem_arena: Any = None  # scoped SMEM's (arena offset, plan), made at the first (ops/smem_scopes.py)
        self.exchange_barriers: int | None = None  # SMEM offset of the cluster exchanges' mbarriers (ops/clusters.py)
        e = emitter
        self.tid = e.tid_x()
        self.wg_tid = e.remui(self.tid, e.i32(THREADS_PER_WARPGROUP))
        self.lane = e.remui(self.tid, e.i32(LANES_PER_WARP))
        self.wg_id = e.divui(self.tid, e.i32(THREADS_PER_WARPGROUP))
        if kernel.num_warpgroups > 1:
            # Broadcast from the warp's lane 0: ptxas then knows the warpgroup index is the same across the warp
            # and keeps what is computed from it (a warpgroup's SMEM offsets, its wgmma descriptors) in uniform
            # registers; from tid / 128 they sat in vector registers and each wgmma first moved its descriptors
            # to uniform ones (R2UR: a 256x512x65536 consumer's k-step went from 73 SASS instructions to 57,
            # tools/sass_loop.py). Volatile, so that it stays at the entry, where every lane of the warp is there
            # for shfl.sync.
            self.wg_id = e.asm("shfl.sync.idx.b32 $0, $1, 0, 31, -1;", "=r,r", [self.wg_id], [e.int_type(32)],
                               side_effects=True)[0]
        self.warp = e.remui(e.divui(self.tid, e.i32(LANES_PER_WARP)), e.i32(WARPS_PER_WARPGROUP))
        # Values that depend only on the thread are computed once, at the kernel's entry, whatever region first
        # asks for them: a value cached from inside a loop or branch would not dominate its later uses.
        self._entry = e.ir.InsertionPoint(e.i32(0).owner)
        self._thread_index_cache: dict[tuple, list[Any]] = {}
        # What this warpgroup's threads may have stored to SMEM tiles (ops whose `thread_smem` is "store") since
        # the warpgroup last met, and what they may have read ("load"): each access as (buffer (smem_root),
        # tile, layout, carried: whether it came round a loop's back edge, from another iteration, whose tiles
        # of one view may lie elsewhere). A read meets the warpgroup first where a store may have written its
        # elements (smem_read_barrier); a store where a read in another tile or layout may have read them, or
        # a store in another tile or layout written them (smem_write_barrier).
        self.smem_stored: frozenset[tuple] = frozenset()
        self.smem_read: frozenset[tuple] = frozenset()
        # Whether one thread of this warpgroup learnt since it last met that TMA stores finished reading SMEM
        # (an op that `releases_smem`): the others learn it when they meet, so their next store meets first.
        # A TMA copy into those bytes, issued by that same thread, needs no meeting (piped rows refill a slot
        # right after waiting for its stores).
        self.smem_released = False
        # Whether a thread of this warpgroup may have stored to an SMEM tile since the warpgroup last fenced the
        # async proxy and met (fence_async): a TMA store fences first only then, so that a run of stores of
        # tiles written once costs one fence and one meeting, not one each (a row staged in SMEM goes out in
        # dozens of boxes).
        self.async_unfenced = False

    # -- values
    def get(self, v: ir.Value) -> Any:
        lowered = self.values[v.id]
        if isinstance(lowered, Deferred):
            lowered = self.values[v.id] = lowered.finish()
        return lowered

    def set(self, v: ir.Value, lowered: Any) -> None:
        self.values[v.id] = lowered

    def peek(self, v: ir.Value) -> Any:
        """The lowered value as it stands, a `Deferred` left unfinished."""
        return self.values[v.id]

    def frag(self, v: ir.Value) -> Frag:
        f = self.get(v)
        assert isinstance(f, Frag), f"{v} is not an array"
        return f

    # -- layouts → indices
    def thread_coords(self, layout: TiledLayout) -> dict[int, Any]:
        """MLIR values of this thread's coordinate along each warp/lane tiled dim (negative index → i32)."""
        tile = layout.tiling.tile_shape(layout.tiling.tiles[0])
        coords = {}
        for dims, idx in ((layout.warp_dims, self.warp), (layout.lane_dims, self.lane)):
            stride = 1
            for d in reversed(dims):
                size = d.times if isinstance(d, Replicated) else tile[d]
                if isinstance(d, int) and size > 1:
                    coords[d] = self.e.remui(self.e.divui(idx, self.e.i32(stride)), self.e.i32(size))
                stride *= size
        return coords

    @contextlib.contextmanager
    def at_entry(self) -> Iterator[None]:
        """Emit at the kernel's entry (what every thread runs once, before anything else) instead of here."""
        self.e.push(self._entry)
        try:
            yield
        finally:
            self.e.pop()

    def thread_index(self, layout: TiledLayout, shape: tuple[int, ...]) -> list[Any]:
        """Per array dimension, the part of an element's index that comes from which thread holds it."""
        key = (layout, shape)
        if key not in self._thread_index_cache:
            e = self.e
            with self.at_entry():
                entries = layout.tiling.dim_strides(len(shape))
                index = [e.i32(0) for _ in shape]
                for d, c in self.thread_coords(layout).items():
                    dim, stride = entries[len(entries) + d]
                    index[dim] = e.addi(index[dim], e.muli(c, e.i32(stride)))
            self._thread_index_cache[key] = index
        return self._thread_index_cache[key]

    def is_primary(self, layout: TiledLayout) -> Any:
        """i1: this thread holds the first copy of its elements (false on Replicated duplicates)."""
        e = self.e
        pred = e.const_bool(True)
        for dims, idx in ((layout.warp_dims, self.warp), (layout.lane_dims, self.lane)):
            stride = 1
            tile = layout.tiling.tile_shape(layout.tiling.tiles[0])
            for d in reversed(dims):
                size = d.times if isinstance(d, Replicated) else tile[d]
                if isinstance(d, Replicated):
                    coord = e.remui(e.divui(idx, e.i32(stride)), e.i32(size))
                    pred = e.andi(pred, e.cmpi("eq", coord, e.i32(0)))
                stride *= size
        return pred

    # -- shared memory
    def alloc_shared(self, nbytes: int, align: int) -> int:
        """A static byte offset into dynamic SMEM for a buffer shared by the whole CTA."""
        self.smem_bytes = (self.smem_bytes + align - 1) // align * align
        offset = self.smem_bytes
        self.smem_bytes += nbytes
        return offset

    def alloc_smem(self, nbytes: int, align: int = 16) -> Any:
        """An i32 byte offset into dynamic SMEM of a region private to this warpgroup."""
        self.smem_bytes = (self.smem_bytes + align - 1) // align * align
        base = self.smem_bytes
        self.smem_bytes += nbytes * self.kernel.num_warpgroups
        e = self.e
        return e.addi(e.i32(base), e.muli(self.wg_id, e.i32(nbytes)))

    def warpgroup_barrier(self, meet: bool = True) -> None:
        """Synchronise the 128 threads of this warpgroup only (named barrier 1 + warpgroup index). meet=False: a
        lowering's own scratch is ordered, and the tracking of the kernel's tiles left alone (it may stand in a
        branch that other paths skip)."""
        self.e.asm_void("bar.sync $0, 128;", "r", [self.e.addi(self.wg_id, self.e.i32(1))])
        if meet:
            self.met()

    def met(self) -> None:
        """The warpgroup met (a barrier of it, or of the CTA): no access before is unordered against one after."""
        self.smem_stored, self.smem_read, self.smem_released = frozenset(), frozenset(), False

    def fence_async(self) -> None:
        """Make what this warpgroup's threads stored to SMEM visible to the async proxy (TMA, wgmma) that one of
        them drives next: each thread fences, then the warpgroup meets."""
        self.e.asm_void("fence.proxy.async.shared::cta;", "", [])
        self.warpgroup_barrier()
        self.async_unfenced = False

    def smem_read_barrier(self, tile: ir.Value) -> None:
        """Before this warpgroup's threads read SMEM tile `tile` into registers: meet, so that each sees what the
        others stored, where one may have stored elements of it since the warpgroup last met. Reads of a tile
        staged once and read many times (a loop over chunks held in SMEM) then meet once, not once per read; a
        read of a buffer or of lines no thread stored to (a row's tail after its head was filled) meets none."""
        root = smem_root(tile)
        if any(r == root and (carried or not disjoint(stored, tile)) for r, stored, _, carried in self.smem_stored):
            self.warpgroup_barrier()

    def smem_write_barrier(self, tile: ir.Value, layout: Layout) -> None:
        """Before this warpgroup's threads store to SMEM tile `tile` from registers in `layout`: meet, so that
        none overwrites what another has yet to read, where one may have read its buffer since the warpgroup last
        met in another tile or layout (a loop that stores a tile and reads it back in another layout: the next
        iteration's store raced the last one's reads), and none's store lands after this one's, where another
        tile or layout may have stored elements of it (a stash written whole, then its edge lines again). Reads
        of the same tile in the same layout, each element held by one thread, were each thread's own elements;
        stores of it wrote each thread's own elements, or copies of one value; and so for another stage of its
        buffer viewed alike (`congruent`: a group of chunks `buf[first + j]` staged in turn)."""
        root = smem_root(tile)
        shared = not isinstance(layout, TiledLayout) or layout.replicated  # an element held by two threads
        touched = [(t, held, carried) for r, t, held, carried in self.smem_read if r == root and shared] + [
            (t, held, carried) for r, t, held, carried in self.smem_read | self.smem_stored
            if r == root and not (held == layout and congruent(t, tile))]
        if self.smem_released or any(carried or not disjoint(t, tile) for t, _, carried in touched):
            self.warpgroup_barrier()

    def loaded(self, tile: ir.Value, layout: Layout) -> None:
        """After this warpgroup's threads read SMEM tile `tile` into registers in `layout`."""
        self.smem_read |= {(smem_root(tile), tile, layout, False)}

    def stored(self, tile: ir.Value, layout: Layout) -> None:
        """After this warpgroup's threads stored to SMEM tile `tile` from registers in `layout`."""
        self.smem_stored |= {(smem_root(tile), tile, layout, False)}
        self.async_unfenced = True

    def enter_loop(self, body: ir.Block) -> tuple[frozenset, frozenset, bool, bool]:
        """Where a loop is about to be emitted: which stores and reads may precede its body's first iteration.
        The body starts as if it had stored (read) what it stores (reads) anywhere: the back edge brings them
        round. A body that reads tiles but stores none meets the warpgroup once here, if a store to their buffers
        came before, rather than at each iteration; one that stores to buffers read before but reads none,
        likewise. After the loop, `leave_loop` with the value returned (the body may run no iteration)."""
        walked = list(body.walk())
        ops = [op for op in walked if op.thread_smem]
        loads = frozenset((smem_root(op.operands[0]), op.operands[0], op.result.layout, True)
                          for op in ops if op.thread_smem == "load")
        stores = frozenset((smem_root(op.operands[0]), op.operands[0], stored_layout(op.operands[1]), True)
                           for op in ops if op.thread_smem == "store")
        read_roots, stored_roots = {r for r, *_ in loads}, {r for r, *_ in stores}
        if (not stores and any(r in read_roots for r, *_ in self.smem_stored)
                or not loads and any(r in stored_roots for r, *_ in self.smem_read)):
            self.warpgroup_barrier()
        entry = self.smem_stored, self.smem_read, self.async_unfenced, self.smem_released
        self.smem_stored = entry[0] | stores
        self.smem_read = entry[1] | loads
        self.async_unfenced = entry[2] or bool(stores)
        self.smem_released = entry[3] or any(op.releases_smem for op in walked)
        return entry

    def leave_loop(self, entry: tuple[frozenset, frozenset, bool, bool]) -> None:
        """After a loop: what may have come before it may still be unmet (it may have run no iteration)."""
        self.smem_stored |= entry[0]
        self.smem_read |= entry[1]
        self.async_unfenced |= entry[2]
        self.smem_released |= entry[3]

    @contextlib.contextmanager
    def branches(self) -> Iterator[Callable[[], None]]:
        """Lower the regions of a branch (an if, or warp roles): each starts in the state before it (call the
        yielded function before each), and after them a store (a read) may have come if one may have on any
        path."""
        entry = self.smem_stored, self.smem_read, self.async_unfenced, self.smem_released
        seen = [frozenset(), frozenset(), False, False]

        def start() -> None:
            seen[0] |= self.smem_stored
            seen[1] |= self.smem_read
            seen[2] |= self.async_unfenced
            seen[3] |= self.smem_released
            self.smem_stored, self.smem_read, self.async_unfenced, self.smem_released = entry

        yield start
        self.smem_stored = seen[0] | self.smem_stored
        self.smem_read = seen[1] | self.smem_read
        self.async_unfenced = seen[2] or self.async_unfenced
        self.smem_released = seen[3] or self.smem_released


def smem_root(tile: ir.Value) -> ir.Value:
    """The buffer an SMEM tile is a view of (an index or a view of an index...): its allocation, or the
    reference it came in as."""
    owner = tile.owner
    while isinstance(owner, ir.Op) and owner.operands and isinstance(owner.operands[0].type, ir.RefType):
        tile, owner = owner.operands[0], owner.operands[0].owner
    return tile


def stored_layout(value: ir.Value) -> Layout:
    """The layout an SMEM store writes `value` in: its own, a splat's as `blocked`."""
    layout = value.layout
    return blocked(value.type.shape, value.dtype) if isinstance(layout, SplatLayout) else layout


def congruent(a: ir.Value, b: ir.Value) -> bool:
    """Whether SMEM tiles a and b are one tile, or alike views of two stages of one buffer (their view ops the same
    but for the stage indexed: `ir.Op.stage_of`), which coincide or share no element: accessed in one layout,
    each element of either lies in one thread."""
    while a is not b:
        oa, ob = a.owner, b.owner
        if not (isinstance(oa, ir.Op) and isinstance(ob, ir.Op) and type(oa) is type(ob) and oa.attrs() == ob.attrs()
                and oa.operands and len(oa.operands) == len(ob.operands)):
            return False
        if oa.stage_of() is None and any(x is not y for x, y in zip(oa.operands[1:], ob.operands[1:])):
            return False
        a, b = oa.operands[0], ob.operands[0]
        if not isinstance(a.type, ir.RefType):
            return False
    return True


def disjoint(a: ir.Value, b: ir.Value) -> bool:
    """Whether SMEM tiles a and b share no element: views of one view along one dimension, from one runtime index
    (or none) plus static offsets whose ranges do not meet (a row's first line and its last two; chunks
    `buf[first + j]` of a group: `ir.Op.view_extent`)."""
    ea = a.owner.view_extent() if isinstance(a.owner, ir.Op) else None
    eb = b.owner.view_extent() if isinstance(b.owner, ir.Op) else None
    if ea is None or eb is None or ea[0] is not eb[0] or ea[1] != eb[1] or ea[2] is not eb[2]:
        return False
    return ea[3] + ea[4] <= eb[3] or eb[3] + eb[4] <= ea[3]


def element_offsets(layout: TiledLayout, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The register/vector part of each held element's index, in Frag order."""
    return _element_offsets(layout, shape)


@functools.lru_cache(maxsize=256)
def _element_offsets(layout: TiledLayout, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    out = []
    for reg in layout.registers(shape):
        for k in range(layout.vector_length):
            out.append(layout.element_index(shape, 0, reg, k))
    return out


def num_elems(layout: Layout, shape: Sequence[int]) -> int:
    if isinstance(layout, SplatLayout):
        return 1
    n = 1
    for d in layout.registers_shape(shape):
        n *= d
    return n * layout.vector_length


def splat_to(ctx: Context, frag: Frag, layout: Layout) -> Frag:
    """`frag` in `layout`: a splat array expanded (no data movement: every element is the one value), an array
    already in `layout` as it is (any other is a relayout, which layout inference inserts)."""
    if isinstance(layout, SplatLayout) or not frag.is_splat:
        if not frag.is_splat and frag.layout != layout:
            raise AssertionError(f"internal error: an array in {frag.layout} used in {layout} without a relayout")
        return frag
    return Frag(layout, frag.shape, frag.dtype, [frag.elems[0]] * num_elems(layout, frag.shape))

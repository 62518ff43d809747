"""Register layouts: how the elements of an array are spread over the 128 threads of a warpgroup.

The algebra is that of Mosaic GPU's tiled layouts. A `Tiling` is a list of tiles applied in turn to the
trailing dimensions of a shape: a dimension of size d tiled by t becomes (d // t, t), the tile parts moved to
the end. A `TiledLayout` then says which dimensions of the tiled shape index the 4 warps, the 32 lanes, and
the per-thread vector; every other tiled dimension indexes a register of the thread. `Replicated(n)` entries
count towards the 4 warps or 32 lanes but index no data: those threads hold copies (this is what a reduction
leaves behind). Tiled dimensions are named by negative indices so that a layout fits arrays with any number
of leading dimensions.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Iterator, Sequence, Union

from .dtypes import DType

WARPS_PER_WARPGROUP = 4
LANES_PER_WARP = 32
THREADS_PER_WARPGROUP = WARPS_PER_WARPGROUP * LANES_PER_WARP
# Global memory moves 32-byte sectors.
SECTOR_BYTES = 32


class LayoutError(ValueError):
    """A layout does not fit a shape, or a layout operation is not defined for it."""


@dataclasses.dataclass(frozen=True)
class Replicated:
    times: int

    def __repr__(self) -> str:
        return f"Replicated({self.times})"


Dim = Union[int, Replicated]


@dataclasses.dataclass(frozen=True)
class Tiling:
    tiles: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        for prev, tile in zip(self.tiles, self.tiles[1:]):
            if len(tile) > len(prev):
                raise LayoutError(f"tile {tile} has more dimensions than the tile {prev} it subdivides")
            for outer, inner in zip(prev[len(prev) - len(tile):], tile):
                if outer % inner:
                    raise LayoutError(f"tile {tile} does not divide the tile {prev} it subdivides")

    def tile_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape after every tile is applied; raises LayoutError if a tile does not divide it."""
        return _tile_shape(self.tiles, tuple(shape))

    def tile_index(self, index: Sequence[int]) -> tuple[int, ...]:
        index = tuple(index)
        for tile in self.tiles:
            n = len(tile)
            head, tail = index[:len(index) - n], index[len(index) - n:]
            index = head + tuple(i // t for i, t in zip(tail, tile)) + tuple(i % t for i, t in zip(tail, tile))
        return index

    @functools.lru_cache(maxsize=4096)  # pure, and asked for every element of a layout's thread maps
    def dim_strides(self, rank: int) -> tuple[tuple[int, int], ...]:
        """For each dimension of the tiled shape: (the array dimension it indexes, its stride there).

        An element's index along array dimension d is the sum over tiled dimensions j with dim j == d of
        tiled_index[j] * stride j: the untiling is linear, which is what lowering builds addresses from.
        """
        entries = [(d, 1) for d in range(rank)]
        for tile in self.tiles:
            n = len(tile)
            head, tail = entries[:len(entries) - n], entries[len(entries) - n:]
            entries = (head + [(d, s * t) for (d, s), t in zip(tail, tile)] + list(tail))
        return tuple(entries)

    def remove_dims(self, rank: int, dims: Sequence[int]) -> "Tiling":
        """The tiling of the array with `dims` (array dimensions, non-negative) removed."""
        entries = list(range(rank))  # array dim of each current entry
        tiles = []
        for tile in self.tiles:
            n = len(tile)
            tail = entries[len(entries) - n:]
            kept = tuple(t for t, d in zip(tile, tail) if d not in dims)
            if kept:
                tiles.append(kept)
            entries = entries[:len(entries) - n] + tail + tail
        return Tiling(tuple(tiles))

    def __repr__(self) -> str:
        return "Tiling(" + "".join(str(t).replace(",)", ")") for t in self.tiles) + ")"


@functools.lru_cache(maxsize=4096)  # pure; asked for tens of thousands of times a compile (thread maps, inference)
def _tile_shape(tiles: tuple[tuple[int, ...], ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    for tile in tiles:
        n = len(tile)
        if n > len(shape):
            raise LayoutError(f"tile {tile} has more dimensions than the shape {shape}")
        head, tail = shape[:len(shape) - n], shape[len(shape) - n:]
        if any(d % t for d, t in zip(tail, tile)):
            raise LayoutError(f"tile {tile} does not divide the trailing dimensions {tail} of the shape")
        shape = head + tuple(d // t for d, t in zip(tail, tile)) + tile
    return shape


def _size(dim: Dim, tiled: Sequence[int]) -> int:
    return dim.times if isinstance(dim, Replicated) else tiled[dim]


@dataclasses.dataclass(frozen=True)
class TiledLayout:
    tiling: Tiling
    warp_dims: tuple[Dim, ...]
    lane_dims: tuple[Dim, ...]
    vector_dim: int | None  # None: one element per register

    def __post_init__(self):
        tile = self.tiling.tile_shape(self.tiling.tiles[0])
        for d in [*self.warp_dims, *self.lane_dims, self.vector_dim]:
            if isinstance(d, int) and not -len(tile) <= d < 0:
                raise LayoutError(f"tiled dimension {d} is outside the tile's {len(tile)} dimensions")
        warps = math.prod(_size(d, tile) for d in self.warp_dims)
        lanes = math.prod(_size(d, tile) for d in self.lane_dims)
        if warps != WARPS_PER_WARPGROUP:
            raise LayoutError(f"warp dimensions {self.warp_dims} cover {warps} warps, expected {WARPS_PER_WARPGROUP}")
        if lanes != LANES_PER_WARP:
            raise LayoutError(f"lane dimensions {self.lane_dims} cover {lanes} lanes, expected {LANES_PER_WARP}")
        used = [d for d in [*self.warp_dims, *self.lane_dims, self.vector_dim] if isinstance(d, int)]
        if len(used) != len(set(used)):
            raise LayoutError(f"a tiled dimension is used twice in {self}")

    @property
    def replicated(self) -> bool:
        """Whether some element is held by more than one thread (a replicated warp or lane dimension)."""
        return any(isinstance(d, Replicated) for d in (*self.warp_dims, *self.lane_dims))

    @property
    def holds_every_element(self) -> bool:
        """Whether every thread holds every element (each warp and lane dimension replicated or of one): a row's
        statistics reduced across all the warps that hold it."""
        tile = self.tiling.tile_shape(self.tiling.tiles[0])
        return all(isinstance(d, Replicated) or tile[d] == 1 for d in (*self.warp_dims, *self.lane_dims))

    @property
    def vector_length(self) -> int:
        if self.vector_dim is None:
            return 1
        return self.tiling.tile_shape(self.tiling.tiles[0])[self.vector_dim]

    def tiled_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        return self.tiling.tile_shape(shape)

    def check_shape(self, shape: Sequence[int]) -> None:
        if len(shape) < len(self.tiling.tiles[0]):
            raise LayoutError(f"{self} needs arrays of rank >= {len(self.tiling.tiles[0])}, got shape {tuple(shape)}")
        self.tiling.tile_shape(shape)

    def registers_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of one thread's register array (warp, lane and vector dimensions set to 1)."""
        tiled = list(self.tiled_shape(shape))
        for d in [*self.warp_dims, *self.lane_dims, self.vector_dim]:
            if isinstance(d, int):
                tiled[d] = 1
        return tuple(tiled)

    @functools.lru_cache(maxsize=4096)  # pure; the mapping it returns is shared: read it, do not change it
    def thread_coords(self, tid: int) -> dict[int, int]:
        """Tiled-dimension coordinates (negative index → value) held by thread `tid` of the warpgroup."""
        tile = self.tiling.tile_shape(self.tiling.tiles[0])
        coords = {}
        for dims, idx in ((self.warp_dims, (tid // LANES_PER_WARP) % WARPS_PER_WARPGROUP),
                          (self.lane_dims, tid % LANES_PER_WARP)):
            for d in reversed(dims):
                size = _size(d, tile)
                if isinstance(d, int):
                    coords[d] = idx % size
                idx //= size
        return coords

    def element_index(self, shape: Sequence[int], tid: int, register: Sequence[int], vector_pos: int) -> tuple[int, ...]:
        """The array index of element `vector_pos` of register `register` in thread `tid`."""
        tiled = list(register)
        n = len(tiled)
        for d, c in self.thread_coords(tid).items():
            tiled[n + d] = c
        if self.vector_dim is not None:
            tiled[n + self.vector_dim] = vector_pos
        index = [0] * len(shape)
        for (dim, stride), i in zip(self.tiling.dim_strides(len(shape)), tiled):
            index[dim] += i * stride
        return tuple(index)

    def registers(self, shape: Sequence[int]) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(range(d) for d in self.registers_shape(shape)))

    def reduce(self, axes: Sequence[int], rank: int) -> "TiledLayout":
        """The layout of the result of reducing `axes` of an array of `rank` held in this layout.

        Threads that held different parts of a reduced axis end up holding the same values, so the warp and
        lane dimensions that indexed it become Replicated.
        """
        axes = {a % rank for a in axes}
        tile_rank_before = len(self.tiling.tiles[0])
        if tile_rank_before > rank:
            raise LayoutError(f"{self} does not fit arrays of rank {rank}")
        # Work on a canonical array of rank `rank` whose leading dims are untiled; the tiled-dimension
        # entries that survive keep their order.
        entries = self.tiling.dim_strides(rank)
        tiled_rank = len(entries)
        new_tiling = self.tiling.remove_dims(rank, sorted(axes))
        new_entries = new_tiling.dim_strides(rank - len(axes))
        kept = [j for j, (d, _) in enumerate(entries) if d not in axes]
        if len(kept) != len(new_entries):
            raise LayoutError(f"cannot reduce axes {sorted(axes)} of {self}")
        position = {j: k - len(new_entries) for k, j in enumerate(kept)}
        tile = self.tiling.tile_shape(self.tiling.tiles[0])

        def remap(d: Dim) -> Dim:
            if isinstance(d, Replicated):
                return d
            j = tiled_rank + d
            if j in position:
                return position[j]
            return Replicated(tile[d])

        vector = None
        if self.vector_dim is not None and (tiled_rank + self.vector_dim) in position:
            vector = position[tiled_rank + self.vector_dim]
        if not new_tiling.tiles:
            raise LayoutError("reducing every axis leaves a scalar, which has no register layout")
        def remap_all(dims: Sequence[Dim]) -> tuple[Dim, ...]:
            return tuple(d for d in map(remap, dims) if d != Replicated(1))

        return TiledLayout(new_tiling, remap_all(self.warp_dims), remap_all(self.lane_dims), vector)

    def with_unit_axis(self, rank: int) -> "TiledLayout":
        """A layout of arrays of rank + 1 whose last axis has size 1 and whose reduction over it (`reduce`) is this
        layout, for arrays of `rank`: every tile takes a trailing 1, each thread holds the same elements."""
        tiling = Tiling(tuple((*tile, 1) for tile in self.tiling.tiles))
        old, new = self.tiling.dim_strides(rank), tiling.dim_strides(rank + 1)
        kept = [k - len(new) for k, (d, _) in enumerate(new) if d != rank]

        def remap(d: Dim) -> Dim:
            return d if isinstance(d, Replicated) else kept[len(old) + d]

        vector = None if self.vector_dim is None else remap(self.vector_dim)
        layout = TiledLayout(tiling, tuple(map(remap, self.warp_dims)), tuple(map(remap, self.lane_dims)), vector)
        if len(kept) != len(old) or layout.reduce((rank,), rank + 1) != self:
            raise LayoutError(f"expected a layout with a unit last axis reducing to {self}, got {layout}")
        return layout

    def reduced_lane_dims(self, axes: Sequence[int], rank: int) -> list[tuple[int, int]]:
        """(stride in the lane index, size) of each lane dimension that indexes one of `axes`."""
        return self._reduced(self.lane_dims, axes, rank)

    def reduced_warp_dims(self, axes: Sequence[int], rank: int) -> list[tuple[int, int]]:
        return self._reduced(self.warp_dims, axes, rank)

    def _reduced(self, dims: Sequence[Dim], axes: Sequence[int], rank: int) -> list[tuple[int, int]]:
        axes = {a % rank for a in axes}
        entries = self.tiling.dim_strides(rank)
        tile = self.tiling.tile_shape(self.tiling.tiles[0])
        out, stride = [], 1
        for d in reversed(dims):
            size = _size(d, tile)
            if isinstance(d, int) and entries[len(entries) + d][0] in axes and size > 1:
                out.append((stride, size))
            stride *= size
        return out

    def __repr__(self) -> str:
        return (f"TiledLayout({self.tiling!r}, warp_dims={self.warp_dims}, lane_dims={self.lane_dims}, "
                f"vector_dim={self.vector_dim})")


@dataclasses.dataclass(frozen=True)
class SplatLayout:
    """Every element equals one value, held by every thread (a broadcast scalar or a constant)."""

    def __repr__(self) -> str:
        return "SplatLayout()"


Layout = Union[TiledLayout, SplatLayout]
SPLAT = SplatLayout()

# The wgmma accumulator (and register A operand) layout: element (r, c) of a 64-row tile lives in warp
# (r % 64) // 16, lane 4 * (r % 8) + (c % 8) // 2, vector slot c % 2; (r % 16) // 8 picks the register row.
WGMMA = TiledLayout(Tiling(((64, 8), (16, 8), (8, 8), (2,))), warp_dims=(-7,), lane_dims=(-3, -2), vector_dim=-1)
# The tcgen05.ld/st 32x32b register layout: each warp holds a 32-row strip of a 128-row tile.
TCGEN05 = TiledLayout(Tiling(((128, 8), (32, 8), (8, 8), (2,))), warp_dims=(-7,), lane_dims=(-3, -2), vector_dim=-1)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def warps_hold_rows(shape: Sequence[int], dtype: DType, access_bytes: int, rows_per_warp: int) -> bool:
    """Whether `blocked` with `rows_per_warp` puts the warps along the rows of `shape` (a 1D shape is one row):
    where each warp would then hold at least that many rows of lanes going along them."""
    cols, rows = shape[-1], shape[-2] if len(shape) >= 2 else 1
    vec = min(max(access_bytes // dtype.itemsize, 1), cols)
    lanes_r = min(LANES_PER_WARP // min(LANES_PER_WARP, cols // vec), rows)
    return rows >= WARPS_PER_WARPGROUP * lanes_r * rows_per_warp


def blocked(shape: Sequence[int], dtype: DType, access_bytes: int = 16, rows_per_warp: int = 0,
            thread_rows: int = 0, row_lanes: int = 0) -> TiledLayout:
    """The default layout for GMEM traffic and elementwise work on an array of `shape`.

    Each thread moves `access_bytes` (16) at a time along the last (contiguous) dimension where the shape allows;
    lanes then warps go along the last dimension first, then the one before; whatever the array is too
    small to give every thread is Replicated. With `rows_per_warp`, warps go along the rows first where each
    then holds at least that many rows (a row's reduction stays in its warp; its columns repeat in registers).
    With `thread_rows` as well, a warp's lanes go along a row only as far as `row_lanes` lanes (by default those
    of one sector, SECTOR_BYTES) or as leaves each thread `thread_rows` rows, whichever is further, and along the
    rows after that: a row's reduction then takes fewer shuffles.
    """
    shape = tuple(shape)
    if not shape:
        raise LayoutError("a scalar has no register layout")
    if not all(_is_pow2(d) for d in shape):
        raise LayoutError(f"register array dimensions must be powers of two, got shape {shape}")
    cols = shape[-1]
    rows = shape[-2] if len(shape) >= 2 else 1
    vec = min(max(access_bytes // dtype.itemsize, 1), cols)
    lanes_c = min(LANES_PER_WARP, cols // vec)
    lanes_r = min(LANES_PER_WARP // lanes_c, rows)
    if rows_per_warp and warps_hold_rows(shape, dtype, access_bytes, rows_per_warp):
        warps_r = WARPS_PER_WARPGROUP
        warps_c = 1
        if thread_rows:
            warp_rows = rows // WARPS_PER_WARPGROUP
            fewest = row_lanes or max(SECTOR_BYTES // (vec * dtype.itemsize), 1)
            lanes_c = min(lanes_c, max(LANES_PER_WARP * thread_rows // warp_rows, fewest))
            lanes_r = min(LANES_PER_WARP // lanes_c, warp_rows)
    else:
        warps_c = min(WARPS_PER_WARPGROUP, cols // (vec * lanes_c))
        warps_r = min(WARPS_PER_WARPGROUP // warps_c, rows // lanes_r)
    lane_rep = LANES_PER_WARP // (lanes_c * lanes_r)
    warp_rep = WARPS_PER_WARPGROUP // (warps_c * warps_r)
    warp_dims: list[Dim] = []
    lane_dims: list[Dim] = []
    if len(shape) == 1:
        tiling = Tiling(((warps_c * lanes_c * vec,), (lanes_c * vec,), (vec,)))
        warp_dims, lane_dims = [-3], [-2]
    else:
        tiling = Tiling(((warps_r * lanes_r, warps_c * lanes_c * vec), (lanes_r, lanes_c * vec), (vec,)))
        warp_dims, lane_dims = [-5, -4], [-3, -2]
    if warp_rep > 1:
        warp_dims.insert(0, Replicated(warp_rep))
    if lane_rep > 1:
        lane_dims.insert(0, Replicated(lane_rep))
    return TiledLayout(tiling, tuple(warp_dims), tuple(lane_dims), -1)


@functools.lru_cache(maxsize=4096)  # inference asks again on every restart: a search of a few hundred layouts
def blocked_reducing_to(shape: Sequence[int], dtype: DType, target: TiledLayout) -> TiledLayout | None:
    """A `blocked` layout of `shape` whose reduction over its last axis is `target`, with the widest accesses that
    have one, or None: the arrays of one row held in parts of different widths (256 + 128 columns) reduce to one
    row layout, where their own `blocked` layouts (a warp holding one row of 256, two of 128) sent the row's
    statistics, and the parts they scaled, through shared memory."""
    rank = len(shape)
    access = 16
    while access >= dtype.itemsize:
        for rows_per_warp in (0, 1, 2, 4, 8, 16, 32):
            for thread_rows in ((0,) if not rows_per_warp else (0, 1, 2, 4, 8)):
                for row_lanes in ((0,) if not thread_rows else (0, 1, 2, 4, 8, 16, 32)):
                    try:
                        layout = blocked(shape, dtype, access, rows_per_warp, thread_rows, row_lanes)
                        if layout.reduce((rank - 1,), rank) == target:
                            return layout
                    except LayoutError:
                        continue
        access //= 2
    return None


def spread(shape: Sequence[int], dtype: DType) -> TiledLayout:
    """`blocked` with accesses as wide as they can be (up to 16 bytes) while each thread holds elements no other
    holds: a line of 256 bf16 takes 4 bytes a thread over all 128 threads, where `blocked` gives one warp 16 bytes
    a lane and the other three copies (each copy issues the line's accesses again, its stores predicated off)."""
    total = dtype.itemsize * math.prod(shape)
    access = 16
    while access > dtype.itemsize and total < access * THREADS_PER_WARPGROUP:
        access //= 2
    return blocked(shape, dtype, access_bytes=access)


def describe(layout: Layout, shape: Sequence[int]) -> str:
    """A text picture of which thread (and register) owns each element of a 2D (or 1D) array."""
    shape = tuple(shape)
    if isinstance(layout, SplatLayout):
        return f"splat {shape}: every thread holds the one value"
    if len(shape) > 2:
        raise LayoutError("describe draws 1D and 2D arrays only")
    grid = [[""] * shape[-1] for _ in range(shape[0] if len(shape) == 2 else 1)]
    regs = list(layout.registers(shape))
    for tid in range(THREADS_PER_WARPGROUP):
        for r_i, reg in enumerate(regs):
            for v in range(layout.vector_length):
                idx = layout.element_index(shape, tid, reg, v)
                row, col = (idx if len(shape) == 2 else (0, idx[0]))
                if not grid[row][col]:
                    grid[row][col] = f"t{tid}r{r_i}"
    width = max(len(c) for row in grid for c in row)
    return "\n".join(" ".join(c.rjust(width) for c in row) for row in grid)

"""How an SMEM tile is stored, the TMA boxes that fill it, the views that slice it and the banks its accesses
hit: one implementation for the frontend, the lowering, the interpreter and the tests.

A tile of shape (..., rows, cols) is a stack of 2D planes (rows, cols), one per index of its leading ("stage")
dimensions, stored one after the other. Without swizzle a plane is row-major. Under an S-byte swizzle (S in
32, 64, 128) it is stored as column blocks one swizzle wide: block b holds columns [b*W, (b+1)*W), W = S*8/bits
elements, as rows x S bytes; within a block the 16-byte chunk index of each 128-byte line is XORed with the
line index modulo S/16 (the pattern the TMA engine and the tensor cores apply to the address bits, repeating
every 8 rows). Each column block of a plane is one TMA box, and each is a run of 8-row swizzle atoms that wgmma
and tcgen05 descriptors address directly. Where a tile's planes have one column block (or no swizzle), the
stack is the same bytes as one plane of all its rows, and one box copies it all.

A view (`tile[a:b]`, `tile[:, mgjit.ds(i, 64)]`) is cut from a tile along whole units of its storage: stages,
8-row atoms of a swizzled tile (any rows of an unswizzled one), whole column blocks of a swizzled tile (16-byte
runs of an unswizzled one). It keeps the plane it was cut from (`storage`): its rows stay one swizzle row (or
one storage row) apart, its column blocks one storage block apart.

`Tile.offset` and `swizzle` use only Python's integer operators (+, *, //, %, &, ^, <<, >>), so the same code
computes Python ints, torch tensors of indices (the interpreter) and MLIR values (the lowering wraps them in
`lower.context.Index`).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import TypeVar

I = TypeVar("I")  # an int, a tensor of ints, or a lowering Index

SWIZZLES = (32, 64, 128)
# The 128B swizzle pattern repeats every 1024 bytes: a swizzled tile starts on that boundary.
SWIZZLE_ALIGN = 1024
# An 8-row swizzle atom: views of a swizzled tile start and end on its rows.
ATOM_ROWS = 8
# Shared memory serves a warp's request in wavefronts over 32 banks of 4 bytes; a request of 8 or 16 bytes per
# thread is split into phases of 16 or 8 threads (128 bytes each).
BANKS = 32
BANK_BYTES = 4


def swizzle(offset: I, width: int) -> I:
    """Where byte `offset` of an unswizzled block lands under a `width`-byte swizzle: the 16-byte chunk index
    within each 128-byte line XORed with the line index modulo width / 16."""
    return offset ^ (((offset >> 7) & (width // 16 - 1)) << 4)


@dataclasses.dataclass(frozen=True)
class Tile:
    """The storage of one SMEM tile (or of a view into one): its stored shape (before any transposed view),
    element bits, swizzle, and `storage`, the (rows, cols) of the plane each of its stages is cut from (None:
    its own last two dimensions)."""

    shape: tuple[int, ...]
    bits: int
    swizzle: int | None = None
    storage: tuple[int, int] | None = None

    @property
    def itemsize(self) -> int:
        return max(self.bits // 8, 1)

    @property
    def rows(self) -> int:
        """Rows over all leading dimensions."""
        return math.prod(self.shape[:-1])

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def plane(self) -> tuple[int, int]:
        """(rows, cols) of one stage."""
        return (self.shape[-2] if len(self.shape) > 1 else 1, self.shape[-1])

    @property
    def stored_plane(self) -> tuple[int, int]:
        """(rows, cols) of the plane each stage is cut from."""
        return self.storage or self.plane

    @property
    def stages(self) -> int:
        return math.prod(self.shape[:-2])

    @property
    def nbytes(self) -> int:
        """The bytes of the tile's elements (what a TMA copy of it moves)."""
        return math.prod(self.shape) * self.itemsize

    @property
    def stage_bytes(self) -> int:
        """The distance between consecutive stages: one stored plane."""
        return math.prod(self.stored_plane) * self.itemsize

    @property
    def block_cols(self) -> int:
        """Columns in one column block: one swizzle row of elements (the whole row without swizzle)."""
        return self.swizzle * 8 // self.bits if self.swizzle else self.cols

    @property
    def blocks(self) -> int:
        return self.cols // self.block_cols

    @property
    def row_bytes(self) -> int:
        """The distance between consecutive rows of a column block."""
        return self.swizzle or self.stored_plane[1] * self.itemsize

    @property
    def folds(self) -> bool:
        """Whether the stages are the bytes of one plane of all their rows (one stage, or planes of one column
        block that are whole): then rows count on across stages and one TMA box covers every stage."""
        rows, cols = self.stored_plane
        return self.stages == 1 or (rows == self.plane[0] and (not self.swizzle or cols == self.block_cols))

    @property
    def block_rows(self) -> int:
        """The rows between consecutive column blocks (what their distance, block_rows * S bytes, counts)."""
        return self.rows if self.folds and self.stages > 1 else self.stored_plane[0]

    @property
    def dense(self) -> bool:
        """Whether every row of every column block is stored right after the one before (what a TMA box
        writes): false for a column view of an unswizzled tile, whose rows keep their storage row's pitch."""
        return bool(self.swizzle) or self.cols == self.stored_plane[1]

    def offset(self, row: I, col: I, swizzled: bool = True) -> I:
        """The byte offset of element (row, col) in the tile, rows counted over all leading dimensions.
        With swizzled=False, where it would be before the swizzle's XOR (what an MMA descriptor addresses)."""
        if self.folds:
            return self._plane_offset(row, col, swizzled)
        rows = self.plane[0]
        return (row // rows) * self.stage_bytes + self._plane_offset(row % rows, col, swizzled)

    def _plane_offset(self, row: I, col: I, swizzled: bool) -> I:
        if not self.swizzle:
            return (row * self.stored_plane[1] + col) * self.itemsize
        s = self.swizzle
        block = col // self.block_cols
        line = row * s + (col % self.block_cols) * self.itemsize
        if swizzled:
            line = swizzle(line, s)
        return block * (self.block_rows * s) + line

    # -- views
    def dim_stride(self, dim: int) -> int:
        """Bytes between consecutive indices of dimension `dim` (along columns of a swizzled tile: at multiples
        of a column block, where a view may start)."""
        rank = len(self.shape)
        dim %= rank
        if dim == rank - 1:
            return self.block_rows * self.itemsize if self.swizzle else self.itemsize
        if dim == rank - 2:
            return self.row_bytes
        return math.prod(self.shape[dim + 1:-2]) * self.stage_bytes

    def granule(self, dim: int) -> int:
        """The unit a view's start and size along `dim` come in: a column block (a 16-byte run without swizzle)
        along columns, an 8-row atom of a swizzled tile along rows, one stage along a leading dimension."""
        rank = len(self.shape)
        dim %= rank
        if dim == rank - 1:
            return self.block_cols if self.swizzle else max(16 * 8 // self.bits, 1)
        if dim == rank - 2 and self.swizzle:
            return ATOM_ROWS
        return 1

    def view(self, dim: int, size: int) -> "Tile":
        """The storage of the view `size` long along `dim` (which starts at a multiple of `granule(dim)`)."""
        shape = list(self.shape)
        shape[dim % len(shape)] = size
        return Tile(tuple(shape), self.bits, self.swizzle, self.stored_plane if len(shape) > 1 else None)

    def spans(self) -> list[tuple[int, int]]:
        """The byte ranges [start, end) the tile's elements occupy, relative to its start, merged where they
        touch (one range for a whole tile)."""
        rows, cols = self.plane
        if not self.dense:
            pieces = [(s * self.stage_bytes + r * self.row_bytes, cols * self.itemsize)
                      for s in range(self.stages) for r in range(rows)]
        elif self.folds:
            pieces = [(b * self.block_rows * self.row_bytes, self.rows * self.row_bytes) for b in range(self.blocks)]
        else:
            pieces = [(s * self.stage_bytes + b * self.block_rows * self.row_bytes, rows * self.row_bytes)
                      for s in range(self.stages) for b in range(self.blocks)]
        merged: list[tuple[int, int]] = []
        for start, length in sorted(pieces):
            if merged and merged[-1][1] == start:
                merged[-1] = (merged[-1][0], start + length)
            else:
                merged.append((start, start + length))
        return merged

    # -- TMA
    def tma_box(self, split: int = 1) -> tuple[int, ...]:
        """The box of one TMA copy of this tile (outermost first): one column block of every stage, with the
        leading dimension divided by `split` (a multicast copy's share of the rows); one column block of one
        stage where the stages do not fold (see `folds`)."""
        if not self.folds:
            return (*(1,) * (len(self.shape) - 2), self.plane[0], self.block_cols)
        shape = (self.shape[0] // split, *self.shape[1:])
        return (*shape[:-1], self.block_cols)

    def boxes(self) -> list[tuple[tuple[int, ...], int]]:
        """(element offset of the box in each dimension, outermost first; byte offset in the tile) of each TMA
        box that copies the tile."""
        rank = len(self.shape)
        if self.folds:
            stages = [((0,) * (rank - 1), 0)]
        else:
            stages = [((*index, 0), flat * self.stage_bytes)
                      for flat, index in enumerate(itertools.product(*map(range, self.shape[:-2])))]
        block_bytes = self.block_rows * self.row_bytes
        return [((*lead, j * self.block_cols), byte + j * block_bytes)
                for lead, byte in stages for j in range(self.blocks)]

    def dim0_bytes(self) -> int:
        """Bytes between consecutive indices of the first dimension of a folding tile (a multicast copy's
        rows are split along it)."""
        return math.prod(self.shape[1:-1]) * self.row_bytes


def wavefronts(addresses: list[int], nbytes: int) -> tuple[int, int]:
    """(wavefronts, the fewest possible) of one warp's shared-memory access: `addresses` are the 32 lanes'
    byte addresses (None: the lane does not access), each moving `nbytes` contiguous bytes. Lanes are served in
    phases of 128 bytes (all 32 lanes for accesses of up to 4 bytes, 16 for 8 bytes, 8 for 16 bytes); a phase
    takes as many wavefronts as the most distinct 4-byte words it needs from one bank (lanes that read the same
    word share it)."""
    lanes_per_phase = BANKS * BANK_BYTES // max(nbytes, BANK_BYTES)
    words_per_lane = max(nbytes // BANK_BYTES, 1)
    total = ideal = 0
    for first in range(0, len(addresses), lanes_per_phase):
        words = {a // BANK_BYTES + k for a in addresses[first:first + lanes_per_phase] if a is not None
                 for k in range(words_per_lane)}
        if not words:
            continue
        per_bank: dict[int, int] = {}
        for w in words:
            per_bank[w % BANKS] = per_bank.get(w % BANKS, 0) + 1
        total += max(per_bank.values())
        ideal += -(-len(words) // BANKS)
    return total, ideal

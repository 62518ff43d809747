"""How an SMEM tile is stored, and the TMA boxes that fill it: one implementation for the frontend, the
lowering, the interpreter and the tests.

A tile of shape (..., cols) holds rows = the product of its leading dimensions. Without swizzle it is
row-major. Under an S-byte swizzle (S in 32, 64, 128) it is stored as column blocks one swizzle wide: block b
holds columns [b*W, (b+1)*W), W = S*8/bits elements, as rows x S bytes; within a block the 16-byte chunk index
of each 128-byte line is XORed with the line index modulo S/16 (the pattern the TMA engine and the tensor cores
apply, repeating every 8 rows). Each column block is one TMA box, and each is a run of 8-row swizzle atoms that
wgmma and tcgen05 descriptors address directly.

`Tile.offset` and `swizzle` use only Python's integer operators (+, *, //, %, &, ^, <<, >>), so the same code
computes Python ints, torch tensors of indices (the interpreter) and MLIR values (the lowering wraps them in
`lower.context.Index`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import TypeVar

I = TypeVar("I")  # an int, a tensor of ints, or a lowering Index

SWIZZLES = (32, 64, 128)
# The 128B swizzle pattern repeats every 1024 bytes: a swizzled tile starts on that boundary.
SWIZZLE_ALIGN = 1024


def swizzle(offset: I, width: int) -> I:
    """Where byte `offset` of an unswizzled block lands under a `width`-byte swizzle: the 16-byte chunk index
    within each 128-byte line XORed with the line index modulo width / 16."""
    return offset ^ (((offset >> 7) & (width // 16 - 1)) << 4)


@dataclasses.dataclass(frozen=True)
class Tile:
    """The storage of one SMEM tile: its stored shape (before any transposed view), element bits, swizzle."""

    shape: tuple[int, ...]
    bits: int
    swizzle: int | None = None

    @property
    def itemsize(self) -> int:
        return max(self.bits // 8, 1)

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def block_cols(self) -> int:
        """Columns in one column block: one swizzle row of elements (the whole row without swizzle)."""
        return self.swizzle * 8 // self.bits if self.swizzle else self.cols

    @property
    def blocks(self) -> int:
        return self.cols // self.block_cols

    @property
    def block_bytes(self) -> int:
        return self.nbytes // self.blocks

    def offset(self, row: I, col: I, swizzled: bool = True) -> I:
        """The byte offset of element (row, col) in the tile, rows counted over all leading dimensions.
        With swizzled=False, where it would be before the swizzle's XOR (what an MMA descriptor addresses)."""
        if not self.swizzle:
            return (row * self.cols + col) * self.itemsize
        s = self.swizzle
        block = col // self.block_cols
        line = row * s + (col % self.block_cols) * self.itemsize
        if swizzled:
            line = swizzle(line, s)
        return block * (self.rows * s) + line

    def tma_box(self, split: int = 1) -> tuple[int, ...]:
        """The box of one TMA copy of this tile (outermost first): one column block, with the leading
        dimension divided by `split` (a multicast copy's share of the rows)."""
        shape = (self.shape[0] // split, *self.shape[1:])
        return (*shape[:-1], self.block_cols if self.swizzle else shape[-1])

    def boxes(self) -> list[tuple[int, int]]:
        """(first column, byte offset in the tile) of each TMA box that copies the tile."""
        return [(j * self.block_cols, j * self.block_bytes) for j in range(self.blocks)]

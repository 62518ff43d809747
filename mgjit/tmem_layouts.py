"""Tensor memory (TMEM) layouts: where each element of a TMEM reference lives, and how registers reach it.

TMEM is 128 lanes by 512 columns of 32-bit cells per CTA; warp w of a warpgroup may only touch lanes
32w..32w+31 with tcgen05.ld/st (PTX ISA 9.1, 9.7.16.2.3 and 9.7.16.10.5). A reference is a 2D (rows, cols)
array of elements of 8, 16 or 32 bits; packing p puts p consecutive elements of a row in one 32-bit column,
the lowest-indexed element in the lowest bits. Three layouts cover what the MMA writes (9.7.16.10.5, "Data
Path Layout Organization"):

- default: row r in lane r. What a 1-CTA M=128 MMA writes (Layout D) and each CTA's half of a 2-CTA M=256
  MMA (Layout A). Its register counterpart is the TCGEN05 layout, moved by 16x256b/16x128b; the 32x32b
  "native" layout (thread i holds lane 32w+i) also moves it.
- half-lane: 64 rows. A 1-CTA M=64 MMA uses half the data path (Layout F: rows 16q..16q+15 in lanes
  32q..32q+15) at lane alignment 0 or 16, so the reference's left half of columns goes at lane offset 0 and
  the right half at 16: row r, column c -> lane 32(r // 16) + r % 16 + 16[c >= cols/2]. Two MMAs per K step
  fill it (`mma_pieces`). Its register counterpart is the WGMMA layout.
- m64 collective: 64 rows, each CTA's half of a 2-CTA M=128 MMA (Layout B, "2x2"): the left half of the
  columns in lanes 0-63, the right half in lanes 64-127. Its register layout is its own.

Block-scaled MMAs read their scale factors from TMEM in a fourth layout, `ScaleLayout`: a (MN, S) matrix of
8-bit scales (S per row of A or column of B), four consecutive scales of a row in one 32-bit word, 32 rows per
column, duplicated in all four 32-lane partitions (9.7.16.10.7). tcgen05.cp's 32x128b.warpx4 shape writes it.

Every layout is also written as a `TiledLayout` over TMEM (`TMEMLayout.tiled`): warp dimensions pick the
32-lane quarter, lane dimensions the lane in it, the vector dimension the slot in a column, and the remaining
dimensions, taken row-major, the column. `lane_and_column` reads that form.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Callable

from .layouts import LANES_PER_WARP, WARPS_PER_WARPGROUP, LayoutError, TiledLayout, Tiling
from .mma_descriptors import Tcgen05Kind

if TYPE_CHECKING:  # blocked_scales takes and returns tensors; importing mgjit does not import torch
    import torch

TMEM_LANES = 128
TMEM_COLUMNS = 512
# tcgen05.ld/st's .num table: .x128 of 32x32b, .x64 of 16x128b, .x32 of 16x256b; 128 registers each at most.
MAX_REGISTERS_PER_ACCESS = 128


class TMEMLayoutError(LayoutError):
    """A TMEM reference, layout or access does not fit what the hardware or the layout allows."""


class TMEMLayoutKind(enum.Enum):
    DEFAULT = "default"
    HALF_LANE = "half-lane"
    M64_COLLECTIVE = "m64 collective"


def _elements_per_register(dtype_bits: int) -> int:
    if dtype_bits not in (8, 16, 32):
        raise TMEMLayoutError(f"TMEM elements are 8, 16 or 32 bits wide, got {dtype_bits}")
    return 32 // dtype_bits


def _check_packing(dtype_bits: int, packing: int) -> None:
    # A column holds one element (in its low bits) or as many as fill it; nothing in between.
    allowed = sorted({1, _elements_per_register(dtype_bits)})
    if packing not in allowed:
        raise TMEMLayoutError(f"{dtype_bits}-bit data takes packing {' or '.join(map(str, allowed))}, got {packing}")


def _register_vector(dtype_bits: int) -> int:
    """Elements per register-layout vector in the 16-lane fragments: two columns for 32-bit data (16x256b
    hands each thread two adjacent columns), one full 32-bit register for narrower data (16x128b)."""
    return max(2, _elements_per_register(dtype_bits))


def _fragment_layout(rows_per_warp: int, vector: int) -> TiledLayout:
    """Each warp holds `rows_per_warp` rows; in every 8-row by 4-vector block, lane 4i + j holds row i,
    vector j (the 16x256b/16x128b fragment). vector = 2 gives exactly TCGEN05 (32 rows) and WGMMA (16 rows)."""
    width = 4 * vector
    return TiledLayout(Tiling(((WARPS_PER_WARPGROUP * rows_per_warp, width), (rows_per_warp, width),
                               (8, width), (vector,))),
                       warp_dims=(-7,), lane_dims=(-3, -2), vector_dim=-1)


def m64_collective_register_layout(cols: int, dtype_bits: int) -> TiledLayout:
    """The register layout that moves an m64-collective reference of `cols` columns.

    Warp 2h + q holds rows 32q..32q+31 of column half h, i.e. exactly the rows of TMEM quarter 2h + q, in the
    same 8-row by 4-vector fragment as TCGEN05 within the half.
    """
    vector = _register_vector(dtype_bits)
    if cols % (8 * vector):
        raise TMEMLayoutError(f"the m64 collective register layout of {dtype_bits}-bit data needs columns in "
                              f"multiples of {8 * vector} (two halves of {4 * vector}), got {cols}")
    return TiledLayout(Tiling(((64, cols), (32, cols // 2), (8, 4 * vector), (vector,))),
                       warp_dims=(-6, -7), lane_dims=(-3, -2), vector_dim=-1)


def native_register_layout(dtype_bits: int) -> TiledLayout:
    """The 32x32b layout of a default reference: thread i of warp w holds row 32w + i, each register one
    32-bit register's worth of consecutive columns."""
    per_register = _elements_per_register(dtype_bits)
    return TiledLayout(Tiling(((TMEM_LANES, per_register), (LANES_PER_WARP, per_register))),
                       warp_dims=(-4,), lane_dims=(-2,), vector_dim=-1)


@dataclasses.dataclass(frozen=True)
class TMEMInstruction:
    """One tcgen05.ld/st that every warp of the warpgroup issues.

    Each warp addresses lane 32w + `lane_offset`, column base + `column_offset`. `operands` lists, for each
    .b32 register of the instruction in order, the register-layout register (an index into
    `registers_shape`) and the vector position of its first element; a register holds 32 // dtype_bits
    elements from there.
    """

    num: int
    lane_offset: int
    column_offset: int
    operands: tuple[tuple[tuple[int, ...], int], ...]


@dataclasses.dataclass(frozen=True)
class TMEMAccess:
    """How a TMEM reference moves to or from registers: one shape and packing mode, several instructions."""

    shape: str  # "32x32b", "16x128b" or "16x256b"
    pack_16b: bool  # .pack::16b on loads, .unpack::16b on stores: 16-bit data one element per column
    register_layout: TiledLayout
    instructions: tuple[TMEMInstruction, ...]

    def cell(self, instruction: TMEMInstruction, register: int, lane):
        """Where register `register` of `instruction` goes for thread `lane` of a warp (an int or a tensor of
        them): (TMEM lane from the warp's first lane, TMEM column from the reference's first, the column step
        between the register's elements). The b32 forms (PTX ISA, the tcgen05.ld/st matrix fragments): 32x32b
        register r is lane l, column r; 16x128b is lane l // 4 + 8 (r % 2), column l % 4 + 4 (r // 2); 16x256b
        is lane l // 4 + 8 ((r // 2) % 2), column r % 2 + 2 (l % 4) + 8 (r // 4). With .pack::16b a register
        holds two 16-bit elements of adjacent columns (step 1, columns doubled); otherwise its elements share
        the column (step 0)."""
        r = register
        if self.shape == "32x32b":
            row, column = lane, r
        elif self.shape == "16x128b":
            row, column = lane // 4 + 8 * (r % 2), lane % 4 + 4 * (r // 2)
        else:
            row, column = lane // 4 + 8 * ((r // 2) % 2), r % 2 + 2 * (lane % 4) + 8 * (r // 4)
        if self.pack_16b:
            return instruction.lane_offset + row, instruction.column_offset + 2 * column, 1
        return instruction.lane_offset + row, instruction.column_offset + column, 0

    def opcode(self, instruction: TMEMInstruction, store: bool = False) -> str:
        if store:
            mode = ".unpack::16b" if self.pack_16b else ""
            return f"tcgen05.st.sync.aligned.{self.shape}.x{instruction.num}{mode}.b32"
        mode = ".pack::16b" if self.pack_16b else ""
        return f"tcgen05.ld.sync.aligned.{self.shape}.x{instruction.num}{mode}.b32"


@dataclasses.dataclass(frozen=True)
class MMAPiece:
    """One tcgen05.mma's share of an accumulator reference: it writes reference columns
    [col_start, col_start + n) with its D address advanced by `lane_offset` lanes and `column_offset` columns."""

    lane_offset: int
    column_offset: int
    col_start: int
    n: int


@dataclasses.dataclass(frozen=True)
class _Strip:
    """How one warp's 32 TMEM lanes of a reference split into instruction repetitions."""

    shape: str
    lane_steps: int  # 16-lane shapes cover a warp's 32 lanes in two steps
    chunks: int  # .x1 repetitions per lane step
    chunk_columns: int  # TMEM columns one .x1 covers
    registers_per_chunk: int
    operands: Callable[[int, int], list[tuple[tuple[int, ...], int]]]  # (lane step, chunk) -> .x1's operands


@dataclasses.dataclass(frozen=True)
class TMEMLayout:
    """The layout of a (rows, cols) TMEM reference; rows follow from the kind (128 default, else 64)."""

    kind: TMEMLayoutKind
    cols: int
    packing: int = 1

    def __post_init__(self):
        if not isinstance(self.kind, TMEMLayoutKind):
            raise TMEMLayoutError(f"kind must be a TMEMLayoutKind, got {self.kind!r}")
        if self.packing not in (1, 2, 4):
            raise TMEMLayoutError(f"packing must be 1, 2 or 4 elements per 32-bit column, got {self.packing}")
        halves = 1 if self.kind is TMEMLayoutKind.DEFAULT else 2
        if self.cols <= 0 or self.cols % (halves * self.packing):
            what = "each half of the columns" if halves == 2 else "the columns"
            raise TMEMLayoutError(f"{self.kind.value} layout with packing {self.packing}: {what} must fill whole "
                                  f"32-bit columns, so cols must be a positive multiple of "
                                  f"{halves * self.packing}, got {self.cols}")
        if self.columns > TMEM_COLUMNS:
            raise TMEMLayoutError(f"a {self.rows}x{self.cols} reference in the {self.kind.value} layout with "
                                  f"packing {self.packing} needs {self.columns} TMEM columns, more than "
                                  f"the {TMEM_COLUMNS} there are")

    @property
    def rows(self) -> int:
        return TMEM_LANES if self.kind is TMEMLayoutKind.DEFAULT else TMEM_LANES // 2

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    @property
    def tiled(self) -> TiledLayout:
        """This layout in the tiled-layout algebra, read over TMEM instead of threads."""
        p, c = self.packing, self.cols
        if self.kind is TMEMLayoutKind.DEFAULT:
            return TiledLayout(Tiling(((TMEM_LANES, p), (LANES_PER_WARP, p))),
                               warp_dims=(-4,), lane_dims=(-2,), vector_dim=-1)
        if self.kind is TMEMLayoutKind.HALF_LANE:
            # (column half, row % 16) pick the lane in the quarter: the right half folds into lanes 16-31.
            return TiledLayout(Tiling(((64, c), (16, c // 2), (p,))),
                               warp_dims=(-5,), lane_dims=(-4, -3), vector_dim=-1)
        # (column half, row // 32) pick the quarter: the right half goes to quarters 2 and 3.
        return TiledLayout(Tiling(((64, c), (32, c // 2), (p,))),
                           warp_dims=(-4, -5), lane_dims=(-3,), vector_dim=-1)

    @property
    def columns(self) -> int:
        """The TMEM columns the reference occupies (allocate `tmem_alloc_columns(columns)`)."""
        halves = 1 if self.kind is TMEMLayoutKind.DEFAULT else 2
        return self.cols // halves // self.packing

    def lane_and_column(self, row: int, col: int) -> tuple[int, int, int]:
        """(TMEM lane, TMEM column relative to the reference's base, slot within the 32-bit column)."""
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            raise TMEMLayoutError(f"element ({row}, {col}) is outside the {self.rows}x{self.cols} reference")
        tiled = self.tiled
        index = tiled.tiling.tile_index((row, col))
        sizes = tiled.tiling.tile_shape(self.shape)
        n = len(index)

        def linear(dims) -> int:
            value = 0
            for d in dims:
                value = value * sizes[n + d] + index[n + d]
            return value

        special = {n + d for d in (*tiled.warp_dims, *tiled.lane_dims, tiled.vector_dim)}
        column = linear([j - n for j in range(n) if j not in special])
        lane = LANES_PER_WARP * linear(tiled.warp_dims) + linear(tiled.lane_dims)
        return lane, column, index[n + tiled.vector_dim]

    def _check_dtype(self, dtype_bits: int) -> None:
        _check_packing(dtype_bits, self.packing)
        if self.packing == 1 and dtype_bits == 8:
            # Only 16-bit data has a register (un)packing mode (.pack::16b / .unpack::16b).
            raise TMEMLayoutError("8-bit data must be packed 4 per column to move through registers; "
                                  "tcgen05.ld/st have no 8-bit unpacking mode, got packing 1")

    def register_layout(self, dtype_bits: int) -> TiledLayout:
        """The register layout tcgen05.ld/st move this reference to and from (see the module docstring)."""
        self._check_dtype(dtype_bits)
        vector = _register_vector(dtype_bits)
        if self.kind is TMEMLayoutKind.M64_COLLECTIVE:
            return m64_collective_register_layout(self.cols, dtype_bits)
        span = (1 if self.kind is TMEMLayoutKind.DEFAULT else 2) * 4 * vector
        if self.cols % span:
            raise TMEMLayoutError(f"the {self.kind.value} layout's register layout for {dtype_bits}-bit data "
                                  f"needs cols in multiples of {span}, got {self.cols}")
        return _fragment_layout(32 if self.kind is TMEMLayoutKind.DEFAULT else 16, vector)

    def _strip(self, dtype_bits: int, register_layout: TiledLayout) -> _Strip:
        native = register_layout == native_register_layout(dtype_bits)
        if native and self.kind is not TMEMLayoutKind.DEFAULT:
            raise TMEMLayoutError(f"the 32x32b native register layout reads lane 32w + i in thread i, which "
                                  f"is only the default layout's row order, not {self.kind.value}'s")
        if not native and register_layout != self.register_layout(dtype_bits):
            alternative = f" or {native_register_layout(dtype_bits)}" if self.kind is TMEMLayoutKind.DEFAULT else ""
            raise TMEMLayoutError(f"the {self.kind.value} layout moves through {self.register_layout(dtype_bits)}"
                                  f"{alternative}, got {register_layout}")
        per_register = _elements_per_register(dtype_bits)
        rank = len(register_layout.tiled_shape(self.shape))

        def reg(positions: dict[int, int]) -> tuple[int, ...]:
            # A register index from its coordinates along some (negative) tiled dimensions; the rest are 0.
            index = [0] * rank
            for dim, value in positions.items():
                index[rank + dim] = value
            return tuple(index)

        if native:
            return _Strip("32x32b", 1, self.cols // per_register, per_register // self.packing, 1,
                          lambda s, k: [(reg({-5: k}), 0)])
        vector = _register_vector(dtype_bits)
        # 16x256b hands a thread two columns per row (32-bit data), 16x128b one 32-bit register per row.
        shape, per_row = ("16x256b", 2) if dtype_bits == 32 else ("16x128b", 1)
        chunk_elements = 4 * vector
        if self.kind is TMEMLayoutKind.DEFAULT:
            chunks = self.cols // chunk_elements
            register_of = lambda s, k, h: reg({-8: k, -5: 2 * s + h})
        elif self.kind is TMEMLayoutKind.HALF_LANE:
            # Lane step s holds column half s of the warp's 16 rows.
            chunks = self.cols // 2 // chunk_elements
            register_of = lambda s, k, h: reg({-8: s * chunks + k, -5: h})
        else:
            # Lane step s holds rows 16s..16s+15 of the warp's 32 rows within its column half.
            chunks = self.cols // 2 // chunk_elements
            register_of = lambda s, k, h: reg({-4: k, -5: 2 * s + h})
        # Per .x1: row half h (lanes +0, then +8), then that row's registers, low columns first.
        return _Strip(shape, 2, chunks, chunk_elements // self.packing, 2 * per_row,
                      lambda s, k: [(register_of(s, k, h), q * per_register) for h in (0, 1) for q in range(per_row)])

    def access(self, dtype_bits: int, register_layout: TiledLayout | None = None,
               max_registers: int = 32) -> TMEMAccess:
        """The tcgen05.ld/st instructions that move this reference to or from `register_layout`.

        The ISA allows 128 registers per instruction; the default cap of 32 keeps one load from pinning more
        registers than an epilogue step consumes before the next load is issued. Each lane step's repetitions
        are split greedily into powers of two (.num must be one).
        """
        self._check_dtype(dtype_bits)
        if register_layout is None:
            register_layout = self.register_layout(dtype_bits)
        if not (0 < max_registers <= MAX_REGISTERS_PER_ACCESS and max_registers & (max_registers - 1) == 0):
            raise TMEMLayoutError(f"max_registers must be a power of two in 1..{MAX_REGISTERS_PER_ACCESS}, "
                                  f"got {max_registers}")
        strip = self._strip(dtype_bits, register_layout)
        max_num = max_registers // strip.registers_per_chunk
        if max_num == 0:
            raise TMEMLayoutError(f"a {strip.shape} access takes {strip.registers_per_chunk} registers, more "
                                  f"than max_registers = {max_registers}")
        instructions = []
        for step in range(strip.lane_steps):
            done = 0
            while done < strip.chunks:
                num = min(max_num, 1 << ((strip.chunks - done).bit_length() - 1))
                operands = tuple(op for k in range(done, done + num) for op in strip.operands(step, k))
                instructions.append(TMEMInstruction(num, 16 * step, done * strip.chunk_columns, operands))
                done += num
        return TMEMAccess(strip.shape, dtype_bits == 16 and self.packing == 1, register_layout,
                          tuple(instructions))

    def mma_pieces(self, max_n: int = 256) -> tuple[MMAPiece, ...]:
        """The tcgen05.mma instructions (one K step) that write this reference as an accumulator.

        An accumulator is never packed (9.7.16.10.4.1: a 16-bit D element sits alone in the low bits of its
        word). The half-lane layout takes one M=64 MMA per column half, the second at lane offset 16 (Layout
        F's other alignment). An m64 collective instruction folds its own N into two lane halves, so it must
        cover the whole reference: its N columns cannot be split without splitting B's columns in two.
        """
        if self.packing != 1:
            raise TMEMLayoutError(f"an MMA accumulator is stored one element per column, got packing {self.packing}")
        if self.kind is TMEMLayoutKind.M64_COLLECTIVE:
            if self.cols > max_n:
                raise TMEMLayoutError(f"an m64 collective accumulator is written by one instruction, so its "
                                      f"{self.cols} columns must be at most N = {max_n}")
            return (MMAPiece(0, 0, 0, self.cols),)
        groups = 1 if self.kind is TMEMLayoutKind.DEFAULT else 2
        width = self.cols // groups
        # The widest N (a multiple of 8, as the descriptor's N >> 3 field demands) that tiles the width.
        n = next((n for n in range(min(width, max_n), 0, -1) if width % n == 0 and n % 8 == 0), None)
        if n is None:
            raise TMEMLayoutError(f"{width} columns per lane group cannot be split into MMAs whose N is a "
                                  f"multiple of 8 and at most {max_n}")
        return tuple(MMAPiece(16 * g, j * n, g * width + j * n, n)
                     for g in range(groups) for j in range(width // n))


@dataclasses.dataclass(frozen=True)
class ScaleLayout:
    """The TMEM layout of a (rows, cols) matrix of block scales: `rows` rows of A (M) or of B's columns (N),
    `cols` scales along K per row. Scales 4g..4g+3 of row r share one word, byte s % 4, in lane r % 32 of every
    32-lane partition (the MMA's partition p reads its own copy), column g * rows / 32 + r // 32: for each group
    of four scales, the rows' words side by side, 32 rows to a column. tcgen05.cp.32x128b.warpx4 fills one
    128-row by 4-scale chunk (4 columns) from 512 bytes of SMEM in which row r's four scales of group g sit at
    16 * (r % 32) + 4 * (r // 32 % 4) (`chunk_byte`)."""

    rows: int
    cols: int

    def __post_init__(self):
        if self.rows <= 0 or self.rows % CHUNK_ROWS or self.cols <= 0 or self.cols % 4:
            raise TMEMLayoutError(f"a TMEM scale matrix has rows in multiples of {CHUNK_ROWS} and scales per row in "
                                  f"multiples of 4 (the chunks tcgen05.cp moves), got {self.rows}x{self.cols}")
        if self.columns > TMEM_COLUMNS:
            raise TMEMLayoutError(f"a {self.rows}x{self.cols} scale matrix needs {self.columns} TMEM columns, more "
                                  f"than the {TMEM_COLUMNS} there are")

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    @property
    def columns(self) -> int:
        return self.rows * self.cols // 128

    def word_column(self, row, group):
        """The column (from the matrix's first) of the word holding scales 4 * group .. 4 * group + 3 of `row`
        (ints or tensors of them)."""
        return group * (self.rows // LANES_PER_WARP) + row // LANES_PER_WARP

    def lane_and_column(self, row: int, col: int, partition: int = 0) -> tuple[int, int, int]:
        """(TMEM lane, column from the matrix's first, byte in the word) of scale (row, col), in `partition`."""
        if not (0 <= row < self.rows and 0 <= col < self.cols and 0 <= partition < WARPS_PER_WARPGROUP):
            raise TMEMLayoutError(f"scale ({row}, {col}) of partition {partition} is outside the {self.rows}x"
                                  f"{self.cols} matrix")
        return LANES_PER_WARP * partition + row % LANES_PER_WARP, self.word_column(row, col // 4), col % 4

    def chunks(self) -> list[tuple[int, int]]:
        """One (byte offset in the SMEM source, column offset in the matrix) per tcgen05.cp.32x128b.warpx4 that
        fills it. The source holds the chunks (row tile t, scale group g) in order t-major, 512 bytes each."""
        groups = self.cols // 4
        return [((t * groups + g) * CHUNK_BYTES, self.word_column(t * CHUNK_ROWS, g))
                for t in range(self.rows // CHUNK_ROWS) for g in range(groups)]

    def register_layout(self, dtype_bits: int) -> TiledLayout:
        raise TMEMLayoutError("block scales reach TMEM from SMEM with mgjit.tcgen05_copy and are read by the MMA; "
                              "they do not move through registers")


# tcgen05.cp.32x128b.warpx4: 32 rows of 16 bytes, each row to one lane of every partition, 4 columns.
CHUNK_ROWS = 128
CHUNK_BYTES = 512


def chunk_byte(row, scale):
    """Where scale `scale` (0..3) of row `row` (0..127) of a 128x4 chunk sits in its 512 SMEM bytes: lane row %
    32's 16 bytes hold columns row // 32, four bytes each (ints or tensors of them)."""
    return 16 * (row % LANES_PER_WARP) + 4 * (row // LANES_PER_WARP) + scale


def blocked_scales(scales: torch.Tensor) -> torch.Tensor:
    """A (rows, cols) matrix of block scales (a torch tensor; rows a multiple of 128, cols of 4) laid out as
    tcgen05_copy reads it: shape (rows // 128, cols // 4 * 32, 16), 128 x 4 chunks of 512 bytes in `chunk_byte`
    order, a row tile's chunks in K order. A kernel's TMA box of (T, G * 32, 16) at (t, 32 * g, 0) brings the
    scales of row tiles t.. t + T - 1 and scale groups g .. g + G - 1 (scales 4g ..), ready for tcgen05_copy."""
    import torch

    rows, cols = scales.shape
    ScaleLayout(rows, cols)  # checks the shape
    r = torch.arange(rows, device=scales.device)[:, None]
    s = torch.arange(cols, device=scales.device)[None, :]
    offset = ((r // CHUNK_ROWS) * (cols // 4) + s // 4) * CHUNK_BYTES + chunk_byte(r % CHUNK_ROWS, s % 4)
    out = torch.empty(rows * cols, dtype=torch.uint8, device=scales.device)
    out[offset.reshape(-1)] = scales.reshape(-1).view(torch.uint8)  # torch cannot index_put 8-bit float types
    return out.view(scales.dtype).view(rows // CHUNK_ROWS, cols // 4 * LANES_PER_WARP, 16)


def mma_data_path(m: int, n: int, cta_group: int, row, col):
    """Where one tcgen05.mma (dense, no .ws) of shape M x N writes element (row, col) of a CTA's share of D,
    relative to its D address: (lane, column). PTX ISA 9.7.16.10.5 ("Data Path Layout Organization"): Layout D
    (1 CTA, M = 128) and Layout A (2 CTAs, M = 256, each CTA its 128 rows) put row r in lane r; Layout F (1 CTA,
    M = 64) puts rows 16q..16q+15 in lanes 32q..32q+15; Layout B (2 CTAs, M = 128, each CTA its 64 rows) puts
    the left half of the N columns in lanes 0-63 and the right half in lanes 64-127. Independent of TMEMLayout,
    which must agree with it for an MMA's result to load back (the interpreter checks one against the other)."""
    if cta_group == 1 and m == 64:
        return 32 * (row // 16) + row % 16, col
    if cta_group == 2 and m == 128:
        half = n // 2
        return row + 64 * (col // half), col % half
    if (cta_group, m) in ((1, 128), (2, 256)):
        return row, col
    raise TMEMLayoutError(f"no dense tcgen05.mma data path for M = {m} over {cta_group} CTA(s)")


def infer_tmem_layout(rows: int, cols: int, dtype_bits: int, collective: bool,
                      packing: int | None = None) -> TMEMLayout:
    """The layout of a (rows, cols) TMEM reference of `dtype_bits`-bit elements.

    128 rows: default. 64 rows: m64 collective under a 2-CTA MMA, half-lane otherwise. `packing` defaults to
    as many elements as fit a 32-bit column; pass packing=1 for an MMA accumulator narrower than 32 bits.
    """
    packing = _elements_per_register(dtype_bits) if packing is None else packing
    _check_packing(dtype_bits, packing)
    if rows == TMEM_LANES:
        kind = TMEMLayoutKind.DEFAULT
    elif rows == TMEM_LANES // 2:
        kind = TMEMLayoutKind.M64_COLLECTIVE if collective else TMEMLayoutKind.HALF_LANE
    else:
        raise TMEMLayoutError(f"a TMEM reference has {TMEM_LANES} rows (M=128, or M=256 over 2 CTAs) or "
                              f"{TMEM_LANES // 2} rows (M=64, or M=128 over 2 CTAs), got {rows}")
    return TMEMLayout(kind, cols, packing)


def tmem_alloc_columns(ncols: int, exact: bool = False) -> int:
    """The columns tcgen05.alloc must request for `ncols` columns: a power of two in 32..512 (9.7.16.7.1).

    With exact=True, `ncols` itself must already be such a count.
    """
    if not 0 < ncols <= TMEM_COLUMNS:
        raise TMEMLayoutError(f"a TMEM allocation covers 1..{TMEM_COLUMNS} columns, got {ncols}")
    rounded = max(32, 1 << (ncols - 1).bit_length())
    if exact and rounded != ncols:
        raise TMEMLayoutError(f"tcgen05.alloc takes a power of two in 32..{TMEM_COLUMNS} columns, got {ncols}")
    return rounded


def check_tcgen05_shape(m: int, n: int, k: int, kind: Tcgen05Kind | str, collective: bool) -> None:
    """Raise TMEMLayoutError unless tcgen05.mma (dense, no .ws) has an m x n x k instruction of `kind`.

    From PTX ISA 9.7.16.2.1, Table 39: 1-CTA M is 64 or 128 and N steps by 8 up to 256; 2-CTA M is 128 or
    256 and N steps by 16. Kind i8 is coarser: 1-CTA N is 8, 16, 24, 32 then steps by 16; 2-CTA N steps by
    32. K is 32 bytes of input: 16 for f16, 8 for tf32, 32 for f8f6f4, i8 and the block-scaled kinds (whose
    mxf4nvf4 elements are pairs). For 2 CTAs, M and N are the pair's (per CTA, A is M/2 x K and B is K x N/2).
    Block-scaled kinds are used with 128 rows per CTA: M = 128 on 1 CTA, 256 on 2.
    """
    try:
        kind = Tcgen05Kind(kind)
    except ValueError:
        raise TMEMLayoutError(f"kind must be one of {', '.join(k.value for k in Tcgen05Kind)}, got {kind!r}") from None
    group = "2-CTA" if collective else "1-CTA"
    ms = (128, 256) if collective else (64, 128)
    if kind.block_scaled:  # mgjit's block-scaled MMAs use the default layout: 128 rows per CTA
        ms = (256,) if collective else (128,)
    if m not in ms:
        raise TMEMLayoutError(f"{group} tcgen05.mma takes M in {ms}, got M = {m}")
    if kind is Tcgen05Kind.I8:
        ns = list(range(32, 257, 32)) if collective else [8, 16, 24, 32, *range(48, 257, 16)]
    else:
        step = 16 if collective else 8
        ns = list(range(step, 257, step))
    if n not in ns:
        rule = ("multiples of 32 up to 256" if collective else "8, 16, 24, 32, then multiples of 16 up to 256") \
            if kind is Tcgen05Kind.I8 else f"multiples of {16 if collective else 8} up to 256"
        raise TMEMLayoutError(f"{group} tcgen05.mma kind {kind.value} takes N in {rule}, got N = {n}")
    if k != kind.instruction_k:
        raise TMEMLayoutError(f"tcgen05.mma kind {kind.value} takes K = {kind.instruction_k} (32 bytes), got K = {k}")

"""SMEM tile geometry (mgjit/tiles.py): the swizzle, where each element of a tile is stored, the TMA boxes.

The same functions run on Python ints (here and in the frontend), on torch index tensors (the interpreter) and
on MLIR values (the lowering, through `lower.emit.Index`); these tests hold them to an independent statement
of the layout and check that each form computes the same numbers."""
import itertools
import types

import pytest

from mgjit import tiles
from mgjit.lower.emit import Index

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("width,xor_bits", [(32, 1), (64, 2), (128, 3)])
def test_swizzle_is_the_bit_xor(width, xor_bits):
    # The swizzle XORs address bits [4, 4 + b) with bits [7, 7 + b), b = log2(width / 16): it permutes the
    # 16-byte chunks of each 128-byte line by the line index (PTX ISA 9.7.16.10.6; TMA uses the same pattern).
    mask = (1 << xor_bits) - 1
    for offset in range(4 * 8 * width):
        assert tiles.swizzle(offset, width) == offset ^ (((offset >> 7) & mask) << 4)


@pytest.mark.parametrize("width", tiles.SWIZZLES)
def test_swizzle_is_a_chunk_permutation_repeating_every_8_rows(width):
    period = 8 * width  # 256, 512, 1024 bytes: the repeat boundaries of 9.7.16.4.1, Table 41
    for base in range(0, 4 * period, period):
        image = [tiles.swizzle(base + o, width) for o in range(period)]
        assert sorted(image) == list(range(base, base + period))
    for offset in range(period):
        assert tiles.swizzle(offset, width) % 16 == offset % 16  # bytes move with their 16-byte chunk
        if offset < 128:
            assert tiles.swizzle(offset, width) == offset  # the first line of a pattern stays in place


def reference_offset(shape, bits, width, row, col):
    """The storage rule stated directly: column blocks `width` bytes wide, each rows x width bytes, and within
    a block chunk j of line L moved to chunk j ^ (L % (width / 16))."""
    itemsize = bits // 8
    rows = 1
    for d in shape[:-1]:
        rows *= d
    if width is None:
        return (row * shape[-1] + col) * itemsize
    per_line = width // itemsize
    block, within = divmod(col, per_line)
    line = row * width + within * itemsize  # byte offset in the block before the swizzle
    line_index, in_line = divmod(line, 128)
    chunk, in_chunk = divmod(in_line, 16)
    chunk ^= line_index % (width // 16)
    return block * rows * width + line_index * 128 + chunk * 16 + in_chunk


SHAPES = [((64, 64), 16, 128), ((8, 64), 16, 64), ((16, 128), 8, 128), ((2, 8, 32), 32, 128), ((24, 16), 16, 32),
          ((64, 256), 16, 128), ((8, 40), 16, None), ((3, 5, 7), 32, None)]


@pytest.mark.parametrize("shape,bits,width", SHAPES)
def test_every_element_has_its_own_bytes_where_the_rule_says(shape, bits, width):
    tile = tiles.Tile(shape, bits, width)
    rows, cols = tile.rows, tile.cols
    seen = set()
    for r, c in itertools.product(range(rows), range(cols)):
        offset = tile.offset(r, c)
        assert offset == reference_offset(shape, bits, width, r, c)
        seen.add(offset // tile.itemsize)
    assert len(seen) == rows * cols and max(seen) * tile.itemsize < tile.nbytes


@pytest.mark.parametrize("shape,bits,width", SHAPES)
def test_index_tensors_compute_the_same_offsets(shape, bits, width):
    """The interpreter evaluates offsets on whole tensors of indices at once."""
    tile = tiles.Tile(shape, bits, width)
    r, c = torch.meshgrid(torch.arange(tile.rows), torch.arange(tile.cols), indexing="ij")
    got = tile.offset(r, c)
    want = torch.tensor([[tile.offset(i, j) for j in range(tile.cols)] for i in range(tile.rows)])
    assert torch.equal(got, want)


def _integer_emitter():
    """An emitter whose 'MLIR ops' compute ints: what the lowering's Index maps each operator to."""
    arith = types.SimpleNamespace(xori=lambda a, b: a ^ b, shli=lambda a, b: a << b, shrui=lambda a, b: a >> b)
    return types.SimpleNamespace(i32=lambda v: v, addi=lambda a, b: a + b, muli=lambda a, b: a * b,
                                 divui=lambda a, b: a // b, remui=lambda a, b: a % b, andi=lambda a, b: a & b,
                                 m=types.SimpleNamespace(arith=arith))


@pytest.mark.parametrize("shape,bits,width", SHAPES)
def test_the_lowering_index_emits_the_same_arithmetic(shape, bits, width):
    e = _integer_emitter()
    tile = tiles.Tile(shape, bits, width)
    for r, c in [(0, 0), (tile.rows - 1, tile.cols - 1), (tile.rows // 2, tile.cols // 3), (7, 1)]:
        if r < tile.rows:
            assert tile.offset(Index(e, r), Index(e, c)).value == tile.offset(r, c)


def test_tma_boxes_are_one_per_column_block():
    tile = tiles.Tile((128, 256), 16, 128)  # 64 bf16 per 128-byte row: 4 column blocks of 128 x 128 bytes
    assert (tile.block_cols, tile.blocks, tile.block_rows * tile.row_bytes) == (64, 4, 16384)
    assert tile.tma_box() == (128, 64) and tile.tma_box(split=2) == (64, 64)
    assert tile.boxes() == [((0, 0), 0), ((0, 64), 16384), ((0, 128), 32768), ((0, 192), 49152)]
    for (_, col), byte in tile.boxes():  # a box's first element is where the tile stores that column
        assert tile.offset(0, col) == byte
    flat = tiles.Tile((64, 40), 16)  # no swizzle: one box covers the row
    assert flat.tma_box() == (64, 40) and flat.boxes() == [((0, 0), 0)]


def test_descriptor_offsets_skip_the_swizzle():
    """An MMA descriptor addresses the unswizzled start of an 8-row atom; the hardware applies the XOR."""
    tile = tiles.Tile((64, 128), 16, 128)
    assert tile.offset(8, 64, swizzled=False) == 1 * 64 * 128 + 8 * 128  # column block 1, row 8
    assert tile.offset(9, 64, swizzled=False) == 8192 + 9 * 128
    assert tile.offset(9, 64) == 8192 + 9 * 128 + 16  # line 9: chunk 0 moves to chunk 9 % 8 = 1

"""TMEM layouts against mappings written out by hand from the PTX ISA (9.1 numbering).

Every expected mapping below is an independent formula taken from the ISA text and figures, never a call into
the code under test: the data-path layouts from 9.7.16.10.5 and the tcgen05.ld/st fragments from 9.7.16.2.3.1.
"""
import itertools

import pytest

from mgjit.layouts import LANES_PER_WARP, TCGEN05, WGMMA, LayoutError
from mgjit.tmem_layouts import (
    MMAPiece, ScaleLayout, TMEMLayout, TMEMLayoutError, TMEMLayoutKind, check_tcgen05_shape, chunk_byte,
    infer_tmem_layout,
    m64_collective_register_layout, mma_data_path, native_register_layout, tmem_alloc_columns,
)

DEFAULT, HALF, M64 = TMEMLayoutKind.DEFAULT, TMEMLayoutKind.HALF_LANE, TMEMLayoutKind.M64_COLLECTIVE
PACKINGS = (1, 2, 4)
# (bits, packing) pairs that move through registers: 32-bit alone, 16-bit unpacked (.pack::16b) or packed,
# 8-bit packed four to a column.
DATA = ((32, 1), (16, 1), (16, 2), (8, 4))


# --- hand-derived TMEM mappings: (row, col) -> (lane, column, slot) -------------------------------------------
# Slot: packing p puts elements p*k .. p*k+p-1 of a row in column k, lowest index in the lowest bits.

def hand_default(row, col, cols, p):
    # Layout D (M = 128, cta_group::1) and Layout A (M = 256, per CTA): 4x1 data path, row r is lane r.
    return row, col // p, col % p


def hand_half_lane(row, col, cols, p):
    # Layout F (M = 64, cta_group::1, non-.ws): "4x1, 1/2 datapath utilized", rows 16q..16q+15 in lanes
    # 32q..32q+15, lane alignment 0 or 16. The layout puts the left half of the columns at alignment 0 and the
    # right half at alignment 16, both starting at the reference's first column.
    half = cols // 2
    return 32 * (row // 16) + row % 16 + 16 * (col // half), (col % half) // p, col % p


def hand_m64_collective(row, col, cols, p):
    # Layout B (M = 128, cta_group::2, dense): "2x2" data path, each CTA's 64 rows in lanes 0-63 for the
    # left half of N and in lanes 64-127 for the right half.
    half = cols // 2
    return row + 64 * (col // half), (col % half) // p, col % p


HAND = {DEFAULT: hand_default, HALF: hand_half_lane, M64: hand_m64_collective}


def layouts_under_test():
    for kind, p in itertools.product(TMEMLayoutKind, PACKINGS):
        for cols in (8 * p, 64, 256):
            if kind is not DEFAULT and cols < 16 * p:
                continue
            yield TMEMLayout(kind, cols, p)


@pytest.mark.parametrize("layout", list(layouts_under_test()), ids=lambda l: f"{l.kind.name}-{l.cols}-p{l.packing}")
def test_lane_and_column_matches_isa_data_path(layout):
    rows, cols, p = layout.rows, layout.cols, layout.packing
    assert rows == (128 if layout.kind is DEFAULT else 64)
    seen = set()
    for row, col in itertools.product(range(rows), range(cols)):
        got = layout.lane_and_column(row, col)
        assert got == HAND[layout.kind](row, col, cols, p), (row, col)
        seen.add(got)
    # Every element in its own cell, and exactly `columns` columns used.
    assert len(seen) == rows * cols
    assert {c for _, c, _ in seen} == set(range(layout.columns))
    assert layout.columns == cols // p // (1 if layout.kind is DEFAULT else 2)


def test_lane_and_column_rejects_out_of_range():
    layout = TMEMLayout(HALF, 64)
    with pytest.raises(TMEMLayoutError, match=r"\(64, 0\) is outside the 64x64"):
        layout.lane_and_column(64, 0)


@pytest.mark.parametrize("kind,cols,packing,message", [
    (DEFAULT, 64, 3, "packing must be 1, 2 or 4.*got 3"),
    (DEFAULT, 6, 4, "multiple of 4, got 6"),
    (HALF, 6, 2, "each half.*multiple of 4, got 6"),
    (M64, 0, 1, "positive multiple of 2, got 0"),
    (DEFAULT, 1024, 1, "needs 1024 TMEM columns, more than the 512"),
    (HALF, 2048, 1, "needs 1024 TMEM columns"),
])
def test_layout_constraints(kind, cols, packing, message):
    with pytest.raises(TMEMLayoutError, match=message):
        TMEMLayout(kind, cols, packing)
    assert issubclass(TMEMLayoutError, LayoutError)


# --- hand-derived register ownership -------------------------------------------------------------------------

def hand_fragment_owner(row, col, rows_per_warp, v):
    # The 16x256b / 16x128b fragments (and the wgmma D fragment) in every 8-row by 4v-element block: thread
    # 4i + j holds row i, elements v*j .. v*j+v-1. Warp w holds rows_per_warp consecutive rows.
    return (row // rows_per_warp) % 4, 4 * (row % 8) + (col % (4 * v)) // v, col % v


def hand_m64_owner(row, col, cols, v):
    # Warp 2h + q holds rows 32q..32q+31 of column half h: exactly the rows of TMEM quarter 2h + q (Layout B).
    half = cols // 2
    warp = 2 * (col // half) + row // 32
    return warp, 4 * (row % 8) + (col % half % (4 * v)) // v, col % v


def hand_native_owner(row, col, e):
    # 32x32b (Figure 183): thread i of warp w reads lane 32w + i; register k holds columns k*e .. k*e+e-1.
    return row // 32, row % 32, col % e


def owners(register_layout, shape):
    """(tid, register, vector position) -> element, over every thread and register of the layout."""
    result = {}
    for tid in range(128):
        for reg in register_layout.registers(shape):
            for v in range(register_layout.vector_length):
                result[tid, reg, v] = register_layout.element_index(shape, tid, reg, v)
    return result


def hand_owner(layout, bits, row, col, native=False):
    e = 32 // bits
    v = max(2, e)
    if native:
        return hand_native_owner(row, col, e)
    if layout.kind is M64:
        return hand_m64_owner(row, col, layout.cols, v)
    return hand_fragment_owner(row, col, 32 if layout.kind is DEFAULT else 16, v)


def cases():
    for kind, (bits, p), cols in itertools.product(TMEMLayoutKind, DATA, (32, 128)):
        yield TMEMLayout(kind, cols, p), bits, False
    for (bits, p), cols in itertools.product(DATA, (16, 96)):
        yield TMEMLayout(DEFAULT, cols, p), bits, True


def case_id(case):
    layout, bits, native = case
    return f"{layout.kind.name}-{layout.cols}-p{layout.packing}-{bits}b" + ("-native" if native else "")


@pytest.mark.parametrize("case", list(cases()), ids=case_id)
def test_register_layout_owners_match_hand_formulas(case):
    layout, bits, native = case
    reg_layout = native_register_layout(bits) if native else layout.register_layout(bits)
    got = owners(reg_layout, layout.shape)
    elements = list(got.values())
    assert sorted(elements) == sorted(itertools.product(range(layout.rows), range(layout.cols)))
    for (tid, _, pos), (row, col) in got.items():
        assert (tid // 32, tid % 32, pos) == hand_owner(layout, bits, row, col, native), (tid, row, col)
        # The warp holding an element may access its TMEM lane: warp w <-> lanes 32w..32w+31.
        lane, _, _ = HAND[layout.kind](row, col, layout.cols, layout.packing)
        assert lane // LANES_PER_WARP == tid // 32, (tid, row, col, lane)


def test_named_register_layouts():
    for bits, p in ((32, 1), (16, 1), (16, 2)):
        assert TMEMLayout(DEFAULT, 64, p).register_layout(bits) == TCGEN05
        assert TMEMLayout(HALF, 64, p).register_layout(bits) == WGMMA
    assert TMEMLayout(M64, 64).register_layout(32) == m64_collective_register_layout(64, 32)


@pytest.mark.parametrize("kind,cols,bits,packing,message", [
    (DEFAULT, 64, 8, 1, "no 8-bit unpacking mode"),
    (DEFAULT, 64, 32, 2, "32-bit data takes packing 1, got 2"),
    (DEFAULT, 64, 16, 4, "16-bit data takes packing 1 or 2, got 4"),
    (DEFAULT, 4, 32, 1, "multiples of 8, got 4"),
    (HALF, 8, 32, 1, "multiples of 16, got 8"),
    (M64, 16, 8, 4, "multiples of 32 .*got 16"),
    (DEFAULT, 64, 12, 1, "8, 16 or 32 bits wide, got 12"),
])
def test_register_layout_constraints(kind, cols, bits, packing, message):
    with pytest.raises(TMEMLayoutError, match=message):
        TMEMLayout(kind, cols, packing).register_layout(bits)


# --- tcgen05.ld/st plans against the ISA fragments -------------------------------------------------------------

def hand_fragment(shape, t, j):
    """(lane within the access, 32-bit column within the access) of register j of thread t, PTX ISA
    9.7.16.2.3.1 "Matrix fragments": .xN repeats the .x1 pattern N times along the columns."""
    if shape == "32x32b":  # Figure 183: thread t owns lane t, register j is column j.
        return t, j
    if shape == "16x256b":  # Figure 186: r0, r1 at lane t/4, columns 2(t%4), +1; r2, r3 the same at lane +8.
        rep, i = divmod(j, 4)
        return t // 4 + 8 * (i // 2), 8 * rep + 2 * (t % 4) + i % 2
    if shape == "16x128b":  # Figure 185: r0 at lane t/4, column t%4; r1 the same at lane +8.
        rep, i = divmod(j, 2)
        return t // 4 + 8 * i, 4 * rep + t % 4
    raise AssertionError(shape)


@pytest.mark.parametrize("case", list(cases()), ids=case_id)
@pytest.mark.parametrize("max_registers", [4, 32, 128])
def test_access_moves_every_element_to_its_cell(case, max_registers):
    layout, bits, native = case
    reg_layout = native_register_layout(bits) if native else None
    access = layout.access(bits, reg_layout, max_registers=max_registers)
    reg_layout = access.register_layout
    e = 32 // bits
    assert access.shape == ("32x32b" if native else "16x256b" if bits == 32 else "16x128b")
    assert access.pack_16b == (bits == 16 and layout.packing == 1)
    moved = set()
    for instr in access.instructions:
        registers_per_x1 = {"32x32b": 1, "16x128b": 2, "16x256b": 4}[access.shape]
        assert len(instr.operands) == instr.num * registers_per_x1 <= max_registers
        assert instr.num & (instr.num - 1) == 0
        for w, t in itertools.product(range(4), range(32)):
            tid = 32 * w + t
            for j, (reg, first) in enumerate(instr.operands):
                lane, column = hand_fragment(access.shape, t, j)
                for i in range(e):
                    if access.pack_16b:  # .pack::16b: the register's halves come from adjacent columns
                        cell = (32 * w + instr.lane_offset + lane, instr.column_offset + 2 * column + i, 0)
                    else:
                        cell = (32 * w + instr.lane_offset + lane, instr.column_offset + column, i)
                    row, col = reg_layout.element_index(layout.shape, tid, reg, first + i)
                    assert HAND[layout.kind](row, col, layout.cols, layout.packing) == cell
                    assert (tid, reg, first + i) not in moved
                    moved.add((tid, reg, first + i))
    assert moved == set(owners(reg_layout, layout.shape))


@pytest.mark.parametrize("case", list(cases()), ids=case_id)
def test_access_cell_is_the_isa_fragment(case):
    """TMEMAccess.cell (what the interpreter moves) against the hand-written fragments."""
    layout, bits, native = case
    access = layout.access(bits, native_register_layout(bits) if native else None)
    for instr in access.instructions:
        for j, t in itertools.product(range(len(instr.operands)), range(32)):
            lane, column = hand_fragment(access.shape, t, j)
            if access.pack_16b:
                expected = (instr.lane_offset + lane, instr.column_offset + 2 * column, 1)
            else:
                expected = (instr.lane_offset + lane, instr.column_offset + column, 0)
            assert access.cell(instr, j, t) == expected


@pytest.mark.parametrize("kind,collective,m", [(DEFAULT, False, 128), (HALF, False, 64), (DEFAULT, True, 256),
                                               (M64, True, 128)])
@pytest.mark.parametrize("cols", [64, 256])
def test_mma_data_path_writes_where_the_layout_says(kind, collective, m, cols):
    """Every MMA piece's D, placed by the data path from its D address, lands on the reference's layout."""
    layout = TMEMLayout(kind, cols)
    for piece in layout.mma_pieces():
        for row, j in itertools.product(range(layout.rows), range(piece.n)):
            lane, column = mma_data_path(m, piece.n, 2 if collective else 1, row, j)
            got = (lane + piece.lane_offset, column + piece.column_offset, 0)
            assert got == HAND[kind](row, piece.col_start + j, cols, 1)
    with pytest.raises(TMEMLayoutError, match="no dense tcgen05.mma data path for M = 64 over 2"):
        mma_data_path(64, 64, 2, 0, 0)


def test_access_instruction_counts_and_opcodes():
    # 128 x 256 f32 through 16x256b: per lane step 32 repetitions of 8 columns, x8 each at 32 registers.
    access = TMEMLayout(DEFAULT, 256).access(32)
    assert [(i.num, i.lane_offset, i.column_offset) for i in access.instructions] == \
        [(8, 0, 0), (8, 0, 64), (8, 0, 128), (8, 0, 192), (8, 16, 0), (8, 16, 64), (8, 16, 128), (8, 16, 192)]
    assert access.opcode(access.instructions[0]) == "tcgen05.ld.sync.aligned.16x256b.x8.b32"
    # 48 columns split into powers of two: x4 then x2.
    access = TMEMLayout(DEFAULT, 48).access(32, native_register_layout(32))
    assert [(i.num, i.column_offset) for i in access.instructions] == [(32, 0), (16, 32)]
    access = TMEMLayout(DEFAULT, 64, 1).access(16)
    assert access.opcode(access.instructions[0], store=True) == "tcgen05.st.sync.aligned.16x128b.x8.unpack::16b.b32"
    assert access.opcode(access.instructions[0]) == "tcgen05.ld.sync.aligned.16x128b.x8.pack::16b.b32"


def test_access_rejects_mismatched_register_layouts():
    with pytest.raises(TMEMLayoutError, match="half-lane layout moves through .*got"):
        TMEMLayout(HALF, 64).access(32, TCGEN05)
    with pytest.raises(TMEMLayoutError, match="only the default layout's row order"):
        TMEMLayout(M64, 64).access(32, native_register_layout(32))
    with pytest.raises(TMEMLayoutError, match="power of two in 1..128, got 48"):
        TMEMLayout(DEFAULT, 64).access(32, max_registers=48)
    with pytest.raises(TMEMLayoutError, match="takes 4 registers, more than max_registers = 2"):
        TMEMLayout(DEFAULT, 64).access(32, max_registers=2)


# --- inference and allocation -----------------------------------------------------------------------------

@pytest.mark.parametrize("rows,cols,bits,collective,kind,packing", [
    (128, 256, 32, False, DEFAULT, 1),  # 1-CTA M=128 accumulator
    (128, 256, 32, True, DEFAULT, 1),  # each CTA's half of a 2-CTA M=256 accumulator
    (64, 128, 32, False, HALF, 1),  # 1-CTA M=64
    (64, 128, 32, True, M64, 1),  # 2-CTA M=128
    (128, 128, 16, False, DEFAULT, 2),  # bf16 data, packed
    (64, 128, 8, True, M64, 4),
])
def test_infer_tmem_layout(rows, cols, bits, collective, kind, packing):
    assert infer_tmem_layout(rows, cols, bits, collective) == TMEMLayout(kind, cols, packing)


def test_infer_tmem_layout_accumulator_packing_and_errors():
    # A 16-bit accumulator is never packed (ISA 9.7.16.10.4.1).
    assert infer_tmem_layout(128, 64, 16, False, packing=1) == TMEMLayout(DEFAULT, 64, 1)
    with pytest.raises(TMEMLayoutError, match="128 rows .* or 64 rows .*got 32"):
        infer_tmem_layout(32, 64, 32, False)
    with pytest.raises(TMEMLayoutError, match="got 256"):
        infer_tmem_layout(256, 64, 32, True)
    with pytest.raises(TMEMLayoutError, match="16-bit data takes packing 1 or 2, got 4"):
        infer_tmem_layout(128, 64, 16, False, packing=4)
    with pytest.raises(TMEMLayoutError, match="8, 16 or 32 bits wide, got 4"):
        infer_tmem_layout(128, 64, 4, False)
    with pytest.raises(TMEMLayoutError, match="needs 1024 TMEM columns"):
        infer_tmem_layout(128, 1024, 32, False)
    with pytest.raises(TMEMLayoutError, match="multiple of 4, got 98"):
        infer_tmem_layout(64, 98, 16, False)


def test_tmem_alloc_columns():
    assert [tmem_alloc_columns(n) for n in (1, 32, 33, 64, 100, 256, 257, 512)] == \
        [32, 32, 64, 64, 128, 256, 512, 512]
    assert tmem_alloc_columns(128, exact=True) == 128
    for n, message in ((0, "1..512 columns, got 0"), (513, "got 513")):
        with pytest.raises(TMEMLayoutError, match=message):
            tmem_alloc_columns(n)
    for n in (16, 48, 96):
        with pytest.raises(TMEMLayoutError, match=f"power of two in 32..512 columns, got {n}"):
            tmem_alloc_columns(n, exact=True)


# --- MMA shapes and pieces -------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k,kind,collective", [
    (128, 256, 16, "f16", False), (64, 8, 16, "f16", False), (64, 200, 16, "f16", False),
    (256, 256, 16, "f16", True), (128, 16, 16, "f16", True),
    (128, 8, 8, "tf32", False), (256, 240, 8, "tf32", True),
    (128, 24, 32, "f8f6f4", False), (256, 32, 32, "f8f6f4", True),
    (128, 24, 32, "i8", False), (64, 48, 32, "i8", False), (128, 256, 32, "i8", False), (256, 96, 32, "i8", True),
    (128, 256, 32, "mxf8f6f4", False), (256, 256, 32, "mxf4nvf4", True), (128, 8, 32, "mxf4nvf4", False),
])
def test_tcgen05_valid_shapes(m, n, k, kind, collective):
    check_tcgen05_shape(m, n, k, kind, collective)


@pytest.mark.parametrize("m,n,k,kind,collective,message", [
    (256, 128, 16, "f16", False, r"1-CTA .*M in \(64, 128\), got M = 256"),
    (64, 128, 16, "f16", True, r"2-CTA .*M in \(128, 256\), got M = 64"),
    (32, 128, 16, "f16", False, "got M = 32"),
    (128, 8, 16, "f16", True, "multiples of 16 up to 256, got N = 8"),
    (128, 12, 16, "f16", False, "multiples of 8 up to 256, got N = 12"),
    (128, 264, 16, "f16", False, "got N = 264"),
    (128, 40, 32, "i8", False, "8, 16, 24, 32, then multiples of 16 up to 256, got N = 40"),
    (128, 48, 32, "i8", True, "multiples of 32 up to 256, got N = 48"),
    (128, 128, 32, "f16", False, r"K = 16 \(32 bytes\), got K = 32"),
    (128, 128, 16, "tf32", False, "K = 8"),
    (128, 128, 16, "f8f6f4", False, "K = 32"),
    (128, 128, 16, "mxf4", False, "kind must be one of f16, tf32, f8f6f4, i8, mxf8f6f4, mxf4nvf4, got 'mxf4'"),
    # mgjit's block-scaled MMAs take 128 rows per CTA (the default layout their scales are laid out for).
    (64, 128, 32, "mxf8f6f4", False, r"1-CTA .*M in \(128,\), got M = 64"),
    (128, 128, 32, "mxf4nvf4", True, r"2-CTA .*M in \(256,\), got M = 128"),
    (128, 128, 64, "mxf4nvf4", False, "K = 32"),
])
def test_tcgen05_invalid_shapes(m, n, k, kind, collective, message):
    with pytest.raises(TMEMLayoutError, match=message):
        check_tcgen05_shape(m, n, k, kind, collective)


def test_mma_pieces():
    assert TMEMLayout(DEFAULT, 512).mma_pieces() == (MMAPiece(0, 0, 0, 256), MMAPiece(0, 256, 256, 256))
    assert TMEMLayout(DEFAULT, 96).mma_pieces() == (MMAPiece(0, 0, 0, 96),)
    assert TMEMLayout(DEFAULT, 384).mma_pieces() == (MMAPiece(0, 0, 0, 192), MMAPiece(0, 192, 192, 192))
    assert TMEMLayout(M64, 256).mma_pieces() == (MMAPiece(0, 0, 0, 256),)
    with pytest.raises(TMEMLayoutError, match="512 columns must be at most N = 256"):
        TMEMLayout(M64, 512).mma_pieces()
    with pytest.raises(TMEMLayoutError, match="one element per column, got packing 2"):
        TMEMLayout(DEFAULT, 64, 2).mma_pieces()


@pytest.mark.parametrize("cols", [16, 128, 512])
def test_half_lane_mma_pieces_compose_layout_f(cols):
    # Each piece is one M=64 MMA writing Layout F (rows 16q..16q+15 -> lanes 32q..32q+15 past its lane
    # offset, its columns in order past its column offset). Together they must write the half-lane layout.
    layout = TMEMLayout(HALF, cols)
    pieces = layout.mma_pieces()
    assert [p.lane_offset for p in pieces] == [0] * (len(pieces) // 2) + [16] * (len(pieces) // 2)
    written = {}
    for piece in pieces:
        for row, j in itertools.product(range(64), range(piece.n)):
            cell = (32 * (row // 16) + row % 16 + piece.lane_offset, piece.column_offset + j, 0)
            written[row, piece.col_start + j] = cell
    assert written == {(r, c): layout.lane_and_column(r, c) for r in range(64) for c in range(cols)}


@pytest.mark.parametrize("cols", [16, 256])
def test_m64_collective_mma_piece_is_layout_b(cols):
    # One M=128 cta_group::2 MMA with N = cols: Layout B puts N's left half in lanes 0-63, right half in 64-127.
    layout = TMEMLayout(M64, cols)
    (piece,) = layout.mma_pieces()
    for row, n in itertools.product(range(64), range(piece.n)):
        expected = (row + 64 * (n // (piece.n // 2)), n % (piece.n // 2), 0)
        assert layout.lane_and_column(row, piece.col_start + n) == expected


# --- block scales in TMEM (9.7.16.10.7) and tcgen05.cp.32x128b.warpx4 ----------------------------------------

@pytest.mark.parametrize("rows,cols", [(128, 4), (128, 16), (256, 8)])
def test_scale_layout_against_the_isa_and_the_copy(rows, cols):
    """Scale (r, s): four scales of a row to a 32-bit word (byte s % 4), 32 rows to a column, the words of one
    group of four scales for all rows side by side (A's 128 rows: 4 columns per group; B's 256: 8), duplicated in
    every 32-lane partition. Independently, tcgen05.cp.32x128b.warpx4 writes SMEM row j (16 bytes) of a chunk to
    lane j of every partition, 4 columns from the chunk's; what it writes must be the scale the layout puts there."""
    layout = ScaleLayout(rows, cols)
    assert layout.columns == rows * cols // 128 and layout.shape == (rows, cols)
    groups = cols // 4
    smem = {}  # SMEM byte of the source tile -> scale (r, s), by the chunk format: chunks t-major, 512 bytes
    for r, s_ in itertools.product(range(rows), range(cols)):
        t, g = r // 128, s_ // 4
        smem[(t * groups + g) * 512 + chunk_byte(r % 128, s_ % 4)] = (r, s_)
    assert sorted(smem) == list(range(rows * cols))
    copied = {}
    for offset, column in layout.chunks():
        for j, byte in itertools.product(range(32), range(16)):
            copied[smem[offset + 16 * j + byte]] = (j, column + byte // 4, byte % 4)
    for (r, s_), cell in copied.items():
        assert cell == (r % 32, (s_ // 4) * (rows // 32) + r // 32, s_ % 4)
        assert layout.lane_and_column(r, s_) == cell
        assert layout.lane_and_column(r, s_, partition=3) == (cell[0] + 96, *cell[1:])
    with pytest.raises(TMEMLayoutError, match="outside"):
        layout.lane_and_column(rows, 0)


def test_scale_layout_rejects():
    for rows, cols in ((64, 4), (128, 6)):
        with pytest.raises(TMEMLayoutError, match="multiples of 128 and scales per row in multiples of 4"):
            ScaleLayout(rows, cols)
    with pytest.raises(TMEMLayoutError, match="needs 1024 TMEM columns"):
        ScaleLayout(256, 512)
    with pytest.raises(TMEMLayoutError, match="do not move through registers"):
        ScaleLayout(128, 4).register_layout(8)

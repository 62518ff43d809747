"""CPU tests of the register-layout algebra (mgjit/layouts.py) against expectations derived by hand."""
import collections
import itertools
import math

import pytest

from mgjit import dtypes
from mgjit.layouts import (
    SPLAT,
    blocked_reducing_to,
    THREADS_PER_WARPGROUP,
    WGMMA,
    LANES_PER_WARP,
    LayoutError,
    Replicated,
    TiledLayout,
    Tiling,
    blocked,
    describe,
    spread,
)


def owners(layout: TiledLayout, shape):
    """(tid, register index, vector slot, element index) for every element copy the 128 threads hold."""
    regs = list(layout.registers(shape))
    for tid in range(THREADS_PER_WARPGROUP):
        for r, reg in enumerate(regs):
            for v in range(layout.vector_length):
                yield tid, r, v, layout.element_index(shape, tid, reg, v)


def is_primary(layout: TiledLayout, tid: int) -> bool:
    """The thread holds the first copy: its coordinate along every Replicated warp/lane entry is 0."""
    tile = layout.tiling.tile_shape(layout.tiling.tiles[0])
    for dims, idx in ((layout.warp_dims, (tid // 32) % 4), (layout.lane_dims, tid % 32)):
        for d in reversed(dims):
            size = d.times if isinstance(d, Replicated) else tile[d]
            if isinstance(d, Replicated) and idx % size:
                return False
            idx //= size
    return True


def copies(layout: TiledLayout) -> int:
    return math.prod(d.times for d in (*layout.warp_dims, *layout.lane_dims) if isinstance(d, Replicated))


# ------------------------------------------------------------------------------------------ WGMMA

@pytest.mark.parametrize("shape", [(64, 8), (64, 64), (128, 32)])
def test_wgmma_element_mapping(shape):
    """PTX's wgmma D fragment: (r, c) is in warp (r%64)//16, lane 4(r%8) + (c%8)//2, vector slot c%2."""
    seen = collections.Counter()
    for tid, _, v, (r, c) in owners(WGMMA, shape):
        warp, lane = tid // 32, tid % 32
        assert warp == (r % 64) // 16, (tid, r, c)
        assert lane == 4 * (r % 8) + (c % 8) // 2, (tid, r, c)
        assert v == c % 2, (tid, r, c)
        seen[(r, c)] += 1
    assert set(seen) == set(itertools.product(range(shape[0]), range(shape[1])))
    assert set(seen.values()) == {1}  # no replication: every element is held exactly once


def test_wgmma_registers():
    # Per thread of a 64x8 tile: rows r and r+8 (register row-half (r%16)//8), 2 columns each.
    assert WGMMA.vector_length == 2
    assert WGMMA.registers_shape((64, 8)) == (1, 1, 1, 1, 2, 1, 1, 1, 1)
    # A 128x256 accumulator: 2 row tiles x 2 row halves x 32 column groups, 2 elements each = 256 values.
    assert math.prod(WGMMA.registers_shape((128, 256))) * 2 == 128 * 256 // 128
    tid = 37  # warp 1, lane 5: rows 16 + 5//4 = 17 and 25, columns 2*(5%4) = 2, 3
    regs = list(WGMMA.registers((64, 8)))
    held = sorted(WGMMA.element_index((64, 8), tid, reg, v) for reg in regs for v in range(2))
    assert held == [(17, 2), (17, 3), (25, 2), (25, 3)]


# ------------------------------------------------------------------------------------------ blocked

SHAPES = [(1,), (2,), (128,), (256,), (1024,), (8192,), (1, 1024), (2, 8), (8, 256), (32, 64), (64, 16),
          (128, 128), (4, 2), (256, 4)]
DTYPES = [dtypes.float32, dtypes.bfloat16, dtypes.int8, dtypes.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_blocked_covers_every_element_exactly_once(shape, dtype):
    layout = blocked(shape, dtype)
    n_copies = copies(layout)
    counts = collections.Counter()
    primary = collections.Counter()
    for tid, _, _, idx in owners(layout, shape):
        assert all(0 <= i < d for i, d in zip(idx, shape, strict=True)), (tid, idx)
        counts[idx] += 1
        if is_primary(layout, tid):
            primary[idx] += 1
    every = set(itertools.product(*map(range, shape)))
    assert set(counts) == every
    assert set(counts.values()) == {n_copies}  # replicated copies, counted separately
    assert set(primary) == every and set(primary.values()) == {1}
    assert sum(counts.values()) == math.prod(shape) * n_copies


@pytest.mark.parametrize("dtype,vec", [(dtypes.float32, 4), (dtypes.bfloat16, 8), (dtypes.float16, 8),
                                       (dtypes.int8, 16), (dtypes.float64, 2)], ids=lambda x: str(x))
def test_blocked_moves_16_bytes_per_thread_where_the_shape_allows(dtype, vec):
    assert blocked((4096,), dtype).vector_length == vec
    assert blocked((16, 1024), dtype).vector_length == vec
    assert blocked((4096,), dtype).vector_length * dtype.itemsize == 16
    # A last dimension narrower than 16 bytes is one vector.
    assert blocked((64, 2), dtype).vector_length == 2
    assert blocked((1,), dtype).vector_length == 1


@pytest.mark.parametrize("shape,dtype,vec", [((1, 256), dtypes.bfloat16, 2), ((2, 256), dtypes.bfloat16, 4),
                                             ((512,), dtypes.float32, 4), ((128,), dtypes.float32, 1),
                                             ((4096,), dtypes.bfloat16, 8), ((16,), dtypes.float32, 1)], ids=str)
def test_spread_gives_every_thread_elements_of_its_own(shape, dtype, vec):
    """`spread`: the widest accesses (up to 16 bytes) with which the 128 threads hold distinct elements; only an
    array of fewer than 128 elements has copies (`blocked` of a 256-wide bf16 line: one warp, three copies)."""
    layout = spread(shape, dtype)
    assert layout.vector_length == vec
    assert layout.replicated == (math.prod(shape) < THREADS_PER_WARPGROUP)
    assert sorted(idx for tid, _, _, idx in owners(layout, shape) if is_primary(layout, tid)) == sorted(
        itertools.product(*map(range, shape)))
    assert blocked((1, 256), dtypes.bfloat16).replicated


@pytest.mark.parametrize("shape,by_rows", [((32, 128), True), ((8, 512), True), ((16, 256), True),
                                           ((4, 1024), False), ((2, 2048), False), ((32, 64), True)], ids=str)
def test_blocked_puts_warps_along_rows_where_each_holds_enough(shape, by_rows):
    """`rows_per_warp=2` with 4-byte accesses of bf16 (a warp's lanes 64 columns): where every warp gets at least
    two rows, warp w holds rows with (row // lanes' rows) % 4 == w, all their columns (a row never spans two warps);
    otherwise warps go along the columns as without it. Every element held once either way."""
    layout = blocked(shape, dtypes.bfloat16, access_bytes=4, rows_per_warp=2)
    assert layout.vector_length == 2
    warps_of_row = collections.defaultdict(set)
    primary = collections.Counter()
    for tid, _, _, idx in owners(layout, shape):
        warps_of_row[idx[0]].add(tid // LANES_PER_WARP)
        primary[idx] += is_primary(layout, tid)
    assert set(primary) == set(itertools.product(*map(range, shape))) and set(primary.values()) == {1}
    lanes_r = max(1, LANES_PER_WARP * 2 // shape[1])
    if by_rows:
        assert all(warps == {row // lanes_r % 4} for row, warps in warps_of_row.items()), dict(warps_of_row)
    else:
        assert layout == blocked(shape, dtypes.bfloat16, access_bytes=4)
        assert all(len(warps) > 1 for warps in warps_of_row.values())


@pytest.mark.parametrize("shape,lanes,rows", [((32, 128), 8, 2), ((16, 256), 16, 2), ((8, 512), 32, 2),
                                              ((64, 128), 8, 4), ((16, 64), 16, 2)], ids=str)
def test_blocked_thread_rows_spends_a_warps_lanes_on_its_rows(shape, lanes, rows):
    """`thread_rows=2` beside `rows_per_warp=2` (4-byte accesses of bf16): a row's lanes go along it as far as one
    32-byte sector (8 lanes) or as leaves each thread two rows, whichever is further, the rest of a warp's lanes
    along its rows; each row stays in one warp, each thread holds `rows` rows. Every element held once."""
    layout = blocked(shape, dtypes.bfloat16, access_bytes=4, rows_per_warp=2, thread_rows=2)
    lanes_of_row = collections.defaultdict(set)
    rows_of_thread = collections.defaultdict(set)
    primary = collections.Counter()
    for tid, _, _, idx in owners(layout, shape):
        lanes_of_row[idx[0]].add(tid)
        rows_of_thread[tid].add(idx[0])
        primary[idx] += is_primary(layout, tid)
    assert set(primary) == set(itertools.product(*map(range, shape))) and set(primary.values()) == {1}
    assert {len(t) for t in lanes_of_row.values()} == {lanes}
    assert all(len({t // LANES_PER_WARP for t in threads}) == 1 for threads in lanes_of_row.values())
    assert {len(r) for r in rows_of_thread.values()} == {rows}
    assert blocked((4, 1024), dtypes.bfloat16, access_bytes=4, rows_per_warp=2, thread_rows=2) == blocked(
        (4, 1024), dtypes.bfloat16, access_bytes=4)


def test_blocked_1d_is_the_strided_layout():
    """Thread t holds elements [i*128*v + t*v, +v) in register i (v = 4 for float32)."""
    layout = blocked((2048,), dtypes.float32)
    assert layout.registers_shape((2048,)) == (4, 1, 1, 1)
    for tid in (0, 1, 31, 32, 127):
        for i, reg in enumerate(layout.registers((2048,))):
            got = [layout.element_index((2048,), tid, reg, v)[0] for v in range(4)]
            assert got == [i * 512 + tid * 4 + v for v in range(4)]


def test_blocked_2d_by_hand():
    """float32 (32, 64): 16 lanes x 4 elements span a row; 2 lanes and 4 warps go down the rows."""
    layout = blocked((32, 64), dtypes.float32)
    assert layout == TiledLayout(Tiling(((8, 64), (2, 64), (4,))), warp_dims=(-5, -4), lane_dims=(-3, -2),
                                 vector_dim=-1)
    assert layout.registers_shape((32, 64)) == (4, 1, 1, 1, 1, 1, 1)
    # Thread 37 = warp 1, lane 5: row 2*1 + 5//16 = 2 (+8 per register), columns 4*(5%16) .. +3.
    regs = list(layout.registers((32, 64)))
    assert [layout.element_index((32, 64), 37, regs[i], 0) for i in range(4)] == [(2, 20), (10, 20), (18, 20),
                                                                                (26, 20)]


# ------------------------------------------------------------------------------------------ reduce

def test_reduce_rows_of_a_2d_layout():
    """Summing axis 1 of blocked((32, 64)): the 16 lanes along a row now hold copies (Replicated(16)), the
    vector of 4 columns disappears, and each thread keeps one value per register row: 4 registers."""
    layout = blocked((32, 64), dtypes.float32)
    out = layout.reduce((1,), 2)
    assert out == TiledLayout(Tiling(((8,), (2,))), warp_dims=(-2,), lane_dims=(-1, Replicated(16)),
                              vector_dim=None)
    assert out.registers_shape((32,)) == (4, 1, 1)
    assert out.vector_length == 1
    # Row r of the result is held by the threads that held row r of the operand.
    for tid in range(128):
        rows_before = {layout.element_index((32, 64), tid, reg, 0)[0] for reg in layout.registers((32, 64))}
        rows_after = {out.element_index((32,), tid, reg, 0)[0] for reg in out.registers((32,))}
        assert rows_before == rows_after


def test_reduce_columns_of_a_2d_layout():
    """Max over axis 0: the 4 warps and the 2 lanes that went down the rows hold copies; the column part of the
    tiling, the 16 lanes and the vector of 4 survive."""
    layout = blocked((32, 64), dtypes.float32)
    out = layout.reduce((0,), 2)
    assert out == TiledLayout(Tiling(((64,), (64,), (4,))), warp_dims=(Replicated(4), -3),
                              lane_dims=(Replicated(2), -2), vector_dim=-1)
    assert out.registers_shape((64,)) == (1, 1, 1, 1)
    assert copies(out) == 8


def test_reduce_wgmma_rows():
    """A row reduction of the wgmma layout: each row lives in 4 lanes (4 (r%8) + {0..3}), which become
    Replicated(4); the warps keep their 16-row strips."""
    out = WGMMA.reduce((1,), 2)
    assert out.lane_dims == (-1, Replicated(4))
    assert out.warp_dims == (-3,)
    assert out.vector_dim is None
    assert WGMMA.reduced_lane_dims((1,), 2) == [(1, 4)]  # butterfly over lane bits 0 and 1
    assert WGMMA.reduced_warp_dims((1,), 2) == []


@pytest.mark.parametrize("shape,dtype,access", [((256, 16), dtypes.bfloat16, 16), ((32, 64), dtypes.float32, 16),
                                                ((64, 128), dtypes.bfloat16, 4), ((128,), dtypes.float32, 16)])
def test_a_unit_last_axis_added_holds_what_the_reduction_held(shape, dtype, access):
    """`with_unit_axis` of a row reduction's layout (or of a 1D one): an (R, 1) layout whose thread t holds row r
    exactly where the reduced layout has thread t hold element r, and that reduces back to it."""
    layout = blocked(shape, dtype, access_bytes=access)
    reduced = layout.reduce((len(shape) - 1,), len(shape)) if len(shape) > 1 else layout
    rows = shape[:-1] if len(shape) > 1 else shape
    unit = reduced.with_unit_axis(len(rows))
    assert unit.reduce((len(rows),), len(rows) + 1) == reduced
    for tid in range(128):
        held = {reduced.element_index(rows, tid, reg, v) for reg in reduced.registers(rows)
                for v in range(reduced.vector_length)}
        unit_held = {unit.element_index((*rows, 1), tid, reg, v)[:-1] for reg in unit.registers((*rows, 1))
                     for v in range(unit.vector_length)}
        assert held == unit_held, tid


@pytest.mark.parametrize("wide,narrow,dtype", [((8, 256), (8, 128), dtypes.bfloat16),
                                               ((2, 1024), (2, 128), dtypes.bfloat16),
                                               ((16, 256), (16, 64), dtypes.float32)])
def test_a_narrower_part_of_a_row_can_reduce_to_the_wider_parts_row_layout(wide, narrow, dtype):
    """Rows held as parts of different widths (264 columns as 256 + 128): `blocked_reducing_to` gives the narrower
    part a layout whose row statistics are held by the threads that hold the wider part's (its own `blocked`
    layout spreads its rows otherwise: a warp holds two rows of 128, one of 256), its accesses as wide as allow it."""
    target = blocked(wide, dtype).reduce((1,), 2)
    assert blocked(narrow, dtype).reduce((1,), 2) != target
    layout = blocked_reducing_to(narrow, dtype, target)
    assert layout is not None and layout.reduce((1,), 2) == target
    rows = narrow[:1]
    for tid in range(THREADS_PER_WARPGROUP):
        held = {target.element_index(rows, tid, reg, v)[0] for reg in target.registers(rows)
                for v in range(target.vector_length)}
        part = {layout.element_index(narrow, tid, reg, v)[0] for reg in layout.registers(narrow)
                for v in range(layout.vector_length)}
        assert part <= held, tid


def test_no_narrower_layout_where_none_reduces_to_the_target():
    """8 columns of 4 rows cannot have each row in one warp of 32 lanes as a row of 512 has: the statistics meet
    through a relayout, as before."""
    assert blocked_reducing_to((4, 8), dtypes.bfloat16, blocked((4, 512), dtypes.bfloat16).reduce((1,), 2)) is None


def test_reducing_everything_is_an_error():
    with pytest.raises(LayoutError, match="scalar"):
        blocked((1024,), dtypes.float32).reduce((0,), 1)


# ------------------------------------------------------------------------------------------ describe

def test_describe_draws_owners():
    # float32 (2, 8): 2 lanes x 4 columns per row, 2 rows; lanes 4.. and warps 1.. hold copies.
    assert describe(blocked((2, 8), dtypes.float32), (2, 8)) == (
        "t0r0 t0r0 t0r0 t0r0 t1r0 t1r0 t1r0 t1r0\n"
        "t2r0 t2r0 t2r0 t2r0 t3r0 t3r0 t3r0 t3r0")
    picture = describe(WGMMA, (64, 8)).splitlines()
    assert len(picture) == 64
    assert picture[0].split() == ["t0r0", "t0r0", "t1r0", "t1r0", "t2r0", "t2r0", "t3r0", "t3r0"]
    assert picture[8].split() == ["t0r1", "t0r1", "t1r1", "t1r1", "t2r1", "t2r1", "t3r1", "t3r1"]
    assert picture[16].split()[0] == "t32r0"
    assert describe(SPLAT, (4, 4)) == "splat (4, 4): every thread holds the one value"


# ------------------------------------------------------------------------------------------ errors

@pytest.mark.parametrize("shape", [(1000,), (3,), (48, 64), (64, 96), (0,)])
def test_blocked_rejects_non_power_of_two_shapes(shape):
    with pytest.raises(LayoutError, match="powers of two"):
        blocked(shape, dtypes.float32)


def test_layout_construction_errors():
    with pytest.raises(LayoutError, match="does not divide the tile"):
        Tiling(((64, 8), (24, 8)))
    with pytest.raises(LayoutError, match="cover 2 warps, expected 4"):
        TiledLayout(Tiling(((64, 8), (2,))), warp_dims=(Replicated(2),), lane_dims=(Replicated(32),),
                    vector_dim=-1)
    with pytest.raises(LayoutError, match="cover 16 lanes, expected 32"):
        TiledLayout(Tiling(((64, 8), (2,))), warp_dims=(Replicated(4),), lane_dims=(Replicated(16),),
                    vector_dim=-1)
    with pytest.raises(LayoutError, match="does not divide the trailing dimensions"):
        WGMMA.check_shape((48, 8))
    with pytest.raises(LayoutError, match="needs arrays of rank >= 2"):
        WGMMA.check_shape((64,))
    with pytest.raises(LayoutError, match="scalar has no register layout"):
        blocked((), dtypes.float32)

"""Staged stores (`mgjit.store(x, index, value, staged=True)`, mgjit/ops/gmem_flat.py): a 2D window of whole rows
of a tensor whose rows lie one after another goes out through shared memory as aligned 16-byte chunks; any other
window stores from registers. Checked on the CPU through tests/ptx_sim.py: the whole memory afterwards must be
exactly the copy asked for (the window's elements inside the tensor, not one other byte), at every dtype width,
rows starting anywhere in a chunk, windows past the last row and before the first, and in a loop (the scratch
reused); and which path ran: the run's chunks read back from shared memory, or the registers (strided rows, a
window narrower than the rows, or starting inside them). Short rows' loads feeding only staged stores (or none)
take 16-byte vectors (ops/gmem.py SHORT_ROW_BYTES)."""
import collections
import re
import sys
from pathlib import Path

import pytest

import mgjit
from mgjit.layouts import blocked
from mgjit.ops.gmem_flat import warp_rows

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gmem_vectors import copy_window, expected_window, random_like, simulate_copy  # noqa: E402

BF16 = torch.bfloat16


@mgjit.kernel
def staged_window(x, out, r0, c0, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    w = (mgjit.ds(r0 + mgjit.program_id(0) * ROWS, ROWS), mgjit.ds(c0 + mgjit.program_id(1) * COLS, COLS))
    mgjit.store(out, w, x[w], staged=True)


@mgjit.kernel
def staged_batch(x, out, b0, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    w = (b0 + mgjit.program_id(1), mgjit.ds(mgjit.program_id(0) * ROWS, ROWS), mgjit.ds(0, COLS))
    mgjit.store(out, w, x[w], staged=True)


@mgjit.kernel
def scaled_rows(x, out, ROWS: mgjit.constexpr, COLS: mgjit.constexpr, STEPS: mgjit.constexpr):
    """Each program stores STEPS groups of ROWS rows in turn (one store op, its scratch reused), doubled."""
    for s in range(STEPS):
        w = (mgjit.ds((mgjit.program_id(0) * STEPS + s) * ROWS, ROWS), mgjit.ds(0, COLS))
        mgjit.store(out, w, (x[w].astype(mgjit.float32) * 2).astype(out.dtype), staged=True)


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MGJIT_CACHE_DIR", str(tmp_path_factory.mktemp("gmem-flat-cache")))
        yield


def flat_ptx(compiled) -> bool:
    """Whether the PTX holds a staged store's path (its run's chunks read back from shared memory)."""
    return "ld.shared.v4.b32" in compiled.ptx


def run_copy(kernel, grid, x_base, x, out_base, out, *scalars, **constexprs):
    """`simulate_copy`, counting the opcodes the kernel issues: (the out base it wrote, the compiled kernel, the
    counts)."""
    return simulate_copy(kernel, grid, x_base, x, out_base, out, collections.Counter(), *scalars, **constexprs)


def ran(counts, opcode: str) -> bool:
    return counts.get(opcode, 0) > 0


def test_warp_rows_hand_derived():
    """Narrowed bf16 rows (4 bytes a lane, 32 lanes along a row, warps along the rows): warp w holds rows w, w + 4,
    w + 8 and w + 12 of 16. With a row's lanes only as far as one 32-byte sector (8 lanes, 4 rows an access):
    warp w holds rows 4w to 4w + 3 and 16 + 4w to 19 + 4w of 32. 16-byte lanes over 16 rows of 128 put rows 0, 1,
    8 and 9 in warp 0 (runs of 2, 8 apart); one row over the warpgroup splits it between warps: None."""
    narrowed = blocked((16, 128), mgjit.bfloat16, access_bytes=4, rows_per_warp=2)
    assert warp_rows(narrowed, (16, 128)) == (0, 1, 4, 4, 0, 4)  # one run of 4 rows, 4 apart
    sector = blocked((32, 128), mgjit.bfloat16, access_bytes=4, rows_per_warp=2, thread_rows=2)
    rows = warp_rows(sector, (32, 128))
    assert rows == (0, 4, 4, 1, 16, 8) and [rows.row(j) for j in range(8)] == [0, 1, 2, 3, 16, 17, 18, 19]
    assert warp_rows(blocked((16, 128), mgjit.bfloat16), (16, 128)) == (0, 2, 2, 1, 8, 4)
    assert warp_rows(blocked((1, 4096), mgjit.float32), (1, 4096)) is None


# (dtype, rows, n, ROWS, COLS, r0s): contiguous rows of odd byte length (and tiny ones); windows from row 0,
# mid-tensor, past the end (the last program's rows partly outside) and starting before row 0; runs shorter than
# a chunk.
CASES = [
    (BF16, 70, 127, 16, 128, [0, 3, -2]),
    (BF16, 33, 255, 8, 256, [0, 5]),
    (BF16, 300, 9, 64, 16, [0, 5, -3]),
    (torch.float32, 40, 125, 8, 128, [0, 1, -1]),
    (torch.int8, 50, 301, 16, 512, [0, 7]),
    (torch.int8, 200, 3, 64, 4, [0, 1]),
    (torch.int8, 4, 3, 8, 4, [0]),  # a run of 12 bytes from a 16-byte boundary: one chunk, partial at its end
    (torch.float64, 20, 33, 8, 64, [0, 1]),
    (torch.float16, 9, 1023, 8, 1024, [0, 2]),
]
CASE_IDS = {"ids": lambda c: f"{c[0]}-{c[2]}-{c[3]}x{c[4]}"}


@pytest.mark.parametrize("case", CASES, **CASE_IDS)
def test_store_of_one_run_copies_exactly(case):
    dtype, rows, n, block_rows, cols, r0s = case
    x = random_like(torch.empty(rows, n, dtype=dtype))
    out = random_like(torch.empty(rows, n, dtype=dtype))
    grid = (-(-rows // block_rows) + 1, 1)
    for r0 in r0s:
        got, compiled, counts = run_copy(staged_window, grid, x, x, out, out, r0, 0, ROWS=block_rows, COLS=cols)
        want = expected_window(out, out, x, range(r0, r0 + block_rows * grid[0]), range(0, cols))
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"rows from {r0}"
        assert ran(counts, "ld.shared.v4.b32"), "the run's chunks went out from shared memory"
    assert not flat_ptx(copy_window.compile(x, out, 0, 0, ROWS=block_rows, COLS=cols, target="sm_90a"))


# Windows whose rows are not one run: starting inside the rows, before their first column and ending inside them,
# narrower than the rows, rows apart from each other (stride n + pad).
NOT_ONE_RUN = [(3, 128, 0), (-5, 128, 0), (0, 64, 0), (0, 128, 2), (7, 128, 3)]
NOT_ONE_RUN_IDS = ["start-inside", "start-before", "narrower", "strided", "strided-inside"]


@pytest.mark.parametrize("c0,cols,pad", NOT_ONE_RUN, ids=NOT_ONE_RUN_IDS)
def test_store_of_other_windows_goes_through_registers(c0, cols, pad):
    base = random_like(torch.empty(60, 127 + pad, dtype=BF16))
    x = base[:, :127]
    out_base = random_like(torch.empty(60, 127 + pad, dtype=BF16))
    out = out_base[:, :127]
    got, compiled, counts = run_copy(staged_window, (5, 1), base, x, out_base, out, 0, c0, ROWS=16, COLS=cols)
    want = expected_window(out_base, out, x, range(0, 80), range(c0, c0 + cols))
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert flat_ptx(compiled) and not ran(counts, "ld.shared.v4.b32")


@pytest.mark.parametrize("b0", [0, -1])
def test_a_batch_index_before_the_rows(b0):
    """out[b, rows, cols] of a (3, 40, 127) tensor, b = b0 + program_id(1) over 4 programs: batches outside the
    tensor (-1 or 3) store nothing, the others their window's rows (one run each)."""
    x = random_like(torch.empty(3, 40, 127, dtype=BF16))
    out = random_like(torch.empty(3, 40, 127, dtype=BF16))
    got, compiled, counts = run_copy(staged_batch, (3, 4), x, x, out, out, b0, ROWS=16, COLS=128)
    want = out.clone()
    for b in range(b0, b0 + 4):
        if 0 <= b < 3:
            want[b] = x[b]
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert ran(counts, "ld.shared.v4.b32")


@pytest.mark.parametrize("n", [127, 131, 9])
def test_store_in_a_loop_reuses_its_scratch(n):
    x = random_like(torch.empty(64, n, dtype=BF16))
    out = torch.full_like(x, float("nan"))
    cols = 1 << (n - 1).bit_length()
    got, compiled, counts = run_copy(scaled_rows, (2,), x, x, out, out, ROWS=8, COLS=cols, STEPS=4)
    assert torch.equal(got, (x.float() * 2).to(BF16))
    assert ran(counts, "ld.shared.v4.b32")
    # the warpgroup meets before each store's puts (the last one's chunk reads), and after them
    assert len(re.findall(r"bar\.sync", compiled.ptx)) >= 2


def test_where_staging_cannot_pay_register_stores_remain():
    """Rows of 128 bf16 start on 16 bytes (plain 16-byte stores already) and a window past FLAT_STORE_BYTES:
    staged=True keeps the register stores, no scratch."""
    for shape, rows, cols in (((64, 128), 16, 128), ((64, 4097), 4, 4096)):
        x = torch.empty(shape, dtype=BF16)
        compiled = staged_window.compile(x, x, 0, 0, ROWS=rows, COLS=cols, target="sm_90a")
        assert not flat_ptx(compiled) and compiled.smem_bytes < 1024, (shape, rows, cols)


@mgjit.kernel
def short_rows(x, out, rowmax, COLS: mgjit.constexpr, STORE: mgjit.constexpr):
    """Rows' maxima of a window of COLS columns; STORE 1: the rows stored too, from registers; 2: staged."""
    w = (mgjit.ds(0, 64), mgjit.ds(0, COLS))
    v = mgjit.load(x, w, other=-1.0)
    rowmax[mgjit.ds(0, 64)] = v.astype(mgjit.float32).max(axis=1)
    if STORE:
        mgjit.store(out, w, v, staged=STORE == 2)


@pytest.mark.parametrize("cols,store,vector", [(16, 0, 8), (32, 2, 8), (16, 1, 2), (64, 2, 8), (128, 0, 8),
                                                (128, 1, 2)], ids=["reduced", "staged", "stored", "widest", "wider",
                                                                  "wider-stored"])
def test_short_rows_not_stored_from_registers_load_16_byte_vectors(cols, store, vector):
    """bf16 rows of 9 to 65 (not 16-byte aligned) in windows of 16 to 128 columns: a thread holds 8 columns (16
    bytes) of a row where no array of their shape is stored (rows held a row a thread: ops/gmem.py
    ROW_ACCESS_LINES), or only staged (SHORT_ROW_BYTES); where one is stored from registers, 2 (the 4-byte
    accesses that keep a warp's lanes on contiguous bytes)."""
    x = torch.empty(64, cols // 2 + 1, dtype=BF16)
    compiled = short_rows.compile(x, x, torch.empty(64), COLS=cols, STORE=store, target="sm_90a")
    (load,) = [line for line in compiled.ir.splitlines() if " = load " in line]
    assert f")({vector}))" in load, load


@pytest.mark.parametrize("cols,thread_rows", [(16, 2), (64, 2), (128, 0)])
def test_rows_stored_from_registers_narrow_only_short_ones(cols, thread_rows):
    """bf16 rows of 9 to 65 stored from registers, in 4-byte accesses: a warp's lanes go along a row of a window of
    at most SHORT_ROW_BYTES (64 columns: 128 bytes) only as far as one 32-byte sector (thread_rows=2: each access
    straddles sectors, paid for by fewer shuffles), along the whole of a wider one (128 columns)."""
    x = torch.empty(64, cols // 2 + 1, dtype=BF16)
    compiled = short_rows.compile(x, x, torch.empty(64), COLS=cols, STORE=1, target="sm_90a")
    (load,) = [line for line in compiled.ir.splitlines() if " = load " in line]
    want = blocked((64, cols), mgjit.bfloat16, access_bytes=4, rows_per_warp=2, thread_rows=thread_rows)
    assert load.split(" : ")[1].startswith(f"bfloat16[64,{cols}] {want!r}"), load


@mgjit.kernel
def weighted_row_sums(x, w, y, out, ROWS: mgjit.constexpr, COLS: mgjit.constexpr, WEIGHTED: mgjit.constexpr):
    """ROWS aligned rows (times a weight vector broadcast along them where WEIGHTED) stored, and their sums."""
    window = (mgjit.ds(0, ROWS), mgjit.ds(0, COLS))
    v = x[window].astype(mgjit.float32)
    if WEIGHTED:
        v = v * w[mgjit.ds(0, COLS)].astype(mgjit.float32)
    y[window] = v.astype(y.dtype)
    out[mgjit.ds(0, ROWS)] = v.sum(axis=1)


# (ROWS, COLS, WEIGHTED, warps along the rows): 16-byte-aligned bf16 rows reduced along them.
WARP_ROWS_CASES = [(4, 512, 0, True), (8, 512, 1, True), (16, 1024, 0, True), (8, 1024, 1, True), (8, 2048, 1, False),
                   (2, 512, 0, False), (8, 256, 0, False), (16, 128, 1, False)]


@pytest.mark.parametrize("rows,cols,weighted,along", WARP_ROWS_CASES, ids=str)
def test_aligned_rows_reduced_along_them_stay_in_their_warps(rows, cols, weighted, along):
    """Stored rows reduced along them (ops/gmem.py WARP_ROWS): `blocked` would split a row of 512 or more bf16 over
    warps; where each warp can hold a whole row and a broadcast weight costs a lane at most HELD_VECTOR_ELEMENTS
    (2048 columns: 64), warps go along the rows. Where `blocked` keeps rows in warps already (256 or 128 columns) or
    they are too few (2), the load keeps it."""
    x = torch.empty(rows, cols, dtype=BF16)
    compiled = weighted_row_sums.compile(x, torch.empty(cols, dtype=BF16), x, torch.empty(rows), ROWS=rows,
                                         COLS=cols, WEIGHTED=weighted, target="sm_90a")
    (load,) = [line for line in compiled.ir.splitlines() if " = load " in line and f"[{rows},{cols}]" in line]
    want = blocked((rows, cols), mgjit.bfloat16, rows_per_warp=1) if along else blocked((rows, cols), mgjit.bfloat16)
    assert load.split(" : ")[1].startswith(f"bfloat16[{rows},{cols}] {want!r}"), load
    assert (want == blocked((rows, cols), mgjit.bfloat16)) is not along


@mgjit.kernel
def row_in_parts(x, out, r0, c0, ROWS: mgjit.constexpr, A: mgjit.constexpr, B: mgjit.constexpr,
                 STAGED: mgjit.constexpr):
    """ROWS rows a program from r0, columns c0 .. c0 + A + B as two arrays (1 added to the first), stored side by
    side in one store."""
    rows = mgjit.ds(r0 + mgjit.program_id(0) * ROWS, ROWS)
    a = mgjit.load(x, (rows, mgjit.ds(c0, A))) + 1
    b = mgjit.load(x, (rows, mgjit.ds(c0 + A, B)))
    if STAGED:
        mgjit.store(out, (rows, mgjit.ds(c0, A + B)), (a, b), staged=True)
    else:
        out[rows, mgjit.ds(c0, A + B)] = (a, b)


def expected_parts(out_base, out, x, rows, c0, a, b):
    """`expected_window` of row_in_parts: 1 added to the window's first `a` columns."""
    added = x.clone()
    added[:, max(c0, 0):max(c0 + a, 0)] += 1
    return expected_window(out_base, out, added, rows, range(c0, c0 + a + b))


# (dtype, n, ROWS, A, B, (r0, c0) starts): rows held as two arrays whose widths add up to the row (9 as 8 + 1,
# 33 as 32 + 1: every element's place is unchecked) or past it (9 as 8 + 4, 5 as 4 + 4: the second array's
# columns past the row's end are checked), windows before the first row (checked) and past the last.
PARTS_CASES = [
    (BF16, 9, 64, 8, 1, [(0, 0), (5, 0), (-3, 0)]),
    (BF16, 33, 16, 32, 1, [(0, 0), (1, 0)]),
    (BF16, 9, 32, 8, 4, [(0, 0), (3, 0)]),
    (torch.int8, 5, 64, 4, 4, [(0, 0), (2, 0)]),
    (torch.float32, 3, 32, 2, 1, [(0, 0), (-1, 0)]),
]


@pytest.mark.parametrize("case", PARTS_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}+{c[4]}")
def test_store_of_arrays_side_by_side_is_one_run(case):
    """`mgjit.store(out, index, (a, b), staged=True)`: a row held as two arrays goes out as one run (the chunks
    read back from shared memory), every byte of the tensor exactly as asked."""
    dtype, n, block_rows, a, b, starts = case
    x = random_like(torch.empty(150, n, dtype=dtype))
    out = random_like(torch.empty(150, n, dtype=dtype))
    grid = (-(-150 // block_rows) + 1,)
    for r0, c0 in starts:
        got, compiled, counts = run_copy(row_in_parts, grid, x, x, out, out, r0, c0, ROWS=block_rows, A=a, B=b,
                                         STAGED=1)
        want = expected_parts(out, out, x, range(r0, r0 + block_rows * grid[0]), c0, a, b)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"from ({r0}, {c0})"
        assert ran(counts, "ld.shared.v4.b32")


@pytest.mark.parametrize("c0,pad,staged", [(0, 3, 1), (1, 0, 1), (2, 0, 0), (-1, 0, 0)],
                         ids=["strided", "start-inside", "registers", "start-before"])
def test_store_of_arrays_side_by_side_elsewhere(c0, pad, staged):
    """Arrays side by side in windows that are no run (rows apart, a window starting inside them) or stored from
    registers: each array in its own columns, c0 .. c0 + 7 and c0 + 8."""
    base = random_like(torch.empty(100, 9 + pad, dtype=BF16))
    x = base[:, :9]
    out_base = random_like(torch.empty(100, 9 + pad, dtype=BF16))
    out = out_base[:, :9]
    got, compiled, counts = run_copy(row_in_parts, (4,), base, x, out_base, out, 0, c0, ROWS=32, A=8, B=1,
                                     STAGED=staged)
    want = expected_parts(out_base, out, x, range(0, 128), c0, 8, 1)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert not ran(counts, "ld.shared.v4.b32")


def test_arrays_side_by_side_interpreted():
    x = random_like(torch.empty(100, 9, dtype=BF16))
    for staged in (0, 1):
        before = random_like(torch.empty(100, 9, dtype=BF16))
        out = before.clone()
        row_in_parts.interpret()[(4,)](x, out, 0, 0, ROWS=32, A=8, B=1, STAGED=staged)
        assert torch.equal(out, expected_parts(before, before, x, range(128), 0, 8, 1))


@mgjit.kernel
def side_by_side_misused(x, out, CASE: mgjit.constexpr):
    a = x[mgjit.ds(0, 4), mgjit.ds(0, 8)]
    b = x[mgjit.ds(0, 4), mgjit.ds(8, 1)]
    if CASE == 0:
        mgjit.store(out, (mgjit.ds(0, 4), mgjit.ds(0, 9)), (a, a))
    elif CASE == 1:
        mgjit.store(out, (mgjit.ds(0, 4), mgjit.ds(0, 9)), (a, b.astype(mgjit.float32)))
    elif CASE == 2:
        mgjit.store(out, (mgjit.ds(0, 4), mgjit.ds(0, 9)), (a, 1.0))
    elif CASE == 3:
        mgjit.store(out, (mgjit.ds(0, 4), 0), (a, b))
    else:
        mgjit.store(out, (mgjit.ds(0, 4), mgjit.ds(0, 9)), ())


@pytest.mark.parametrize("case,match", [
    (0, r"fill the window's last axis of 9, got widths \[8, 8\]"),
    (1, "storing float32 into out, a bfloat16 reference \\(array 1 of the tuple\\)"),
    (2, "each is an array of rank 2, got float at position 1"),
    (3, "a window whose last index is a range .* got 2 arrays and an integer last index"),
    (4, "takes at least one array .* got 0 arrays"),
])
def test_arrays_side_by_side_errors(case, match):
    """A tuple stored side by side is checked where it is written: its widths, dtypes and ranks, and a last index
    that is a range."""
    x = torch.empty(4, 9, dtype=BF16)
    with pytest.raises(mgjit.CompileError, match=match) as err:
        side_by_side_misused.compile(x, x, CASE=case, target="sm_90a")
    line = side_by_side_misused.fn.__code__.co_firstlineno + 5 + 2 * case  # after the decorator, def, a and b
    assert f"test_gmem_flat.py:{line} " in str(err.value), str(err.value)


def test_staged_must_be_static():
    @mgjit.kernel
    def dynamic(x, out, s):
        mgjit.store(out, (mgjit.ds(0, 16), mgjit.ds(0, 128)), x[mgjit.ds(0, 16), mgjit.ds(0, 128)], staged=s > 0)

    x = torch.empty(16, 127, dtype=BF16)
    with pytest.raises(mgjit.CompileError, match="staged must be a static bool"):
        dynamic.compile(x, x, 1, target="sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, **CASE_IDS)
def test_flat_store_on_the_gpu(case):
    """On the GPU, fresh rows and a poisoned output: each case's windows copy exactly what they cover, in a grid
    of many programs (warps of different CTAs write neighbouring rows' partial chunks)."""
    dtype, _, n, block_rows, cols, r0s = case
    rows = 40 * block_rows + 3
    x = random_like(torch.empty(rows, n, dtype=dtype)).cuda()
    for r0 in r0s:
        out = random_like(torch.empty(rows, n, dtype=dtype)).cuda()
        grid = -(-rows // block_rows) + 1
        want = expected_window(out.cpu(), out.cpu(), x.cpu(), range(r0, r0 + block_rows * grid), range(0, cols))
        staged_window[(grid, 1)](x, out, r0, 0, ROWS=block_rows, COLS=cols)
        torch.cuda.synchronize()
        assert torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)), f"rows from {r0}"



@pytest.mark.gpu
@pytest.mark.parametrize("case", PARTS_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}+{c[4]}")
def test_arrays_side_by_side_on_the_gpu(case):
    """On the GPU, fresh rows and a poisoned output: rows held as two arrays stored staged, over many programs."""
    dtype, n, block_rows, a, b, starts = case
    rows = 40 * block_rows + 3
    x = random_like(torch.empty(rows, n, dtype=dtype)).cuda()
    grid = -(-rows // block_rows) + 1
    for r0, c0 in starts:
        out = random_like(torch.empty(rows, n, dtype=dtype)).cuda()
        want = expected_parts(out.cpu(), out.cpu(), x.cpu(), range(r0, r0 + block_rows * grid), c0, a, b)
        row_in_parts[(grid,)](x, out, r0, c0, ROWS=block_rows, A=a, B=b, STAGED=1)
        torch.cuda.synchronize()
        assert torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)), f"from ({r0}, {c0})"

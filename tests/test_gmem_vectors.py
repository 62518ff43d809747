"""GMEM windows at every alignment, row length and row stride, checked on the CPU: the PTX compiled for sm_90a runs
instruction by instruction in tests/ptx_sim.py (which also faults on misaligned accesses, loads that touch no
allocation and shuffles or barriers in divergent code), and the whole memory afterwards must be exactly the
copy asked for: the window's elements inside the tensor copied, not one other byte changed.

Which accesses the compiler picks is checked on the PTX: plain vectors when the launch proves alignment,
aligned accesses of the alignment it proves (4 bytes and up), and aligned 32-bit words shifted by prmt below
that (rows of 4097 bf16), with no bounds test where the whole window is inside the tensor."""
import re
import sys
from pathlib import Path

import pytest

import mgjit

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402

BF16 = torch.bfloat16


@mgjit.kernel
def copy_window(x, out, r0, c0, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    w = (mgjit.ds(r0 + mgjit.program_id(0) * ROWS, ROWS), mgjit.ds(c0 + mgjit.program_id(1) * COLS, COLS))
    out[w] = x[w]


@mgjit.kernel
def copy_stepped(x, out, r0, c0, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    """copy_window with the column start a loop's induction variable (one step), as a row's chunks are."""
    r = r0 + mgjit.program_id(0) * ROWS
    first = c0 + mgjit.program_id(1) * COLS
    for c in range(first, first + COLS, COLS):
        w = (mgjit.ds(r, ROWS), mgjit.ds(c, COLS))
        out[w] = x[w]


@mgjit.kernel
def fill_window(x, out, r0, c0, ROWS: mgjit.constexpr, COLS: mgjit.constexpr, OTHER: mgjit.constexpr):
    w = (mgjit.ds(r0 + mgjit.program_id(0) * ROWS, ROWS), mgjit.ds(c0 + mgjit.program_id(1) * COLS, COLS))
    out[w] = mgjit.load(x, w, other=OTHER)


@mgjit.kernel
def fill_scalars(x, out, OTHER: mgjit.constexpr):
    i = mgjit.program_id(0) - 1
    out[mgjit.program_id(0)] = mgjit.load(x, i, other=OTHER)


@mgjit.kernel
def cast_window(x, out, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    w = (mgjit.ds(mgjit.program_id(0) * ROWS, ROWS), mgjit.ds(mgjit.program_id(1) * COLS, COLS))
    out[w] = x[w].astype(out.dtype)


@mgjit.kernel
def copy_flat(x, out, s0, BLOCK: mgjit.constexpr):
    w = mgjit.ds(s0 + mgjit.program_id(0) * BLOCK, BLOCK)
    out[w] = x[w]


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MGJIT_CACHE_DIR", str(tmp_path_factory.mktemp("gmem-vectors-cache")))
        yield


def random_like(t):
    if t.dtype.is_floating_point:
        return torch.randn(t.shape, dtype=torch.float32).to(t.dtype)
    if t.dtype == torch.bool:
        return torch.randint(0, 2, t.shape).bool()
    return torch.randint(-100, 100, t.shape, dtype=t.dtype)


def run_copy(kernel, grid, x_base, x, out_base, out, *scalars, **constexprs):
    """Run a copy kernel on the simulator; return (the out base it wrote, the compiled kernel)."""
    return simulate_copy(kernel, grid, x_base, x, out_base, out, None, *scalars, **constexprs)[:2]


def simulate_copy(kernel, grid, x_base, x, out_base, out, counts, *scalars, **constexprs):
    """`run_copy`, counting the opcodes issued into `counts` (a Counter, or None): (the out base it wrote, the
    compiled kernel, counts). No byte outside `out` may change."""
    compiled = kernel.compile(x, out, *scalars, **constexprs, target="sm_90a")
    dev = ptx_sim.Device()
    dev.counts = counts
    dev.place(x_base)
    dev.place(out_base)
    before = dev.mem.bytes.copy()
    dev.run(compiled, grid, x, out, *scalars)
    got = dev.fetch(out_base)
    lo = dev.bases[1][1]
    hi = lo + out_base.numel() * out_base.element_size()
    after = dev.mem.bytes
    assert (after[:lo] == before[:lo]).all() and (after[hi:] == before[hi:]).all(), "a byte outside `out` changed"
    return got, compiled, counts


def expected_window(out_base, out, x, rows, cols):
    ref = out_base.clone()
    view = ref.as_strided(out.shape, out.stride(), out.storage_offset())
    r = [i for i in rows if 0 <= i < x.shape[0]]
    c = [j for j in cols if 0 <= j < x.shape[1]]
    if r and c:
        view[r[0]:r[-1] + 1, c[0]:c[-1] + 1] = x[r[0]:r[-1] + 1, c[0]:c[-1] + 1]
    return ref


ALL = (slice(None), slice(None))
# (dtype, x base shape, x view (slices of the base), out base shape, out view, ROWS, COLS, grid, starts (r0, c0)):
# every case has windows that start before, end after and straddle the ends of rows, and rows that start
# anywhere in a 16-byte chunk; x and out are aligned differently.
CASES = [
    # rows of 4097 bf16: each row starts 2 bytes further into a chunk; windows over many lanes and registers
    (BF16, (3, 4097), ALL, (3, 4100), (slice(None), slice(3, None)), 1, 1024, (3, 5), [(0, 0), (0, 3), (1, -5)]),
    # strided rows that start 4 bytes into a chunk, f32
    (torch.float32, (4, 700), (slice(None), slice(1, 651)), (4, 650), ALL, 2, 512, (2, 2), [(0, 0), (1, -1), (0, 7)]),
    # several rows per warp: lane runs end at row boundaries
    (BF16, (50, 77), ALL, (50, 80), (slice(None), slice(1, 78)), 32, 16, (2, 6), [(0, 0), (3, 5), (0, -9)]),
    (torch.float16, (40, 33), ALL, (40, 33), ALL, 16, 64, (3, 1), [(0, 0), (-2, 1)]),
    # bytes: shifts within words, 1-byte pieces
    (torch.int8, (9, 301), ALL, (9, 307), (slice(None), slice(5, 306)), 4, 128, (3, 3), [(0, 0), (1, 7), (0, -13)]),
    # 8-byte elements one element into a chunk
    (torch.float64, (6, 131), (slice(None), slice(1, 131)), (6, 130), ALL, 2, 64, (3, 3), [(0, 0), (0, 3)]),
    # aligned rows whose length is not a multiple of the access: plain vectors, the last one of a row masked
    # (loads) or stored element by element (stores)
    (BF16, (5, 1008), (slice(None), slice(0, 1001)), (5, 1016), (slice(None), slice(0, 1001)), 2, 512, (3, 2),
     [(0, 0), (0, 16)]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[5]}x{c[6]}")
def test_copy_window_any_alignment(case):
    dtype, x_shape, x_view, out_shape, out_view, rows, cols, grid, starts = case
    x_base = random_like(torch.empty(x_shape, dtype=dtype))
    x = x_base[x_view]
    out_base = random_like(torch.empty(out_shape, dtype=dtype))
    out = out_base[out_view]
    assert out.shape == x.shape
    for r0, c0 in starts:
        got, compiled = run_copy(copy_window, grid, x_base, x, out_base, out, r0, c0, ROWS=rows, COLS=cols)
        want = expected_window(out_base, out, x, range(r0, r0 + rows * grid[0]), range(c0, c0 + cols * grid[1]))
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"window at ({r0}, {c0})"


@pytest.mark.parametrize("dtype,pad", [(BF16, 1), (BF16, 0), (torch.float32, 1), (torch.int8, 3)],
                         ids=["bf16-shifted", "bf16", "f32-narrowed", "int8"])
@pytest.mark.parametrize("n", [1023, 897, 895, 769, 767, 513, 511, 301])
def test_window_head_inside_or_checked_at_every_row_end(dtype, pad, n):
    """A window of 1024 columns over rows of n: unchecked where it lies inside the rows, its first 896 columns
    unchecked and the rest checked where those lie inside, else all checked. Rows end on either side of 896 and
    far from it, and windows start before, at and after the row's start."""
    x_base = random_like(torch.empty(3, n + pad, dtype=dtype))
    x = x_base[:, pad:]
    out_base = random_like(torch.empty(3, n + 2, dtype=dtype))
    out = out_base[:, 1:n + 1]
    branches = {}
    for c0 in (0, 3, -2):
        for kernel in (copy_stepped, copy_window):  # with a head path, and (a start from arguments) without
            got, compiled = run_copy(kernel, (3, 1), x_base, x, out_base, out, 0, c0, ROWS=1, COLS=1024)
            want = expected_window(out_base, out, x, range(0, 3), range(c0, c0 + 1024))
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"{kernel.name} at column {c0}"
            branches[kernel.name] = len(re.findall(r"bra\.uni", compiled.ptx))
    # a branch between each two paths of the store, and of the load where it shifts words into place (plain
    # accesses, float32 rows 4 bytes into a chunk, take none); copy_stepped's loop runs once, which LLVM sees
    # from its trip count: no back edge
    load = 0 if dtype == torch.float32 else 1
    assert branches == {"copy_stepped": 2 + 2 * load, "copy_window": 1 + load}


def fill_for(dtype) -> float | int:
    return -float("inf") if dtype.is_floating_point else -7


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[5]}x{c[6]}")
def test_load_other_fills_what_lies_outside(case):
    """mgjit.load(x, window, other=v): elements inside x are copied, those of the window outside x read v, at every
    alignment (plain, ragged, narrowed and shifted accesses); the interpreter agrees."""
    dtype, x_shape, x_view, out_shape, out_view, rows, cols, grid, starts = case
    other = fill_for(dtype)
    x_base = random_like(torch.empty(x_shape, dtype=dtype))
    x = x_base[x_view]
    out_base = random_like(torch.empty(out_shape, dtype=dtype))
    out = out_base[out_view]
    for r0, c0 in starts:
        got, _ = run_copy(fill_window, grid, x_base, x, out_base, out, r0, c0, ROWS=rows, COLS=cols, OTHER=other)
        want = out_base.clone()
        view = want.as_strided(out.shape, out.stride(), out.storage_offset())
        for i in range(max(r0, 0), min(r0 + rows * grid[0], out.shape[0])):
            for j in range(max(c0, 0), min(c0 + cols * grid[1], out.shape[1])):
                view[i, j] = x[i, j] if i < x.shape[0] and j < x.shape[1] else other
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"window at ({r0}, {c0})"
        interpreted = out_base.clone()
        view = interpreted.as_strided(out.shape, out.stride(), out.storage_offset())
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MGJIT_INTERPRET", "1")
            fill_window[grid](x, view, r0, c0, ROWS=rows, COLS=cols, OTHER=other)
        assert torch.equal(interpreted.view(torch.uint8), want.view(torch.uint8)), f"interpreted at ({r0}, {c0})"


@pytest.mark.parametrize("dtype,width,align", [(BF16, 1008, 16), (torch.float16, 1008, 16), (torch.int8, 1008, 16),
                                               (torch.float32, 1008, 16), (torch.float64, 1008, 16),
                                               (torch.int8, 1002, 2), (torch.bool, 1002, 2)], ids=str)
def test_load_other_fills_the_end_of_aligned_ragged_rows(dtype, width, align):
    """Rows aligned to 16 bytes whose length is not a multiple of the access (1001 of a base `width` wide): the
    last access of a row is loaded whole and the elements past the row's end (the base's next columns, which hold
    data) read as `other`, written into a wider out where they show. Rows aligned to 2 bytes load shifted words,
    tested per element there."""
    other = 1 if dtype == torch.bool else fill_for(dtype)
    x_base = random_like(torch.empty(5, width, dtype=dtype))
    x = x_base[:, :1001]
    out = random_like(torch.empty(5, 1024, dtype=dtype))
    got, compiled = run_copy(fill_window, (3, 2), x_base, x, out, out, 0, 0, ROWS=2, COLS=512, OTHER=other)
    assert re.search(rf"x: \w+\[rank 2, align {align}, unit-stride, last%1\]", compiled.meta["specialization"])
    want = out.clone()
    want[:, :1001] = x
    want[:, 1001:] = other
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("window", [True, False], ids=["window", "scalar"])
@pytest.mark.parametrize("dtype,other", [(torch.float8_e4m3fn, -float("inf")), (torch.float8_e4m3fn, 1000.0),
                                         (torch.float16, 1e6), (torch.float8_e5m2, -float("inf"))], ids=str)
def test_load_other_past_the_dtypes_range_reads_as_torch_converts_it(dtype, other, window):
    """A fill beyond its dtype's finite range (-inf of float8_e4m3fn, which has no infinity; 1e6 of float16) reads
    as torch converts it, -448 and inf, on the GPU and in the interpreter alike (the interpreter had raised
    torch.full's overflow error for a window: softmax over float8_e4m3fn rows crashed there)."""
    x = torch.randn(2, 5).to(dtype)
    fill = torch.tensor([other], dtype=dtype)
    if window:  # a 2 x 16 window over 2 x 5
        kernel, args, grid, constexprs = fill_window, [x, torch.zeros(2, 16, dtype=dtype), 0, 0], (1, 1), {"ROWS": 2,
                                                                                                         "COLS": 16}
        want = torch.cat([x, fill.expand(2, 11)], 1)
    else:  # out[p] = x[p - 1] for p in 0..11: out[0] and out[11] lie outside x
        kernel, args, grid, constexprs = fill_scalars, [x.view(-1), torch.zeros(12, dtype=dtype)], (12,), {}
        want = torch.cat([fill, x.view(-1), fill])
    dev = ptx_sim.Device()
    dev.run(kernel.compile(*args, **constexprs, OTHER=other, target="sm_90a"), grid, *args)
    assert torch.equal(dev.fetch(args[1]).view(torch.uint8), want.view(torch.uint8))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MGJIT_INTERPRET", "1")
        kernel[grid](*args, **constexprs, OTHER=other)
    assert torch.equal(args[1].view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=str)
@pytest.mark.parametrize("other", [-float("inf"), -0.0, 0.0, float("nan"), 0.1], ids=str)
def test_load_other_scalars_and_signed_zero(other, dtype):
    """A scalar index outside the tensor reads `other` (-0.0 and NaN included: the register holds its bits before
    the predicated access, not zeros; 0.1 rounded to bf16 as torch rounds it); no select follows the load, and
    0.0 compiles to what x[i] compiles to."""
    x = torch.randn(5).to(dtype)
    out = torch.full((7,), 3.0, dtype=dtype)
    compiled = fill_scalars.compile(x, out, OTHER=other, target="sm_90a")
    dev = ptx_sim.Device()
    dev.place(x)
    dev.place(out)
    dev.run(compiled, (7,), x, out)
    want = torch.cat([torch.tensor([other], dtype=dtype), x, torch.tensor([other], dtype=dtype)])
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(dev.fetch(out).view(bits), want.view(bits))
    assert "selp" not in compiled.ptx


@mgjit.kernel
def fill_from_runtime(x, i, out):
    out[0] = mgjit.load(x, 0, other=x[1])


@mgjit.kernel
def fill_from_scalar(x, i, out):
    out[0] = mgjit.load(i, 0, other=1)


@mgjit.kernel
def fill_by_another_name(x, i, out):
    out[0] = mgjit.load(x, 0, fill=1)


@pytest.mark.parametrize("kernel, message", [
    (fill_from_runtime, "other must be a static number"),
    (fill_from_scalar, "a tensor argument of the kernel"),
    (fill_by_another_name, "takes other="),
], ids=lambda k: getattr(k, "name", ""))
def test_load_other_errors(kernel, message):
    with pytest.raises(mgjit.CompileError, match=message) as err:
        kernel.compile(torch.randn(4), 3, torch.randn(4), target="sm_90a")
    assert "test_gmem_vectors.py" in str(err.value)


@pytest.mark.parametrize("dtype, other, message", [
    (torch.int8, 300, "outside the range of x's dtype int8 \\(-128 to 127\\)"),
    (torch.int32, 0.5, "not a value of x's dtype int32"),
    (torch.int32, -float("inf"), "not a value of x's dtype int32"),
    (torch.float4_e2m1fn_x2, 1.0, "only other=0 fills it"),
    (torch.float8_e8m0fnu, -float("inf"), "only other=0 fills it"),
])
def test_load_other_must_fit_the_dtype(dtype, other, message):
    x = torch.zeros(4, dtype=dtype)
    with pytest.raises(mgjit.CompileError, match=message):
        fill_scalars.compile(x, x, OTHER=other, target="sm_90a")


@pytest.mark.parametrize("first", [1, 0], ids=["shifted", "aligned"])
def test_loads_past_the_end_read_zero(first):
    """A window of x that goes past its rows' ends, stored into a wider out: what x lacks reads as zero. Rows
    end 2 bytes into a chunk; they start 2 bytes in, or aligned (1040 bf16 apart)."""
    x_base = random_like(torch.empty(6, 1040, dtype=BF16))
    x = x_base[:, first:1017]
    n = x.shape[1]
    out = random_like(torch.empty(6, 1100, dtype=BF16))
    got, _ = run_copy(copy_window, (3, 1), x_base, x, out, out, 0, 0, ROWS=2, COLS=1024)
    want = out.clone()
    want[:, :n] = x
    want[:, n:1024] = 0
    assert torch.equal(got, want)


def test_whole_rows_write_each_byte_once():
    """Inside a row, chunks and pieces cover every byte exactly once: nothing is written twice."""
    x = random_like(torch.empty(4, 2053, dtype=BF16))
    compiled = copy_window.compile(x, x, 0, 0, ROWS=1, COLS=2048, target="sm_90a")
    dev = ptx_sim.Device()
    dev.place(x)
    out = random_like(x)
    dev.place(out)
    dev.run(compiled, (4, 1), x, out, 0, 0)
    lo = dev.bases[1][1]
    writes = torch.from_numpy(dev.mem.writes[lo:lo + out.numel() * 2].copy()).view(4, 2053, 2)
    assert (writes[:, :2048] == 1).all() and (writes[:, 2048:] == 0).all()
    assert torch.equal(dev.fetch(out)[:, :2048], x[:, :2048])


def test_copy_from_aligned_to_misaligned_rows():
    """The load aligned, the store shifted, and the other way round."""
    a = random_like(torch.empty(4, 1024, dtype=BF16))
    b_base = random_like(torch.empty(4, 1027, dtype=BF16))
    b = b_base[:, 3:]
    got, _ = run_copy(copy_window, (4, 1), a, a, b_base, b, 0, 0, ROWS=1, COLS=1024)
    want = b_base.clone()
    want[:, 3:] = a
    assert torch.equal(got, want)
    got, _ = run_copy(copy_window, (4, 1), b_base, b, a, a, 0, 0, ROWS=1, COLS=1024)
    assert torch.equal(got, b)


@pytest.mark.parametrize("src,dst", [(BF16, torch.float32), (torch.float32, BF16)])
def test_cast_between_widths(src, dst):
    """bf16 rows into f32 ones and back, both misaligned: the f32 rows start 4 bytes into a chunk (4-byte
    accesses), the bf16 ones 2 bytes into a word (whole words shifted by prmt, and 2-byte ends)."""
    x_base = random_like(torch.empty(6, 1100, dtype=src))
    out_base = random_like(torch.empty(6, 1100, dtype=dst))
    x, out = x_base[:, 1:1034], out_base[:, 3:1036]
    got, compiled = run_copy(cast_window, (3, 3), x_base, x, out_base, out, ROWS=2, COLS=512)
    want = out_base.clone()
    want[:, 3:1036] = x.to(dst)
    assert torch.equal(got, want)
    assert "st.global.b32" in compiled.ptx and not re.search(r"st\.global\.v[24]", compiled.ptx)
    assert "prmt.b32" in compiled.ptx


@pytest.mark.parametrize("dst", [torch.int8, torch.int16])
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_narrow_stores_of_values_from_wide_loads(dst, offset):
    """int64 rows (two elements a vector) cast to 8- or 16-bit rows that start `offset` elements into a word:
    accesses of 1 or 2 bytes. Their elements were packed through a vector<1 x i8> -> i32 bitcast, an LLVM
    translation failure (an internal error found by the differential fuzzer; fp8 rows too, below)."""
    x_base = random_like(torch.empty(4, 300, dtype=torch.int64))
    out_base = random_like(torch.empty(4, 300, dtype=dst))
    x, out = x_base[:, 1:261], out_base[:, offset:offset + 260]
    got, _ = run_copy(cast_window, (2, 3), x_base, x, out_base, out, ROWS=2, COLS=128)
    want = out_base.clone()
    want[:, offset:offset + 260] = x.to(dst)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dst", [torch.float8_e5m2, torch.float8_e4m3fn])
def test_narrow_fp8_stores_of_values_from_wide_loads_compile(dst):
    x = torch.zeros(4, 300, dtype=torch.int64)[:, 1:261]
    out = torch.zeros(4, 300, dtype=dst)[:, 1:261]
    for target in ("sm_90a", "sm_100a"):
        assert "st.global.u8" in cast_window.compile(x, out, ROWS=2, COLS=128, target=target).ptx


@pytest.mark.parametrize("dtype,offset", [(torch.float32, 3), (BF16, 5)])
def test_copy_flat_at_an_offset(dtype, offset):
    x_base = random_like(torch.empty(1200, dtype=dtype))
    out_base = random_like(torch.empty(1100, dtype=dtype))
    x, out = x_base[offset:offset + 1000], out_base[1:1001]
    for s0 in (0, -7, 9):
        got, _ = run_copy(copy_flat, (2,), x_base, x, out_base, out, s0, BLOCK=512)
        want = out_base.clone()
        lo, hi = max(s0, 0), min(s0 + 1024, 1000)
        want[1 + lo:1 + hi] = x[lo:hi]
        assert torch.equal(got, want), f"start {s0}"


ACCESSES = ("ld.global.v4.b32", "st.global.v4.b32", "ld.global.b32", "st.global.b32", "ld.global.b16",
            "st.global.b16", "prmt.b32")


def body_accesses(ptx: str) -> dict[str, int]:
    return {k: len(re.findall(re.escape(k) + r"\b", ptx)) for k in ACCESSES}


def unchecked_paths(ptx: str) -> tuple[str, str]:
    """The PTX of a load's and then a store's unchecked path: from the branch on the window being inside the
    tensor to the branch past the other paths (each access's first)."""
    blocks = re.findall(r"@%p\d+ bra\s+\S+;(.*?)bra\.uni", ptx, re.S)
    return blocks[0], next(b for b in blocks if "st.global" in b)


@pytest.mark.parametrize("n", [255, 253])
def test_rows_held_whole_by_warps_store_words_joined_across_lanes(n):
    """16 rows of n bf16 a program, each warp holding 4 whole rows, its lanes along a row 2 elements each: where a
    row starts inside a word, its unchecked accesses store the aligned word of a lane's second element and the next
    lane's first (a shuffle, lane 31 taking lane 0's of the thread's access further along the row), where two
    2-byte halves went; a row spread over warps (test_ragged_bf16_rows_get_word_accesses) keeps the halves. The
    copy is exact through the simulator: out's rows start on and inside words, windows past the last row and
    crossing the row's end."""
    x = random_like(torch.empty(70, n, dtype=BF16))
    out_base = random_like(torch.empty(70, n + 2, dtype=BF16))
    out = out_base[:, 1:n + 1]
    for r0, c0 in [(0, 0), (5, 0), (0, -3), (3, 2)]:  # windows of columns 0-127 inside the rows (unchecked)
        got, compiled = run_copy(copy_window, (6, 2), x, x, out_base, out, r0, c0, ROWS=16, COLS=128)
        want = expected_window(out_base, out, x, range(r0, r0 + 96), range(c0, c0 + 256))
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (r0, c0)
    _, store = unchecked_paths(compiled.ptx)
    assert len(re.findall(r"shfl\.sync\.idx", store)) == 8  # a word a lane of each access: 4 rows of 2


def test_ragged_bf16_rows_get_word_accesses():
    """x[row, ds(0, 4096)] on rows of 4097 bf16 (every row starts 2 bytes further into a word). The load anchors a
    layout of 32-bit accesses, lanes side by side, so each instruction of a warp moves 128 contiguous bytes. Where
    a column group of the window is inside the tensor (one test for the CTA): per 2 elements, 2 aligned word
    loads (the second only when the access starts inside a word) shifted into place by one prmt, and a word store
    (when it does not) or a 2-byte head and tail; no bounds test, no shuffle, no element-by-element access."""
    x = torch.empty(100, 4097, dtype=BF16)
    c = copy_window.compile(x, x, 0, 0, ROWS=1, COLS=4096, target="sm_90a")
    load, store = unchecked_paths(c.ptx)
    accesses = 16  # of 4 bytes per thread
    assert body_accesses(load) == {**dict.fromkeys(ACCESSES, 0), "ld.global.b32": 2 * accesses, "prmt.b32": accesses}
    assert len(re.findall(r"@%p\d+ ld", load)) == accesses and "setp.lt" not in load
    assert body_accesses(store) == {**dict.fromkeys(ACCESSES, 0), "st.global.b32": accesses,
                                    "st.global.b16": 2 * accesses}
    assert "shfl" not in c.ptx
    assert "x: bfloat16[rank 2, align 2, unit-stride, last%1]" in c.meta["specialization"]
    # Lanes hold 2 elements each, side by side (64 columns a warp), warps 64 columns apart.
    (held,) = c.layouts.data["registers"]
    assert held["layout"]["tiles"] == [[1, 256], [1, 64], [2]]


@mgjit.kernel
def window_row_sums(x, sums, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    rows = mgjit.ds(mgjit.program_id(0) * ROWS, ROWS)
    sums[rows] = x[rows, mgjit.ds(0, COLS)].astype(mgjit.float32).sum(axis=1)


@pytest.mark.parametrize("n", [127, 255])
def test_odd_rows_only_reduced_are_held_a_row_a_thread(n):
    """32 rows of 127 (255) bf16, rows that start inside a word. Summed and stored as one value a row, a row is
    held by 4 lanes of its warp in 16-byte accesses (so that a warp's access spans 8 rows: ops/gmem.py
    ROW_ACCESS_LINES), a row a thread: 2 shuffles in all, where 8 lanes a row in 32-bit words took 6 and 32 lanes
    a row 40. Copied, a row keeps 32 lanes of 32-bit words: a store of 32 bytes a row would straddle the sectors
    of rows that are not 32-byte aligned. The simulated sums (poisoned first, rows left over for the last program)
    match torch."""
    x = (torch.randn(3 * 32 + 5, n) * 2).to(BF16)
    sums = torch.full((x.shape[0],), float("nan"))
    cols = 1 << (n - 1).bit_length()
    c = window_row_sums.compile(x, sums, ROWS=32, COLS=cols, target="sm_90a")
    held = c.layouts.data["registers"][0]
    assert held["shape"] == [32, cols] and held["layout"]["tiles"] == [[32, 32], [8, 32], [8]], held
    assert len(re.findall(r"shfl\.sync", c.ptx)) == 2
    dev = ptx_sim.Device()
    dev.run(c, (4, 1, 1), x, sums)
    torch.testing.assert_close(dev.fetch(sums), x.float().sum(1), rtol=1e-5, atol=1e-4)
    copied = copy_window.compile(x, x, 0, 0, ROWS=32, COLS=cols, target="sm_90a")
    assert copied.layouts.data["registers"][0]["layout"]["tiles"][1:] == [[1, 64], [2]]


# (rows, columns, dtype, row length) -> the tiles of the rows held a row a thread (ops/gmem.py ROW_ACCESS_LINES),
# derived by hand: a warp holds rows / 4 of them, its lanes go along a row as far as leaves a thread one row, and at
# least as far as keeps a warp's access within 8 lines of 128 bytes (rows of 32 bytes: 1 lane; 64: 2; 128 and
# longer: 4), in 16-byte accesses (8 bf16, 4 float32).
HELD_ROWS = [
    (128, 16, BF16, 17, [[128, 8], [32, 8], [8]]),     # 32 rows a warp, a lane each, 2 accesses a row
    (64, 64, BF16, 65, [[32, 32], [8, 32], [8]]),      # 16 rows a warp: 2 lanes a row would leave a thread one,
                                                       # but a warp's access would span 16 lines: 4 lanes, 2 rows
    (128, 16, torch.float32, 17, [[64, 8], [16, 8], [4]]),  # 64-byte rows: 2 lanes, 2 rows a thread
    (8, 1024, BF16, 1024, [[8, 128], [2, 128], [8]]),  # 2 rows a warp, 16 lanes a row
]


@pytest.mark.parametrize("rows,cols,dtype,n,tiles", HELD_ROWS, ids=lambda v: str(v) if isinstance(v, int) else None)
def test_rows_only_reduced_along_them_are_held_a_row_a_thread(rows, cols, dtype, n, tiles):
    x = (torch.randn(2 * rows + 3, n) * 2).to(dtype)
    sums = torch.full((x.shape[0],), float("nan"))
    c = window_row_sums.compile(x, sums, ROWS=rows, COLS=cols, target="sm_90a")
    held = c.layouts.data["registers"][0]
    assert held["shape"] == [rows, cols] and held["layout"]["tiles"] == tiles, held
    dev = ptx_sim.Device()
    dev.run(c, (3, 1, 1), x, sums)
    torch.testing.assert_close(dev.fetch(sums), x.float()[:, :cols].sum(1), rtol=1e-5, atol=1e-3)


@mgjit.kernel
def window_weighted_sums(x, w, sums, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    rows, cols = mgjit.ds(mgjit.program_id(0) * ROWS, ROWS), mgjit.ds(0, COLS)
    sums[rows] = (x[rows, cols].astype(mgjit.float32) * w[cols].astype(mgjit.float32)[None, :]).sum(axis=1)


@pytest.mark.parametrize("rows,cols,tiles", [(128, 16, [[128, 8], [32, 8], [8]]), (8, 1024, [[4, 64], [1, 64], [2]])])
def test_rows_held_a_row_a_thread_only_where_a_vector_along_them_stays_small(rows, cols, tiles):
    """Rows times a weight vector broadcast along them, summed: held a row a thread where the thread's copy of the
    vector is small (rows of 16: 16 of HELD_VECTOR_ELEMENTS), with lanes along them where it is not (8 rows of
    1024 would give each thread 64 of the vector: a warp's lanes along a row in 32-bit words, as rows of 1025
    bf16 are read otherwise)."""
    x = (torch.randn(2 * rows + 3, cols + 1) * 2).to(BF16)
    w, sums = torch.randn(cols + 1).to(BF16), torch.full((x.shape[0],), float("nan"))
    c = window_weighted_sums.compile(x, w, sums, ROWS=rows, COLS=cols, target="sm_90a")
    assert c.layouts.data["registers"][0]["layout"]["tiles"] == tiles
    dev = ptx_sim.Device()
    dev.run(c, (3, 1, 1), x, w, sums)
    want = (x.float()[:, :cols] * w.float()[:cols]).sum(1)
    torch.testing.assert_close(dev.fetch(sums)[:3 * rows], want[:3 * rows], rtol=1e-4, atol=1e-3)


@mgjit.kernel
def window_column_sums(x, sums, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    sums[mgjit.ds(0, COLS)] = x[mgjit.ds(0, ROWS), mgjit.ds(0, COLS)].astype(mgjit.float32).sum(axis=0)


def test_rows_reduced_across_keep_lanes_along_them():
    """The same 64 rows of 64 bf16 summed over the rows (axis 0), not along them: the blocked layout (8 lanes a
    row, warps down the rows), not a row a thread."""
    x = torch.randn(64, 64).to(BF16)
    c = window_column_sums.compile(x, torch.empty(64), ROWS=64, COLS=64, target="sm_90a")
    assert c.layouts.data["registers"][0]["layout"]["tiles"] == [[16, 64], [4, 64], [8]]


@pytest.mark.parametrize("n,access", [(4098, 4), (4100, 8), (4104, 16)])
def test_bf16_rows_aligned_below_16_bytes_get_accesses_as_wide_as_their_alignment(n, access):
    """Rows of 4098 (4100) bf16 start on a 4 (8) byte boundary: plain accesses of 4 (8) bytes with lanes side by
    side, no shifting; 4104 keeps 16-byte vectors."""
    x = torch.empty(100, n, dtype=BF16)
    c = copy_window.compile(x, x, 0, 0, ROWS=1, COLS=4096, target="sm_90a")
    count = 4096 * 2 // 128 // access
    suffix = {4: ".b32", 8: ".v2.b32", 16: ".v4.b32"}[access]
    assert len(re.findall(rf"ld\.global{re.escape(suffix)}\b", c.ptx)) == count
    assert len(re.findall(rf"st\.global{re.escape(suffix)}\b", c.ptx)) >= count
    assert "prmt" not in c.ptx and "shfl" not in c.ptx


def test_misaligned_f32_rows_get_4_byte_accesses():
    """Rows of 4097 f32 start 4 bytes further into a chunk each: 4-byte accesses, with no shifting; the load's
    plain accesses each tested, on one path (no branch), the store's untested where the window is inside."""
    x = torch.empty(100, 4097)
    c = copy_window.compile(x, x, 0, 0, ROWS=1, COLS=4096, target="sm_90a")
    _, store = unchecked_paths(c.ptx)
    assert body_accesses(store) == {**dict.fromkeys(ACCESSES, 0), "st.global.b32": 32}
    loads = re.findall(r"(@%p\d+ )?ld\.global\.b32", c.ptx)
    assert len(loads) == 32 and all(loads)
    assert "prmt" not in c.ptx and "shfl" not in c.ptx and "setp.lt" not in store


def test_aligned_rows_keep_plain_vectors():
    x = torch.empty(100, 4096, dtype=BF16)
    c = copy_window.compile(x, x, 0, 0, ROWS=1, COLS=4096, target="sm_90a")
    assert body_accesses(c.ptx) == {**dict.fromkeys(ACCESSES, 0), "ld.global.v4.b32": 4, "st.global.v4.b32": 4}
    assert "shfl" not in c.ptx and "bra" not in c.ptx


@mgjit.kernel
def window_at(x, out, c0, OTHER: mgjit.constexpr):
    out[0, mgjit.ds(0, 64)] = mgjit.load(x, (0, mgjit.ds(c0, 64)), other=OTHER)
    out[1, mgjit.ds(c0, 64)] = x[0, mgjit.ds(0, 64)]


@pytest.mark.parametrize("c0", [2 ** 31 - 1, 2 ** 31 - 40, -2 ** 31])
def test_windows_at_the_ends_of_the_int32_range_are_outside(c0):
    """A window whose start is near 2**31 - 1: start + size wrapped and passed the inside test, and the load read
    (the store wrote) far past the tensor (the fuzzer's --ptx, seed 30226, a start read from memory). Run from the
    PTX on the simulator, which raises on an access outside every tensor."""
    x = torch.randn(2, 100)
    out = torch.full((2, 100), 7.0)
    compiled = window_at.compile(x, out, c0, OTHER=-1.0, target="sm_90a")
    dev = ptx_sim.Device()
    dev.place(x)
    dev.place(out)
    dev.run(compiled, (1,), x, out, c0)
    want = torch.full((2, 100), 7.0)
    want[0, :64] = -1.0
    assert torch.equal(dev.fetch(out), want)


@mgjit.kernel
def load_other_then_math(x, out, top, N: mgjit.constexpr):
    r = mgjit.program_id(0)
    v = mgjit.load(x, (r, mgjit.ds(0, N)), other=-3)
    out[r, mgjit.ds(0, N)] = v * v + 1
    top[r] = v.astype(mgjit.float32).max()


@pytest.mark.parametrize("dtype", [torch.int16, BF16, torch.float16], ids=str)
@pytest.mark.parametrize("n", [1021, 1023, 1024])
def test_16bit_loads_join_their_paths_as_words(dtype, n):
    """A 16-bit load with a fill (whose unchecked and checked paths join) delivers its elements as the words they
    were loaded in: a float maximum of them takes a word at a time (`max.NaN.bf16x2`), no 16-bit register is
    widened apart (`cvt.u32.u16`), and LLVM may pair the halves' arithmetic (`mul.rn.bf16x2`, which the simulator
    runs half by half). Exact against torch, from the PTX and interpreted, rows ending inside a word or not."""
    x = (torch.randn(4, n) * 30).to(dtype)
    padded = torch.cat([x, torch.full((4, 1024 - n), -3, dtype=dtype)], 1)
    want, want_top = padded * padded + 1, padded.float().amax(1)
    args = (torch.zeros(4, 1024, dtype=dtype), torch.zeros(4))
    c = load_other_then_math.compile(x, *args, N=1024, target="sm_90a")
    assert "cvt.u32.u16" not in c.ptx
    if dtype.is_floating_point:
        assert re.search(r"max\.NaN\.b?f16x2", c.ptx)
    dev = ptx_sim.Device()
    got = [torch.zeros_like(a) for a in args]
    for t in (x, *got):
        dev.place(t)
    dev.run(c, (4,), x, *got)
    assert torch.equal(dev.fetch(got[0]), want) and torch.equal(dev.fetch(got[1]), want_top)
    interpreted = [torch.zeros_like(a) for a in args]
    load_other_then_math.interpret[(4,)](x, *interpreted, N=1024)
    assert torch.equal(interpreted[0], want) and torch.equal(interpreted[1], want_top)

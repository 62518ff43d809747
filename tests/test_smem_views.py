"""SMEM as a first-class memory, on the CPU: views of tiles (their geometry against the tile they are cut from,
the errors where the storage does not allow them), bank conflicts against hand-computed bank mappings, and the
GPU tests' kernels (test_gpu_smem_views.py) compiled for sm_90a and interpreted against torch."""
import inspect
import itertools
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import mgjit
from mgjit import tiles
from mgjit.layouts import WGMMA, blocked
from mgjit.ir import RefType
from mgjit.ops.smem import bank_conflicts
import ptx_sim
import test_gpu_smem_views as gv

torch = pytest.importorskip("torch")
BF16 = torch.bfloat16


def line_of(kernel, text: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# ---------------------------------------------------------------------------------------------- geometry

VIEWS = [  # (tile shape, bits, swizzle, dim, start, size)
    ((128, 256), 16, 128, 0, 64, 64),   # rows of a 4-block tile: blocks stay 128 rows apart
    ((128, 256), 16, 128, 1, 128, 64),  # one column block
    ((64, 128), 32, 64, 0, 8, 16),      # 8-row atoms of a 64B swizzle
    ((64, 96), 16, None, 1, 16, 32),    # 16-byte runs of an unswizzled tile: rows keep their 192-byte pitch
    ((4, 64, 128), 16, 128, 0, 1, 2),   # stages of a buffer whose stages do not fold
    ((4, 64, 128), 16, 128, 1, 32, 16),  # rows of every stage
    ((3, 16, 64), 16, 128, 0, 2, 1),    # stages that fold (one column block)
]


@pytest.mark.parametrize("shape,bits,swizzle,dim,start,size", VIEWS)
def test_a_view_addresses_the_elements_of_its_tile(shape, bits, swizzle, dim, start, size):
    tile = tiles.Tile(shape, bits, swizzle)
    view = tile.view(dim, size)
    assert start % tile.granule(dim) == 0 and size % tile.granule(dim) == 0
    base = start * tile.dim_stride(dim)
    vshape = view.shape
    seen = set()
    for index in itertools.product(*map(range, vshape)):
        parent = list(index)
        parent[dim] += start
        row = lambda ix, sh: sum(ix[d] * int(torch.tensor(sh[d + 1:-1]).prod()) for d in range(len(sh) - 1))
        got = base + view.offset(row(index, vshape), index[-1])
        assert got == tile.offset(row(parent, shape), parent[-1]), index
        seen.add(got)
    spans = [(base + a, base + b) for a, b in view.spans()]
    assert all(any(a <= x < b for a, b in spans) for x in seen)
    assert sum(b - a for a, b in spans) == view.nbytes  # the spans are exactly the view's bytes


def test_stages_of_a_wide_swizzled_tile_are_whole_planes():
    """(2, 64, 128) bf16 under a 128B swizzle: each stage is a 64 x 128 plane of two column blocks, stored one
    stage after the other (what buf[s] addresses), so one TMA box per stage and column block."""
    tile = tiles.Tile((2, 64, 128), 16, 128)
    assert not tile.folds and tile.stage_bytes == 64 * 256
    assert tile.offset(64 + 3, 70) == 64 * 256 + tiles.Tile((64, 128), 16, 128).offset(3, 70)
    assert tile.tma_box() == (1, 64, 64)
    assert tile.boxes() == [((0, 0, 0), 0), ((0, 0, 64), 8192), ((1, 0, 0), 16384), ((1, 0, 64), 24576)]
    folded = tiles.Tile((2, 64, 64), 16, 128)  # one column block: the stages are one plane of 128 rows
    assert folded.folds and folded.tma_box() == (2, 64, 64) and folded.boxes() == [((0, 0, 0), 0)]


# ---------------------------------------------------------------------------------------------- bank conflicts

def test_wavefronts_of_hand_computed_accesses():
    assert tiles.wavefronts([4 * lane for lane in range(32)], 4) == (1, 1)  # 32 consecutive words
    assert tiles.wavefronts([128 * lane for lane in range(32)], 4) == (32, 1)  # one bank, 32 words
    assert tiles.wavefronts([0] * 32, 4) == (1, 1)  # one word, broadcast
    assert tiles.wavefronts([8 * lane for lane in range(32)], 4) == (2, 1)  # every other word: 16 banks twice
    assert tiles.wavefronts([16 * lane for lane in range(32)], 16) == (4, 4)  # 4 phases of 8 lanes x 16 bytes
    assert tiles.wavefronts([16 * (lane % 4) + 128 * (lane // 4) for lane in range(32)], 16) == (8, 4)
    assert tiles.wavefronts([2 * lane for lane in range(32)], 2) == (1, 1)  # 2-byte elements share words


def test_the_wgmma_layout_reads_a_128b_swizzled_tile_without_conflicts():
    """Register (r, c) pairs of the WGMMA layout: a warp's 32 lanes read rows r = lane // 4 of 8 rows, 4 bytes at
    column 2 * (lane % 4). Unswizzled rows are 128 bytes apart, so the 8 rows hit the same 4 banks (8-way);
    the 128B swizzle moves row r's 16-byte chunk to chunk c ^ r: 32 distinct banks."""
    plain = RefType("smem", mgjit.bfloat16, 2, (64, 64))
    swizzled = RefType("smem", mgjit.bfloat16, 2, (64, 64), 128)
    total, ideal = bank_conflicts(plain, WGMMA, (64, 64))
    assert total == 8 * ideal
    assert bank_conflicts(swizzled, WGMMA, (64, 64)) == (ideal, ideal)
    # 16-byte vectors along rows (the coalesced layout) never conflict: 8 lanes cover one 128-byte line.
    assert bank_conflicts(plain, blocked((64, 64), mgjit.bfloat16), (64, 64))[0] == \
        bank_conflicts(plain, blocked((64, 64), mgjit.bfloat16), (64, 64))[1]


@mgjit.kernel
def conflicted(x, out, SW: mgjit.constexpr):
    s = mgjit.smem((64, 64), x.dtype, swizzle=SW)
    b = mgjit.smem((64, 64), x.dtype, swizzle=128)
    s[...] = x[mgjit.ds(0, 64), mgjit.ds(0, 64)]
    b[...] = x[mgjit.ds(0, 64), mgjit.ds(0, 64)]
    mgjit.fence_async_shared()
    acc = mgjit.wgmma(mgjit.zeros((64, 64), mgjit.float32), s[...], b)  # A from registers: the WGMMA layout
    mgjit.wgmma_wait(0)
    out[mgjit.ds(0, 64), mgjit.ds(0, 64)] = acc


def test_a_conflicting_read_is_a_warning_at_its_line_and_a_note_in_the_ir():
    x = torch.empty(64, 64, dtype=BF16)
    out = torch.empty(64, 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = conflicted.compile(x, out, SW=None, target="sm_90a")
    found = [w for w in caught if issubclass(w.category, mgjit.BankConflictWarning)]
    assert len(found) == 1 and found[0].lineno == line_of(conflicted, "s[...], b)")
    assert "8-way bank conflicts" in str(found[0].message) and "no swizzle" in str(found[0].message)
    assert "bank_conflict=8-way" in next(line for line in c.ir.splitlines() if "smem_load" in line)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mgjit.BankConflictWarning)
        c = conflicted.compile(x, out, SW=128, target="sm_90a")
    assert "bank_conflict" not in c.ir


@mgjit.kernel
def widened(w, x, out, N: mgjit.constexpr):
    s = mgjit.smem((2, N), mgjit.float32)
    s[1][...] = w[mgjit.ds(0, N)].astype(mgjit.float32) * 2.0
    row = x[mgjit.ds(0, 4), mgjit.ds(1, N)].astype(mgjit.float32)
    out[mgjit.ds(0, 4), mgjit.ds(0, N)] = row * s[1][...][None, :]


@pytest.mark.parametrize("n,load", [(256, "ld.global.b32"), (4096, "ld.global.v2.b32")])
def test_a_store_of_a_widened_load_takes_a_layout_without_conflicts(n, load):
    """A bf16 load cast to float32 and stored into an unswizzled tile: in the load's own coalesced layout (16
    bytes of bf16 a lane) each lane would store 32 bytes, two-way conflicts; inference places the load in 16
    bytes of float32 a lane instead (8-byte loads), or, for 256 elements, which 16 bytes a lane would leave to
    two warps with the other two holding copies, in 8 bytes over all 128 threads (`layouts.spread`: 4-byte
    loads). No warning, and the numbers hold (interpreter, PTX)."""
    w, x = torch.randn(n).to(BF16), torch.randn(4, n + 1).to(BF16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mgjit.BankConflictWarning)
        c = widened.compile(w, x, torch.empty(4, n), N=n, target="sm_90a")
    assert "bank_conflict" not in c.ir and load in c.ptx and "ld.global.v4.b32" not in c.ptx
    ref = x[:, 1:].float() * (w.float() * 2)
    out = torch.full((4, n), float("nan"))
    widened.interpret[(1,)](w, x, out, N=n)
    assert torch.equal(out, ref)
    dev = ptx_sim.Device()
    out.fill_(float("nan"))
    dev.run(c, (1,), w, x, out)
    assert torch.equal(dev.fetch(out), ref)


def test_a_conflicting_read_warns_again_when_another_process_loads_the_kernel_from_the_cache(tmp_path):
    """The cache entry records the compile's warnings about the kernel's lines: a process that loads it warns as
    the compiling one did (it once gave ptxas' warnings only, so a warm cache hid the conflict)."""
    code = f"""
        import sys, warnings; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        warnings.simplefilter("always")
        import torch, test_smem_views as t
        x, out = torch.empty(64, 64, dtype=torch.bfloat16), torch.empty(64, 64)
        c = t.conflicted.compile(x, out, SW=None, target="sm_90a")
        print(c.from_cache)
        """
    env = {**os.environ, "MGJIT_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=300, env=env) for _ in range(2)]
    assert [r.stdout.strip() for r in runs] == ["False", "True"], [r.stderr[-500:] for r in runs]
    for r in runs:
        assert "BankConflictWarning" in r.stderr and "8-way bank conflicts" in r.stderr
        assert f"test_smem_views.py:{line_of(conflicted, 's[...], b)')}" in r.stderr


# ---------------------------------------------------------------------------------------------- slicing errors

@mgjit.kernel
def bad_view(x, WHICH: mgjit.constexpr):
    t = mgjit.smem((2, 128, 128), x.dtype, swizzle=128)
    u = mgjit.smem((64, 128), x.dtype)
    bars = mgjit.barrier(1)
    if WHICH == 0:
        v = t[0][:, 0:32]
    if WHICH == 1:
        v = t[1, 4:68]
    if WHICH == 2:
        v = t[:, 0]
    if WHICH == 3:
        v = t[0][mgjit.ds(x.shape[0], 16), 64:512]
    if WHICH == 4:
        v = t[0][3]
    if WHICH == 5:
        v = t[0][0:x.shape[0]]
    if WHICH == 6:
        mgjit.copy_async(x, (0, 0), u[:, 8:40], barrier=bars[0])
    if WHICH == 7:
        v = mgjit.smem((2, 2, 64, 64), x.dtype)[:, 0:1]
    if WHICH == 8:
        mgjit.copy_async(x, (0, 0), mgjit.smem((3, 5, 24), x.dtype)[1], barrier=bars[0])
    if WHICH == 9:
        mgjit.gather_async(x, mgjit.arange(64), 0, mgjit.smem((64, 32), x.dtype, swizzle=64), barrier=bars[0])
    w = mgjit.smem((2, 64, 128), x.dtype)
    if WHICH == 10:
        v = t[0].window(0, (64, 128))
    if WHICH == 11:
        v = w[0][:, 0:64].window(0, (8, 64))
    if WHICH == 12:
        v = w.window(4, (8, 128))
    if WHICH == 13:
        v = w.window(128 * 127, (2, 128))
    if WHICH == 14:
        v = w.window(0, (x.shape[0], 128))
    if WHICH == 15:
        v = w[0].T.window(0, (8, 64))


@pytest.mark.parametrize("which,text,phrase", [
    (0, "[:, 0:32]", "slicing a 128B-swizzled tile along its minor dimension needs multiples of 64 bfloat16 "
                     "(one column block), got size 32"),
    (1, "t[1, 4:68]", "needs multiples of 8 rows (the swizzle atom), got start 4"),
    (2, "t[:, 0]", "integer indices of its stages first, then slices"),
    (3, "64:512", "the slice 64:512 is outside dimension 1"),
    (4, "t[0][3]", "take rows of a 2D tile as a slice of multiples of 8"),
    (5, "0:x.shape[0]", "static bounds (tile[a:b]) or a static size from a runtime start"),
    (6, "u[:, 8:40]", "keeps their pitch"),
    (7, "[:, 0:1]", "only the first of a buffer's stage dimensions can be sliced"),
    (8, "(3, 5, 24)", "this tile's boxes start at multiples of only 16 bytes"),
    (9, "gather_async", "this tile's rows are 64 bytes apart: use a 128B swizzle"),
    (10, "t[0].window", "which needs them stored as one run"),
    (11, "w[0][:, 0:64]", "which needs them stored as one run"),
    (12, "w.window(4", "a window starts on 16 bytes, a multiple of 8 bfloat16, got start 4"),
    (13, "128 * 127", "the window of 256 elements from 16256 is outside the SMEM tile's 16384"),
    (14, "(x.shape[0], 128)", "a window has a static shape of positive ints"),
    (15, ".T.window", "which needs them stored as one run"),
])
def test_views_the_storage_does_not_allow_are_errors_at_their_line(which, text, phrase):
    x = torch.empty(64, 64, dtype=BF16)
    with pytest.raises(mgjit.CompileError) as info:
        bad_view.compile(x, WHICH=which, target="sm_90a")
    assert info.value.loc.line == line_of(bad_view, text), str(info.value)
    assert phrase in str(info.value)


@mgjit.kernel
def runtime_slice(x, out, START):
    t = mgjit.smem((64, 64), x.dtype, swizzle=128)
    t[...] = x[mgjit.ds(0, 64), mgjit.ds(0, 64)]
    out[mgjit.ds(0, 16), mgjit.ds(0, 64)] = t[mgjit.ds(START, 16)][...]


def test_a_runtime_start_off_the_atom_is_an_interpreter_error():
    x = torch.randn(64, 64, dtype=BF16)
    out = torch.full((16, 64), float("nan"), dtype=BF16)
    runtime_slice.interpret[(1,)](x, out, 24)
    assert torch.equal(out, x[24:40])
    with pytest.raises(mgjit.InterpretError) as info:
        runtime_slice.interpret[(1,)](x, out, 20)
    assert info.value.check == "smem-slice" and "multiples of 8 rows" in str(info.value)
    with pytest.raises(mgjit.InterpretError) as info:
        runtime_slice.interpret[(1,)](x, out, 56)
    assert info.value.check == "out-of-bounds"


@pytest.mark.parametrize("start", [0, 8, 200, 256 + 24, 16 * 256])
def test_windows_read_and_write_a_tile_in_storage_order(start):
    x = torch.randn(64, 256, dtype=BF16)
    out = torch.full((48, 256), float("nan"), dtype=BF16)
    gv.windows.interpret[(1,)](x, out, start, R=16, C=256)
    assert torch.equal(out, gv.windows_reference(x, start, 16, 256))


def test_a_window_off_16_bytes_or_past_its_tile_is_an_interpreter_error():
    x = torch.randn(64, 256, dtype=BF16)
    out = torch.full((48, 256), float("nan"), dtype=BF16)
    with pytest.raises(mgjit.InterpretError) as info:
        gv.windows.interpret[(1,)](x, out, 4, R=16, C=256)
    assert info.value.check == "smem-slice" and "this runtime start is 4" in str(info.value)
    with pytest.raises(mgjit.InterpretError) as info:
        gv.windows.interpret[(1,)](x, out, 16 * 256 + 8, R=16, C=256)
    assert info.value.check == "out-of-bounds" and "outside the SMEM tile" in str(info.value)


def test_a_window_compiles_to_vector_accesses_at_its_runtime_start():
    ptx = gv.windows.compile(torch.empty(64, 256, dtype=BF16), torch.empty(48, 256, dtype=BF16), 8, R=16, C=256,
                             target="sm_90a").ptx
    assert "ld.shared.v4.b32" in ptx and "st.shared.v4.b32" in ptx


# ---------------------------------------------------------------------------------------------- the GPU kernels

def poisoned(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.mark.parametrize("b_kmajor", [False, True], ids=["b-mn-major", "b-k-major"])
def test_slices_feed_wgmma(b_kmajor):
    a = torch.randn(128, 256, dtype=BF16)
    b = torch.randn(128, 256, dtype=BF16) if b_kmajor else torch.randn(256, 128, dtype=BF16)
    c = poisoned(128, 128)
    gv.sliced_wgmma.interpret[(1,)](a, b, c, K=256, B_KMAJOR=b_kmajor)
    ref = a.float() @ (b.float().t() if b_kmajor else b.float())
    torch.testing.assert_close(c, ref, rtol=1e-5, atol=1e-4)
    compiled = gv.sliced_wgmma.compile(a, b, c, K=256, B_KMAJOR=b_kmajor, target="sm_90a")
    mmas = [line for line in compiled.ptx.splitlines() if "wgmma.mma_async" in line]
    assert compiled.spills == 0 and mmas and all("m64n64k16.f32.bf16.bf16" in line for line in mmas)


def test_tma_into_views():
    x = torch.randn(128, 128, dtype=BF16)
    out = poisoned(128, 128, dtype=BF16)
    gv.views_through_tma.interpret[(1,)](x, x.view(2, 64, 128), out, R=64, C=128)
    assert torch.equal(out, torch.cat([x[:64], x[64:] + x[:64]]))
    c = gv.views_through_tma.compile(x, x.view(2, 64, 128), out, R=64, C=128, target="sm_90a")
    assert {"box": [1, 64, 64], "param": 1, "swizzle": 128} in c.meta["tma"]  # a box per stage and column block
    assert c.ptx.count("cp.async.bulk.tensor.3d") == 4 and c.ptx.count("cp.async.bulk.tensor.2d") == 4


def test_scoped_buffers_share_their_bytes():
    x = torch.randn(1024, 128, dtype=BF16)
    out = poisoned(1024, 128, dtype=BF16)
    gv.scoped_reuse.interpret[(1,)](x, out, STAGES=4, R=128, C=128)
    assert torch.equal(out, torch.cat([x[:512] * 2, x[512:] * 3]))
    c = gv.scoped_reuse.compile(x, out, STAGES=4, R=128, C=128, target="sm_90a")
    # Each scope holds 128 KiB; two would exceed the 227 KiB a CTA can have, one at a time fits.
    assert 131072 <= c.smem_bytes <= 131072 + 2048 and c.spills == 0
    assert c.ir.count("scoped=True") == 2 and c.ir.count("smem_free") == 2


@mgjit.kernel
def unscoped(x, STAGES: mgjit.constexpr):
    for phase in mgjit.static_range(2):
        buf = mgjit.smem((STAGES, 128, 128), x.dtype, swizzle=128)
        buf[0][...] = mgjit.zeros((128, 128), x.dtype)


def test_the_same_buffers_for_the_whole_kernel_exceed_the_budget():
    """Compiled or interpreted alike (the interpreter laid the buffers out past the budget and ran on: a matmul of
    30 stages failed there with a wgmma descriptor's address out of range)."""
    x = torch.empty(64, 64, dtype=BF16)
    with pytest.raises(mgjit.CompileError) as info:
        unscoped.compile(x, STAGES=4, target="sm_90a")
    assert info.value.rule == "smem-budget" and info.value.loc.line == line_of(unscoped, "buf = mgjit.smem")
    with pytest.raises(mgjit.CompileError, match="262144 bytes by this allocation") as info:
        unscoped.interpret[(1,)](x, STAGES=4)
    assert info.value.rule == "smem-budget" and info.value.loc.line == line_of(unscoped, "buf = mgjit.smem")


def test_prefetch_then_copy():
    x = torch.randn(300, 128, dtype=BF16)
    out = poisoned(300, 128, dtype=BF16)
    gv.prefetch_then_copy.interpret[(5,)](x, out, R=64, C=128)
    assert torch.equal(out, x)
    c = gv.prefetch_then_copy.compile(x, out, R=64, C=128, target="sm_90a")
    prefetches = [line for line in c.ptx.splitlines() if "cp.async.bulk.prefetch.tensor" in line]
    assert len(prefetches) == 3 and all("cp.async.bulk.prefetch.tensor.2d.L2.global.tile" in p for p in prefetches)
    assert {"box": [64, 64], "param": 0, "swizzle": 0} in c.meta["tma"]  # the prefetch by shape: unswizzled


@pytest.mark.parametrize("swizzle,dim", [(128, 256), (None, 64), (128, 64)])
def test_gather_rows_is_index_select(swizzle, dim):
    table = torch.randn(1000, dim, dtype=BF16)
    ids = torch.randint(0, 1000, (300,), dtype=torch.int32)
    ids[7], ids[100] = 1000, -3
    out = poisoned(300, dim, dtype=BF16)
    gv.gather_rows.interpret[(5,)](table, ids, out, R=64, D=dim, SW=swizzle)
    assert torch.equal(out, gv.embedding_reference(table, ids))
    assert gv.gather_rows.compile(table, ids, out, R=64, D=dim, SW=swizzle, target="sm_90a").spills == 0


def test_gather_instructions_per_target():
    table, ids, out = torch.empty(1000, 256, dtype=BF16), torch.empty(300, dtype=torch.int32), torch.empty(300, 256)
    hopper = gv.gather_rows.compile(table, ids, out.to(BF16), R=64, D=256, SW=128, target="sm_90a")
    rows = [line for line in hopper.ptx.splitlines() if "cp.async.bulk.tensor.2d" in line]
    # 64 rows x 4 column blocks, each row copied by the thread holding its index: 4 rows x 4 blocks per thread.
    assert len(rows) == 16 and all("gather4" not in r for r in rows) and hopper.spills == 0
    assert {"box": [1, 64], "param": 0, "swizzle": 128} in hopper.meta["tma"]
    blackwell = gv.gather_rows.compile(table, ids, out.to(BF16), R=64, D=256, SW=128, target="sm_100a")
    rows = [line for line in blackwell.ptx.splitlines() if "tile::gather4" in line]
    assert len(rows) == 4 and blackwell.spills == 0  # one gather4 of four rows per column block


def test_gathered_tokens_times_weight():
    x, w = torch.randn(500, 128, dtype=BF16), torch.randn(128, 64, dtype=BF16)
    ids = torch.randint(0, 500, (256,), dtype=torch.int32)
    out = poisoned(256, 64)
    gv.gathered_matmul.interpret[(4,)](x, ids, w, out, R=64, K=128, N=64)
    torch.testing.assert_close(out, x[ids.long()].float() @ w.float(), rtol=1e-5, atol=1e-4)
    c = gv.gathered_matmul.compile(x, ids, w, out, R=64, K=128, N=64, target="sm_90a")
    assert c.spills == 0 and "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in c.ptx


@mgjit.kernel
def tcgen05_on_views(a, b, c, K: mgjit.constexpr):
    """Blackwell: c (128 x 128) = a @ b with A's K steps and B's column blocks taken as views of whole tiles."""
    a_s = mgjit.smem((128, K), a.dtype, swizzle=128)
    b_s = mgjit.smem((K, 128), b.dtype, swizzle=128)
    bars = mgjit.barrier(1, arrivals=2)
    done = mgjit.barrier(1)
    mgjit.copy_async(a, (0, 0), a_s, barrier=bars[0])
    mgjit.copy_async(b, (0, 0), b_s, barrier=bars[0])
    bars[0].wait()
    acc = mgjit.tmem((128, 128), mgjit.float32)
    for k in range(K // 64):
        mgjit.tcgen05_mma(acc[:, 0:64], a_s[:, mgjit.ds(k * 64, 64)], b_s[mgjit.ds(k * 64, 64), 0:64], accumulate=k > 0)
        mgjit.tcgen05_mma(acc[:, 64:128], a_s[:, mgjit.ds(k * 64, 64)], b_s[mgjit.ds(k * 64, 64), 64:128],
                          accumulate=k > 0)
    mgjit.tcgen05_commit(done[0])
    done[0].wait()
    c[0:128, 0:128] = acc.load()


def test_views_feed_tcgen05():
    a, b = torch.randn(128, 192, dtype=BF16), torch.randn(192, 128, dtype=BF16)
    c = poisoned(128, 128)
    tcgen05_on_views.interpret[(1,)](a, b, c, K=192)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-5, atol=1e-4)
    compiled = tcgen05_on_views.compile(a, b, c, K=192, target="sm_100a")
    assert compiled.spills == 0 and "tcgen05.mma.cta_group::1.kind::f16" in compiled.ptx


@mgjit.kernel
def stores_into_views(x, out):
    """Rows, column blocks and stages of tiles written from registers and read back whole."""
    t = mgjit.smem((64, 128), x.dtype, swizzle=128)
    u = mgjit.smem((64, 128), x.dtype)
    s = mgjit.smem((3, 16, 128), x.dtype, swizzle=128)
    for h in mgjit.static_range(2):
        t[:, h * 64:(h + 1) * 64][...] = x[mgjit.ds(0, 64), mgjit.ds(64 - h * 64, 64)]  # the halves swapped
    u[...] = mgjit.zeros((64, 128), x.dtype)
    u[8:40, 32:64][...] = x[mgjit.ds(0, 32), mgjit.ds(0, 32)]
    s[1:3][...] = mgjit.zeros((2, 16, 128), x.dtype) + 1.0
    s[0, 8:16][...] = x[mgjit.ds(0, 8), mgjit.ds(0, 128)]
    out[mgjit.ds(0, 64), mgjit.ds(0, 128)] = t[...]
    out[mgjit.ds(64, 64), mgjit.ds(0, 128)] = u[...]
    out[mgjit.ds(128, 8), mgjit.ds(0, 128)] = s[0, 8:16][...] + s[2][0:8][...]


def test_stores_into_views_land_where_reads_find_them():
    x = torch.randn(64, 128, dtype=BF16)
    out = poisoned(136, 128, dtype=BF16)
    stores_into_views.interpret[(1,)](x, out)
    want = torch.zeros(136, 128, dtype=BF16)
    want[:64] = torch.cat([x[:, 64:], x[:, :64]], dim=1)
    want[64 + 8:64 + 40, 32:64] = x[:32, :32]
    want[128:136] = x[:8] + 1.0
    assert torch.equal(out, want)
    assert stores_into_views.compile(x, out, target="sm_90a").spills == 0


# ---------------------------------------------------------------------------------------------- read barriers

@mgjit.kernel
def staged_once_read_often(x, out, n):
    buf = mgjit.smem((2, 256), mgjit.float32)
    buf[0][...] = x[mgjit.ds(0, 256)]
    buf[1][...] = x[mgjit.ds(256, 256)] * 2.0
    acc = buf[0][...]
    for k in mgjit.static_range(1, 2):
        acc = acc + buf[k][...]
    for i in range(n):
        acc = acc + buf[0][...]
    for i in range(n):
        acc = acc - buf[1][...]
    out[mgjit.ds(0, 256)] = acc


@mgjit.kernel
def restaged_every_iteration(x, out, n):
    buf = mgjit.smem((256,), mgjit.float32)
    acc = x[mgjit.ds(0, 256)]
    for i in range(n):
        buf[...] = acc
        acc = buf[...] + 1.0
    out[mgjit.ds(0, 256)] = acc


@mgjit.kernel
def staged_in_a_branch(x, out, n):
    buf = mgjit.smem((64,), mgjit.float32)
    buf[...] = x[mgjit.ds(0, 64)]
    acc = buf[...]
    if n > 0:
        buf[...] = acc * 3.0
    out[mgjit.ds(0, 64)] = buf[...] + acc


@mgjit.kernel
def line_rewritten(x, out):
    buf = mgjit.smem((4, 256), mgjit.float32)
    buf[...] = x[mgjit.ds(0, 4), mgjit.ds(0, 256)]
    buf[mgjit.ds(1, 1), :][...] = x[mgjit.ds(4, 1), mgjit.ds(0, 256)] * 2.0
    out[mgjit.ds(0, 4), mgjit.ds(0, 256)] = buf[...]


@mgjit.kernel
def head_then_tail(x, out):
    buf = mgjit.smem((4, 256), mgjit.float32)
    buf[...] = x[mgjit.ds(0, 4), mgjit.ds(0, 256)]
    head = buf[mgjit.ds(0, 1), :]
    head[...] = head[...] + 1.0
    out[mgjit.ds(0, 2), mgjit.ds(0, 256)] = buf[mgjit.ds(2, 2), :][...]


@mgjit.kernel
def two_buffers(x, out):
    a = mgjit.smem((4, 256), mgjit.float32)
    b = mgjit.smem((4, 256), mgjit.float32)
    b[...] = x[mgjit.ds(0, 4), mgjit.ds(0, 256)]
    v = b[...]
    a[...] = v * 3.0
    out[mgjit.ds(0, 4), mgjit.ds(0, 256)] = b[...] + v


@mgjit.kernel
def chunks_in_groups(x, out, n):
    buf = mgjit.smem((8, 256), mgjit.float32)
    for g in range(n):
        for j in mgjit.static_range(4):
            buf[g * 4 + j][...] = x[mgjit.ds((g * 4 + j) * 256, 256)]
    acc = buf[0][...]
    for k in mgjit.static_range(1, 8):
        acc = acc + buf[k][...] * (k + 1.0)
    out[mgjit.ds(0, 256)] = acc


def loop_bodies(ptx: str) -> list[list[str]]:
    """The lines of each loop of a PTX listing: from a label to the branch back to it."""
    lines = ptx.splitlines()
    labels = {line.strip()[:-1]: i for i, line in enumerate(lines) if line.strip().endswith(":")}
    bodies = []
    for i, line in enumerate(lines):
        target = line.split("bra")[-1].strip(" ;.uni\t") if "bra" in line else None
        if target in labels and labels[target] < i:
            bodies.append(lines[labels[target]:i])
    return bodies


def test_a_warpgroup_meets_before_a_tile_read_only_where_a_store_may_precede_it():
    """An SMEM read into registers needs a warpgroup barrier (bar.sync 1+wg, 128) only where one of the
    warpgroup's threads may have stored to SMEM since the warpgroup last met, and a store only where one may have
    read its buffer in another tile or layout, or in a layout whose elements two threads hold. A segment staged
    once and read in loops (the row examples' chunked rows) meets once, before the first read, not in every loop;
    a loop that stores before each read meets in its body; a store in a branch makes the read after the branch
    meet, and meets before it (two warps hold each element of a 64-wide f32 array, one to a thread: one's store
    raced the other's read). Each kernel also runs under the interpreter against torch, and from its PTX on the
    simulator, which reports a read or store that no bar.sync orders after another warp's store or read."""
    x = torch.randn(512)
    once = staged_once_read_often.compile(x, x, 5, target="sm_90a").ptx
    assert once.count("bar.sync") == 1
    assert loop_bodies(once) and not any("bar.sync" in "".join(b) for b in loop_bodies(once))
    every = restaged_every_iteration.compile(x, x, 5, target="sm_90a").ptx
    assert loop_bodies(every) and all("bar.sync" in "".join(b) for b in loop_bodies(every))
    branch = staged_in_a_branch.compile(x, x, 5, target="sm_90a").ptx
    assert branch.count("bar.sync") == 3  # after the first store, before and after the branch's store
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ptx_sim
    for n in (0, 3):
        for kernel, want in ((staged_once_read_often, x[:256] + 2 * x[256:] + n * (x[:256] - 2 * x[256:])),
                             (restaged_every_iteration, x[:256] + n),
                             (staged_in_a_branch, x[:64] * (4.0 if n > 0 else 2.0))):
            out = torch.full((256,), float("nan"))
            kernel.interpret[(1,)](x, out, n)
            torch.testing.assert_close(out[:len(want)], want)
            assert out[len(want):].isnan().all()
            dev = ptx_sim.Device()
            simulated = torch.full((256,), float("nan"))
            dev.place(x)
            dev.place(simulated)
            dev.run(kernel.compile(x, simulated, n, target="sm_90a"), (1,), x, simulated, n)
            assert torch.equal(dev.fetch(simulated)[:len(want)], out[:len(want)]), kernel.name


def test_a_warpgroup_meets_where_accesses_may_touch_one_element():
    """The barriers the lowering places between a warpgroup's SMEM accesses (`Context.smem_read_barrier`,
    `smem_write_barrier`) tell apart what cannot touch one element: a store of a tile's row in another layout than
    the tile's whole store meets first (the later store might land first: a stash written whole, then its edge
    lines again), where it met only before the read; a read of rows no thread stored since the warpgroup met (a
    row's tail after its head was filled: static slices of one view whose ranges do not meet) and a read of a
    buffer after a store to another meet nothing. Interpreted against torch, and run from the PTX on the
    simulator, which reports a read or store that no bar.sync orders after another warp's store or read."""
    x, want = torch.randn(5, 256), {}
    want["line_rewritten"] = torch.cat([x[:1], x[4:5] * 2, x[2:4], torch.full((1, 256), float("nan"))])
    want["head_then_tail"] = torch.cat([x[2:4], torch.full((3, 256), float("nan"))])
    want["two_buffers"] = torch.cat([x[:4] * 2, torch.full((1, 256), float("nan"))])
    barriers = {"line_rewritten": 2, "head_then_tail": 1, "two_buffers": 1}  # before: 1 (the race), 2, 2
    for kernel in (line_rewritten, head_then_tail, two_buffers):
        out = torch.full((5, 256), float("nan"))
        kernel.interpret[(1,)](x, out)
        torch.testing.assert_close(out, want[kernel.name], equal_nan=True)
        compiled = kernel.compile(x, out, target="sm_90a")
        assert compiled.ptx.count("bar.sync") == barriers[kernel.name], kernel.name
        dev = ptx_sim.Device()
        simulated = torch.full((5, 256), float("nan"))
        dev.place(x)
        dev.place(simulated)
        dev.run(compiled, (1,), x, simulated)
        torch.testing.assert_close(dev.fetch(simulated), want[kernel.name], equal_nan=True)


def test_chunks_staged_in_groups_meet_once():
    """Chunks of a row staged in groups (`buf[g * 4 + j]` in a loop over g, examples/_rows.py `stage`), all in one
    layout: two stages of one buffer coincide or share no element, so the stores meet nothing (a group's four
    met before each when the lowering first checked stores against stores); the reads after meet once."""
    x = torch.randn(2048)
    want = sum(x[k * 256:(k + 1) * 256] * (k + 1.0) for k in range(8))
    out = torch.full((256,), float("nan"))
    chunks_in_groups.interpret[(1,)](x, out, 2)
    torch.testing.assert_close(out, want)
    compiled = chunks_in_groups.compile(x, out, 2, target="sm_90a")
    assert compiled.ptx.count("bar.sync") == 1
    dev = ptx_sim.Device()
    simulated = torch.full((256,), float("nan"))
    dev.place(x)
    dev.place(simulated)
    dev.run(compiled, (1,), x, simulated, 2)
    torch.testing.assert_close(dev.fetch(simulated), want)


@mgjit.kernel
def weighted_rows(x, w, out, shift, N: mgjit.constexpr):
    xs, ws = mgjit.smem((4, N), x.dtype), mgjit.smem((4, N), mgjit.float32)
    xs[...] = x[mgjit.ds(0, 4), mgjit.ds(0, N)]
    ws[...] = w[mgjit.ds(0, 4), mgjit.ds(0, N)]
    v = xs[...].astype(mgjit.float32) - 1.0
    if shift > 0:  # read again: the product's row comes through the if's branches
        v = xs[...].astype(mgjit.float32) + shift
    out[mgjit.ds(0, 4), mgjit.ds(0, N)] = (v * ws[...]).astype(out.dtype)


@pytest.mark.parametrize("shift", [0.0, 2.5])
def test_a_float32_read_beside_bf16_rows_takes_their_common_layout_without_conflicts(shift):
    """bf16 rows and float32 weights, both read from unswizzled tiles and multiplied: in the rows' coalesced
    layout (16 bytes of bf16 a lane) each lane would read 32 bytes of the weights, two-way conflicts (piped
    layernorm with float32 weights ran 0.75 of copy bandwidth for 0.85 without); inference places the rows' reads,
    through both branches of the if, in 16 bytes of float32 a lane instead (8 bytes of bf16). No warning, and the
    numbers hold (interpreter, PTX)."""
    n = 512
    x, w = torch.randn(4, n).to(BF16), torch.randn(4, n)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mgjit.BankConflictWarning)
        c = weighted_rows.compile(x, w, torch.empty(4, n, dtype=BF16), shift, N=n, target="sm_90a")
    assert "bank_conflict" not in c.ir
    assert "ld.shared.v2.b32" in c.ptx and "ld.shared.v4.b32" in c.ptx  # 8 bytes of bf16, 16 of float32 a lane
    ref = ((x.float() + shift if shift > 0 else x.float() - 1.0) * w).to(BF16)
    out = torch.full((4, n), float("nan"), dtype=BF16)
    weighted_rows.interpret[(1,)](x, w, out, shift, N=n)
    assert torch.equal(out, ref)
    dev = ptx_sim.Device()
    out.fill_(float("nan"))
    dev.run(c, (1,), x, w, out, shift)
    assert torch.equal(dev.fetch(out), ref)

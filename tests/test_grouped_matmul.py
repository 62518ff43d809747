"""The grouped (mixture-of-experts) GEMM on the CPU (examples/grouped_matmul.py): its group table, the product
interpreted against torch._grouped_mm and a float32 reference on ragged groups (empty ones too), both weight
layouts, fp8 with rowwise scales; the device-built TMA descriptor that stops each store at its group's end
(mgjit.tma_bounded, ops/tma.py); ptxas with no spills."""
import os
import sys

import pytest
import torch

import mgjit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import grouped_matmul as gm  # noqa: E402

BF16 = torch.bfloat16


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")


def groups(sizes, k, n, dtype=BF16, layout="k"):
    sizes = torch.tensor(sizes)
    offs = sizes.cumsum(0).to(torch.int32)
    x = torch.randn(int(sizes.sum()), k).to(dtype)
    w = torch.randn(len(sizes), n, k).to(dtype).transpose(1, 2) if layout == "k" else \
        torch.randn(len(sizes), k, n).to(dtype)
    return x, w, offs


def rel_err(out, ref):
    assert not out.isnan().any(), "some of the poisoned output was never written"
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def group_table(offs, rows, length=256):
    table, count = torch.full((3, length), -7, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    gm.group_tiles.interpret[(1,)](offs, rows, table[0], table[1], table[2], count, BM=64, GROUPS=16)
    assert (table[0, count.item():] == -1).all()
    return [tuple(table[:, r].tolist()) for r in range(count.item())]


def test_the_group_table(interpreted):
    offs = torch.tensor([0, 130, 130, 131, 400, 400], dtype=torch.int32)  # sizes 0, 130, 0, 1, 269, 0
    tiles = [(1, 0, 130), (1, 64, 130), (1, 128, 130), (3, 130, 131)] + [(4, 131 + 64 * i, 400) for i in range(5)]
    assert group_table(offs, 400) == tiles


def test_offs_that_are_not_cumulative_row_ends_give_no_tile_past_x(interpreted):
    """offs are on the device, unchecked: each group's rows are clamped to x's (none where its end is below its
    start), and the tile count to the table's length, so that garbage offs give no tile past x (its store would
    land past c's rows) and no read past the table."""
    offs = torch.tensor([100, 60, 900, -5, 300], dtype=torch.int32)  # over 250 rows
    assert group_table(offs, 250) == [(0, 0, 100), (0, 64, 100), (2, 60, 250), (2, 124, 250), (2, 188, 250)] + \
        [(4, 64 * i, 250) for i in range(4)]
    up_and_down = torch.tensor([250, 0] * 8, dtype=torch.int32)  # 8 groups of all 250 rows: 32 tiles
    tiles = group_table(up_and_down, 250, length=16)
    assert len(tiles) == 16 and all(0 <= row < end <= 250 for _, row, end in tiles)


def test_an_empty_dimension_launches_nothing(interpreted):
    """N or K of 0 (K: TMA descriptors of no bytes; N: a reshape of no elements) failed; no rows, no columns or
    sums of nothing now give zeros of (M, N) without a launch."""
    for m, k, n in ((0, 64, 64), (64, 64, 0), (64, 0, 64)):
        x, w = torch.randn(m, k, dtype=BF16), torch.randn(2, n, k, dtype=BF16).transpose(1, 2)
        out, launches = gm.grouped_launches(x, w, torch.tensor([m // 2, m], dtype=torch.int32))
        assert launches == [] and out.shape == (m, n) and not out.any()
        assert gm.grouped_matmul(x, w, torch.tensor([m // 2, m], dtype=torch.int32)).shape == (m, n)


def test_grouped_matmul_refuses_offs_of_another_dtype_by_name():
    x, w, offs = groups([3, 5], 64, 64)
    with pytest.raises(ValueError, match="offs as int32"):
        gm.grouped_matmul(x, w, offs.long())
    # operands wgmma does not multiply failed to compile deep in the kernel; mixed dtypes too
    with pytest.raises(TypeError, match="grouped_matmul multiplies bfloat16, .* got x of torch.int16"):
        gm.grouped_matmul(x.to(torch.int16), w.to(torch.int16), offs)
    with pytest.raises(TypeError, match="x and w of one dtype, got torch.bfloat16 and torch.float16"):
        gm.grouped_matmul(x, w.half(), offs)


def test_matmul_refuses_operands_wgmma_does_not_multiply():
    """int8 operands were taken for fp8 by their size; float64 was told to be K-major."""
    import matmul_hopper as mh
    a = torch.ones(64, 64)
    for dtype in (torch.int8, torch.float64):
        with pytest.raises(TypeError, match=f"matmul multiplies bfloat16, .* got a of {dtype}"):
            mh.matmul(a.to(dtype), a.to(dtype).T, b_kmajor=True)


@pytest.mark.parametrize("sizes,k,n,layout,config", [
    ([0, 70, 33, 0, 150, 1, 0], 192, 136, "k", dict(BN=128)),
    ([0, 70, 33, 0, 150, 1, 0], 192, 136, "n", dict(BN=128)),
    ([64, 0, 129, 5], 128, 256, "k", dict(BN=256, STAGES=2)),
    ([3, 0, 0, 61, 64, 2, 200], 64, 128, "k", dict(BM=64, BN=64)),
    ([0, 200, 17], 136, 256, "n", dict(BM=192, BN=256)),  # the default 3 stages did not fit beside the epilogue
    ([0, 0, 0], 64, 64, "k", {})], ids=["ragged-kmajor", "ragged-nmajor", "bn256", "bm64", "bm192-bn256", "all-empty"])
def test_grouped_bf16_matches_torch(sizes, k, n, layout, config, interpreted):
    x, w, offs = groups(sizes, k, n, layout=layout)
    out = gm.grouped_matmul(x, w, offs, config=config)
    assert out.shape == (x.shape[0], n)
    if x.shape[0]:
        ref = torch._grouped_mm(x, w, offs=offs)
        assert rel_err(out, gm.reference(x, w, offs)) < 5e-3
        assert rel_err(out, ref.float()) < 5e-3


@pytest.mark.parametrize("config,message", [
    (dict(BM=100, BN=64), "BM is 64, 128 or 192.*got 100"),  # ran, and left rows of each tile unwritten
    (dict(BN=32), "BN is 64, 128, 192 or 256.*got 32"),  # failed in the epilogue tile's swizzle
    (dict(BN=128, STAGES=1), "STAGES is at least 2"),  # deadlocks
    (dict(BN=128, GROUP_M=0), "GROUP_M .* at least 1, got 0")])
def test_configs_the_kernel_cannot_run_are_refused_by_name(config, message, interpreted):
    x, w, offs = groups([130, 0, 50], 136, 136)
    with pytest.raises(mgjit.CompileError, match=message):
        gm.grouped_matmul(x, w, offs, config=config)


def test_grouped_fp8_with_rowwise_scales(interpreted):
    x, w, offs = groups([40, 0, 100, 7], 256, 128, dtype=torch.float8_e4m3fn)
    scale_x, scale_w = torch.rand(x.shape[0]) + 0.5, torch.rand(4, 128) + 0.5
    out = gm.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w, config=dict(BN=128))
    assert out.dtype == BF16 and rel_err(out, gm.reference(x, w, offs, scale_x, scale_w)) < 5e-3


@mgjit.kernel
def bounded_store(x, y, ends, descs, BM: mgjit.constexpr, BN: mgjit.constexpr, SLOT: mgjit.constexpr):
    pid = mgjit.program_id(0)
    t = mgjit.smem((BM, BN), y.dtype, swizzle=128)
    t[...] = x[mgjit.ds(pid * BM, BM), mgjit.ds(0, BN)]
    mgjit.store_async(mgjit.tma_bounded(y, (ends[pid], None), descs, pid + SLOT), (pid * BM, 0), t)
    mgjit.store_async_wait(0)


def test_a_bounded_store_stops_at_its_rows():
    x = torch.randn(256, 64, dtype=BF16)
    y = torch.full((256, 64), float("nan"), dtype=BF16)
    ends = torch.tensor([50, 200, 256, 0], dtype=torch.int32)
    bounded_store.interpret[(4,)](x, y, ends, torch.zeros(512, dtype=torch.uint8), BM=64, BN=64, SLOT=0)
    written = ~y.isnan().all(dim=1)
    assert written.tolist() == [r < 50 or 64 <= r < 192 for r in range(256)]  # CTA 3 may store no row
    assert torch.equal(y[written], x[written])


def test_a_descriptor_slot_past_the_tensor_is_an_error():
    x, y = torch.randn(128, 64, dtype=BF16), torch.zeros(128, 64, dtype=BF16)
    with pytest.raises(mgjit.InterpretError) as info:
        bounded_store.interpret[(2,)](x, y, torch.tensor([64, 64], dtype=torch.int32),
                                      torch.zeros(256, dtype=torch.uint8), BM=64, BN=64, SLOT=1)
    assert info.value.check == "out-of-bounds" and "descriptor slot 2 of a 256-byte tensor" in str(info.value)


def test_the_bounded_store_builds_its_descriptor_on_the_device():
    x, y = torch.empty(256, 64, dtype=BF16), torch.empty(256, 64, dtype=BF16)
    ptx = bounded_store.compile(x, y, torch.empty(4, dtype=torch.int32), torch.empty(512, dtype=torch.uint8), BM=64,
                                BN=64, SLOT=0, target="sm_90a").ptx
    for instr in ("tensormap.replace.tile.global_dim.global.b1024.b32", "fence.proxy.tensormap::generic.release.gpu",
                  "fence.proxy.tensormap::generic.acquire.gpu", "cp.async.bulk.wait_group 0", "trap"):
        assert instr in ptx, instr


@pytest.mark.parametrize("dtype,config", [(BF16, dict(BN=256, BK=64, STAGES=3)), (BF16, dict(BN=128, BK=64, STAGES=4)),
                                          (torch.float8_e4m3fn, dict(BN=256, BK=128, STAGES=3, SCALED=True))],
                         ids=["bf16-256", "bf16-128", "fp8-256"])
def test_ptxas_reports_no_spills(dtype, config):
    x, w = torch.empty(4096, 1024, dtype=dtype), torch.empty(8 * 2048, 1024, dtype=dtype)
    out, i32 = torch.empty(4096, 2048, dtype=BF16), torch.empty(640, dtype=torch.int32)
    c = gm.grouped_matmul_kernel.compile(x, w, out, torch.empty(4096), torch.empty(8, 2048), i32, i32, i32, i32,
                                         torch.empty(2048, dtype=torch.uint8), N=2048, BM=128, GROUP_M=8, **config,
                                         target="sm_90a")
    assert c.spills == 0, c.ptxas_report
    table = gm.group_tiles.compile(torch.empty(128, dtype=torch.int32), 4096, i32, i32, i32, i32, BM=128,
                                   GROUPS=128, target="sm_90a")
    assert table.spills == 0, table.ptxas_report


def test_the_example_runs_as_a_script_without_a_gpu():
    """Without a GPU, examples/grouped_matmul.py compiles its kernel for sm_90a and prints it."""
    import re
    import subprocess
    run = subprocess.run([sys.executable, os.path.join(os.path.dirname(gm.__file__), "grouped_matmul.py")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert re.search(r"CompiledKernel\(grouped_matmul_kernel, sm_90a, registers=\d+, spills=0, ", run.stdout), run.stdout


@pytest.mark.parametrize("n,bn", [(64, 128), (128, 128), (640, 128), (768, 256), (1408, 256), (1536, 256),
                                  (4096, 256), (14336, 256), (4224, 256), (384, 128)])
def test_column_tile_is_256_unless_it_pads_an_eighth_more(n, bn):
    assert gm.column_tile(n) == bn

"""GPU: every schedule of the Hopper matmul (examples/matmul_hopper.py) against torch on fresh random inputs with
poisoned outputs, on the awkward shapes the schedules exist for: M = 1, 3, 16 (swap-AB), K-heavy (stream-K,
split-K), fewer tiles than SMs, ragged edges, transposed and strided operands, f16, fp8; and the schedule the
wrapper picks by itself (heuristics + timing) on each shape class."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import matmul_hopper as mh  # noqa: E402


def operands(m, n, k, dtype=torch.bfloat16, a_layout="row", b_layout="row"):
    if a_layout == "t":
        a = torch.randn(k, m, device="cuda", dtype=dtype).t()
    elif a_layout == "strided":
        a = torch.randn(m, 2 * k + 64, device="cuda", dtype=dtype)[:, 64:64 + k]
    else:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype).t() if b_layout == "t" else \
        torch.randn(k, n, device="cuda", dtype=dtype)
    return a, b


def check(c, ref, tol=1e-2):
    assert not c.isnan().any(), "some of the output was never written"
    assert ((c.double() - ref.double()).norm() / ref.double().norm()).item() < tol


SHAPES = [(1, 4096, 4096), (3, 4096, 4096), (16, 8192, 1024), (64, 1000, 2000), (77, 3000, 333),
          (1000, 3000, 2000), (1024, 1024, 16384), (256, 256, 65536), (512, 512, 512), (4097, 4095, 333),
          (128, 8192, 8192)]
CONFIGS = {
    "dp-128x256": dict(BM=128, BN=256), "dp-128x128": dict(BM=128, BN=128), "dp-64x128": dict(BM=64, BN=128),
    "dp-64x32": dict(BM=64, BN=32), "dp-192x192": dict(BM=192, BN=192),
    "multicast-b-192x128-stream-k": dict(BM=192, BN=128, STREAM_K=1, MULTICAST="b"),
    "stream-k-1": dict(BM=128, BN=256, STREAM_K=1), "stream-k-2": dict(BM=128, BN=128, STREAM_K=2),
    "stream-k-atomic": dict(BM=128, BN=128, STREAM_K=1, DETERMINISTIC=False),
    "split-k-4": dict(BM=128, BN=128, STREAM_K=1, SPLIT=4), "stream-k-m64": dict(BM=64, BN=256, STREAM_K=1),
    "swap-128": dict(SWAP_AB=True, BM=128, STREAM_K=1), "swap-64": dict(SWAP_AB=True, BM=64, STREAM_K=1),
    "swap-dp-64": dict(SWAP_AB=True, BM=64), "swap-dp-128": dict(SWAP_AB=True, BM=128),
    "multicast-b-128x192": dict(BM=128, BN=192, MULTICAST="b"),
    "multicast-b-128x256": dict(BM=128, BN=256, MULTICAST="b"),
    "multicast-a-128x128": dict(BM=128, BN=128, MULTICAST="a"), "multicast-b-64x128": dict(BM=64, BN=128, MULTICAST="b"),
    "multicast-b-split-k-4": dict(BM=128, BN=128, STREAM_K=1, SPLIT=4, MULTICAST="b"),
    "multicast-a-stream-k": dict(BM=128, BN=64, STREAM_K=1, MULTICAST="a"),
    "multicast-a-split-k-2": dict(BM=128, BN=128, STREAM_K=1, SPLIT=2, MULTICAST="a"),
}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_schedule_against_torch(m, n, k, config, poison_empty):
    cfg = dict(CONFIGS[config])
    if cfg.get("SWAP_AB"):
        if m > 256:
            pytest.skip("swap-AB puts M on the wgmma's N: at most 256")
        cfg["BN"] = -(-m // 8) * 8
    a, b = operands(m, n, k)
    check(mh.matmul(a, b, cfg), a.float() @ b.float())


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("layouts", [{}, {"a_layout": "t"}, {"b_layout": "t"}, {"a_layout": "strided"}],
                         ids=["rows", "a-transposed", "b-transposed", "a-strided"])
def test_the_wrapper_picks_a_correct_schedule(m, n, k, layouts, poison_empty):
    a, b = operands(m, n, k, **layouts)
    check(mh.matmul(a, b), a.float() @ b.float())


@pytest.mark.parametrize("multicast", ["b", "a"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("layouts", [{}, {"a_layout": "t"}, {"b_layout": "t"}, {"a_layout": "strided"}],
                         ids=["rows", "a-transposed", "b-transposed", "a-strided"])
@pytest.mark.parametrize("m,n,k", [(1000, 3000, 2000), (1152, 1000, 136), (4097, 4095, 333), (640, 4224, 512)])
def test_multicast_on_ragged_shapes(m, n, k, layouts, dtype, multicast, poison_empty):
    """Clusters of two sharing B (or A) on tiles that do not divide M, N, K; an odd number of row tiles for B
    (column tiles for A) so that a pair's second tile lies wholly outside (1152 = 9 x 128 rows, 4224 = 33 x 128
    columns); K of 3 k-steps, fewer than the stages; pairs of a persistent grid with several items each."""
    a, b = operands(m, n, k, dtype=dtype, **layouts)
    check(mh.matmul(a, b, dict(BM=128, BN=192 if multicast == "b" else 128, MULTICAST=multicast)),
          a.float() @ b.float())


CLUSTER4_CONFIGS = {
    "swap-b": dict(SWAP_AB=True, BM=64, MULTICAST="b", CLUSTER=4),
    "swap-b-128-stream-k": dict(SWAP_AB=True, BM=128, STREAM_K=1, MULTICAST="b", CLUSTER=4),
    "swap-b-split-k-3": dict(SWAP_AB=True, BM=64, STREAM_K=1, SPLIT=3, MULTICAST="b", CLUSTER=4),
    "b-128x128": dict(BM=128, BN=128, MULTICAST="b", CLUSTER=4),
    "a-split-k-2": dict(BM=128, BN=64, STREAM_K=1, SPLIT=2, MULTICAST="a", CLUSTER=4),
}


@pytest.mark.parametrize("config", CLUSTER4_CONFIGS)
@pytest.mark.parametrize("layouts", [{}, {"b_layout": "t"}, {"a_layout": "strided"}],
                         ids=["rows", "b-transposed", "a-strided"])
@pytest.mark.parametrize("m,n,k", [(90, 3000, 2000), (160, 4160, 520), (1152, 1000, 136)])
def test_clusters_of_four_on_ragged_shapes(m, n, k, layouts, config, poison_empty):
    """Clusters of four sharing B (swapped: the activations, M rounded up to 32 columns, a multicast part of 8
    rows or more a CTA) or A, on tiles that do not divide M, N, K: an item's last tiles past M or N (3000 weight
    rows are 47 tiles of 64, 12 items of 4), K of 3 k-steps, fewer than the stages."""
    cfg = dict(CLUSTER4_CONFIGS[config])
    if cfg.get("SWAP_AB"):
        if m > 256:
            pytest.skip("swap-AB puts M on the wgmma's N: at most 256")
        cfg["BN"] = -(-m // 32) * 32
    a, b = operands(m, n, k, **layouts)
    check(mh.matmul(a, b, cfg), a.float() @ b.float())


@pytest.mark.parametrize("config", [dict(BM=128, BN=160), dict(BM=128, BN=224), dict(BM=192, BN=144),
                                    dict(BM=128, BN=208)], ids=["128x160", "128x224", "192x144", "128x208"])
@pytest.mark.parametrize("m,n,k", [(1024, 4936, 5376), (3000, 1120, 1792), (777, 1234, 333)])
@pytest.mark.parametrize("b_layout", ["t", "row"], ids=["b-kmajor", "b-nmajor"])
def test_tiles_fitted_to_a_wave(m, n, k, config, b_layout, poison_empty):
    """The widths `wave_fitted` offers a K-major B (examples/_matmul_schedules.py), ragged edges included: 32-column
    epilogue chunks (160, 224), stores from registers (144, 208); an N-major B tile of 160 or 224 columns in 64B
    swizzle rows (explicit configs only: slower than the usual tiles)."""
    if b_layout == "row" and config["BN"] % 32:
        pytest.skip("an N-major B tile is a multiple of 32 columns")
    a, b = operands(m, n, k, b_layout=b_layout)
    check(mh.matmul(a, b, config), a.float() @ b.float())


@pytest.mark.parametrize("m,n,k", [(3, 4096, 4096), (1000, 3000, 2000), (2048, 2048, 2048)])
def test_f16(m, n, k, poison_empty):
    a, b = operands(m, n, k, dtype=torch.float16, b_layout="t")
    check(mh.matmul(a, b), a.float() @ b.float())


@pytest.mark.parametrize("m,n,k", [(3, 4096, 4096), (1000, 3000, 2048), (1024, 1024, 16384)])
def test_fp8_schedules(m, n, k):
    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    scale = torch.tensor([0.25], device="cuda")
    check(mh.matmul(a, w, scale=scale, b_kmajor=True), (a.float() @ w.float().t()) * 0.25)


def test_stream_k_is_deterministic_and_atomic_fix_up_is_close():
    a, b = operands(1024, 1024, 16384)
    det = dict(BM=128, BN=128, STREAM_K=1)
    first, again = mh.matmul(a, b, det), mh.matmul(a, b, det)
    assert torch.equal(first, again)
    check(mh.matmul(a, b, {**det, "DETERMINISTIC": False}), a.float() @ b.float())


def test_epilogue_on_swapped_and_cut_tiles(poison_empty):
    a, b = operands(3, 4096, 4096)
    bias, scale = torch.randn(4096, device="cuda", dtype=torch.bfloat16), torch.tensor([0.5], device="cuda")
    ref = torch.nn.functional.gelu((a.float() @ b.float()) * 0.5 + bias.float())
    for cfg in (dict(SWAP_AB=True, BM=128, BN=8, STREAM_K=1), dict(BM=64, BN=128, STREAM_K=1)):
        check(mh.matmul(a, b, cfg, scale=scale, bias=bias, activation="gelu"), ref)

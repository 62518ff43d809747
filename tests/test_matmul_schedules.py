"""The Hopper matmul's schedules on the CPU (examples/matmul_hopper.py, examples/_matmul_schedules.py): every
schedule interpreted against torch on small awkward shapes through the wrapper (stream-K cut tiles with both
fix-ups, split-K, swap-AB for M = 1, 3, 16, M = 64 tiles, transposed and strided operands, f16, the
epilogue), the spans a profiled stream-K launch records, the heuristics' picks per shape class, and ptxas with
no spills for every kind of config."""
import os
import re
import sys

import pytest
import torch

import mgjit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import _device  # noqa: E402
import _matmul_schedules as schedules  # noqa: E402
import matmul_hopper as mh  # noqa: E402

BF16, F16 = torch.bfloat16, torch.float16


@pytest.fixture
def interpreted(monkeypatch, poison_empty):
    """The wrapper's launches run in the interpreter on a GPU of `sms` SMs (3 unless a test sets another), into
    outputs poisoned with NaN."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    sms = {"count": 3}
    monkeypatch.setattr(mh, "sm_count", lambda device: sms["count"])
    monkeypatch.setattr(_device, "_KEPT", {})
    return sms


def rel_err(out, ref):
    assert not out.isnan().any(), "some of the poisoned output was never written"
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def operands(m, n, k, dtype=BF16, a_layout="row", b_layout="row"):
    """a (m, k) and b (k, n) as the layouts say: row-major, a transposed view ("t") or a strided view."""
    a = torch.randn(k, m, dtype=dtype).t() if a_layout == "t" else (
        torch.randn(m, 2 * k + 8, dtype=dtype)[:, 8:8 + k] if a_layout == "strided" else torch.randn(m, k, dtype=dtype))
    b = torch.randn(n, k, dtype=dtype).t() if b_layout == "t" else torch.randn(k, n, dtype=dtype)
    return a, b


CASES = {  # (m, n, k, config, sms, operand layouts)
    "dp-128x256": (300, 304, 200, dict(BM=128, BN=256), 3, {}),
    "dp-m64-tile": (77, 200, 128, dict(BM=64, BN=128), 3, {}),
    # 32 columns: the N-major B tile and the epilogue tile in a 64B swizzle
    "dp-64x32": (77, 200, 192, dict(BM=64, BN=32), 5, {}),
    "dp-64x32-b-kmajor": (77, 200, 192, dict(BM=64, BN=32), 5, dict(b_layout="t")),
    "stream-k-1": (200, 136, 320, dict(BM=128, BN=128, STREAM_K=1), 3, {}),
    "stream-k-2": (300, 200, 256, dict(BM=128, BN=64, STREAM_K=2), 4, {}),
    "stream-k-atomic": (200, 136, 320, dict(BM=128, BN=128, STREAM_K=1, DETERMINISTIC=False), 3, {}),
    "split-k": (130, 128, 512, dict(BM=128, BN=128, STREAM_K=1, SPLIT=3), 8, {}),
    # 7 contributors per tile, each CTA one of them
    "split-k-7": (130, 128, 896, dict(BM=128, BN=128, STREAM_K=1, SPLIT=7), 14, {}),
    "stream-k-m64": (77, 136, 448, dict(BM=64, BN=64, STREAM_K=1), 5, {}),
    # fewer k-iterations than CTAs (77 x 3000 x 333 and 512^3 on 132 SMs): a CTA with an empty range between a
    # cut tile's contributors was expected in its lock, which never filled: the tile was never stored
    "stream-k-fewer-iterations-than-ctas": (77, 136, 200, dict(BM=128, BN=128, STREAM_K=1), 12, {}),
    "split-k-more-splits-than-iterations": (130, 128, 192, dict(BM=128, BN=128, STREAM_K=1, SPLIT=8), 16, {}),
    # M = 77 swapped: BN = 80, whose cut tiles are fixed up as 64 + 16 columns (register arrays are 2^n wide)
    "swap-m77-bn80": (77, 136, 200, dict(SWAP_AB=True, BM=64, BN=80, STREAM_K=1), 5, {}),
    # M = 33 swapped: BN = 40 (32 + 8 columns), 13 or 14 contributors a tile: partials loaded 4 (32 columns) and
    # 8 (8 columns) at a time, the last step's loads past the last contributor reading nothing
    "swap-m33-bn40-many-cuts": (33, 136, 2048, dict(SWAP_AB=True, BM=64, BN=40, STREAM_K=1), 40, {}),
    "swap-fewer-iterations-than-ctas": (16, 256, 256, dict(SWAP_AB=True, BM=64, BN=16, STREAM_K=1), 24, {}),
    "swap-m1": (1, 200, 320, dict(SWAP_AB=True, BM=128, BN=8, STREAM_K=1), 3, {}),
    "swap-m3-bm64": (3, 136, 512, dict(SWAP_AB=True, BM=64, BN=8, STREAM_K=1), 4, {}),
    "swap-m16-dp": (16, 200, 128, dict(SWAP_AB=True, BM=128, BN=16), 3, {}),
    # M = 90 swapped, one CTA a weight tile: BN = 96 (64 + 32 columns stored from registers)
    "swap-m90-bn96-dp": (90, 200, 192, dict(SWAP_AB=True, BM=64, BN=96), 4, {}),
    "swap-b-kmajor": (5, 136, 320, dict(SWAP_AB=True, BM=64, BN=8, STREAM_K=1), 3, dict(b_layout="t")),
    "swap-a-transposed": (3, 136, 128, dict(SWAP_AB=True, BM=64, BN=64), 3, dict(a_layout="t")),
    "a-transposed": (200, 136, 192, dict(BM=128, BN=128, STREAM_K=1), 3, dict(a_layout="t")),
    "a-strided-b-kmajor": (200, 136, 192, dict(BM=128, BN=128), 3, dict(a_layout="strided", b_layout="t")),
    # Multicast over clusters of two: 3 row tiles make 2 pairs, the second one's rank-1 tile wholly past M; K of
    # 3 k-steps, fewer than the stages; 4 items on 2 clusters (the ring runs on across items); 5 SMs hold 2.
    "multicast-b-odd-m": (300, 200, 136, dict(BM=128, BN=128, MULTICAST="b", STAGES=4), 5, {}),
    "multicast-b-kmajor-a-strided": (300, 136, 200, dict(BM=128, BN=64, MULTICAST="b"), 4,
                                     dict(a_layout="strided", b_layout="t")),
    "multicast-b-m64-a-transposed": (150, 136, 520, dict(BM=64, BN=128, MULTICAST="b", STAGES=3), 2,
                                     dict(a_layout="t")),
    "multicast-a-odd-n": (200, 300, 136, dict(BM=128, BN=128, MULTICAST="a"), 4, {}),
    "multicast-a-transposed-b-kmajor": (200, 136, 200, dict(BM=128, BN=64, MULTICAST="a"), 2,
                                        dict(a_layout="t", b_layout="t")),
    # Stream-K over clusters: 6 pairs on 4 clusters, 4 whole and 2 cut over the 4 (each CTA fixes up its tile);
    # split-K on pairs whose second tile is partly past N (300 columns: tiles at 0, 128 | 256, 384); atomic
    "multicast-b-stream-k": (300, 136, 520, dict(BM=128, BN=64, MULTICAST="b", STREAM_K=1), 8, {}),
    "multicast-a-split-k-odd-n": (200, 300, 640, dict(BM=128, BN=128, MULTICAST="a", STREAM_K=1, SPLIT=4), 16, {}),
    "multicast-b-stream-k-atomic": (300, 136, 520, dict(BM=64, BN=64, MULTICAST="b", STREAM_K=1,
                                                        DETERMINISTIC=False), 8, {}),
    # Clusters of four: swapped 64-row weight tiles sharing the activations (M = 90 as 96 columns, 24 rows a CTA's
    # part of the shared tile), 10 weight tiles as 3 items, the last one's last two wholly past N; stream-K over
    # clusters sharing B (5 row tiles as 2 items); split-K over clusters sharing A, 300 columns in one item
    "multicast4-b-swapped": (90, 600, 320, dict(SWAP_AB=True, BM=64, BN=96, MULTICAST="b", CLUSTER=4), 8, {}),
    "multicast4-b-stream-k": (600, 136, 520, dict(BM=128, BN=64, MULTICAST="b", CLUSTER=4, STREAM_K=1), 12,
                              dict(b_layout="t")),
    "multicast4-a-split-k": (200, 300, 640, dict(BM=128, BN=64, MULTICAST="a", CLUSTER=4, STREAM_K=1, SPLIT=2), 16,
                             {}),
    # Three consumers (192-row tiles): 500 rows make 3 tiles, the last one cut by M; stream-K over clusters
    # sharing B, a pair's second tile wholly past M
    "bm192-odd": (500, 300, 136, dict(BM=192, BN=192), 3, {}),
    "bm192-stream-k-multicast-b": (500, 136, 520, dict(BM=192, BN=128, STREAM_K=1, MULTICAST="b"), 8,
                                   dict(a_layout="t")),
    # Tiles fitted to a wave (`wave_fitted`, a K-major B): 160 columns stored in 32-column chunks (a 64B swizzle),
    # N cut inside the second tile; 144 columns on three consumers, stored from registers (no swizzle row fits)
    "wave-fitted-128x160-b-kmajor": (200, 330, 136, dict(BM=128, BN=160), 3, dict(b_layout="t")),
    "wave-fitted-192x144-b-kmajor": (250, 300, 136, dict(BM=192, BN=144), 3, dict(b_layout="t")),
    "wave-fitted-128x224-b-kmajor-a-transposed": (250, 500, 136, dict(BM=128, BN=224), 3,
                                                  dict(a_layout="t", b_layout="t")),
    # An N-major B tile of 160 or 224 columns in 64B swizzle rows (320 and 448 bytes), A transposed too
    "nmajor-64b-swizzle-128x160": (200, 330, 136, dict(BM=128, BN=160), 3, {}),
    "nmajor-64b-swizzle-128x224-a-transposed": (250, 500, 136, dict(BM=128, BN=224), 3, dict(a_layout="t")),
}


@pytest.mark.parametrize("case", CASES)
def test_every_schedule_matches_torch(case, interpreted):
    m, n, k, config, sms, layouts = CASES[case]
    interpreted["count"] = sms
    a, b = operands(m, n, k, **layouts)
    c = mh.matmul(a, b, config)
    assert c.shape == (m, n) and rel_err(c, a.float() @ b.float()) < 5e-3


def test_f16_and_the_epilogue_on_swapped_and_stream_k_tiles(interpreted):
    a, b = operands(3, 136, 320, dtype=F16)
    bias, scale = torch.randn(136, dtype=F16), torch.tensor([0.5])
    ref = torch.nn.functional.gelu((a.float() @ b.float()) * 0.5 + bias.float())
    for config in (dict(SWAP_AB=True, BM=128, BN=8, STREAM_K=1), dict(BM=64, BN=64, STREAM_K=1)):
        c = mh.matmul(a, b, config, scale=scale, bias=bias, activation="gelu")
        assert c.dtype == F16 and rel_err(c, ref) < 5e-3


def test_fp8_decode_candidates_on_more_ctas_than_iterations(interpreted):
    """fp8 with a small M (the GPU's 64 x 512 x 1024): every candidate is stream-K over fewer k-iterations than
    SMs; each must store every element."""
    interpreted["count"] = 12
    a = (torch.randn(16, 512) * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(256, 512) * 2).to(torch.float8_e4m3fn)
    scale = torch.tensor([0.125])
    ref = (a.float() @ w.float().t()) * 0.125
    problem = schedules.Problem.of(a, w, True, BF16, True, False, None)
    for config in schedules.candidates(problem, 12):
        assert rel_err(mh.matmul(a, w, config, scale=scale, b_kmajor=True), ref) < 5e-3, schedules.describe(config)


@pytest.mark.parametrize("multicast", ["b", "a"])
def test_multicast_in_f16_with_the_epilogue(multicast, interpreted):
    a, b = operands(200, 136, 260, dtype=F16, b_layout="t")
    bias, scale = torch.randn(136, dtype=F16), torch.tensor([0.5])
    ref = torch.relu((a.float() @ b.float()) * 0.5 + bias.float())
    c = mh.matmul(a, b, dict(BM=64, BN=64, MULTICAST=multicast, TMA_STORE=False), scale=scale, bias=bias,
                  activation="relu")
    assert c.dtype == F16 and rel_err(c, ref) < 5e-3


@pytest.mark.parametrize("stream_k", [0, 1], ids=["data-parallel", "split-k"])
@pytest.mark.parametrize("seed", [1, 2])
def test_multicast_under_a_random_schedule(seed, stream_k, interpreted):
    """Each CTA's producer may run ahead of the peer's consumers: a slot is refilled (by both producers' halves)
    only after the consumers of both CTAs released it, whatever the interleaving; split over K, the two CTAs of
    a cluster fix up their own tiles, whoever finishes last."""
    a, b = operands(300, 136, 200)
    problem = schedules.Problem.of(a, b, False, BF16, False, False, None)
    split = dict(STREAM_K=1, SPLIT=2) if stream_k else {}
    cfg = schedules.normalize(problem, dict(BM=128, BN=64, MULTICAST="b", STAGES=2, **split))
    plan = schedules.launch_plan(problem, cfg, 8 if stream_k else 4)
    assert plan.grid == ((8,) if stream_k else (4,)) and plan.kernel_cfg["cluster"] == (2, 1, 1)
    c = torch.full((300, 136), float("nan"), dtype=BF16)
    ws, locks = schedules.workspace(plan.kernel_cfg, plan.tiles, plan.grid, c)
    mh.matmul_kernel.interpret(policy="random", seed=seed)[plan.grid](a, b, c, c, c, ws, locks, **plan.kernel_cfg)
    assert rel_err(c, a.float() @ b.float()) < 5e-3
    if stream_k:
        assert not locks.any(), "every lock is zero again for the next launch"


def test_a_chosen_multicast_schedule_launches_again_on_its_cluster(interpreted, monkeypatch, tmp_path):
    """A call whose key was seen before launches what the first call chose (`_Prepared`): for a multicast
    schedule, on clusters of two."""
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(schedules, "TIMER", InterpretedTimer())  # the last candidate timed is the fastest
    monkeypatch.setattr(schedules, "_CHOSEN", {})
    monkeypatch.setattr(schedules, "_TIMED", {})
    monkeypatch.setattr(mh, "_PREPARED", {})
    problem_configs = [dict(BM=128, BN=64), dict(BM=128, BN=64, MULTICAST="b")]
    monkeypatch.setattr(schedules, "candidates", lambda problem, sms: [schedules.normalize(problem, c)
                                                                       for c in problem_configs])
    a, b = operands(300, 136, 200)
    first = mh.matmul(a, b)
    assert schedules.chosen(a, b)["MULTICAST"] == "b"
    (prepared,) = mh._PREPARED.values()
    assert prepared.cluster == (2, 1, 1)
    a2, b2 = operands(300, 136, 200)
    again = mh.matmul(a2, b2)
    assert rel_err(first, a.float() @ b.float()) < 5e-3 and rel_err(again, a2.float() @ b2.float()) < 5e-3


@pytest.mark.parametrize("dtype", [F16, torch.float8_e4m3fn, torch.float32], ids=["f16", "fp8", "tf32"])
def test_the_m_65_to_256_candidates_in_every_operand_type(dtype, interpreted):
    """The swapped candidates of M of 65 to 256 (64-row weight tiles shared by clusters of four, data-parallel and
    stream-K; 128-row ones unshared) in f16, fp8 and tf32 (K-major weights): 20 weight tiles on 4 SMs, a partial
    last wave, M = 100 as 128 columns."""
    interpreted["count"] = 4
    m, n, k = 100, 1280, 256
    a = (torch.randn(m, k) * 2).to(dtype)
    w = (torch.randn(n, k) * 2).to(dtype)
    out = dtype if dtype.itemsize == 2 else BF16
    problem = schedules.Problem.of(a, w, True, out, False, False, None)
    configs = [o for o in schedules.candidates(problem, 4)
               if o["SWAP_AB"] and (o.get("CLUSTER") == 4 or o["BM"] == 128)]
    assert len(configs) == 3, [schedules.describe(o) for o in configs]
    ref = a.double() @ w.double().t()
    for config in configs:
        c = mh.matmul(a, w, config, b_kmajor=True, out_dtype=out)
        assert rel_err(c, ref) < 5e-3, schedules.describe(config)


def test_multicast_refuses_a_cluster_of_one():
    x = torch.empty(256, 256, dtype=BF16)
    cfg = dict(BM=128, BN=128, BK=64, STAGES=2, GROUP_M=8, MULTICAST="b", num_warpgroups=3)
    with pytest.raises(mgjit.CompileError, match="cluster"):
        mh.matmul_kernel.compile(x, x, x, x, x, x, x, **cfg, target="sm_90a")


@pytest.mark.parametrize("config,b_layout,message", [
    (dict(BM=100, BN=128), "row", "BM is 64, 128 or 192.*got 100"),  # ran, rows 64-99 of each tile never stored
    (dict(BM=256, BN=128), "row", "BM is 64, 128 or 192.*got 256"),  # the launch refused 5 warpgroups
    (dict(BM=128, BN=128, GROUP_M=0), "row", "GROUP_M .* at least 1, got 0"),  # divided by zero
    (dict(BM=128, BN=128, STAGES=1), "row", "STAGES is at least 2.*got 1"),  # deadlocked: a hang on a GPU
    (dict(BM=128, BN=128, STAGES=1, STREAM_K=1, SPLIT=3), "t", "STAGES is at least 2"),
    (dict(BM=128, BN=100), "t", "BN is a multiple of 8 from 8 to 256.*got 100"),
    (dict(BM=128, BN=144), "row", r"N-major B tile's rows \(144 columns\)"),  # failed in the SMEM allocation
    (dict(BM=192, BN=40), "row", r"N-major B tile's rows \(40 columns\)"),
    (dict(BM=128, BN=40, TMA_STORE=True), "t", "epilogue chunk's rows \\(EPILOGUE_N = 40 columns\\)")])
def test_configs_the_kernel_cannot_run_are_refused_by_name(config, b_layout, message, interpreted):
    """An explicit config (an autotuning sweep's, a caller's) that the kernel cannot run as asked is refused at
    compile time, naming the key and its value, where it ran wrong, divided by zero, deadlocked or failed deep in
    the SMEM allocation; the same tile widths where they can run compute what torch does."""
    a, b = operands(200, 320, 136, b_layout=b_layout)
    with pytest.raises(mgjit.CompileError, match=message):
        mh.matmul(a, b, config)


def test_the_narrow_widths_that_can_run_do(interpreted):
    """N-major B tiles of 16 and 32 columns (32- and 64-byte swizzle rows), and 40 columns of a K-major B, whose
    epilogue chunk no swizzle row holds: stored from registers."""
    for config, b_layout in ((dict(BM=64, BN=16), "row"), (dict(BM=128, BN=32), "row"), (dict(BM=128, BN=40), "t")):
        a, b = operands(200, 200, 136, b_layout=b_layout)
        assert rel_err(mh.matmul(a, b, config), a.float() @ b.float()) < 5e-3, config


def test_stream_k_is_bitwise_repeatable_and_leaves_its_workspace_clean(interpreted):
    a, b = operands(200, 136, 320)
    config = dict(BM=128, BN=128, STREAM_K=1)
    first, again = mh.matmul(a, b, config), mh.matmul(a, b, config)
    assert torch.equal(first, again)
    mh.matmul(a, b, {**config, "DETERMINISTIC": False})
    for (_, _, _, deterministic), (ws, locks) in _device._KEPT.items():
        assert not locks.any(), "every lock is reset by the CTA that finishes its tile"
        assert deterministic or not ws.any(), "the atomic fix-up zeroes the slots it added into"


def test_stream_k_under_a_random_schedule(interpreted):
    a, b = operands(200, 136, 320)
    cfg = schedules.normalize(schedules.Problem.of(a, b, False, BF16, False, False, None),
                              dict(BM=128, BN=128, STREAM_K=1))
    problem = schedules.Problem.of(a, b, False, BF16, False, False, None)
    c = torch.full((200, 136), float("nan"), dtype=BF16)
    plan = schedules.launch_plan(problem, cfg, 3)
    mh.matmul_kernel.interpret(policy="random", seed=5)[plan.grid](a, b, c, c, c, *schedules.workspace(
        plan.kernel_cfg, plan.tiles, plan.grid, c), **plan.kernel_cfg)
    assert rel_err(c, a.float() @ b.float()) < 5e-3


class InterpretedTimer:
    """Stands in for the CUDA event timer: runs each candidate once (interpreted) and rates the last one run
    fastest."""

    device = "interpreter"

    def __init__(self):
        self.configs = []

    def __call__(self, run) -> float:
        run()
        self.configs.append(run.config)
        return 100.0 - len(self.configs)


def test_candidates_are_timed_into_an_output_padded_for_tma(interpreted, monkeypatch, tmp_path):
    """Rows of 135 bf16 are not a multiple of 16 bytes: the wrapper pads its output's rows for the TMA store,
    and times its candidates into one made the same way (on the GPU, 4097 x 4095 found every candidate refused:
    they were timed into an unpadded output, whose rows TMA cannot store)."""
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))  # no remembered timings
    timer = InterpretedTimer()
    monkeypatch.setattr(schedules, "TIMER", timer)
    monkeypatch.setattr(schedules, "_CHOSEN", {})
    monkeypatch.setattr(schedules, "_TIMED", {})
    a, b = operands(130, 135, 64)
    options = schedules.candidates(schedules.Problem.of(a, b, False, BF16, False, False, None), 3)
    assert len(options) > 1 and any(o["TMA_STORE"] for o in options)
    c = mh.matmul(a, b)
    assert rel_err(c, a.float() @ b.float()) < 5e-3
    # Round-robin: each candidate once a round, the median of its rounds
    assert [dict(c.kwargs) for c in timer.configs] == [o for _ in range(schedules.TIMING_ROUNDS) for o in options]
    assert schedules.chosen(a, b) == options[-1]
    times = schedules.timings(a, b)  # what benchmarks/matmul.py prints under each shape
    assert list(times) == [schedules.describe(o) for o in options]
    n = len(options)
    assert list(times.values()) == [f"{100.0 - (n + i):.4f} ms" for i in range(1, n + 1)]


def first_choice(m, n, k, dtype=BF16, sms=132):
    a, b = torch.empty(m, k, dtype=dtype), torch.empty(k, n, dtype=dtype)
    return schedules.candidates(schedules.Problem.of(a, b, False, dtype, False, False, None), sms)


@pytest.mark.parametrize("shape,expected", [
    ((3, 4096, 4096), dict(SWAP_AB=True, BM=64, BN=8, STREAM_K=0)),
    ((16, 8192, 8192), dict(SWAP_AB=True, BN=16, STREAM_K=0)),
    ((64, 4096, 4096), dict(SWAP_AB=True, BN=64)),
    ((8192, 8192, 8192), dict(SWAP_AB=False, BM=128, BN=256, STREAM_K=0, TMA_STORE=True)),
    ((4096, 4096, 4096), dict(BM=128, BN=256, STREAM_K=2, TMA_STORE=False)),
    ((1000, 3000, 2000), dict(BM=128, BN=128, STREAM_K=1)),
    ((1024, 1024, 16384), dict(BM=128, BN=128, STREAM_K=1)),
    ((256, 512, 65536), dict(BM=128, BN=64, STREAM_K=1, SPLIT=8, MULTICAST="a")),
    ((128, 8192, 8192), dict(BM=128, BN=128, STREAM_K=1)),
    ((512, 512, 512), dict(BM=128, BN=128, STREAM_K=0)),
    ((128, 2048, 1024), dict(BM=128, BN=128, STREAM_K=0))])
def test_the_heuristics_favourite_per_shape_class(shape, expected):
    options = first_choice(*shape)
    assert 1 <= len(options) <= 11  # each one is compiled and timed on a shape's first call
    assert {k: options[0][k] for k in expected} == expected
    for option in options:  # every wgmma candidate fits: at least two stages beside its epilogue tile
        assert option.get("GEMV") or option["STAGES"] >= 2


@pytest.mark.parametrize("shape,b_kmajor,fitted", [
    # cuBLAS's tiles there: 256 x 160 (124 tiles, one round) and 192 x 144 (128 tiles)
    ((1024, 4936, 5376), True, [(128, 160)]), ((3000, 1120, 1792), True, [(128, 224), (192, 144)]),
    ((1024, 4936, 5376), False, []),  # an N-major B tile of 160 columns (64B swizzle rows) ran 0.62 of cuBLAS
    ((8192, 8192, 8192), True, []), ((4096, 4096, 4096), True, []), ((2048, 11008, 4096), True, []),
    ((1000, 3000, 2000), True, []), ((1024, 1024, 16384), True, [])])
def test_tiles_fitted_to_a_wave_where_the_usual_ones_overflow_a_round(shape, b_kmajor, fitted):
    """A fitted tile puts at most FIT_GAIN of the usual tiles' work on the busiest SM (1024 x 4936: 128 x 160 tiles
    take two rounds of 248 where 128 x 192 take two of 208; 3000 x 1120: 128 x 224 one round of 120 where 128 x 256
    take one of 120 and 128 x 192 two), and is offered beside them; the suite's shapes are left as they were."""
    m, n, k = shape
    a = torch.empty(m, k, dtype=BF16)
    b = torch.empty(n, k, dtype=BF16) if b_kmajor else torch.empty(k, n, dtype=BF16)
    problem = schedules.Problem.of(a, b, b_kmajor, BF16, False, False, None)
    offered = schedules.wave_fitted(problem, 132)
    assert [(c["BM"], c["BN"]) for c in offered] == fitted
    options = schedules.candidates(problem, 132)
    assert all(c in options for c in offered) and len(options) <= 11
    for c in offered:
        assert not c["SWAP_AB"] and not c["STREAM_K"] and c["STAGES"] >= 4
        assert c["TMA_STORE"] == (c["BN"] % 32 == 0) and (not c["TMA_STORE"] or c["BN"] % c["EPILOGUE_N"] == 0)


@pytest.mark.parametrize("shape,splits", [
    ((64, 1240, 4096), {True: 6, False: 6}), ((33, 1240, 4096), {True: 6, False: 6}),
    ((64, 4096, 4096), {True: 2, False: 2}), ((64, 14336, 4096), {}), ((16, 1240, 4096), {True: 6})])
def test_decode_splits_few_tiles_swapped_and_past_16_rows_unswapped(shape, splits):
    """Decode shapes whose weights make few 64-wide tiles split K over the SMs, swapped (64 x M tiles), and past
    16 rows unswapped too (64 x 64 tiles, TMA-stored: 64 x 1240 x 4096 ran 12.6 us there, 15.1 swapped)."""
    options = first_choice(*shape)
    found = {o["SWAP_AB"]: o["SPLIT"] for o in options if o.get("SPLIT")}
    assert found == splits
    for o in options:
        if o.get("SPLIT") and not o["SWAP_AB"]:
            assert (o["BM"], o["BN"], o["STREAM_K"], o["TMA_STORE"]) == (64, 64, 1, True)
    assert len(options) <= 8


@pytest.mark.parametrize("shape,split", [((96, 1240, 8192), 3), ((100, 2000, 6000), 2), ((128, 4096, 4096), 0),
                                         ((256, 512, 65536), 4), ((1024, 1024, 16384), 0)])
def test_long_k_tries_64x64_tiles_split_to_about_a_wave(shape, split):
    """Fewer tiles than SMs and a long K (also under SMALL_WORK where K is LONG_K_TILES k-tiles or more: 96 x 1240
    x 8192 ran its best small tile at 0.64 of cuBLAS): 64 x 64 tiles, split-K onto about one wave where they are
    few, else data-parallel."""
    options = first_choice(*shape)
    (option,) = [o for o in options if (o["BM"], o["BN"], o.get("MULTICAST")) == (64, 64, None)]
    assert (option.get("SPLIT", 0), option["STREAM_K"]) == (split, 1 if split else 0)
    assert len(options) <= 11 and options[0]["STREAM_K"]


@pytest.mark.parametrize("shape,swapped,paired", [
    ((80, 3000, 4096), 80, False), ((96, 3000, 4096), 96, False), ((72, 4096, 14336), 72, False),
    ((80, 3000, 2048), 80, False), ((96, 1240, 8192), None, False), ((128, 4096, 4096), None, False),
    ((256, 512, 65536), None, True), ((1024, 1024, 16384), None, True), ((80, 50257, 4096), 80, False),
    ((1000, 3000, 2000), None, True)])
def test_65_to_96_rows_also_try_swapped_weight_tiles(shape, swapped, paired):
    """Few tiles (with a long K, small problems) or a partial last wave (an LM head, 80 x 50257): M of 65 to
    SWAP_ROWS rows also tries the weights' 64-row tiles swapped onto the wgmma's M side, one CTA a tile, where they
    fill a third of the SMs (not 20 tiles: 96 x 1240 x 8192); M-neighbour pairs sharing B only where M holds two
    128-row tiles (else every pair's second tile is empty)."""
    options = first_choice(*shape)
    swaps = [(o["BM"], o["BN"], o["STREAM_K"]) for o in options
             if o["SWAP_AB"] and not o.get("MULTICAST") and o["BM"] == 64]
    assert swaps == ([(64, swapped, 0)] if swapped else [])
    assert any(o.get("MULTICAST") == "b" and not o["SWAP_AB"] for o in options) == paired
    assert len(options) <= 11


def test_swapped_weight_tiles_only_where_m_pads_to_96_rows_or_fewer():
    """An MN-major A pads a swapped tile's M side to 64 columns (80 rows: 128, the width where the swap lost):
    no swapped tile there; K-major, 80 rows pad to 80."""
    m, n, k = 80, 3000, 4096
    b = torch.empty(k, n, dtype=BF16)
    for a, side in ((torch.empty(m, k, dtype=BF16), 80), (torch.empty(k, m, dtype=BF16).t(), None)):
        problem = schedules.Problem.of(a, b, False, BF16, False, False, None)
        swaps = [o["BN"] for o in schedules.candidates(problem, 132)
                 if o["SWAP_AB"] and not o.get("MULTICAST") and o["BM"] == 64]
        assert swaps == ([side] if side else []), a.stride()


@pytest.mark.parametrize("shape,tiles", [
    ((1000, 3000, 2000), [(128, 192)]), ((4096, 4096, 4096), [(128, 256), (128, 192)]),
    ((8192, 8192, 8192), [(128, 256)]), ((2048, 11008, 4096), [(128, 256), (128, 192)]),
    ((512, 512, 512), []), ((3, 4096, 4096), [])])
def test_multicast_candidates_where_tiles_are_many_enough(shape, tiles):
    """The larger shapes also time their data-parallel tiles on clusters of two sharing B; small and decode
    shapes do not (a pair of tiles per cluster leaves SMs idle there)."""
    multicast = [o for o in first_choice(*shape) if o.get("MULTICAST") and not o["STREAM_K"] and "CLUSTER" not in o]
    assert [(o["BM"], o["BN"]) for o in multicast] == tiles
    for option in multicast:
        assert option["MULTICAST"] == "b" and not option["STREAM_K"] and "multicast B" in schedules.describe(option)
        plan = schedules.launch_plan(schedules.Problem.of(torch.empty(shape[0], shape[2], dtype=BF16),
                                                          torch.empty(shape[2], shape[1], dtype=BF16), False, BF16,
                                                          False, False, None), option, 132)
        pairs = -(-shape[0] // (2 * option["BM"])) * -(-shape[1] // option["BN"])
        assert plan.grid == (2 * min(pairs, 66),) and plan.kernel_cfg["cluster"] == (2, 1, 1)


@pytest.mark.parametrize("shape,side", [
    ((100, 7328, 3784), 128), ((160, 8896, 16384), 160), ((144, 4096, 14336), 160), ((256, 8192, 8192), 256),
    ((80, 2000, 6000), None), ((100, 894, 3584), None), ((300, 8192, 8192), None), ((48, 8192, 8192), None)])
def test_65_to_256_rows_also_share_the_activations_over_clusters_of_four(shape, side):
    """M of 65 to 256 rows, where the weights make a third of the SMs' worth of 64-row tiles: swapped 64-row weight
    tiles on clusters of four sharing the activations (M rounded up to 32 columns: 8 rows a CTA's multicast part),
    data-parallel and stream-K, launched on the clusters that run at once (off the GPU, a quarter of the SMs),
    and 128-row ones unshared (M rounded up to 8); none for few weight tiles (2000 / 64), M past 256 or decode
    shapes."""
    options = [o for o in first_choice(*shape) if o.get("CLUSTER") == 4]
    assert [(o["BM"], o["BN"], o["STREAM_K"]) for o in options] == ([(64, side, 0), (64, side, 1)] if side else [])
    wide = [o["BN"] for o in first_choice(*shape) if o["SWAP_AB"] and o["BM"] == 128 and not o["STREAM_K"]]
    assert wide == ([-(-shape[0] // 8) * 8] if side else [])
    m, n, k = shape
    problem = schedules.Problem.of(torch.empty(m, k, dtype=BF16), torch.empty(k, n, dtype=BF16), False, BF16,
                                   False, False, None)
    for option in options:
        assert option["SWAP_AB"] and option["MULTICAST"] == "b" and "multicast B x4" in schedules.describe(option)
        plan = schedules.launch_plan(problem, option, 132)
        items = -(-n // (4 * option["BM"]))
        assert plan.kernel_cfg["cluster"] == (4, 1, 1) and plan.tiles == 4 * items
        assert plan.grid == (4 * (33 if option["STREAM_K"] else min(items, 33)),)


@pytest.mark.parametrize("shape", [(1024, 1024, 16384), (1000, 3000, 2000)])
def test_long_k_with_few_tiles_also_splits_over_clusters_sharing_a(shape):
    """Fewer tiles than SMs and a long K: the two-way split of 128 x 128 tiles is timed over clusters of two
    N-neighbours sharing their A tile (H200, 1024 x 1024 x 16384: 58.4 us against 61.0 unshared), each
    cluster's pair of tiles cut in two: 2 x 2 CTAs a pair."""
    problem = schedules.Problem.of(torch.empty(shape[0], shape[2], dtype=BF16),
                                   torch.empty(shape[2], shape[1], dtype=BF16), False, BF16, False, False, None)
    (option,) = [o for o in first_choice(*shape) if o.get("MULTICAST") == "a" and o.get("SPLIT") == 2]
    assert (option["BM"], option["BN"], option["STREAM_K"]) == (128, 128, 1)
    assert "split 2 multicast A" in schedules.describe(option)
    plan = schedules.launch_plan(problem, option, 132)
    pairs = -(-shape[0] // 128) * -(-shape[1] // 256)
    assert plan.grid == (2 * min(66, 2 * pairs),) and plan.kernel_cfg["cluster"] == (2, 1, 1)


# One config of each kind the heuristics propose (tile, schedule, epilogue, operand majors); each must compile
# without spills. (The 128 x 256 data-parallel config is tests/test_hopper_cpu.py's.)
SPILL_CONFIGS = {
    "stream-k-256": dict(BM=128, BN=256, STREAM_K=2, TMA_STORE=False, STAGES=4),
    "stream-k-128": dict(BM=128, BN=128, STREAM_K=2, STAGES=6),
    "stream-k-atomic": dict(BM=128, BN=192, STREAM_K=1, STAGES=4, DETERMINISTIC=False),
    "m64-stream-k": dict(BM=64, BN=256, STREAM_K=1, STAGES=4),
    "stream-k-128x64": dict(BM=128, BN=64, STREAM_K=1, STAGES=8),
    "m64-dp-deep": dict(BM=64, BN=64, STAGES=12),
    "swap-decode": dict(BM=128, BN=16, STAGES=12, STREAM_K=1, A_MNMAJOR=True, B_KMAJOR=True, TMA_STORE=False,
                        BIAS=True, BIAS_ROWS=True, SCALED=True, ACTIVATION="gelu"),
    "swap-m77": dict(BM=128, BN=80, STAGES=8, STREAM_K=1, A_MNMAJOR=True, B_KMAJOR=True, TMA_STORE=False),
    "swap-decode-m64": dict(BM=64, BN=8, STAGES=12, STREAM_K=1, A_MNMAJOR=True, B_KMAJOR=True, TMA_STORE=False),
    "swap-decode-dp": dict(BM=64, BN=8, STAGES=12, A_MNMAJOR=True, B_KMAJOR=True, TMA_STORE=False, BIAS=True,
                           BIAS_ROWS=True, SCALED=True, ACTIVATION="gelu"),
    "swap-m24-bias": dict(BM=64, BN=24, STAGES=12, STREAM_K=1, A_MNMAJOR=True, B_KMAJOR=True, TMA_STORE=False,
                          BIAS=True, BIAS_ROWS=True),
    "multicast-b-128x192": dict(BM=128, BN=192, STAGES=4, MULTICAST="b"),
    "multicast-b-128x256-kmajor": dict(BM=128, BN=256, STAGES=3, MULTICAST="b", B_KMAJOR=True),
    "multicast-a-a-mnmajor": dict(BM=128, BN=128, STAGES=5, MULTICAST="a", A_MNMAJOR=True),
    "multicast-b-split-k": dict(BM=128, BN=128, STAGES=6, STREAM_K=1, MULTICAST="b"),
    "multicast-a-split-k-128x64": dict(BM=128, BN=64, STAGES=8, STREAM_K=1, MULTICAST="a"),
    # The epilogue in 64-column chunks leaves 128 x 256 tiles room for a fourth stage, with the whole epilogue.
    "chunked-epilogue-128x256": dict(BM=128, BN=256, STAGES=4, BIAS=True, SCALED=True, ACTIVATION="gelu"),
    "chunked-epilogue-multicast": dict(BM=128, BN=256, STAGES=4, MULTICAST="b", B_KMAJOR=True),
    # M of 65 to 256: swapped 64-row weight tiles sharing the activations over clusters of four (cuBLAS's 64 x 104
    # and 256 x 160 tiles on 4 x 1 clusters at 100 x 7328 x 3784 and 160 x 8896 x 16384), and 128-row ones unshared
    "multicast4-swap-64x160-stream-k": dict(BM=64, BN=160, STAGES=8, STREAM_K=1, MULTICAST="b", CLUSTER=4,
                                            A_MNMAJOR=True, B_KMAJOR=True, TMA_STORE=False),
    "multicast4-swap-64x128": dict(BM=64, BN=128, STAGES=9, MULTICAST="b", CLUSTER=4, A_MNMAJOR=True,
                                   B_KMAJOR=True, TMA_STORE=False),
    "swap-128x200": dict(BM=128, BN=200, STAGES=5, A_MNMAJOR=True, B_KMAJOR=True, TMA_STORE=False),
    # Tiles fitted to a wave (`wave_fitted`)
    "wave-fitted-128x160": dict(BM=128, BN=160, STAGES=5, B_KMAJOR=True, EPILOGUE_N=32),
    "nmajor-64b-swizzle-128x160": dict(BM=128, BN=160, STAGES=5, EPILOGUE_N=32),
    "wave-fitted-128x224": dict(BM=128, BN=224, STAGES=4, B_KMAJOR=True, EPILOGUE_N=32),
    "wave-fitted-192x144": dict(BM=192, BN=144, STAGES=5, B_KMAJOR=True, TMA_STORE=False),
}


def test_stages_fit_the_epilogue_the_config_has():
    """Two 64 x 64 chunk buffers a consumer with the TMA-store epilogue, none without: 6 and 7 stages of
    128 x 128, and 4 of 128 x 256 either way (the whole 128 x 256 C tile left room for 3)."""
    a, b = torch.empty(4096, 4096, dtype=BF16), torch.empty(4096, 4096, dtype=BF16)
    problem = schedules.Problem.of(a, b, False, BF16, False, False, None)
    assert schedules.epilogue_bytes(2, 128, 2) == schedules.epilogue_bytes(2, 256, 2) == 2 * 2 * 64 * 64 * 2
    assert schedules.normalize(problem, dict(BM=128, BN=128))["STAGES"] == 6
    assert schedules.normalize(problem, dict(BM=128, BN=128, TMA_STORE=False))["STAGES"] == 7
    assert schedules.normalize(problem, dict(BM=128, BN=256))["STAGES"] == 4
    # An odd multiple of 32 columns in 32-column chunks (a 64-byte swizzle row); a width no swizzle row holds
    # whole (144 columns: 288 bytes) stores from registers
    assert schedules.normalize(problem, dict(BM=128, BN=96))["EPILOGUE_N"] == 32
    assert not schedules.normalize(problem, dict(BM=128, BN=144))["TMA_STORE"]


def compile_config(name):
    config = {**mh.DEFAULT_CONFIG, **SPILL_CONFIGS[name]}
    x, out = torch.empty(4096, 4096, dtype=BF16), torch.empty(4096, 4096, dtype=BF16)
    # The stream-K workspace as schedules.workspace makes it: f32 rows of a multiple of 8 columns (16-byte aligned).
    ws = torch.empty(64, config["BN"])
    return mh.matmul_kernel.compile(x, x, out, torch.empty(1), torch.empty(4096, dtype=BF16), ws,
                                    torch.empty(1, dtype=torch.int32), **config,
                                    num_warpgroups=config["BM"] // 64 + 1,
                                    cluster=(config.get("CLUSTER", 2), 1, 1) if config.get("MULTICAST") else None,
                                    target="sm_90a")


@pytest.mark.parametrize("name", SPILL_CONFIGS)
def test_ptxas_reports_no_spills(name):
    c = compile_config(name)
    assert c.spills == 0 and not c.meta["warnings"], c.ptxas_report
    assert c.smem_bytes <= 232448


def test_multicast_ptx_shares_the_slot_ring_across_the_cluster():
    """The shared tile arrives by multicast copies; the other operand's copies and the C stores stay per CTA;
    each consumer releases its slot here and in the peer (mapa + a relaxed arrive: no cluster-scope fence, whose
    membar stall cost 30%); ptxas says nothing."""
    c = compile_config("multicast-b-128x192")
    assert c.spills == 0 and not c.meta["warnings"], c.ptxas_report
    assert c.meta["cluster"] == [2, 1, 1]
    multicast = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
                           r"(\.multicast::cluster)?", c.ptx)
    # B (64 x 192: three 64-column boxes) multicast; A's two 64-row halves each one box, per CTA.
    assert multicast.count(".multicast::cluster") == 3 and multicast.count("") == 2
    assert "mbarrier.arrive.shared::cluster.b64" in c.ptx and "mapa.shared::cluster" in c.ptx
    assert "mbarrier.arrive.release.cluster" not in c.ptx
    assert c.ptx.count("barrier.cluster.arrive") == 2  # after the barriers' init, and before exit


def test_the_atomic_fix_up_adds_every_accumulator_element():
    """Each consumer thread adds its 64 x 192 / 128 accumulator elements into the workspace, two per vector
    atomic, each pair from its own registers (the GPU's atomic fix-up once added the first element everywhere:
    every source pair was one register twice)."""
    sources = re.findall(r"atom\.relaxed\.gpu\.global\.v2\.f32\.add \{[^}]*\}, \[[^]]*\], \{([^}]*)\};",
                         compile_config("stream-k-atomic").ptx)
    registers = [r.strip() for pair in sources for r in pair.split(",")]
    assert len(sources) == 64 * 192 // 128 // 2 and len(set(registers)) == len(registers)


def test_stream_k_work_items_carry_the_spans_of_a_tile(interpreted):
    """matmul(..., profile=) records the spans of a stream-K launch: each CTA's data-parallel tile and its range
    of the cut tile are one work item each, loaded in one "load tile" span and computed in one "tile" span
    (its "mma", then its "epilogue": the fix-up for the cut tile)."""
    from span_checks import check_matmul_spans
    a, b = operands(200, 136, 320)
    prof = mgjit.Profile()
    c = mh.matmul(a, b, dict(BM=128, BN=128, STREAM_K=1), profile=prof)
    assert rel_err(c, a.float() @ b.float()) < 5e-3
    # 2 x 2 tiles on 3 CTAs: tiles 0-2 data-parallel, one per CTA; tile 3's 5 k-iterations cut 1 + 2 + 2
    # over the 3 CTAs: two work items per CTA.
    check_matmul_spans(prof, grid=3, tiles=4, items=[2, 2, 2])


@pytest.mark.parametrize("m", [24, 40])
def test_swapped_tile_of_a_non_power_of_two_width_adds_its_bias(m, monkeypatch):
    """M = 24 or 40 swapped puts a 24- or 40-wide tile on the wgmma's N: the bias broadcast along its rows had no
    default layout (a side not a power of two) and was a CompileError; it takes the accumulator's layout."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(mh, "sm_count", lambda device: 8)
    a, b = torch.randn(m, 256, dtype=BF16), torch.randn(256, 128, dtype=BF16)
    bias = torch.randn(128, dtype=BF16)
    c = mh.matmul(a, b, {"SWAP_AB": True, "BM": 64, "BN": -(-m // 8) * 8, "STREAM_K": 1}, bias=bias)
    assert rel_err(c, a.float() @ b.float() + bias.float()) < 5e-3

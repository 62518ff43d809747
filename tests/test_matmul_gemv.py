"""The decode GEMVs (examples/_matmul_gemv.py), on the CPU: every candidate interpreted through the matmul wrapper
against torch (ragged K and N, the whole epilogue, bf16 and f16; K-major weights given (N, K) or as a transposed
view, N-major weights (K, N) with and without the K split, a strided or transposed a, no K at all), the split's
repeatable sums and reusable workspace, the cached call, the chooser's candidate lists, its timings keyed by every
kernel's source, and clean sm_90a compiles. On a GPU (marked gpu): every candidate against torch, and the chooser.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import _device  # noqa: E402
import _matmul_gemv as gemv  # noqa: E402
import _matmul_schedules as schedules  # noqa: E402
import matmul_hopper as mh  # noqa: E402

BF16, F16 = torch.bfloat16, torch.float16


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(mh, "sm_count", lambda device: 3)
    monkeypatch.setattr(mh, "_PREPARED", {})
    monkeypatch.setattr(schedules, "_CHOSEN", {})
    monkeypatch.setattr(_device, "_KEPT", {})


def reference(a, w, scale, bias, activation):
    exact = a.double() @ w.double().t()
    if scale is not None:
        exact = exact * scale.double()
    if bias is not None:
        exact = exact + bias.double()
    return torch.nn.functional.gelu(exact) if activation == "gelu" else exact.relu() if activation else exact


@pytest.mark.parametrize("m,k,n,dtype,kmajor,epilogue", [
    (3, 300, 37, BF16, True, "bias-gelu"),
    (4, 1030, 20, F16, False, "scale-relu"),
    (1, 64, 5, BF16, False, None),
    (2, 9000, 9, BF16, True, "bias"),
])
def test_every_candidate_matches_torch(interpreted, poison_empty, m, k, n, dtype, kmajor, epilogue):
    a = torch.randn(m, k, dtype=dtype)
    w = torch.randn(n, k, dtype=dtype)
    scale = torch.tensor([0.5]) if epilogue and "scale" in epilogue else None
    bias = torch.randn(n, dtype=dtype) if epilogue and "bias" in epilogue else None
    activation = next((f for f in ("gelu", "relu") if epilogue and f in epilogue), None)
    configs = gemv.candidates(m, k)
    assert configs
    for cfg in configs:
        c = mh.matmul(a, w if kmajor else w.t(), config=cfg, scale=scale, bias=bias, activation=activation,
                      b_kmajor=kmajor)
        assert not c.isnan().any(), "some of the poisoned output was never written"
        ref = reference(a, w, scale, bias, activation)
        assert ((c.double() - ref).norm() / ref.norm()).item() < 5e-3, cfg


@pytest.mark.parametrize("kmajor", [True, False])
def test_a_cached_call_of_a_chosen_gemv_matches_torch(interpreted, poison_empty, monkeypatch, kmajor):
    """The chooser's pick (a GEMV, as if it had timed fastest; the N-major one split) served again from the call
    cache, on fresh inputs."""
    pick = gemv.candidates(4, 200)[0] if kmajor else nmajor_config(128, 4, 4)
    monkeypatch.setattr(schedules, "candidates", lambda problem, sms: [pick])
    for call in ("full", "cached"):
        a, w = torch.randn(4, 200, dtype=BF16), torch.randn(48, 200, dtype=BF16)
        prepared = len(mh._PREPARED)
        c = mh.matmul(a, w.t() if kmajor else w.t().contiguous())
        assert len(mh._PREPARED) == prepared + (call == "full")
        assert mh._PREPARED[next(reversed(mh._PREPARED))].gemv
        ref = a.double() @ w.double().t()
        assert ((c.double() - ref).norm() / ref.norm()).item() < 5e-3, call


def decode_problem(m: int, w_kmajor: bool, dtype=BF16, n: int = 4096, k: int = 4096) -> schedules.Problem:
    a = torch.empty(m, k, dtype=dtype)
    b = torch.empty(k, n, dtype=dtype)
    return schedules.Problem.of(a, b.t() if w_kmajor else b, False, dtype, False, False, None)


def test_decode_tries_the_gemv_of_its_weights_layout():
    for m in (1, 3, 4):
        listed = schedules.candidates(decode_problem(m, True), 132)
        assert [c for c in listed if c.get("GEMV")] == gemv.candidates(m, 4096) != []
        assert listed[0].get("SWAP_AB")  # the untimed default stays the tensor-core schedule
    for m in range(1, 9):
        listed = schedules.candidates(decode_problem(m, False), 132)
        assert [c for c in listed if c.get("GEMV")] == gemv.nmajor_candidates(m, 4096, 4096, 132) != []
        assert listed[0].get("SWAP_AB")
    assert not any(c.get("GEMV") for c in schedules.candidates(decode_problem(5, True), 132))
    assert not any(c.get("GEMV") for c in schedules.candidates(decode_problem(9, False), 132))
    assert gemv.candidates(3, 2 * 8192 + 1) == [] and gemv.candidates(5, 64) == []
    assert schedules.describe(gemv.candidates(3, 4096)[0]) == "GEMV 2 rows x 4096 columns x 1 chunks"
    with pytest.raises(ValueError, match="'k-major' or 'n-major'"):
        schedules.choose(decode_problem(2, True), {"GEMV": True, "ROWS": 1}, 132, None, None, None)


@pytest.mark.parametrize("kmajor,config,message", [
    # each ran and computed a wrong C: the other layout's weight read as this one's, K past the chunks left out,
    # no tile loaded
    (False, {"GEMV": "k-major", "ROWS": 2, "KC": 128, "KCH": 3}, r"reads an \(N, K\) weight: this b is N-major"),
    (True, {"GEMV": "n-major", "BN": 128, "KB": 8, "UNROLL": 2, "SPLIT": 1}, r"reads a \(K, N\) weight"),
    (True, {"GEMV": "k-major", "ROWS": 2, "KC": 64, "KCH": 1}, "KCH chunks of KC = 64 columns cover K = 320"),
    (False, {"GEMV": "n-major", "BN": 128, "KB": 8, "UNROLL": 0, "SPLIT": 1}, "UNROLL .* at least 1, got 0"),
    # these failed deep in the kernel, or in the grid's division by zero
    (True, {"GEMV": "k-major", "ROWS": 0, "KC": 128, "KCH": 3}, "ROWS is a power of two .* got 0"),
    (False, {"GEMV": "n-major", "BN": 128, "KB": 8, "UNROLL": 2, "SPLIT": 3}, "SPLIT is a power of two .* got 3")])
def test_gemv_configs_that_ran_wrong_or_failed_deep_are_refused_by_name(kmajor, config, message, interpreted):
    a = torch.randn(3, 320).to(torch.bfloat16)
    b = torch.randn(136, 320).to(torch.bfloat16) if kmajor else torch.randn(320, 136).to(torch.bfloat16)
    with pytest.raises(ValueError, match=message):
        mh.matmul(a, b, config, b_kmajor=kmajor)


@pytest.mark.parametrize("n,k,splits", [
    (4096, 4096, (16, 16, 8, 16)),    # 32 column blocks of 128: 16 parts make 512 programs, ~4 per SM
    (14336, 4096, (4, 4, 2, 8)),      # 112 blocks: 4 parts (448 programs)
    (8192, 8192, (8, 8, 4, 16)),
    (4096, 16, (1, 1, 1, 1)),         # one loop step of K for every tile: nothing to split
    (64, 1000, (32, 16, 8, 16)),      # as many parts as steps allow (8 x 128 rows a step), SPLIT x BN <= 4096
])
def test_nmajor_candidates_split_k_over_the_sms(n, k, splits):
    configs = gemv.nmajor_candidates(3, n, k, 132)
    assert [c["SPLIT"] for c in configs] == list(splits)
    for c in configs:
        assert c["KB"] * c["BN"] == 128 * 8  # one 16-byte vector of bf16 a thread a tile
        assert c["SPLIT"] * c["BN"] <= gemv.MAX_PARTIALS
    assert schedules.describe(configs[0]) == f"GEMV N-major 128 columns x 8x4 rows a step, K split {splits[0]}"


def nmajor_config(bn: int, unroll: int, split: int) -> dict:
    return {"GEMV": "n-major", "BN": bn, "KB": 1024 // bn, "UNROLL": unroll, "SPLIT": split}


@pytest.mark.parametrize("m,k,n,dtype,split,epilogue,a_view", [
    (1, 300, 37, BF16, 1, None, "plain"),
    (2, 1000, 200, F16, 4, "scale-relu", "strided"),
    (3, 515, 129, BF16, 2, "bias-gelu", "transposed"),
    (4, 1030, 257, F16, 16, None, "plain"),
    (8, 777, 300, BF16, 8, "bias", "plain"),
    (5, 0, 40, BF16, 2, "bias-relu", "plain"),  # no K at all: act(bias)
])
def test_nmajor_matches_torch(interpreted, poison_empty, m, k, n, dtype, split, epilogue, a_view):
    """gemv_nmajor through the wrapper, weights given (K, N): ragged K and N (rows of b not 16-byte aligned for
    N = 37, 129, 257), every tile shape with and without the K split, the epilogue, a as a strided or transposed
    view."""
    a = {"plain": lambda: torch.randn(m, k, dtype=dtype), "strided": lambda: torch.randn(m, 2 * k, dtype=dtype)[:, ::2],
         "transposed": lambda: torch.randn(k, m, dtype=dtype).t()}[a_view]()
    b = torch.randn(k, n, dtype=dtype)
    scale = torch.tensor([0.5]) if epilogue and "scale" in epilogue else None
    bias = torch.randn(n, dtype=dtype) if epilogue and "bias" in epilogue else None
    activation = next((f for f in ("gelu", "relu") if epilogue and f in epilogue), None)
    ref = reference(a, b.t(), scale, bias, activation)
    for bn, unroll, _ in gemv.NMAJOR_TILES:
        cfg = nmajor_config(bn, unroll, split)
        c = mh.matmul(a, b, config=cfg, scale=scale, bias=bias, activation=activation)
        assert not c.isnan().any(), "some of the poisoned output was never written"
        assert ((c.double() - ref).norm() / ref.norm().clamp(min=1e-9)).item() < 5e-3, cfg


def test_nmajor_split_repeats_bitwise_and_leaves_the_workspace_ready(interpreted, poison_empty):
    """Two launches of a split on the same inputs agree bit for bit; each leaves the locks zero, so that the next
    launch (fresh inputs, the same workspace) is right."""
    cfg = nmajor_config(128, 4, 8)
    a, b = torch.randn(3, 1500, dtype=BF16), torch.randn(1500, 200, dtype=BF16)
    first, again = mh.matmul(a, b, config=cfg), mh.matmul(a, b, config=cfg)
    assert torch.equal(first, again)
    (ws, locks), = _device._KEPT.values()
    assert locks.shape[0] >= 2 and not locks.any()
    a, b = torch.randn(3, 1500, dtype=BF16), torch.randn(1500, 200, dtype=BF16)
    c = mh.matmul(a, b, config=cfg)
    ref = a.double() @ b.double()
    assert ((c.double() - ref).norm() / ref.norm()).item() < 5e-3


@pytest.mark.parametrize("m,k", [(1, 4096), (3, 4096), (4, 4096), (4, 16384), (3, 11008)])
def test_candidates_compile_clean(m, k):
    a = torch.empty(m, k, dtype=BF16)
    w = torch.empty(4096, k, dtype=BF16)
    for cfg in gemv.candidates(m, k):
        kernel_cfg = {k: v for k, v in cfg.items() if k != "GEMV"}
        c = gemv.gemv_kmajor.compile(a, w, a, a, w[0], M=m, **kernel_cfg, BIAS=True, ACTIVATION="gelu",
                                     target="sm_90a")
        assert c.spills == 0, (cfg, c.ptxas_report)


# The decode shapes of benchmarks/gemv_nmajor.py, (N, K).
BENCHMARKED = ((4096, 4096), (8192, 8192), (14336, 4096), (4096, 14336))


@pytest.mark.parametrize("m", [1, 4, 8])
def test_nmajor_candidates_compile_clean(m):
    """Every gemv_nmajor candidate of the benchmarked shapes (the largest epilogue) compiles for sm_90a without a
    spill or a ptxas warning."""
    a = torch.empty(m, 4096, dtype=BF16)
    configs = {tuple(sorted(c.items())) for n, k in BENCHMARKED for c in gemv.nmajor_candidates(m, n, k, 132)}
    for cfg in map(dict, sorted(configs)):
        kernel_cfg = {k: v for k, v in cfg.items() if k != "GEMV"}
        ws, locks = torch.empty(8, 128), torch.empty(8, dtype=torch.int32)
        c = gemv.gemv_nmajor.compile(a, a, a, torch.empty(1), a[0], ws, locks, M=m, **kernel_cfg, SCALED=True,
                                     BIAS=True, ACTIVATION="gelu", target="sm_90a")
        assert c.spills == 0 and c.meta["warnings"] == [], (cfg, c.ptxas_report)
        assert c.registers <= 200, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (3, 4096, 11008), (4, 11008, 4096), (3, 4097, 1000)])
def test_gpu_every_candidate_matches_torch(m, k, n):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    a = torch.randn(m, k, device="cuda", dtype=BF16)
    w = torch.randn(n, k, device="cuda", dtype=BF16)
    bias = torch.randn(n, device="cuda", dtype=BF16)
    ref = reference(a, w, None, bias, "gelu")
    for cfg in gemv.candidates(m, k):
        torch.cuda.empty_cache()
        c = mh.matmul(a, w.t(), config=cfg, bias=bias, activation="gelu")
        assert not c.isnan().any()
        assert ((c.double() - ref).norm() / ref.norm()).item() < 5e-3, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n,a_view", [(1, 4096, 4096, "plain"), (3, 14336, 4096, "plain"),
                                          (4, 4096, 14336, "strided"), (8, 4097, 1000, "plain"),
                                          (2, 8192, 8192, "transposed")])
def test_gpu_nmajor_every_candidate_matches_torch(poison_empty, m, k, n, a_view):
    """gemv_nmajor on the GPU, weights (K, N), every candidate forced through the wrapper: the outputs (NaN
    before) against torch, and a split launch twice on the same inputs bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    a = {"plain": lambda: torch.randn(m, k, device="cuda", dtype=BF16),
         "strided": lambda: torch.randn(m, 2 * k, device="cuda", dtype=BF16)[:, ::2],
         "transposed": lambda: torch.randn(k, m, device="cuda", dtype=BF16).t()}[a_view]()
    b = torch.randn(k, n, device="cuda", dtype=BF16)
    bias = torch.randn(n, device="cuda", dtype=BF16)
    ref = reference(a, b.t(), None, bias, "gelu")
    for cfg in gemv.nmajor_candidates(m, n, k, mh.sm_count(0)):
        c = mh.matmul(a, b, config=cfg, bias=bias, activation="gelu")
        assert not c.isnan().any(), ("some of the poisoned output was never written", cfg)
        assert ((c.double() - ref).norm() / ref.norm()).item() < 5e-3, cfg
        if cfg["SPLIT"] > 1:
            assert torch.equal(c, mh.matmul(a, b, config=cfg, bias=bias, activation="gelu")), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (3, 4096, 4096), (4, 8192, 8192)])
def test_gpu_chooser_times_the_nmajor_gemv(poison_empty, monkeypatch, m, k, n):
    """The chooser times every N-major GEMV candidate (none refused) beside swap-AB, and its pick is right."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    monkeypatch.setattr(schedules, "_CHOSEN", {})
    monkeypatch.setattr(mh, "_PREPARED", {})
    a = torch.randn(m, k, device="cuda", dtype=BF16)
    b = torch.randn(k, n, device="cuda", dtype=BF16)
    c = mh.matmul(a, b)
    ref = a.double() @ b.double()
    assert not c.isnan().any() and ((c.double() - ref).norm() / ref.norm()).item() < 5e-3
    timed = schedules.timings(a, b)
    nmajor = [v for name, v in timed.items() if name.startswith("GEMV N-major")]
    assert len(nmajor) == len(gemv.nmajor_candidates(m, n, k, mh.sm_count(0))) and all(
        v.endswith(" ms") for v in nmajor), timed
    print(f"{m}x{n}x{k}: picked {schedules.describe(schedules.chosen(a, b))}; {timed}")


@pytest.mark.parametrize("edited,kind", [("gemv_kmajor", "k-major"), ("gemv_nmajor", "n-major")])
def test_an_edited_gemv_is_timed_again(interpreted, monkeypatch, tmp_path, edited, kind):
    """The chooser remembers its timings on disk under the source keys of every kernel its candidates run: a
    GEMV whose source changed is timed again, not served the choice its old source won."""
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    timed = []

    def timer(run):
        run()
        timed.append(run.config)
        return 1.0
    timer.device = "interpreter"
    monkeypatch.setattr(schedules, "TIMER", timer)
    a, w = torch.randn(3, 128, dtype=BF16), torch.randn(40, 128, dtype=BF16)
    b = w.t() if kind == "k-major" else w.t().contiguous()  # the weights as that GEMV reads them
    options = schedules.candidates(schedules.Problem.of(a, b, False, BF16, False, False, None), 3)
    assert any(o.get("GEMV") == kind for o in options)
    counts = []
    for call in ("first", "remembered", "gemv edited"):
        if call == "gemv edited":
            monkeypatch.setattr(getattr(gemv, edited), "source_key", lambda: "0" * 64)
        monkeypatch.setattr(schedules, "_CHOSEN", {})  # a fresh process: only the disk remembers
        monkeypatch.setattr(mh, "_PREPARED", {})
        before = len(timed)
        mh.matmul(a, b)
        counts.append(len(timed) - before)
    assert counts == [schedules.TIMING_ROUNDS * len(options), 0, schedules.TIMING_ROUNDS * len(options)]

"""Decode matmuls with K-major weights as row reductions (examples/_matmul_gemv.py), on the CPU: every GEMV
candidate interpreted through the matmul wrapper against torch (ragged K and N, the whole epilogue, weights given
(N, K) or as a transposed view, bf16 and f16), the cached call, the chooser's candidate list, and clean sm_90a
compiles."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import _matmul_gemv as gemv  # noqa: E402
import _matmul_schedules as schedules  # noqa: E402
import matmul_hopper as mh  # noqa: E402

BF16, F16 = torch.bfloat16, torch.float16


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(mh, "_sm_count", lambda device: 3)
    monkeypatch.setattr(mh, "_PREPARED", {})
    monkeypatch.setattr(schedules, "_CHOSEN", {})


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


def test_a_cached_call_of_a_chosen_gemv_matches_torch(interpreted, poison_empty, monkeypatch):
    """The chooser's pick (a GEMV, as if it had timed fastest) served again from the call cache, on fresh inputs."""
    pick = gemv.candidates(4, 200)[0]
    monkeypatch.setattr(schedules, "candidates", lambda problem, sms: [pick])
    for call in ("full", "cached"):
        a, w = torch.randn(4, 200, dtype=BF16), torch.randn(48, 200, dtype=BF16)
        prepared = len(mh._PREPARED)
        c = mh.matmul(a, w.t())
        assert len(mh._PREPARED) == prepared + (call == "full")
        assert mh._PREPARED[next(reversed(mh._PREPARED))].gemv
        ref = a.double() @ w.double().t()
        assert ((c.double() - ref).norm() / ref.norm()).item() < 5e-3, call


def test_decode_with_k_major_weights_also_tries_gemv():
    def problem(m, w_kmajor: bool, dtype=BF16):
        a = torch.empty(m, 4096, dtype=dtype)
        b = torch.empty(4096, 4096, dtype=dtype)
        return schedules.Problem.of(a, b.t() if w_kmajor else b, False, dtype, False, False, None)
    for m in (1, 3, 4):
        listed = schedules.candidates(problem(m, True), 132)
        assert [c for c in listed if c.get("GEMV")] == gemv.candidates(m, 4096) != []
        assert listed[0].get("SWAP_AB")  # the untimed default stays the tensor-core schedule
        assert not any(c.get("GEMV") for c in schedules.candidates(problem(m, False), 132))
    assert not any(c.get("GEMV") for c in schedules.candidates(problem(5, True), 132))
    assert gemv.candidates(3, 2 * 8192 + 1) == [] and gemv.candidates(5, 64) == []
    assert schedules.describe(gemv.candidates(3, 4096)[0]) == "GEMV 2 rows x 4096 columns x 1 chunks"


@pytest.mark.parametrize("m,k", [(1, 4096), (3, 4096), (4, 4096), (4, 16384), (3, 11008)])
def test_candidates_compile_clean(m, k):
    a = torch.empty(m, k, dtype=BF16)
    w = torch.empty(4096, k, dtype=BF16)
    for cfg in gemv.candidates(m, k):
        kernel_cfg = {k: v for k, v in cfg.items() if k != "GEMV"}
        c = gemv.gemv_kmajor.compile(a, w, a, a, w[0], M=m, **kernel_cfg, BIAS=True, ACTIVATION="gelu",
                                     target="sm_90a")
        assert c.spills == 0, (cfg, c.ptxas_report)


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


def test_an_edited_gemv_is_timed_again(interpreted, monkeypatch, tmp_path):
    """The chooser remembers its timings on disk under the source keys of both kernels its candidates run: a
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
    options = schedules.candidates(schedules.Problem.of(a, w.t(), False, BF16, False, False, None), 3)
    assert any(o.get("GEMV") for o in options)
    counts = []
    for call in ("first", "remembered", "gemv edited"):
        if call == "gemv edited":
            monkeypatch.setattr(gemv.gemv_kmajor, "source_key", lambda: "0" * 64)
        monkeypatch.setattr(schedules, "_CHOSEN", {})  # a fresh process: only the disk remembers
        monkeypatch.setattr(mh, "_PREPARED", {})
        before = len(timed)
        mh.matmul(a, w.t())
        counts.append(len(timed) - before)
    assert counts == [len(options), 0, len(options)]

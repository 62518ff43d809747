"""Fresh random explicit configs of the Hopper matmul (examples/matmul_hopper.py) and the grouped matmul
(examples/grouped_matmul.py), interpreted on random small shapes and operand layouts: each computes what torch
does into a NaN-poisoned output, or is refused by a check that names what it cannot do. An autotuning sweep
hands the wrappers configs like these; the fifty-second session's sweep of 40 found one that ran and left rows of
C unwritten (BM=100), one that deadlocked (STAGES=1: a hang on a GPU), one that divided by zero (GROUP_M=0) and
widths that failed deep in the SMEM allocation. Each case's shape, layouts and config are in its failure's
message."""
import os
import random
import sys

import torch

import mgjit
from mgjit.errors import LaunchError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import _device  # noqa: E402
import grouped_matmul as gm  # noqa: E402
import matmul_hopper as mh  # noqa: E402

BF16 = torch.bfloat16
CASES = 40
# Refusals that name what cannot be: the kernel's static assertions and the SMEM, TMA and launch checks
NAMED = ("static assertion failed", "swizzle", "shared memory", "num_warpgroups", "multicast", "TMA")


def random_config(rng: random.Random) -> dict:
    """Mostly configs the kernel runs, some it must refuse: BM off the 64-row consumers, BN off wgmma's N or
    off a swizzle row, one stage, GROUP_M of 0."""
    cfg = {"BM": rng.choice([64, 128, 192, 64, 128, 192, 100, 256]),
           "BN": rng.choice([8, 16, 32, 40, 64, 96, 128, 144, 160, 192, 256, 100])}
    if rng.random() < 0.4:
        cfg["STREAM_K"] = rng.choice([1, 2])
        if rng.random() < 0.5:
            cfg["SPLIT"] = rng.choice([2, 3, 4])
    if rng.random() < 0.25:
        cfg["SWAP_AB"] = True
    if rng.random() < 0.25:
        cfg["MULTICAST"], cfg["CLUSTER"] = rng.choice(["a", "b"]), rng.choice([2, 4])
    for key, values, p in (("STAGES", [1, 2, 3], 0.2), ("DETERMINISTIC", [False], 0.2),
                           ("TMA_STORE", [True, False], 0.2), ("BK", [32, 64, 128], 0.2),
                           ("GROUP_M", [0, 1, 3, 8], 0.2), ("EPILOGUE_N", [16, 32, 64], 0.1)):
        if rng.random() < p:
            cfg[key] = rng.choice(values)
    return cfg


def test_random_configs_compute_what_torch_does_or_are_refused_by_name(monkeypatch, poison_empty):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(_device, "_KEPT", {})
    rng = random.Random()
    ran = 0
    for _ in range(CASES):
        sms = rng.choice([2, 3, 5, 8])
        monkeypatch.setattr(mh, "sm_count", lambda device, s=sms: s)
        m, n, k = rng.choice([1, 3, 17, 77, 130, 200]), rng.choice([8, 40, 136, 264]), rng.choice([64, 136, 320])
        a_t, b_kmajor = rng.random() < 0.3, rng.random() < 0.4
        a = torch.randn(k, m, dtype=BF16).t() if a_t else torch.randn(m, k, dtype=BF16)
        b = torch.randn(n, k, dtype=BF16) if b_kmajor else torch.randn(k, n, dtype=BF16)
        cfg = random_config(rng)
        case = f"{m}x{n}x{k}, A {'transposed' if a_t else 'row-major'}, B {'K' if b_kmajor else 'N'}-major, " \
               f"{sms} SMs, {cfg}"
        try:
            c = mh.matmul(a, b, cfg, b_kmajor=b_kmajor)
        except (mgjit.CompileError, LaunchError) as e:
            assert any(word in str(e) for word in NAMED), f"{case}: refused without naming why: {e}"
            continue
        ref = a.double() @ (b.double().t() if b_kmajor else b.double())
        assert not c.isnan().any(), f"{case}: some of the poisoned output was never written"
        assert ((c.double() - ref).norm() / ref.norm()).item() < 5e-3, case
        ran += 1
    assert ran, "no random config ran"


def test_random_grouped_configs_compute_what_torch_does_or_are_refused_by_name(monkeypatch, poison_empty):
    """Ragged groups (some empty), K- or N-major weights, BM, BN, STAGES and GROUP_M drawn with values the kernel
    must refuse among them (BM=100 left rows of each tile unwritten)."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    rng = random.Random()
    ran = 0
    for _ in range(CASES // 2):
        sms = rng.choice([2, 3, 5])
        monkeypatch.setattr(gm, "sm_count", lambda index, s=sms: s)
        sizes = [rng.choice([0, 1, 50, 130]) for _ in range(rng.choice([1, 2, 3]))]
        k, n, w_kmajor = rng.choice([64, 136]), rng.choice([64, 136, 200]), rng.random() < 0.5
        offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
        x = torch.randn(sum(sizes), k, dtype=BF16)
        w = torch.randn(len(sizes), n, k, dtype=BF16).transpose(1, 2) if w_kmajor else \
            torch.randn(len(sizes), k, n, dtype=BF16)
        cfg = {key: rng.choice(values) for key, values in (("BM", [64, 128, 100]), ("BN", [64, 128, 256, 32, 96]),
                                                            ("STAGES", [1, 2, 3]), ("GROUP_M", [0, 1, 8]))
               if rng.random() < 0.4}
        case = f"groups {sizes}, K {k}, N {n}, weights {'K' if w_kmajor else 'N'}-major, {sms} SMs, {cfg}"
        try:
            out = gm.grouped_matmul(x, w, offs, config=cfg)
        except (mgjit.CompileError, LaunchError) as e:
            assert any(word in str(e) for word in NAMED), f"{case}: refused without naming why: {e}"
            continue
        if x.shape[0]:
            ref = gm.reference(x, w, offs).double()
            assert not out.isnan().any(), f"{case}: some of the poisoned output was never written"
            assert ((out.double() - ref).norm() / ref.norm()).item() < 5e-3, case
        ran += 1
    assert ran, "no random config ran"

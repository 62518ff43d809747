"""Decode GEMV with N-major weights (b given (K, N)): every gemv_nmajor candidate (examples/_matmul_gemv.py), forced,
against torch.matmul (cuBLAS), the fastest swap-AB wgmma candidate (what the wrapper ran before the GEMV), the
wrapper's own pick and an autotuned Triton matmul, in one process, timed interleaved.

    python benchmarks/gemv_nmajor.py [--rounds 5] [--shapes 3x4096x4096 ...] [--no-triton]

Shapes are M x N x K, bf16. Each contender is checked against an fp32 reference first. Every timing is the median
of triton.testing.do_bench (L2 flushed before each run) over the interleaved rounds, after a warm-up; the operands
rotate over enough copies (at least 4) to exceed twice the L2. Prints us, the weights' TB/s (all of a, b and c
counted) and the ratio to cuBLAS (above 1: faster than cuBLAS).
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _matmul_gemv as gemv  # noqa: E402
import _matmul_schedules as schedules  # noqa: E402
from matmul import rel_err, triton_matmul  # noqa: E402
from _device import sm_count  # noqa: E402
from matmul_hopper import matmul  # noqa: E402

SHAPES = [(1, 4096, 4096), (3, 4096, 4096), (4, 8192, 8192), (3, 4096, 14336), (3, 14336, 4096)]
L2_BYTES = 50 * 2 ** 20  # H100 SXM


def rotating(fn, copies):
    """fn over the next (a, b) of `copies` on each call."""
    turn = itertools.cycle(copies)
    return lambda: fn(*next(turn))


def run_shape(m: int, n: int, k: int, rounds: int, tmm) -> None:
    from triton.testing import do_bench
    nbytes = 2 * (m * k + k * n + m * n)
    count = max(4, -(-2 * L2_BYTES // nbytes))
    copies = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
               torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(count)]
    a, b = copies[0]
    ref = a.float() @ b.float()
    problem = schedules.Problem.of(a, b, False, torch.bfloat16, False, False, None)
    options = schedules.candidates(problem, sm_count(a.device.index))
    fns = {"cuBLAS": lambda x, y: torch.matmul(x, y), "wrapper's pick": lambda x, y: matmul(x, y)}
    for cfg in options:
        if cfg.get("SWAP_AB") or cfg.get("GEMV") == "n-major":
            fns[schedules.describe(cfg)] = lambda x, y, cfg=cfg: matmul(x, y, config=cfg)
    if tmm:
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in copies]
        slot = {id(x): o for (x, _), o in zip(copies, outs)}
        fns["Triton"] = lambda x, y: tmm(x, y, slot[id(x)])
    for who, fn in fns.items():  # warm-up (the wrapper times its candidates here), and the results checked
        err = rel_err(fn(a, b), ref)
        assert err < 1e-2, f"{who}: relative error {err}"
    samples = {who: [] for who in fns}
    timed = {who: rotating(fn, copies) for who, fn in fns.items()}
    for _ in range(rounds):  # interleaved: a clock or thermal drift hits every contender alike
        for who, fn in timed.items():
            samples[who].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    ms = {who: statistics.median(v) for who, v in samples.items()}
    swap = min((who for who in ms if who.startswith("swap-AB")), key=ms.get)
    print(f"\n{m}x{n}x{k} bf16, b (K, N): {len(copies)} copies of {nbytes / 2 ** 20:.1f} MiB; the wrapper picks "
          f"{schedules.describe(schedules.chosen(a, b))}")
    for who in sorted(ms, key=ms.get):
        mark = "  <- fastest swap-AB" if who == swap else ""
        print(f"  {who:<62} {ms[who] * 1e3:8.2f} us {nbytes / ms[who] / 1e9:6.2f} TB/s "
              f"{ms['cuBLAS'] / ms[who]:6.3f}x cuBLAS{mark}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", nargs="*", help="M x N x K, e.g. 3x4096x4096")
    ap.add_argument("--no-triton", action="store_true")
    args = ap.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes else SHAPES
    tmm = None if args.no_triton else triton_matmul()
    print(f"{torch.cuda.get_device_name()}; gemv_nmajor candidates per shape: "
          f"{len(gemv.NMAJOR_TILES)}; rounds: {args.rounds}")
    for m, n, k in shapes:
        run_shape(m, n, k, args.rounds, tmm)


if __name__ == "__main__":
    main()

"""Explicit Hopper matmul configs against cuBLAS, interleaved: what a schedule or tile would give on a shape,
beside the one the wrapper chooses (`auto`), without editing the heuristics.

    python benchmarks/matmul_configs.py 4096x4096x4096 auto BM=128,BN=128,PINGPONG=1 \\
        256x512x65536 auto BM=128,BN=64,STREAM_K=1,SPLIT=8,MULTICAST=a,DETERMINISTIC=0

A shape is MxNxK, optionally with :b-t (B given as a transposed (N, K) weight), :a-strided or :f16; the configs
after it (keys of matmul_kernel's constexprs plus SWAP_AB and SPLIT, `auto` for the wrapper's own choice) are
timed on it. Each config is first checked against an fp32 reference into a NaN-poisoned output; then cuBLAS
and every config are timed round-robin (`--rounds`, each a do_bench median with L2 flushed), each config as
a repeated call of the wrapper launches it once chosen (its per-call path), and the medians and their ratios to
cuBLAS are printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import _matmul_schedules as schedules  # noqa: E402
import matmul_hopper as mh  # noqa: E402
from matmul import DTYPES, median_ms, operands, parse_shape, rel_err  # noqa: E402


def parse_config(text: str) -> dict | None:
    """`auto` -> None; `BM=128,MULTICAST=a,PINGPONG=1` -> {"BM": 128, "MULTICAST": "a", "PINGPONG": True}."""
    if text == "auto":
        return None
    out: dict = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if value.lstrip("-").isdigit():
            out[key] = int(value)
            if key in ("PINGPONG", "DETERMINISTIC", "TMA_STORE", "SWAP_AB"):
                out[key] = bool(out[key])
        else:
            out[key] = None if value == "None" else value
    return out


def parse(args: list[str]) -> list[tuple[tuple, list]]:
    """[(shape, [config or None, ...]), ...] from the command line's shapes and configs."""
    runs: list[tuple[tuple, list]] = []
    for arg in args:
        shape = parse_shape(arg)
        if shape is not None:
            runs.append((shape, []))
        elif not runs:
            raise SystemExit(f"a config before any shape: {arg}")
        else:
            runs[-1][1].append(parse_config(arg))
    return runs


def time_shape(shape: tuple, configs: list, rounds: int) -> None:
    m, n, k, dtype_name, layout = shape
    a, b = operands(m, n, k, DTYPES[dtype_name], layout)
    ref = a.float() @ b.float()
    mh.matmul(a, b)  # the wrapper's choice, timed once
    problem = schedules.Problem.of(a, b, False, a.dtype, False, False, None)
    names, fns = ["cuBLAS"], [lambda: torch.matmul(a, b)]
    for cfg in configs:
        if cfg is None:
            names.append("auto: " + schedules.describe(schedules.chosen(a, b)))
            fns.append(lambda: mh.matmul(a, b))
            continue
        full = schedules.normalize(problem, cfg)
        c = mh._output(m, n, a.dtype, a.device).fill_(float("nan"))
        try:
            plan = mh._launch(problem, full, c, None, None)
        except Exception as error:  # noqa: BLE001 - a config the compiler refuses is reported, not fatal
            print(f"  {schedules.describe(full)}: refused: {str(error)[:200]}", flush=True)
            continue
        err = rel_err(c, ref)
        if not err < 1e-2:
            print(f"  {schedules.describe(full)}: WRONG (relative error {err:.2e})", flush=True)
            continue
        names.append(schedules.describe(full))
        # Timed as a repeated call runs once the wrapper chose: matmul(config=...) takes the whole Python path
        # each call, and kernels of 10-20 us measured that path (96x1240x8192, 64x64 split 3: 28.5 us a call
        # against a 15.5 us kernel).
        prepared = mh._Prepared(problem, plan, a, b, False, mh.sm_count(a.device.index))
        fns.append(lambda prepared=prepared: prepared(a, b, None, None))
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            samples[i] += median_ms(fn, 1)
    ms = [statistics.median(s) for s in samples]
    print(f"{m}x{n}x{k} {dtype_name} {layout or 'rows'}", flush=True)
    for name, t in zip(names, ms):
        print(f"  {t * 1e3:8.1f} us  {ms[0] / t:6.3f} of cuBLAS  {name}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("items", nargs="+", help="shapes (MxNxK[:b-t|:a-strided|:f16]), each followed by configs")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}")
    for shape, configs in parse(args.items):
        time_shape(shape, configs, args.rounds)


if __name__ == "__main__":
    main()

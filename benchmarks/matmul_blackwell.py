"""Blackwell matmul (examples/matmul_blackwell_ws.py): mgjit's warp-specialized persistent kernel, static and
CLC-scheduled, on 1 and 2 CTAs, against cuBLAS (torch.matmul) and a Triton matmul for bf16, and against
torch._scaled_mm for mxfp8 and nvfp4 (block scales in the same blocked layout), in one process, interleaved,
on inputs rotated through copies that together exceed L2. Each result is checked first; prints TFLOP/s and
ratios (medians of triton.testing.do_bench).

    python benchmarks/matmul_blackwell.py [--shapes 8192x8192x8192 ...] [--formats bf16 mxfp8 nvfp4] [--json f]

Needs a Blackwell GPU (sm_100); nothing here runs elsewhere.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys

import torch

import mgjit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)
import matmul_blackwell_ws as ws  # noqa: E402

SHAPES = ["8192x8192x8192", "4096x4096x4096", "16384x8192x1024", "1024x8192x8192"]
L2_BYTES = 128 << 20


def bench(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=100, rep=500, return_mode="median")


def rotated(make, nbytes: int):
    """Enough fresh input sets that cycling through them streams more than twice L2; returns next_set()."""
    sets = [make() for _ in range(max(1, math.ceil(2 * L2_BYTES / nbytes)))]
    return itertools.cycle(sets).__next__


def inputs(m: int, n: int, k: int, fmt: str) -> tuple:
    """Fresh (a, b_t, a_scales, b_scales), the scales already in the blocked layout both kernels read."""
    a, b, sa, sb = ws.make_inputs(m, n, k, fmt, "cuda")
    return (a, b, None, None) if sa is None else (a, b, mgjit.blocked_scales(sa), mgjit.blocked_scales(sb))


def scaled_mm(a, b_t, a_scales, b_scales):
    """torch._scaled_mm on block-scaled inputs (cuBLAS reads the same blocked scale layout, flattened)."""
    return torch._scaled_mm(a, b_t.t(), scale_a=a_scales.reshape(-1), scale_b=b_scales.reshape(-1),
                            out_dtype=torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=SHAPES)
    ap.add_argument("--formats", nargs="*", default=["bf16", "mxfp8", "nvfp4"])
    ap.add_argument("--json")
    ap.add_argument("--no-triton", action="store_true")
    args = ap.parse_args()
    if torch.cuda.get_device_capability() != (10, 0):
        raise SystemExit(f"needs a Blackwell GPU (sm_100), this is {torch.cuda.get_device_name()}")
    triton_run = None
    if not args.no_triton:
        from matmul import triton_matmul
        triton_run = triton_matmul()
    results = {"device": torch.cuda.get_device_name(), "rows": []}
    for fmt, shape in itertools.product(args.formats, args.shapes):
        m, n, k = map(int, shape.split("x"))
        x, y, sx, sy = ws.make_inputs(m, n, k, fmt, "cuda")
        ref = ws.reference(x, y, sx, sy)
        if sx is not None:  # both contenders read the scales blocked
            sx, sy = mgjit.blocked_scales(sx), mgjit.blocked_scales(sy)
        nbytes = x.numel() * x.element_size() + y.numel() * y.element_size()
        next_set = rotated(lambda: inputs(m, n, k, fmt), nbytes)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        row = {"format": fmt, "shape": shape, "ms": {}, "error": {}}
        contenders = {f"mgjit {v}{' clc' if clc else ''}": (lambda a, b, sa, sb, v=v, clc=clc:
                                                         ws.matmul(a, b, sa, sb, out=out, variant=v, clc=clc,
                                                                   blocked=True))
                      for v in ws.CONFIGS if v.startswith(fmt) for clc in (False, True)}
        if fmt == "bf16":
            contenders["cuBLAS"] = lambda a, b, sa, sb: torch.matmul(a, b.t())
            if triton_run is not None:
                contenders["triton"] = lambda a, b, sa, sb: triton_run(a, b.t(), out)
        else:
            contenders["torch._scaled_mm"] = scaled_mm
        for who, fn in contenders.items():
            out.fill_(float("nan"))
            try:
                got = fn(x, y, sx, sy)
            except Exception as e:  # noqa: BLE001 - a contender this torch/triton build lacks
                print(f"{fmt} {shape} {who}: failed ({type(e).__name__}: {str(e).splitlines()[0]})")
                continue
            err = ((got.double() - ref).norm() / ref.norm()).item()
            row["error"][who] = err
            if not err < 2e-2:
                print(f"{fmt} {shape} {who}: WRONG, relative error {err:.2e}")
                continue
            row["ms"][who] = bench(lambda fn=fn: fn(*next_set()))
        flops = 2 * m * n * k
        row["tflops"] = {who: flops / t / 1e9 for who, t in row["ms"].items()}
        results["rows"].append(row)
        base = row["ms"].get("cuBLAS") or row["ms"].get("torch._scaled_mm")
        print(f"{fmt} {shape}: " + "  ".join(
            f"{who} {tf:.0f} TFLOP/s" + (f" ({base / row['ms'][who]:.3f}x)" if base else "")
            for who, tf in row["tflops"].items()))
        del x, y, ref, next_set
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

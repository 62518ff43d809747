"""A picture of where a Hopper matmul's time goes: examples/matmul_hopper.py launched with its mgjit.trace spans
recorded (`profile=mgjit.Profile()`), written as a Chrome/Perfetto trace and a timeline PNG, with a summary per
span and what profiling costs (the profiled launch against the same kernel compiled without spans, and cuBLAS
for scale), timed interleaved with medians of CUDA-event timings.

    python benchmarks/profile_matmul.py [--shape 8192x8192x8192] [--out DIR] [--capacity 256]

Writes DIR/matmul_trace.json (open in ui.perfetto.dev or chrome://tracing), DIR/matmul_trace.png and
DIR/matmul_trace_summary.txt. Triton is not timed here: this script is about the picture, and the profiler's
own cost is measured against mgjit's kernel without spans.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import mgjit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from matmul_hopper import matmul  # noqa: E402


def timed(fn) -> float:
    """Milliseconds of one call, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8192x8192x8192", help="MxNxK")
    parser.add_argument("--out", default=".", help="directory for the trace JSON, PNG and summary")
    parser.add_argument("--capacity", type=int, default=256, help="events per warpgroup")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    m, n, k = map(int, args.shape.split("x"))
    # Two input sets, alternated, each larger than L2 at the default shape; random, never zeros.
    inputs = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
               torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    prof = mgjit.Profile(capacity=args.capacity)
    a, b = inputs[0]
    c = matmul(a, b, profile=prof)  # compiles the profiled variant
    err = ((c.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
    assert err < 1e-2, f"the profiled matmul is wrong: relative error {err:.2e}"
    matmul(a, b)  # and the plain one
    variants = {"mgjit": lambda x, y: matmul(x, y), "mgjit profiled": lambda x, y: matmul(x, y, profile=prof),
                "cuBLAS": lambda x, y: torch.matmul(x, y)}
    for fn in variants.values():  # warm-up
        for x, y in inputs:
            fn(x, y)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(args.reps):
        x, y = inputs[rep % 2]
        for name, fn in variants.items():
            times[name].append(timed(lambda: fn(x, y)))
    flops = 2 * m * n * k
    print(f"matmul {m}x{n}x{k} bf16, median of {args.reps} interleaved runs:")
    base = statistics.median(times["mgjit"])
    for name, ts in times.items():
        ms = statistics.median(ts)
        print(f"  {name:16} {ms * 1e3:9.1f} us  {flops / ms / 1e9:7.1f} TFLOP/s  {ms / base:5.3f}x mgjit")
    print("  (the profiled launch includes zeroing its buffer and the Python launch path)")
    matmul(*inputs[0], profile=prof)
    os.makedirs(args.out, exist_ok=True)
    prof.save(os.path.join(args.out, "matmul_trace.json"))
    try:
        prof.save(os.path.join(args.out, "matmul_trace.png"))
    except ImportError:
        print("matplotlib is missing: draw the PNG elsewhere with "
              "mgjit.Profile.from_chrome_trace('matmul_trace.json').save('matmul_trace.png')")
    summary = prof.summary()
    with open(os.path.join(args.out, "matmul_trace_summary.txt"), "w") as f:
        f.write(summary + "\n")
    print(summary)
    print(f"wrote {args.out}/matmul_trace.json, matmul_trace.png, matmul_trace_summary.txt "
          f"({len(prof.spans)} spans on {len({s.sm for s in prof.spans})} SMs)")


if __name__ == "__main__":
    main()

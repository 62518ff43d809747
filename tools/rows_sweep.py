"""Random row-example cases from their sm_90a PTX on the PTX simulator (tests/ptx_sim.py), against torch and the
interpreter: a kernel (softmax, rmsnorm, layernorm, cross-entropy), a dtype, a row length from 1 to 70000 (or to
--max-n: rows over 16 CTAs, of one program an SM, start near 116000 in bf16), one of
the wrapper's candidate mappings for it (held, chunked, streamed, persistent, piped over slots, clusters or
segments), a few rows of a random scale and offset, and when TMA copies land. What the CI suite checks on chosen
cases (tests/test_ptx_tma.py), over cases nobody chose: 549 of them found the 12-byte SMEM buffer read as 16
(benchmarks/RESULTS.md, eighteenth session).

    python tools/rows_sweep.py --seed 1 --count 200        # one line a case; exit status 1 if any failed
    python tools/rows_sweep.py --seed 1 --count 20 --max-n 262144   # long rows too (up to a minute a case)
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "tests")]
import test_ptx_tma  # noqa: E402

KERNELS = ("softmax", "rmsnorm", "layernorm", "cross_entropy")
DTYPES = (torch.bfloat16, torch.bfloat16, torch.float16, torch.float32)
ELEMENTS = 3_000_000  # a case's elements times its CTAs a row: about 10 seconds on the simulator


def case(rng: random.Random, max_n: int = 70000):
    """(kernel, n, dtype, mapping, rows, scale, offset, lands) of one random case, rows of up to max_n columns."""
    kernel, dtype = rng.choice(KERNELS), rng.choice(DTYPES)
    n = rng.choice([rng.randint(1, 300), rng.randint(300, 4200), rng.randint(4097, 20000), rng.randint(20000, max_n)])
    config = rng.choice(test_ptx_tma.candidates(kernel, n, dtype.itemsize))
    k = config.kwargs
    rows = rng.randint(1, 9)
    if k["PIPE"]:  # every program loops past its ring of slots
        rows = test_ptx_tma.ring_rows(config) + rng.randint(1, 5)
    rows = max(1, min(rows, ELEMENTS // (n * k["CTAS"])))
    if k["PIPE"]:
        rows = max(rows, test_ptx_tma.ring_rows(config) + 1)
    scale, offset, lands = rng.choice([1, 3, 10]), rng.choice([0, 1, -50]), rng.choice(["late", "early"])
    return kernel, n, dtype, config, rows, scale, offset, lands


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--max-n", type=int, default=70000, help="the longest row drawn (at least 20000)")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    failures = 0
    for i in range(args.count):
        kernel, n, dtype, config, rows, scale, offset, lands = case(rng, max(args.max_n, 20000))
        torch.manual_seed(args.seed * 100000 + i)
        x = (torch.randn(rows, n) * scale + offset).to(dtype)
        start = time.time()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                test_ptx_tma.simulate_rows(kernel, x, config, lands)
            status = "ok"
        except Exception as e:  # a failure is reported, and the sweep goes on
            failures += 1
            status = f"FAIL {type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"
        print(f"{i} {kernel} n={n} {str(dtype)[6:]} rows={rows} x*{scale}{offset:+} {lands} {config.short()} "
              f"{time.time() - start:.1f}s {status}", flush=True)
    print(f"{failures} of {args.count} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

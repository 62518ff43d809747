"""Wall time to compile N autotune candidates serially and in forked worker processes (mgjit.autotune's
compile pool), on the CPU: no GPU is needed, the target is named.

    python benchmarks/autotune_compile.py --target sm_90a --configs 100 [--jobs 16] [--synthetic-ms 300]

Each mode compiles its own N never-seen configs into its own fresh cache directory, after one warm-up
compile, so neither mode gets cache hits from the other or pays the other's imports. The kernel is a small
elementwise mgjit kernel whose configs vary a block size, the warpgroup count and a constant (every config
is a full compile: source to PTX to cubin). `--synthetic-ms` swaps in a stand-in compile that burns that
much CPU and writes a cache entry, to measure the pool itself where the compiler is not available.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any


def make_real_kernel() -> Any:
    import mgjit

    @mgjit.kernel
    def scale_add(x, y, out, n, BLOCK: mgjit.constexpr, ALPHA: mgjit.constexpr):
        start = mgjit.program_id(0) * BLOCK
        out[mgjit.ds(start, BLOCK)] = x[mgjit.ds(start, BLOCK)] * ALPHA + y[mgjit.ds(start, BLOCK)]

    return scale_add


class SyntheticKernel:
    """The `mgjit.kernel` interface with a compile that burns `ms` of CPU (not a sleep: a sleep would
    overlap on one core) and publishes its result in the kernel cache, as the real compile does."""

    name = "synthetic"
    arg_names = ["x", "y", "out", "n", "BLOCK", "ALPHA"]
    constexpr_names = ["BLOCK", "ALPHA"]

    def __init__(self, ms: float):
        self.ms = ms

    def source_key(self) -> str:
        return hashlib.sha256(b"synthetic").hexdigest()

    def compile(self, *args: Any, target: str | None = None, num_warpgroups: int = 1, cluster=(1, 1, 1),
                **constexprs: Any) -> Any:
        from types import SimpleNamespace

        from mgjit.cache import default_store

        key = hashlib.sha256(json.dumps([sorted(constexprs.items()), num_warpgroups, target]).encode()).hexdigest()
        store = default_store()
        if store.get(key) is None:
            deadline = time.perf_counter() + self.ms / 1000
            digest = b""
            while time.perf_counter() < deadline:
                digest = hashlib.sha256(digest).digest()
            store.put(key, {"kernel.cubin": digest * 1024}, {"registers": 64})
        return SimpleNamespace(name=self.name, key=key, target=target or "sm_90a", registers=64, spills=0,
                               smem_bytes=0, threads=128 * num_warpgroups)

    def __getitem__(self, grid: Any) -> Any:
        raise RuntimeError("the synthetic kernel only compiles")


def configs(count: int, offset: int) -> list:
    from mgjit.autotune import Config

    blocks = (256, 512, 1024, 2048)
    return [Config(BLOCK=blocks[i % 4], ALPHA=float(offset + i), num_warpgroups=1 + (i // 4) % 2)
            for i in range(count)]


def timed_compile(kernel: Any, candidates: list, args: tuple, target: str, jobs: int) -> tuple[float, int]:
    from mgjit.autotune import autotune

    os.environ["MGJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"mgjit-bench-j{jobs}-")
    tuned = autotune(configs=candidates, jobs=jobs)(kernel)
    start = time.perf_counter()
    outcomes = tuned.compile_all(*args, target=target)
    return time.perf_counter() - start, sum(o.pruned is not None for o in outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="sm_90a", help="compile target, e.g. sm_90a or sm_100a")
    parser.add_argument("--configs", type=int, default=100, help="candidates per mode")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="worker processes")
    parser.add_argument("--synthetic-ms", type=float, default=None,
                        help="use a stand-in compile burning this many ms of CPU instead of the compiler")
    parser.add_argument("--json", help="also write the numbers to this file")
    options = parser.parse_args()
    os.environ.setdefault("MGJIT_AUTOTUNE_QUIET", "1")

    import torch

    n = 1 << 20
    args = (torch.ones(n), torch.ones(n), torch.empty(n), n)
    kernel = make_real_kernel() if options.synthetic_ms is None else SyntheticKernel(options.synthetic_ms)
    warm_seconds, _ = timed_compile(kernel, configs(1, 10 * options.configs), args, options.target, 1)
    serial, pruned_serial = timed_compile(kernel, configs(options.configs, 0), args, options.target, 1)
    parallel, pruned_parallel = timed_compile(kernel, configs(options.configs, options.configs), args,
                                              options.target, options.jobs)
    result = {"kernel": kernel.name, "target": options.target, "configs": options.configs,
              "jobs": options.jobs, "cores": len(os.sched_getaffinity(0)), "warmup_s": round(warm_seconds, 3),
              "serial_s": round(serial, 3), "parallel_s": round(parallel, 3),
              "speedup": round(serial / parallel, 2), "pruned": [pruned_serial, pruned_parallel]}
    print(f"{result['kernel']} {options.target}: {options.configs} configs, first compile {warm_seconds:.2f} s; "
          f"serial {serial:.2f} s ({serial / options.configs * 1000:.0f} ms/config), "
          f"{options.jobs} jobs on {result['cores']} cores {parallel:.2f} s: {result['speedup']:.2f}x "
          f"(pruned {pruned_serial} / {pruned_parallel})")
    if options.json:
        Path(options.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

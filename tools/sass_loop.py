"""The SASS of the Hopper matmul's consumer k-loop, without a GPU: examples/matmul_hopper.py compiled here for the
heuristics' first candidate on a shape (or a config, as `benchmarks/matmul_configs.py` takes it), its cubin
disassembled by nvdisasm (`pip install nvidia-cuda-nvdisasm`), and each innermost loop that issues wgmmas counted
(`--print`: listed). What a compiler change does to the k-loop shows here before any device time: the
thirty-second session found a 256x512x65536 consumer spending 73 instructions a k-step on 4 HGMMAs (cuBLAS: 37
on 8), many of them moving descriptors from vector to uniform registers (R2UR), and cut it to 54.

    python tools/sass_loop.py 256x512x65536
    python tools/sass_loop.py 4096x4096x4096 BM=128,BN=128 --print
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "benchmarks")]
import _matmul_schedules as schedules  # noqa: E402
import matmul_hopper as mh  # noqa: E402
from matmul_configs import parse_config  # noqa: E402


def nvdisasm() -> str:
    """nvdisasm's path: on PATH, or from the nvidia-cuda-nvdisasm wheel."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
        for base in nvidia.__path__:
            for candidate in Path(base).glob("*/bin/nvdisasm"):
                return str(candidate)
    except ImportError:
        pass
    raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm")


def cubin(m: int, n: int, k: int, given: dict | None) -> tuple[bytes, str]:
    """(the cubin of the matmul kernel the wrapper would launch for bf16 (m, k) @ (k, n), its config in words)."""
    a, b = torch.empty(m, k, dtype=torch.bfloat16), torch.empty(k, n, dtype=torch.bfloat16)
    problem = schedules.Problem.of(a, b, False, torch.bfloat16, False, False, None)
    cfg = schedules.normalize(problem, given) if given else schedules.candidates(problem, 132)[0]
    plan = schedules.launch_plan(problem, cfg, 132)
    if plan.gemv:
        raise SystemExit(f"{schedules.describe(cfg)} runs on the CUDA cores: no wgmma loop")
    args = mh.kernel_args(problem, plan, torch.empty(m, n, dtype=torch.bfloat16), None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = mh.matmul_kernel.compile(*args, **plan.kernel_cfg, target="sm_90a")
    return compiled.cubin, schedules.describe(cfg)


def wgmma_loops(sass: str) -> list[list[str]]:
    """The instructions of each innermost loop (a backward branch's range, label to branch) holding a wgmma: the
    k-loops, not the work-item loops around them."""
    lines = [line.strip() for line in sass.splitlines()]
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\.L_x_\d+:", line)}
    spans = []
    for i, line in enumerate(lines):
        # A loop's back edge is a predicated branch; an unconditional one back is an out-of-line block (a barrier
        # wait's retry, placed after the function's body) returning into the loop.
        target = re.search(r"@!?U?P\w+\s+BRA `\((\.L_x_\d+)\)", line)
        if target and labels.get(target.group(1), i) < i:
            body = [x for x in lines[labels[target.group(1)]:i + 1] if x.startswith("/*")]
            if any("GMMA" in x for x in body):
                spans.append((labels[target.group(1)], i, body))
    return [body for start, end, body in spans
            if not any(start <= s and e <= end and (s, e) != (start, end) for s, e, _ in spans)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shape", help="MxNxK (bf16, row-major A and B)")
    p.add_argument("config", nargs="?", help="explicit config, as matmul_configs.py takes it (default: the pick)")
    p.add_argument("--print", action="store_true", help="print each loop's instructions")
    args = p.parse_args(argv)
    m, n, k = (int(x) for x in args.shape.split("x"))
    binary, described = cubin(m, n, k, parse_config(args.config) if args.config else None)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary)
        f.flush()
        sass = subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True, text=True).stdout
    print(f"{args.shape}: {described}")
    for body in wgmma_loops(sass):
        mma = sum("GMMA" in x for x in body)
        print(f"  loop of {len(body)} instructions: {mma} wgmma, {len(body) - mma} others")
        if args.print:
            print("\n".join("    " + re.sub(r"\s+", " ", x) for x in body))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The driver every example shares: compile-only without a GPU, check against torch and time with one.

An example describes itself with five callbacks and calls `run_example(...)` from its `__main__`:

    setup(device)               -> (inputs, out): fresh random inputs and an (uninitialised) output
    compile(*inputs, out, target=...) -> the CompiledKernel (or a list of them) that `run` launches
    run(*inputs, out=out)       -> launches the example's wrapper, writing `out`
    reference(*inputs)          -> what `out` should hold (torch; any float dtype, compared in float64)
    bytes_moved(*inputs, out)   -> bytes one `run` reads and writes, for GB/s (default: every tensor once)

Without a GPU (or with --compile-only) it compiles for --target (default sm_90a) into the cache
(MGJIT_CACHE_DIR if set) and prints what it built; `setup` then gets device "meta" (tensors with shapes,
dtypes and strides but no data, which is all a compile looks at). With a Hopper or Blackwell GPU it also
runs the wrapper on the fresh inputs with the output poisoned first, compares with the reference (exit
code 1 if wrong) and times it (triton.testing.do_bench's median when triton is importable, else CUDA
events).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import mgjit

GPU_TARGETS = {(9, 0): "sm_90a", (10, 0): "sm_100a"}
IR_LINES = 12


def _gpu_target() -> str | None:
    if not torch.cuda.is_available():
        return None
    return GPU_TARGETS.get(torch.cuda.get_device_capability())


def compile_only_elsewhere(target: str, name: str, argv: list[str]) -> tuple[list[str], bool]:
    """For an example whose kernels run on `target` GPUs alone: (argv, whether it now only compiles). Unless this
    machine has such a GPU or argv names a --target, it compiles for `target`, saying so next to another GPU."""
    if _gpu_target() == target or any(arg.startswith("--target") for arg in argv):
        return argv, False
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        print(f"{name} needs a {target} GPU; this GPU is sm_{major}{minor} ({torch.cuda.get_device_name()}): "
              f"compiling for {target} only")
    return [*argv, "--target", target], True


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output with values no correct kernel writes, so that an element it skips fails the check."""
    return t.fill_(float("nan")) if t.dtype.is_floating_point else t.fill_(-12345)


def default_bytes_moved(*tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def describe(c: mgjit.CompiledKernel) -> str:
    """A few lines saying what was built and where it is kept."""
    from mgjit.cache import default_store
    store = default_store()
    entry = store.get(c.key)
    where = entry.path if entry is not None and entry.path is not None else store.root
    ptxas = next((line.split(":", 1)[1].strip() for line in c.ptxas_report.splitlines() if "Used" in line), "?")
    how = "cache hit" if c.from_cache else f"compiled in {c.meta.get('compile_seconds', 0):.2f} s"
    ir_lines = c.ir.splitlines()
    # At least up to the first register array, whose layout is what the IR shows best.
    count = max(IR_LINES, next((i + 1 for i, line in enumerate(ir_lines) if "TiledLayout(" in line), 0))
    shown = "\n".join("    " + line for line in ir_lines[:count])
    more = f"\n    ... ({len(ir_lines) - count} more lines: CompiledKernel.ir)" if len(ir_lines) > count else ""
    return (f"kernel     {c.name}\n"
            f"target     {c.target}\n"
            f"launch     {c.meta.get('specialization', '')}\n"
            f"resources  {c.registers} registers, {c.spills} bytes spilled, {c.smem_bytes} bytes dynamic smem, "
            f"{c.threads} threads\n"
            f"ptxas      {ptxas}\n"
            f"cache      {how}: {where}\n"
            f"key        {c.key}\n"
            f"IR (layouts inferred):\n{shown}{more}")


def _time_ms(fn: Callable[[], Any]) -> tuple[float, str]:
    """Median milliseconds per call of fn."""
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        try:
            return float(do_bench(fn, return_mode="median")), "triton.testing.do_bench, median"
        except TypeError:  # older triton: no return_mode
            return float(do_bench(fn, quantiles=[0.5])[0]), "triton.testing.do_bench, median"
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(100)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(100)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)), "CUDA events, median of 100"


def check(out: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> tuple[bool, float]:
    """(all within atol + rtol * |expected|, max absolute error), NaN anywhere in `out` being wrong."""
    o, e = out.double(), expected.double().to(out.device)
    if o.shape != e.shape:
        return False, math.inf
    err = (o - e).abs()
    max_err = err.max().item() if err.numel() else 0.0
    ok = bool(torch.isfinite(o).all()) and bool((err <= atol + rtol * e.abs()).all())
    return ok, max_err


def run_example(name: str, *, setup: Callable[[str], tuple[Sequence[Any], torch.Tensor]],
                compile: Callable[..., Any], run: Callable[..., Any], reference: Callable[..., torch.Tensor],
                bytes_moved: Callable[..., int] | None = None, rtol: float = 1e-5, atol: float = 1e-6,
                argv: Sequence[str] | None = None) -> int:
    """Compile (and, with a GPU, check and time) one example; returns the process exit code."""
    parser = argparse.ArgumentParser(description=f"mgjit example: {name}")
    parser.add_argument("--target", help="compile for this target (sm_90a, sm_100a); default: this GPU's, "
                                         "or sm_90a without one")
    parser.add_argument("--compile-only", action="store_true", help="do not run even if a GPU is present")
    args = parser.parse_args(argv)

    gpu = _gpu_target()
    if torch.cuda.is_available() and gpu is None:
        major, minor = torch.cuda.get_device_capability()
        print(f"this GPU is sm_{major}{minor}; mgjit runs on Hopper (sm_90a) and Blackwell (sm_100a): compiling only")
    target = args.target or gpu or "sm_90a"
    will_run = gpu is not None and target == gpu and not args.compile_only
    # Compiling needs only shapes, dtypes, strides and alignment: without a GPU the inputs are meta tensors.
    device = "cuda" if will_run else "meta"

    print(f"== mgjit example: {name} ==")
    inputs, out = setup(device)
    start = time.perf_counter()
    built = compile(*inputs, out, target=target)
    seconds = time.perf_counter() - start
    built = list(built) if isinstance(built, (list, tuple)) else [built]
    for c in built:
        print(describe(c))
    print(f"compile() took {seconds:.2f} s")
    if not will_run:
        reason = ("--compile-only" if args.compile_only else f"--target {target} is not this GPU ({gpu})" if gpu
                  else "no GPU")
        print(f"{reason}: compiled for {target}, not run")
        return 0

    poison(out)
    run(*inputs, out=out)
    torch.cuda.synchronize()
    expected = reference(*inputs)
    ok, max_err = check(out, expected, rtol, atol)
    print(f"check      max abs error {max_err:.3e} vs torch (rtol {rtol:g}, atol {atol:g}): "
          f"{'OK' if ok else 'WRONG'}")
    if not ok:
        return 1
    ms, how = _time_ms(lambda: run(*inputs, out=out))
    nbytes = bytes_moved(*inputs, out) if bytes_moved else default_bytes_moved(*inputs, out)
    print(f"time       {ms * 1e3:.1f} us ({how}), {nbytes / (ms * 1e-3) / 1e9:.0f} GB/s "
          f"({nbytes / 1e6:.1f} MB moved) on {torch.cuda.get_device_name()}")
    return 0


def main(**kwargs) -> None:
    """`run_example` as a script's exit status."""
    sys.exit(run_example(**kwargs))

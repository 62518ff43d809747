"""The autotuned Hopper matmul against exhaustive timing of its own search space, and the sweep's cost
against Triton's autotuning of its matmul (issue 4, item 7).

    python benchmarks/autotune_matmul.py [--json out.json]   # the shape suite: ~3-5 minutes on an H100/H200
    python benchmarks/autotune_matmul.py --quick              # 2 shapes, 3 configs: a smoke run (~1 minute)
    python benchmarks/autotune_matmul.py --dry-run [--quick]  # no GPU: build the spaces, compile for sm_90a

It exits with status 1 when a pick is more than 3% slower than the best or a config computes a wrong result.

For each shape (bf16 in, fp32 accumulate, bf16 out):

1. the space: the cartesian product of SPACES[space], less the configs that RULES drop before anything
   compiles (the wgmma tile shape, the 128-byte swizzle against BK's row bytes, the shared-memory budget,
   and in the default space a minimum pipeline depth); the compiler rejects the swizzle and the budget
   too, but only after tracing the kernel;
2. the mgjit autotuner sweeps it (`mgjit.autotune`, default CUDA-event timer) with a fresh kernel object and
   a fresh cache directory, so that every shape pays a cold sweep: wall time of the first call, split into
   the compile phase and the timing phase (`TuningReport.compile_seconds` / `timing_seconds`);
3. every config of the space is checked against torch (poisoned output) and timed here with
   `triton.testing.do_bench` (median; L2 flushed before each run) on the same inputs; the best few and the
   autotuner's pick are timed again, interleaved, three times, and their medians decide;
4. pick / best must be <= 1.03;
5. Triton's autotuner for its matmul (`benchmarks/matmul.py`, six configs; with --triton-same-space also over
   this space's configs where Triton can express them) in a fresh TRITON_CACHE_DIR and a fresh kernel
   object: wall time of the first, synchronized call.

Both compilers are warmed up first (imports, driver) in throwaway cache directories, so that the first
shape does not pay a one-time cost that the others do not.
"""
from __future__ import annotations

import argparse
import atexit
import functools
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "examples")))
sys.path.insert(0, HERE)
import _matmul_schedules as schedules  # noqa: E402
from matmul_hopper import _tma_ready, matmul_kernel  # noqa: E402
from mgjit.autotune import Config, autotune, expand_space  # noqa: E402
from mgjit.autotune.prune import apply_user_pruning  # noqa: E402

SHAPES = ["8192x8192x8192", "4096x4096x4096", "16384x8192x1024", "128x8192x8192", "1000x3000x2000"]
QUICK_SHAPES = ["4096x4096x4096", "1000x3000x2000"]

# The kernel: two consumer warpgroups of BM // 2 = 64 rows each (so BM is 128), one wgmma of N = BN per
# k-step (N <= 256, a multiple of 8), 128-byte swizzled SMEM tiles; GROUP_M row tiles share a column sweep.
# Counts below are for bf16 with the kernel's TMA-store epilogue (its default, TMA_STORE=True).
SPACES: dict[str, dict[str, list[int]]] = {
    # 4 x 3 x 5 x 2 = 120 candidates, 38 after the rules.
    "default": dict(BM=[128], BN=[64, 128, 192, 256], BK=[32, 64, 128], STAGES=[2, 3, 4, 5, 6], GROUP_M=[8, 16]),
    # The same without the pipeline-depth rule: 42 after the rules.
    "full": dict(BM=[128], BN=[64, 128, 192, 256], BK=[32, 64, 128], STAGES=[2, 3, 4, 5, 6], GROUP_M=[8, 16]),
    # The default space with the epilogue as a dimension: SMEM-staged TMA store or direct stores, which
    # leave room for a deeper ring (240 candidates, 78 after the rules).
    "epilogue": dict(BM=[128], BN=[64, 128, 192, 256], BK=[32, 64, 128], STAGES=[2, 3, 4, 5, 6], GROUP_M=[8, 16],
                     TMA_STORE=[True, False]),
    # 4 candidates, all kept by the rules.
    "quick": dict(BM=[128], BN=[128, 256], BK=[64], STAGES=[3, 4], GROUP_M=[8]),
}

SMEM_LIMIT = 232448   # bytes of shared memory one block may use on sm_90 (227 KB)
SMEM_RESERVE = 1024   # for the mbarriers (16 bytes per stage today) and alignment
SWIZZLE_BYTES = 128   # the kernel's SMEM tiles are 128-byte swizzled
MIN_K_IN_FLIGHT = 192  # the default space's pipeline-depth rule: STAGES * BK >= this


def _element_size(named: Mapping[str, Any], name: str) -> int:
    tensor = named.get(name)
    return tensor.element_size() if hasattr(tensor, "element_size") else 2


def tma_store(config: Config, named: Mapping[str, Any]) -> bool:
    """Whether the kernel stages its epilogue in SMEM: the config's TMA_STORE, else the call's, else the
    kernel's default."""
    if "TMA_STORE" in config.kwargs:
        return bool(config.kwargs["TMA_STORE"])
    return bool(named.get("TMA_STORE", matmul_kernel.defaults.get("TMA_STORE", False)))


def smem_bytes(config: Config, named: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """(ring, epilogue) bytes of shared memory: STAGES slots of an A tile (BM x BK) and a B tile (BK x BN),
    and with the TMA-store epilogue each consumer's two chunk buffers (examples/_matmul_schedules.epilogue_bytes)."""
    named = named or {}
    k = config.kwargs
    ring = k["STAGES"] * (k["BM"] * k["BK"] + k["BK"] * k["BN"]) * _element_size(named, "a")
    epilogue = schedules.epilogue_bytes(k["BM"] // 64, k["BN"], _element_size(named, "c")) \
        if tma_store(config, named) else 0
    return ring, epilogue


def wgmma_shape(config: Config, named: Mapping[str, Any]) -> str | None:
    k = config.kwargs
    if k["BM"] != 128:
        return f"wgmma-shape: BM={k['BM']}, but the kernel's two consumer warpgroups take 64 rows each (BM=128)"
    if not (8 <= k["BN"] <= 256 and k["BN"] % 8 == 0):
        return f"wgmma-shape: BN={k['BN']} is not a wgmma N (a multiple of 8 up to 256)"
    return None


def swizzle_width(config: Config, named: Mapping[str, Any]) -> str | None:
    row = config.kwargs["BK"] * _element_size(named, "a")
    if row % SWIZZLE_BYTES:
        return (f"swizzle-width: BK={config.kwargs['BK']} rows are {row} bytes, not a multiple of the "
                f"{SWIZZLE_BYTES}-byte swizzle")
    return None


def smem_budget(config: Config, named: Mapping[str, Any]) -> str | None:
    ring, epilogue = smem_bytes(config, named)
    need = ring + epilogue + SMEM_RESERVE
    if need > SMEM_LIMIT:
        return (f"smem-budget: kernel needs {need} bytes of shared memory (ring {ring}, epilogue {epilogue}, "
                f"{SMEM_RESERVE} reserved), the limit is {SMEM_LIMIT}")
    return None


def pipeline_depth(config: Config, named: Mapping[str, Any]) -> str | None:
    k = config.kwargs
    if k["STAGES"] * k["BK"] < MIN_K_IN_FLIGHT:
        return (f"pipeline-depth: STAGES*BK = {k['STAGES'] * k['BK']} K elements in flight < {MIN_K_IN_FLIGHT}, "
                f"too shallow a ring to hide the loads")
    return None


RULES = {"default": [wgmma_shape, swizzle_width, smem_budget, pipeline_depth],
         "full": [wgmma_shape, swizzle_width, smem_budget],
         "epilogue": [wgmma_shape, swizzle_width, smem_budget, pipeline_depth],
         "quick": [wgmma_shape, swizzle_width, smem_budget]}


def build_space(space: str = "default", named: Mapping[str, Any] | None = None,
                ) -> tuple[list[Config], list[Config], dict[Config, str]]:
    """(every candidate, the ones the rules keep, the dropped ones with reasons)."""
    candidates = expand_space(SPACES[space])
    dropped = apply_user_pruning(candidates, named or {}, None, RULES[space])
    return candidates, [c for c in candidates if c not in dropped], dropped


def parse_shape(shape: str) -> tuple[int, int, int]:
    m, n, k = map(int, shape.lower().split("x"))
    return m, n, k


def kernel_args(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The kernel's runtime arguments for c = a @ b, as examples/matmul_hopper.matmul passes them: the
    optional operands (`scale`, `bias`: read only when SCALED / BIAS) get c as a placeholder."""
    given = {"a": a, "b": b, "c": c}
    return tuple(given.get(name, c) for name in matmul_kernel.runtime_names)


@functools.cache
def sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def grid(meta: Mapping[str, Any]) -> tuple[int]:
    """The example's persistent grid: one CTA per output tile, at most one per SM."""
    tiles = -(-meta["a"].shape[0] // meta["BM"]) * -(-meta["b"].shape[1] // meta["BN"])
    return (min(tiles, sm_count(meta["a"].device.index)),)


def fresh_kernel() -> Any:
    """A new kernel object over the example's function: no in-process memo of earlier compiles."""
    return type(matmul_kernel)(matmul_kernel.fn, num_warpgroups=matmul_kernel.num_warpgroups)


def temp_dir(prefix: str) -> str:
    """A new temporary directory, removed when the process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def fresh_cache(tag: str) -> str:
    """Point mgjit's kernel cache (and so the autotuner's result store) at a new empty directory."""
    path = temp_dir(f"mgjit-autotune-{tag}-")
    os.environ["MGJIT_CACHE_DIR"] = path
    return path


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------------------- dry run


def dry_run(shapes: list[str], space: str, target: str, jobs: int | None) -> dict[str, Any]:
    """No GPU: build each shape's space and compile it for `target` with the autotuner's compile pool (a
    fresh cache directory per shape, as the GPU run has), and check the SMEM rule against the compiler's
    own count and its own budget check."""
    from mgjit.errors import CompileError

    out: dict[str, Any] = {"target": target, "space": space, "shapes": {}}
    x = torch.empty(16, 16, dtype=torch.bfloat16)
    candidates, kept, dropped = build_space(space, {"a": x, "c": x})
    print(f"space {space!r}: {len(candidates)} candidates, {len(kept)} kept by the rules, {len(dropped)} dropped")
    by_rule: dict[str, int] = {}
    for reason in dropped.values():
        by_rule[reason.split(":")[0]] = by_rule.get(reason.split(":")[0], 0) + 1
    print("  dropped by rule: " + ", ".join(f"{r} {n}" for r, n in sorted(by_rule.items())))
    out.update(candidates=len(candidates), kept=len(kept), dropped_by_rule=by_rule)
    fresh_cache("dry-warm")  # import the compiler once, as the GPU run's warm-up does
    start = time.perf_counter()
    fresh_kernel().compile(*kernel_args(x, x, x), target=target, BM=128, BN=64, BK=64, STAGES=2, GROUP_M=8)
    out["first_compile_s"] = round(time.perf_counter() - start, 3)
    print(f"  warm-up: first compile in this process {out['first_compile_s']:.2f} s (not counted below)")
    for shape in shapes:
        m, n, k = parse_shape(shape)
        a = torch.empty(m, k, dtype=torch.bfloat16)
        b = torch.empty(k, n, dtype=torch.bfloat16)
        c = torch.empty(m, n, dtype=torch.bfloat16)
        fresh_cache("dry")
        tuned = autotune(configs=candidates, key=["a", "b"], rules=RULES[space], jobs=jobs)(fresh_kernel())
        start = time.perf_counter()
        outcomes = tuned.compile_all(*kernel_args(_tma_ready(a), _tma_ready(b), c), target=target)
        seconds = time.perf_counter() - start
        compiled = [o for o in outcomes if o.compiled is not None]
        compile_pruned = {o.config.short(): o.pruned for o in outcomes if o.config in kept and o.compiled is None}
        # The rule's estimate against the compiler's own count.
        slack = sorted({o.compiled.smem_bytes - sum(smem_bytes(o.config, {"a": a, "c": c})) for o in compiled})
        over = [o.config.short() for o in compiled if o.compiled.smem_bytes > SMEM_LIMIT]
        regs = sorted({o.compiled.registers for o in compiled})
        print(f"{shape:>16}: {len(compiled)}/{len(kept)} compiled for {target} in {seconds:.2f} s "
              f"({jobs or 'default'} jobs on {len(os.sched_getaffinity(0))} cores); registers {regs}, "
              f"spills {sorted({o.compiled.spills for o in compiled})}; SMEM beyond the rule's estimate {slack} bytes")
        for name, reason in compile_pruned.items():
            print(f"{'':>18}pruned at compile: {name}: {reason}")
        if over:
            print(f"{'':>18}OVER THE SMEM LIMIT yet compiled: {over}")
        out["shapes"][shape] = {"compiled": len(compiled), "compile_s": round(seconds, 3),
                                "compile_pruned": compile_pruned, "smem_slack_bytes": slack,
                                "registers": regs, "over_smem_limit": over}
    # What the compiler should reject and does not: a ring over the budget.
    over_cfg = Config(BM=128, BN=256, BK=64, STAGES=5, GROUP_M=8)
    x = torch.empty(4096, 4096, dtype=torch.bfloat16)
    fresh_cache("dry-over")
    try:
        ck = fresh_kernel().compile(*kernel_args(x, x, x), target=target, **over_cfg.launch_kwargs())
        verdict = f"ACCEPTED by the compiler with smem={ck.smem_bytes} B > {SMEM_LIMIT} B (should be rejected)"
    except CompileError as error:
        verdict = f"rejected by the compiler: {str(error).splitlines()[0]}"
    print(f"over-budget config {over_cfg.short()}: {verdict}")
    out["over_budget_config"] = {"config": over_cfg.short(), "verdict": verdict}
    return out


# -------------------------------------------------------------------------------------------- GPU run


def bench(fn: Any, warmup: int, rep: int) -> float:
    """Median ms of `fn` with L2 flushed before each run: triton.testing.do_bench, or the autotuner's own
    CUDA-event timer where Triton is not installed."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return _event_timer(warmup, rep)(fn)
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


@functools.cache
def _event_timer(warmup: int, rep: int) -> Any:
    from mgjit.autotune import CudaEventTimer

    return CudaEventTimer(warmup_ms=warmup, rep_ms=rep)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def warm_up() -> dict[str, float]:
    """Import and initialize both compilers once, in throwaway cache directories."""
    times = {}
    fresh_cache("warm")
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    start = time.perf_counter()
    fresh_kernel()[(4,)](*kernel_args(x, x, y), BM=128, BN=64, BK=64, STAGES=2, GROUP_M=8)
    torch.cuda.synchronize()
    times["mgjit_first_compile_s"] = time.perf_counter() - start
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return times
    _set_triton_cache(temp_dir("triton-warm-"))

    @triton.jit
    def _copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    start = time.perf_counter()
    _copy[(1,)](x, y, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    times["triton_first_compile_s"] = time.perf_counter() - start
    return times


def _set_triton_cache(path: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = path
    import triton

    knobs = getattr(triton, "knobs", None)  # Triton >= 3.4 reads it through knobs (from the env by default)
    if knobs is not None:
        knobs.cache.dir = path


def triton_space_matmul(configs: list[Config]) -> Any:
    """benchmarks/matmul.py's Triton matmul, autotuned over `configs` (BM, BN, BK, GROUP_M, STAGES as
    num_stages, 8 warps like mgjit's two consumer warpgroups)."""
    from matmul import triton_matmul

    points = dict.fromkeys((c.kwargs["BM"], c.kwargs["BN"], c.kwargs["BK"], c.kwargs["GROUP_M"], c.kwargs["STAGES"], 8)
                           for c in configs)  # one per point: Triton has no TMA_STORE
    return triton_matmul(list(points))


def time_triton_sweep(make: Any, a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """Wall time of the first call of a fresh Triton autotuned matmul in a fresh cache directory."""
    _set_triton_cache(temp_dir("triton-autotune-"))
    run = make()
    c = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=a.dtype)
    torch.cuda.synchronize()
    start = time.perf_counter()
    run(a, b, c)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return {"wall_s": round(wall, 3), "rel_err": rel_err(c, ref), "ms": bench(lambda: run(a, b, c), 25, 200)}


def tune_shape(shape: str, space: str, options: argparse.Namespace) -> dict[str, Any]:
    m, n, k = parse_shape(shape)
    a = _tma_ready(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    b = _tma_ready(torch.randn(k, n, device="cuda", dtype=torch.bfloat16))
    ref = a.float() @ b.float()
    candidates, kept, dropped = build_space(space, {"a": a, "c": a})
    row: dict[str, Any] = {"shape": shape, "candidates": len(candidates), "kept_by_rules": len(kept)}

    # (2) The autotuner, cold: fresh kernel object, fresh cache directory.
    fresh_cache("sweep")
    kernel = fresh_kernel()
    tuned = autotune(configs=candidates, key=["a", "b"], rules=RULES[space], jobs=options.jobs)(kernel)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    tuned[grid](*kernel_args(a, b, c))
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    report = tuned.tuning_report()
    pick = report.winner.config
    timed = [r for r in report.rows if r.ms is not None]
    compile_pruned = {r.config.short(): r.pruned for r in report.rows if r.config in kept and r.ms is None}
    row["autotune"] = {
        "wall_s": round(wall, 3), "compile_s": round(report.compile_seconds, 3),
        "timing_s": round(report.timing_seconds, 3),
        "other_s": round(wall - report.compile_seconds - report.timing_seconds, 3),
        "compile_share": report.compile_seconds / wall, "timing_share": report.timing_seconds / wall,
        "timed": len(timed), "compile_pruned": compile_pruned, "pick": pick.short(),
        "pick_ms_by_tuner": report.winner.ms, "rel_err": rel_err(c, ref),
        "table": report.table(),
    }
    log(f"{shape}: autotune {wall:.2f} s (compile {report.compile_seconds:.2f} s, timing "
        f"{report.timing_seconds:.2f} s), {len(timed)} timed, pick {pick.short()}")

    # (3) Every config of the space, checked and timed here, on the same inputs.
    if not options.no_exhaustive:
        fns, exhaustive, errors, wrong = {}, {}, {}, {}
        start = time.perf_counter()
        for config in kept:
            kwargs = config.launch_kwargs()
            fn = functools.partial(kernel[grid(dict(a=a, b=b, **kwargs))], *kernel_args(a, b, c), **kwargs)
            c.fill_(float("nan"))
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as error:  # a compile error: it cannot be timed
                errors[config.short()] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
                continue
            err = rel_err(c, ref)
            if not err < 1e-2:
                wrong[config.short()] = err
                continue
            fns[config] = fn
            exhaustive[config] = bench(fn, options.warmup, options.rep)
        if not exhaustive:
            raise RuntimeError(f"{shape}: no config of the space ran correctly: {errors} {wrong}")
        first_best = min(exhaustive, key=exhaustive.get)
        # The closest few again, interleaved, with the autotuner's pick among them: their medians decide.
        finalists = sorted(exhaustive, key=exhaustive.get)[:options.finalists]
        if pick in fns and pick not in finalists:
            finalists.append(pick)
        rounds: dict[Config, list[float]] = {cfg: [] for cfg in finalists}
        for _ in range(options.rounds):
            for cfg in finalists:
                rounds[cfg].append(bench(fns[cfg], options.warmup, options.confirm_rep))
        confirmed = {cfg: statistics.median(ts) for cfg, ts in rounds.items()}
        best = min(confirmed, key=confirmed.get)
        ratio = confirmed[pick] / confirmed[best] if pick in confirmed else math.inf
        row["exhaustive"] = {
            "seconds": round(time.perf_counter() - start, 2), "timed": len(exhaustive), "errors": errors,
            "wrong": wrong,
            "ms": {cfg.short(): t for cfg, t in exhaustive.items()},
            "first_pass_best": first_best.short(),
            "first_pass_ratio": exhaustive[pick] / exhaustive[first_best] if pick in exhaustive else math.inf,
            "confirmed_ms": {cfg.short(): t for cfg, t in confirmed.items()},
            "best": best.short(), "best_ms": confirmed[best], "pick_ms": confirmed.get(pick),
            "ratio": ratio, "within_3pct": ratio <= 1.03,
            "tflops_pick": 2 * m * n * k / confirmed[pick] / 1e9 if pick in confirmed else None,
        }
        log(f"{shape}: exhaustive {len(exhaustive)} configs, best {best.short()} {confirmed[best]:.4f} ms, "
            f"pick/best {ratio:.4f}{'' if ratio <= 1.03 else '  OVER 3%'}"
            + (f"; {len(errors)} did not run: {errors}" if errors else "")
            + (f"; {len(wrong)} WRONG (relative error): {wrong}" if wrong else ""))
        row["cublas_ms"] = bench(functools.partial(torch.matmul, a, b), options.warmup, options.rep)

    # (5) Triton's autotuner over its own matmul, cold.
    if not options.no_triton:
        from matmul import triton_matmul

        row["triton"] = {"configs": 6, **time_triton_sweep(triton_matmul, a, b, ref)}
        log(f"{shape}: triton autotune (6 configs) {row['triton']['wall_s']:.2f} s")
        if options.triton_same_space:
            expressible = [cfg for cfg in kept if cfg.kwargs["BN"] & (cfg.kwargs["BN"] - 1) == 0]  # tl.arange
            sweep = time_triton_sweep(lambda: triton_space_matmul(expressible), a, b, ref)
            row["triton_same_space"] = {"configs": len({tuple(cfg.kwargs[n] for n in ("BN", "BK", "STAGES", "GROUP_M"))
                                                        for cfg in expressible}), **sweep}
            log(f"{shape}: triton autotune ({row['triton_same_space']['configs']} configs of this space) "
                f"{sweep['wall_s']:.2f} s")
    del a, b, c, ref
    torch.cuda.empty_cache()
    return row


def print_table(results: dict[str, Any]) -> None:
    warm = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in results["warm_up"].items())
    print(f"device: {results['device']}  space: {results['space']}  compile jobs: {results['jobs']}  "
          f"warm-up (not counted): {warm}")
    print(f"{'M x N x K':>16}  {'space':>5}  {'timed':>5}  {'sweep s':>7}  {'compile s':>13}  {'timing s':>13}  "
          f"{'pick / best':>11}  {'pick':<40} {'best':<40} {'TFLOP/s':>7}  {'Triton s':>8}")
    for r in results["rows"]:
        t = r["autotune"]
        ex = r.get("exhaustive")
        line = (f"{r['shape']:>16}  {r['kept_by_rules']:>5}  {t['timed']:>5}  {t['wall_s']:>7.2f}  "
                f"{t['compile_s']:>6.2f} ({t['compile_share']:>4.0%})  "
                f"{t['timing_s']:>6.2f} ({t['timing_share']:>4.0%})  ")
        if ex:
            line += f"{ex['ratio']:>11.4f}  {t['pick']:<40} {ex['best']:<40} {ex['tflops_pick'] or math.nan:>7.1f}  "
        else:
            line += f"{'-':>11}  {t['pick']:<40} {'-':<40} {'-':>7}  "
        if "triton" in r:
            line += f"{r['triton']['wall_s']:>8.2f}"
            if "triton_same_space" in r:
                line += f"  ({r['triton_same_space']['configs']} configs: {r['triton_same_space']['wall_s']:.2f} s)"
        print(line)
    ratios = [r["exhaustive"]["ratio"] for r in results["rows"] if "exhaustive" in r]
    if ratios:
        print(f"every pick within 3% of the exhaustive best: {all(x <= 1.03 for x in ratios)} "
              f"(worst {max(ratios):.4f})")
    wrong = {r["shape"]: r["exhaustive"]["wrong"] for r in results["rows"] if r.get("exhaustive", {}).get("wrong")}
    if wrong:
        print(f"configs with a wrong result: {wrong}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", help="MxNxK ... (default: the matmul issue's suite)")
    parser.add_argument("--space", choices=sorted(SPACES), help="default: 'default', or 'quick' with --quick")
    parser.add_argument("--quick", action="store_true", help="2 shapes, the 'quick' space: a smoke run")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: build and compile the spaces only")
    parser.add_argument("--target", default="sm_90a", help="compile target of --dry-run")
    parser.add_argument("--jobs", type=int, default=None, help="compile processes (default: the usable cores)")
    parser.add_argument("--no-exhaustive", action="store_true", help="skip the exhaustive timing")
    parser.add_argument("--no-triton", action="store_true", help="skip Triton's autotune sweep")
    parser.add_argument("--triton-same-space", action="store_true",
                        help="also time Triton's autotuner over this space (power-of-two BN only); slow")
    parser.add_argument("--warmup", type=int, default=25, help="do_bench warm-up (ms) of the exhaustive pass")
    parser.add_argument("--rep", type=int, default=200, help="do_bench repetition (ms) of the exhaustive pass")
    parser.add_argument("--confirm-rep", type=int, default=400, help="do_bench repetition (ms) of the finals")
    parser.add_argument("--finalists", type=int, default=3, help="configs timed again (plus the pick)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the finals")
    parser.add_argument("--json", help="also write the results to this file")
    options = parser.parse_args()
    shapes = options.shapes or (QUICK_SHAPES if options.quick else SHAPES)
    space = options.space or ("quick" if options.quick else "default")
    os.environ.setdefault("MGJIT_AUTOTUNE_QUIET", "1")

    if options.dry_run:
        start = time.perf_counter()
        results = dry_run(shapes, space, options.target, options.jobs)
        results["seconds"] = round(time.perf_counter() - start, 2)
        print(f"dry run: {results['seconds']:.1f} s")
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run to build and compile the spaces only")
        from mgjit.autotune.compile_pool import default_jobs

        start = time.perf_counter()
        results = {"device": torch.cuda.get_device_name(), "space": space, "space_values": SPACES[space],
                   "rules": [r.__name__ for r in RULES[space]],
                   "jobs": options.jobs or default_jobs(), "cores": len(os.sched_getaffinity(0)),
                   "torch": torch.__version__, "python": platform.python_version(),
                   "timing": {"warmup_ms": options.warmup, "rep_ms": options.rep,
                              "confirm_rep_ms": options.confirm_rep, "finalists": options.finalists,
                              "rounds": options.rounds}}
        try:
            import triton

            results["triton_version"] = triton.__version__
        except ImportError:
            options.no_triton = True
            log("triton is not installed: no Triton sweep, and the exhaustive pass times with CUDA events")
        results["warm_up"] = warm_up()
        results["rows"] = [tune_shape(shape, space, options) for shape in shapes]
        results["seconds"] = round(time.perf_counter() - start, 1)
        print_table(results)
        print(f"total {results['seconds']:.0f} s")
    if options.json:
        with open(options.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    failed = [r["shape"] for r in results.get("rows", [])
              if "exhaustive" in r and (not r["exhaustive"]["within_3pct"] or r["exhaustive"]["wrong"])]
    if failed:
        raise SystemExit(f"FAILED: a pick over 3% of the best, or a config with a wrong result, for {failed}")


if __name__ == "__main__":
    main()

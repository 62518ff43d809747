"""Memory-bound row kernels against copy bandwidth, over row lengths from 1 to 262144 and every dtype.

For each kernel (softmax, RMSNorm, LayerNorm, cross-entropy, a fused gelu_tanh(x) * y + z), dtype and row
length, it times mgjit's example wrapper, torch and Triton (benchmarks/triton_rows.py) in one run, interleaved,
on fresh random inputs of at least 256 MB moved (far beyond L2), and divides each by the time of a
device-to-device copy of the same number of bytes (read plus written) measured in the same run: 1.0 is copy
bandwidth. Every mgjit result is checked against torch first (outputs poisoned with NaN). mgjit's wrappers tune
their mapping on the first call for a shape (before anything is timed); the mapping picked is reported.
Cases that move less than TINY bytes are marked `tiny`: launch latency, not bandwidth, bounds them.

    python benchmarks/rows.py                    # the whole sweep; a table, rows.json, rows.md and rows.png in --out
    python benchmarks/rows.py --quick            # a few lengths per kernel
    python benchmarks/rows.py --kernels softmax --dtypes bfloat16 --lengths 4097 100000
    python benchmarks/rows.py --quick --candidates   # also every mapping the autotuner timed
    python benchmarks/rows.py --kernels layernorm rmsnorm --dtypes bfloat16 --weights float32   # f32 norm weights
    ROWS_TREE=abbase MGJIT_CACHE_DIR=/tmp/base python benchmarks/rows.py ...   # another tree's wrappers (an A/B)
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
# ROWS_TREE: another tree's mgjit and examples (`git archive <commit> mgjit autotune cache examples | tar -x -C DIR`:
# with autotune/ and cache/ its mgjit tunes and caches with its own, else with the installed tree's), so that two
# trees' tuned wrappers are timed in one call on one machine, each process with its own MGJIT_CACHE_DIR.
TREE = Path(os.environ.get("ROWS_TREE", HERE.parent)).resolve()
if not (TREE / "mgjit").is_dir() or not (TREE / "examples").is_dir():
    raise SystemExit(f"ROWS_TREE {TREE} holds no mgjit/ and examples/")
sys.path[:0] = [str(HERE), str(TREE), str(TREE / "examples")]

try:
    import _rows_launch  # noqa: E402
except ImportError:  # a ROWS_TREE from before the tuned launch left examples/_rows.py
    import _rows as _rows_launch  # noqa: E402

import cross_entropy as ce_example  # noqa: E402
import fused_elementwise as fe_example  # noqa: E402
import layernorm as ln_example  # noqa: E402
import rmsnorm as rms_example  # noqa: E402
import softmax as sm_example  # noqa: E402
from _rows_piped import piped_views  # noqa: E402

import mgjit  # noqa: E402

if not Path(mgjit.__file__).resolve().is_relative_to(TREE):
    raise SystemExit(f"mgjit imported from {mgjit.__file__}, not from ROWS_TREE {TREE}")

LENGTHS = [1, 3, 16, 100, 127, 128, 300, 1000, 1024, 1100, 2047, 4096, 4097, 5000, 8191, 8192, 8193, 16384, 32000,
           50257, 65536, 100000, 128256, 262144]
QUICK = [16, 1000, 4096, 4097, 32000, 100000]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
TARGET_BYTES = 256 << 20
TINY = 32 << 20


def for_dtypes(configs: tuple, dtypes: tuple, n: int, piped: bool = False) -> tuple:
    """The mappings the tree's wrapper launches for rows of n columns of `dtypes`, float64 rows piped too where
    `piped` (a kernel of _rows_launch.PIPED_FLOAT64); a ROWS_TREE from before float64 rows took their own
    mappings launched every dtype's alike, and older ones' for_dtypes take what they take."""
    if not hasattr(_rows_launch, "for_dtypes"):
        return configs
    takes = inspect.signature(_rows_launch.for_dtypes).parameters
    named = {k: v for k, v in (("n", n), ("piped", piped)) if k in takes}
    return _rows_launch.for_dtypes(configs, dtypes, **named)


def bench(fn, reps: int = 30) -> float:
    """Median milliseconds of fn (do_bench when triton is there, else CUDA events)."""
    try:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=10, rep=max(reps, 20), return_mode="median"))
    except ImportError:
        pass
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def copy_ms(nbytes: int) -> float:
    """A device-to-device copy that reads and writes nbytes in all."""
    half = max(nbytes // 2, 16)
    src = torch.empty(half, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


def rows_for(n: int, itemsize: int, tensors: int) -> int:
    return max(1, min(1 << 24, TARGET_BYTES // (max(n, 1) * itemsize * tensors)))


def relerr(out, ref) -> float:
    """The error relative to the reference's norm, or to 2^-20 an element where that is smaller: cross-entropy
    over rows of one column is 0 in every row (torch gives exactly 0, float32 logsumexps less the logit leave
    ~1e-6), which a plain relative error reported as 5e26."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / ref.norm().clamp_min(2 ** -20 * ref.numel() ** 0.5)).item()


def picked_mapping(kernel, configs: list, args: tuple, views: tuple = (), **constexprs):
    """A function giving the mapping mgjit's wrapper launched for these arguments and the autotuner's time of
    every candidate (call it after a launch)."""
    return lambda: (repr(_rows_launch.picked(kernel, configs, args, views, **constexprs)),
                    _rows_launch.timings(kernel, configs, args, views, **constexprs))


def wide(t: torch.Tensor) -> torch.Tensor:
    """What a reference computes in: float64 for float64 tensors, else float32."""
    return t.double() if t.dtype == torch.float64 else t.float()


def case(kernel: str, n: int, dtype: torch.dtype, weights: torch.dtype | None = None):
    """(runs {name: fn}, output, reference fn, bytes moved, mapping fn) for one kernel, length and dtype (the norms'
    weight and bias in `weights`, by default the rows' dtype: models often keep them in float32)."""
    import triton_rows as tr
    isz = torch.finfo(dtype).bits // 8
    wdtype = weights or dtype
    wsz = torch.finfo(wdtype).bits // 8
    if kernel == "softmax":
        m = rows_for(n, isz, 2)
        x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
        out = torch.empty_like(x)
        runs = {"mgjit": lambda: sm_example.softmax(x, out), "torch": lambda: torch.softmax(x, 1),
                "triton": lambda: tr.softmax(x, out)}
        ref = lambda: torch.softmax(wide(x), 1)  # noqa: E731
        itemsize, views = piped_views((x, out))
        configs = for_dtypes(sm_example.mapping(n, None, itemsize), (dtype,), n, piped=True)
        picked = picked_mapping(sm_example.softmax_kernel, configs, (x, out), views)
        return runs, out, ref, 2 * x.numel() * isz, picked
    if kernel in ("rmsnorm", "layernorm"):
        m = rows_for(n, isz, 2)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = torch.randn(n, device="cuda", dtype=wdtype)
        b = torch.randn(n, device="cuda", dtype=wdtype)
        out = torch.empty_like(x)
        if kernel == "rmsnorm":
            runs = {"mgjit": lambda: rms_example.rmsnorm(x, w, 1e-6, out),
                    "torch": lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-6),
                    "triton": lambda: tr.rmsnorm(x, w, out)}
            ref = lambda: torch.nn.functional.rms_norm(wide(x), (n,), wide(w), 1e-6)  # noqa: E731
            itemsize, views = piped_views((x, out), (w,))
            configs = for_dtypes(rms_example.rmsnorm_mapping(n, None, itemsize, (wsz,)), (dtype, wdtype), n,
                                 piped=True)
            picked = picked_mapping(rms_example.rmsnorm_kernel, configs, (x, w, out), views, eps=1e-6)
        else:
            runs = {"mgjit": lambda: ln_example.layernorm(x, w, b, 1e-5, out),
                    "torch": lambda: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5),
                    "triton": lambda: tr.layernorm(x, w, b, out)}
            ref = lambda: torch.nn.functional.layer_norm(wide(x), (n,), wide(w), wide(b), 1e-5)  # noqa: E731
            itemsize, views = piped_views((x, out), (w, b))
            configs = for_dtypes(ln_example.layernorm_mapping(n, None, itemsize, (wsz, wsz)), (dtype, wdtype),
                                 n, piped=True)
            picked = picked_mapping(ln_example.layernorm_rows, configs, (x, w, b, out), views, eps=1e-5)
        return runs, out, ref, 2 * x.numel() * isz + 2 * n * wsz, picked
    if kernel == "cross_entropy":
        m = rows_for(n, isz, 1)
        logits = torch.randn(m, n, device="cuda", dtype=dtype) * 4
        target = torch.randint(0, n, (m,), device="cuda")
        loss = torch.empty(m, device="cuda", dtype=torch.float64 if dtype == torch.float64 else torch.float32)
        # Losses alone, as torch and Triton give them: no logsumexps written (4 bytes a row)
        runs = {"mgjit": lambda: ce_example.cross_entropy(logits, target, out=loss, return_lse=False),
                "torch": lambda: torch.nn.functional.cross_entropy(logits, target, reduction="none"),
                "triton": lambda: tr.cross_entropy(logits, target, loss)}
        ref = lambda: torch.nn.functional.cross_entropy(wide(logits), target, reduction="none")  # noqa: E731
        itemsize, views = piped_views((logits,))
        configs = for_dtypes(ce_example.mapping(n, itemsize, False), (dtype,), n)
        picked = picked_mapping(ce_example.cross_entropy_rows, configs,
                                (logits, target, loss, torch.empty_like(loss), -100),
                                (*views, *ce_example.scratch(logits, configs)))
        return runs, loss, ref, logits.numel() * isz + m * (8 + loss.element_size()), picked
    if kernel == "fused":
        m = rows_for(n, isz, 4)
        x, y, z = (torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(3))
        out = torch.empty_like(x)
        runs = {"mgjit": lambda: fe_example.fused(x, y, z, out), "torch": lambda: tr.torch_fused(x, y, z, out),
                "triton": lambda: tr.fused(x, y, z, out)}
        ref = lambda: fe_example.reference(x, y, z)  # noqa: E731
        flat = tuple(t.view(-1) for t in (x, y, z, out))
        return runs, out, ref, 4 * x.numel() * isz, picked_mapping(fe_example.fused_flat, fe_example.BLOCKS, flat)
    raise ValueError(kernel)


def measure(kernel: str, n: int, dtype_name: str, weights: str | None = None) -> dict:
    dtype = DTYPES[dtype_name]
    weighted = kernel in ("rmsnorm", "layernorm") and weights not in (None, dtype_name)
    runs, out, ref, nbytes, picked = case(kernel, n, dtype, DTYPES[weights] if weighted else None)
    if weighted:  # told apart in the table and the plot
        dtype_name = f"{dtype_name}+{weights}"
    out.fill_(float("nan"))
    runs["mgjit"]()
    torch.cuda.synchronize()
    err = relerr(out, ref())
    mapping, timings = picked()
    row = {"kernel": kernel, "dtype": dtype_name, "n": n, "bytes": nbytes, "mgjit_relerr": err,
           "tiny": nbytes < TINY, "mgjit_mapping": mapping}
    copy = copy_ms(nbytes)
    row["copy_ms"] = copy
    # every candidate mapping as the autotuner timed it, as a fraction of copy bandwidth
    row["candidates"] = [(c.short(), None if ms is None else copy / ms) for c, ms in timings]
    for name in ("mgjit", "torch", "triton"):  # interleaved: the three in one sitting, same inputs
        try:
            ms = bench(runs[name])
            row[f"{name}_ms"] = ms
            row[f"{name}_frac"] = copy / ms
        except Exception as e:  # a comparison that cannot run this case is reported, not fatal
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return row


def cell(row: dict, name: str) -> str:
    return f"{row[name + '_frac']:6.2f}" if name + "_frac" in row else "   err"


def line(row: dict) -> str:
    return (f"{row['kernel']:14} {row['dtype']:9} {row['n']:7d} {row['mgjit_relerr']:8.1e} {cell(row, 'mgjit')} "
            f"{cell(row, 'torch')} {cell(row, 'triton')}{'  tiny' if row['tiny'] else ''}  {row['mgjit_mapping']}")


def markdown(rows: list[dict]) -> str:
    """The results as a table for benchmarks/RESULTS.md."""
    out = [f"Fraction of copy bandwidth on {torch.cuda.get_device_name()} (tiny: under {TINY >> 20} MB moved, "
           "launch-bound).", "", "| kernel | dtype | n | mgjit | torch | triton | mgjit mapping |",
           "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        out.append(f"| {r['kernel']} | {r['dtype']} | {r['n']}{' (tiny)' if r['tiny'] else ''} | "
                   f"{cell(r, 'mgjit').strip()} | {cell(r, 'torch').strip()} | {cell(r, 'triton').strip()} | "
                   f"{r['mgjit_mapping']} |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kernels = sorted({r["kernel"] for r in rows})
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(len(kernels), len(dtypes), figsize=(5 * len(dtypes), 3 * len(kernels)), squeeze=False)
    for i, k in enumerate(kernels):
        for j, d in enumerate(dtypes):
            ax = axes[i][j]
            sel = sorted((r for r in rows if r["kernel"] == k and r["dtype"] == d), key=lambda r: r["n"])
            for name, style in (("mgjit", "o-"), ("torch", "s--"), ("triton", "^:")):
                pts = [(r["n"], r[f"{name}_frac"]) for r in sel if f"{name}_frac" in r]
                if pts:
                    ax.plot(*zip(*pts), style, label=name, markersize=3)
            ax.axhline(0.9, color="gray", linewidth=0.5)
            ax.set_xscale("log")
            ax.set_ylim(0, 1.1)
            ax.set_title(f"{k} {d}", fontsize=9)
            ax.set_xlabel("row length")
            ax.set_ylabel("fraction of copy bandwidth")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", nargs="*", default=["softmax", "rmsnorm", "layernorm", "cross_entropy", "fused"])
    p.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    p.add_argument("--lengths", nargs="*", type=int)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--candidates", action="store_true", help="print every mapping the autotuner timed")
    p.add_argument("--weights", choices=list(DTYPES), help="the norms' weight and bias dtype (default: the rows')")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    lengths = args.lengths or (QUICK if args.quick else LENGTHS)
    rows, start = [], time.time()
    print(f"{'kernel':14} {'dtype':9} {'n':>7} {'relerr':>8} {'mgjit':>6} {'torch':>6} {'triton':>6}  (fraction of "
          f"copy bandwidth) on {torch.cuda.get_device_name()}; mgjit's mapping", flush=True)
    for kernel in args.kernels:
        for dtype in args.dtypes:
            for n in lengths:
                row = measure(kernel, n, dtype, args.weights)
                rows.append(row)
                print(line(row), flush=True)
                for config, frac in row["candidates"] if args.candidates else ():
                    print(f"{'':34} {'pruned' if frac is None else f'{frac:6.2f}'}  {config}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    (out / "rows.md").write_text(markdown(rows))
    try:
        plot(rows, out / "rows.png")
    except ImportError:
        pass
    below = [r for r in rows if not r["tiny"] and r.get("mgjit_frac", 0) < 0.9]
    print(f"{len(rows)} cases in {time.time() - start:.0f} s; {len(below)} (not tiny) below 0.9 of copy bandwidth; "
          f"rows.json, rows.md and rows.png in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

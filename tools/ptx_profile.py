"""Dynamic PTX instruction counts of the row examples' kernels, from the PTX simulator (tests/ptx_sim.py): the
instructions a thread issues per element it holds, by opcode. This is the CPU's view of a memory-bound kernel's
instruction budget: at copy bandwidth an H100 SM has about 40 thread-instructions per bf16 element of a row kernel
(read and written once), an H200 about 28. PTX is not SASS (ptxas folds and expands), but mappings and lowerings
compare: layernorm over bf16 rows of 4095, one row a warpgroup, issued 35.2 an element; persistent with float32
weights in shared memory, 23.7 over 64 rows; an aligned row of 4096, 20.8. Registers decide as much: the same
layernorm of 4095 went 127 -> 96 registers (0.85 -> 0.88 of copy bandwidth) for 2 more instructions an element.
Piped mappings run too (TMA: tests/ptx_tma.py), on the grid the wrapper launches without a GPU: layernorm over 80
rows of 50257 piped over clusters of 5 CTAs issued 16.2 an element (its stash of the weights spread over 10 rows a
cluster; over 16 rows, 23.3).

    python tools/ptx_profile.py --kernel layernorm --n 4095                # the wrapper's first candidate
    python tools/ptx_profile.py --kernel rmsnorm --n 8191 --list           # the candidates, numbered
    python tools/ptx_profile.py --kernel rmsnorm --n 8191 --config 5 --rows 16
    python tools/ptx_profile.py --kernel layernorm --n 8193 --config 18 --steady   # a row's cost, prologue left out
    python tools/ptx_profile.py --kernel softmax --n 230000 --config 5 --steady --rows 4 --full   # max.NaN.bf16x2 ...
    python tools/ptx_profile.py --kernel layernorm --n 16385 --weights float32 --list   # float32 weight and bias

Off the GPU a piped grid has 2 SMs' programs, each taking a few rows, so a count over a few rows carries each
program's prologue (the weights' stash, the ring's first copies); `--steady` runs `--rows` (default 64) and twice
as many and reports the difference (layernorm over bf16 rows of 8193: 21.2 an element with the prologue, 17.7
without, before the twentieth session's layouts; 15.3 after). The simulated memory is sized to the tensors, so long
rows take `--rows` a few (64 rows of 230000 columns move 59 MB); `--full` counts whole opcodes, with their types.
"""
from __future__ import annotations

import argparse
import collections
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
# This checkout's mgjit too, not the one an editable install points at (the last `pip install -e`: a CI clone's after
# .ci/run), whose counts a comparison of two trees would silently report.
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "tests")]
import _rows  # noqa: E402
import _rows_launch  # noqa: E402
import cross_entropy as ce  # noqa: E402
import layernorm as ln  # noqa: E402
import ptx_sim  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402
from _rows_piped import piped_views  # noqa: E402


def launch_of(kernel: str, x: torch.Tensor, weights: torch.dtype | None = None):
    """(kernel, arguments, constexprs, candidate mappings as its wrapper launches them) of a row example over x
    (a norm's weights in `weights`, by default x's dtype)."""
    function, args, constexprs, configs = unfiltered_launch(kernel, x, weights)
    return function, args, constexprs, _rows_launch.for_dtypes(configs, (x.dtype, weights or x.dtype), n=x.shape[1],
                                                               piped=kernel in _rows_launch.PIPED_FLOAT64)


def unfiltered_launch(kernel: str, x: torch.Tensor, weights: torch.dtype | None):
    n = x.shape[1]
    w, b, out = torch.randn(n).to(weights or x.dtype), torch.randn(n).to(weights or x.dtype), torch.empty_like(x)
    if kernel == "softmax":
        itemsize, views = piped_views((x, out))
        return sm.softmax_kernel, (x, out, *views), {}, sm.mapping(n, None, itemsize)
    if kernel == "rmsnorm":
        itemsize, views = piped_views((x, out), (w,))
        return (rms.rmsnorm_kernel, (x, w, out, *views), {"eps": 1e-6},
                rms.rmsnorm_mapping(n, None, itemsize, (w.element_size(),)))
    if kernel == "layernorm":
        itemsize, views = piped_views((x, out), (w, b))
        return (ln.layernorm_rows, (x, w, b, out, *views), {"eps": 1e-5},
                ln.layernorm_mapping(n, None, itemsize, (w.element_size(), b.element_size())))
    target = torch.randint(0, n, (x.shape[0],))
    loss, lse = (torch.empty(x.shape[0], dtype=ce.stat_dtype(x.dtype)) for _ in range(2))
    itemsize, views = piped_views((x,))
    configs = ce.mapping(n, itemsize, False)  # losses alone, as benchmarks/rows.py times them
    return ce.cross_entropy_rows, (x, target, loss, lse, -100, *views, *ce.scratch(x, configs)), {}, configs


def profile(kernel_name: str, n: int, dtype: torch.dtype, config, rows: int = 0, full: bool = False,
            weights: torch.dtype | None = None):
    """(the compiled kernel, instructions a thread issues an element, those by opcode name, or by the whole opcode
    with its types where `full`) of a row example's kernel under `config`, run from its sm_90a PTX over `rows` rows
    (default: one row group a program)."""
    rows = rows or config.kwargs["ROWS"]
    kernel, launch_args, constexprs, _ = launch_of(kernel_name, (torch.randn(rows, n) * 3).to(dtype), weights)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = kernel.compile(*launch_args, **constexprs, **config.launch_kwargs(), target="sm_90a")
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in launch_args
                if isinstance(t, torch.Tensor)}
    dev = ptx_sim.Device(max(16 << 20, sum(-(-b // 64) * 64 for b in storages.values()) + (1 << 20)))
    dev.counts = collections.Counter()
    dev.run(compiled, _rows.grid(rows, config), *launch_args, cluster=config.kwargs["CTAS"])
    # A count is one instruction of all a CTA's warps (a divergent one counts its warps' share): counts over all
    # CTAs per element of one CTA's threads
    per_thread = rows * n / (128 * config.kwargs["WGS"])
    by_opcode: collections.Counter = collections.Counter()
    for opcode, count in dev.counts.items():
        by_opcode[opcode if full else opcode.split(".")[0]] += count / per_thread
    return compiled, sum(dev.counts.values()) / per_thread, by_opcode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=["softmax", "rmsnorm", "layernorm", "cross_entropy"], required=True)
    p.add_argument("--n", type=int, required=True, help="the row length")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--config", type=int, default=0, help="which candidate mapping (see --list)")
    p.add_argument("--rows", type=int, default=0, help="rows to run (default: one row group a program)")
    p.add_argument("--list", action="store_true", help="number the candidate mappings and stop")
    p.add_argument("--steady", action="store_true", help="the count over twice --rows less that over --rows")
    p.add_argument("--top", type=int, default=16, help="opcodes to show")
    p.add_argument("--full", action="store_true", help="count whole opcodes (max.NaN.bf16x2, not max)")
    p.add_argument("--weights", help="the norms' weight and bias dtype (default: --dtype)")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    weights = getattr(torch, args.weights) if args.weights else None
    probe = launch_of(args.kernel, torch.empty(1, args.n, dtype=dtype), weights)[3]
    if args.list:
        for i, config in enumerate(probe):
            print(f"{i:3}  {config.short()}")
        return 0
    config = probe[args.config]
    if args.steady:
        rows = args.rows or 64
        _, first, first_by = profile(args.kernel, args.n, dtype, config, rows, args.full, weights)
        compiled, second, second_by = profile(args.kernel, args.n, dtype, config, 2 * rows, args.full, weights)
        per_element = 2 * second - first  # counts are per element of all rows: (2R * second - R * first) / R
        by_opcode = collections.Counter({k: 2 * second_by[k] - first_by.get(k, 0) for k in second_by})
    else:
        compiled, per_element, by_opcode = profile(args.kernel, args.n, dtype, config, args.rows, args.full,
                                                   weights)
    print(f"{args.kernel} n={args.n} {args.dtype} {config.short()}: {compiled.registers} registers, "
          f"{per_element:.1f} instructions an element")
    print("  " + "  ".join(f"{name} {count:.1f}" for name, count in by_opcode.most_common(args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

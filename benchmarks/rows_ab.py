"""The row examples' kernels under fixed mappings, timed against a copy of the same bytes, from any tree of mgjit:
an A/B of a compiler change on the same mapping (the autotuner of benchmarks/rows.py may pick another mapping on
either side, which hides the change).

    python benchmarks/rows_ab.py TREE [--dtype float32] [--weights float32] [--pad COLUMNS] KERNEL:N:INDEX ...

TREE is a directory holding mgjit/ and examples/ (`.`, or an older commit's `git archive HEAD mgjit autotune cache
examples`: with autotune/ and cache/, its own are imported, else the installed tree's);
KERNEL is softmax, rmsnorm, layernorm, cross_entropy or fused. INDEX numbers the wrapper's candidate mappings for
rows of N (`python tools/ptx_profile.py --kernel KERNEL --n N --list`), or is a mapping written as an expression
over _rows or _rows_piped (`softmax:50257:_rows.hold(1,(4096,128),12,1)`,
`rmsnorm:8193:_rows_piped.piped(8193,3,2,True)`, no spaces or colons); for fused, the flat kernel's
block sizes (examples/fused_elementwise.py BLOCKS) over contiguous rows of N. Each line: the mapping, the relative error
against torch (outputs poisoned with NaN first) and the fraction of copy bandwidth (at least 256 MB moved
as benchmarks/rows.py counts them, the median of three do_bench medians). `--dtype`: the rows' (bfloat16 by
default). `--weights float32`: the norms' weight and bias in float32 beside rows of another dtype (as models keep
them), their mappings those of float32 weights; by default the rows' dtype. `--pad COLUMNS`:
the rows (inputs and outputs) are the first N columns of tensors COLUMNS wider, so that the same rows lie another
stride apart (held mappings only: a piped one reads a row's neighbours' bytes): cross-entropy over rows of 2060,
four a program, ran 0.96 of copy bandwidth contiguous and 0.85 in rows of 2100, a memory latency an array of the
row while each array's loads sat under a branch (benchmarks/RESULTS.md, forty-third and forty-fourth sessions).
Run one process per tree, both on one machine in one call.
"""
import inspect
import sys
from pathlib import Path

tree = Path(sys.argv[1]).resolve()
sys.path[:0] = [str(tree), str(tree / "examples")]

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import _rows  # noqa: E402
try:
    import _rows_launch  # noqa: E402
except ImportError:  # a tree from before the wrappers' shared launch rules
    _rows_launch = None
import cross_entropy as ce  # noqa: E402
import fused_elementwise as fe  # noqa: E402
import layernorm as ln  # noqa: E402
import mgjit  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402

assert Path(mgjit.__file__).resolve().is_relative_to(tree), f"mgjit from {mgjit.__file__}, not {tree}"

TARGET_BYTES = 256 << 20


def case(kernel: str, n: int, dev: torch.device, wdtype: torch.dtype, pad: int = 0,
         dtype: torch.dtype = torch.bfloat16):
    """(kernel, its arguments, constexprs, candidate mappings, the grid of a mapping, the output, the torch
    reference, bytes moved) over rows of n in `dtype`, a norm's weights in `wdtype`, the rows `pad` columns apart more
    than n."""
    item, wsize = dtype.itemsize, wdtype.itemsize
    wide = torch.float64 if dtype == torch.float64 else torch.float32  # what the kernels compute and return in
    tensors = {"cross_entropy": 1, "fused": 4}.get(kernel, 2)
    rows = max(1, TARGET_BYTES // (item * n * tensors))
    if pad and kernel == "fused":
        raise SystemExit("--pad: the fused kernel reads its rows flat, as contiguous tensors")
    x = torch.randn(rows, n + pad, device=dev, dtype=dtype)[:, :n]
    row_grid = lambda config: _rows.grid(rows, config, dev)  # noqa: E731
    if kernel == "softmax":
        out = padded_like(x, pad)
        if "xl" not in sm.softmax_kernel.arg_names:  # a tree from before piped rows
            return (sm.softmax_kernel, (x, out), {}, _rows.mapping(n), row_grid, out,
                    lambda: torch.softmax(x.to(wide), 1), 2 * item * x.numel())
        return (sm.softmax_kernel, (x, out, lines_of(x), lines_of(out)), {}, sm.mapping(n, None, item), row_grid, out,
                lambda: torch.softmax(x.to(wide), 1), 2 * item * x.numel())
    if kernel in ("rmsnorm", "layernorm"):
        out = padded_like(x, pad)
        w, b = torch.randn(n, device=dev, dtype=wdtype), torch.randn(n, device=dev, dtype=wdtype)
        if kernel == "rmsnorm":
            if "wv" in rms.rmsnorm_kernel.arg_names:  # piped rows (examples/_rows_piped.py)
                from _rows_piped import weight_rows
                return (rms.rmsnorm_kernel, (x, w, out, lines_of(x), lines_of(out), weight_rows(w)), {"eps": 1e-6},
                        rms.rmsnorm_mapping(n, None, item, (wsize,)), row_grid, out,
                        lambda: torch.nn.functional.rms_norm(x.to(wide), (n,), w.to(wide), 1e-6),
                        2 * item * x.numel() + wsize * n)
            return (rms.rmsnorm_kernel, (x, w, out), {"eps": 1e-6}, rms.rmsnorm_mapping(n), row_grid, out,
                    lambda: torch.nn.functional.rms_norm(x.to(wide), (n,), w.to(wide), 1e-6),
                    2 * item * x.numel() + wsize * n)
        if "wv" in ln.layernorm_rows.arg_names:  # piped rows (examples/_rows_piped.py)
            from _rows_piped import weight_rows
            return (ln.layernorm_rows, (x, w, b, out, lines_of(x), lines_of(out), weight_rows(w), weight_rows(b)),
                    {"eps": 1e-5}, ln.layernorm_mapping(n, None, item, (wsize, wsize)), row_grid, out,
                    lambda: torch.nn.functional.layer_norm(x.to(wide), (n,), w.to(wide), b.to(wide), 1e-5),
                    2 * item * x.numel() + 2 * wsize * n)
        return (ln.layernorm_rows, (x, w, b, out), {"eps": 1e-5}, ln.layernorm_mapping(n), row_grid, out,
                lambda: torch.nn.functional.layer_norm(x.to(wide), (n,), w.to(wide), b.to(wide), 1e-5),
                2 * item * x.numel() + 2 * wsize * n)
    if kernel == "cross_entropy":
        target = torch.randint(0, n, (rows,), device=dev)
        loss, lse = (torch.full((rows,), float("nan"), device=dev, dtype=wide) for _ in range(2))
        reference = lambda: torch.nn.functional.cross_entropy(x.to(wide), target, reduction="none")  # noqa: E731
        if "xl" not in ce.cross_entropy_rows.arg_names:  # a tree from before piped rows
            return (ce.cross_entropy_rows, (x, target, loss, lse, -100), {}, ce.mapping(n), row_grid, loss,
                    reference, item * x.numel() + 12 * rows)
        # Losses alone (the 12 bytes a row counted: a target and a loss), where the tree can leave out the logsumexps
        configs = ce.mapping(n, item, False) if "LSE" in ce.cross_entropy_rows.arg_names else ce.mapping(n, item)
        # Piped segments' pieces and counts (`scratch`); in trees from before runs of segments (a07ff7c and older:
        # `workspace`), statistics only, merged by a second launch left out of the kernel's time and its loss.
        scratch = (ce.scratch(x, configs) if hasattr(ce, "scratch") else
                   (ce.workspace(x, configs),) if "parts" in ce.cross_entropy_rows.arg_names else ())
        return (ce.cross_entropy_rows, (x, target, loss, lse, -100, lines_of(x), *scratch), {}, configs, row_grid,
                loss, reference, item * x.numel() + 12 * rows)
    if kernel == "fused":
        y, z = torch.randn_like(x), torch.randn_like(x)
        out = torch.full_like(x, float("nan"))
        flat = tuple(t.view(-1) for t in (x, y, z, out))
        return (fe.fused_flat, flat, {}, fe.BLOCKS, lambda config: (-(-x.numel() // config.kwargs["BLOCK"]),), out,
                lambda: fe.reference(x, y, z), 4 * item * x.numel())
    raise ValueError(f"unknown kernel {kernel!r}")


def padded_like(x: torch.Tensor, pad: int) -> torch.Tensor:
    """A NaN-poisoned output of x's shape, its rows `pad` columns apart more than their length."""
    rows, n = x.shape
    return torch.full((rows, n + pad), float("nan"), device=x.device, dtype=x.dtype)[:, :n]


def lines_of(t: torch.Tensor):
    """What a piped mapping reads as `t`'s lines (`_rows_piped.lines`): t's own, or for rows in a wider tensor the
    whole tensor's (read by no held mapping)."""
    from _rows_piped import lines
    return lines(t) if t.is_contiguous() else lines(t.as_strided((t.shape[0], t.stride(0)), (t.stride(0), 1)))


def mapping_of(expression: str, like: mgjit.Config) -> mgjit.Config:
    """A mapping written as an expression over _rows (`_rows.hold(1,(4096,128),12,1)`) or, in trees that have it,
    _rows_piped (`_rows_piped.piped(8193,3,2,True)`: 3 slots, 2 programs an SM, weights stashed), with the
    constexprs the wrapper's mappings have beside it (OCC, PERSIST) at 0."""
    names = {"_rows": _rows}
    if (tree / "examples" / "_rows_piped.py").exists():
        import _rows_piped
        names["_rows_piped"] = _rows_piped
    config = eval(expression, names)  # noqa: S307 (a benchmark's command line)
    return config.replace(**{k: 0 for k in like.kwargs if k not in config.kwargs})


def main() -> None:
    dev = torch.device("cuda")
    specs = sys.argv[2:]
    dtype, wdtype, pad = torch.bfloat16, None, 0
    while specs[:1] in (["--weights"], ["--pad"], ["--dtype"]):
        if specs[0] == "--weights":
            wdtype = getattr(torch, specs[1])
        elif specs[0] == "--dtype":
            dtype = getattr(torch, specs[1])
        else:
            pad = int(specs[1])
        specs = specs[2:]
    wdtype = wdtype or dtype
    for spec in specs:
        kernel, n, index = spec.split(":")
        k, args, constexprs, configs, grid_of, out, reference, nbytes = case(kernel, int(n), dev, wdtype, pad, dtype)
        # the mappings the wrapper launches for these dtypes (float64's own, in trees that have them; chunked by the
        # row's length and piped for float64 rows as the wrapper does, in trees whose for_dtypes takes them)
        if hasattr(_rows_launch, "for_dtypes"):
            takes = inspect.signature(_rows_launch.for_dtypes).parameters
            piped = kernel in getattr(_rows_launch, "PIPED_FLOAT64", ())
            named = {name: value for name, value in (("n", int(n)), ("piped", piped)) if name in takes}
            configs = _rows_launch.for_dtypes(configs, (dtype, wdtype), **named)
        config = configs[int(index)] if index.isdigit() else mapping_of(index, configs[0])
        if kernel == "cross_entropy" and hasattr(ce, "scratch"):  # sized for this mapping's grid, not the wrapper's
            args = (*args[:-2], *ce.scratch(args[0], (config,)))
        if pad and config.kwargs.get("PIPE"):
            raise SystemExit(f"--pad: {spec} is a piped mapping, which reads a row's neighbours' bytes")
        grid = grid_of(config)
        run = lambda: k[grid](*args, **constexprs, **config.launch_kwargs())  # noqa: E731
        run()
        torch.cuda.synchronize()
        ref = reference()
        err = ((out.to(ref.dtype) - ref).abs().max() / ref.abs().max()).item()
        src = torch.empty(max(nbytes // 2, 16), dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        times, copies = [], []
        for _ in range(3):
            times.append(do_bench(run, warmup=10, rep=40, return_mode="median"))
            copies.append(do_bench(lambda: dst.copy_(src), warmup=10, rep=40, return_mode="median"))
        stride = f" (rows {int(n) + pad} apart)" if pad else ""
        print(f"{tree.name:8} {kernel:13} {n:>6}{stride} #{index:<3} {config.short():72} err {err:.1e}  "
              f"{sorted(copies)[1] / sorted(times)[1]:.3f}", flush=True)


if __name__ == "__main__":
    main()

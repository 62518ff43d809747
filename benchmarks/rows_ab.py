"""The row examples' kernels under fixed mappings, timed against a copy of the same bytes, from any tree of mgjit:
an A/B of a compiler change on the same mapping (the autotuner of benchmarks/rows.py may pick another mapping on
either side, which hides the change).

    python benchmarks/rows_ab.py TREE KERNEL:N:INDEX ...

TREE is a directory holding mgjit/ and examples/ (`.`, or an older commit's `git archive HEAD mgjit examples`);
KERNEL is softmax, rmsnorm or layernorm; INDEX numbers the wrapper's candidate mappings for rows of N
(`python tools/ptx_profile.py --kernel KERNEL --n N --list`). Each line: the mapping, the relative error against
torch (outputs poisoned with NaN first) and the fraction of copy bandwidth (bf16 rows, at least 256 MB moved, the
median of three do_bench medians). Run one process per tree, both on one machine in one call.
"""
import sys
from pathlib import Path

tree = Path(sys.argv[1]).resolve()
sys.path[:0] = [str(tree), str(tree / "examples")]

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import _rows  # noqa: E402
import layernorm as ln  # noqa: E402
import mgjit  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402

assert Path(mgjit.__file__).resolve().is_relative_to(tree), f"mgjit from {mgjit.__file__}, not {tree}"


def case(kernel: str, n: int, dev: torch.device):
    """(kernel, its arguments, constexprs, candidate mappings, the torch reference) over bf16 rows of n."""
    rows = max(1, (256 << 20) // (4 * n))
    x = torch.randn(rows, n, device=dev, dtype=torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    w, b = torch.randn(n, device=dev, dtype=x.dtype), torch.randn(n, device=dev, dtype=x.dtype)
    if kernel == "softmax":
        return sm.softmax_kernel, (x, out), {}, _rows.mapping(n), lambda: torch.softmax(x.float(), 1)
    if kernel == "rmsnorm":
        return (rms.rmsnorm_kernel, (x, w, out), {"eps": 1e-6}, rms.rmsnorm_mapping(n),
                lambda: torch.nn.functional.rms_norm(x.float(), (n,), w.float(), 1e-6))
    return (ln.layernorm_rows, (x, w, b, out), {"eps": 1e-5}, ln.layernorm_mapping(n),
            lambda: torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5))


def main() -> None:
    dev = torch.device("cuda")
    sms = _rows.sm_count(dev)
    for spec in sys.argv[2:]:
        kernel, n, index = spec.split(":")
        k, args, constexprs, configs, reference = case(kernel, int(n), dev)
        config = configs[int(index)]
        x, out = args[0], args[-1]
        grid = _rows.grid(x.shape[0], config, dev)
        run = lambda: k[grid](*args, **constexprs, **config.launch_kwargs())  # noqa: E731
        run()
        torch.cuda.synchronize()
        ref = reference()
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        src, dst = torch.empty_like(x), torch.empty_like(x)
        times, copies = [], []
        for _ in range(3):
            times.append(do_bench(run, warmup=10, rep=40, return_mode="median"))
            copies.append(do_bench(lambda: dst.copy_(src), warmup=10, rep=40, return_mode="median"))
        print(f"{tree.name:8} {kernel:10} {n:>6} #{index:<3} {config.short():72} err {err:.1e}  "
              f"{sorted(copies)[1] / sorted(times)[1]:.3f}", flush=True)


if __name__ == "__main__":
    main()

"""Host launch time against argument count (issue 13): mgjit against Triton and torch, in one run.

    python benchmarks/launch.py [--json out.json]     # on a GPU
    python benchmarks/launch.py --cpu                 # anywhere: the launch path minus the driver

Each kernel adds its tensors (1 to 16, the first is the output) and, in the "+4 scalars" rows, four scalars
(two ints, two floats). Host time per launch is the median over interleaved rounds of 2000-launch batches of
a cached kernel (the device synchronized between batches, never inside one). Triton's kernels take the same
tensors plus the element count. Targets (issue 13, H100): 3 tensors <= 3 us, 8 tensors + 4 scalars <= 5 us,
<= 0.2 us per extra tensor (the least-squares slope over 1..16 tensors).

--cpu times the same mgjit launches on the C launcher's stub driver with no hook (everything but
cuLaunchKernel: binding, the key from DLPack, the plan lookup, packing), the Python path for comparison, the
Python attribute reads the old key needed per tensor, and apache-tvm-ffi's call overhead where it is
installed (`testing.nop` with the same tensors: its floor for passing them to C).

Both modes also time the row examples' wrappers (softmax, rmsnorm, layernorm, cross-entropy) on 64 bf16 rows of
8193 once tuned: their whole host cost a call (checks, four views, the launch; on a GPU beside torch's op). On the
CPU a wrapper's pick is its first piped candidate, taken without timing.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import mgjit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))  # the row examples' wrappers (`row_calls`)
COUNTS = (1, 2, 3, 4, 6, 8, 12, 16)
BATCH = 2000
ROUNDS = 15
N = 1024  # elements per tensor: one small CTA


def _kernel_source(tensors: int, scalars: int) -> str:
    ts = [f"t{i}" for i in range(tensors)]
    ss = [f"s{j}" for j in range(scalars)]
    body = " + ".join([f"{t}[mgjit.ds(0, BLOCK)]" for t in ts] + ss)
    tl_body = " + ".join([f"tl.load({t} + offs, mask=mask)" for t in ts] + ss)
    return (f"import mgjit\n\n\n@mgjit.kernel\ndef k{tensors}_{scalars}({', '.join(ts + ss)}, BLOCK: mgjit.constexpr):\n"
            f"    t0[mgjit.ds(0, BLOCK)] = {body} + 1.0\n\n\n"
            f"def triton_kernel():\n"
            f"    import triton\n    import triton.language as tl\n\n"
            f"    @triton.jit\n"
            f"    def t{tensors}_{scalars}({', '.join(ts + ss)}, n, BLOCK: tl.constexpr):\n"
            f"        offs = tl.arange(0, BLOCK)\n        mask = offs < n\n"
            f"        tl.store(t0 + offs, {tl_body} + 1.0, mask=mask)\n"
            f"    return t{tensors}_{scalars}\n")


def kernels(tensors: int, scalars: int):
    """The mgjit kernel and (lazily) the Triton kernel of this shape, from a generated file (mgjit reads source)."""
    path = os.path.join(tempfile.gettempdir(), f"mgjit_launch_bench_{tensors}_{scalars}.py")
    with open(path, "w") as f:
        f.write(_kernel_source(tensors, scalars))
    spec = importlib.util.spec_from_file_location(f"mgjit_launch_bench_{tensors}_{scalars}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, f"k{tensors}_{scalars}"), module.triton_kernel


def _scalars(count: int) -> list:
    return [3, 5, 0.5, 0.25][:count]


def host_us(fns: dict, sync, reduce=statistics.median) -> dict:
    """Host microseconds per call of each function (the median batch; --cpu takes the fastest, on machines shared
    with other work): interleaved rounds of BATCH calls each."""
    for fn in fns.values():
        for _ in range(200):
            fn()
    sync()
    samples = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(BATCH):
                fn()
            samples[name].append((time.perf_counter() - t0) / BATCH * 1e6)
            sync()
    return {name: reduce(s) for name, s in samples.items()}


def slope(xs, ys) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def gpu(results: dict) -> list:
    rows = []
    _, triton_of = kernels(1, 0)
    triton_of()  # import Triton once up front
    out = torch.empty(N, device="cuda")
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    torch_us = host_us({"torch": lambda: torch.add(x, y, out=out)}, torch.cuda.synchronize)["torch"]
    results["torch_add_out_us"] = torch_us
    for scalars in (0, 4):
        mg = {}
        for n in COUNTS:
            kernel, triton_of = kernels(n, scalars)
            t = [torch.randn(N, device="cuda") for _ in range(n)]
            s = _scalars(scalars)
            expected = sum(t) + sum(s) + 1.0  # the kernel adds one, so that every launch changes t0
            kernel[(1,)](*t, *s, BLOCK=N)
            torch.cuda.synchronize()
            torch.testing.assert_close(t[0], expected)
            tk = triton_of()
            launch = kernel[(1,)]
            us = host_us({
                "mgjit": lambda: kernel[(1,)](*t, *s, BLOCK=N),
                "mgjit bound": lambda: launch(*t, *s, BLOCK=N),
                "triton": lambda: tk[(1,)](*t, *s, N, BLOCK=N),
            }, torch.cuda.synchronize)
            mg[n] = us["mgjit"]
            results[f"launch_us_{n}t_{scalars}s"] = us
            rows.append((f"{n} tensors" + (f" + {scalars} scalars" if scalars else ""), us["mgjit"],
                         us["mgjit bound"], us["triton"], us["mgjit"] / us["triton"]))
        per_tensor = slope(list(mg), list(mg.values()))
        results[f"per_tensor_us_{scalars}s"] = per_tensor
        rows.append((f"  per extra tensor ({scalars} scalars, slope)", per_tensor, None, None, None))
    return rows


def driver_floor_us(results: dict) -> None:
    """What the host's driver alone costs: a parameterless kernel launched by cuLaunchKernel in a C loop (the
    floor under any launcher), beside mgjit's whole path for the same kernel."""
    from mgjit import fastlaunch
    path = os.path.join(tempfile.gettempdir(), "mgjit_launch_bench_empty.py")
    with open(path, "w") as f:
        f.write("import mgjit\n\n\n@mgjit.kernel\ndef empty():\n    pass\n")
    spec = importlib.util.spec_from_file_location("mgjit_launch_bench_empty", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    empty = module.empty
    empty[(1,)]()
    device = torch.cuda.current_device()
    function = int(empty.compile(target=f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}a")
                   .launcher().function(device))
    stream = torch.cuda.current_stream().cuda_stream
    c = fastlaunch.load()
    floor = []
    for _ in range(ROUNDS):
        floor.append(c.driver_floor(function, 128, stream, BATCH) / 1e3)
        torch.cuda.synchronize()
    results["driver_floor_us"] = statistics.median(floor)
    results["mgjit_no_args_us"] = host_us({"empty": lambda: empty[(1,)]()}, torch.cuda.synchronize)["empty"]


def python_path_us() -> float:
    """The Python path (no C launcher) for 3 tensors, in a child process with MGJIT_NO_C_LAUNCHER=1."""
    import subprocess
    env = dict(os.environ, MGJIT_NO_C_LAUNCHER="1")
    out = subprocess.run([sys.executable, __file__, "--python-path-child"], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.split()[-1])


ROW_SHAPE = (64, 8193)  # bf16 rows that take piped mappings (four views a call) in a kernel of a few microseconds


def row_calls(device) -> dict:
    """The row examples' wrappers on ROW_SHAPE bf16 rows on `device`, each beside its torch twin: name -> (mgjit
    call, torch call). Each wrapper's first call tunes its mapping."""
    import cross_entropy
    import layernorm
    import rmsnorm
    import softmax
    m, n = ROW_SHAPE
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    out, w, b = torch.empty_like(x), torch.randn(n, device=device, dtype=x.dtype), torch.randn(n, device=device,
                                                                                                 dtype=x.dtype)
    target, loss = torch.randint(0, n, (m,), device=device), torch.empty(m, device=device)
    f = torch.nn.functional
    return {"softmax": (lambda: softmax.softmax(x, out), lambda: torch.softmax(x, 1)),
            "rmsnorm": (lambda: rmsnorm.rmsnorm(x, w, 1e-6, out), lambda: f.rms_norm(x, (n,), w, 1e-6)),
            "layernorm": (lambda: layernorm.layernorm(x, w, b, 1e-5, out), lambda: f.layer_norm(x, (n,), w, b)),
            "cross_entropy": (lambda: cross_entropy.cross_entropy(x, target, out=loss, return_lse=False),
                              lambda: f.cross_entropy(x, target, reduction="none"))}


def row_wrappers(results: dict, device, sync) -> list:
    """Host microseconds per call of each row example's wrapper once its shape is tuned, and on a GPU of its torch
    twin (on the CPU torch would compute)."""
    rows = []
    for name, (mine, theirs) in row_calls(device).items():
        fns = {"mgjit": mine} if device == "cpu" else {"mgjit": mine, "torch": theirs}
        us = host_us(fns, sync, min if device == "cpu" else statistics.median)
        results[f"row_wrapper_us_{name}"] = us
        twin = f" (torch {us['torch']:.2f} us)" if "torch" in us else ""
        rows.append((f"{name} {ROW_SHAPE[0]}x{ROW_SHAPE[1]} bf16 wrapper{twin}", us["mgjit"]))
    return rows


def cpu(results: dict) -> list:
    """The launch path on the stub driver (no hook: nothing is launched) and the Python path, per tensor count."""
    import pytest
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from launch_stub import StubGPU
    rows = []
    patch = pytest.MonkeyPatch()
    try:
        for path in ("c", "python"):
            stub = StubGPU(patch, c_launcher=path == "c")
            if stub.module is not None:
                stub.module.use_stub_driver(None)
            else:
                stub.record = False
            for scalars in (0, 4):
                us = {}
                for n in COUNTS:
                    kernel, _ = kernels(n, scalars)
                    t = [torch.randn(N) for _ in range(n)]
                    s = _scalars(scalars)
                    us[n] = host_us({path: lambda: kernel[(1,)](*t, *s, BLOCK=N)}, lambda: None, min)[path]
                    results[f"cpu_{path}_us_{n}t_{scalars}s"] = us[n]
                    rows.append((f"{path} path, {n} tensors" + (f" + {scalars} scalars" if scalars else ""), us[n]))
                rows.append((f"  {path} path, per extra tensor ({scalars} scalars, slope)",
                             slope(list(us), list(us.values()))))
        # The row wrappers on the C path, their picks taken without timing (the first piped candidate, which makes
        # four views a call): what a tuned call costs on the host, the driver left out.
        import _rows_launch
        from mgjit.autotune.tuner import Autotuned
        stub = StubGPU(patch)
        stub.module.use_stub_driver(None)
        patch.setattr(_rows_launch, "tuning_enabled", lambda x: True)
        patch.setattr(Autotuned, "_tune", lambda self, named, key, grid: next(
            c for c in self.configs if c.kwargs.get("PIPE")))
        rows += row_wrappers(results, "cpu", lambda: None)
    finally:
        patch.undo()
    x = torch.randn(N)
    reads = host_us({"attributes": lambda: (x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device())},
                    lambda: None, min)["attributes"]
    rows.append(("python attribute reads the old key made, per tensor", reads))
    try:
        import tvm_ffi
        nop = tvm_ffi.get_global_func("testing.nop")
        for n in (0, 3, 8, 16):
            t = [torch.randn(N) for _ in range(n)]
            rows.append((f"apache-tvm-ffi testing.nop({n} tensors)", host_us({"nop": lambda: nop(*t)},
                                                                               lambda: None, min)["nop"]))
    except ImportError:
        rows.append(("apache-tvm-ffi not installed (pip install apache-tvm-ffi to compare)", float("nan")))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--python-path-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    results: dict = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if args.python_path_child:
        kernel, _ = kernels(3, 0)
        t = [torch.randn(N, device="cuda") for _ in range(3)]
        print(host_us({"py": lambda: kernel[(1,)](*t, BLOCK=N)}, torch.cuda.synchronize)["py"])
        return
    if args.cpu:
        for name, us in cpu(results):
            print(f"{name:<60} {us:8.3f} us")
    else:
        results["device"] = torch.cuda.get_device_name()
        rows = gpu(results)
        wrappers = row_wrappers(results, "cuda", torch.cuda.synchronize)
        results["python_path_3t_us"] = python_path_us()
        driver_floor_us(results)
        print(f"device: {results['device']}, torch {results['torch']}, python {results['python']}; "
              f"median host us per launch, {ROUNDS} rounds of {BATCH}")
        print(f"{'kernel':<44} {'mgjit':>8} {'bound':>8} {'triton':>8} {'mgjit/triton':>13}")
        for name, mg, bound, tr, ratio in rows:
            cells = [f"{v:8.2f}" if v is not None else " " * 8 for v in (mg, bound, tr)]
            print(f"{name:<44} {' '.join(cells)} {f'{ratio:13.2f}' if ratio else ''}")
        for name, us in wrappers:
            print(f"{name:<60} {us:8.2f} us")
        print(f"torch.add(x, y, out=out): {results['torch_add_out_us']:.2f} us; mgjit Python path (no C launcher), "
              f"3 tensors: {results['python_path_3t_us']:.2f} us")
        print(f"driver floor (cuLaunchKernel of a parameterless kernel in a C loop): {results['driver_floor_us']:.2f} us; "
              f"mgjit launching that kernel: {results['mgjit_no_args_us']:.2f} us")
        three, eight = results["launch_us_3t_0s"]["mgjit"], results["launch_us_8t_4s"]["mgjit"]
        print(f"targets: 3 tensors {three:.2f} <= 3 us {'OK' if three <= 3 else 'MISSED'}; 8 tensors + 4 scalars "
              f"{eight:.2f} <= 5 us {'OK' if eight <= 5 else 'MISSED'}; per extra tensor "
              f"{results['per_tensor_us_0s']:.3f} <= 0.2 us {'OK' if results['per_tensor_us_0s'] <= 0.2 else 'MISSED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

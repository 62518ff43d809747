"""Cache benchmarks (issue 6, item 7): cold compile, warm hits in the same and in a new process, and 16
concurrent cold compiles of one kernel — for softmax (bf16, 4096 columns, `benchmarks/core.py`) and the
Hopper matmul (bf16, 4096³, `examples/matmul_hopper.py` with DEFAULT_CONFIG, 3 warpgroups).

    python benchmarks/cache.py [--json out.json] [--reps 7] [--proc-reps 5] [--conc-reps 3] [--procs 16]
                               [--compile-only] [--only cold warm process concurrent] [--profile]

With a CUDA GPU a new process's "first result" is the first launch's output, synchronized; without one (or
with --compile-only) it is the first `compile(..., target="sm_90a")` returning. The output says which.
Every compile targets sm_90a. The environment is used as it is (PYTHONPATH for the MLIR bindings,
MGJIT_PTXAS, MGJIT_MLIR_PACKAGE), except that MGJIT_CACHE_DIR is set to fresh temporary directories and
MGJIT_CACHE_REDIS is dropped so that every "cold" number is a real compile, and child processes may write
bytecode (PYTHONDONTWRITEBYTECODE is dropped for them, and one untimed child runs first) so that `import
mgjit` costs what it costs for an installed package; --no-bytecode keeps PYTHONDONTWRITEBYTECODE as it is.

In-process numbers are medians of --reps repetitions; subprocess ones of --proc-reps (single processes) and
--conc-reps (rounds of --procs concurrent processes). --profile also prints cProfile's top costs of a
warm hit, in a new process and in this one.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch

import mgjit

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
KERNELS = ("softmax", "matmul")
TARGET = "sm_90a"
SOFTMAX_ROWS = 4096
SOFTMAX_COLS = 4096
MM = 4096

# How each kernel is called, shared by this process and the children (which exec it after `import mgjit`).
# softmax launches `core.softmax` directly; the matmul launches through the example's own wrapper
# `matmul_hopper.matmul(a, b)` (its grid and arguments are the example's business), and compiles the same
# specialization as `matmul_kernel.compile(a, b, c, <c for each further runtime argument>, **DEFAULT_CONFIG)`,
# as the example's __main__ does.
CALLS = textwrap.dedent('''
    def kernel_calls(which):
        """(kernel, constexprs, extend(args) -> compile args, launch(kernel, args) -> output)."""
        import sys
        if which == "softmax":
            sys.path.insert(0, {bench!r})
            from core import softmax as k
            consts = dict(BLOCK={cols})

            def launch(kern, args):
                kern[(args[0].shape[0],)](*args, **consts)
                return args[1]
            return k, consts, lambda args: args, launch
        sys.path.insert(0, {examples!r})
        import matmul_hopper as mh
        k = mh.matmul_kernel
        extra = len(k.runtime_names) - 3

        def launch(kern, args):
            saved, mh.matmul_kernel = mh.matmul_kernel, kern
            try:
                return mh.matmul(args[0], args[1], mh.DEFAULT_CONFIG)
            finally:
                mh.matmul_kernel = saved
        return k, dict(mh.DEFAULT_CONFIG), lambda args: tuple(args) + (args[2],) * extra, launch
''').format(cols=SOFTMAX_COLS, bench=HERE, examples=EXAMPLES)

# The child process. It builds its inputs with torch (imported before the clock starts: the user's program
# has them already), then times `import mgjit` + importing the kernel's module, and the first result.
CHILD = textwrap.dedent('''
    import json, os, sys, time
    import torch
    which, mode, barrier, profile_out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    launch = mode == "launch"
    dev = "cuda" if launch else "cpu"
    bf16 = torch.bfloat16
    if launch:
        torch.cuda.init()
    shape = ({rows}, {cols}) if which == "softmax" else ({mm}, {mm})
    def mk():
        return torch.randn(shape, device=dev, dtype=bf16) * 3 if launch else torch.empty(shape, dtype=bf16)
    args = (mk(), torch.empty(shape, device=dev, dtype=bf16)) if which == "softmax" else \\
        (mk(), mk(), torch.empty(shape, device=dev, dtype=bf16))
    if launch:
        torch.cuda.synchronize()
    if barrier != "-":  # concurrent mode: everyone starts the mgjit part at once
        open(os.path.join(barrier, "ready.%d" % os.getpid()), "w").close()
        go = os.path.join(barrier, "go")
        while not os.path.exists(go):
            time.sleep(0.0005)
    prof = None
    if profile_out != "-":
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    wall0 = time.time()
    t0 = time.perf_counter()
    import mgjit
    exec(CALLS)
    k, consts, extend, run = kernel_calls(which)
    t1 = time.perf_counter()
    if launch:
        out = run(k, args)
        torch.cuda.synchronize()
        compiled = next(iter(getattr(k, "_compiled", {{}}).values()), None)
    else:
        compiled = k.compile(*extend(args), target={target!r}, **consts)
    t2 = time.perf_counter()
    wall2 = time.time()
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile_out)
    tops = {{"numba_cuda_mlir", os.environ.get("MGJIT_MLIR_PACKAGE", "numba_cuda_mlir._mlir").split(".")[0]}}
    mlir_modules = sorted(m for m in sys.modules
                          if m == "mgjit.mlir" or m in tops or any(m.startswith(t + ".") for t in tops))
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    ok = None
    if launch:
        if which == "softmax":
            ref = torch.softmax(args[0].float(), 1)
            ok = bool(torch.allclose(out.float(), ref, rtol=2e-2, atol=1e-3))
        else:
            ref = args[0].float() @ args[1].float()
            ok = bool(((out.float() - ref).norm() / ref.norm()).item() < 1e-2)
    print(json.dumps({{
        "import_s": t1 - t0, "first_s": t2 - t1, "total_s": t2 - t0, "wall0": wall0, "wall2": wall2,
        "from_cache": None if compiled is None else compiled.from_cache,
        "key": None if compiled is None else compiled.key,
        "mlir_modules": mlir_modules[:5], "mlir_mapped": "_mlir_libs" in maps or "libMLIR" in maps,
        "ok": ok,
    }}))
''').format(rows=SOFTMAX_ROWS, cols=SOFTMAX_COLS, mm=MM, target=TARGET)


# ---------------------------------------------------------------------------------------------- helpers

def kernels() -> dict:
    """name -> (kernel, constexprs, extend, launch) as CALLS defines them."""
    ns: dict = {}
    exec(CALLS, ns)
    return {which: ns["kernel_calls"](which) for which in KERNELS}


def inputs(which: str, device: str) -> tuple:
    """The arguments the user has: random data on a GPU, uninitialised CPU tensors for compile-only."""
    bf16 = torch.bfloat16
    gpu = device == "cuda"
    shape = (SOFTMAX_ROWS, SOFTMAX_COLS) if which == "softmax" else (MM, MM)

    def make():
        return torch.randn(shape, device=device, dtype=bf16) * 3 if gpu else torch.empty(shape, dtype=bf16)
    if which == "softmax":
        return (make(), torch.empty(shape, device=device, dtype=bf16))
    return (make(), make(), torch.empty(shape, device=device, dtype=bf16))


def correct(which: str, args: tuple, out) -> bool:
    if which == "softmax":
        return bool(torch.allclose(out.float(), torch.softmax(args[0].float(), 1), rtol=2e-2, atol=1e-3))
    ref = args[0].float() @ args[1].float()
    return bool(((out.float() - ref).norm() / ref.norm()).item() < 1e-2)


def fresh(k: mgjit.Kernel) -> mgjit.Kernel:
    """A new kernel object over the same function: no in-memory entries, the disk store is all it has."""
    return mgjit.kernel(k.fn, num_warpgroups=k.num_warpgroups)


def child_env(cache_dir: str, bytecode: bool) -> dict:
    env = dict(os.environ)
    env["MGJIT_CACHE_DIR"] = cache_dir
    env.pop("MGJIT_CACHE_REDIS", None)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def ms(s: float) -> str:
    if s >= 9.95:
        return f"{s:.1f} s"
    return f"{s * 1e3:.0f} ms" if s >= 0.995 else (f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs")


class Bench:
    def __init__(self, args):
        self.args = args
        self.gpu = torch.cuda.is_available() and not args.compile_only
        self.mode = "launch" if self.gpu else "compile"
        self.device = "cuda" if self.gpu else "cpu"
        self.tmp = tempfile.mkdtemp(prefix="mgjit-cache-bench-")
        self.script = os.path.join(self.tmp, "child.py")
        with open(self.script, "w") as f:
            f.write(f"CALLS = {CALLS!r}\n" + CHILD)
        self.kernels = kernels()
        self.results: dict = {k: {} for k in KERNELS}
        self.checks: list[str] = []   # failed checks: printed, and a non-zero exit code
        self.notes: list[str] = []
        self.rows: list[tuple[str, dict, str]] = []
        self.primed = False

    def new_dir(self) -> str:
        return tempfile.mkdtemp(dir=self.tmp, prefix="store-")

    def row(self, label: str, key: str, fmt=ms, note: str = "") -> None:
        self.rows.append((label, {k: (fmt(self.results[k][key]) if key in self.results[k] else "")
                                  for k in KERNELS}, note))

    def check(self, cond: bool, what: str) -> None:
        if not cond:
            self.checks.append(what)

    # -- subprocesses
    def spawn(self, which: str, cache_dir: str, mode: str, barrier: str = "-", profile: str = "-"):
        return subprocess.Popen([sys.executable, self.script, which, mode, barrier, profile],
                                env=child_env(cache_dir, not self.args.no_bytecode),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(self, proc) -> dict:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"child failed ({proc.returncode}):\n{err[-4000:]}")
        return json.loads(out.strip().splitlines()[-1])

    def prime(self) -> None:
        """One untimed cold child per kernel: writes the bytecode of mgjit and the kernels' modules."""
        if not self.primed:
            for which in KERNELS:
                self.run_child(which, self.new_dir(), "compile")
            self.primed = True

    def run_child(self, which: str, cache_dir: str, mode: str, profile: str = "-") -> dict:
        t0 = time.perf_counter()
        res = self.finish(self.spawn(which, cache_dir, mode, profile=profile))
        res["process_s"] = time.perf_counter() - t0
        return res

    # -- in-process
    def cold_and_warm(self) -> None:
        from mgjit import mlir
        t0 = time.perf_counter()
        mlir.load()
        self.mlir_import_s = time.perf_counter() - t0
        saved = os.environ.get("MGJIT_CACHE_DIR")
        redis = os.environ.pop("MGJIT_CACHE_REDIS", None)
        try:
            for which, (k, consts, extend, run) in self.kernels.items():
                user_args = inputs(which, self.device)
                args = extend(user_args)
                r = self.results[which]
                # warm-up: the first compile in a process also imports mgjit's lowering code
                os.environ["MGJIT_CACHE_DIR"] = self.new_dir()
                fresh(k).compile(*args, target=TARGET, **consts)
                cold = []
                for _ in range(self.args.reps):
                    os.environ["MGJIT_CACHE_DIR"] = self.new_dir()
                    kk = fresh(k)
                    t0 = time.perf_counter()
                    c = kk.compile(*args, target=TARGET, **consts)
                    cold.append(time.perf_counter() - t0)
                    self.check(not c.from_cache, f"{which}: in-process cold compile was a cache hit")
                r["cold_compile_s"] = statistics.median(cold)
                r["ptxas_registers"] = c.registers
                r["compile_seconds_meta"] = c.meta.get("compile_seconds")
                # the store now holds the entry: new kernel objects hit it on disk
                disk = []
                for _ in range(self.args.reps):
                    kk = fresh(k)
                    t0 = time.perf_counter()
                    c2 = kk.compile(*args, target=TARGET, **consts)
                    disk.append(time.perf_counter() - t0)
                    self.check(c2.from_cache, f"{which}: warm compile with the disk entry present missed")
                r["warm_disk_same_process_s"] = statistics.median(disk)
                mem = []
                for _ in range(max(200, self.args.reps)):
                    t0 = time.perf_counter()
                    c3 = kk.compile(*args, target=TARGET, **consts)
                    mem.append(time.perf_counter() - t0)
                self.check(c3 is c2, f"{which}: a second compile() on the same object did not return the same kernel")
                r["warm_memory_s"] = statistics.median(mem)
                if self.gpu:
                    launch = []
                    for _ in range(self.args.reps):
                        kk = fresh(k)
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        out = run(kk, user_args)
                        torch.cuda.synchronize()
                        launch.append(time.perf_counter() - t0)
                        got = next(iter(getattr(kk, "_compiled", {}).values()), None)
                        self.check(got is None or got.from_cache, f"{which}: first launch of a new object missed")
                    self.check(correct(which, user_args, out), f"{which}: the launched kernel computed a wrong result")
                    r["warm_disk_first_launch_s"] = statistics.median(launch)
                if self.args.profile:
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(20):
                        fresh(k).compile(*args, target=TARGET, **consts)
                    prof.disable()
                    self.profile_report(f"{which}: warm disk hit in this process (20 new kernel objects)", prof)
        finally:
            if saved is None:
                os.environ.pop("MGJIT_CACHE_DIR", None)
            else:
                os.environ["MGJIT_CACHE_DIR"] = saved
            if redis is not None:
                os.environ["MGJIT_CACHE_REDIS"] = redis

    # -- one process at a time
    def processes(self) -> None:
        self.prime()
        for which in KERNELS:
            r = self.results[which]
            cold = [self.run_child(which, self.new_dir(), self.mode) for _ in range(self.args.proc_reps)]
            for c in cold:
                self.check(c["from_cache"] is not True, f"{which}: cold process hit the cache")
                self.check(c["ok"] is not False, f"{which}: cold process computed a wrong result")
            r["cold_process_total_s"] = statistics.median(c["total_s"] for c in cold)
            r["cold_process_first_s"] = statistics.median(c["first_s"] for c in cold)
            r["cold_process_spawn_to_exit_s"] = statistics.median(c["process_s"] for c in cold)
            warm_dir = self.new_dir()
            self.run_child(which, warm_dir, self.mode)  # fills the store exactly as the child will look it up
            warm = [self.run_child(which, warm_dir, self.mode) for _ in range(self.args.proc_reps)]
            for w in warm:
                self.check(w["from_cache"] is not False, f"{which}: warm process missed the cache")
                self.check(not w["mlir_modules"] and not w["mlir_mapped"],
                           f"{which}: warm process imported MLIR ({w['mlir_modules']}, mapped={w['mlir_mapped']})")
                self.check(w["ok"] is not False, f"{which}: warm process computed a wrong result")
            r["warm_process_total_s"] = statistics.median(w["total_s"] for w in warm)
            r["warm_process_import_s"] = statistics.median(w["import_s"] for w in warm)
            r["warm_process_first_s"] = statistics.median(w["first_s"] for w in warm)
            r["warm_process_spawn_to_exit_s"] = statistics.median(w["process_s"] for w in warm)
            r["warm_process_mlir_imported"] = any(w["mlir_modules"] or w["mlir_mapped"] for w in warm)
            if self.args.profile:
                out = os.path.join(self.tmp, f"{which}.prof")
                self.run_child(which, warm_dir, self.mode, profile=out)
                self.profile_report(f"{which}: new process, warm cache, import mgjit → first result", out)

    # -- many processes at once
    def concurrent(self) -> None:
        self.prime()
        n = self.args.procs
        for which in KERNELS:
            r = self.results[which]
            one, many, spans, compiled_counts = [], [], [], []
            for _ in range(self.args.conc_reps):
                d = self.new_dir()
                t0 = time.perf_counter()
                res = self.run_child(which, d, "compile")
                one.append(time.perf_counter() - t0)
                spans.append(("1", res["total_s"]))
            for _ in range(self.args.conc_reps):
                d = self.new_dir()
                barrier = tempfile.mkdtemp(dir=self.tmp, prefix="barrier-")
                t0 = time.perf_counter()
                procs = [self.spawn(which, d, "compile", barrier=barrier) for _ in range(n)]
                while len([f for f in os.listdir(barrier) if f.startswith("ready.")]) < n:
                    if any(p.poll() not in (None, 0) for p in procs):
                        break
                    time.sleep(0.001)
                go_wall = time.time()
                open(os.path.join(barrier, "go"), "w").close()
                outs = [self.finish(p) for p in procs]
                many.append(time.perf_counter() - t0)
                spans.append(("n", max(o["wall2"] for o in outs) - go_wall))
                keys = {o["key"] for o in outs}
                self.check(len(keys) == 1, f"{which}: concurrent children built different keys: {keys}")
                from mgjit.cache.store import Store
                store = Store(d)
                entries = store.entries()
                self.check(len(entries) == 1 and entries[0].key in keys,
                           f"{which}: the store ended with {len(entries)} entries, expected exactly 1 for the key")
                self.check(store.get(next(iter(keys))) is not None, f"{which}: the one entry does not verify")
                leftovers = os.listdir(os.path.join(d, ".tmp")) if os.path.isdir(os.path.join(d, ".tmp")) else []
                self.check(not leftovers, f"{which}: temporary entries left behind: {leftovers}")
                compiled_counts.append(sum(1 for o in outs if not o["from_cache"]))
                r["concurrent_store_entries"] = len(entries)
            r["single_cold_subprocess_s"] = statistics.median(one)
            r["single_cold_subprocess_import_to_result_s"] = statistics.median(s for w, s in spans if w == "1")
            r["concurrent_wall_s"] = statistics.median(many)
            r["concurrent_go_to_last_result_s"] = statistics.median(s for w, s in spans if w == "n")
            r["concurrent_children_that_compiled"] = statistics.median(compiled_counts)

    # -- profile
    def profile_report(self, title: str, prof) -> None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        s2 = io.StringIO()
        pstats.Stats(prof, stream=s2).sort_stats("tottime").print_stats(15)
        self.notes.append(f"=== profile: {title} — by cumulative time ===\n{_trim(s.getvalue())}\n"
                          f"=== profile: {title} — by own time ===\n{_trim(s2.getvalue())}")

    # -- report
    def report(self) -> dict:
        a = self.args
        first = ("first launch, synchronized" if self.gpu else f"first compile(..., target={TARGET!r}) returning")
        if "cold" in a.only:
            self.row(f"cold compile, MLIR already imported (fresh store, median of {a.reps})", "cold_compile_s")
        if "process" in a.only:
            self.row(f"cold process: import mgjit → {first} (incl. MLIR import; median of {a.proc_reps})",
                     "cold_process_total_s")
            self.row("  of which the first compile (MLIR import + compile)", "cold_process_first_s")
            self.row("  process spawn → exit", "cold_process_spawn_to_exit_s")
        if "cold" in a.only:
            self.row(f"warm hit, same process: new kernel object, disk entry → compile() (median of {a.reps})",
                     "warm_disk_same_process_s")
            self.row("warm hit, same process: same object, second compile() (in-memory)", "warm_memory_s")
            if self.gpu:
                self.row("warm hit, same process: new kernel object → first launch, synchronized",
                         "warm_disk_first_launch_s")
        if "process" in a.only:
            self.row(f"warm hit, new process: import mgjit → {first} (median of {a.proc_reps})",
                     "warm_process_total_s")
            self.row("  of which import mgjit + the kernel's module", "warm_process_import_s")
            self.row("  of which the first result", "warm_process_first_s")
            self.row("  process spawn → exit (python + torch start-up included)", "warm_process_spawn_to_exit_s")
            self.row("  MLIR imported in the warm process?", "warm_process_mlir_imported",
                     fmt=lambda v: "yes (!)" if v else "no")
        if "concurrent" in a.only:
            self.row(f"1 cold compile in a subprocess: spawn → exit (median of {a.conc_reps})",
                     "single_cold_subprocess_s")
            self.row("  of which import mgjit → compiled", "single_cold_subprocess_import_to_result_s")
            self.row(f"{a.procs} concurrent cold compiles, one key: spawn → all exited (median of {a.conc_reps})",
                     "concurrent_wall_s")
            self.row(f"  from 'go' (all {a.procs} imported torch) → last compiled", "concurrent_go_to_last_result_s")
            self.row("  children that compiled (the rest hit the winner's entry)", "concurrent_children_that_compiled",
                     fmt=lambda v: f"{v:g} of {a.procs}")
            self.row("  entries in the store afterwards", "concurrent_store_entries", fmt=str)

        if hasattr(os, "getloadavg"):
            self.machine["loadavg_end"] = os.getloadavg()
        print(f"machine: {self.machine['description']}; load average at start "
              f"{self.machine['loadavg_start']}, at end {self.machine.get('loadavg_end')}")
        what = ("GPU: first result = first launch, synchronized" if self.gpu
                else "compile-only (no GPU or --compile-only): first result = compile() returning")
        print(f"mode: {what}; target {TARGET}")
        bc = os.environ.get("PYTHONDONTWRITEBYTECODE")
        print("child processes: " + ("bytecode as the environment says" if a.no_bytecode or not bc else
                                     "PYTHONDONTWRITEBYTECODE dropped (set here), so imports use .pyc files")
              + ("; PYTHONDONTWRITEBYTECODE is set: imports compile from source" if a.no_bytecode and bc else ""))
        print(f"mgjit from {self.machine['mgjit_path']}")
        print(f"ptxas {self.machine['ptxas']} ({self.machine['ptxas_path']}), {self.machine['mlir_bindings']}, "
              f"MLIR import in this process {ms(self.mlir_import_s) if hasattr(self, 'mlir_import_s') else '-'}")
        width = max(len(r[0]) for r in self.rows)
        print(f"{'measure':<{width}}  {'softmax bf16 x4096':>18}  {'matmul bf16 4096³':>18}")
        for label, vals, _ in self.rows:
            print(f"{label:<{width}}  {vals['softmax']:>18}  {vals['matmul']:>18}")
        for n in self.notes:
            print(n)
        if self.checks:
            print("FAILED CHECKS:\n  " + "\n  ".join(self.checks))
        else:
            print("all checks passed (cold were misses, warm were hits, no MLIR in warm processes"
                  + (", one verified entry after each concurrent round)" if "concurrent" in a.only else ")"))
        out = {"machine": self.machine, "mode": self.mode, "target": TARGET, "results": self.results,
               "mlir_import_s": getattr(self, "mlir_import_s", None), "failed_checks": self.checks,
               "settings": {"reps": a.reps, "proc_reps": a.proc_reps, "conc_reps": a.conc_reps, "procs": a.procs,
                            "child_bytecode": not a.no_bytecode or not os.environ.get("PYTHONDONTWRITEBYTECODE")},
               "markdown": self.markdown()}
        return out

    def markdown(self) -> str:
        lines = ["| measure | softmax bf16 ×4096 | matmul bf16 4096³ |", "| --- | ---: | ---: |"]
        for label, vals, _ in self.rows:
            label = label.replace("  ", "— ", 1) if label.startswith("  ") else label
            lines.append(f"| {label} | {vals['softmax']} | {vals['matmul']} |")
        return "\n".join(lines)


def _trim(text: str) -> str:
    """pstats output without its header lines and with long paths shortened."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("Ordered by", "List reduced")):
            continue
        for prefix in sorted({os.path.dirname(torch.__file__).rsplit("/", 1)[0] + "/",
                              os.path.dirname(HERE) + "/", sys.prefix + "/lib/"}, key=len, reverse=True):
            line = line.replace(prefix, "")
        out.append(line)
    return "\n".join(out)


def machine_info(gpu: bool) -> dict:
    from mgjit import toolchain
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    dev = torch.cuda.get_device_name() if gpu else "no GPU (compile-only)"
    return {"description": f"{dev}, {cores} CPU cores, {platform.processor() or platform.machine()}, "
                           f"Python {platform.python_version()}, torch {torch.__version__}",
            "cores": cores, "device": dev, "torch": torch.__version__, "python": platform.python_version(),
            "ptxas": toolchain.ptxas_version(), "ptxas_path": toolchain.ptxas_path(),
            "mlir_bindings": toolchain.mlir_bindings_version(), "mgjit_path": os.path.dirname(mgjit.__file__),
            "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--reps", type=int, default=7, help="in-process repetitions (median; at least 5)")
    ap.add_argument("--proc-reps", type=int, default=5, help="single-subprocess repetitions (median; at least 3)")
    ap.add_argument("--conc-reps", type=int, default=3, help="rounds of concurrent processes (median; at least 3)")
    ap.add_argument("--procs", type=int, default=16, help="processes compiling one kernel at once")
    ap.add_argument("--compile-only", action="store_true", help="do not launch even if a GPU is present")
    ap.add_argument("--only", nargs="*", default=["cold", "process", "concurrent"],
                    choices=["cold", "process", "concurrent"])
    ap.add_argument("--no-bytecode", action="store_true",
                    help="keep PYTHONDONTWRITEBYTECODE for the child processes (default: drop it)")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top costs of the warm-hit paths")
    args = ap.parse_args()
    if os.environ.get("MGJIT_CACHE_REDIS"):
        print("note: MGJIT_CACHE_REDIS is set; this benchmark measures the local store and ignores it")
    bench = Bench(args)
    bench.machine = machine_info(bench.gpu)
    try:
        if "cold" in args.only:
            bench.cold_and_warm()
        if "process" in args.only:
            bench.processes()
        if "concurrent" in args.only:
            bench.concurrent()
        out = bench.report()
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    sys.exit(1 if bench.checks else 0)


if __name__ == "__main__":
    main()

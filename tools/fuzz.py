"""Differential fuzzing of mgjit (issue 10, item 4).

Random valid kernels (tests/fuzz_gen.py) are compiled for sm_90a and sm_100a, run in the interpreter and
compared with the reference semantics of the same program (tests/fuzz_ref.py); with --gpu they are also
launched, and the GPU's outputs compared with the interpreter's (bit-exact where the reference says exact,
else within twice the reference's error bound); with --ptx their sm_90a PTX is run on the CPU by the PTX
simulator (tests/ptx_sim.py) and compared the same way: the lowering's numbers checked without a GPU (kernels
using instructions or types the simulator does not cover are counted apart, as unsimulated).

    python tools/fuzz.py --seed 1 --count 2000 --jobs 2
    python tools/fuzz.py --ptx --seed 1 --count 2000 --jobs 2
    python3 tools/fuzz.py --gpu --seed 1 --count 1000

Prints the kernels run and the failures by category; each category's first failures are minimized and written
to --out (default fuzz-failures/) as <category>/seed<N>.py (+ .pt, its tensors), runnable on their own.
A failure is: anything but a CompileError naming the kernel's line (an internal error, an MLIR verifier
failure, a ptxas error), a CompileError for a valid kernel, an interpreter error, or a value mismatch; with
--gpu also a failed launch, or one that has not finished HANG_SECONDS after it began (gpu-hang); and a kernel that
takes its process down (crash: an abort inside the compiler). Kernels are checked in child processes (Worker),
each replaced after one of those, so the run goes on past them, and their minimizing runs there too.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import dataclasses
import importlib.util
import multiprocessing
import os
import queue
import re
import sys
import tempfile
import time
import traceback
import warnings
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), ROOT]

import torch  # noqa: E402

import fuzz_gen  # noqa: E402
import fuzz_program  # noqa: E402
import fuzz_ref  # noqa: E402
import mgjit  # noqa: E402

TARGETS = ("sm_90a", "sm_100a")


@dataclasses.dataclass
class Outcome:
    status: str  # "ok", "uncertain" (the reference cannot follow its control flow), "unsimulated" or "fail"
    category: str = ""
    detail: str = ""


class Launch:
    """A program's kernel (imported from its source) and the tensors of one launch."""

    def __init__(self, p: fuzz_program.Program, directory: str, tag: str):
        path = os.path.join(directory, f"fuzz_{p.seed}_{tag}.py")
        with open(path, "w") as f:
            f.write(fuzz_program.source(p))
        spec = importlib.util.spec_from_file_location(f"fuzz_{p.seed}_{tag}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.path, self.kernel, self.p = path, module.fuzz_kernel, p
        self.consts = dict(p.consts)

    def tensors(self, device: str = "cpu") -> tuple[dict, dict]:
        return tensors(self.p, device)

    def args(self, inputs: dict, outputs: dict) -> list:
        return [*inputs.values(), *outputs.values(), *(v for _, v in self.p.scalars)]


def tensors(p: fuzz_program.Program, device: str = "cpu") -> tuple[dict, dict]:
    """Fresh copies of a program's input and output tensors (the views the kernel takes)."""
    def views(ts):
        return {t.name: t.view_of(t.data.clone().to(device)) for t in ts}
    return views(p.inputs), views(p.outputs)


def normalize(message: str) -> str:
    """A message's first line without the numbers and names that differ between kernels."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    line = re.sub(r"\S*fuzz_\d+_\w+\.py:\d+( \(in \w+\))?: ", "", line)
    line = re.sub(r"`[^`]*`", "`_`", line)
    line = re.sub(r"\b(" + "|".join(d.name for d in mgjit.dtypes.ALL) + r")\b", "T", line)
    line = re.sub(r"\bout\d+|\bx\d+", "_", line)
    line = re.sub(r"%\d+|\b\d+\b|0x[0-9a-f]+", "N", line)
    return line[:110]


def classify(e: Exception, launch: Launch, stage: str) -> Outcome:
    if isinstance(e, mgjit.CompileError) and not isinstance(e, mgjit.InterpretError) \
            and not e.message.startswith("internal error"):
        if e.loc is None or os.path.abspath(e.loc.file) != launch.path:
            return Outcome("fail", f"unlocated-compile-error: {normalize(e.message)}", str(e))
        return Outcome("fail", f"compile-error[{e.rule or '-'}]: {normalize(e.message)}", str(e))
    detail = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
    message = e.message if isinstance(e, mgjit.CompileError) else str(e)
    if "error: " in message:  # an MLIR diagnostic: its own first line says what failed
        message = message[message.index("error: "):]
    return Outcome("fail", f"{stage}: {type(e).__name__}: {normalize(message)}", detail)


def check(p: fuzz_program.Program, directory: str, tag: str, gpu: bool = False, ptx: bool = False) -> Outcome:
    """Compile for both targets, interpret, evaluate the reference and compare (and on the GPU, launch; with
    `ptx`, run the sm_90a PTX on the simulator)."""
    try:
        launch = Launch(p, directory, tag)
    except Exception as e:  # the generator made a program Python cannot import: a generator bug
        return Outcome("fail", f"generator: {type(e).__name__}: {normalize(str(e))}", traceback.format_exc())
    inputs, outputs = launch.tensors()
    args = launch.args(inputs, outputs)
    for target in TARGETS:
        try:
            launch.kernel.compile(*args, target=target, **launch.consts)
        except Exception as e:
            return classify(e, launch, f"internal-error[{target}]")
    try:
        launch.kernel.interpret[(p.grid,)](*args, **launch.consts)
    except Exception as e:
        return classify(e, launch, "interpret-error")
    ref_in, ref_out = launch.tensors()
    try:
        expected = fuzz_ref.evaluate(p, ref_in, ref_out)
    except fuzz_ref.Uncertain:
        return Outcome("uncertain")
    except Exception as e:
        return Outcome("fail", f"reference: {type(e).__name__}: {normalize(str(e))}", traceback.format_exc())
    bad = compare(outputs, expected, 1.0)
    if bad:
        return Outcome("fail", "mismatch: interpreter against reference", bad)
    if gpu:
        return check_gpu(launch, outputs, expected)
    if ptx:
        return check_ptx(launch, outputs, expected)
    return Outcome("ok")


def compare(got: dict, expected: dict, scale: float) -> str:
    """A description of the elements of `got` outside the expected bounds ('' if none)."""
    lines = []
    for name, value in got.items():
        want, err = expected[name]
        wrong = fuzz_ref.mismatches(value.cpu(), want, err, scale)
        if wrong.any():
            idx = wrong.nonzero()[:4].tolist()
            cells = ", ".join(f"{tuple(i)}: got {value.cpu()[tuple(i)].item()!r} want {want[tuple(i)].item()!r} "
                              f"(err {err[tuple(i)].item():.3g})" for i in idx)
            lines.append(f"{name} ({int(wrong.sum())} of {wrong.numel()} wrong): {cells}")
    return "\n".join(lines)


def _before_launch() -> None:
    """Called just before each GPU launch (a Worker's child tells its parent, which then waits HANG_SECONDS)."""


def check_gpu(launch: Launch, interpreted: dict, expected: dict) -> Outcome:
    inputs, outputs = launch.tensors("cuda")
    _before_launch()
    try:
        launch.kernel[(launch.p.grid,)](*launch.args(inputs, outputs), **launch.consts)
        torch.cuda.synchronize()
    except Exception as e:
        return classify(e, launch, "gpu-error")
    bounds = {n: (interpreted[n], err) for n, (_, err) in expected.items()}
    bad = compare(outputs, bounds, 2.0)
    return Outcome("fail", "mismatch: GPU against interpreter", bad) if bad else Outcome("ok")


def check_ptx(launch: Launch, interpreted: dict, expected: dict) -> Outcome:
    import ptx_sim
    inputs, outputs = launch.tensors()
    args = launch.args(inputs, outputs)
    compiled = launch.kernel.compile(*args, target="sm_90a", **launch.consts)
    dev = ptx_sim.Device()
    bases = {name: t if t._base is None else t._base for name, t in {**inputs, **outputs}.items()}
    for base in bases.values():
        dev.place(base)
    try:
        dev.run(compiled, (launch.p.grid,), *args)
    except ptx_sim.SimError as e:  # what the hardware would fault on (a misaligned or stray access, a hang)
        if str(e).startswith("the simulator does not know"):
            return Outcome("unsimulated", detail=str(e))
        return classify(e, launch, "ptx-sim-error")
    got = {name: dev.fetch(bases[name]).as_strided(t.shape, t.stride(),
                                                   t.storage_offset() - bases[name].storage_offset())
           for name, t in outputs.items()}
    bounds = {n: (interpreted[n], err) for n, (_, err) in expected.items()}
    bad = compare(got, bounds, 2.0)
    return Outcome("fail", "mismatch: PTX simulator against interpreter", bad) if bad else Outcome("ok")


# ---------------------------------------------------------------------------------------------- minimizing

def _stmt_lists(p: fuzz_program.Program):
    """Every statement list of the program, in a fixed order."""
    def lists(stmts):
        yield stmts
        for s in stmts:
            yield from lists(s.body)
            yield from lists(s.orelse)
    for h in p.helpers:
        yield from lists(h.body)
    yield from lists(p.body)


def _nodes(p: fuzz_program.Program):
    """Every expression of the program, in a fixed order."""
    for stmts in _stmt_lists(p):
        for s in stmts:
            for key in ("value", "cond"):
                if isinstance(s.attrs.get(key), fuzz_program.Node):
                    yield from s.attrs[key].walk()
            for key in ("bounds", "starts"):
                for n in s.attrs.get(key, []):
                    yield from n.walk()
    for h in p.helpers:
        for r in h.returns:
            yield from r.walk()


def _candidates(p: fuzz_program.Program) -> list[Callable[[fuzz_program.Program], None]]:
    """Smaller variants of p, as edits of a copy: fewer warpgroups and programs, statements removed or unwrapped,
    expressions replaced by a sub-expression or a constant of their type."""
    out: list[Callable[[fuzz_program.Program], None]] = []
    if p.grid > 1:
        out.append(lambda q: setattr(q, "grid", 1))
    n = len(p.body)
    for k in (n // 2, n // 4, n // 8):  # big steps first: drop a run of k top-level statements
        for start in range(0, n - k + 1, max(k, 1)) if k > 1 else ():
            out.append(lambda q, start=start, k=k: q.body.__delitem__(slice(start, start + k)))
    for li, stmts in enumerate(_stmt_lists(p)):
        for si, s in enumerate(stmts):
            out.append(lambda q, li=li, si=si: list(_stmt_lists(q))[li].pop(si))
            if s.kind in ("if", "for", "static_for", "const_if"):
                for part in ("body", "orelse"):
                    out.append(lambda q, li=li, si=si, part=part: _unwrap(list(_stmt_lists(q))[li], si, part))
    for ni, n in enumerate(_nodes(p)):
        for ci, c in enumerate(n.args):
            if c.ty == n.ty:
                out.append(lambda q, ni=ni, ci=ci: _replace(list(_nodes(q))[ni], list(_nodes(q))[ni].args[ci]))
        if n.ty.shape and not n.ty.view and n.op != "full":
            out.append(lambda q, ni=ni: _replace(list(_nodes(q))[ni], fuzz_program.Node(
                "full", list(_nodes(q))[ni].ty, attrs={"value": 1 if list(_nodes(q))[ni].ty.dtype.is_int else 1.0})))
    return out


def _unwrap(stmts: list, i: int, part: str) -> None:
    stmts[i:i + 1] = getattr(stmts[i], part)


def _replace(node: fuzz_program.Node, by: fuzz_program.Node) -> None:
    node.op, node.ty, node.args, node.attrs = by.op, by.ty, by.args, by.attrs


def _prune(p: fuzz_program.Program) -> None:
    """Drop tensors and helpers nothing refers to any more."""
    used = {n.attrs.get("ref") for n in _nodes(p)} | {s.attrs.get("out") for ss in _stmt_lists(p) for s in ss}
    p.inputs = [t for t in p.inputs if t.name in used]
    p.outputs = [t for t in p.outputs if t.name in used]
    called = {n.attrs.get("helper") for n in _nodes(p)}
    p.helpers = [h for h in p.helpers if h.name in called]


Checker = Callable[[fuzz_program.Program, str, str], Outcome]  # (program, directory, tag) -> its outcome


def minimize(p: fuzz_program.Program, category: str, directory: str, checker: Checker,
             budget_s: float) -> fuzz_program.Program:
    """Greedily shrink p while it still fails with the same category."""
    assert category, "only failures are minimized"
    deadline = time.time() + budget_s
    attempt, start, progress = 0, 0, True
    while progress and time.time() < deadline:
        progress = False
        edits = _candidates(p)
        i = start
        while i < len(edits) and time.time() < deadline:
            q = copy.deepcopy(p)
            try:
                edits[i](q)
                _prune(q)
            except (IndexError, KeyError):
                i += 1
                continue
            attempt += 1
            if checker(q, directory, f"min{attempt}").category == category:
                p, edits, progress = q, _candidates(q), True  # the edits before i failed already: go on from i
            else:
                i += 1
        start = 0
    return p


REPRO = '''

if __name__ == "__main__":
    # {category}
    import os
    import torch
    data = torch.load(os.path.splitext(os.path.abspath(__file__))[0] + ".pt")
    views = [torch.as_strided(b.clone(), s, st, o) for b, s, st, o in data["tensors"]]
    args = views + data["scalars"]
    for target in ("sm_90a", "sm_100a"):
        fuzz_kernel.compile(*args, target=target, **data["consts"])
    fuzz_kernel.interpret[(data["grid"],)](*args, **data["consts"])
    for name, view, (want, err) in zip(data["names"], views[-len(data["expected"]):], data["expected"]):
        bad = ~((view == want) | (view != view) & (want != want) | ((view.double() - want.double()).abs() <= err))
        bad &= err.isfinite()
        print(name, "ok" if not bad.any() else f"got {{view[bad][:8].tolist()}} want {{want[bad][:8].tolist()}}")
'''


def write_repro(p: fuzz_program.Program, outcome: Outcome, out_dir: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", outcome.category.lower()).strip("-")[:80]
    folder = os.path.join(out_dir, slug)
    os.makedirs(folder, exist_ok=True)
    base = os.path.join(folder, f"seed{p.seed}")
    expected = []
    try:
        inputs, outputs = tensors(p)
        expected = list(fuzz_ref.evaluate(p, inputs, outputs).values())
    except fuzz_ref.Uncertain:  # the repro then compiles and interprets only
        pass
    views = [(t.data, tuple(v.shape), v.stride(), v.storage_offset())
             for t in p.inputs + p.outputs for v in [t.view_of(t.data)]]
    torch.save({"tensors": views, "scalars": [v for _, v in p.scalars], "consts": dict(p.consts), "grid": p.grid,
                "names": [t.name for t in p.outputs], "expected": expected}, base + ".pt")
    with open(base + ".py", "w") as f:
        body = "\n".join("# " + line for line in outcome.detail.strip().splitlines()[-12:])
        f.write(f"# {outcome.category}\n{body}\n" + fuzz_program.source(p) + REPRO.format(category=outcome.category))
    return base + ".py"


# ---------------------------------------------------------------------------------------------- driver

KERNEL_SECONDS = 300  # a kernel that takes longer to compile, interpret and check is reported as a hang
HANG_SECONDS = 15  # a GPU launch of a fuzzed kernel (microseconds of work) that takes longer hangs


class Worker:
    """check(..., gpu, ptx) in a child process of its own, which the parent replaces after a kernel that takes it
    down: an abort inside the compiler (LLVM's "Cannot select" ends the process, fuzz seed 88218, and a run in one
    process ended there, naming nothing), a launch that hangs (it holds its process inside CUDA, where no signal
    handler runs: no answer HANG_SECONDS after its launch began) or fails (the CUDA context may be unusable). The
    kernel is reported and the run goes on. `setup` (a module-level function) runs first in each child."""

    def __init__(self, setup: Callable[[], None] | None = None, gpu: bool = True, ptx: bool = False):
        self.setup, self.gpu, self.ptx = setup, gpu, ptx
        self._start()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # a forked child would share the parent's CUDA state
        self.conn, child = context.Pipe()
        self.proc = context.Process(target=_child, args=(child, self.setup, self.gpu, self.ptx), daemon=True)
        self.proc.start()
        child.close()

    def restart(self) -> None:
        self.close()
        self._start()

    def check(self, p: fuzz_program.Program, directory: str, tag: str) -> Outcome:
        if not self.proc.is_alive():
            self.restart()
        self.conn.send((p, directory, tag))
        limit = KERNEL_SECONDS
        while True:
            if not self.conn.poll(limit):
                failure = Outcome("fail", "gpu-hang", f"the launch did not finish in {HANG_SECONDS} s") \
                    if limit == HANG_SECONDS else Outcome("fail", "timeout", f"no answer in {KERNEL_SECONDS} s")
                break
            try:
                answer = self.conn.recv()
            except EOFError:  # the child died without an answer
                self.proc.join(5)
                what = f"the checking process died (exit code {self.proc.exitcode})"
                failure = Outcome("fail", "gpu-crash" if self.gpu else "crash", what)
                break
            if answer == "launch":
                limit = HANG_SECONDS
                continue
            if answer.category.startswith("gpu-"):  # its CUDA context may be unusable: a fresh child
                self.restart()
            return answer
        self.restart()
        return failure

    def close(self) -> None:
        self.proc.kill()
        self.proc.join()


def _child(conn, setup: Callable[[], None] | None, gpu: bool, ptx: bool) -> None:
    global _before_launch
    _init_worker()
    if setup is not None:
        setup()
    _before_launch = lambda: conn.send("launch")  # noqa: E731
    while True:
        p, directory, tag = conn.recv()
        try:
            outcome = check(p, directory, tag, gpu=gpu, ptx=ptx)
        except Exception as e:  # outside check's own handling: moving the tensors to the GPU
            outcome = Outcome("fail", f"worker: {type(e).__name__}: {normalize(str(e))}", traceback.format_exc())
        conn.send(outcome)


def run_in_workers(seeds, jobs: int, gpu: bool, ptx: bool, record: Callable[[int, Outcome], None]) -> Worker:
    """Check the seeds in `jobs` Workers at once, recording the outcomes in the seeds' order; returns one of the
    Workers, still running, for the minimizing runs (all are closed if the run stops on an exception)."""
    workers: queue.Queue = queue.Queue()
    every = [Worker(gpu=gpu, ptx=ptx) for _ in range(jobs)]
    for w in every:
        workers.put(w)

    def one(seed: int) -> tuple[int, Outcome]:
        w = workers.get()
        try:
            with tempfile.TemporaryDirectory(prefix="mgjit-fuzz-") as d:
                return seed, w.check(fuzz_gen.generate(seed), d, "k")
        finally:
            workers.put(w)
    try:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for seed, outcome in pool.map(one, seeds):
                record(seed, outcome)
    except BaseException:
        for w in every:
            w.close()
        raise
    for w in every[1:]:
        w.close()
    return every[0]


def _init_worker() -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", mgjit.PtxasWarning)  # spills of big random kernels are not failures
    # Every warpgroup of a kernel of several stores the same values (the program has no warpgroup branches): the
    # replicated-store warning is right, and not a failure; wrong values are found by the comparison.
    warnings.simplefilter("ignore", mgjit.CompileWarning)
    # Random layouts meet SMEM tiles in every order: bank conflicts are slow, not wrong, and filled the logs.
    warnings.simplefilter("ignore", mgjit.BankConflictWarning)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--gpu", action="store_true", help="also launch on the GPU and compare with the interpreter")
    ap.add_argument("--ptx", action="store_true",
                    help="also run the sm_90a PTX on the PTX simulator and compare with the interpreter")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default="fuzz-failures", help="folder for minimized reproductions")
    ap.add_argument("--minimize", type=int, default=2, help="failures minimized per category")
    ap.add_argument("--minimize-seconds", type=float, default=120.0)
    args = ap.parse_args(argv)
    os.environ.setdefault("MGJIT_CACHE_DIR", tempfile.mkdtemp(prefix="mgjit-fuzz-cache-"))
    os.environ.setdefault("MGJIT_CACHE_MAX_BYTES", str(64 << 20))
    seeds = range(args.seed, args.seed + args.count)
    start = time.time()
    counts: collections.Counter = collections.Counter()
    failures: dict[str, list[tuple[int, Outcome]]] = collections.defaultdict(list)

    def record(seed: int, outcome: Outcome) -> None:
        counts[outcome.status] += 1
        if outcome.status == "fail":
            failures[outcome.category].append((seed, outcome))
            if len(failures[outcome.category]) == 1:
                print(f"seed {seed}: {outcome.category}", flush=True)
        done = sum(counts.values())
        if done % 100 == 0:
            print(f"... {done} kernels, {counts['fail']} failing, {time.time() - start:.0f} s", flush=True)

    worker = None
    try:
        worker = run_in_workers(seeds, 1 if args.gpu else args.jobs, args.gpu, args.ptx, record)
        print(f"\n{sum(counts.values())} kernels in {time.time() - start:.0f} s: {counts['ok']} ok, "
              f"{counts['uncertain']} with control flow the reference cannot follow (compiled and interpreted "
              "only), " + (f"{counts['unsimulated']} beyond the PTX simulator, " if args.ptx else "")
              + f"{counts['fail']} failing")
        for category, items in sorted(failures.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(items):5d}  {category}   (seeds {', '.join(str(s) for s, _ in items[:6])})")
        checker: Checker = worker.check
        with tempfile.TemporaryDirectory(prefix="mgjit-fuzz-min-") as d:
            for category, items in failures.items():
                for seed, outcome in items[:args.minimize]:
                    small = minimize(fuzz_gen.generate(seed), category, d, checker, args.minimize_seconds)
                    final = checker(small, d, "final")
                    where = write_repro(small, final if final.status == "fail" else outcome, args.out)
                    print(f"  minimized seed {seed} -> {where}")
    finally:
        if worker is not None:
            worker.close()
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())

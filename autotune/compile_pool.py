"""Compiling the candidate configs of a sweep, in parallel across forked processes where the OS allows.

Children inherit the kernel and the call's arguments through fork (nothing is pickled but config indices
and reason strings), compile one config at a time, and leave the result in the shared on-disk kernel cache; the
parent then compiles each survivor again, which is a cache hit. Children never touch CUDA: they only run
the compiler, for a target the parent resolved first. A child the compiler takes down (an LLVM fatal error
aborts its process) costs its config alone: the config is pruned with what the child printed, and the sweep goes
on."""
from __future__ import annotations

import collections
import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CompileError
from .config import Config
from .prune import compile_error_reason, resource_reason


@dataclass(frozen=True)
class CompileOutcome:
    """One config's compile: the CompiledKernel of a survivor, or why the config was pruned; `warnings`: a
    survivor's compile warnings (warnings.WarningMessage), for `compile_configs` or its caller to pass on."""

    config: Config
    compiled: Any = None
    pruned: str | None = None
    warnings: tuple = ()


def default_jobs() -> int:
    """Worker processes for compiling: `MGJIT_AUTOTUNE_JOBS`, else the usable cores shared among the
    ranks of this host (torchrun's `LOCAL_WORLD_SIZE`), so that 8 ranks on one host do not start 8x
    oversubscribed pools."""
    env = os.environ.get("MGJIT_AUTOTUNE_JOBS")
    if env:
        try:
            jobs = int(env)
        except ValueError:
            raise ValueError(f"MGJIT_AUTOTUNE_JOBS must be a positive int; got {env!r}") from None
        if jobs < 1:
            raise ValueError(f"MGJIT_AUTOTUNE_JOBS must be a positive int; got {env!r}")
        return jobs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, cores // max(1, local_ranks))


def can_fork() -> bool:
    """Fork is the transport (the kernel object is inherited, never pickled); a daemon process, such as a
    pool worker, may not have children of its own."""
    return ("fork" in multiprocessing.get_all_start_methods()
            and not multiprocessing.current_process().daemon)


def _compile_here(kernel: Any, args: Sequence[Any], keywords: Mapping[str, Any], config: Config,
                  target: str | None) -> CompileOutcome:
    """Compile one config. The compile's warnings are kept on the outcome only for a config that is kept: a pruned
    one's (ptxas spilling, say) are its prune reason, which the tuning report shows."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            compiled = kernel.compile(*args, target=target, **keywords, **config.launch_kwargs())
        except CompileError as error:
            return CompileOutcome(config, pruned=compile_error_reason(error))
    reason = resource_reason(compiled.registers, compiled.spills, compiled.threads)
    if reason is not None:
        return CompileOutcome(config, pruned=reason)
    return CompileOutcome(config, compiled=compiled, warnings=tuple(caught))


def pass_on(caught: Sequence[warnings.WarningMessage]) -> None:
    """Give the caller warnings caught while compiling, as they were given."""
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


# What forked children compile: (kernel, args, keywords, configs, target). Set in the parent just before
# the workers fork and cleared after; a module global because fork, not pickling, carries it to the children.
_JOB: tuple[Any, Sequence[Any], Mapping[str, Any], Sequence[Config], str | None] | None = None


def _compile_in_child(index: int) -> str | None:
    """Compile config `index`; return its prune reason, or None when the parent should compile it again
    (a success, now in the disk cache, or an unexpected failure that the parent will reproduce and raise
    with its own traceback)."""
    assert _JOB is not None, "compile worker started without a job"
    kernel, args, keywords, configs, target = _JOB
    try:
        kernel.compile(*args, target=target, **keywords, **configs[index].launch_kwargs())
    except CompileError as error:
        return compile_error_reason(error)
    except Exception:
        pass  # the parent compiles this config again and raises the error with its own traceback
    return None


def _worker(conn: multiprocessing.connection.Connection, stderr: int) -> None:
    """A forked child's loop: compile each config index the parent sends and answer (index, prune reason), until
    None. Its stderr is the file `stderr`, which the parent reads if the child dies."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a guard for compilers that would look for a device
    os.dup2(stderr, 2)
    if faulthandler.is_enabled():  # its dump of an abort (pytest enables it) goes there too, not to the terminal
        faulthandler.enable(file=2)
    # Silent here: the parent compiles each survivor again (a cache hit, which replays the compile's warnings)
    # and passes on the warnings of the configs it keeps.
    warnings.simplefilter("ignore")
    while (index := conn.recv()) is not None:
        conn.send((index, _compile_in_child(index)))


def _how_it_died(exitcode: int | None, stderr) -> str:
    """How a worker died: its exit signal or code, and what it printed last, or first where that names an error
    (LLVM prints "LLVM ERROR: Cannot select: ...", then the DAG it could not select)."""
    how = (f"killed by {signal.Signals(-exitcode).name}" if exitcode is not None and exitcode < 0
           else f"exit code {exitcode}")
    stderr.seek(0)
    lines = [line.strip() for line in stderr.read().decode(errors="replace").splitlines() if line.strip()]
    said = next((line for line in lines if "ERROR" in line or "Fatal" in line), lines[-1] if lines else "")
    return f"{how}: {said[:300]}" if said else how


def _in_workers(kernel_name: str, configs: Sequence[Config], indices: Sequence[int],
                jobs: int) -> Iterator[tuple[int, str | None]]:
    """Compile configs[i] for each i of `indices` in up to `jobs` forked workers, one index at a time each;
    yield (index, prune reason or None) as they finish. A worker that dies holding an index prunes that config
    (and warns: a compiler crash is a bug of mgjit's), and a new worker takes its place; a multiprocessing.Pool
    would wait forever for the lost index."""
    context = multiprocessing.get_context("fork")
    todo = collections.deque(indices)
    running: dict[Any, tuple[Any, Any, int]] = {}  # the parent's end of a worker's pipe: (process, stderr, index)

    def start() -> None:
        parent_end, child_end = context.Pipe()
        stderr = tempfile.TemporaryFile()
        process = context.Process(target=_worker, args=(child_end, stderr.fileno()), daemon=True)
        process.start()
        child_end.close()  # the worker's death reads as EOF only once the parent holds no copy of its end
        running[parent_end] = (process, stderr, todo.popleft())
        parent_end.send(running[parent_end][2])

    def retire(conn, kill: bool = False) -> None:
        process, stderr, _ = running.pop(conn)
        if kill:
            process.kill()
        elif process.is_alive():
            conn.send(None)  # an idle worker stops at None
        process.join()
        conn.close()
        stderr.close()

    try:
        while todo and len(running) < jobs:
            start()
        while running:
            for conn in multiprocessing.connection.wait(list(running)):
                process, stderr, index = running[conn]
                try:
                    answer = conn.recv()
                except EOFError:
                    process.join()
                    how = _how_it_died(process.exitcode, stderr)
                    warnings.warn(f"mgjit: compiling {kernel_name} with {configs[index]!r} took the compiler's "
                                  f"process down ({how}); the config is pruned. This is a bug in mgjit: please "
                                  "report it with the config.", RuntimeWarning, stacklevel=3)
                    retire(conn)
                    if todo:
                        start()
                    yield index, f"internal error: the compiler's process died ({how})"
                    continue
                if todo:
                    running[conn] = (process, stderr, todo.popleft())
                    conn.send(running[conn][2])
                else:
                    retire(conn)
                yield answer
    finally:
        for conn in list(running):  # a sweep stopped early (an exception, ^C): workers mid-compile are killed
            retire(conn, kill=True)


def compile_configs(kernel: Any, args: Sequence[Any], keywords: Mapping[str, Any],
                    configs: Sequence[Config], *, target: str | None = None, jobs: int | None = None,
                    on_done: Callable[[], None] | None = None, warn: bool = True) -> list[CompileOutcome]:
    """Compile every config (with the call's `args` and `keywords`, the config's values added), pruning those
    that break a compiler rule or whose ptxas report rules them out. Outcomes come back in config order. The
    survivors' compile warnings reach the caller (`warn`), or are kept on their outcomes for the caller to pass on
    (the tuner: the pick's alone).

    `jobs` worker processes (default `default_jobs()`); 1, or no fork on this OS, compiles serially.
    `on_done()` is called once per finished config, for a progress bar."""
    global _JOB
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be a positive int; got {jobs!r}")
    outcomes: dict[int, CompileOutcome] = {}
    tick = on_done or (lambda: None)

    # The parent compiles serially until one config succeeds. That resolves the target (children must not
    # ask a device for it) and imports the compiler once, so that children inherit it warm.
    next_index = 0
    while next_index < len(configs):
        outcome = _compile_here(kernel, args, keywords, configs[next_index], target)
        outcomes[next_index] = outcome
        next_index += 1
        tick()
        if outcome.compiled is not None:
            target = outcome.compiled.target
            break

    rest = list(range(next_index, len(configs)))
    workers = min(jobs, len(rest))
    if workers > 1 and can_fork():
        _JOB = (kernel, args, keywords, configs, target)
        try:
            for index, reason in _in_workers(getattr(kernel, "name", "kernel"), configs, rest, workers):
                if reason is not None:
                    outcomes[index] = CompileOutcome(configs[index], pruned=reason)
                tick()
        finally:
            _JOB = None
        # Survivors (and anything a child failed on unexpectedly) compile here: a disk-cache hit for the
        # former, the real error with its traceback for the latter.
        for index in rest:
            if index not in outcomes:
                outcomes[index] = _compile_here(kernel, args, keywords, configs[index], target)
    else:
        for index in rest:
            outcomes[index] = _compile_here(kernel, args, keywords, configs[index], target)
            tick()
    ordered = [outcomes[i] for i in range(len(configs))]
    if warn:
        for outcome in ordered:
            pass_on(outcome.warnings)
    return ordered

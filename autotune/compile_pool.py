"""Compiling the candidate configs of a sweep, in parallel across forked processes where the OS allows.

Children inherit the kernel and the call's arguments through fork (nothing is pickled but config indices
and reason strings), compile one config each, and leave the result in the shared on-disk kernel cache; the
parent then compiles each survivor again, which is a cache hit. Children never touch CUDA: they only run
the compiler, for a target the parent resolved first."""
from __future__ import annotations

import multiprocessing
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
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
# the pool forks and cleared after; a module global because fork, not pickling, carries it to the children.
_JOB: tuple[Any, Sequence[Any], Mapping[str, Any], Sequence[Config], str | None] | None = None


def _child_init() -> None:
    # A guard for compilers that would look for a device: a forked child must not initialize CUDA.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def _compile_in_child(index: int) -> tuple[int, str | None]:
    """Compile config `index`; return its prune reason, or None when the parent should compile it again
    (a success, now in the disk cache, or an unexpected failure that the parent will reproduce and raise
    with its own traceback)."""
    assert _JOB is not None, "compile worker started without a job"
    kernel, args, keywords, configs, target = _JOB
    # Silent here: the parent compiles each survivor again (a cache hit, which replays the compile's warnings)
    # and passes on the warnings of the configs it keeps.
    warnings.simplefilter("ignore")
    try:
        kernel.compile(*args, target=target, **keywords, **configs[index].launch_kwargs())
    except CompileError as error:
        return index, compile_error_reason(error)
    except Exception:
        pass  # the parent compiles this config again and raises the error with its own traceback
    return index, None


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
            with multiprocessing.get_context("fork").Pool(workers, initializer=_child_init) as pool:
                for index, reason in pool.imap_unordered(_compile_in_child, rest):
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

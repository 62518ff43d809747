"""Reasons to drop a config before it is timed: user predicates, compile errors and the ptxas report.

Every drop carries a reason string, shown in the tuning report and (for compile and ptxas reasons, which
depend only on the kernel source, the config and the call's specialization) stored on disk."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .config import Config

# Hardware limits that ptxas does not enforce on its own (Hopper and Blackwell alike): a thread may
# address at most 255 registers, and an SM has 64K 32-bit registers, which one block must fit in.
MAX_REGISTERS_PER_THREAD = 255
REGISTERS_PER_SM = 65536

Rule = Callable[[Config, Mapping[str, Any]], "str | None"]
PruneConfigs = Callable[[list[Config], Mapping[str, Any]], Sequence[Config]]


def apply_user_pruning(configs: Sequence[Config], named_args: Mapping[str, Any],
                       prune_configs: PruneConfigs | None, rules: Sequence[Rule]) -> dict[Config, str]:
    """Configs dropped by the user's `prune_configs` callable and `rules` predicates, with reasons.

    `prune_configs(configs, named_args)` returns the configs to keep; `rule(config, named_args)` returns a
    reason string to drop the config or None to keep it. Rules run only on what `prune_configs` kept."""
    dropped: dict[Config, str] = {}
    kept = list(configs)
    if prune_configs is not None:
        result = prune_configs(list(configs), named_args)
        offered = set(configs)
        strangers = [c for c in result if c not in offered]
        if strangers:
            raise ValueError(f"prune_configs must return a subset of the configs it was given; it returned "
                             f"{strangers[0]!r}, which was not among them")
        keep = set(result)
        name = getattr(prune_configs, "__name__", "prune_configs")
        for config in kept:
            if config not in keep:
                dropped[config] = f"prune_configs ({name}) removed it"
        kept = [c for c in kept if c in keep]
    for config in kept:
        for rule in rules:
            reason = rule(config, named_args)
            if reason is not None:
                if not isinstance(reason, str):
                    raise TypeError(f"an autotune rule must return a reason str or None; "
                                    f"{getattr(rule, '__name__', rule)!r} returned {reason!r}")
                dropped[config] = reason
                break
    return dropped


def compile_error_reason(error: BaseException) -> str:
    """The prune reason for a `CompileError`: its rule, then the first line of its message, which names
    the kernel's file and line (the rest is the quoted source line)."""
    first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
    rule = getattr(error, "rule", None)
    return f"{rule}: {first_line}" if rule else f"compile error: {first_line}"


def resource_reason(registers: int, spills: int, threads: int) -> str | None:
    """Why a compiled kernel's ptxas report rules it out, or None if it does not.

    Spilling configs are dropped outright rather than timed: local-memory traffic makes them slow, and a
    config that spills at this size is rarely the winner."""
    if spills > 0:
        return f"ptxas: {spills} bytes spilled"
    if registers > MAX_REGISTERS_PER_THREAD:
        return f"ptxas: {registers} registers per thread > {MAX_REGISTERS_PER_THREAD}"
    if registers * threads > REGISTERS_PER_SM:
        return (f"ptxas: {registers} registers x {threads} threads = {registers * threads} "
                f"> {REGISTERS_PER_SM} per SM")
    return None


def divisible(problem: str, tile: str) -> Rule:
    """A rule that drops configs whose tile (a config value) does not divide the problem size (an int
    argument): `rules=[divisible("M", "BM")]`. Sizes are runtime values, so the compiler cannot check it."""

    def rule(config: Config, named_args: Mapping[str, Any]) -> str | None:
        if tile not in config.kwargs:
            raise KeyError(f"divisible({problem!r}, {tile!r}): the config has no {tile!r}; it has "
                           f"{sorted(config.kwargs)}")
        if problem not in named_args:
            raise KeyError(f"divisible({problem!r}, {tile!r}): the kernel call has no argument {problem!r}; "
                           f"it has {sorted(named_args)}")
        size, step = named_args[problem], config.kwargs[tile]
        if size % step:
            return f"divisibility: {problem}={size} is not a multiple of {tile}={step}"
        return None

    rule.__name__ = f"divisible_{problem}_by_{tile}"
    return rule

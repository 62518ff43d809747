"""`autotune` and `Autotuned`: pick, per tuning key, the fastest config of a kernel and launch with it.

A sweep for a new key: load what the on-disk store already knows (shared among ranks), drop configs by the
user's rules, compile the rest in parallel (pruning on compile errors and the ptxas report), time the
survivors, store every result, and pick the fastest (ties go to the earlier config)."""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import LaunchError
from . import distributed, progress
from .compile_pool import CompileOutcome, compile_configs, pass_on
from .config import LAUNCH_OPTIONS, Config, expand_space
from .prune import PruneConfigs, Rule, apply_user_pruning
from .report import Row, TuningReport
from .store import Result, ResultStore, default_root
from .timing import CudaEventTimer, Run, Timer, device_name

Key = tuple[tuple[str, Any], ...]

_default_timer: CudaEventTimer | None = None


def _shared_default_timer() -> CudaEventTimer:
    # One for the process: it holds a 256 MB flush buffer per device, which every kernel can share.
    global _default_timer
    if _default_timer is None:
        _default_timer = CudaEventTimer()
    return _default_timer


def _names(what: str, names: Any) -> tuple[str, ...]:
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{what} must be a list of argument names, e.g. {what}=['M', 'N']; got {names!r}")
    return tuple(names)


class Autotuned:
    """A kernel with a list of configs; `tuned[grid](*args)` launches the fastest config for the args'
    tuning key, sweeping the configs the first time a key is seen (or reading the stored sweep)."""

    def __init__(self, kernel: Any, configs: Sequence[Config], *, key: Sequence[str] = (),
                 restore: Sequence[str] = (), reset: Sequence[str] = (),
                 prune_configs: PruneConfigs | None = None, rules: Sequence[Rule] = (),
                 timer: Timer | None = None, jobs: int | None = None):
        for attribute in ("name", "arg_names", "constexpr_names", "source_key", "compile", "__getitem__"):
            if not hasattr(kernel, attribute):
                raise TypeError(f"mgjit.autotune decorates an @mgjit.kernel (stack it on top); got "
                                f"{kernel!r}, which has no {attribute!r}")
        configs = tuple(configs)
        if not configs or not all(isinstance(c, Config) for c in configs):
            raise TypeError(f"configs must be a non-empty list of mgjit.Config; got {configs!r}")
        if len(set(configs)) != len(configs):
            twice = next(c for i, c in enumerate(configs) if c in configs[:i])
            raise ValueError(f"{twice!r} is listed twice in the configs of {kernel.name}")
        config_names = list(configs[0].kwargs)
        for config in configs:
            if set(config.kwargs) != set(config_names):
                raise ValueError(f"every config of {kernel.name} must set the same constexprs: {configs[0]!r} "
                                 f"sets {sorted(config_names)}, {config!r} sets {sorted(config.kwargs)}")
        not_constexpr = [n for n in config_names if n not in kernel.constexpr_names]
        if not_constexpr:
            raise ValueError(f"configs set {not_constexpr}, which are not constexpr parameters of "
                             f"{kernel.name} (its constexprs: {list(kernel.constexpr_names)})")
        self.kernel = kernel
        self.configs = configs
        # The arguments a launch passes: every parameter but those the config supplies.
        self._call_names = tuple(n for n in kernel.arg_names if n not in config_names)
        # Leading parameters go to the kernel positionally (its launch fast path) up to the first one that a
        # config sets; the rest by name, so that parameters after a tuned constexpr still bind right.
        self._positional = tuple(itertools.takewhile(lambda n: n not in config_names, kernel.arg_names))
        self._all_positional = self._positional == self._call_names
        for what, names in (("key", key), ("restore", restore), ("reset", reset)):
            for name in _names(what, names):
                if name not in self._call_names:
                    raise ValueError(f"{what} names {name!r}, which is not an argument that launches of "
                                     f"{kernel.name} pass (they pass {list(self._call_names)})")
        self.key = tuple(key)
        self._key_index = tuple(self._call_names.index(n) for n in self.key)
        self.restore = tuple(restore)
        self.reset = tuple(reset)
        # What the autotuner itself reads from a launch's arguments; the kernel checks the rest.
        self._required = tuple(dict.fromkeys(self.key + self.restore + self.reset))
        self.prune_configs = prune_configs
        self.rules = tuple(rules)
        self.timer = timer
        self.jobs = jobs
        # The launch path's memo: tuning key in its cheap in-process form (tensor shapes and dtypes as torch
        # gives them) -> (config, the keyword arguments it adds to a launch).
        self._chosen: dict[tuple, tuple[Config, dict[str, Any]]] = {}
        self._reports: dict[Key, TuningReport] = {}
        self._last_key: Key | None = None
        self._entry: Any = None  # what `tuned[grid]` indexes: the C launcher's Tuned, or the Python path

    @property
    def name(self) -> str:
        return self.kernel.name

    def __repr__(self) -> str:
        return f"<mgjit.autotune {self.kernel.name}: {len(self.configs)} configs, key={list(self.key)}>"

    # -- arguments ---------------------------------------------------------------------------------------

    def _bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        if len(args) > len(self._call_names):
            raise TypeError(f"{self.kernel.name} takes {len(self._call_names)} arguments besides its tuned "
                            f"constexprs ({list(self._call_names)}); got {len(args)} positional")
        named = dict(zip(self._call_names, args, strict=False))  # the rest may come by name
        for name, value in kwargs.items():
            if name not in self._call_names:
                raise TypeError(f"{self.kernel.name} got an unexpected argument {name!r} (the autotuner sets "
                                f"the config's values; launches pass {list(self._call_names)})")
            if name in named:
                raise TypeError(f"{self.kernel.name} got argument {name!r} twice")
            named[name] = value
        missing = [n for n in self._required if n not in named]
        if missing:
            raise TypeError(f"{self.kernel.name} is missing arguments {missing}")
        return named

    def _split(self, named: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The caller's arguments as the kernel takes them: positional ones, then the rest by name."""
        positional = []
        for name in self._positional:
            if name not in named:  # left to the kernel's default: later ones must go by name
                break
            positional.append(named[name])
        passed = self._positional[:len(positional)]
        return positional, {n: v for n, v in named.items() if n not in passed}

    def tuning_key(self, named: Mapping[str, Any]) -> Key:
        """The `key` arguments' values (a tensor's shape), then every tensor argument's dtype (a config
        tuned for float16 is not assumed best for float8), in parameter order; JSON-able."""
        parts = [(n, tuple(int(d) for d in named[n].shape) if hasattr(named[n], "shape") else named[n])
                 for n in self.key]
        parts += [(f"{n}.dtype", str(named[n].dtype)) for n in self._call_names if hasattr(named.get(n), "dtype")]
        return tuple(parts)

    def _memo_key(self, values: Sequence[Any]) -> tuple:
        """What `tuning_key` tells apart, without names or conversions, from the arguments in `_call_names`
        order: the launch path builds it on every call."""
        return (*[getattr(values[i], "shape", values[i]) for i in self._key_index],
                *[getattr(v, "dtype", None) for v in values])

    @staticmethod
    def _grid(grid: Any, named: Mapping[str, Any], options: Mapping[str, Any]) -> Any:
        """A grid, or a grid callable's answer for these arguments plus the config's values."""
        return grid({**named, **options}) if callable(grid) else grid

    # -- launching ---------------------------------------------------------------------------------------

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return (self._entry or self._make_entry())[grid]

    def _make_entry(self) -> Any:
        """After the first launch of a tuning key, the C launcher finds its config and launches in one call (its
        memo is keyed at least as finely as `_memo_key`); everything else comes here, to `_launch`."""
        from ..jit import Kernel, _PythonEntry
        native = None
        if isinstance(self.kernel, Kernel):
            self.kernel._entry or self.kernel._make_entry()
            native = self.kernel._native
        if native is None:
            self._entry = _PythonEntry(self._launch)
        else:
            self._entry = self.kernel._c_module.Tuned(native, self._call_names, self.key,
                                                       tuple(self.configs[0].kwargs), self._c_miss)
        return self._entry

    def _c_miss(self, grid: Any, *args: Any, **kwargs: Any) -> tuple:
        """Launch through the Python path and return its choice as the C launcher remembers it: the config's
        values (in the order of the first config's names), num_warpgroups, cluster, and the launch options a
        callable grid sees."""
        config = self._launch_choosing(grid, *args, **kwargs)
        return (tuple(config.kwargs[n] for n in self.configs[0].kwargs), config.num_warpgroups, config.cluster,
                config.launch_kwargs())

    def _launch(self, grid: Any, *args: Any, **kwargs: Any) -> None:
        self._launch_choosing(grid, *args, **kwargs)

    def _launch_choosing(self, grid: Any, *args: Any, **kwargs: Any) -> Config:
        """Launch with the chosen config for these arguments (sweeping for a new tuning key), and return it."""
        plain = not kwargs and len(args) == len(self._call_names)
        named = dict(zip(self._call_names, args, strict=True)) if plain else self._bind(args, kwargs)
        memo = self._memo_key(args if plain else [named.get(n) for n in self._call_names])
        chosen = self._chosen.get(memo)
        if chosen is None:
            _refuse_during_capture(self.kernel.name, named)
            config = self._tune(named, self.tuning_key(named), grid)
            chosen = self._chosen[memo] = (config, config.launch_kwargs())
        options = chosen[1]
        launcher = self.kernel[self._grid(grid, named, options)]
        if plain and self._all_positional:
            launcher(*args, **options)
        else:
            positional, keywords = self._split(named)
            launcher(*positional, **keywords, **options)
        return chosen[0]

    def best_config(self, named_args: Mapping[str, Any]) -> Config:
        """The chosen config for these arguments (name -> value, as a launch would bind them), from this
        process's sweeps or the on-disk store. Raises LookupError when neither has every config's result."""
        chosen = self._chosen.get(self._memo_key([named_args.get(n) for n in self._call_names]))
        if chosen is not None:
            return chosen[0]
        key = self.tuning_key(named_args)
        device = device_name(self.timer or _shared_default_timer())
        dropped = apply_user_pruning(self.configs, named_args, self.prune_configs, self.rules)
        known = self._store().load(self.kernel.name, self.kernel.source_key(), device, key)
        untuned = [c for c in self.configs if c not in dropped and c.key() not in known]
        if untuned:
            raise LookupError(f"{self.kernel.name} is not tuned for key {dict(key)}: {len(untuned)} configs "
                              f"have no stored result (e.g. {untuned[0]!r}); launch it once to tune")
        return self._choose(key, known, dropped, set(known), device)

    def compile(self, *args: Any, target: str | None = None, **kwargs: Any) -> Any:
        """Compile one config for these arguments: the one whose values `kwargs` set, else the chosen one
        (see `best_config`). Returns the kernel's CompiledKernel."""
        config_names = set(self.configs[0].kwargs)
        given = {n: kwargs.pop(n) for n in list(kwargs) if n in config_names or n in LAUNCH_OPTIONS}
        if given and not config_names <= set(given):
            raise TypeError(f"{self.kernel.name}.compile: to compile a config of your own, give all of "
                            f"{sorted(config_names)}; got {sorted(given)}")
        named = self._bind(args, kwargs)
        config = Config(**given) if given else self.best_config(named)
        positional, keywords = self._split(named)
        return self.kernel.compile(*positional, target=target, **keywords, **config.launch_kwargs())

    def compile_all(self, *args: Any, target: str | None = None, jobs: int | None = None,
                    **kwargs: Any) -> list[CompileOutcome]:
        """Compile every config for these arguments, in parallel, without timing: the pruning half of a
        sweep (and a way to fill the kernel cache ahead of time). One outcome per config, in order."""
        named = self._bind(args, kwargs)
        dropped = apply_user_pruning(self.configs, named, self.prune_configs, self.rules)
        todo = [c for c in self.configs if c not in dropped]
        positional, keywords = self._split(named)
        with progress.bar(len(todo), f"{self.kernel.name}: compiling") as tick:
            compiled = compile_configs(self.kernel, positional, keywords, todo, target=target,
                                       jobs=self.jobs if jobs is None else jobs, on_done=tick)
        by_config = {outcome.config: outcome for outcome in compiled}
        return [by_config.get(c) or CompileOutcome(c, pruned=dropped[c]) for c in self.configs]

    # -- the sweep ---------------------------------------------------------------------------------------

    @staticmethod
    def _store() -> ResultStore:
        # Resolved per use, so that a changed MGJIT_CACHE_DIR (a test, a notebook) takes effect.
        return ResultStore(default_root())

    def _tune(self, named: dict[str, Any], key: Key, grid: Any) -> Config:
        timer = self.timer or _shared_default_timer()
        device = device_name(timer)
        source_key = self.kernel.source_key()
        store = self._store()
        rank, size = distributed.world()
        local = store.load(self.kernel.name, source_key, device, key)
        # Every rank must see the same known results, or their to-do lists (and so their splits) differ.
        known = distributed.share(local, size)
        dropped = apply_user_pruning(self.configs, named, self.prune_configs, self.rules)
        todo = [c for c in self.configs if c not in dropped and c.key() not in known]
        phases: dict[str, float] = {}
        caught: dict[str, tuple] = {}
        new = distributed.share(self._sweep(distributed.my_share(todo, rank, size), named, grid, timer, phases,
                                            caught), size)
        results = {**known, **new}
        if results != local:  # also keep what other ranks knew, so this rank's next process needs no one
            store.save(self.kernel.name, source_key, device, key, results)
        best = self._choose(key, results, dropped, set(known), device, phases)
        # The pick's compile warnings, not every candidate's: a bank conflict in a config that lost is no concern
        # of the caller's (the row examples' sweeps printed a dozen such warnings a shape). A pick compiled by
        # another process warns when this one loads it from the disk cache.
        pass_on(caught.get(best.key(), ()))
        return best

    def _sweep(self, configs: Sequence[Config], named: dict[str, Any], grid: Any,
               timer: Timer, phases: dict[str, float], caught: dict[str, tuple]) -> dict[str, Result]:
        """Compile, prune and time `configs`; results by config key. The wall time of each phase goes into
        `phases` ("compile", "timing"), in seconds; the survivors' compile warnings into `caught`, by config key."""
        if not configs:
            return {}
        positional, keywords = self._split(named)
        start = time.perf_counter()
        with progress.bar(len(configs), f"{self.kernel.name}: compiling") as tick:
            outcomes = compile_configs(self.kernel, positional, keywords, configs, jobs=self.jobs, on_done=tick,
                                       warn=False)
        phases["compile"] = time.perf_counter() - start
        caught.update((o.config.key(), o.warnings) for o in outcomes if o.warnings)
        results = {o.config.key(): Result(pruned=o.pruned) for o in outcomes if o.pruned is not None}
        survivors = [o.config for o in outcomes if o.pruned is None]

        saved = {n: named[n].clone() for n in self.restore}
        reset = [named[n] for n in self.reset]

        def setup() -> None:
            for n, value in saved.items():
                named[n].copy_(value)
            for tensor in reset:
                tensor.zero_()

        start = time.perf_counter()
        try:
            with progress.bar(len(survivors), f"{self.kernel.name}: timing") as tick:
                for config in survivors:
                    options = config.launch_kwargs()
                    launcher = self.kernel[self._grid(grid, named, options)]
                    ms = timer(Run(config, setup, functools.partial(launcher, *positional, **keywords, **options)))
                    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) \
                            or ms < 0:
                        raise ValueError(f"an autotune timer must return a finite time in ms >= 0; "
                                         f"{timer!r} returned {ms!r} for {config!r}")
                    results[config.key()] = Result(ms=float(ms))
                    tick()
            self._confirm(survivors, results, timer, setup, grid, named, positional, keywords)
        finally:
            # The launch that follows the sweep must see the arguments as the caller passed them.
            setup()
            phases["timing"] = time.perf_counter() - start
        return results

    # Finalists within this fraction of the fastest are re-timed, interleaved, before one is chosen: a single
    # sequential pass mis-ranks configs a few percent apart (seen on an H100: a 3.6% slower pick).
    CONFIRM_WITHIN = 0.05
    CONFIRM_MAX = 4
    CONFIRM_ROUNDS = 3

    def _confirm(self, survivors: Sequence[Config], results: dict[str, Result], timer: Timer, setup, grid: Any,
                 named: Mapping[str, Any], positional: Sequence[Any], keywords: Mapping[str, Any]) -> None:
        timed = sorted((results[c.key()].ms, i, c) for i, c in enumerate(survivors))
        if len(timed) < 2:
            return
        fastest = timed[0][0]
        finalists = [c for ms, _, c in timed[:self.CONFIRM_MAX] if ms <= fastest * (1 + self.CONFIRM_WITHIN)]
        if len(finalists) < 2:
            return
        samples = {c.key(): [results[c.key()].ms] for c in finalists}
        for _ in range(self.CONFIRM_ROUNDS):
            for config in finalists:
                options = config.launch_kwargs()
                launcher = self.kernel[self._grid(grid, named, options)]
                samples[config.key()].append(float(timer(Run(config, setup, functools.partial(
                    launcher, *positional, **keywords, **options)))))
        for k, values in samples.items():
            results[k] = Result(ms=statistics.median(values))

    def _choose(self, key: Key, results: Mapping[str, Result], dropped: Mapping[Config, str],
                stored: set[str], device: str, phases: Mapping[str, float] | None = None) -> Config:
        """The fastest timed config (earliest in the list on a tie, so that every rank agrees), recorded
        with its report (and the sweep's phase times, where this process swept)."""
        rows = []
        for index, config in enumerate(self.configs):
            if config in dropped:
                rows.append(Row(index, config, None, dropped[config], False, False))
            else:
                result = results[config.key()]
                rows.append(Row(index, config, result.ms, result.pruned, False, config.key() in stored))
        timed = [row for row in rows if row.ms is not None]
        if not timed:
            reasons = "; ".join(f"{row.config!r}: {row.pruned}" for row in rows[:8])
            raise RuntimeError(f"every config of {self.kernel.name} was pruned for key {dict(key)}: "
                               f"{reasons}{' ...' if len(rows) > 8 else ''}")
        best = min(timed, key=lambda row: (row.ms, row.index))
        rows[best.index] = dataclasses.replace(best, winner=True)
        phases = phases or {}
        self._reports[key] = TuningReport(self.kernel.name, dict(key), device, tuple(rows),
                                          compile_seconds=phases.get("compile", 0.0),
                                          timing_seconds=phases.get("timing", 0.0))
        self._last_key = key
        return best.config

    def tuning_report(self, named_args: Mapping[str, Any] | None = None,
                      plot: str | None = None) -> TuningReport:
        """Every config of the sweep for `named_args`' key (default: the last key tuned) with its time or
        prune reason, winner marked. `str()` of it is a table; `.rows` the data; `plot=path` also draws a
        bar chart (needs matplotlib)."""
        key = self._last_key if named_args is None else self.tuning_key(named_args)
        if key is None or key not in self._reports:
            raise LookupError(f"{self.kernel.name} has no tuning report "
                              f"{'yet' if key is None else f'for key {dict(key)}'}: launch it to tune first")
        report = self._reports[key]
        if plot is not None:
            report.plot(plot)
        return report


def _refuse_during_capture(name: str, named: Mapping[str, Any]) -> None:
    """A sweep compiles, times and synchronizes: never while a CUDA graph is being captured."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise LaunchError(f"{name} has no tuned config for these arguments and cannot tune while a CUDA graph is "
                          "being captured (tuning compiles, times and synchronizes): launch it once with arguments "
                          "of this tuning key before capturing (a warm-up run)")


def autotune(configs: Sequence[Config] | None = None, *, space: Mapping[str, Sequence[Any]] | None = None,
             space_filter: Callable[[Config], bool] | None = None, key: Sequence[str] = (),
             restore: Sequence[str] = (), reset: Sequence[str] = (),
             prune_configs: PruneConfigs | None = None, rules: Sequence[Rule] = (),
             timer: Timer | None = None, jobs: int | None = None) -> Callable[[Any], Autotuned]:
    """Decorate an `@mgjit.kernel` with configs to choose among, per tuning key.

    configs / space: the candidates, a list of `Config` or a dict of name -> values whose cartesian product
        (kept where `space_filter(config)` is true) is the list.
    key: argument names whose values (a tensor's shape) select a tuning; tensor dtypes always do.
    restore: in-place arguments saved before the sweep and copied back before each timed run and after.
    reset: arguments the kernel expects zeroed (accumulators): zeroed before each timed run and after.
    prune_configs(configs, named_args) -> configs to keep; rules: [rule(config, named_args) -> reason or
        None], both evaluated before anything compiles.
    timer(run) -> ms: how a config is timed (default: CUDA events, L2 flushed, median).
    jobs: processes that compile candidates (default: the usable cores, `MGJIT_AUTOTUNE_JOBS`)."""
    if (configs is None) == (space is None):
        raise TypeError("mgjit.autotune takes either configs=[Config(...), ...] or space=dict(name=[...])")
    if space is not None:
        candidates = expand_space(space, space_filter)
    elif space_filter is not None:
        raise TypeError("space_filter filters a space=...; filter configs=[...] yourself")
    else:
        candidates = list(configs)

    def decorate(kernel: Any) -> Autotuned:
        return Autotuned(kernel, candidates, key=key, restore=restore, reset=reset,
                         prune_configs=prune_configs, rules=rules, timer=timer, jobs=jobs)

    return decorate

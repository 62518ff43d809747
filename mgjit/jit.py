"""`@mgjit.kernel`: binding a call's arguments, its specialization, and the launch path.

`kernel[grid](...)` runs the C launcher's dispatcher (fastlaunch.py, _launch.c): it binds the call, computes
a small dispatch key from the arguments, finds a ready launch plan and launches, all in one C call. Only a miss
comes back to Python (`_c_miss`): derive the typed specialization from the key (specialize.py), get the
compiled kernel from the cache or the compiler (compiler.get) and make its launch plan (launch.Plan). Anything
unusual takes the Python path, a dispatcher generated with the kernel's signature (launch.build_dispatcher),
which is the whole launch path where the C launcher is unavailable. The cache key covers the source of the
kernel and of everything it reads (deps.py), so redefining a helper in a notebook cell recompiles its callers;
each call checks, by identity, that those globals still hold the objects the key was built from.
"""
from __future__ import annotations

import functools
import inspect
import os
from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import deps, dtypes, specialize, targets
from ._version import VERSION
from .errors import CompileError, LaunchError
from .language import constexpr
from .source import SourceFunction
from .specialize import Specialization

if TYPE_CHECKING:
    from .interpret.launch import Interpreter

__all__ = ["Kernel", "VERSION"]


def _cluster(cluster) -> tuple[int, int, int]:
    """Normalise a cluster shape: None → (1, 1, 1); checked against the hardware's limit of CTAs."""
    if cluster is None:
        return (1, 1, 1)
    c = tuple(cluster) + (1,) * (3 - len(tuple(cluster)))
    limit = max(t.max_cluster_ctas for t in targets.TARGETS.values())
    if len(c) != 3 or not all(isinstance(x, int) and x >= 1 for x in c) or c[0] * c[1] * c[2] > limit:
        raise LaunchError(f"cluster must be 1 to 3 positive ints with at most {limit} CTAs in all, got {cluster!r}")
    return c


def _warpgroups(value: Any, default: int) -> int:
    """A num_warpgroups argument (None: the kernel's own) checked: 1 to 4 warpgroups of 128 threads."""
    n = default if value is None else value
    if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 4):
        raise LaunchError(f"num_warpgroups must be an int in 1..4 (128 to 512 threads per CTA), got {n!r}")
    return n


def _is_constexpr(annotation: Any) -> bool:
    return annotation is constexpr or (isinstance(annotation, str) and annotation.split(".")[-1] == "constexpr")


class Kernel:
    __mgjit_kernel__ = True

    def __init__(self, fn: Callable, num_warpgroups: int = 1):
        self.fn = fn
        self.name = fn.__name__
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        functools.update_wrapper(self, fn)
        sig = inspect.signature(fn)
        self.arg_names = list(sig.parameters)
        self.constexpr_names = [n for n, p in sig.parameters.items() if _is_constexpr(p.annotation)]
        self.runtime_names = [n for n in self.arg_names if n not in self.constexpr_names]
        # A dtype annotation (`x: mgjit.float16`) fixes that argument's dtype: other dtypes are an error.
        self.fixed_dtypes = {n: p.annotation for n, p in sig.parameters.items() if isinstance(p.annotation, dtypes.DType)}
        self.defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
        for n, p in sig.parameters.items():
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                raise CompileError(f"kernel {self.name}: parameter `{n}` must be a plain named parameter "
                                   "(no *args/**kwargs)")
        self.num_warpgroups = _warpgroups(num_warpgroups, 1)
        self.source = SourceFunction(fn)  # read once: an edited file changes nothing until it is re-imported
        self._plans: dict[tuple, Any] = {}
        # Keyed by the specialization and its constexprs as launch.strict_constexpr gives them: 1, 1.0 and True,
        # or -0.0 and 0.0, equal under ==, get kernels of their own.
        self._compiled: dict[tuple[Specialization, tuple], Any] = {}
        self._source_key: str | None = None
        self._deps: deps.Dependencies | None = None
        self._dispatch: Callable[..., None] | None = None  # the Python path
        self._native = None  # the C launcher's Dispatcher
        self._entry: Any = None  # what `kernel[grid]` indexes: the native dispatcher or a _PythonEntry
        self._missing = object()
        self._key_fn = None
        self._c_module = None

    # -- keys
    def _deps_changed(self) -> bool:
        return self._deps is not None and self._deps.changed()

    def _refresh_if_redefined(self) -> None:
        if self._deps_changed():
            self._plans.clear()
            self._compiled.clear()
            self._source_key = None
            self._deps = None
            if self._native is not None:
                self._native.clear()
                self._native.set_guard((), None)

    def _guard(self) -> tuple[tuple, Callable[[], bool] | None]:
        """What the C dispatcher checks on every launch to learn whether what the kernel reads changed: the reads
        it checks itself (`deps.Dependencies.watched`), and what it calls for the rest (None: nothing)."""
        if self._deps is None:
            return (), None
        return self._deps.watched, self._deps.checks_changed if self._deps.checks else None

    def source_key(self) -> str:
        """A hash of the kernel's source and everything it reads, plus the versions that shape its code."""
        self._refresh_if_redefined()
        if self._source_key is None:
            from . import toolchain
            from .cache.store import hash_parts
            self._deps = deps.of_kernel(self.source)
            self._source_key = hash_parts("mgjit", VERSION, toolchain.compiler_fingerprint(), self._deps.parts)
            if self._native is not None:
                self._native.set_guard(*self._guard())
        return self._source_key

    # -- specialization
    def _bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Split a call into runtime values (in parameter order) and constexpr values."""
        if len(args) > len(self.arg_names):
            raise LaunchError(f"{self.name} takes {len(self.arg_names)} arguments ({', '.join(self.arg_names)}), "
                              f"got {len(args)} positional")
        bound = dict(zip(self.arg_names, args))
        for k, v in kwargs.items():
            if k not in self.arg_names:
                raise LaunchError(f"{self.name} has no parameter `{k}` (parameters: {', '.join(self.arg_names)})")
            if k in bound:
                raise LaunchError(f"{self.name} got two values for `{k}`")
            bound[k] = v
        for n in self.arg_names:
            if n not in bound:
                if n in self.defaults:
                    bound[n] = self.defaults[n]
                else:
                    kind = "constexpr " if n in self.constexpr_names else ""
                    raise LaunchError(f"{self.name} is missing the {kind}argument `{n}`")
        runtime = [bound[n] for n in self.runtime_names]
        consts = {n: bound[n] for n in self.constexpr_names}
        return runtime, consts

    def _specialization(self, args: tuple, consts: dict, target: str, num_warpgroups: int,
                        cluster: tuple[int, int, int], profile: bool = False) -> Specialization:
        try:
            constexprs = tuple(sorted(consts.items()))
            hash(constexprs)
        except TypeError:
            raise LaunchError(f"constexpr arguments of {self.name} must be hashable: {consts}") from None
        return Specialization(tuple(self.runtime_names), args, constexprs, target, num_warpgroups, cluster, profile)

    # -- compile
    def compile(self, *args, target: str | None = None, num_warpgroups: int | None = None,
                cluster: tuple[int, int, int] | None = None, profile: bool = False, **kwargs):
        """Compile for the given arguments (tensors may live on any device: only their dtype, rank, strides and
        alignment matter) and return the CompiledKernel; a machine without a GPU can compile for any target.
        profile=True compiles the variant that records mgjit.trace spans (what a profiled launch runs)."""
        runtime, consts = self._bind(args, kwargs)
        arg_specs = specialize.of_arguments(self.name, self.runtime_names, runtime, self.fixed_dtypes)
        spec = self._specialization(arg_specs, consts, target or targets.DEFAULT.name,
                                    _warpgroups(num_warpgroups, self.num_warpgroups), _cluster(cluster), profile)
        return self._get_compiled(spec)

    def _get_compiled(self, spec: Specialization):
        from .launch import strict_constexpr
        self._refresh_if_redefined()
        memo = (spec, tuple(strict_constexpr(v) for _, v in spec.constexprs))
        compiled = self._compiled.get(memo)
        if compiled is None:
            from . import compiler  # the compiler loads on the first miss (see compiler.py)
            key = self.source_key()
            compiled = compiler.get(self.source, key, self._deps.persistent, spec)
            self._compiled[memo] = compiled
        return compiled

    def inspect(self, *args, target: str | None = None, num_warpgroups: int | None = None,
                cluster: tuple[int, int, int] | None = None, **kwargs) -> str:
        """The IR with inferred layouts, the ptxas report, and where to find the MLIR and PTX."""
        c = self.compile(*args, target=target, num_warpgroups=num_warpgroups, cluster=cluster, **kwargs)
        return (f"{c!r}\n--- IR (layouts inferred) ---\n{c.ir}\n--- ptxas ---\n{c.ptxas_report.strip()}\n"
                f"(.mlir and .ptx: CompiledKernel.mlir / .ptx)")

    # -- launch
    def __getitem__(self, grid) -> Callable[..., None]:
        return (self._entry or self._make_entry())[grid]

    @property
    def interpret(self) -> "Interpreter":
        """Run on the CPU instead: `kernel.interpret[grid](...)` (see mgjit/interpret)."""
        from .interpret import interpreter
        return interpreter(self)

    def _make_entry(self) -> Any:
        from . import fastlaunch
        self._build_dispatcher()
        c_module = fastlaunch.load()
        if c_module is None:
            self._entry = _PythonEntry(self._slow_entry)
            return self._entry
        self._key_fn = specialize.argument_key()
        self._c_module = c_module
        self._native = c_module.Dispatcher(
            tuple(self.arg_names), tuple(n in self.constexpr_names for n in self.arg_names),
            tuple(self.defaults.get(n, self._missing) for n in self.arg_names), self._missing, self._c_miss,
            self._slow_entry)
        self._native.set_guard(*self._guard())
        self._entry = self._native
        return self._entry

    def _slow_entry(self, grid, *args, **kwargs) -> None:
        """The Python path of a call: the interpreter under MGJIT_INTERPRET=1, else the generated dispatcher."""
        if os.environ.get("MGJIT_INTERPRET") == "1":
            return self.interpret[grid](*args, **kwargs)
        if "profile" in kwargs and "profile" not in self.arg_names:  # the launch option profile=: hidden.py
            from . import hidden
            return hidden.launch_profiled(self, grid, args, kwargs)
        self._dispatch(grid, *args, **kwargs)

    def _build_dispatcher(self) -> Callable[..., None]:
        from . import launch
        self._dispatch = launch.build_dispatcher(
            self.name, self.arg_names, self.runtime_names, self.constexpr_names, self.defaults,
            {"_plans": self._plans, "_miss": self._miss, "_key": specialize.argument_key(), "_M": self._missing,
             "_slow": self._slow_call, "_deps_changed": self._deps_changed})
        return self._dispatch

    def _slow_call(self, grid, given: tuple, extra: tuple, unknown: dict, num_warpgroups, cluster) -> None:
        """A call that is not on the fast path: report argument errors clearly, or refresh after a helper or
        global the kernel reads was redefined, then dispatch again (by name, defaults included)."""
        named = {n: v for n, v in zip(self.arg_names, given) if v is not self._missing}
        if extra:
            self._bind(list(named.values()) + list(extra), {})  # raises: too many positional arguments
        if unknown or len(named) < len(self.arg_names):
            self._bind([], {**named, **unknown})  # raises: an unknown or a missing argument
        self._refresh_if_redefined()
        self._dispatch(grid, num_warpgroups=num_warpgroups, cluster=cluster, **named)

    def _c_miss(self, key: bytes, runtime: tuple, consts: dict, num_warpgroups, cluster):
        """The C dispatcher found no plan for `key`: check that the key says what specialize.argument_key() says
        of these arguments (the C and Python keys must agree, or a plan could serve a call it was not compiled
        for), then find or make the plan under the Python key and return its C half."""
        from . import fastlaunch, launch
        import torch
        parts = tuple((getattr(torch, fastlaunch.KEY_DTYPES[p[0]].torch_name), *p[1:]) if isinstance(p, tuple)
                      and len(p) == 6 else p for p in self._c_module.decode(key))
        expected = tuple(self._key_fn(v, []) for v in runtime)
        if parts != expected:
            raise LaunchError(f"{self.name}: internal error: the C launcher's dispatch key {parts} differs from "
                              f"{expected}; set MGJIT_NO_C_LAUNCHER=1 to launch through Python")
        py_key = (parts, launch.constexpr_key(self.constexpr_names, consts), num_warpgroups, cluster)
        plan = self._plans.get(py_key) or self._miss(py_key, runtime, consts, num_warpgroups, cluster)
        return plan.native

    def _miss(self, key: tuple, runtime: tuple, consts: dict, num_warpgroups: int | None, cluster):
        try:
            hash(key)
        except TypeError:
            raise LaunchError(f"constexpr arguments of {self.name} must be hashable: {consts}") from None
        arg_specs = tuple(specialize.from_key(self.name, n, part, self.fixed_dtypes.get(n))
                          for n, part in zip(self.runtime_names, key[0]))
        _refuse_during_capture(self.name, self.runtime_names, arg_specs, consts)
        plan = self._make_plan(arg_specs, consts, _warpgroups(num_warpgroups, self.num_warpgroups), _cluster(cluster),
                               runtime)
        self._plans[key] = plan
        return plan

    def _make_plan(self, arg_specs: tuple, consts: dict, num_warpgroups: int, cluster: tuple[int, int, int],
                   runtime: tuple, profile: bool = False):
        import torch
        from . import launch
        device = launch.launch_device(self.name, self.runtime_names, runtime)
        major, minor = torch.cuda.get_device_capability(device)
        target = targets.for_capability((major, minor))
        if target is None:
            raise LaunchError(f"mgjit targets {', '.join(f'{t.architecture} ({t.name})' for t in targets.TARGETS.values())}; "
                              f"this GPU is sm_{major}{minor}")
        spec = self._specialization(arg_specs, consts, target.name, num_warpgroups, cluster, profile)
        try:
            compiled = self._get_compiled(spec)
        except CompileError as e:
            if e.rule != "target-arch":
                raise
            raise LaunchError(launch.wrong_gpu(self.name, e.required_target or "another target", device)
                              + f"\n{e}") from None
        if compiled.target != target.name:  # never launch code built for another architecture
            raise LaunchError(launch.wrong_gpu(self.name, compiled.target, device))
        if compiled.meta.get("hidden_buffers"):  # mgjit.print or profiling: the Python path (hidden.py)
            from . import hidden
            return hidden.HiddenPlan(self.name, compiled, device)
        return launch.Plan(self.name, compiled, device, self._c_module)

    def __call__(self, *args, **kwargs):
        raise LaunchError(f"launch {self.name} with a grid: {self.name}[grid](...)")

    def __repr__(self) -> str:
        return f"<mgjit.kernel {self.name}>"


class _PythonEntry:
    """`kernel[grid]` where the C launcher is unavailable: the Python path, bound to the grid."""

    def __init__(self, slow_entry: Callable[..., None]):
        self.slow_entry = slow_entry

    def __getitem__(self, grid) -> Callable[..., None]:
        return functools.partial(self.slow_entry, grid)


def _refuse_during_capture(name: str, names: Sequence[str], arg_specs: tuple, consts: dict) -> None:
    """A miss compiles, loads a module and may synchronize: never while a CUDA graph is being captured."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        described = ", ".join([f"{n}: {a.describe()}" for n, a in zip(names, arg_specs)]
                              + [f"{k}={v!r}" for k, v in consts.items()])
        raise LaunchError(f"{name} has no launch plan for ({described}) and one cannot be made while a CUDA graph "
                          "is being captured (it would compile, load a module or synchronize): launch it once "
                          "with these argument types and constexprs before capturing (a warm-up run)")

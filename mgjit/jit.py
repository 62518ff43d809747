"""`@mgjit.kernel`: specialization, cache keys, compilation on a miss, and the launch fast path.

A call computes a small specialization tuple from its arguments (dtypes, ranks, 16-byte alignment, unit
last stride, divisibility of the last size and of int arguments, constexpr values) and looks it up in a
dict of ready launchers. Only a miss does more: build the cache key, ask the disk store, and compile if
needed. The key covers the source of the kernel and of everything it reads (device functions, globals,
closure variables), so redefining a helper in a notebook cell recompiles its callers; each call checks,
by identity, that those globals still hold the objects the key was built from.
"""
from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Callable, Sequence

from . import dtypes, ir
from .errors import CompileError, LaunchError
from .source import DeviceFunction, SourceFunction, closure_vars
from .language import Builtin, constexpr

VERSION = "0.1.0"
DEFAULT_TARGET = "sm_90a"
MAX_GRID = (2**31 - 1, 65535, 65535)

_LAUNCH_OPTIONS = ("num_warpgroups", "target")


def _cluster(cluster) -> tuple[int, int, int]:
    """Normalise a cluster shape: None → (1, 1, 1); checked against the hardware's limit of 16 CTAs."""
    if cluster is None:
        return (1, 1, 1)
    c = tuple(cluster) + (1,) * (3 - len(tuple(cluster)))
    if len(c) != 3 or not all(isinstance(x, int) and x >= 1 for x in c) or c[0] * c[1] * c[2] > 16:
        raise LaunchError(f"cluster must be 1 to 3 positive ints with at most 16 CTAs in all, got {cluster!r}")
    return c


def _is_constexpr(annotation: Any) -> bool:
    return annotation is constexpr or (isinstance(annotation, str) and annotation.split(".")[-1] == "constexpr")


# ---------------------------------------------------------------------------------------------- dependencies

_PLAIN = (int, float, bool, str, bytes, type(None), dtypes.DType)


def _describe_global(obj: Any, seen: set) -> Any:
    """What of a global the cache key must see: source for device functions, value for plain data."""
    if isinstance(obj, DeviceFunction):
        return ("device", obj.fn.__qualname__, _source_parts(obj.fn, seen))
    if isinstance(obj, _PLAIN):
        return ("value", repr(obj))
    if isinstance(obj, (tuple, list)) and all(isinstance(x, _PLAIN) for x in obj):
        return ("value", repr(obj))
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    if isinstance(obj, Builtin) or callable(obj):
        return ("callable", getattr(obj, "__module__", ""), getattr(obj, "__qualname__", repr(obj)))
    return ("object", type(obj).__qualname__)


def _referenced(fn: Callable) -> dict[str, Any]:
    """Globals and closure variables a function's code names (including nested code objects)."""
    names: set[str] = set()
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    out = {n: fn.__globals__[n] for n in sorted(names) if n in fn.__globals__}
    out.update(closure_vars(fn))
    return out


def _source_parts(fn: Callable, seen: set) -> tuple:
    if id(fn) in seen:
        return ("recursive", fn.__qualname__)
    seen = seen | {id(fn)}
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = fn.__code__.co_code.hex()
    deps = tuple((name, _describe_global(obj, seen)) for name, obj in _referenced(fn).items())
    return (src, deps)


def _dependency_snapshot(fn: Callable) -> list[tuple[dict, str, Any]]:
    """(namespace, name, object) for every global the kernel and its helpers read, to detect redefinition."""
    out, stack, seen = [], [fn], set()
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        for name in _referenced(f):
            if name in f.__globals__:
                obj = f.__globals__[name]
                out.append((f.__globals__, name, obj))
                if isinstance(obj, DeviceFunction):
                    stack.append(obj.fn)
    return out


# ---------------------------------------------------------------------------------------------- compiled

class CompiledKernel:
    """One specialization, compiled: its cubin and what was learned on the way (for inspection and tuning)."""

    def __init__(self, name: str, key: str, target: str, meta: dict, files: dict[str, bytes]):
        self.name = name
        self.key = key
        self.target = target
        self.meta = meta
        self._files = files
        self.registers: int = meta["registers"]
        self.spills: int = meta["spills"]
        self.smem_bytes: int = meta["smem_bytes"]
        self.threads: int = meta["threads"]
        self.params: list[dict] = meta["params"]
        self.from_cache: bool = False
        self._launcher = None

    def _file(self, name: str) -> str:
        return self._files[name].decode()

    @property
    def cubin(self) -> bytes:
        return self._files["kernel.cubin"]

    @property
    def ptx(self) -> str:
        return self._file("kernel.ptx")

    @property
    def ir(self) -> str:
        return self._file("kernel.ir")

    @property
    def mlir(self) -> str:
        return self._file("kernel.mlir")

    @property
    def ptxas_report(self) -> str:
        return self._file("ptxas.txt")

    def launcher(self):
        if self._launcher is None:
            from .runtime import Launcher
            self._launcher = Launcher(self.cubin, self.name, self.params, self.smem_bytes, self.threads,
                                      len(self.meta.get("tma", [])), tuple(self.meta.get("cluster", (1, 1, 1))))
        return self._launcher

    def __repr__(self) -> str:
        return (f"CompiledKernel({self.name}, {self.target}, registers={self.registers}, spills={self.spills}, "
                f"smem={self.smem_bytes}B, threads={self.threads})")


# ---------------------------------------------------------------------------------------------- kernel

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
        self.num_warpgroups = num_warpgroups
        self._plans: dict[tuple, Any] = {}
        self._compiled: dict[tuple, CompiledKernel] = {}
        self._source_key: str | None = None
        self._deps: list[tuple[dict, str, Any]] | None = None
        self._dispatch: Callable[..., None] | None = None

    # -- keys
    def _deps_changed(self) -> bool:
        if self._deps is None:
            return False
        for ns, name, obj in self._deps:
            if ns.get(name) is not obj:
                return True
        return False

    def _refresh_if_redefined(self) -> None:
        if self._deps_changed():
            self._plans.clear()
            self._compiled.clear()
            self._source_key = None
            self._deps = None

    def source_key(self) -> str:
        """A hash of the kernel's source and everything it reads, plus the versions that shape its code."""
        self._refresh_if_redefined()
        if self._source_key is None:
            from .cache.store import hash_parts
            from . import toolchain
            self._deps = _dependency_snapshot(self.fn)
            self._source_key = hash_parts("mgjit", VERSION, toolchain.compiler_fingerprint(),
                                          _source_parts(self.fn, set()))
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

    def _arg_spec(self, name: str, v: Any) -> tuple:
        """The specialization of one runtime argument, from the same key the launch dispatcher uses, so a
        launch plan is always compiled from exactly what its key records."""
        if type(v) is int and not -2**63 <= v < 2**63:
            raise LaunchError(f"argument `{name}` = {v} does not fit in 64 bits")
        return self._spec_from_key(name, _arg_specializer()(v, []))

    def _spec_from_key(self, name: str, part: Any) -> tuple:
        """Translate one argument's dispatch-key part into the specialization the compiler receives."""
        if part == "bool":
            return ("scalar", "i1")
        if part == "float":
            return ("scalar", "f32")
        if part[0] == "int":
            _, fits_i32, multiple_of_16 = part
            return ("scalar", "i32" if fits_i32 else "i64", 16 if multiple_of_16 else 1)
        if part[0] == "other":
            raise LaunchError(f"argument `{name}` of {self.name} is a {part[1].__name__}; kernels take torch "
                              "tensors, ints, floats and bools (constexpr parameters take any hashable value)")
        torch_dtype, rank, align, unit, size_div, _device = part
        try:
            dtype = dtypes.from_torch(torch_dtype).name
        except TypeError as e:
            raise LaunchError(f"argument `{name}` of {self.name}: {e}") from None
        fixed = self.fixed_dtypes.get(name)
        if fixed is not None and dtype != fixed.name:
            raise LaunchError(f"argument `{name}` of {self.name} must be {fixed.name} (fixed by its annotation), "
                              f"got {dtype}")
        return ("tensor", (dtype, rank, align, unit, size_div))

    def _params_and_specs(self, spec: tuple) -> tuple[list[ir.Param], list[Any]]:
        params, specs = [], []
        from .specialize import TensorSpec
        for name, s in zip(self.runtime_names, spec):
            if s[0] == "tensor":
                dtype_name, rank, align, unit, size_div = s[1]
                params.append(ir.Param(name, "tensor", dtypes.BY_NAME[dtype_name], rank))
                specs.append(TensorSpec(align, unit, size_div))
            else:
                mlir_t = s[1]
                dtype = {"i1": dtypes.bool_, "i32": dtypes.int32, "i64": dtypes.int64, "f32": dtypes.float32}[mlir_t]
                params.append(ir.Param(name, "scalar", dtype))
                specs.append(s[2] if len(s) > 2 else None)
        return params, specs

    # -- compile
    def compile(self, *args, target: str | None = None, num_warpgroups: int | None = None,
                cluster: tuple[int, int, int] | None = None, **kwargs) -> CompiledKernel:
        """Compile for the given arguments (tensors may live on any device: only their dtype, rank, strides and
        alignment matter) and return the CompiledKernel; a machine without a GPU can compile for any target."""
        runtime, consts = self._bind(args, kwargs)
        spec = tuple(self._arg_spec(n, v) for n, v in zip(self.runtime_names, runtime))
        return self._get_compiled(spec, consts, target or DEFAULT_TARGET, num_warpgroups or self.num_warpgroups,
                                  _cluster(cluster))

    def _get_compiled(self, spec: tuple, consts: dict, target: str, num_warpgroups: int,
                      cluster: tuple[int, int, int] = (1, 1, 1)) -> CompiledKernel:
        self._refresh_if_redefined()
        try:
            const_key = tuple(sorted(consts.items()))
            hash(const_key)
        except TypeError:
            raise LaunchError(f"constexpr arguments of {self.name} must be hashable: {consts}") from None
        memo_key = (spec, const_key, target, num_warpgroups, cluster)
        compiled = self._compiled.get(memo_key)
        if compiled is not None:
            return compiled
        from .cache.store import default_store, hash_parts
        key = hash_parts(self.source_key(), repr(spec), repr(const_key), target, num_warpgroups, cluster)
        expect = {"mgjit_version": VERSION, "target": target, "name": self.name}
        store = default_store()
        entry = store.get(key, expect=expect)
        if entry is not None:
            files = {n: entry.read(n) for n in ("kernel.cubin", "kernel.ptx", "kernel.ir", "kernel.mlir", "ptxas.txt")}
            compiled = CompiledKernel(self.name, key, target, dict(entry.meta), files)
            compiled.from_cache = True
        else:
            compiled = self._compile_fresh(key, spec, consts, target, num_warpgroups, cluster)
            store.put(key, compiled._files, compiled.meta)
        self._compiled[memo_key] = compiled
        return compiled

    def _compile_fresh(self, key: str, spec: tuple, consts: dict, target: str, num_warpgroups: int,
                       cluster: tuple[int, int, int]) -> CompiledKernel:
        from . import compiler, frontend
        if num_warpgroups not in (1, 2, 3, 4):
            raise LaunchError(f"num_warpgroups must be 1..4, got {num_warpgroups}")
        params, specs = self._params_and_specs(spec)
        kernel_ir = frontend.trace(SourceFunction(self.fn), params, consts, num_warpgroups, cluster)
        spec_by_value = {v.id: s for v, s in zip(kernel_ir.args, specs) if s is not None}
        for desc in kernel_ir.tma_descriptors:
            s = specs[desc.param]
            if s.align < 16 or not s.unit_stride:
                raise CompileError(
                    f"argument `{params[desc.param].name}` is copied with TMA (copy_async), which needs a 16-byte "
                    f"aligned base, row strides that are multiples of 16 bytes and a contiguous last dimension; "
                    f"this call's tensor has {s.align}-byte alignment{'' if s.unit_stride else ' and a strided last dimension'}",
                    kernel_ir.loc, rule="tma-alignment")
        if kernel_ir.cta_group == 2 and (cluster[0] * cluster[1] * cluster[2]) % 2:
            raise CompileError(f"{self.name} runs 2-CTA (collective) tcgen05 MMAs on CTA pairs: compile and launch it "
                               f"with a cluster of an even number of CTAs, e.g. cluster=(2, 1, 1); got {cluster}",
                               kernel_ir.loc, rule="cta-group")
        art = compiler.compile_ir(kernel_ir, spec_by_value, target)
        abi = [{"kind": p.kind, "rank": p.rank, "mlir": p.dtype.mlir, "dtype": p.dtype.name, "name": p.name}
               for p in params]
        meta = {"name": self.name, "target": target, "mgjit_version": VERSION,
                "specialization": _describe_spec(self.runtime_names, spec, consts),
                "params": abi, "registers": art.registers, "spills": art.spills, "smem_bytes": art.smem_bytes,
                "threads": art.threads, "num_warpgroups": num_warpgroups, "cluster": list(cluster),
                "tma": [{"param": d.param, "box": list(d.box), "swizzle": d.swizzle}
                        for d in kernel_ir.tma_descriptors],
                "compile_seconds": round(art.compile_seconds, 4)}
        files = {"kernel.cubin": art.cubin, "kernel.ptx": art.ptx.encode(), "kernel.ir": art.ir_text.encode(),
                 "kernel.mlir": art.mlir_text.encode(), "ptxas.txt": art.ptxas_report.encode()}
        return CompiledKernel(self.name, key, target, meta, files)

    def inspect(self, *args, target: str | None = None, num_warpgroups: int | None = None,
                cluster: tuple[int, int, int] | None = None, **kwargs) -> str:
        """The IR with inferred layouts, the ptxas report, and where to find the MLIR and PTX."""
        c = self.compile(*args, target=target, num_warpgroups=num_warpgroups, cluster=cluster, **kwargs)
        return (f"{c!r}\n--- IR (layouts inferred) ---\n{c.ir}\n--- ptxas ---\n{c.ptxas_report.strip()}\n"
                f"(.mlir and .ptx: CompiledKernel.mlir / .ptx)")

    # -- launch
    def __getitem__(self, grid) -> Callable[..., None]:
        dispatch = self._dispatch or self._build_dispatcher()
        return functools.partial(dispatch, grid)

    def _build_dispatcher(self) -> Callable[..., None]:
        """Generate `<kernel name>(grid, <the kernel's parameters>, *, num_warpgroups=None)`.

        Python's own argument binding matches names; each runtime argument contributes a small
        specialization tuple (and its launch values, in the same pass); a dict lookup finds the launch
        plan. Anything unusual (a missing or unknown argument, a redefined helper, a new specialization)
        leaves the fast path for Python code that explains or compiles. The generated source contains only
        the signature's identifiers.
        """
        missing = object()
        namespace: dict[str, Any] = {"_plans": self._plans, "_miss": self._miss, "_spec": _arg_specializer(),
                                     "_M": missing, "_slow": self._slow_call, "_deps_changed": self._deps_changed}
        for n in self.arg_names:
            if n in self.defaults:
                namespace[f"_default_{n}"] = self.defaults[n]
        params = ", ".join(f"{n}=_default_{n}" if n in self.defaults else f"{n}=_M" for n in self.arg_names)
        specs = "".join(f"_spec({n}, _values), " for n in self.runtime_names)
        consts = "".join(f"{n}, " for n in self.constexpr_names)
        runtime = "".join(f"{n}, " for n in self.runtime_names)
        given = " or ".join(f"{n} is _M" for n in self.arg_names if n not in self.defaults) or "False"
        src = (f"def {self.name}(grid, {params}{', ' if params else ''}*_extra, num_warpgroups=None, cluster=None, "
               f"**_unknown):\n"
               f"    if _extra or _unknown or {given} or _deps_changed():\n"
               f"        return _slow(grid, ({', '.join(self.arg_names)}{',' if self.arg_names else ''}), _extra, "
               f"_unknown, num_warpgroups, cluster)\n"
               f"    _values = []\n"
               f"    key = (({specs}), ({consts}), num_warpgroups, cluster)\n"
               f"    try:\n"
               f"        plan = _plans[key]\n"
               f"    except (KeyError, TypeError):\n"
               f"        plan = _miss(key, ({runtime}), dict(({''.join(f'({n!r}, {n}), ' for n in self.constexpr_names)})), "
               f"num_warpgroups, cluster)\n"
               f"    plan(grid, _values)\n")
        exec(compile(src, f"<mgjit dispatcher for {self.name}>", "exec"), namespace)
        self._dispatch = namespace[self.name]
        self._missing = missing
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

    def _miss(self, key: tuple, runtime: tuple, consts: dict, num_warpgroups: int | None, cluster):
        try:
            hash(key)
        except TypeError:
            raise LaunchError(f"constexpr arguments of {self.name} must be hashable: {consts}") from None
        spec = tuple(self._spec_from_key(n, part) for n, part in zip(self.runtime_names, key[0]))
        plan = self._make_plan(spec, consts, num_warpgroups or self.num_warpgroups, _cluster(cluster), runtime)
        self._plans[key] = plan
        return plan

    def _make_plan(self, spec: tuple, consts: dict, num_warpgroups: int, cluster: tuple[int, int, int],
                   runtime: tuple):
        import torch
        if not torch.cuda.is_available():
            raise LaunchError(f"launching {self.name} needs a CUDA GPU; on this machine use "
                              f"{self.name}.compile(..., target='sm_90a') to compile without one")
        device = torch.cuda.current_device()
        for n, v in zip(self.runtime_names, runtime):
            if isinstance(v, torch.Tensor):
                if not v.is_cuda:
                    raise LaunchError(f"{self.name}: argument `{n}` is on {v.device}; kernels take CUDA tensors")
                if v.device.index != device:
                    raise LaunchError(f"{self.name}: argument `{n}` is on {v.device} but the current device is "
                                      f"cuda:{device}")
        major, minor = torch.cuda.get_device_capability(device)
        target = {(9, 0): "sm_90a", (10, 0): "sm_100a"}.get((major, minor))
        if target is None:
            raise LaunchError(f"mgjit targets Hopper (sm_90a) and Blackwell (sm_100a); this GPU is sm_{major}{minor}")
        try:
            compiled = self._get_compiled(spec, consts, target, num_warpgroups, cluster)
        except CompileError as e:
            if e.rule != "target-arch":
                raise
            raise LaunchError(_wrong_gpu(self.name, _required_target(e.message), device) + f"\n{e}") from None
        if compiled.target != target:  # never launch code built for another architecture
            raise LaunchError(_wrong_gpu(self.name, compiled.target, device))
        return _make_launch_fn(self.name, compiled, device)

    def __call__(self, *args, **kwargs):
        raise LaunchError(f"launch {self.name} with a grid: {self.name}[grid](...)")

    def __repr__(self) -> str:
        return f"<mgjit.kernel {self.name}>"


def _describe_spec(names: Sequence[str], spec: tuple, consts: dict) -> str:
    parts = []
    for n, s in zip(names, spec):
        if s[0] == "tensor":
            dtype, rank, align, unit, div = s[1]
            parts.append(f"{n}: {dtype}[rank {rank}, align {align}{', unit-stride' if unit else ''}, last%{div}]")
        else:
            parts.append(f"{n}: {s[1]}" + (f" (%{s[2]})" if len(s) > 2 else ""))
    parts += [f"{k}={v!r}" for k, v in consts.items()]
    return ", ".join(parts)


def _arg_specializer() -> Callable[[Any, list], Any]:
    """The per-argument part of the dispatch key, as cheap as possible: for a tensor its dtype, rank,
    alignment and size-divisibility classes, unit last stride and device; for a scalar its kind and whether
    it is a multiple of 16. In the same pass it appends the argument's launch values (pointer, sizes,
    strides) to `values`, so each tensor attribute is read once per launch."""
    import torch
    tensor = torch.Tensor
    div = _DIV_CLASS

    def spec(v, values):
        t = type(v)
        if t is tensor or (t is not int and t is not float and t is not bool and isinstance(v, tensor)):
            st = v.stride()
            shape = v.shape
            bits = v.data_ptr()
            values.append(bits)
            values += shape
            values += st
            if len(st) > 1:
                isz = v.itemsize
                for s in st[:-1]:
                    bits |= s * isz
            last = shape[-1] if st else 1
            return (v.dtype, len(st), div[bits & 15], not st or st[-1] == 1 or last == 1, div[last & 15],
                    v.get_device())
        values.append(v)
        if t is int:
            return ("int", -2147483648 <= v <= 2147483647, (v & 15) == 0)
        if t is float:
            return "float"
        if t is bool:
            return "bool"
        return ("other", t)

    return spec


_DIV_CLASS = tuple(16 if i == 0 else (i & -i) for i in range(16))


_ARCHITECTURES = {"sm_90a": "Hopper", "sm_100a": "Blackwell"}


def _required_target(message: str) -> str:
    """The target a `target-arch` CompileError says the kernel needs (its lowering names it)."""
    return next((t for t in _ARCHITECTURES if f"needs {t}" in message), "sm_100a")


def _wrong_gpu(name: str, required: str, device: int) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    return (f"{name} needs {required} ({_ARCHITECTURES.get(required, 'another architecture')}); this GPU is "
            f"sm_{major}{minor} ({torch.cuda.get_device_name(device)}), so it was not launched")


def _make_launch_fn(name: str, compiled: CompiledKernel, device: int):
    """The per-specialization launch: TMA descriptors if any, then one C call that packs the values and
    launches (or the cuda-python path where the C launcher is unavailable or the launch uses a cluster)."""
    import torch
    from . import fastlaunch
    from .runtime import CudaError, check
    launcher = compiled.launcher()
    tensormaps = None
    if compiled.meta.get("tma"):
        from .runtime import TensorMaps
        tensormaps = TensorMaps(name, compiled.params, compiled.meta["tma"]).encode_all
    get_stream = torch._C._cuda_getCurrentRawStream
    get_device = torch._C._cuda_getDevice
    cluster_shape = launcher.cluster if launcher.cluster != (1, 1, 1) else None
    c_module = fastlaunch.load() if cluster_shape is None else None

    def check_device():
        if get_device() != device:
            raise LaunchError(f"{name}: the tensors are on cuda:{device} but the current device is "
                              f"cuda:{get_device()}")

    def normalise(grid) -> tuple[int, int, int]:
        g = (grid,) if isinstance(grid, int) else tuple(grid)
        if not 1 <= len(g) <= 3:
            raise LaunchError(f"{name}: a grid has 1 to 3 dimensions, got {grid!r}")
        g = g + (1,) * (3 - len(g))
        if not all(isinstance(x, int) for x in g) or not (0 < g[0] <= MAX_GRID[0] and 0 < g[1] <= MAX_GRID[1]
                                                          and 0 < g[2] <= MAX_GRID[2]):
            raise LaunchError(f"{name}: every grid dimension must be a positive int, at most {MAX_GRID}, got {grid!r}")
        if cluster_shape is not None and (g[0] % cluster_shape[0] or g[1] % cluster_shape[1] or g[2] % cluster_shape[2]):
            raise LaunchError(f"{name}: the grid {g} is not a whole number of clusters of {cluster_shape}")
        return g

    if c_module is None:
        def run(grid, values):
            check_device()
            if tensormaps is not None:
                values += tensormaps(values)
            launcher.launch(device, normalise(grid), get_stream(device), values)
        return run

    c_launch = c_module.launch
    handle = int(launcher.function(device))
    threads, smem, layout = launcher.threads, launcher.smem_bytes, launcher.c_layout
    buffer, pointers = launcher.buffer_address, launcher.pointers_address

    def failed(rc: int, grid, values):
        if rc == -1:
            g = normalise(grid)  # raises for a bad grid; a list or numpy ints land here and go again
            rc = c_launch(handle, g, threads, smem, get_stream(device), buffer, layout, values, pointers)
            if rc == 0:
                return
        if rc in (-2, -3):
            raise LaunchError(f"{name}: an argument does not fit its parameter type: tensor dimensions must be "
                              "below 2**31 and int arguments must fit in 64 bits")
        if rc > 0:
            try:
                check((driver_result(rc),))
            except CudaError as e:
                raise CudaError(f"{name}: launch failed: {e}") from None
            raise CudaError(f"{name}: launch failed with CUDA error {rc}")

    def run(grid, values):
        if get_device() != device:
            check_device()
        if tensormaps is not None:
            values += tensormaps(values)
        rc = c_launch(handle, grid, threads, smem, get_stream(device), buffer, layout, values, pointers)
        if rc:
            failed(rc, grid, values)

    return run


def driver_result(rc: int):
    from .runtime import driver
    return driver().CUresult(rc)

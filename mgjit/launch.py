"""Launch plans: what one specialization's launch does once it is compiled, and the Python dispatcher that
`kernel[grid](...)` falls back to.

The fast path is C (mgjit/_launch.c through fastlaunch.py): one call binds the arguments, computes the
dispatch key from the tensors, finds the plan's C half (`Plan.native`) and launches. Python runs only on a
miss (Kernel._c_miss: compile, make the plan, check the C key against specialize.argument_key()) and on the
slow path: anything unusual (a missing or unknown argument, a tensor subclass, a redefined helper, a grid
that needs explaining, MGJIT_INTERPRET=1) goes to the dispatcher `build_dispatcher` generates with the
kernel's own signature, which is also the whole launch path where the C launcher is unavailable. Both paths
find plans by the same rules: a plan is made once per dispatch key and shared.

A grid with a zero dimension launches nothing (as in Triton): the arguments are still checked and the kernel
compiled, so that an empty batch behaves like any other.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from . import abi, targets
from .errors import LaunchError

MAX_GRID = (2**31 - 1, 65535, 65535)


def wrong_gpu(name: str, required: str, device: int) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    arch = targets.TARGETS[required].architecture if required in targets.TARGETS else "another architecture"
    return (f"{name} needs {required} ({arch}); this GPU is "
            f"sm_{major}{minor} ({torch.cuda.get_device_name(device)}), so it was not launched")


def launch_device(name: str, names: Sequence[str], values: Sequence[Any]) -> int:
    """The device a launch runs on: torch's current CUDA device, which every tensor argument must be on."""
    import torch
    if not torch.cuda.is_available():
        raise LaunchError(f"launching {name} needs a CUDA GPU; on this machine use "
                          f"{name}.compile(..., target='sm_90a') to compile without one")
    device = torch.cuda.current_device()
    for n, v in zip(names, values):
        if isinstance(v, torch.Tensor):
            if not v.is_cuda:
                raise LaunchError(f"{name}: argument `{n}` is on {v.device}; kernels take CUDA tensors")
            if v.device.index != device:
                raise LaunchError(f"{name}: argument `{n}` is on {v.device} but the current device is "
                                  f"cuda:{device}")
    return device


def normalise(name: str, grid: Any, cluster: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """A grid as three dimensions, or None when one of them is zero (nothing to launch); raises for a bad one."""
    g = (grid,) if isinstance(grid, int) else tuple(grid) if isinstance(grid, (tuple, list)) else None
    if g is None or not 1 <= len(g) <= 3:
        raise LaunchError(f"{name}: a grid is an int or 1 to 3 ints, got {grid!r}")
    g = g + (1,) * (3 - len(g))
    if not all(isinstance(x, int) and 0 <= x <= limit for x, limit in zip(g, MAX_GRID)):
        raise LaunchError(f"{name}: every grid dimension must be an int >= 0, at most {MAX_GRID}, got {grid!r}")
    if 0 in g:
        return None
    if g[0] % cluster[0] or g[1] % cluster[1] or g[2] % cluster[2]:
        raise LaunchError(f"{name}: the grid {g} is not a whole number of clusters of {cluster}")
    return g


def launch_failed(name: str, rc: int) -> None:
    """Raise the error a C launch's return code means (a CUresult > 0, or one of abi.C_ERRORS)."""
    from .runtime import CudaError, check
    if rc == abi.C_ERRORS["value"]:
        raise LaunchError(f"{name}: an argument does not fit its parameter type: tensor dimensions must be below "
                          "2**31 and int arguments must fit in 64 bits")
    if rc == abi.C_ERRORS["layout"]:
        raise LaunchError(f"{name}: internal error: the call's arguments do not match its launch plan")
    try:
        check((driver_result(rc),))
    except CudaError as e:
        raise CudaError(f"{name}: launch failed: {e}") from None
    raise CudaError(f"{name}: launch failed with CUDA error {rc}")


def driver_result(rc: int):
    from .runtime import driver
    return driver().CUresult(rc)


class Plan:
    """One compiled kernel's launch on one device. `plan(grid, values)` launches through cuda-python (the
    Python path; `values` are the runtime arguments' launch values in parameter order, see
    specialize.argument_key); `native` is the C launcher's plan, None where that is unavailable."""

    def __init__(self, name: str, compiled, device: int, c_module=None):
        import torch
        from . import runtime
        self.name = name
        self.device = device
        self.launcher = compiled.launcher()
        self.cluster = self.launcher.cluster
        self.tensormaps = None
        descriptors = compiled.meta.get("tma") or []
        if descriptors:
            self.tensormaps = runtime.TensorMaps(name, compiled.params, descriptors).encode_all
        self.get_stream = torch._C._cuda_getCurrentRawStream
        self.get_device = torch._C._cuda_getDevice
        context = runtime.ensure_context(device)
        function = int(self.launcher.function(device))
        self.native = None
        if c_module is not None:
            ranks = tuple(p["rank"] if p["kind"] == "tensor" else -1 for p in compiled.params)
            maps = tuple(runtime.tensormap_arguments(compiled.params, d) for d in descriptors)
            try:
                self.native = c_module.Plan(name, function, context, device, self.launcher.threads,
                                            self.launcher.smem_bytes, self.cluster, ranks, self.launcher.c_layout,
                                            maps)
            except ValueError:  # more than the C launcher's 4 KB of parameters: the Python path takes it
                self.native = None

    def __call__(self, grid: Any, values: list) -> None:
        from . import runtime
        g = normalise(self.name, grid, self.cluster)
        if g is None:
            return
        if self.get_device() != self.device:
            raise LaunchError(f"{self.name}: the tensors are on cuda:{self.device} but the current device is "
                              f"cuda:{self.get_device()}")
        runtime.ensure_context(self.device)
        if self.tensormaps is not None:
            values = values + self.tensormaps(values)
        self.launcher.launch(self.device, g, self.get_stream(self.device), values)


def build_dispatcher(name: str, arg_names: list[str], runtime_names: list[str], constexpr_names: list[str],
                     defaults: dict[str, Any], namespace: dict[str, Any]) -> Callable[..., None]:
    """Generate `<name>(grid, <the kernel's parameters>, *, num_warpgroups=None, cluster=None)`, the Python path.

    `namespace` provides what the generated code calls: `_plans` (dispatch key -> plan), `_key` (the
    per-argument key function, specialize.argument_key()), `_miss(key, runtime values, constexprs,
    num_warpgroups, cluster)` (makes a plan), `_slow(grid, given, extra, unknown, num_warpgroups, cluster)`,
    `_deps_changed()` and `_M` (the marker of a missing argument). The key records each constexpr as
    strict_constexpr gives it (see constexpr_key). The generated source contains only the signature's identifiers.
    """
    namespace = dict(namespace)
    for n in arg_names:
        if n in defaults:
            namespace[f"_default_{n}"] = defaults[n]
    params = ", ".join(f"{n}=_default_{n}" if n in defaults else f"{n}=_M" for n in arg_names)
    keys = "".join(f"_key({n}, _values), " for n in runtime_names)
    namespace["_strict"] = strict_constexpr
    consts = "".join(f"_strict({n}), " for n in constexpr_names)
    runtime = "".join(f"{n}, " for n in runtime_names)
    given = " or ".join(f"{n} is _M" for n in arg_names if n not in defaults) or "False"
    src = (f"def {name}(grid, {params}{', ' if params else ''}*_extra, num_warpgroups=None, cluster=None, "
           f"**_unknown):\n"
           f"    if _extra or _unknown or {given} or _deps_changed():\n"
           f"        return _slow(grid, ({', '.join(arg_names)}{',' if arg_names else ''}), _extra, "
           f"_unknown, num_warpgroups, cluster)\n"
           f"    _values = []\n"
           f"    key = (({keys}), ({consts}), num_warpgroups, cluster)\n"
           f"    try:\n"
           f"        plan = _plans[key]\n"
           f"    except (KeyError, TypeError):\n"
           f"        plan = _miss(key, ({runtime}), dict(({''.join(f'({n!r}, {n}), ' for n in constexpr_names)})), "
           f"num_warpgroups, cluster)\n"
           f"    plan(grid, _values)\n")
    exec(compile(src, f"<mgjit dispatcher for {name}>", "exec"), namespace)
    return namespace[name]


def strict_constexpr(value: Any) -> tuple:
    """A constexpr as dispatch keys compare it: with its type, so that 1, 1.0 and True (equal under ==) find
    different plans; floats by their bits, so that -0.0 and 0.0 (equal under ==) do too and a NaN (unequal to
    itself) finds its own; tuples element by element. The C launcher compares the same way (same_object in
    _launch_keys.c)."""
    kind = type(value)
    if kind is float:
        return (float, value.hex())
    if kind is tuple:
        return (tuple, tuple(strict_constexpr(v) for v in value))
    return (kind, value)


def constexpr_key(constexpr_names: Sequence[str], consts: dict[str, Any]) -> tuple:
    """The constexpr part of a dispatch key, as the generated dispatcher builds it."""
    return tuple(strict_constexpr(consts[n]) for n in constexpr_names)

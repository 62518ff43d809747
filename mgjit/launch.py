"""Launch plans: what one specialization's launch does once it is compiled, and the dispatcher a kernel's
`kernel[grid](...)` runs.

The dispatcher is generated with the kernel's own signature. Python's own argument binding matches names;
each runtime argument contributes a small dispatch-key part (and its launch values, in the same pass); a dict
lookup finds the launch plan. Anything unusual (a missing or unknown argument, a redefined helper, a new
specialization) leaves the fast path for the Kernel's slow path, which explains or compiles.

A launch plan builds the TMA descriptors if any, then makes one C call that packs the values and launches (or
goes through cuda-python where the C launcher is unavailable or the launch uses a cluster).
"""
from __future__ import annotations

from typing import Any, Callable

from . import abi, targets
from .errors import LaunchError

MAX_GRID = (2**31 - 1, 65535, 65535)


def wrong_gpu(name: str, required: str, device: int) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    arch = targets.TARGETS[required].architecture if required in targets.TARGETS else "another architecture"
    return (f"{name} needs {required} ({arch}); this GPU is "
            f"sm_{major}{minor} ({torch.cuda.get_device_name(device)}), so it was not launched")


def make_plan(name: str, compiled, device: int) -> Callable[[Any, list], None]:
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
        if rc == abi.C_ERRORS["grid"]:
            g = normalise(grid)  # raises for a bad grid; a list or numpy ints land here and go again
            rc = c_launch(handle, g, threads, smem, get_stream(device), buffer, layout, values, pointers)
            if rc == 0:
                return
        if rc in (abi.C_ERRORS["value"], abi.C_ERRORS["count"]):
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


def build_dispatcher(name: str, arg_names: list[str], runtime_names: list[str], constexpr_names: list[str],
                     defaults: dict[str, Any], namespace: dict[str, Any]) -> Callable[..., None]:
    """Generate `<name>(grid, <the kernel's parameters>, *, num_warpgroups=None, cluster=None)`.

    `namespace` provides what the generated code calls: `_plans` (dispatch key -> plan), `_key` (the
    per-argument key function, specialize.argument_key()), `_miss(key, runtime values, constexprs,
    num_warpgroups, cluster)` (makes a plan), `_slow(grid, given, extra, unknown, num_warpgroups, cluster)`,
    `_deps_changed()` and `_M` (the marker of a missing argument). The generated source contains only the
    signature's identifiers.
    """
    namespace = dict(namespace)
    for n in arg_names:
        if n in defaults:
            namespace[f"_default_{n}"] = defaults[n]
    params = ", ".join(f"{n}=_default_{n}" if n in defaults else f"{n}=_M" for n in arg_names)
    keys = "".join(f"_key({n}, _values), " for n in runtime_names)
    consts = "".join(f"{n}, " for n in constexpr_names)
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

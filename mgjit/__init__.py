"""mgjit: a Triton-style JIT for NVIDIA Hopper and Blackwell GPUs, lowered through MLIR.

Importing mgjit is cheap: MLIR, torch's CUDA state and the driver are touched only when a kernel is
compiled or launched.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Callable


class _CheckoutPackages:
    """A source checkout keeps mgjit.cache and mgjit.autotune beside mgjit/ (pyproject's package-dir mapping, as
    DESIGN.md lays the tree out). Where this mgjit/ is such a checkout's, they are found in that checkout: an
    editable install's finder maps them to the installed checkout, which is another tree where this one was put
    first on sys.path (tools/ptx_profile.py, benchmarks/rows_ab.py TREE): its kernel cache and autotuner would
    serve this tree's kernels, or fail to import where that tree is gone. An installed wheel has them inside
    mgjit/, and this finder is not registered."""

    def __init__(self, root: str):
        self.packages = {f"{__name__}.{name}": os.path.join(root, name) for name in ("cache", "autotune")}

    def find_spec(self, fullname: str, path=None, target=None):
        directory = self.packages.get(fullname)
        if directory is None:
            return None
        return importlib.util.spec_from_file_location(fullname, os.path.join(directory, "__init__.py"),
                                                      submodule_search_locations=[directory])


def _checkout_root() -> str | None:
    """The checkout whose mgjit/ this is, where its cache/ and autotune/ stand beside it (not inside): packages of
    those names holding mgjit's modules (store.py, tuner.py), not a project's own cache/ beside a vendored mgjit/."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    inside = any(os.path.isdir(os.path.join(here, name)) for name in ("cache", "autotune"))
    beside = all(os.path.isfile(os.path.join(root, *path)) for path in (
        ("cache", "__init__.py"), ("cache", "store.py"), ("autotune", "__init__.py"), ("autotune", "tuner.py")))
    return root if beside and not inside else None


_CHECKOUT = _checkout_root()
if _CHECKOUT is not None:
    sys.meta_path.insert(0, _CheckoutPackages(_CHECKOUT))

from .dtypes import (DType, bfloat16, bool_, float4_e2m1fn_x2, float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float16,
                     float32, float64, int8, int16, int32, int64, uint8)
from .errors import (BankConflictWarning, Check, CompileError, CompileWarning, InterpretError, LaunchError,
                     PtxasWarning)
from .source import DeviceFunction
from ._version import VERSION as __version__
from .compiler import CompiledKernel
from .jit import Kernel
from .torch_op import outside_graph_pools, torch_op
from .language import (abs, arange, barrier, cdiv, cluster_rank, cluster_sync, clz, constexpr, copy_async, cos,
                       cta_sync, ds, erf, exp, exp2, fence_async_shared, fma, full, log, log2, max, maximum, min,
                       min_ctas_per_sm, minimum, named_barrier, num_programs, pipeline, popc, program_id, rsqrt,
                       set_max_registers, sin, smem, sqrt, static_range, store_async, store_async_wait, sum, tanh, tile,
                       tma_bounded, warp_id, warpgroup_id, wgmma, wgmma_wait, where, zeros)
from .language import clc_query, clc_try_cancel, tcgen05_commit, tcgen05_copy, tcgen05_mma, tmem  # Blackwell (sm_100a)
from .tmem_layouts import blocked_scales
from .language import cluster_gather, cluster_reduce
from .language import device_assert, print, trace  # debugging and profiling
from .profiler import Profile
from .runtime import max_active_clusters
from .language import gather_async, prefetch_async, scoped_smem  # scoped SMEM, TMA extras
from .language import (atomic_add, atomic_cas, atomic_max, atomic_min, atomic_xchg, load,  # GMEM
                       semaphore_signal, semaphore_wait, store)


def kernel(fn: Callable | None = None, *, num_warpgroups: int = 1):
    """Decorate a Python function as a GPU kernel: `@mgjit.kernel` or `@mgjit.kernel(num_warpgroups=2)`."""
    if fn is None:
        return lambda f: Kernel(f, num_warpgroups=num_warpgroups)
    return Kernel(fn, num_warpgroups=num_warpgroups)


def device(fn: Callable) -> DeviceFunction:
    """Decorate a helper that kernels call; it is inlined where it is called."""
    return DeviceFunction(fn)


def __getattr__(name: str):
    # The autotuner loads on first use so that `import mgjit` stays light.
    if name in ("autotune", "Config"):
        # import_module, not `from . import autotune`: the latter asks this module for the attribute first,
        # which would recurse here. Importing binds mgjit.autotune to the (callable) package.
        module = importlib.import_module("mgjit.autotune")
        return module.Config if name == "Config" else module
    raise AttributeError(f"module 'mgjit' has no attribute {name!r}")

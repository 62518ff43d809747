"""mgjit.autotune: choose the fastest config of a kernel per tuning key, and remember it on disk.

    @mgjit.autotune(configs=[mgjit.Config(BM=128, BN=256, BK=64, num_warpgroups=3), ...],
                    key=["M", "N", "K"], restore=["c"])
    @mgjit.kernel
    def matmul(a, b, c, M, N, K, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr): ...

    matmul[grid](a, b, c, M, N, K)     # first call per key: prune, compile in parallel, time, store
    print(matmul.tuning_report())

Importing this package is cheap: torch is imported inside the functions that time, share or inspect
tensors, and nothing here imports MLIR.
"""
import sys
import types
from collections.abc import Callable
from typing import Any

from .compile_pool import CompileOutcome
from .config import Config, expand_space
from .prune import divisible
from .report import Row, TuningReport
from .store import Result, ResultStore
from .timing import CudaEventTimer, Run
from .tuner import Autotuned, autotune

__all__ = ["Autotuned", "CompileOutcome", "Config", "CudaEventTimer", "Result", "ResultStore", "Row", "Run",
           "TuningReport", "autotune", "divisible", "expand_space"]


class _CallableModule(types.ModuleType):
    """Once `mgjit.autotune` (this package) is imported, Python binds the name `autotune` in `mgjit` to the
    package, shadowing the decorator that `mgjit` exports under the same name. Calling the package calls
    the decorator, so `@mgjit.autotune(...)` works whichever of the two the name holds."""

    def __call__(self, *args: Any, **kwargs: Any) -> Callable[[Any], Autotuned]:
        return autotune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

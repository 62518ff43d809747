"""The one place that imports the MLIR Python bindings.

By default the bindings come from the numba-cuda-mlir wheel (`numba_cuda_mlir._mlir`), which registers every
upstream dialect and pass; `MGJIT_MLIR_PACKAGE` names another upstream build (e.g. `mlir`). The import is
lazy (about 0.7 s and 170 MB): `import mgjit`, a cache hit and a launch never pay for it.
"""
from __future__ import annotations

import importlib
import os
import types

from .errors import CompileError

_loaded: types.SimpleNamespace | None = None

PIPELINE = ("builtin.module(convert-scf-to-cf, convert-arith-to-llvm, gpu.module(convert-gpu-to-nvvm), "
            "reconcile-unrealized-casts, gpu-module-to-binary{format=isa})")


def package_name() -> str:
    return os.environ.get("MGJIT_MLIR_PACKAGE", "numba_cuda_mlir._mlir")


def load() -> types.SimpleNamespace:
    """The MLIR modules mgjit uses, imported on first call."""
    global _loaded
    if _loaded is None:
        pkg = package_name()
        mods = {}
        try:
            for name in ("ir", "passmanager"):
                mods[name] = importlib.import_module(f"{pkg}.{name}")
            for name in ("arith", "scf", "llvm", "nvvm", "gpu"):
                mods[name] = importlib.import_module(f"{pkg}.dialects.{name}")
        except ImportError as e:
            where = (f"MGJIT_MLIR_PACKAGE={pkg}" if "MGJIT_MLIR_PACKAGE" in os.environ
                     else f"{pkg} (from the numba-cuda-mlir wheel, a dependency of mgjit)")
            raise CompileError(f"the MLIR Python bindings could not be imported from {where}: {e}; install "
                               "numba-cuda-mlir, or point MGJIT_MLIR_PACKAGE at a package that provides ir, "
                               "passmanager and the arith, scf, llvm, nvvm and gpu dialects") from None
        _loaded = types.SimpleNamespace(**mods)
    return _loaded


def to_ptx(module) -> str:
    """Run the lowering pipeline on a module holding one gpu.module and return its PTX."""
    m = load()
    pm = m.passmanager.PassManager.parse(PIPELINE, context=module.context)
    pm.run(module.operation)
    binary = module.body.operations[0]
    obj = m.gpu.ObjectAttr(binary.attributes["objects"][0])
    return obj.object.decode()

"""The one place that imports the MLIR Python bindings.

By default the bindings come from the numba-cuda-mlir wheel (`numba_cuda_mlir._mlir`), which registers every
upstream dialect and pass; `MGJIT_MLIR_PACKAGE` names another upstream build (e.g. `mlir`). The import is
lazy (about 0.7 s and 170 MB): `import mgjit`, a cache hit and a launch never pay for it.

The pipeline runs under LLVM's crash recovery where the bindings' library exports it (`_crash_recovery`): an LLVM
fatal error ("Cannot select", an assertion) aborts the whole process otherwise, a notebook's kernel with it.
"""
from __future__ import annotations

import ctypes
import glob
import importlib
import itertools
import os
import tempfile
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


# mlir::PassManager::enableCrashReproducerGeneration(llvm::StringRef outputFile, bool genLocalReproducer): with it,
# PassManager::run runs the passes on a thread under llvm::CrashRecoveryContext, which turns a signal (the abort of
# report_fatal_error) into a failed run and writes the module it was given to outputFile. The C API lacks it; a
# StringRef is passed by value as (pointer, length), two integer registers on x86-64 and AArch64 alike.
_ENABLE_RECOVERY = "_ZN4mlir11PassManager31enableCrashReproducerGenerationEN4llvm9StringRefEb"
_FATAL_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_recovery: tuple | None = None  # (enableCrashReproducerGeneration, _capsule_pointer) once looked up, else ()
_fatal_errors: list[str] = []  # what LLVM's fatal errors said, in order (_on_fatal_error)
_reproducers = itertools.count()
# How the recovery's diagnostic begins where it caught a crash (it writes the reproducer for any failed pass)
_CRASHED = "A signal was caught while processing the MLIR module"


@_FATAL_HANDLER
def _on_fatal_error(reason: bytes) -> None:
    """LLVM's fatal error handler: keep the reason for the CompileError, and print it as LLVM does without one (the
    process still dies of a fatal error outside a recovered run)."""
    text = reason.decode(errors="replace")
    _fatal_errors.append(text)
    os.write(2, f"LLVM ERROR: {text}\n".encode())


def _crash_recovery() -> tuple:
    """(enableCrashReproducerGeneration from the bindings' libMLIRPythonCAPI, _capsule_pointer); () where the
    library lacks it (another build of MLIR): the pipeline then runs unguarded. The default bindings also get
    _on_fatal_error, a Python callback LLVM calls on its recovery thread: it needs the GIL, which their
    PassManager.run releases (a build whose run holds it would hang there instead of failing)."""
    global _recovery
    if _recovery is None:
        _recovery = ()
        libs = importlib.import_module(f"{package_name()}._mlir_libs")
        for path in sorted(glob.glob(os.path.join(os.path.dirname(libs.__file__), "libMLIRPythonCAPI*.so*"))):
            try:
                lib = ctypes.CDLL(path)  # the library the bindings loaded: dlopen hands back the same copy of LLVM
                enable, install = lib[_ENABLE_RECOVERY], lib.LLVMInstallFatalErrorHandler
            except (OSError, AttributeError):
                continue
            enable.argtypes, enable.restype = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_bool], None
            if "MGJIT_MLIR_PACKAGE" not in os.environ:
                install.argtypes, install.restype = [_FATAL_HANDLER], None
                install(_on_fatal_error)
            _recovery = (enable, _capsule_pointer)
            break
    return _recovery


def _capsule_pointer(capsule) -> int:
    """The pointer a PyCapsule holds (a PassManager's _CAPIPtr: the mlir::PassManager), under its own name."""
    name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))(capsule)
    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer",
                                                                                 ctypes.pythonapi))
    return get(capsule, name)


def to_ptx(module) -> str:
    """Run the lowering pipeline on a module holding one gpu.module and return its PTX. Where crash recovery is
    there, an LLVM fatal error in it raises RuntimeError with LLVM's reason and the path of the module it failed on;
    other failures raise the bindings' MLIRError."""
    m = load()
    pm = m.passmanager.PassManager.parse(PIPELINE, context=module.context)
    reproducer = None  # where a recovered crash writes the module
    recovery = _crash_recovery()
    if recovery:
        enable, pointer = recovery
        reproducer = os.path.join(tempfile.gettempdir(), f"mgjit-crashed-{os.getpid()}-{next(_reproducers)}.mlir")
        path = reproducer.encode()
        enable(pointer(pm._CAPIPtr), path, len(path), False)
        if os.path.exists(reproducer):  # left by an earlier process of this pid
            os.remove(reproducer)
    said = len(_fatal_errors)
    try:
        pm.run(module.operation)
    except Exception as e:
        if reproducer is None or not os.path.exists(reproducer):
            raise
        if len(_fatal_errors) > said:
            raise RuntimeError(f"LLVM stopped with a fatal error: {_fatal_errors[said].splitlines()[0]} (the module "
                               f"it failed on is at {reproducer}; LLVM's whole report went to stderr)") from e
        if not any(_CRASHED in str(d) for d in getattr(e, "error_diagnostics", ())):
            raise  # a pass failed and said why (its note names the reproducer)
        raise RuntimeError(f"LLVM crashed (its report went to stderr; the module it failed on is at {reproducer})") \
            from e
    binary = module.body.operations[0]
    obj = m.gpu.ObjectAttr(binary.attributes["objects"][0])
    return obj.object.decode()

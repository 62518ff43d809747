"""Build and load the C launch fast path (mgjit/_launch.c), once per machine and Python version.

The shared object lives in the cache directory under a name that hashes its source and the Python
version, published by rename so concurrent processes can build it at once. Where it cannot be built (no C
compiler or Python headers) launches go through cuda-python instead, which costs a few microseconds more.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

from . import abi

_SOURCE = Path(__file__).with_name("_launch.c")
# A C compiler that hangs must not hang the first launch: the Python launcher is used instead.
_BUILD_TIMEOUT_S = 120
_module: ModuleType | None = None
_failed: str | None = None


def _cache_dir() -> Path:
    from .cache.store import default_store
    return Path(default_store().root) / "launcher"


def load() -> ModuleType | None:
    """The compiled launcher module, or None (with the reason in `failure()`) if it cannot be had."""
    global _module, _failed
    if _module is not None or _failed is not None:
        return _module
    if os.environ.get("MGJIT_NO_C_LAUNCHER"):
        _failed = "disabled by MGJIT_NO_C_LAUNCHER"
        return None
    try:
        _module = _build_and_import()
    except Exception as e:  # no compiler, no headers, no libcuda: fall back, remember why
        _failed = f"{type(e).__name__}: {e}"
    return _module


def failure() -> str | None:
    return _failed


def _build_and_import() -> ModuleType:
    source = _SOURCE.read_bytes()
    defines = abi.c_defines()
    tag = hashlib.sha256(source + sys.version.encode() + " ".join(defines).encode()).hexdigest()[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    directory = _cache_dir()
    target = directory / f"mgjit_launch_{tag}{suffix}"
    if not target.exists():
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
        if cc is None:
            raise RuntimeError("no C compiler found")
        include = sysconfig.get_paths()["include"]
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            out = Path(tmp) / target.name
            try:
                proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", f"-I{include}", *defines, str(_SOURCE), "-o",
                                       str(out), "-ldl"], capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"building the C launcher with {cc} did not finish within {_BUILD_TIMEOUT_S} s") \
                    from None
            if proc.returncode != 0:
                raise RuntimeError(f"building the C launcher failed: {proc.stderr.strip()[:500]}")
            os.replace(out, target)
    loader = importlib.machinery.ExtensionFileLoader("mgjit_launch", str(target))
    spec = importlib.util.spec_from_file_location("mgjit_launch", str(target), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module

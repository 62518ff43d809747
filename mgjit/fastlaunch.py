"""Build, load and configure the C launch fast path (mgjit/_launch.c), once per machine and Python version.

The shared object lives in the cache directory under a name that hashes its source and the Python
version, published by rename so concurrent processes can build it at once. It reads torch tensors through
the DLPack C exchange API (`torch.Tensor.__dlpack_c_exchange_api__`, torch >= 2.10): measured on the CPU,
filling a DLTensor from a torch tensor that way costs ~0.09 us, against ~0.7 us for reading `data_ptr()`,
`shape`, `stride()`, `dtype` and `get_device()` through the CPython API (see benchmarks/launch.py --cpu).

Where it cannot be had (no C compiler or Python headers, a torch without the exchange API, no libcuda),
launches take the Python path (launch.py's generated dispatcher and cuda-python), which costs several
microseconds more; a warning says so once. Without a GPU nothing is built: there is nothing to launch.
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
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from . import abi, dtypes

_SOURCE = Path(__file__).with_name("_launch.c")
# The files it #includes (one translation unit): every byte of them is in the build's tag.
_PARTS = tuple(Path(__file__).with_name(f"_launch_{part}.c") for part in ("keys", "plan", "tuned"))
# A C compiler that hangs must not hang the first launch: the Python launcher is used instead.
_BUILD_TIMEOUT_S = 120
_module: ModuleType | None = None
_configured: ModuleType | None = None
_failed: str | None = None
# The dtypes a tensor's dispatch key can name, in the order of the indices in its key.
KEY_DTYPES: tuple[dtypes.DType, ...] = tuple(d for d in dtypes.ALL if d.torch_name)


def _cache_dir() -> Path:
    from .cache.store import default_store
    return Path(default_store().root) / "launcher"


def module() -> ModuleType:
    """The compiled module, configured for torch (its driver not chosen yet); raises where it cannot be had."""
    global _configured
    if _configured is None:
        m = _build_and_import()
        _configure(m)
        _configured = m
    return _configured


def load() -> ModuleType | None:
    """The configured module launching through libcuda, or None (with the reason in `failure()`)."""
    global _module, _failed
    if _module is not None or _failed is not None:
        return _module
    if os.environ.get("MGJIT_NO_C_LAUNCHER"):
        _failed = "disabled by MGJIT_NO_C_LAUNCHER"
        return None
    import torch
    if not torch.cuda.is_available():  # nothing to launch on: the Python path explains that, or interprets
        _failed = "no CUDA GPU"
        return None
    try:
        m = module()
        m.use_driver()
        _check_on_the_gpu(m)
        _module = m
    except Exception as e:  # no compiler, no headers, no exchange API, no libcuda: fall back, remember why
        _failed = f"{type(e).__name__}: {e}"
        warnings.warn(f"mgjit: the C launch path is unavailable ({_failed}); kernels launch through the slower "
                      "Python path", RuntimeWarning, stacklevel=3)
    return _module


def _check_on_the_gpu(m: ModuleType) -> None:
    """What the C launcher takes from torch's exchange API for CUDA tensors, checked against torch's own answers
    once per process: the stream launches go to, and a tensor view's address, sizes, strides and device."""
    import torch
    if not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    t = torch.empty(4, 6, device=f"cuda:{device}")[1:, 2:].t()
    described = m.describe(t)
    expected = (2, device, t.data_ptr(), tuple(t.shape), tuple(t.stride()))
    if described[1:] != expected:
        raise RuntimeError(f"torch's DLPack exchange API describes a CUDA tensor as {described[1:]}, not {expected}")
    side = torch.cuda.Stream(device)
    for stream in (torch.cuda.current_stream(device), side):
        with torch.cuda.stream(stream):
            if m.current_stream(device) != stream.cuda_stream:
                raise RuntimeError("torch's DLPack exchange API names another stream than torch.cuda.current_stream")


def failure() -> str | None:
    return _failed


def dlpack_exchange_api() -> Any:
    """torch's DLPack C exchange API: a capsule (torch >= 2.11), or its address (torch 2.10's first spelling)."""
    import torch
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    if api is None:
        api = getattr(torch.Tensor, "__c_dlpack_exchange_api__", None)
    if api is None:
        raise RuntimeError(f"torch {torch.__version__} has no DLPack C exchange API (torch >= 2.10 has)")
    return api


def _configure(m: ModuleType) -> None:
    import torch
    from . import launch
    types = (torch.Tensor, torch.nn.Parameter)
    m.configure(dlpack_exchange_api(), types, (), launch.launch_failed)
    # Each dtype's DLPack spelling, as torch's exchange API reports it, in KEY_DTYPES order.
    spelled = tuple(m.describe(torch.empty(0, dtype=getattr(torch, d.torch_name)))[0] for d in KEY_DTYPES)
    if len(set(spelled)) != len(spelled):
        raise RuntimeError(f"two dtypes share a DLPack spelling: {spelled}")
    m.configure(dlpack_exchange_api(), types, spelled, launch.launch_failed)


def _build_and_import() -> ModuleType:
    source = b"".join(path.read_bytes() for path in (_SOURCE, *_PARTS))
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
                proc = subprocess.run([cc, "-O2", "-std=c11", "-shared", "-fPIC", f"-I{include}", *defines,
                                       str(_SOURCE), "-o", str(out), "-ldl"], capture_output=True, text=True,
                                      timeout=_BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"building the C launcher with {cc} did not finish within {_BUILD_TIMEOUT_S} s") \
                    from None
            if proc.returncode != 0:
                raise RuntimeError(f"building the C launcher failed: {proc.stderr.strip()[:500]}")
            os.replace(out, target)
    loader = importlib.machinery.ExtensionFileLoader("mgjit_launch", str(target))
    spec = importlib.util.spec_from_file_location("mgjit_launch", str(target), loader=loader)
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    return m

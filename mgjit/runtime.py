"""Loading cubins and launching them on torch's current stream through cuda-python (cuda.bindings.driver).

A `Launcher` is built once per compiled kernel. Its arguments live in one preallocated buffer laid out by a
precompiled `struct.Struct`, with a fixed array of pointers into it, so a launch is one `pack_into` and
one `cuLaunchKernel` with the pointer array's address: no per-call allocation, no per-argument wrapping.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any, Sequence

_driver = None


def driver():
    global _driver
    if _driver is None:
        from cuda.bindings import driver as d
        _driver = d
    return _driver


class CudaError(RuntimeError):
    pass


def check(result) -> Any:
    """Unwrap a cuda.bindings (err, *values) tuple, raising CudaError with the driver's message."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    d = driver()
    if err != d.CUresult.CUDA_SUCCESS:
        _, msg = d.cuGetErrorString(err)
        raise CudaError(f"CUDA driver error {err.name}: {msg.decode() if msg else ''}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def abi_format(params: Sequence[dict]) -> str:
    """struct format of the kernel parameters in order (native alignment matches the driver's)."""
    fmt = "@"
    for p in params:
        if p["kind"] == "tensor":
            fmt += "Q" + "i" * p["rank"] + "q" * p["rank"]
        else:
            fmt += {"i32": "i", "i64": "q", "f32": "f", "f64": "d", "i1": "?"}[p["mlir"]]
    return fmt


_MAX_STATIC_SMEM = 48 * 1024


class Launcher:
    def __init__(self, cubin: bytes, name: str, params: Sequence[dict], smem_bytes: int, threads: int):
        self.cubin = cubin
        self.name = name
        self.smem_bytes = smem_bytes
        self.threads = threads
        self.packer = struct.Struct(abi_format(params))
        self.buffer = ctypes.create_string_buffer(max(self.packer.size, 1))
        base = ctypes.addressof(self.buffer)
        offsets = _field_offsets(abi_format(params))
        self.pointers = (ctypes.c_void_p * max(len(offsets), 1))(*(base + o for o in offsets))
        self.pointers_address = ctypes.addressof(self.pointers)
        self.functions: dict[int, Any] = {}  # device ordinal → CUfunction
        self.lock = threading.Lock()

    def function(self, device: int):
        f = self.functions.get(device)
        if f is None:
            d = driver()
            module = check(d.cuModuleLoadData(self.cubin))
            f = check(d.cuModuleGetFunction(module, self.name.encode()))
            if self.smem_bytes > _MAX_STATIC_SMEM:
                check(d.cuFuncSetAttribute(
                    f, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem_bytes))
            self.functions[device] = f
        return f

    def launch(self, device: int, grid: tuple[int, int, int], stream: int, values: Sequence[Any]) -> None:
        f = self.functions.get(device) or self.function(device)
        with self.lock:
            try:
                self.packer.pack_into(self.buffer, 0, *values)
            except struct.error as e:
                from .errors import LaunchError
                raise LaunchError(f"{self.name}: an argument does not fit its parameter type ({e}); tensor "
                                  "dimensions must be below 2**31 and int arguments fit in 64 bits") from None
            err, = driver().cuLaunchKernel(f, grid[0], grid[1], grid[2], self.threads, 1, 1, self.smem_bytes,
                                           stream, self.pointers_address, 0)
        if err:
            check((err,))


def _field_offsets(fmt: str) -> list[int]:
    """Byte offset of each field of a struct format (with native alignment)."""
    offsets = []
    prefix = "@"
    for ch in fmt[1:]:
        size = struct.calcsize(prefix + ch)
        offsets.append(size - struct.calcsize(ch))
        prefix += ch
    return offsets

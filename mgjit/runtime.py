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


_FIELD = {"ptr": ("Q", 8, 8), "i32": ("i", 4, 4), "i64": ("q", 8, 8), "f32": ("f", 4, 4), "f64": ("d", 8, 8),
          "i1": ("?", 1, 1), "tensormap": ("128s", 128, 64)}


_C_CODE = {"ptr": 1, "i32": 2, "i64": 3, "f32": 4, "f64": 5, "i1": 6, "tensormap": 7}


def abi_layout(params: Sequence[dict], tensormaps: int) -> tuple[str, list[int], bytes]:
    """struct format (explicit padding) and byte offset of every kernel parameter, in order: each tensor is
    its pointer, sizes (i32) and strides (i64); then the TMA descriptors (128 bytes, 64-byte aligned)."""
    kinds = []
    for p in params:
        if p["kind"] == "tensor":
            kinds += ["ptr"] + ["i32"] * p["rank"] + ["i64"] * p["rank"]
        else:
            kinds.append(p["mlir"])
    kinds += ["tensormap"] * tensormaps
    fmt, offsets, pos, c_layout = "=", [], 0, b""
    for k in kinds:
        code, size, align = _FIELD[k]
        pad = -pos % align
        fmt += "x" * pad + code
        pos += pad
        offsets.append(pos)
        c_layout += struct.pack("<BI", _C_CODE[k], pos)
        pos += size
    return fmt, offsets, c_layout


_MAX_STATIC_SMEM = 48 * 1024


class Launcher:
    def __init__(self, cubin: bytes, name: str, params: Sequence[dict], smem_bytes: int, threads: int,
                 tensormaps: int = 0, cluster: tuple[int, int, int] = (1, 1, 1)):
        self.cubin = cubin
        self.cluster = cluster
        self.name = name
        self.smem_bytes = smem_bytes
        self.threads = threads
        fmt, offsets, self.c_layout = abi_layout(params, tensormaps)
        self.packer = struct.Struct(fmt)
        # 64 spare bytes so the buffer can start on a 64-byte boundary (the descriptors' alignment).
        self.storage = ctypes.create_string_buffer(max(self.packer.size, 1) + 64)
        base = ctypes.addressof(self.storage)
        base += -base % 64
        self.buffer = (ctypes.c_char * max(self.packer.size, 1)).from_address(base)
        self.buffer_address = base
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
            if self.cluster != (1, 1, 1):
                err, = driver().cuLaunchKernelEx(self._cluster_config(grid, stream), f, self.pointers_address, 0)
            else:
                err, = driver().cuLaunchKernel(f, grid[0], grid[1], grid[2], self.threads, 1, 1, self.smem_bytes,
                                               stream, self.pointers_address, 0)
        if err:
            check((err,))


    def _cluster_config(self, grid: tuple[int, int, int], stream: int):
        d = driver()
        config = d.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = self.threads, 1, 1
        config.sharedMemBytes = self.smem_bytes
        config.hStream = stream
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = self.cluster
        config.attrs = [attr]
        config.numAttrs = 1
        return config


_TMA_DTYPE = {"bfloat16": "BFLOAT16", "float16": "FLOAT16", "float32": "FLOAT32", "float64": "FLOAT64",
              "int32": "INT32", "int64": "INT64", "uint8": "UINT8", "int8": "UINT8", "float8_e4m3fn": "UINT8",
              "float8_e5m2": "UINT8", "int16": "UINT16"}
_TMA_SWIZZLE = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}


class TensorMaps:
    """Builds the TMA descriptors of a launch from its tensors' pointers, sizes and strides, keeping the
    encoded bytes per (pointer, sizes, strides): the same tensors next time cost one dict lookup."""

    def __init__(self, name: str, params: Sequence[dict], descriptors: Sequence[dict]):
        self.name = name
        self.descriptors = descriptors
        starts, pos = [], 0
        for p in params:
            starts.append(pos)
            pos += 1 + 2 * p["rank"] if p["kind"] == "tensor" else 1
        self.slices = []
        for desc in descriptors:
            p = params[desc["param"]]
            start = starts[desc["param"]]
            self.slices.append((start, start + 1 + 2 * p["rank"], p))
        self.cache: dict[tuple, bytes] = {}

    def encode_all(self, values: Sequence) -> list[bytes]:
        out = []
        for desc, (start, stop, p) in zip(self.descriptors, self.slices):
            key = (id(desc), *values[start:stop])
            blob = self.cache.get(key)
            if blob is None:
                if len(self.cache) > 4096:
                    self.cache.clear()
                blob = self.cache[key] = self._encode(desc, p, values[start:stop])
            out.append(blob)
        return out

    def _encode(self, desc: dict, p: dict, values: Sequence) -> bytes:
        d = driver()
        rank = p["rank"]
        ptr, sizes, strides = values[0], values[1:1 + rank], values[1 + rank:]
        itemsize = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8,
                    "int16": 2}.get(p["dtype"], 1)
        from .errors import LaunchError
        if ptr % 16 or any((s * itemsize) % 16 for s in strides[:-1]) or (rank and strides[-1] != 1):
            raise LaunchError(f"{self.name}: argument `{p['name']}` is read with TMA (copy_async), which needs a "
                              f"16-byte aligned base, row strides that are multiples of 16 bytes and a contiguous "
                              f"last dimension; got address {ptr:#x}, strides {tuple(strides)} x {itemsize} bytes")
        dtype = getattr(d.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_TMA_DTYPE[p['dtype']]}")
        swizzle = getattr(d.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{_TMA_SWIZZLE[desc['swizzle']]}")
        # The driver takes dimensions innermost first, and strides (bytes) of every dimension but the innermost.
        dims = [d.cuuint64_t(int(x)) for x in reversed(sizes)]
        byte_strides = [d.cuuint64_t(int(x) * itemsize) for x in list(reversed(strides))[1:]]
        box = [d.cuuint32_t(int(x)) for x in reversed(desc["box"])]
        ones = [d.cuuint32_t(1)] * rank
        tmap = check(d.cuTensorMapEncodeTiled(
            dtype, rank, ptr, dims, byte_strides, box, ones,
            d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
            d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
        return struct.pack("<16Q", *(int(x) for x in tmap.opaque))

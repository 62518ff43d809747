"""Loading cubins and launching them on torch's current stream through cuda-python (cuda.bindings.driver).

A `Launcher` is built once per compiled kernel. Its arguments live in one preallocated buffer laid out by the
parameter ABI (`abi.buffer_layout`), with a fixed array of pointers into it, so a launch is one `pack_into` and
one `cuLaunchKernel` with the pointer array's address: no per-call allocation, no per-argument wrapping. This is
the Python path; the C launcher (`fastlaunch`) packs the same layout into a buffer of its own, and encodes TMA
descriptors with the arguments `tensormap_arguments` gives it, which are those `TensorMaps` uses.
"""
from __future__ import annotations

import ctypes
import functools
import math
import struct
import threading
from typing import Any, Sequence

from . import abi, dtypes, targets
from .errors import LaunchError

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


_MAX_STATIC_SMEM = 48 * 1024


def ensure_context(device: int) -> int:
    """The CUDA context current on this thread (its handle), made current first if there is none: torch's
    runtime does that lazily, so a thread that has not used the GPU yet may have none."""
    d = driver()
    ctx = check(d.cuCtxGetCurrent())
    if not int(ctx):
        ctx = check(d.cuDevicePrimaryCtxRetain(check(d.cuDeviceGet(device))))
        check(d.cuCtxSetCurrent(ctx))
    return int(ctx)


# An empty kernel, JIT-compiled by the driver for whatever GPU is current (PTX for sm_90 runs on every later one):
# `max_active_clusters` asks the occupancy calculator about it with the shared memory of the CTAs it stands for.
_PROBE_PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry mgjit_cluster_probe() { ret; }
"""
_probes: dict[int, Any] = {}


@functools.lru_cache(maxsize=None)
def max_active_clusters(ctas: int, ctas_per_sm: int = 1, threads: int = 128, device: int = 0) -> int:
    """How many clusters of `ctas` CTAs of `threads` threads can run at once on CUDA device `device` when an SM
    holds at most `ctas_per_sm` of them (`mgjit.min_ctas_per_sm`): the grid of a persistent clustered kernel. A
    cluster's CTAs share a GPC, and GPCs do not all hold a multiple of a cluster: on an H200 (132 SMs), 2 CTAs an
    SM fit 62 clusters of 4 (not 66), 30 of 8 and 14 of 16, and a grid one cluster larger runs that cluster after
    the others, in a second wave. The driver is asked once per process for each set of arguments (an H200 took
    3 to 4.5 ms a call)."""
    if ctas < 1 or ctas > targets.HOPPER.max_cluster_ctas or ctas_per_sm < 1:
        raise ValueError(f"max_active_clusters: expected 1 <= ctas <= {targets.HOPPER.max_cluster_ctas} and "
                         f"ctas_per_sm >= 1, got ctas={ctas}, ctas_per_sm={ctas_per_sm}")
    d = driver()
    check(d.cuInit(0))
    ensure_context(device)
    f = _probes.get(device)
    if f is None:
        f = _probes[device] = check(d.cuModuleGetFunction(check(d.cuModuleLoadData(_PROBE_PTX)),
                                                          b"mgjit_cluster_probe"))
        check(d.cuFuncSetAttribute(f, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
    attr = d.CUdevice_attribute
    per_sm = check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, device))
    reserved = check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, device))
    # shared memory that lets exactly ctas_per_sm CTAs share an SM
    smem = max(0, per_sm // ctas_per_sm - reserved - 1024)
    check(d.cuFuncSetAttribute(f, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
    config = d.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = ctas, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = smem
    cluster = d.CUlaunchAttribute()
    cluster.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z = ctas, 1, 1
    config.attrs = [cluster]
    config.numAttrs = 1
    return check(d.cuOccupancyMaxActiveClusters(f, config))


class Launcher:
    def __init__(self, cubin: bytes, name: str, fields: Sequence[abi.Field], smem_bytes: int, threads: int,
                 cluster: tuple[int, int, int] = (1, 1, 1)):
        self.cubin = cubin
        self.cluster = cluster
        self.name = name
        self.smem_bytes = smem_bytes
        self.threads = threads
        layout = abi.buffer_layout(fields)
        offsets, self.c_layout = layout.offsets, layout.c_layout
        self.packer = struct.Struct(layout.struct_format)
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
            f = check(d.cuModuleGetFunction(module, abi.symbol(self.name).encode()))
            if self.smem_bytes > _MAX_STATIC_SMEM:
                check(d.cuFuncSetAttribute(
                    f, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem_bytes))
            if math.prod(self.cluster) > targets.PORTABLE_CLUSTER_CTAS:
                check(d.cuFuncSetAttribute(
                    f, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
            self.functions[device] = f
        return f

    def launch(self, device: int, grid: tuple[int, int, int], stream: int, values: Sequence[Any]) -> None:
        f = self.functions.get(device) or self.function(device)
        with self.lock:
            try:
                self.packer.pack_into(self.buffer, 0, *values)
            except struct.error as e:
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


_TMA_SWIZZLE = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}


class TensorMaps:
    """Builds the TMA descriptors of a launch from its tensors' pointers, sizes and strides, keeping the
    encoded bytes per (pointer, sizes, strides): the same tensors next time cost one dict lookup."""

    def __init__(self, name: str, params: Sequence[dict], descriptors: Sequence[dict]):
        self.name = name
        self.descriptors = descriptors
        # Each parameter's launch values: as many as the fields it occupies (abi.param_fields).
        spans, pos = [], 0
        for p in params:
            count = len(abi.param_fields(p["kind"], dtypes.BY_NAME[p["dtype"]], p["rank"]))
            spans.append((pos, pos + count))
            pos += count
        self.slices = [(*spans[desc["param"]], params[desc["param"]]) for desc in descriptors]
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
        # Alignment and unit last stride are part of the specialization this kernel was compiled for (the
        # compiler refuses TMA on anything else), so they need no check here.
        rank = p["rank"]
        ptr, sizes, strides = values[0], values[1:1 + rank], values[1 + rank:]
        dtype, swizzle, interleave, l2, oob = _tensormap_enums(desc, p)
        itemsize = dtypes.BY_NAME[p["dtype"]].itemsize
        # The driver takes dimensions innermost first, and strides (bytes) of every dimension but the innermost.
        dims = [d.cuuint64_t(int(x)) for x in reversed(sizes)]
        byte_strides = [d.cuuint64_t(int(x) * itemsize) for x in list(reversed(strides))[1:]]
        box = [d.cuuint32_t(int(x)) for x in reversed(desc["box"])]
        ones = [d.cuuint32_t(1)] * rank
        tmap = check(d.cuTensorMapEncodeTiled(dtype, rank, ptr, dims, byte_strides, box, ones, interleave, swizzle,
                                              l2, oob))
        return struct.pack("<16Q", *(int(x) for x in tmap.opaque))


def _tensormap_enums(desc: dict, p: dict) -> tuple:
    """The driver enums of one descriptor: data type, swizzle, interleave, L2 promotion, out-of-bounds fill."""
    d = driver()
    element = dtypes.BY_NAME[p["dtype"]]
    return (getattr(d.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{element.tma}"),
            getattr(d.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{_TMA_SWIZZLE[desc['swizzle']]}"),
            d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(d.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_L2_{l2_promotion(desc, element)}B"),
            d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)


def l2_promotion(desc: dict, element: dtypes.DType) -> int:
    """The bytes L2 fetches from DRAM for a descriptor's miss: a box row's width, 64 to 256. Wider, L2 also fetches
    bytes beside the box that this copy does not read: a matmul's 128-byte k-slices (64 bf16) promoted to 256 bytes
    ran 256x512x65536 (split-K, L2-bound) 3% slower than at 128 or 64 on an H200; the other shapes measured alike."""
    row = desc["box"][-1] * element.itemsize
    return 256 if row >= 256 else 128 if row >= 128 else 64


def tensormap_arguments(params: Sequence[dict], desc: dict) -> tuple:
    """One TMA descriptor as the C launcher's Plan takes it: (the tensor parameter's index among the runtime
    parameters, data type, swizzle, interleave, L2 promotion, out-of-bounds fill, box (outermost first),
    element size in bytes): the arguments TensorMaps._encode gives cuTensorMapEncodeTiled."""
    p = params[desc["param"]]
    return (desc["param"], *(int(e) for e in _tensormap_enums(desc, p)), tuple(int(b) for b in desc["box"]),
            dtypes.BY_NAME[p["dtype"]].itemsize)

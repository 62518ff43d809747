"""A stand-in GPU for launch tests on machines without one: the C launcher's stub driver reports each launch
(its function, grid, block, stream, cluster and packed parameter buffer) instead of calling libcuda, the
cuda-python launcher records its values, and torch's device queries answer as for one Hopper GPU. Kernels
compile for real (sm_90a); CPU tensors stand for cuda:0 tensors (their key says device -1 in both paths)."""
from __future__ import annotations

import ctypes
import dataclasses
import struct

import pytest

torch = pytest.importorskip("torch")

FUNCTION = 0x5EED


@dataclasses.dataclass
class Launch:
    path: str  # "c" or "python"
    grid: tuple
    threads: int
    smem: int
    cluster: tuple
    values: tuple  # the kernel parameters, unpacked with the kernel's own struct layout (descriptors as bytes)
    function: int = 0  # the compiled kernel's handle: one per specialization (constexprs included)


class StubGPU:
    def __init__(self, monkeypatch, c_launcher: bool = True):
        from mgjit import fastlaunch, launch, runtime
        self.launches: list[Launch] = []
        self.misses = 0
        self.capturing = False
        self.record = True  # False: the Python path's launches return at once (timing)
        self.layouts: dict[int, struct.Struct] = {}  # function handle -> its kernel's parameter layout
        self.module = fastlaunch.module() if c_launcher else None
        if self.module is not None:
            self.module.use_stub_driver(self._c_launch)
        monkeypatch.setattr(fastlaunch, "load", lambda: self.module)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: self.capturing)
        monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
        monkeypatch.setattr(launch, "launch_device", lambda name, names, values: 0)
        monkeypatch.setattr(runtime, "ensure_context", lambda device: 0)
        stub = self

        def function(launcher, device):
            handle = launcher.__dict__.setdefault("stub_handle", FUNCTION + len(stub.layouts))
            stub.layouts[handle] = launcher.packer
            return handle

        monkeypatch.setattr(runtime.Launcher, "function", function)
        monkeypatch.setattr(runtime, "_driver", _Driver(runtime.driver(), self))
        from mgjit import jit
        original = jit.Kernel._miss

        def counting_miss(kernel, *args):
            stub.misses += 1
            return original(kernel, *args)

        monkeypatch.setattr(jit.Kernel, "_miss", counting_miss)

    def _c_launch(self, function, grid, threads, smem, stream, cluster, buffer) -> int:
        assert stream == 0
        packer = self.layouts[function]
        values = packer.unpack_from(buffer.ljust(packer.size, b"\0"))
        self.launches.append(Launch("c", grid, threads, smem, cluster, values, function))
        return 0


class _Driver:
    """cuda.bindings.driver with its launches recorded (the Python path's buffer read back through its pointers)."""

    def __init__(self, real, stub: StubGPU):
        self.real, self.stub = real, stub

    def __getattr__(self, name):
        return getattr(self.real, name)

    def _record(self, f, grid, threads, smem, stream, cluster, pointers) -> tuple:
        if not self.stub.record:
            return (self.real.CUresult.CUDA_SUCCESS,)
        assert int(stream) == 0
        packer = self.stub.layouts[int(f)]
        base = ctypes.c_void_p.from_address(pointers).value
        values = packer.unpack(ctypes.string_at(base, packer.size))
        self.stub.launches.append(Launch("python", tuple(grid), threads, smem, tuple(cluster), values, int(f)))
        return (self.real.CUresult.CUDA_SUCCESS,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, pointers, extra):
        return self._record(f, (gx, gy, gz), bx, smem, stream, (1, 1, 1), pointers)

    def cuLaunchKernelEx(self, config, f, pointers, extra):
        dim = config.attrs[0].value.clusterDim
        return self._record(f, (config.gridDimX, config.gridDimY, config.gridDimZ), config.blockDimX,
                            config.sharedMemBytes, config.hStream, (dim.x, dim.y, dim.z), pointers)


def tensor_values(t) -> tuple:
    """What a launch passes for a tensor: its address, sizes and strides (abi.param_fields)."""
    return (t.data_ptr(), *t.shape, *t.stride())

"""What the examples ask of the GPU they launch on, asked once per device, and the zeroed scratch their kernels
share across launches."""
from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any

import mgjit


@functools.lru_cache(maxsize=None)
def sm_count(device: int | None) -> int:
    """The SMs of CUDA device `device` (an index): the grids of persistent kernels are sized by it. None (tensors
    off the GPU: the interpreter, the PTX simulator): 2, so that a grid smaller than the work makes each program
    loop."""
    if device is None:
        return 2
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count


def current_stream(device) -> int:
    """The current stream of a device (0 off CUDA), as a raw handle: no torch.cuda.Stream object per call."""
    import torch
    return torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0


_KEPT: dict[Hashable, tuple] = {}


def kept_zero(key: Hashable, shapes: Sequence[tuple[tuple[int, ...], Any]], device) -> tuple:
    """Tensors of at least these (shape, dtype)s on `device`, zero when made, that the launches under `key` share
    and leave zero (a fix-up's locks and counters; the key names the kernel, the device and the current stream:
    launches on one stream never overlap, launches on two may). Made at the first call, and again, each dimension
    the larger of what was and what is asked, when a call needs more; outside torch.compile's CUDA-graph pools
    (mgjit.outside_graph_pools), as they are kept across calls."""
    import torch
    have = _KEPT.get(key)
    if have is not None and all(len(t.shape) == len(shape) and all(a >= b for a, b in zip(t.shape, shape))
                                for t, (shape, _) in zip(have, shapes)):
        return have
    if have is not None:
        shapes = [(tuple(max(a, b) for a, b in zip(t.shape, shape)), dtype) for t, (shape, dtype) in zip(have, shapes)]
        if device.type == "cuda":  # freed once the caller's stream is done with them
            for t in have:
                t.record_stream(torch.cuda.current_stream(device))
    made = _KEPT[key] = mgjit.outside_graph_pools(
        lambda: tuple(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in shapes), device)
    return made


def kept(key: Hashable) -> tuple | None:
    """The tensors `kept_zero` keeps under `key` now (None before its first call)."""
    return _KEPT.get(key)

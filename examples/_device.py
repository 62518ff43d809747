"""What the examples ask of the GPU they launch on, asked once per device."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def sm_count(device: int | None) -> int:
    """The SMs of CUDA device `device` (an index): the grids of persistent kernels are sized by it. None (tensors
    off the GPU: the interpreter, the PTX simulator): 2, so that a grid smaller than the work makes each program
    loop."""
    if device is None:
        return 2
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count

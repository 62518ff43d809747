"""What the examples ask of the GPU they launch on, asked once per device."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def sm_count(device: int) -> int:
    """The SMs of CUDA device `device` (an index): the grids of persistent kernels are sized by it."""
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count

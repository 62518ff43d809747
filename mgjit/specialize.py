"""What a launch fixes about each runtime argument: the specialization a kernel is compiled for."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """What a launch fixed about a tensor argument (part of the cache key)."""

    align: int  # bytes (power of two <= 16) dividing the base address and every non-last stride in bytes
    unit_stride: bool  # the last dimension is contiguous
    size_div: int  # power of two <= 16 dividing the last dimension's size

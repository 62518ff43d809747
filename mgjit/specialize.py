"""What a launch fixes about each runtime argument, as typed records.

A call computes a cheap dispatch key from its arguments (`argument_key`, one part per argument); the
specialization a kernel is compiled for is derived from that key (`from_key`), never from the arguments
directly, so a launch plan is always compiled from exactly what its key records. A tensor is specialized on
its dtype, rank, the alignment of its base and row strides, whether its last dimension is contiguous and the
power-of-two divisor of its last size (these decide 16-byte vector access and TMA); an int on whether it fits
in 32 bits and whether it is a multiple of 16; floats and bools by kind. Sizes are runtime values.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from . import deps, dtypes, ir
from .dtypes import DType
from .errors import LaunchError

# The largest power of two <= 16 dividing i, for i in 0..15 (0 stands for a multiple of 16).
DIV_CLASS = tuple(16 if i == 0 else (i & -i) for i in range(16))


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """What a launch fixed about a tensor argument."""

    dtype: DType
    rank: int
    align: int  # bytes (power of two <= 16) dividing the base address and every non-last stride in bytes
    unit_stride: bool  # the last dimension is contiguous
    size_div: int  # power of two <= 16 dividing the last dimension's size

    def key(self) -> tuple:
        return ("tensor", self.dtype.name, self.rank, self.align, self.unit_stride, self.size_div)

    def describe(self) -> str:
        return (f"{self.dtype.name}[rank {self.rank}, align {self.align}{', unit-stride' if self.unit_stride else ''}, "
                f"last%{self.size_div}]")


@dataclasses.dataclass(frozen=True)
class ScalarSpec:
    """What a launch fixed about a scalar argument: its type and, for ints, a power of two dividing it."""

    dtype: DType
    divisor: int | None = None

    def key(self) -> tuple:
        return ("scalar", self.dtype.name, self.divisor)

    def describe(self) -> str:
        return self.dtype.mlir + (f" (%{self.divisor})" if self.divisor else "")


ArgSpec = TensorSpec | ScalarSpec


@dataclasses.dataclass(frozen=True)
class Specialization:
    """Everything one compiled kernel is specialized on, besides its source."""

    names: tuple[str, ...]  # the runtime arguments, in parameter order
    args: tuple[ArgSpec, ...]
    constexprs: tuple[tuple[str, Any], ...]  # sorted by name
    target: str
    num_warpgroups: int
    cluster: tuple[int, int, int]
    profile: bool = False  # record mgjit.trace spans into a hidden buffer (mgjit/profiler.py)

    def key_parts(self) -> tuple[tuple, bool]:
        """The parts of the cache key this specialization contributes, and whether they describe content only
        (False when a constexpr value is described by identity: see deps.describe_value)."""
        described = [(name, deps.describe_value(value)) for name, value in self.constexprs]
        constexprs = tuple((name, d) for name, (d, _) in described)
        persistent = all(p for _, (_, p) in described)
        profiled = ("profile",) if self.profile else ()  # a kernel without spans keeps the key it always had
        return (tuple(a.key() for a in self.args), constexprs, self.target, self.num_warpgroups,
                self.cluster, *profiled), persistent

    def params(self) -> list[ir.Param]:
        return [ir.Param(n, "tensor", a.dtype, a.rank) if isinstance(a, TensorSpec) else ir.Param(n, "scalar", a.dtype)
                for n, a in zip(self.names, self.args)]

    def describe(self) -> str:
        parts = [f"{n}: {a.describe()}" for n, a in zip(self.names, self.args)]
        return ", ".join(parts + [f"{k}={v!r}" for k, v in self.constexprs] + (["profiled"] if self.profile else []))


def argument_key() -> Callable[[Any, list], Any]:
    """The per-argument part of the dispatch key, as cheap as possible: for a tensor its dtype, rank,
    alignment and size-divisibility classes, unit last stride and device; for a scalar its kind and whether
    it is a multiple of 16. In the same pass it appends the argument's launch values (pointer, sizes,
    strides) to `values`, so each tensor attribute is read once per launch."""
    import torch  # the launch path's only torch dependency; imported when the first dispatcher is built
    tensor = torch.Tensor
    div = DIV_CLASS

    def key(v, values):
        t = type(v)
        if t is tensor or (t is not int and t is not float and t is not bool and isinstance(v, tensor)):
            st = v.stride()
            shape = v.shape
            bits = v.data_ptr()
            values.append(bits)
            values += shape
            values += st
            if len(st) > 1:
                isz = v.itemsize
                for s in st[:-1]:
                    bits |= s * isz
            last = shape[-1] if st else 1
            return (v.dtype, len(st), div[bits & 15], not st or st[-1] == 1 or last == 1, div[last & 15],
                    v.get_device())
        values.append(v)
        if t is int:
            return ("int", -2147483648 <= v <= 2147483647, (v & 15) == 0)
        if t is float:
            return "float"
        if t is bool:
            return "bool"
        return ("other", t)

    return key


def from_key(kernel: str, name: str, part: Any, fixed_dtype: DType | None) -> ArgSpec:
    """The specialization the compiler receives for one argument's dispatch-key part."""
    if part == "bool":
        return ScalarSpec(dtypes.bool_)
    if part == "float":
        return ScalarSpec(dtypes.float32)
    if part[0] == "int":
        _, fits_i32, multiple_of_16 = part
        return ScalarSpec(dtypes.int32 if fits_i32 else dtypes.int64, 16 if multiple_of_16 else 1)
    if part[0] == "other":
        raise LaunchError(f"argument `{name}` of {kernel} is a {part[1].__name__}; kernels take torch "
                          "tensors, ints, floats and bools (constexpr parameters take any hashable value)")
    torch_dtype, rank, align, unit, size_div, _device = part
    try:
        dtype = dtypes.from_torch(torch_dtype)
    except TypeError as e:
        raise LaunchError(f"argument `{name}` of {kernel}: {e}") from None
    if fixed_dtype is not None and dtype != fixed_dtype:
        raise LaunchError(f"argument `{name}` of {kernel} must be {fixed_dtype.name} (fixed by its annotation), "
                          f"got {dtype.name}")
    return TensorSpec(dtype, rank, align, unit, size_div)


def of_arguments(kernel: str, names: Sequence[str], values: Sequence[Any],
                 fixed_dtypes: dict[str, DType]) -> tuple[ArgSpec, ...]:
    """The specialization of a call's runtime arguments, through the same key the dispatcher computes."""
    key = argument_key()
    out = []
    for n, v in zip(names, values):
        if type(v) is int and not -2**63 <= v < 2**63:
            raise LaunchError(f"argument `{n}` = {v} does not fit in 64 bits")
        out.append(from_key(kernel, n, key(v, []), fixed_dtypes.get(n)))
    return tuple(out)

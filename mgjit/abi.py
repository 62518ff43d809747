"""The kernel-parameter ABI: how a launch's values reach the kernel. One table, followed by the lowering (the
kernel's signature), the Python launcher (a struct layout) and the C launcher (its field codes are compiled in
from `c_defines()`).

A tensor argument travels as its address, then its sizes (i32), then its strides in elements (i64), one per
dimension; a scalar as one value of its type; then come the TMA descriptors the kernel uses, 128 bytes each,
64-byte aligned, passed by value as grid constants that the kernel reads in place.
"""
from __future__ import annotations

import dataclasses
import re
import struct
from typing import Sequence

from .dtypes import DType


@dataclasses.dataclass(frozen=True)
class Field:
    """One kernel parameter slot."""

    name: str
    struct_code: str  # its `struct` format character(s)
    size: int  # bytes
    align: int  # bytes
    c_code: int  # the C launcher's code for it
    mlir: str  # the kernel parameter's MLIR type


POINTER = Field("ptr", "Q", 8, 8, 1, "!llvm.ptr<1>")
I32 = Field("i32", "i", 4, 4, 2, "i32")
I64 = Field("i64", "q", 8, 8, 3, "i64")
F32 = Field("f32", "f", 4, 4, 4, "f32")
F64 = Field("f64", "d", 8, 8, 5, "f64")
I1 = Field("i1", "?", 1, 1, 6, "i1")
TENSORMAP = Field("tensormap", "128s", 128, 64, 7,
                  "!llvm.ptr {llvm.byval = !llvm.array<128 x i8>, llvm.align = 64 : i64, nvvm.grid_constant}")
FIELDS: tuple[Field, ...] = (POINTER, I32, I64, F32, F64, I1, TENSORMAP)
_SCALARS = {f.mlir: f for f in (I32, I64, F32, F64, I1)}

# What the C launcher's packing returns besides CUresult values (which are >= 0): a value that does not fit its
# field, a layout that does not match the call's arguments, a current CUDA context other than the plan's.
C_ERRORS = {"value": -2, "layout": -3, "context": -4}


def param_fields(kind: str, dtype: DType, rank: int) -> list[Field]:
    """The fields one kernel parameter occupies: a tensor's pointer, sizes and strides, or one scalar."""
    if kind == "tensor":
        return [POINTER] + [I32] * rank + [I64] * rank
    field = _SCALARS.get(dtype.mlir)
    if field is None:
        raise ValueError(f"a {dtype.name} scalar cannot be a kernel parameter")
    return [field]


def kernel_fields(params: Sequence[tuple[str, DType, int]], tensormaps: int) -> list[Field]:
    """Every field of a kernel's parameter list, in order: its params (kind, dtype, rank), then the TMA
    descriptors."""
    fields = [f for kind, dtype, rank in params for f in param_fields(kind, dtype, rank)]
    return fields + [TENSORMAP] * tensormaps


@dataclasses.dataclass(frozen=True)
class BufferLayout:
    """Where each field lies in a launch's argument buffer."""

    struct_format: str  # for struct.pack_into, explicit padding included
    offsets: tuple[int, ...]  # byte offset of each field
    c_layout: bytes  # (code u8, offset u32) per field, little-endian: what the C launcher reads
    size: int


def buffer_layout(fields: Sequence[Field]) -> BufferLayout:
    fmt, offsets, pos, c_layout = "=", [], 0, b""
    for f in fields:
        pad = -pos % f.align
        fmt += "x" * pad + f.struct_code
        pos += pad
        offsets.append(pos)
        c_layout += struct.pack("<BI", f.c_code, pos)
        pos += f.size
    return BufferLayout(fmt, tuple(offsets), c_layout, pos)


def c_defines() -> list[str]:
    """The preprocessor definitions the C launcher is compiled with: its field codes and error returns."""
    defines = [f"-DMGJIT_FIELD_{f.name.upper()}={f.c_code}" for f in FIELDS]
    return defines + [f"-DMGJIT_E_{name.upper()}={code}" for name, code in C_ERRORS.items()]


def symbol(kernel_name: str) -> str:
    """The kernel's symbol in MLIR, PTX and the cubin, which the launcher looks up: its Python name when that is
    a plain ASCII identifier, else an ASCII spelling of it (Python allows Unicode names; PTX does not)."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", kernel_name):
        return kernel_name
    return "mgjit_" + kernel_name.encode("utf-8").hex()

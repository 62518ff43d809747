"""Element types of the kernel language, and their names in torch, MLIR and the TMA engine: one table."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DType:
    name: str
    bits: int
    kind: str  # "float", "int", "uint" or "bool"
    mlir: str  # the MLIR type spelling
    torch_name: str | None  # attribute of the torch module, None where torch has no such type
    tma: str  # the CUtensorMapDataType a TMA descriptor of this element type names (CU_TENSOR_MAP_DATA_TYPE_*)
    max_finite: float | None = None  # floats: the largest finite value (fp8 conversions saturate to it)
    # Block-scaling formats that only TMA, SMEM and the tensor cores move and read (no register arithmetic).
    storage_only: bool = False

    @property
    def itemsize(self) -> int:
        return max(self.bits // 8, 1)

    @property
    def storage_bits(self) -> int:
        """Bits one element occupies in memory (a bool is a byte)."""
        return 8 * self.itemsize

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint", "bool")

    @property
    def is_signed(self) -> bool:
        return self.kind == "int"

    @property
    def int_range(self) -> tuple[int, int]:
        """The least and the greatest value of an integer or bool dtype."""
        if self.is_signed:
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1

    def __repr__(self) -> str:
        return f"mgjit.{self.name}"


float32 = DType("float32", 32, "float", "f32", "float32", "FLOAT32", 3.4028234663852886e38)
float16 = DType("float16", 16, "float", "f16", "float16", "FLOAT16", 65504.0)
bfloat16 = DType("bfloat16", 16, "float", "bf16", "bfloat16", "BFLOAT16", 3.3895313892515355e38)
float64 = DType("float64", 64, "float", "f64", "float64", "FLOAT64", 1.7976931348623157e308)
# TMA moves bytes: fp8 and 8-bit integers travel as UINT8, int16 as UINT16 (no conversion happens).
float8_e4m3fn = DType("float8_e4m3fn", 8, "float", "f8E4M3FN", "float8_e4m3fn", "UINT8", 448.0)
float8_e5m2 = DType("float8_e5m2", 8, "float", "f8E5M2", "float8_e5m2", "UINT8", 57344.0)
int8 = DType("int8", 8, "int", "i8", "int8", "UINT8")
int16 = DType("int16", 16, "int", "i16", "int16", "UINT16")
int32 = DType("int32", 32, "int", "i32", "int32", "INT32")
int64 = DType("int64", 64, "int", "i64", "int64", "INT64")
uint8 = DType("uint8", 8, "uint", "i8", "uint8", "UINT8")
bool_ = DType("bool", 1, "bool", "i1", "bool", "UINT8")
# Block scaling (Blackwell tcgen05.mma ... block_scale): an unsigned power-of-two scale per 32 elements (mxfp8,
# OCP MX), and 4-bit e2m1 data stored two to a byte, the lower K index in the low nibble (nvfp4 takes an e4m3
# scale per 16 of them). One element of float4_e2m1fn_x2 is a pair, as in torch.
float8_e8m0fnu = DType("float8_e8m0fnu", 8, "float", "i8", "float8_e8m0fnu", "UINT8", storage_only=True)
float4_e2m1fn_x2 = DType("float4_e2m1fn_x2", 8, "float", "i8", "float4_e2m1fn_x2", "UINT8", storage_only=True)

ALL: tuple[DType, ...] = (
    float32, float16, bfloat16, float64, float8_e4m3fn, float8_e5m2,
    int8, int16, int32, int64, uint8, bool_, float8_e8m0fnu, float4_e2m1fn_x2,
)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL}


def from_torch(torch_dtype: object) -> DType:
    """The DType of a torch dtype; raises TypeError for one mgjit does not support."""
    name = str(torch_dtype).removeprefix("torch.")
    dtype = BY_NAME.get("bool" if name == "bool" else name)
    if dtype is None:
        supported = ", ".join(d.torch_name for d in ALL if d.torch_name)
        raise TypeError(f"torch dtype {torch_dtype} is not supported by mgjit (supported: {supported})")
    return dtype


def promote(a: DType, b: DType) -> DType:
    """The result type of a binary op between arrays of two dtypes (torch's rules for the types we have): the
    same whichever comes first. Types of one width that cannot hold each other meet in a wider one: float16 and
    bfloat16 in float32, the two fp8s in float16 (which holds both exactly; torch refuses them), int8 and uint8
    in int16."""
    if a == b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    if a.is_float:
        if a.bits == b.bits:
            return float32 if a.bits == 16 else float16
        return a if a.bits > b.bits else b
    if a == bool_:
        return b
    if b == bool_:
        return a
    if a.is_signed != b.is_signed:
        signed, unsigned = (a, b) if a.is_signed else (b, a)
        return signed if signed.bits > unsigned.bits else int16
    return a if a.bits > b.bits else b

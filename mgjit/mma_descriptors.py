"""Bit-field encoders for the values that describe an MMA to the tensor cores, and the shape rules they obey.

Everything here is pure integer arithmetic on frozen dataclasses, so it can be tested bit by bit without a GPU
and folded into constants by the lowering. Each field's bit range names the PTX ISA section it comes from
(section numbers are those of PTX ISA 9.1; later editions renumber chapter 9.7.16 as 9.7.17/9.7.18):

- tcgen05 instruction descriptor: 9.7.16.4.2 "Instruction descriptor", Table 42 (kinds tf32, f16, f8f6f4, i8),
  and its block-scaled form (kinds mxf8f6f4, mxf4nvf4), whose scale-factor fields take the D type's place.
- block scaling: 9.7.16.10.7 "Block Scaling", Tables 54 and 55 (scale vector sizes, types, scale factor IDs).
- tcgen05 shared memory descriptor: 9.7.16.4.1 "Shared memory descriptor" (sm_100 layout, 3-bit swizzle field).
- wgmma shared memory descriptor: 9.7.15.5.1.2.2 "Matrix Descriptor Format" (sm_90 layout, 2-bit swizzle field).
- wgmma shapes: 9.7.15.2 "Matrix Shape" of the asynchronous warpgroup-level MMA.
- swizzling: 9.7.16.10.6 "Shared Memory Layout and Swizzling" and its wgmma counterpart 9.7.15.5.1.2.

The tcgen05 MMA shape table itself (9.7.16.2.1, Table 39) is checked by `tmem_layouts.check_tcgen05_shape`,
next to the TMEM layouts whose M it decides.
"""
from __future__ import annotations

import dataclasses
import enum

from . import dtypes
from .dtypes import DType
from .layouts import LayoutError
from .tiles import swizzle as swizzle_bytes


class DescriptorError(LayoutError):
    """An MMA operand, shape or descriptor field is outside what the hardware accepts."""


class Major(enum.Enum):
    """Which dimension of an MMA operand is contiguous in shared memory.

    K-major is the untransposed form for both operands (A is M x K row-major, B is N x K row-major); MN-major
    is what the ISA calls "transpose" (9.7.16.10.1 for tcgen05, the imm-trans-a/b operands for wgmma).
    """

    K = "K"
    MN = "MN"


class Tcgen05Kind(enum.Enum):
    """The `.kind` of a dense tcgen05.mma: four without block scaling, named by their input element width, and
    two with it (mxf8f6f4: 8-bit floats; mxf4nvf4: e2m1 stored two to a byte)."""

    F16 = "f16"
    TF32 = "tf32"
    F8F6F4 = "f8f6f4"
    I8 = "i8"
    MXF8F6F4 = "mxf8f6f4"
    MXF4NVF4 = "mxf4nvf4"

    @property
    def block_scaled(self) -> bool:
        return self in (Tcgen05Kind.MXF8F6F4, Tcgen05Kind.MXF4NVF4)

    @property
    def input_bits(self) -> int:
        """Bits of one operand element in shared memory. f8f6f4 also takes 6- and 4-bit types, but shared memory
        holds each in an 8-bit container (9.7.16.10.4); mxf4nvf4's element is a byte holding two e2m1 values."""
        return {Tcgen05Kind.F16: 16, Tcgen05Kind.TF32: 32}.get(self, 8)

    @property
    def instruction_k(self) -> int:
        """K of one instruction in operand elements: 32 bytes of each input row (Table 39: K = 16, 8, 32, 32;
        mxf4nvf4's K = 64 values are 32 of its two-value elements)."""
        return 256 // self.input_bits


# Table 42 codes, per kind. The tf32 kind reads float32 storage as tf32.
_AB_CODES: dict[Tcgen05Kind, dict[DType, int]] = {
    Tcgen05Kind.F16: {dtypes.float16: 0, dtypes.bfloat16: 1},
    Tcgen05Kind.TF32: {dtypes.float32: 2},
    Tcgen05Kind.F8F6F4: {dtypes.float8_e4m3fn: 0, dtypes.float8_e5m2: 1},
    Tcgen05Kind.I8: {dtypes.uint8: 0, dtypes.int8: 1},
}
_D_CODES: dict[Tcgen05Kind, dict[DType, int]] = {
    Tcgen05Kind.F16: {dtypes.float16: 0, dtypes.float32: 1},
    Tcgen05Kind.TF32: {dtypes.float32: 1},
    Tcgen05Kind.F8F6F4: {dtypes.float16: 0, dtypes.float32: 1},
    Tcgen05Kind.I8: {dtypes.int32: 2},
}


def tcgen05_kind(dtype: DType, scale_dtype: DType | None = None) -> Tcgen05Kind:
    """The tcgen05.mma kind that multiplies operands of `dtype`, block-scaled by `scale_dtype` if given."""
    if scale_dtype is not None:
        return block_scaling(dtype, scale_dtype).kind
    for kind, codes in _AB_CODES.items():
        if dtype in codes:
            return kind
    if dtype in _SCALED_AB_CODES[Tcgen05Kind.MXF4NVF4]:
        raise DescriptorError(f"{dtype.name} operands are multiplied only with block scaling: pass a_scale= and "
                              "b_scale= (TMEM references of the scales)")
    supported = ", ".join(d.name for codes in _AB_CODES.values() for d in codes)
    raise DescriptorError(f"tcgen05.mma has no kind for operands of {dtype.name}; expected one of {supported}")


# Table 55 and the block-scaled descriptor's A/B type fields (the mxf8f6f4 codes are f8f6f4's; e2m1 is 1 under
# mxf4nvf4), and the scale type bit 23.
_SCALED_AB_CODES: dict[Tcgen05Kind, dict[DType, int]] = {
    Tcgen05Kind.MXF8F6F4: {dtypes.float8_e4m3fn: 0, dtypes.float8_e5m2: 1},
    Tcgen05Kind.MXF4NVF4: {dtypes.float4_e2m1fn_x2: 1},
}
_SCALE_CODES: dict[DType, int] = {dtypes.float8_e4m3fn: 0, dtypes.float8_e8m0fnu: 1}


@dataclasses.dataclass(frozen=True)
class BlockScaling:
    """How a block-scaled tcgen05.mma scales its operands (9.7.16.10.7): each row of A and each column of B
    is cut along K into blocks of `block` values, each multiplied by one scale of `scale_dtype`. An instruction
    reads `scales_per_instruction` consecutive scales of a row from one 32-bit TMEM word (scale_vec::1X, 2X or
    4X), starting at byte `scale_id`: the scale factor ID of its descriptor."""

    kind: Tcgen05Kind
    scale_dtype: DType
    block: int

    @property
    def values_per_element(self) -> int:
        """Values in one operand element: 2 for e2m1 pairs, else 1."""
        return 2 if self.kind is Tcgen05Kind.MXF4NVF4 else 1

    @property
    def scales_per_instruction(self) -> int:
        return self.kind.instruction_k * self.values_per_element // self.block

    @property
    def qualifier(self) -> str:
        return f"block_scale.scale_vec::{self.scales_per_instruction}X"

    def scale_word(self, k_step: int) -> tuple[int, int]:
        """For the instruction of K step `k_step`: (which 4-scale word of the row it reads, its scale ID)."""
        first = k_step * self.scales_per_instruction
        return first // 4, first % 4


def block_scaling(dtype: DType, scale_dtype: DType) -> BlockScaling:
    """The block scaling of a tcgen05.mma on `dtype` operands with `scale_dtype` scales (Table 55): mxfp8
    (e4m3/e5m2, ue8m0 per 32), mxfp4 (e2m1, ue8m0 per 32) and nvfp4 (e2m1, e4m3 per 16)."""
    if dtype in _SCALED_AB_CODES[Tcgen05Kind.MXF8F6F4] and scale_dtype == dtypes.float8_e8m0fnu:
        return BlockScaling(Tcgen05Kind.MXF8F6F4, scale_dtype, 32)
    if dtype == dtypes.float4_e2m1fn_x2 and scale_dtype in _SCALE_CODES:
        return BlockScaling(Tcgen05Kind.MXF4NVF4, scale_dtype, 32 if scale_dtype == dtypes.float8_e8m0fnu else 16)
    raise DescriptorError(f"no block-scaled tcgen05.mma multiplies {dtype.name} with {scale_dtype.name} scales; "
                          "expected float8_e4m3fn/float8_e5m2 with float8_e8m0fnu (mxfp8), or float4_e2m1fn_x2 "
                          "with float8_e8m0fnu (mxfp4) or float8_e4m3fn (nvfp4)")


def _decoded_dtype(codes: dict[DType, int], code: int, what: str, kind: Tcgen05Kind) -> DType:
    """The dtype an instruction descriptor's type field names."""
    found = [d for d, c in codes.items() if c == code]
    if not found:
        raise DescriptorError(f"{what} code {code} means nothing for kind {kind.value}")
    return found[0]


def _field(name: str, value: int, bits: int) -> int:
    if not 0 <= value < 1 << bits:
        raise DescriptorError(f"{name} = {value} does not fit its {bits}-bit field (expected 0..{(1 << bits) - 1})")
    return value


@dataclasses.dataclass(frozen=True)
class Tcgen05InstrDescriptor:
    """The 32-bit instruction descriptor of a dense tcgen05.mma (PTX ISA 9.7.16.4.2, Table 42).

    `m` and `n` are the instruction's M and N as the descriptor states them: for `.cta_group::2` that is the
    pair's M (128 or 256) and the full N. Which (M, N) a CTA group accepts is `check_tcgen05_shape`'s job;
    this class checks only what the fields can hold and which types go together.
    """

    m: int
    n: int
    a_dtype: DType
    b_dtype: DType
    d_dtype: DType
    a_major: Major = Major.K
    b_major: Major = Major.K
    negate_a: bool = False
    negate_b: bool = False
    saturate: bool = False

    def __post_init__(self):
        kind = tcgen05_kind(self.a_dtype)
        if tcgen05_kind(self.b_dtype) is not kind:
            raise DescriptorError(f"A is {self.a_dtype.name} (kind {kind.value}) but B is {self.b_dtype.name} "
                                  f"(kind {tcgen05_kind(self.b_dtype).value}); both operands need one kind")
        if kind is Tcgen05Kind.F16 and self.a_dtype != self.b_dtype:
            raise DescriptorError(f"kind f16 multiplies f16 by f16 or bf16 by bf16, got {self.a_dtype.name} "
                                  f"by {self.b_dtype.name}")
        if self.d_dtype not in _D_CODES[kind]:
            expected = ", ".join(d.name for d in _D_CODES[kind])
            raise DescriptorError(f"kind {kind.value} accumulates into {expected}, got {self.d_dtype.name}")
        if self.a_dtype == dtypes.bfloat16 and self.d_dtype != dtypes.float32:
            raise DescriptorError(f"bf16 operands accumulate into float32 only, got {self.d_dtype.name}")
        if kind is Tcgen05Kind.I8 and (self.negate_a or self.negate_b):
            raise DescriptorError("kind i8 cannot negate its operands (Table 42: No Negate = 0 only)")
        if self.saturate and kind is not Tcgen05Kind.I8:
            raise DescriptorError(f"saturation applies to kind i8 only, got kind {kind.value}")
        if self.m not in (64, 128, 256):
            raise DescriptorError(f"M must be 64, 128 or 256 (Table 39 without .ws), got {self.m}")
        if self.n % 8 or not 8 <= self.n <= 256:
            raise DescriptorError(f"N must be a multiple of 8 in 8..256 (the field holds N >> 3), got {self.n}")

    @property
    def kind(self) -> Tcgen05Kind:
        return tcgen05_kind(self.a_dtype)

    @classmethod
    def decode(cls, value: int, kind: Tcgen05Kind) -> "Tcgen05InstrDescriptor":
        """The descriptor `encode` made, read back field by field as the tensor cores read it (the kind comes
        from the instruction, not the descriptor)."""
        return cls(m=((value >> 24) & 0x1F) << 4, n=((value >> 17) & 0x3F) << 3,
                   a_dtype=_decoded_dtype(_AB_CODES[kind], (value >> 7) & 7, "A type", kind),
                   b_dtype=_decoded_dtype(_AB_CODES[kind], (value >> 10) & 7, "B type", kind),
                   d_dtype=_decoded_dtype(_D_CODES[kind], (value >> 4) & 3, "D type", kind),
                   a_major=Major.MN if value >> 15 & 1 else Major.K, b_major=Major.MN if value >> 16 & 1 else Major.K,
                   negate_a=bool(value >> 13 & 1), negate_b=bool(value >> 14 & 1), saturate=bool(value >> 3 & 1))

    def encode(self) -> int:
        kind = self.kind
        desc = 0
        # Bits 0-1 (sparsity selector) and 2 (sparsity) stay 0: dense MMA.
        desc |= int(self.saturate) << 3                              # bit 3: saturate (i8)
        desc |= _field("D type", _D_CODES[kind][self.d_dtype], 2) << 4  # bits 4-5: dtype
        # Bit 6 reserved.
        desc |= _field("A type", _AB_CODES[kind][self.a_dtype], 3) << 7   # bits 7-9: atype
        desc |= _field("B type", _AB_CODES[kind][self.b_dtype], 3) << 10  # bits 10-12: btype
        desc |= int(self.negate_a) << 13                             # bit 13: negate A
        desc |= int(self.negate_b) << 14                             # bit 14: negate B
        desc |= int(self.a_major is Major.MN) << 15                  # bit 15: transpose A
        desc |= int(self.b_major is Major.MN) << 16                  # bit 16: transpose B
        desc |= _field("N >> 3", self.n >> 3, 6) << 17               # bits 17-22: N >> 3
        # Bit 23 reserved.
        desc |= _field("M >> 4", self.m >> 4, 5) << 24               # bits 24-28: M >> 4
        # Bit 29 reserved; bits 30-31 (maximum B shift, .ws only) stay 0.
        return desc


@dataclasses.dataclass(frozen=True)
class Tcgen05ScaledInstrDescriptor:
    """The 32-bit instruction descriptor of a block-scaled tcgen05.mma (kinds mxf8f6f4, mxf4nvf4; the
    block-scaled form of Table 42). D is float32; the bits that name D's type in the dense form hold B's scale
    factor ID (4-5), bit 23 the scale type and bits 29-30 A's scale factor ID."""

    m: int
    n: int
    a_dtype: DType
    b_dtype: DType
    scale_dtype: DType
    a_major: Major = Major.K
    b_major: Major = Major.K
    a_scale_id: int = 0
    b_scale_id: int = 0

    def __post_init__(self):
        scaling = block_scaling(self.a_dtype, self.scale_dtype)
        if block_scaling(self.b_dtype, self.scale_dtype).kind is not scaling.kind:
            raise DescriptorError(f"A is {self.a_dtype.name} but B is {self.b_dtype.name}: a block-scaled MMA "
                                  "takes both operands of one kind")
        if scaling.kind is Tcgen05Kind.MXF4NVF4 and Major.MN in (self.a_major, self.b_major):
            raise DescriptorError("e2m1 operands must be K-major (stored two to a byte along K)")
        if self.m not in (128, 256):
            raise DescriptorError(f"a block-scaled MMA has M = 128 (1 CTA) or 256 (2 CTAs), got {self.m}")
        if self.n % 8 or not 8 <= self.n <= 256:
            raise DescriptorError(f"N must be a multiple of 8 in 8..256 (the field holds N >> 3), got {self.n}")
        step = scaling.scales_per_instruction
        for name, sid in (("A", self.a_scale_id), ("B", self.b_scale_id)):
            if sid not in range(0, 4, step):
                raise DescriptorError(f"{name}'s scale factor ID selects a {step}-byte part of a 32-bit word: "
                                      f"one of {list(range(0, 4, step))}, got {sid}")

    @property
    def scaling(self) -> BlockScaling:
        return block_scaling(self.a_dtype, self.scale_dtype)

    def encode(self) -> int:
        kind = self.scaling.kind
        desc = self.b_scale_id << 4                                          # bits 4-5: B scale factor ID
        desc |= _SCALED_AB_CODES[kind][self.a_dtype] << 7                    # bits 7-9: atype
        desc |= _SCALED_AB_CODES[kind][self.b_dtype] << 10                   # bits 10-12: btype
        desc |= int(self.a_major is Major.MN) << 15                          # bit 15: transpose A
        desc |= int(self.b_major is Major.MN) << 16                          # bit 16: transpose B
        desc |= _field("N >> 3", self.n >> 3, 6) << 17                       # bits 17-22: N >> 3
        desc |= _SCALE_CODES[self.scale_dtype] << 23                         # bit 23: 0 ue4m3, 1 ue8m0
        desc |= _field("M >> 4", self.m >> 4, 5) << 24                       # bits 24-28: M >> 4
        desc |= self.a_scale_id << 29                                        # bits 29-30: A scale factor ID
        # Bits 0-3 (sparsity), 13-14 (negation) and 31 (K = 96 for mxf4) stay 0.
        return desc

    @classmethod
    def decode(cls, value: int, kind: Tcgen05Kind) -> "Tcgen05ScaledInstrDescriptor":
        """The descriptor `encode` made, read back as the tensor cores read it (the kind is the instruction's)."""
        return cls(m=((value >> 24) & 0x1F) << 4, n=((value >> 17) & 0x3F) << 3,
                   a_dtype=_decoded_dtype(_SCALED_AB_CODES[kind], (value >> 7) & 7, "A type", kind),
                   b_dtype=_decoded_dtype(_SCALED_AB_CODES[kind], (value >> 10) & 7, "B type", kind),
                   scale_dtype=_decoded_dtype(_SCALE_CODES, (value >> 23) & 1, "scale type", kind),
                   a_major=Major.MN if value >> 15 & 1 else Major.K, b_major=Major.MN if value >> 16 & 1 else Major.K,
                   a_scale_id=(value >> 29) & 3, b_scale_id=(value >> 4) & 3)


class SmemSwizzle(enum.Enum):
    """The swizzle of an MMA operand in shared memory."""

    NONE = "none"
    B32 = "32B"
    B64 = "64B"
    B128 = "128B"
    B128_BASE32B = "128B with 32B atomicity"  # sm_100 only

    @property
    def bytes(self) -> int:
        """The swizzle width: the bytes of one tile row (16 for no swizzle: one core-matrix row)."""
        return {SmemSwizzle.NONE: 16, SmemSwizzle.B32: 32, SmemSwizzle.B64: 64, SmemSwizzle.B128: 128,
                SmemSwizzle.B128_BASE32B: 128}[self]

    @staticmethod
    def from_bytes(swizzle: int) -> "SmemSwizzle":
        modes = {16: SmemSwizzle.NONE, 32: SmemSwizzle.B32, 64: SmemSwizzle.B64, 128: SmemSwizzle.B128}
        if swizzle not in modes:
            raise DescriptorError(f"swizzle must be 16 (none), 32, 64 or 128 bytes, got {swizzle}")
        return modes[swizzle]


# tcgen05 (sm_100) bits 61-63, 9.7.16.4.1: values 3, 5 and 7 are invalid.
_TCGEN05_SWIZZLE_CODES = {SmemSwizzle.NONE: 0, SmemSwizzle.B128_BASE32B: 1, SmemSwizzle.B128: 2,
                          SmemSwizzle.B64: 4, SmemSwizzle.B32: 6}
# wgmma (sm_90) bits 62-63, 9.7.15.5.1.2.2; sm_90 has no 32B-atomicity mode.
_WGMMA_SWIZZLE_CODES = {SmemSwizzle.NONE: 0, SmemSwizzle.B128: 1, SmemSwizzle.B64: 2, SmemSwizzle.B32: 3}


def descriptor_address_field(byte_value: int, what: str = "address") -> int:
    """matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4, refusing values the 14-bit field would corrupt.

    Shared-memory addresses and byte offsets enter both descriptor formats this way; the low 4 bits must be
    zero (16-byte alignment) and the value must fit 18 bits (256 KiB) or the mask would silently drop bits.
    """
    if byte_value % 16:
        raise DescriptorError(f"{what} {byte_value:#x} must be 16-byte aligned")
    if not 0 <= byte_value < 1 << 18:
        raise DescriptorError(f"{what} {byte_value:#x} must be in 0..0x3fff0 to fit the 14-bit field (>> 4)")
    return (byte_value & 0x3FFFF) >> 4


@dataclasses.dataclass(frozen=True)
class SmemDescriptor:
    """The inputs of a shared-memory matrix descriptor, common to wgmma (sm_90) and tcgen05 (sm_100).

    `start_address` is the byte address in the CTA's shared window. The lowering usually knows it only at run
    time: encode with `start_address=0` for the constant part and add `descriptor_address_field(addr)`, which
    occupies bits 0-13 alone in both formats. `leading_byte_offset` and `stride_byte_offset` are the LBO and
    SBO of the canonical layouts (9.7.16.3 / 9.7.15.5.1.2.1). `base_offset` is the 3-bit phase of a swizzle
    pattern that does not start on its repeat boundary.
    """

    start_address: int
    leading_byte_offset: int
    stride_byte_offset: int
    swizzle: SmemSwizzle
    base_offset: int = 0

    def __post_init__(self):
        descriptor_address_field(self.start_address, "start address")
        descriptor_address_field(self.leading_byte_offset, "leading dimension byte offset")
        descriptor_address_field(self.stride_byte_offset, "stride dimension byte offset")
        _field("base offset", self.base_offset, 3)

    def _common(self) -> int:
        desc = descriptor_address_field(self.start_address)                    # bits 0-13: start address >> 4
        desc |= descriptor_address_field(self.leading_byte_offset) << 16      # bits 16-29: LBO >> 4
        desc |= descriptor_address_field(self.stride_byte_offset) << 32       # bits 32-45: SBO >> 4
        desc |= self.base_offset << 49                                        # bits 49-51: base offset
        return desc


def tcgen05_smem_descriptor(d: SmemDescriptor) -> int:
    """The 64-bit tcgen05 (sm_100) shared memory descriptor, PTX ISA 9.7.16.4.1.

    Bits 0-13 start address >> 4; 16-29 leading dimension byte offset >> 4 (relative mode); 32-45 stride
    dimension byte offset >> 4; 46-48 the fixed value 0b001 (what distinguishes this format from sm_90's);
    49-51 base offset; 52 leading-dimension stride mode, 0 = relative offset (the absolute-address mode is
    not used); 53-60 zero; 61-63 swizzle mode 0 none, 1 128B with 32B atomicity, 2 128B, 4 64B, 6 32B.
    """
    desc = d._common()
    desc |= 0b001 << 46
    desc |= _TCGEN05_SWIZZLE_CODES[d.swizzle] << 61
    return desc


def decode_smem_descriptor(value: int, tcgen05: bool) -> SmemDescriptor:
    """A 64-bit shared-memory descriptor (the tcgen05 format, or wgmma's) read back into its fields."""
    if tcgen05:
        if (value >> 46) & 7 != 0b001:
            raise DescriptorError(f"a tcgen05 shared memory descriptor has 0b001 in bits 46-48, got {value:#x}")
        codes, code = _TCGEN05_SWIZZLE_CODES, (value >> 61) & 7
    else:
        codes, code = _WGMMA_SWIZZLE_CODES, (value >> 62) & 3
    found = [s for s, c in codes.items() if c == code]
    if not found:
        raise DescriptorError(f"swizzle code {code} is invalid in {value:#x}")
    field = lambda shift: ((value >> shift) & 0x3FFF) << 4  # noqa: E731
    return SmemDescriptor(field(0), field(16), field(32), found[0], (value >> 49) & 7)


def operand_address(d: SmemDescriptor, major: Major, mn, k, bits: int):
    """The shared-memory byte address the tensor cores read element (mn, k) of an MMA operand from, for a
    swizzled descriptor: the canonical layouts of PTX ISA 9.7.15.5.1.2.1 (wgmma) and 9.7.16.3 (tcgen05), which
    agree. K-major: rows of `swizzle` bytes hold K, 8-row groups are SBO apart (an instruction's 32 bytes of K
    stay within one row). MN-major: rows of `swizzle` bytes hold MN, swizzle-wide MN blocks are LBO apart, K
    rows are `swizzle` bytes apart in groups of 8 that are SBO apart. The swizzle XOR then applies to the
    address itself. Without swizzle (K-major only, what tcgen05.cp reads): 8-row by 16-byte core matrices,
    SBO apart along MN and LBO apart along K. `mn` and `k` may be ints or tensors of them."""
    if d.swizzle is SmemSwizzle.NONE and major is Major.K and not d.base_offset:
        k_bytes = k * bits // 8
        return (d.start_address + (mn % 8) * 16 + (mn // 8) * d.stride_byte_offset
                + (k_bytes // 16) * d.leading_byte_offset + k_bytes % 16)
    if d.swizzle not in (SmemSwizzle.B32, SmemSwizzle.B64, SmemSwizzle.B128) or d.base_offset:
        raise DescriptorError(f"operand addressing is modelled for K-major tiles without swizzle and for "
                              f"32B/64B/128B swizzles, with base offset 0, got {d.swizzle.value} {major.value}-major, "
                              f"base offset {d.base_offset}")
    s = d.swizzle.bytes
    if major is Major.K:
        offset = (mn % 8) * s + (mn // 8) * d.stride_byte_offset + k * bits // 8
    else:
        mn_bytes = mn * bits // 8
        offset = mn_bytes % s + (mn_bytes // s) * d.leading_byte_offset + (k % 8) * s + (k // 8) * d.stride_byte_offset
    return swizzle_bytes(d.start_address + offset, s)


def wgmma_smem_descriptor(d: SmemDescriptor) -> int:
    """The 64-bit wgmma (sm_90) matrix descriptor, PTX ISA 9.7.15.5.1.2.2 "Matrix Descriptor Format".

    Bits 0-13 start address >> 4; 16-29 leading dimension byte offset >> 4; 32-45 stride dimension byte
    offset >> 4; 49-51 base offset; 62-63 swizzle mode 0 none, 1 128B, 2 64B, 3 32B; all other bits zero.
    """
    if d.swizzle not in _WGMMA_SWIZZLE_CODES:
        raise DescriptorError(f"wgmma has no {d.swizzle.value} swizzle mode; expected one of "
                              f"{', '.join(s.value for s in _WGMMA_SWIZZLE_CODES)}")
    return d._common() | _WGMMA_SWIZZLE_CODES[d.swizzle] << 62


SWIZZLES = (32, 64, 128)


def check_swizzle(swizzle: int) -> None:
    if swizzle not in SWIZZLES:
        raise DescriptorError(f"an MMA operand swizzle must be one of {SWIZZLES} bytes, got {swizzle}")


_WGMMA_D_TYPES: dict[DType, tuple[DType, ...]] = {
    dtypes.float16: (dtypes.float16, dtypes.float32),
    dtypes.bfloat16: (dtypes.float32,),
    dtypes.float32: (dtypes.float32,),  # read as tf32
    dtypes.float8_e4m3fn: (dtypes.float16, dtypes.float32),
    dtypes.float8_e5m2: (dtypes.float16, dtypes.float32),
    dtypes.int8: (dtypes.int32,),
    dtypes.uint8: (dtypes.int32,),
}


def check_wgmma_shape(m: int, n: int, k: int, ab_dtype: DType, d_dtype: DType,
                      a_major: Major = Major.K, b_major: Major = Major.K) -> None:
    """Raise DescriptorError unless one wgmma.mma_async.m{m}n{n}k{k} on these types exists (9.7.15.2).

    M is 64 (one warpgroup); K is 32 bytes of input; N is a multiple of 8 in 8..256, except that the integer
    shapes step by 16 past N = 32 (N = 8, 16, 24, 32, 48, ..., 256). Only 16-bit operands may be MN-major
    ("transpose is only supported for .f16/.bf16"), so tf32, fp8 and int8 tiles must be K-major.
    """
    if ab_dtype not in _WGMMA_D_TYPES:
        raise DescriptorError(f"wgmma has no variant for {ab_dtype.name} operands; expected one of "
                              f"{', '.join(d.name for d in _WGMMA_D_TYPES)}")
    if d_dtype not in _WGMMA_D_TYPES[ab_dtype]:
        raise DescriptorError(f"wgmma on {ab_dtype.name} accumulates into "
                              f"{', '.join(d.name for d in _WGMMA_D_TYPES[ab_dtype])}, got {d_dtype.name}")
    if m != 64:
        raise DescriptorError(f"wgmma has M = 64, got M = {m}")
    expected_k = 256 // ab_dtype.bits
    if k != expected_k:
        raise DescriptorError(f"wgmma on {ab_dtype.name} has K = {expected_k} (32 bytes), got K = {k}")
    if ab_dtype.is_int:
        if not (n in (8, 16, 24, 32) or (32 < n <= 256 and n % 16 == 0)):
            raise DescriptorError(f"integer wgmma takes N in 8, 16, 24, 32, then multiples of 16 up to 256, got {n}")
    elif n % 8 or not 8 <= n <= 256:
        raise DescriptorError(f"wgmma takes N a multiple of 8 in 8..256, got {n}")
    if ab_dtype.bits != 16 and Major.MN in (a_major, b_major):
        raise DescriptorError(f"{ab_dtype.name} wgmma operands must be K-major (only f16/bf16 may be MN-major), "
                              f"got A {a_major.value}-major, B {b_major.value}-major")

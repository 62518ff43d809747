"""MMA descriptors decoded field by field against values worked out by hand from the PTX ISA (9.1 numbering)."""
import pytest

from mgjit import dtypes
from mgjit.layouts import LayoutError
from mgjit.mma_descriptors import (
    DescriptorError, Major, SmemDescriptor, SmemSwizzle, Tcgen05InstrDescriptor, Tcgen05Kind,
    Tcgen05ScaledInstrDescriptor, block_scaling, check_swizzle, check_wgmma_shape, decode_smem_descriptor,
    descriptor_address_field, operand_address, tcgen05_kind, tcgen05_smem_descriptor, wgmma_smem_descriptor,
)

f16, bf16, f32, i32 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.int32
e4m3, e5m2, s8, u8 = dtypes.float8_e4m3fn, dtypes.float8_e5m2, dtypes.int8, dtypes.uint8
e8m0, e2m1 = dtypes.float8_e8m0fnu, dtypes.float4_e2m1fn_x2


def bits(value: int, lo: int, hi: int) -> int:
    """Bits lo..hi inclusive, as the ISA tables number them."""
    return (value >> lo) & ((1 << (hi - lo + 1)) - 1)


# --- tcgen05 instruction descriptor (9.7.16.4.2, Table 42) ------------------------------------------------------

def test_instr_descriptor_bf16_f32_m128_n256_k_major():
    desc = Tcgen05InstrDescriptor(128, 256, bf16, bf16, f32).encode()
    # By hand: dtype F32 = 1 at bit 4 (0x10); atype BF16 = 1 at bit 7 (0x80); btype BF16 = 1 at bit 10 (0x400);
    # N >> 3 = 32 at bit 17 (0x400000); M >> 4 = 8 at bit 24 (0x8000000); everything else 0.
    assert desc == 0x08400490
    assert bits(desc, 0, 1) == 0  # sparsity selector
    assert bits(desc, 2, 2) == 0  # dense
    assert bits(desc, 3, 3) == 0  # no saturate
    assert bits(desc, 4, 5) == 1  # D = f32
    assert bits(desc, 6, 6) == 0  # reserved
    assert bits(desc, 7, 9) == 1  # A = bf16
    assert bits(desc, 10, 12) == 1  # B = bf16
    assert bits(desc, 13, 14) == 0  # no negation
    assert bits(desc, 15, 16) == 0  # both K-major
    assert bits(desc, 17, 22) == 256 >> 3
    assert bits(desc, 23, 23) == 0
    assert bits(desc, 24, 28) == 128 >> 4
    assert bits(desc, 29, 31) == 0  # reserved, max shift


def test_instr_descriptor_f16_accumulate_m64_transposed_negated():
    desc = Tcgen05InstrDescriptor(64, 8, f16, f16, f16, a_major=Major.MN, negate_b=True).encode()
    # D = F16 = 0, A = B = F16 = 0; negate B bit 14 (0x4000); transpose A bit 15 (0x8000);
    # N >> 3 = 1 at 17 (0x20000); M >> 4 = 4 at 24 (0x4000000).
    assert desc == 0x0402C000
    assert (bits(desc, 13, 13), bits(desc, 14, 14), bits(desc, 15, 15), bits(desc, 16, 16)) == (0, 1, 1, 0)
    assert (bits(desc, 17, 22), bits(desc, 24, 28)) == (1, 4)


@pytest.mark.parametrize("args,kwargs,expected", [
    # e4m3 x e5m2 -> f32, 2-CTA M=256 N=16: dtype 1 (0x10), atype 0, btype E5M2 = 1 at 10 (0x400),
    # N >> 3 = 2 at 17 (0x40000), M >> 4 = 16 at 24 (0x10000000).
    ((256, 16, e4m3, e5m2, f32), {}, 0x10040410),
    # tf32 (float32 storage) -> f32, M=128 N=64, B MN-major: atype/btype TF32 = 2 (0x100, 0x800), dtype 1 (0x10),
    # transpose B bit 16 (0x10000), N >> 3 = 8 at 17 (0x100000), M >> 4 = 8 at 24 (0x8000000).
    ((128, 64, f32, f32, f32), {"b_major": Major.MN}, 0x08110910),
    # s8 x u8 -> s32 saturating, M=128 N=32: saturate bit 3 (0x8), dtype S32 = 2 (0x20), atype signed = 1 (0x80),
    # btype unsigned = 0, N >> 3 = 4 at 17 (0x80000), M >> 4 = 8 at 24 (0x8000000).
    ((128, 32, s8, u8, i32), {"saturate": True}, 0x080800A8),
    # e5m2 -> f16, negate A bit 13 (0x2000): atype = btype = 1 (0x80, 0x400), dtype F16 = 0, N = 128, M = 128.
    ((128, 128, e5m2, e5m2, f16), {"negate_a": True}, 0x08202480),
])
def test_instr_descriptor_other_kinds(args, kwargs, expected):
    assert Tcgen05InstrDescriptor(*args, **kwargs).encode() == expected


@pytest.mark.parametrize("args,kwargs,message", [
    ((128, 128, bf16, f16, f32), {}, "f16 by f16 or bf16 by bf16, got bfloat16 by float16"),
    ((128, 128, bf16, bf16, f16), {}, "bf16 operands accumulate into float32 only, got float16"),
    ((128, 128, e4m3, bf16, f32), {}, "kind f8f6f4.*kind f16.*one kind"),
    ((128, 128, s8, s8, f32), {}, "kind i8 accumulates into int32, got float32"),
    ((128, 128, f32, f32, f16), {}, "kind tf32 accumulates into float32, got float16"),
    ((128, 128, dtypes.int16, dtypes.int16, i32), {}, "no kind for operands of int16"),
    ((128, 128, s8, s8, i32), {"negate_a": True}, "i8 cannot negate"),
    ((128, 128, f16, f16, f32), {"saturate": True}, "saturation applies to kind i8 only, got kind f16"),
    ((96, 128, f16, f16, f32), {}, "M must be 64, 128 or 256.*got 96"),
    ((128, 12, f16, f16, f32), {}, "N must be a multiple of 8 in 8..256.*got 12"),
    ((128, 264, f16, f16, f32), {}, "got 264"),
])
def test_instr_descriptor_rejects(args, kwargs, message):
    with pytest.raises(DescriptorError, match=message):
        Tcgen05InstrDescriptor(*args, **kwargs)
    assert issubclass(DescriptorError, LayoutError)


def test_kinds():
    assert [tcgen05_kind(d) for d in (f16, bf16, f32, e4m3, e5m2, s8, u8)] == [
        Tcgen05Kind.F16, Tcgen05Kind.F16, Tcgen05Kind.TF32, Tcgen05Kind.F8F6F4, Tcgen05Kind.F8F6F4,
        Tcgen05Kind.I8, Tcgen05Kind.I8]
    # K is 32 bytes of input per instruction (Table 39); an mxf4nvf4 element is a byte of two e2m1 values.
    assert {k: k.instruction_k for k in Tcgen05Kind} == {
        Tcgen05Kind.F16: 16, Tcgen05Kind.TF32: 8, Tcgen05Kind.F8F6F4: 32, Tcgen05Kind.I8: 32,
        Tcgen05Kind.MXF8F6F4: 32, Tcgen05Kind.MXF4NVF4: 32}
    assert [k for k in Tcgen05Kind if k.block_scaled] == [Tcgen05Kind.MXF8F6F4, Tcgen05Kind.MXF4NVF4]
    with pytest.raises(DescriptorError, match="only with block scaling"):
        tcgen05_kind(e2m1)


# --- block scaling (9.7.16.10.7, Tables 54 and 55) and the block-scaled instruction descriptor ----------------

def test_block_scalings():
    """mxfp8: one ue8m0 scale per 32 values, K = 32 per instruction, so .scale_vec::1X and the four instructions
    of a word take bytes 0, 1, 2, 3 (scale factor ID = byte). mxfp4: ue8m0 per 32 over K = 64: 2X, IDs 0 and 2.
    nvfp4: e4m3 per 16 over K = 64: 4X, ID 0, one word per instruction."""
    mx8 = block_scaling(e4m3, e8m0)
    assert (mx8.kind, mx8.block, mx8.scales_per_instruction, mx8.qualifier) == (
        Tcgen05Kind.MXF8F6F4, 32, 1, "block_scale.scale_vec::1X")
    assert [mx8.scale_word(k) for k in range(6)] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    assert block_scaling(e5m2, e8m0).kind is Tcgen05Kind.MXF8F6F4
    mx4 = block_scaling(e2m1, e8m0)
    assert (mx4.kind, mx4.block, mx4.values_per_element, mx4.qualifier) == (
        Tcgen05Kind.MXF4NVF4, 32, 2, "block_scale.scale_vec::2X")
    assert [mx4.scale_word(k) for k in range(4)] == [(0, 0), (0, 2), (1, 0), (1, 2)]
    nv4 = block_scaling(e2m1, e4m3)
    assert (nv4.block, nv4.qualifier) == (16, "block_scale.scale_vec::4X")
    assert [nv4.scale_word(k) for k in range(3)] == [(0, 0), (1, 0), (2, 0)]
    for a, scale in ((e4m3, e4m3), (bf16, e8m0), (e2m1, bf16)):
        with pytest.raises(DescriptorError, match="no block-scaled tcgen05.mma multiplies"):
            block_scaling(a, scale)


@pytest.mark.parametrize("args,kwargs,expected", [
    # mxfp8, M = 128, N = 256: B scale ID 1 at bits 4-5 (0x10), e4m3 = 0 in both type fields, N >> 3 = 32 at
    # 17 (0x400000), ue8m0 = 1 at bit 23 (0x800000), M >> 4 = 8 at 24 (0x8000000), A scale ID 2 at 29.
    ((128, 256, e4m3, e4m3, e8m0), {"a_scale_id": 2, "b_scale_id": 1}, 0x48C00010),
    # e5m2 = 1 (0x80, 0x400), B MN-major (bit 16), N = 64 (8 << 17), M = 256 (16 << 24), IDs 3 and 0.
    ((256, 64, e5m2, e5m2, e8m0), {"b_major": Major.MN, "a_scale_id": 3}, 0x70910480),
    # nvfp4: e2m1 = 1 under mxf4nvf4, ue4m3 = 0 at bit 23, N = 128 (16 << 17), M = 256.
    ((256, 128, e2m1, e2m1, e4m3), {}, 0x10200480),
])
def test_scaled_instr_descriptor(args, kwargs, expected):
    desc = Tcgen05ScaledInstrDescriptor(*args, **kwargs)
    assert desc.encode() == expected
    assert bits(expected, 17, 22) << 3 == args[1] and bits(expected, 24, 28) << 4 == args[0]
    assert Tcgen05ScaledInstrDescriptor.decode(expected, desc.scaling.kind) == desc


@pytest.mark.parametrize("args,kwargs,message", [
    ((128, 128, e2m1, e2m1, e4m3), {"a_major": Major.MN}, "e2m1 operands must be K-major"),
    ((64, 128, e4m3, e4m3, e8m0), {}, "M = 128 .* or 256 .*got 64"),
    ((128, 128, e2m1, e2m1, e4m3), {"a_scale_id": 1}, "4-byte part .* one of \\[0\\], got 1"),
    ((128, 128, e2m1, e2m1, e8m0), {"b_scale_id": 1}, "one of \\[0, 2\\], got 1"),
    ((128, 128, e4m3, e2m1, e8m0), {}, "one kind"),
    ((128, 12, e4m3, e4m3, e8m0), {}, "multiple of 8"),
])
def test_scaled_instr_descriptor_rejects(args, kwargs, message):
    with pytest.raises(DescriptorError, match=message):
        Tcgen05ScaledInstrDescriptor(*args, **kwargs)


# --- shared memory descriptors ---------------------------------------------------------------------------

# A K-major tile at 0x1000 with LBO 16 and SBO 1024 (8 rows of 128 bytes): start >> 4 = 0x100 in bits 0-13,
# LBO >> 4 = 1 in bits 16-29, SBO >> 4 = 64 in bits 32-45.
FIELDS = 0x100 | 1 << 16 | 64 << 32


@pytest.mark.parametrize("swizzle,code", [
    # 9.7.16.4.1, bits 61-63: 0 none, 1 128B with 32B atomicity, 2 128B, 4 64B, 6 32B.
    (SmemSwizzle.NONE, 0), (SmemSwizzle.B128_BASE32B, 1), (SmemSwizzle.B128, 2), (SmemSwizzle.B64, 4),
    (SmemSwizzle.B32, 6),
])
def test_tcgen05_smem_descriptor(swizzle, code):
    desc = tcgen05_smem_descriptor(SmemDescriptor(0x1000, 16, 1024, swizzle))
    assert desc == FIELDS | 0b001 << 46 | code << 61
    assert bits(desc, 0, 13) == 0x1000 >> 4
    assert bits(desc, 14, 15) == 0
    assert bits(desc, 16, 29) == 16 >> 4
    assert bits(desc, 30, 31) == 0
    assert bits(desc, 32, 45) == 1024 >> 4
    assert bits(desc, 46, 48) == 0b001  # the sm_100 descriptor's fixed "version" bits
    assert bits(desc, 49, 51) == 0  # base offset
    assert bits(desc, 52, 52) == 0  # relative leading-dimension offset
    assert bits(desc, 53, 60) == 0
    assert bits(desc, 61, 63) == code


def test_tcgen05_smem_descriptor_worked_values():
    # 128B swizzle: 0x4000_4040_0001_0100 = 2 << 61 | 1 << 46 | 64 << 32 | 1 << 16 | 0x100.
    assert tcgen05_smem_descriptor(SmemDescriptor(0x1000, 16, 1024, SmemSwizzle.B128)) == 0x4000404000010100
    assert tcgen05_smem_descriptor(SmemDescriptor(0x1000, 16, 1024, SmemSwizzle.B32)) == 0xC000404000010100
    desc = tcgen05_smem_descriptor(SmemDescriptor(0x3FFF0, 0x3FFF0, 0x3FFF0, SmemSwizzle.B64, base_offset=5))
    assert (bits(desc, 0, 13), bits(desc, 16, 29), bits(desc, 32, 45), bits(desc, 49, 51)) == (0x3FFF,) * 3 + (5,)


@pytest.mark.parametrize("swizzle,code", [
    # 9.7.15.5.1.2.2, bits 62-63: 0 none, 1 128B, 2 64B, 3 32B.
    (SmemSwizzle.NONE, 0), (SmemSwizzle.B128, 1), (SmemSwizzle.B64, 2), (SmemSwizzle.B32, 3),
])
def test_wgmma_smem_descriptor(swizzle, code):
    desc = wgmma_smem_descriptor(SmemDescriptor(0x1000, 16, 1024, swizzle, base_offset=3))
    assert desc == FIELDS | 3 << 49 | code << 62
    assert bits(desc, 0, 13) == 0x100
    assert bits(desc, 16, 29) == 1
    assert bits(desc, 32, 45) == 64
    assert bits(desc, 46, 48) == 0  # no version bits on sm_90
    assert bits(desc, 49, 51) == 3
    assert bits(desc, 52, 61) == 0
    assert bits(desc, 62, 63) == code


def test_wgmma_smem_descriptor_worked_value():
    # 128B swizzle: 1 << 62 | 64 << 32 | 1 << 16 | 0x100.
    assert wgmma_smem_descriptor(SmemDescriptor(0x1000, 16, 1024, SmemSwizzle.B128)) == 0x4000004000010100


def test_runtime_address_adds_into_constant_descriptor():
    constant = tcgen05_smem_descriptor(SmemDescriptor(0, 16, 1024, SmemSwizzle.B128))
    full = tcgen05_smem_descriptor(SmemDescriptor(0x2A40, 16, 1024, SmemSwizzle.B128))
    assert constant + descriptor_address_field(0x2A40) == full


@pytest.mark.parametrize("args,kwargs,message", [
    ((0x1008, 16, 1024, SmemSwizzle.B128), {}, "start address 0x1008 must be 16-byte aligned"),
    ((0x40000, 16, 1024, SmemSwizzle.B128), {}, "start address 0x40000 must be in 0..0x3fff0"),
    ((0x1000, 8, 1024, SmemSwizzle.B128), {}, "leading dimension byte offset 0x8 must be 16-byte aligned"),
    ((0x1000, 16, -16, SmemSwizzle.B128), {}, "stride dimension byte offset"),
    ((0x1000, 16, 1024, SmemSwizzle.B128), {"base_offset": 8}, "base offset = 8 does not fit its 3-bit field"),
])
def test_smem_descriptor_rejects(args, kwargs, message):
    with pytest.raises(DescriptorError, match=message):
        SmemDescriptor(*args, **kwargs)


def test_wgmma_has_no_32b_atomicity_mode():
    with pytest.raises(DescriptorError, match="wgmma has no 128B with 32B atomicity swizzle mode"):
        wgmma_smem_descriptor(SmemDescriptor(0x1000, 16, 1024, SmemSwizzle.B128_BASE32B))


def test_swizzle_from_bytes():
    assert [SmemSwizzle.from_bytes(b) for b in (16, 32, 64, 128)] == [
        SmemSwizzle.NONE, SmemSwizzle.B32, SmemSwizzle.B64, SmemSwizzle.B128]
    with pytest.raises(DescriptorError, match="got 256"):
        SmemSwizzle.from_bytes(256)


# --- swizzling -------------------------------------------------------------------------------------------

def test_swizzle_widths():
    for good in (32, 64, 128):
        check_swizzle(good)
    for bad in (0, 16, 96, 256):
        with pytest.raises(DescriptorError, match=f"one of \\(32, 64, 128\\) bytes, got {bad}"):
            check_swizzle(bad)


# --- wgmma shapes (9.7.15.2) ------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k,ab,d,a_major,b_major", [
    (64, 256, 16, bf16, f32, Major.K, Major.K),
    (64, 8, 16, f16, f16, Major.MN, Major.MN),  # 16-bit operands may be MN-major
    (64, 128, 8, f32, f32, Major.K, Major.K),  # tf32
    (64, 200, 32, e4m3, f32, Major.K, Major.K),
    (64, 24, 32, e5m2, f16, Major.K, Major.K),
    (64, 24, 32, s8, i32, Major.K, Major.K),
    (64, 48, 32, u8, i32, Major.K, Major.K),
])
def test_wgmma_valid_shapes(m, n, k, ab, d, a_major, b_major):
    check_wgmma_shape(m, n, k, ab, d, a_major, b_major)


@pytest.mark.parametrize("m,n,k,ab,d,a_major,b_major,message", [
    (128, 64, 16, bf16, f32, Major.K, Major.K, "M = 64, got M = 128"),
    (64, 264, 16, bf16, f32, Major.K, Major.K, "multiple of 8 in 8..256, got 264"),
    (64, 12, 16, f16, f32, Major.K, Major.K, "got 12"),
    (64, 64, 32, bf16, f32, Major.K, Major.K, r"K = 16 \(32 bytes\), got K = 32"),
    (64, 64, 16, e4m3, f32, Major.K, Major.K, "K = 32"),
    (64, 40, 32, s8, i32, Major.K, Major.K, "then multiples of 16 up to 256, got 40"),
    (64, 64, 32, e4m3, f32, Major.K, Major.MN, "float8_e4m3fn wgmma operands must be K-major.*B MN-major"),
    (64, 64, 8, f32, f32, Major.MN, Major.K, "float32 wgmma operands must be K-major"),
    (64, 64, 16, bf16, f16, Major.K, Major.K, "accumulates into float32, got float16"),
    (64, 64, 16, dtypes.int16, i32, Major.K, Major.K, "no variant for int16"),
])
def test_wgmma_invalid_shapes(m, n, k, ab, d, a_major, b_major, message):
    with pytest.raises(DescriptorError, match=message):
        check_wgmma_shape(m, n, k, ab, d, a_major, b_major)


# --- decoding, and the tensor cores' addressing ----------------------------------------------------------------

@pytest.mark.parametrize("desc", [
    Tcgen05InstrDescriptor(128, 256, bf16, bf16, f32), Tcgen05InstrDescriptor(64, 8, f16, f16, f16, Major.MN,
                                                                              Major.MN, negate_a=True),
    Tcgen05InstrDescriptor(256, 128, e5m2, e4m3, f32, b_major=Major.MN), Tcgen05InstrDescriptor(128, 64, f32, f32, f32),
    Tcgen05InstrDescriptor(128, 32, s8, u8, i32, saturate=True)])
def test_instr_descriptor_decodes_to_itself(desc):
    assert Tcgen05InstrDescriptor.decode(desc.encode(), desc.kind) == desc


@pytest.mark.parametrize("swizzle", [SmemSwizzle.B32, SmemSwizzle.B64, SmemSwizzle.B128])
def test_smem_descriptors_decode_to_themselves(swizzle):
    d = SmemDescriptor(0x2A40, 0x4000, 1024, swizzle, base_offset=0)
    assert decode_smem_descriptor(tcgen05_smem_descriptor(d), tcgen05=True) == d
    assert decode_smem_descriptor(wgmma_smem_descriptor(d), tcgen05=False) == d
    with pytest.raises(DescriptorError, match="0b001 in bits 46-48"):
        decode_smem_descriptor(wgmma_smem_descriptor(d), tcgen05=True)


@pytest.mark.parametrize("swizzle", [32, 64, 128])
@pytest.mark.parametrize("dtype", [bf16, f32, e4m3])
@pytest.mark.parametrize("k_major", [True, False])
def test_operand_addresses_read_what_the_tile_stores(swizzle, dtype, k_major):
    """An MMA instruction's operand block, read through its descriptor, is exactly the tile's elements where
    tiles.Tile stores them (what TMA boxes and SMEM stores write): for every K step and operand block."""
    import torch

    from mgjit.ir import RefType
    from mgjit.ops.smem import descriptor_fields, tile_of
    k_step = 256 // dtype.bits
    block = swizzle * 8 // dtype.bits  # elements per swizzle row
    # Two column blocks along the contiguous dimension: K for a K-major tile, MN for an MN-major one.
    mn, k = (64, 2 * block) if k_major else (2 * block, 2 * k_step)
    t = RefType("smem", dtype, 2, (mn, k) if k_major else (k, mn), swizzle)
    tile = tile_of(t)
    base = 3 * 1024
    for mn0 in range(0, mn, 64 if k_major else block):
        for k0 in range(0, k, k_step):
            byte, fields = descriptor_fields(t, mn0, k0, k_major)
            d = SmemDescriptor(base + byte, fields.leading_byte_offset, fields.stride_byte_offset, fields.swizzle)
            rows = 64 if k_major else block
            i = torch.arange(rows)[:, None]
            j = torch.arange(k_step)[None, :]
            got = operand_address(d, Major.K if k_major else Major.MN, i, j, dtype.bits)
            stored = tile.offset(mn0 + i, k0 + j) if k_major else tile.offset(k0 + j, mn0 + i)
            assert torch.equal(got, base + stored)

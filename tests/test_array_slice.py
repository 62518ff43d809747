"""Static slices of register arrays (`x[a:b, c:d]`, ops/arrays.ArraySlice): on whole tiles of the operand's layout
a slice selects registers (a wgmma accumulator's 64-column chunks), off them it goes through SMEM; both against
torch, from the interpreter and from the sm_90a PTX on the simulator (tests/ptx_sim.py)."""
import sys
from pathlib import Path

import pytest
import torch

import mgjit
from mgjit import ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402

BF16 = torch.bfloat16


@mgjit.kernel
def accumulator_chunks(a, b, out, BN: mgjit.constexpr, CHUNK: mgjit.constexpr, ROWS: mgjit.constexpr):
    """out = a @ b, stored a (64, CHUNK) chunk of the accumulator at a time, the chunks in reverse order."""
    a_s = mgjit.smem((ROWS, 64), a.dtype, swizzle=128)
    b_s = mgjit.smem((64, BN), b.dtype, swizzle=128)
    bar = mgjit.barrier(1, arrivals=2)
    mgjit.copy_async(a, (0, 0), a_s, barrier=bar[0])
    mgjit.copy_async(b, (0, 0), b_s, barrier=bar[0])
    bar[0].wait()
    acc = mgjit.wgmma(mgjit.zeros((ROWS, BN), mgjit.float32), a_s, b_s)
    mgjit.wgmma_wait(0)
    for r in mgjit.static_range(ROWS // 64):
        for j in mgjit.static_range(BN // CHUNK):
            c = BN // CHUNK - 1 - j
            chunk = acc[r * 64:(r + 1) * 64, c * CHUNK:(c + 1) * CHUNK]
            out[mgjit.ds(r * 64, 64), mgjit.ds(c * CHUNK, CHUNK)] = (chunk * 2.0).astype(out.dtype)


@mgjit.kernel
def blocked_slice(x, out, R0: mgjit.constexpr, R1: mgjit.constexpr, C0: mgjit.constexpr, C1: mgjit.constexpr,
                  R: mgjit.constexpr = 64, C: mgjit.constexpr = 64):
    """out = x[R0:R1, C0:C1] + 1 of an (R, C) array loaded whole."""
    v = x[mgjit.ds(0, R), mgjit.ds(0, C)]
    out[mgjit.ds(0, R1 - R0), mgjit.ds(0, C1 - C0)] = v[R0:R1, C0:C1] + 1


def simulate(kernel, args, **constexprs):
    compiled = kernel.compile(*args, **constexprs, target="sm_90a")
    dev = ptx_sim.Device()
    dev.run(compiled, (1,), *args)
    return compiled, dev


def sliced_ops(compiled) -> list:
    return [line for line in compiled.files["kernel.ir"].decode().splitlines() if "array_slice" in line]


@pytest.mark.parametrize("bn,chunk,rows", [(128, 64, 64), (128, 64, 128), (64, 32, 64), (128, 8, 64)])
def test_accumulator_chunks_are_its_registers(bn, chunk, rows):
    # small integers: every sum is exact in f32, whatever order the tensor cores add in
    a, b = torch.randint(-4, 5, (rows, 64)).to(BF16), torch.randint(-4, 5, (64, bn)).to(BF16)
    want = ((a.float() @ b.float()) * 2).to(BF16)
    out = torch.full((rows, bn), float("nan")).to(BF16)
    accumulator_chunks.interpret[(1,)](a, b, out, BN=bn, CHUNK=chunk, ROWS=rows)
    assert torch.equal(out, want)
    out = torch.full((rows, bn), float("nan")).to(BF16)
    compiled, dev = simulate(accumulator_chunks, (a, b, out), BN=bn, CHUNK=chunk, ROWS=rows)
    assert torch.equal(dev.fetch(out), want)
    assert len(sliced_ops(compiled)) == (rows // 64) * (bn // chunk)
    assert "st.shared" not in compiled.ptx  # registers selected, nothing moved through SMEM


@pytest.mark.parametrize("r0,r1,c0,c1", [(0, 32, 0, 64), (8, 40, 16, 48), (1, 2, 3, 4), (32, 64, 32, 64)])
def test_slices_of_a_loaded_array(r0, r1, c0, c1):
    x = torch.randn(64, 64)
    want = x[r0:r1, c0:c1] + 1
    out = torch.full((64, 64), float("nan"))
    blocked_slice.interpret[(1,)](x, out, R0=r0, R1=r1, C0=c0, C1=c1)
    assert torch.equal(out[:r1 - r0, :c1 - c0], want)
    out = torch.full((64, 64), float("nan"))
    _, dev = simulate(blocked_slice, (x, out), R0=r0, R1=r1, C0=c0, C1=c1)
    assert torch.equal(dev.fetch(out)[:r1 - r0, :c1 - c0], want)


@mgjit.kernel
def widened_slice(x, out, row, col):
    """The fuzzer's seed 9138: an (8, 256) window of bytes (rows not 16-byte aligned) widened to f32 and cut at
    [0:4, 91:219]."""
    v = x[mgjit.ds(row, 8), mgjit.ds(col, 256)].astype(mgjit.float32)
    out[mgjit.ds(0, 4), mgjit.ds(0, 128)] = v[0:4, 91:219] - 3.0


def test_an_off_tile_slice_whose_layout_equals_its_operands_still_moves():
    """The slice's layout, the default one of its shape, is its operand's: off the tiles, its elements are still
    other threads' (an internal KeyError, once)."""
    x = torch.randint(-100, 100, (10, 300), dtype=torch.int8)
    out = torch.full((4, 128), float("nan"))
    compiled, dev = simulate(widened_slice, (x, out, 1, 5))
    assert torch.equal(dev.fetch(out), x[1:5, 96:224].float() - 3)
    assert "st.shared" in compiled.ptx


def test_slice_keeps_a_tiled_layout_only_on_whole_tiles():
    from mgjit.layouts import WGMMA
    assert ops.arrays.slice_keeps_layout(WGMMA, (64, 256), (0, 64), (64, 64))
    assert ops.arrays.slice_keeps_layout(WGMMA, (128, 256), (64, 8), (64, 8))
    assert not ops.arrays.slice_keeps_layout(WGMMA, (64, 256), (0, 4), (64, 8))  # starts inside a tile
    assert not ops.arrays.slice_keeps_layout(WGMMA, (64, 256), (0, 0), (32, 64))  # half a tile's rows
    assert not ops.arrays.slice_keeps_layout(WGMMA, (64, 256), (0, 0), (64, 12))


@mgjit.kernel
def slice_forms(x, out):
    """Slices with open and negative bounds, and slices given a new dimension: a row, a sum of two rows, and a
    (16, 2) outer sum of a column and a row."""
    v = x[mgjit.ds(0, 64)]
    out[0, mgjit.ds(0, 16)] = v[8:24]
    out[mgjit.ds(1, 1), mgjit.ds(0, 16)] = v[:16][None, :] + v[-16:][None, :]
    out[mgjit.ds(2, 16), mgjit.ds(0, 2)] = v[32:48][:, None] + v[48:50][None, :]


@mgjit.kernel
def leading_rows(x, out):
    """out = x[2:6] of an (8, 16) array: one index for two dimensions takes whole rows."""
    out[mgjit.ds(0, 4), mgjit.ds(0, 16)] = x[mgjit.ds(0, 8), mgjit.ds(0, 16)][2:6] * 2


def test_a_slice_of_the_leading_dimension_takes_whole_rows():
    x = torch.randn(8, 16)
    out = torch.full((4, 16), float("nan"))
    leading_rows.interpret[(1,)](x, out)
    assert torch.equal(out, x[2:6] * 2)


def test_slices_mixed_with_new_dimensions():
    x = torch.randn(64)
    out = torch.full((18, 16), float("nan"))
    slice_forms.interpret[(1,)](x, out)
    assert torch.equal(out[0], x[8:24])
    assert torch.equal(out[1], x[:16] + x[-16:])
    assert torch.equal(out[2:18, :2], x[32:48][:, None] + x[48:50][None, :])
    out2 = torch.full((18, 16), float("nan"))
    _, dev = simulate(slice_forms, (x, out2))
    assert torch.equal(dev.fetch(out2)[:2], out[:2]) and torch.equal(dev.fetch(out2)[2:18, :2], out[2:18, :2])


@mgjit.kernel
def bad_slice(x, out, HOW: mgjit.constexpr):
    v = x[mgjit.ds(0, 64)]
    if HOW == "step":
        out[mgjit.ds(0, 32)] = v[0:64:2]
    elif HOW == "empty":
        out[mgjit.ds(0, 32)] = v[40:40]
    else:
        out[mgjit.ds(0, 32)] = v[0:out.shape[0]]


@pytest.mark.parametrize("how,message", [("step", "slices of step 1"), ("empty", "is empty"),
                                         ("runtime", "must be static ints")])
def test_bad_slices_are_refused_at_the_users_line(how, message):
    x = torch.zeros(64)
    with pytest.raises(mgjit.CompileError, match=message) as info:
        bad_slice.compile(x, x, HOW=how, target="sm_90a")
    assert "test_array_slice.py" in str(info.value)

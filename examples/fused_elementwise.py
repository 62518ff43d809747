"""A fused elementwise kernel: out = gelu_tanh(x) * y + z, read and written once, for tensors of any shape.

Contiguous tensors are processed as one flat range, whatever their last dimension (an odd row length does not
matter to a flat range: every 16-byte access stays aligned, only the range's end is ragged); other layouts go
through a 2D kernel over (rows, columns) windows, whose rows may start anywhere in a 32-bit word (the loads and
stores move aligned words and shift the bytes into place). The block size and window shape are autotuned per shape.
Computed in float32 (float64 tensors in float64: `_rows.wide`), rounded once at the store.

    python examples/fused_elementwise.py   # compile for sm_90a without a GPU; check against torch and time with one
"""
import math

import torch
from _rows import wide
from _rows_launch import floating, output, tuned_launch

import mgjit

BLOCK = 4096
# 8192 is left out: where the size is not a multiple of 8, the ragged end's store keeps the whole block's data
# in registers until it knows whether to store element by element (255 registers and a spill).
BLOCKS = [mgjit.Config(BLOCK=b) for b in (BLOCK, 2048, 1024)]
WINDOWS = [mgjit.Config(ROWS=r, COLS=c) for r, c in ((8, 512), (4, 1024), (16, 256))]
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
# A flat range goes to the kernel in pieces of at most this many elements: a tensor's sizes travel as 32-bit ints
# (a range of 2**31 elements or more was refused at launch), and a multiple of every BLOCK and of 16 bytes keeps
# every piece's start as aligned as the range's.
FLAT_SPAN = 2 ** 30


@mgjit.device
def gelu_tanh(v):
    return 0.5 * v * (1.0 + mgjit.tanh(SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)))


@mgjit.kernel
def fused_flat(x, y, z, out, BLOCK: mgjit.constexpr):
    i = mgjit.program_id(0) * BLOCK
    v = x[mgjit.ds(i, BLOCK)].astype(wide(x))
    r = gelu_tanh(v) * y[mgjit.ds(i, BLOCK)].astype(v.dtype) + z[mgjit.ds(i, BLOCK)].astype(v.dtype)
    out[mgjit.ds(i, BLOCK)] = r.astype(out.dtype)


@mgjit.kernel
def fused_2d(x, y, z, out, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    r0, c0 = mgjit.program_id(0) * ROWS, mgjit.program_id(1) * COLS
    w = (mgjit.ds(r0, ROWS), mgjit.ds(c0, COLS))
    v = x[w].astype(wide(x))
    out[w] = (gelu_tanh(v) * y[w].astype(v.dtype) + z[w].astype(v.dtype)).astype(out.dtype)


def fused(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(x, approximate='tanh') * y + z for tensors of one shape and dtype."""
    if not (x.shape == y.shape == z.shape and x.dtype == y.dtype == z.dtype):
        raise ValueError(f"fused takes x, y and z of one shape and dtype, got {tuple(x.shape)} {x.dtype}, "
                         f"{tuple(y.shape)} {y.dtype} and {tuple(z.shape)} {z.dtype}")
    floating("fused", x=x)
    out = output(out, x.shape, x.device, x.dtype, "fused", x=x, y=y, z=z)
    if x.numel() == 0:
        return out
    if all(t.is_contiguous() for t in (x, y, z, out)):
        flat = tuple(t.view(-1) for t in (x, y, z, out))
        for start in range(0, x.numel(), FLAT_SPAN):
            tuned_launch(fused_flat, BLOCKS, lambda n, c: (-(-n // c["BLOCK"]),),
                         tuple(t[start:start + FLAT_SPAN] for t in flat))
        return out
    x2, y2, z2, o2 = (t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t for t in (x, y, z, out))
    cols = x2.shape[1]
    tuned_launch(fused_2d, WINDOWS, lambda rows, c: (-(-rows // c["ROWS"]), -(-cols // c["COLS"])), (x2, y2, z2, o2))
    if o2.data_ptr() != out.data_ptr():
        out.copy_(o2.view(out.shape))
    return out


# ---- what the harness needs

def setup(device):
    shape = (8192, 8191)
    x, y, z = (torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(3))
    return (x, y, z), torch.empty(shape, device=device, dtype=torch.bfloat16)


def compile(x, y, z, out, target):
    flat = [t.view(-1) for t in (x, y, z, out)]
    return fused_flat.compile(*flat, BLOCK=BLOCK, target=target)


def reference(x, y, z):
    return torch.nn.functional.gelu(x.double(), approximate="tanh") * y.double() + z.double()


if __name__ == "__main__":
    from _harness import main
    main(name="fused_elementwise", setup=setup, compile=compile, run=fused, reference=reference, rtol=2e-2,
         atol=2e-2)

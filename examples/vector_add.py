"""Vector addition: the smallest mgjit kernel.

Each program (CTA, one warpgroup of 128 threads) adds one block of BLOCK elements.
`x[mgjit.ds(start, BLOCK)]` loads a window of the tensor into registers, 16 bytes per thread at a time where
the tensors allow; the ragged end of the last block needs no code, because every access is predicated on
being inside the tensor. The wrapper only chooses the grid.

    python examples/vector_add.py     # compile for sm_90a without a GPU; check against torch and time with one
"""
import torch

import mgjit

BLOCK = 2048


@mgjit.kernel
def add_kernel(x, y, out, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    out[mgjit.ds(start, BLOCK)] = x[mgjit.ds(start, BLOCK)] + y[mgjit.ds(start, BLOCK)]


def add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x + y for two 1D tensors of one shape and dtype, like torch.add."""
    if not (x.ndim == 1 and x.shape == y.shape and x.dtype == y.dtype):
        raise ValueError(f"add takes x and y 1D of one shape and dtype, got {tuple(x.shape)} {x.dtype} and "
                         f"{tuple(y.shape)} {y.dtype}")
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        # a shorter out would be written in part (each window stops at its edge), another dtype truncated
        raise ValueError(f"add: out must be {tuple(x.shape)} {x.dtype} on {x.device} like x, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    add_kernel[(triton_style_cdiv(x.numel(), BLOCK),)](x, y, out, BLOCK=BLOCK)
    return out


def triton_style_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


# ---- what the harness needs: inputs, the specialization add() launches, a reference

def setup(device):
    n = 1 << 25  # 128 MiB per float32 tensor: far larger than L2, so the timing measures HBM
    x = torch.randn(n, device=device)
    y = torch.randn(n, device=device)
    return (x, y), torch.empty_like(x)


def compile(x, y, out, target):
    return add_kernel.compile(x, y, out, BLOCK=BLOCK, target=target)


if __name__ == "__main__":
    from _harness import main
    main(name="vector_add", setup=setup, compile=compile, run=add, reference=torch.add, rtol=0, atol=0)

"""How fast an H100/H200 reads bf16 rows by the row and flat, in Triton (no mgjit): each kernel only reads a
contiguous (rows, n) tensor and sums what it read, timed against a device-to-device copy of as many bytes (1.0 =
copy bandwidth), for row lengths around 2048 and 4096.

- `rows4`: a program reads 4 rows (a [4, 2^k] block and a masked tail block of the rest);
- `rows4g`: the same with program p's rows p, p + G, p + 2G, p + 3G (G programs), so that programs running side
  by side read neighbouring rows;
- `rows1`: a program reads one row;
- `flat8k`: a program reads 8192 contiguous elements, rows ignored;
- `g_warp_row` / `g_warps_along`: `rows4` in Gluon with the row length a constexpr (accesses as wide as the rows'
  alignment allows, as mgjit's) and the layout given: each warp a row of its own (mgjit's held rows) / the four
  warps side by side along each row, 512 bytes apart (Triton's default).

Triton's row readers run 0.2 slower at row lengths that are not a multiple of 16 (2-byte loads: it cannot prove
the rows aligned); the Gluon readers, in either layout, and the flat one read 0.9-0.98 of copy bandwidth at every
length (benchmarks/RESULTS.md, forty-fourth session).

    python benchmarks/rows_reads.py
    python benchmarks/rows_reads.py --lengths 2060 2100
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.testing import do_bench

LENGTHS = (2048, 2056, 2060, 2064, 2080, 2100, 2112, 1600, 1608, 4108, 4148)
TARGET_BYTES = 256 << 20


@triton.jit
def rows_kernel(x, out, n, G, R: tl.constexpr, W: tl.constexpr, T: tl.constexpr, STRIDED: tl.constexpr):
    p = tl.program_id(0)
    if STRIDED:
        r = p + G * tl.arange(0, R)[:, None]
    else:
        r = p * R + tl.arange(0, R)[:, None]
    c = tl.arange(0, W)[None, :]
    head = tl.load(x + r * n + c).to(tl.float32)
    ct = W + tl.arange(0, T)[None, :]
    tail = tl.load(x + r * n + ct, mask=ct < n, other=0.0).to(tl.float32)
    tl.store(out + tl.reshape(r, (R,)), tl.sum(head, 1) + tl.sum(tail, 1))


@triton.jit
def flat_kernel(x, out, total, B: tl.constexpr):
    p = tl.program_id(0)
    o = p * B + tl.arange(0, B)
    tl.store(out + p, tl.sum(tl.load(x + o, mask=o < total, other=0.0).to(tl.float32), 0))


@gluon.jit
def gluon_rows_kernel(x, out, N: gl.constexpr, R: gl.constexpr, W: gl.constexpr, T: gl.constexpr,
                      layout: gl.constexpr):
    p = gl.program_id(0)
    r = p * R + gl.arange(0, R, layout=gl.SliceLayout(1, layout))
    r2 = gl.expand_dims(r, 1)
    c = gl.expand_dims(gl.arange(0, W, layout=gl.SliceLayout(0, layout)), 0)
    head = gl.load(x + r2 * N + c).to(gl.float32)
    ct = W + gl.expand_dims(gl.arange(0, T, layout=gl.SliceLayout(0, layout)), 0)
    tail = gl.load(x + r2 * N + ct, mask=(ct < N) & (r2 >= 0), other=0.0).to(gl.float32)
    gl.store(out + r, gl.sum(head, axis=1) + gl.sum(tail, axis=1))


WARP_A_ROW = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
WARPS_ALONG = gl.BlockedLayout([1, 8], [1, 32], [1, 4], [1, 0])


def median_ms(fn) -> float:
    return sorted(do_bench(fn, warmup=10, rep=40, return_mode="median") for _ in range(3))[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="*", default=LENGTHS)
    args = p.parse_args()
    for n in args.lengths:
        rows = TARGET_BYTES // (2 * n) // 16 * 16
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(rows, device="cuda")
        src = torch.empty(rows * n, dtype=torch.uint8, device="cuda")  # a copy of it moves x's bytes twice
        dst = torch.empty_like(src)
        w = 1 << (n.bit_length() - 1)
        t = max(16, 1 << (n - w - 1).bit_length()) if n > w else 16
        readers = {
            "rows4": lambda: rows_kernel[(rows // 4,)](x, out, n, rows // 4, R=4, W=w, T=t, STRIDED=False),
            "rows4g": lambda: rows_kernel[(rows // 4,)](x, out, n, rows // 4, R=4, W=w, T=t, STRIDED=True),
            "rows1": lambda: rows_kernel[(rows,)](x, out, n, rows, R=1, W=w, T=t, STRIDED=False),
            "g_warp_row": lambda: gluon_rows_kernel[(rows // 4,)](x, out, n, 4, w, t, WARP_A_ROW, num_warps=4),
            "g_warps_along": lambda: gluon_rows_kernel[(rows // 4,)](x, out, n, 4, w, t, WARPS_ALONG, num_warps=4),
            "flat8k": lambda: flat_kernel[(triton.cdiv(rows * n, 8192),)](x, out, rows * n, B=8192),
        }
        results = []
        for name, read in readers.items():
            read()
            torch.cuda.synchronize()
            results.append(f"{name} {median_ms(lambda: dst.copy_(src)) / median_ms(read):.3f}")
        print(f"{n:6}  " + "  ".join(results), flush=True)


if __name__ == "__main__":
    main()

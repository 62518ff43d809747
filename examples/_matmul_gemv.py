"""Decode matmuls with K-major weights as row reductions: c[m, n] = sum_k a[m, k] * w[n, k] for M <= 4.

A linear layer's weight is (N, K), K contiguous: each output feature is one weight row. With a handful of
activation rows (M <= 16), the weights dominate the traffic and the tensor cores have little to do, so this
kernel reads weight rows the way the row examples read rows (16-byte loads, one read of each weight), ROWS rows
per program: each program holds its rows in registers chunk by chunk (KC columns, KCH chunks unrolled) and
reduces them against each of the M activation rows (read from L2), then applies the epilogue (scale, bias,
activation) of the wgmma kernel. The chooser (examples/_matmul_schedules.py) times it beside swap-AB wgmma.

Each (chunk, activation row) pair costs one reduction across the warpgroup, and ptxas issues the loads of every
unrolled chunk up front: so M <= 4 and at most 2 chunks (K <= 16384). Past that, swap-AB wgmma serves decode
(16 activation rows in 1024-column chunks took 255 registers and spilled 1.8 KB).
"""
from __future__ import annotations

import mgjit

from _matmul_epilogue import activate

MAX_M = 4
MAX_CHUNKS = 2            # unrolled K chunks
HELD = 8192               # weight elements a 128-thread program holds at once (64 f32 a thread)


@mgjit.kernel
def gemv_kmajor(a, w, c, scale, bias, M: mgjit.constexpr, ROWS: mgjit.constexpr, KC: mgjit.constexpr,
                KCH: mgjit.constexpr, SCALED: mgjit.constexpr = False, BIAS: mgjit.constexpr = False,
                ACTIVATION: mgjit.constexpr = None):
    """c[:M, n0:n0 + ROWS] for n0 = program_id(0) * ROWS; a (M, K) in any layout, w (N, K) with unit K stride."""
    n0 = mgjit.program_id(0) * ROWS
    sums = ()
    for m in mgjit.static_range(M):
        sums = sums + (mgjit.zeros((ROWS,), mgjit.float32),)
    for kc in mgjit.static_range(KCH):
        k0 = kc * KC
        wt = w[mgjit.ds(n0, ROWS), mgjit.ds(k0, KC)].astype(mgjit.float32)  # zeros past K and N
        out = ()
        for m in mgjit.static_range(M):
            am = a[m, mgjit.ds(k0, KC)].astype(mgjit.float32)
            out = out + (sums[m] + (wt * am[None, :]).sum(axis=1),)
        sums = out
    for m in mgjit.static_range(M):
        acc = sums[m]
        if SCALED:
            acc = acc * scale[0]
        if BIAS:
            acc = acc + bias[mgjit.ds(n0, ROWS)].astype(mgjit.float32)
        acc = activate(acc, ACTIVATION)
        c[m, mgjit.ds(n0, ROWS)] = acc.astype(c.dtype)


def candidates(m: int, k: int) -> list[dict]:
    """GEMV configs for M activation rows and K columns: ROWS weight rows per program, K in chunks of KC (a power
    of two, ROWS * KC <= HELD); none past MAX_M or where K needs more than MAX_CHUNKS chunks."""
    if not 1 <= m <= MAX_M:
        return []
    out = []
    for rows in (2, 1, 4):
        kc = min(HELD // rows, 1 << max(k - 1, 0).bit_length())
        chunks = -(-k // kc)
        if chunks <= MAX_CHUNKS:
            out.append({"GEMV": True, "ROWS": rows, "KC": kc, "KCH": chunks})
    return out


def grid(n: int, cfg: dict) -> tuple[int]:
    return (-(-n // cfg["ROWS"]),)

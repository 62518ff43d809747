"""Decode matmuls on the CUDA cores for a few activation rows, one read of the weights with 16-byte loads.

A linear layer's weight is (N, K), K contiguous (K-major): each output feature is one weight row. With a handful
of activation rows (M <= 16) the weights dominate the traffic and the tensor cores have little to do. The
chooser (examples/_matmul_schedules.py) times these kernels beside swap-AB wgmma.

gemv_kmajor, c[m, n] = sum_k a[m, k] * w[n, k]: reads weight rows the way the row examples read rows, ROWS rows
per program: each program holds its rows in registers chunk by chunk (KC columns, KCH chunks unrolled) and
reduces them against each of the M activation rows (read from L2). Each (chunk, activation row) pair costs one
reduction across the warpgroup, and ptxas issues the loads of every unrolled chunk up front: so M <= 4 and at
most 2 chunks (K <= 16384). Past that, swap-AB wgmma serves decode (16 activation rows in 1024-column chunks took
255 registers and spilled 1.8 KB).

gemv_nmajor, c[m, n] = sum_k a[m, k] * b[k, n] with b (K, N), N contiguous (N-major): no row of b is an output
feature, so a program owns BN columns and a range of K instead. It walks its range in (KB, BN) tiles of b, one
16-byte vector a thread each, UNROLL tiles a loop step (their loads in flight together), and keeps one (KB, BN)
f32 accumulator per activation row that takes only FMAs (acc_m += a[m, k0:k0 + KB][:, None] * tile; the few a
values come from L1); each accumulator is reduced over its KB rows once, at the end. N = 4096 makes 32 column
blocks of 128, too few to keep 132 SMs streaming, so K is split over SPLIT programs per column block: each
publishes its partial rows in an f32 workspace and counts itself in the block's lock; the last to arrive adds
the SPLIT partials (one (SPLIT, BN) load per row, summed in a fixed order: bitwise repeatable) and stores. The
accumulators are named, not a tuple (a runtime loop carries arrays, not tuples): M <= NMAJOR_MAX_M = 8, spill-free
(200 registers at M = 8 and UNROLL = 8; 96 at M = 4 and UNROLL = 4).

Both kernels end in the wgmma kernel's epilogue (scale, bias, activation), `store_row`.
"""
from __future__ import annotations

import mgjit

from _matmul_epilogue import activate

MAX_M = 4                 # gemv_kmajor's activation rows
NMAJOR_MAX_M = 8          # gemv_nmajor's: its named accumulators
MAX_CHUNKS = 2            # gemv_kmajor's unrolled K chunks
HELD = 8192               # weight elements a 128-thread gemv_kmajor program holds at once (64 f32 a thread)
THREADS = 128             # one warpgroup per program
VECTOR = 8                # 16-bit elements in the 16 bytes one load of a thread moves
# gemv_nmajor's candidates: (BN, UNROLL, fewer), KB making each tile one 16-byte vector a thread (8 rows of 128
# bf16), K split as `nmajor_split` says, in half as many parts where `fewer` (longer ranges, a shorter fix-up).
NMAJOR_TILES = ((128, 4, False), (128, 8, False), (128, 8, True), (256, 4, False))
PROGRAMS_PER_SM = 4       # split K until about this many programs per SM stream at once
MAX_PARTIALS = 4096       # SPLIT x BN: the finishing program loads a row's SPLIT partials at once (32 f32 a thread)


@mgjit.device
def store_row(acc, c, scale, bias, m, n0, BN, SCALED, BIAS, ACTIVATION):
    """c[m, n0:n0 + BN] = act(acc * scale[0] + bias[n0:n0 + BN]) from the f32 row acc (the wgmma kernel's
    epilogue, row by row)."""
    if SCALED:
        acc = acc * scale[0]
    if BIAS:
        acc = acc + bias[mgjit.ds(n0, BN)].astype(mgjit.float32)
    acc = activate(acc, ACTIVATION)
    c[m, mgjit.ds(n0, BN)] = acc.astype(c.dtype)


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
        store_row(sums[m], c, scale, bias, m, n0, ROWS, SCALED, BIAS, ACTIVATION)


@mgjit.device
def row_fma(acc, a, m, k0, tile, KB, M):
    """acc + a[m, k0:k0 + KB][:, None] * tile for an activation row m < M; acc as it is for the unused ones."""
    if m < M:
        acc = mgjit.fma(a[m, mgjit.ds(k0, KB)].astype(mgjit.float32)[:, None], tile, acc)
    return acc


@mgjit.kernel
def gemv_nmajor(a, b, c, scale, bias, ws, locks, M: mgjit.constexpr, BN: mgjit.constexpr, KB: mgjit.constexpr,
                UNROLL: mgjit.constexpr, SPLIT: mgjit.constexpr = 1, SCALED: mgjit.constexpr = False,
                BIAS: mgjit.constexpr = False, ACTIVATION: mgjit.constexpr = None):
    """c[:M, n0:n0 + BN] for n0 = program_id(0) * BN, its K range split over the SPLIT programs program_id(1);
    a (M, K) in any layout, b (K, N). With SPLIT > 1 (a power of two), ws (f32, at least
    N / BN * M * SPLIT rows of BN) holds the partials and locks (int32, one per column block) counts them:
    zeros, as every launch leaves them."""
    assert M <= 8, "gemv_nmajor keeps 8 accumulators: M <= 8"
    block, part = mgjit.program_id(0), mgjit.program_id(1)
    n0 = block * BN
    step = KB * UNROLL
    steps = mgjit.cdiv(b.shape[0], step)
    acc0 = mgjit.zeros((KB, BN), mgjit.float32)
    acc1 = mgjit.zeros((KB, BN), mgjit.float32)
    acc2 = mgjit.zeros((KB, BN), mgjit.float32)
    acc3 = mgjit.zeros((KB, BN), mgjit.float32)
    acc4 = mgjit.zeros((KB, BN), mgjit.float32)
    acc5 = mgjit.zeros((KB, BN), mgjit.float32)
    acc6 = mgjit.zeros((KB, BN), mgjit.float32)
    acc7 = mgjit.zeros((KB, BN), mgjit.float32)
    for i in range(part * steps // SPLIT, (part + 1) * steps // SPLIT):
        for u in mgjit.static_range(UNROLL):
            k0 = i * step + u * KB
            tile = b[mgjit.ds(k0, KB), mgjit.ds(n0, BN)].astype(mgjit.float32)  # zeros past K and N
            acc0 = row_fma(acc0, a, 0, k0, tile, KB, M)
            acc1 = row_fma(acc1, a, 1, k0, tile, KB, M)
            acc2 = row_fma(acc2, a, 2, k0, tile, KB, M)
            acc3 = row_fma(acc3, a, 3, k0, tile, KB, M)
            acc4 = row_fma(acc4, a, 4, k0, tile, KB, M)
            acc5 = row_fma(acc5, a, 5, k0, tile, KB, M)
            acc6 = row_fma(acc6, a, 6, k0, tile, KB, M)
            acc7 = row_fma(acc7, a, 7, k0, tile, KB, M)
    accs = (acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7)
    if SPLIT == 1:
        for m in mgjit.static_range(M):
            store_row(accs[m].sum(axis=0), c, scale, bias, m, n0, BN, SCALED, BIAS, ACTIVATION)
    else:
        # Partial row (block, m, part) is workspace row (block * M + m) * SPLIT + part: a row's SPLIT partials
        # lie together. acq_rel: the partials of the programs counted before are visible to the last one.
        for m in mgjit.static_range(M):
            ws[(block * M + m) * SPLIT + part, mgjit.ds(0, BN)] = accs[m].sum(axis=0)
        if mgjit.atomic_add(locks, block, 1, sem="acq_rel") == SPLIT - 1:
            for m in mgjit.static_range(M):
                partials = ws[mgjit.ds((block * M + m) * SPLIT, SPLIT), mgjit.ds(0, BN)]
                store_row(partials.sum(axis=0), c, scale, bias, m, n0, BN, SCALED, BIAS, ACTIVATION)
            locks[block] = 0


def candidates(m: int, k: int) -> list[dict]:
    """gemv_kmajor configs for M activation rows and K columns: ROWS weight rows per program, K in chunks of KC
    (a power of two, ROWS * KC <= HELD); none past MAX_M or where K needs more than MAX_CHUNKS chunks."""
    if not 1 <= m <= MAX_M:
        return []
    out = []
    for rows in (2, 1, 4):
        kc = min(HELD // rows, 1 << max(k - 1, 0).bit_length())
        chunks = -(-k // kc)
        if chunks <= MAX_CHUNKS:
            out.append({"GEMV": "k-major", "ROWS": rows, "KC": kc, "KCH": chunks})
    return out


def nmajor_candidates(m: int, n: int, k: int, sms: int) -> list[dict]:
    """gemv_nmajor configs for M activation rows, N columns and K (16-bit weights), one per NMAJOR_TILES entry;
    none past NMAJOR_MAX_M."""
    if not 1 <= m <= NMAJOR_MAX_M:
        return []
    out = []
    for bn, unroll, fewer in NMAJOR_TILES:
        kb = THREADS * VECTOR // bn
        split = nmajor_split(-(-n // bn), -(-k // (kb * unroll)), bn, sms)
        out.append({"GEMV": "n-major", "BN": bn, "KB": kb, "UNROLL": unroll, "SPLIT": max(split // 2, 1) if fewer
                    else split})
    return out


def nmajor_split(blocks: int, steps: int, bn: int, sms: int) -> int:
    """How many parts to split K's `steps` loop steps into for `blocks` column blocks of BN: the power of two that
    brings the grid nearest PROGRAMS_PER_SM programs per SM, each part at least one step, SPLIT x BN at most
    MAX_PARTIALS."""
    split = 1
    while 2 * split <= steps and 2 * split * bn <= MAX_PARTIALS and blocks * split * 1.5 < PROGRAMS_PER_SM * sms:
        split *= 2
    return split


def check(cfg: dict, k: int, b_kmajor: bool, bits: int) -> None:
    """Refuse, naming the key, a caller's GEMV config that would compute a wrong C or fail deep in its kernel: a
    k-major GEMV reads an (N, K) weight and an n-major one a (K, N) weight (given the other layout, each read it as
    its own: a wrong C); both take 16-bit operands; a k-major GEMV's KCH chunks of KC columns must cover K (the
    columns past them were left out of C); an n-major one's UNROLL must be at least 1 (0 loaded nothing); register
    array dimensions (ROWS, KC; BN, KB and SPLIT) are powers of two."""
    kind = cfg["GEMV"]
    if kind not in ("k-major", "n-major"):
        raise ValueError(f"a GEMV config's GEMV is 'k-major' or 'n-major' (the weights' layout), got {kind!r}")
    if bits != 16:
        raise ValueError(f"the {kind} GEMV multiplies 16-bit operands, got {bits}-bit ones")
    if (kind == "k-major") != b_kmajor:
        weight, other = ("an (N, K)", "n-major") if kind == "k-major" else ("a (K, N)", "k-major")
        raise ValueError(f"the {kind} GEMV reads {weight} weight: this b is {'K' if b_kmajor else 'N'}-major (the "
                         f"{other} GEMV reads it)")
    for key in ("ROWS", "KC") if kind == "k-major" else ("BN", "KB", "SPLIT"):
        v = cfg.get(key)
        if not (isinstance(v, int) and v >= 1 and v & (v - 1) == 0):
            raise ValueError(f"the {kind} GEMV config's {key} is a power of two (a register array's dimension), "
                             f"got {v!r}")
    if kind == "k-major" and not (isinstance(cfg.get("KCH"), int) and cfg["KCH"] * cfg["KC"] >= k):
        raise ValueError(f"the k-major GEMV config's KCH chunks of KC = {cfg['KC']} columns cover K = {k}, got "
                         f"KCH = {cfg.get('KCH')!r}")
    if kind == "n-major" and not (isinstance(cfg.get("UNROLL"), int) and cfg["UNROLL"] >= 1):
        raise ValueError(f"the n-major GEMV config's UNROLL (the tiles a loop step loads) is at least 1, got "
                         f"{cfg.get('UNROLL')!r}")


def grid(n: int, cfg: dict) -> tuple[int, ...]:
    """The launch grid of a GEMV config: column blocks (weight rows for K-major), and the K split."""
    if cfg["GEMV"] == "k-major":
        return (-(-n // cfg["ROWS"]),)
    return (-(-n // cfg["BN"]), cfg["SPLIT"])

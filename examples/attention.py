"""Flash attention for Hopper in mgjit: forward (with the logsumexp) and backward, behind a torch.autograd.Function
and an SDPA-style wrapper.

Forward (`attention_fwd`), FlashAttention-3's design: a CTA owns BM = 64 * CONSUMERS query rows of one head.
Warpgroup 0 is the producer: it copies the CTA's Q once and streams K and V blocks of BN rows into rings of
STAGES shared-memory slots with the TMA engine, on 24 registers a thread. Each of the CONSUMERS other warpgroups
owns 64 query rows and, on up to 240 registers, runs the online softmax: S = Q Kᵀ (wgmma), P = exp2(S·scale·log2e
- m) with the scale folded into one exponent, O += P V (wgmma, P straight from registers as the A operand).
- OVERLAP: the softmax of block j runs while the tensor cores compute S of block j + 1 and P V of block j - 1
  (both issued, then `wgmma_wait(1)` for S only).
- PINGPONG: the consumers take turns issuing their GEMMs (named barriers), so one's softmax runs while the
  other's GEMMs do.
- Only the blocks that cross the causal diagonal or the end of K are masked, in their own loop; the others run
  a loop with no mask at all.
- The epilogue writes O through shared memory with a TMA store (rows past the end are dropped) and the
  logsumexp with plain stores.

Backward: `attention_bwd_preprocess` (delta = rowsum(dO * O)), `attention_bwd` (per KV block: dK, dV; dQ
added into an fp32 buffer with TMA reduce-add) and `attention_bwd_dq` (that buffer, scaled, into dQ's dtype).

    python examples/attention.py     # on a Hopper GPU: checks against torch SDPA; without one: compiles for sm_90a
"""
from __future__ import annotations

import math

import mgjit

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
PRODUCER_REGISTERS = 24


# ---------------------------------------------------------------------------------------------- forward

@mgjit.device
def mask_scores(s, rows, n0, Sk, CAUSAL, BN):
    """-inf where a key is past the end of K or, causally, after the query (SDPA's is_causal: top-left)."""
    cols = n0 + mgjit.arange(BN)
    s = mgjit.where(cols[None, :] < Sk, s, -float("inf"))  # (the scores first: the iotas take their layout)
    if CAUSAL:
        s = mgjit.where(cols[None, :] <= rows[:, None], s, -float("inf"))
    return s


@mgjit.device
def online_softmax(s, m, l, scale_log2):
    """One block of the online softmax in base 2, the scale folded into the exponent: the new row maxima (of the
    unscaled scores), the probabilities, the row sums, and alpha, by which the previous output rows shrink."""
    m_new = mgjit.maximum(m, s.max(axis=1))
    base = mgjit.where(m_new == -float("inf"), 0.0, m_new * scale_log2)  # a row that has seen no key yet
    p = mgjit.exp2(s * scale_log2 - base[:, None])
    alpha = mgjit.exp2(m * scale_log2 - base)
    return p, m_new, l * alpha + p.sum(axis=1), alpha


@mgjit.kernel(num_warpgroups=3)
def attention_fwd(q, k, v, o, lse, scale_log2, D: mgjit.constexpr, BN: mgjit.constexpr, STAGES: mgjit.constexpr,
                  CONSUMERS: mgjit.constexpr, CAUSAL: mgjit.constexpr, OVERLAP: mgjit.constexpr,
                  PINGPONG: mgjit.constexpr, REGISTERS: mgjit.constexpr):
    """o = softmax(q kᵀ · scale) v and lse = logsumexp(q kᵀ · scale) for q, o (B, H, Sq, D), k, v (B, Hk, Sk, D),
    lse (B, H, Sq) fp32; launched with num_warpgroups = 1 + CONSUMERS on a grid (cdiv(Sq, 64 * CONSUMERS), B * H)."""
    assert not PINGPONG or OVERLAP, "PINGPONG takes turns on the overlapped GEMMs: it needs OVERLAP"
    assert BN in (16, 32, 64, 128, 256), f"BN, the keys of a block, is a power of two from 16 to 256 (a register " \
        f"array's dimension, and the K of P V's wgmma), got {BN}"
    assert CONSUMERS in (1, 2, 3), f"CONSUMERS is 1, 2 or 3 (a CTA holds at most 4 warpgroups), got {CONSUMERS}"
    BM = 64 * CONSUMERS
    Sk, H = k.shape[2], q.shape[1]
    b, h = mgjit.program_id(1) // H, mgjit.program_id(1) % H
    hk = h // (H // k.shape[1])  # GQA: the KV head this query head reads
    m_block = mgjit.num_programs(0) - 1 - mgjit.program_id(0) if CAUSAL else mgjit.program_id(0)  # longest first
    m0 = m_block * BM
    if CAUSAL:
        n_blocks = mgjit.cdiv(mgjit.minimum(Sk, m0 + BM), BN)
        n_plain = mgjit.minimum((m0 + 1) // BN, Sk // BN)  # blocks no query row of the CTA masks
    else:
        n_blocks = mgjit.cdiv(Sk, BN)
        n_plain = Sk // BN

    q_s = mgjit.smem((CONSUMERS, 1, 1, 64, D), q.dtype, swizzle=128)  # each consumer's Q, then its O tile
    k_s = mgjit.smem((STAGES, 1, 1, BN, D), k.dtype, swizzle=128)
    v_s = mgjit.smem((STAGES, 1, 1, BN, D), v.dtype, swizzle=128)
    q_full = mgjit.barrier(1, arrivals=CONSUMERS)
    k_full = mgjit.barrier(STAGES, arrivals=1)
    v_full = mgjit.barrier(STAGES, arrivals=1)
    k_empty = mgjit.barrier(STAGES, arrivals=CONSUMERS)
    v_empty = mgjit.barrier(STAGES, arrivals=CONSUMERS)
    if PINGPONG:
        turn = mgjit.named_barrier(CONSUMERS, warpgroups=2)  # turn[c]: consumer c may issue its GEMMs

    wg = mgjit.warpgroup_id()
    if wg == 0:
        mgjit.set_max_registers(PRODUCER_REGISTERS, increase=False)
        for c in mgjit.static_range(CONSUMERS):
            mgjit.copy_async(q, (b, h, m0 + 64 * c, 0), q_s[c], barrier=q_full[0])
        for j in range(n_blocks):
            with mgjit.trace("load K, V"):  # spans: recorded when a launch profiles
                slot = j % STAGES
                if j >= STAGES:
                    k_empty[slot].wait()
                mgjit.copy_async(k, (b, hk, j * BN, 0), k_s[slot], barrier=k_full[slot])
                if j >= STAGES:
                    v_empty[slot].wait()
                mgjit.copy_async(v, (b, hk, j * BN, 0), v_s[slot], barrier=v_full[slot])
    else:
        if CONSUMERS > 1:  # one consumer beside the producer has the registers a thread can have (255) already
            mgjit.set_max_registers(REGISTERS, increase=True)
        c = wg - 1
        row0 = m0 + 64 * c
        rows = row0 + mgjit.arange(64)
        q_t = q_s[c][0][0]
        m = mgjit.full((64,), -float("inf"), mgjit.float32)
        l = mgjit.zeros((64,), mgjit.float32)
        acc = mgjit.zeros((64, D), mgjit.float32)
        if PINGPONG:
            if c == 0:
                turn[0].arrive()  # consumer 0 takes the first turn
        with mgjit.trace("attend"):  # S = Q K^T, the online softmax and P V over every K, V block
            q_full[0].wait()
            if OVERLAP:
                k_full[0].wait()
                if PINGPONG:
                    turn[c].sync()
                s = mgjit.wgmma(mgjit.zeros((64, BN), mgjit.float32), q_t, k_s[0][0][0].T)
                if PINGPONG:
                    turn[(c + 1) % CONSUMERS].arrive()
                mgjit.wgmma_wait(0)
                k_empty[0].arrive()
                if n_plain == 0:
                    s = mask_scores(s, rows, 0, Sk, CAUSAL, BN)
                p, m, l, alpha = online_softmax(s, m, l, scale_log2)
                p = p.astype(v.dtype)
                for masked in mgjit.static_range(2):
                    for j in range(mgjit.maximum(n_plain, 1) if masked else 1, n_blocks if masked else n_plain):
                        slot, prev = j % STAGES, (j - 1) % STAGES
                        k_full[slot].wait()
                        if PINGPONG:
                            turn[c].sync()
                        s = mgjit.wgmma(mgjit.zeros((64, BN), mgjit.float32), q_t, k_s[slot][0][0].T)
                        v_full[prev].wait()
                        acc = mgjit.wgmma(acc, p, v_s[prev][0][0])
                        if PINGPONG:
                            turn[(c + 1) % CONSUMERS].arrive()
                        mgjit.wgmma_wait(1)  # S is done; P V runs on under the softmax
                        k_empty[slot].arrive()
                        if masked:
                            s = mask_scores(s, rows, j * BN, Sk, CAUSAL, BN)
                        p, m, l, alpha = online_softmax(s, m, l, scale_log2)
                        p = p.astype(v.dtype)
                        mgjit.wgmma_wait(0)
                        v_empty[prev].arrive()
                        acc = acc * alpha[:, None]
                last = (n_blocks - 1) % STAGES
                v_full[last].wait()
                if PINGPONG:
                    turn[c].sync()
                acc = mgjit.wgmma(acc, p, v_s[last][0][0])
                if PINGPONG:
                    turn[(c + 1) % CONSUMERS].arrive()
                mgjit.wgmma_wait(0)
                v_empty[last].arrive()
            else:
                for masked in mgjit.static_range(2):
                    for j in range(n_plain if masked else 0, n_blocks if masked else n_plain):
                        slot = j % STAGES
                        k_full[slot].wait()
                        s = mgjit.wgmma(mgjit.zeros((64, BN), mgjit.float32), q_t, k_s[slot][0][0].T)
                        mgjit.wgmma_wait(0)
                        k_empty[slot].arrive()
                        if masked:
                            s = mask_scores(s, rows, j * BN, Sk, CAUSAL, BN)
                        p, m, l, alpha = online_softmax(s, m, l, scale_log2)
                        acc = acc * alpha[:, None]
                        v_full[slot].wait()
                        acc = mgjit.wgmma(acc, p.astype(v.dtype), v_s[slot][0][0])
                        mgjit.wgmma_wait(0)
                        v_empty[slot].arrive()
        with mgjit.trace("epilogue"):  # the logsumexp, and O through SMEM and TMA
            lse[b, h, mgjit.ds(row0, 64)] = (m * scale_log2 + mgjit.log2(l)) * LN2
            q_t[...] = (acc / l[:, None]).astype(o.dtype)  # Q is spent: its tile takes O
            mgjit.store_async(o, (b, h, row0, 0), q_s[c])
            mgjit.store_async_wait(0)


# ---------------------------------------------------------------------------------------------- backward

@mgjit.kernel
def attention_bwd_preprocess(o, do, delta, dq_acc, D: mgjit.constexpr, ROWS: mgjit.constexpr):
    """delta = rowsum(o * do) (fp32, (B, H, Sq)) and zeros into dq_acc (fp32, like o); grid (cdiv(Sq, ROWS), B * H)."""
    H = o.shape[1]
    b, h = mgjit.program_id(1) // H, mgjit.program_id(1) % H
    r0 = mgjit.program_id(0) * ROWS
    x = o[b, h, mgjit.ds(r0, ROWS), mgjit.ds(0, D)].astype(mgjit.float32)
    dx = do[b, h, mgjit.ds(r0, ROWS), mgjit.ds(0, D)].astype(mgjit.float32)
    delta[b, h, mgjit.ds(r0, ROWS)] = (x * dx).sum(axis=1)
    dq_acc[b, h, mgjit.ds(r0, ROWS), mgjit.ds(0, D)] = mgjit.zeros((ROWS, D), mgjit.float32)


@mgjit.kernel
def attention_bwd_dq(dq_acc, dq, scale, D: mgjit.constexpr, ROWS: mgjit.constexpr):
    """dq = dq_acc * scale in dq's dtype; grid (cdiv(Sq, ROWS), B * H)."""
    H = dq.shape[1]
    b, h = mgjit.program_id(1) // H, mgjit.program_id(1) % H
    r0 = mgjit.program_id(0) * ROWS
    window = (b, h, mgjit.ds(r0, ROWS), mgjit.ds(0, D))
    dq[window] = (dq_acc[window] * scale).astype(dq.dtype)


@mgjit.device
def mask_scores_t(st, kv, m0, Sk, CAUSAL, BM):
    """The mask of a transposed score tile (keys along rows, queries along columns)."""
    cols = m0 + mgjit.arange(BM)
    st = mgjit.where(kv[:, None] < Sk, st, -float("inf"))
    if CAUSAL:
        st = mgjit.where(kv[:, None] <= cols[None, :], st, -float("inf"))
    return st


@mgjit.device
def share_columns(tile, block, q0, stored):
    """Store a consumer's block of columns into the tile its partners store theirs into, for the tensor cores to
    read, and wait (on the named barrier `stored`) until every part is there."""
    tile[:, mgjit.ds(q0, block.shape[1])][...] = block
    mgjit.fence_async_shared()
    stored.sync()


@mgjit.kernel(num_warpgroups=3)
def attention_bwd(q, k, v, do, lse, delta, dq_acc, dk, dv, scale_log2, scale, D: mgjit.constexpr,
                  BM: mgjit.constexpr, STAGES: mgjit.constexpr, CONSUMERS: mgjit.constexpr, SPLIT: mgjit.constexpr,
                  SHARED_SCORES: mgjit.constexpr, CAUSAL: mgjit.constexpr, REGISTERS: mgjit.constexpr):
    """dk, dv (B, Hk, Sk, D) and dq_acc += dS K / scale for one KV block per CTA, over the query blocks of every
    query head that reads it (GQA). The KV block has BN = 64 * CONSUMERS / SPLIT rows: consumer c owns rows
    64 * (c // SPLIT) and the (c % SPLIT)-th of SPLIT column chunks of D (SPLIT = 2 at D >= 128, so that its dK
    and dV fit in registers). Sᵀ = K Qᵀ and dPᵀ = V dOᵀ are computed transposed, so that Pᵀ and dSᵀ are the A
    operands of dV += Pᵀ dO and dK += dSᵀ Q; dQ = dS K goes through SMEM (dSᵀ stored, read transposed) and is
    added into dq_acc by a TMA reduce-add. The SPLIT consumers of one KV block need the same Pᵀ and dSᵀ: without
    SHARED_SCORES each computes them whole, as registers; with it (FlashAttention-3's way) each computes the
    (c % SPLIT)-th of SPLIT column blocks (query rows), stores it into one shared tile, and, once the partner's
    part is there too (a named barrier), reads the whole tile from SMEM as the A operand.
    The producer streams each query block's Q, dO, logsumexp and delta (lse and delta: fp32 (B, H, Sq) with
    16-byte aligned rows). Grid (cdiv(Sk, BN), B * Hk), num_warpgroups = 1 + CONSUMERS."""
    assert not SHARED_SCORES or SPLIT > 1, "SHARED_SCORES shares Sᵀ and dPᵀ between the SPLIT consumers of a block"
    # Refused by name where they failed deep in an SMEM allocation or, CONSUMERS=3 with SPLIT=2, indexed a consumer's
    # K part past its buffer (out of bounds on a GPU)
    assert CONSUMERS in (1, 2, 3) and SPLIT in (1, 2) and CONSUMERS % SPLIT == 0, f"CONSUMERS (1, 2 or 3) is a " \
        f"multiple of SPLIT (1 or 2): SPLIT consumers share each 64-row part of a KV block, got {CONSUMERS} and {SPLIT}"
    assert D % (64 * SPLIT) == 0, f"a consumer's D // SPLIT columns are whole 64-column blocks (128-byte swizzle " \
        f"rows), got D = {D}, SPLIT = {SPLIT}"
    assert BM in (64, 128, 256), f"BM, the query rows of a step, is 64, 128 or 256 (a register array's dimension, " \
        f"128-byte swizzle rows), got {BM}"
    DC = D // SPLIT
    KCH = DC // 64  # dQ is computed 64 columns at a time (it would not fit in registers beside dK and dV)
    QW = BM // SPLIT if SHARED_SCORES else BM  # the query columns of Sᵀ and dPᵀ a consumer computes
    BN = 64 * CONSUMERS // SPLIT
    PARTS = CONSUMERS // SPLIT
    Sq, Sk, H, Hk = q.shape[2], k.shape[2], q.shape[1], k.shape[1]
    G = H // Hk
    b, hk = mgjit.program_id(1) // Hk, mgjit.program_id(1) % Hk
    n0 = mgjit.program_id(0) * BN
    m_blocks = mgjit.cdiv(Sq, BM)
    m_first = mgjit.minimum(n0 // BM, m_blocks) if CAUSAL else 0  # the first query block that sees the KV block
    if n0 + BN > Sk:
        m_plain = m_blocks  # a ragged KV block: every query block masks its keys past the end
    elif CAUSAL:
        m_plain = mgjit.cdiv(n0 + BN - 1, BM)  # the query blocks before this one see keys after theirs
    else:
        m_plain = 0

    k_s = mgjit.smem((PARTS, SPLIT, 1, 1, 64, DC), k.dtype, swizzle=128)
    kc_s = mgjit.smem((PARTS, SPLIT, KCH, 1, 1, 64, 64), k.dtype, swizzle=128)  # K again, as dQ's 64-column chunks
    v_s = mgjit.smem((PARTS, SPLIT, 1, 1, 64, DC), v.dtype, swizzle=128)
    q_s = mgjit.smem((STAGES, SPLIT, 1, 1, BM, DC), q.dtype, swizzle=128)
    do_s = mgjit.smem((STAGES, SPLIT, 1, 1, BM, DC), do.dtype, swizzle=128)
    lse_s = mgjit.smem((STAGES, 1, 1, BM), mgjit.float32)  # the query block's logsumexp and delta
    delta_s = mgjit.smem((STAGES, 1, 1, BM), mgjit.float32)
    if SHARED_SCORES:  # Pᵀ and dSᵀ of the KV block, each consumer's QW columns one 16-bit column block apart
        pt_s = mgjit.smem((1, 64, BM), q.dtype, swizzle=min(128, 2 * QW))
        ds_s = mgjit.smem((1, 64, BM), q.dtype, swizzle=min(128, 2 * QW))  # read transposed for dQ too
        scores = mgjit.named_barrier(2, warpgroups=CONSUMERS)  # [0]: Pᵀ stored whole, [1]: dSᵀ stored whole
    else:
        ds_s = mgjit.smem((CONSUMERS, 64, BM), q.dtype, swizzle=128)  # each consumer's dSᵀ, read transposed for dQ
    # its dQ part, for the reduce-add. Unswizzled, the accumulator's stores take 8 wavefronts per warp (a 4-way
    # bank conflict), but one TMA box: with a 32B swizzle (8 boxes of 8 columns, 2 wavefronts) the H100 ran the
    # D = 128 backward at 244 TFLOP/s against 295 unswizzled.
    dq_s = mgjit.smem((CONSUMERS, 1, 1, BM, 64), mgjit.float32)
    kv_full = mgjit.barrier(1, arrivals=(2 + KCH) * PARTS * SPLIT)
    full = mgjit.barrier(STAGES, arrivals=2 * SPLIT + 2)
    empty = mgjit.barrier(STAGES, arrivals=CONSUMERS)
    if SPLIT > 1:
        spent = mgjit.named_barrier(1, warpgroups=CONSUMERS)  # every consumer is done reading K and V

    wg = mgjit.warpgroup_id()
    if wg == 0:
        mgjit.set_max_registers(PRODUCER_REGISTERS, increase=False)
        for r in mgjit.static_range(PARTS):
            for d in mgjit.static_range(SPLIT):
                mgjit.copy_async(k, (b, hk, n0 + 64 * r, d * DC), k_s[r][d], barrier=kv_full[0])
                mgjit.copy_async(v, (b, hk, n0 + 64 * r, d * DC), v_s[r][d], barrier=kv_full[0])
                for j in mgjit.static_range(KCH):
                    mgjit.copy_async(k, (b, hk, n0 + 64 * r, d * DC + 64 * j), kc_s[r][d][j], barrier=kv_full[0])
        it = 0
        for g in range(G):
            for m in range(m_first, m_blocks):
                slot = it % STAGES
                if it >= STAGES:
                    empty[slot].wait()
                for d in mgjit.static_range(SPLIT):
                    mgjit.copy_async(q, (b, hk * G + g, m * BM, d * DC), q_s[slot][d], barrier=full[slot])
                    mgjit.copy_async(do, (b, hk * G + g, m * BM, d * DC), do_s[slot][d], barrier=full[slot])
                mgjit.copy_async(lse, (b, hk * G + g, m * BM), lse_s[slot], barrier=full[slot])
                mgjit.copy_async(delta, (b, hk * G + g, m * BM), delta_s[slot], barrier=full[slot])
                it += 1
    else:
        if CONSUMERS > 1:  # one consumer beside the producer has the registers a thread can have (255) already
            mgjit.set_max_registers(REGISTERS, increase=True)
        c = wg - 1
        part, chunk = c // SPLIT, c % SPLIT
        kv = n0 + 64 * part + mgjit.arange(64)
        dk_acc = mgjit.zeros((64, DC), mgjit.float32)
        dv_acc = mgjit.zeros((64, DC), mgjit.float32)
        kv_full[0].wait()
        it = 0
        for g in range(G):
            h = hk * G + g
            for m in range(m_first, m_blocks):
                slot = it % STAGES
                m0 = m * BM
                full[slot].wait()
                q0 = QW * chunk if SHARED_SCORES else 0
                st = mgjit.zeros((64, QW), mgjit.float32)
                dpt = mgjit.zeros((64, QW), mgjit.float32)
                for d in mgjit.static_range(SPLIT):
                    st = mgjit.wgmma(st, k_s[part][d][0][0], q_s[slot][d][0][0][mgjit.ds(q0, QW)].T)
                for d in mgjit.static_range(SPLIT):
                    dpt = mgjit.wgmma(dpt, v_s[part][d][0][0], do_s[slot][d][0][0][mgjit.ds(q0, QW)].T)
                mgjit.wgmma_wait(1)  # Sᵀ is done; dPᵀ runs on
                if m < m_plain:
                    st = mask_scores_t(st, kv, m0 + q0, Sk, CAUSAL, QW)
                lse_t = lse_s[slot][0][0][mgjit.ds(q0, QW)][...]
                pt = mgjit.exp2(st * scale_log2 - (lse_t * LOG2E)[None, :]).astype(do.dtype)
                if SHARED_SCORES:  # (the partner's dV of the last block, which read Pᵀ, was done before scores[1])
                    share_columns(pt_s[0], pt, q0, scores[0])
                    dv_acc = mgjit.wgmma(dv_acc, pt_s[0], do_s[slot][chunk][0][0])
                else:
                    dv_acc = mgjit.wgmma(dv_acc, pt, do_s[slot][chunk][0][0])
                mgjit.wgmma_wait(1)  # dPᵀ is done; dV runs on
                # dSᵀ from the rounded Pᵀ that dV used: the fp32 one would stay live beside dK, dV and dPᵀ (spills)
                delta_t = delta_s[slot][0][0][mgjit.ds(q0, QW)][...]
                dst = (pt.astype(mgjit.float32) * (dpt - delta_t[None, :])).astype(q.dtype)
                if SHARED_SCORES:
                    # dV is done before scores[1]: past it, the partner stores the next block's Pᵀ over this one.
                    # (The partner's dK and dQ of the last block, which read dSᵀ, were done before scores[0].)
                    mgjit.wgmma_wait(0)
                    share_columns(ds_s[0], dst, q0, scores[1])
                    dk_acc = mgjit.wgmma(dk_acc, ds_s[0], q_s[slot][chunk][0][0])
                else:
                    dk_acc = mgjit.wgmma(dk_acc, dst, q_s[slot][chunk][0][0])
                    ds_s[c][...] = dst
                    mgjit.fence_async_shared()
                for j in mgjit.static_range(KCH):
                    dq = mgjit.wgmma(mgjit.zeros((BM, 64), mgjit.float32), ds_s[0 if SHARED_SCORES else c].T,
                                     kc_s[part][chunk][j][0][0])
                    mgjit.wgmma_wait(0)
                    if j == 0:
                        empty[slot].arrive()  # every GEMM that reads the slot is done
                    mgjit.store_async_wait(0)  # the previous dQ part has left dq_s
                    dq_s[c][0][0][...] = dq
                    mgjit.store_async(dq_acc, (b, h, m0, chunk * DC + 64 * j), dq_s[c], reduce="add")
                it += 1
        row0 = n0 + 64 * part
        if SPLIT > 1:
            spent[0].sync()  # the partner consumer read this consumer's K and V chunks too
        k_s[part][chunk][0][0][...] = (dk_acc * scale).astype(dk.dtype)  # K and V are spent: their tiles take dK, dV
        mgjit.store_async(dk, (b, hk, row0, chunk * DC), k_s[part][chunk])
        v_s[part][chunk][0][0][...] = dv_acc.astype(dv.dtype)
        mgjit.store_async(dv, (b, hk, row0, chunk * DC), v_s[part][chunk])
        mgjit.store_async_wait(0)


# ---------------------------------------------------------------------------------------------- torch wrappers

def registers_per_consumer(consumers: int) -> int:
    """What each consumer warpgroup can take once the producer is down to PRODUCER_REGISTERS: the SM's 64K
    registers shared by 128 threads per warpgroup, in setmaxnreg's steps of 8, at most 240."""
    return min(240, (65536 // 128 - PRODUCER_REGISTERS) // consumers // 8 * 8)


def forward_config(head_dim: int, causal: bool) -> dict:
    """The default forward configuration for a head dimension (the benchmark's --tune searches others)."""
    return dict(BN=64 if head_dim > 128 else 128, STAGES=2, CONSUMERS=2, OVERLAP=True, PINGPONG=True)


def backward_config(head_dim: int, causal: bool) -> dict:
    """The default backward configuration. D = 64: the consumers own 64-row halves of a 128-row KV block. D >= 128:
    they own halves of D for one 64-row block (so that dK, dV and dQ fit in registers: the halves of 128 rows
    spill at D = 128), each computing half of Sᵀ and dPᵀ and sharing it through SMEM (SHARED_SCORES; without it
    both compute them whole); D = 256 fits one stage of Q and dO in SMEM."""
    if head_dim > 128:
        return dict(BM=64, STAGES=1, CONSUMERS=2, SPLIT=2, SHARED_SCORES=True)
    if head_dim > 64:
        return dict(BM=64, STAGES=2, CONSUMERS=2, SPLIT=2, SHARED_SCORES=True)
    return dict(BM=64, STAGES=2, CONSUMERS=2, SPLIT=1, SHARED_SCORES=False)


def _consumers(cfg: dict) -> int:
    """A config's CONSUMERS, refused by name where no launch has them: the grid divides by it (0) and a CTA holds
    at most 4 warpgroups, the producer's among them (4 was refused by the launch's count of warpgroups)."""
    consumers = cfg["CONSUMERS"]
    if type(consumers) is not int or consumers not in (1, 2, 3):
        raise ValueError(f"attention: CONSUMERS is 1, 2 or 3 (a CTA holds at most 4 warpgroups, one of them the "
                         f"producer), got {consumers!r}")
    return consumers


def _padded_head_dim(d: int) -> int:
    if not 0 < d <= 256:
        raise ValueError(f"head dimensions up to 256 are supported, got {d}")
    return -(-d // 64) * 64


def _tma_ready(t):
    """`t`, or a copy of it, that TMA can read: unit last stride, 16-byte aligned base and strides (a copy's rows
    are padded to a multiple of 16 bytes)."""
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1]):
        return t
    return _padded_rows(t.shape, t.dtype, t.device).copy_(t)


def _padded_rows(shape, dtype, device):
    """An empty tensor of `shape` whose rows start 16-byte aligned (a view of a buffer with padded rows)."""
    import torch
    per = 16 // torch.empty(0, dtype=dtype).element_size()
    return torch.empty(*shape[:-1], -(-shape[-1] // per) * per, dtype=dtype, device=device)[..., :shape[-1]]


def _prepare(q, k, v, scale):
    """Checked, TMA-ready (B, H, S, D) inputs, zero-padded to a head dimension of a multiple of 64, and the scale."""
    import torch
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention takes (B, H, S, D) tensors, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype or q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"attention takes bfloat16 or float16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    (b, h, _, d), (bk, hk, sk, dk) = q.shape, k.shape
    if bk != b or v.shape[:3] != k.shape[:3] or dk != d or v.shape[3] != d or h % hk:
        raise ValueError(f"q (B, H, Sq, D), k and v (B, Hk, Sk, D) with H a multiple of Hk: got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if sk == 0:
        raise ValueError("attention over an empty key sequence is undefined")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not scale > 0:
        raise ValueError(f"the softmax scale must be positive, got {scale}")
    dp = _padded_head_dim(d)
    if dp != d:
        q, k, v = (torch.nn.functional.pad(x, (0, dp - d)) for x in (q, k, v))
    return _tma_ready(q), _tma_ready(k), _tma_ready(v), scale


def attention_forward(q, k, v, causal: bool = False, scale: float | None = None, config: dict | None = None,
                      profile=None):
    """(o, lse): o = softmax(q kᵀ · scale) v (B, H, Sq, D) and lse = logsumexp(q kᵀ · scale) (B, H, Sq, fp32), for
    q (B, H, Sq, D) and k, v (B, Hk, Sk, D) with H a multiple of Hk (GQA/MQA); causal as SDPA's is_causal (query i
    sees keys 0..i). `profile`, an mgjit.Profile, records the launch's spans: the producer's "load K, V" per
    block, each consumer's "attend" and "epilogue"."""
    outputs, launches = forward_launches(q, k, v, causal, scale, config)
    for kernel, grid, args, constexprs in launches:  # profiled: the Python path
        kernel[grid](*args, **constexprs, **({} if profile is None else {"profile": profile}))
    return outputs


def forward_launches(q, k, v, causal: bool = False, scale: float | None = None, config: dict | None = None):
    """((o, lse), the launch that fills them: [(kernel, grid, arguments, constexprs)], none where Sq is 0): what
    `attention_forward` runs (tests run it elsewhere: tests/test_ptx_wgmma.py)."""
    import torch
    d = q.shape[-1]
    qp, kp, vp, scale = _prepare(q, k, v, scale)
    b, h, sq, dp = qp.shape
    cfg = {**forward_config(dp, causal), **(config or {})}
    o = torch.empty(b, h, sq, dp, dtype=q.dtype, device=q.device)
    lse = _padded_rows((b, h, sq), torch.float32, q.device)  # the backward reads it with TMA
    consumers = _consumers(cfg)
    launches = [(attention_fwd, (-(-sq // (64 * consumers)), b * h), (qp, kp, vp, o, lse, scale * LOG2E),
                 dict(D=dp, CAUSAL=bool(causal), REGISTERS=registers_per_consumer(consumers),
                      num_warpgroups=1 + consumers, **cfg))] if sq else []
    return ((o if dp == d else o[..., :d]), lse), launches


def attention_backward(do, q, k, v, o, lse, causal: bool = False, scale: float | None = None,
                       config: dict | None = None):
    """(dq, dk, dv) of attention_forward, given its output o, its lse and the output's gradient do."""
    grads, launches = backward_launches(do, q, k, v, o, lse, causal, scale, config)
    for kernel, grid, args, constexprs in launches:
        kernel[grid](*args, **constexprs)
    return grads


def backward_launches(do, q, k, v, o, lse, causal: bool = False, scale: float | None = None,
                      config: dict | None = None):
    """((dq, dk, dv), the launches that fill them, in order): what `attention_backward` runs."""
    import torch
    d = q.shape[-1]
    qp, kp, vp, scale = _prepare(q, k, v, scale)
    b, h, sq, dp = qp.shape
    hk, sk = kp.shape[1], kp.shape[2]
    if dp != d:
        o, do = (torch.nn.functional.pad(x, (0, dp - d)) for x in (o, do))
    o, do, lse = _tma_ready(o), _tma_ready(do), _tma_ready(lse)
    cfg = {**backward_config(dp, causal), **(config or {})}
    consumers = _consumers(cfg)
    delta = _padded_rows((b, h, sq), torch.float32, q.device)
    dq_acc = torch.empty(b, h, sq, dp, dtype=torch.float32, device=q.device)
    dq = torch.empty(b, h, sq, dp, dtype=q.dtype, device=q.device)
    dk = torch.empty(b, hk, sk, dp, dtype=q.dtype, device=q.device)
    dv = torch.empty(b, hk, sk, dp, dtype=q.dtype, device=q.device)
    rows = 8192 // dp
    block_n = 64 * consumers // cfg["SPLIT"]
    launches = [(attention_bwd, (-(-sk // block_n), b * hk),
                 (qp, kp, vp, do, lse, delta, dq_acc, dk, dv, scale * LOG2E, scale),
                 dict(D=dp, CAUSAL=bool(causal), REGISTERS=registers_per_consumer(consumers),
                      num_warpgroups=1 + consumers, **cfg))]
    if sq:
        launches = [(attention_bwd_preprocess, (-(-sq // rows), b * h), (o, do, delta, dq_acc), dict(D=dp, ROWS=rows)),
                    *launches,
                    (attention_bwd_dq, (-(-sq // rows), b * h), (dq_acc, dq, scale), dict(D=dp, ROWS=rows))]
    grads = (dq, dk, dv) if dp == d else (dq[..., :d], dk[..., :d], dv[..., :d])
    return grads, launches


def _autograd_function():
    import torch

    class Attention(torch.autograd.Function):
        """attention_forward with attention_backward as its gradient (loss.backward() works through it)."""

        @staticmethod
        def forward(ctx, q, k, v, causal, scale, config):
            o, lse = attention_forward(q, k, v, causal, scale, config)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal, ctx.scale = causal, scale
            return o, lse

        @staticmethod
        def backward(ctx, do, dlse):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = attention_backward(do, q, k, v, o, lse, ctx.causal, ctx.scale)
            return dq, dk, dv, None, None, None

    return Attention


_ATTENTION = None


def attention(q, k, v, causal: bool = False, scale: float | None = None, config: dict | None = None):
    """(o, lse) with autograd: the gradient flows to q, k and v (not through lse)."""
    global _ATTENTION
    if _ATTENTION is None:
        _ATTENTION = _autograd_function()
    return _ATTENTION.apply(q, k, v, causal, scale, config)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False):
    """torch.nn.functional.scaled_dot_product_attention's conventions (q, k, v as (B, H, S, D); is_causal is
    top-left aligned; fewer key/value heads need enable_gqa=True), with mgjit's kernels and autograd."""
    if attn_mask is not None or dropout_p:
        raise NotImplementedError("mgjit's attention has no attn_mask and no dropout; use is_causal")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"{query.shape[1]} query heads and {key.shape[1]} key/value heads need enable_gqa=True")
    return attention(query, key, value, is_causal, scale)[0]


if __name__ == "__main__":
    import torch
    if torch.cuda.is_available():
        q, k, v, do = (torch.randn(2, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for causal in (False, True):
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            o, lse = attention_forward(q, k, v, causal)
            err = ((o.float() - ref).norm() / ref.norm()).item()
            print(f"attention (2, 16, 4096, 128) bf16 causal={causal}: relative error {err:.2e}")
            if err > 1e-2:
                raise SystemExit(1)
        raise SystemExit(0)
    x = torch.empty(2, 16, 4096, 128, dtype=torch.bfloat16)
    rows = torch.empty(2, 16, 4096)
    fwd = {**forward_config(128, True), "REGISTERS": registers_per_consumer(2)}
    print(attention_fwd.compile(x, x, x, x, rows, 0.1, D=128, CAUSAL=True, num_warpgroups=3, target="sm_90a", **fwd))
    bwd = {**backward_config(128, True), "REGISTERS": registers_per_consumer(2)}
    print(attention_bwd.compile(x, x, x, x, rows, rows, torch.empty(2, 16, 4096, 128), x, x, 0.1, 0.1, D=128,
                                CAUSAL=True, num_warpgroups=3, target="sm_90a", **bwd))

"""A Triton fused attention for benchmarks/attention.py, written the way Triton's fused-attention tutorial writes
it: forward with the online softmax in base 2 (blocks left of the causal diagonal unmasked, the diagonal masked)
and the logsumexp; backward as a delta preprocess, one kernel for dK and dV per KV block and one for dQ per query
block (no atomics). (B, H, S, D) tensors, GQA, ragged lengths, causal aligned top-left like SDPA. It is the
comparison, not part of mgjit.
"""
import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

_FWD_CONFIGS = [triton.Config({"BM": bm, "BN": bn}, num_stages=s, num_warps=w)
                for bm, bn, s, w in ((128, 64, 3, 4), (128, 128, 3, 8), (128, 64, 4, 8), (64, 64, 4, 4))]


@triton.autotune(configs=_FWD_CONFIGS, key=["SQ", "SK", "D", "CAUSAL"])
@triton.jit
def _fwd(Q, K, V, O, L, qk_scale, H, G, SQ, SK, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
         D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    hk = h // G
    rows = pid_m * BM + tl.arange(0, BM)
    d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqs + d[None, :], mask=rows[:, None] < SQ, other=0.0)
    k_base, v_base = K + b * skb + hk * skh, V + b * svb + hk * svh
    m_i = tl.full([BM], -float("inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    end = tl.minimum(SK, (pid_m + 1) * BM) if CAUSAL else SK
    plain = tl.minimum(SK // BN, (pid_m * BM + 1) // BN) * BN if CAUSAL else (SK // BN) * BN
    for start in range(0, end, BN):
        cols = start + tl.arange(0, BN)
        k = tl.load(k_base + cols[None, :] * sks + d[:, None], mask=cols[None, :] < SK, other=0.0)
        s = tl.dot(q, k) * qk_scale
        if start >= plain:  # the diagonal block and the ragged end: masked
            keep = cols[None, :] < SK
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * svs + d[None, :], mask=cols[:, None] < SK, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    tl.store(L + bh * SQ + rows, (m_i + tl.math.log2(l_i)) / 1.4426950408889634, mask=rows < SQ)
    tl.store(O + b * sob + h * soh + rows[:, None] * sos + d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=rows[:, None] < SQ)


@triton.jit
def _bwd_preprocess(O, DO, DELTA, SQ, BM: tl.constexpr, D: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    bh = tl.program_id(1)
    d = tl.arange(0, D)
    offs = bh * SQ * D + rows[:, None] * D + d[None, :]
    o = tl.load(O + offs, mask=rows[:, None] < SQ, other=0.0).to(tl.float32)
    do = tl.load(DO + offs, mask=rows[:, None] < SQ, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * SQ + rows, tl.sum(o * do, 1), mask=rows < SQ)


_BWD_CONFIGS = [triton.Config({"BM": bm, "BN": bn}, num_stages=s, num_warps=w)
                for bm, bn, s, w in ((64, 128, 3, 8), (64, 64, 3, 4), (32, 128, 3, 4))]


@triton.autotune(configs=_BWD_CONFIGS, key=["SQ", "SK", "D", "CAUSAL"])
@triton.jit
def _bwd_dkdv(Q, K, V, DO, L, DELTA, DK, DV, qk_scale, scale, H, G, SQ, SK, D: tl.constexpr, CAUSAL: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr):
    """dK, dV of one KV block (contiguous (B, H, S, D) tensors) over the query blocks of its group's heads."""
    pid_n, bhk = tl.program_id(0), tl.program_id(1)
    hk_all = H // G
    b, hk = bhk // hk_all, bhk % hk_all
    cols = pid_n * BN + tl.arange(0, BN)
    d = tl.arange(0, D)
    kv_offs = bhk * SK * D + cols[:, None] * D + d[None, :]
    k = tl.load(K + kv_offs, mask=cols[:, None] < SK, other=0.0)
    v = tl.load(V + kv_offs, mask=cols[:, None] < SK, other=0.0)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    start_m = (pid_n * BN // BM) * BM if CAUSAL else 0
    for g in range(G):
        bh = b * H + hk * G + g
        for m0 in range(start_m, SQ, BM):
            rows = m0 + tl.arange(0, BM)
            q_offs = bh * SQ * D + rows[:, None] * D + d[None, :]
            q = tl.load(Q + q_offs, mask=rows[:, None] < SQ, other=0.0)
            do = tl.load(DO + q_offs, mask=rows[:, None] < SQ, other=0.0)
            lse = tl.load(L + bh * SQ + rows, mask=rows < SQ, other=0.0) * 1.4426950408889634
            delta = tl.load(DELTA + bh * SQ + rows, mask=rows < SQ, other=0.0)
            st = tl.dot(k, tl.trans(q)) * qk_scale  # (BN, BM)
            keep = cols[:, None] < SK
            if CAUSAL:
                keep = keep & (cols[:, None] <= rows[None, :])
            pt = tl.where(keep, tl.math.exp2(st - lse[None, :]), 0.0)
            dv += tl.dot(pt.to(do.dtype), do)
            dpt = tl.dot(v, tl.trans(do))
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q)
    tl.store(DK + kv_offs, (dk * scale).to(DK.dtype.element_ty), mask=cols[:, None] < SK)
    tl.store(DV + kv_offs, dv.to(DV.dtype.element_ty), mask=cols[:, None] < SK)


@triton.autotune(configs=_BWD_CONFIGS, key=["SQ", "SK", "D", "CAUSAL"])
@triton.jit
def _bwd_dq(Q, K, V, DO, L, DELTA, DQ, qk_scale, scale, H, G, SQ, SK, D: tl.constexpr, CAUSAL: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr):
    """dQ of one query block (contiguous (B, H, S, D) tensors) over the KV blocks it sees."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    bhk = b * (H // G) + h // G
    rows = pid_m * BM + tl.arange(0, BM)
    d = tl.arange(0, D)
    q_offs = bh * SQ * D + rows[:, None] * D + d[None, :]
    q = tl.load(Q + q_offs, mask=rows[:, None] < SQ, other=0.0)
    do = tl.load(DO + q_offs, mask=rows[:, None] < SQ, other=0.0)
    lse = tl.load(L + bh * SQ + rows, mask=rows < SQ, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh * SQ + rows, mask=rows < SQ, other=0.0)
    dq = tl.zeros([BM, D], tl.float32)
    end = tl.minimum(SK, (pid_m + 1) * BM) if CAUSAL else SK
    for n0 in range(0, end, BN):
        cols = n0 + tl.arange(0, BN)
        kv_offs = bhk * SK * D + cols[:, None] * D + d[None, :]
        k = tl.load(K + kv_offs, mask=cols[:, None] < SK, other=0.0)
        v = tl.load(V + kv_offs, mask=cols[:, None] < SK, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        keep = cols[None, :] < SK
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        p = tl.where(keep, tl.math.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(DQ + q_offs, (dq * scale).to(DQ.dtype.element_ty), mask=rows[:, None] < SQ)


def forward(q, k, v, causal=False, scale=None):
    """(o, lse) for (B, H, Sq, D) q and (B, Hk, Sk, D) k, v."""
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    o = torch.empty_like(q)
    lse = torch.empty(b, h, sq, device=q.device, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(sq, meta["BM"]), b * h)  # noqa: E731
    _fwd[grid](q, k, v, o, lse, scale * LOG2E, h, h // hk, sq, sk, *q.stride()[:3], *k.stride()[:3],
               *v.stride()[:3], *o.stride()[:3], D=d, CAUSAL=causal)
    return o, lse


def backward(do, q, k, v, o, lse, causal=False, scale=None):
    """(dq, dk, dv) of forward()."""
    q, k, v, o, do = (x.contiguous() for x in (q, k, v, o, do))
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    delta = torch.empty_like(lse)
    _bwd_preprocess[(triton.cdiv(sq, 64), b * h)](o, do, delta, sq, BM=64, D=d)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    args = (scale * LOG2E, scale, h, h // hk, sq, sk)
    _bwd_dkdv[lambda meta: (triton.cdiv(sk, meta["BN"]), b * hk)](q, k, v, do, lse, delta, dk, dv, *args, D=d,
                                                                   CAUSAL=causal)
    _bwd_dq[lambda meta: (triton.cdiv(sq, meta["BM"]), b * h)](q, k, v, do, lse, delta, dq, *args, D=d,
                                                                 CAUSAL=causal)
    return dq, dk, dv

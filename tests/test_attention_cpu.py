"""examples/attention.py on the CPU: the forward (with the logsumexp) and the gradients through the torch
wrappers, run by the interpreter against an fp32 torch reference on small ragged shapes (GQA, causal, every head
dimension, the forward's schedules); and every default configuration compiled for sm_90a with no spill, no
ptxas warning, no relayout of an accumulator, and wgmmas that ptxas need not serialize."""
import inspect
import math
import os
import re
import sys
import warnings

import pytest

import mgjit

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import attention as A  # noqa: E402


def reference(q, k, v, causal, scale):
    """o and lse in fp32, query i seeing keys 0..i when causal (SDPA's is_causal)."""
    group = q.shape[1] // k.shape[1]
    k, v = (x.float().repeat_interleave(group, 1) for x in (k, v))
    s = (q.float() @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), -float("inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def inputs(b, h, hk, sq, sk, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=g).to(dtype)
    k = torch.randn(b, hk, sk, d, generator=g).to(dtype)
    v = torch.randn(b, hk, sk, d, generator=g).to(dtype)
    return q, k, v


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")


FORWARD = [  # (b, h, hk, sq, sk, d, causal, dtype, config)
    (1, 2, 1, 200, 300, 64, False, torch.bfloat16, {}),  # GQA, ragged, Sq != Sk
    (1, 2, 2, 130, 100, 64, True, torch.float16, {}),  # causal with Sq > Sk
    (1, 2, 1, 70, 250, 128, True, torch.bfloat16, {}),
    (1, 1, 1, 65, 90, 256, False, torch.bfloat16, {}),
    (1, 2, 2, 300, 130, 64, True, torch.bfloat16, {"CONSUMERS": 3, "BN": 64}),
    (1, 1, 1, 100, 200, 64, True, torch.bfloat16, {"OVERLAP": False, "PINGPONG": False}),
    (1, 1, 1, 100, 200, 64, False, torch.bfloat16, {"PINGPONG": False, "STAGES": 3}),
    (2, 4, 1, 40, 70, 96, True, torch.bfloat16, {}),  # MQA, a head dim padded to 128
    # One consumer: beside the producer it has the 255 registers a thread can have (its setmaxnreg.inc to 240, a
    # decrease, is left out: the interpreter refused it, a GPU's behaviour is undefined)
    (1, 1, 1, 100, 200, 64, True, torch.bfloat16, {"CONSUMERS": 1, "PINGPONG": False}),
]


@pytest.mark.parametrize("b,h,hk,sq,sk,d,causal,dtype,config", FORWARD)
def test_forward_matches_torch(interpret, b, h, hk, sq, sk, d, causal, dtype, config):
    q, k, v = inputs(b, h, hk, sq, sk, d, dtype)
    scale = 0.8 / math.sqrt(d)
    o, lse = A.attention_forward(q, k, v, causal, scale, config)
    ref, ref_lse = reference(q, k, v, causal, scale)
    assert o.shape == q.shape and o.dtype == dtype
    torch.testing.assert_close(o.float(), ref, atol=1.5e-2, rtol=1e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)


def test_a_profiled_forward_records_its_spans(interpret):
    """attention_forward(..., profile=) records, in each CTA, the producer's "load K, V" per K/V block and each
    consumer's "attend" then "epilogue", and computes what it computes unprofiled."""
    q, k, v = inputs(1, 2, 1, 200, 300, 64)
    prof = mgjit.Profile()
    o, lse = A.attention_forward(q, k, v, False, 0.125, None, profile=prof)
    ref, _ = reference(q, k, v, False, 0.125)
    torch.testing.assert_close(o.float(), ref, atol=1.5e-2, rtol=1e-2)
    assert not prof.warnings, prof.warnings
    consumers, bn = A.forward_config(64, False)["CONSUMERS"], A.forward_config(64, False)["BN"]
    ctas = [(x, y, 0) for y in range(2) for x in range(-(-200 // (64 * consumers)))]
    assert sorted({s.cta for s in prof.spans}) == sorted(ctas)
    for cta in ctas:
        mine = [s for s in prof.spans if s.cta == cta]
        loads = sorted((s for s in mine if s.warpgroup == 0), key=lambda s: s.start)
        assert [s.name for s in loads] == ["load K, V"] * -(-300 // bn)
        assert all(a.end <= b.start for a, b in zip(loads, loads[1:]))
        for wg in range(1, consumers + 1):
            spans = sorted((s for s in mine if s.warpgroup == wg), key=lambda s: s.start)
            assert [s.name for s in spans] == ["attend", "epilogue"] and spans[0].end <= spans[1].start


BACKWARD = [  # (b, h, hk, sq, sk, d, causal)
    (1, 2, 1, 100, 130, 64, False),
    (1, 2, 2, 130, 100, 64, True),
    (1, 4, 2, 70, 200, 128, True),
    (1, 1, 1, 65, 90, 256, False),
    (1, 2, 1, 100, 70, 256, True),  # D = 256: GQA, causal with Sq > Sk, ragged
    (1, 2, 1, 64, 64, 96, True),
]


def assert_gradients_close(q, k, v, do, causal, grads):
    """grads (of q, k, v) against the fp32 reference's, relative to the largest of each."""
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    reference(qf, kf, vf, causal, 1 / math.sqrt(q.shape[-1]))[0].backward(do.float())
    for g, ref in zip(grads, (qf, kf, vf)):
        assert not g.isnan().any(), "some of the poisoned gradient was never written"
        err = (g.float() - ref.grad).abs().max() / ref.grad.abs().max()
        assert err < 1e-2, (err, g.shape)


@pytest.mark.parametrize("b,h,hk,sq,sk,d,causal", BACKWARD)
def test_gradients_match_torch(interpret, poison_empty, b, h, hk, sq, sk, d, causal):
    q, k, v = (x.requires_grad_() for x in inputs(b, h, hk, sq, sk, d, seed=1))
    do = torch.randn(b, h, sq, d, generator=torch.Generator().manual_seed(2)).to(q.dtype)
    A.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h != hk).backward(do)
    assert_gradients_close(q, k, v, do, causal, (q.grad, k.grad, v.grad))


BACKWARD_VARIANTS = [  # (b, h, hk, sq, sk, d, causal, config): the configurations that are no head dim's default
    (1, 4, 2, 70, 200, 128, True, {"SHARED_SCORES": False}),  # each consumer computes Sᵀ and dPᵀ whole
    (1, 2, 1, 100, 70, 256, True, {"SHARED_SCORES": False}),
    (1, 2, 1, 200, 150, 128, True, {"BM": 128, "STAGES": 1}),  # 128-row query blocks, shared scores
    (1, 1, 1, 130, 100, 128, False, {"BM": 128, "STAGES": 1}),
    (1, 2, 1, 100, 130, 64, True, {"CONSUMERS": 1}),  # one consumer, no setmaxnreg.inc
]


@pytest.mark.parametrize("config,d,message", [
    ({"BN": 96}, 64, "BN, the keys of a block, is a power of two"),  # failed in a register array of 96
    ({"BN": 8}, 64, "BN, the keys of a block, is a power of two"),
])
def test_forward_configs_it_cannot_run_are_refused_by_name(interpret, config, d, message):
    q, k, v = inputs(1, 1, 1, 100, 130, d)
    with pytest.raises(mgjit.CompileError, match=message):
        A.attention_forward(q, k, v, False, None, {"PINGPONG": False, **config})


@pytest.mark.parametrize("config,d,message", [
    # CONSUMERS=3 with SPLIT=2 read consumer 2's K part past its buffer (out of bounds on a GPU); CONSUMERS=1 with
    # SPLIT=2 and D=64 with SPLIT=2 failed in an SMEM allocation, BM=96 in a swizzle
    ({"CONSUMERS": 3}, 128, "CONSUMERS .* is a multiple of SPLIT"),
    ({"CONSUMERS": 1}, 128, "CONSUMERS .* is a multiple of SPLIT"),
    ({"SPLIT": 2}, 64, "whole 64-column blocks"),
    ({"BM": 96}, 64, "BM, the query rows of a step, is 64, 128 or 256"),
])
def test_backward_configs_it_cannot_run_are_refused_by_name(interpret, config, d, message):
    q, k, v = inputs(1, 1, 1, 100, 130, d)
    do = torch.randn_like(q)
    o, lse = A.attention_forward(q, k, v, False)
    with pytest.raises(mgjit.CompileError, match=message):
        A.attention_backward(do, q, k, v, o, lse, False, config=config)


@pytest.mark.parametrize("consumers", [0, 4, 2.0])
def test_consumers_no_launch_has_are_refused_by_name(consumers):
    """CONSUMERS=0 divided by zero in the grid; 4 was refused by the launch's count of warpgroups (5)."""
    q, k, v = inputs(1, 1, 1, 100, 130, 64)
    with pytest.raises(ValueError, match=f"CONSUMERS is 1, 2 or 3 .*got {consumers}"):
        A.attention_forward(q, k, v, False, None, {"CONSUMERS": consumers})
    o, lse = torch.zeros_like(q), torch.zeros(1, 1, 100)
    with pytest.raises(ValueError, match=f"CONSUMERS is 1, 2 or 3 .*got {consumers}"):
        A.attention_backward(q, q, k, v, o, lse, False, config={"CONSUMERS": consumers, "SPLIT": 1})


@pytest.mark.parametrize("b,h,hk,sq,sk,d,causal,config", BACKWARD_VARIANTS)
def test_backward_variants_match_torch(interpret, poison_empty, b, h, hk, sq, sk, d, causal, config):
    q, k, v = inputs(b, h, hk, sq, sk, d, seed=3)
    do = torch.randn(b, h, sq, d, generator=torch.Generator().manual_seed(4)).to(q.dtype)
    o, lse = A.attention_forward(q, k, v, causal)
    assert_gradients_close(q, k, v, do, causal, A.attention_backward(do, q, k, v, o, lse, causal, config=config))


def test_sdpa_conventions_are_checked():
    q, k, v = inputs(1, 4, 2, 64, 64, 64)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        A.scaled_dot_product_attention(q, k, v)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        A.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(64, 64, dtype=torch.bool))
    with pytest.raises(ValueError, match="positive"):
        A.attention_forward(q, q, q, scale=-1.0)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        A.attention_forward(q.float(), q.float(), q.float())


# ---------------------------------------------------------------------------------------------- sm_90a

def compile_forward(d, causal, dtype=torch.bfloat16, **config):
    q = torch.empty(2, 4, 4096, d, dtype=dtype)
    lse = torch.empty(2, 4, 4096)
    cfg = {**A.forward_config(d, causal), **config}
    consumers = cfg["CONSUMERS"]
    return A.attention_fwd.compile(q, q, q, q, lse, 0.1, D=d, CAUSAL=causal, **cfg, num_warpgroups=1 + consumers,
                                   REGISTERS=A.registers_per_consumer(consumers), target="sm_90a")


def compile_backward(d, causal, **config):
    q = torch.empty(2, 4, 4096, d, dtype=torch.bfloat16)
    rows, acc = torch.empty(2, 4, 4096), torch.empty(2, 4, 4096, d)
    cfg = {**A.backward_config(d, causal), **config}
    consumers = cfg["CONSUMERS"]
    return A.attention_bwd.compile(q, q, q, q, rows, rows, acc, q, q, 0.1, 0.1, D=d, CAUSAL=causal, **cfg,
                                   num_warpgroups=1 + consumers, REGISTERS=A.registers_per_consumer(consumers),
                                   target="sm_90a")


def dq_staging_store_line() -> int:
    """The line of the backward's store of dQ into its unswizzled staging tile: a 4-way bank conflict kept on
    purpose (one TMA box per reduce-add; a 32B swizzle's 8 boxes ran the D = 128 backward 17% slower on an H100)."""
    lines, first = inspect.getsourcelines(A.attention_bwd.fn)
    return first + next(i for i, line in enumerate(lines) if "dq_s[c][0][0][...] = dq" in line)


def assert_clean(compile_fn, *args, conflict_line: int | None = None, **kwargs):
    """No ptxas warning, no bank conflict (but at `conflict_line`), no spill, no relayout but of a splat (a zeros
    accumulator), and no wgmma group with a register written between its fence and its commit (ptxas would
    serialize it)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = compile_fn(*args, **kwargs)
    flagged = [w for w in caught if issubclass(w.category, (mgjit.PtxasWarning, mgjit.CompileWarning))
               or issubclass(w.category, mgjit.BankConflictWarning) and w.lineno != conflict_line]
    assert not flagged, [str(w.message) for w in flagged]
    assert c.spills == 0, c.ptxas_report
    relayouts = [line for line in c.ir.splitlines() if "= relayout(" in line]
    sources = {re.search(r"relayout\((%\d+)\)", line).group(1) for line in relayouts}
    for src in sources:
        assert re.search(rf"\s{src} = splat\(", c.ir), f"{src} is relayouted and is not a splat"
    for group in re.findall(r"wgmma\.fence\.sync\.aligned;(.*?)wgmma\.commit_group", c.ptx, re.S):
        assert not re.search(r"^\s*(cvt\.rn\.(bf16|f16)|mov\.b32\s+%r\d+, \{|mul\.rn\.f32)", group, re.M), \
            "an A fragment or accumulator register written inside a wgmma group"
    return c


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_compiles_clean(d, causal):
    c = assert_clean(compile_forward, d, causal)
    assert "setmaxnreg.inc.sync.aligned.u32 240" in c.ptx and "setmaxnreg.dec.sync.aligned.u32 24" in c.ptx
    assert re.search(r"bar\.sync %r\d+, 256;", c.ptx) and re.search(r"bar\.arrive %r\d+, 256;", c.ptx)  # ping-pong
    assert "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group" in c.ptx  # the TMA-store epilogue
    assert "wgmma.wait_group.sync.aligned 1;" in c.ptx  # S of the next block overlaps the softmax


def test_forward_variants_compile_clean():
    assert_clean(compile_forward, 64, True, dtype=torch.float16, CONSUMERS=3, BN=64)
    assert_clean(compile_forward, 128, False, OVERLAP=False, PINGPONG=False, STAGES=3)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_compiles_clean(d, causal):
    c = assert_clean(compile_backward, d, causal, conflict_line=dq_staging_store_line())
    assert "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add" in c.ptx  # dQ's reduce-add
    if A.backward_config(d, causal)["SHARED_SCORES"]:  # each consumer computes half of Sᵀ and of dPᵀ (N = 32)
        assert "wgmma.mma_async.sync.aligned.m64n32k16" in c.ptx and re.search(r"bar\.sync %r\d+, 256;", c.ptx)


@pytest.mark.parametrize("d,config", [(128, {"SHARED_SCORES": False}), (256, {"SHARED_SCORES": False}),
                                      (128, {"BM": 128, "STAGES": 1})])
def test_backward_variants_compile_clean(d, config):
    c = assert_clean(compile_backward, d, True, conflict_line=dq_staging_store_line(), **config)
    halves = config.get("SHARED_SCORES", True) and config.get("BM", 64) == 64  # Sᵀ, dPᵀ of 32 query columns
    assert ("wgmma.mma_async.sync.aligned.m64n32k16" in c.ptx) == halves

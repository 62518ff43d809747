"""examples/attention.py on a Hopper GPU against torch's SDPA (fp32 math on the same inputs) on fresh random
inputs, with every output buffer the wrappers allocate poisoned first: ragged lengths, each head dim, causal and
not, GQA, fp16, the forward's schedules, and the gradients through loss.backward()."""
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import attention as A  # noqa: E402

pytestmark = pytest.mark.gpu


def poison_allocator():
    """Fill freed device memory with NaN, so that outputs the kernels leave unwritten show as NaN (the wrappers
    allocate their outputs with torch.empty, which reuses this memory)."""
    torch.cuda.synchronize()
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    block.fill_(0xFF)  # 0xFFFF is a NaN in bf16, f16 and fp32
    del block


def sdpa(q, k, v, causal, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                            enable_gqa=q.shape[1] != k.shape[1])


def sdpa_lse(q, k, v, causal, scale):
    group = q.shape[1] // k.shape[1]
    s = (q.float() @ k.float().repeat_interleave(group, 1).transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril().logical_not(), -math.inf)
    return torch.logsumexp(s, -1)


CASES = [  # (b, h, hk, sq, sk, d, causal)
    (2, 8, 8, 1024, 1024, 64, False),
    (2, 8, 8, 1000, 1000, 128, True),
    (1, 8, 2, 777, 1531, 128, False),  # GQA, ragged, Sq < Sk
    (1, 4, 1, 1531, 777, 128, True),  # MQA, causal with Sq > Sk
    (2, 4, 4, 513, 513, 256, True),
    (1, 4, 4, 300, 2000, 256, False),
    (1, 2, 2, 100, 100, 96, True),  # a head dim padded to 128
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b,h,hk,sq,sk,d,causal", CASES)
def test_forward_against_sdpa(b, h, hk, sq, sk, d, causal, dtype):
    q = torch.randn(b, h, sq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, hk, sk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, hk, sk, d, device="cuda", dtype=dtype)
    scale = 0.7 / math.sqrt(d)
    poison_allocator()
    o, lse = A.attention_forward(q, k, v, causal, scale)
    ref = sdpa(q.float(), k.float(), v.float(), causal, scale)
    assert not o.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(o.float(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, sdpa_lse(q, k, v, causal, scale), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("config", [{"OVERLAP": False, "PINGPONG": False}, {"PINGPONG": False},
                                    {"CONSUMERS": 3, "BN": 64}, {"CONSUMERS": 1, "PINGPONG": False}, {"STAGES": 3},
                                    {"BN": 64}])
def test_forward_schedules(config):
    q, k, v = (torch.randn(2, 4, 1111, 128 if config.get("CONSUMERS", 2) == 2 else 64, device="cuda",
                           dtype=torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        poison_allocator()
        o, _ = A.attention_forward(q, k, v, causal, None, config)
        torch.testing.assert_close(o.float(), sdpa(q.float(), k.float(), v.float(), causal), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("d,config", [(64, {"CONSUMERS": 1, "SPLIT": 1}), (64, {"CONSUMERS": 3, "SPLIT": 1}),
                                      (128, {"CONSUMERS": 1, "SPLIT": 1, "SHARED_SCORES": False}),
                                      (128, {"SHARED_SCORES": False})])
def test_backward_schedules(d, config):
    """Backward with one consumer warpgroup (which keeps the registers it starts with), three, or both halves of D
    computing the scores whole, against float32 autograd through SDPA."""
    q, k, v, do = (torch.randn(2, 3, 333, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for causal in (False, True):
        o, lse = A.attention_forward(q, k, v, causal)
        poison_allocator()
        grads = A.attention_backward(do, q, k, v, o, lse, causal, None, config)
        qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
        sdpa(qf, kf, vf, causal).backward(do.float())
        for g, ref in zip(grads, (qf, kf, vf)):
            assert not g.isnan().any()
            err = ((g.float() - ref.grad).norm() / ref.grad.norm()).item()
            assert err < 2e-2, (err, config, causal)


@pytest.mark.parametrize("b,h,hk,sq,sk,d,causal", CASES)
def test_gradients_against_sdpa(b, h, hk, sq, sk, d, causal):
    q, k, v = (torch.randn(b, n, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for n, s in ((h, sq), (hk, sk), (hk, sk)))
    do = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
    poison_allocator()
    A.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h != hk).backward(do)
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    sdpa(qf, kf, vf, causal).backward(do.float())
    for x, ref in ((q, qf), (k, kf), (v, vf)):
        assert not x.grad.isnan().any()
        err = ((x.grad.float() - ref.grad).norm() / ref.grad.norm()).item()
        assert err < 2e-2, (err, tuple(x.shape))


def test_training_step_reduces_the_loss():
    """loss.backward() through the SDPA-style wrapper in a module: a few SGD steps lower a regression loss."""
    torch.manual_seed(0)
    x = torch.randn(2, 256, 128, device="cuda", dtype=torch.bfloat16)
    target = torch.randn(2, 256, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.nn.Linear(128, 3 * 128, device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.SGD(w.parameters(), lr=0.5)
    losses = []
    for _ in range(5):
        q, k, v = w(x).view(2, 256, 3, 2, 64).permute(2, 0, 3, 1, 4)
        out = A.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 256, 128)
        loss = (out.float() - target.float()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses

"""GPU: the grouped (mixture-of-experts) GEMM (examples/grouped_matmul.py) against torch._grouped_mm and a float32
reference on fresh random, ragged groups (empty ones too), poisoned outputs: bf16 with K- and N-major weights, 8 to
128 experts, fp8 with rowwise scales; rows between the groups must come out of their own group."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import grouped_matmul as gm  # noqa: E402


def routing(experts: int, tokens: int, empty: int, seed: int = 0) -> torch.Tensor:
    """Group sizes of a skewed random routing with `empty` experts that get no token."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(experts, generator=g) ** 3
    weights[torch.randperm(experts, generator=g)[:empty]] = 0
    sizes = torch.bincount(torch.multinomial(weights, tokens, replacement=True, generator=g), minlength=experts)
    return sizes


def problem(sizes, k, n, dtype=torch.bfloat16, layout="k"):
    offs = sizes.cumsum(0).to(torch.int32).cuda()
    x = torch.randn(int(sizes.sum()), k, device="cuda").to(dtype)
    w = torch.randn(len(sizes), n, k, device="cuda").to(dtype).transpose(1, 2) if layout == "k" else \
        torch.randn(len(sizes), k, n, device="cuda").to(dtype)
    return x, w, offs


def check(out, ref, tol=1e-2):
    assert not out.isnan().any(), "some of the output was never written"
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < tol


@pytest.mark.parametrize("experts,tokens,empty,k,n", [(8, 4096, 2, 1024, 2048), (32, 5000, 5, 2048, 1536),
                                                      (128, 8192, 20, 2048, 768), (4, 333, 1, 320, 200)])
@pytest.mark.parametrize("layout", ["k", "n"])
def test_grouped_bf16_against_torch(experts, tokens, empty, k, n, layout, poison_empty):
    x, w, offs = problem(routing(experts, tokens, empty), k, n, layout=layout)
    out = gm.grouped_matmul(x, w, offs)
    check(out, gm.reference(x, w, offs))
    check(out, torch._grouped_mm(x, w, offs=offs).float())


def test_group_edges_are_their_own_groups(poison_empty):
    """Groups of 1, 63, 64, 65 and 129 rows: each tile's last rows sit next to the next group's first."""
    sizes = torch.tensor([1, 63, 0, 64, 65, 129, 0, 3])
    x, w, offs = problem(sizes, 256, 256)
    out = gm.grouped_matmul(x, w, offs)
    ref = gm.reference(x, w, offs)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            check(out[start:end], ref[start:end])
        start = end


@pytest.mark.parametrize("experts,tokens,k,n", [(8, 4096, 1024, 2048), (64, 8192, 2048, 1408)])
def test_grouped_fp8_rowwise(experts, tokens, k, n, poison_empty):
    x, w, offs = problem(routing(experts, tokens, 3), k, n, dtype=torch.float8_e4m3fn)
    scale_x = torch.rand(x.shape[0], device="cuda") + 0.5
    scale_w = torch.rand(experts, n, device="cuda") + 0.5
    out = gm.grouped_matmul(x, w, offs, scale_x=scale_x, scale_w=scale_w)
    assert out.dtype == torch.bfloat16
    check(out, gm.reference(x, w, offs, scale_x, scale_w))

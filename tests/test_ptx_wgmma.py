"""GEMM and attention kernels from their sm_90a PTX on the CPU (tests/ptx_sim.py: warp-specialized CTAs, TMA,
wgmma, named barriers): every schedule the matmul wrapper may time for a problem (data-parallel, stream-K,
split-K, swap-AB, multicast, the GEMVs; examples/_matmul_schedules.candidates) launched as the wrapper launches
it, with few SMs so that persistent CTAs loop and stream-K cuts tiles; the grouped GEMM's two launches;
attention's forward (ping-pong consumers, causal, GQA) and backward; outputs poisoned, against torch.
A slot given back before the wgmma that reads it is waited for is caught."""
import sys
import warnings
from pathlib import Path

import pytest

import mgjit

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(Path(__file__).resolve().parent)]
import _matmul_schedules as schedules  # noqa: E402
import attention as A  # noqa: E402
import grouped_matmul as G  # noqa: E402
import matmul_hopper as mh  # noqa: E402
import ptx_sim  # noqa: E402

BF16 = torch.bfloat16


def compiled(kernel, args, constexprs, target="sm_90a"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ptxas' and the bank-conflict warnings are other tests' business
        return kernel.compile(*args, **constexprs, target=target)


def run_launches(dev, launches, target="sm_90a") -> None:
    """A wrapper's launches, in order, on the simulator: each reads what the ones before left in its memory."""
    for kernel, grid, args, constexprs in launches:
        cluster = constexprs.get("cluster") or (1,)
        dev.run(compiled(kernel, args, constexprs, target), grid, *args, cluster=cluster)


def within_rounding(got, want, k: int) -> bool:
    """A product's bf16 output against its float64 value: within the rounding, relative to the larger of the
    value and the typical size of its k-term sums."""
    return bool(((got.double() - want).abs() <= 2 ** -7 * (want.abs() + k ** 0.5)).all())


def simulate_plan(problem, cfg: dict, sms: int, scale, bias, c, lands: str = "late"):
    """c from the PTX of the launch examples/matmul_hopper._launch makes of `cfg` for `problem` on `sms` SMs,
    each of its elements stored once."""
    plan = schedules.launch_plan(problem, cfg, sms)
    if plan.gemv:
        kernel = mh.GEMV_KERNELS[plan.gemv]
        args = (problem.a_op.t() if problem.a_mn else problem.a_op, problem.b_op, c,
                c if scale is None else scale, c if bias is None else bias, *schedules.launch_workspace(plan, c))
    else:
        kernel = mh.matmul_kernel
        args = mh.kernel_args(problem, plan, c, scale, bias)
    dev = ptx_sim.Device(128 << 20)
    dev.lands = lands
    run_launches(dev, [(kernel, plan.grid, args, plan.kernel_cfg)])
    assert (dev.stores(c) == 1).all(), schedules.describe(cfg)
    return dev.fetch(c)


def check_candidates(m, n, k, sms, dtype=BF16, b_kmajor=False, a_transposed=False, scaled=False, biased=False,
                     which=None, lands="late"):
    a = torch.randn(k, m).to(dtype).t() if a_transposed else torch.randn(m, k).to(dtype)
    b = torch.randn(n, k).to(dtype) if b_kmajor else torch.randn(k, n).to(dtype)
    out_dtype = dtype if dtype.itemsize == 2 else BF16
    scale = torch.rand(1) + 0.5 if scaled else None
    bias = torch.randn(n).to(out_dtype) if biased else None
    problem = schedules.Problem.of(a, b, b_kmajor, out_dtype, scaled, biased, None)
    want = a.double() @ (b.double().t() if b_kmajor else b.double())
    want = want * (scale.double() if scaled else 1) + (bias.double() if biased else 0)
    candidates = schedules.candidates(problem, sms)
    for cfg in candidates if which is None else [candidates[i] for i in which]:
        c = torch.full((m, n), float("nan")).to(out_dtype)
        got = simulate_plan(problem, cfg, sms, scale, bias, c, lands).double()
        assert not got.isnan().any(), schedules.describe(cfg)
        assert within_rounding(got, want, k), schedules.describe(cfg)


@pytest.mark.parametrize("m,n,k,sms,kwargs", [
    (3, 256, 512, 8, dict(b_kmajor=True)),       # decode, a linear layer's weight: swap-AB and the K-major GEMVs
    (3, 256, 512, 8, {}),                        # decode, N-major weight: swap-AB and the N-major GEMVs
    (256, 512, 256, 4, dict(scaled=True, biased=True)),  # whole waves, with the epilogue; multicast B
    (256, 512, 256, 3, {}),                      # a partial last wave: stream-K
    (200, 264, 136, 8, {}),                      # small and ragged: every edge tile cut by TMA and the stores
], ids=["decode-kmajor", "decode-nmajor", "waves-epilogue", "partial-wave", "small-ragged"])
def test_every_matmul_candidate_from_its_ptx(m, n, k, sms, kwargs):
    check_candidates(m, n, k, sms, **kwargs)


def test_long_k_split_over_clusters_from_its_ptx():
    """Fewer tiles than SMs and a long K: split-K over clusters of two N-neighbours sharing their A tile (TMA
    multicast, cut tiles fixed up by the last contributor)."""
    problem_cfg = schedules.candidates(schedules.Problem.of(torch.empty(256, 16384, dtype=BF16),
                                                            torch.empty(16384, 256, dtype=BF16), False, BF16,
                                                            False, False, None), 32)[0]
    assert problem_cfg.get("MULTICAST") == "a" and problem_cfg.get("SPLIT", 1) > 1, problem_cfg
    check_candidates(256, 256, 16384, 32, which=[0])


@pytest.mark.parametrize("kwargs", [{}, dict(dtype=torch.float8_e4m3fn, b_kmajor=True)], ids=["bf16", "fp8"])
def test_swapped_tiles_sharing_the_activations_over_clusters_of_four_from_their_ptx(kwargs):
    """M of 65 to 256 rows over many weight tiles (a partial last wave on 4 SMs): swapped 64-row weight tiles on a
    cluster of four sharing the activations (M = 100 as 128 columns, each CTA multicasting 32 of them), data-parallel
    and stream-K, and 128-row swapped tiles: 20 weight tiles as 5 items of four, every one on the one cluster."""
    m, n, k, sms = 100, 1280, 128, 4
    dtype = kwargs.get("dtype", BF16)
    b = torch.empty(n, k, dtype=dtype) if kwargs.get("b_kmajor") else torch.empty(k, n, dtype=dtype)
    problem = schedules.Problem.of(torch.empty(m, k, dtype=dtype), b, bool(kwargs.get("b_kmajor")),
                                   dtype if dtype.itemsize == 2 else BF16, False, False, None)
    which = [i for i, o in enumerate(schedules.candidates(problem, sms)) if o["SWAP_AB"] and o["BM"] in (64, 128)
             and (o.get("CLUSTER") == 4 or o["BM"] == 128)]
    described = [schedules.describe(schedules.candidates(problem, sms)[i]) for i in which]
    assert len(which) == 3 and sum("multicast B x4" in d for d in described) == 2, described
    check_candidates(m, n, k, sms, which=which, **kwargs)


@pytest.mark.parametrize("b_kmajor", [False, True], ids=["b-nmajor", "b-kmajor"])
def test_tiles_fitted_to_a_wave_from_their_ptx(b_kmajor):
    """The widths examples/_matmul_schedules.wave_fitted offers a K-major B: 160 and 224 columns (the epilogue in
    32-column chunks) and 144 on three consumers stored from registers; 160 and 224 of an N-major B too (64B swizzle
    rows; explicit configs only). N cut inside the last tile (344 columns: rows of C on 16 bytes, as the wrapper
    pads them for TMA)."""
    m, n, k, sms = 200, 344, 136, 4
    a = torch.randn(m, k).to(BF16)
    b = torch.randn(n, k).to(BF16) if b_kmajor else torch.randn(k, n).to(BF16)
    problem = schedules.Problem.of(a, b, b_kmajor, BF16, False, False, None)
    want = a.double() @ (b.double().t() if b_kmajor else b.double())
    for bm, bn in [(128, 160), (128, 224)] + ([(192, 144)] if b_kmajor else []):
        cfg = schedules.config(problem, bm, bn)
        got = simulate_plan(problem, cfg, sms, None, None, torch.full((m, n), float("nan")).to(BF16)).double()
        assert within_rounding(got, want, k), schedules.describe(cfg)


@pytest.mark.parametrize("lands", ["late", "early"])
@pytest.mark.parametrize("kwargs", [dict(dtype=torch.float16), dict(dtype=torch.float8_e4m3fn, b_kmajor=True),
                                    dict(dtype=torch.float32, b_kmajor=True), dict(a_transposed=True),
                                    dict(b_kmajor=True, biased=True)],
                         ids=["f16", "fp8", "tf32", "a-transposed", "b-kmajor"])
def test_operand_forms_from_their_ptx(kwargs, lands):
    check_candidates(192, 320, 256, 4, which=[0], lands=lands, **kwargs)


@pytest.mark.parametrize("lands", ["late", "early"])
@pytest.mark.parametrize("b,h,hk,sq,sk,d,causal", [(1, 2, 2, 200, 300, 64, False), (1, 4, 2, 100, 180, 64, True),
                                                  (1, 2, 2, 130, 250, 128, False)])
def test_attention_forward_and_backward_from_their_ptx(b, h, hk, sq, sk, d, causal, lands):
    """attention_forward's launch, then attention_backward's three (delta, dK and dV with dQ reduce-added by TMA,
    dQ) on the forward's o and lse, against SDPA's output and gradients."""
    q, k, v, do = (torch.randn(*shape, d).to(BF16) for shape in ((b, h, sq), (b, hk, sk), (b, hk, sk), (b, h, sq)))
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(
        leaves[0], *(x.repeat_interleave(h // hk, 1) for x in leaves[1:]), is_causal=causal)
    want.backward(do.double())
    dev = ptx_sim.Device(128 << 20)
    dev.lands = lands
    (o, lse), launches = A.forward_launches(q, k, v, causal)
    o.fill_(float("nan"))
    run_launches(dev, launches)
    assert (dev.fetch(o).double() - want.detach()).abs().max() < 2e-2
    grads, launches = A.backward_launches(do, q, k, v, o, lse, causal)
    for g in grads:
        g.fill_(float("nan"))
    run_launches(dev, launches)
    for got, leaf in zip(grads, leaves):
        assert (dev.fetch(got).double() - leaf.grad).abs().max() < 2e-2 * max(1.0, leaf.grad.abs().max().item())


@pytest.mark.parametrize("lands", ["late", "early"])
@pytest.mark.parametrize("sizes,k,n,dtype,kmajor", [
    ([0, 70, 33, 0, 150, 1], 128, 256, BF16, True),   # empty groups, groups ending inside a tile's rows
    ([5, 0, 130, 64], 256, 128, BF16, False),         # N-major weights
    ([40, 0, 100], 256, 192, torch.float8_e4m3fn, True),  # fp8 with rowwise scales
], ids=["bf16", "nmajor", "fp8"])
def test_grouped_matmul_from_its_ptx(sizes, k, n, dtype, kmajor, lands):
    """Both launches of examples/grouped_matmul.grouped_matmul (the tile table, then the persistent matmul whose
    stores stop at each group's end through descriptors cut on the device: tensormap.replace), each output
    element stored once."""
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    m = int(offs[-1])
    x = torch.randn(m, k).to(dtype)
    w = torch.randn(len(sizes), n, k).to(dtype).transpose(1, 2) if kmajor else torch.randn(len(sizes), k, n).to(dtype)
    scales = (torch.rand(m) + 0.5, torch.rand(len(sizes), n) + 0.5) if dtype.itemsize == 1 else (None, None)
    c, launches = G.grouped_launches(x, w, offs, *scales)
    c.fill_(float("nan"))
    dev = ptx_sim.Device(64 << 20)
    dev.lands = lands
    run_launches(dev, launches)
    want = G.reference(x, w, offs, *scales).double()
    assert within_rounding(dev.fetch(c), want, k)
    assert (dev.stores(c) == 1).all()


@mgjit.kernel(num_warpgroups=2)
def ring_matmul(a, b, c, EARLY: mgjit.constexpr):
    """c (64 x 64) = a (64 x K) @ b (K x 64) through a ring of two slots: warpgroup 0 copies, warpgroup 1
    multiplies and gives a slot back once its wgmma is waited for (EARLY: right after issuing it, a race)."""
    a_s = mgjit.smem((2, 64, 64), a.dtype, swizzle=128)
    b_s = mgjit.smem((2, 64, 64), b.dtype, swizzle=128)
    full = mgjit.barrier(2, arrivals=2)
    empty = mgjit.barrier(2)
    k_tiles = mgjit.cdiv(a.shape[1], 64)
    if mgjit.warpgroup_id() == 0:
        for k in range(k_tiles):
            if k >= 2:
                empty[k % 2].wait()
            mgjit.copy_async(a, (0, k * 64), a_s[k % 2], barrier=full[k % 2])
            mgjit.copy_async(b, (k * 64, 0), b_s[k % 2], barrier=full[k % 2])
    else:
        acc = mgjit.zeros((64, 64), mgjit.float32)
        for k in range(k_tiles):
            full[k % 2].wait()
            acc = mgjit.wgmma(acc, a_s[k % 2], b_s[k % 2])
            if EARLY:
                empty[k % 2].arrive()
            mgjit.wgmma_wait(0)
            if not EARLY:
                empty[k % 2].arrive()
        c[mgjit.ds(0, 64), mgjit.ds(0, 64)] = acc.astype(c.dtype)


@pytest.mark.parametrize("early", [False, True])
def test_a_slot_given_back_before_its_wgmma_is_waited_for_is_caught(early):
    a, b = torch.randn(64, 256).to(BF16), torch.randn(256, 64).to(BF16)
    c = torch.full((64, 64), float("nan")).to(BF16)
    dev = ptx_sim.Device()
    dev.lands = "early"  # the producer's refill lands the moment it is issued
    kernel = compiled(ring_matmul, (a, b, c), dict(EARLY=early))
    if early:
        with pytest.raises(ptx_sim.SimError, match="wgmma operand .* changed before the wgmma.wait_group"):
            dev.run(kernel, (1,), a, b, c)
    else:
        dev.run(kernel, (1,), a, b, c)
        assert torch.allclose(dev.fetch(c).double(), a.double() @ b.double(), rtol=2 ** -7, atol=0.1)

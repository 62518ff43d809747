"""The Blackwell kernels from their sm_100a PTX on the CPU (tests/ptx_sim.py with tests/ptx_tcgen05.py): no
Blackwell GPU is lent to this project, so this is where their numbers are checked. examples/matmul_blackwell.py's
three shapes (M = 128 per CTA; a CTA pair's M = 256 with multicast commits; M = 64 in the half-lane layout) and
examples/matmul_blackwell_ws.py's warp-specialized persistent kernel (bf16, mxfp8 and nvfp4, one CTA and a pair;
its accumulators double-buffered in TMEM, the block scales staged through TMEM by tcgen05.cp), on aligned and
ragged shapes, outputs poisoned, against torch (the scaled formats dequantized); one block-scaled MMA of each
format (mxfp8 e4m3 and e5m2, mxfp4, nvfp4: scale_vec 1X, 2X, 4X); TMEM round trips through tcgen05.st and
tcgen05.ld in each register layout mgjit infers."""
import sys
from pathlib import Path

import pytest

import mgjit

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(Path(__file__).resolve().parent)]
import matmul_blackwell as MB  # noqa: E402
import matmul_blackwell_ws as W  # noqa: E402
import ptx_sim  # noqa: E402
import test_blackwell_scaled as scaled  # noqa: E402
from test_ptx_wgmma import run_launches, within_rounding  # noqa: E402

BF16 = torch.bfloat16


def simulate(kernel, grid, cluster, args, constexprs, lands="late"):
    dev = ptx_sim.Device(64 << 20)
    dev.lands = lands
    run_launches(dev, [(kernel, grid, args, dict(constexprs, cluster=cluster))], "sm_100a")
    return dev


def assert_product(got, a, b_t):
    assert not got.isnan().any()
    assert within_rounding(got, a.double() @ b_t.double().T, a.shape[1])


@pytest.mark.parametrize("lands", ["late", "early"])
@pytest.mark.parametrize("m,n,k", [(256, 512, 256), (200, 264, 136)])
@pytest.mark.parametrize("variant", list(MB.CONFIGS))
def test_blackwell_matmul_from_its_ptx(variant, m, n, k, lands):
    a, b = torch.randn(m, k).to(BF16), torch.randn(k, n).to(BF16)
    c = torch.full((m, n), float("nan")).to(BF16)
    cfg = MB.CONFIGS[variant]
    grid, cluster = MB._launch_shape(m, n, cfg)
    dev = simulate(MB.matmul_kernel, grid, cluster, (a, b, c), cfg, lands)
    assert_product(dev.fetch(c), a, b.t())
    assert (dev.stores(c) == 1).all()


def simulate_ws(variant: str, m: int, n: int, k: int, clc: bool):
    """examples/matmul_blackwell_ws.py's `variant` on 4 SMs (fewer CTAs than tiles), from its PTX, over fresh
    random operands (the scaled formats quantized, their scales blocked): (the device, c, the float64 product c
    should hold, of the dequantized operands)."""
    fmt = variant.split("-")[0]
    if fmt == "bf16":
        a, b_t = torch.randn(m, k).to(BF16), torch.randn(n, k).to(BF16)
        sfa = sfb = a  # unused without scales
        want = a.double() @ b_t.double().T
    else:
        (a, sa), (b_t, sb) = W.quantize(torch.randn(m, k), fmt), W.quantize(torch.randn(n, k), fmt)
        sfa, sfb = mgjit.blocked_scales(sa), mgjit.blocked_scales(sb)
        want = W.dequantize(a, sa) @ W.dequantize(b_t, sb).T
    c = torch.full((m, n), float("nan")).to(BF16)
    cfg = W.CONFIGS[variant]
    grid, cluster = W.launch_shape(m, n, cfg, clc, 4)
    return simulate(W.matmul_ws_kernel, grid, cluster, (a, b_t, c, sfa, sfb), dict(cfg, CLC=clc)), c, want


@pytest.mark.parametrize("variant,m,n,k", [("bf16", 256, 512, 320), ("bf16", 384, 264, 128),
                                           ("bf16-2cta", 512, 512, 256), ("mxfp8", 256, 384, 384),
                                           ("mxfp8-2cta", 512, 256, 256), ("nvfp4", 384, 256, 512),
                                           ("nvfp4-2cta", 512, 256, 256)])
def test_warp_specialized_blackwell_matmul_from_its_ptx(variant, m, n, k):
    """Each CTA's roles walk several tiles, the accumulators alternating; the scaled formats' scales copied to TMEM
    by tcgen05.cp beside the MMAs that read them, in a ring of STAGES slots."""
    dev, c, want = simulate_ws(variant, m, n, k, clc=False)
    got = dev.fetch(c)
    assert not got.isnan().any() and within_rounding(got, want, k)


@pytest.mark.parametrize("variant,m,n,k", [("bf16", 384, 512, 128), ("bf16-2cta", 512, 512, 192),
                                           ("mxfp8", 256, 256, 256)])
def test_warp_specialized_matmul_with_cluster_launch_control_from_its_ptx(variant, m, n, k):
    """CLC: a cluster per tile, each running cluster cancelling the launch of the next and taking its tile
    (here the first cluster takes them all: the simulator launches clusters one after another)."""
    dev, c, want = simulate_ws(variant, m, n, k, clc=True)
    got = dev.fetch(c)
    assert not got.isnan().any() and within_rounding(got, want, k)
    assert (dev.stores(c) == 1).all()


@pytest.mark.parametrize("fmt", list(scaled.FORMATS))
@pytest.mark.parametrize("collective", [False, True], ids=["1cta", "2cta"])
def test_block_scaled_mma_from_its_ptx(fmt, collective):
    """tests/test_blackwell_scaled.py's one-tile kernel (interpreted there) from its PTX: f32 accumulation of
    products exact in f32, so within f32 rounding of the dequantized float64 product."""
    m, n = (256, 256) if collective else (128, 256)
    c, want, args, consts = scaled.run_scaled(fmt, m, n, collective)
    c.fill_(float("nan"))
    ctas = 2 if collective else 1
    got = simulate(scaled.scaled_mma, (ctas,), (2, 1, 1) if collective else None, args, consts).fetch(c)
    assert not got.isnan().any()
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-6


@mgjit.kernel
def tmem_roundtrip(x, y, ROWS: mgjit.constexpr, COLS: mgjit.constexpr, PACKING: mgjit.constexpr):
    t = mgjit.tmem((ROWS, COLS), x.dtype, packing=PACKING)
    t.store(x[0:ROWS, 0:COLS])
    y[0:ROWS, 0:COLS] = t.load() * 2


@pytest.mark.parametrize("rows,cols,dtype,packing", [(128, 64, torch.float32, 1), (128, 64, BF16, 2),
                                                     (64, 128, BF16, 2), (64, 64, torch.float32, 1)])
def test_tmem_round_trips_from_their_ptx(rows, cols, dtype, packing):
    """What tcgen05.st puts in a lane and column, tcgen05.ld of the same layout gets back, in every warp's quarter
    of the lanes: the TCGEN05 register layout of 128 rows, the WGMMA one of 64."""
    x = torch.randn(rows, cols).to(dtype)
    y = torch.full_like(x, float("nan"))
    dev = simulate(tmem_roundtrip, (1,), None, (x, y), dict(ROWS=rows, COLS=cols, PACKING=packing))
    assert torch.equal(dev.fetch(y), x * 2)

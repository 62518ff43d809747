"""mgjit.cluster_reduce on the CPU: the interpreter, and the PTX compiled for sm_90a run on tests/ptx_sim.py
(clusters of CTAs taking turns between cluster barriers, DSMEM through mapa), against torch; its errors."""
import re
import sys
from pathlib import Path

import pytest

import mgjit

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_sim  # noqa: E402

CTAS, WGS, BLOCK = 4, 2, 256


@mgjit.kernel
def segment_stats(x, sums, maxima, counts, rowmax, BLOCK: mgjit.constexpr, CTAS: mgjit.constexpr,
                  WGS: mgjit.constexpr):
    """Each warpgroup of each CTA holds a segment of 2 rows; out[row, segment] gets the cluster's results."""
    seg = mgjit.cluster_rank() * WGS + mgjit.warpgroup_id()
    rows = mgjit.ds((mgjit.program_id(0) // CTAS) * 2, 2)
    v = x[rows, mgjit.ds(seg * BLOCK, BLOCK)]
    s = mgjit.cluster_reduce(v.sum(axis=1), "sum")       # an array, in a reduced layout
    m = mgjit.cluster_reduce(v.max(), "max")              # a scalar
    c = mgjit.cluster_reduce((v > 0.0).astype(mgjit.int32).sum(axis=1), "sum")
    sums[rows, seg] = s
    maxima[rows, seg] = mgjit.maximum(s * 0.0, s * 0.0) + m  # m, as a (2,) array
    counts[rows, seg] = c
    rowmax[rows, seg] = mgjit.cluster_reduce(v.min(axis=1), "min")


def inputs():
    x = torch.randn(4, CTAS * WGS * BLOCK)
    outs = [torch.full((4, CTAS * WGS), float("nan")) for _ in range(2)]
    outs.insert(2, torch.full((4, CTAS * WGS), -1, dtype=torch.int32))
    outs.append(torch.full((4, CTAS * WGS), float("nan")))
    return x, outs


def check(x, sums, maxima, counts, mins):
    seg = CTAS * WGS
    ref_sum = x.sum(1, keepdim=True).expand(-1, seg)
    assert torch.allclose(sums, ref_sum, rtol=1e-5, atol=1e-4)
    assert (sums == sums[:, :1]).all()  # every warpgroup of the cluster got the same bits
    pair_max = x.view(2, 2, -1).amax(dim=(1, 2))  # the scalar max covers the program's 2 rows
    assert torch.equal(maxima, pair_max.repeat_interleave(2)[:, None].expand(-1, seg))
    assert torch.equal(counts, (x > 0).sum(1, dtype=torch.int32)[:, None].expand(-1, seg))
    assert torch.equal(mins, x.amin(1, keepdim=True).expand(-1, seg))


def compile_stats(x, outs):
    return segment_stats.compile(x, *outs, BLOCK=BLOCK, CTAS=CTAS, WGS=WGS, target="sm_90a", num_warpgroups=WGS,
                                 cluster=(CTAS, 1, 1))


def test_interpreted():
    x, outs = inputs()
    segment_stats.interpret[(2 * CTAS,)](x, *outs, BLOCK=BLOCK, CTAS=CTAS, WGS=WGS, num_warpgroups=WGS,
                                         cluster=(CTAS, 1, 1))
    check(x, *outs)


def test_ptx_runs_on_the_simulator():
    x, outs = inputs()
    compiled = compile_stats(x, outs)
    ptx = compiled.ptx
    assert "mapa.shared::cluster.u32" in ptx and "st.shared::cluster.b32" in ptx
    # two cluster barriers per reduction: one before the slots are read, one before they may be written again
    assert len(re.findall(r"barrier\.cluster\.wait", ptx)) == 2 * 4
    dev = ptx_sim.Device()
    for t in (x, *outs):
        dev.place(t)
    dev.run(compiled, (2 * CTAS,), x, *outs, cluster=CTAS)
    check(x, *(dev.fetch(t) for t in outs))


def test_one_cta_uses_no_cluster_instruction():
    """Compiled without a cluster, the warpgroups of one CTA combine through its own shared memory."""
    x = torch.randn(4, 2 * BLOCK)
    outs = inputs()[1]
    outs = [o[:, :2].contiguous() for o in outs]
    compiled = segment_stats.compile(x, *outs, BLOCK=BLOCK, CTAS=1, WGS=2, target="sm_90a", num_warpgroups=2)
    ptx = compiled.ptx
    assert "barrier.cluster" not in ptx and "mapa" not in ptx and "shared::cluster" not in ptx
    assert "bar.sync 0" in ptx
    dev = ptx_sim.Device()
    for t in (x, *outs):
        dev.place(t)
    dev.run(compiled, (2,), x, *outs)
    sums = dev.fetch(outs[0])
    assert torch.allclose(sums, x.sum(1, keepdim=True).expand(-1, 2), rtol=1e-5, atol=1e-4)
    assert torch.equal(dev.fetch(outs[3]), x.amin(1, keepdim=True).expand(-1, 2))


@mgjit.kernel
def bad_kind(x, out):
    out[0] = mgjit.cluster_reduce(x[mgjit.ds(0, 128)].sum(), "mean")


@mgjit.kernel
def bad_dtype(x, out):
    out[mgjit.ds(0, 128)] = mgjit.cluster_reduce(x[mgjit.ds(0, 128)], "sum")


def test_errors_name_the_line():
    x = torch.zeros(128)
    with pytest.raises(mgjit.CompileError, match=r"test_cluster_reduce.py:\d+.*kind is one of"):
        bad_kind.compile(x, x, target="sm_90a")
    h = torch.zeros(128, dtype=torch.float16)
    with pytest.raises(mgjit.CompileError, match=r"test_cluster_reduce.py:\d+.*float32 or int32.*float16"):
        bad_dtype.compile(h, h, target="sm_90a")


@pytest.mark.gpu
def test_on_the_gpu():
    x, outs = inputs()
    x, outs = x.cuda(), [o.cuda() for o in outs]
    segment_stats[(2 * CTAS,)](x, *outs, BLOCK=BLOCK, CTAS=CTAS, WGS=WGS, num_warpgroups=WGS, cluster=(CTAS, 1, 1))
    torch.cuda.synchronize()
    check(x.cpu(), *(o.cpu() for o in outs))

"""mgjit.cluster_reduce and mgjit.cluster_gather on the CPU: the interpreter, and the PTX compiled for sm_90a run
on tests/ptx_sim.py (clusters of CTAs taking turns, each until it waits; DSMEM through mapa and st.async counted
on mbarriers), against torch; that an exchange costs no cluster barrier; their errors."""
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


def inputs(dtype=torch.float32):
    x = torch.randn(4, CTAS * WGS * BLOCK, dtype=dtype)
    outs = [torch.full((4, CTAS * WGS), float("nan"), dtype=dtype) for _ in range(2)]
    outs.insert(2, torch.full((4, CTAS * WGS), -1, dtype=torch.int32))
    outs.append(torch.full((4, CTAS * WGS), float("nan"), dtype=dtype))
    return x, outs


def check(x, sums, maxima, counts, mins):
    """float64 values cross the cluster as two words each: their sums to float64's rounding."""
    seg = CTAS * WGS
    ref_sum = x.sum(1, keepdim=True).expand(-1, seg)
    assert torch.allclose(sums, ref_sum, rtol=1e-5 if x.dtype == torch.float32 else 1e-13, atol=1e-4)
    assert (sums == sums[:, :1]).all()  # every warpgroup of the cluster got the same bits
    pair_max = x.view(2, 2, -1).amax(dim=(1, 2))  # the scalar max covers the program's 2 rows
    assert torch.equal(maxima, pair_max.repeat_interleave(2)[:, None].expand(-1, seg))
    assert torch.equal(counts, (x > 0).sum(1, dtype=torch.int32)[:, None].expand(-1, seg))
    assert torch.equal(mins, x.amin(1, keepdim=True).expand(-1, seg))


def compile_stats(x, outs):
    return segment_stats.compile(x, *outs, BLOCK=BLOCK, CTAS=CTAS, WGS=WGS, target="sm_90a", num_warpgroups=WGS,
                                 cluster=(CTAS, 1, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_interpreted(dtype):
    x, outs = inputs(dtype)
    segment_stats.interpret[(2 * CTAS,)](x, *outs, BLOCK=BLOCK, CTAS=CTAS, WGS=WGS, num_warpgroups=WGS,
                                         cluster=(CTAS, 1, 1))
    check(x, *outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_ptx_runs_on_the_simulator(dtype):
    x, outs = inputs(dtype)
    compiled = compile_stats(x, outs)
    ptx = compiled.ptx
    assert "mapa.shared::cluster.u32" in ptx and "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32" in ptx
    # each reduction waits on an mbarrier for the slots, not at a cluster barrier (whose release waits for every
    # load and store in flight): the entry arrives once after initialising the mbarriers, and the first exchange
    # waits there (each exchange has the wait, predicated on being the first)
    assert len(re.findall(r"mbarrier\.try_wait\.parity\.acquire\.cluster", ptx)) == 4
    assert ptx.count("barrier.cluster.arrive.relaxed.aligned") == 1 and "barrier.cluster.arrive.release" not in ptx
    assert len(re.findall(r"@first barrier\.cluster\.wait", ptx)) == 4
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
def gathered_stats(x, out, BLOCK: mgjit.constexpr, CTAS: mgjit.constexpr, WGS: mgjit.constexpr):
    """out[row, segment] = sum over the segments k of (k + 1) * (segment k's row sum) + the max of segment k's two
    rows: the sums and maxima of every segment, gathered in one exchange."""
    seg = mgjit.cluster_rank() * WGS + mgjit.warpgroup_id()
    rows = mgjit.ds((mgjit.program_id(0) // CTAS) * 2, 2)
    v = x[rows, mgjit.ds(seg * BLOCK, BLOCK)]
    sums, maxima = mgjit.cluster_gather(v.sum(axis=1), v.max())
    total = sums[0] + maxima[0]
    for k in mgjit.static_range(1, CTAS * WGS):
        total = total + sums[k] * (k + 1.0) + maxima[k]
    out[rows, seg] = total


def gathered_reference(x):
    segs = x.view(4, CTAS * WGS, BLOCK)
    sums = segs.sum(2)
    maxima = segs.view(2, 2, CTAS * WGS, BLOCK).amax(dim=(1, 3)).repeat_interleave(2, 0)
    weights = torch.arange(1, CTAS * WGS + 1, dtype=x.dtype)
    return ((sums * weights).sum(1) + maxima.sum(1))[:, None].expand(-1, CTAS * WGS)


def test_gather_interpreted_and_simulated():
    """Every warpgroup gets every slot's values (slot = rank * WGS + warpgroup), two values in one exchange: one
    mbarrier wait."""
    x = torch.randn(4, CTAS * WGS * BLOCK)
    ref = gathered_reference(x)
    out = torch.full((4, CTAS * WGS), float("nan"))
    launch = dict(BLOCK=BLOCK, CTAS=CTAS, WGS=WGS, num_warpgroups=WGS, cluster=(CTAS, 1, 1))
    gathered_stats.interpret[(2 * CTAS,)](x, out, **launch)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-4)
    compiled = gathered_stats.compile(x, out, **launch, target="sm_90a")
    assert len(re.findall(r"mbarrier\.try_wait", compiled.ptx)) == 1
    out.fill_(float("nan"))
    dev = ptx_sim.Device()
    dev.place(x)
    dev.place(out)
    dev.run(compiled, (2 * CTAS,), x, out, cluster=CTAS)
    got = dev.fetch(out)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-4) and (got == got[:, :1]).all()


@mgjit.kernel
def running_sums(x, out, steps, BLOCK: mgjit.constexpr, CTAS: mgjit.constexpr):
    """out[program, 0] = the sum over `steps` chunks of each chunk's cluster-wide sum: one reduction run in a loop."""
    rank = mgjit.cluster_rank()
    total = 0.0
    for step in range(steps):
        total = total + mgjit.cluster_reduce(x[mgjit.ds((step * CTAS + rank) * BLOCK, BLOCK)].sum(), "sum")
    out[mgjit.program_id(0), 0] = total


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_a_reduction_in_a_loop_waits_before_rewriting_its_slots(steps):
    """In a loop the slots of one reduction are written again. The simulator lets the last CTA of a turn run on
    into the next run's exchange before the others read this one: the two buffers (and mbarriers) alternate, and
    a bar.sync of the CTA precedes each write, so the sums stay exact, with no cluster barrier in the loop. Lane p
    of the first warp writes CTA p's copy of the scalar (one thread writing every CTA's in turn cost bf16 layernorm
    rows of 262144 over 16 CTAs a fifth of their time: 0.67 -> 0.81 of copy bandwidth)."""
    x = torch.randn(steps * CTAS * BLOCK)
    out = torch.full((CTAS, 1), float("nan"))
    compiled = running_sums.compile(x, out, steps, BLOCK=BLOCK, CTAS=CTAS, cluster=(CTAS, 1, 1), target="sm_90a")
    assert len(re.findall(r"barrier\.cluster\.wait", compiled.ptx)) == 1 and "bar.sync 0" in compiled.ptx
    # the scalar goes to the CTAs from CTAS lanes at once: one st.async, not one a CTA in turn
    assert len(re.findall(r"st\.async\.shared::cluster", compiled.ptx)) == 1
    dev = ptx_sim.Device()
    dev.place(x)
    dev.place(out)
    dev.run(compiled, (CTAS,), x, out, steps, cluster=CTAS)
    ref = x.view(steps, -1).sum(1).sum()
    assert torch.allclose(dev.fetch(out), ref.expand(CTAS, 1), rtol=1e-5, atol=1e-4)


@mgjit.kernel
def wide_exchanges(x, xi, out, outi, CTAS: mgjit.constexpr):
    """64-bit values through a cluster, each as two words: an int64 array summed elementwise and an int64 scalar's
    maximum (the scalar from as many lanes as CTAs), a float64 row's sums gathered."""
    rank = mgjit.cluster_rank()
    v = xi[mgjit.ds(rank * 128, 128)]
    outi[mgjit.program_id(0), mgjit.ds(0, 128)] = mgjit.cluster_reduce(v, "sum") + mgjit.cluster_reduce(v.max(), "max")
    sums = mgjit.cluster_gather(x[mgjit.ds(rank * 128, 128)].sum())
    total = sums[0]
    for k in mgjit.static_range(1, CTAS):
        total = total + sums[k] * (k + 1.0)
    out[mgjit.program_id(0)] = total


def wide_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """wide_exchanges' x and xi."""
    x = torch.randn(CTAS * 128, dtype=torch.float64) * 1e3
    xi = torch.randint(-(1 << 40), 1 << 40, (CTAS * 128,), dtype=torch.int64)
    xi[5] = (1 << 62) + 3  # sums that wrap past 2**63
    xi[128 + 5] = (1 << 62) + 7
    return x, xi


def check_wide(x, xi, out, outi) -> None:
    """wide_exchanges' results: exact int64 sums and maximum, the float64 one the same bits in every program."""
    assert torch.equal(outi, (xi.view(CTAS, 128).sum(0) + xi.max()).expand(CTAS, 128))
    want = (x.view(CTAS, 128).sum(1) * torch.arange(1, CTAS + 1, dtype=torch.float64)).sum().expand(CTAS)
    assert torch.allclose(out, want, rtol=1e-13, atol=0) and (out == out[0]).all()


def test_64_bit_values_cross_the_cluster_as_two_words():
    x, xi = wide_inputs()
    out, outi = torch.full((CTAS,), float("nan"), dtype=torch.float64), torch.zeros(CTAS, 128, dtype=torch.int64)
    launch = dict(CTAS=CTAS, cluster=(CTAS, 1, 1))
    wide_exchanges.interpret[(CTAS,)](x, xi, out, outi, **launch)
    check_wide(x, xi, out, outi)
    compiled = wide_exchanges.compile(x, xi, out, outi, **launch, target="sm_90a")
    dev = ptx_sim.Device()
    out.fill_(float("nan"))
    outi.zero_()
    for t in (x, xi, out, outi):
        dev.place(t)
    dev.run(compiled, (CTAS,), x, xi, out, outi, cluster=CTAS)
    check_wide(x, xi, dev.fetch(out), dev.fetch(outi))


@mgjit.kernel
def bad_kind(x, out):
    out[0] = mgjit.cluster_reduce(x[mgjit.ds(0, 128)].sum(), "mean")


@mgjit.kernel
def bad_dtype(x, out):
    out[mgjit.ds(0, 128)] = mgjit.cluster_reduce(x[mgjit.ds(0, 128)], "sum")


@mgjit.kernel
def bad_gather(x, out):
    out[mgjit.ds(0, 128)] = mgjit.cluster_gather(x[mgjit.ds(0, 128)])[0]


def test_errors_name_the_line():
    x = torch.zeros(128)
    with pytest.raises(mgjit.CompileError, match=r"test_cluster_reduce.py:\d+.*kind is one of"):
        bad_kind.compile(x, x, target="sm_90a")
    h = torch.zeros(128, dtype=torch.float16)
    with pytest.raises(mgjit.CompileError, match=r"test_cluster_reduce.py:\d+.*float32, int32, float64 or int64 "
                       r"values, got float16"):
        bad_dtype.compile(h, h, target="sm_90a")
    with pytest.raises(mgjit.CompileError, match=r"test_cluster_reduce.py:\d+.*float32, int32, float64 or int64 "
                       r"values, got float16"):
        bad_gather.compile(h, h, target="sm_90a")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_on_the_gpu(dtype):
    x, outs = inputs(dtype)
    x, outs = x.cuda(), [o.cuda() for o in outs]
    segment_stats[(2 * CTAS,)](x, *outs, BLOCK=BLOCK, CTAS=CTAS, WGS=WGS, num_warpgroups=WGS, cluster=(CTAS, 1, 1))
    torch.cuda.synchronize()
    check(x.cpu(), *(o.cpu() for o in outs))


@pytest.mark.gpu
def test_gather_on_the_gpu():
    x = torch.randn(4, CTAS * WGS * BLOCK)
    out = torch.full((4, CTAS * WGS), float("nan"), device="cuda")
    gathered_stats[(2 * CTAS,)](x.cuda(), out, BLOCK=BLOCK, CTAS=CTAS, WGS=WGS, num_warpgroups=WGS,
                                cluster=(CTAS, 1, 1))
    torch.cuda.synchronize()
    got = out.cpu()
    assert torch.allclose(got, gathered_reference(x), rtol=1e-5, atol=1e-4) and (got == got[:, :1]).all()


@pytest.mark.gpu
def test_64_bit_values_cross_the_cluster_on_the_gpu():
    x, xi = wide_inputs()
    out = torch.full((CTAS,), float("nan"), dtype=torch.float64, device="cuda")
    outi = torch.zeros(CTAS, 128, dtype=torch.int64, device="cuda")
    wide_exchanges[(CTAS,)](x.cuda(), xi.cuda(), out, outi, CTAS=CTAS, cluster=(CTAS, 1, 1))
    check_wide(x, xi, out.cpu(), outi.cpu())


@mgjit.kernel
def synced_sums(x, out, BLOCK: mgjit.constexpr, CTAS: mgjit.constexpr):
    """A cluster_sync, then a reduction: the kernel's other cluster barrier decides how the exchanges' mbarriers
    are published at the entry."""
    rank = mgjit.cluster_rank()
    mgjit.cluster_sync()
    out[mgjit.program_id(0), 0] = mgjit.cluster_reduce(x[mgjit.ds(rank * BLOCK, BLOCK)].sum(), "sum")


def test_a_kernel_with_cluster_syncs_waits_for_the_mbarriers_at_its_entry():
    """Where the kernel has cluster barriers of its own, the entry arrives and waits after initialising the
    mbarriers (a split arrive would pair with the kernel's own wait); the sums stay exact on the simulator."""
    x = torch.randn(CTAS * BLOCK)
    out = torch.full((CTAS, 1), float("nan"))
    compiled = synced_sums.compile(x, out, BLOCK=BLOCK, CTAS=CTAS, cluster=(CTAS, 1, 1), target="sm_90a")
    assert "@first barrier.cluster.wait" not in compiled.ptx
    entry = compiled.ptx.index("fence.mbarrier_init.release.cluster")
    own = compiled.ptx.index("barrier.cluster.arrive.release")  # the kernel's cluster_sync
    assert compiled.ptx.index("barrier.cluster.wait.aligned", entry) < own
    dev = ptx_sim.Device()
    dev.place(x)
    dev.place(out)
    dev.run(compiled, (CTAS,), x, out, cluster=CTAS)
    assert torch.allclose(dev.fetch(out), x.sum().expand(CTAS, 1), rtol=1e-5, atol=1e-4)

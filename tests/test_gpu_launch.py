"""GPU: the C launch path (issue 13). Launches through it compute what torch computes whatever the arguments'
alignment, strides, dtypes and streams; empty grids do nothing; launches are captured in CUDA graphs and
replayed on new data copied into the static inputs (an elementwise kernel, the Hopper matmul with its TMA
descriptors, an autotuned kernel); a miss during capture is a clear error; and models calling mgjit ops run
under torch.compile (fullgraph) and its CUDA graphs (mode="reduce-overhead")."""
import os
import sys
import threading

import pytest

import mgjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import model as bench_model  # noqa: E402
from model import example  # noqa: E402


@mgjit.kernel
def axpby(x, y, out, alpha, beta, n, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    i = start + mgjit.arange(BLOCK)
    v = x[mgjit.ds(start, BLOCK)].astype(mgjit.float32) * alpha + y[mgjit.ds(start, BLOCK)].astype(mgjit.float32) * beta
    out[mgjit.ds(start, BLOCK)] = mgjit.where(i < n, v, 0.0).astype(out.dtype)


def _launch(x, y, out, alpha=2.0, beta=-1.0, block=1024):
    axpby[(-(-x.shape[0] // block),)](x, y, out, alpha, beta, x.shape[0], BLOCK=block)


def _expected(x, y, alpha=2.0, beta=-1.0):
    return (x.float() * alpha + y.float() * beta).to(x.dtype)


@mgjit.kernel
def cluster_sums(x, out, BLOCK: mgjit.constexpr, CTAS: mgjit.constexpr):
    """out[row, rank] = the sum of x's row, each CTA of a cluster summing its BLOCK columns of it."""
    rank = mgjit.cluster_rank()
    rows = mgjit.ds(mgjit.program_id(0) // CTAS, 1)
    out[rows, rank] = mgjit.cluster_reduce(x[rows, mgjit.ds(rank * BLOCK, BLOCK)].sum(axis=1), "sum")


@pytest.mark.parametrize("ctas", [8, 12, 16])
def test_clusters_past_the_portable_size_launch(ctas):
    """Clusters of 9 to 16 CTAs (Hopper's non-portable limit, which mgjit accepts) launch: without the function's
    opt-in they failed with CUDA_ERROR_INVALID_CLUSTER_SIZE."""
    x = torch.randn(6, ctas * 256, device="cuda")
    out = torch.full((6, ctas), float("nan"), device="cuda")
    cluster_sums[(6 * ctas,)](x, out, BLOCK=256, CTAS=ctas, cluster=(ctas, 1, 1))
    torch.testing.assert_close(out, x.sum(1, keepdim=True).expand(-1, ctas), rtol=1e-5, atol=1e-4)


def test_the_c_launcher_is_in_use():
    from mgjit import fastlaunch
    assert fastlaunch.load() is not None, fastlaunch.failure()
    x = torch.randn(4096, device="cuda")
    out = torch.full_like(x, float("nan"))
    _launch(x, x, out)
    assert axpby._native is not None and axpby._native.plan_count() >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_alignment_strides_and_offsets_get_their_own_plans(dtype):
    base = torch.randn(1 << 16, device="cuda", dtype=dtype)
    other = torch.randn(1 << 16, device="cuda", dtype=dtype)
    for offset, length in [(0, 1 << 15), (1, 4097), (3, 1000), (8, 12345), (0, 7)]:
        x, y = base[offset:offset + length], other[offset + 2:offset + 2 + length]
        out = torch.full((length + 5,), float("nan"), device="cuda", dtype=dtype)[5:]
        _launch(x, y, out)
        torch.testing.assert_close(out, _expected(x, y))
    x = base[::2][:5000]  # a strided input
    out = torch.full((5000,), float("nan"), device="cuda", dtype=dtype)
    _launch(x, x, out, 1.0, 1.0)
    torch.testing.assert_close(out, _expected(x, x, 1.0, 1.0))


def test_a_side_stream_and_a_new_thread():
    x, y = torch.randn(100_000, device="cuda"), torch.randn(100_000, device="cuda")
    out = torch.full_like(x, float("nan"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(20):  # queued behind one another on the side stream, never on the default one
            _launch(x, y, out)
    stream.synchronize()
    torch.testing.assert_close(out, _expected(x, y))
    out2 = torch.full_like(x, float("nan"))
    errors = []

    def worker():
        try:
            _launch(x, y, out2, 3.0, 1.0)
            torch.cuda.synchronize()
        except Exception as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errors, errors
    torch.testing.assert_close(out2, _expected(x, y, 3.0, 1.0))


def test_empty_grids_and_empty_batches():
    x = torch.empty(0, device="cuda")
    axpby[(0,)](x, x, x, 1.0, 1.0, 0, BLOCK=1024)
    axpby[(0, 4)](x, x, x, 1.0, 1.0, 0, BLOCK=1024)
    torch.cuda.synchronize()
    with pytest.raises(mgjit.LaunchError, match="grid"):
        axpby[(-1,)](x, x, x, 1.0, 1.0, 0, BLOCK=1024)
    rmsnorm = example("rmsnorm")
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    assert rmsnorm.rmsnorm_op(torch.empty(0, 4096, device="cuda", dtype=torch.bfloat16), w, 1e-6).shape == (0, 4096)


def test_cuda_graph_replays_an_elementwise_kernel_on_new_data():
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    out = torch.full_like(x, float("nan"))
    _launch(x, y, out)  # warm-up: compiles and makes the plan
    torch.cuda.synchronize()

    def allocations() -> int:
        return torch.cuda.memory_stats()["allocation.all.allocated"]  # every allocation the caching allocator made

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # torch's capture allocates its own state: only the launch is counted
        before = allocations()
        _launch(x, y, out, 0.5, 2.0)
        during = allocations() - before
    assert during == 0  # the launch allocated nothing
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        y.copy_(torch.randn_like(y))
        out.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(out, _expected(x, y, 0.5, 2.0))


def test_a_miss_during_capture_is_a_clear_error():
    x = torch.randn(4096, device="cuda", dtype=torch.float16)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(mgjit.LaunchError, match="warm-up"):
        with torch.cuda.graph(graph):
            axpby[(32,)](x, x, x, 1.0, 1.0, 4096, BLOCK=128)  # a specialization never launched before


def test_cuda_graph_replays_the_hopper_matmul_with_its_tma_descriptors():
    hopper = example("matmul_hopper")
    a = torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 768, device="cuda", dtype=torch.bfloat16)
    hopper.matmul(a, b, activation="relu")  # warm-up: the same specialization as the captured call
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = hopper.matmul(a, b, activation="relu")
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        c.fill_(float("nan"))
        graph.replay()
        ref = torch.relu(a.float() @ b.float())
        assert ((c.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_cuda_graph_replays_an_autotuned_kernel(monkeypatch, tmp_path):
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    tuned = mgjit.autotune(configs=[mgjit.Config(BLOCK=b) for b in (512, 1024, 2048)], key=["n"])(
        mgjit.kernel(axpby.fn))
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    out = torch.full_like(x, float("nan"))

    def grid(meta):
        return (-(-meta["n"] // meta["BLOCK"]),)

    tuned[grid](x, y, out, 2.0, 1.0, x.shape[0])  # tunes
    tuned[grid](x, y, out, 2.0, 1.0, x.shape[0])  # the C path's memo
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tuned[grid](x, y, out, 2.0, 1.0, x.shape[0])
    x.copy_(torch.randn_like(x))
    out.fill_(float("nan"))
    graph.replay()
    torch.testing.assert_close(out, _expected(x, y, 2.0, 1.0))
    with pytest.raises(mgjit.LaunchError, match="cannot tune while a CUDA graph"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            tuned[grid](x[:1000], y[:1000], out[:1000], 2.0, 1.0, 1000)


def test_a_first_sweep_inside_a_torch_compile_warm_up(monkeypatch, tmp_path):
    """An autotuner's first sweep (a timer of its own, nothing tuned on disk) inside torch.compile's CUDA-graph
    warm-up: what the sweep keeps, the timer's L2 flush buffer, must not stay in the graphs' pool ("1 tensor(s) in
    the cudagraph pool not tracked as outputs", seen once on a fresh cache where a worker's first sweep was
    there); then replays match."""
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    tuned = mgjit.autotune(configs=[mgjit.Config(BLOCK=b) for b in (512, 1024)], key=["n"],
                           timer=mgjit.autotune.CudaEventTimer(warmup_ms=1, rep_ms=2))(mgjit.kernel(axpby.fn))

    @mgjit.torch_op("mgjit_tests::axpby_first_sweep", outputs=lambda x, y: (x.shape, x.dtype))
    def axpby_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        tuned[lambda meta: (-(-meta["n"] // meta["BLOCK"]),)](x, y, out, 2.0, 1.0, x.shape[0])
        return out

    compiled = torch.compile(lambda x, y: axpby_op(x, y) + 1.0, fullgraph=True, mode="reduce-overhead")
    for _ in range(4):  # warm-up (the sweep), recording, replays
        x, y = torch.randn(1 << 16, device="cuda"), torch.randn(1 << 16, device="cuda")
        torch.testing.assert_close(compiled(x, y), _expected(x, y, 2.0, 1.0) + 1.0)


@pytest.mark.parametrize("tokens", [64, 512])
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_runs_mgjit_ops_without_graph_breaks(mode, tokens):
    """benchmarks/model.py's model of mgjit custom ops, against the same model in plain torch. 64 tokens take
    stream-K schedules, whose workspace (kept across launches) torch's CUDA graphs must not see in their pool."""
    ops = {"matmul": example("matmul_hopper"), "rmsnorm": example("rmsnorm")}
    mgjit_model, torch_model = bench_model.model(1024, ops), bench_model.model(1024, None)
    compiled = torch.compile(mgjit_model, fullgraph=True, mode=mode)
    with torch.no_grad():
        for _ in range(4):  # warm-up runs, then CUDA graph replays for reduce-overhead
            x = torch.randn(tokens, 1024, device="cuda", dtype=torch.bfloat16)
            out = compiled(x).float()
            ref = torch_model(x).float()
            assert ((out - ref).norm() / ref.norm()).item() < 3e-2

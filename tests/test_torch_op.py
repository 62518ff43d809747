"""mgjit.torch_op on the CPU: the fake implementation gives torch.compile the declared outputs, a model calling
the op compiles with fullgraph=True (no graph break) into a graph where the op is one node, and the compiled
model and its gradient (the registered formula) match torch. The real implementation runs in the interpreter
(MGJIT_INTERPRET=1); tests/test_gpu_launch.py runs the same on a GPU, under CUDA graphs too."""
import pytest

import mgjit

torch = pytest.importorskip("torch")


@mgjit.kernel
def axpy_kernel(x, y, out, alpha, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    out[mgjit.ds(start, BLOCK)] = x[mgjit.ds(start, BLOCK)] * alpha + y[mgjit.ds(start, BLOCK)]


def _backward(ctx, grad):
    return grad * ctx.alpha, grad, None


def _setup(ctx, inputs, output):
    ctx.alpha = inputs[2]


@mgjit.torch_op("mgjit_tests::axpy", outputs=lambda x, y, alpha: (x.shape, x.dtype), backward=_backward,
                setup_context=_setup)
def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    out = torch.empty_like(x)
    axpy_kernel[(-(-x.numel() // 256),)](x, y, out, alpha, BLOCK=256)
    return out


@mgjit.torch_op("mgjit_tests::split_halves", outputs=lambda x: [((x.shape[0] // 2,), x.dtype)] * 2)
def split_halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = x.shape[0] // 2
    return x[:half].clone(), x[half:2 * half].clone()


def model(x, y):
    return torch.relu(axpy(x, y, 2.0)) * 3 - y


def reference(x, y):
    return torch.relu(x * 2.0 + y) * 3 - y


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")


def test_the_fake_implementation_declares_the_outputs_without_launching(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr(type(axpy_kernel), "__getitem__", lambda *a: pytest.fail("launched while tracing"))
    with FakeTensorMode():
        x = torch.empty(1000, 3, dtype=torch.bfloat16)
        out = axpy(x, x, 0.5)
        a, b = split_halves(torch.empty(9))
    assert out.shape == (1000, 3) and out.dtype == torch.bfloat16
    assert a.shape == b.shape == (4,) and a.dtype == torch.float32


def test_fullgraph_compile_has_the_op_as_one_node_and_matches_torch(interpret):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x, y = torch.randn(1000), torch.randn(1000)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(x, y), reference(x, y))
    (graph,) = graphs
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and "mgjit_tests.axpy" in str(n.target)]
    assert len(calls) == 1


def test_autograd_through_the_compiled_op(interpret):
    x, y = torch.randn(512, requires_grad=True), torch.randn(512, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(x, y).sum().backward()
    xr, yr = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    reference(xr, yr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(y.grad, yr.grad)


def test_opcheck(interpret):
    torch.library.opcheck(axpy, (torch.randn(300), torch.randn(300), 0.5))
    torch.library.opcheck(split_halves, (torch.randn(10),))


def test_registration_errors():
    def untyped(x):
        return x

    with pytest.raises(TypeError, match="needs a type annotation"):
        mgjit.torch_op("mgjit_tests::untyped", outputs=lambda x: (x.shape, x.dtype))(untyped)
    with pytest.raises(TypeError, match="no parameter 'z'"):
        mgjit.torch_op("mgjit_tests::typo", outputs=lambda x: (x.shape, x.dtype), params=["z"])(axpy_kernel.fn)


def test_registering_again_replaces_the_code_and_keeps_the_schema(interpret):
    calls = []

    def first(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def second(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x * 3

    op = mgjit.torch_op("mgjit_tests::again", outputs=lambda x: (x.shape, x.dtype))(first)
    again = mgjit.torch_op("mgjit_tests::again", outputs=lambda x: (x.shape, x.dtype))(second)
    x = torch.randn(4)
    assert again is op
    torch.testing.assert_close(op(x), x * 3)
    assert calls == [1]

    def other(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(ValueError, match="schema cannot change"):
        mgjit.torch_op("mgjit_tests::again", outputs=lambda x, y: (x.shape, x.dtype))(other)


def test_an_op_over_some_of_the_wrappers_parameters_passes_them_by_name(interpret):
    def shifted(x: torch.Tensor, out: torch.Tensor | None = None, shift: float = 1.0) -> torch.Tensor:
        assert out is None
        return x + shift

    op = mgjit.torch_op("mgjit_tests::shifted", outputs=lambda x, shift=1.0: (x.shape, x.dtype),
                        params=["x", "shift"])(shifted)
    x = torch.randn(5)
    torch.testing.assert_close(op(x, 2.0), x + 2)
    torch.testing.assert_close(torch.compile(lambda t: op(t, 3.0), fullgraph=True, backend="aot_eager")(x), x + 3)


def test_the_examples_ops_compile_fullgraph(interpret):
    import importlib.util
    import pathlib
    import sys
    examples = pathlib.Path(__file__).resolve().parent.parent / "examples"
    sys.path.insert(0, str(examples))
    ops = {}
    for name in ("softmax", "rmsnorm", "matmul_hopper"):
        spec = importlib.util.spec_from_file_location(f"torch_op_{name}", examples / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        ops[name] = module
    x, w = torch.randn(5, 256), torch.randn(256)

    def block(x, w):
        return ops["softmax"].softmax_op(ops["rmsnorm"].rmsnorm_op(x, w, 1e-5)) * 2

    out = torch.compile(block, fullgraph=True, backend="aot_eager")(x, w)
    expected = torch.softmax(torch.nn.functional.rms_norm(x, (256,), w, 1e-5), dim=1) * 2
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        a, b = torch.empty(100, 64, dtype=torch.bfloat16), torch.empty(64, 32, dtype=torch.bfloat16)
        c = ops["matmul_hopper"].matmul_op(a, b, None, None, "relu")
    assert c.shape == (100, 32) and c.dtype == torch.bfloat16


class _Stream:
    synchronized = 0

    def synchronize(self):
        _Stream.synchronized += 1


def test_outside_graph_pools_runs_on_a_thread_of_its_own(monkeypatch):
    """Tensors kept across calls are made on another thread (torch.compile's CUDA graphs route the calling thread's
    allocations into their pool while they warm up or record), its work waited for and its errors raised here; in
    place inside a capture, and off CUDA."""
    import threading
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    before = _Stream.synchronized
    assert mgjit.outside_graph_pools(threading.get_ident, cuda) != threading.get_ident()
    assert _Stream.synchronized == before + 1

    def fails():
        raise MemoryError("out of memory in the other thread")
    with pytest.raises(MemoryError, match="other thread"):
        mgjit.outside_graph_pools(fails, cuda)
    capturing[0] = True
    assert mgjit.outside_graph_pools(threading.get_ident, cuda) == threading.get_ident()
    capturing[0] = False
    assert mgjit.outside_graph_pools(threading.get_ident, torch.device("cpu")) == threading.get_ident()


def test_the_autotune_timer_keeps_its_flush_buffer_outside_graph_pools(monkeypatch):
    """The default timer's L2 flush buffer, kept across sweeps, is made through outside_graph_pools: a first sweep
    inside a "reduce-overhead" warm-up left it in the CUDA graphs' pool."""
    import importlib

    from mgjit.autotune import timing
    made = []
    module = importlib.import_module("mgjit.torch_op")  # mgjit.torch_op is the decorator
    monkeypatch.setattr(module, "outside_graph_pools", lambda make, device: made.append(device) or "buffer")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    timer = timing.CudaEventTimer(flush_bytes=1 << 10)
    assert timer._flush_buffer(torch) == "buffer" and timer._flush_buffer(torch) == "buffer"
    assert made == [torch.device("cuda", 3)]  # once per device

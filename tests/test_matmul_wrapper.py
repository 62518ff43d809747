"""The Hopper matmul wrapper's cached calls (examples/matmul_hopper.py, `_Prepared`) on a stub GPU
(tests/launch_stub.py): a call like an earlier one launches the same compiled kernel on the same grid with the
same arguments as the full path does, for row-major, swapped (decode), transposed, strided and misaligned
operands; a change of any ingredient of the call key takes the full path again; and, interpreted, a cached
call computes what torch does."""
import os
import sys
import struct

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import _device  # noqa: E402
import _matmul_schedules as schedules  # noqa: E402
import matmul_hopper as mh  # noqa: E402

BF16, F16 = torch.bfloat16, torch.float16


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A stub GPU of 132 SMs with empty wrapper tables; counts the wrapper's full-path calls (`choose`) and
    names the tensors it makes (outputs, copies) so that launches can be compared across calls."""
    from launch_stub import StubGPU
    try:
        stub = StubGPU(monkeypatch)
    except RuntimeError as e:  # no C compiler or no DLPack exchange API: nothing to test here
        pytest.skip(f"the C launcher is unavailable: {e}")
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    # The kernel's launch path is made afresh, on the stub's C launcher (an earlier test may have made it without)
    for attr, fresh in (("_entry", None), ("_native", None), ("_c_module", None), ("_dispatch", None), ("_plans", {})):
        monkeypatch.setattr(mh.matmul_kernel, attr, fresh)
    monkeypatch.setattr(mh, "sm_count", lambda device: 132)
    for table in ("_CHOSEN", "_PLANS"):
        monkeypatch.setattr(schedules, table, {})
    monkeypatch.setattr(_device, "_KEPT", {})
    monkeypatch.setattr(mh, "_PREPARED", {})
    stub.full_calls = 0
    stub.made = {}  # address -> what the wrapper made there
    choose, output, tma_ready = schedules.choose, mh._output, mh._tma_ready

    def counted_choose(*args, **kwargs):
        stub.full_calls += 1
        return choose(*args, **kwargs)

    def named_output(*args):
        c = output(*args)
        stub.made[c.data_ptr()] = "c"
        return c

    def named_ready(t):
        ready = tma_ready(t)
        if ready.data_ptr() != t.data_ptr():
            stub.made[ready.data_ptr()] = f"padded {tuple(t.shape)}"
        return ready

    monkeypatch.setattr(schedules, "choose", counted_choose)
    monkeypatch.setattr(mh, "_output", named_output)
    monkeypatch.setattr(mh, "_tma_ready", named_ready)
    return stub


def described(launch, gpu, inputs: dict) -> tuple:
    """A launch with every address named (an input, or what the wrapper made), in its parameters and in its TMA
    descriptors (the stub encodes a descriptor's address as its second word)."""
    names = {**gpu.made, **{t.data_ptr(): name for name, t in inputs.items()}}
    values = []
    for v in launch.values:
        if isinstance(v, bytes):
            words = list(struct.unpack("<16Q", v))
            words[1] = names.get(words[1], words[1])
            values.append(("descriptor", *words))
        else:
            values.append(names.get(v, v) if isinstance(v, int) and not isinstance(v, bool) else v)
    return (launch.function, launch.grid, launch.threads, launch.smem, launch.cluster, tuple(values))


def misaligned(m, k, dtype=BF16):
    """An (m, k) tensor 2 bytes past a 16-byte boundary: TMA cannot read it, the wrapper pads a copy."""
    t = torch.randn(m * k + 1, dtype=dtype)[1:].view(m, k)
    assert t.data_ptr() % 16 != 0
    return t


CASES = {  # name: (a, b, keyword arguments)
    "decode-swap-ab-bias-gelu": (lambda: torch.randn(16, 256, dtype=BF16), lambda: torch.randn(256, 512, dtype=BF16),
                                 lambda: dict(bias=torch.randn(512, dtype=BF16), activation="gelu")),
    "data-parallel": (lambda: torch.randn(256, 128, dtype=BF16), lambda: torch.randn(128, 256, dtype=BF16), dict),
    "misaligned-a-relu": (lambda: misaligned(200, 128), lambda: torch.randn(128, 256, dtype=BF16),
                          lambda: dict(activation="relu")),
    "transposed-views-f16": (lambda: torch.randn(128, 200, dtype=F16).t(), lambda: torch.randn(256, 128, dtype=F16).t(),
                             dict),
    "strided-a-scaled": (lambda: torch.randn(200, 264, dtype=BF16)[:, 8:136],
                         lambda: torch.randn(128, 256, dtype=BF16), lambda: dict(scale=torch.tensor([0.5]))),
}


@pytest.mark.parametrize("case", CASES)
def test_a_cached_call_launches_what_the_full_path_launches(gpu, case):
    """Per case, three calls: the first takes the full path and is remembered; the second launches from what it
    remembered; the third takes the full path again (the table emptied) on the same inputs. The cached launch
    is the full path's: same compiled kernel, grid, block, shared memory, cluster, arguments and descriptors
    (the output, and any padded copy, named by what they are)."""
    make_a, make_b, make_kwargs = CASES[case]
    a, b, kwargs = make_a(), make_b(), make_kwargs()
    inputs = {"a": a, "b": b, **{k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}}
    mh.matmul(a, b, **kwargs)
    assert gpu.full_calls == 1 and len(mh._PREPARED) == 1
    first = described(gpu.launches[-1], gpu, inputs)
    c = mh.matmul(a, b, **kwargs)
    assert gpu.full_calls == 1, "the second call is the cached one"
    assert c.shape == (a.shape[0], b.shape[1]) and c.dtype == a.dtype
    cached = described(gpu.launches[-1], gpu, inputs)
    mh._PREPARED.clear()
    mh.matmul(a, b, **kwargs)
    assert gpu.full_calls == 2
    again = described(gpu.launches[-1], gpu, inputs)
    assert cached == first == again
    assert gpu.launches[-1].path == "c"
    if case.startswith("misaligned"):
        assert any(isinstance(v, tuple) and v[2] == "padded (200, 128)" for v in cached[-1])


def test_each_ingredient_of_the_call_key_takes_the_full_path(gpu, monkeypatch):
    """A call that differs from a remembered one in any ingredient of its key is not served from it: shape,
    dtype, strides, alignment, scale, bias, activation, output dtype, K-major b, stream, SM count, or a
    replaced table of chosen schedules. Each such call is then remembered, and cached from the next on."""
    a, b = torch.randn(16, 128, dtype=BF16), torch.randn(128, 256, dtype=BF16)
    bias = torch.randn(256, dtype=BF16)
    mh.matmul(a, b, bias=bias)
    variants = {
        "shape": lambda: mh.matmul(torch.randn(32, 128, dtype=BF16), b, bias=bias),
        "dtype": lambda: mh.matmul(a.to(F16), b.to(F16), bias=bias.to(F16)),
        "strides": lambda: mh.matmul(a, b.t().contiguous().t(), bias=bias),
        "alignment": lambda: mh.matmul(misaligned(16, 128), b, bias=bias),
        "scale": lambda: mh.matmul(a, b, bias=bias, scale=torch.tensor([2.0])),
        "no bias": lambda: mh.matmul(a, b),
        "activation": lambda: mh.matmul(a, b, bias=bias, activation="relu"),
        "output dtype": lambda: mh.matmul(a, b, bias=bias, out_dtype=torch.float32),
        "K-major b": lambda: mh.matmul(a, b.t().contiguous(), bias=bias, b_kmajor=True),
    }
    for name, call in variants.items():
        before = gpu.full_calls
        call()
        assert gpu.full_calls == before + 1, f"a call with another {name} was served from the cache"
        call()
        assert gpu.full_calls == before + 1, f"the call with another {name} was not remembered"
    before = gpu.full_calls
    with pytest.MonkeyPatch.context() as stream:
        for module in (mh, schedules):  # the call key, and the workspace key
            stream.setattr(module, "current_stream", lambda device: 7)
        mh.matmul(a, b, bias=bias)
    assert gpu.full_calls == before + 1, "a call on another stream was served from the cache"
    monkeypatch.setattr(mh, "sm_count", lambda device: 66)
    mh.matmul(a, b, bias=bias)
    assert gpu.full_calls == before + 2, "a call on a GPU of other SMs was served from the cache"
    monkeypatch.setattr(schedules, "_CHOSEN", {})
    mh.matmul(a, b, bias=bias)
    assert gpu.full_calls == before + 3, "a call after the chosen schedules were replaced was served from the cache"
    with pytest.raises(ValueError, match="activation"):
        mh.matmul(a, b, activation="silu")


def test_cached_calls_compute_what_torch_does(monkeypatch, poison_empty):
    """Interpreted (on a GPU of 3 SMs, outputs poisoned with NaN): the second call of a shape, on fresh inputs,
    served from the cache, is right for a swapped decode shape with the whole epilogue and for a misaligned
    operand."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(mh, "sm_count", lambda device: 3)
    monkeypatch.setattr(_device, "_KEPT", {})
    monkeypatch.setattr(mh, "_PREPARED", {})
    bias, scale = torch.randn(136, dtype=BF16), torch.tensor([0.5])
    cases = ((lambda: torch.randn(3, 128, dtype=BF16), dict(scale=scale, bias=bias, activation="gelu"),
              lambda exact: torch.nn.functional.gelu(exact * 0.5 + bias.float())),
             (lambda: misaligned(70, 64), {}, lambda exact: exact))
    for make_a, kwargs, epilogue in cases:
        for call in ("full", "cached"):
            a = make_a()
            b = torch.randn(a.shape[1], 136, dtype=BF16)
            prepared = len(mh._PREPARED)
            c = mh.matmul(a, b, **kwargs)
            assert len(mh._PREPARED) == prepared + (call == "full")
            ref = epilogue(a.double() @ b.double())
            assert not c.isnan().any(), "some of the poisoned output was never written"
            assert ((c.double() - ref).norm() / ref.norm()).item() < 5e-3, (call, tuple(a.shape))


def test_an_a_of_more_dimensions_is_rows_as_torch_matmul_takes_it(monkeypatch, poison_empty):
    """(..., M, K) @ (K, N), a linear layer's call: a's leading dimensions are rows (ValueError before); an a whose
    rows are no view (its leading dimensions transposed) is copied; b given (N, K) too; the epilogue applies."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(mh, "sm_count", lambda device: 3)
    bias = torch.randn(48, dtype=BF16)
    for a in (torch.randn(2, 3, 40, 64, dtype=BF16), torch.randn(40, 3, 64, dtype=BF16).transpose(0, 1)):
        w = torch.randn(48, 64, dtype=BF16)
        c = mh.matmul(a, w.t(), bias=bias, activation="relu")
        ref = torch.relu(a.double() @ w.double().t() + bias.double())
        assert c.shape == (*a.shape[:-1], 48) and ((c.double() - ref).norm() / ref.norm()).item() < 5e-3
        c = mh.matmul(a, w, b_kmajor=True)
        assert ((c.double() - a.double() @ w.double().t()).norm() / ref.norm()).item() < 5e-3


def test_products_of_an_empty_dimension_are_what_torch_gives(monkeypatch):
    """M or N of 0 raised ZeroDivisionError and K of 0 a CompileError about TMA alignment: now an empty c, or for
    K of 0 the epilogue of a zero accumulator (act(0 * scale + bias)), without a launch; a bias of another shape is
    still refused by name."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    for m, n, k in ((0, 64, 64), (64, 0, 64), (64, 48, 0), (0, 0, 0)):
        a, b = torch.randn(m, k, dtype=BF16), torch.randn(k, n, dtype=BF16)
        c = mh.matmul(a, b)
        assert c.shape == (m, n) and c.dtype == BF16 and torch.equal(c, (a.float() @ b.float()).to(BF16))
    bias, scale = torch.randn(48), torch.tensor([3.0])
    for activation, act in ((None, lambda t: t), ("relu", torch.relu), ("gelu", torch.nn.functional.gelu)):
        c = mh.matmul(torch.randn(5, 0, dtype=BF16), torch.randn(0, 48, dtype=BF16), scale=scale, bias=bias,
                      activation=activation)
        # torch's gelu of a stride-0 (expanded) tensor takes its scalar path, an ulp off the vectorized one: the
        # reference is the contiguous rows the wrapper applies it to
        assert torch.equal(c, act(bias.expand(5, 48).contiguous()).to(BF16)), activation
    with pytest.raises(ValueError, match=r"matmul: bias must be of shape \(48,\), got \(47,\)"):
        mh.matmul(torch.randn(5, 0, dtype=BF16), torch.randn(0, 48, dtype=BF16), bias=bias[1:])

"""Piped rows (examples/_rows_piped.py) without a GPU: every piped mapping of softmax interpreted over more rows
than the programs' rings hold (a grid of 2 SMs), rows starting anywhere in a line of the flattened tensor and a
last partial line; which mappings are offered, for which tensors; registers at sm_90a."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import _rows  # noqa: E402
import _rows_piped as piped  # noqa: E402
import softmax as sm  # noqa: E402

BF16 = torch.bfloat16


def rel_err(out, ref) -> float:
    assert not out.isnan().any(), "some of the poisoned output was never written"
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("n,dtype", [(4097, torch.float32), (5000, BF16), (8193, torch.float16)], ids=str)
def test_every_piped_mapping_interpreted(n, dtype):
    configs = [c for c in sm.mapping(n, None, torch.finfo(dtype).bits // 8) if c.kwargs["PIPE"]]
    assert len(configs) >= 3
    for config in configs:
        programs = 2 * config.kwargs["PIPE"]  # 2 SMs without a GPU
        rows = programs * (config.kwargs["STAGES"] + 1) + 1  # every slot refilled; one program takes one more
        x = (torch.randn(rows, n) * 3).to(dtype)
        assert (rows * n) % piped.LINE, "the last line is partial"
        assert _rows.grid(rows, config) == (programs,)
        out = torch.full_like(x, float("nan"))
        sm.softmax_kernel.interpret[(programs,)](x, out, piped.lines(x), piped.lines(out), **config.launch_kwargs())
        assert rel_err(out, torch.softmax(x.double(), 1)) < {torch.float32: 1e-6}.get(dtype, 5e-3), config


def test_piped_softmax_through_the_wrapper(monkeypatch):
    """The wrapper launches a piped mapping the tuner picked (here forced first) with the lines views."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    n = 4100
    first = [c for c in sm.mapping(n, None, 4) if c.kwargs["PIPE"]][0]
    monkeypatch.setattr(sm, "mapping", lambda *args: (first,))
    x = torch.randn(6, n) * 3
    out = torch.full_like(x, float("nan"))
    sm.softmax(x, out)
    assert rel_err(out, torch.softmax(x.double(), 1)) < 1e-6


def test_which_rows_are_piped():
    """Piped mappings are offered from 4097 columns to the 65 lines one warpgroup holds (16385), where their
    slots fit shared memory, and every config of the kernel sets the same constexprs."""
    for n, itemsize, expect in ((4096, 2, 0), (4097, 2, 4), (16385, 2, 3), (16386, 2, 0), (8193, 4, 3),
                                (16385, 4, 0), (100000, 2, 0)):
        configs = sm.mapping(n, None, itemsize)
        assert len({tuple(sorted(c.kwargs)) for c in configs}) == 1, n
        got = [c for c in configs if c.kwargs["PIPE"]]
        assert len(got) == expect, (n, itemsize, got)
        for c in got:
            nl = sum(c.kwargs["PL"])
            assert nl == piped.line_count(n) and (nl - 1) * piped.LINE < n + piped.LINE - 1 <= nl * piped.LINE
            assert c.kwargs["PIPE"] * c.kwargs["STAGES"] * nl * piped.LINE * itemsize <= 227 * 1024
    assert not any(c.kwargs["PIPE"] for c in sm.mapping(8193, None, 0))
    assert not any(c.kwargs["PIPE"] for c in sm.mapping(8193, 4, 2))


def test_pipeable_tensors():
    x = torch.randn(6, 5000)
    assert piped.pipeable(x, torch.empty_like(x))
    assert not piped.pipeable(x[:, 1:])  # rows 4999 apart in a 5000-wide tensor
    assert not piped.pipeable(torch.randn(30001)[1:].view(6, 5000))  # starts 4 bytes in
    lines = piped.lines(x)
    assert lines.shape == (30000 // piped.LINE, piped.LINE) and lines.data_ptr() == x.data_ptr()


@pytest.mark.parametrize("n", [8193, 12289, 16385])
def test_piped_softmax_compiles_without_spills(n):
    x = torch.empty(64, n, dtype=BF16)
    for config in sm.mapping(n, None, 2):
        if config.kwargs["PIPE"] and config.kwargs["PIPE"] <= 2:
            c = sm.softmax_kernel.compile(x, x, piped.lines(x), piped.lines(x), **config.launch_kwargs(),
                                          target="sm_90a")
            assert c.spills == 0, (n, config)

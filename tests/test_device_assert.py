"""mgjit.device_assert: a scalar condition checked where the kernel runs. The interpreter raises InterpretError
naming the line and the message; the compiled kernel traps (checked in PTX, on the PTX simulator, and on the
GPU, where the launch fails); a condition known when the kernel is traced is checked then."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import mgjit  # noqa: E402
from mgjit.errors import Check, CompileError, InterpretError  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptx_sim  # noqa: E402


@mgjit.kernel
def doubled_if_short(x, out, LIMIT: mgjit.constexpr):
    """out = 2 x over the first 256 elements, for x of at most LIMIT elements."""
    mgjit.device_assert(x.shape[0] <= LIMIT, "x is longer than LIMIT")
    out[mgjit.ds(0, 256)] = x[mgjit.ds(0, 256)] * 2


@mgjit.kernel
def asserts_when_traced(x, LIMIT: mgjit.constexpr):
    mgjit.device_assert(LIMIT > 0, "LIMIT must be positive")
    x[mgjit.ds(0, 128)] = x[mgjit.ds(0, 128)] + 1


@mgjit.kernel
def asserts_an_array(x):
    mgjit.device_assert(x[mgjit.ds(0, 128)] > 0, "all positive")


@mgjit.kernel
def asserts_without_a_message(x):
    mgjit.device_assert(x.shape[0] > 0)


def test_interpreted():
    x = torch.randn(256)
    out = torch.full((256,), float("nan"))
    doubled_if_short.interpret[(2,)](x, out, LIMIT=256)
    assert torch.equal(out, x * 2)
    with pytest.raises(InterpretError) as info:
        doubled_if_short.interpret[(2,)](torch.randn(300), out, LIMIT=256)
    assert info.value.check == Check.DEVICE_ASSERT
    text = str(info.value)
    line = next(i for i, src in enumerate(open(__file__), 1) if "x.shape[0] <= LIMIT" in src)
    assert "x is longer than LIMIT" in text and f"test_device_assert.py:{line}" in text and "CTA 0" in text


def test_compiled_traps_and_simulates():
    x, out = torch.randn(300), torch.full((256,), float("nan"))
    compiled = doubled_if_short.compile(x, out, LIMIT=256, target="sm_90a")
    traps = [line.strip() for line in compiled.ptx.splitlines() if "trap" in line]
    assert len(traps) == 1 and traps[0].startswith("@!%p"), traps
    for n, fails in ((256, False), (300, True)):
        x = torch.randn(n)
        dev = ptx_sim.Device()
        for t in (x, out):
            dev.place(t)
        if fails:
            with pytest.raises(ptx_sim.SimError, match="trap"):
                dev.run(compiled, (1,), x, out)
        else:
            dev.run(compiled, (1,), x, out)
            assert torch.equal(dev.fetch(out), x * 2)


def test_known_when_traced():
    x = torch.randn(128)
    with pytest.raises(CompileError, match="LIMIT must be positive"):
        asserts_when_traced.compile(x, LIMIT=0, target="sm_90a")
    assert "trap" not in asserts_when_traced.compile(x, LIMIT=1, target="sm_90a").ptx


def test_misuse_names_the_fix():
    x = torch.randn(128)
    with pytest.raises(CompileError, match=r"scalar condition, got an array of shape \(128,\)"):
        asserts_an_array.compile(x, target="sm_90a")
    with pytest.raises(CompileError, match="takes a condition and a message"):
        asserts_without_a_message.compile(x, target="sm_90a")


@pytest.mark.gpu
def test_the_launch_fails_on_the_gpu(tmp_path):
    """A trap ends the CUDA context, so the failing launch runs in a process of its own."""
    script = tmp_path / "assert_on_gpu.py"
    script.write_text(textwrap.dedent('''
        import sys, torch, mgjit

        @mgjit.kernel
        def guarded(x, out, LIMIT: mgjit.constexpr):
            mgjit.device_assert(x.shape[0] <= LIMIT, "x is longer than LIMIT")
            out[mgjit.ds(0, 256)] = x[mgjit.ds(0, 256)] * 2

        n = int(sys.argv[1])
        x = torch.randn(n, device="cuda")
        out = torch.full((256,), float("nan"), device="cuda")
        guarded[(4,)](x, out, LIMIT=256)
        torch.cuda.synchronize()
        assert torch.equal(out, x[:256] * 2)
        print("completed")
    '''))
    ok = subprocess.run([sys.executable, str(script), "256"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "completed" in ok.stdout, ok.stderr
    failed = subprocess.run([sys.executable, str(script), "300"], capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0 and "completed" not in failed.stdout, failed.stdout

"""The generated launch dispatcher, on the CPU: argument binding, defaults and errors (the launch itself
needs a GPU, so a correct call ends in the clear 'needs a CUDA GPU' error)."""
import pytest

import mgjit
import mgjit.specialize

torch = pytest.importorskip("torch")


@mgjit.kernel
def with_defaults(x, out, n, BLOCK: mgjit.constexpr, SCALE: mgjit.constexpr = 2, FLAG: mgjit.constexpr = False):
    start = mgjit.program_id(0) * BLOCK
    v = x[mgjit.ds(start, BLOCK)] * SCALE
    out[mgjit.ds(start, BLOCK)] = v if not FLAG else -v


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_defaults_do_not_leave_the_fast_path(no_gpu):
    x = torch.zeros(1024)
    for call in (lambda: with_defaults[(1,)](x, x, 1024, BLOCK=256),
                 lambda: with_defaults[(1,)](x, x, 1024, BLOCK=256, FLAG=True),
                 lambda: with_defaults[(1,)](x, x, 1024, 256, 3)):
        with pytest.raises(mgjit.LaunchError, match="needs a CUDA GPU"):
            call()


def test_argument_errors(no_gpu):
    x = torch.zeros(1024)
    with pytest.raises(mgjit.LaunchError, match="missing the constexpr argument `BLOCK`"):
        with_defaults[(1,)](x, x, 1024)
    with pytest.raises(mgjit.LaunchError, match="missing the argument `n`"):
        with_defaults[(1,)](x, x, BLOCK=256)
    with pytest.raises(mgjit.LaunchError, match="has no parameter `BLOKC`"):
        with_defaults[(1,)](x, x, 1024, BLOKC=256)
    with pytest.raises(mgjit.LaunchError, match="takes 6 arguments"):
        with_defaults[(1,)](x, x, 1024, 256, 2, False, 7)


def test_defaults_are_part_of_the_specialization():
    x = torch.zeros(1024)
    a = with_defaults.compile(x, x, 1024, BLOCK=256)
    b = with_defaults.compile(x, x, 1024, BLOCK=256, SCALE=2)
    c = with_defaults.compile(x, x, 1024, BLOCK=256, SCALE=3)
    assert a.key == b.key != c.key


def test_autotune_names_load_lazily_in_a_fresh_process():
    """`mgjit.Config` / `mgjit.autotune` used before anything imported the autotuner (a spawned worker)."""
    import subprocess
    import sys
    for first in ("Config", "autotune"):
        code = (f"import sys, mgjit; mgjit.{first}; assert callable(mgjit.autotune); "
                "print(mgjit.Config(BM=64))")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr[-500:]


@mgjit.kernel
def window_at(x, out, start, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(start, BLOCK)]


def test_a_plan_is_compiled_from_exactly_what_its_key_records():
    """Launch plans are found by a key that records, for an int, only whether it is a multiple of 16: the
    kernel behind the plan must assume no more (1000 and 1004 share a plan, so neither may assume 8)."""
    x = torch.zeros(4096)
    spec = mgjit.specialize.argument_key()
    assert spec(1000, []) == spec(1004, []) != spec(1024, [])
    k1000 = window_at.compile(x, x, 1000, BLOCK=512)  # 512 float32: 16 bytes for each of 128 threads
    k1004 = window_at.compile(x, x, 1004, BLOCK=512)
    k1024 = window_at.compile(x, x, 1024, BLOCK=512)
    assert k1000.key == k1004.key != k1024.key
    # Start known only to be an int: 4-byte loads (all that f32 elements are known to be aligned to); a
    # multiple of 16: 16-byte loads.
    assert "ld.global.b32" in k1000.ptx and "ld.global.v4" not in k1000.ptx
    assert "ld.global.v4" in k1024.ptx and "ld.global.b32" not in k1024.ptx

"""Runtime loops, `for i in range(start, stop, step)`: the values Python's range gives, for bounds anywhere in
int32, in the interpreter, in the PTX (on the simulator) and on the GPU. The lowering counts iterations from 0 and
computes i from the count: scf.for's own test (`i + step < stop`, signed) never ends where i + step passes 2**31,
and a loop through negative values, tested unsigned by LLVM, was compiled by ptxas into one that never ends (fuzz
seed 50175, which hung an H200)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
import mgjit  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptx_sim  # noqa: E402

CAP = 8  # the most iterations a case may take; out[CAP] holds the count


@mgjit.kernel
def visits(out, start, stop, step):
    """out[k] = the loop variable's k-th value, out[CAP] = how many there were."""
    n = 0
    for i in range(start, stop, step):
        out[mgjit.minimum(n, CAP)] = i
        n += 1
    out[CAP] = n


@mgjit.kernel
def visits_const(out, START: mgjit.constexpr, STOP: mgjit.constexpr, STEP: mgjit.constexpr):
    """`visits` with bounds LLVM sees (it may know the loop variable's range, and unroll)."""
    n = 0
    for i in range(START, STOP, STEP):
        out[mgjit.minimum(n, CAP)] = i
        n += 1
    out[CAP] = n


I32_MAX = 2**31 - 1
CASES = [(-4, -1, 2), (-3, 0, 1), (-7, 5, 3), (0, 5, 2), (5, 5, 1), (6, 2, 1), (-5, -9, 1),
         (I32_MAX - 7, I32_MAX, 4), (I32_MAX - 1, I32_MAX, 1), (-2**31, I32_MAX, 2**30), (-2**31, -2**31 + 3, 1),
         (-1, I32_MAX, 2**30), (-2**31, 0, 2**30 + 1), (3, 20, 7)]


def expected(start: int, stop: int, step: int) -> torch.Tensor:
    values = list(range(start, stop, step))
    assert len(values) <= CAP
    return torch.tensor(values + [-1] * (CAP - len(values)) + [len(values)], dtype=torch.int32)


def poisoned() -> torch.Tensor:
    return torch.full((CAP + 1,), -1, dtype=torch.int32)


@pytest.mark.parametrize("start,stop,step", CASES)
def test_interpreted(start, stop, step):
    out = poisoned()
    visits.interpret[(1,)](out, start, stop, step)
    assert torch.equal(out, expected(start, stop, step))


@pytest.mark.parametrize("start,stop,step", CASES)
def test_runtime_bounds_from_their_ptx(start, stop, step):
    out = poisoned()
    dev = ptx_sim.Device()
    dev.place(out)
    dev.run(visits.compile(out, start, stop, step, target="sm_90a"), (1,), out, start, stop, step)
    assert torch.equal(dev.fetch(out), expected(start, stop, step))


@pytest.mark.parametrize("start,stop,step", CASES)
def test_constant_bounds_from_their_ptx(start, stop, step):
    out = poisoned()
    dev = ptx_sim.Device()
    dev.place(out)
    dev.run(visits_const.compile(out, START=start, STOP=stop, STEP=step, target="sm_90a"), (1,), out)
    assert torch.equal(dev.fetch(out), expected(start, stop, step))


def random_ranges(n: int) -> list[tuple[int, int, int]]:
    """Fresh ranges anywhere in int32 of 0 to CAP values, steps from 1 to 2**31 - 1, stops anywhere in the last
    step (or before the start)."""
    out = []
    while len(out) < n:
        step = max(1, int(torch.randint(1, 2**31, ()).item()) >> int(torch.randint(0, 31, ()).item()))
        start = int(torch.randint(-2**31, 2**31, ()).item())
        count = int(torch.randint(0, CAP + 1, ()).item())
        stop = start + (count - 1) * step + int(torch.randint(1, step + 1, ()).item()) if count else \
            start - int(torch.randint(0, 2**20, ()).item())
        if -2**31 <= stop <= I32_MAX:
            out.append((start, stop, step))
    return out


def test_random_ranges_from_their_ptx():
    compiled = visits.compile(poisoned(), 0, 1, 1, target="sm_90a")
    for start, stop, step in random_ranges(40):
        out = poisoned()
        dev = ptx_sim.Device()
        dev.place(out)
        dev.run(compiled, (1,), out, start, stop, step)
        assert torch.equal(dev.fetch(out), expected(start, stop, step)), (start, stop, step)


@pytest.mark.parametrize("step", [0, -1, -2**31])
def test_a_runtime_step_that_is_not_positive_fails(step):
    """Python's range counts down on a negative step; mgjit's loops count up: the interpreter names the line, the
    compiled kernel traps (where scf.for would loop without end)."""
    out = poisoned()
    with pytest.raises(mgjit.CompileError, match="step must be positive") as info:
        visits.interpret[(1,)](out, 0, 4, step)
    line = next(i for i, src in enumerate(open(__file__), 1) if src.strip() == "for i in range(start, stop, step):")
    assert f"test_loops.py:{line}" in str(info.value)
    compiled = visits.compile(out, 0, 4, step, target="sm_90a")
    dev = ptx_sim.Device()
    dev.place(out)
    with pytest.raises(ptx_sim.SimError, match="trap"):
        dev.run(compiled, (1,), out, 0, 4, step)


def test_a_constant_step_needs_no_check():
    out = poisoned()
    assert "trap" not in visits_const.compile(out, START=0, STOP=9, STEP=2, target="sm_90a").ptx
    assert "trap" in visits.compile(out, 0, 9, 2, target="sm_90a").ptx


@pytest.mark.gpu
@pytest.mark.parametrize("start,stop,step", CASES)
def test_on_the_gpu(start, stop, step):
    out = poisoned().cuda()
    visits[(1,)](out, start, stop, step)
    const = poisoned().cuda()
    visits_const[(1,)](const, START=start, STOP=stop, STEP=step)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), expected(start, stop, step))
    assert torch.equal(const.cpu(), expected(start, stop, step))


@pytest.mark.gpu
def test_the_fuzz_kernel_that_hung_the_gpu(tmp_path):
    """Seed 50175 (a loop over range(-4, -1, 2) among others), compiled against CUDA 13.0's libdevice and ptxas,
    looped without end: the launch hung. Launched by the fuzzer's GPU worker, which reports a hang and kills it."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    import fuzz
    import fuzz_gen
    worker = fuzz.Worker()
    try:
        outcome = worker.check(fuzz_gen.generate(50175), str(tmp_path), "k")
    finally:
        worker.close()
    assert outcome.status == "ok", outcome

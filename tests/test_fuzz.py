"""A seeded, bounded run of the differential fuzzer (tools/fuzz.py; issue 10, item 4): random valid kernels
compiled for sm_90a and sm_100a, interpreted, and compared with the reference semantics of the same program; and
their PTX run on the PTX simulator against the interpreter. Longer runs, minimized reproductions and the GPU
comparison: `python tools/fuzz.py --help`."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import fuzz  # noqa: E402
import fuzz_gen  # noqa: E402
import fuzz_program  # noqa: E402

SEEDS = range(40)


def test_a_seed_is_a_program():
    assert fuzz_program.source(fuzz_gen.generate(7)) == fuzz_program.source(fuzz_gen.generate(7))
    assert fuzz_program.source(fuzz_gen.generate(7)) != fuzz_program.source(fuzz_gen.generate(8))


def test_seeded_kernels_compile_interpret_and_match_the_reference(tmp_path):
    failures, uncertain = [], 0
    for seed in SEEDS:
        outcome = fuzz.check(fuzz_gen.generate(seed), str(tmp_path), "k")
        uncertain += outcome.status == "uncertain"
        if outcome.status == "fail":
            failures.append(f"seed {seed}: {outcome.category}\n{outcome.detail}")
    assert not failures, "\n\n".join(failures) + "\n(reproduce: python tools/fuzz.py --seed N --count 1)"
    assert uncertain < len(SEEDS) // 4  # most kernels are compared, not only compiled


@pytest.mark.parametrize("seed", [990677, 991757])
def test_the_reference_rounds_sqrt_correctly(tmp_path, seed):
    """Seed 990677 takes the square root of 99.20155334472656 in f32: torch's CPU sqrt gave 9.959997177, the
    interpreter (and sqrt.rn.f32) 9.959998131, the correctly rounded one; seed 991757 that of 1953444704 in f64,
    where torch's is one ulp off. The reference took torch's and reported mismatches."""
    assert fuzz.check(fuzz_gen.generate(seed), str(tmp_path), "k").status != "fail"


def test_the_reference_carries_an_atomic_values_uncertainty(tmp_path):
    """Seed 5215: `atomic_add(out, ds(0, 32), exp(arange(-5, 27)).astype(int32))`. exp's last bits may differ
    from the true function's (the GPU's ex2.approx), so where exp(15) to exp(26) cast to int32 may round to either
    side the reference does not know the sum; it had dropped the atomic value's uncertainty and wanted exact sums
    (the interpreter's differed by 2 to 48)."""
    assert fuzz.check(fuzz_gen.generate(5215), str(tmp_path), "k").status != "fail"


def test_the_reference_leaves_the_sign_of_a_minimum_of_signed_zeros_open(tmp_path):
    """Seed 46166: `2.0 // min(x[ds(wg, 2), ds(wg, 64)], axis=0)` in float8_e4m3fn over columns holding +0 and -0.
    The minimum of +0 and -0 is either zero (the interpreter's order and the GPU's instruction may pick either),
    and 2 // it is then +448 or -448 (saturated infinities): the reference wanted one sign, and the PTX simulator
    and the interpreter picked different ones."""
    assert fuzz.check(fuzz_gen.generate(46166), str(tmp_path), "k", ptx=True).status != "fail"


def test_the_fuzzer_finds_a_planted_bug(tmp_path, monkeypatch):
    """A wrong rule in the interpreter (float addition that subtracts) shows as a mismatch within a few kernels:
    the comparison can fail."""
    import torch
    from mgjit.ops import elementwise
    monkeypatch.setitem(elementwise._FLOAT_BINARY, "add", torch.sub)
    outcomes = [fuzz.check(fuzz_gen.generate(seed), str(tmp_path), "k") for seed in range(12)]
    assert any(o.category == "mismatch: interpreter against reference" for o in outcomes)


def test_the_gpu_comparison_with_the_interpreter_standing_in(tmp_path, monkeypatch):
    """--gpu's path (launch, then compare with the interpreter within the reference's bounds) on the CPU:
    MGJIT_INTERPRET=1 makes the launch interpret, and "cuda" tensors stay on the CPU."""
    import torch
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    cpu_tensors = fuzz.tensors
    monkeypatch.setattr(fuzz, "tensors", lambda p, device="cpu": cpu_tensors(p, "cpu"))
    outcomes = [fuzz.check(fuzz_gen.generate(seed), str(tmp_path), "k", gpu=True) for seed in range(4)]
    assert all(o.status in ("ok", "uncertain") for o in outcomes), [o.detail for o in outcomes]


def stand_in_gpu() -> None:
    """Worker's setup here: the interpreter stands in for the GPU (MGJIT_INTERPRET=1 in the environment, "cuda"
    tensors kept on the CPU); the launch of seed FUZZ_HANG_SEED hangs (a synchronize that sleeps) and that of
    FUZZ_FAIL_SEED fails."""
    import time

    import torch
    cpu_tensors = fuzz.tensors
    seeds = []

    def tensors(p, device="cpu"):
        seeds.append(p.seed)
        return cpu_tensors(p, "cpu")

    def synchronize():
        if seeds[-1] == int(os.environ["FUZZ_HANG_SEED"]):
            time.sleep(600)
        if seeds[-1] == int(os.environ["FUZZ_FAIL_SEED"]):
            raise RuntimeError("an illegal memory access was encountered")

    fuzz.tensors = tensors
    torch.cuda.synchronize = synchronize


def test_a_gpu_launch_that_hangs_or_fails_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    """A hung launch holds its process inside CUDA, where no Python signal reaches it, and a failed one may leave
    the CUDA context unusable: --gpu launches in a child process, which the parent replaces after either (a GPU
    fuzz run once stalled at a hang until its step's time limit, naming nothing)."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path / "cache"))
    seeds = [s for s in range(20) if fuzz.check(fuzz_gen.generate(s), str(tmp_path), "k").status == "ok"][:4]
    monkeypatch.setenv("FUZZ_HANG_SEED", str(seeds[1]))
    monkeypatch.setenv("FUZZ_FAIL_SEED", str(seeds[2]))
    monkeypatch.setattr(fuzz, "HANG_SECONDS", 3)
    worker = fuzz.Worker(stand_in_gpu)
    try:
        outcomes = [worker.check(fuzz_gen.generate(s), str(tmp_path), "k") for s in seeds]
    finally:
        worker.close()
    assert [o.category for o in outcomes][:2] == ["", "gpu-hang"], outcomes
    assert outcomes[2].category.startswith("gpu-error: RuntimeError: an illegal memory access")
    assert outcomes[3].status == "ok", outcomes[3]


def abort_on_a_seed() -> None:
    """Worker's setup here: checking seed FUZZ_ABORT_SEED aborts the process, as LLVM's "Cannot select" does."""
    real = fuzz.check

    def check(p, *args, **kwargs):
        if p.seed == int(os.environ["FUZZ_ABORT_SEED"]):
            os.abort()
        return real(p, *args, **kwargs)
    fuzz.check = check


def test_a_kernel_that_takes_its_process_down_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    """An abort inside the compiler (LLVM's NVPTX backend, fuzz seed 88218) ended a run in one process, naming
    nothing: kernels are checked in a child process, replaced after one that dies, and the kernel reported."""
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FUZZ_ABORT_SEED", "1")
    worker = fuzz.Worker(abort_on_a_seed, gpu=False)
    try:
        outcomes = [worker.check(fuzz_gen.generate(s), str(tmp_path), "k") for s in (0, 1, 2)]
    finally:
        worker.close()
    assert outcomes[1].category == "crash" and "exit code -6" in outcomes[1].detail, outcomes[1]
    assert outcomes[0].status != "fail" and outcomes[2].status != "fail", outcomes


def test_seeded_kernels_run_from_their_ptx_on_the_simulator_match_the_interpreter(tmp_path):
    """--ptx: the sm_90a PTX of each kernel run by tests/ptx_sim.py agrees with the interpreter (the lowering's
    numbers, checked without a GPU); most seeds are within the simulator's reach."""
    failures, simulated = [], 0
    for seed in SEEDS:
        outcome = fuzz.check(fuzz_gen.generate(seed), str(tmp_path), "k", ptx=True)
        simulated += outcome.status == "ok"
        if outcome.status == "fail":
            failures.append(f"seed {seed}: {outcome.category}\n{outcome.detail}")
    assert not failures, "\n\n".join(failures) + "\n(reproduce: python tools/fuzz.py --ptx --seed N --count 1)"
    assert simulated >= len(SEEDS) // 2


def test_the_ptx_comparison_finds_a_planted_lowering_bug(tmp_path, monkeypatch):
    """A wrong lowering (float addition emitted as subtraction) shows as a mismatch of the simulated PTX against
    the interpreter within a few kernels: the comparison can fail."""
    from mgjit.lower.emit import Emitter
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path / "cache"))  # compiled afresh, with the planted rule
    fbinary = Emitter.fbinary
    monkeypatch.setattr(Emitter, "fbinary",
                        lambda self, kind, a, b: fbinary(self, "sub" if kind == "add" else kind, a, b))
    outcomes = [fuzz.check(fuzz_gen.generate(seed), str(tmp_path), "k", ptx=True) for seed in range(12)]
    assert any(o.category == "mismatch: PTX simulator against interpreter" for o in outcomes), \
        [o.category or o.status for o in outcomes]


@pytest.mark.gpu
def test_seeded_kernels_on_the_gpu_match_the_interpreter(tmp_path):
    failures = []
    for seed in SEEDS:
        outcome = fuzz.check(fuzz_gen.generate(seed), str(tmp_path), "k", gpu=True)
        if outcome.status == "fail":
            failures.append(f"seed {seed}: {outcome.category}\n{outcome.detail}")
    assert not failures, "\n\n".join(failures)

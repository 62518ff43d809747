"""On the GPU: mgjit.print prints what the interpreter prints for the same launch (captured and compared), and a
profiled Hopper matmul records sane spans (nested, ordered, per warpgroup, in nanoseconds) while computing the
right product. With $OUT set, the profiled matmul's trace is written there as JSON and PNG."""
import os

import pytest
import torch

import mgjit
from span_checks import check_matmul_spans
from test_debug_print import every_dtype, per_thread, scalars_and_arrays, two_warpgroups

pytestmark = pytest.mark.gpu


def printed(capsys, launch) -> list[str]:
    capsys.readouterr()
    launch()
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("case", ["scalars_and_arrays", "per_thread", "two_warpgroups", "every_dtype"])
def test_the_gpu_prints_what_the_interpreter_prints(case, capsys):
    kernels = {
        "scalars_and_arrays": (scalars_and_arrays, (3,), lambda: (torch.randn(3, 64, device="cuda"), 5),
                               dict(BLOCK=64)),
        "per_thread": (per_thread, (1,), lambda: (torch.randn(256, device="cuda"),), dict(BLOCK=256)),
        "two_warpgroups": (two_warpgroups, (2,), lambda: (torch.zeros(1, device="cuda"),), {}),
        "every_dtype": (every_dtype, (1,), lambda: (torch.randn(1, dtype=torch.float64, device="cuda"),
                                                     torch.randint(-2**40, 2**40, (1,), device="cuda"),
                                                     torch.randn(4, device="cuda").to(torch.float8_e4m3fn)),
                        dict(BLOCK=4)),
    }
    kernel, grid, make, consts = kernels[case]
    args = make()
    on_gpu = printed(capsys, lambda: kernel[grid](*args, **consts))
    interpreted = printed(capsys, lambda: kernel.interpret[grid](*args, **consts))
    assert on_gpu and on_gpu == interpreted
    again = printed(capsys, lambda: kernel[grid](*args, **consts))  # the launch plan, made once, prints again
    assert again == on_gpu


@mgjit.kernel
def count_and_copy(x, out, BLOCK: mgjit.constexpr):
    pid = mgjit.program_id(0)
    v = x[pid, mgjit.ds(0, BLOCK)]
    mgjit.print("{}", pid)
    out[pid, mgjit.ds(0, BLOCK)] = v + 1


def test_a_printing_kernel_computes_and_prints_from_many_ctas(capsys):
    x = torch.randn(500, 128, device="cuda")
    out = torch.full_like(x, float("nan"))
    lines = printed(capsys, lambda: count_and_copy[(500,)](x, out, BLOCK=128))
    assert lines == [f"[cta ({i}, 0, 0)] {i}" for i in range(500)]
    torch.testing.assert_close(out, x + 1)


def test_a_profiled_hopper_matmul_records_sane_spans(capsys):
    from test_interpret_kernels import hopper
    m, n, k = 2048, 2048, 1024
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    prof = mgjit.Profile(capacity=256)
    config = hopper.DEFAULT_CONFIG  # data-parallel: one span of each kind per tile (other schedules cut tiles)
    c = hopper.matmul(a, b, config, profile=prof)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=0.5)
    tiles = (m // hopper.DEFAULT_CONFIG["BM"]) * (n // hopper.DEFAULT_CONFIG["BN"])
    grid = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    check_matmul_spans(prof, grid, tiles)
    assert prof.unit == "ns"
    mma = [s.duration for s in prof.spans if s.name == "mma"]
    assert 0 < sum(mma) / len(mma) < 1e6, "an mma span of a 128x256x1024 tile takes microseconds"
    assert len({s.sm for s in prof.spans}) == grid, "each CTA of the persistent grid has an SM of its own"
    plain = hopper.matmul(a, b, config)  # an unprofiled launch afterwards runs the kernel without spans
    torch.testing.assert_close(plain, c)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        prof.save(os.path.join(out, "matmul_trace.json"))
        try:  # without matplotlib, Profile.from_chrome_trace(json) draws it elsewhere
            prof.save(os.path.join(out, "matmul_trace.png"))
        except ImportError:
            pass
        with open(os.path.join(out, "matmul_trace_summary.txt"), "w") as f:
            f.write(prof.summary() + "\n")

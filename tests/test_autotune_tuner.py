"""The sweep end to end on a fake kernel and a fake timer: choice, persistence, in-place arguments, report."""
import io
import json
import sys
import warnings

import mgjit
import mgjit.autotune as at
import pytest
import test_autotune_fakes
import torch
from mgjit.autotune import Config, autotune
from test_autotune_fakes import FakeKernel, FakeTimer

cache_dirs = test_autotune_fakes.cache_dirs  # the shared fixture

CONFIGS = [Config(BM=bm, BN=bn, BK=64, STAGES=3, num_warpgroups=wg)
           for bm in (64, 128) for bn in (128, 256) for wg in (1, 2)]
# Made-up times: BM=128, BN=256, 2 warpgroups is fastest.
TIMES = {c: 1.0 + 0.1 * i for i, c in enumerate(reversed(CONFIGS))}


def args(m=256, n=256, k=64, dtype=torch.float32):
    return torch.ones(m, k, dtype=dtype), torch.ones(k, n, dtype=dtype), torch.zeros(m, n, dtype=dtype), m, n, k


def tuned(tmp_path, configs=CONFIGS, times=TIMES.__getitem__, source="v1", device="fake-gpu", **options):
    kernel = FakeKernel(tmp_path / "kernels", source=source, **options.pop("kernel_options", {}))
    timer = FakeTimer(kernel, times, device=device)
    return autotune(configs=configs, key=["M", "N", "K"], timer=timer, jobs=1, **options)(kernel), kernel, timer


def test_winner_is_the_fastest_and_the_launch_uses_it(cache_dirs):
    matmul, kernel, timer = tuned(cache_dirs)
    grid_calls = []

    def grid(meta):
        grid_calls.append(meta)
        return (meta["M"] // meta["BM"], meta["N"] // meta["BN"])

    matmul[grid](*args())
    best = Config(BM=128, BN=256, BK=64, STAGES=3, num_warpgroups=2)
    assert timer.calls == len(CONFIGS)
    assert kernel.launches[-1][:3] == (dict(BM=128, BN=256, BK=64, STAGES=3), 2, None)
    assert kernel.launches[-1][3] == (2, 1)  # the grid callable saw the winner's BM/BN
    assert grid_calls[-1]["num_warpgroups"] == 2 and grid_calls[-1]["M"] == 256
    assert matmul.best_config(dict(zip(["a", "b", "c", "M", "N", "K"], args(), strict=True))) == best

    # Same key again: no new sweep.
    matmul[grid](*args())
    assert timer.calls == len(CONFIGS)
    # A new key (M) sweeps again; so does a new dtype with the same sizes.
    matmul[grid](*args(m=512))
    assert timer.calls == 2 * len(CONFIGS)
    matmul[grid](*args(dtype=torch.float16))
    assert timer.calls == 3 * len(CONFIGS)


def test_ties_go_to_the_earlier_config(cache_dirs):
    matmul, _, _ = tuned(cache_dirs, times=lambda c: 1.0 if c.kwargs["BN"] == 256 else 2.0)
    matmul[(1,)](*args())
    assert matmul.tuning_report().winner.config == CONFIGS[2]  # first with BN=256


def test_a_new_process_times_nothing_and_an_added_config_is_timed_alone(cache_dirs):
    first, _, timer = tuned(cache_dirs)
    first[(1,)](*args())
    assert timer.calls == len(CONFIGS)

    # A fresh Autotuned over an equal kernel (same source key) stands for a new process.
    second, kernel2, timer2 = tuned(cache_dirs)
    second[(1,)](*args())
    assert timer2.calls == 0
    assert kernel2.misses == 0 and kernel2.hits == 0  # nothing compiled either: the launch compiles lazily
    assert second.best_config(dict(zip(["a", "b", "c", "M", "N", "K"], args(), strict=True))) == \
        first.tuning_report().winner.config
    assert all(row.stored for row in second.tuning_report().rows)

    extra = Config(BM=256, BN=128, BK=64, STAGES=3, num_warpgroups=2)
    third, _, timer3 = tuned(cache_dirs, configs=CONFIGS + [extra], times=lambda c: 0.5 if c == extra else TIMES[c])
    third[(1,)](*args())
    assert timer3.timed == [extra]
    assert third.tuning_report().winner.config == extra

    # A changed kernel source (new source key) or another device re-tunes everything.
    fourth, _, timer4 = tuned(cache_dirs, source="v2")
    fourth[(1,)](*args())
    assert timer4.calls == len(CONFIGS)
    fifth, _, timer5 = tuned(cache_dirs, device="other-gpu")
    fifth[(1,)](*args())
    assert timer5.calls == len(CONFIGS)


def test_stored_results_are_json_per_config_with_prune_reasons(cache_dirs):
    big = Config(BM=256, BN=256, BK=128, STAGES=4)  # over the shared-memory budget
    matmul, _, _ = tuned(cache_dirs, configs=CONFIGS[:2] + [big])
    matmul[(1,)](*args())
    files = list((cache_dirs / "mgjit-cache" / "autotune").glob("matmul-*.json"))
    assert len(files) == 1
    document = json.loads(files[0].read_text())
    assert document["device"] == "fake-gpu"
    assert document["key"] == [["M", 256], ["N", 256], ["K", 64], ["a.dtype", "torch.float32"],
                               ["b.dtype", "torch.float32"], ["c.dtype", "torch.float32"]]
    assert document["configs"][CONFIGS[0].key()] == {"ms": TIMES[CONFIGS[0]]}
    assert document["configs"][big.key()]["pruned"].startswith("smem-budget: ")
    assert not list(files[0].parent.glob("*.tmp"))


def test_a_corrupt_store_file_warns_once_and_retunes(cache_dirs):
    first, _, _ = tuned(cache_dirs)
    first[(1,)](*args())
    [path] = (cache_dirs / "mgjit-cache" / "autotune").glob("matmul-*.json")
    path.write_text(path.read_text()[:40])  # truncated

    second, _, timer = tuned(cache_dirs)
    with pytest.warns(UserWarning, match="ignoring corrupt tuning results") as caught:
        second[(1,)](*args())
    assert len([w for w in caught if "corrupt" in str(w.message)]) == 1
    assert timer.calls == len(CONFIGS)
    json.loads(path.read_text())  # rewritten whole

    # Valid JSON but the wrong schema is corrupt too; and a file is warned about only once per process.
    path.write_text(json.dumps({"version": 1, "configs": []}))
    third, _, timer3 = tuned(cache_dirs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        third[(1,)](*args())
    assert [w for w in caught if "corrupt" in str(w.message)] == []
    assert timer3.calls == len(CONFIGS)


def accumulate(named, constexprs):
    named["c"].add_(named["a"] @ named["b"])  # c += a @ b, in place


def test_restore_keeps_an_in_place_kernel_correct(cache_dirs):
    a, b, c, m, n, k = args()
    c.fill_(1.0)
    untuned = c + a @ b

    matmul, kernel, timer = tuned(cache_dirs, restore=["c"], kernel_options=dict(body=accumulate))
    matmul[(1,)](a, b, c, m, n, k)
    assert timer.calls == len(CONFIGS) and len(kernel.launches) > 3 * len(CONFIGS)
    torch.testing.assert_close(c, untuned, rtol=0, atol=0)

    # Without restore the sweep's launches pile up in c: the test above can fail.
    matmul_bad, _, _ = tuned(cache_dirs, source="v-bad", kernel_options=dict(body=accumulate))
    c2 = torch.ones(m, n)
    matmul_bad[(1,)](a, b, c2, m, n, k)
    assert not torch.equal(c2, untuned)


def test_reset_zeroes_an_accumulator_before_each_run_and_after_the_sweep(cache_dirs):
    def split_k(named, constexprs):
        named["partial"].add_(named["a"] @ named["b"])  # an atomic-add style accumulator
        named["c"].copy_(named["partial"])

    kernel_options = dict(body=split_k, arg_names=("a", "b", "c", "partial", "M", "N", "K", "BM", "BN", "BK",
                                                   "STAGES"))
    a, b, c, m, n, k = args()
    partial = torch.zeros(m, n)
    matmul, _, _ = tuned(cache_dirs, reset=["partial"], kernel_options=kernel_options)
    matmul[(1,)](a, b, c, partial, m, n, k)
    torch.testing.assert_close(c, a @ b, rtol=0, atol=0)


def test_report_lists_every_config_with_time_or_reason(cache_dirs):
    big = Config(BM=256, BN=256, BK=128, STAGES=4, num_warpgroups=1)
    spilling = Config(BM=64, BN=512, BK=32, STAGES=2, num_warpgroups=1)
    configs = CONFIGS + [big, spilling]
    matmul, _, _ = tuned(cache_dirs, configs=configs, times=lambda c: TIMES.get(c, 0.1),
                         rules=[lambda c, named: "BM=64 is too narrow" if c == CONFIGS[0] else None])
    with pytest.raises(LookupError, match="no tuning report yet"):
        matmul.tuning_report()
    matmul[(1,)](*args())
    report = matmul.tuning_report()
    assert [row.index for row in report.rows] == list(range(len(configs)))
    rows = {row.config: row for row in report.rows}
    assert rows[CONFIGS[0]].pruned == "BM=64 is too narrow" and rows[CONFIGS[0]].ms is None
    assert rows[big].pruned == "smem-budget: kernel needs 524288 bytes of shared memory, the limit is 232448"
    assert rows[spilling].pruned == "ptxas: 64 bytes spilled"
    assert rows[CONFIGS[7]].winner and rows[CONFIGS[7]].ms == 1.0
    assert sum(row.winner for row in report.rows) == 1
    table = str(report)
    lines = table.splitlines()
    assert lines[0] == ("mgjit.autotune matmul  key: M=256, N=256, K=64, a.dtype=torch.float32, "
                        "b.dtype=torch.float32, c.dtype=torch.float32  device: fake-gpu")
    assert len(lines) == 2 + len(configs)
    assert "<- winner" in lines[2 + 7] and "BM=128 BN=256 BK=64 STAGES=3 wg=2" in lines[2 + 7]
    assert lines[2 + 7].split()[0] == "7" and "1.0000" in lines[2 + 7]
    assert "pruned: ptxas: 64 bytes spilled" in lines[-1]
    assert repr(report) == table


def test_report_records_the_wall_time_of_each_phase_of_the_sweep(cache_dirs):
    import time

    def slow(config):  # the fake timer's time per config, after a real 10 ms of wall time
        time.sleep(0.01)
        return TIMES[config]

    matmul, _, _ = tuned(cache_dirs, times=slow)
    matmul[(1,)](*args())
    report = matmul.tuning_report()
    assert report.timing_seconds >= 0.01 * len(CONFIGS)
    assert 0 < report.compile_seconds < report.timing_seconds

    # Every result from the store: nothing compiled or timed in this sweep.
    again, _, timer = tuned(cache_dirs, times=slow)
    again[(1,)](*args())
    assert timer.calls == 0
    assert again.tuning_report().compile_seconds == again.tuning_report().timing_seconds == 0.0


def test_report_plot_needs_matplotlib_and_says_so(cache_dirs, monkeypatch, tmp_path):
    matmul, _, _ = tuned(cache_dirs)
    matmul[(1,)](*args())
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        matmul.tuning_report(plot=str(tmp_path / "x.png"))


def test_report_plot_draws_a_png(cache_dirs, tmp_path):
    pytest.importorskip("matplotlib")
    matmul, _, _ = tuned(cache_dirs)
    matmul[(1,)](*args())
    path = tmp_path / "tuning.png"
    report = matmul.tuning_report(plot=str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.winner.config == CONFIGS[7]


def test_every_config_pruned_is_an_error_listing_reasons(cache_dirs):
    matmul, _, timer = tuned(cache_dirs, rules=[lambda c, named: f"no {c.kwargs['BM']}"])
    with pytest.raises(RuntimeError, match=r"every config of matmul was pruned.*no 64"):
        matmul[(1,)](*args())
    assert timer.calls == 0


def test_compile_uses_the_chosen_or_the_given_config(cache_dirs):
    matmul, kernel, _ = tuned(cache_dirs)
    with pytest.raises(LookupError, match="not tuned for key"):
        matmul.compile(*args())
    matmul[(1,)](*args())
    compiled = matmul.compile(*args(), target="sm_100a")
    assert compiled.target == "sm_100a" and compiled.threads == 256  # the winner has 2 warpgroups
    own = matmul.compile(*args(), BM=64, BN=128, BK=32, STAGES=2)
    assert own.threads == 128 and own.smem_bytes == (64 + 128) * 32 * 2 * 2
    with pytest.raises(TypeError, match=r"give all of \['BK', 'BM', 'BN', 'STAGES'\]; got \['BM'\]"):
        matmul.compile(*args(), BM=64)


def test_timer_must_return_a_time(cache_dirs):
    matmul, _, _ = tuned(cache_dirs, times=lambda c: float("nan"))
    with pytest.raises(ValueError, match="must return a finite time in ms >= 0"):
        matmul[(1,)](*args())


def test_decorator_checks_its_arguments_against_the_kernel(tmp_path):
    kernel = FakeKernel(tmp_path)
    with pytest.raises(TypeError, match="either configs"):
        autotune()(kernel)
    with pytest.raises(ValueError, match=r"configs set \['BX'\], which are not constexpr"):
        autotune(configs=[Config(BX=1)])(kernel)
    with pytest.raises(ValueError, match="must set the same constexprs"):
        autotune(configs=[Config(BM=1), Config(BN=1)])(kernel)
    with pytest.raises(ValueError, match="listed twice"):
        autotune(configs=[Config(BM=1), Config(BM=1)])(kernel)
    with pytest.raises(ValueError, match=r"key names 'BM', which is not an argument that launches"):
        autotune(configs=CONFIGS, key=["BM"])(kernel)
    with pytest.raises(TypeError, match="must be a list of argument names"):
        autotune(configs=CONFIGS, restore="c")(kernel)
    with pytest.raises(TypeError, match="stack it on top"):
        autotune(configs=CONFIGS)(lambda a: a)
    space = autotune(space=dict(BM=[64, 128], BN=[128], BK=[64], STAGES=[2, 3], num_warpgroups=[1, 2]),
                     space_filter=lambda c: c.num_warpgroups == 2)(kernel)
    assert len(space.configs) == 4 and all(c.num_warpgroups == 2 for c in space.configs)


def test_launch_argument_binding(cache_dirs):
    matmul, kernel, _ = tuned(cache_dirs)
    a, b, c, m, n, k = args()
    matmul[(1,)](a, b, c, M=m, K=k, N=n)
    assert len(kernel.launches) > 0
    with pytest.raises(TypeError, match="unexpected argument 'BM'"):
        matmul[(1,)](a, b, c, m, n, k, BM=64)
    with pytest.raises(TypeError, match=r"missing arguments \['K'\]"):
        matmul[(1,)](a, b, c, m, n)
    with pytest.raises(TypeError, match="got argument 'M' twice"):
        matmul[(1,)](a, b, c, m, n, k, M=m)


def test_importing_autotune_imports_neither_torch_nor_mlir():
    import subprocess

    code = ("import sys, mgjit.autotune; bad = [m for m in sys.modules if m.split('.')[0] == 'torch' "
            "or 'mlir' in m.lower()]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_public_names(tmp_path):
    import mgjit

    assert at.Config is Config and at.autotune is autotune
    assert callable(at.divisible) and callable(at.expand_space)
    # Importing the package binds mgjit.autotune to it; calling it must still decorate.
    assert mgjit.autotune is at or mgjit.autotune is autotune
    tuned = mgjit.autotune(configs=CONFIGS[:2], key=["M"])(FakeKernel(tmp_path))
    assert isinstance(tuned, at.Autotuned) and tuned.configs == tuple(CONFIGS[:2])


def test_parameters_after_a_tuned_constexpr_go_by_name(cache_dirs):
    # def k(a, BM: constexpr, b, c, M, N, K, BN, BK, STAGES, ACT: constexpr): BM sits between runtime args.
    kernel_options = dict(arg_names=("a", "BM", "b", "c", "M", "N", "K", "BN", "BK", "STAGES", "ACT"),
                          constexpr_names=("BM", "BN", "BK", "STAGES", "ACT"))
    matmul, kernel, timer = tuned(cache_dirs, kernel_options=kernel_options)
    a, b, c, m, n, k = args()
    matmul[(1,)](a, b, c, m, n, k, "relu")
    assert kernel.launches[-1][0] == dict(BM=128, BN=256, BK=64, STAGES=3, ACT="relu")
    assert timer.calls == len(CONFIGS)
    assert matmul.compile(a, b, c, m, n, k, ACT="gelu").smem_bytes == (128 + 256) * 64 * 2 * 3


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal_only_and_not_when_quiet(cache_dirs, monkeypatch):
    pytest.importorskip("tqdm")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv("MGJIT_AUTOTUNE_QUIET")
    matmul, _, _ = tuned(cache_dirs)
    matmul[(1,)](*args())
    shown = terminal.getvalue()
    # tqdm redraws at most every 0.1 s and clears the bar at the end (leave=False): look for the opening.
    assert "matmul: compiling:   0%" in shown and f"0/{len(CONFIGS)}" in shown and "matmul: timing:" in shown

    monkeypatch.setenv("MGJIT_AUTOTUNE_QUIET", "1")
    terminal.seek(0)
    terminal.truncate()
    quiet, _, _ = tuned(cache_dirs, source="v-quiet")
    quiet[(1,)](*args())
    assert terminal.getvalue() == ""

    monkeypatch.delenv("MGJIT_AUTOTUNE_QUIET")
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file, not a terminal
    logged, _, _ = tuned(cache_dirs, source="v-log")
    logged[(1,)](*args())
    assert sys.stderr.getvalue() == ""


def test_report_rows_carry_no_trailing_blanks(cache_dirs):
    matmul, _, _ = tuned(cache_dirs)
    matmul[(1,)](*args())
    assert all(line == line.rstrip() for line in str(matmul.tuning_report()).splitlines())


def test_close_finalists_are_timed_again_before_choosing(cache_dirs):
    """A first pass that mis-ranks two configs 2% apart (a noisy first sample) must not decide the winner:
    finalists within 5% of the fastest are re-timed, interleaved, and the median decides."""
    fast, close = CONFIGS[0], CONFIGS[1]
    seen: dict = {}

    def times(c):
        seen[c] = seen.get(c, 0) + 1
        if c == fast:
            return 1.05 if seen[c] == 1 else 1.00  # its first sample was unlucky
        return 1.02 if c == close else 3.0

    matmul, _, timer = tuned(cache_dirs, times=times)
    matmul[(1,)](*args())
    assert matmul.tuning_report().winner.config == fast
    assert seen[fast] == seen[close] == 1 + at.tuner.Autotuned.CONFIRM_ROUNDS
    assert all(seen[c] == 1 for c in CONFIGS[2:])  # far slower configs are timed once


class WarningKernel(FakeKernel):
    """Warns (as the compiler does of a bank conflict) when it compiles a config whose BN is in `warns_for`."""

    def __init__(self, cache_dir, warns_for):
        super().__init__(cache_dir)
        self.warns_for = warns_for

    def compile(self, *args, **kwargs):
        if kwargs.get("BN") in self.warns_for:
            warnings.warn(f"conflict in BM={kwargs['BM']} BN={kwargs['BN']} wg={kwargs.get('num_warpgroups')}",
                          mgjit.BankConflictWarning)
        return super().compile(*args, **kwargs)


@pytest.mark.parametrize("warns_for", [(128, 256), (128,)])
def test_a_sweep_passes_on_the_picks_compile_warnings_alone(cache_dirs, warns_for):
    """Every candidate warns where BN is in warns_for; the sweep picks BM=128, BN=256 on 2 warpgroups: the caller
    gets that config's warning once (none where it has none), not the candidates' that lost (a row example's
    first call printed a dozen bank-conflict warnings of mappings it did not pick)."""
    kernel = WarningKernel(cache_dirs / "kernels", warns_for)
    matmul = autotune(configs=CONFIGS, key=["M", "N", "K"], timer=FakeTimer(kernel, TIMES.__getitem__), jobs=1)(kernel)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        matmul[(1,)](*args())
    given = [str(w.message) for w in caught if issubclass(w.category, mgjit.BankConflictWarning)]
    assert given == (["conflict in BM=128 BN=256 wg=2"] if 256 in warns_for else []), given
    assert sum(c.kwargs["BN"] in warns_for for c in CONFIGS) > 1  # losers warned as they compiled

"""Every mapping the row examples may pick (examples/_rows.py candidates: rows per program, two warpgroups,
segments over a cluster, rows streamed in chunks), each forced, on the CPU: interpreted against torch on fresh random inputs with the
outputs poisoned, and a few run from their sm_90a PTX on tests/ptx_sim.py (rows that start anywhere in a
16-byte chunk, clusters, several warpgroups). The autotuner picks among these on a GPU, so each must be right."""
import collections
import functools
import re
import sys
from pathlib import Path

import pytest

import mgjit
from mgjit.targets import HOPPER

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _rows  # noqa: E402
import _rows_launch  # noqa: E402
import cross_entropy as ce  # noqa: E402
import layernorm as ln  # noqa: E402
import ptx_sim  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402
from _rows_piped import lines  # noqa: E402

BF16 = torch.bfloat16
TOL = {torch.float32: 2e-6, BF16: 5e-3, torch.float16: 1e-3}


def rel_err(out, ref) -> float:
    assert not out.isnan().any(), "some of the poisoned output was never written"
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def kernels(x, dtype):
    """(kernel, args, constexprs, outputs to check against references) of each row example for x. Sums over
    long rows round more in f32: their tolerances grow with the row."""
    n = x.shape[1]
    scale = max(1.0, n / 8192)
    w, b = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
    target = torch.randint(0, n, (x.shape[0],))
    target[::3] = -100
    xd = x.double()
    out = [torch.full_like(x, float("nan")) for _ in range(3)]
    loss, lse = torch.full((x.shape[0],), float("nan")), torch.full((x.shape[0],), float("nan"))
    return [
        (sm.softmax_kernel, (x, out[0], x, out[0]), {}, [(out[0], torch.softmax(xd, 1), TOL[dtype] * scale)]),
        (rms.rmsnorm_kernel, (x, w, out[1], x, out[1], x), {"eps": 1e-6},
         [(out[1], torch.nn.functional.rms_norm(xd, (n,), w.double(), 1e-6), TOL[dtype] * scale)]),
        (ln.layernorm_rows, (x, w, b, out[2], x, out[2], x, x), {"eps": 1e-5},
         [(out[2], torch.nn.functional.layer_norm(xd, (n,), w.double(), b.double(), 1e-5), TOL[dtype] * scale)]),
        (ce.cross_entropy_rows, (x, target, loss, lse, -100, x, loss, loss), {},
         [(loss, torch.nn.functional.cross_entropy(xd, target, reduction="none", ignore_index=-100), 1e-5 * scale),
          (lse, torch.logsumexp(xd, 1), 1e-6 * scale)]),
    ]


# A cluster of 2 CTAs of 2 warpgroups holding 8192 columns each: its last segment lies wholly past a row of
# 20000 (its maximum is -inf, its count 0), which must add nothing to the row's statistics.
PAST_THE_END = _rows.hold(1, (8192,), 2, 2)
# Rows of 9000 chunked over 2 CTAs of 6 chunks of 1024: the second CTA's third chunk crosses the row's end and
# its last three lie wholly past it (masked out of layernorm's deviations, -inf in the softmaxes).
CHUNKS_PAST_THE_END = _rows.chunked(2, 1024, 6)


@pytest.mark.parametrize("n", [3, 33, 77, 150, 300, 777, 1100, 2304, 4097, 9000, 20000])
def test_every_candidate_interpreted(n):
    x = torch.randn(5, n) * 3
    extra = {20000: [PAST_THE_END], 9000: [CHUNKS_PAST_THE_END]}.get(n, [])
    for config in _rows.candidates(n) + extra:
        for kernel, args, constexprs, checks in kernels(x, torch.float32):
            kernel.interpret[_rows.grid(x.shape[0], config)](*args, **constexprs, **config.launch_kwargs())
            for got, ref, tol in checks:
                assert rel_err(got, ref) < tol, f"{kernel.name} {config}"


@mgjit.kernel
def part_starts_of(out, PARTS: mgjit.constexpr, CTAS: mgjit.constexpr, WGS: mgjit.constexpr):
    """out[cta, warpgroup, p] = the first column of part p of the segment _rows.segment gives this warpgroup."""
    _, starts = _rows.segment(1, PARTS, CTAS, WGS)
    for p in mgjit.static_range(len(PARTS)):
        out[mgjit.program_id(0), mgjit.warpgroup_id(), p] = starts[p]


def test_split_rows_put_only_their_narrowest_parts_past_the_row_end():
    """Every held mapping that splits a row (over the CTAs of a cluster or warpgroups), interpreted: its segments'
    parts tile the columns it covers, the parts of each width side by side (part-major: all segments' widest
    parts first), so every part but the narrowest lies wholly inside the row and takes no bounds test (segment-
    major, a row of 8193 over 2 CTAs of 4096 + 128 had the second CTA's 4096-wide array cross the row's end)."""
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    lengths = [4097, 5000, 8193, 9000, 12289, 20000, 50257, 100000, 262144]
    lengths += torch.randint(4097, 262145, (6,), generator=generator).tolist()
    for n in lengths:
        for config in _rows.candidates(n):
            k = config.kwargs
            split, parts = k["CTAS"] * k["WGS"], k["PARTS"]
            if k["BLOCK"] or split == 1:
                continue
            out = torch.full((k["CTAS"], k["WGS"], len(parts)), -1, dtype=torch.int32)
            part_starts_of.interpret[(k["CTAS"],)](out, PARTS=parts, CTAS=k["CTAS"], WGS=k["WGS"],
                                                   num_warpgroups=config.num_warpgroups, cluster=config.cluster)
            starts = out.view(split, len(parts))
            before = 0
            for p, width in enumerate(parts):
                assert sorted(starts[:, p].tolist()) == [split * before + s * width for s in range(split)], (n, k)
                before += width
                if p < len(parts) - 1:
                    assert split * before <= n, (n, k)  # these parts' windows end inside the row
            assert split * before >= n, (n, k)


def test_rows_per_program_is_a_power_of_two_for_every_length():
    """ROWS is a register array's dimension: for rows of 257 to 384 columns (held as 256 + 128) the candidates were
    10, 20 and 5 rows, and every row example failed to compile on such rows. A rows_per_program that is not a
    power of two is refused, naming the argument."""
    for n in range(1, _rows.SEGMENT + 1):
        for c in _rows.mapping(n):
            rows = c.kwargs["ROWS"]
            assert rows & (rows - 1) == 0 and rows * max(sum(c.kwargs["PARTS"]), 1) <= 16384, (n, c)
    assert [(c.kwargs["ROWS"], c.kwargs["PARTS"]) for c in _rows.mapping(300)] == [
        (8, (256, 128)), (16, (256, 128)), (4, (256, 128)), (8, (256, 64)), (16, (256, 64)), (8, (256, 32, 16)),
        (16, (256, 32, 16))]
    for bad in (0, 3, 10, 2.0):  # 2.0 failed in `&` (a TypeError naming no argument)
        with pytest.raises(ValueError, match=f"rows_per_program must be a power of two.*got {bad}"):
            _rows.mapping(300, bad)


def test_rows_per_program_of_another_type_is_refused_after_its_int_ran(monkeypatch):
    """True and 1.0 equal 1: each wrapper's mapping cache served them 1's mappings once 1 had run, else True
    passed the check and 1.0 failed in torch's expand (a TypeError naming no argument)."""
    import rmsnorm as rms
    import softmax as sm
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    x, w = torch.randn(5, 7).to(torch.bfloat16), torch.ones(7).to(torch.bfloat16)
    runs = {"softmax": lambda rows: sm.softmax(x, rows_per_program=rows),
            "rmsnorm": lambda rows: rms.rmsnorm(x, w, rows_per_program=rows)}
    for name, run in runs.items():
        run(1)
        for bad in (True, 1.0, "4"):
            with pytest.raises(ValueError, match=f"rows_per_program must be a power of two.*got {bad!r}"):
                run(bad)


@pytest.mark.parametrize("n", [300, 20001])
def test_masked_stretches_of_minus_inf_give_torchs_results(monkeypatch, n):
    """Logits masked with -inf over long stretches (constrained decoding, a padded vocabulary): every softmax and
    cross-entropy mapping gives torch's result, including those whose chunks, segments or CTAs then hold -inf
    alone (streamed rows, piped segments, piped clusters; each took exp(-inf + inf) = NaN before)."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    x = torch.randn(4, n) * 3
    x[0, :n * 3 // 4] = -float("inf")
    x[1, n // 4:] = -float("inf")
    x[2, n // 10:n - n // 20] = -float("inf")
    x = x.to(BF16)
    target = torch.tensor([n - 1, 0, n - 2, 7])
    xd = x.double()
    want_loss, want_softmax = torch.nn.functional.cross_entropy(xd, target, reduction="none"), torch.softmax(xd, 1)
    for config in ce.mapping(n, 2):
        loss, lse = torch.full((4,), float("nan")), torch.full((4,), float("nan"))
        ce.run_mapping(config, x, target, loss, lse)
        assert torch.allclose(loss.double(), want_loss, rtol=1e-5, atol=1e-5), config
    for config in sm.mapping(n, None, 2):
        out = torch.full_like(x, float("nan"))
        sm.softmax_kernel[_rows.grid(4, config)](x, out, lines(x), lines(out), **config.launch_kwargs())
        assert torch.allclose(out.double(), want_softmax, rtol=2e-2, atol=1e-3), config


@pytest.mark.parametrize("n", [10, 300, 5000, 20000])
def test_cross_entropy_of_a_target_outside_the_row_is_nan(monkeypatch, n):
    """A target outside [0, n) that is not ignore_index: torch raises; every mapping gives a NaN loss (the target's
    logit had read as 0 outside the row, and the loss was a plausible number), the PTX as the interpreter."""
    x = torch.randn(6, n)
    target = torch.tensor([0, 3, n, -100, -5, n - 1])
    ref = torch.nn.functional.cross_entropy(x, target.clamp(0, n - 1), reduction="none")
    want = torch.where((target >= 0) & (target < n), ref, torch.nan).where(target != -100, 0.0)
    configs = ce.mapping(n, 4)  # piped ones too, from 4097 columns, and segments of rows past 16385
    with monkeypatch.context() as interpreted:
        interpreted.setenv("MGJIT_INTERPRET", "1")
        for config in configs:
            loss, lse = torch.full((6,), 7.0), torch.empty(6)
            ce.run_mapping(config, x, target, loss, lse)
            assert torch.allclose(loss, want, rtol=1e-5, atol=1e-5, equal_nan=True), config
    compiled = ce.cross_entropy_rows.compile(x, target, loss, lse, -100, x, loss, loss, **configs[0].launch_kwargs(),
                                             target="sm_90a")
    loss = torch.full((6,), 7.0)
    dev = ptx_sim.Device()
    dev.run(compiled, _rows.grid(6, configs[0]), x, target, loss, lse, -100, x, loss, loss,
            cluster=configs[0].kwargs["CTAS"])
    assert torch.allclose(dev.fetch(loss), want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("n", [3, 300, 5000, 20000])
def test_cross_entropy_near_zero_is_exact_and_never_negative(monkeypatch, n):
    """A target logit that dominates its row, of 0.75 to 100: the loss is 0 or more, as torch's, within 5e-7 of it,
    on every mapping (held, split over warpgroups or CTAs, piped, in segments) and from the PTX. Its logsumexp less
    the target's logit was off by up to an ulp of the maximum * log2(e) (the exps' shift, rounded): up to 3.8e-6
    here, and 28 of 399 rows of 3 negative (-1.2e-7 at a logit of 1.75, -9.5e-7 at 14)."""
    top = torch.arange(1, 400 if n < 1000 else 40, dtype=torch.float32) * (0.25 if n < 1000 else 2.5) + 0.5
    x = (top[:, None] - 40.0 - torch.arange(n, dtype=torch.float32) % 300).to(BF16)
    target = torch.randint(0, n, (len(top),))
    x[torch.arange(len(top)), target] = top.to(BF16)
    want = torch.nn.functional.cross_entropy(x.double(), target, reduction="none")
    configs = ce.mapping(n, 2)
    with monkeypatch.context() as interpreted:
        interpreted.setenv("MGJIT_INTERPRET", "1")
        for config in configs:
            loss, lse = torch.full((len(top),), float("nan")), torch.full((len(top),), float("nan"))
            ce.run_mapping(config, x, target, loss, lse)
            assert (loss >= 0).all() and torch.allclose(loss.double(), want, rtol=0, atol=5e-7), config
    loss, lse = torch.full((len(top),), float("nan")), torch.empty(len(top))
    args = (x, target, loss, lse, -100, x, loss, loss)
    compiled = ce.cross_entropy_rows.compile(*args, **configs[0].launch_kwargs(), target="sm_90a")
    dev = ptx_sim.Device()
    dev.run(compiled, _rows.grid(len(top), configs[0]), *args, cluster=configs[0].kwargs["CTAS"])
    assert (dev.fetch(loss) >= 0).all() and torch.allclose(dev.fetch(loss).double(), want, rtol=0, atol=5e-7)


def test_the_row_wrappers_refuse_bad_shapes_by_name(monkeypatch):
    """Bad inputs get a ValueError that names what was expected and what came (they were bare asserts, or for out
    nothing; integer inputs truncated, a float target too, an out overlapping an input raced)."""
    import fused_elementwise as fe
    x, w = torch.randn(2, 3, 64), torch.randn(64)
    cases = [(lambda: sm.softmax(torch.tensor(1.0)), r"softmax takes x whose last dimension .* 0-dimensional"),
             (lambda: rms.rmsnorm(x[0], w[:63]), r"rmsnorm takes .* got \(3, 64\) and \(63,\)"),
             (lambda: ln.layernorm(x, w[1:], w), r"layernorm takes .* got \(2, 3, 64\), \(63,\) and \(64,\)"),
             (lambda: ce.cross_entropy(x[0], torch.zeros(2, dtype=torch.long)),
              r"cross_entropy takes .* got \(3, 64\) and \(2,\)"),
             (lambda: fe.fused(w, w, w.half()), r"fused takes x, y and z of one shape and dtype"),
             # an out of another shape was written in part; an integer one truncated
             (lambda: sm.softmax(x[0], out=torch.empty(2, 64)), r"softmax: out must be .* \(3, 64\) .* got \(2, 64\)"),
             (lambda: rms.rmsnorm(x[0], w, out=torch.empty(3, 64, dtype=torch.int32)), r"rmsnorm: out .* torch.int32"),
             (lambda: ce.cross_entropy(x[0], torch.zeros(3, dtype=torch.long), out=torch.empty(2)),
              r"cross_entropy: out must be .* \(3,\) .* got \(2,\)"),
             (lambda: fe.fused(w, w, w, out=torch.empty(63)), r"fused: out must be"),
             # an out whose leading dimensions do not flatten into rows
             (lambda: sm.softmax(x, out=torch.empty(3, 2, 64).transpose(0, 1)),
              r"softmax: out of shape \(2, 3, 64\) and strides \(64, 128, 1\) is not a view of rows of 64"),
             # integer and bool inputs: torch refuses them; an output of their dtype truncated, bool failed to compile
             (lambda: sm.softmax(torch.ones(3, 64, dtype=torch.bool)),
              r"softmax takes a floating-point x, got torch.bool"),
             (lambda: fe.fused(*[torch.ones(64, dtype=torch.int32)] * 3),
              r"fused takes a floating-point x, got torch.int32"),
             (lambda: rms.rmsnorm(x[0], w.long()), r"rmsnorm takes a floating-point w, got torch.int64"),
             (lambda: ln.layernorm(x[0].int(), w, w), r"layernorm takes a floating-point x, got torch.int32"),
             (lambda: ce.cross_entropy(x[0].long(), torch.zeros(3, dtype=torch.long)),
              r"cross_entropy takes a floating-point logits, got torch.int64"),
             # a float target was truncated to class indices; torch reads it as probabilities
             (lambda: ce.cross_entropy(x[0], torch.full((3,), 0.7)),
              r"class indices of an integer dtype as target, got torch.float32"),
             # an out sharing memory with an input, but not that input itself: programs raced on the rows between
             (lambda: sm.softmax(x[0, 1:], out=x[0, :-1]), r"softmax: out overlaps x in part"),
             (lambda: rms.rmsnorm(x[0, :1], w, out=w.view(1, 64)), r"rmsnorm: out overlaps w in part"),
             (lambda: fe.fused(w[1:], w[1:], w[1:], out=w[:-1]), r"fused: out overlaps x in part")]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    monkeypatch.setenv("MGJIT_INTERPRET", "1")  # in place (out is x itself) stays allowed
    y = x[0].clone()
    sm.softmax(y, out=y)
    assert torch.allclose(y, torch.softmax(x[0], 1), rtol=1e-5, atol=1e-6)


def test_the_row_wrappers_take_any_leading_dimensions(monkeypatch):
    """softmax, rmsnorm and layernorm work over the last dimension of x, as torch's: leading dimensions (batch,
    sequence) flattened into rows, a strided x copied where they do not flatten, out in x's shape (in place too);
    rows of no columns come back empty, cross-entropy over no classes gives the losses of targets outside the row
    (NaN, 0 where ignored) and logsumexps of -inf (each had failed on a negative shift count in the mappings)."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    n = 40
    w, b = torch.randn(n), torch.randn(n)
    refs = {"softmax": (sm.softmax, (), lambda x: torch.softmax(x, -1)),
            "rmsnorm": (rms.rmsnorm, (w,), lambda x: torch.nn.functional.rms_norm(x, (n,), w, 1e-6)),
            "layernorm": (ln.layernorm, (w, b), lambda x: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5))}
    for name, (run, weights, ref) in refs.items():
        for x in (torch.randn(2, 3, n), torch.randn(n), torch.randn(3, 5, n).transpose(0, 1), torch.randn(2, 1, 2, n)):
            out = run(x, *weights)
            assert out.shape == x.shape and torch.allclose(out, ref(x), rtol=1e-4, atol=1e-5), (name, x.shape)
            given = torch.full(x.shape, float("nan"))
            assert run(x, *weights, out=given) is given and torch.allclose(given, ref(x), rtol=1e-4, atol=1e-5)
        x = torch.randn(2, 3, n)
        want = ref(x)
        assert run(x, *weights, out=x) is x and torch.allclose(x, want, rtol=1e-4, atol=1e-5), name
        empty = torch.randn(4, 2, 0)
        assert run(empty, *[t[:0] for t in weights]).shape == (4, 2, 0), name
    loss, lse = ce.cross_entropy(torch.randn(3, 0), torch.tensor([0, -100, 2]))
    assert torch.equal(loss.isnan(), torch.tensor([True, False, True])) and loss[1] == 0
    assert torch.equal(lse, torch.full((3,), -float("inf")))
    loss = ce.cross_entropy(torch.randn(2, 0), torch.tensor([-100, 1]), return_lse=False)
    assert loss[0] == 0 and loss[1].isnan()


def test_short_rows_also_try_two_arrays_that_pad_less():
    """Rows a warpgroup holds that one power of two, or the binary digits of the row rounded up to 128 columns,
    would pad by more than another array costs: also held as two (each mapping's rows a power of two, as every
    held mapping's)."""
    lengths = (1, 2, 3, 7, 9, 33, 35, 63, 65, 100, 129, 192, 193, 255, 256, 260, 300, 1100, 4100, 8191, 8193)
    assert [_rows._two_parts(n) for n in lengths] == [
        (), (), (2, 1), (), (8, 1), (32, 1), (32, 4), (), (64, 1), (), (128, 1), (128, 64), (), (), (), (256, 4),
        (256, 64), (), (4096, 4), (), ()]
    for n in (3, 33, 150):
        pairs = [c for c in _rows.candidates(n) if len(c.kwargs["PARTS"]) == 2]
        assert pairs and all(c.kwargs["PARTS"] == _rows._two_parts(n) for c in pairs), n
        assert all(c.kwargs["ROWS"] & (c.kwargs["ROWS"] - 1) == 0 for c in pairs), n
    for n, rows in ((260, (8, 16)), (1030, (2, 4)), (4100, (1, 2))):
        pairs = [c for c in _rows.candidates(n) if c.kwargs["PARTS"] == _rows._two_parts(n)]
        assert [c.kwargs["ROWS"] for c in pairs] == list(rows), n


def test_rows_also_try_three_arrays_that_pad_a_tail_to_16_bytes():
    """Where the row rounded up to 8 columns has three binary digits, they are also tried (300 as 256 + 32 + 16),
    if they pad less than the two arrays (256 + 64) and `parts` (256 + 128)."""
    lengths = (50, 100, 127, 150, 300, 700, 1100, 1500, 3000, 4100, 8000, 8191, 9000)
    assert [_rows._fine_parts(n) for n in lengths] == [
        (32, 16, 8), (64, 32, 8), (), (128, 16, 8), (256, 32, 16), (512, 128, 64), (1024, 64, 16), (), (), (), (),
        (), ()]
    for n, rows in ((300, (8, 16)), (1100, (2, 4)), (150, (16, 32))):
        triples = [c for c in _rows.candidates(n) if len(c.kwargs["PARTS"]) == 3]
        assert [(c.kwargs["ROWS"], c.kwargs["PARTS"]) for c in triples] == [(r, _rows._fine_parts(n)) for r in rows]
    # 704 columns as 512 + 128 + 64, tried beside 512 + 256 (`parts`, 768): nothing pads less in two
    assert {c.kwargs["PARTS"] for c in _rows.candidates(700)} == {(512, 256), (512, 128, 64)}


def test_rows_of_three_arrays_or_more_also_try_one_padded_array():
    """A row `parts` holds in three arrays or more is also tried as one array, the next power of two (padded and
    masked), at about 4096 elements a program (four rows of 4096); rows of one or two arrays, and rows whose next
    power of two is wider than 4096 columns, are not."""
    single = {n: [(c.kwargs["ROWS"], c.kwargs["PARTS"]) for c in _rows.candidates(n)
                  if len(c.kwargs["PARTS"]) == 1 and c.kwargs["BLOCK"] == 0]
              for n in (333, 700, 777, 1001, 1100, 1800, 3800, 5000)}
    assert single == {333: [], 700: [], 777: [(4, (1024,))], 1001: [(4, (1024,)), (8, (1024,)), (2, (1024,))],
                      1100: [], 1800: [(2, (2048,))], 3800: [(4, (4096,))], 5000: []}


def test_candidates_cover_every_length():
    """Held mappings cover the row; every row longer than 4096 columns can also stream (the mapping used before
    rows were split over clusters: the autotuner can always fall back to it) and be chunked (over a cluster
    where it is longer than CHUNK_SEGMENT), with no CTA's segment wholly past the row's end and at most
    128 KB of shared memory a CTA in f32; rows longer than a cluster holds only stream."""
    for n in [1, 2, 127, 128, 129, 4095, 4096, 4097, 8191, 8192, 8193, 32000, 50257, 100000, 131072, 262144]:
        configs = _rows.candidates(n)
        assert configs, n
        assert (_rows.streaming() in configs) == (n > _rows.SEGMENT // 2), n
        chunked = [c for c in configs if c.kwargs["CHUNKS"]]
        assert bool(chunked) == (n > _rows.SEGMENT // 2), n
        assert any(c.kwargs["CTAS"] > 1 for c in chunked) == (n > _rows.CHUNK_SEGMENT), n
        for c in configs:
            k = c.kwargs
            segments = k["CTAS"] * k["WGS"]
            assert k["BLOCK"] > 0 or sum(k["PARTS"]) * segments >= n and k["ROWS"] >= 1
            assert k["CTAS"] <= 8 and k["WGS"] <= 4 and (c.num_warpgroups or 1) == k["WGS"]
            assert (c.cluster or (1, 1, 1))[0] == k["CTAS"]
        for c in chunked:
            k = c.kwargs
            width = k["CHUNKS"] * k["BLOCK"]
            assert k["ROWS"] == k["WGS"] == 1 and k["CTAS"] * width >= n > (k["CTAS"] - 1) * width, (n, k)
            assert width * 4 <= 128 * 1024, (n, k)
    assert _rows.mapping(262145) == (_rows.streaming(),)
    assert _rows.mapping(262145, stream=8192) == (_rows.streaming(8192),)


# From the PTX: rows of 4097 bf16 (every row starts 2 bytes further into a word) as one and as two
# warpgroups, 9000-wide f16 rows over a cluster of 2, streamed and chunked in one CTA, 20000-wide bf16 rows
# over 3 CTAs of 2 warpgroups and chunked over 2 CTAs (the second's last chunk crosses the row's end). Softmax
# and cross-entropy; chunked rows all four kernels (layernorm masks the chunks that cross the row's end). Short
# rows in two arrays (_rows._two_parts): 33 bf16 columns as 32 + 1 (rows starting 2 bytes into a word), 150 f16
# as 128 + 32 (the second array crossing the row's end), 1030 f16 as 1024 + 8 (rows starting 4 bytes into 16);
# in three (_rows._fine_parts): 300 bf16 as 256 + 32 + 16 (the third crossing the row's end by 4 columns); aligned
# rows of 264 and 1032 bf16 as 256 + 128 and 1024 + 128 (the second array in a layout that reduces where the first's
# statistics are: 8-byte accesses, a row a warp); f16 rows of 777 in one array of 1024 (a quarter of it past the
# row's end, rows starting 2 bytes into a word).
SIMULATED = [(4097, BF16, _rows.candidates(4097)[0]), (4097, BF16, _rows.candidates(4097)[2]),
             (9000, torch.float16, _rows.candidates(9000)[0]), (9000, torch.float16, _rows.streaming()),
             (9000, torch.float16, _rows.chunkings(9000)[0]), (20000, BF16, _rows.candidates(20000)[3]),
             (20000, BF16, _rows.chunkings(20000)[1]), (33, BF16, _rows.hold(64, (32, 1))),
             (150, torch.float16, _rows.hold(16, (128, 32))), (300, BF16, _rows.hold(16, (256, 32, 16))),
             (1030, torch.float16, _rows.hold(4, (1024, 8))), (264, BF16, _rows.hold(8, (256, 128))),
             (1032, BF16, _rows.hold(2, (1024, 128))), (777, torch.float16, _rows.hold(4, (1024,)))]


@pytest.mark.parametrize("n,dtype,config", SIMULATED, ids=lambda v: v.short() if isinstance(v, mgjit.Config) else str(v))
def test_ptx_of_candidates_simulated(n, dtype, config):
    x = (torch.randn(3, n) * 3).to(dtype)
    every = kernels(x, dtype)
    for kernel, args, constexprs, checks in every if config.kwargs["CHUNKS"] else every[::3]:
        compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
        dev = ptx_sim.Device()
        dev.run(compiled, _rows.grid(x.shape[0], config), *args, cluster=config.kwargs["CTAS"])
        for got, ref, tol in checks:
            assert rel_err(dev.fetch(got), ref) < max(tol, TOL[dtype]), f"{kernel.name} {config}"


# Staged stores (_rows.staging): softmax over 16 rows of 255 a program and 256 of 9 (its rows held 8 columns a
# thread, ops/gmem.py SHORT_ROW_BYTES), RMSNorm over 8 of 511 (and persistent: the staged store in a loop over row
# groups), layernorm over rows of 5, on more rows than the grid's last program holds; rows held as two arrays
# stored side by side in one run: softmax 9 as 8 + 1, RMSNorm 17 as 16 + 1, layernorm 33 as 32 + 1.
STAGED = [(255, BF16, "softmax", sm.mapping(255)[3]), (511, torch.float16, "rmsnorm", rms.rmsnorm_mapping(511)[3]),
          (511, BF16, "rmsnorm", rms.rmsnorm_mapping(511)[9]),
          (9, BF16, "softmax", next(c for c in sm.mapping(9) if c.kwargs["STAGED"] and c.kwargs["PARTS"] == (16,))),
          (5, torch.float16, "layernorm", next(c for c in ln.layernorm_mapping(5) if c.kwargs["STAGED"])),
          (9, BF16, "softmax", next(c for c in sm.mapping(9) if c.kwargs["STAGED"] and c.kwargs["PARTS"] == (8, 1))),
          (17, BF16, "rmsnorm", next(c for c in rms.rmsnorm_mapping(17) if c.kwargs["STAGED"]
                                     and c.kwargs["PARTS"] == (16, 1) and not c.kwargs["PERSIST"])),
          (33, torch.float16, "layernorm", next(c for c in ln.layernorm_mapping(33) if c.kwargs["STAGED"]
                                                and c.kwargs["PARTS"] == (32, 1)))]


@pytest.mark.parametrize("n,dtype,name,config", STAGED,
                         ids=lambda v: v.short() if isinstance(v, mgjit.Config) else str(v))
def test_ptx_of_staged_mappings_simulated(n, dtype, name, config):
    assert config.kwargs["STAGED"] == 1 and (config.kwargs.get("PERSIST", 0) > 0) == (config is STAGED[2][3])
    x = (torch.randn(300 if n < 64 else 37, n) * 3).to(dtype)
    kernel, args, constexprs, checks = kernels(x, dtype)[{"softmax": 0, "rmsnorm": 1, "layernorm": 2}[name]]
    compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
    dev = ptx_sim.Device()
    dev.counts = collections.Counter()
    dev.run(compiled, _rows.grid(x.shape[0], config), *args)
    for got, ref, tol in checks:
        assert rel_err(dev.fetch(got), ref) < max(tol, TOL[dtype]), f"{kernel.name} {config}"
    assert dev.counts.get("ld.shared.v4.b32", 0) > 0  # the rows went out from shared memory as one run


def test_staged_twins_only_where_rows_are_misaligned():
    """Rows of 3, 9, 255 and 511: each held mapping of 4 or more rows on one warpgroup again with STAGED=1 (rows of 9
    held as 8 + 1 too: one store, its arrays side by side); rows of 256 (16-byte aligned in bf16) and layernorm's
    past STAGED_ROWS (measured slower staged): none."""
    for n in (3, 9, 255, 511):
        held = [c for c in sm.mapping(n) if not c.kwargs["BLOCK"] and not c.kwargs.get("PIPE")
                and c.kwargs["ROWS"] >= 4 and c.kwargs["CTAS"] == c.kwargs["WGS"] == 1]
        staged = [c for c in sm.mapping(n) if c.kwargs.get("STAGED")]
        assert staged and [c.replace(STAGED=1) for c in held if not c.kwargs.get("STAGED")] == staged
        assert (n > 9) or any(len(c.kwargs["PARTS"]) == 2 for c in staged), n
        for configs in (sm.mapping(n, itemsize=2), rms.rmsnorm_mapping(n, itemsize=2)):  # the autotuner's rule
            assert len({tuple(sorted(c.kwargs)) for c in configs}) == 1
    assert not any(c.kwargs.get("STAGED") for c in sm.mapping(256) + rms.rmsnorm_mapping(256))
    assert not any(c.kwargs.get("STAGED") for c in ln.layernorm_mapping(255))
    assert any(c.kwargs.get("STAGED") for c in ln.layernorm_mapping(9)) and ln.STAGED_ROWS <= 255
    for n in (3, 9, 255, 256, 4097, 100000):  # the autotuner's rule, with and without twins
        for configs in (ln.layernorm_mapping(n), ln.layernorm_mapping(n, itemsize=2, weight_sizes=(2, 2))):
            assert len({tuple(sorted(c.kwargs)) for c in configs}) == 1, n


def test_cross_entropy_also_caps_short_two_array_rows_registers():
    """Cross-entropy's short rows held as two arrays are tried again with registers capped for TWO_PART_OCC CTAs an
    SM (one key set for the tuner); longer two-array rows (4097 as 4096 + 128) are not."""
    for n, capped in ((9, 2), (33, 2), (150, 2), (4097, 0), (100000, 0)):
        configs = ce.mapping(n, 2)
        occ = [c for c in configs if c.kwargs["OCC"]]
        assert len(occ) == capped and all(c.kwargs["OCC"] == ce.TWO_PART_OCC for c in occ), n
        assert [c.replace(OCC=0) for c in occ] == [c for c in configs if len(c.kwargs["PARTS"]) == 2
                                                   and sum(c.kwargs["PARTS"]) < 256 and not c.kwargs["OCC"]]
        assert len({tuple(sorted(c.kwargs)) for c in configs}) == 1, n


def test_cross_entropy_also_tries_early_targets_and_full_occupancy():
    """Cross-entropy's rows held whole in two arrays or more, wider than EARLY_COLUMNS, are tried again with their
    targets' logits gathered first (EARLY), and those held one a program in at most FULL_OCC_COLUMNS again at FULL_OCC
    CTAs an SM (and that twin gathering first too); one key set for the tuner."""
    for n, early, full in ((300, 0, 0), (1600, 6, 1), (2304, 4, 1), (3000, 4, 1), (4096, 0, 0), (5000, 2, 0)):
        configs = ce.mapping(n, 2)
        whole = [c for c in configs if not (c.kwargs["EARLY"] or c.kwargs["BLOCK"] or c.kwargs["PIPE"])
                 and c.kwargs["CTAS"] * c.kwargs["WGS"] == 1]
        twins = [c.replace(EARLY=0) for c in configs if c.kwargs["EARLY"]]
        assert len(twins) == early and twins == [c for c in whole if len(c.kwargs["PARTS"]) > 1
                                                 and sum(c.kwargs["PARTS"]) > ce.EARLY_COLUMNS], n
        capped = [c.replace(OCC=0) for c in whole if c.kwargs["OCC"] == ce.FULL_OCC]
        assert len(capped) == full and capped == [c for c in whole if c.kwargs["ROWS"] == 1 and not c.kwargs["OCC"]
                                                  and sum(c.kwargs["PARTS"]) <= ce.FULL_OCC_COLUMNS], n
        assert len({tuple(sorted(c.kwargs)) for c in configs}) == 1, n


def test_cross_entropy_gathers_the_targets_logits_before_the_exps_where_early():
    """EARLY=1 issues the targets' logit loads before the row's exps, EARLY=0 after them (in the PTX's order)."""
    logits, target, loss = torch.empty(64, 2304, dtype=BF16), torch.empty(64, dtype=torch.long), torch.empty(64)
    config = next(c for c in ce.mapping(2304, 2) if c.kwargs["ROWS"] == 2 and not c.kwargs["OCC"])
    for early in (0, 1):
        ptx = ce.cross_entropy_rows.compile(logits, target, loss, loss, -100, logits, loss, loss,
                                            **config.replace(EARLY=early).launch_kwargs(), target="sm_90a").ptx
        gather, exp = ptx.index("ld.global.b16"), ptx.index("ex2.approx")
        assert (gather < exp) == bool(early), early


def softmax_or_cross_entropy_ptx(kernel: str, n: int, mapping) -> str:
    """The sm_90a PTX of softmax's or cross-entropy's kernel over 64 bf16 rows of n under a held `mapping`."""
    x = torch.empty(64, n, dtype=BF16)
    config = mapping.replace(**{k: 0 for k in (sm.mapping if kernel == "softmax" else ce.mapping)(n)[0].kwargs
                                if k not in mapping.kwargs})
    if kernel == "softmax":
        return sm.softmax_kernel.compile(x, x, x, x, **config.launch_kwargs(), target="sm_90a").ptx
    target, loss = torch.empty(64, dtype=torch.long), torch.empty(64)
    return ce.cross_entropy_rows.compile(x, target, loss, loss, -100, x, loss, loss, **config.launch_kwargs(),
                                         target="sm_90a").ptx


@pytest.mark.parametrize("kernel", ["softmax", "cross_entropy"])
@pytest.mark.parametrize("n,mapping", [(2100, _rows.hold(4, (2048, 128))), (1608, _rows.hold(4, (1024, 512, 128))),
                                       (3000, _rows.hold(1, (2048, 1024))), (2101, _rows.hold(4, (2048, 128)))],
                         ids=["2100", "1608", "3000", "2101-shifted"])
def test_a_rows_plain_loads_go_out_on_one_path(kernel, n, mapping):
    """A row held as several arrays read with a fill (-inf), in plain accesses (aligned, or narrowed to the rows'
    8-byte alignment): every load of the row comes before its maximum, with no branch among them. Under a branch
    each, a branch's loads were waited for where it joined, so the row took a memory latency an array
    (cross-entropy 2100 ran 0.82 of copy bandwidth, 0.96 unbranched; H200). Rows that start inside a word (2101)
    keep a branch around their per-word tests."""
    ptx = softmax_or_cross_entropy_ptx(kernel, n, mapping)
    first_load, first_max = ptx.index("ld.global"), ptx.index("max.")
    row_loads = re.findall(r"ld\.global\.(?:v4\.b32|v2\.b32|b32)", ptx[first_max:])
    assert not row_loads or kernel == "cross_entropy" and n % 2, row_loads  # odd rows' gathers are words
    assert ("bra" in ptx[first_load:first_max]) == bool(n % 2)


@pytest.mark.parametrize("kernel,mapping", [("softmax", _rows.hold(8, (256, 64, 16))),
                                            ("cross_entropy", _rows.hold(16, (256, 128)))])
def test_a_rows_shifted_arrays_load_inside_the_first_arrays_paths(kernel, mapping):
    """Rows starting inside a word (bf16 rows of 333) read as several arrays of words shifted into place: every
    array's loads go out inside the paths of the first array's branch, none after its paths join. Each array under
    its own branch waited for the previous array's words and their shifts (prmt) first: softmax over such rows
    0.70 -> 0.89 of copy bandwidth, cross-entropy 0.80 -> 0.84 (H200, benchmarks/rows_ab.py)."""
    n = 333
    ptx = softmax_or_cross_entropy_ptx(kernel, n, mapping)
    first_max = ptx.index("max.")
    join = re.search(r"bra\.uni\s+(\$L__BB\d+_\d+);", ptx).group(1)
    after_join = ptx[ptx.index(f"\n{join}:"):first_max]
    assert "prmt.b32" in ptx[:first_max] and ptx[:first_max].count("ld.global.b32") > 2 * len(mapping.kwargs["PARTS"])
    assert not re.search(r"ld\.global\.b(16|32)", after_join), after_join  # (cross-entropy loads its targets there)


def test_examples_read_rows_in_whole_words():
    """The PTX of the examples' heuristic picks: 4097-wide bf16 rows (every one starting at another offset in a
    32-bit word) loaded and stored as aligned words shifted by prmt, with no bounds test, where a window's column
    group is inside the tensor (tests/test_gmem_vectors.py counts them), and element by element (each 2-byte
    access behind its own bound, or behind a branch on its window lying inside the row) only where it is not or
    a thread holds one element of a row's narrow part; cross-entropy's aligned
    bf16 logits loaded 16 bytes at a time, with no relayout through shared memory (what made it slow), and
    the target logits of the rows a thread holds gathered, one 2-byte load each (at most ROWS a thread)."""
    x = torch.empty(64, 4097, dtype=BF16)
    c = sm.compile(x, x, "sm_90a")
    assert "prmt.b32" in c.ptx and "ld.global.b32" in c.ptx and "st.global.b32" in c.ptx
    assert "ld.global.v4" not in c.ptx and "shfl.sync.down" not in c.ptx
    lines = c.ptx.splitlines()
    narrow = [i for i, line in enumerate(lines) if "ld.global.b16" in line]
    # behind a bound: a predicate, or a branch past it where the window does not lie wholly inside the row
    assert narrow and all(re.search(r"@%p\d+ ld\.global\.b16", lines[i])
                          or any(re.search(r"@%p\d+ bra", line) for line in lines[i - 3:i]) for i in narrow), \
        "every 2-byte load is behind a bound"
    for n in (1000, 4096, 4097):
        logits, target, loss = torch.empty(64, n, dtype=BF16), torch.empty(64, dtype=torch.long), torch.empty(64)
        c = ce.compile(logits, target, loss, "sm_90a")
        config = ce.mapping(n)[0].kwargs
        assert ("ld.global.v4.b32" in c.ptx) == (n % 8 == 0), n
        # the targets' logits; odd rows also load a window that crosses the row's end element by element
        gathered = c.ptx.count("ld.global.b16")
        assert (gathered > config["ROWS"]) if n % 2 else (1 <= gathered <= config["ROWS"]), (n, gathered)
        assert c.smem_bytes <= 256, n  # the reductions' scratch only (a relayout took 1216 and 4144 bytes)


@pytest.mark.parametrize("n,index,head", [(4095, 0, True), (8191, 0, True), (8191, 3, True), (50257, 0, False)],
                         ids=["4095", "8191", "8191-chunks", "50257-cluster"])
def test_softmax_windows_take_a_head_path_where_their_start_is_fixed_or_stepped(monkeypatch, n, index, head):
    """Rows of odd bf16 length (shifted words): a window at a constant start (a row's part) or at a loop's
    induction variable (a row's chunks) takes a third path, its first 7/8 of columns unchecked and the rest
    checked, beside all unchecked and all checked; one whose start comes from the CTA's place in a cluster does
    not (a third path cost 32 registers there, and no row ends in its head)."""
    from mgjit.cache import store
    from mgjit.ops import gmem_window
    monkeypatch.setattr(store, "default_store", lambda: None)  # compiled twice, the second without heads
    x = torch.empty(64, n, dtype=BF16)
    config = _rows.mapping(n)[index]
    split = gmem_window.column_split

    def headless(*args):
        hi, head, tail = split(*args)
        return hi, tuple(sorted(head + tail)), ()
    branches = []
    for column_split in (split, headless):
        monkeypatch.setattr(gmem_window, "column_split", column_split)
        monkeypatch.setattr(sm.softmax_kernel, "_compiled", {})
        ptx = sm.softmax_kernel.compile(x, x, x, x, **config.launch_kwargs(), target="sm_90a").ptx
        branches.append(ptx.count("bra.uni"))
    assert (branches[0] > branches[1]) == head, branches


@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=str)
def test_fused_candidates_do_not_spill(dtype):
    """Every block size the fused elementwise example may pick, on a flat size that is not a multiple of the
    16-byte access (the ragged end's store is the costliest in registers)."""
    import fused_elementwise as fe
    x = torch.empty(4097 * 33, dtype=dtype)
    for config in fe.BLOCKS:
        assert fe.fused_flat.compile(x, x, x, x, **config.launch_kwargs(), target="sm_90a").spills == 0, config


NORMS = {"rmsnorm": (rms.rmsnorm_kernel, rms.rmsnorm_mapping, {"eps": 1e-6}, 1, 3),  # weights, views
         "layernorm": (ln.layernorm_rows, ln.layernorm_mapping, {"eps": 1e-5}, 2, 4)}


@pytest.mark.parametrize("name,n,segments", [("rmsnorm", 4095, 1), ("layernorm", 4095, 1), ("rmsnorm", 8191, 2),
                                             ("layernorm", 8191, 2), ("rmsnorm", 8193, 2), ("layernorm", 8193, 2),
                                             ("rmsnorm", 50257, 7), ("layernorm", 50257, 7)])
def test_ragged_weights_cost_no_register_per_element(name, n, segments):
    """The norms' weight vectors end inside an access where n is odd: their last access's elements past the end
    are filled in the loaded words, which stay packed until converted. Filled per unpacked element they held a
    register each: layernorm over bf16 rows of 4095 took 127 registers, 95 with weights 4096 long (on an H100,
    rmsnorm over rows of 8191 on two warpgroups ran 0.79 of copy bandwidth so, 0.94 filled in the words). So
    ragged weights compile to about as many registers as whole ones."""
    kernel, mapping, constexprs, weights, views = NORMS[name]
    x = torch.empty(64, n, dtype=BF16)
    config = [c for c in mapping(n) if sum(c.kwargs["PARTS"]) and c.kwargs["CTAS"] * c.kwargs["WGS"] == segments
              and not c.kwargs.get("OCC") and not c.kwargs["PERSIST"]][0]
    registers = []
    for length in (n, -(-n // 8) * 8):
        w = torch.empty(length, dtype=BF16)
        registers.append(kernel.compile(x, *[w] * weights, x, *[x] * views, **constexprs, **config.launch_kwargs(),
                                        target="sm_90a").registers)
    assert registers[0] <= registers[1] + 8, (config, registers)


class PreferTimer:
    """A fake timer under which `best` is the fastest config."""
    device = "stub-gpu"

    def __init__(self, best):
        self.best = best

    def __call__(self, run) -> float:
        run()
        return 1.0 if run.config == self.best else 2.0


@pytest.mark.parametrize("n", [1000, 20000], ids=["rows", "cluster"])
def test_a_tuned_row_launch_goes_through_the_c_launcher_after_its_first_call(monkeypatch, tmp_path, n):
    """_rows_launch.tuned_launch on a stub GPU (tests/launch_stub.py): the first call of a shape sweeps the candidates
    (a fake timer prefers softmax's second and rmsnorm's last persistent one), later calls launch the chosen
    mapping in one C call, with the grid its grid callable computes from the config's ROWS, CTAS and PERSIST (2
    SMs for a CPU tensor), its cluster and its warpgroups; a constexpr passed by name (rmsnorm's eps) takes the
    same path."""
    from launch_stub import StubGPU
    try:
        gpu = StubGPU(monkeypatch)
    except RuntimeError as e:  # no C compiler or no DLPack exchange API: nothing to test here
        pytest.skip(f"the C launcher is unavailable: {e}")
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    for kernel in (sm.softmax_kernel, rms.rmsnorm_kernel):  # an entry made before the stub has no C launcher
        monkeypatch.setattr(kernel, "_entry", None)
    softmax_configs, rmsnorm_configs = sm.mapping(n, None, 4), rms.rmsnorm_mapping(n, None, 4)
    preferred = {sm.softmax_kernel.name: softmax_configs[1],
                 rms.rmsnorm_kernel.name: [c for c in rmsnorm_configs if c.kwargs["PERSIST"]][-1]}
    misses = []

    def tuned(kernel, candidates, key):
        timer = PreferTimer(preferred[kernel.name])
        t = mgjit.autotune(configs=list(candidates), key=[key], timer=timer, jobs=1)(kernel)
        original = t._c_miss
        monkeypatch.setattr(t, "_c_miss", lambda *a, **k: misses.append(kernel.name) or original(*a, **k))
        return t

    monkeypatch.setattr(_rows_launch, "_tuned", functools.lru_cache(maxsize=None)(tuned))
    monkeypatch.setattr(_rows_launch, "tuning_enabled", lambda x: True)
    x, w = torch.randn(64, n), torch.randn(n)
    functions = {}
    for example, kernel, args, constexprs, configs in (
            (sm.softmax, sm.softmax_kernel, (x,), {}, softmax_configs),
            (rms.rmsnorm, rms.rmsnorm_kernel, (x, w), {"eps": 1e-6}, rmsnorm_configs)):
        views = (x, x) if kernel is sm.softmax_kernel else (x, x, x)  # the wrappers' views: any of x's dtype
        example(*args)
        best = preferred[kernel.name]
        first = len(gpu.launches)
        example(*args)
        example(*args)
        assert misses.count(kernel.name) == 1 and len(gpu.launches) == first + 2
        last = gpu.launches[-1]
        groups = 64 // best.kwargs["ROWS"]
        grid = min(groups, 2 * best.kwargs["PERSIST"]) if best.kwargs.get("PERSIST") else groups * best.kwargs["CTAS"]
        assert last.path == "c" and last.grid == (grid, 1, 1)
        assert last.cluster == (best.cluster or (1, 1, 1)) and last.threads == 128 * best.kwargs["WGS"]
        assert _rows_launch.picked(kernel, configs, (*args, torch.empty_like(x)), views, **constexprs) == best
        functions[kernel.name] = last.function
    sm.softmax(x, x)  # in place, once the shape is tuned: the tuned mapping on its grid, no sweep
    best = preferred[sm.softmax_kernel.name]
    assert misses.count(sm.softmax_kernel.name) == 1 and gpu.launches[-1].grid == (64 // best.kwargs["ROWS"]
                                                                                  * best.kwargs["CTAS"], 1, 1)
    assert gpu.launches[-1].function == functions[sm.softmax_kernel.name]
    sm.softmax(torch.randn(32, n))  # another shape: swept for itself, launched on its own grid
    assert misses.count(sm.softmax_kernel.name) == 2 and gpu.launches[-1].grid == (32 // best.kwargs["ROWS"]
                                                                                  * best.kwargs["CTAS"], 1, 1)


def test_layernorm_also_tries_held_rows_at_higher_occupancy():
    """layernorm_mapping: the row examples' mappings (OCC=0, with staged twins for rows shorter than STAGED_ROWS),
    then each held one again asking ptxas to fit 3 and 4 CTAs an SM, where the threads allow it, then the
    persistent grids (_rows.persisting), then (for elements of a known size) the piped ones; every config sets the
    same constexprs (the tuner requires it)."""
    piped_keys = ("PIPE", "PL", "STAGES", "STASH", "LAST", "FLAT")
    assert [c.kwargs["PIPE"] for c in ln.layernorm_mapping(8193, None, 2, (2, 2))][-4:] == [2, 2, 2, 3]
    for n in (16, 4097, 32000, 300000):
        configs = ln.layernorm_mapping(n)
        assert len({tuple(sorted(c.kwargs)) for c in configs}) == 1, n
        assert not any(c.kwargs["PIPE"] for c in configs), n
        assert [{k: v for k, v in c.kwargs.items() if k not in ("OCC", "PERSIST", "STAGED", *piped_keys)}
                for c in configs if not c.kwargs["OCC"] and not c.kwargs["PERSIST"] and not c.kwargs["STAGED"]] == [
            dict(c.kwargs) for c in _rows.mapping(n)], n
        assert all(not c.kwargs["OCC"] for c in configs if c.kwargs["PERSIST"]), n
        held = [c for c in _rows.mapping(n) if not c.kwargs["BLOCK"]]
        capped = [c for c in configs if c.kwargs["OCC"]]
        assert len(capped) == sum(occ * 128 * c.kwargs["WGS"] <= 2048 for c in held for occ in ln.OCCUPANCY), n
        assert all(not c.kwargs["BLOCK"] for c in capped)
    # Rows of 4097 bf16 held by one warpgroup, capped for 4 CTAs an SM: at most 128 registers, no spill.
    x, w = torch.empty(8, 4097, dtype=BF16), torch.empty(4097, dtype=BF16)
    one = [c for c in ln.layernorm_mapping(4097)
           if c.kwargs["ROWS"] == 1 and c.kwargs["WGS"] == 1 and not c.kwargs["PERSIST"]]
    compiled = {c.kwargs["OCC"]: ln.layernorm_rows.compile(x, w, w, x, x, x, x, x, eps=1e-5, **c.launch_kwargs(),
                                                           target="sm_90a")
                for c in one}
    assert ".minnctapersm 1" in compiled[0].ptx and ".minnctapersm 3" in compiled[3].ptx
    assert compiled[4].registers <= 128 and compiled[4].spills == 0 and ".minnctapersm 4" in compiled[4].ptx
    xf = torch.randn(5, 4097) * 3
    for kernel, args, constexprs, checks in kernels(xf, torch.float32)[2:3]:
        config = [c for c in ln.layernorm_mapping(4097) if c.kwargs["OCC"] == 4][0]
        kernel.interpret[_rows.grid(xf.shape[0], config)](*args, **constexprs, **config.launch_kwargs())
        for got, ref, tol in checks:
            assert rel_err(got, ref) < tol


@pytest.mark.parametrize("n", [77, 4097, 8191])
def test_persistent_norms_interpreted(n):
    """The norms' persistent grids (_rows.persisting): fewer programs than row groups (2 SMs without a GPU), each
    looping over its groups (the last one partial) with its segment of the weights read once into shared
    memory."""
    for index, mapping in ((1, rms.rmsnorm_mapping), (2, ln.layernorm_mapping)):
        persistent = [c for c in mapping(n) if c.kwargs["PERSIST"]]
        assert persistent and all(c.kwargs["PERSIST"] * c.kwargs["WGS"] == 4 for c in persistent), n
        for config in persistent:
            m = config.kwargs["ROWS"] * 9 - 1
            assert _rows.grid(m, config)[0] == 2 * config.kwargs["PERSIST"] < 9, config
            kernel, args, constexprs, checks = kernels(torch.randn(m, n) * 3, torch.float32)[index]
            kernel.interpret[_rows.grid(m, config)](*args, **constexprs, **config.launch_kwargs())
            for got, ref, tol in checks:
                assert rel_err(got, ref) < tol, f"{kernel.name} {config}"


@pytest.mark.parametrize("wgs,rows", [(2, 1), (1, 2)])
def test_ptx_of_persistent_norms_simulated(wgs, rows):
    """The persistent norms from their sm_90a PTX: bf16 rows of 4097 (each starting at another offset in a word),
    two warpgroups each holding half a row and stashing half the weights, or two rows per group; each program
    loops over 2 or 3 groups."""
    n = 4097
    for index, mapping in ((1, rms.rmsnorm_mapping), (2, ln.layernorm_mapping)):
        config = [c for c in mapping(n) if c.kwargs["PERSIST"] and c.kwargs["WGS"] == wgs
                  and c.kwargs["ROWS"] == rows][0]
        m = 5 * rows
        x = (torch.randn(m, n) * 3).to(BF16)
        kernel, args, constexprs, checks = kernels(x, BF16)[index]
        compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
        dev = ptx_sim.Device()
        dev.run(compiled, _rows.grid(m, config), *args)
        for got, ref, tol in checks:
            assert rel_err(dev.fetch(got), ref) < tol, f"{kernel.name} {config}"


def test_persistent_grids_fit_their_weights_in_shared_memory():
    """PERSIST programs an SM each keep their weights' segments in shared memory as float32: a persistent mapping
    is offered only where PERSIST of them fit (layernorm's w and b over 8192 columns a warpgroup do not fit 4
    times), and the compiled kernels' shared memory says so."""
    held = [c for c in ln.layernorm_mapping(8191) if c.kwargs["PERSIST"]]
    assert [(c.kwargs["PARTS"], c.kwargs["WGS"]) for c in held] == [((4096,), 2)]
    assert any(c.kwargs["PARTS"] == (8192,) and c.kwargs["ROWS"] == 1 for c in rms.rmsnorm_mapping(8191)
               if c.kwargs["PERSIST"])
    x = torch.empty(8, 8191, dtype=BF16)
    w = torch.empty(8191, dtype=BF16)
    for kernel, args, constexprs, configs in ((rms.rmsnorm_kernel, (x, w, x, x, x, x), {"eps": 1e-6},
                                               rms.rmsnorm_mapping(8191)),
                                              (ln.layernorm_rows, (x, w, w, x, x, x, x, x), {"eps": 1e-5}, held)):
        for config in [c for c in configs if c.kwargs["PERSIST"] and c.kwargs["ROWS"] == 1]:
            compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
            # an SM's 228 KB: what one CTA may use and the 1 KB it reserves
            assert config.kwargs["PERSIST"] * (compiled.smem_bytes + 1024) <= HOPPER.smem_bytes + 1024, config


def test_persistent_layernorm_issues_fewer_instructions_an_element():
    """tools/ptx_profile.py from the PTX simulator: layernorm over bf16 rows of 4095 (each starting at another
    offset in a word) issues about 33 PTX instructions an element held by one warpgroup, the persistent grid
    with float32 weights in shared memory about 24 over 8 rows a program (it loads, bounds-tests and converts
    no weight per row), and an aligned row of 4096 about 17."""
    sys.path.insert(0, str(ROOT / "tools"))
    import ptx_profile
    configs = ln.layernorm_mapping(4095)
    held = [c for c in configs if c.kwargs["ROWS"] == 1 and not c.kwargs["OCC"] and not c.kwargs["PERSIST"]][0]
    persistent = [c for c in configs if c.kwargs["ROWS"] == 1 and c.kwargs["PERSIST"]][0]
    _, per_held, held_opcodes = ptx_profile.profile("layernorm", 4095, BF16, held, 16)
    # 8 programs without a GPU (2 SMs), each over 8 rows: the one copy of the weights into shared memory is spread
    _, per_persistent, by_opcode = ptx_profile.profile("layernorm", 4095, BF16, persistent, 64)
    _, per_aligned, _ = ptx_profile.profile("layernorm", 4096, BF16, held, 16)
    assert per_aligned < per_persistent < per_held * 0.8, (per_aligned, per_persistent, per_held)
    # no weight widened from bf16 (a mask or a shift of its word) or bounds-tested per row: the row's elements'
    # widenings and tests are left
    widened, held_widened = (ops["and"] + ops["shl"] for ops in (by_opcode, held_opcodes))
    assert widened < held_widened * 0.6 and by_opcode["setp"] < held_opcodes["setp"] * 0.75


def test_rows_wider_than_2048_columns_also_go_four_a_program_one_a_warp():
    """Rows of 2049 to 4096 columns (one about 4096 elements a program) are also tried four a program, where each
    warp holds a row and no reduction crosses warps: tools/ptx_profile.py, bf16 layernorm over rows of 2304 issues
    about 17 PTX instructions an element one row a program (26 before its row statistics, which every thread
    holds, reached the narrower array without a relayout: ops/arrays.py `_held_element`; 19 before its two
    arrays' sums crossed the warps together: ops/reductions.py `_fuse_partials`, which halved its bar.syncs) and
    about 13 four a program (half of those bar.syncs again)."""
    for n, rows in ((2049, [1, 2, 4]), (2304, [1, 2, 4]), (4096, [1, 2, 4]), (2048, [2, 4, 1]), (1600, [2, 4, 1])):
        held = [c.kwargs["ROWS"] for c in _rows.candidates(n) if not c.kwargs["BLOCK"] and c.kwargs["WGS"] == 1
                and c.kwargs["PARTS"] == _rows.parts(n)]
        assert held == rows, n
    sys.path.insert(0, str(ROOT / "tools"))
    import ptx_profile
    one, four = (_rows.hold(rows, _rows.parts(2304)).replace(OCC=0, STAGED=0, PERSIST=0) for rows in (1, 4))
    _, per_one, ops_one = ptx_profile.profile("layernorm", 2304, BF16, one, 8)
    _, per_four, ops_four = ptx_profile.profile("layernorm", 2304, BF16, four, 8)
    assert per_four < per_one * 0.8 and ops_four["bar"] * 1.5 < ops_one["bar"], (per_one, per_four, ops_one["bar"])


def test_ptx_profile_counts_an_element_once_however_the_row_is_split():
    """tools/ptx_profile.py: a row of 8192 bf16 held by one warpgroup, by two warpgroups of a CTA or by a cluster
    of two CTAs costs about as many instructions an element (a split adds its exchange, not a factor of its
    CTAs: each simulator step is one instruction of one CTA's threads)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import ptx_profile
    per = [ptx_profile.profile("softmax", 8192, BF16, config, 2)[1]
           for config in (_rows.hold(1, (8192,)), _rows.hold(1, (4096,), 1, 2), _rows.hold(1, (4096,), 2, 1))]
    assert 7 < per[0] < per[1] < per[2] < per[0] * 1.4, per


@pytest.mark.parametrize("kernel,n", [("softmax", 127), ("rmsnorm", 255), ("layernorm", 511), ("cross_entropy", 127),
                                      ("cross_entropy", 255), ("cross_entropy", 511)])
def test_short_odd_rows_reduce_within_a_warp(kernel, n):
    """Rows whose length is odd are read in 4-byte accesses, 64 bf16 columns a warp: several rows of 128 to 1024
    columns a warpgroup put each row in one warp (its columns repeated in registers), not over two to eight warps,
    so that its reductions take shuffles only, no exchange through shared memory (cross-entropy's too: the mask of
    its targets takes the logits' layout, not they the mask's: 36.6 instructions an element at 255 and 511 before,
    21.3 and 17.5 after; and as cross-entropy stores no rows, a row takes as few lanes as one sector or two rows a
    thread allow: 127 29.2 -> 16.9, 255 21.3 -> 17.2; tools/ptx_profile.py, PTX
    simulator: no bar.sync a row, and about 24, 21 and 28 instructions an element where the exchange took 34, 26
    and 33; H200, kernel alone: softmax 127 0.51 -> 0.77, rmsnorm 255 0.69 -> 0.87, layernorm 511 0.69 -> 0.88).
    The simulated PTX's outputs (poisoned first, rows left over for the last program) match torch."""
    sys.path.insert(0, str(ROOT / "tools"))
    import ptx_profile
    config = ptx_profile.launch_of(kernel, torch.empty(1, n, dtype=BF16))[3][0]
    assert config.kwargs["ROWS"] >= 8 and config.kwargs["PARTS"] == (1 << (n - 1).bit_length(),)
    _, per_element, by_opcode = ptx_profile.profile(kernel, n, BF16, config, 64)
    budget = {"softmax": 26, "rmsnorm": 23, "layernorm": 30, "cross_entropy": 19}[kernel]
    assert per_element < budget and by_opcode["bar"] < 0.01, (per_element, by_opcode["bar"])
    x = (torch.randn(3 * config.kwargs["ROWS"] + 5, n) * 2).to(BF16)
    k, args, constexprs, _ = ptx_profile.launch_of(kernel, x)
    out, w = {"softmax": (args[1], None), "rmsnorm": (args[2], args[1]), "layernorm": (args[3], args[1]),
              "cross_entropy": (args[2], None)}[kernel]
    ref = (torch.softmax(x.float(), 1) if kernel == "softmax" else
           ce.reference(x, args[1]) if kernel == "cross_entropy" else
           torch.nn.functional.rms_norm(x.float(), (n,), w.float(), 1e-6) if kernel == "rmsnorm" else
           torch.nn.functional.layer_norm(x.float(), (n,), w.float(), args[2].float(), 1e-5))
    compiled = k.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
    out.fill_(float("nan"))
    dev = ptx_sim.Device()
    dev.run(compiled, _rows.grid(x.shape[0], config), *args)
    got = dev.fetch(out).float()
    assert not got.isnan().any() and (got - ref).abs().max() < 2e-2 * ref.abs().max()


@pytest.mark.parametrize("n,parts,rows", [(9, (8, 1), 128), (17, (16, 1), 128), (33, (32, 1), 128),
                                          (264, (256, 128), 8), (1032, (1024, 128), 2)])
def test_a_rows_narrower_part_meets_the_other_without_relayouts(n, parts, rows):
    """Rows held as two arrays: the second's row statistics (a reduction over its columns) are placed where the
    first array's are (ops/reductions.py Reduce.free_with_operand), so that every example combines them, and
    broadcasts them back, with no relayout (each a round trip through shared memory and a barrier). One column
    wide, nothing moves; wider, its load takes a layout that reduces there (`layouts.blocked_reducing_to`): aligned
    bf16 rows of 264 as 256 + 128, 8 a program, had 4 relayouts in softmax, one of a whole (8, 128) float32 array,
    and issued 20.3 PTX instructions an element, 17.4 without (tools/ptx_profile.py). (A part of 8 columns, 1030 as
    1024 + 8, has no layout of 4 rows reducing where a row of 1024 does: its statistics still meet through shared
    memory.) A splat given a tiled layout (layernorm's zero centre, yielded beside a row's mean) moves nothing."""
    x = torch.empty(256, n, dtype=BF16)
    config = _rows.hold(rows, parts)
    for kernel, args, constexprs, _ in kernels(x, BF16):
        compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
        splats = set(re.findall(r"(%\d+) = splat\(", compiled.ir))
        relayouts = [line for line in compiled.ir.splitlines()
                     if "= relayout(" in line and re.search(r"relayout\((%\d+)\)", line)[1] not in splats]
        assert not relayouts, (kernel.name, relayouts)


@pytest.mark.parametrize("n,parts,masked", [(17, (16, 1), False), (19, (16, 4), True)])
def test_layernorm_masks_its_padding_only_where_there_is_some(n, parts, masked):
    """Layernorm's deviations from the mean are masked past the row's end (a select an element) only where its
    arrays hold more columns than the row: rows of 17 held as 16 + 1 take none, rows of 19 as 16 + 4 do. Counted
    on the PTX simulator, the results checked against torch."""
    x = (torch.randn(64, n) * 3).to(BF16)
    kernel, args, constexprs, checks = kernels(x, BF16)[2]
    config = _rows.hold(64, parts)
    compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
    dev = ptx_sim.Device()
    dev.counts = collections.Counter()
    dev.run(compiled, _rows.grid(x.shape[0], config), *args)
    for got, ref, tol in checks:
        assert rel_err(dev.fetch(got), ref) < max(tol, TOL[BF16])
    assert (dev.counts.get("selp.f32", 0) > 0) == masked, dev.counts.get("selp.f32", 0)


@pytest.mark.parametrize("n,rows", [(1600, 4), (1600, 2), (800, 4), (3000, 1), (1100, 8), (700, 8), (2100, 2)])
def test_rows_of_several_arrays_broadcast_their_statistics_without_moving_arrays(n, rows):
    """Rows held as arrays of several widths (1600 as 1024 + 512 + 128): where the widest one's rows span every
    warp, its row statistics reach every thread, and a narrower array that holds a row a warp takes them by each
    thread picking its row's (ops/arrays.py, `_held_element`), not by a relayout of the whole (rows, 512) float32
    array through shared memory (layernorm over 4 rows of 1600: 8 relayouts, two of (4, 512), 158 registers; now 4
    of row vectors, 113); the stored rows' narrowest array is read a row a warp (ops/gmem.py `_narrow_rows_layout`;
    cross-entropy's rows, only reduced, keep their copies). Layernorm masks its padding in the last array alone.
    Every example on the PTX simulator, against torch, on more rows than a program holds."""
    x = (torch.randn(2 * rows + 1, n) * 3).to(BF16)
    config = _rows.hold(rows, _rows.parts(n))
    for kernel, args, constexprs, checks in kernels(x, BF16):
        compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
        moved = [line for line in compiled.ir.splitlines() if "= relayout(" in line and f"[{rows}," in line]
        assert not moved or kernel is ce.cross_entropy_rows, (kernel.name, moved)  # rows only reduced: ops/gmem.py
        dev = ptx_sim.Device()
        dev.counts = collections.Counter()
        dev.run(compiled, _rows.grid(x.shape[0], config), *args)
        for got, ref, tol in checks:
            assert rel_err(dev.fetch(got), ref) < max(tol, TOL[BF16]), (kernel.name, config)
        if kernel is ln.layernorm_rows:  # a select an element of the last array, none of the first
            programs = _rows.grid(x.shape[0], config)[0]
            assert dev.counts.get("selp.f32", 0) / programs < rows * config.kwargs["PARTS"][0] / 128, dev.counts


@pytest.mark.parametrize("n,rows", [(1000, 4), (4095, 1), (5000, 1)])
def test_layernorm_one_pass_falls_back_where_a_mean_lies_far_from_zero(n, rows):
    """Held layernorm rows of ONE_PASS_WIDTH columns or more take their statistics in one pass (the sums of x and
    x^2) where every row's mean lies within 4 standard deviations of 0. Float32 rows of mean 1000 and standard
    deviation 1 would lose their variance to cancellation there (sum(x^2) = 1e6 n rounds by about 0.06 n, against
    a variance sum of n): the program takes their deviations from registers instead. Rows of either kind in one
    program (4 rows of 1000) and in programs of their own, from the sm_90a PTX on the simulator and interpreted,
    against torch in float64: within 2e-4 (a float32 mean of 1000 is itself 3e-5 off, its deviations with it: the
    two-pass statistics missed by 4e-5 here), where the one pass alone missed by 0.03 to 0.05."""
    x = torch.randn(2 * rows, n)
    x[::2] += 1000.0
    w, b = torch.randn(n), torch.randn(n)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    config = _rows.hold(rows, _rows.parts(n))
    assert sum(config.kwargs["PARTS"]) >= ln.ONE_PASS_WIDTH
    for got in held_layernorm(x, w, b, config):
        assert rel_err(got, ref) < 2e-4


def test_layernorm_one_pass_keeps_rows_whose_squares_overflow():
    """Rows near 3e18 (float32 squares past 3.4e38, so sum(x^2) and n mean^2 are inf and the one-pass test NaN) with
    deviations of 1e17: the held rows take their deviations from registers (finite), as torch's statistics are;
    from the sm_90a PTX on the simulator and interpreted."""
    n, rows = 1024, 2
    x = 3e18 + torch.randn(rows, n) * 1e17
    w, b = torch.randn(n), torch.randn(n)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    for got in held_layernorm(x, w, b, _rows.hold(1, _rows.parts(n))):
        assert rel_err(got, ref) < 2e-4


def held_layernorm(x, w, b, config) -> tuple[torch.Tensor, torch.Tensor]:
    """Layernorm of x under a held mapping: (from its sm_90a PTX on the simulator, interpreted)."""
    grid = _rows.grid(x.shape[0], config)
    got, interpreted = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    compiled = ln.layernorm_rows.compile(x, w, b, got, x, got, x, x, eps=1e-5, **config.launch_kwargs(),
                                         target="sm_90a")
    dev = ptx_sim.Device()
    for t in (x, w, b, got):
        dev.place(t)
    dev.run(compiled, grid, x, w, b, got, x, got, x, x)
    ln.layernorm_rows.interpret[grid](x, w, b, interpreted, x, interpreted, x, x, eps=1e-5, **config.launch_kwargs())
    return dev.fetch(got), interpreted

"""Piped rows (examples/_rows_piped.py) without a GPU: every piped mapping of softmax and cross-entropy interpreted
over more rows than the programs' rings hold (a grid of 2 SMs), rows starting anywhere in a line of the flattened
tensor and a last partial line; which mappings are offered, for which tensors; registers at sm_90a."""
import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import _device  # noqa: E402
import _rows  # noqa: E402
import _rows_piped as piped  # noqa: E402
import cross_entropy as ce  # noqa: E402
import layernorm as ln  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402

import mgjit  # noqa: E402

BF16 = torch.bfloat16


def ce_options(config) -> dict:
    """A softmax mapping's launch options for cross_entropy_rows, which takes no flat mappings (FLAT left out)."""
    return {k: v for k, v in config.launch_kwargs().items() if k != "FLAT"}


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
        target = torch.randint(0, n, (rows,))
        target[::4] = -100
        loss, lse = torch.full((rows,), float("nan")), torch.full((rows,), float("nan"))
        ce.cross_entropy_rows.interpret[(programs,)](x, target, loss, lse, -100, piped.lines(x), loss, loss,
                                                     **ce_options(config))
        xd = x.double()
        assert rel_err(lse, torch.logsumexp(xd, 1)) < 1e-6, config
        ref = torch.nn.functional.cross_entropy(xd, target, reduction="none", ignore_index=-100)
        assert rel_err(loss, ref) < 1e-5, config


@pytest.mark.parametrize("n,dtype", [(4097, BF16), (5000, torch.float32)], ids=str)
def test_every_piped_rmsnorm_interpreted(n, dtype):
    """rmsnorm's piped grids are a multiple of stash_multiple programs (the weights stashed once per program, laid
    out as the envelope of a row starting within 16 bytes of a line, and read per row through a window: 8 programs
    for bf16 rows of odd length, whose rows then start a multiple of 8 elements apart; 1 for float32 rows of 5000,
    which start on 16 bytes): a program's rows start at 3 or 4 places in their envelopes (4097 * 8 = 8 elements
    past whole lines, 5000 * 3 = 152), each read through its own window."""
    itemsize = torch.finfo(dtype).bits // 8
    configs = [c for c in rms.rmsnorm_mapping(n, None, itemsize, (itemsize,)) if c.kwargs["PIPE"]]
    assert configs and all(c.kwargs["STASH"] == {4097: 8, 5000: 1}[n] for c in configs)
    programs = {4097: 8, 5000: 3}[n]
    rows = 3 * programs + 2
    x = (torch.randn(rows, n) + 0.3).to(dtype)
    w = torch.randn(n).to(dtype)
    ref = torch.nn.functional.rms_norm(x.double(), (n,), w.double(), 1e-6)
    for config in configs[:2]:
        assert _rows.grid(rows, config)[0] % config.kwargs["STASH"] == 0
        out = torch.full_like(x, float("nan"))
        rms.rmsnorm_kernel.interpret[(programs,)](x, w, out, piped.lines(x), piped.lines(out), piped.weight_rows(w),
                                                  eps=1e-6, **config.launch_kwargs())
        assert rel_err(out, ref) < {torch.float32: 1e-6}.get(dtype, 5e-3), config


@pytest.mark.parametrize("n,dtype,mean", [(4097, BF16, 0.3), (5000, torch.float32, 40.0), (6001, torch.float16, -7.0)],
                         ids=str)
def test_every_piped_layernorm_interpreted(n, dtype, mean):
    """layernorm's piped mappings: weights and biases stashed per program (as rmsnorm's), each row's deviations
    taken from the mean rounded to x's dtype, written over the envelope's columns outside the row, so that they
    are exactly 0 there. Rows whose mean is far from 0 (40 standard deviations) check that the fill leaves
    nothing in the variance: with zeros there, 768 of them would add 768 * 40**2 to a sum of squares of 5000.
    Each program's rows take the fill from their predecessor's mean and are read once, or, where their own mean
    lies 60 standard deviations away from it (a program's third row here, and its first where the mean is far
    from 0), read again with their own. Each program's rows start at three places in their envelopes."""
    itemsize = torch.finfo(dtype).bits // 8
    configs = [c for c in ln.layernorm_mapping(n, None, itemsize, (itemsize, itemsize)) if c.kwargs["PIPE"]]
    assert configs and all(c.kwargs["STASH"] == piped.stash_multiple(n, itemsize) for c in configs)
    programs = 8
    rows = 3 * programs + 3
    jump = 60.0 * (torch.arange(rows) >= 2 * programs)[:, None]
    x = (torch.randn(rows, n) + mean + jump).to(dtype)
    w, b = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
    ref = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    for config in configs[:2]:
        out = torch.full_like(x, float("nan"))
        ln.layernorm_rows.interpret[(programs,)](x, w, b, out, piped.lines(x), piped.lines(out),
                                                 piped.weight_rows(w), piped.weight_rows(b), eps=1e-5,
                                                 **config.launch_kwargs())
        # float32 at a mean of 40: torch's own layer_norm is 1.5e-6 off, the held mapping 1.75e-6
        assert rel_err(out, ref) < {torch.float32: 4e-6}.get(dtype, 5e-3), config


def test_a_piped_mapping_refuses_other_rows():
    """A piped mapping holds its rows' lines (PL) as made for one row length: on rows of another, its one store of
    lines 1 to NL - 3 would write into the neighbouring rows, so the kernel stops (mgjit.device_assert: the
    interpreter raises, the GPU traps). Stashed weights refuse a grid whose programs' rows start at different
    columns of their envelopes."""
    from mgjit.errors import Check, InterpretError
    config = [c for c in sm.mapping(8193, None, 4) if c.kwargs["PIPE"]][0]
    for n in (8193 - 449, 8193 + 256):  # rows needing 32 and 34 lines, not 33
        x = torch.randn(4, n)
        with pytest.raises(InterpretError, match="rows of another length") as info:
            sm.softmax_kernel.interpret[(2,)](x, x, piped.lines(x), piped.lines(x), **config.launch_kwargs())
        assert info.value.check == Check.DEVICE_ASSERT
    x = torch.randn(4, 8001)  # 33 lines, as 8193: the same mapping holds
    out = torch.full_like(x, float("nan"))
    sm.softmax_kernel.interpret[(2,)](x, out, piped.lines(x), piped.lines(out), **config.launch_kwargs())
    assert rel_err(out, torch.softmax(x.double(), 1)) < 1e-6
    n = 5001
    config = [c for c in rms.rmsnorm_mapping(n, None, 2, (2,)) if c.kwargs["PIPE"]][0]
    x, w = torch.randn(9, n, dtype=BF16), torch.randn(n, dtype=BF16)
    with pytest.raises(InterpretError, match="multiple of _rows_piped.stash_multiple programs"):
        rms.rmsnorm_kernel.interpret[(4,)](x, w, x, piped.lines(x), piped.lines(x), piped.weight_rows(w), eps=1e-6,
                                           **config.launch_kwargs())


@pytest.mark.parametrize("n,rows", [(8193, 1), (4352, 2)])
def test_fewer_rows_than_slots(n, rows):
    """A program with fewer rows than slots (the prologue copies only those), and a tensor of whole lines (the last
    envelope reaches past the end: nothing to patch, zeros filled)."""
    x = torch.randn(rows, n) * 3
    config = [c for c in sm.mapping(n, None, 4) if c.kwargs["PIPE"] and c.kwargs["STAGES"] >= 3][0]
    out = torch.full_like(x, float("nan"))
    sm.softmax_kernel.interpret[(1,)](x, out, piped.lines(x), piped.lines(out), **config.launch_kwargs())
    assert rel_err(out, torch.softmax(x.double(), 1)) < 1e-6


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


def test_piped_cross_entropy_through_the_wrapper(monkeypatch):
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    n = 5003
    first = [c for c in ce.mapping(n, 2) if c.kwargs["PIPE"]][0]
    monkeypatch.setattr(ce, "mapping", lambda *args: (first,))
    logits = (torch.randn(9, n) * 4).to(BF16)
    target = torch.randint(0, n, (9,))
    loss, lse = ce.cross_entropy(logits, target)
    assert rel_err(lse, torch.logsumexp(logits.double(), 1)) < 1e-6
    assert rel_err(loss, torch.nn.functional.cross_entropy(logits.double(), target, reduction="none")) < 1e-5


@pytest.mark.parametrize("n", [1, 100, 511, 512, 5003])
def test_piped_norms_through_the_wrappers(monkeypatch, n):
    """The norm wrappers on tensors piped mappings may take, with any row length: from 4097 columns the tuner's
    pick (here forced to a piped one) gets w and b as `weight_rows`; below, the held mappings run, and the views
    the wrapper builds for piped ones must still be made (a weight of one element once failed to)."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    if n > 4096:
        rms_first = [c for c in rms.rmsnorm_mapping(n, None, 4, (4,)) if c.kwargs["PIPE"]][0]
        ln_first = [c for c in ln.layernorm_mapping(n, None, 4, (4, 4)) if c.kwargs["PIPE"]][0]
        monkeypatch.setattr(rms, "rmsnorm_mapping", lambda *args: (rms_first,))
        monkeypatch.setattr(ln, "layernorm_mapping", lambda *args: (ln_first,))
    x = torch.randn(5, n) + 2
    w, b = torch.randn(n), torch.randn(n)
    xd = x.double()
    assert rel_err(rms.rmsnorm(x, w), torch.nn.functional.rms_norm(xd, (n,), w.double(), 1e-6)) < 1e-6
    ref = torch.nn.functional.layer_norm(xd, (n,), w.double(), b.double(), 1e-5)
    assert rel_err(ln.layernorm(x, w, b), ref) < 4e-6


@pytest.mark.parametrize("n", [100, 5003])
def test_norms_with_float32_weights_of_bf16_rows(monkeypatch, n):
    """Models keep norm weights in float32 and activations in bf16: the wrappers take them, held or piped (the
    piped mapping, forced here, stashes the float32 weights and reads them through windows on 16 bytes of
    float32, a grid of stash_multiple(n, 4) programs), interpreted against torch in float64."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    if n > 4096:
        rms_first = [c for c in rms.rmsnorm_mapping(n, None, 2, (4,)) if c.kwargs["PIPE"]][0]
        ln_first = [c for c in ln.layernorm_mapping(n, None, 2, (4, 4)) if c.kwargs["PIPE"]][0]
        assert rms_first.kwargs["STASH"] == ln_first.kwargs["STASH"] == piped.stash_multiple(n, 4) == 4
        monkeypatch.setattr(rms, "rmsnorm_mapping", lambda *args: (rms_first,))
        monkeypatch.setattr(ln, "layernorm_mapping", lambda *args: (ln_first,))
    x = (torch.randn(9, n) + 2).to(BF16)
    w, b = torch.randn(n), torch.randn(n)
    xd = x.double()
    got = rms.rmsnorm(x, w)
    assert got.dtype == BF16 and rel_err(got, torch.nn.functional.rms_norm(xd, (n,), w.double(), 1e-6)) < 5e-3
    got = ln.layernorm(x, w, b)
    ref = torch.nn.functional.layer_norm(xd, (n,), w.double(), b.double(), 1e-5)
    assert got.dtype == BF16 and rel_err(got, ref) < 5e-3


@pytest.mark.parametrize("kernel", ["rmsnorm", "layernorm"])
def test_float32_weights_are_read_without_bank_conflicts(kernel):
    """Float32 weights scale bf16 rows read from shared memory: the rows are read 8 bytes a lane so that the weights
    are read 16 bytes a lane, not 32 (two-way conflicts: layernorm over rows of 5003 ran 0.69 of copy bandwidth
    for 0.83 without them on an H200). No BankConflictWarning, no conflict noted in the IR (sm_90a)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
    import ptx_profile
    n = 5003
    k, args, constexprs, configs = ptx_profile.launch_of(kernel, torch.randn(4, n).to(BF16), torch.float32)
    config = next(c for c in configs if c.kwargs["PIPE"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", mgjit.BankConflictWarning)
        c = k.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
    assert "bank_conflict" not in c.ir and "float32[" in c.ir


def test_weight_rows():
    """Rows of 2 * LINE elements LINE apart, over the vector's own storage; a short vector as one row."""
    w = torch.arange(5003.0)
    rows = piped.weight_rows(w)
    assert rows.shape == ((5003 - 512) // 256 + 1, 512) and rows.data_ptr() == w.data_ptr()
    assert rows[3, 0] == 3 * 256 and rows[-1, -1] == (rows.shape[0] + 1) * 256 - 1 <= 5002
    assert piped.weight_rows(w[:100]).shape == (1, 100)


def test_lines():
    """A contiguous tensor as whole lines of LINE elements over its own storage (from its storage offset), the
    last partial line left out; anything else refused."""
    x = torch.randn(10, 700)
    for t in (x, x[3:6], x[:0]):
        got = piped.lines(t)
        whole = t.numel() // 256 * 256
        assert got.shape == (whole // 256, 256) and torch.equal(got.reshape(-1), t.reshape(-1)[:whole])
        assert got.data_ptr() == t.data_ptr()
    with pytest.raises(ValueError, match="contiguous"):
        piped.lines(x[:, 1:])


def test_which_rows_are_piped():
    """Piped mappings are offered from 4097 columns to the 65 lines one warpgroup holds (16385), where their
    slots fit shared memory, and every config of the kernel sets the same constexprs; softmax's rows that one CTA
    does not hold over a cluster (`test_rows_piped_over_a_cluster`), cross-entropy's as segments
    (`test_cross_entropy_segments_interpreted`)."""
    for n, itemsize, expect in ((4096, 2, 0), (4097, 2, 4), (16385, 2, 3), (8193, 4, 3), (16385, 4, 0)):
        configs = sm.mapping(n, None, itemsize)
        assert len({tuple(sorted(c.kwargs)) for c in configs}) == 1, n
        got = [c for c in configs if c.kwargs["PIPE"] and c.kwargs["CTAS"] == 1]
        assert [{**ce_options(c), "SEGS": 0, "OCC": 0, "EARLY": 0, "LSE": 1} for c in got] == [
            c.kwargs for c in ce.mapping(n, itemsize) if c.kwargs["PIPE"] and not c.kwargs["SEGS"]], n
        assert len(got) == expect, (n, itemsize, got)
        for c in got:
            nl = sum(c.kwargs["PL"])
            assert nl == piped.line_count(n) == c.kwargs["LAST"]
            assert (nl - 1) * piped.LINE < n + piped.LINE - 1 <= nl * piped.LINE
            assert c.kwargs["PIPE"] * c.kwargs["STAGES"] * nl * piped.LINE * itemsize <= 227 * 1024
    for n in (16386, 50257, 100000):
        assert not any(c.kwargs["PIPE"] and c.kwargs["CTAS"] > 1 for c in ce.mapping(n, 2)), n
    assert not any(c.kwargs["PIPE"] for c in sm.mapping(8193, None, 0))
    assert not any(c.kwargs["PIPE"] for c in sm.mapping(8193, 4, 2))


@pytest.mark.parametrize("itemsize", [2, 4])
def test_rows_piped_over_a_cluster(itemsize):
    """Softmax rows longer than one CTA holds, split by whole lines over a cluster of at most 8 CTAs, or of 16 (one
    register array a CTA, or else up to three at WIDE_CLUSTER_SHAPES, or else up to four at WIDER_CLUSTER_SHAPES)
    where 8 do not hold them: each CTA's
    segment fits its registers and its slots the shared memory at its programs an SM, the last segment is shorter
    by less than a tenth of the cluster's lines and holds at least 4, and together the segments are the row's
    envelope. None past 16 CTAs of 65 lines."""
    offered = {}
    for n in range(16387, 280000, 2999):
        nl = piped.line_count(n)
        configs = [c for c in sm.mapping(n, None, itemsize) if c.kwargs["PIPE"]]
        assert len({tuple(sorted(c.kwargs)) for c in sm.mapping(n, None, itemsize)}) == 1, n
        for c in configs:
            kw, ctas = c.kwargs, c.kwargs["CTAS"]
            k = sum(kw["PL"])
            assert (2 <= ctas <= 8 or ctas == 16) and c.launch_kwargs()["cluster"] == (ctas, 1, 1), c
            assert (ctas - 1) * k + kw["LAST"] == nl and 4 <= kw["LAST"] <= k and 10 * nl >= 9 * ctas * k, (n, c)
            assert len(kw["PL"]) <= 3 + (ctas > 8) and k <= piped.REGISTER_LINES[kw["PIPE"]], (n, c)
            shape, wide = (kw["STAGES"], kw["PIPE"]), piped.WIDE_CLUSTER_SHAPES
            assert ctas <= 8 or len(kw["PL"]) == 1 or shape in wide + piped.WIDER_CLUSTER_SHAPES, (n, c)
            assert len(kw["PL"]) < 4 or shape in piped.WIDER_CLUSTER_SHAPES, (n, c)
            assert ctas <= 8 or shape not in piped.WIDER_CLUSTER_SHAPES or len(kw["PL"]) == 1 or not any(
                (o.kwargs["STAGES"], o.kwargs["PIPE"]) in wide for o in configs), (n, c)  # where three hold none
            assert ctas <= 8 or all(other.kwargs["CTAS"] > 8 for other in configs), (n, c)  # none portable
            assert kw["PIPE"] * (kw["STAGES"] * k * piped.LINE * itemsize + piped.SLACK) <= 232448, (n, c)
        offered[n] = len(configs)
    assert all(offered[n] for n in offered if n <= 70000) and not offered[277300], offered
    # every length up to 16 CTAs of 64 lines (bf16), or up to where f32 slots fill the shared memory
    assert all(offered[n] for n in offered if n <= {2: 262144, 4: 220000}[itemsize]), offered
    if itemsize == 2:  # 128256: 501 lines over 8 CTAs of 64, not 63 (six arrays); 262144 over 16 of 64
        assert [(c.kwargs["CTAS"], c.kwargs["PL"], c.kwargs["LAST"]) for c in sm.mapping(128256, None, 2)
                if c.kwargs["PIPE"]] == [(8, (64,), 53)]
        assert [(c.kwargs["CTAS"], c.kwargs["PL"], c.kwargs["STAGES"]) for c in sm.mapping(262144, None, 2)
                if c.kwargs["PIPE"]] == [(16, (64,), 3)]
        assert [(c.kwargs["CTAS"], c.kwargs["PL"], c.kwargs["STAGES"], c.kwargs["PIPE"])
                for c in sm.mapping(150000, None, 2) if c.kwargs["PIPE"]] == [(16, (32, 4, 1), 3, 3),
                                                                        (16, (32, 4, 1), 2, 3)]


@pytest.mark.parametrize("n,dtype", [(16386, torch.float32), (20000, torch.float16), (50257, BF16),
                                     (65536, torch.float32)], ids=str)
def test_every_cluster_piped_mapping_interpreted(n, dtype):
    """Each CTA of a cluster pipes its segment of each of its cluster's rows and the segments swap (maximum,
    sum) once a row: over more rows than the rings hold (one cluster without a GPU), rows starting anywhere in
    a line, the last line partial where the rows' length allows."""
    configs = [c for c in sm.mapping(n, None, torch.finfo(dtype).bits // 8) if c.kwargs["PIPE"]]
    assert configs and all(c.kwargs["CTAS"] > 1 for c in configs)
    for config in configs:
        ctas, clusters = config.kwargs["CTAS"], max(1, 2 * config.kwargs["PIPE"] // config.kwargs["CTAS"])
        rows = clusters * (config.kwargs["STAGES"] + 1) + 1
        assert _rows.grid(rows, config) == (clusters * ctas,)
        x = (torch.randn(rows, n) * 3).to(dtype)
        assert (rows * n) % piped.LINE or n % piped.LINE == 0
        out = torch.full_like(x, float("nan"))
        sm.softmax_kernel.interpret[(clusters * ctas,)](x, out, piped.lines(x), piped.lines(out),
                                                         **config.launch_kwargs())
        assert rel_err(out, torch.softmax(x.double(), 1)) < {torch.float32: 1e-6}.get(dtype, 5e-3), config


def test_norms_over_16_ctas():
    """Rows no portable cluster holds, with stashed weights: layernorm's 262144 columns (16 CTAs of 64 lines, w and
    b 64 KB a CTA) leave room for one program an SM of three or four slots (LONE_CLUSTER_SHAPES), rmsnorm's one
    weight also for two of two; rows of 150000 (16 CTAs of 37 lines, three arrays): rmsnorm two slots and three
    programs (WIDE_CLUSTER_SHAPES), layernorm two programs of three or two slots (WIDER_CLUSTER_SHAPES) and one
    program an SM over the 16 CTAs and, as no portable cluster holds a split of two programs an SM, over 8 CTAs of 80
    lines (74 with four slots, which 80 do not fit); rows of 200000 and 230000 (16 CTAs of 49 and 57 lines, which
    three programs an SM do not hold), two programs and one. Each fits an SM's shared memory and its registers."""
    def shapes(configs, stash, itemsize=2):
        piped_configs = [c.kwargs for c in configs if c.kwargs["PIPE"]]
        for kw in piped_configs:
            k = sum(kw["PL"])
            slots = kw["STAGES"] * itemsize
            assert kw["PIPE"] * (((slots + stash) * k + stash) * piped.LINE + piped.SLACK) <= 232448, kw
            assert k <= piped.REGISTER_LINES[kw["PIPE"]], kw
        return [(kw["CTAS"], kw["PL"], kw["STAGES"], kw["PIPE"]) for kw in piped_configs]
    assert shapes(ln.layernorm_mapping(262144, None, 2, (2, 2)), 4) == [(16, (64,), 3, 1), (16, (64,), 4, 1)]
    assert shapes(rms.rmsnorm_mapping(262144, None, 2, (2,)), 2) == [(16, (64,), 2, 2), (16, (64,), 3, 1),
                                                                     (16, (64,), 4, 1)]
    assert shapes(ln.layernorm_mapping(150000, None, 2, (2, 2)), 4) == [
        (16, (32, 4, 1), 3, 2), (16, (32, 4, 1), 2, 2), (16, (32, 4, 1), 3, 1), (16, (32, 4, 1), 4, 1),
        (8, (64, 16), 3, 1), (8, (64, 8, 2), 4, 1)]
    assert shapes(rms.rmsnorm_mapping(150000, None, 2, (2,)), 2) == [(16, (32, 4, 1), 2, 3), (8, (64, 16), 3, 1),
                                                                     (8, (64, 16), 4, 1)]
    lone = [(16, (32, 16, 1), 3, 1), (16, (32, 16, 1), 4, 1)]
    assert shapes(ln.layernorm_mapping(200000, None, 2, (2, 2)), 4) == [(16, (32, 16, 1), 2, 2)] + lone
    assert shapes(rms.rmsnorm_mapping(200000, None, 2, (2,)), 2) == [(16, (32, 16, 1), 3, 2),
                                                                     (16, (32, 16, 1), 2, 2)] + lone
    lone = [(16, (32, 16, 8, 1), 3, 1), (16, (32, 16, 8, 1), 4, 1)]
    assert shapes(ln.layernorm_mapping(230000, None, 2, (2, 2)), 4) == lone
    assert shapes(rms.rmsnorm_mapping(230000, None, 2, (2,)), 2) == [(16, (32, 16, 8, 1), 2, 2)] + lone
    # float32 rows and weights of 150000: no split of two programs an SM fits, so one program over 16 CTAs of 37
    assert shapes(ln.layernorm_mapping(150000, None, 4, (4, 4)), 8, 4) == [(16, (32, 4, 1), 3, 1)]
    assert shapes(rms.rmsnorm_mapping(150000, None, 4, (4,)), 4, 4) == [(16, (32, 4, 1), 3, 1), (16, (32, 4, 1), 4, 1)]
    assert not any(c.kwargs["PIPE"] == 1 for c in sm.mapping(150000, None, 2))  # no weights: no lone programs


def test_pipeable_tensors():
    x = torch.randn(6, 5000)
    assert piped.pipeable(x, torch.empty_like(x))
    assert not piped.pipeable(x[:, 1:])  # rows 4999 apart in a 5000-wide tensor
    assert not piped.pipeable(torch.randn(30001)[1:].view(6, 5000))  # starts 4 bytes in
    lines = piped.lines(x)
    assert lines.shape == (30000 // piped.LINE, piped.LINE) and lines.data_ptr() == x.data_ptr()


def test_piped_views():
    """What the wrappers launch beside their arguments: the row tensors as lines and the weights as overlapping
    rows where piped mappings may run, else x in their places and no element size to offer piped mappings for."""
    x, out, w = torch.randn(6, 5000).to(BF16), torch.empty(6, 5000, dtype=BF16), torch.randn(5000)
    itemsize, views = piped.piped_views((x, out), (w, w))
    assert itemsize == 2 and [v.shape for v in views] == [(117, 256), (117, 256), (18, 512), (18, 512)]
    assert [v.data_ptr() for v in views] == [x.data_ptr(), out.data_ptr(), w.data_ptr(), w.data_ptr()]
    for itemsize, views in (piped.piped_views((x, out), (w,), rows_per_program=2),
                            piped.piped_views((x, out), (torch.randn(2, 5000)[:, 0],)),
                            piped.piped_views((x[:, 1:], out[:, 1:]), (w,))):
        assert itemsize == 0 and views[-1] is views[0] and len(views) == 3


def test_one_copy_one_store_and_one_fence_a_row():
    """The PTX of piped softmax: a row comes in as one TMA copy (STAGES in the prologue, one in the loop) and goes
    out as one TMA store, behind one async-proxy fence (in 256-element boxes of a 1D view, a row of 8193 took 63
    TMA instructions, each about 70 cycles of its thread; and each store had its own fence and bar.sync)."""
    x = torch.empty(64, 8193, dtype=BF16)
    for config in sm.mapping(8193, None, 2):
        if config.kwargs["PIPE"]:
            ptx = sm.softmax_kernel.compile(x, x, piped.lines(x), piped.lines(x), **config.launch_kwargs(),
                                            target="sm_90a").ptx
            assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global") == config.kwargs["STAGES"] + 1
            assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == 1
            assert ptx.count("fence.proxy.async") == 1 and ptx.count("mbarrier.try_wait") == 1


def test_two_slots_are_refilled_as_their_row_begins():
    """A ring of two slots refills the slot of the row before as a row begins, before its reductions (`refill`:
    refilled after the row, no copy would be in flight while it is computed); a ring of three after the row's
    results, just before its store. The loop's copy is the PTX's last; the prologue's come before any shuffle."""
    x = torch.empty(64, 8193, dtype=BF16)
    copy, store = "cp.async.bulk.tensor.2d.shared::cluster.global", "cp.async.bulk.tensor.2d.global.shared::cta"
    for config in sm.mapping(8193, None, 2):
        if config.kwargs["PIPE"]:
            ptx = sm.softmax_kernel.compile(x, x, piped.lines(x), piped.lines(x), **config.launch_kwargs(),
                                            target="sm_90a").ptx
            refill, reduce, out = ptx.rindex(copy), ptx.index("shfl.sync"), ptx.rindex(store)
            assert (refill < reduce < out) if config.kwargs["STAGES"] == 2 else (reduce < refill < out), config


def test_piped_layernorm_fills_move_no_data():
    """The fill of a row's head, `where(arange(256)[None, :] < s, fill, line)`, is computed in the layout the line
    is loaded in: no relayout (an SMEM round trip and two warpgroup barriers a row) in piped layernorm, whose
    inference first placed the mask's iota for a default layout and later needed it in the line's. The fill and
    the stores of a row's first and last lines spread the line over all 128 threads (`layouts.spread`): each
    thread updates its own elements, so the update needs no barrier between its read and its write. And a CTA
    barrier meets the warpgroup: the read after it has no bar.sync of its own (30 bar.sync before the three). The
    reads of a row's last lines after its first line's fill, and of the stashed weights after the row's results
    went into its slot, meet nothing (other lines, another buffer), nor does the wait for the TMA stores before a
    slot's refill, which one thread issues (21 bar.sync before)."""
    x, w = torch.empty(64, 8193, dtype=BF16), torch.empty(8193, dtype=BF16)
    config = next(c for c in ln.layernorm_mapping(8193, None, 2, (2, 2)) if c.kwargs["PIPE"])
    c = ln.layernorm_rows.compile(x, w, w, x, piped.lines(x), piped.lines(x), piped.weight_rows(w),
                                  piped.weight_rows(w), eps=1e-5, **config.launch_kwargs(), target="sm_90a")
    assert "relayout(" not in str(c.ir)
    assert c.ptx.count("bar.sync") == 16


def test_norms_over_a_cluster_where_one_cta_has_two_slots():
    """Rows that one CTA holds with only two slots at two programs an SM or more (rmsnorm from 55 lines, layernorm
    from 49) are offered over a cluster too; rows one CTA holds with three slots at two programs are not, nor are
    softmax's (three slots fit to 65 lines)."""
    def split(configs):
        return sorted({c.kwargs["CTAS"] for c in configs if c.kwargs["PIPE"]})
    assert split(rms.rmsnorm_mapping(16385, None, 2, (2,))) == [1, 2, 4]
    assert split(rms.rmsnorm_mapping(14000, None, 2, (2,))) == [1, 3]
    assert split(rms.rmsnorm_mapping(13000, None, 2, (2,))) == [1]
    assert split(ln.layernorm_mapping(12289, None, 2, (2, 2))) == [1, 3]
    assert split(ln.layernorm_mapping(8193, None, 2, (2, 2))) == [1]
    assert split(sm.mapping(16385, None, 2)) == [1]


@pytest.mark.parametrize("n", [8193, 12289, 16385])
def test_piped_softmax_compiles_without_spills(n):
    x = torch.empty(64, n, dtype=BF16)
    for config in sm.mapping(n, None, 2):
        if config.kwargs["PIPE"] and config.kwargs["PIPE"] <= 2:
            c = sm.softmax_kernel.compile(x, x, piped.lines(x), piped.lines(x), **config.launch_kwargs(),
                                          target="sm_90a")
            assert c.spills == 0, (n, config)


@pytest.mark.parametrize("draw", range(4))
def test_piped_rows_fuzzed(monkeypatch, draw):
    """Each piped kernel, interpreted under one of its piped mappings drawn at random for a row length (one draw in
    two past 16385: over a cluster, or cross-entropy's segments), dtype and row count drawn at random (fresh every
    run; the seed is in the failure message), on the grid its wrapper launches: rows start anywhere in their
    lines, and how the last lines fall is whatever the draw makes it."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    seed = int(torch.randint(0, 2**31, ()))
    gen = torch.Generator().manual_seed(seed)
    pick = lambda k: int(torch.randint(0, k, (), generator=gen))  # noqa: E731
    long = pick(2)
    n = 16386 + pick(140000 - 16386) if long else 4097 + pick(16385 - 4097 + 1)
    rows = 9 + pick(24) if long else piped.LINE + 1 + pick(40)
    dtype = (torch.float32, BF16, torch.float16)[pick(3)]
    itemsize = torch.finfo(dtype).bits // 8
    tol = {torch.float32: 4e-6}.get(dtype, 5e-3)
    what = f"seed {seed}: n {n}, {rows} rows, {dtype}"
    x = (torch.randn(rows, n, generator=gen) * 2 + pick(9) - 4).to(dtype)
    xd = x.double()
    configs = [c for c in sm.mapping(n, None, itemsize) if c.kwargs["PIPE"]]
    if configs:  # none where slots do not fit, or a row would take more than 8 CTAs
        config = configs[pick(len(configs))]
        out = torch.full_like(x, float("nan"))
        sm.softmax_kernel.interpret[_rows.grid(rows, config)](x, out, piped.lines(x), piped.lines(out),
                                                               **config.launch_kwargs())
        assert rel_err(out, torch.softmax(xd, 1)) < max(tol, 1e-6), (what, config)
    configs = [c for c in ce.mapping(n, itemsize) if c.kwargs["PIPE"]]
    if configs:
        config = configs[pick(len(configs))]
        target = torch.randint(0, n, (rows,), generator=gen)
        loss, lse = torch.full((rows,), float("nan")), torch.full((rows,), float("nan"))
        ce.run_mapping(config, x, target, loss, lse)
        assert rel_err(lse, torch.logsumexp(xd, 1)) < 1e-6, (what, config)
        ref = torch.nn.functional.cross_entropy(xd, target, reduction="none")
        assert rel_err(loss, ref) < 1e-5, (what, config)
    w, b = torch.randn(n, generator=gen).to(dtype), torch.randn(n, generator=gen).to(dtype)
    for kernel, mapping, vectors, ref in (
            (rms.rmsnorm_kernel, rms.rmsnorm_mapping(n, None, itemsize, (itemsize,)), (w,),
             torch.nn.functional.rms_norm(xd, (n,), w.double(), 1e-6)),
            (ln.layernorm_rows, ln.layernorm_mapping(n, None, itemsize, (itemsize, itemsize)), (w, b),
             torch.nn.functional.layer_norm(xd, (n,), w.double(), b.double(), 1e-5))):
        configs = [c for c in mapping if c.kwargs["PIPE"]]
        if not configs:
            continue
        config = configs[pick(len(configs))]
        out = torch.full_like(x, float("nan"))
        kernel.interpret[_rows.grid(rows, config)](x, *vectors, out, piped.lines(x), piped.lines(out),
                                                   *map(piped.weight_rows, vectors),
                                                   eps=1e-6 if len(vectors) == 1 else 1e-5, **config.launch_kwargs())
        assert rel_err(out, ref) < tol, (what, kernel.name, config)


def test_cross_entropy_refuses_a_cluster_mapping():
    """Cross-entropy pipes a row through one CTA: a softmax mapping over a cluster launched on it fails to compile,
    naming the line, where it would have run each CTA of the cluster as a program of its own."""
    n = 50257
    config = [c for c in sm.mapping(n, None, 2) if c.kwargs["PIPE"]][0]
    assert config.kwargs["CTAS"] > 1
    x = torch.empty(8, n, dtype=BF16)
    with pytest.raises(mgjit.CompileError, match=r"cross_entropy\.py:\d+ .*pipes each row through one CTA"):
        ce.cross_entropy_rows.compile(x, torch.empty(8, dtype=torch.int64), torch.empty(8), torch.empty(8), -100,
                                      piped.lines(x), x, x, **ce_options(config), target="sm_90a")


@pytest.mark.parametrize("n,dtype", [(20000, BF16), (20001, BF16), (32000, torch.float32), (65536, torch.float16)],
                         ids=str)
def test_norms_piped_over_a_cluster_interpreted(n, dtype):
    """rmsnorm and layernorm rows too long for one CTA, over a cluster, each CTA with its segments of w (and b)
    stashed: the grid a multiple of stash_multiple clusters (8 for bf16 rows of 20001, whose rows start 8 elements
    apart on such a grid; 1 for 20000, whose rows start 32 elements apart, and for 32000 and 65536, whole lines),
    so that every row of a cluster reads its weights through a window on 16 bytes.
    Layernorm's rows jump in mean halfway through each cluster's rows, which its segments see alike (the read
    again is taken or not by every CTA of the cluster)."""
    itemsize = torch.finfo(dtype).bits // 8
    w, b = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
    for kernel, mapping, weights in ((rms.rmsnorm_kernel, rms.rmsnorm_mapping, 1), (ln.layernorm_rows,
                                                                                   ln.layernorm_mapping, 2)):
        configs = [c for c in mapping(n, None, itemsize, (itemsize,) * weights) if c.kwargs["PIPE"]]
        assert configs and all(c.kwargs["CTAS"] > 1 for c in configs), configs
        for config in configs[:2]:
            kw = config.kwargs
            assert kw["STASH"] == piped.stash_multiple(n, itemsize) == {20001: 8}.get(n, 1)
            grid = _rows.grid(10 ** 6, config)
            clusters = grid[0] // kw["CTAS"]
            assert clusters % kw["STASH"] == 0 and grid == _rows.grid(clusters * 3 + 1, config)
            rows = clusters * 3 + 1
            jump = 40.0 * (torch.arange(rows) >= rows // 2)[:, None]
            x = (torch.randn(rows, n) + 3 + jump).to(dtype)
            out = torch.full_like(x, float("nan"))
            xd, args = x.double(), (x, w, out, piped.lines(x), piped.lines(out), piped.weight_rows(w))
            if weights == 1:
                ref = torch.nn.functional.rms_norm(xd, (n,), w.double(), 1e-6)
                kernel.interpret[grid](*args, eps=1e-6, **config.launch_kwargs())
            else:
                ref = torch.nn.functional.layer_norm(xd, (n,), w.double(), b.double(), 1e-5)
                kernel.interpret[grid](x, w, b, out, piped.lines(x), piped.lines(out), piped.weight_rows(w),
                                       piped.weight_rows(b), eps=1e-5, **config.launch_kwargs())
            assert rel_err(out, ref) < {torch.float32: 4e-6}.get(dtype, 5e-3), (kernel, config)


@pytest.mark.parametrize("n,dtype", [(20001, BF16), (50257, torch.float32), (300001, torch.float16),
                                     (20000, BF16)], ids=str)
def test_cross_entropy_segments_interpreted(monkeypatch, n, dtype):
    """Cross-entropy rows too long for one CTA split into segments of whole lines that programs take as rows, the
    last of a row's segments to be counted in merging their statistics. Three configs through `run_mapping`, over
    more segments than the programs' rings hold, targets on either side of the boundaries between segments and
    ignored, each run twice on fresh targets (the counts each launch leaves zero are the next one's), the last
    under the interpreter's random schedule; and the wrapper with one forced. Rows longer than a cluster holds
    (300001) take segments too, and so do rows that start on 16 bytes (20000)."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(_device, "_KEPT", {})
    itemsize = torch.finfo(dtype).bits // 8
    configs = [c for c in ce.mapping(n, itemsize) if c.kwargs["SEGS"] > 1]
    assert configs and all(c.kwargs["CTAS"] == 1 for c in configs)
    rows = 7
    x = (torch.randn(rows, n) * 4).to(dtype)
    xd = x.double()
    for k, config in enumerate(configs[:3]):
        assert _rows.grid(rows, config) == (min(rows * config.kwargs["SEGS"], 2 * config.kwargs["PIPE"]),)
        width = sum(config.kwargs["PL"]) * piped.LINE  # a segment's columns; the first starts s into row r's lines
        for again in range(2):
            target = torch.randint(0, n, (rows,))
            target[0], target[1], target[3] = 0, n - 1, -100
            for r, before in ((2, 1), (4, 0), (5, 1), (6, 0)):  # a target on either side of a segments' boundary
                target[r] = ((r + again) % (config.kwargs["SEGS"] - 1) + 1) * width - r * n % piped.LINE - before
            ref = torch.nn.functional.cross_entropy(xd, target, reduction="none", ignore_index=-100)
            loss, lse = torch.full((rows,), float("nan")), torch.full((rows,), float("nan"))
            if k == 2:
                parts, counts = ce.scratch(x, (config,))
                ce.cross_entropy_rows.interpret(policy="random", seed=again)[_rows.grid(rows, config)](
                    x, target, loss, lse, -100, piped.lines(x), parts, counts, **config.launch_kwargs())
            else:
                ce.run_mapping(config, x, target, loss, lse)
            assert rel_err(lse, torch.logsumexp(xd, 1)) < 1e-6, config
            assert rel_err(loss, ref) < 1e-5, config
            (counts,), = _device._KEPT.values()
            assert counts.shape == (rows,) and not counts.any(), "the row that merges sets its count back to 0"
    pair = tuple(configs[:2])
    monkeypatch.setattr(ce, "mapping", lambda *args: pair)
    loss, lse = ce.cross_entropy(x, target)
    assert rel_err(loss, ref) < 1e-5


@pytest.mark.parametrize("n,dtype", [(33, torch.float32), (9000, torch.float32), (5000, BF16), (20001, BF16)],
                         ids=str)
def test_cross_entropy_without_logsumexps(monkeypatch, n, dtype):
    """return_lse=False: every kind of mapping (held rows in one array or more, on one or two warpgroups; streamed;
    chunked over a cluster; piped; piped segments) with LSE=0 writes the same losses and no logsumexp (a poisoned
    lse stays poisoned), and the wrapper returns the losses alone."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(_device, "_KEPT", {})
    rows = 7
    x = (torch.randn(rows, n) * 4).to(dtype)
    target = torch.randint(0, n, (rows,))
    target[3] = -100
    ref = torch.nn.functional.cross_entropy(x.double(), target, reduction="none", ignore_index=-100)
    configs = ce.mapping(n, torch.finfo(dtype).bits // 8, False)
    assert [c.kwargs["LSE"] for c in configs] == [0] * len(configs)
    assert [c.replace(LSE=1) for c in configs] == list(ce.mapping(n, torch.finfo(dtype).bits // 8))
    kinds = {}
    for c in configs:
        k = c.kwargs
        kinds.setdefault((k["PIPE"] > 0, k["SEGS"] > 1, k["BLOCK"] > 0, k["CHUNKS"] > 0, k["CTAS"] * k["WGS"],
                          len(k["PARTS"])), c)
    assert len(kinds) >= 2, configs
    for config in kinds.values():
        loss, lse = torch.full((rows,), float("nan")), torch.full((rows,), float("nan"))
        ce.run_mapping(config, x, target, loss, lse)
        assert lse.isnan().all(), f"{config} wrote logsumexps"
        assert rel_err(loss, ref) < 1e-5, config
    got = ce.cross_entropy(x, target, return_lse=False)
    assert isinstance(got, torch.Tensor) and rel_err(got, ref) < 1e-5
    loss, lse = ce.cross_entropy(x, target)
    assert torch.equal(loss, got) and rel_err(lse, torch.logsumexp(x.double(), 1)) < 1e-6


def test_cross_entropy_segments_refuse_too_little_scratch(monkeypatch):
    """Piped segments store the pieces of rows that programs share in parts (two columns a program) and count them in
    counts (one a row): scratch made for a smaller grid (here for the wrapper's mappings, 4 programs an SM, under one
    of 8) would drop pieces and write wrong losses (-inf), so the kernel stops (the interpreter raises, the GPU
    traps); scratch made for the mapping launched runs it."""
    from mgjit.errors import Check, InterpretError
    monkeypatch.setattr(_device, "_KEPT", {})
    n, rows = 50257, 7
    config = piped.piped(n, 2, 8, segs=13, lines=16).replace(OCC=0, EARLY=0, LSE=1)
    x = (torch.randn(rows, n) * 4).to(BF16)
    target = torch.randint(0, n, (rows,))
    grid = _rows.grid(rows, config)
    small = ce.scratch(x, [c for c in ce.mapping(n, 2) if c.kwargs["PIPE"]])
    assert small[0].shape[1] < 2 * grid[0]
    loss, lse = torch.full((rows,), float("nan")), torch.full((rows,), float("nan"))
    with pytest.raises(InterpretError, match="two columns a program") as info:
        ce.cross_entropy_rows.interpret[grid](x, target, loss, lse, -100, piped.lines(x), *small,
                                              **config.launch_kwargs())
    assert info.value.check == Check.DEVICE_ASSERT
    ce.cross_entropy_rows.interpret[grid](x, target, loss, lse, -100, piped.lines(x), *ce.scratch(x, (config,)),
                                          **config.launch_kwargs())
    ref = torch.nn.functional.cross_entropy(x.double(), target, reduction="none")
    assert rel_err(loss, ref) < 1e-5


def split_ends(rows: int, segs: int, programs: int) -> tuple[int, int]:
    """(programs whose run holds pieces of rows at both its ends, rows split over three programs or more) for runs
    as _rows_piped.program_items cuts them."""
    each, more = divmod(rows * segs, programs)
    runs = [(p * each + min(p, more), each + (p < more)) for p in range(programs)]
    both = sum(1 for first, count in runs if count and first % segs and (first + count) % segs
               and (first + count - 1) // segs != first // segs)
    holders = [sum(1 for first, count in runs if count and first < (r + 1) * segs and first + count > r * segs)
               for r in range(rows)]
    return both, sum(h >= 3 for h in holders)


def test_cross_entropy_runs_split_rows_at_both_ends(monkeypatch):
    """Runs of segments cut anywhere: a program holding pieces of two rows (its run's first and last), rows whose
    pieces three programs or more hold (runs shorter than a row); each row merged once, in the programs' order,
    whichever counts its last piece in (the programs launch in random orders), and every count left zero."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    monkeypatch.setattr(_device, "_KEPT", {})
    n = 20001
    config = next(c for c in ce.mapping(n, 2) if c.kwargs["SEGS"] > 1)
    segs = config.kwargs["SEGS"]
    cases = {rows: split_ends(rows, segs, _rows.grid(rows, config)[0]) for rows in (1, 2, 3, 5, 7, 9, 11)}
    assert any(both for both, _ in cases.values()) and any(wide for _, wide in cases.values()), cases
    for rows in cases:
        x = (torch.randn(rows, n) * 4).to(BF16)
        target = torch.randint(0, n, (rows,))
        ref = torch.nn.functional.cross_entropy(x.double(), target, reduction="none")
        for seed in range(3):  # the programs launched in an order drawn from the seed, copies landing at random
            loss, lse = torch.full((rows,), float("nan")), torch.full((rows,), float("nan"))
            parts, counts = ce.scratch(x, (config,))
            ce.cross_entropy_rows.interpret(policy="random", seed=seed)[_rows.grid(rows, config)](
                x, target, loss, lse, -100, piped.lines(x), parts, counts, **config.launch_kwargs())
            assert rel_err(loss, ref) < 1e-5 and rel_err(lse, torch.logsumexp(x.double(), 1)) < 1e-6, (rows, seed)
            assert not counts.any(), (rows, seed)


def flat_cases(x, out):
    """(kernel, its arguments and constexprs for x and out as the wrappers launch them, its flat mappings, the torch
    reference) of softmax, RMSNorm and layernorm over rows of one column."""
    w, b = torch.randn(1).to(x.dtype), torch.randn(1).to(x.dtype)
    item, xd = x.element_size(), x.double()
    _, views = piped.piped_views((x, out))
    _, rms_views = piped.piped_views((x, out), (w,))
    _, ln_views = piped.piped_views((x, out), (w, b))
    return [(sm.softmax_kernel, (x, out, *views), {}, sm.mapping(1, None, item), torch.softmax(xd, 1)),
            (rms.rmsnorm_kernel, (x, w, out, *rms_views), {"eps": 1e-6}, rms.rmsnorm_mapping(1, None, item, (item,)),
             torch.nn.functional.rms_norm(xd, (1,), w.double(), 1e-6)),
            (ln.layernorm_rows, (x, w, b, out, *ln_views), {"eps": 1e-5},
             ln.layernorm_mapping(1, None, item, (item, item)),
             torch.nn.functional.layer_norm(xd, (1,), w.double(), b.double(), 1e-5))]


def same_or_both_nan(got, ref, tol) -> bool:
    got, ref = got.double(), ref.double()
    return torch.equal(got.isnan(), ref.isnan()) and bool(((got - ref).nan_to_num().abs() <= tol).all())


@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=str)
@pytest.mark.parametrize("rows", [1, 255, 256, 257, 5000])
def test_rows_of_one_column_go_flat(rows, dtype):
    """Softmax, RMSNorm and layernorm over contiguous rows of one column also take flat mappings (FLAT_ROWS rows a
    program, as whole lines, the rows past the last whole line through the tensors by the program holding them),
    interpreted against torch with infinite inputs (NaN out, as torch) and the output poisoned; no other length,
    forced rows a program or cross-entropy offers them."""
    x = (torch.randn(rows, 1) * 3).to(dtype)
    x[::7] = float("inf")
    x[3::7] = -float("inf")
    out = torch.full_like(x, float("nan"))
    for kernel, args, constexprs, configs, ref in flat_cases(x, out):
        flat = [c for c in configs if c.kwargs["FLAT"]]
        assert [c.kwargs["ROWS"] for c in flat] == list(piped.FLAT_ROWS)
        for config in flat:
            out.fill_(float("nan"))
            kernel.interpret[_rows.grid(rows, config)](*args, **constexprs, **config.launch_kwargs())
            assert same_or_both_nan(out, ref, 1e-2 if dtype == BF16 else 1e-6), (kernel.name, config)
    for configs in (sm.mapping(2, None, 2), sm.mapping(1, None, 0), sm.mapping(1, 4, 2),
                    rms.rmsnorm_mapping(1, None, 0), ln.layernorm_mapping(3, None, 2)):
        assert not any(c.kwargs.get("FLAT") for c in configs)
    assert not any("FLAT" in c.kwargs for c in ce.mapping(1, 2))


def test_flat_rows_through_the_wrappers(monkeypatch):
    """The wrappers read rows of one column flat where the tensors are contiguous (the interpreter launches the
    first candidate: forced here to a flat one) and as held rows where they are not."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    real = sm.mapping
    monkeypatch.setattr(sm, "mapping", lambda n, r=None, item=0: tuple(sorted(real(n, r, item),
                                                                             key=lambda c: -c.kwargs["FLAT"])))
    for x, flat in ((torch.randn(3000, 1), True), (torch.randn(3000, 2)[:, :1], False)):
        itemsize, _ = piped.piped_views((x, x))  # as softmax() asks: flat mappings only for contiguous tensors
        assert sm.mapping(1, None, itemsize)[0].kwargs["FLAT"] == flat
        assert sm.softmax(x).eq(1).all()


@pytest.mark.parametrize("dtype", [BF16, torch.float16], ids=str)
def test_flat_rows_from_their_ptx(dtype):
    """A flat mapping of each kernel run from its sm_90a PTX on the simulator over 1000 + 77 rows (the last program
    holding the rows past the last whole line), its lines moved in 16-byte vectors."""
    import ptx_sim
    x = (torch.randn(1077, 1) * 3).to(dtype)
    out = torch.full_like(x, float("nan"))
    for kernel, args, constexprs, configs, ref in flat_cases(x, out):
        config = next(c for c in configs if c.kwargs["FLAT"] and c.kwargs["ROWS"] == 1024)
        compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
        assert "ld.global.v4" in compiled.ptx and "st.global.v4" in compiled.ptx, kernel.name
        dev = ptx_sim.Device()
        dev.run(compiled, _rows.grid(x.shape[0], config), *args)
        assert same_or_both_nan(dev.fetch(out), ref, 1e-2), kernel.name

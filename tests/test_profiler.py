"""The profiler: spans compile to nothing unless a launch profiles (byte-identical PTX), the profiled variant's
PTX, spans recorded by the interpreter (nested, ordered, per warpgroup), decoding hand-written buffers (the
timer's wrap, overflow), lanes, the Chrome trace and the timeline picture."""
import json
import os

import pytest
import torch

import mgjit
from mgjit import profiler


def scale_kernel(spans: bool):
    """The same kernel (same name) with and without spans."""
    if spans:
        @mgjit.kernel
        def scale(x, out, BLOCK: mgjit.constexpr):
            pid = mgjit.program_id(0)
            with mgjit.trace("load"):
                v = x[pid, mgjit.ds(0, BLOCK)]
            for i in range(2):
                with mgjit.trace("math"), mgjit.trace("inner"):
                    v = v * 2
            out[pid, mgjit.ds(0, BLOCK)] = v
    else:
        @mgjit.kernel
        def scale(x, out, BLOCK: mgjit.constexpr):
            pid = mgjit.program_id(0)
            v = x[pid, mgjit.ds(0, BLOCK)]
            for i in range(2):
                v = v * 2
            out[pid, mgjit.ds(0, BLOCK)] = v
    return scale


def test_spans_compile_to_nothing_when_the_launch_does_not_profile():
    x = torch.empty(4, 256)
    plain = scale_kernel(False).compile(x, x, BLOCK=256, target="sm_90a")
    with_spans = scale_kernel(True).compile(x, x, BLOCK=256, target="sm_90a")
    assert with_spans.ptx == plain.ptx
    assert with_spans.key != plain.key  # the source differs; the code does not
    assert "hidden_buffers" not in with_spans.meta


def test_the_profiled_variant_records_each_span_edge_and_takes_its_buffer_last():
    x = torch.empty(4, 256)
    c = scale_kernel(True).compile(x, x, BLOCK=256, target="sm_90a", profile=True)
    assert c.meta["hidden_buffers"] == {"profile": {"param": 2, "spans": ["load", "math", "inner"]}}
    assert [p["name"] for p in c.params] == ["x", "out", "mgjit.profile"]
    # Two edges of load, four of math and inner per step of the loop, which LLVM unrolls: 2 + 2 * 4.
    assert c.ptx.count("%globaltimer_lo") == 10
    assert c.ptx.count("mov.u64 t, %globaltimer;") == 1 and "%smid" in c.ptx
    assert c.spills == 0 and "profiled" in c.meta["specialization"]


@mgjit.kernel(num_warpgroups=2)
def two_roles(x, out, BLOCK: mgjit.constexpr):
    wg = mgjit.warpgroup_id()
    pid = mgjit.program_id(0)
    with mgjit.trace("kernel"):
        if wg == 0:
            with mgjit.trace("producer"):
                v = x[pid, mgjit.ds(0, BLOCK)]
                out[pid, mgjit.ds(0, BLOCK)] = v
        else:
            for i in range(3):
                with mgjit.trace("step"):
                    mgjit.print("{}", i, where="warpgroup")


def test_the_interpreter_records_nested_ordered_spans_per_warpgroup(capsys):
    x = torch.randn(2, 128)
    out = torch.full_like(x, float("nan"))
    prof = mgjit.Profile(capacity=16)
    two_roles.interpret[(2,)](x, out, BLOCK=128, profile=prof)
    assert torch.equal(out, x) and len(capsys.readouterr().out.splitlines()) == 6
    assert prof.unit == "ticks" and not prof.warnings
    for cta in range(2):
        for wg in range(2):
            mine = [s for s in prof.spans if s.cta == (cta, 0, 0) and s.warpgroup == wg]
            assert {s.sm for s in mine} == {cta}  # under the interpreter the "SM" is the CTA
            outer = [s for s in mine if s.depth == 0]
            assert [s.name for s in outer] == ["kernel"]
            inner = sorted((s for s in mine if s.depth == 1), key=lambda s: s.start)
            assert [s.name for s in inner] == (["producer"] if wg == 0 else ["step"] * 3)
            assert all(outer[0].start < s.start < s.end < outer[0].end for s in inner)
            assert all(a.end < b.start for a, b in zip(inner, inner[1:]))
    summary = prof.summary()
    assert summary.splitlines()[0].split() == ["span", "count", "mean", "ticks", "total", "ticks"]
    assert any(line.split()[:2] == ["step", "6"] for line in summary.splitlines())


def test_a_launch_under_MGJIT_INTERPRET_takes_profile_and_a_bad_one_is_refused(monkeypatch):
    x = torch.randn(2, 128)
    prof = mgjit.Profile()
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    two_roles[(2,)](x, torch.empty_like(x), BLOCK=128, profile=prof)
    assert len(prof.spans) == 2 * (2 + 1 + 3)
    monkeypatch.delenv("MGJIT_INTERPRET")
    with pytest.raises(mgjit.LaunchError, match="profile= takes an mgjit.Profile, got str"):
        two_roles[(2,)](x, torch.empty_like(x), BLOCK=128, profile="yes")


def test_a_full_region_keeps_its_first_events_and_says_so():
    prof = mgjit.Profile(capacity=4)
    two_roles.interpret[(1,)](torch.randn(1, 128), torch.empty(1, 128), BLOCK=128, profile=prof)
    steps = [s for s in prof.spans if s.warpgroup == 1]
    assert [s.name for s in steps] == ["step"]  # kernel begins, step, step begins: 4 events
    assert prof.warnings == ["CTA (0, 0, 0) warpgroup 1 recorded 8 events, 4 more than the capacity of 4: "
                             "Profile(capacity=...) larger"]


def region(sm: int, start: int, events: list[tuple[int, bool, int]], capacity: int) -> list[int]:
    words = [sm, len(events), start & 0xFFFFFFFF, start >> 32]
    for span, end, t in events:
        words += [profiler.event_tag(span, end), t & 0xFFFFFFFF]
    words += [0] * (profiler.EVENT_WORDS * (capacity - len(events)))
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def test_decoding_follows_the_timer_through_the_wrap_of_its_low_word():
    start = (5 << 32) + 0xFFFFFF00  # 256 ns before the low word wraps
    words = region(7, start, [(0, False, start + 16), (1, False, start + 200), (1, True, start + 300),
                              (0, True, start + 1000)], capacity=4)
    words += region(9, start + 50, [(1, False, start + 60), (1, True, start + 70)], capacity=4)
    spans, warnings = profiler.decode(torch.tensor(words, dtype=torch.int32), (2, 1, 1), 1, ["outer", "inner"])
    assert not warnings
    assert [(s.name, s.sm, s.cta, s.start, s.end, s.depth) for s in spans] == [
        ("outer", 7, (0, 0, 0), 0, 984, 0), ("inner", 7, (0, 0, 0), 184, 284, 1), ("inner", 9, (1, 0, 0), 44, 54, 0)]


def test_ctas_that_share_an_sm_at_once_get_lanes_of_their_own():
    def span(cta, wg, start, end, sm=0):
        return profiler.Span("s", (cta, 0, 0), wg, sm, start, end, 0)
    spans = [span(0, 0, 0, 10), span(0, 1, 0, 12), span(1, 0, 5, 20), span(1, 1, 6, 21), span(2, 0, 15, 30),
             span(3, 0, 0, 40, sm=1)]
    lanes = profiler.assign_lanes(spans)
    # CTA 1 overlaps CTA 0 (slot 1); CTA 2 starts after CTA 0 ended (slot 0 again); SM 1 has its own slots.
    assert [lanes[s] for s in spans] == [0, 1, 2, 3, 0, 0]


def test_the_chrome_trace_has_a_complete_event_per_span_and_names_its_lanes(tmp_path):
    prof = mgjit.Profile()
    two_roles.interpret[(2,)](torch.randn(2, 128), torch.empty(2, 128), BLOCK=128, profile=prof)
    path = tmp_path / "trace.json"
    prof.save(str(path))
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(prof.spans) == 12
    assert {(e["pid"], e["tid"]) for e in complete} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names[(0, None)] == "SM 0" and names[(1, 1)] == "wg 1"
    assert trace["otherData"] == {"kernel": "two_roles", "clock": "logical"}
    first = min(complete, key=lambda e: (e["ts"], -e["dur"]))
    assert first["name"] == "kernel" and first["args"] == {"cta": [0, 0, 0], "warpgroup": 0, "depth": 0}
    again = mgjit.Profile.from_chrome_trace(str(path))  # to draw elsewhere, on a machine with matplotlib
    assert sorted(again.spans, key=str) == sorted(prof.spans, key=str) and again.unit == "ticks"


def test_the_timeline_is_a_png_that_shows_in_a_notebook(tmp_path):
    pytest.importorskip("matplotlib")
    prof = mgjit.Profile()
    assert prof._repr_png_() is None
    two_roles.interpret[(2,)](torch.randn(2, 128), torch.empty(2, 128), BLOCK=128, profile=prof)
    png = prof._repr_png_()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    path = tmp_path / "trace.png"
    prof.save(str(path))
    assert path.read_bytes().startswith(b"\x89PNG")
    figure = prof.timeline()
    (axes,) = figure.axes
    assert [t.get_text() for t in axes.get_yticklabels()] == ["SM 0 wg 0", "SM 0 wg 1", "SM 1 wg 0", "SM 1 wg 1"]
    assert sorted(t.get_text() for t in axes.get_legend().get_texts()) == ["kernel", "producer", "step"]


def test_importing_mgjit_does_not_import_matplotlib():
    import subprocess
    import sys
    code = "import sys, mgjit; mgjit.Profile(); print('matplotlib' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_the_hopper_matmul_example_carries_nested_spans_per_warpgroup():
    from test_interpret_kernels import hopper
    from span_checks import check_matmul_spans
    a, b = torch.randn(256, 128, dtype=torch.bfloat16), torch.randn(128, 384, dtype=torch.bfloat16)
    c = torch.full((256, 384), float("nan"), dtype=torch.bfloat16)
    prof = mgjit.Profile()
    hopper.matmul_kernel.interpret[(2,)](a, b, c, c, c, c, c, **{**hopper.DEFAULT_CONFIG, "BN": 128},
                                         profile=prof)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=1e-1)
    check_matmul_spans(prof, grid=2, tiles=6)


@mgjit.kernel
def span_without_name(x):
    with mgjit.trace(3):  # ERR
        pass


@mgjit.kernel
def span_as(x):
    with mgjit.trace("a") as t:  # ERR
        pass


@mgjit.kernel
def span_called(x):
    mgjit.trace("a")  # ERR


@mgjit.kernel
def other_with(x):
    with open("f"):  # ERR
        pass


@pytest.mark.parametrize("kernel,phrase", [
    (span_without_name, "mgjit.trace takes a span name, a string"),
    (span_as, "binds nothing: leave out `as t`"),
    (span_called, "mgjit.trace opens a `with` block"),
    (other_with, "`with` statements in a kernel open mgjit scopes only"),
], ids=["name", "as", "call", "other"])
def test_span_errors_name_the_line(kernel, phrase):
    from test_core_frontend import err_line
    with pytest.raises(mgjit.CompileError) as info:
        kernel.compile(torch.zeros(4), target="sm_90a", profile=True)
    assert phrase in str(info.value) and info.value.loc.line == err_line(kernel) and info.value.loc.file == __file__

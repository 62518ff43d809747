"""mgjit.print: the text the interpreter prints (hand-derived), the record format it shares with the GPU, the
PTX a printing kernel lowers to, and its errors. tests/test_gpu_debug.py checks that the GPU prints the same."""
import pytest
import torch

import mgjit
from mgjit import dtypes, printing


@mgjit.kernel
def scalars_and_arrays(x, n, BLOCK: mgjit.constexpr):
    pid = mgjit.program_id(0)
    v = x[pid, mgjit.ds(0, BLOCK)]
    mgjit.print("pid {} n={} sum {:.2f}", pid, n, v.sum())
    mgjit.print("row {}", v, where="warpgroup")


def test_scalars_and_arrays_print_once_per_cta_and_warpgroup_in_cta_order(capsys):
    x = torch.arange(2 * 8, dtype=torch.float32).reshape(2, 8) / 4
    scalars_and_arrays.interpret[(2,)](x, 7, BLOCK=8)
    assert capsys.readouterr().out.splitlines() == [
        "[cta (0, 0, 0)] pid 0 n=7 sum 7.00",
        "[cta (0, 0, 0) wg 0] row [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]",
        "[cta (1, 0, 0)] pid 1 n=7 sum 23.00",
        "[cta (1, 0, 0) wg 0] row [2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75]"]


@mgjit.kernel
def per_thread(x, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, BLOCK)]
    mgjit.print("{:g}", v, where="thread")


def test_per_thread_each_thread_prints_the_elements_its_layout_gives_it(capsys):
    """256 float32 in the blocked layout: 16-byte vectors, lanes along the array, the 4 warps two copies of two
    halves: thread t holds 128 * ((t // 32) % 2) + 4 * (t % 32) + k, k < 4."""
    per_thread.interpret[(1,)](torch.arange(256, dtype=torch.float32), BLOCK=256)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 128
    for t, line in enumerate(lines):
        first = 128 * ((t // 32) % 2) + 4 * (t % 32)
        items = ", ".join(f"{first + k}: {first + k}" for k in range(4))
        assert line == f"[cta (0, 0, 0) thread {t}] {{{items}}}"


@mgjit.kernel(num_warpgroups=2)
def two_warpgroups(x):
    wg = mgjit.warpgroup_id()
    mgjit.print("wg {}", wg, where="warpgroup")
    mgjit.print("cta {}", wg)
    if wg == 1:
        mgjit.print("only wg 1 {}", wg, where="warpgroup")


def test_where_cta_prints_from_warpgroup_0_and_warpgroup_from_each(capsys):
    two_warpgroups.interpret[(1,)](torch.zeros(1))
    assert capsys.readouterr().out.splitlines() == [
        "[cta (0, 0, 0) wg 0] wg 0", "[cta (0, 0, 0)] cta 0", "[cta (0, 0, 0) wg 1] wg 1",
        "[cta (0, 0, 0) wg 1] only wg 1 1"]


@mgjit.kernel
def every_dtype(f64, i64, f8, BLOCK: mgjit.constexpr):
    h = mgjit.full((4,), 1.5, mgjit.float16)
    b = mgjit.full((2, 2), -2.25, mgjit.bfloat16)
    i8 = mgjit.full((4,), -3, mgjit.int8)
    u8 = mgjit.full((4,), 250, mgjit.uint8)
    flags = mgjit.arange(4) < 2
    mgjit.print("{} {} {} {} {}", h, b, i8, u8, flags)
    x, n = f64[0], i64[0]
    mgjit.print("{:>6}|{:.1f}|{:x}|{}|{}", 0.1, x, n, x * 2, n * 2)
    mgjit.print("{} {:.3f}", f8[mgjit.ds(0, BLOCK)], f8[1])


def test_values_keep_their_dtype_through_the_words_they_travel_as(capsys):
    every_dtype.interpret[(1,)](torch.tensor([2.0 ** 40 + 0.5], dtype=torch.float64),
                                torch.tensor([-(2 ** 40) - 1]),
                                torch.tensor([0.5, -448.0, 0.0234375, 3.0]).to(torch.float8_e4m3fn), BLOCK=4)
    assert capsys.readouterr().out.splitlines() == [
        "[cta (0, 0, 0)] [1.5, 1.5, 1.5, 1.5] [[-2.25, -2.25], [-2.25, -2.25]] [-3, -3, -3, -3] "
        "[250, 250, 250, 250] [True, True, False, False]",
        "[cta (0, 0, 0)]    0.1|1099511627776.5|-10000000001|2199023255553.0|-2199023255554",
        "[cta (0, 0, 0)] [0.5, -448.0, 0.0234375, 3.0] -448.000"]


def test_the_words_of_a_record_decode_to_the_values(capsys):
    """A hand-written buffer: the cursor, one record of a site with an int64 and a 2x2 float32 array."""
    site = {"format": "{} {}", "where": "cta", "line": 1,
            "values": [{"dtype": "int64", "shape": []}, {"dtype": "float32", "shape": [2, 2]}]}
    words = printing.record_words("cta", [(dtypes.int64, ()), (dtypes.float32, (2, 2))], [0, 4])
    assert words == printing.HEADER_WORDS + 2 + 4
    floats = torch.tensor([1.0, -2.0, 0.5, 3.0]).view(torch.int32).tolist()
    record = [1, 5, 0, words, -7 & 0xFFFFFFFF, 0xFFFFFFFF, *floats]
    buffer = torch.tensor([words, *[w - (1 << 32) if w >= 1 << 31 else w for w in record], 0, 0], dtype=torch.int32)
    assert printing.lines(buffer, [site], (2, 3, 1)) == ["[cta (1, 2, 0)] -7 [[1.0, -2.0], [0.5, 3.0]]"]


def test_records_past_the_end_of_the_buffer_are_counted_as_dropped(monkeypatch, capsys):
    monkeypatch.setenv("MGJIT_PRINT_WORDS", "20")
    x = torch.arange(2 * 8, dtype=torch.float32).reshape(2, 8)
    scalars_and_arrays.interpret[(2,)](x, 7, BLOCK=8)
    lines = capsys.readouterr().out.splitlines()
    # Each CTA reserves 4 + 3 words, then 4 + 8: the first CTA's 19 words fit, the second's do not.
    assert lines[:2] == ["[cta (0, 0, 0)] pid 0 n=7 sum 28.00", "[cta (0, 0, 0) wg 0] row [0.0, 1.0, 2.0, 3.0, "
                         "4.0, 5.0, 6.0, 7.0]"]
    assert len(lines) == 3 and "19 more words of records did not fit the buffer of 20 words" in lines[2]


def test_a_printing_kernel_lowers_to_one_reservation_per_print_and_takes_its_buffer_last():
    x = torch.empty(2, 8)
    c = scalars_and_arrays.compile(x, 7, BLOCK=8, target="sm_90a")
    assert [p["name"] for p in c.params] == ["x", "n", "mgjit.print"]
    assert c.meta["hidden_buffers"]["print"]["param"] == 2
    assert [s["format"] for s in c.meta["hidden_buffers"]["print"]["sites"]] == ["pid {} n={} sum {:.2f}", "row {}"]
    assert c.ptx.count("atom.global.add.u32") == 2
    plain = per_thread.compile(torch.empty(256), BLOCK=256, target="sm_100a")
    assert "atom.global.add.u32" in plain.ptx and plain.spills == 0
    typed = every_dtype.compile(torch.empty(1, dtype=torch.float64), torch.empty(1, dtype=torch.int64),
                                torch.empty(4, dtype=torch.float8_e4m3fn), BLOCK=4, target="sm_90a")
    assert typed.ptx.count("atom.global.add.u32") == 3 and typed.spills == 0


def test_a_printing_kernel_is_a_cache_hit_for_a_new_kernel_object():
    """Its entry holds the call's parameters as its specialization decides them, the hidden buffer apart: a new
    process (here, a new Kernel object over the same source) loads it instead of compiling again."""
    x = torch.empty(2, 8)
    first = scalars_and_arrays.compile(x, 7, BLOCK=8, target="sm_100a")
    again = mgjit.kernel(scalars_and_arrays.fn).compile(x, 7, BLOCK=8, target="sm_100a")
    assert again.from_cache and again.key == first.key
    assert again.params == first.params and [p["name"] for p in again.params] == ["x", "n", "mgjit.print"]


@mgjit.kernel
def bad_count(x):
    mgjit.print("{} {}", 1)  # ERR


@mgjit.kernel
def bad_field(x):
    mgjit.print("{0}", 1)  # ERR


@mgjit.kernel
def bad_where(x):
    mgjit.print("{}", 1, where="warp")  # ERR


@mgjit.kernel
def bad_value(x):
    mgjit.print("{}", x)  # ERR


@mgjit.kernel
def python_print(x):
    print(x)  # ERR


@pytest.mark.parametrize("kernel,phrase", [
    (bad_count, "the format '{} {}' has 2 fields for 1 value"),
    (bad_field, "mgjit.print fields are {} or {:spec}"),
    (bad_where, "where= is one of 'cta', 'warpgroup', 'thread', got 'warp'"),
    (bad_value, "mgjit.print prints numbers and arrays, got Ref"),
    (python_print, "to print from the GPU use mgjit.print"),
], ids=["count", "field", "where", "value", "python-print"])
def test_print_errors_name_the_line(kernel, phrase):
    from test_core_frontend import err_line
    with pytest.raises(mgjit.CompileError) as info:
        kernel.compile(torch.zeros(4), target="sm_90a")
    assert phrase in str(info.value) and info.value.loc.line == err_line(kernel) and info.value.loc.file == __file__

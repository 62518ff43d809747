"""CPU tests of the frontend: every construct outside the kernel language is a CompileError that names the
kernel's file, the exact line of the offending construct, and the construct itself.

Each bad kernel marks its offending line with a trailing `# ERR` comment; the expected line number is read
from the function's source with inspect.getsourcelines, so moving code around cannot silently break a test.
Nothing here needs MLIR: the frontend and layout inference fail before lowering.
"""
import inspect
import linecache
import os
import re

import pytest

import mgjit

torch = pytest.importorskip("torch")

THIS_FILE = os.path.abspath(__file__)


def err_line(obj) -> int:
    """The absolute line number of the single line marked `# ERR` in a kernel's or helper's source."""
    fn = getattr(obj, "fn", obj)
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, line in enumerate(lines) if line.rstrip().endswith("# ERR")]
    assert len(hits) == 1, f"{fn.__name__} must mark exactly one line with # ERR"
    return hits[0]


def op_names(ir_text: str) -> list[str]:
    """The op of every line of printed IR, in order (`%3 = load {...}(...)` -> "load")."""
    names = []
    for line in ir_text.splitlines()[1:-1]:
        body = line.split("  # line")[0].strip()
        if body.startswith("^region"):
            continue
        body = body.split(" = ", 1)[1] if body.startswith("%") else body
        names.append(re.split(r"[ ({]", body, maxsplit=1)[0])
    return names


def plain_double(v):
    return v * 2


# ------------------------------------------------------------------------------------------ bad kernels
# Arguments: x (1D float32 unless noted), out (1D float32), n (runtime int), BLOCK (constexpr).

@mgjit.kernel
def k_while(x, out, n, BLOCK: mgjit.constexpr):
    i = mgjit.program_id(0)
    while i < n:  # ERR
        i += 1
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)]


@mgjit.kernel
def k_print(x, out, n, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, BLOCK)]
    print("block", BLOCK)  # ERR
    out[mgjit.ds(0, BLOCK)] = v


@mgjit.kernel
def k_plain_call(x, out, n, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, BLOCK)]
    w = plain_double(v)  # ERR
    out[mgjit.ds(0, BLOCK)] = w


@mgjit.kernel
def k_and(x, out, n, BLOCK: mgjit.constexpr):
    s = x[0]
    if s > 0.0 and s < 1.0:  # ERR
        s = s * 2.0
    out[0] = s


@mgjit.kernel
def k_or(x, out, n, BLOCK: mgjit.constexpr):
    s = x[0]
    t = x[1]
    u = s or t  # ERR
    out[0] = u


@mgjit.kernel
def k_chained(x, out, n, BLOCK: mgjit.constexpr):
    s = x[0]
    inside = 0.0 < s < 1.0  # ERR
    out[0] = mgjit.where(inside, s, 0.0)


@mgjit.kernel
def k_return_in_if(x, out, n, BLOCK: mgjit.constexpr):
    s = x[0]
    if s > 0.0:
        out[1] = s
        return  # ERR
    out[0] = s


@mgjit.kernel
def k_return_in_loop(x, out, n, BLOCK: mgjit.constexpr):
    for i in range(n):
        if i == 3:
            out[i] = x[i]
        return  # ERR


@mgjit.kernel
def k_loop_local(x, out, n, BLOCK: mgjit.constexpr):
    for i in range(n):
        last = x[i]
    out[0] = last  # ERR


@mgjit.kernel
def k_non_pow2(x, out, n, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, 1000)]  # ERR
    out[mgjit.ds(0, 1000)] = v


@mgjit.kernel
def k_store_dtype(x, out, n, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, BLOCK)]
    out[mgjit.ds(0, BLOCK)] = v.astype(mgjit.float16)  # ERR


@mgjit.kernel
def k_rank(x2d, out, n, BLOCK: mgjit.constexpr):
    v = x2d[mgjit.ds(0, BLOCK)]  # ERR
    out[mgjit.ds(0, BLOCK)] = v


@mgjit.kernel
def k_ds_runtime_size(x, out, n, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, n)]  # ERR
    out[mgjit.ds(0, BLOCK)] = v


@mgjit.kernel
def k_full_slice(x, out, n, BLOCK: mgjit.constexpr):
    v = x[:]  # ERR
    out[mgjit.ds(0, BLOCK)] = v


@mgjit.device
def forever(v):
    return forever(v) + 1.0  # ERR


@mgjit.kernel
def k_recursive(x, out, n, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = forever(x[mgjit.ds(0, BLOCK)])


@mgjit.kernel
def k_returns_value(x, out, n, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, BLOCK)]
    return v  # ERR


@mgjit.kernel
def k_try(x, out, n, BLOCK: mgjit.constexpr):
    try:  # ERR
        v = x[mgjit.ds(0, BLOCK)]
    except IndexError:
        v = mgjit.zeros((BLOCK,), mgjit.float32)
    out[mgjit.ds(0, BLOCK)] = v


@mgjit.kernel
def k_with(x, out, n, BLOCK: mgjit.constexpr):
    with open(x):  # ERR
        pass


@mgjit.kernel
def k_lambda(x, out, n, BLOCK: mgjit.constexpr):
    f = lambda v: v * 2.0  # noqa: E731, F841  # ERR
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)]


@mgjit.kernel
def k_nonlocal_global(x, out, n, BLOCK: mgjit.constexpr):
    global THIS_FILE  # ERR
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)]


# (kernel, where the # ERR line is, phrase the message must contain)
CASES = [
    (k_while, k_while, "while loops are not supported"),
    (k_print, k_print, "print is not supported"),
    (k_plain_call, k_plain_call, "`plain_double` is a plain Python function and cannot take runtime values"),
    (k_and, k_and, "`and`/`or` need compile-time values"),
    (k_or, k_or, "`and`/`or` need compile-time values"),
    (k_chained, k_chained, "chained comparisons of runtime values are not supported"),
    (k_loop_local, k_loop_local, "name `last` is not defined (a variable first assigned inside a runtime loop"),
    (k_non_pow2, k_non_pow2, "register array dimensions must be powers of two"),
    (k_store_dtype, k_store_dtype, "storing float16 into out, a float32 reference"),
    (k_rank, k_rank, "x2d has rank 2 but is indexed with 1 indices"),
    (k_ds_runtime_size, k_ds_runtime_size, "ds size must be a positive static int (a constexpr)"),
    (k_full_slice, k_full_slice, "slice of axis 0 of x needs static bounds"),
    (k_recursive, forever, "recursion is not supported"),
    (k_returns_value, k_returns_value, "a kernel cannot return a value"),
    (k_try, k_try, "`Try` statements are not supported"),
    (k_with, k_with, "`with` statements in a kernel open mgjit scopes only"),
    (k_lambda, k_lambda, "`Lambda` expressions are not supported"),
    (k_nonlocal_global, k_nonlocal_global, "`Global` statements are not supported"),
]


def compile_args(kernel):
    x = torch.zeros(64, 1024) if kernel is k_rank else torch.zeros(4096)
    return (x, torch.zeros(4096), 4096), {"BLOCK": 1024}


def assert_error_at(excinfo, where, phrase):
    err = excinfo.value
    line = err_line(where)
    text = str(err)
    assert f"{THIS_FILE}:{line}" in text, f"expected {THIS_FILE}:{line} in:\n{text}"
    assert phrase in text, f"expected {phrase!r} in:\n{text}"
    assert err.loc is not None and err.loc.file == THIS_FILE and err.loc.line == line
    # The message quotes the offending source line itself.
    assert linecache.getline(THIS_FILE, line).strip() in text


@pytest.mark.parametrize("kernel,where,phrase", CASES, ids=[c[0].name for c in CASES])
def test_construct_outside_language(kernel, where, phrase):
    args, kwargs = compile_args(kernel)
    with pytest.raises(mgjit.CompileError) as excinfo:
        kernel.compile(*args, target="sm_90a", **kwargs)
    assert_error_at(excinfo, where, phrase)


RETURN_CASES = [(k_return_in_if, "return inside a runtime `if` is not supported"),
                (k_return_in_loop, "return inside a runtime loop is not supported")]


@pytest.mark.parametrize("kernel,phrase", RETURN_CASES, ids=["if", "for"])
def test_return_inside_runtime_control_flow_points_at_the_return(kernel, phrase):
    args, kwargs = compile_args(kernel)
    with pytest.raises(mgjit.CompileError) as excinfo:
        kernel.compile(*args, target="sm_90a", **kwargs)
    assert_error_at(excinfo, kernel, phrase)


# ------------------------------------------------------------------------------------------ what is allowed

@mgjit.kernel
def k_static_python(x, out, MODE: mgjit.constexpr, BLOCK: mgjit.constexpr):
    """Python on compile-time values is ordinary Python: and/or, not, tuples, helpers, static asserts."""
    assert BLOCK % 128 == 0, "BLOCK must be a multiple of 128"
    half = BLOCK // 2
    sizes = (half, half)
    v = x[mgjit.ds(0, sizes[0] + sizes[1])]
    if MODE == "scale" and not BLOCK < 128 or MODE == "never":
        v = v * 3.0
    out[mgjit.ds(0, BLOCK)] = v


def test_compile_time_python_is_folded():
    x = torch.zeros(4096)
    c = k_static_python.compile(x, x, MODE="scale", BLOCK=256, target="sm_90a")
    ir_text = c.ir
    assert "load {sizes=(256,)" in ir_text
    assert "binary {kind=mul}" in ir_text and "value=3.0" in ir_text
    assert "if" not in op_names(ir_text)  # the `if` on constexprs left no trace in the IR
    c2 = k_static_python.compile(x, x, MODE="copy", BLOCK=256, target="sm_90a")
    assert "value=3.0" not in c2.ir


def test_static_assert_names_its_line():
    x = torch.zeros(4096)
    with pytest.raises(mgjit.CompileError) as excinfo:
        k_static_python.compile(x, x, MODE="scale", BLOCK=192, target="sm_90a")
    lines, first = inspect.getsourcelines(k_static_python.fn)
    line = first + next(i for i, s in enumerate(lines) if s.strip().startswith("assert BLOCK"))
    assert f"{THIS_FILE}:{line}" in str(excinfo.value)
    assert "static assertion failed: BLOCK must be a multiple of 128" in str(excinfo.value)


@mgjit.kernel
def k_static_chained(x, out, BLOCK: mgjit.constexpr):
    assert 0 < BLOCK <= 4096
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)]


def test_chained_comparison_of_constexprs_is_python():
    x = torch.zeros(4096)
    c = k_static_chained.compile(x, x, BLOCK=1024, target="sm_90a")
    assert "load {sizes=(1024,)" in c.ir


def test_launch_without_gpu_is_a_clear_error():
    x = torch.zeros(4096)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(mgjit.LaunchError, match="needs a CUDA GPU"):
        k_static_python[(1,)](x, x, MODE="scale", BLOCK=256)


def test_kernel_called_without_grid_is_a_clear_error():
    with pytest.raises(mgjit.LaunchError, match=r"launch k_try with a grid: k_try\[grid\]"):
        k_try(1, 2, 3, BLOCK=4)


def test_argument_binding_errors():
    x = torch.zeros(4096)
    with pytest.raises(mgjit.LaunchError, match="missing the constexpr argument `BLOCK`"):
        k_static_python.compile(x, x, MODE="scale")
    with pytest.raises(mgjit.LaunchError, match="has no parameter `BLOK`"):
        k_static_python.compile(x, x, MODE="scale", BLOCK=256, BLOK=3)
    with pytest.raises(mgjit.LaunchError, match="kernels take torch tensors, ints, floats and bools"):
        k_static_python.compile(x, "not a tensor", MODE="scale", BLOCK=256)


# ------------------------------------------------------------------------------------------ indexing a shape

@mgjit.kernel
def k_shape_past_rank(x, out, n, BLOCK: mgjit.constexpr):
    rows = x.shape[2]  # ERR
    out[0] = rows.astype(out.dtype)


@mgjit.kernel
def k_array_shape_past_rank(x, out, n, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, BLOCK)]
    out[0] = v.shape[1] * 1.0  # ERR


@mgjit.kernel
def k_tuple_past_end(x, out, n, BLOCK: mgjit.constexpr):
    sizes = (BLOCK, BLOCK)
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, sizes[2])]  # ERR


# ------------------------------------------------------------------------------------------ range over a float

@mgjit.kernel
def k_range_float(x, out, n, BLOCK: mgjit.constexpr):
    for i in range(1.5):  # ERR
        out[i] = x[i]


@mgjit.kernel
def k_range_runtime_float(x, out, n, BLOCK: mgjit.constexpr):
    for i in range(0, n, x[0]):  # ERR
        out[i] = x[i]


@mgjit.kernel
def k_range_array(x, out, n, BLOCK: mgjit.constexpr):
    for i in range(mgjit.arange(BLOCK)):  # ERR
        out[i] = x[i]


@mgjit.kernel
def k_static_range_float(x, out, n, BLOCK: mgjit.constexpr):
    for i in mgjit.static_range(BLOCK / 2):  # ERR
        out[i] = x[i]


# (kernel, phrase): issue 14's bare IndexError (item 9) and silently truncated range bounds (item 10)
INDEX_AND_RANGE_CASES = [
    (k_shape_past_rank, "`x` has 1 dimension, got index 2 of its shape"),
    (k_array_shape_past_rank, "the runtime value has 1 dimension, got index 1 of its shape"),
    (k_tuple_past_end, "index 2 is out of range for a tuple of 2 elements"),
    (k_range_float, "range bounds must be integers, got float 1.5"),
    (k_range_runtime_float, "range bounds must be integer scalars, got a runtime float32"),
    (k_range_array, "range bounds must be integer scalars, got an array of shape (1024,)"),
    (k_static_range_float, "static_range bounds must be integers"),
]


@pytest.mark.parametrize("kernel,phrase", INDEX_AND_RANGE_CASES, ids=[c[0].name for c in INDEX_AND_RANGE_CASES])
def test_an_index_past_a_shape_or_a_float_range_bound_is_a_compile_error(kernel, phrase):
    test_construct_outside_language(kernel, kernel, phrase)


@mgjit.device
def wait_for(bars, i):
    bars[i].wait()


@mgjit.kernel(num_warpgroups=2)
def helper_waits(x, out):
    """A helper waits on the caller's barrier; the phase it leaves is the one the caller waits on next (a stale
    phase would pass the second wait at once and read the tile before it is rewritten)."""
    ready = mgjit.barrier(1)
    done = mgjit.barrier(1)
    tile = mgjit.smem((128,), mgjit.float32)
    if mgjit.warpgroup_id() == 0:
        tile[...] = x[mgjit.ds(0, 128)]
        ready[0].arrive()
        done[0].wait()
        tile[...] = x[mgjit.ds(0, 128)] * 2.0
        ready[0].arrive()
    else:
        wait_for(ready, 0)  # phase 0
        out[mgjit.ds(0, 128)] = tile[...]
        done[0].arrive()
        wait_for(ready, 0)  # phase 1
        out[mgjit.ds(128, 128)] = tile[...]


def test_a_helper_waits_on_the_callers_barriers():
    x = torch.randn(128)
    out = torch.full((256,), float("nan"))
    helper_waits.interpret[(1,)](x, out)
    assert torch.equal(out, torch.cat([x, x * 2]))


# ------------------------------------------------------------------------------------------ tuples carried

@mgjit.kernel
def k_carry_tuples(x, out):
    """Running (sum, (count of positives, max)) over the rows of x, carried as a nested tuple."""
    acc = (mgjit.zeros((128,), mgjit.float32), (0, mgjit.full((128,), -1e30, mgjit.float32)))
    for i in range(x.shape[0]):
        v = x[i, mgjit.ds(0, 128)]
        acc = (acc[0] + v, (acc[1][0] + (v > 0.0).astype(mgjit.int32).sum(), mgjit.maximum(acc[1][1], v)))
    out[0, mgjit.ds(0, 128)] = acc[0]
    out[1, mgjit.ds(0, 128)] = acc[1][1]
    out[2, 0] = acc[1][0].astype(mgjit.float32)


@mgjit.kernel
def k_tuple_grows(x, out):
    acc = (mgjit.zeros((128,), mgjit.float32), 0.0)
    for i in range(x.shape[0]):
        acc = (acc[0], acc[1], 1.0)  # ERR
    out[0, mgjit.ds(0, 128)] = acc[0]


@mgjit.kernel
def k_tuple_reshapes(x, out):
    acc = (mgjit.zeros((128,), mgjit.float32), (0.0, 0.0))
    for i in range(x.shape[0]):
        acc = (acc[0], (acc[1][0], x[i, mgjit.ds(0, 128)]))  # ERR
    out[0, mgjit.ds(0, 128)] = acc[0]


def test_a_runtime_loop_carries_tuples():
    """A tuple (nested, of arrays and numbers) assigned in a runtime loop is carried element by element: the
    interpreter's result matches torch on fresh inputs, and its PTX compiles; a tuple that changes length or an
    element that changes shape is an error naming the element and the loop's line."""
    x = torch.randn(7, 128)
    out = torch.full((3, 128), float("nan"))
    k_carry_tuples.interpret[(1,)](x, out)
    assert torch.allclose(out[0], x.sum(0), atol=1e-5)
    assert torch.equal(out[1], x.max(0).values)
    assert out[2, 0].item() == (x > 0).sum().item()
    assert k_carry_tuples.compile(x, out, target="sm_90a").spills == 0
    loop = err_line(k_tuple_grows) - 1
    with pytest.raises(mgjit.CompileError, match=rf"{THIS_FILE}:{loop}.*`acc` is a tuple of 2 before the loop "
                                                 r"but a tuple of 3 in it"):
        k_tuple_grows.compile(x, out, target="sm_90a")
    with pytest.raises(mgjit.CompileError, match=r"`acc\[1\]\[1\]` changes shape in the loop from \(\) to \(128,\)"):
        k_tuple_reshapes.compile(x, out, target="sm_90a")


@mgjit.kernel
def k_branches_disagree(x, out):
    v = mgjit.zeros((128,), mgjit.float32)
    if x[0] > 0.0:  # ERR
        v = x[mgjit.ds(0, 128)]
    else:
        v = mgjit.zeros((64,), mgjit.float32)
        out[mgjit.ds(0, 64)] = v
    out[mgjit.ds(0, 128)] = v


def test_branches_that_leave_a_value_in_two_shapes_are_an_error_at_the_if():
    """Named at the `if`, not at whichever line was traced last."""
    x, out = torch.randn(128), torch.empty(128)
    with pytest.raises(mgjit.CompileError, match=rf"{THIS_FILE}:{err_line(k_branches_disagree)}.*`v` has shape "
                                                 r"\(128,\) on one branch and \(64,\) on the other"):
        k_branches_disagree.compile(x, out, target="sm_90a")


# ------------------------------------------------------------------------------------------ scalars from full

@mgjit.kernel
def k_scalar_from_full(x, out):
    """mgjit.full((), v) and mgjit.zeros(()) are runtime scalars: usable where a scalar is (a splat operand of
    mgjit.where, a value carried through a loop, a cast)."""
    fill = mgjit.full((), 0.5, mgjit.float32)
    count = mgjit.zeros((), mgjit.int32)
    for i in range(x.shape[0]):
        fill = fill + x[i, 0]
        count = count + 1
    v = x[0, mgjit.ds(0, 128)]
    out[mgjit.ds(0, 128)] = mgjit.where(v > 0.0, fill.astype(mgjit.bfloat16).astype(mgjit.float32), v)
    out[128] = count.astype(mgjit.float32)


def test_full_of_an_empty_shape_is_a_scalar():
    """Shape () gave a 0-d array that mgjit.where refused with an internal 'splat takes a scalar'."""
    x = torch.randn(5, 128)
    out = torch.full((129,), float("nan"))
    k_scalar_from_full.interpret[(1,)](x, out)
    fill = (0.5 + x[:, 0].sum()).to(torch.bfloat16).float()
    assert torch.equal(out[:128], torch.where(x[0] > 0, fill, x[0]))
    assert out[128].item() == 5
    k_scalar_from_full.compile(x, out, target="sm_90a")

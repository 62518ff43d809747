"""CPU tests of the IR: what the frontend builds (constexpr folding, structured control flow), what the
printer shows (ops, attributes, layouts, source lines) and what the verifier rejects.

The frontend and layout inference are driven directly here (frontend.trace, infer.infer_layouts), so these
tests need neither MLIR nor ptxas, except the one that checks CompiledKernel.ir against them.
"""
import inspect

import pytest

import mgjit
from mgjit import dtypes, frontend, infer, ir, ops
from mgjit.errors import CompileError, Loc

torch = pytest.importorskip("torch")

F32 = dtypes.float32


def line_of(kernel, text: str) -> int:
    """The absolute line number of the first source line of `kernel` that contains `text`."""
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def trace(kernel, params, consts, num_warpgroups=1, layouts=True) -> ir.Kernel:
    k = frontend.trace(mgjit.source.SourceFunction(kernel.fn), params, consts, num_warpgroups)
    if layouts:
        infer.infer_layouts(k)
    return k


def tensor(name, rank, dtype=F32):
    return ir.Param(name, "tensor", dtype, rank)


@mgjit.kernel
def scale_kernel(x, out, MODE: mgjit.constexpr, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * (BLOCK * 2)
    v = x[mgjit.ds(start, BLOCK * 2)]
    if MODE == "double":
        v = v * 2.0
    else:
        v = v + 1.0
    out[mgjit.ds(start, BLOCK * 2)] = v


# spread((128,), float32), the load placed for its store: one element a thread (blocked's 16-byte vectors of 4
# would cover the 128 elements with one warp's lanes, the other 3 warps holding copies).
B128 = "TiledLayout(Tiling((128)(32)(1)), warp_dims=(-3,), lane_dims=(-2,), vector_dim=-1)"

SCALE_IR = """\
kernel @scale_kernel(%0: ref<gmem, float32, rank 1> (x), %1: ref<gmem, float32, rank 1> (out)) warpgroups=1 {{
  %2 = program_id {{axis=0}}() : int32  # line {l_start}
  %3 = constant {{value=128}}() : int32  # line {l_start}
  %4 = binary {{kind=mul}}(%2, %3) : int32  # line {l_start}
  %5 = load {{sizes=(128,), squeeze=(0,)}}(%0, %4) : float32[128] {B128}  # line {l_load}
  %6 = constant {{value=2.0}}() : float32  # line {l_mul}
  %7 = splat(%6) : float32[128] SplatLayout()  # line {l_mul}
  %8 = binary {{kind=mul}}(%5, %7) : float32[128] {B128}  # line {l_mul}
  store {{sizes=(128,), squeeze=(0,)}}(%1, %4, %8)  # line {l_store}
}}"""


def scale_ir(mode="double", layouts=True) -> ir.Kernel:
    return trace(scale_kernel, [tensor("x", 1), tensor("out", 1)], {"MODE": mode, "BLOCK": 64}, layouts=layouts)


def test_printer_text_of_a_small_kernel():
    """Constexprs fold (BLOCK * 2 is the constant 128, the `if MODE` leaves only its taken branch), every
    array shows its inferred layout, and every op the line it came from."""
    expected = SCALE_IR.format(
        B128=B128, l_start=line_of(scale_kernel, "start ="), l_load=line_of(scale_kernel, "v = x["),
        l_mul=line_of(scale_kernel, "v * 2.0"), l_store=line_of(scale_kernel, "out[mgjit.ds"))
    assert ir.format_kernel(scale_ir()) == expected


def test_printer_without_layouts_and_before_inference():
    before = ir.format_kernel(scale_ir(layouts=False))
    assert "Layout" not in before
    assert "%5 = load {sizes=(128,), squeeze=(0,)}(%0, %4) : float32[128]  # line" in before
    k = scale_ir()
    assert ir.format_kernel(k, layouts=False) == before
    assert ir.format_kernel(k) != before


def test_other_constexpr_takes_the_other_branch():
    text = ir.format_kernel(scale_ir(mode="plus"))
    assert "binary {kind=add}(%5, %7) : float32[128]" in text
    assert "value=1.0" in text
    assert "value=2.0" not in text and "kind=mul}(%5" not in text


def test_renumbering_is_stable():
    """Value ids are global counters; the printer renumbers from %0 so two traces print the same text."""
    assert ir.format_kernel(scale_ir()) == ir.format_kernel(scale_ir())


@mgjit.kernel
def loop_if_kernel(x, out, n, BLOCK: mgjit.constexpr):
    row = mgjit.program_id(0)
    acc = mgjit.zeros((BLOCK,), mgjit.float32)
    for j in range(0, n, BLOCK):
        acc += x[row, mgjit.ds(j, BLOCK)]
    total = acc.sum()
    if row % 2 == 0:
        total = total * 2.0
    out[row] = total


def loop_if_ir():
    return trace(loop_if_kernel, [tensor("x", 2), tensor("out", 1), ir.Param("n", "scalar", dtypes.int32)],
                 {"BLOCK": 256})


def test_structured_control_flow_in_the_printer():
    text = ir.format_kernel(loop_if_ir())
    lines = text.splitlines()
    assert lines[0] == ("kernel @loop_if_kernel(%0: ref<gmem, float32, rank 2> (x), %1: ref<gmem, float32, rank 1> "
                        "(out), %2: int32 (n)) warpgroups=1 {")
    # The loop carries `acc` (a float32[256]); its region's arguments are the induction variable and `acc`.
    for_line = next(line for line in lines if " = for(" in line)
    assert for_line.strip().startswith("%9 = for(%6, %2, %7, %8) : float32[256] TiledLayout(")
    assert for_line.endswith(f"# line {line_of(loop_if_kernel, 'for j in')}")
    region = lines[lines.index(for_line) + 1].strip()
    assert region.startswith("^region0(%10: int32, %11: float32[256] TiledLayout(")
    # The zeros splat is carried into a tiled loop: an explicit (free) relayout, visible in the IR.
    assert any(line.strip().startswith("%8 = relayout(%5)") for line in lines)
    # The runtime `if` yields the new `total` on one branch and the old one on the other.
    if_at = next(i for i, line in enumerate(lines) if " = if(" in line)
    assert lines[if_at + 1].strip() == "^region0():"
    assert "^region1():" in [line.strip() for line in lines[if_at:]]
    assert [line.strip().split("  #")[0] for line in lines if "yield(" in line] == ["yield(%13)", "yield(%21)",
                                                                                     "yield(%14)"]


def test_if_op_carries_the_line_of_the_if_statement():
    k = loop_if_ir()
    (if_op,) = [op for op in k.walk() if isinstance(op, ops.If)]
    assert if_op.loc.line == line_of(loop_if_kernel, "if row % 2")


@mgjit.kernel
def two_reductions(x, out, B: mgjit.constexpr):
    t = x[mgjit.ds(0, B), mgjit.ds(0, B)]
    out[mgjit.ds(0, B)] = t.sum(axis=1) + t.max(axis=0)


def test_layout_conflict_inserts_a_visible_relayout():
    """A row sum and a column max of one tile live in different layouts: adding them moves one of them."""
    k = trace(two_reductions, [tensor("x", 2), tensor("out", 1)], {"B": 32})
    body = list(k.walk())
    (relayout,) = [op for op in body if isinstance(op, ops.Relayout)]
    row_sum, col_max = [op for op in body if isinstance(op, ops.Reduce)]
    assert relayout.operands[0] is col_max.result
    assert relayout.result.layout == row_sum.result.layout != col_max.result.layout
    add = next(op for op in body if isinstance(op, ops.Binary) and op.kind == "add")
    assert add.operands == [row_sum.result, relayout.result]
    assert "%7 = relayout(%6) : float32[32] TiledLayout(" in ir.format_kernel(k)


def test_compiled_kernel_ir_is_the_inferred_ir():
    x = torch.zeros(4096)
    c = scale_kernel.compile(x, x, MODE="double", BLOCK=64, target="sm_90a")
    assert c.ir == ir.format_kernel(scale_ir())


# ------------------------------------------------------------------------------------------ verifier

LOC = Loc("hand_written.py", 7, 0, "hand")


def hand_kernel(*ops: ir.Op, args=()) -> ir.Kernel:
    body = ir.Block()
    body.ops = list(ops)
    return ir.Kernel("hand", [], list(args), body, 1, Loc("hand_written.py", 1, 0, "hand"))


def test_verifier_accepts_well_formed_ir():
    a = ops.Constant(1, dtypes.int32, LOC)
    b = ops.Constant(2, dtypes.int32, LOC)
    add = ops.Binary("add", a.result, b.result, LOC)
    ir.verify(hand_kernel(a, b, add))
    text = ir.format_kernel(hand_kernel(a, b, add))
    assert text.splitlines()[3] == "  %2 = binary {kind=add}(%0, %1) : int32  # line 7"


def test_verifier_rejects_use_before_definition():
    a = ops.Constant(1, dtypes.int32, LOC)
    add = ops.Binary("add", a.result, a.result, LOC)
    with pytest.raises(CompileError, match="is not defined before its use") as excinfo:
        ir.verify(hand_kernel(add, a))
    assert str(excinfo.value).startswith("hand_written.py:7 (in hand): internal error: operand %")


def test_verifier_rejects_a_value_used_outside_its_region():
    """A value defined inside a loop body is not visible after the loop."""
    lo, hi, step = (ops.Constant(v, dtypes.int32, LOC) for v in (0, 4, 1))
    loop = ops.For(lo.result, hi.result, step.result, [], LOC)
    inner = ops.Binary("add", loop.body.args[0], loop.body.args[0], LOC)
    loop.body.ops = [inner, ops.Yield([], LOC)]
    ok = hand_kernel(lo, hi, step, loop)
    ir.verify(ok)
    after = ops.Binary("mul", inner.result, inner.result, LOC)
    with pytest.raises(CompileError, match="not defined before its use"):
        ir.verify(hand_kernel(lo, hi, step, loop, after))


def test_verifier_rejects_mismatched_binary_dtypes():
    a = ops.Constant(1, dtypes.int32, LOC)
    b = ops.Constant(2.0, dtypes.float32, LOC)
    add = ops.Binary("add", a.result, b.result, LOC)
    with pytest.raises(CompileError, match="operand dtypes differ: int32 and float32") as excinfo:
        ir.verify(hand_kernel(a, b, add))
    assert excinfo.value.loc == LOC


def test_verifier_rejects_other_malformed_ops():
    i = ops.Constant(1, dtypes.int32, LOC)
    f = ops.Constant(1.0, dtypes.float32, LOC)
    with pytest.raises(CompileError, match="xor needs integer operands, got float32"):
        ir.verify(hand_kernel(f, ops.Binary("xor", f.result, f.result, LOC)))
    with pytest.raises(CompileError, match="exp needs a floating-point operand, got int32"):
        ir.verify(hand_kernel(i, ops.Unary("exp", i.result, LOC)))
    with pytest.raises(CompileError, match="program_id axis must be 0, 1 or 2, got 3"):
        ir.verify(hand_kernel(ops.ProgramId(3, LOC)))
    ref = ir.Value(ir.RefType("gmem", dtypes.float32, 2))
    arr = ops.Splat(f.result, (8, 4), LOC)
    store = ops.Store(ref, [i.result, i.result], (8, 8), (False, False), [arr.result], LOC)
    with pytest.raises(CompileError, match=r"storing an array of shape \(8, 4\) into a window of shape \(8, 8\)"):
        ir.verify(hand_kernel(i, f, arr, store, args=[ref]))
    sides = ops.Store(ref, [i.result, i.result], (8, 9), (False, False), [arr.result, arr.result], LOC,
                      column_starts=[i.result])
    with pytest.raises(CompileError, match=r"side by side fill the window's last axis of 9, got widths \[4, 4\]"):
        ir.verify(hand_kernel(i, f, arr, sides, args=[ref]))
    missing = ops.Store(ref, [i.result, i.result], (8, 8), (False, False), [arr.result, arr.result], LOC)
    with pytest.raises(CompileError, match="expected a column start for each of the 2 arrays but the first, got 0"):
        ir.verify(hand_kernel(i, f, arr, missing, args=[ref]))
    load = ops.Load(ref, [i.result], (8,), (False,), LOC)
    with pytest.raises(CompileError, match="a reference of rank 2 needs 2 indices, got 1"):
        ir.verify(hand_kernel(i, f, load, args=[ref]))

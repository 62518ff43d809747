"""Scoped SMEM (`with mgjit.scoped_smem(...) as buf:`): where the plan puts each buffer (later scopes over the
bytes of ended ones, the branches of an `if` apart), the budget counting the most that is open at once, a
buffer used after its block is an error at the line, and the interpreter's check that a warpgroup entering a
scope knows every other warpgroup left the scopes it reuses."""
import inspect

import pytest

import mgjit
from mgjit import dtypes, frontend, ir, ops
from mgjit.ops.smem_scopes import scope_plan, smem_plan
from mgjit.source import SourceFunction

torch = pytest.importorskip("torch")
BF16 = torch.bfloat16


def line_of(kernel, text: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def traced(kernel, num_warpgroups: int = 1) -> ir.Kernel:
    params = [ir.Param("x", "tensor", dtypes.bfloat16, 2), ir.Param("flag", "scalar", dtypes.int32)]
    return frontend.trace(SourceFunction(kernel.fn), params, {}, num_warpgroups)


def scoped_offsets(kernel: ir.Kernel) -> dict[int, int]:
    """The arena offset of each scoped buffer, by the line that opened its block."""
    plan = scope_plan(kernel)
    return {op.loc.line: plan.offsets[id(op)] for op in kernel.walk() if isinstance(op, ops.ScopedSmemAlloc)}


@mgjit.kernel
def nested(x, flag):
    with mgjit.scoped_smem((64, 64), mgjit.bfloat16, swizzle=128) as a:           # A: 8 KiB at 0
        a[...] = mgjit.zeros((64, 64), mgjit.bfloat16)
        with mgjit.scoped_smem((8, 16), mgjit.float32) as b:                        # B: inside A, after it
            b[...] = mgjit.zeros((8, 16), mgjit.float32)
    with mgjit.scoped_smem((32, 64), mgjit.bfloat16, swizzle=128) as c:            # C: A's bytes again
        c[...] = mgjit.zeros((32, 64), mgjit.bfloat16)
    if flag > 0:
        with mgjit.scoped_smem((16, 64), mgjit.bfloat16, swizzle=128) as d:        # D: a branch, at 0
            d[...] = mgjit.zeros((16, 64), mgjit.bfloat16)
    else:
        with mgjit.scoped_smem((16, 64), mgjit.bfloat16, swizzle=128) as e:        # E: after D (concurrent)
            e[...] = mgjit.zeros((16, 64), mgjit.bfloat16)


def test_the_plan_reuses_ended_scopes_and_keeps_branches_apart():
    kernel = traced(nested)
    lines = {name: line_of(nested, f"as {name}:") for name in "abcde"}
    offsets = scoped_offsets(kernel)
    assert offsets[lines["a"]] == 0 and offsets[lines["b"]] == 8192  # b nests inside a's block
    assert offsets[lines["c"]] == 0  # after a's block: its bytes
    assert offsets[lines["d"]] == 0 and offsets[lines["e"]] == 2048  # either branch may run beside the other
    assert scope_plan(kernel).size == 8192 + 8 * 16 * 4  # the most open at once: a and b
    buffers, size = smem_plan(kernel)
    assert size == scope_plan(kernel).size  # the interpreter's SMEM: the arena alone


@mgjit.kernel
def used_after(x, flag):
    with mgjit.scoped_smem((64, 64), mgjit.bfloat16, swizzle=128) as a:
        a[...] = mgjit.zeros((64, 64), mgjit.bfloat16)
        view = a[0:8]
    x[mgjit.ds(0, 8), mgjit.ds(0, 64)] = view[...]  # ERR


def test_a_buffer_used_after_its_block_is_an_error_at_the_line():
    with pytest.raises(mgjit.CompileError) as info:
        traced(used_after)
    assert info.value.loc.line == line_of(used_after, "# ERR")
    assert f"`with mgjit.scoped_smem(...)` at line {line_of(used_after, 'as a:')} after that block ended" \
        in str(info.value)


@mgjit.kernel
def not_a_scope(x, flag):
    buf = mgjit.scoped_smem((64, 64), mgjit.bfloat16)


def test_scoped_smem_outside_a_with_is_an_error():
    with pytest.raises(mgjit.CompileError, match=r"opens a `with` block: `with mgjit.scoped_smem\(...\):`"):
        traced(not_a_scope)


@mgjit.kernel(num_warpgroups=2)
def two_phases(x, out, SYNC: mgjit.constexpr):
    """Both warpgroups fill their half of a scoped tile and write it out, then do the same in a second scope
    over the same bytes; with SYNC an mbarrier that both arrive on orders the first block's end before the
    second's start."""
    wg = mgjit.warpgroup_id()
    bars = mgjit.barrier(1, arrivals=2)
    with mgjit.scoped_smem((2, 64, 64), x.dtype, swizzle=128) as first:
        first[wg][...] = x[mgjit.ds(wg * 64, 64), mgjit.ds(0, 64)]
        out[mgjit.ds(wg * 64, 64), mgjit.ds(0, 64)] = first[wg][...]
    if SYNC:
        bars[0].arrive()
        bars[0].wait()
    with mgjit.scoped_smem((2, 64, 64), x.dtype, swizzle=128) as second:
        second[1 - wg][...] = x[mgjit.ds(wg * 64, 64), mgjit.ds(64, 64)]
    out[mgjit.ds(wg * 64, 64), mgjit.ds(64, 64)] = x[mgjit.ds(wg * 64, 64), mgjit.ds(64, 64)]


@pytest.mark.parametrize("policy,seed", [("late", 0), ("eager", 0), ("random", 1)])
def test_warpgroups_reusing_scoped_bytes_must_be_ordered(policy, seed):
    x = torch.randn(128, 128, dtype=BF16)
    out = torch.full_like(x, float("nan"))
    two_phases.interpret(policy=policy, seed=seed)[(1,)](x, out, SYNC=True)
    assert torch.equal(out, x)
    with pytest.raises(mgjit.InterpretError) as info:
        two_phases.interpret(policy=policy, seed=seed)[(1,)](x, out, SYNC=False)
    # Whichever warpgroup the schedule runs first, the other's entry (into either scope) is the unordered one.
    lines = {info.value.loc.line} | {loc.line for loc in info.value.related}
    assert info.value.check == "smem-scope" and {line_of(two_phases, "as first:"),
                                                 line_of(two_phases, "as second:")} <= lines

"""Running a kernel's IR on the CPU: exact numerics on torch tensors, and a checker for races and deadlocks.

`kernel.interpret[grid](...)` (or `kernel[grid](...)` under MGJIT_INTERPRET=1) traces and infers the kernel the
way the compiler does and runs that IR: each warpgroup of each CTA is a coroutine, register arrays are torch
tensors of their logical shape, SMEM is bytes laid out as the hardware lays them out (swizzle, TMA boxes, MMA
descriptors), TMEM is 128 x 512 cells written by the MMA data paths and read by tcgen05.ld's shapes, and async
copies and MMAs complete when the scheduler chooses (scheduler.py). Races, deadlocks, barrier miscounts and
out-of-bounds accesses are `mgjit.InterpretError`s naming the kernel's lines (checker.py).

This module is the registry: each op family registers `@interpret.rule(OpClass)` beside its other rules in
`mgjit/ops/`. A rule takes (op, warpgroup) and either returns None or is a generator that yields
`scheduler.Wait`s where the warpgroup may block.

| module | job |
| --- | --- |
| `launch.py` | binding a call, building the IR, moving tensors, running the grid cluster by cluster |
| `scheduler.py` | warpgroup coroutines, async operations and when they complete, deadlocks |
| `machine.py` | SMEM bytes, mbarriers, tensor memory, the register pool, CTA and cluster barriers |
| `checker.py` | vector clocks and the ordering checks on SMEM and TMEM accesses |
| `numerics.py` | dtypes as torch dtypes, casts, elements as bits |
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..registry import RuleRegistry

if TYPE_CHECKING:
    from .launch import Interpreter

InterpretRule = Callable[..., Any]
RULES: RuleRegistry[InterpretRule] = RuleRegistry("interpreter")
rule = RULES.rule


def interpreter(kernel: Any) -> Interpreter:
    """`kernel.interpret`: an object that runs `kernel` on the CPU, `interpreter(kernel)[grid](*args)`."""
    from .launch import Interpreter
    return Interpreter(kernel)

"""`for k, *tiles in mgjit.pipeline(steps, mgjit.tile(...), ..., stages, release, warp_specialize,
registers)`: a TMA → SMEM ring of `stages` slots feeding the loop body, traced straight through the tracer's
loop and branch machinery (the user's body is traced in place, once).

Without warp specialization: a prologue fills stages - release slots; step k waits for its slot, runs the body,
waits for all but `release` wgmma groups and refills the slot of step k - release (whose MMAs are now done) with
step k - release + stages. With it, warpgroup 0
produces (waiting for a slot to be released, then copying) and the others consume (releasing the slot of
step k - release after each wait); the producer then skips the rest of the block the loop is in (the code
after it runs in the consumers only: an epilogue stores what the consumers computed, and the producer, which
computed nothing, stores nothing).
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Any, Callable

from ... import language as lang
from ...errors import Rule
from ..control import ControlFlow, assigned_names
from ..registry import builtin, loop
from ..semantics import Semantics
from ..values import BarrierSlot, Expanded, Ref, Tensor
from .barriers import arrive, barrier, wait
from .smem import index as smem_index, smem
from .tma import copy_async
from .warpgroups import set_max_registers, warpgroup_id
from .wgmma import wgmma_wait


@dataclasses.dataclass(frozen=True)
class TileSpec:
    """mgjit.tile(...): the block of `tensor` at origin + k * step, for mgjit.pipeline."""

    tensor: Ref
    origin: tuple
    block: tuple[int, ...]
    step: tuple[int, ...]
    swizzle: int | None


@builtin(lang.tile)
def tile(t: Semantics, args: list, kwargs: dict) -> TileSpec:
    names = ("tensor", "origin", "block", "step", "swizzle")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise t.error(f"tile() got an unexpected or repeated argument `{k}`")
        bound[k] = v
    if not {"tensor", "origin", "block", "step"} <= set(bound):
        raise t.error("tile(tensor, origin, block, step, swizzle=None) needs the first four arguments")
    tensor = bound["tensor"]
    if not isinstance(tensor, Ref):
        raise t.error("tile() takes a tensor argument of the kernel")
    origin, block, step = (tuple(bound[k]) if isinstance(bound[k], (tuple, list)) else (bound[k],)
                           for k in ("origin", "block", "step"))
    if not len(origin) == len(block) == len(step) == tensor.ndim:
        raise t.error(f"tile() needs origin, block and step of rank {tensor.ndim} for {tensor.name}")
    if not all(isinstance(x, int) and x > 0 for x in block) or not all(isinstance(x, int) for x in step):
        raise t.error("tile() block and step must be static ints (constexprs)")
    swizzle = bound.get("swizzle")
    if swizzle is None:
        row = block[-1] * tensor.dtype.bits // 8
        swizzle = next((sw for sw in (128, 64, 32) if row % sw == 0 and len(block) >= 2 and block[-2] % 8 == 0),
                       None)
    return TileSpec(tensor, origin, block, step, swizzle)


@loop(lang.pipeline)
def pipeline(t: ControlFlow, node: ast.For, args: list, kwargs: dict) -> None:
    unknown = set(kwargs) - {"stages", "release", "warp_specialize", "registers"}
    if unknown:
        raise t.error(f"pipeline() has no argument {sorted(unknown)[0]!r}")
    if len(args) < 2 or not all(isinstance(s, TileSpec) for s in args[1:]):
        raise t.error("pipeline(steps, mgjit.tile(...), ...) takes a step count and at least one tile")
    steps, specs = args[0], args[1:]
    stages = kwargs.get("stages", 2)
    release = kwargs.get("release", 1)
    ws = bool(kwargs.get("warp_specialize", False))
    registers = kwargs.get("registers")
    if not isinstance(stages, int) or stages < 2:
        raise t.error(f"pipeline stages must be a static int >= 2, got {stages!r}")
    if not isinstance(release, int) or not 0 <= release < stages:
        raise t.error(f"pipeline release must be a static int in 0..stages-1, got {release!r}")
    target = node.target
    if not (isinstance(target, ast.Tuple) and len(target.elts) == 1 + len(specs)
            and all(isinstance(e, ast.Name) for e in target.elts)):
        raise t.error(f"write `for k, {', '.join(f'tile{i}' for i in range(len(specs)))} in mgjit.pipeline(...)`: "
                      "one name for the step and one per tile")
    if ws and t.num_warpgroups < 2:
        raise t.error("a warp-specialized pipeline needs num_warpgroups >= 2 (one producer, the rest consume)")
    if ws and registers:
        leaving = sorted(n for n in assigned_names(node.body) if n in t.scope)
        if leaving:
            raise t.error(f"registers={registers} caps the producer warpgroup, but `{leaving[0]}` is carried out "
                          "of the pipeline and would live in the producer too (it would spill); drop registers= "
                          "or keep such values inside the loop body", rule=Rule.REGISTERS)
    full = barrier(t, [stages, len(specs)], {})
    empty = barrier(t, [stages, t.num_warpgroups - 1], {}) if ws else None
    bufs = [smem(t, [(stages, *spec.block), spec.tensor.dtype, spec.swizzle], {}) for spec in specs]
    k_name, tile_names = target.elts[0].id, [e.id for e in target.elts[1:]]
    consumed = assigned_names(node.body) | set(tile_names)

    def here() -> None:  # the ring's own ops are at the `for` statement
        t.at(node)

    def when(cond: Any, then: Callable[[], None]) -> None:
        """`if cond: then()`, decided at compile time or traced as a branch."""
        if isinstance(cond, (Tensor, Expanded)):
            t.branch(cond, then, lambda: None, (), node)
        elif cond:
            then()

    def copies(step: Any, slot: Callable[[], Any]) -> None:
        """Copy the tiles of pipeline step `step` into the slot `slot()` of their buffers."""
        for spec, buf in zip(specs, bufs):
            here()
            coords = tuple(t.apply_binop("add", o, t.apply_binop("mul", step, s))
                           for o, s in zip(spec.origin, spec.step))
            copy_async(t, [spec.tensor, coords, smem_index(t, buf, slot())], {"barrier": BarrierSlot(full, slot())})

    def consume(k: Tensor) -> None:
        """Step k: wait for its slot, bind the tiles, run the body, let `release` wgmma groups run on."""
        here()
        slot = t.apply_binop("mod", k, stages)
        here()
        wait(t, BarrierSlot(full, slot), [], {})
        for name, buf in zip(tile_names, bufs):
            here()
            t.scope[name] = smem_index(t, buf, slot)
        t.run_body(node.body)
        here()
        wgmma_wait(t, [release], {})
        here()
        if ws:  # release the slot of step k - release, whose MMAs are done
            when(t.apply_compare("ge", k, release), lambda: arrive(
                t, BarrierSlot(empty, t.apply_binop("mod", t.apply_binop("sub", k, release), stages)), [], {}))
            return
        following = t.apply_binop("add", k, stages - release)  # into the slot that step k - release used
        here()
        when(t.apply_compare("lt", following, steps),
             lambda: copies(following, lambda: t.apply_binop("mod", following, stages)))

    def produce(k: Tensor) -> None:
        """Step k of the producer warpgroup: wait until the consumers release the slot, then fill it."""
        here()
        slot = t.apply_binop("mod", k, stages)
        here()
        when(t.apply_compare("ge", k, stages), lambda: wait(t, BarrierSlot(empty, slot), [], {}))
        copies(k, lambda: slot)

    def consumer() -> None:
        here()
        t.runtime_loop(node, k_name, t.range_bounds([steps]), consume, consumed)
        here()
        wgmma_wait(t, [0], {})

    if not ws:
        for s in range(stages - release):  # the prologue fills the first stages - release slots
            here()
            when(t.apply_compare("lt", s, steps), lambda: copies(s, lambda: s))
        consumer()
        return
    lo, hi = registers if registers else (None, None)

    def producer() -> None:
        if lo:
            here()
            set_max_registers(t, [lo], {"increase": False})
        here()
        t.runtime_loop(node, None, t.range_bounds([steps]), produce, set())

    def consumers() -> None:
        if hi:
            here()
            set_max_registers(t, [hi], {"increase": True})
        consumer()

    here()
    wg = warpgroup_id(t, [], {})
    t.branch(t.apply_compare("eq", wg, 0), producer, consumers, consumed | {k_name}, node)
    here()
    t.guard_rest(t.apply_compare("ne", wg, 0))

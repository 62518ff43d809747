"""Warpgroups: `mgjit.warpgroup_id()` and `mgjit.set_max_registers(n, increase=...)` (setmaxnreg, for warp
specialization)."""
from __future__ import annotations

from ... import language as lang, ops
from ..registry import builtin
from ..semantics import Semantics
from ..values import Tensor


@builtin(lang.warpgroup_id, positional=(0, 0))
def warpgroup_id(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return t.emit(ops.WarpgroupId(t.builder.loc))


@builtin(lang.set_max_registers, unit="setmaxnreg")
def set_max_registers(t: Semantics, args: list, kwargs: dict) -> None:
    count = args[0] if args else kwargs.get("count")
    increase = kwargs.get("increase", True)
    if not isinstance(count, int):
        raise t.error("set_max_registers takes a static register count")
    t.builder.add(ops.SetMaxRegisters(count, bool(increase), t.builder.loc))

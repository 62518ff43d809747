"""Atomics and semaphores on GMEM (Atomic, SemaphoreWait in ops/atomics.py): `mgjit.atomic_add(x, index, value)`
and its siblings return the old values; `mgjit.semaphore_signal(x, index)` / `mgjit.semaphore_wait(x, index, n)`
order a warpgroup's work across CTAs. `index` is what `x[index]` takes: integers for one element, `mgjit.ds`
windows for an array."""
from __future__ import annotations

from typing import Any

from ... import dtypes, language as lang, ops
from ...errors import Rule
from ...ops.atomics import SCOPES, SEMANTICS
from ..registry import builtin
from ..semantics import Semantics
from ..values import Expanded, Ref, Tensor
from .gmem import window


def _static_choice(t: Semantics, what: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise t.error(f"{what} must be one of {', '.join(repr(c) for c in choices)} (a static string), got "
                      f"{value!r}", rule=Rule.ATOMIC)
    return value


def _target(t: Semantics, name: str, x: Any, index: Any):
    if not isinstance(x, Ref):
        raise t.error(f"mgjit.{name} works on a tensor argument of the kernel (GMEM), got {getattr(x, 'kind', x)!r}")
    return window(t, x, index)


def _operand(t: Semantics, name: str, x: Ref, value: Any, shape: tuple[int, ...], what: str) -> Tensor:
    """`value` as the atomic takes it: of x's dtype (Python numbers convert; arrays must match) and of the
    window's shape (scalars broadcast)."""
    if not isinstance(value, (Tensor, Expanded)):
        value = t.to_tensor(value, x.dtype)
    if value.dtype != x.dtype:
        raise t.error(f"mgjit.{name}: the {what} is {value.dtype.name} but {x.name} holds {x.dtype.name}; convert "
                      f"with .astype({x.name}.dtype)", rule=Rule.ATOMIC)
    if tuple(value.shape) != shape or isinstance(value, Expanded):
        if not shape:
            raise t.error(f"mgjit.{name}: x[index] is one element, so the {what} must be a scalar, got an array "
                          f"of shape {tuple(value.shape)}")
        value = t.broadcast_to(value, shape)
    return value


def _ordering(t: Semantics, kwargs: dict, default_sem: str) -> tuple[str, str]:
    sem = _static_choice(t, "sem", kwargs.get("sem", default_sem), SEMANTICS)
    return sem, _static_choice(t, "scope", kwargs.get("scope", "gpu"), SCOPES)


def _rmw(kind: str):
    name = f"atomic_{kind}"

    def call(t: Semantics, args: list, kwargs: dict) -> Tensor:
        if set(kwargs) - {"sem", "scope"}:
            raise t.error(f"mgjit.{name}(x, index, value, sem='relaxed', scope='gpu') takes sem= and scope=, got "
                          f"{sorted(set(kwargs) - {'sem', 'scope'})}")
        x, index, value = args
        starts, sizes, squeeze = _target(t, name, x, index)
        shape = tuple(s for s, q in zip(sizes, squeeze) if not q)
        sem, scope = _ordering(t, kwargs, "relaxed")
        value = _operand(t, name, x, value, shape, "value")
        return t.emit(ops.Atomic(kind, x.value, starts, sizes, squeeze, value.value, sem, scope, t.builder.loc))
    return call


for _marker, _kind in ((lang.atomic_add, "add"), (lang.atomic_min, "min"), (lang.atomic_max, "max"),
                       (lang.atomic_xchg, "xchg")):
    builtin(_marker, positional=(3, 3))(_rmw(_kind))


@builtin(lang.atomic_cas, positional=(4, 4))
def atomic_cas(t: Semantics, args: list, kwargs: dict) -> Tensor:
    if set(kwargs) - {"sem", "scope"}:
        raise t.error("mgjit.atomic_cas(x, index, compare, value, sem='relaxed', scope='gpu') takes sem= and scope=")
    x, index, compare, value = args
    starts, sizes, squeeze = _target(t, "atomic_cas", x, index)
    shape = tuple(s for s, q in zip(sizes, squeeze) if not q)
    sem, scope = _ordering(t, kwargs, "relaxed")
    compare = _operand(t, "atomic_cas", x, compare, shape, "compare value")
    value = _operand(t, "atomic_cas", x, value, shape, "value")
    return t.emit(ops.Atomic("cas", x.value, starts, sizes, squeeze, value.value, sem, scope, t.builder.loc,
                             compare=compare.value))


def _cell(t: Semantics, name: str, x: Any, index: Any):
    starts, sizes, squeeze = _target(t, name, x, index)
    if not all(squeeze):
        raise t.error(f"mgjit.{name} works on one int32 cell: index it with integers, not mgjit.ds windows")
    if x.dtype != dtypes.int32:
        raise t.error(f"mgjit.{name}: a semaphore is an int32 cell, {x.name} holds {x.dtype.name}", rule=Rule.ATOMIC)
    return starts, sizes, squeeze


@builtin(lang.semaphore_signal, positional=(2, 3))
def semaphore_signal(t: Semantics, args: list, kwargs: dict) -> None:
    if set(kwargs) - {"inc", "scope"}:
        raise t.error("mgjit.semaphore_signal(x, index, inc=1, scope='gpu') takes inc= and scope=")
    x, index = args[:2]
    inc = args[2] if len(args) > 2 else kwargs.get("inc", 1)
    starts, sizes, squeeze = _cell(t, "semaphore_signal", x, index)
    scope = _static_choice(t, "scope", kwargs.get("scope", "gpu"), SCOPES)
    inc = _operand(t, "semaphore_signal", x, inc, (), "increment")
    t.builder.add(ops.Atomic("add", x.value, starts, sizes, squeeze, inc.value, "release", scope, t.builder.loc,
                             signal=True))


@builtin(lang.semaphore_wait, positional=(3, 3))
def semaphore_wait(t: Semantics, args: list, kwargs: dict) -> None:
    if set(kwargs) - {"scope"}:
        raise t.error("mgjit.semaphore_wait(x, index, value, scope='gpu') takes scope=")
    x, index, value = args
    starts, _, _ = _cell(t, "semaphore_wait", x, index)
    scope = _static_choice(t, "scope", kwargs.get("scope", "gpu"), SCOPES)
    value = _operand(t, "semaphore_wait", x, value, (), "value")
    t.builder.add(ops.SemaphoreWait(x.value, starts, value.value, scope, t.builder.loc))

"""What a kernel can call, and what its values can do: one table each, filled by the modules that implement
them (`builtins/` by hardware unit, `control.py` for `range`).

- `@builtin(lang.X, unit=..., positional=(lo, hi))`: the function `fn(t, args, kwargs)` traces a call of the
  `language.py` marker `mgjit.X`. `unit` is the hardware unit its ops need (a name of `targets.UNITS`, checked
  against the target on the ops it emits: `Op.requires`); `positional` bounds its positional arguments.
- `@method(ValueClass, "name", ...)`: `fn(t, value, args, kwargs)` traces `value.name(...)`; the dunders
  `__getitem__(t, value, index)` and `__setitem__(t, value, index, item)` trace `value[index]` and
  `value[index] = item`. `@attribute(ValueClass, "name")`: `fn(t, value)` traces reading `value.name`.
- `@loop(marker)`: `fn(t, node, args, kwargs)` traces `for ... in marker(*args, **kwargs):` (the statement
  `node`); such a marker can only be iterated.
- `@context(marker)`: `fn(t, args, kwargs)` traces entering `with marker(*args, **kwargs) as x:` and returns
  (the value bound to x, a function of no arguments that traces leaving the block); such a marker can only
  open a `with` block.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .. import language as lang, targets

BuiltinFn = Callable[[Any, list, dict], Any]  # (the tracer, positional arguments, keyword arguments) -> value


@dataclasses.dataclass(frozen=True)
class Builtin:
    marker: lang.Builtin
    fn: BuiltinFn
    unit: str | None
    positional: tuple[int, int] | None


@dataclasses.dataclass(frozen=True)
class Member:
    fn: Callable
    is_attribute: bool


_BUILTINS: dict[lang.Builtin, Builtin] = {}
_MEMBERS: dict[tuple[type, str], Member] = {}
_LOOPS: dict[Any, Callable] = {}
_CONTEXTS: dict[Any, Callable] = {}


def builtin(*markers: lang.Builtin, unit: str | None = None,
            positional: tuple[int, int] | None = None) -> Callable[[BuiltinFn], BuiltinFn]:
    """Decorator: `fn` traces calls of each of `markers`."""
    if unit is not None and unit not in targets.UNITS:
        raise ValueError(f"unknown hardware unit {unit!r}; the units are {sorted(targets.UNITS)}")

    def register(fn: BuiltinFn) -> BuiltinFn:
        for marker in markers:
            _claim(_BUILTINS, marker, f"mgjit.{marker.name}")
            _BUILTINS[marker] = Builtin(marker, fn, unit, positional)
        return fn
    return register


def method(cls: type, *names: str) -> Callable[[Callable], Callable]:
    """Decorator: `fn` traces the methods `names` (or indexing dunders) of values of class `cls`."""
    return _member(cls, names, is_attribute=False)


def attribute(cls: type, *names: str) -> Callable[[Callable], Callable]:
    """Decorator: `fn` traces reading the attributes `names` of values of class `cls`."""
    return _member(cls, names, is_attribute=True)


def loop(*markers: Any) -> Callable[[Callable], Callable]:
    """Decorator: `fn` traces `for` loops over each of `markers`."""
    return _by_marker(_LOOPS, markers)


def context(*markers: Any) -> Callable[[Callable], Callable]:
    """Decorator: `fn` traces `with` blocks opened by each of `markers`."""
    return _by_marker(_CONTEXTS, markers)


def find_builtin(marker: lang.Builtin) -> Builtin | None:
    return _BUILTINS.get(marker)


def find_member(value: Any, name: str) -> Member | None:
    """What traces `value.name` (or a dunder of `value`), looked up along the value's class hierarchy."""
    for cls in type(value).__mro__:
        member = _MEMBERS.get((cls, name))
        if member is not None:
            return member
    return None


def member_names(value: Any) -> list[str]:
    """The methods and attributes a kernel may use on `value` (for messages)."""
    classes = type(value).__mro__
    return sorted({name for cls, name in _MEMBERS if cls in classes and not name.startswith("__")}
                  | set(getattr(value, "attributes", ())))


def find_loop(marker: Any) -> Callable | None:
    return _find(_LOOPS, marker)


def find_context(marker: Any) -> Callable | None:
    return _find(_CONTEXTS, marker)


def _find(table: dict, marker: Any) -> Callable | None:
    try:
        return table.get(marker)
    except TypeError:  # an unhashable object: not a marker
        return None


def builtins() -> dict[lang.Builtin, Builtin]:
    """Every registered builtin, by marker."""
    return dict(_BUILTINS)


def _member(cls: type, names: tuple[str, ...], is_attribute: bool) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for name in names:
            _claim(_MEMBERS, (cls, name), f"{cls.__name__}.{name}")
            _MEMBERS[(cls, name)] = Member(fn, is_attribute)
        return fn
    return register


def _by_marker(table: dict, markers: tuple) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for marker in markers:
            _claim(table, marker, getattr(marker, "__name__", repr(marker)))
            table[marker] = fn
        return fn
    return register


def _claim(table: dict, key: Any, what: str) -> None:
    if key in table:
        raise ValueError(f"{what} is registered twice")

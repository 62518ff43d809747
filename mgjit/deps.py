"""What a kernel reads, for its cache key: its source and the source and values of everything it reads
(device functions, globals, closure variables), and a snapshot that tells when one of them was redefined.
"""
from __future__ import annotations

import inspect
import types
from typing import Any, Callable

from . import dtypes
from .language import Builtin
from .source import DeviceFunction, closure_vars

_PLAIN = (int, float, bool, str, bytes, type(None), dtypes.DType)


def _describe_global(obj: Any, seen: set) -> Any:
    """What of a global the cache key must see: source for device functions, value for plain data."""
    if isinstance(obj, DeviceFunction):
        return ("device", obj.fn.__qualname__, source_parts(obj.fn, seen))
    if isinstance(obj, _PLAIN):
        return ("value", repr(obj))
    if isinstance(obj, (tuple, list)) and all(isinstance(x, _PLAIN) for x in obj):
        return ("value", repr(obj))
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    if isinstance(obj, Builtin) or callable(obj):
        return ("callable", getattr(obj, "__module__", ""), getattr(obj, "__qualname__", repr(obj)))
    return ("object", type(obj).__qualname__)


def _referenced(fn: Callable) -> dict[str, Any]:
    """Globals and closure variables a function's code names (including nested code objects)."""
    names: set[str] = set()
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    out = {n: fn.__globals__[n] for n in sorted(names) if n in fn.__globals__}
    out.update(closure_vars(fn))
    return out


def source_parts(fn: Callable, seen: set) -> tuple:
    if id(fn) in seen:
        return ("recursive", fn.__qualname__)
    seen = seen | {id(fn)}
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = fn.__code__.co_code.hex()
    deps = tuple((name, _describe_global(obj, seen)) for name, obj in _referenced(fn).items())
    return (src, deps)


def snapshot(fn: Callable) -> list[tuple[dict, str, Any]]:
    """(namespace, name, object) for every global the kernel and its helpers read, to detect redefinition."""
    out, stack, seen = [], [fn], set()
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        for name in _referenced(f):
            if name in f.__globals__:
                obj = f.__globals__[name]
                out.append((f.__globals__, name, obj))
                if isinstance(obj, DeviceFunction):
                    stack.append(obj.fn)
    return out


def changed(snap: list[tuple[dict, str, Any]]) -> bool:
    """Whether any global in a snapshot now names another object."""
    return any(ns.get(name) is not obj for ns, name, obj in snap)

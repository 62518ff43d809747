"""Debugging and profiling: `mgjit.print(fmt, *values, where=...)`, `with mgjit.trace("name"):` and
`mgjit.device_assert(cond, message)`.

Both write into buffers the compiler appends to the kernel's parameters (`Kernel.hidden_buffers`; the launcher
allocates them, mgjit/hidden.py): "print" as soon as a kernel prints, "profile" when the compile records spans
(a profiled launch). Without profiling a `with mgjit.trace(...)` block traces its body and nothing else, so the
kernel is the one it would be without the block.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ... import dtypes, ir, language as lang, ops, printing
from ...errors import Loc
from ..registry import builtin, context
from ..semantics import Semantics
from ..values import Expanded, Tensor


@dataclasses.dataclass
class HiddenBuffer:
    """A hidden parameter being traced: its IR value and the table the host decodes the buffer with."""

    value: ir.Value
    table: dict
    region: ir.Value | None = None  # the profile: this warpgroup's region (ProfileStart's result)


def _buffer(t: Semantics, name: str, table: dict) -> HiddenBuffer:
    if name not in t.hidden_buffers:
        t.hidden_buffers[name] = HiddenBuffer(ir.Value(ir.RefType("gmem", dtypes.int32, 1)), table)
    return t.hidden_buffers[name]


def start(t: Semantics, loc: Loc) -> None:
    """At the kernel's entry: when profiling, the profile buffer and this warpgroup's region of it."""
    if t.profile:
        buf = _buffer(t, "profile", {"spans": []})
        buf.region = t.builder.add(ops.ProfileStart(buf.value, loc)).result


def finish(t: Semantics, params: list[ir.Param], args: list[ir.Value]) -> dict[str, dict]:
    """Append the hidden buffers to the kernel's parameters; returns Kernel.hidden_buffers."""
    out = {}
    for name, buf in t.hidden_buffers.items():
        out[name] = {"param": len(params), **buf.table}
        params.append(ir.Param(f"mgjit.{name}", "tensor", dtypes.int32, 1))
        args.append(buf.value)
    return out


@builtin(lang.print)
def print_(t: Semantics, args: list, kwargs: dict) -> None:
    if not args or not isinstance(args[0], str):
        raise t.error("mgjit.print takes a format string first: mgjit.print(\"x = {}\", x)")
    where = kwargs.pop("where", "cta")
    if kwargs:
        raise t.error(f"mgjit.print takes where= only, got {', '.join(kwargs)}")
    if where not in printing.MODES:
        raise t.error(f"mgjit.print's where= is one of {', '.join(map(repr, printing.MODES))}, got {where!r}")
    fmt, values = args[0], args[1:]
    try:
        printing.parse_format(fmt, len(values))
    except ValueError as e:
        raise t.error(str(e)) from None
    traced = []
    for v in values:
        if not isinstance(v, (Tensor, Expanded, bool, int, float)):
            raise t.error(f"mgjit.print prints numbers and arrays, got {type(v).__name__}")
        traced.append(t.to_tensor(v))
    buf = _buffer(t, "print", {"sites": []})
    sites = buf.table["sites"]
    sites.append({"format": fmt, "where": where, "line": t.builder.loc.line if t.builder.loc else 0,
                  "values": [{"dtype": x.dtype.name, "shape": list(x.shape)} for x in traced]})
    t.builder.add(ops.Print(buf.value, [x.value for x in traced], len(sites) - 1, fmt, where, t.builder.loc))


@context(lang.trace)
def trace(t: Semantics, args: list, kwargs: dict) -> tuple[None, Callable[[], None]]:
    """`with mgjit.trace("name"):` a span of this warpgroup, recorded when the launch profiles. The tracer
    leaves the span where the block ends, on a `return` in it (in an inlined helper) too."""
    name = args[0] if len(args) == 1 and not kwargs else kwargs.get("name") if not args and set(kwargs) == {"name"} \
        else None
    if not isinstance(name, str):
        raise t.error("mgjit.trace takes a span name, a string: `with mgjit.trace(\"load\"):`")
    if not t.profile:
        return None, lambda: None
    buf = t.hidden_buffers["profile"]
    names = buf.table["spans"]
    if name not in names:
        names.append(name)
    span = names.index(name)
    loc = t.builder.loc
    t.builder.add(ops.ProfileEvent(buf.region, span, name, False, loc))
    return None, lambda: t.builder.add(ops.ProfileEvent(buf.region, span, name, True, loc))


@builtin(lang.device_assert)
def device_assert(t: Semantics, args: list, kwargs: dict) -> None:
    if kwargs or len(args) != 2 or not isinstance(args[1], str):
        raise t.error("mgjit.device_assert takes a condition and a message: mgjit.device_assert(n > 0, \"empty rows\")")
    cond, message = args
    if isinstance(cond, (bool, int)):  # known when traced (constexprs, static shapes)
        if not cond:
            raise t.error(f"device_assert fails for every launch of this specialization: {message}")
        return
    cond = t.to_tensor(cond)
    if cond.shape:
        raise t.error(f"mgjit.device_assert takes a scalar condition, got an array of shape {cond.shape}; reduce it "
                      f"first ((x >= 0).min(), a count > 0)")
    if cond.dtype != dtypes.bool_:
        cond = t.to_tensor(cond != 0)
    t.builder.add(ops.DeviceAssert(cond.value, message, t.builder.loc))

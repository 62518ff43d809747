"""What a kernel reads: described by value for its cache key, and checked for changes on every call.

A kernel's key covers its source (read once, when it was decorated) and everything its code reads, by value, at
every level: a global or closure variable, or an attribute chain rooted at one (`cfg.S`, `ops.act`, `Cls.X`), is
resolved and its value described — numbers and strings by value, containers by their contents, device
functions by their source and their own reads, plain Python functions by their code and reads, modules,
classes and namespaces by the attributes read (or, when one is read whole, by its plain attributes). Values
mgjit cannot describe by content (a tensor, an object whose repr is its address) are described by identity,
which makes the kernel's compiled code memory-only: it is never written to, or read from, the disk cache, where
another process could hold a different object at the same address.

Every call checks, cheaply, that each name and chain still resolves to the object the key was built from, and
that mutable values (lists, dicts, sets, namespaces) still compare equal to their snapshot; a change rebuilds
the key. Reads of mgjit itself (`mgjit.exp`, `mgjit.float32`) are described by name and not checked.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import enum
import functools
import hashlib
import operator
import types
from typing import Any, Callable

from . import dtypes
from .language import Builtin, constexpr, ds
from .source import DeviceFunction, SourceFunction

_SCALARS = (type(None), bool, int, float, str, bytes)
_MUTABLE = (list, dict, set, bytearray, types.SimpleNamespace)


@dataclasses.dataclass
class Dependencies:
    """What a function reads: `parts` for the cache key; what every call checks is unchanged: `watched`, reads
    that must still give the very objects they gave (plain data, which the C launcher checks without running
    Python: per module, (its globals, names, objects); per function, (the function, "__defaults__", the tuple)),
    and `checks`, the rest (each True while unchanged); `persistent` False when a part is an identity rather than
    a content description."""

    parts: tuple
    watched: tuple
    checks: list[Callable[[], bool]]
    persistent: bool

    def changed(self) -> bool:
        return not all(map(_holds, self.watched)) or self.checks_changed()

    def checks_changed(self) -> bool:
        """Whether a read that `watched` does not cover changed (what the C launcher asks Python)."""
        for check in self.checks:
            if not check():
                return True
        return False


def of_kernel(source: SourceFunction) -> Dependencies:
    """The dependencies of a kernel (or device function) given its captured source."""
    reader = _Reader()
    parts = reader.function(source)
    return Dependencies(parts, tuple(reader.watched()), reader.checks, reader.persistent)


def _holds(entry: tuple) -> bool:
    """Whether a `Dependencies.watched` entry's reads still give its objects (the Python twin of the C
    launcher's `watched_changed`)."""
    holder, names, expected = entry
    if isinstance(names, str):
        return getattr(holder, names, _MISSING) is expected
    return all(map(operator.is_, map(holder.get, names, (_MISSING,) * len(names)), expected))


def describe_value(value: Any) -> tuple[Any, bool]:
    """A value's content description (for constexpr arguments in keys) and whether it is persistent."""
    reader = _Reader()
    return reader.value(value), reader.persistent


class _Reader:
    def __init__(self):
        self.checks: list[Callable[[], bool]] = []
        # Plain global reads, checked by identity together per module: id(globals) -> (globals, {name: object})
        self.globals: dict[int, tuple[dict, dict[str, Any]]] = {}
        self.attributes: list[tuple[Any, str, Any]] = []  # (function, "__defaults__", the tuple): by identity
        self.persistent = True
        self.seen: dict[int, Any] = {}  # functions being described, for recursion through device functions

    # -- functions
    def function(self, source: SourceFunction) -> tuple:
        fn = source.fn
        if id(fn) in self.seen:
            return ("recursive", fn.__qualname__)
        self.seen[id(fn)] = fn
        reads = []
        for chain in sorted(_free_chains(source.node)):
            root = chain[0]
            namespace, where = _binding(fn, root)
            if namespace is None:
                reads.append((".".join(chain), ("unbound",)))
                continue
            reads.append((".".join(chain), self.chain(namespace, where, chain)))
        defaults = self.value(fn.__defaults__) if fn.__defaults__ else None
        kwdefaults = self.value(fn.__kwdefaults__) if fn.__kwdefaults__ else None
        for attribute in ("__defaults__", "__kwdefaults__"):
            value = getattr(fn, attribute)
            if value and _changes_in_place(value) is None:
                self.attributes.append((fn, attribute, value))
            elif value:
                self._watch(functools.partial(getattr, fn, attribute), value)
        return ("function", source.source, tuple(reads), defaults, kwdefaults)

    def chain(self, namespace: Any, where: str, chain: tuple[str, ...]) -> Any:
        """Resolve `chain` from its root binding and describe the value it reaches."""
        if where == "builtins":
            return ("python-builtin", chain[0])
        root = _lookup(namespace, where, chain[0])
        if _is_mgjit(root):  # the mgjit package and what it exports: fixed, described by name
            return ("mgjit", ".".join(chain))
        # Descend through namespaces and through objects' own attributes (`cfg.S` of a dataclass or any
        # instance): an attribute the type provides (a method of a number, a field of a tuple) is described
        # with the value.
        value, depth = root, 0
        while depth + 1 < len(chain) and _is_namespace(value, chain[depth + 1]):
            try:
                value = getattr(value, chain[depth + 1])
            except AttributeError:
                return ("missing", ".".join(chain))
            depth += 1
        steps = chain[1:depth + 1]
        if where == "globals" and not steps and _changes_in_place(value) is None:
            self.globals.setdefault(id(namespace), (namespace, {}))[1][chain[0]] = value
            return (".".join(chain[:depth + 1]), self.value(value))

        def resolve():
            v = _lookup(namespace, where, chain[0])
            for attr in steps:
                v = getattr(v, attr, _MISSING)
            return v

        self._watch(resolve, value)
        return (".".join(chain[:depth + 1]), self.value(value))

    def watched(self) -> list[tuple]:
        """`Dependencies.watched`: one entry per module of the plain global reads, one per function default."""
        return [(namespace, tuple(reads), tuple(reads.values())) for namespace, reads in self.globals.values()] + [
            *self.attributes]

    def _watch(self, resolve: Callable[[], Any], expected: Any) -> None:
        """Add the per-call check that `resolve()` still gives `expected`: the same object, and for mutable
        values one that still equals a copy of what it held."""
        kind = _changes_in_place(expected)
        if kind == "contents":
            snapshot = _Reader().value(expected)
            self.checks.append(lambda: resolve() is expected and _Reader().value(expected) == snapshot)
        elif kind == "attributes":  # an instance read whole: its attributes may be assigned in place
            snapshot = _Reader().value(vars(expected))
            self.checks.append(lambda: resolve() is expected and _Reader().value(vars(expected)) == snapshot)
        else:
            self.checks.append(lambda: resolve() is expected)

    # -- values
    def value(self, x: Any) -> Any:
        if isinstance(x, bool) or x is None or isinstance(x, (int, float, str, bytes)):
            return ("value", type(x).__name__, x)
        if isinstance(x, complex):
            return ("value", "complex", repr(x))
        if isinstance(x, dtypes.DType):
            return ("dtype", x.name)
        if isinstance(x, Builtin) or x is constexpr or x is ds:
            return ("mgjit", getattr(x, "name", getattr(x, "__name__", "")))
        if isinstance(x, DeviceFunction):
            return ("device", self.function(x.source))
        if getattr(x, "__mgjit_kernel__", False):
            return ("kernel", self.function(x.source))
        if isinstance(x, (tuple, list)):
            return (type(x).__name__, tuple(self.value(v) for v in x))
        if isinstance(x, (set, frozenset)):
            return (type(x).__name__, tuple(sorted((self.value(v) for v in x), key=repr)))
        if isinstance(x, dict):
            items = sorted(((self.value(k), self.value(v)) for k, v in x.items()), key=lambda kv: repr(kv[0]))
            return ("dict", tuple(items))
        if isinstance(x, enum.Enum):
            return ("enum", type(x).__qualname__, x.name, self.value(x.value))
        if isinstance(x, types.ModuleType):
            return ("module", x.__name__, self._attributes(x, vars(x), own_module=x.__name__))
        if isinstance(x, type):
            return ("class", x.__module__, x.__qualname__, self._attributes(x, vars(x), own_module=None))
        if isinstance(x, types.SimpleNamespace):
            return ("namespace", self.value(vars(x)))
        if dataclasses.is_dataclass(x):
            return ("dataclass", type(x).__qualname__,
                    tuple((f.name, self.value(getattr(x, f.name))) for f in dataclasses.fields(x)))
        if isinstance(x, types.FunctionType):
            return ("python-function", x.__qualname__, self._code(x.__code__), self._plain_function_reads(x))
        if isinstance(x, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            return ("c-function", getattr(x, "__module__", None) or "", x.__qualname__)
        text = repr(x)
        if " at 0x" in text or type(x).__module__.split(".")[0] == "torch" and not _is_torch_dtype(x):
            # No content to describe (or too much: a tensor): identity, and memory-only caching.
            self.persistent = False
            return ("identity", type(x).__qualname__, id(x))
        return ("repr", type(x).__module__, type(x).__qualname__, text)

    def _attributes(self, owner: Any, namespace: dict, own_module: str | None) -> tuple:
        """A module or class read whole: its attributes by value, leaving out dunders, submodules and (for a
        module) the functions and classes it imported from elsewhere, which are not part of its own content."""
        out = []
        for name, v in sorted(namespace.items()):
            if name.startswith("__") or isinstance(v, types.ModuleType):
                continue
            if own_module is not None and _defined_in(v) not in (None, own_module):
                continue
            if isinstance(v, (staticmethod, classmethod)):
                v = v.__func__
            elif isinstance(v, property):
                v = v.fget
            out.append((name, self.value(v)))
        return tuple(out)

    def _code(self, code: types.CodeType) -> tuple:
        consts = tuple(self._code(c) if isinstance(c, types.CodeType) else self.value(c) for c in code.co_consts)
        return (hashlib.sha256(code.co_code).hexdigest(), code.co_names, consts)

    def _plain_function_reads(self, fn: types.FunctionType) -> tuple:
        """The globals a compile-time helper's code names, by value (its bytecode names them, not attributes)."""
        if id(fn) in self.seen:
            return ("recursive",)
        self.seen[id(fn)] = fn
        names = set()
        stack = [fn.__code__]
        while stack:
            code = stack.pop()
            names.update(code.co_names)
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        return tuple((n, self.value(fn.__globals__[n])) for n in sorted(names)
                     if n in fn.__globals__ and not _is_mgjit(fn.__globals__[n]))


_MISSING = object()


def _changes_in_place(value: Any) -> str | None:
    """How a read value can change in place, so that its check compares a snapshot and not only identity:
    "contents" (a mutable container, or a tuple holding one), "attributes" (an instance read whole), or None."""
    if isinstance(value, _MUTABLE) or (isinstance(value, tuple) and _holds_mutable(value)):
        return "contents"
    return "attributes" if _has_own_state(value) else None


def _lookup(namespace: Any, where: str, name: str) -> Any:
    if where == "closure":
        try:
            return namespace.cell_contents
        except ValueError:
            return _MISSING
    return namespace.get(name, _MISSING)


def _binding(fn: Callable, name: str) -> tuple[Any, str]:
    """Where a free name of `fn` is bound: (its closure cell, "closure"), (globals, "globals"),
    (None, "builtins") for Python's builtins, or (None, "") when unbound."""
    if name in fn.__code__.co_freevars:
        return fn.__closure__[fn.__code__.co_freevars.index(name)], "closure"
    if name in fn.__globals__:
        return fn.__globals__, "globals"
    if hasattr(builtins, name):
        return None, "builtins"
    return None, ""


def _is_mgjit(x: Any) -> bool:
    if isinstance(x, types.ModuleType):
        return x.__name__ == "mgjit" or x.__name__.startswith("mgjit.")
    return isinstance(x, (Builtin, dtypes.DType)) or x is constexpr or x is ds


def _defined_in(v: Any) -> str | None:
    """The module a function, class or device function was defined in (None for data)."""
    if isinstance(v, DeviceFunction):
        return v.fn.__module__
    if isinstance(v, (types.FunctionType, type)):
        return v.__module__
    return None


def _is_namespace(value: Any, attr: str) -> bool:
    """Whether reading `attr` of `value` reads a binding of its own (resolved and checked on every call)."""
    if isinstance(value, (types.ModuleType, type, types.SimpleNamespace)):
        return True
    return _has_own_state(value) and attr in vars(value)


def _has_own_state(x: Any) -> bool:
    """An instance of a user's class with assignable attributes (a dataclass, a plain object)."""
    return (not isinstance(x, (types.ModuleType, type, types.FunctionType, DeviceFunction, *_MUTABLE))
            and not getattr(x, "__mgjit_kernel__", False) and isinstance(getattr(x, "__dict__", None), dict))


def _is_torch_dtype(x: Any) -> bool:
    return type(x).__name__ == "dtype" and type(x).__module__ == "torch"


def _holds_mutable(t: tuple) -> bool:
    return any(isinstance(v, _MUTABLE) or (isinstance(v, tuple) and _holds_mutable(v)) for v in t)


def _free_chains(fn_node: ast.FunctionDef) -> set[tuple[str, ...]]:
    """The names a function reads that it does not bind itself, each with the longest attribute chain it is
    used through at each use (`cfg.S` gives ("cfg", "S"); a bare `cfg` gives ("cfg",))."""
    local = {a.arg for a in [*fn_node.args.posonlyargs, *fn_node.args.args, *fn_node.args.kwonlyargs]}
    for extra in (fn_node.args.vararg, fn_node.args.kwarg):
        if extra is not None:
            local.add(extra.arg)
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(fn_node):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            local.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not fn_node:
            local.add(node.name)
    chains = set()
    for node in ast.walk(fn_node):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)) or node.id in local:
            continue
        chain, top = [node.id], node
        while isinstance(parents.get(id(top)), ast.Attribute) and parents[id(top)].value is top:
            top = parents[id(top)]
            chain.append(top.attr)
        chains.add(tuple(chain))
    return chains

"""A kernel's or helper's Python source, read once, when it is decorated: what the frontend parses, what cache
keys hash and what errors quote. A file edited (or switched by git) after that changes nothing until the
function is defined again (re-imported, or its notebook cell re-run).

Kept apart from the frontend so that `import mgjit` and a cache hit never load the compiler.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Callable

from .errors import CompileError, Loc


class SourceFunction:
    """A Python function's parsed source, with its location in the user's file."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.name = fn.__name__
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise CompileError(f"cannot read the source of {fn.__qualname__}: {e}") from None
        self.lines = [line.rstrip("\n") for line in lines]
        self.source = textwrap.dedent("".join(lines))
        self.file = inspect.getsourcefile(fn) or fn.__code__.co_filename
        self.first_line = first
        tree = ast.parse(self.source)
        self.node = tree.body[0]
        if not isinstance(self.node, ast.FunctionDef):
            raise CompileError(f"{fn.__qualname__} is not a plain function definition",
                               Loc(self.file, first, 0, self.name))

    def loc(self, node: ast.AST) -> Loc:
        line = getattr(node, "lineno", 1)
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Loc(self.file, self.first_line + line - 1, getattr(node, "col_offset", 0), self.name, text)


def closure_vars(fn: Callable) -> dict[str, Any]:
    """The values of a function's closure variables (cells not yet filled are left out)."""
    out = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            out[name] = cell.cell_contents
        except ValueError:
            pass
    return out


class DeviceFunction:
    """A helper made by @mgjit.device: inlined into the kernels that call it. Its source is read here, once."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.source = SourceFunction(fn)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.__name__} is an @mgjit.device function: call it from inside a kernel")

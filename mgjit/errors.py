"""The errors mgjit raises at users: each names the kernel file and line it concerns."""
from __future__ import annotations

import dataclasses
import linecache


@dataclasses.dataclass(frozen=True)
class Loc:
    """A place in the user's Python source."""

    file: str
    line: int
    col: int = 0
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def source_line(self) -> str:
        return linecache.getline(self.file, self.line).rstrip()


class CompileError(Exception):
    """A kernel cannot be compiled as written. `rule` names the broken rule where one applies (the autotuner
    records it as the reason a config was pruned)."""

    def __init__(self, message: str, loc: Loc | None = None, rule: str | None = None):
        self.message = message
        self.loc = loc
        self.rule = rule
        super().__init__(self._format())

    def _format(self) -> str:
        if self.loc is None:
            return self.message
        where = f"{self.loc}" + (f" (in {self.loc.function})" if self.loc.function else "")
        text = f"{where}: {self.message}"
        line = self.loc.source_line()
        if line:
            text += f"\n    {line.strip()}"
        return text


class LaunchError(ValueError):
    """A launch's arguments do not fit the kernel (wrong count, device, dtype, grid)."""

"""The errors mgjit raises at users: each names the kernel file and line it concerns."""
from __future__ import annotations

import dataclasses
import enum
import linecache


@dataclasses.dataclass(frozen=True)
class Loc:
    """A place in the user's Python source; `text` is that line as the source was read when the function was
    decorated (the file may have changed since)."""

    file: str
    line: int
    col: int = 0
    function: str = ""
    text: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def source_line(self) -> str:
        return self.text.rstrip() if self.text else linecache.getline(self.file, self.line).rstrip()


class Rule(str, enum.Enum):
    """The rules a CompileError can name: the autotuner records the tag as the reason it pruned a config,
    and tests match on it. One enumeration, so that a rule is spelled the same everywhere."""

    LAYOUT = "layout"                  # a register layout does not fit an array, or layouts conflict
    REGISTERS = "registers"            # register budgets (set_max_registers, values living in a capped role)
    SWIZZLE_WIDTH = "swizzle-width"    # a swizzled SMEM tile's rows against its swizzle
    SMEM_BUDGET = "smem-budget"        # shared memory per CTA
    TMA_BOX = "tma-box"                # the TMA box a copy needs
    TMA_ALIGNMENT = "tma-alignment"    # a tensor copied by TMA must be 16-byte aligned with unit last stride
    WGMMA_SHAPE = "wgmma-shape"        # what one wgmma instruction accepts
    TCGEN05_SHAPE = "tcgen05-shape"    # what one tcgen05.mma instruction accepts
    TMEM_LAYOUT = "tmem-layout"        # what a TMEM reference can be
    TMEM_ALLOC = "tmem-alloc"          # how TMEM is allocated
    CTA_GROUP = "cta-group"            # 1-CTA against 2-CTA tcgen05 work
    CLUSTER = "cluster"                # cluster shapes and what needs one
    TARGET = "target"                  # an unknown target
    TARGET_ARCH = "target-arch"        # an op the target's architecture lacks
    PTXAS = "ptxas"                    # ptxas rejected the PTX

    # A str mixin alone formats as "Rule.LAYOUT" on Python >= 3.11; a rule reads as its tag everywhere.
    __str__ = str.__str__
    __format__ = str.__format__


class CompileError(Exception):
    """A kernel cannot be compiled as written. `rule` names the broken rule where one applies (the autotuner
    records it as the reason a config was pruned); `required_target` names the target an op needs when the
    rule is Rule.TARGET_ARCH."""

    def __init__(self, message: str, loc: Loc | None = None, rule: Rule | None = None,
                 required_target: str | None = None):
        self.message = message
        self.loc = loc
        self.rule = Rule(rule) if rule is not None else None
        self.required_target = required_target
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


class PtxasWarning(UserWarning):
    """ptxas warned about a kernel (serialized wgmma, ignored setmaxnreg, ...) or spilled registers: usually a
    large slowdown, so it is shown, naming the kernel."""

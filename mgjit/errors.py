"""The errors mgjit raises at users: each names the kernel file and line it concerns."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import linecache
import warnings
from typing import Iterator


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
    SMEM_SLICE = "smem-slice"          # a view of an SMEM tile cut where its storage has no boundary
    SMEM_BUDGET = "smem-budget"        # shared memory per CTA
    TMA_BOX = "tma-box"                # the TMA box a copy needs
    TMA_ALIGNMENT = "tma-alignment"    # a tensor copied by TMA must be 16-byte aligned with unit last stride
    WGMMA_SHAPE = "wgmma-shape"        # what one wgmma instruction accepts
    TCGEN05_SHAPE = "tcgen05-shape"    # what one tcgen05.mma instruction accepts
    TMEM_LAYOUT = "tmem-layout"        # what a TMEM reference can be
    TMEM_ALLOC = "tmem-alloc"          # how TMEM is allocated
    CTA_GROUP = "cta-group"            # 1-CTA against 2-CTA tcgen05 work
    WARP_ROLE = "warp-role"            # what one warp's role (`if mgjit.warp_id() == w:`) may hold
    CLUSTER = "cluster"                # cluster shapes and what needs one
    TARGET = "target"                  # an unknown target
    TARGET_ARCH = "target-arch"        # an op the target's architecture lacks
    PTXAS = "ptxas"                    # ptxas rejected the PTX
    ATOMIC = "atomic"                  # what an atomic or semaphore accepts: types, ordering, scope

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


class Check(str, enum.Enum):
    """What the interpreter's checker found (`InterpretError.check`): tests match on the tag."""

    TMA_INCOMPLETE = "tma-incomplete"        # SMEM read before its TMA copy completed on a barrier the reader waited on
    SMEM_UNORDERED = "smem-unordered"        # SMEM read of ordinary stores not ordered (barrier, fence) before it
    IN_FLIGHT_WRITE = "in-flight-write"      # a write to SMEM or TMEM that an in-flight async op may still access
    ACCUMULATOR_READ = "accumulator-read"    # an MMA accumulator read before the wait that completes the MMA
    DEADLOCK = "deadlock"                    # every warpgroup blocked and nothing in flight to unblock one
    BARRIER_COUNT = "barrier-count"          # arrivals or transaction bytes that do not match a barrier's count
    OUT_OF_BOUNDS = "out-of-bounds"          # an SMEM, barrier or TMEM index outside its allocation
    SMEM_SLICE = "smem-slice"                # a runtime SMEM slice start off its tile's grid (8-row atoms, column blocks)
    SMEM_SCOPE = "smem-scope"                # a scoped SMEM buffer's bytes used by two scopes that nothing orders
    TMEM_LIFETIME = "tmem-lifetime"          # a TMEM access before its allocation or after its deallocation
    ASYNC_AT_EXIT = "async-at-exit"          # a CTA exits while an async copy or MMA still uses its memory
    REGISTERS = "registers"                  # set_max_registers beyond what the register file can give
    CLC_AFTER_FAILURE = "clc-after-failure"  # a try_cancel after the CTA read a failed response
    DEVICE_ASSERT = "device-assert"          # an mgjit.device_assert whose condition was false
    GMEM_UNORDERED = "gmem-unordered"        # GMEM read of stores (another CTA's, warpgroup's) nothing orders before it
    TMA_START = "tma-start"                  # a TMA load's box starting off 16 bytes along the tensor's innermost dim

    __str__ = str.__str__
    __format__ = str.__format__


class InterpretError(CompileError):
    """The interpreter found a race, a deadlock or an out-of-bounds access in a kernel. `loc` is the line that
    does it; `related` are the other lines involved (the copy a read raced with, the other waits of a deadlock)."""

    def __init__(self, message: str, loc: Loc | None, check: Check, related: tuple[Loc, ...] = ()):
        self.check = Check(check)
        self.related = tuple(related)
        super().__init__(message, loc)

    def _format(self) -> str:
        text = super()._format()
        for loc in self.related:
            text += f"\n  see {loc}" + (f": {loc.source_line().strip()}" if loc.source_line() else "")
        return text


class LaunchError(ValueError):
    """A launch's arguments do not fit the kernel (wrong count, device, dtype, grid)."""


class BankConflictWarning(UserWarning):
    """An SMEM read or write of a register array takes more shared-memory wavefronts than its bytes need (a
    bank conflict) in the layout inference chose, for the tile's swizzle: shown at the line of the access."""


class PtxasWarning(UserWarning):
    """ptxas warned about a kernel (serialized wgmma, ignored setmaxnreg, ...) or spilled registers: usually a
    large slowdown, so it is shown, naming the kernel."""


class CompileWarning(UserWarning):
    """A kernel compiles, but a line of it probably does not do what was meant (a GMEM store that several
    warpgroups repeat, ...): the message names the line."""


# Warnings a compile gives about the user's lines (not ptxas'), by name: a cache entry records them, and a
# process that loads the entry gives them again, as it gives ptxas' (compiler._warn).
COMPILE_WARNINGS: dict[str, type[Warning]] = {c.__name__: c for c in (BankConflictWarning, CompileWarning)}
_RECORDED: contextvars.ContextVar[list | None] = contextvars.ContextVar("mgjit_compile_warnings", default=None)


_REPEATED: contextvars.ContextVar[bool] = contextvars.ContextVar("mgjit_repeated_pass", default=False)


def compile_warning(message: str, category: type[Warning], loc: Loc) -> None:
    """Warn at a kernel's line, and record the warning for the cache entry of the compile under way."""
    if _REPEATED.get():
        return
    recorded = _RECORDED.get()
    if recorded is not None:
        recorded.append({"category": category.__name__, "message": message, "file": loc.file, "line": loc.line})
    warnings.warn_explicit(message, category, loc.file, loc.line)


@contextlib.contextmanager
def recording_compile_warnings() -> Iterator[list[dict]]:
    """The compile warnings given inside the block, as cache metadata (compile_warning)."""
    token = _RECORDED.set([])
    try:
        yield _RECORDED.get()
    finally:
        _RECORDED.reset(token)


@contextlib.contextmanager
def repeated_pass() -> Iterator[None]:
    """A pass over a kernel that an earlier pass of this compile went through (the compiler lowering it again):
    the warnings it would give about the kernel's lines were given then, and are neither given nor recorded."""
    token = _REPEATED.set(True)
    try:
        yield
    finally:
        _REPEATED.reset(token)

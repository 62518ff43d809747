"""The targets mgjit compiles for: one table of what each architecture has and how it is compiled.

Everything that depends on the architecture reads it here: the PTX ISA version the MLIR pipeline asks for,
the device capability a launch maps to a target, shared and tensor memory per CTA, cluster limits, and the
hardware units an op may need (an op names its unit in `Op.requires`; the compiler checks it against the
target before lowering).
"""
from __future__ import annotations

import dataclasses

from .errors import CompileError, Loc, Rule


@dataclasses.dataclass(frozen=True)
class Target:
    name: str                     # the ptxas -arch and nvvm chip name
    architecture: str             # the marketing name, for messages
    capability: tuple[int, int]   # torch.cuda.get_device_capability() of GPUs that run it
    ptx_features: str             # the nvvm target's PTX ISA version (wgmma needs 8.0, vector atomics 8.1,
                                  # tensormap.replace 8.3, tcgen05 8.6)
    smem_bytes: int               # dynamic shared memory one CTA may use
    tmem_columns: int             # 32-bit tensor-memory columns per CTA (128 lanes each); 0: none
    max_cluster_ctas: int         # CTAs in one cluster (the non-portable limit, opted into at launch)
    param_bytes: int              # a kernel's parameter space (4352 bytes before PTX ISA 8.1, 32764 from it)
    units: frozenset[str]         # hardware units its ops may use (see UNITS)


# The hardware units ops are checked against, with what an error says of each. "wgmma" is Hopper's warpgroup
# MMA (sm_90a only: Blackwell has tcgen05 instead); "tcgen05" covers tensor memory, its MMA and 2-CTA work;
# "clc" is Blackwell's cluster launch control, "tma_gather4" its TMA copy of four rows picked by index
# (tile::gather4), which a row gather uses where the target has it; TMA, mbarriers, clusters and setmaxnreg exist
# on both.
UNITS = {"tma": "the TMA engine exists", "mbarrier": "mbarriers exist", "cluster": "clusters exist",
         "setmaxnreg": "setmaxnreg exists", "wgmma": "the warpgroup MMA (wgmma) exists",
         "tcgen05": "tensor memory and tcgen05 exist", "clc": "cluster launch control exists",
         "tma_gather4": "TMA gather4 exists"}

HOPPER = Target("sm_90a", "Hopper", (9, 0), "+ptx83", smem_bytes=232448, tmem_columns=0, max_cluster_ctas=16,
                param_bytes=32764, units=frozenset({"tma", "mbarrier", "cluster", "setmaxnreg", "wgmma"}))
BLACKWELL = Target("sm_100a", "Blackwell", (10, 0), "+ptx87", smem_bytes=232448, tmem_columns=512,
                   max_cluster_ctas=16, param_bytes=32764,
                   units=frozenset({"tma", "mbarrier", "cluster", "setmaxnreg", "tcgen05", "clc", "tma_gather4"}))

TARGETS: dict[str, Target] = {t.name: t for t in (HOPPER, BLACKWELL)}

# One SM of either target: its register file (32-bit registers) and the most threads and CTAs resident on it.
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
CTAS_PER_SM = 32
# The CTAs a cluster may have without opting in (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED): a
# cluster of 9 to max_cluster_ctas fails its launch with CUDA_ERROR_INVALID_CLUSTER_SIZE otherwise.
PORTABLE_CLUSTER_CTAS = 8
DEFAULT = HOPPER


def get(name: str, loc: Loc | None = None) -> Target:
    """The Target called `name`; a CompileError (at `loc`) naming the known ones otherwise."""
    target = TARGETS.get(name)
    if target is None:
        raise CompileError(f"unknown target {name!r}; mgjit compiles for {', '.join(TARGETS)}", loc, Rule.TARGET)
    return target


def for_capability(capability: tuple[int, int]) -> Target | None:
    """The target that runs on a GPU of this compute capability, or None."""
    return next((t for t in TARGETS.values() if t.capability == tuple(capability)), None)


def providing(unit: str) -> Target:
    """The first target that has `unit` (what an error suggests compiling for)."""
    return next(t for t in TARGETS.values() if unit in t.units)


def covering(units: set[str]) -> Target:
    """The first target that has every one of `units` (DEFAULT when none has them all, so that checking the
    ops against it names what is missing)."""
    return next((t for t in TARGETS.values() if units <= t.units), DEFAULT)


def check_unit(target: Target, unit: str, what: str, loc: Loc | None) -> None:
    """A CompileError at `loc` unless `target` has the hardware `unit` that `what` needs."""
    if unit not in target.units:
        needed = providing(unit)
        only = "only there" if sum(unit in t.units for t in TARGETS.values()) == 1 else "there"
        raise CompileError(f"{what} needs {needed.name} ({needed.architecture}): {UNITS[unit]} {only}; this "
                           f"kernel is being compiled for {target.name} ({target.architecture})", loc,
                           Rule.TARGET_ARCH, required_target=needed.name)

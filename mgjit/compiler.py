"""One specialization of a kernel → a CompiledKernel, through the cache.

`get(...)` looks the specialization up in the kernel store and compiles on a miss; `compile_specialization`
runs the stages: trace (frontend), the checks that need the whole kernel and its specialization, layout
inference, lowering to MLIR, the MLIR pipeline to PTX, and ptxas. A CompiledKernel is what a cache entry
holds: its files (`ARTIFACTS`) and its JSON metadata.

The stages import on first compile (frontend, ops, inference, lowering: tens of milliseconds), so that a cache
hit and a launch load none of them; MLIR itself loads only inside lowering.
"""
from __future__ import annotations

import time
import warnings
from typing import Any

from . import abi, dtypes
from ._version import VERSION
from .errors import CompileError, PtxasWarning, Rule
from .source import SourceFunction
from .specialize import Specialization, TensorSpec


class _Artifact:
    """A CompiledKernel attribute read from one of its files (decoded as text unless binary)."""

    def __init__(self, filename: str, text: bool = True):
        self.filename = filename
        self.text = text

    def __set_name__(self, owner, name: str) -> None:
        self.attribute = name

    def __get__(self, compiled: "CompiledKernel | None", owner=None):
        if compiled is None:
            return self
        data = compiled.files[self.filename]
        return data.decode() if self.text else data


class CompiledKernel:
    """One specialization, compiled: its cubin and what was learned on the way (for inspection and tuning)."""

    cubin = _Artifact("kernel.cubin", text=False)
    ptx = _Artifact("kernel.ptx")
    ir = _Artifact("kernel.ir")  # the IR with its inferred layouts
    mlir = _Artifact("kernel.mlir")
    ptxas_report = _Artifact("ptxas.txt")

    def __init__(self, name: str, key: str, target: str, meta: dict, files: dict[str, bytes]):
        self.name = name
        self.key = key
        self.target = target
        self.meta = meta
        self.files = files
        self.registers: int = meta["registers"]
        self.spills: int = meta["spills"]
        self.smem_bytes: int = meta["smem_bytes"]
        self.threads: int = meta["threads"]
        self.params: list[dict] = meta["params"]
        self.from_cache: bool = False
        self._launcher = None

    def launcher(self):
        """The runtime's Launcher of this kernel (its module, argument buffer and layout), made once."""
        if self._launcher is None:
            from .runtime import Launcher  # cuda-python loads when the first kernel is launched
            fields = abi.kernel_fields([(p["kind"], dtypes.BY_NAME[p["dtype"]], p["rank"]) for p in self.params],
                                       len(self.meta.get("tma", [])))
            self._launcher = Launcher(self.cubin, self.name, fields, self.smem_bytes, self.threads,
                                      tuple(self.meta.get("cluster", (1, 1, 1))))
        return self._launcher

    def __repr__(self) -> str:
        return (f"CompiledKernel({self.name}, {self.target}, registers={self.registers}, spills={self.spills}, "
                f"smem={self.smem_bytes}B, threads={self.threads})")


ARTIFACTS: tuple[str, ...] = tuple(a.filename for a in vars(CompiledKernel).values() if isinstance(a, _Artifact))


def get(source: SourceFunction, source_key: str, persistent: bool, spec: Specialization) -> CompiledKernel:
    """A kernel's compiled `spec`: from the store, or compiled and stored. `persistent` False (the kernel reads
    a value that has no content description) keeps it out of the store: see deps.py."""
    from .cache.store import default_store, hash_parts
    parts, content_only = spec.key_parts()
    key = hash_parts(source_key, *parts)
    store = default_store() if persistent and content_only else None
    if store is not None:
        entry = store.get(key, expect={"mgjit_version": VERSION, "target": spec.target, "name": source.name})
        if entry is not None:
            compiled = CompiledKernel(source.name, key, spec.target, dict(entry.meta),
                                      {n: entry.read(n) for n in ARTIFACTS})
            compiled.from_cache = True
            _warn(compiled, source)
            return compiled
    compiled = compile_specialization(source, spec, key)
    _warn(compiled, source)
    if store is not None:
        store.put(key, compiled.files, compiled.meta)
    return compiled


def trace(source: SourceFunction, spec: Specialization):
    """The IR of one specialization, as the frontend builds it (before layout inference)."""
    from . import frontend
    return frontend.trace(source, spec.params(), dict(spec.constexprs), spec.num_warpgroups, spec.cluster)


def check_and_infer(kernel, spec: Specialization):
    """The rules that need the traced kernel with its specialization and target, then layout inference: after
    this the kernel is the program the lowering emits (and the interpreter runs). Returns the Target."""
    from . import infer, targets
    _check_specialization(kernel, spec)
    target = targets.get(spec.target, kernel.loc)
    _check_parameter_space(kernel, target)
    for op in kernel.walk():
        if op.requires is not None:
            targets.check_unit(target, op.requires, f"`{op.name}`", op.loc)
    infer.infer_layouts(kernel)
    return target


def compile_specialization(source: SourceFunction, spec: Specialization, key: str) -> CompiledKernel:
    """Trace, check, infer, lower and assemble one specialization of a kernel."""
    from . import ir, lower, mlir, toolchain  # the stages: see the module docstring
    start = time.perf_counter()
    params = spec.params()
    kernel = trace(source, spec)
    target = check_and_infer(kernel, spec)
    by_value: dict[int, Any] = {}
    for v, a in zip(kernel.args, spec.args):
        if isinstance(a, TensorSpec):
            by_value[v.id] = a
        elif a.divisor is not None:
            by_value[v.id] = a.divisor
    ir_text = ir.format_kernel(kernel)
    lowered = lower.lower(kernel, by_value, target, toolchain.libdevice_path)
    mlir_text = str(lowered.module)
    try:
        ptx = mlir.to_ptx(lowered.module)
    except Exception as e:  # an MLIR diagnostic: our bug, but say which kernel and keep the details
        raise CompileError(f"internal error while lowering kernel {kernel.name} to PTX: {e}", kernel.loc) from None
    cubin, report = toolchain.assemble(ptx, target.name, kernel.name)
    meta = {"name": kernel.name, "target": target.name, "mgjit_version": VERSION,
            "specialization": spec.describe(),
            "params": [{"kind": p.kind, "rank": p.rank, "mlir": p.dtype.mlir, "dtype": p.dtype.name, "name": p.name}
                       for p in params],
            "registers": report.registers, "spills": report.spills, "smem_bytes": lowered.smem_bytes,
            "threads": lowered.threads, "num_warpgroups": spec.num_warpgroups, "cluster": list(spec.cluster),
            "tma": [{"param": d.param, "box": list(d.box), "swizzle": d.swizzle} for d in kernel.tma_descriptors],
            "warnings": report.warnings, "compile_seconds": round(time.perf_counter() - start, 4)}
    files = {"kernel.cubin": cubin, "kernel.ptx": ptx.encode(), "kernel.ir": ir_text.encode(),
             "kernel.mlir": mlir_text.encode(), "ptxas.txt": report.text.encode()}
    return CompiledKernel(kernel.name, key, target.name, meta, files)


def _warn(compiled: CompiledKernel, source: SourceFunction) -> None:
    """ptxas' warnings about a kernel (and any spill), as Python warnings at the kernel's definition: when it
    is compiled, and again when a process first loads it from the cache."""
    loc = source.loc(source.node)
    for text in compiled.meta.get("warnings", []):
        warnings.warn_explicit(f"{compiled.name} ({compiled.target}): ptxas: {text}", PtxasWarning, loc.file,
                               loc.line)


def _check_parameter_space(kernel, target) -> None:
    """The launch's values must fit the target's parameter space (ptxas would stop with a bare error)."""
    fields = abi.kernel_fields([(p.kind, p.dtype, p.rank) for p in kernel.params], len(kernel.tma_descriptors))
    size = abi.buffer_layout(fields).size
    if size > target.param_bytes:
        tensors = sum(p.kind == "tensor" for p in kernel.params)
        raise CompileError(f"{kernel.name}'s parameters take {size} bytes ({tensors} tensors, each an address and a "
                           f"size and stride per dimension, plus scalars and TMA descriptors), more than the "
                           f"{target.param_bytes} bytes a {target.name} kernel can take; pass fewer tensors, or "
                           "views with fewer dimensions", kernel.loc)


def _check_specialization(kernel, spec: Specialization) -> None:
    """The rules that need the traced kernel and the call's specialization together."""
    for desc in kernel.tma_descriptors:
        s = spec.args[desc.param]
        if s.align < 16 or not s.unit_stride:
            raise CompileError(
                f"argument `{spec.names[desc.param]}` is copied with TMA (copy_async), which needs a 16-byte "
                f"aligned base, row strides that are multiples of 16 bytes and a contiguous last dimension; "
                f"this call's tensor has {s.align}-byte alignment{'' if s.unit_stride else ' and a strided last dimension'}",
                kernel.loc, rule=Rule.TMA_ALIGNMENT)
    ctas = spec.cluster[0] * spec.cluster[1] * spec.cluster[2]
    if kernel.cta_group == 2 and ctas % 2:
        raise CompileError(f"{kernel.name} runs 2-CTA (collective) tcgen05 MMAs on CTA pairs: compile and launch it "
                           f"with a cluster of an even number of CTAs, e.g. cluster=(2, 1, 1); got {spec.cluster}",
                           kernel.loc, rule=Rule.CTA_GROUP)

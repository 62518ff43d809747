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
from .errors import (COMPILE_WARNINGS, CompileError, CompileWarning, PtxasWarning, Rule, compile_warning,
                     recording_compile_warnings, repeated_pass)
from .source import SourceFunction
from .specialize import Specialization, TensorSpec

# How the lowering sees a hidden buffer: an int32 vector with an aligned base, as the launcher allocates it.
HIDDEN_BUFFER = TensorSpec(dtypes.int32, 1, 16, True, 1)


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
        # The call's parameters (what its specialization decides), then the hidden buffers the compiler appended.
        self.params: list[dict] = meta["params"] + hidden_params(meta)
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

    @property
    def layouts(self):
        """The layouts inference chose (register arrays, SMEM buffers, TMEM references), drawable: shown inline
        in a notebook, `.save("layouts.png")` elsewhere (see mgjit/draw.py)."""
        from .draw import KernelLayouts
        return KernelLayouts(self.name, self.meta.get("layouts"))

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
        compiled = load_cached(store, key, spec_meta(source.name, spec))
        if compiled is not None:
            _warn(compiled, source)
            return compiled
    compiled = compile_specialization(source, spec, key)
    _warn(compiled, source)
    if store is not None:
        store.put(key, compiled.files, compiled.meta)
    return compiled


def spec_meta(name: str, spec: Specialization) -> dict[str, Any]:
    """The part of a kernel's metadata that its specialization decides: a cache entry must agree with it."""
    return {"name": name, "target": spec.target, "mgjit_version": VERSION, "specialization": spec.describe(),
            "params": [{"kind": p.kind, "rank": p.rank, "mlir": p.dtype.mlir, "dtype": p.dtype.name, "name": p.name}
                       for p in spec.params()],
            "num_warpgroups": spec.num_warpgroups, "cluster": list(spec.cluster)}


def load_cached(store, key: str, expected: dict[str, Any]) -> CompiledKernel | None:
    """The kernel stored under `key` in `store` (a cache.Store), or None. Its meta must hold `expected`
    (spec_meta) and every file and field this mgjit reads: an entry of another build is a miss with one
    warning, never a crash."""
    from .cache import Wanted
    entry = store.get(key, wanted=Wanted(expected, ARTIFACTS, check_meta))
    if entry is None:
        return None
    compiled = CompiledKernel(expected["name"], key, expected["target"], dict(entry.meta),
                              {n: entry.read(n) for n in ARTIFACTS})
    compiled.from_cache = True
    return compiled


def _count(value: Any, what: str, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise ValueError(f"{what} is {str(value)[:20]!r}, not an int >= {low}")
    return value


def hidden_params(meta: dict) -> list[dict]:
    """The parameters of a kernel's hidden buffers (mgjit.print, profiling), after the call's, in their order."""
    hidden = sorted(meta.get("hidden_buffers", {}).items(), key=lambda item: item[1]["param"])
    return [{"kind": "tensor", "rank": HIDDEN_BUFFER.rank, "mlir": HIDDEN_BUFFER.dtype.mlir,
             "dtype": HIDDEN_BUFFER.dtype.name, "name": f"mgjit.{name}"} for name, _ in hidden]


def check_meta(meta: dict) -> None:
    """ValueError (or KeyError, TypeError) unless `meta` holds every field, of the right type, that a
    CompiledKernel, its launcher and the autotuner read."""
    for field in ("registers", "spills", "smem_bytes", "threads", "num_warpgroups"):
        _count(meta[field], field)
    params = meta["params"]
    for p in params:
        if not (isinstance(p["name"], str) and isinstance(p["mlir"], str) and p["kind"] in ("tensor", "scalar")):
            raise ValueError(f"bad parameter {str(p)[:40]}")
        abi.param_fields(p["kind"], dtypes.BY_NAME[p["dtype"]], _count(p["rank"], "rank"))
    if len(meta["cluster"]) != 3:
        raise ValueError("cluster is not three sizes")
    for n in meta["cluster"]:
        _count(n, "cluster size", 1)
    for d in meta["tma"]:
        if _count(d["param"], "tma param") >= len(params) or params[d["param"]]["kind"] != "tensor":
            raise ValueError("a TMA descriptor names no tensor parameter")
        _count(d["swizzle"], "swizzle")
        for n in d["box"]:
            _count(n, "box size", 1)
    hidden = sorted(d["param"] for d in meta.get("hidden_buffers", {}).values())
    if hidden != list(range(len(params), len(params) + len(hidden))):
        raise ValueError("the hidden buffers do not follow the call's parameters")
    if not all(isinstance(w, str) for w in meta["warnings"]):
        raise ValueError("warnings are not text")
    for w in meta.get("compile_warnings", []):
        if not (w["category"] in COMPILE_WARNINGS and isinstance(w["message"], str) and isinstance(w["file"], str)):
            raise ValueError(f"bad compile warning {str(w)[:40]}")
        _count(w["line"], "warning line")


def trace(source: SourceFunction, spec: Specialization):
    """The IR of one specialization, as the frontend builds it (before layout inference)."""
    from . import frontend
    return frontend.trace(source, spec.params(), dict(spec.constexprs), spec.num_warpgroups, spec.cluster,
                          profile=spec.profile)


def check_and_infer(kernel, spec: Specialization):
    """The rules that need the traced kernel with its specialization and target, then layout inference: after
    this the kernel is the program the lowering emits (and the interpreter runs). Returns the Target."""
    from . import infer, targets
    _check_specialization(kernel, spec)
    _warn_replicated_stores(kernel)
    target = targets.get(spec.target, kernel.loc)
    _check_parameter_space(kernel, target)
    for op in kernel.walk():
        if op.requires is not None:
            targets.check_unit(target, op.requires, f"`{op.name}`", op.loc)
    infer.infer_layouts(kernel, specs_by_value(kernel, spec))
    return target


def specs_by_value(kernel, spec: Specialization) -> dict[int, Any]:
    """What the specialization knows of each argument, by the id of its value in the kernel: a TensorSpec for a
    tensor, the known divisor of an int scalar (none: absent)."""
    by_value: dict[int, Any] = {}
    # The hidden buffers (mgjit.print, profiling) follow the call's arguments: int32 vectors the launcher makes.
    hidden = (HIDDEN_BUFFER,) * (len(kernel.args) - len(spec.args))
    for v, a in zip(kernel.args, spec.args + hidden):
        if isinstance(a, TensorSpec):
            by_value[v.id] = a
        elif a.divisor is not None:
            by_value[v.id] = a.divisor
    return by_value


def compile_specialization(source: SourceFunction, spec: Specialization, key: str) -> CompiledKernel:
    """Trace, check, infer, lower and assemble one specialization of a kernel."""
    start = time.perf_counter()
    with recording_compile_warnings() as given:
        kernel = trace(source, spec)
        target = check_and_infer(kernel, spec)
        return _lower_and_assemble(kernel, target, spec, key, start, given)


def _lower_and_assemble(kernel, target, spec: Specialization, key: str, start: float,
                        given: list[dict]) -> CompiledKernel:
    """Lower an inferred kernel and assemble it; `given`: the compile warnings so far (more may come)."""
    from . import draw, ir, lower, mlir, toolchain  # the stages: see the module docstring
    by_value = specs_by_value(kernel, spec)
    ir_text = ir.format_kernel(kernel)

    def build(rematerialize: bool):
        lowered = lower.lower(kernel, by_value, target, toolchain.libdevice_path, rematerialize)
        mlir_text = str(lowered.module)
        try:
            ptx = mlir.to_ptx(lowered.module)
        except Exception as e:  # an MLIR diagnostic: our bug, but say which kernel and keep the details
            raise CompileError(f"internal error while lowering kernel {kernel.name} to PTX: {e}",
                               kernel.loc) from None
        return (lowered, mlir_text, ptx, *toolchain.assemble(ptx, target.name, kernel.name))

    built = build(False)
    if built[-1].spills:  # ptxas spilled: try SMEM addresses computed where they are used
        with repeated_pass():
            again = build(True)
        built = again if again[-1].spills < built[-1].spills else built
    lowered, mlir_text, ptx, cubin, report = built
    meta = {**spec_meta(kernel.name, spec), "target": target.name,
            "registers": report.registers, "spills": report.spills, "smem_bytes": lowered.smem_bytes,
            "threads": lowered.threads,
            "tma": [{"param": d.param, "box": list(d.box), "swizzle": d.swizzle} for d in kernel.tma_descriptors],
            "warnings": report.warnings, "compile_warnings": given, "layouts": draw.kernel_layouts(kernel),
            "compile_seconds": round(time.perf_counter() - start, 4)}
    if kernel.hidden_buffers:
        meta["hidden_buffers"] = kernel.hidden_buffers
    files = {"kernel.cubin": cubin, "kernel.ptx": ptx.encode(), "kernel.ir": ir_text.encode(),
             "kernel.mlir": mlir_text.encode(), "ptxas.txt": report.text.encode()}
    return CompiledKernel(kernel.name, key, target.name, meta, files)


def _warn(compiled: CompiledKernel, source: SourceFunction) -> None:
    """ptxas' warnings about a kernel (and any spill), as Python warnings at the kernel's definition: when it
    is compiled, and again when a process first loads it from the cache, with the compile's warnings about the
    kernel's lines (given while it compiled: errors.compile_warning)."""
    if compiled.from_cache:
        for w in compiled.meta.get("compile_warnings", []):
            warnings.warn_explicit(w["message"], COMPILE_WARNINGS[w["category"]], w["file"], w["line"])
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


def _warn_replicated_stores(kernel) -> None:
    """Which warpgroups run a GMEM store (ops/warpgroups.py): warn where several write one window."""
    from .ops.warpgroups import replicated_stores
    for op, runners in replicated_stores(kernel):
        loc = op.loc or kernel.loc
        compile_warning(
            f"{kernel.name}: warpgroups {runners} all run this GMEM store, at a window that does not depend on the "
            f"warpgroup: each writes it again (a race if their values differ). Every warpgroup runs what is not "
            f"under a branch on mgjit.warpgroup_id(): put the store under one (`if wg == 1:`), or index its window "
            f"by the warpgroup", CompileWarning, loc)


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

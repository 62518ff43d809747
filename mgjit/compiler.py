"""One specialization of a kernel, from IR to cubin: layout inference, lowering, the MLIR pipeline, ptxas."""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from . import infer, ir, mlir, toolchain
from .errors import CompileError


@dataclasses.dataclass
class Artifacts:
    cubin: bytes
    ptx: str
    ir_text: str
    mlir_text: str
    ptxas_report: str
    registers: int
    spills: int
    smem_bytes: int  # dynamic shared memory the launch must provide
    threads: int
    compile_seconds: float


_LIBDEVICE_UNARY = {"tanh", "erf", "sin", "cos"}


def needs_libdevice(kernel: ir.Kernel) -> bool:
    for op in kernel.walk():
        if isinstance(op, ir.Unary) and op.operands[0].dtype.is_float:
            if op.kind in _LIBDEVICE_UNARY or (op.operands[0].dtype.bits == 64 and op.kind not in ("neg", "abs", "sqrt")):
                return True
        if isinstance(op, ir.Binary) and op.kind == "pow" and op.operands[0].dtype.bits == 64:
            return True
    return False


def compile_ir(kernel: ir.Kernel, specs: dict[int, Any], target: str) -> Artifacts:
    from . import lowering  # imports MLIR-facing code only when compiling
    start = time.perf_counter()
    infer.infer_layouts(kernel)
    ir_text = ir.format_kernel(kernel)
    libdevice = toolchain.libdevice_path() if needs_libdevice(kernel) else None
    lowered = lowering.lower(kernel, specs, target, libdevice)
    mlir_text = str(lowered.module)
    try:
        ptx = mlir.to_ptx(lowered.module)
    except Exception as e:  # an MLIR diagnostic: our bug, but say which kernel and keep the details
        raise CompileError(f"internal error while lowering kernel {kernel.name} to PTX: {e}", kernel.loc) from None
    cubin, report = toolchain.assemble(ptx, target, kernel.name)
    return Artifacts(cubin=cubin, ptx=ptx, ir_text=ir_text, mlir_text=mlir_text, ptxas_report=report.text,
                     registers=report.registers, spills=report.spills, smem_bytes=lowered.smem_bytes,
                     threads=lowered.threads, compile_seconds=time.perf_counter() - start)

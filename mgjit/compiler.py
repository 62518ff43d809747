"""One specialization of a kernel, from IR to cubin: layout inference, lowering, the MLIR pipeline, ptxas."""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from . import infer, ir, lower, mlir, targets, toolchain
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


def compile_ir(kernel: ir.Kernel, specs: dict[int, Any], target: str) -> Artifacts:
    start = time.perf_counter()
    target_info = targets.get(target, kernel.loc)
    infer.infer_layouts(kernel)
    ir_text = ir.format_kernel(kernel)
    lowered = lower.lower(kernel, specs, target_info, toolchain.libdevice_path)
    mlir_text = str(lowered.module)
    try:
        ptx = mlir.to_ptx(lowered.module)
    except Exception as e:  # an MLIR diagnostic: our bug, but say which kernel and keep the details
        raise CompileError(f"internal error while lowering kernel {kernel.name} to PTX: {e}", kernel.loc) from None
    cubin, report = toolchain.assemble(ptx, target, kernel.name)
    return Artifacts(cubin=cubin, ptx=ptx, ir_text=ir_text, mlir_text=mlir_text, ptxas_report=report.text,
                     registers=report.registers, spills=report.spills, smem_bytes=lowered.smem_bytes,
                     threads=lowered.threads, compile_seconds=time.perf_counter() - start)

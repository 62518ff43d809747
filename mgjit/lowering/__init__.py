"""IR → MLIR (gpu.module with one llvm.func kernel). One rule per IR op, registered in `core.RULES`."""
from __future__ import annotations

import dataclasses
from typing import Any

from .. import ir, mlir
from ..layouts import THREADS_PER_WARPGROUP
from . import blackwell, control, elementwise, hopper, memory, reduce  # noqa: F401  (register their rules)
from .core import RULES, Context, LoweredRef, TensorSpec
from .emit import Emitter

# PTX ISA version each target is compiled with (wgmma needs 8.0 on sm_90a; tcgen05 8.6 on sm_100a).
TARGET_FEATURES = {"sm_90a": "+ptx80", "sm_100a": "+ptx86"}


@dataclasses.dataclass
class LoweredKernel:
    module: Any  # the MLIR module
    smem_bytes: int
    uses_libdevice: bool
    threads: int


def _param_types(kernel: ir.Kernel) -> list[str]:
    types = []
    for p in kernel.params:
        if p.kind == "tensor":
            types += ["!llvm.ptr<1>"] + ["i32"] * p.rank + ["i64"] * p.rank
        else:
            types.append(p.dtype.mlir)
    # TMA descriptors: 128-byte, 64-byte aligned by-value parameters the kernel reads in place.
    types += ["!llvm.ptr {llvm.byval = !llvm.array<128 x i8>, llvm.align = 64 : i64, nvvm.grid_constant}"] * \
        len(kernel.tma_descriptors)
    return types


def lower_ops(ctx: Context, ops: list[ir.Op]) -> None:
    for op in ops:
        fn = RULES.get(type(op))
        if fn is None:
            raise op.error(f"internal error: no lowering rule for `{op.name}`")
        fn(op, ctx)


def lower(kernel: ir.Kernel, specs: dict[int, Any], target: str, libdevice: str | None = None) -> LoweredKernel:
    """Build the MLIR module for a kernel whose layouts are inferred.

    `specs` maps each parameter Value id to its TensorSpec (tensors) or known divisor (int scalars).
    """
    if target not in TARGET_FEATURES:
        raise ir.CompileError(f"unknown target {target!r}; mgjit compiles for {sorted(TARGET_FEATURES)}",
                              kernel.loc, rule="target")
    m = mlir.load()
    threads = THREADS_PER_WARPGROUP * kernel.num_warpgroups
    ctx_mlir = m.ir.Context()
    # No MLIR thread pool: one module per compile gains nothing from it, and a context collected in a
    # forked autotune worker would wait forever for pool threads that did not survive the fork.
    ctx_mlir.enable_multithreading(False)
    with ctx_mlir, m.ir.Location.unknown():
        sig = ", ".join(f"%a{i}: {t}" for i, t in enumerate(_param_types(kernel)))
        link = f', link = ["{libdevice}"]' if libdevice else ""
        text = (
            'module attributes {gpu.container_module} {\n'
            f'  gpu.module @mgjit [#nvvm.target<chip = "{target}", features = "{TARGET_FEATURES[target]}", O = 3{link}>] {{\n'
            '    llvm.mlir.global external @__mgjit_smem() {addr_space = 3 : i32, alignment = 1024 : i64} '
            ': !llvm.array<0 x i8>\n'
            f'    llvm.func @{kernel.name}({sig}) attributes {{gpu.kernel, nvvm.kernel, '
            f'nvvm.maxntid = array<i32: {threads}, 1, 1>, nvvm.minctasm = 1 : i32}} {{\n'
            '      llvm.return\n    }\n  }\n}\n')
        module = m.ir.Module.parse(text)
        gpu_module = module.body.operations[0]
        gpu_block = gpu_module.regions[0].blocks[0]
        func = gpu_block.operations[1]
        func_block = func.regions[0].blocks[0]
        emitter = Emitter(m, module, func_block, gpu_block)
        with emitter.ip[0]:
            ctx = Context(kernel, emitter, specs)
            ctx.target = target  # rules that need a newer architecture check it
            args = list(func_block.arguments)
            pos = 0
            for p, v in zip(kernel.params, kernel.args):
                if p.kind == "tensor":
                    ptr = emitter.ptr_to_int(args[pos])
                    sizes = args[pos + 1:pos + 1 + p.rank]
                    strides = args[pos + 1 + p.rank:pos + 1 + 2 * p.rank]
                    ctx.set(v, LoweredRef(ptr, list(sizes), list(strides), specs[v.id], p.dtype))
                    pos += 1 + 2 * p.rank
                else:
                    ctx.set(v, args[pos])
                    pos += 1
            ctx.tma_descriptors = [emitter.ptr_to_int(a) for a in args[pos:]]
            lower_ops(ctx, kernel.body.ops)
        return LoweredKernel(module, ctx.smem_bytes, bool(emitter.libdevice_decls), threads)


__all__ = ["lower", "LoweredKernel", "TensorSpec", "TARGET_FEATURES"]

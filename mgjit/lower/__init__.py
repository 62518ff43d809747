"""IR → MLIR: a gpu.module holding one llvm.func kernel, built by one rule per IR op.

This is the driver. The rules live beside their ops in `mgjit/ops/` and register with
`@lower.rule(OpClass)`; `Context` (context.py) holds the lowered values and `Emitter` (emit.py) the MLIR
builders. MLIR itself is imported only when `lower()` runs.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .. import abi, ir, mlir, targets
from ..errors import Rule
from ..layouts import THREADS_PER_WARPGROUP
from ..registry import RuleRegistry
from .context import Context, Frag, LoweredRef
from .emit import Emitter

LowerRule = Callable[[ir.Op, Context], None]
RULES: RuleRegistry[LowerRule] = RuleRegistry("lowering")
rule = RULES.rule
# Fusions: tried before an op's rule; one that returns True has lowered the op (from its operands' `Deferred`
# partials), False leaves it to the rule.
FusionRule = Callable[[ir.Op, Context], bool]
FUSIONS: RuleRegistry[FusionRule] = RuleRegistry("fusion")
fusion = FUSIONS.rule


@dataclasses.dataclass
class LoweredKernel:
    module: Any  # the MLIR module
    smem_bytes: int
    threads: int


def lower_ops(ctx: Context, ops: list[ir.Op]) -> None:
    for op in ops:
        fuse = FUSIONS.get(type(op))
        if fuse is not None and fuse(op, ctx):
            continue
        fn = RULES.get(type(op))
        if fn is None:
            raise op.error(f"internal error: no lowering rule for `{op.name}`")
        before = ctx.smem_bytes
        fn(op, ctx)
        # Every byte of shared memory a kernel takes counts: its buffers, and the scratch that cross-warp
        # reductions, relayouts and TMEM bookkeeping take; the op that goes over the limit is the one named.
        if ctx.smem_bytes > ctx.target.smem_bytes and ctx.smem_bytes > before:
            raise over_smem_budget(op, ctx.smem_bytes, ctx.target.smem_bytes)


def over_smem_budget(op: ir.Op, needed: int, limit: int) -> Exception:
    """The error naming `op` as the one that takes a kernel's shared memory to `needed` bytes, past `limit` (the
    interpreter raises it too, for the buffers it lays out)."""
    what = "this allocation" if op.name == "smem_alloc" else (
        f"this {op.name} (its shared-memory scratch: a reduction across warps, a relayout or TMEM bookkeeping)")
    return op.error(f"shared memory: the kernel needs {needed} bytes by {what}, more than the {limit} bytes a CTA "
                    f"can have (fewer stages or smaller tiles)", rule=Rule.SMEM_BUDGET)


def lower_block(ctx: Context, block: ir.Block) -> list:
    """Lower a region's ops (all but its terminator); returns the flat values its Yield yields."""
    lower_ops(ctx, block.ops[:-1])
    terminator = block.ops[-1]
    return [x for v in terminator.operands for x in flatten(ctx.get(v))]


def flatten(lowered) -> list:
    """The MLIR values a lowered value travels as through a region boundary (a Frag as its elements)."""
    return list(lowered.elems) if isinstance(lowered, Frag) else [lowered]


def _nvvm_target(target: targets.Target, libdevice: str | None) -> str:
    link = f', link = ["{libdevice}"]' if libdevice else ""
    return f'[#nvvm.target<chip = "{target.name}", features = "{target.ptx_features}", O = 3{link}>]'


def lower(kernel: ir.Kernel, specs: dict[int, Any], target: targets.Target,
          libdevice: Callable[[], str], rematerialize: bool = False) -> LoweredKernel:
    """Build the MLIR module for a kernel whose layouts are inferred.

    `specs` maps each parameter Value id to its TensorSpec (tensors) or known divisor (int scalars);
    `libdevice` finds libdevice, which is linked when a rule called into it; `rematerialize`: the SMEM addresses
    of register arrays' loads and stores are computed at each use (Context.rematerialize).
    """
    m = mlir.load()
    threads = THREADS_PER_WARPGROUP * kernel.num_warpgroups
    ctx_mlir = m.ir.Context()
    # No MLIR thread pool: one module per compile gains nothing from it, and a context collected in a
    # forked autotune worker would wait forever for pool threads that did not survive the fork.
    ctx_mlir.enable_multithreading(False)
    with ctx_mlir, m.ir.Location.unknown():
        fields = abi.kernel_fields([(p.kind, p.dtype, p.rank) for p in kernel.params], len(kernel.tma_descriptors))
        sig = ", ".join(f"%a{i}: {f.mlir}" for i, f in enumerate(fields))
        text = (
            'module attributes {gpu.container_module} {\n'
            f'  gpu.module @mgjit {_nvvm_target(target, None)} {{\n'
            '    llvm.mlir.global external @__mgjit_smem() {addr_space = 3 : i32, alignment = 1024 : i64} '
            ': !llvm.array<0 x i8>\n'
            f'    llvm.func @{abi.symbol(kernel.name)}({sig}) attributes {{gpu.kernel, nvvm.kernel, '
            f'nvvm.maxntid = array<i32: {threads}, 1, 1>, nvvm.minctasm = {kernel.min_ctas_per_sm} : i32}} {{\n'
            '      llvm.return\n    }\n  }\n}\n')
        module = m.ir.Module.parse(text)
        gpu_module = module.body.operations[0]
        gpu_block = gpu_module.regions[0].blocks[0]
        func = gpu_block.operations[1]
        func_block = func.regions[0].blocks[0]
        emitter = Emitter(m, module, func_block, gpu_block)
        with emitter.ip[0]:
            ctx = Context(kernel, emitter, specs, target, rematerialize)
            args = list(func_block.arguments)
            pos = 0
            for p, v in zip(kernel.params, kernel.args):
                mine = args[pos:pos + len(abi.param_fields(p.kind, p.dtype, p.rank))]
                pos += len(mine)
                if p.kind == "tensor":  # pointer, sizes, strides
                    ptr, sizes, strides = emitter.ptr_to_int(mine[0]), mine[1:1 + p.rank], mine[1 + p.rank:]
                    ctx.set(v, LoweredRef(ptr, list(sizes), list(strides), specs[v.id], p.dtype))
                else:
                    ctx.set(v, mine[0])
            ctx.tma_descriptors = [emitter.ptr_to_int(a) for a in args[pos:]]
            lower_ops(ctx, kernel.body.ops)
        if emitter.libdevice_decls:  # link libdevice exactly when a rule called into it
            gpu_module.attributes["targets"] = m.ir.Attribute.parse(_nvvm_target(target, libdevice()))
        # Whole 16-byte chunks: buffers are 16-byte aligned, so LLVM may widen a load of a small buffer's 12 bytes
        # (warpgroups' partial sums) to 16, and the last buffer's must stay inside the allocation.
        return LoweredKernel(module, -(-ctx.smem_bytes // 16) * 16, threads)

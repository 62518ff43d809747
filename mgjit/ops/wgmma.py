"""Hopper's warpgroup MMA: Wgmma (acc + a @ b on the tensor cores, asynchronous) and WgmmaWait.

The accumulator lives in registers in the WGMMA layout (an anchor for layout inference: a zeros splat moves
into it for free); A comes from SMEM or from registers in the same layout; B from SMEM. SMEM operands are
addressed by matrix descriptors over the column-block storage of smem.py. WgmmaWait returns the arrays it
carries as new values, so no read of an accumulator can be scheduled before the tensor cores are done.
"""
from __future__ import annotations

from typing import Generator, Sequence

import torch

from .. import dtypes, infer, interpret, lower
from .. import mma_descriptors as md
from ..errors import Loc, Rule
from ..interpret import numerics
from ..interpret.checker import Access, check_read
from ..interpret.scheduler import AsyncOp, Pending, Wait, Warpgroup
from ..ir import Op, Value, check, is_ref
from ..layouts import WGMMA
from .arrays import Relayout, Splat
from .program import Constant
from .smem import SmemTile, descriptor_fields, mma_operand, operand_descriptor, stored_k_major, tile_ranges


class Wgmma(Op):
    """acc + a @ b on the warpgroup's tensor cores, issued asynchronously (complete with WgmmaWait).
    `b` is an SMEM tile (K, N) (or a transposed view); `a` is an SMEM tile (M, K) or a 16-bit register
    array (M, K) in the WGMMA layout; acc is (M, N)."""

    name = "wgmma"
    requires = "wgmma"

    def __init__(self, acc: Value, a: Value, b: Value, loc: Loc | None):
        super().__init__([acc, a, b], [acc.type], loc)

    def verify(self):
        acc, a, b = self.operands

        def need(cond: bool, message: str) -> None:
            if not cond:
                raise self.error(message, rule=Rule.WGMMA_SHAPE)

        need(acc.is_array and len(acc.type.shape) == 2, "the wgmma accumulator is a 2D register array")
        a_in_registers = a.is_array
        if a_in_registers:
            need(len(a.type.shape) == 2 and a.dtype.bits == 16,
                 f"wgmma A from registers is a 2D f16/bf16 array, got {a.type}")
        for name, v in ((("b", b),) if a_in_registers else (("a", a), ("b", b))):
            need(is_ref(v, "smem") and v.type.rank == 2, f"wgmma operand {name} must be a 2D SMEM tile")
            need(v.type.swizzle is not None, f"wgmma operand {name} needs a swizzled SMEM tile "
                 "(mgjit.smem(..., swizzle=32/64/128))")
        (m, n), (ma, k), (kb, nb) = acc.type.shape, a.type.shape, b.type.shape
        need(m == ma and n == nb and k == kb,
             f"wgmma shapes do not chain: acc {acc.type.shape}, a {a.type.shape}, b {b.type.shape}")
        if m % 64:
            raise self.error(f"a warpgroup's wgmma accumulator has a multiple of 64 rows, got {m}", rule=Rule.WGMMA_SHAPE)
        need(a.dtype == b.dtype, f"wgmma operands differ in dtype: {a.dtype.name} and {b.dtype.name}")
        need(a.dtype in _PTX_TYPE and acc.dtype == dtypes.float32,
             f"mgjit's wgmma multiplies {', '.join(d.name for d in _PTX_TYPE)} operands into a float32 "
             f"accumulator; got {a.dtype.name} operands into {acc.dtype.name}")
        a_major = md.Major.MN if (not a_in_registers and a.type.transposed) else md.Major.K
        b_major = md.Major.K if b.type.transposed else md.Major.MN
        k_step = 256 // a.dtype.bits
        if k % k_step:
            raise self.error(f"the K extent of wgmma tiles must be a multiple of {k_step} for {a.dtype.name}, "
                             f"got {k}", rule=Rule.WGMMA_SHAPE)
        try:
            md.check_wgmma_shape(64, n, k_step, a.dtype, acc.dtype, a_major, b_major)
            for v in ((b,) if a_in_registers else (a, b)):
                rows, cols = v.type.shape if not v.type.transposed else v.type.shape[::-1]
                md.check_swizzle(v.type.swizzle)
                if (cols * v.dtype.bits // 8) % v.type.swizzle:
                    raise md.DescriptorError(
                        f"a {v.type.swizzle}B-swizzled tile needs rows that are a multiple of {v.type.swizzle} "
                        f"bytes, got {cols} x {v.dtype.name} = {cols * v.dtype.bits // 8} bytes")
        except md.DescriptorError as e:
            raise self.error(str(e), rule=Rule.WGMMA_SHAPE) from None


class WgmmaWait(Op):
    """Wait until at most `pending` wgmma groups are in flight. The arrays it carries (accumulators) are
    returned as its results, so no read of them can be scheduled before the wait."""

    name = "wgmma_wait"
    requires = "wgmma"

    def __init__(self, pending: int, arrays: Sequence[Value], loc: Loc | None):
        super().__init__(arrays, [a.type for a in arrays], loc)
        self.pending = pending

    def attrs(self):
        return {"pending": self.pending}

    def verify(self):
        check(0 <= self.pending <= 7, self, f"wgmma_wait takes 0..7 pending groups, got {self.pending}")


@infer.rule(Wgmma)
def _infer_wgmma(op: Wgmma, inf: infer.Inference) -> None:
    """The accumulator lives in the WGMMA layout (an anchor): a zeros splat moves into it for free."""
    if op.operands[0].layout != WGMMA:
        inf.relayout(inf.current_block, op, 0, WGMMA)
    a = op.operands[1]
    if a.is_array and a.layout != WGMMA:  # A from registers: the wgmma operand fragment is the WGMMA layout
        inf.move_or_relayout(op, 1, WGMMA)
    inf.set_layout(op.result, WGMMA, op)


@infer.rule(WgmmaWait)
def _infer_wgmma_wait(op: WgmmaWait, inf: infer.Inference) -> None:
    for x, r in zip(op.operands, op.results):
        inf.set_layout(r, x.layout, op)


# ---------------------------------------------------------------------------------------------- lowering

_PTX_TYPE = {dtypes.bfloat16: "bf16", dtypes.float16: "f16", dtypes.float32: "tf32",
             dtypes.float8_e4m3fn: "e4m3", dtypes.float8_e5m2: "e5m2"}


@lower.rule(Wgmma)
def _wgmma(op: Wgmma, ctx: lower.Context) -> None:
    e = ctx.e
    acc: lower.Frag = ctx.frag(op.operands[0])
    a = ctx.get(op.operands[1])  # an SmemTile, or a Frag for A from registers
    b: SmemTile = ctx.get(op.operands[2])
    m, n = op.result.type.shape
    a_regs = isinstance(a, lower.Frag)
    k = op.operands[1].type.shape[1]
    dtype = op.operands[1].dtype
    k_step = 256 // dtype.bits
    a_k_major = a_regs or stored_k_major(a.type, 1)
    b_k_major = stored_k_major(b.type, 0)
    ab = _PTX_TYPE[dtype]
    per_tile = n // 2  # accumulator registers per thread per m64 tile
    f32 = e.type(dtypes.float32)
    # A zeros accumulator is not materialised: the first MMA of each tile ignores it (scale-d = 0).
    zero_init = _is_zeros(op.operands[0])
    elems = [e.m.llvm.mlir_undef(f32)] * len(acc.elems) if zero_init else list(acc.elems)
    steps = k // k_step
    words: list = []
    if a_regs:
        # The A fragment of one m64k16 step: 8 elements per thread, (column block, row half, pair) in the WGMMA
        # layout's register order, packed into 4 b32 registers a0..a3; all of them before the fence.
        per_block = k // 8 * 2 * 2  # elements per m64 tile of A, per thread
        for t in range(m // 64):
            for kk in range(steps):
                chunk = a.elems[t * per_block + kk * 8:t * per_block + kk * 8 + 8]
                words += [e.pack_i32([e.bitcast(x, e.int_type(16)) for x in chunk[i:i + 2]]) for i in range(0, 8, 2)]
    # Every register the wgmmas read (the A fragment, the accumulator) must be written before wgmma.fence, or
    # ptxas serializes them: they pass through the fence as tied operands, so that no write of them can be
    # scheduled after it.
    fenced = [*words, *([] if zero_init else elems)]
    if fenced:
        cons = ["r"] * len(words) + ["f"] * (len(fenced) - len(words))
        fenced = e.asm("wgmma.fence.sync.aligned;", ",".join([f"={c}" for c in cons] + [str(i) for i in range(len(cons))]),
                       fenced, [x.type for x in fenced], side_effects=True)
        words, elems = fenced[:len(words)], (elems if zero_init else fenced[len(words):])
    else:
        e.asm_void("wgmma.fence.sync.aligned;", "", [])
    one = e.i32(1)
    descriptors = _Descriptors(ctx)
    for t in range(m // 64):
        regs = elems[t * per_tile:(t + 1) * per_tile]
        for kk in range(steps):
            scale_d = e.i32(0) if zero_init and kk == 0 else one
            nb = per_tile + (4 if a_regs else 1)  # the asm's operands: outputs, A (registers or a descriptor), B
            db, b_text = descriptors.operand(b, 0, kk * k_step, b_k_major, f"${nb}", "db")
            outs = ", ".join(f"${i}" for i in range(per_tile))
            if a_regs:
                a_ops = words[(t * steps + kk) * 4:(t * steps + kk) * 4 + 4]
                a_text = "{" + ", ".join(f"${per_tile + i}" for i in range(4)) + "}"
                a_cons = ["r"] * 4
            else:
                da, a_text = descriptors.operand(a, t * 64, kk * k_step, a_k_major, f"${per_tile}", "da")
                a_ops, a_cons = [da], ["l"]
            # Only 16-bit operands have the transpose immediates (tf32 and fp8 must be K-major); A in
            # registers has only B's.
            if dtype.bits != 16:
                transposes = ""
            elif a_regs:
                transposes = f", {0 if b_k_major else 1}"
            else:
                transposes = f", {0 if a_k_major else 1}, {0 if b_k_major else 1}"
            text = (f"{{ .reg .pred p; {descriptors.take_prelude()}setp.ne.b32 p, ${nb + 1}, 0; "
                    f"wgmma.mma_async.sync.aligned.m64n{n}k{k_step}.f32.{ab}.{ab} {{{outs}}}, {a_text}, "
                    f"{b_text}, p, 1, 1{transposes}; }}")
            constraints = ",".join(["=f"] * per_tile + a_cons + ["l", "r"] + [str(i) for i in range(per_tile)])
            regs = e.asm(text, constraints, [*a_ops, db, scale_d, *regs], [f32] * per_tile, side_effects=True)
        elems[t * per_tile:(t + 1) * per_tile] = regs
    e.asm_void("wgmma.commit_group.sync.aligned;", "", [])
    ctx.set(op.result, lower.Frag(acc.layout, acc.shape, acc.dtype, elems))


class _Descriptors:
    """The SMEM descriptors of one Wgmma's k-steps: the descriptor of each operand tile's start, an asm operand,
    plus the step's offset added inside the wgmma's asm (one add.s64 a step, where a descriptor formed from its
    address takes five: add, shift, mask, widen, or; a ring slot's tile is known only in the loop, so a 128x64
    k-iteration formed eight of them). Formed outside the asm, LLVM would also hoist loop-invariant descriptors
    out of the loop, where they stay live beside the accumulators. The start address field holds bytes / 16
    of an address below 2^18, so adding the offset's bytes / 16 to the descriptor carries into no other
    field."""

    def __init__(self, ctx: lower.Context):
        self.ctx = ctx
        self.bases: dict[str, object] = {}  # by the asm's name of the operand's descriptor
        self.prelude: list[str] = []

    def operand(self, tile: SmemTile, mn: int, k: int, k_major: bool, arg: str, name: str) -> tuple[object, str]:
        """(the asm operand, how the wgmma names its descriptor) for the block at (mn, k) of a tile, whose
        operand the asm calls `arg`; `name`: a register of the asm's own for the sum."""
        if name not in self.bases:
            self.bases[name] = operand_descriptor(self.ctx, tile, 0, 0, k_major)
        offset = descriptor_fields(tile.type, mn, k, k_major)[0] - descriptor_fields(tile.type, 0, 0, k_major)[0]
        if not offset:
            return self.bases[name], arg
        self.prelude.append(f".reg .b64 {name}; add.s64 {name}, {arg}, {offset >> 4}; ")
        return self.bases[name], name

    def take_prelude(self) -> str:
        """The asm that forms this step's descriptors (then forgotten: the next step forms its own)."""
        text, self.prelude = "".join(self.prelude), []
        return text


def _is_zeros(v: Value) -> bool:
    """An accumulator that is a splat of the constant 0 (moved into the WGMMA layout by inference)."""
    op = v.owner
    if isinstance(op, Relayout):
        op = op.operands[0].owner
    if not isinstance(op, Splat):
        return False
    const = op.operands[0].owner
    return isinstance(const, Constant) and const.value == 0


@lower.rule(WgmmaWait)
def _wgmma_wait(op: WgmmaWait, ctx: lower.Context) -> None:
    e = ctx.e
    flat, where = [], []
    for v in op.operands:
        f = ctx.frag(v)
        where.append((len(flat), len(f.elems)))
        flat.extend(f.elems)
    if not flat:
        e.asm_void(f"wgmma.wait_group.sync.aligned {op.pending};", "", [])
        return
    cons = []
    for x in flat:
        cons.append("r" if str(x.type).startswith("i") else "f")
    constraints = ",".join([f"={c}" for c in cons] + [str(i) for i in range(len(flat))])
    out = e.asm(f"wgmma.wait_group.sync.aligned {op.pending};", constraints, flat, [x.type for x in flat],
                side_effects=True)
    for v, r, (start, count) in zip(op.operands, op.results, where):
        f = ctx.frag(v)
        ctx.set(r, lower.Frag(f.layout, f.shape, f.dtype, out[start:start + count]))


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(Wgmma)
def _interp_wgmma(op: Wgmma, wg: Warpgroup) -> None:
    """Issue one wgmma group: its SMEM operands must be ready (TMA copies waited for, stores fenced) now; they
    count as read until a wgmma_wait retires the group. The result is Pending until then; at completion each
    m64nNk instruction adds A @ B to the accumulator in f32, operands read through their descriptors."""
    acc_v, a_v, b_v = op.operands
    cta, engine = wg.cta, wg.engine
    acc = wg.raw(acc_v)
    if not isinstance(acc, Pending):
        acc = wg.get(acc_v, op)
    a = wg.get(a_v, op)
    b = wg.get(b_v, op)
    (m, n), k = op.result.type.shape, a_v.type.shape[1]
    k_step = 256 // a_v.dtype.bits
    a_k_major = a_v.is_array or stored_k_major(a.type, 1)
    b_k_major = stored_k_major(b.type, 0)
    queue = ("wgmma", cta.rank, wg.index)
    ordinal = engine.next_in(queue)
    for tile in ((b,) if a_v.is_array else (a, b)):
        for start, end in tile_ranges(tile):
            check_read(cta.smem_records, start, end, wg.clock, op.loc, "this wgmma")
            cta.smem_records.add(Access(start, end, "read", queue, ordinal, op.loc, "wgmma"))
    result = Pending(queue, ordinal, op.loc)

    def compute() -> None:
        d = (acc.value if isinstance(acc, Pending) else acc).to(torch.float32).clone()
        for t in range(m // 64):
            for kk in range(k // k_step):
                if a_v.is_array:
                    a_block = a[t * 64:(t + 1) * 64, kk * k_step:(kk + 1) * k_step]
                else:
                    a_block = mma_operand(cta, a, t * 64, 64, kk * k_step, k_step, a_k_major, tcgen05=False)
                b_block = mma_operand(cta, b, 0, n, kk * k_step, k_step, b_k_major, tcgen05=False)
                d[t * 64:(t + 1) * 64] += numerics.mma_input(a_block) @ numerics.mma_input(b_block).T
        result.value = d.to(numerics.torch_dtype(op.result.dtype))

    engine.issue(AsyncOp(queue, op.loc, "wgmma", compute, (cta,)))
    wg.set(op.result, result)


@interpret.rule(WgmmaWait)
def _interp_wgmma_wait(op: WgmmaWait, wg: Warpgroup) -> Generator[Wait, None, None]:
    """Block until at most `pending` groups are in flight; the arrays it carries come out computed where their
    group has retired, and still pending otherwise."""
    yield wg.wait_async(op, ("wgmma", wg.cta.rank, wg.index), op.pending, "wgmma_wait")
    for x, r in zip(op.operands, op.results):
        value = wg.raw(x)
        if isinstance(value, Pending) and wg.clock.get(value.key, 0) >= value.seq:
            value = value.value
        wg.set(r, value)

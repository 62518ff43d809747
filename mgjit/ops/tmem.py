"""Tensor memory (TMEM, Blackwell): TmemAlloc, TmemIndex (`ref[stage]`), TmemSlice (`ref[:, a:b]`), TmemLoad
(`ref.load()`), TmemStore (`ref.store(x)`) and TmemDealloc (the end of the kernel's tensor memory).

A TMEM reference's layout follows from its type (`tmem_layout`: 128 rows default; 64 rows half-lane, or m64
collective in a 2-CTA kernel; block scales their own); layout inference records it on the reference, and loads
and stores move data in the register layout that matches it (TCGEN05, WGMMA for half-lane, or the m64-collective
one). A reference may have a leading stage dimension, (stages, rows, cols): its stages sit side by side in the
columns, and `ref[i]` (a runtime index) is stage i, as a double-buffered accumulator needs.

Warp 0 allocates every TMEM reference of the kernel with one `tcgen05.alloc` (the sum of their columns, each
reference aligned to its own power-of-two size, rounded up to a power of two of at least 32), writes the address
to an SMEM word, relinquishes the allocation permit and synchronises the CTA (the CTA pair in a 2-CTA kernel)
with the tcgen05 fences around the barrier; every thread then reads the address. The end of the kernel
(TmemDealloc) synchronises again and warp 0 frees the columns. A TMEM address is lane << 16 | column; a lowered
reference is the address of its (lane 0, first column). tcgen05.ld/st follow `TMEMLayout.access`: every warp
addresses its own 32-lane quarter (warp w of a warpgroup may touch lanes 32w..32w+31 only). Loads are followed
by tcgen05.wait::ld with the loaded registers threaded through it, so no use of them can be scheduled before
the wait.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Generator, Sequence

import torch

from .. import dtypes, infer, interpret, ir, lower
from ..dtypes import DType
from ..errors import Check, InterpretError, Loc, Rule
from ..interpret import numerics
from ..interpret.checker import Access, check_freed, check_result_read, check_write
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import ArrayType, Op, TmemRefType, Value, check, is_int_scalar, is_ref
from ..layouts import LANES_PER_WARP, THREADS_PER_WARPGROUP, TiledLayout
from ..tmem_layouts import (TMEM_COLUMNS, ScaleLayout, TMEMLayout, TMEMLayoutError, infer_tmem_layout,
                            tmem_alloc_columns)
from .smem import shared_address

SCALE_DTYPES = (dtypes.float8_e8m0fnu, dtypes.float8_e4m3fn)


def tmem_layout(t: TmemRefType) -> TMEMLayout | ScaleLayout:
    """The layout of a TMEM reference type (of one stage); raises TMEMLayoutError for what TMEM cannot hold."""
    rows, cols = t.shape[-2:]
    if t.scales:
        return ScaleLayout(rows, cols)
    return infer_tmem_layout(rows, cols, t.dtype.bits, t.collective, t.packing)


def stages(t: TmemRefType) -> int:
    return t.shape[0] if len(t.shape) == 3 else 1


def _is_matrix(op: Op, v: Value, what: str) -> None:
    check(is_ref(v, "tmem") and len(v.type.shape) == 2, op,
          f"{what} a 2D TMEM reference; index a staged one first (ref[stage])")


def _tmem_layout_of(op: Op, t: TmemRefType):
    try:
        return tmem_layout(t)
    except TMEMLayoutError as e:
        raise op.error(str(e), rule=Rule.TMEM_LAYOUT) from None


class TmemAlloc(Op):
    """Tensor memory for the whole kernel. Warp 0 allocates every TMEM reference of the kernel at the first
    TmemAlloc (one tcgen05.alloc, then relinquish_alloc_permit); TmemDealloc frees it at the end."""

    name = "tmem_alloc"
    requires = "tcgen05"

    def __init__(self, shape: tuple[int, ...], dtype: DType, packing: int, collective: bool, loc: Loc | None,
                 scales: bool = False):
        t = TmemRefType("tmem", dtype, len(shape), tuple(shape), packing=packing, collective=collective,
                        scales=scales)
        super().__init__([], [t], loc)

    def attrs(self):
        t = self.result.type
        return {"shape": t.shape, "dtype": t.dtype.name, "packing": t.packing, "collective": t.collective,
                **({"scales": True} if t.scales else {})}

    def verify(self):
        t = self.result.type
        if len(t.shape) not in (2, 3):
            raise self.error(f"a TMEM reference is 2D (rows, cols), or 3D (stages, rows, cols), got shape {t.shape}",
                             rule=Rule.TMEM_LAYOUT)
        if t.scales and t.dtype not in SCALE_DTYPES:
            raise self.error(f"block scales are {' or '.join(d.name for d in SCALE_DTYPES)}, got {t.dtype.name}",
                             rule=Rule.TMEM_LAYOUT)


class TmemIndex(Op):
    """`ref[i]`: stage i (a runtime index) of a (stages, rows, cols) TMEM reference."""

    name = "tmem_index"
    requires = "tcgen05"

    def __init__(self, ref: Value, index: Value, loc: Loc | None):
        t = ref.type
        super().__init__([ref, index], [dataclasses.replace(t, rank=2, shape=tuple(t.shape[1:]))], loc)

    def verify(self):
        ref, index = self.operands
        check(is_ref(ref, "tmem") and len(ref.type.shape) == 3, self,
              f"only a staged TMEM reference (stages, rows, cols) is indexed by a stage, got {ref.type}")
        check(is_int_scalar(index), self, "a stage index must be an integer scalar")


class TmemSlice(Op):
    """`ref[:, start:start + size]`: static column range of a 128-row (default layout) TMEM reference."""

    name = "tmem_slice"
    requires = "tcgen05"

    def __init__(self, ref: Value, start: int, size: int, loc: Loc | None):
        t = ref.type
        super().__init__([ref], [dataclasses.replace(t, shape=(t.shape[0], size))], loc)
        self.start = start
        self.size = size

    def attrs(self):
        return {"start": self.start, "size": self.size}

    def verify(self):
        t = self.operands[0].type
        _is_matrix(self, self.operands[0], "columns are sliced of")
        check(not t.scales, self, "block scales are used whole by the MMA: slice their SMEM source instead")
        if t.shape[0] != 128:
            raise self.error(f"column slices are taken of 128-row TMEM references (the default layout); a "
                             f"{t.shape[0]}-row reference folds its columns over lanes, load it whole",
                             rule=Rule.TMEM_LAYOUT)
        if not (self.size > 0 and 0 <= self.start and self.start + self.size <= t.shape[1]):
            raise self.error(f"columns {self.start}:{self.start + self.size} are outside the {t.shape[1]} columns "
                             "of the TMEM reference", rule=Rule.TMEM_LAYOUT)
        if self.start % t.packing or self.size % t.packing:
            raise self.error(f"a TMEM slice covers whole 32-bit columns: start and size must be multiples of the "
                             f"packing {t.packing}, got {self.start} and {self.size}", rule=Rule.TMEM_LAYOUT)


class TmemLoad(Op):
    """TMEM → registers (tcgen05.ld, then tcgen05.wait::ld) by one warpgroup, in the register layout that
    matches the reference's TMEM layout (TCGEN05, WGMMA for half-lane, or the m64-collective one)."""

    name = "tmem_load"
    requires = "tcgen05"

    def __init__(self, ref: Value, loc: Loc | None):
        super().__init__([ref], [ArrayType(tuple(ref.type.shape), ref.dtype)], loc)

    def verify(self):
        _is_matrix(self, self.operands[0], "tmem_load reads")


class TmemStore(Op):
    """Registers → TMEM (tcgen05.st, tcgen05.wait::st) by one warpgroup; visible to MMAs it issues next."""

    name = "tmem_store"
    requires = "tcgen05"

    def __init__(self, ref: Value, value: Value, loc: Loc | None):
        super().__init__([ref, value], [], loc)

    def verify(self):
        ref, value = self.operands
        _is_matrix(self, ref, "tmem_store writes")
        shape = value.type.shape if value.is_array else ()
        check(shape == tuple(ref.type.shape), self,
               f"storing an array of shape {shape} into a TMEM reference of shape {tuple(ref.type.shape)}")
        check(value.dtype == ref.dtype, self,
               f"storing {value.dtype.name} into a {ref.dtype.name} TMEM reference; use .astype()")


class TmemDealloc(Op):
    """The end of the kernel's tensor memory: every thread is done with it, warp 0 frees it."""

    name = "tmem_dealloc"
    requires = "tcgen05"

    def __init__(self, refs: Sequence[Value], loc: Loc | None):
        super().__init__(refs, [], loc)


def _tmem_register_layout(op: Op, ref: Value) -> TiledLayout:
    try:
        return _tmem_layout_of(op, ref.type).register_layout(ref.dtype.bits)
    except TMEMLayoutError as e:
        raise op.error(f"{ref.type} cannot move through registers: {e}", rule=Rule.TMEM_LAYOUT) from None


@infer.rule(TmemAlloc, TmemIndex, TmemSlice)
def _infer_tmem_ref(op: Op, inf: infer.Inference) -> None:
    """A TMEM reference's layout (of one stage) follows from its type (128 rows: default; 64 rows: half-lane, or
    m64 collective in a 2-CTA kernel; packing from the dtype; scales); it is chosen here, recorded on the
    reference (where the IR printer shows it, and lowering and the MMA's checks read it), and an allocation
    must fit tcgen05.alloc: a power of two of at least 32 columns (of any size for scales, which the kernel's
    one allocation packs beside the others)."""
    t = op.result.type
    layout = op.result.layout = _tmem_layout_of(op, t)
    if isinstance(op, TmemAlloc):
        columns = stages(t) * layout.columns
        try:
            if not t.scales:
                tmem_alloc_columns(columns, exact=True)
            elif columns & (columns - 1):  # scales are small: any power of two packs without gaps
                raise TMEMLayoutError(f"{columns} columns")
        except TMEMLayoutError:
            what = "of block scales" if t.scales else f"in the {layout.kind.value} layout with packing {t.packing}"
            least = "" if t.scales else ", at least 32"
            raise op.error(
                f"tcgen05.alloc allocates a power of two in 32..{TMEM_COLUMNS} columns, but a "
                f"{'x'.join(map(str, t.shape))} {t.dtype.name} reference {what} occupies {columns} columns; give it "
                f"a power-of-two number of columns{least}", rule=Rule.TMEM_ALLOC) from None


@infer.rule(TmemLoad)
def _infer_tmem_load(op: TmemLoad, inf: infer.Inference) -> None:
    """An anchor: tcgen05.ld delivers the register layout that matches the TMEM layout (TCGEN05 for default,
    WGMMA for half-lane, the m64-collective layout)."""
    inf.set_layout(op.result, _tmem_register_layout(op, op.operands[0]), op)


@infer.rule(TmemStore)
def _infer_tmem_store(op: TmemStore, inf: infer.Inference) -> None:
    target = _tmem_register_layout(op, op.operands[0])
    value = op.operands[1]
    if value.layout == target:
        return
    # Data loaded from GMEM (or an iota) straight into the layout tcgen05.st needs, rather than relayouted.
    inf.move_or_relayout(op, 1, target)


infer.rule(TmemDealloc)(infer.no_arrays)


# ---------------------------------------------------------------------------------------------- lowering

@dataclasses.dataclass
class LoweredTmem:
    """A lowered TMEM reference."""

    addr: Any  # i32 TMEM address of its (lane 0, first column)
    type: TmemRefType
    layout: TMEMLayout | ScaleLayout  # of one stage


@dataclasses.dataclass
class _TmemState:
    """The kernel's one allocation (made at its first TmemAlloc)."""

    base: Any  # i32 TMEM address tcgen05.alloc returned
    columns: int  # the columns allocated
    cta_group: int
    offsets: dict[int, int]  # id(TmemAlloc) -> first column of its reference


def thread_sync(ctx: lower.Context, cta_group: int) -> None:
    """Order tcgen05 operations across all threads of the CTA (of both CTAs of a pair): fence, barrier, fence."""
    e = ctx.e
    e.asm_void("tcgen05.fence::before_thread_sync;", "", [])
    if cta_group == 2:
        e.asm_void("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;", "", [])
    else:
        e.asm_void("bar.sync 0;", "", [])
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])


def _warp0(ctx: lower.Context) -> Any:
    return ctx.e.cmpi("ult", ctx.tid, ctx.e.i32(LANES_PER_WARP))


def _alloc_columns(op: TmemAlloc) -> int:
    return stages(op.result.type) * op.result.layout.columns


def allocation_plan(kernel: ir.Kernel) -> tuple[dict[int, int], int]:
    """The first column of each TMEM reference (by id(TmemAlloc)) in the kernel's one allocation, and the
    columns tcgen05.alloc requests for it."""
    offsets, used = {}, 0
    # Largest first: powers of two then pack without gaps, each aligned to its own size.
    allocs = [o for o in kernel.body.ops if isinstance(o, TmemAlloc)]
    for o in sorted(allocs, key=lambda o: -_alloc_columns(o)):
        offsets[id(o)] = used
        used += _alloc_columns(o)
        if used > TMEM_COLUMNS:
            raise o.error(f"the kernel's TMEM references need {used} columns by this one, more than the "
                          f"{TMEM_COLUMNS} a CTA has", rule=Rule.TMEM_ALLOC)
    return offsets, tmem_alloc_columns(used)


def _allocate(op: TmemAlloc, ctx: lower.Context) -> _TmemState:
    cta_group = ctx.kernel.cta_group
    offsets, columns = allocation_plan(ctx.kernel)
    e = ctx.e
    slot = shared_address(ctx, e.i32(ctx.alloc_shared(4, 16)))
    warp0 = _warp0(ctx)
    e.asm_void(f"@$0 tcgen05.alloc.cta_group::{cta_group}.sync.aligned.shared::cta.b32 [$1], {columns};", "b,r",
               [warp0, slot])
    e.asm_void(f"@$0 tcgen05.relinquish_alloc_permit.cta_group::{cta_group}.sync.aligned;", "b", [warp0])
    thread_sync(ctx, cta_group)
    base = e.asm("ld.shared.b32 $0, [$1];", "=r,r", [slot], [ctx.e.int_type(32)], side_effects=True)[0]
    return _TmemState(base, columns, cta_group, offsets)


@lower.rule(TmemAlloc)
def _tmem_alloc(op: TmemAlloc, ctx: lower.Context) -> None:
    state = ctx.tmem
    if state is None:
        state = ctx.tmem = _allocate(op, ctx)
    offset = state.offsets[id(op)]
    addr = ctx.e.addi(state.base, ctx.e.i32(offset)) if offset else state.base
    ctx.set(op.result, LoweredTmem(addr, op.result.type, op.result.layout))


@lower.rule(TmemDealloc)
def _tmem_dealloc(op: TmemDealloc, ctx: lower.Context) -> None:
    state: _TmemState = ctx.tmem
    thread_sync(ctx, state.cta_group)
    ctx.e.asm_void(f"@$0 tcgen05.dealloc.cta_group::{state.cta_group}.sync.aligned.b32 $1, {state.columns};", "b,r",
                   [_warp0(ctx), state.base])


@lower.rule(TmemIndex)
def _tmem_index(op: TmemIndex, ctx: lower.Context) -> None:
    e = ctx.e
    src: LoweredTmem = ctx.get(op.operands[0])
    offset = e.muli(ctx.get(op.operands[1]), e.i32(src.layout.columns))
    ctx.set(op.result, LoweredTmem(e.addi(src.addr, offset), op.result.type, op.result.layout))


@lower.rule(TmemSlice)
def _tmem_slice(op: TmemSlice, ctx: lower.Context) -> None:
    src: LoweredTmem = ctx.get(op.operands[0])
    column = op.start // src.type.packing
    addr = ctx.e.addi(src.addr, ctx.e.i32(column)) if column else src.addr
    ctx.set(op.result, LoweredTmem(addr, op.result.type, op.result.layout))


def _register_index(layout, shape) -> dict[tuple[int, ...], int]:
    """Register-layout register index -> position of its first element in a Frag's `elems`."""
    regs = list(layout.registers(shape))
    return {r: i * layout.vector_length for i, r in enumerate(regs)}


def _warp_address(ctx: lower.Context, ref: LoweredTmem) -> Any:
    """The reference's address in this warp's 32-lane quarter."""
    e = ctx.e
    return e.addi(ref.addr, e.m.arith.shli(ctx.warp, e.i32(16 + 5)))  # (32 * warp) << 16


def _words_to_elems(ctx: lower.Context, word, dtype) -> list:
    e = ctx.e
    if dtype.bits == 32:
        return [e.bitcast(word, e.type(dtype)) if dtype.is_float else word]
    parts = e.unpack_i32(word, dtype.bits)
    return [e.bitcast(x, e.type(dtype)) if dtype.is_float else x for x in parts]


def _elems_to_word(ctx: lower.Context, elems: list, dtype) -> Any:
    e = ctx.e
    ints = [e.bitcast(x, e.int_type(dtype.bits)) if dtype.is_float else x for x in elems]
    return ints[0] if dtype.bits == 32 else e.pack_i32(ints)


@lower.rule(TmemLoad)
def _tmem_load(op: TmemLoad, ctx: lower.Context) -> None:
    e = ctx.e
    ref: LoweredTmem = ctx.get(op.operands[0])
    out = op.result
    dtype, shape, layout = out.dtype, out.type.shape, out.layout
    access = ref.layout.access(dtype.bits, layout)
    per_word = 32 // dtype.bits
    where = _register_index(layout, shape)
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])
    base = _warp_address(ctx, ref)
    words, slots = [], []
    for ins in access.instructions:
        n = len(ins.operands)
        addr = e.addi(base, e.i32((ins.lane_offset << 16) + ins.column_offset))
        outs = ", ".join(f"${i}" for i in range(n))
        words += e.asm(f"{access.opcode(ins)} {{{outs}}}, [${n}];", ",".join(["=r"] * n + ["r"]), [addr],
                       [ctx.e.int_type(32)] * n, side_effects=True)
        slots += [where[reg] + pos for reg, pos in ins.operands]
    # The registers pass through the wait, so that no use of them is scheduled before it.
    n = len(words)
    words = e.asm("tcgen05.wait::ld.sync.aligned;", ",".join(["=r"] * n + [str(i) for i in range(n)]), words,
                  [ctx.e.int_type(32)] * n, side_effects=True)
    # Order the loads before what a later barrier arrival lets another thread issue (an MMA into these columns).
    e.asm_void("tcgen05.fence::before_thread_sync;", "", [])
    elems: list[Any] = [None] * (len(where) * layout.vector_length)
    for word, slot in zip(words, slots, strict=True):
        elems[slot:slot + per_word] = _words_to_elems(ctx, word, dtype)
    assert all(x is not None for x in elems), "TMEM access plan does not cover the register layout"
    ctx.set(out, lower.Frag(layout, shape, dtype, elems))


@lower.rule(TmemStore)
def _tmem_store(op: TmemStore, ctx: lower.Context) -> None:
    e = ctx.e
    ref: LoweredTmem = ctx.get(op.operands[0])
    frag: lower.Frag = ctx.frag(op.operands[1])
    dtype, shape, layout = frag.dtype, frag.shape, frag.layout
    access = ref.layout.access(dtype.bits, layout)
    per_word = 32 // dtype.bits
    where = _register_index(layout, shape)
    base = _warp_address(ctx, ref)
    for ins in access.instructions:
        n = len(ins.operands)
        words = [_elems_to_word(ctx, frag.elems[where[reg] + pos:where[reg] + pos + per_word], dtype)
                 for reg, pos in ins.operands]
        addr = e.addi(base, e.i32((ins.lane_offset << 16) + ins.column_offset))
        srcs = ", ".join(f"${i + 1}" for i in range(n))
        e.asm_void(f"{access.opcode(ins, store=True)} [$0], {{{srcs}}};", ",".join(["r"] * (n + 1)), [addr, *words])
    e.asm_void("tcgen05.wait::st.sync.aligned;", "", [])
    # The MMA that reads this is issued by one thread of the warpgroup: make every warp's stores visible to it.
    e.asm_void("tcgen05.fence::before_thread_sync;", "", [])
    ctx.warpgroup_barrier()
    e.asm_void("tcgen05.fence::after_thread_sync;", "", [])


# ---------------------------------------------------------------------------------------------- interpreter
# A TMEM reference is a LoweredTmem whose address is its first column (an int): the kernel's allocation plan
# fixes it, so every warpgroup knows it from the start (`static_refs`) and a TMEM access that runs before the
# allocation does is caught. Loads and stores follow `TMEMLayout.access` instruction by instruction: each
# register of each thread moves the cells its tcgen05.ld/st shape gives it (`TMEMAccess.cell`), and holds the
# elements its register layout says.

def static_refs(kernel: ir.Kernel) -> dict[int, LoweredTmem]:
    """The value of every TmemAlloc result (by value id), from the allocation plan."""
    if not any(isinstance(op, TmemAlloc) for op in kernel.body.ops):
        return {}
    offsets, _ = allocation_plan(kernel)
    return {op.result.id: LoweredTmem(offsets[id(op)], op.result.type, tmem_layout(op.result.type))
            for op in kernel.body.ops if isinstance(op, TmemAlloc)}


@functools.lru_cache(maxsize=64)
def _cells(layout: TMEMLayout, registers: TiledLayout, bits: int) -> tuple[torch.Tensor, ...]:
    """For every element a load or store of a reference moves: (TMEM lane, column from the reference's first,
    bit position in the cell, flat index of the element in the array)."""
    shape = layout.shape
    access = layout.access(bits, registers)
    tid = torch.arange(THREADS_PER_WARPGROUP)
    warp, lane = tid // LANES_PER_WARP, tid % LANES_PER_WARP
    lanes, columns, shifts, flat = [], [], [], []
    for ins in access.instructions:
        for r, (reg, pos) in enumerate(ins.operands):
            row, column, step = access.cell(ins, r, lane)
            for e in range(32 // bits):
                index = registers.element_index(shape, tid, reg, pos + e)
                flat.append(torch.as_tensor(index[0] * shape[1] + index[1]).expand(THREADS_PER_WARPGROUP))
                lanes.append(LANES_PER_WARP * warp + row)
                columns.append(column + step * e)
                shifts.append(torch.full((THREADS_PER_WARPGROUP,), 0 if step else e * bits))
    out = tuple(torch.cat(x).to(torch.int64) for x in (lanes, columns, shifts, flat))
    assert torch.equal(out[3].sort().values, torch.arange(shape[0] * shape[1])), "the access plan misses elements"
    return out


def _columns(ref: LoweredTmem) -> tuple[int, int]:
    return ref.addr, ref.addr + ref.layout.columns


@interpret.rule(TmemAlloc)
def _interp_tmem_alloc(op: TmemAlloc, wg: Warpgroup) -> Generator[Wait, None, None]:
    """At the kernel's first TmemAlloc warp 0 allocates every reference's columns, then the CTA (the CTA pair,
    for 2-CTA kernels) synchronises; later TmemAllocs only name their reference."""
    kernel = wg.run.kernel
    if op is not next(o for o in kernel.body.ops if isinstance(o, TmemAlloc)):
        return
    if wg.index == 0:
        wg.cta.tmem.allocate(allocation_plan(kernel)[1])
    yield wg.rendezvous(op, wg.cluster.sync if kernel.cta_group == 2 else wg.cta.sync)


@interpret.rule(TmemIndex)
def _interp_tmem_index(op: TmemIndex, wg: Warpgroup) -> None:
    src = wg.get(op.operands[0], op)
    index = int(wg.scalar(op.operands[1], op))
    count = stages(src.type)
    if not 0 <= index < count:
        alloc = op.operands[0].owner
        raise InterpretError(f"stage {index} is outside this TMEM reference of {count} stages (shape "
                             f"{src.type.shape})", op.loc, Check.OUT_OF_BOUNDS, (alloc.loc,) if alloc.loc else ())
    wg.set(op.result, LoweredTmem(src.addr + index * src.layout.columns, op.result.type, src.layout))


@interpret.rule(TmemSlice)
def _interp_tmem_slice(op: TmemSlice, wg: Warpgroup) -> None:
    src = wg.get(op.operands[0], op)
    wg.set(op.result, LoweredTmem(src.addr + op.start // src.type.packing, op.result.type,
                                  tmem_layout(op.result.type)))


@interpret.rule(TmemLoad)
def _interp_tmem_load(op: TmemLoad, wg: Warpgroup) -> None:
    ref = wg.get(op.operands[0], op)
    out, tmem = op.result, wg.cta.tmem
    bits = out.dtype.bits
    lanes, columns, shifts, flat = _cells(ref.layout, out.layout, bits)
    first, last = _columns(ref)
    check_result_read(tmem.records, first, last, wg.clock, op.loc, "this TMEM load")
    tmem.check(op.loc, "this TMEM load", lanes, first + columns, first, last)
    words = tmem.cells[lanes, first + columns].to(torch.int64) & 0xFFFFFFFF
    elements = torch.empty(flat.numel(), dtype=torch.int64)
    elements[flat] = (words >> shifts) & ((1 << bits) - 1)
    wg.set(out, numerics.from_bits(elements, out.dtype).reshape(out.type.shape))
    tmem.records.add(Access(first, last, "read", wg.agent, wg.event(), op.loc, "TMEM load"))


@interpret.rule(TmemStore)
def _interp_tmem_store(op: TmemStore, wg: Warpgroup) -> None:
    ref = wg.get(op.operands[0], op)
    value, tmem = op.operands[1], wg.cta.tmem
    bits = value.dtype.bits
    lanes, columns, shifts, flat = _cells(ref.layout, value.layout, bits)
    first, last = _columns(ref)
    check_write(tmem.records, first, last, wg.clock, op.loc, "this TMEM store", space="TMEM")
    tmem.check(op.loc, "this TMEM store", lanes, first + columns, first, last)
    elements = numerics.to_bits(wg.get(value, op).reshape(-1), value.dtype).to(torch.int64) & ((1 << bits) - 1)
    cells = lanes * TMEM_COLUMNS + first + columns
    words = torch.zeros(tmem.cells.numel(), dtype=torch.int64).index_add_(0, cells, elements[flat] << shifts)
    touched = cells.unique()
    tmem.cells.view(-1)[touched] = words[touched].to(torch.int32)


@interpret.rule(TmemDealloc)
def _interp_tmem_dealloc(op: TmemDealloc, wg: Warpgroup) -> Generator[Wait, None, None]:
    """Every thread synchronises (the CTA pair's, in a 2-CTA kernel), then warp 0 frees the columns: no MMA may
    still be writing them, as far as warp 0 can know."""
    yield wg.rendezvous(op, wg.cluster.sync if wg.run.kernel.cta_group == 2 else wg.cta.sync)
    if wg.index == 0:
        tmem = wg.cta.tmem
        check_freed(tmem.records, wg.clock, op.loc, "tensor memory (freed where the kernel ends)")
        tmem.free(op.loc)

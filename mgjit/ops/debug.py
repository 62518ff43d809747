"""Debugging and profiling inside kernels: Print (`mgjit.print`), the profiler's ProfileStart and ProfileEvent
(`with mgjit.trace(name):`), and DeviceAssert (`mgjit.device_assert`). The first three write into a hidden buffer
the launcher allocates and reads back: the formats are printing.py's and profiler.py's, where the host decodes
them. A failed DeviceAssert traps, which ends the CUDA context too, so it leaves no record the host could read;
the interpreter names its line and message.

Print: a warpgroup's thread 0 reserves the records with one atomic add on the buffer's cursor and hands the
position to the other threads through shared memory (between two warpgroup barriers); then every thread writes
what it holds. ProfileStart finds the warpgroup's region and writes its header; each ProfileEvent is thread 0
of the warpgroup reading its event count from shared memory, reading %globaltimer_lo and storing 8 bytes, so
that a span costs a few instructions and no wait on global memory.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import torch

from .. import dtypes, infer, interpret, lower, printing, profiler
from ..dtypes import DType
from ..errors import Check, InterpretError, Loc
from ..interpret import numerics
from ..interpret.scheduler import Warpgroup
from ..ir import Op, RefType, Value, check, is_ref
from ..layouts import THREADS_PER_WARPGROUP, Layout, SplatLayout, TiledLayout, blocked
from ..lower.context import LoweredRef, element_offsets, num_elems, splat_to
from .smem import shared_address


def _is_buffer(v: Value) -> bool:
    return is_ref(v, "gmem") and v.dtype == dtypes.int32 and v.type.rank == 1


class Print(Op):
    """Write one record per CTA, warpgroup or thread (`where`) of `values` into the print buffer (operand 0)."""

    name = "print"

    def __init__(self, buffer: Value, values: Sequence[Value], site: int, fmt: str, where: str, loc: Loc | None):
        super().__init__([buffer, *values], [], loc)
        self.site = site
        self.fmt = fmt
        self.where = where

    @property
    def buffer(self) -> Value:
        return self.operands[0]

    @property
    def values(self) -> list[Value]:
        return self.operands[1:]

    def attrs(self):
        return {"site": self.site, "format": repr(self.fmt), "where": self.where}

    def verify(self):
        check(_is_buffer(self.operands[0]), self, "internal error: print writes into an int32 buffer")
        check(self.where in printing.MODES, self, f"where= is one of {', '.join(printing.MODES)}, got {self.where!r}")
        for v in self.values:
            check(not isinstance(v.type, RefType), self, f"mgjit.print prints numbers and arrays, not {v.type}")


class ProfileStart(Op):
    """This warpgroup's region of the profile buffer (operand 0), its header written: SM, no events, the time."""

    name = "profile_start"

    def __init__(self, buffer: Value, loc: Loc | None):
        super().__init__([buffer], [RefType("gmem", dtypes.int32, 1)], loc)

    def verify(self):
        check(_is_buffer(self.operands[0]), self, "internal error: profiling writes into an int32 buffer")


class ProfileEvent(Op):
    """A span of `mgjit.trace` begins or ends (`end`) in this warpgroup: one event in its region."""

    name = "profile_event"

    def __init__(self, region: Value, span: int, span_name: str, end: bool, loc: Loc | None):
        super().__init__([region], [], loc)
        self.span = span
        self.span_name = span_name
        self.end = end

    def attrs(self):
        return {"span": repr(self.span_name), "end": self.end}

    def verify(self):
        check(_is_buffer(self.operands[0]), self, "internal error: a profile event goes to a profile region")


class DeviceAssert(Op):
    """Trap where a scalar condition is false (`mgjit.device_assert`): a launch fails rather than write wrong
    results."""

    name = "device_assert"

    def __init__(self, cond: Value, message: str, loc: Loc | None):
        super().__init__([cond], [], loc)
        self.message = message

    def attrs(self):
        return {"message": repr(self.message)}

    def verify(self):
        cond = self.operands[0]
        check(not cond.is_array and not isinstance(cond.type, RefType) and cond.dtype == dtypes.bool_, self,
              f"device_assert's condition is a bool scalar, got {cond.type}")


infer.rule(Print, ProfileStart, ProfileEvent, DeviceAssert)(infer.no_arrays)


def print_layout(v: Value) -> Layout:
    """The layout a printed array is written from: its own, or for a splat (one value everywhere) the blocked
    layout, so that every thread writes a share of it."""
    layout = v.layout
    return blocked(v.type.shape, v.dtype) if isinstance(layout, SplatLayout) or layout is None else layout


def _shape(v: Value) -> tuple[int, ...]:
    return v.type.shape if v.is_array else ()


def record_words(op: Print) -> int:
    held = [num_elems(print_layout(v), _shape(v)) if v.is_array else 0 for v in op.values]
    return printing.record_words(op.where, [(v.dtype, _shape(v)) for v in op.values], held)


# ---------------------------------------------------------------------------------------------- lowering

def _cta_linear(e) -> Any:
    x, y, z = (e.ctaid(a) for a in range(3))
    nx, ny = e.nctaid(0), e.nctaid(1)
    return e.addi(x, e.muli(nx, e.addi(y, e.muli(ny, z))))


def _words(e, x, dtype: DType) -> list:
    """A value as the 32-bit words it travels as (printing.word_dtype), low word first."""
    if printing.travels_as_bits(dtype):
        return [e.zext(e.bitcast(x, e.int_type(dtype.bits)), 32)]
    wide = printing.word_dtype(dtype)
    y = e.cast(x, dtype, wide)
    if wide.is_float:
        y = e.bitcast(y, e.int_type(wide.bits))
    if wide.bits == 64:
        return [e.trunc(y, 32), e.trunc(e.m.arith.shrui(y, e.i64(32)), 32)]
    return [y]


class _Writer:
    """Stores of 32-bit words at word offsets of a buffer: [ptr + 4 * (first + offset)] under a predicate."""

    def __init__(self, ctx: lower.Context, ptr, first):
        self.e = ctx.e
        self.ptr = ptr
        self.first = first

    def store(self, offset, word, pred) -> None:
        e = self.e
        index = e.addi(self.first, offset if not isinstance(offset, int) else e.i32(offset))
        addr = e.addi(self.ptr, e.muli(e.ext_i64(index, signed=False), e.i64(4)))
        e.asm_void("@$0 st.global.b32 [$1], $2;", "b,l,r", [pred, addr, word])


@lower.rule(Print)
def _print(op: Print, ctx: lower.Context) -> None:
    e = ctx.e
    buf: LoweredRef = ctx.get(op.buffer)
    per_thread = op.where == "thread"
    words = record_words(op)
    active = e.cmpi("eq", ctx.wg_id, e.i32(0)) if op.where == "cta" else e.const_bool(True)
    leader = e.andi(active, e.cmpi("eq", ctx.wg_tid, e.i32(0)))
    # Thread 0 reserves the warpgroup's records; the others learn where from shared memory. The first barrier
    # keeps the slot from being overwritten while a thread still reads the previous print's position.
    slot = shared_address(ctx, ctx.alloc_smem(4, 4))
    ctx.warpgroup_barrier()
    reserve = e.i32(words * (THREADS_PER_WARPGROUP if per_thread else 1))
    base = e.asm("mov.u32 $0, 0; @$1 atom.global.add.u32 $0, [$2], $3;", "=r,b,l,r", [leader, buf.ptr, reserve],
                 [e.int_type(32)], side_effects=True)[0]
    e.asm_void("@$0 st.shared.u32 [$1], $2;", "b,r,r", [leader, slot, base])
    ctx.warpgroup_barrier()
    base = e.asm("ld.shared.u32 $0, [$1];", "=r,r", [slot], [e.int_type(32)], side_effects=True)[0]
    record = e.addi(base, e.i32(printing.CURSOR_WORDS))
    if per_thread:
        record = e.addi(record, e.muli(ctx.wg_tid, e.i32(words)))
    fits = e.cmpi("ule", e.addi(record, e.i32(words)), buf.sizes[0])
    ok = e.andi(active, fits)
    writer = ok if per_thread else e.andi(ok, e.cmpi("eq", ctx.wg_tid, e.i32(0)))
    out = _Writer(ctx, buf.ptr, record)
    thread = ctx.tid if per_thread else e.muli(ctx.wg_id, e.i32(THREADS_PER_WARPGROUP))
    for k, word in enumerate([e.i32(op.site + 1), _cta_linear(e), thread, e.i32(words)]):
        out.store(k, word, writer)
    pos = printing.HEADER_WORDS
    for v in op.values:
        w = printing.value_words(v.dtype)
        if not v.is_array:
            for k, word in enumerate(_words(e, ctx.get(v), v.dtype)):
                out.store(pos + k, word, writer)
            pos += w
            continue
        shape = v.type.shape
        layout = print_layout(v)
        frag = ctx.frag(v)
        frag = splat_to(ctx, frag, layout) if frag.is_splat else frag
        assert frag.layout == layout, (frag.layout, layout)
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        thread_index = ctx.thread_index(layout, shape)
        thread_flat = e.i32(0)
        for t, s in zip(thread_index, strides):
            thread_flat = e.addi(thread_flat, e.muli(t, e.i32(s)))
        offsets = element_offsets(layout, shape)
        if per_thread:
            out.store(pos, e.i32(len(offsets)), writer)
            for i, (off, x) in enumerate(zip(offsets, frag.elems)):
                at = pos + 1 + i * (1 + w)
                out.store(at, e.addi(thread_flat, e.i32(sum(o * s for o, s in zip(off, strides)))), writer)
                for k, word in enumerate(_words(e, x, v.dtype)):
                    out.store(at + 1 + k, word, writer)
            pos += 1 + len(offsets) * (1 + w)
        else:
            primary = e.andi(ok, ctx.is_primary(layout))
            for off, x in zip(offsets, frag.elems):
                flat = e.addi(thread_flat, e.i32(sum(o * s for o, s in zip(off, strides))))
                at = e.addi(e.i32(pos), e.muli(flat, e.i32(w)))
                for k, word in enumerate(_words(e, x, v.dtype)):
                    out.store(e.addi(at, e.i32(k)) if k else at, word, primary)
            pos += math.prod(shape) * w


@lower.rule(DeviceAssert)
def _device_assert(op: DeviceAssert, ctx: lower.Context) -> None:
    ctx.e.asm_void("@!$0 trap;", "b", [ctx.get(op.operands[0])])


@lower.rule(ProfileStart)
def _profile_start(op: ProfileStart, ctx: lower.Context) -> None:
    e = ctx.e
    buf: LoweredRef = ctx.get(op.operands[0])
    nwg = ctx.kernel.num_warpgroups
    regions = e.muli(e.muli(e.muli(e.nctaid(0), e.nctaid(1)), e.nctaid(2)), e.i32(nwg))
    words = e.divui(buf.sizes[0], regions)
    region = e.addi(e.muli(_cta_linear(e), e.i32(nwg)), ctx.wg_id)
    ptr = e.addi(buf.ptr, e.muli(e.ext_i64(e.muli(region, words), signed=False), e.i64(4)))
    header = e.i32(profiler.HEADER_WORDS)
    capacity = e.select(e.cmpi("uge", words, header),
                        e.divui(e.subi(words, header), e.i32(profiler.EVENT_WORDS)), e.i32(0))
    counter = shared_address(ctx, ctx.alloc_smem(4, 4))
    leader = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    e.asm_void("{ .reg .u32 sm, zero, lo, hi; .reg .u64 t; mov.u32 sm, %smid; mov.u32 zero, 0;"
               " mov.u64 t, %globaltimer; cvt.u32.u64 lo, t; shr.u64 t, t, 32; cvt.u32.u64 hi, t;"
               " @$0 st.global.v2.u32 [$1], {sm, zero}; @$0 st.global.v2.u32 [$1+8], {lo, hi};"
               " @$0 st.shared.u32 [$2], zero; }", "b,l,r", [leader, ptr, counter])
    ctx.set(op.result, _ProfileRegion(ptr, capacity, counter))


class _ProfileRegion:
    """A warpgroup's region as the lowering holds it: its address, its capacity in events, and the shared
    memory word that counts its events (only thread 0 of the warpgroup touches either)."""

    def __init__(self, ptr, capacity, counter):
        self.ptr = ptr
        self.capacity = capacity
        self.counter = counter


@lower.rule(ProfileEvent)
def _profile_event(op: ProfileEvent, ctx: lower.Context) -> None:
    e = ctx.e
    region: _ProfileRegion = ctx.get(op.operands[0])
    tag = e.i32(profiler.event_tag(op.span, op.end))
    records = e.addi(region.ptr, e.i64(4 * profiler.HEADER_WORDS))
    count = e.addi(region.ptr, e.i64(4))
    # An end reads the clock before its bookkeeping, a begin after it, so the span holds as little of it as can be.
    clock = "mov.u32 t, %globaltimer_lo;"
    e.asm_void("{ .reg .pred p, q; .reg .u32 i, t; .reg .u64 a; setp.eq.u32 p, $0, 0; @p ld.shared.u32 i, [$1];"
               f" {clock if op.end else ''} setp.lt.and.u32 q, i, $2, p; mad.wide.u32 a, i, 8, $3;"
               f" {'' if op.end else clock} @q st.global.v2.u32 [a], {{$4, t}}; add.u32 i, i, 1;"
               " @p st.shared.u32 [$1], i; @p st.global.u32 [$5], i; }",
               "r,r,r,l,r,l", [ctx.wg_tid, region.counter, region.capacity, records, tag, count])


# ---------------------------------------------------------------------------------------------- interpreter

def _cta_index(wg: Warpgroup) -> int:
    x, y, z = wg.cta.program_id
    gx, gy, _ = wg.run.grid
    return x + gx * (y + gy * z)


def _as_words(x: torch.Tensor, dtype: DType) -> torch.Tensor:
    """Values (any shape) as the int32 words they travel as, row-major, low word first."""
    if printing.travels_as_bits(dtype):
        return numerics.to_bits(x, dtype).reshape(-1).to(torch.int32) & 0xFF
    wide = printing.word_dtype(dtype)
    y = numerics.cast(x, dtype, wide) if wide != dtype else x
    return y.reshape(-1).contiguous().view(torch.int32) if wide.bits == 64 else \
        y.to(numerics.torch_dtype(wide)).reshape(-1).view(torch.int32)


@functools.lru_cache(maxsize=64)
def _held(layout: TiledLayout, shape: tuple[int, ...]) -> torch.Tensor:
    """(128, elements each thread holds): the flat index of each element in the order its registers hold it."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    out = []
    for tid in range(THREADS_PER_WARPGROUP):
        row = []
        for reg in layout.registers(shape):
            for k in range(layout.vector_length):
                index = layout.element_index(shape, tid, reg, k)
                row.append(sum(i * s for i, s in zip(index, strides)))
        out.append(row)
    return torch.tensor(out, dtype=torch.int64)


@interpret.rule(Print)
def _interp_print(op: Print, wg: Warpgroup) -> None:
    if op.where == "cta" and wg.index != 0:
        return
    buf = wg.get(op.buffer, op)
    words = record_words(op)
    threads = range(THREADS_PER_WARPGROUP) if op.where == "thread" else range(1)
    base = int(buf[0])
    buf[0] = base + words * len(threads)
    values = [(v, wg.get(v, op)) for v in op.values]
    for t in threads:
        record = printing.CURSOR_WORDS + base + t * words
        if record + words > buf.numel():
            continue
        tid = wg.index * THREADS_PER_WARPGROUP + t
        parts = [torch.tensor([op.site + 1, _cta_index(wg), tid, words], dtype=torch.int32)]
        for v, x in values:
            if v.is_array and op.where == "thread":
                flat = _held(print_layout(v), v.type.shape)[t]
                pairs = torch.cat([flat.to(torch.int32)[:, None],
                                   _as_words(x.reshape(-1)[flat], v.dtype).reshape(len(flat), -1)], dim=1)
                parts += [torch.tensor([len(flat)], dtype=torch.int32), pairs.reshape(-1)]
            else:
                parts.append(_as_words(x, v.dtype))
        buf[record:record + words] = torch.cat(parts)


@interpret.rule(DeviceAssert)
def _interp_device_assert(op: DeviceAssert, wg: Warpgroup) -> None:
    if not bool(wg.scalar(op.operands[0], op)):
        raise InterpretError(f"device_assert failed in CTA {_cta_index(wg)}, warpgroup {wg.index}: {op.message}",
                             op.loc, Check.DEVICE_ASSERT)


@interpret.rule(ProfileStart)
def _interp_profile_start(op: ProfileStart, wg: Warpgroup) -> None:
    """Under the interpreter the SM is the CTA's index and the time a logical clock: one tick per event, in the
    order the interpreter ran them (see profiler.py)."""
    buf = wg.get(op.operands[0], op)
    nwg = wg.cta.num_warpgroups
    regions = math.prod(wg.run.grid) * nwg
    words = buf.numel() // regions
    index = _cta_index(wg) * nwg + wg.index
    region = buf[index * words:(index + 1) * words]
    region[:profiler.HEADER_WORDS] = torch.tensor([_cta_index(wg), 0, wg.run.ticks, 0], dtype=torch.int32)
    wg.set(op.result, region)


@interpret.rule(ProfileEvent)
def _interp_profile_event(op: ProfileEvent, wg: Warpgroup) -> None:
    region = wg.get(op.operands[0], op)
    count = int(region[1])
    if count < (region.numel() - profiler.HEADER_WORDS) // profiler.EVENT_WORDS:
        at = profiler.HEADER_WORDS + profiler.EVENT_WORDS * count
        tag = profiler.event_tag(op.span, op.end)
        region[at:at + 2] = torch.tensor([tag - (1 << 32) if tag >= 1 << 31 else tag, wg.run.ticks],
                                         dtype=torch.int32)
    region[1] = count + 1
    wg.run.ticks += 1

"""Atomics and semaphores on GMEM: Atomic (add, min, max, exchange or compare-and-swap on a window of a tensor
argument, returning the old values) and SemaphoreWait (spin until a cell reaches a value, with acquire
ordering). A semaphore signal is an Atomic add with release ordering.

Each op states its memory ordering (`sem`: relaxed, acquire, release, acq_rel) and the scope that ordering
reaches (`scope`: cta, cluster, gpu, sys), as PTX's `atom{.sem}{.scope}` does.

- An array window: every thread performs the atomics of the elements its layout gives it, one instruction per
  element (f32 adds: one vector instruction per 2 or 4 contiguous elements). The ordering holds per thread.
  Elements outside the tensor are skipped and read as zero.
- A scalar (every index an integer): the warpgroup's first thread performs it once and every thread receives
  the old value. The ordering holds for the whole warpgroup: with release, every write its threads made before
  (the lowering meets them at a warpgroup barrier first) happens before; with acquire, every access they make
  after (they meet at a barrier after it) happens after. A signal (`mgjit.semaphore_signal`: a release add
  whose old value nobody reads) goes out as a `red` after that first barrier and waits for nothing: the old
  value's broadcast (a shared-memory store that waits for the L2's answer, then a barrier) would hold the whole
  warpgroup for a round trip to the L2 at every signal.
- SemaphoreWait: the warpgroup's first thread polls the cell with `ld.acquire` until it holds at least `value`
  (signed), backing off with nanosleep; the warpgroup meets at a barrier after. A wait still unsatisfied after
  WAIT_TIMEOUT_NS traps (the launch fails) rather than hang, and so does a wait on a cell outside the tensor.

Under the interpreter (one cluster at a time) a semaphore wait that blocks starts the next cluster of the grid
beside the waiting one, as a GPU runs its CTAs side by side; interpret/scheduler.py.
"""
from __future__ import annotations

from typing import Generator, Sequence

import torch

from .. import dtypes, infer, interpret, lower
from ..dtypes import DType
from ..errors import Check, InterpretError, Loc, Rule
from ..interpret import numerics
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import ScalarType, Value, check
from ..layouts import SplatLayout, TiledLayout, blocked
from ..lower.context import element_offsets, splat_to
from ..lower.words import from_bits
from .gmem import _GmemAccess, _window
from .gmem_window import _element_addresses, _vector_width
from .smem import shared_address, store_shared

SEMANTICS = ("relaxed", "acquire", "release", "acq_rel")
SCOPES = ("cta", "cluster", "gpu", "sys")
KINDS = ("add", "min", "max", "xchg", "cas")
WAIT_TIMEOUT_NS = 10_000_000_000  # a semaphore wait traps after 10 s: a bug, not a slow kernel

# The PTX type of each atomic by kind and element type; a pair missing here has no instruction.
_ADD = {dtypes.int32: "u32", dtypes.int64: "u64", dtypes.float32: "f32", dtypes.float64: "f64",
        dtypes.float16: "noftz.f16", dtypes.bfloat16: "noftz.bf16"}
_MIN_MAX = {dtypes.int32: "s32", dtypes.int64: "s64"}
_BITS = {16: "b16", 32: "b32", 64: "b64"}
PTX_TYPE: dict[str, dict[DType, str]] = {
    "add": _ADD, "min": _MIN_MAX, "max": _MIN_MAX,
    "xchg": {d: _BITS[d.bits] for d in dtypes.ALL if d.bits in (32, 64)},
    "cas": {d: _BITS[d.bits] for d in dtypes.ALL if d.bits in (16, 32, 64) and d != dtypes.bool_},
}
_PTX_OP = {"add": "add", "min": "min", "max": "max", "xchg": "exch", "cas": "cas"}


def _check_ordering(op: _GmemAccess, sem: str, scope: str) -> None:
    check(sem in SEMANTICS, op, f"memory ordering must be one of {', '.join(SEMANTICS)}, got {sem!r}", Rule.ATOMIC)
    check(scope in SCOPES, op, f"scope must be one of {', '.join(SCOPES)}, got {scope!r}", Rule.ATOMIC)


class Atomic(_GmemAccess):
    """`kind` (add, min, max, xchg, cas) on the window of `ref` at `starts` of static `sizes` with `value` (for cas,
    where the old value equals `compare`); the result is the old values, of the value's type. `signal`: a scalar
    release add whose result nobody reads (`mgjit.semaphore_signal`), issued without waiting for it."""

    name = "atomic"

    def __init__(self, kind: str, ref: Value, starts: Sequence[Value], sizes: tuple[int, ...],
                 squeeze: tuple[bool, ...], value: Value, sem: str, scope: str, loc: Loc | None,
                 compare: Value | None = None, signal: bool = False):
        extra = [compare] if compare is not None else []
        super().__init__([ref, *starts, *extra, value], [value.type], loc)
        self._init_window(sizes, squeeze)
        self.kind, self.sem, self.scope, self.signal = kind, sem, scope, signal

    @property
    def starts(self) -> list[Value]:
        return self.operands[1:1 + self.ref.type.rank]

    @property
    def value(self) -> Value:
        return self.operands[-1]

    @property
    def compare(self) -> Value | None:
        return self.operands[-2] if self.kind == "cas" else None

    @property
    def is_scalar(self) -> bool:
        return not self.value.is_array

    def attrs(self):
        attrs = {"kind": self.kind, "sem": self.sem, "scope": self.scope, **super().attrs()}
        return {**attrs, "signal": True} if self.signal else attrs

    def verify(self):
        self._verify_window(self.ref, self.starts)
        _check_ordering(self, self.sem, self.scope)
        check(self.kind in KINDS, self, f"atomics are {', '.join(KINDS)}; got {self.kind!r}", Rule.ATOMIC)
        check(len(self.operands) == 1 + self.ref.type.rank + 1 + (self.kind == "cas"), self,
              "compare-and-swap takes a compare value; the other atomics do not")
        for v in (self.value, self.compare) if self.kind == "cas" else (self.value,):
            shape = v.type.shape if v.is_array else ()
            check(shape == self.window_shape, self, f"an atomic on a window of shape {self.window_shape} takes "
                  f"values of that shape, got {shape}")
            check(v.dtype == self.ref.dtype, self, f"an atomic on a {self.ref.dtype.name} tensor takes "
                  f"{self.ref.dtype.name} values, got {v.dtype.name}", Rule.ATOMIC)
        if self.signal:
            check(self.kind == "add" and self.sem == "release" and self.is_scalar, self,
                  f"a signal is a scalar release add, got a {'scalar' if self.is_scalar else 'window'} {self.sem} "
                  f"{self.kind}", Rule.ATOMIC)
        types = PTX_TYPE[self.kind]
        check(self.ref.dtype in types, self, f"atomic {self.kind} is not available on {self.ref.dtype.name}: the "
              f"hardware has it on {', '.join(d.name for d in types)}", Rule.ATOMIC)


class SemaphoreWait(_GmemAccess):
    """Block until the int32 cell of `ref` at `starts` holds at least `value` (acquire at `scope`)."""

    name = "semaphore_wait"

    def __init__(self, ref: Value, starts: Sequence[Value], value: Value, scope: str, loc: Loc | None):
        super().__init__([ref, *starts, value], [], loc)
        self._init_window((1,) * len(starts), (True,) * len(starts))
        self.scope = scope

    @property
    def starts(self) -> list[Value]:
        return self.operands[1:-1]

    def attrs(self):
        return {"scope": self.scope}

    def verify(self):
        self._verify_window(self.ref, self.starts)
        _check_ordering(self, "acquire", self.scope)
        value = self.operands[-1]
        check(self.ref.dtype == dtypes.int32 and isinstance(value.type, ScalarType) and value.dtype == dtypes.int32,
              self, f"a semaphore is an int32 cell waited on for an int32 value, got a {self.ref.dtype.name} "
              f"tensor and a {value.type} value", Rule.ATOMIC)


@infer.rule(Atomic)
def _infer_atomic(op: Atomic, inf: infer.Inference) -> None:
    """The old values come back in the layout of the values (a splat goes out in the coalesced layout)."""
    if op.is_scalar:
        return
    operands = [len(op.operands) - 1] + ([len(op.operands) - 2] if op.kind == "cas" else [])
    layout = inf.choose_common(op, operands)
    if not isinstance(layout, TiledLayout):
        layout = blocked(op.window_shape, op.value.dtype)
    for i in operands:
        if op.operands[i].layout != layout and not isinstance(op.operands[i].layout, SplatLayout):
            inf.relayout(inf.current_block, op, i, layout)
    inf.set_layout(op.result, layout, op)


infer.rule(SemaphoreWait)(infer.no_arrays)


# ---------------------------------------------------------------------------------------------- lowering

def _qualifiers(sem: str, scope: str) -> str:
    return f".{sem}.{scope}"


def _instruction(op: Atomic, vector: int = 1) -> str:
    ptx_type = PTX_TYPE[op.kind][op.ref.dtype]
    if vector > 1:  # only f32 adds have the vector form
        return f"atom{_qualifiers(op.sem, op.scope)}.global.v{vector}.f32.add"
    return f"atom{_qualifiers(op.sem, op.scope)}.global.{_PTX_OP[op.kind]}.{ptx_type}"


def _register(dtype: DType) -> tuple[str, int]:
    """The inline-asm constraint and integer width of the register one element travels in."""
    return {16: ("h", 16), 32: ("r", 32), 64: ("l", 64)}[dtype.bits]


def _atomic_access(ctx: lower.Context, op: Atomic, pred, addr, values: list, compares: list | None) -> list:
    """One atomic instruction (predicated) on `values` at `addr` (for cas, `compares` first, as PTX takes
    them); the old values, zero where `pred` is false."""
    e = ctx.e
    dtype = op.ref.dtype
    n = len(values)
    cons, bits = _register(dtype)
    ins = [e.bitcast(x, e.int_type(bits)) if dtype.is_float else x for x in [*(compares or []), *values]]
    outs = ", ".join(f"${i}" for i in range(n))
    srcs = ", ".join(f"${n + 2 + i}" for i in range(len(ins)))
    dst, src = (f"{{{outs}}}", f"{{{srcs}}}") if n > 1 else (outs, srcs)
    zero = " ".join(f"mov.b{bits} ${i}, 0;" for i in range(n))
    text = f"{zero} @${n} {_instruction(op, n)} {dst}, [${n + 1}], {src};"
    constraints = ",".join([f"={cons}"] * n + ["b", "l"] + [cons] * len(ins))
    words = e.asm(text, constraints, [pred, addr, *ins], [e.int_type(bits)] * n, side_effects=True)
    return [from_bits(e, w, dtype) for w in words]


def _atomic_width(ctx: lower.Context, op: Atomic, ref: lower.LoweredRef, layout: TiledLayout, shape) -> int:
    """Elements per instruction: 2 or 4 contiguous f32 adds (PTX's vector atom) where the launch proves each
    vector aligned and the row length a multiple of it (a vector is wholly inside the tensor or wholly outside,
    as its first element says), else 1."""
    if op.kind != "add" or op.ref.dtype != dtypes.float32:
        return 1
    w, align, _ = _vector_width(ctx, op, ref, layout, shape)
    w = min(w, 4, align // op.ref.dtype.itemsize, ref.spec.size_div)
    return w if w in (2, 4) else 1


@lower.rule(Atomic)
def _atomic(op: Atomic, ctx: lower.Context) -> None:
    ref: lower.LoweredRef = ctx.get(op.ref)
    if op.is_scalar:
        _scalar_atomic(op, ctx, ref)
        return
    e = ctx.e
    shape = op.window_shape
    frag = ctx.frag(op.value)
    layout = op.result.layout
    values = splat_to(ctx, frag, layout).elems
    compares = splat_to(ctx, ctx.frag(op.compare), layout).elems if op.kind == "cas" else None
    w = _atomic_width(ctx, op, ref, layout, shape)
    elements = _element_addresses(ctx, op, ref, layout, shape, step=w)
    primary = ctx.is_primary(layout)
    olds = []
    for i in range(0, len(elements), w):
        first = elements[i]
        olds.extend(_atomic_access(ctx, op, e.andi(first.inside, primary), first.addr, values[i:i + w],
                                   compares[i:i + w] if compares is not None else None))
    if layout.replicated:
        olds = _share_with_replicas(ctx, layout, shape, op.ref.dtype, olds, primary)
    ctx.set(op.result, lower.Frag(layout, shape, op.ref.dtype, olds))


def _share_with_replicas(ctx: lower.Context, layout: TiledLayout, shape, dtype: DType, olds: list, primary) -> list:
    """Where a layout holds an element in several threads, only the first performed its atomic: it passes the
    old value to the others through shared memory (indexed by the element's position in the window)."""
    e = ctx.e
    size = dtype.itemsize
    count = 1
    for d in shape:
        count *= d
    base = ctx.alloc_smem(count * size, 16)
    thread = ctx.thread_index(layout, shape)
    addresses = []
    for off in element_offsets(layout, shape):
        linear = e.i32(0)
        for d, (t, k) in enumerate(zip(thread, off)):
            linear = e.addi(e.muli(linear, e.i32(shape[d])), e.addi(t, e.i32(k)))
        addresses.append(e.addi(base, e.muli(linear, e.i32(size))))
    ctx.warpgroup_barrier()  # an earlier use of the scratch (in a loop) is fully read
    for x, addr in zip(olds, addresses):
        store_shared(e, shared_address(ctx, addr), [x], dtype, primary)
    ctx.warpgroup_barrier()
    return [e.smem_load(e.type(dtype), addr) for addr in addresses]


def _scalar_atomic(op: Atomic, ctx: lower.Context, ref: lower.LoweredRef) -> None:
    """The first thread performs it; the old value reaches every thread through shared memory (a signal's: none,
    `_signal`)."""
    e = ctx.e
    dtype = op.ref.dtype
    (cell,) = _element_addresses(ctx, op, ref, None, ())
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    if op.signal:
        _signal(ctx, op, e.andi(cell.inside, elected), cell.addr)
        return
    scratch = ctx.alloc_smem(8, 8)
    # Before: an earlier use of the scratch is fully read, and (release) every thread's earlier writes are done.
    ctx.warpgroup_barrier()
    compares = [ctx.get(op.compare)] if op.kind == "cas" else None
    (old,) = _atomic_access(ctx, op, e.andi(cell.inside, elected), cell.addr, [ctx.get(op.value)], compares)
    store_shared(e, shared_address(ctx, scratch), [old], dtype, elected)
    ctx.warpgroup_barrier()  # after: (acquire) every thread's later accesses follow the atomic
    ctx.set(op.result, e.smem_load(e.type(dtype), scratch))


def _signal(ctx: lower.Context, op: Atomic, pred, addr) -> None:
    """A signal: every thread's earlier writes done (a warpgroup barrier), then the first thread's `red`; its
    result (a semaphore's int32) reads as zero."""
    e = ctx.e
    ctx.warpgroup_barrier()
    e.asm_void(f"@$0 red{_qualifiers(op.sem, op.scope)}.global.add.u32 [$1], $2;", "b,l,r",
               [pred, addr, ctx.get(op.value)])
    ctx.set(op.result, e.i32(0))


@lower.rule(SemaphoreWait)
def _semaphore_wait(op: SemaphoreWait, ctx: lower.Context) -> None:
    e = ctx.e
    ref: lower.LoweredRef = ctx.get(op.ref)
    (cell,) = _element_addresses(ctx, op, ref, None, ())
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    value = ctx.get(op.operands[-1])
    e.asm_void(
        "{ .reg .pred inside, done, late; .reg .b32 seen, pause; .reg .u64 start, now;"
        " @!$0 bra SEMDONE;"
        " @!$1 trap;"
        " mov.u64 start, %globaltimer; mov.b32 pause, 32;"
        f" SEMPOLL: ld.acquire.{op.scope}.global.b32 seen, [$2];"
        " setp.ge.s32 done, seen, $3; @done bra SEMDONE;"
        " nanosleep.u32 pause; min.u32 pause, pause, 1024; shl.b32 pause, pause, 1;"
        f" mov.u64 now, %globaltimer; sub.u64 now, now, start; setp.gt.u64 late, now, {WAIT_TIMEOUT_NS};"
        " @late trap; bra SEMPOLL;"
        " SEMDONE: }", "b,b,l,r", [elected, cell.inside, cell.addr, value])
    ctx.warpgroup_barrier()  # every thread's later accesses follow the acquire


# ---------------------------------------------------------------------------------------------- interpreter

def _combine(kind: str, old: torch.Tensor, value: torch.Tensor, compare: torch.Tensor | None,
             dtype: DType) -> torch.Tensor:
    """What an atomic leaves in memory, computed as the hardware does (integer adds wrap, narrow floats add in
    f32 and round once, compare-and-swap compares bits)."""
    if kind == "add":
        return (numerics.widen(old, dtype) + numerics.widen(value, dtype)).to(old.dtype)
    if kind == "min":
        return torch.minimum(old, value)
    if kind == "max":
        return torch.maximum(old, value)
    if kind == "xchg":
        return value.clone()
    equal = numerics.to_bits(old, dtype) == numerics.to_bits(compare, dtype)
    return torch.where(equal, value, old)


@interpret.rule(Atomic)
def _interp_atomic(op: Atomic, wg: Warpgroup) -> None:
    """The whole window at once: a warpgroup's step is atomic with respect to every other warpgroup."""
    ref, inside = _window(op, wg)
    dtype = op.ref.dtype
    value = wg.get(op.value, op).reshape(op.sizes) if op.value.is_array else wg.get(op.value, op).reshape(())
    compare = wg.get(op.compare, op) if op.kind == "cas" else None
    old = torch.zeros(op.sizes, dtype=numerics.torch_dtype(dtype))
    if inside is not None:
        here = ref[inside[0]]
        if op.sem in ("acquire", "acq_rel"):
            wg.run.gmem.acquire(here, wg.clock)
        if op.sem in ("release", "acq_rel"):
            wg.run.gmem.release(here, wg.clock)
        old[inside[1]] = here
        part = value.expand(op.sizes)[inside[1]]
        cmp = compare.reshape(op.sizes if op.value.is_array else ()).expand(op.sizes)[inside[1]] \
            if compare is not None else None
        ref[inside[0]] = _combine(op.kind, here.clone(), part, cmp, dtype)
    wg.set(op.result, old.reshape(op.window_shape))


@interpret.rule(SemaphoreWait)
def _interp_semaphore_wait(op: SemaphoreWait, wg: Warpgroup) -> Generator[Wait, None, None]:
    ref, inside = _window(op, wg)
    starts = [int(wg.scalar(s, op)) for s in op.starts]
    if inside is None:
        raise InterpretError(f"a semaphore wait on the cell at {starts}, outside the tensor of shape "
                             f"{tuple(ref.shape)}", op.loc, Check.OUT_OF_BOUNDS)
    cell = ref[inside[0]]
    value = int(wg.scalar(op.operands[-1], op))

    def describe() -> str:
        return f"semaphore at {starts} to reach {value} (it holds {int(cell.reshape(-1)[0])})"

    yield Wait(op.loc, lambda: int(cell.reshape(-1)[0]) >= value, describe,
               lambda: wg.run.gmem.acquire(cell, wg.clock), cross_cta=True)


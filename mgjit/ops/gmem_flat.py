"""Staged stores (`mgjit.store(x, index, value, staged=True)`): a 2D GMEM window store of whole rows of a tensor
whose rows lie one after another goes out through shared memory as aligned 16-byte chunks.

A row that does not start on 16 bytes (bf16 rows of 127, 255) is stored from registers in accesses that straddle
the L2's 32-byte sectors, where it starts inside a 32-bit word in 2-byte halves, and past 7/8 of a window's
columns element by element. ncu (H200, softmax over bf16 rows of 127, 16 rows a program): 9.5 M L2 write sectors
and 3.8 M write requests where rows of 128 take 6.3 M and 1.6 M, the L2 at 0.94 of its peak. Where the tensor's row
stride is its row length and the window's columns cover every column, the window's rows inside the tensor are one
run of bytes (`RowsRun`), however short the rows: each thread puts its elements inside the tensor into a scratch
holding the run from its first chunk's boundary, the warpgroup meets (bar.sync of its 128 threads), and the
run goes out, its whole chunks one st.global.v4 each (thread t the t-th of every 128), its partial first and last
chunks element by element by threads 0 and 1 alone. Whether the rows are one run is known at run time only
(strides are not specialized): elsewhere the same store goes out from registers, behind one branch that every
thread takes alike. A store of several arrays side by side (`mgjit.store(x, index, (a, b), staged=True)`: a row
held as 8 + 1 columns) puts them all into the one scratch: each array's window alone would be no run. Where no row
of the window lies before the tensor's first and every array's columns lie inside the rows (a run-time test), the
puts take no bounds test: rows past the last land past the run's end.

Whether it pays depends on what hides the staging's round trip, so it is asked for, not chosen here: the row
examples offer it as a mapping the tuner weighs (examples/_rows.py `staging`). Kernel alone, bf16, H200, softmax:
16 rows of 255 a program 0.92 -> 0.93 of copy bandwidth, 16 of 127 0.83 -> 0.82. Each warp's rows staged as runs of
their own, row by row (the thirteenth to thirty-third sessions), had run 0.92 and 0.70 there, rows of 9 (64 runs a
warp, a chunk and a piece each) at 199 PTX instructions an element. Staged loads were built the same way and
measured (the thirty-fourth session): a plain copy of bf16 rows of 9, 16 columns held, ran 0.72 of copy bandwidth
through registers and 0.44 loaded staged; softmax over them 0.52 and 0.41; not kept. The warpgroup's meeting costs
where a program's few rows leave nothing else of it in flight (the thirtieth session, one run a warpgroup: 8 rows of
1023 a program 0.84, a row of 4097 a CTA 0.92 -> 0.81), hence a tuner's candidate, not a default. Rows held as two
arrays, one store (the thirty-fifth session; tuned, H200): softmax over bf16 rows of 9 0.59 -> 1.02, 33 0.63 ->
0.98, 65 0.60 -> 0.92 (PTX instructions an element at 9: 42.6 staged one array of 16 columns, 26.8 two arrays from
registers, 15.3 two staged, the partial chunks' element stores behind a branch: 18.1 issued by every thread).

Applies where the launch does not prove rows 16-byte aligned (where it does, the registers' accesses are 16-byte
vectors already) to windows of at most FLAT_STORE_BYTES of two dimensions (after single indices: `out[b, rows,
cols]`); elsewhere staged=True stores from registers. `warp_rows` (how a layout's warps hold an array's rows) serves
ops/gmem.py's stores of shifted words too.
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Callable, NamedTuple

from .. import ir, lower
from ..layouts import LANES_PER_WARP, THREADS_PER_WARPGROUP, WARPS_PER_WARPGROUP, Layout, TiledLayout
from ..lower.context import LoweredRef, element_offsets
from .control import in_loop
from .gmem_access import _all, _not, _store_bytes
from .smem import shared_address, store_shared

FLAT_STORE_BYTES = 16 << 10  # the most bytes of a window staged
CHUNK = 16  # bytes of one st.global.v4


class WarpRows(NamedTuple):
    """Warp w holds whole rows of the array: rows first + w * warp_step + (j % run) * run_step + (j // run) *
    block_step for j < rows_held (runs of `run` rows `run_step` apart, repeated `block_step` further on), every
    element of each; a lane's elements may lie in several of them, and its lanes' rows may differ."""

    first: int
    warp_step: int
    run: int
    run_step: int
    block_step: int
    rows_held: int

    def row(self, j: int) -> int:
        """Warp 0's j-th row."""
        return self.first + j % self.run * self.run_step + j // self.run * self.block_step


@functools.lru_cache(maxsize=256)
def warp_rows(layout: TiledLayout, shape: tuple[int, ...]) -> WarpRows | None:
    """How the warps of `layout` hold the rows of a (rows, columns) array, or None where some row is split between
    warps or a warp's rows are not runs of a power of two evenly spaced, repeated evenly."""
    if len(shape) != 2:
        return None
    registers = [(reg, v) for reg in layout.registers(shape) for v in range(layout.vector_length)]
    held: dict[int, set[int]] = {}  # row -> the warps holding elements of it
    columns: dict[int, set[int]] = {}  # row -> its columns held
    for tid in range(WARPS_PER_WARPGROUP * LANES_PER_WARP):
        for reg, v in registers:
            r, c = layout.element_index(shape, tid, reg, v)
            held.setdefault(r, set()).add(tid // LANES_PER_WARP)
            columns.setdefault(r, set()).add(c)
    if any(len(w) != 1 for w in held.values()) or any(len(c) != shape[1] for c in columns.values()):
        return None
    by_warp = [sorted(r for r, w in held.items() if w == {k}) for k in range(WARPS_PER_WARPGROUP)]
    rows = by_warp[0]
    if not rows or any(len(b) != len(rows) for b in by_warp):
        return None
    warp_step = by_warp[1][0] - rows[0] if WARPS_PER_WARPGROUP > 1 else 0
    if any(b != [r + k * warp_step for r in rows] for k, b in enumerate(by_warp)):
        return None
    run_step = rows[1] - rows[0] if len(rows) > 1 else 1
    run = next((k for k in range(1, len(rows)) if rows[k] - rows[k - 1] != run_step), len(rows))
    block_step = rows[run] - rows[0] if run < len(rows) else 0
    shape_ = WarpRows(rows[0], warp_step, run, run_step, block_step, len(rows))
    if run & (run - 1) or len(rows) % run or [shape_.row(j) for j in range(len(rows))] != rows:
        return None
    return shape_


def stages(op: ir.Op, ref: LoweredRef, layouts: list[Layout]) -> bool:
    """Whether a store (ops/gmem.py Store) of arrays in `layouts` is staged where its window's rows are one run (see
    the module): a window of two dimensions after single indices (a batch's row block), rows the launch does not
    prove 16-byte aligned, at most FLAT_STORE_BYTES."""
    spec, sizes = ref.spec, op.sizes
    return (len(sizes) >= 2 and op.window_shape == tuple(sizes[-2:])
            and all(isinstance(layout, TiledLayout) for layout in layouts)
            and spec.unit_stride and spec.align < CHUNK and math.prod(sizes) * ref.dtype.itemsize <= FLAT_STORE_BYTES)


def _plane(e, ref: LoweredRef, starts: list) -> tuple[Any, Any]:
    """(i64 address, i1): where the plane a window's leading indices pick starts, and whether they lie inside the
    tensor."""
    base, inside = ref.ptr, e.const_bool(True)
    for start, n, stride in zip(starts[:-2], ref.sizes[:-2], ref.strides[:-2]):
        base = e.addi(base, e.muli(e.ext_i64(start), e.muli(stride, e.i64(ref.dtype.itemsize))))
        inside = e.andi(inside, e.cmpi("ult", start, n))
    return base, inside


class RowsRun:
    """A 2D window's rows as one run of bytes. Where a tensor's rows lie one after another (its row stride its row
    length) and a window's columns cover all of theirs, the window's rows inside the tensor are one run, which
    16-byte chunks move whole however short the rows are (bf16 rows of 9 columns are 18 bytes: staged row by row,
    a chunk and a piece each). `applies` (i1, alike in every thread) says whether they are at run time; a scratch
    holding the run from its first chunk's boundary holds window element (w, c) at `address`."""

    def __init__(self, ctx: lower.Context, ref: LoweredRef, sizes: tuple[int, ...], starts: list, base, inside):
        e = self.e = ctx.e
        isz = self.isz = ref.dtype.itemsize
        self.r0, self.c0 = starts[-2:]
        rows, self.n = ref.sizes[-2:]
        self.applies = _all(e, [inside, e.cmpi("eq", ref.strides[-2], e.ext_i64(self.n)), e.cmpi("sle", self.c0,
                                e.i32(0)), e.cmpi("sge", e.addi(self.c0, e.i32(sizes[-1])), self.n)])
        first = e.m.arith.maxsi(self.r0, e.i32(0))
        count = e.m.arith.maxsi(e.subi(e.m.arith.minsi(e.addi(self.r0, e.i32(sizes[-2])), rows), first), e.i32(0))
        start = e.addi(base, e.muli(e.ext_i64(first), e.muli(e.ext_i64(self.n), e.i64(isz))))
        length = e.muli(e.muli(count, self.n), e.i32(isz))  # at most FLAT_STORE_BYTES
        self.boundary = e.andi(start, e.i64(-CHUNK))
        self.skew = e.andi(e.trunc(start, 32), e.i32(CHUNK - 1))
        self.end = e.addi(start, e.ext_i64(length))
        past = e.addi(self.skew, length)
        self.head = e.cmpi("ne", self.skew, e.i32(0))  # the first chunk is partial
        self.last = e.m.arith.shrui(past, e.i32(4))  # the chunk holding the run's end
        self.max_chunks = -(-(math.prod(sizes[-2:]) * isz + CHUNK - 1) // CHUNK)
        self.origin = e.subi(e.trunc(base, 32), e.trunc(self.boundary, 32))  # the plane's start past the boundary

    def address(self, scratch, w, c) -> Any:
        """The shared address of window element (w, c) (i32 indices into the window) in `scratch`: its byte in the
        plane less the run's first boundary, in 32 bits (wrapping as the 64-bit address does)."""
        e = self.e
        index = e.addi(e.muli(e.addi(self.r0, w), self.n), e.addi(self.c0, c))
        return e.addi(e.addi(scratch, self.origin), e.muli(index, e.i32(self.isz)))


def store_staged(ctx: lower.Context, op: ir.Op, ref: LoweredRef, parts: list[tuple[lower.Frag, list]],
                 registers: Callable[[], None]) -> None:
    """A staged store (`mgjit.store(x, index, value, staged=True)`): where the window's rows are one run
    (`RowsRun`), each thread puts its elements inside the tensor into a scratch at their byte past the run's first
    chunk boundary, the warpgroup meets, and the run goes out from the scratch; elsewhere `registers()` stores.
    `parts`: each array side by side along the window's rows (one, or a row's parts: 9 columns as 8 + 1) with
    its elements' addresses (ops/gmem.py)."""
    e = ctx.e
    starts = [ctx.get(s) for s in op.starts]
    run = RowsRun(ctx, ref, op.sizes, starts, *_plane(e, ref, starts))
    scratch = shared_address(ctx, ctx.alloc_smem(run.max_chunks * CHUNK, CHUNK))
    if in_loop(ctx.kernel, op):
        ctx.warpgroup_barrier(meet=False)  # every thread's earlier reads of the scratch are done

    columns = list(itertools.accumulate((frag.shape[-1] for frag, _ in parts[:-1]), initial=0))

    def put(checked: bool) -> list:
        for (frag, els), column in zip(parts, columns):
            _put(ctx, run, scratch, frag, els, column, checked)
        return []

    # Unchecked where no row lies before the tensor's and every array's columns inside its rows: the elements of
    # rows past its last land past the run's end in the scratch, which holds the whole window.
    inside = [e.cmpi("sge", run.r0, e.i32(0))]
    for (frag, _), column in zip(parts, columns):
        first = e.addi(run.c0, e.i32(column))
        inside += [e.cmpi("sge", first, e.i32(0)), e.cmpi("sle", first, e.subi(run.n, e.i32(frag.shape[-1])))]
    e.only_if(run.applies, lambda: e.if_else(_all(e, inside), [], lambda: put(False), lambda: put(True)))
    ctx.warpgroup_barrier(meet=False)
    e.only_if(run.applies, lambda: _write_out(ctx, run, scratch, ref.dtype.itemsize))
    e.only_if(_not(e, run.applies), registers)


def _put(ctx: lower.Context, run: RowsRun, scratch, frag: lower.Frag, els: list, column: int, checked: bool) -> None:
    """Each element of an array whose columns start `column` into the window into the scratch at its place in the
    run, element by element; `checked`: only those inside the tensor."""
    e = ctx.e
    thread_row, thread_col = ctx.thread_index(frag.layout, frag.shape)
    thread_col = e.addi(thread_col, e.i32(column)) if column else thread_col
    rows: dict[int, Any] = {}  # a held row's offset -> the address of the thread's column 0 of it
    for (r, c), value, el in zip(element_offsets(frag.layout, frag.shape), frag.elems, els):
        if r not in rows:
            rows[r] = run.address(scratch, e.addi(thread_row, e.i32(r)), thread_col)
        store_shared(e, e.addi(rows[r], e.i32(c * run.isz)), [value], frag.dtype, el.inside if checked else None)


def _write_out(ctx: lower.Context, run: RowsRun, scratch, isz: int) -> None:
    """The run from the scratch: its whole chunks from thread t the t-th of every 128, one st.global.v4 each; its
    partial first chunk from thread 0 and partial last from thread 1 (the first, where it is partial at both ends),
    element by element."""
    e = ctx.e
    first_whole = e.zext(run.head, 32)
    for k0 in range(0, run.max_chunks, THREADS_PER_WARPGROUP):
        k = e.addi(ctx.wg_tid, e.i32(k0))
        whole = e.andi(e.cmpi("uge", k, first_whole), e.cmpi("ult", k, run.last))
        at = e.muli(k, e.i32(CHUNK))
        _store_bytes(e, e.addi(run.boundary, e.ext_i64(at)), whole, _read_chunk(e, e.addi(scratch, at), whole), CHUNK)
    at_head = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    tail = e.cmpi("ne", e.andi(run.end, e.i64(CHUNK - 1)), e.i64(0))
    apart = e.ori(e.cmpi("ugt", run.last, e.i32(0)), _not(e, run.head))
    takes = e.andi(e.cmpi("ult", ctx.wg_tid, e.i32(2)), e.select(at_head, run.head, e.andi(tail, apart)))

    def partial() -> None:  # a branch: the warpgroup's other threads skip its element-by-element stores
        offset = e.select(at_head, e.i32(0), e.muli(run.last, e.i32(CHUNK)))
        words = _read_chunk(e, e.addi(scratch, offset), None)
        start = e.addi(run.boundary, e.ext_i64(run.skew))
        _store_chunk_elements(e, e.addi(run.boundary, e.ext_i64(offset)), words, start, run.end, isz)

    e.only_if(takes, partial)


def _read_chunk(e, addr, pred) -> list:
    """The 16 bytes at shared-window address addr (16-byte aligned) as 4 words, where pred holds (None: always)."""
    if pred is None:
        return e.asm("ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", [addr], [e.int_type(32)] * 4,
                     side_effects=True)
    return e.asm("@$4 ld.shared.v4.b32 {$0, $1, $2, $3}, [$5];", "=r,=r,=r,=r,b,r", [pred, addr],
                 [e.int_type(32)] * 4, side_effects=True)


def _store_chunk_elements(e, at, words: list, start, end, isz: int) -> None:
    """The elements of the chunk of `words` at `at` that lie in [start, end), one store each."""
    per_word = max(1, 4 // isz)
    for j in range(CHUNK // isz):
        addr = e.addi(at, e.i64(j * isz))
        inside = e.andi(e.cmpi("uge", addr, start), e.cmpi("ult", addr, end))
        if isz >= 4:
            _store_bytes(e, addr, inside, words[j * isz // 4:(j + 1) * isz // 4], isz)
        else:
            word = words[j // per_word]
            shift = 8 * isz * (j % per_word)
            part = e.m.arith.shrui(word, e.i32(shift)) if shift else word
            _store_bytes(e, addr, inside, [part], isz)

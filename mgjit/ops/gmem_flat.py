"""Staged stores (`mgjit.store(x, index, value, staged=True)`): a 2D GMEM window store whose rows the layout
gives each warp whole is staged through shared memory and each row written out as aligned 16-byte chunks.

A row that does not start on 16 bytes (bf16 rows of 127, 255) is stored from registers in accesses that straddle
the L2's 32-byte sectors, where it starts inside a 32-bit word in 2-byte halves, and past 7/8 of a window's
columns element by element. ncu (H200, softmax over bf16 rows of 127, 16 rows a program): 9.5 M L2 write sectors
and 3.8 M write requests where rows of 128 take 6.3 M and 1.6 M, the L2 at 0.94 of its peak. A window's columns
inside the tensor are one run of bytes in each of its rows, wherever the row starts and whatever the row stride.
Each lane puts its elements into the scratch, a slot a window row, at their byte offset from the row's run's first
16-byte boundary; the warp's lanes meet (bar.warp.sync); then they store the warp's rows' chunks: whole chunks one
st.global.v4 each, a run's partial first and last chunks element by element.

Whether it pays depends on what hides the staging's round trip, so it is asked for, not chosen here: the row
examples offer it as a mapping the tuner weighs (examples/_rows.py `staging`). Kernel alone, bf16, H200: softmax
over 16 rows of 255 a program 0.87 -> 0.92 of copy bandwidth, 8 of 511 0.93 -> 0.96, RMSNorm 8 of 511 0.89 ->
0.92; but softmax 16 rows of 127 0.83 -> 0.70 (its instructions an element 25.6 -> 34.7: four runs a warp, each
with its partial chunks, for 4 elements a lane a row), 8 of 1023 0.90 -> 0.86 (4 CTAs an SM, 109 -> 127 registers),
and layernorm slower at every length (0.76 -> 0.66 at 127, 0.83 -> 0.77 at 1023). Staged over the whole warpgroup
instead (one run of whole rows, a bar.sync between the puts and the chunks): 255 0.97, 511 0.99, but 1023 0.84 and a
row of 4097 a CTA 0.92 -> 0.81, the warpgroup waiting for its slowest warp while nothing of it is in flight; so only
a warp's lanes meet, and a row spread over warps keeps the register stores. A layout with a row's lanes only as far
as a 32-byte sector (fewer shuffles a reduction, ops/gmem.py NARROW_THREAD_ROWS) staged too: softmax 127 0.79,
255 0.90, no better.

Applies where the launch does not prove rows 16-byte aligned (where it does, the registers' accesses are 16-byte
vectors already) to windows of at most FLAT_STORE_BYTES of two dimensions (after single indices: `out[b, rows,
cols]`) whose layout gives each warp whole rows (`warp_rows`); elsewhere staged=True stores from registers.
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from .. import ir, lower
from ..layouts import LANES_PER_WARP, WARPS_PER_WARPGROUP, Layout, TiledLayout
from ..lower.context import LoweredRef, element_offsets
from .control import in_loop
from .gmem_access import _store_bytes
from .smem import shared_address, store_shared

FLAT_STORE_BYTES = 16 << 10  # the most bytes of a window a flat store stages
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


def flat_store_applies(sizes: tuple[int, ...], ref: LoweredRef, layout: Layout, shape: tuple[int, ...]) -> bool:
    """Whether a store of an array of `shape` in `layout` into a window of `sizes` of `ref` is staged (see the
    module): the window's last two dimensions the array's, any before them single indices (a batch's row block)."""
    spec = ref.spec
    return (len(sizes) >= 2 and tuple(sizes[-2:]) == shape and all(n == 1 for n in sizes[:-2])
            and isinstance(layout, TiledLayout)
            and spec.unit_stride and spec.align < CHUNK and math.prod(sizes) * ref.dtype.itemsize <= FLAT_STORE_BYTES
            and warp_rows(layout, shape) is not None)


def _sync_warp(e) -> None:
    e.asm_void("bar.warp.sync -1;", "", [])


class FlatStage:
    """A flat store's scratch: a slot for each row of the window, which only the warp holding the row writes and
    reads. `put` stages an element (or an aligned access of them) at its byte offset from its row's run's first
    16-byte boundary, `write_out` stores the runs' chunks. Per row a thread holds, only 32-bit values stay live
    across the puts."""

    def __init__(self, ctx: lower.Context, op: ir.Op, sizes: tuple[int, ...], ref: LoweredRef, starts: list,
                 layout: TiledLayout, shape: tuple[int, ...]) -> None:
        e = self.e = ctx.e
        self.ctx, self.ref = ctx, ref
        self.rows = warp_rows(layout, shape)
        isz = self.isz = ref.dtype.itemsize
        self.slot = -(-(sizes[-1] * isz + CHUNK - 1) // CHUNK) * CHUNK  # the most bytes a row's run's chunks span
        self.scratch = shared_address(ctx, ctx.alloc_smem(sizes[-2] * self.slot, CHUNK))
        # The window's leading indices: where its plane starts, and whether it lies inside the tensor.
        self.base, self.inside = ref.ptr, e.const_bool(True)
        for start, n, stride in zip(starts[:-2], ref.sizes[:-2], ref.strides[:-2]):
            self.base = e.addi(self.base, e.muli(e.ext_i64(start), e.muli(stride, e.i64(isz))))
            self.inside = e.andi(self.inside, e.cmpi("ult", start, n))
        # A row's run: its columns from max(c0, 0) to min(c0 + width, n), none where the row is outside the tensor.
        self.r0, c0 = starts[-2:]
        self.rows_n = ref.sizes[-2]
        self.lo = e.m.arith.maxsi(c0, e.i32(0))
        self.count = e.m.arith.maxsi(
            e.subi(e.m.arith.minsi(e.addi(c0, e.i32(sizes[-1])), ref.sizes[-1]), self.lo), e.i32(0))
        self.row_bytes = e.muli(ref.strides[-2], e.i64(isz))
        # The low bits of window row w's run's start: base + (r0 + w) * row_bytes + lo * isz, in 32 bits.
        self.lo32 = e.addi(e.trunc(self.base, 32), e.muli(self.lo, e.i32(isz)))
        self.row_bytes32 = e.trunc(self.row_bytes, 32)
        # element (w, c) sits at slot w + skew + (c - lo) * isz: from the thread's row and column
        thread_row, thread_col = ctx.thread_index(layout, shape)
        column_bytes = e.muli(e.subi(e.addi(c0, thread_col), self.lo), e.i32(isz))
        self.offsets = element_offsets(layout, shape)
        self.put_bases = {}  # a held element's row offset -> the address its column's bytes add to
        for r in sorted({off[0] for off in self.offsets}):
            w = e.addi(thread_row, e.i32(r))
            self.put_bases[r] = e.addi(self._slot(w), e.addi(self._skew(w), column_bytes))
        if in_loop(ctx.kernel, op):
            _sync_warp(e)  # the lanes' earlier reads of the scratch are done

    def _slot(self, w) -> Any:
        return self.e.addi(self.scratch, self.e.muli(w, self.e.i32(self.slot)))

    def _skew(self, w) -> Any:
        """The byte window row w's run starts at past its 16-byte boundary."""
        e = self.e
        return e.andi(e.addi(self.lo32, e.muli(e.addi(self.r0, w), self.row_bytes32)), e.i32(CHUNK - 1))

    def _warp_row(self, j) -> Any:
        """This warp's j-th window row (j an int, or an i32)."""
        e, rows = self.e, self.rows
        if isinstance(j, int):
            rel = e.i32(rows.row(j))
        else:
            within = e.muli(e.andi(j, e.i32(rows.run - 1)), e.i32(rows.run_step))
            blocks = e.muli(e.m.arith.shrui(j, e.i32(rows.run.bit_length() - 1)), e.i32(rows.block_step))
            rel = e.addi(e.i32(rows.first), e.addi(within, blocks))
        return e.addi(rel, e.muli(self.ctx.warp, e.i32(rows.warp_step)))

    def put(self, i: int, elems: list, pred) -> None:
        """Frag elements i, i + 1, ... (consecutive in a row; several only where their access is aligned to its
        bytes), where `pred` holds (None: always)."""
        e = self.e
        addr = e.addi(self.put_bases[self.offsets[i][0]], e.i32(self.offsets[i][1] * self.isz))
        store_shared(e, addr, elems, self.ref.dtype, pred)

    def _run(self, w, skew) -> tuple[Any, Any, Any]:
        """Window row w's run: (its first byte's 16-byte boundary, i64; the chunk holding its end, i32; its end,
        i64)."""
        e = self.e
        r = e.addi(self.r0, w)
        lo_bytes = e.ext_i64(e.muli(self.lo, e.i32(self.isz)))
        start = e.addi(e.addi(self.base, e.muli(e.ext_i64(r), self.row_bytes)), lo_bytes)
        inside = e.andi(self.inside, e.cmpi("ult", r, self.rows_n))
        length = e.select(inside, e.muli(self.count, e.i32(self.isz)), e.i32(0))
        last = e.m.arith.shrui(e.addi(skew, length), e.i32(4))
        return e.andi(start, e.i64(-CHUNK)), last, e.addi(start, e.ext_i64(length))

    def write_out(self) -> None:
        """After the lanes' `put`s: each of the warp's rows' runs from its slot to memory, its whole chunks (from
        the first if the run starts on 16 bytes, else the second, to the last before its end's boundary) one
        st.global.v4 each, lane l the l-th of every 32; then its partial first and last chunks element by element,
        from lanes 2j and 2j + 1 for the warp's j-th row (lanes l and l + 1 of every 32 rows over 16 rows a warp)."""
        e, ctx = self.e, self.ctx
        _sync_warp(e)
        lane_bytes = e.muli(ctx.lane, e.i32(CHUNK))
        for j in range(self.rows.rows_held):
            w = self._warp_row(j)
            skew = self._skew(w)
            boundary, last, _ = self._run(w, skew)
            head = e.zext(e.cmpi("ne", skew, e.i32(0)), 32)  # the first chunk is partial
            slot = e.addi(self._slot(w), lane_bytes)
            at = e.addi(boundary, e.ext_i64(lane_bytes))
            for k0 in range(0, self.slot // CHUNK, LANES_PER_WARP):
                k = e.addi(ctx.lane, e.i32(k0))
                whole = e.andi(e.cmpi("uge", k, head), e.cmpi("ult", k, last))
                words = self._read_chunk(e.addi(slot, e.i32(k0 * CHUNK)), whole)
                _store_bytes(e, e.addi(at, e.i64(k0 * CHUNK)), whole, words, CHUNK)
        for j0 in range(0, self.rows.rows_held, LANES_PER_WARP // 2):
            j = e.addi(e.m.arith.shrui(ctx.lane, e.i32(1)), e.i32(j0))
            e.only_if(e.cmpi("ult", j, e.i32(self.rows.rows_held)), lambda j=j: self._partial(self._warp_row(j)))

    def _partial(self, w) -> None:
        """Window row w's partial first chunk (even lanes, where it is partial) or partial last chunk (odd lanes,
        unless that is the first, partial at both ends, which the even lane takes), element by element."""
        e = self.e
        skew = self._skew(w)
        boundary, last, end = self._run(w, skew)
        head = e.cmpi("ne", skew, e.i32(0))
        at_head = e.cmpi("eq", e.andi(self.ctx.lane, e.i32(1)), e.i32(0))
        tail = e.cmpi("ne", e.andi(end, e.i64(CHUNK - 1)), e.i64(0))
        apart = e.ori(e.cmpi("ugt", last, e.i32(0)), e.cmpi("eq", head, e.const_bool(False)))
        takes = e.select(at_head, head, e.andi(tail, apart))
        offset = e.select(at_head, e.i32(0), e.muli(last, e.i32(CHUNK)))
        words = self._read_chunk(e.addi(self._slot(w), offset), takes)
        start = e.addi(boundary, e.ext_i64(skew))
        _store_chunk_elements(e, e.addi(boundary, e.ext_i64(offset)), words, takes, start, end, self.isz)

    def _read_chunk(self, addr, pred) -> list:
        e = self.e
        return e.asm("@$4 ld.shared.v4.b32 {$0, $1, $2, $3}, [$5];", "=r,=r,=r,=r,b,r", [pred, addr],
                     [e.int_type(32)] * 4, side_effects=True)


def _store_chunk_elements(e, at, words: list, pred, start, end, isz: int) -> None:
    """The elements of the chunk of `words` at `at` that lie in [start, end), one store each, where pred holds."""
    per_word = max(1, 4 // isz)
    for j in range(CHUNK // isz):
        addr = e.addi(at, e.i64(j * isz))
        inside = e.andi(pred, e.andi(e.cmpi("uge", addr, start), e.cmpi("ult", addr, end)))
        if isz >= 4:
            _store_bytes(e, addr, inside, words[j * isz // 4:(j + 1) * isz // 4], isz)
        else:
            word = words[j // per_word]
            shift = 8 * isz * (j % per_word)
            part = e.m.arith.shrui(word, e.i32(shift)) if shift else word
            _store_bytes(e, addr, inside, [part], isz)

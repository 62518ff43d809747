"""The PTX of single GMEM accesses, for the Load and Store rules of mgjit/ops/gmem.py: predicated loads and
stores of aligned 1 to 16 bytes, and accesses that start anywhere in a 32-bit word (bytes shifted with prmt),
stored whole or element by element at a tensor's end."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import torch

from .. import dtypes, lower
from ..dtypes import DType
from ..interpret import numerics
from ..layouts import LANES_PER_WARP, WARPS_PER_WARPGROUP, TiledLayout
from ..lower.context import LoweredRef, element_offsets
from ..lower.words import from_bits, pack_words, slot, unpack_words


@dataclasses.dataclass
class _Element:
    addr: Any  # i64 byte address
    inside: Any  # i1: the element is inside the tensor
    rows: Any  # i1: every index but the last is inside the tensor; None when there is none
    col: Any  # i32 index along the last dimension
    root: Any = None  # i64: addr less a constant `offset` of bytes, shared by the elements of one row of the window
    offset: int = 0


class _WordBases:
    """Where an access that may start anywhere in a 32-bit word finds its words: the 4-byte boundary at or before
    its first byte, the byte it starts at after that boundary (its skew) and the first boundary at or after it.
    Accesses whose addresses differ from a shared root by a constant multiple of 4 bytes share the root's, plus
    their constant, which ptxas folds into each access: computed per access, `addr & ~3` hid that the accesses
    were one base apart, and every access kept an address register pair of its own (softmax over rows of 8191
    bf16 in one 8192-wide window: 32 pairs for its loads, 32 for its stores)."""

    def __init__(self, e, els: Sequence[_Element | None] = ()):
        """Roots of `els` computed here, where they dominate the paths that follow (a window's, its head's and
        the checked one: mgjit/ops/gmem.py); others where first asked for."""
        self.e = e
        self.roots: dict[int, tuple[Any, Any, Any]] = {}  # id(root) -> (floor, skew, ceiling)
        for el in els:
            if el is not None and el.root is not None and not el.offset % 4 and id(el.root) not in self.roots:
                self.roots[id(el.root)] = self._of_address(el.root)

    def _of_address(self, addr) -> tuple[Any, Any, Any]:
        e = self.e
        floor, skew = e.andi(addr, e.i64(-4)), e.andi(e.trunc(addr, 32), e.i32(3))
        return floor, skew, e.addi(floor, e.ext_i64(e.andi(e.addi(skew, e.i32(3)), e.i32(4))))

    def of(self, el: _Element) -> tuple[Any, Any, Any]:
        """(i64 floor, i32 skew in 0..3, i64 ceiling) of el's address."""
        e = self.e
        if el.root is None or el.offset % 4:
            return self._of_address(el.addr)
        if id(el.root) not in self.roots:
            self.roots[id(el.root)] = self._of_address(el.root)
        floor, skew, ceiling = self.roots[id(el.root)]
        if not el.offset:
            return floor, skew, ceiling
        return e.addi(floor, e.i64(el.offset)), skew, e.addi(ceiling, e.i64(el.offset))


def _all(e, preds: Sequence[Any]) -> Any:
    """The conjunction of i1 values (None stands for true)."""
    out = None
    for p in preds:
        if p is not None:
            out = p if out is None else e.andi(out, p)
    return out


def _not(e, p) -> Any:
    return e.m.arith.xori(p, e.const_bool(True))


def _access_suffix(total_bits: int) -> tuple[str, int]:
    """The ld/st type suffix and the number of 32-bit registers for one access of `total_bits` (>= 32)."""
    n = total_bits // 32
    return (f".v{n}.b32" if n > 1 else ".b32"), n


def _load_words(e, addr, pred, n: int, fill: int = 0) -> list:
    """n 32-bit words from addr (aligned to 4n bytes); where pred is false (None: always loaded), the words hold
    the bits of `fill` instead, 32 to a word, the lowest in word 0."""
    suffix, _ = _access_suffix(32 * n)
    outs = ", ".join(f"${i}" for i in range(n))
    dst = f"{{{outs}}}" if n > 1 else outs
    if pred is None:
        return e.asm(f"ld.global{suffix} {dst}, [${n}];", ",".join(["=r"] * n + ["l"]), [addr],
                     [e.int_type(32)] * n, side_effects=True)
    preset = " ".join(f"mov.b32 ${i}, {fill >> 32 * i & 0xFFFFFFFF:#x};" for i in range(n))
    text = f"{preset} @${n} ld.global{suffix} {dst}, [${n + 1}];"
    return e.asm(text, ",".join(["=r"] * n + ["b", "l"]), [pred, addr], [e.int_type(32)] * n, side_effects=True)


def _store_bytes(e, addr, pred, data: Sequence[Any], nbytes: int) -> None:
    """Store `nbytes` (1, 2, 4, 8 or 16) at addr (aligned to them) where pred holds (None: always): data is
    nbytes // 4 words, or one i16 or i32 holding 1 or 2 bytes in its low bits."""
    guard, operands, constraints = ("", [], []) if pred is None else ("@$0 ", [pred], ["b"])
    k = len(operands)
    if nbytes < 4:
        half = data[0] if data[0].type == e.int_type(16) else e.trunc(data[0], 16)
        e.asm_void(f"{guard}st.global.{'b16' if nbytes == 2 else 'u8'} [${k}], ${k + 1};",
                   ",".join(constraints + ["l", "h"]), [*operands, addr, half])
        return
    suffix, n = _access_suffix(8 * nbytes)
    srcs = ", ".join(f"${i + k + 1}" for i in range(n))
    src = f"{{{srcs}}}" if n > 1 else srcs
    e.asm_void(f"{guard}st.global{suffix} [${k}], {src};", ",".join(constraints + ["l"] + ["r"] * n),
               [*operands, addr, *data])


def fill_bits(value: int | float, dtype: DType) -> int:
    """The bits of `value` stored as one element of `dtype`, rounded as the interpreter's fill is (torch)."""
    raw = torch.tensor([value], dtype=numerics.torch_dtype(dtype)).view(torch.uint8)
    return int.from_bytes(bytes(raw.tolist()), "little")


def _load_access(ctx: lower.Context, addr, pred, dtype: DType, count: int, fill: int = 0, limit=None) -> list:
    """`count` elements from addr; where pred is false (None: always loaded) each reads as the element whose bits
    are `fill` (fill_bits). The registers hold it before the predicated load, so no select per element follows
    the load (softmax over rows of 4097 bf16 held by one warpgroup, SASS: 36 SEL and 163 PRMT -> 2 and 98).
    `limit` (an i32, or None): elements from index `limit` on read as `fill` too (past a row's end), the first
    excepted (pred covers it)."""
    e = ctx.e
    bits = dtype.storage_bits
    total = count * bits
    filled = sum(fill << k * bits for k in range(count))  # the bits of `count` fills, the first lowest
    if total < 32:  # one or two narrow elements: a 16-bit register, no conversions around the access
        suffix = ".b16" if total == 16 else ".u8"
        if pred is None:
            half = e.asm(f"ld.global{suffix} $0, [$1];", "=h,l", [addr], [e.int_type(16)], side_effects=True)[0]
        else:
            half = e.asm(f"mov.b16 $0, {filled:#x}; @$1 ld.global{suffix} $0, [$2];", "=h,b,l", [pred, addr],
                         [e.int_type(16)], side_effects=True)[0]
        if limit is not None:  # the same fill, in the 16-bit register widened to a word and back
            half = e.trunc(_fill_past(e, [e.zext(half, 32)], limit, bits, count, fill)[0], 16)
        return _unpack_narrow(e, half if total == 16 else e.trunc(half, 8), dtype, count)
    words = _load_words(e, addr, pred, total // 32, filled)
    return unpack_words(e, words if limit is None else _fill_past(e, words, limit, bits, count, fill), dtype, count)


def _fill_past(e, words: list, limit, bits: int, count: int, fill: int) -> list:
    """The words of an access of `count` elements of `bits` bits with the elements from index `limit` on (an
    i32; the first is always kept) replaced by the bits `fill`: a select of the word per element, which keeps the
    elements packed until they are converted. Selecting the unpacked elements held each in a register of its own
    meanwhile: layernorm over bf16 rows of 4095, whose weight vectors end inside an access, took 127 registers
    (95 with weights 4096 long). The selects sit behind a branch on the access reaching past the row's end, which
    every access but a row's last skips: unbranched, the fused elementwise example's flat ragged loads, no longer
    behind a branch on their window being inside, issued 50.7 PTX instructions an element, 44.7 so (42.7 with the
    window's branch)."""
    return e.if_else(e.cmpi("slt", limit, e.i32(count)), [w.type for w in words],
                    lambda: _filled_words(e, words, limit, bits, count, fill), lambda: list(words))


def _filled_words(e, words: list, limit, bits: int, count: int, fill: int) -> list:
    out = list(words)
    for k in range(1, count):
        keep = e.cmpi("slt", e.i32(k), limit)
        if bits >= 32:
            for part in range(bits // 32):
                j = k * bits // 32 + part
                out[j] = e.select(keep, out[j], _word_const(e, fill >> 32 * part))
            continue
        j, shift = divmod(k * bits, 32)
        mask = ((1 << bits) - 1) << shift
        replaced = e.ori(e.andi(out[j], _word_const(e, ~mask)), _word_const(e, fill << shift & mask))
        out[j] = e.select(keep, out[j], replaced)
    return out


def _word_const(e, bits: int):
    """An i32 constant of the low 32 bits of `bits`."""
    bits &= 0xFFFFFFFF
    return e.i32(bits - (1 << 32) if bits >> 31 else bits)


def _unpack_narrow(e, word, dtype: DType, count: int) -> list:
    bits = dtype.storage_bits
    out = []
    for j in range(count):
        x = e.m.arith.shrui(word, e.const(j * bits, _int_of(word, e))) if j else word
        if word.type != e.int_type(bits):
            x = e.trunc(x, bits)
        out.append(from_bits(e, x, dtype))
    return out


def _int_of(word, e) -> DType:
    width = e.ir.IntegerType(word.type).width
    return {8: dtypes.int8, 16: dtypes.int16, 32: dtypes.int32}[width]


def _store_access(ctx: lower.Context, addr, pred, elems, dtype: DType) -> None:
    e = ctx.e
    total = len(elems) * dtype.storage_bits
    _store_bytes(e, addr, pred, pack_words(e, elems, dtype), total // 8)


# -- accesses below 4-byte alignment
# A row of 4097 bf16 starts 2 bytes further into a 32-bit word than the row before it. Where an access's
# alignment is known only at run time and is below 4 bytes (16- and 8-bit elements), it moves aligned 32-bit
# words: a load reads the words its bytes straddle (one more than it holds, when it starts inside a word) and
# shifts them into place with one byte permute (prmt) per word; a store writes the words wholly inside its
# bytes and a head and a tail of 1 to 3 bytes. Elements partly outside the tensor are stored one by one,
# behind a branch. Where bounds go per word or element (these accesses, narrowed or ragged ones), a window
# wholly inside the tensor (one test, the same for every thread) skips them all, and one whose first 7/8 of
# columns are inside skips them there. (Aligned 16-byte chunks
# shifted between lanes cost 3 to 6 times the instructions: the shift is a runtime value, so every word goes
# through a tree of selects. The words take more L1 wavefronts, which a memory-bound kernel can spare: 4 to 5
# per 16 bytes, as 4-byte elements take.)

def _prmt(e, lo, hi, selector) -> Any:
    """The 4 bytes of {hi:lo} (lo the low word) that `selector` names (prmt's default mode)."""
    i32 = e.int_type(32)
    return e.asm("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [lo, hi, selector], [i32])[0]


def _bytes_from(e, skew) -> Any:
    """The prmt selector of bytes skew .. skew + 3 (skew a runtime i32 in 0..3)."""
    return e.addi(e.i32(0x3210), e.muli(skew, e.i32(0x1111)))


def _word_loads(ctx: lower.Context, ref: LoweredRef, w: int, els: list[_Element], checked: bool, fill,
                bases: _WordBases) -> list:
    """Each access as the nw + 1 words from the one its first byte is in, shifted by prmt. Unchecked (the window
    is inside the tensor), only the last word is predicated: on the access starting inside a word (else it is
    the next access's). Checked, a word is loaded when it holds an element inside the tensor (of this row, or
    just before the access), and elements outside read as `fill` (a value of the ref's dtype)."""
    e = ctx.e
    dtype, isz, n = ref.dtype, ref.dtype.itemsize, ref.sizes[-1]
    nw, per_word = w * isz // 4, 4 // isz
    out = []
    for i in range(0, len(els), w):
        el = els[i]
        base, skew, _ = bases.of(el)
        if checked:
            lo, hi = _span(e, el, n)
            lead = e.m.arith.shrui(skew, e.i32(isz.bit_length() - 1))  # elements of the first word before el
            lo, hi = e.addi(lo, lead), e.addi(hi, lead)
            preds = [_all(e, [el.rows, e.cmpi("slt", e.i32(m * per_word), hi),
                              e.cmpi("sge", e.i32(m * per_word + per_word - 1), lo)]) for m in range(nw + 1)]
        else:
            preds = [None] * nw + [e.cmpi("ne", skew, e.i32(0))]
        words = [_load_words(e, e.addi(base, e.i64(4 * m)), preds[m], 1)[0] for m in range(nw + 1)]
        selector = _bytes_from(e, skew)
        vals = unpack_words(e, [_prmt(e, words[j], words[j + 1], selector) for j in range(nw)], dtype, w)
        if checked:
            vals = [e.select(els[i + k].inside, v, fill) for k, v in enumerate(vals)]
        out.extend(vals)
    return out


def _store_unaligned_access(e, el: _Element, words: list, pred, isz: int, bases: _WordBases) -> None:
    """One access (its bytes packed in `words`) that may start anywhere in a 32-bit word, where pred holds: the
    words wholly inside its bytes (the bytes shifted into them by prmt), then a head and a tail."""
    nbytes = 4 * len(words)
    end, tail, body = bases.of(el)  # the boundaries before and after its first byte; the bytes past the first
    head = e.andi(e.subi(e.i32(4), tail), e.i32(3))  # bytes before the first boundary
    selector = _bytes_from(e, head)
    for j in range(len(words) - 1):  # bytes head + 4j .. head + 4j + 3
        _store_bytes(e, e.addi(body, e.i64(4 * j)), pred, [_prmt(e, words[j], words[j + 1], selector)], 4)
    _store_bytes(e, e.addi(body, e.i64(nbytes - 4)), _all(e, [pred, e.cmpi("eq", tail, e.i32(0))]), [words[-1]], 4)
    first, last = words[0], words[-1]
    if isz == 1:  # a head of 1 or 3 bytes starts with a byte, a tail of 1 or 3 ends with one
        _store_bytes(e, el.addr, _all(e, [pred, _bit_set(e, head, 1)]), [e.trunc(first, 16)], 1)
        _store_bytes(e, e.addi(el.addr, e.i64(nbytes - 1)), _all(e, [pred, _bit_set(e, tail, 1)]),
                     [e.trunc(e.m.arith.shrui(last, e.i32(24)), 16)], 1)
        odd = e.andi(head, e.i32(1))
        pair = e.trunc(e.m.arith.shrui(first, e.muli(odd, e.i32(8))), 16)
        end_pair = e.trunc(e.m.arith.shrui(last, e.muli(e.subi(e.i32(4), tail), e.i32(8))), 16)
    else:
        odd = e.i32(0)
        pair, end_pair = e.trunc(first, 16), e.trunc(e.m.arith.shrui(last, e.i32(16)), 16)
    _store_bytes(e, e.addi(el.addr, e.ext_i64(odd)) if isz == 1 else el.addr, _all(e, [pred, _bit_set(e, head, 2)]),
                 [pair], 2)
    _store_bytes(e, e.addi(end, e.i64(nbytes)), _all(e, [pred, _bit_set(e, tail, 2)]), [end_pair], 2)


@functools.lru_cache(maxsize=256)
def lanes_along_rows(layout: TiledLayout, shape: tuple[int, ...], w: int) -> bool:
    """Whether the 32 lanes of every warp hold one row's consecutive accesses of `w` elements, lane l the l-th."""
    if len(shape) < 1:
        return False
    first = next(iter(layout.registers(shape)))
    for warp in range(WARPS_PER_WARPGROUP):
        idx = [layout.element_index(shape, warp * LANES_PER_WARP + lane, first, 0) for lane in range(LANES_PER_WARP)]
        if any(i[:-1] != idx[0][:-1] or i[-1] != idx[0][-1] + lane * w for lane, i in enumerate(idx)):
            return False
    return True


@functools.lru_cache(maxsize=256)
def word_links(layout: TiledLayout, shape: tuple[int, ...], w: int, accesses: tuple[int, ...]
               ) -> tuple[tuple[int | None, bool], ...]:
    """For each of `accesses` (Frag indices of accesses of `w` elements, lanes along rows): the position among them
    of the access whose columns follow its own in the same row (lane 0's first element continuing lane 31's last),
    or None; and whether one precedes it."""
    offsets = element_offsets(layout, shape)
    where = {offsets[i]: k for k, i in enumerate(accesses)}
    step = 32 * w
    links = []
    for i in accesses:
        off = offsets[i]
        nxt = where.get(off[:-1] + (off[-1] + step,))
        links.append((nxt, off[:-1] + (off[-1] - step,) in where))
    return tuple(links)


def _store_shuffled_words(ctx: lower.Context, firsts: list[_Element], words: list, links, bases: _WordBases) -> None:
    """One 32-bit word of two 16-bit elements an access (lanes along a row, lane l holding its l-th word), every
    access inside the tensor. A row that starts on a word stores each word whole. One that starts inside a word
    (its byte skew 2) stores the aligned word that holds this lane's second element and the next lane's first,
    taken by a shuffle (lane 31 takes lane 0's of the access that continues the row, `links`), so that each word
    goes as one 4-byte store where it went as two 2-byte halves: a row's first element (lane 0, no access before)
    and last (lane 31, none after) go alone."""
    e = ctx.e
    lane = ctx.lane
    first_lane, last_lane = e.cmpi("eq", lane, e.i32(0)), e.cmpi("eq", lane, e.i32(31))
    source_lane = e.andi(e.addi(lane, e.i32(1)), e.i32(31))
    for el, word, (nxt, prev) in zip(firsts, words, links):
        _, skew, _ = bases.of(el)
        mid = e.cmpi("ne", skew, e.i32(0))
        _store_bytes(e, el.addr, _not(e, mid), [word], 4)
        sent = e.select(first_lane, words[nxt], word) if nxt is not None else word
        neighbour = e.shfl_idx(sent, source_lane)
        joined = _prmt(e, word, neighbour, e.i32(0x5432))
        has_next = None if nxt is not None else _not(e, last_lane)
        _store_bytes(e, e.addi(el.addr, e.i64(2)), _all(e, [mid, has_next]), [joined], 4)
        if nxt is None:
            _store_bytes(e, e.addi(el.addr, e.i64(2)), e.andi(mid, last_lane),
                         [e.trunc(e.m.arith.shrui(word, e.i32(16)), 16)], 2)
        if not prev:
            _store_bytes(e, el.addr, e.andi(mid, first_lane), [e.trunc(word, 16)], 2)


def _store_whole_or_elementwise(ctx: lower.Context, ref: LoweredRef, w: int, els: list[_Element], elems: list,
                                primary, store_whole: Callable[[_Element, list, Any], None]) -> None:
    """Accesses wholly inside the tensor through `store_whole(first element, packed words, predicate)`; those
    partly inside element by element, behind one branch."""
    e = ctx.e
    dtype, n, isz = ref.dtype, ref.sizes[-1], ref.dtype.itemsize
    loose, packed, spans = [], [], []
    for i in range(0, len(els), w):
        el = els[i]
        spans.append(_span(e, el, n))
        lo, hi = spans[-1]
        whole = _all(e, [el.rows, e.cmpi("sle", lo, e.i32(0)), e.cmpi("sge", hi, e.i32(w)), primary])
        packed.append(pack_words(e, elems[i:i + w], dtype))
        store_whole(el, packed[-1], whole)
        loose.append(_all(e, [_not(e, whole), e.cmpi("slt", lo, e.i32(w)), e.cmpi("sgt", hi, e.i32(0)), primary]))

    def elementwise():
        for a, i in enumerate(range(0, len(els), w)):
            _store_elementwise(e, els[i], spans[a], loose[a], packed[a], w, isz)
    e.only_if(functools.reduce(e.ori, loose), elementwise)


def _span(e, first: _Element, n) -> tuple[Any, Any]:
    """(lo, hi): element k of the access that starts at `first` is inside its row when lo <= k < hi.

    Stores test their bounds this way, not as `col + k < n`: the compiler would match those indices with the
    ones a kernel computed for its own masks and keep all of them in registers until the store."""
    return e.subi(e.i32(0), first.col), e.subi(n, first.col)


def _store_elementwise(e, first: _Element, span: tuple[Any, Any], pred, words: list, w: int, itemsize: int) -> None:
    """Store the elements of an access (packed in words) that are inside the tensor, one by one, where pred
    holds. Their addresses are computed here, inside the branch that needs them."""
    lo, hi = span
    pred = _all(e, [pred, first.rows])
    for k in range(w):
        inside = e.andi(e.cmpi("sle", lo, e.i32(k)), e.cmpi("sgt", hi, e.i32(k)))
        _store_bytes(e, e.addi(first.addr, e.i64(k * itemsize)), e.andi(pred, inside),
                     slot(e, words, k * itemsize, itemsize), itemsize)


def _bit_set(e, x, bit: int) -> Any:
    return e.cmpi("ne", e.andi(x, e.i32(bit)), e.i32(0))

"""Register data as 32-bit words: elements packed into words for memory accesses, and bytes moved between
words by amounts known only at run time (funnel shifts, slot selection, merges).

Memory accesses of 4 to 16 bytes move whole 32-bit registers. When an access's alignment is known only at
run time (a row of 4097 bf16 starts at a different offset in every 16-byte chunk), the GMEM lowering moves
aligned chunks and shifts the bytes into place with these helpers: everything is selects, shifts and PTX
funnel shifts on words, with no branch.
"""
from __future__ import annotations

from typing import Any, Sequence

from .. import dtypes
from ..dtypes import DType


def to_bits(e, x, dtype: DType):
    """An element as an integer of its storage width."""
    if dtype == dtypes.bool_:
        return e.zext(x, 8)
    if dtype.is_float:
        return e.bitcast(x, e.int_type(dtype.storage_bits))
    return x


def from_bits(e, x, dtype: DType):
    if dtype == dtypes.bool_:
        return e.cmpi("ne", x, e.const(0, dtypes.int8))
    if dtype.is_float:
        return e.bitcast(x, e.type(dtype))
    return x


def pack_words(e, elems, dtype: DType) -> list:
    """Elements (one access) → 32-bit words (or one narrower integer for accesses under 32 bits)."""
    bits = dtype.storage_bits
    ints = [to_bits(e, x, dtype) for x in elems]
    if bits == 64:
        words = []
        for x in ints:
            words.append(e.trunc(x, 32))
            words.append(e.trunc(e.m.arith.shrui(x, e.i64(32)), 32))
        return words
    per_word = 32 // bits
    if per_word == 1:
        return ints
    # Narrow elements go through a vector<per_word x iN> bitcast: one register move, not shifts and ors.
    return [e.pack_i32(ints[i:i + per_word]) for i in range(0, len(ints), per_word)]


def unpack_words(e, words, dtype: DType, count: int) -> list:
    bits = dtype.storage_bits
    if bits == 64:
        out = []
        for lo, hi in zip(words[0::2], words[1::2]):
            x = e.ori(e.zext(lo, 64), e.m.arith.shli(e.zext(hi, 64), e.i64(32)))
            out.append(from_bits(e, x, dtype))
        return out
    per_word = 32 // bits
    if per_word == 1:
        return [from_bits(e, w, dtype) for w in words][:count]
    out = [x for w in words for x in e.unpack_i32(w, bits)]
    return [from_bits(e, x, dtype) for x in out[:count]]


def _is_set(e, x, bit: int):
    """i1: bit `bit` (a power of two) of the i32 x is set."""
    return e.cmpi("ne", e.andi(x, e.i32(bit)), e.i32(0))


def pick(e, options: Sequence[Any], index) -> Any:
    """options[index] for a runtime i32 index below len(options) (a power of two): a tree of selects."""
    level = list(options)
    bit = 1
    while len(level) > 1:
        c = _is_set(e, index, bit)
        level = [e.select(c, level[i + 1], level[i]) for i in range(0, len(level), 2)]
        bit *= 2
    return level[0]


def funnel(e, lo: Sequence[Any], hi: Sequence[Any], shift, granule: int) -> list:
    """The 4·len(lo) bytes that start at byte `shift` of the words lo followed by hi (little-endian, as memory
    holds them). `shift` is a runtime i32, a multiple of `granule` (a power of two) and below 4·len(lo):
    whole words are picked by selects on the bits of shift // 4, the bytes within a word by `shf.r`."""
    n = len(lo)
    words = list(lo) + list(hi)
    word_shift = e.m.arith.shrui(shift, e.i32(2))
    bit = max(granule // 4, 1)
    while bit < n:
        c = _is_set(e, word_shift, bit)
        words = [e.select(c, words[j + bit], words[j]) for j in range(len(words) - bit)]
        bit *= 2
    if granule >= 4:
        return words[:n]
    bits = e.muli(e.andi(shift, e.i32(3)), e.i32(8))
    i32 = e.int_type(32)
    # shf.r.wrap.b32 d, a, b, c: d = the low word of (b:a) >> c, a the low half.
    return [e.asm("shf.r.wrap.b32 $0, $1, $2, $3;", "=r,r,r,r", [words[j], words[j + 1], bits], [i32])[0]
            for j in range(n)]


def merge_below(e, low: Sequence[Any], high: Sequence[Any], count, granule: int) -> list:
    """Word by word, the bytes below byte `count` (a runtime i32, a multiple of `granule`, below 4·len(low))
    from `low` and the others from `high`."""
    out = []
    for j, (a, b) in enumerate(zip(low, high)):
        whole = e.cmpi("sge", count, e.i32(4 * j + 4))
        if granule >= 4:
            out.append(e.select(whole, a, b))
            continue
        none = e.cmpi("sle", count, e.i32(4 * j))
        # 1..3 bytes of this word come from `low`; the mask is only used when that is so.
        mask = e.subi(e.m.arith.shli(e.i32(1), e.muli(e.andi(e.subi(count, e.i32(4 * j)), e.i32(3)), e.i32(8))),
                      e.i32(1))
        mixed = e.ori(e.andi(a, mask), e.andi(b, e.m.arith.xori(mask, e.i32(-1))))
        out.append(e.select(whole, a, e.select(none, b, mixed)))
    return out


def slot(e, words: Sequence[Any], pos, nbytes: int) -> list:
    """The `nbytes` bytes at byte offset `pos` of the words (an int, or a runtime i32; a multiple of nbytes):
    nbytes // 4 words, or for 1 or 2 bytes one i16 that holds them in its low bits."""
    n = len(words)
    if isinstance(pos, int):
        if nbytes >= 4:
            return list(words[pos // 4:(pos + nbytes) // 4])
        word = words[pos // 4]
        return [e.trunc(e.m.arith.shrui(word, e.i32(pos % 4 * 8)) if pos % 4 else word, 16)]
    if nbytes >= 4:
        per = nbytes // 4
        index = e.m.arith.shrui(pos, e.i32(nbytes.bit_length() - 1))
        return [pick(e, [words[s * per + m] for s in range(n // per)], index) for m in range(per)]
    word = pick(e, list(words), e.m.arith.shrui(pos, e.i32(2)))
    shifted = e.m.arith.shrui(word, e.muli(e.andi(pos, e.i32(3)), e.i32(8)))
    return [e.trunc(shifted, 16)]

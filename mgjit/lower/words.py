"""Register data as 32-bit words: elements packed into words for memory accesses, and the bytes of one element
taken out of them.

Memory accesses of 4 to 16 bytes move whole 32-bit registers. (When an access's alignment is known only at run
time, the GMEM lowering shifts bytes between words with prmt: see mgjit/ops/gmem_access.py.)
"""
from __future__ import annotations

from typing import Any, Sequence

from .. import dtypes
from ..dtypes import DType


_INTS = {8: dtypes.int8, 16: dtypes.int16}


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
    """Elements (one access) → 32-bit words; an access under 32 bits fills the low bits of one word."""
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
    # Padded with zeros to whole words (`Emitter.pack_i32`: halves through a vector bitcast, bytes or'ed in).
    ints += [e.const(0, _INTS[bits])] * (-len(ints) % per_word)
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


def slot(e, words: Sequence[Any], pos: int, nbytes: int) -> list:
    """The `nbytes` bytes at byte offset `pos` (a multiple of nbytes) of the words: nbytes // 4 words, or for 1
    or 2 bytes one i16 that holds them in its low bits."""
    if nbytes >= 4:
        return list(words[pos // 4:(pos + nbytes) // 4])
    word = words[pos // 4]
    return [e.trunc(e.m.arith.shrui(word, e.i32(pos % 4 * 8)) if pos % 4 else word, 16)]

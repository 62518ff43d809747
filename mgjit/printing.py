"""`mgjit.print`: the records a kernel writes, and how the host turns them into text.

A kernel that prints gets a hidden parameter, an int32 buffer the launcher allocates (mgjit/hidden.py). Word 0
is a cursor: each print reserves its records there with one atomic add per warpgroup, so records of one
warpgroup lie in program order. A record is

    site + 1, CTA (linear index, x fastest), thread (in the CTA), its length in words, then each value:
    a scalar as its word(s); an array printed once per CTA or warpgroup as all its elements, row-major;
    an array printed per thread as the count of elements the thread holds, then (flat index, word(s)) each.

Values travel widened to 32 bits (64-bit types as two words, low first): 16-bit floats as float32, narrow ints
and bools as int32, 8-bit floats as their bits, which loses nothing. After the launch the host reads the buffer back (this waits for the
kernel), sorts the records by CTA, then thread, then position (so that the text does not depend on the order
CTAs ran in) and formats them here. The interpreter writes the same words into a CPU buffer and goes through
the same decoding and formatting, so it prints the same text by construction.

Why a buffer and not `vprintf` (the driver's printf FIFO, as Triton's device_print uses): the text is formatted
by Python, so the interpreter's output is the GPU's by construction and every Python format spec works; it
goes to `sys.stdout`, so it shows in a notebook cell and pytest captures it (vprintf writes to the process's C
stdout, which a notebook does not show, at the next synchronization); lines come out in a deterministic order;
and a full buffer is reported, where the printf FIFO drops lines silently. The cost: a printing kernel
launches through the Python path and synchronizes after each launch, which a debugging run can afford.
"""
from __future__ import annotations

import os
import string
from typing import Any, Sequence

import numpy as np
import torch

from . import dtypes
from .dtypes import DType

MODES = ("cta", "warpgroup", "thread")
HEADER_WORDS = 4  # site + 1, CTA, thread, record length
CURSOR_WORDS = 1
# The default buffer: 4 MiB of records per launch (MGJIT_PRINT_WORDS sets another size).
DEFAULT_WORDS = 1 << 20


def buffer_words() -> int:
    return int(os.environ.get("MGJIT_PRINT_WORDS", DEFAULT_WORDS))


def word_dtype(dtype: DType) -> DType:
    """The type a printed value travels as: 64-bit types as themselves, 16-bit floats as float32, integers
    and bools as int32 (sign- or zero-extended by their signedness), 8-bit floats as their bits in an int32
    (registers cannot convert them; the host can)."""
    if dtype.bits == 64:
        return dtype
    return dtypes.float32 if dtype.is_float and dtype.bits > 8 else dtypes.int32


def travels_as_bits(dtype: DType) -> bool:
    return dtype.is_float and dtype.bits == 8


def value_words(dtype: DType) -> int:
    return 2 if dtype.bits == 64 else 1


def parse_format(fmt: str, count: int) -> list[tuple[str, str | None]]:
    """`fmt` as (literal text, format spec of the value after it, or None after the last value); raises
    ValueError unless it has exactly `count` fields, each `{}` or `{:spec}`."""
    try:
        parts = list(string.Formatter().parse(fmt))
    except ValueError as e:
        raise ValueError(f"bad format string {fmt!r}: {e}") from None
    fields = [(text, spec) for text, name, spec, conversion in parts if name is not None]
    for text, name, spec, conversion in parts:
        if name is not None and (name != "" or conversion is not None or "{" in (spec or "")):
            field = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"mgjit.print fields are {{}} or {{:spec}} (values in order), got {field} in {fmt!r}")
    if len(fields) != count:
        raise ValueError(f"the format {fmt!r} has {len(fields)} field{'s' if len(fields) != 1 else ''} for "
                         f"{count} value{'s' if count != 1 else ''}")
    out = [(text, spec or "") for text, name, spec, _ in parts if name is not None]
    tail = parts[-1][0] if parts and parts[-1][1] is None else ""
    return out + [(tail, None)]


def record_words(where: str, values: Sequence[tuple[DType, tuple[int, ...]]], held: Sequence[int]) -> int:
    """The words of one record of a print site: `values` its (dtype, shape) each, `held` per array the elements
    one thread holds (what a per-thread record carries)."""
    n = HEADER_WORDS
    for (dtype, shape), count in zip(values, held):
        w = value_words(dtype)
        if not shape:
            n += w
        elif where == "thread":
            n += 1 + count * (1 + w)
        else:
            n += int(np.prod(shape)) * w
    return n


# ---------------------------------------------------------------------------------------------- host side

def _value(words: Sequence[int], dtype: DType) -> Any:
    """A Python number from the word(s) a value travelled as."""
    if dtype.bits == 64:
        bits = (int(words[0]) & 0xFFFFFFFF) | (int(words[1]) << 32)
        raw = np.array([bits & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
        return float(raw.view(np.float64)[0]) if dtype.is_float else int(raw.view(np.int64)[0])
    word = np.array([words[0]], dtype=np.int32)
    if travels_as_bits(dtype):
        return torch.tensor([int(word[0]) & 0xFF], dtype=torch.uint8).view(getattr(torch, dtype.torch_name)).item()
    if dtype.is_float:
        return float(word.view(np.float32)[0])
    if dtype == dtypes.bool_:
        return bool(word[0])
    return int(word[0])


def _text(x: Any, dtype: DType, spec: str) -> str:
    """One element as text, formatted by `spec` (Python's format mini-language). A float narrower than 64 bits
    is first the shortest decimal that reads back as it in float32 (0.1, not 0.10000000149011612)."""
    if dtype.is_float and dtype.bits < 64:
        x = float(str(np.float32(x)))
    return format(x, spec)


def _nested(flat: list[str], shape: Sequence[int]) -> str:
    if len(shape) <= 1:
        return "[" + ", ".join(flat) + "]"
    step = len(flat) // shape[0]
    return "[" + ", ".join(_nested(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])) + "]"


def _unravel(index: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for d in reversed(shape):
        out.append(index % d)
        index //= d
    return tuple(reversed(out))


def decode(buffer: torch.Tensor, sites: Sequence[dict]) -> tuple[list[tuple[int, int, int, list[str]]], int]:
    """The records in a print buffer, each (CTA, thread, site, the formatted value texts), in the order they
    lie; and how many words were reserved past the buffer's end (records that were dropped)."""
    words = buffer.cpu().tolist()
    used = words[0] & 0xFFFFFFFF
    end = min(CURSOR_WORDS + used, len(words))
    records = []
    pos = CURSOR_WORDS
    while pos + HEADER_WORDS <= end:
        site_id, cta, thread, length = words[pos:pos + HEADER_WORDS]
        if not 0 < site_id <= len(sites) or length < HEADER_WORDS or pos + length > end:
            break  # a record reserved past the end (the rest were dropped)
        site = sites[site_id - 1]
        body = words[pos + HEADER_WORDS:pos + length]
        records.append((cta, thread, site_id - 1, _format_values(site, body)))
        pos += length
    return records, max(0, CURSOR_WORDS + used - len(words))


def _format_values(site: dict, body: list[int]) -> list[str]:
    specs = [spec for _, spec in parse_format(site["format"], len(site["values"]))[:-1]]
    out, pos = [], 0
    for v, spec in zip(site["values"], specs):
        dtype = dtypes.BY_NAME[v["dtype"]]
        w = value_words(dtype)
        shape = v["shape"]
        if not shape:
            out.append(_text(_value(body[pos:pos + w], dtype), dtype, spec))
            pos += w
        elif site["where"] == "thread":
            count = body[pos]
            pos += 1
            items = []
            for _ in range(count):
                index = _unravel(body[pos], shape)
                items.append(f"{index if len(index) > 1 else index[0]}: "
                             f"{_text(_value(body[pos + 1:pos + 1 + w], dtype), dtype, spec)}")
                pos += 1 + w
            out.append("{" + ", ".join(items) + "}")
        else:
            n = int(np.prod(shape))
            flat = [_text(_value(body[pos + i * w:pos + (i + 1) * w], dtype), dtype, spec) for i in range(n)]
            out.append(_nested(flat, shape))
            pos += n * w
    return out


def _cta_coords(linear: int, grid: Sequence[int]) -> tuple[int, int, int]:
    return linear % grid[0], (linear // grid[0]) % grid[1], linear // (grid[0] * grid[1])


def lines(buffer: torch.Tensor, sites: Sequence[dict], grid: Sequence[int]) -> list[str]:
    """The text a launch printed, one line per record, ordered by CTA, thread and program order; a last line
    says how much did not fit the buffer."""
    records, dropped = decode(buffer, sites)
    order = sorted(range(len(records)), key=lambda i: (records[i][0], records[i][1], i))
    out = []
    for i in order:
        cta, thread, site_id, texts = records[i]
        site = sites[site_id]
        x, y, z = _cta_coords(cta, grid)
        who = {"cta": "", "warpgroup": f" wg {thread // 128}", "thread": f" thread {thread}"}[site["where"]]
        pieces = parse_format(site["format"], len(texts))
        message = "".join(text + (value if value is not None else "")
                          for (text, _), value in zip(pieces, [*texts, None]))
        out.append(f"[cta ({x}, {y}, {z}){who}] {message}")
    if dropped:
        out.append(f"mgjit.print: {dropped} more words of records did not fit the buffer of {len(buffer)} words "
                   f"and were dropped (set MGJIT_PRINT_WORDS to a larger size)")
    return out

"""Cache keys and the names of an entry's files: `hash_parts`, and the checks of what may name an entry."""

from __future__ import annotations

import hashlib
import re
from typing import Any

META = "meta.json"
KEY_RE = re.compile(r"[0-9a-f]{8,128}")
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def hash_parts(*parts: Any) -> str:
    """A stable sha256 hex digest of a nested structure of str/bytes/int/float/bool/None/tuple/list/dict.

    Every value is type-tagged and length-prefixed, so ("ab", "c") and ("a", "bc") differ, as do 1, 1.0,
    True, "1" and [1] versus (1,). Dict items are ordered by their encoded keys, so insertion order does not
    matter. Any other type raises TypeError rather than falling back to repr, which may not be stable.
    """
    out: list[bytes] = [b"mgjit.hash_parts/1\0"]
    _encode(parts, out)
    return hashlib.sha256(b"".join(out)).hexdigest()


def _encode(x: Any, out: list[bytes]) -> None:
    # bool before int: bool is a subclass of int.
    if x is None:
        out.append(b"N")
    elif isinstance(x, bool):
        out.append(b"T" if x else b"F")
    elif isinstance(x, int):
        out.append(b"i%d;" % x)
    elif isinstance(x, float):
        out.append(b"f" + x.hex().encode() + b";")
    elif isinstance(x, str):
        data = x.encode("utf-8", "surrogatepass")
        out.append(b"s%d:" % len(data))
        out.append(data)
    elif isinstance(x, (bytes, bytearray, memoryview)):
        data = bytes(x)
        out.append(b"b%d:" % len(data))
        out.append(data)
    elif isinstance(x, (tuple, list)):
        out.append(b"%s%d:" % (b"t" if isinstance(x, tuple) else b"l", len(x)))
        for item in x:
            _encode(item, out)
    elif isinstance(x, dict):
        items = []
        for k, v in x.items():
            kb: list[bytes] = []
            _encode(k, kb)
            items.append((b"".join(kb), v))
        items.sort(key=lambda kv: kv[0])
        out.append(b"d%d:" % len(items))
        for kb_joined, v in items:
            out.append(kb_joined)
            _encode(v, out)
    else:
        raise TypeError(f"hash_parts cannot hash {type(x).__name__!r} values")


def check_key(key: str) -> None:
    """ValueError unless `key` is 8 to 128 lowercase hex digits (it names a directory)."""
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise ValueError(f"cache key must be 8 to 128 lowercase hex digits, got {key!r}")


def check_name(name: str) -> None:
    """ValueError unless `name` may name a file of an entry."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name == META:
        raise ValueError(f"invalid cache file name {name!r} (letters, digits, '._-'; not {META!r})")

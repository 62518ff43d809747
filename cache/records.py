"""What one cache entry is: its record (meta.json), the checks that make a damaged entry a miss, and the
`Entry` a hit returns. Shared by the disk store and the Redis tier.

A record is JSON::

    {"format": 2, "key": ..., "created": ..., "size": ...,
     "files": {name: {"sha256": ..., "size": ...}}, "meta": {...the caller's...}, "digest": ...}

`digest` is the sha256 of the canonical JSON of everything else, so that a flipped byte in the caller's meta
(a thread count, a parameter's dtype) is damage and not a kernel launched with the wrong configuration.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .keys import META, NAME_RE

FORMAT = 2
# A meta.json larger than this is garbage; reading it whole could exhaust memory.
MAX_META_BYTES = 16 << 20
_SHA_RE = re.compile(r"[0-9a-f]{64}")


class Damaged(ValueError):
    """An entry (on disk or in Redis) that must be ignored; the message says why."""


def _digest(rec: Mapping[str, Any]) -> str:
    body = {k: v for k, v in rec.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def make_record(key: str, files: Mapping[str, bytes], meta: Mapping[str, Any]) -> bytes:
    """The meta.json of an entry of `files` and the JSON-able `meta`."""
    rec: dict[str, Any] = {
        "format": FORMAT,
        "key": key,
        "created": time.time(),
        "size": sum(len(b) for b in files.values()),
        "files": {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for n, b in files.items()},
        "meta": json.loads(json.dumps(dict(meta))),
    }
    rec["digest"] = _digest(rec)
    return json.dumps(rec, indent=1, sort_keys=True).encode()


def parse_record(raw: bytes, key: str) -> dict[str, Any]:
    """Parse and validate a meta.json; raise Damaged if it is not a record of `key` in our format."""
    if len(raw) > MAX_META_BYTES:
        raise Damaged("meta.json is too large")
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise Damaged(f"meta.json is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise Damaged(f"meta.json is not an mgjit cache record of format {FORMAT}")
    try:
        intact = rec.get("digest") == _digest(rec)
    except (TypeError, ValueError, RecursionError):
        intact = False
    if not intact:
        raise Damaged("meta.json fails its digest")
    if rec.get("key") != key:
        raise Damaged(f"meta.json names key {str(rec.get('key'))[:20]!r}")
    files, meta = rec.get("files"), rec.get("meta")
    if not isinstance(files, dict) or not isinstance(meta, dict):
        raise Damaged("meta.json lacks 'files' or 'meta'")
    for name, info in files.items():
        if (
            not NAME_RE.fullmatch(name)
            or name == META
            or not isinstance(info, dict)
            or not isinstance(info.get("sha256"), str)
            or not _SHA_RE.fullmatch(info["sha256"])
            or type(info.get("size")) is not int
            or info["size"] < 0
        ):
            raise Damaged(f"meta.json has a bad entry for file {name[:40]!r}")
    return rec


def verify_file(name: str, data: bytes, info: Mapping[str, Any]) -> None:
    """Damaged unless `data` is the file the record describes."""
    if len(data) != info["size"]:
        raise Damaged(f"{name} has {len(data)} bytes, expected {info['size']}")
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise Damaged(f"{name} fails its sha256 checksum")


@dataclass(frozen=True)
class Wanted:
    """What a reader needs of an entry beyond its integrity: meta items equal to `expect` (compared in JSON
    form), the files named in `files`, and whatever `check(meta)` asserts (it raises ValueError or
    TypeError, or KeyError for a missing field). An entry that does not fit is damage: a miss and one
    warning, never a crash of the reader."""

    expect: Mapping[str, Any] | None = None
    files: Collection[str] = ()
    check: Callable[[dict[str, Any]], None] | None = None

    def meta(self, rec: Mapping[str, Any]) -> None:
        """Damaged unless the record's meta and its list of files are what the reader needs."""
        meta = rec["meta"]
        if self.expect:
            # The caller may pass tuples where the stored meta has lists.
            for k, v in json.loads(json.dumps(dict(self.expect))).items():
                if k not in meta or meta[k] != v:
                    raise Damaged(f"meta[{k!r}] is {str(meta.get(k))[:40]!r}, expected {v!r}")
        missing = [n for n in self.files if n not in rec["files"]]
        if missing:
            raise Damaged(f"it has no {missing[0]} (an entry of another build?)")
        if self.check is not None:
            try:
                self.check(meta)
            except (KeyError, TypeError, ValueError) as e:
                raise Damaged(f"its metadata does not fit this mgjit ({type(e).__name__}: {str(e)[:80]})") from None


ANY = Wanted()


class Entry:
    """One cached kernel: `key`, the caller's `meta`, and `path` (None when kept in memory only).

    An entry is a verified snapshot: `Store.get` reads every file and checks its sha256, so `read` never
    touches the disk and cannot fail if the entry is evicted afterwards.
    """

    __slots__ = ("key", "meta", "path", "_data")

    def __init__(self, key: str, meta: dict[str, Any], path: Path | None, data: Mapping[str, bytes]) -> None:
        self.key = key
        self.meta = meta
        self.path = path
        self._data = dict(data)

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the entry's files."""
        return tuple(self._data)

    def read(self, name: str) -> bytes:
        """The bytes of file `name` (KeyError if the entry has none)."""
        return self._data[name]

    def __repr__(self) -> str:
        return f"Entry({self.key[:12]}…, name={self.meta.get('name')!r}, path={self.path})"


@dataclass(frozen=True)
class EntryInfo:
    """What a scan of the store knows about one entry (meta only when asked for; None if damaged)."""

    key: str
    path: Path
    size: int
    last_used: float
    meta: dict[str, Any] | None = None

"""The on-disk kernel store: one directory per entry, published by rename.

Layout under the root (created 0700)::

    <root>/<key[:2]>/<key>/meta.json      the record: key, format, created, size, per-file sha256, caller meta
    <root>/<key[:2]>/<key>/<files>         kernel.cubin, kernel.ptx, ptxas.txt, ... as the caller named them
    <root>/.tmp/                           entries being written (same filesystem, so rename is atomic)
    <root>/.trash/                         entries being removed (renamed away first, then deleted)

A writer fills a private temporary directory, fsyncs it and renames it into place; if another writer got
there first the rename fails and the loser's copy is dropped (same key, same content). Removal renames the
entry out of the way before deleting it, meta.json last. A reader reads through one directory descriptor,
so it sees a whole entry or none, with no locks, which also holds on network filesystems where flock is
unreliable. The last-use time of an entry is the mtime of its meta.json, bumped on every hit. Metadata is
JSON only: a damaged or tampered entry is a miss.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._warn import CacheWarning, warn_once

__all__ = [
    "CacheWarning",
    "DEFAULT_MAX_BYTES",
    "Entry",
    "EntryInfo",
    "Store",
    "default_dir",
    "default_store",
    "hash_parts",
    "parse_size",
]

FORMAT = 1
META = "meta.json"
DEFAULT_MAX_BYTES = 4 << 30
_TMP = ".tmp"
_TRASH = ".trash"
_KEY_RE = re.compile(r"[0-9a-f]{8,128}")
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
# A meta.json larger than this is garbage; reading it whole could exhaust memory.
_MAX_META_BYTES = 16 << 20
# A temporary directory this old belongs to a writer that died; younger ones may still be in use.
_STALE_TMP_S = 3600.0
# Eviction goes below the limit by this factor so that the next puts do not each trigger a scan.
_LOW_WATER = 0.9


class _Damaged(ValueError):
    """An entry (on disk or in Redis) that must be ignored; the message says why."""


# ---------------------------------------------------------------------------------------------- keys


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


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(f"cache key must be 8 to 128 lowercase hex digits, got {key!r}")


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name == META:
        raise ValueError(f"invalid cache file name {name!r} (letters, digits, '._-'; not {META!r})")


# ------------------------------------------------------------------------------------------ records


def _parse_record(raw: bytes, key: str) -> dict[str, Any]:
    """Parse and validate a meta.json; raise _Damaged if it is not a record of `key` in our format."""
    if len(raw) > _MAX_META_BYTES:
        raise _Damaged("meta.json is too large")
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise _Damaged(f"meta.json is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise _Damaged(f"meta.json is not an mgjit cache record of format {FORMAT}")
    if rec.get("key") != key:
        raise _Damaged(f"meta.json names key {str(rec.get('key'))[:80]!r}")
    files, meta = rec.get("files"), rec.get("meta")
    if not isinstance(files, dict) or not isinstance(meta, dict):
        raise _Damaged("meta.json lacks 'files' or 'meta'")
    for name, info in files.items():
        if (
            not _NAME_RE.fullmatch(name)
            or name == META
            or not isinstance(info, dict)
            or not isinstance(info.get("sha256"), str)
            or not _SHA_RE.fullmatch(info["sha256"])
            or type(info.get("size")) is not int
            or info["size"] < 0
        ):
            raise _Damaged(f"meta.json has a bad entry for file {name[:80]!r}")
    return rec


def _verify(name: str, data: bytes, info: Mapping[str, Any]) -> None:
    if len(data) != info["size"]:
        raise _Damaged(f"{name} has {len(data)} bytes, expected {info['size']}")
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise _Damaged(f"{name} fails its sha256 checksum")


_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _read_at(dir_fd: int, name: str, limit: int) -> bytes:
    """Up to `limit` bytes of file `name` in the directory open as `dir_fd`."""
    with open(os.open(name, os.O_RDONLY | _O_CLOEXEC, dir_fd=dir_fd), "rb") as f:
        return f.read(limit)


def _same_dir(fd: int, path: Path) -> bool:
    """Whether the directory open as `fd` is still the one at `path`."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)


def _check_expect(meta: Mapping[str, Any], expect: Mapping[str, Any] | None) -> None:
    if not expect:
        return
    # Compare in JSON form: the caller may pass tuples where the stored meta has lists.
    want = json.loads(json.dumps(dict(expect)))
    for k, v in want.items():
        if k not in meta or meta[k] != v:
            raise _Damaged(f"meta[{k!r}] is {meta.get(k)!r}, expected {v!r}")


# -------------------------------------------------------------------------------------------- entries


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


# ---------------------------------------------------------------------------------------------- store


def parse_size(text: str) -> int:
    """Bytes from '4294967296', '500M', '2G', '1.5GiB', '64k' (binary multiples)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgtp]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 500M, 2G or a number of bytes)")
    return int(float(m.group(1)) * 1024 ** " kmgtp".index(m.group(2).lower() or " "))


def default_dir() -> Path:
    """$MGJIT_CACHE_DIR, else ($XDG_CACHE_HOME or ~/.cache)/mgjit."""
    explicit = os.environ.get("MGJIT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "mgjit"


class Store:
    """A directory of cache entries with a size limit, plus an optional Redis tier.

    Safe to share between threads and processes. The size limit is enforced after a put from a per-process
    running total (seeded by one scan), so puts by other processes are noticed at this process's next scan.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        max_bytes: int = DEFAULT_MAX_BYTES,
        redis_url: str | None = None,
    ) -> None:
        self.root = Path(os.path.abspath(os.path.expanduser(root)))
        self.max_bytes = max_bytes
        self.redis = None
        if redis_url:
            # Imported only when configured: `import mgjit` and a local hit do not pay for sockets.
            from .remote import tier_for

            try:
                self.redis = tier_for(redis_url)
            except ValueError as e:
                warn_once(("redis-url", redis_url), f"mgjit cache: ignoring MGJIT_CACHE_REDIS: {e}")
        self._lock = threading.Lock()
        self._total: int | None = None
        self._root_checked = False

    @classmethod
    def from_env(cls, root: str | os.PathLike[str] | None = None) -> Store:
        """A store configured by MGJIT_CACHE_DIR, MGJIT_CACHE_MAX_BYTES and MGJIT_CACHE_REDIS."""
        max_bytes = DEFAULT_MAX_BYTES
        text = os.environ.get("MGJIT_CACHE_MAX_BYTES")
        if text:
            try:
                max_bytes = parse_size(text)
            except ValueError as e:
                warn_once(("max-bytes", text), f"mgjit cache: ignoring MGJIT_CACHE_MAX_BYTES: {e}")
        return cls(
            default_dir() if root is None else root,
            max_bytes=max_bytes,
            redis_url=os.environ.get("MGJIT_CACHE_REDIS") or None,
        )

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r}, max_bytes={self.max_bytes}, redis={self.redis})"

    def _entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    # ------------------------------------------------------------------------------------- lookup

    def get(self, key: str, expect: Mapping[str, Any] | None = None) -> Entry | None:
        """The entry of `key`, or None. Every item of `expect` must equal the stored meta's.

        A damaged entry (bad JSON, missing file, checksum or key or `expect` mismatch) is a miss: one
        warning names it and it is removed. With Redis configured, a local miss reads through.
        """
        _check_key(key)
        if not self._root_checked:
            self._check_root()
        entry = self._get_local(key, expect)
        if entry is None and self.redis is not None:
            entry = self._get_remote(key, expect)
        return entry

    def _get_local(self, key: str, expect: Mapping[str, Any] | None) -> Entry | None:
        d = self._entry_dir(key)
        try:
            # Everything is read through one directory descriptor, so that meta.json and the files come
            # from the same entry even if it is replaced or removed while we read.
            fd = os.open(d, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            warn_once(("read", str(d)), f"mgjit cache: cannot open {d} ({e}); recompiling")
            return None
        try:
            return self._read_entry(key, d, fd, expect)
        finally:
            os.close(fd)

    def _read_entry(self, key: str, d: Path, fd: int, expect: Mapping[str, Any] | None) -> Entry | None:
        name = META
        try:
            rec = _parse_record(_read_at(fd, META, _MAX_META_BYTES + 1), key)
            _check_expect(rec["meta"], expect)
            data = {}
            for name, info in rec["files"].items():
                # One byte more than recorded, so an overlong file is caught without reading all of it.
                data[name] = _read_at(fd, name, info["size"] + 1)
                _verify(name, data[name], info)
        except _Damaged as e:
            self._damaged(d, str(e))
            return None
        except FileNotFoundError:
            # A published entry is complete for as long as it stays at `d` (removal renames it away
            # first, and deletes meta.json last), so a missing file is damage only if the directory we
            # read is still there, and an empty directory is nothing at all.
            if _same_dir(fd, d) and os.listdir(fd):
                self._damaged(d, f"{name} is missing")
            return None
        except OSError as e:
            warn_once(("read", str(d)), f"mgjit cache: cannot read {d / name} ({e}); recompiling")
            return None
        try:
            os.utime(META, dir_fd=fd)
        except OSError:
            pass  # a read-only shared cache still serves hits; only its LRU order stops advancing
        return Entry(key, rec["meta"], d, data)

    def _get_remote(self, key: str, expect: Mapping[str, Any] | None) -> Entry | None:
        from .remote import decode_blob

        assert self.redis is not None
        blob = self.redis.fetch(key)
        if blob is None:
            return None
        try:
            members = decode_blob(blob)
            if META not in members:
                raise _Damaged("the blob has no meta.json")
            raw = members.pop(META)
            rec = _parse_record(raw, key)
            _check_expect(rec["meta"], expect)
            if set(members) != set(rec["files"]):
                raise _Damaged("the blob's files do not match its meta.json")
            for name, info in rec["files"].items():
                _verify(name, members[name], info)
        except ValueError as e:  # _Damaged, or a framing error from decode_blob
            warn_once(
                ("damaged", self.redis.where(key)),
                f"mgjit cache: ignoring damaged entry {self.redis.where(key)}: {e}; it will be recompiled",
            )
            self.redis.delete(key)
            return None
        return self._publish(key, members, rec["meta"], raw)

    def _damaged(self, d: Path, reason: str) -> None:
        warn_once(("damaged", str(d)), f"mgjit cache: ignoring damaged entry {d}: {reason}; it will be recompiled")
        self._discard(d)

    # -------------------------------------------------------------------------------------- store

    def put(self, key: str, files: Mapping[str, bytes], meta: Mapping[str, Any]) -> Entry:
        """Store `files` and the JSON-able `meta` under `key` and return the entry.

        Never fails for lack of a writable cache: it warns once and returns an in-memory entry. Entry.meta
        is `meta` after a JSON round trip (tuples become lists), exactly as a later `get` returns it.
        """
        _check_key(key)
        blobs = {}
        for name, data in files.items():
            _check_name(name)
            blobs[name] = data if isinstance(data, bytes) else bytes(data)
        rec = {
            "format": FORMAT,
            "key": key,
            "created": time.time(),
            "size": sum(len(b) for b in blobs.values()),
            "files": {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for n, b in blobs.items()},
            "meta": dict(meta),
        }
        raw = json.dumps(rec, indent=1, sort_keys=True).encode()
        entry = self._publish(key, blobs, json.loads(raw)["meta"], raw)
        if self.redis is not None:
            self.redis.submit(key, blobs, raw)
        return entry

    def _publish(
        self,
        key: str,
        files: Mapping[str, bytes],
        meta: dict[str, Any],
        raw: bytes,
    ) -> Entry:
        d = self._entry_dir(key)
        tmp = None
        try:
            tmp = self._write_tmp(key, files, raw)
            won = self._rename_into_place(tmp, d)
        except OSError as e:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            warn_once(
                ("unwritable", str(self.root)),
                f"mgjit cache: cannot write to {self.root} ({e}); compiled kernels are kept in memory only",
            )
            return Entry(key, meta, None, files)
        if won:
            self._account(key, len(raw) + sum(len(b) for b in files.values()))
        return Entry(key, meta, d, files)

    def _write_tmp(self, key: str, files: Mapping[str, bytes], raw: bytes) -> Path:
        # Every time, not once: someone may have deleted the whole cache since, and makedirs would
        # create missing parents with the umask's mode rather than 0700.
        os.makedirs(self.root, 0o700, exist_ok=True)
        if not self._root_checked:
            self._check_root()
        tmp_root = self.root / _TMP
        os.makedirs(tmp_root, 0o700, exist_ok=True)
        tmp = tmp_root / f"{key}.{os.getpid()}.{secrets.token_hex(4)}"
        os.mkdir(tmp, 0o700)
        try:
            for name, data in files.items():
                _write_file(tmp / name, data)
            # meta.json last: its presence marks a complete entry even before the rename.
            _write_file(tmp / META, raw)
            _fsync_dir(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return tmp

    def _rename_into_place(self, tmp: Path, d: Path) -> bool:
        """Publish `tmp` as `d`; False (and `tmp` dropped) if another writer already published `d`."""
        last: OSError | None = None
        for _ in range(3):
            try:
                os.rename(tmp, d)
            except FileNotFoundError as e:
                # The shard directory is new, or a concurrent clear removed it.
                last = e
                os.makedirs(d.parent, 0o700, exist_ok=True)
                continue
            except OSError as e:
                # ENOTEMPTY/EEXIST: `d` exists. EBUSY: some network filesystems say this instead.
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY):
                    raise
                last = e
                try:
                    names = os.listdir(d)
                except FileNotFoundError:
                    continue  # removed meanwhile: try again
                if META in names:
                    shutil.rmtree(tmp, ignore_errors=True)
                    return False
                self._discard(d)  # a damaged remnant without meta.json: replace it
                continue
            _fsync_dir(d.parent)
            return True
        assert last is not None
        raise last

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the Redis write-behind queue is empty; True if it is (or there is no Redis)."""
        return True if self.redis is None else self.redis.flush(timeout)

    # ---------------------------------------------------------------------------------- housekeeping

    def _check_root(self) -> None:
        """Warn once if the root is writable by others or owned by someone else: they could plant kernels."""
        try:
            st = os.stat(self.root)
        except OSError:
            return  # not created yet; put creates it 0700
        self._root_checked = True
        if st.st_mode & 0o022:
            warn_once(
                ("perms", str(self.root)),
                f"mgjit cache: {self.root} is group- or world-writable (mode {st.st_mode & 0o777:o}); "
                f"other users could plant kernels in it. Run: chmod 700 {self.root}",
            )
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            warn_once(
                ("owner", str(self.root)),
                f"mgjit cache: {self.root} is owned by uid {st.st_uid}, not by you; its owner can plant kernels",
            )

    def _discard(self, d: Path) -> None:
        """Remove an entry directory: rename it into the trash (atomic for readers), then delete it."""
        trash = self.root / _TRASH
        try:
            os.makedirs(trash, 0o700, exist_ok=True)
            dest = trash / f"{d.name}.{os.getpid()}.{secrets.token_hex(4)}"
            os.rename(d, dest)
        except OSError:
            return  # already gone, or a read-only cache where ignoring the entry is all we can do
        _remove_entry_dir(dest)

    def _account(self, key: str, size: int) -> None:
        with self._lock:
            if self._total is not None:
                self._total += size
                if self._total <= self.max_bytes:
                    return
        self._shrink(keep=key)

    def _shrink(self, keep: str) -> None:
        self._sweep()
        infos = self.entries()
        total = sum(i.size for i in infos)
        if total > self.max_bytes:
            removed = self._evict(infos, int(self.max_bytes * _LOW_WATER), keep=keep)
            total -= sum(i.size for i in removed)
        with self._lock:
            self._total = total

    def _evict(self, infos: list[EntryInfo], target: int, keep: str | None = None) -> list[EntryInfo]:
        """Remove least-recently-used entries until at most `target` bytes remain; return those removed."""
        total = sum(i.size for i in infos)
        removed = []
        for info in sorted(infos, key=lambda i: i.last_used):
            if total <= target:
                break
            if info.key == keep:
                continue  # the entry just written is in use
            self._discard(info.path)
            total -= info.size
            removed.append(info)
        return removed

    def _sweep(self) -> None:
        """Delete what crashed writers and interrupted removals left behind."""
        now = time.time()
        for sub, min_age in ((_TMP, _STALE_TMP_S), (_TRASH, 0.0)):
            try:
                it = os.scandir(self.root / sub)
            except OSError:
                continue
            with it:
                for e in it:
                    try:
                        if now - e.stat(follow_symlinks=False).st_mtime >= min_age:
                            _remove_entry_dir(Path(e.path))
                    except OSError:
                        pass  # removed by a concurrent sweep

    def entries(self, with_meta: bool = False) -> list[EntryInfo]:
        """Scan the store (stat only, unless `with_meta`: then meta.json is parsed too; None if damaged)."""
        out = []
        try:
            shards = os.scandir(self.root)
        except OSError:
            return out
        with shards:
            for shard in shards:
                if len(shard.name) != 2 or not shard.is_dir(follow_symlinks=False):
                    continue
                try:
                    it = os.scandir(shard.path)
                except OSError:
                    continue
                with it:
                    for e in it:
                        if _KEY_RE.fullmatch(e.name) and e.name.startswith(shard.name):
                            info = _scan_entry(Path(e.path), e.name, with_meta)
                            if info is not None:
                                out.append(info)
        return out

    def prune(self, max_bytes: int | None = None, older_than: float | None = None) -> list[EntryInfo]:
        """Remove entries unused for `older_than` seconds, then LRU ones above `max_bytes` (default: the
        store's limit); also clean up leftovers of crashed writers. Returns the removed entries."""
        self._sweep()
        infos = self.entries()
        removed = []
        if older_than is not None:
            cutoff = time.time() - older_than
            for info in infos:
                if info.last_used < cutoff:
                    self._discard(info.path)
                    removed.append(info)
            infos = [i for i in infos if i.last_used >= cutoff]
        evicted = self._evict(infos, self.max_bytes if max_bytes is None else max_bytes)
        with self._lock:
            self._total = sum(i.size for i in infos) - sum(i.size for i in evicted)
        return removed + evicted

    def clear(self) -> list[EntryInfo]:
        """Remove every entry; return those removed."""
        return self.prune(max_bytes=0)


def _scan_entry(d: Path, key: str, with_meta: bool) -> EntryInfo | None:
    size = 0
    last_used = None
    try:
        with os.scandir(d) as it:
            for f in it:
                st = f.stat(follow_symlinks=False)
                size += st.st_size
                if f.name == META:
                    last_used = st.st_mtime
        if last_used is None:  # damaged; the directory's own time ranks it for eviction
            last_used = os.stat(d).st_mtime
    except FileNotFoundError:
        return None  # removed while we looked
    except OSError:
        return None
    meta = None
    if with_meta:
        try:
            meta = _parse_record((d / META).read_bytes(), key)["meta"]
        except (OSError, _Damaged):
            pass
    return EntryInfo(key, d, size, last_used, meta)


def _remove_entry_dir(d: Path) -> None:
    """Delete an entry directory, meta.json last.

    A reader that opened the directory before it was renamed away may still be reading it; because
    meta.json goes last, a directory with files but no meta.json is always damage, never a removal.
    """
    try:
        names = os.listdir(d)
    except OSError:
        return
    for name in sorted(names, key=lambda n: n == META):
        p = d / name
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)  # not ours: entries are flat
            else:
                os.unlink(p)
        except OSError:
            pass  # removed by a concurrent sweep
    try:
        os.rmdir(d)
    except OSError:
        pass


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not fsync directories; the data files are already synced
    finally:
        os.close(fd)


_default: tuple[tuple[str | None, ...], Store] | None = None
_default_lock = threading.Lock()


def default_store() -> Store:
    """The process-wide store, configured from the environment.

    It is rebuilt if MGJIT_CACHE_DIR, XDG_CACHE_HOME, MGJIT_CACHE_MAX_BYTES or MGJIT_CACHE_REDIS changed
    since, so that setting one in a notebook after `import mgjit` takes effect.
    """
    global _default
    env = tuple(
        os.environ.get(v) for v in ("MGJIT_CACHE_DIR", "XDG_CACHE_HOME", "MGJIT_CACHE_MAX_BYTES", "MGJIT_CACHE_REDIS")
    )
    current = _default
    if current is None or current[0] != env:
        with _default_lock:
            if _default is None or _default[0] != env:
                _default = (env, Store.from_env())
            current = _default
    return current[1]

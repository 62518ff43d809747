"""The on-disk kernel store: one directory per entry, published by rename.

Layout under the root (created 0700, marked by root.MARKER)::

    <root>/<key[:2]>/<key>/meta.json      the record (records.py): key, files' sha256, caller meta, digest
    <root>/<key[:2]>/<key>/<files>         kernel.cubin, kernel.ptx, ptxas.txt, ... as the caller named them
    <root>/.tmp/                           entries being written (same filesystem, so rename is atomic)
    <root>/.trash/                         entries being removed (renamed away first, then deleted)

A writer fills a private temporary directory, fsyncs it and renames it into place; if another writer got
there first the rename fails and the loser's copy is dropped (same key, same content). Removal renames the
entry out of the way before deleting it, meta.json last. A reader reads through one directory descriptor,
so it sees a whole entry or none, with no locks, which also holds on network filesystems where flock is
unreliable. The last-use time of an entry is the mtime of its meta.json, bumped on every hit. Metadata is
JSON only: a damaged or tampered entry is a miss, and whatever is at an entry's place that is not an entry
(a file, a link) is removed so that the next compile can publish.

Everything inside the root is reached through directory descriptors without following links (safefs.py),
and the root is used only if it is ours alone and mgjit's (root.py).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import root as roots
from . import safefs
from ._warn import CacheWarning, warn_once
from .keys import KEY_RE, META, check_key, check_name, hash_parts
from .records import ANY, MAX_META_BYTES, Damaged, Entry, EntryInfo, Wanted, make_record, parse_record, verify_file

__all__ = [
    "CacheWarning",
    "DEFAULT_MAX_BYTES",
    "Entry",
    "EntryInfo",
    "Store",
    "Wanted",
    "default_dir",
    "default_store",
    "hash_parts",
    "parse_size",
]

DEFAULT_MAX_BYTES = 4 << 30
_TMP = ".tmp"
_TRASH = ".trash"
# A temporary directory this old belongs to a writer that died; younger ones may still be in use.
_STALE_TMP_S = 3600.0
# Eviction goes below the limit by this factor so that the next puts do not each trigger a scan.
_LOW_WATER = 0.9


def parse_size(text: str) -> int:
    """Bytes from '4294967296', '500M', '2G', '1.5GiB', '64k' (binary multiples)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgtp]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 500M, 2G or a number of bytes)")
    return int(float(m.group(1)) * 1024 ** " kmgtp".index(m.group(2).lower() or " "))


def default_dir() -> Path:
    """$MGJIT_CACHE_DIR, else ($XDG_CACHE_HOME or ~/.cache)/mgjit."""
    explicit = os.environ.get("MGJIT_CACHE_DIR")
    return Path(explicit).expanduser() if explicit else roots.user_dir()


class Store:
    """A directory of cache entries with a size limit, plus an optional Redis tier.

    Safe to share between threads and processes. The size limit is enforced after a put from a per-process
    running total (seeded by one scan), so puts by other processes are noticed at this process's next scan.
    `root` is the directory in use: the one `requested`, or a private one when that one is refused.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        max_bytes: int = DEFAULT_MAX_BYTES,
        redis_url: str | None = None,
    ) -> None:
        self.requested = self._path = Path(os.path.abspath(os.path.expanduser(root)))
        self._resolved = False
        self.max_bytes = max_bytes
        self.redis = None
        if redis_url:
            # Imported only when configured: `import mgjit` and a local hit do not pay for it.
            from .remote import tier_for

            self.redis = tier_for(redis_url)
        self._lock = threading.Lock()
        self._total: int | None = None

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
        return f"Store({str(self._path)!r}, max_bytes={self.max_bytes}, redis={self.redis})"

    # ------------------------------------------------------------------------------------------ root

    @property
    def root(self) -> Path:
        """The directory in use (checked, and replaced by a private one if refused, on first use)."""
        if not self._resolved:
            self._open_root(create=False, close=True)
        return self._path

    def _open_root(self, create: bool, close: bool = False) -> int | None:
        """A descriptor of the verified root (None if it does not exist and not `create`)."""
        try:
            fd = roots.open_root(self._path, create)
        except roots.Unsafe as e:
            refused = self._path
            self._path = roots.fallback(refused)
            warn_once(
                ("refused", str(refused)),
                f"mgjit cache: not using {refused}: {e.why}. Using {self._path} instead. To use it, {e.fix}.",
            )
            fd = roots.open_root(self._path, create)
        self._resolved = True
        if close and fd is not None:
            os.close(fd)
            return None
        return fd

    @contextmanager
    def _root_fd(self, create: bool) -> Iterator[int | None]:
        fd = self._open_root(create)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def _where(self, key: str) -> str:
        return f"{key[:16]}… in {self._path}"

    # ----------------------------------------------------------------------------------------- lookup

    def get(self, key: str, expect: Mapping[str, Any] | None = None, wanted: Wanted | None = None) -> Entry | None:
        """The entry of `key`, or None. Every item of `expect` must equal the stored meta's, and the entry
        must be what `wanted` asks for (records.Wanted).

        A damaged entry (bad JSON, missing file, checksum or key or `expect` mismatch, a link or a file at
        its place) is a miss: one warning names it and it is removed. With Redis configured, a local miss
        reads through.
        """
        check_key(key)
        if expect is not None:
            wanted = Wanted(expect, wanted.files, wanted.check) if wanted else Wanted(expect)
        wanted = wanted or ANY
        try:
            with self._root_fd(create=False) as rfd:
                entry = None if rfd is None else self._get_local(rfd, key, wanted)
        except OSError as e:
            warn_once(("read", str(self._path)), f"mgjit cache: cannot read {self._path} ({e.strerror}); recompiling")
            entry = None
        if entry is None and self.redis is not None:
            entry = self._get_remote(key, wanted)
        return entry

    def _get_local(self, rfd: int, key: str, wanted: Wanted) -> Entry | None:
        shard = self._open_part(rfd, key[:2], key)
        if shard is None:
            return None
        try:
            fd = self._open_part(shard, key, key)
            if fd is None:
                return None
            try:
                return self._read_entry(rfd, shard, fd, key, wanted)
            finally:
                os.close(fd)
        finally:
            os.close(shard)

    def _open_part(self, parent: int, name: str, key: str) -> int | None:
        """The shard or entry directory `name`; None if missing, or if something else is there (removed,
        with a warning)."""
        try:
            return safefs.open_dir(name, parent)
        except FileNotFoundError:
            return None
        except safefs.NotOurs as e:
            self._damaged(parent, name, key, e.strerror)
            return None

    def _read_entry(self, rfd: int, shard: int, fd: int, key: str, wanted: Wanted) -> Entry | None:
        name = META
        try:
            rec = parse_record(safefs.read_file(fd, META, MAX_META_BYTES + 1), key)
            wanted.meta(rec)
            data = {}
            for name, info in rec["files"].items():
                # One byte more than recorded, so an overlong file is caught without reading all of it.
                data[name] = safefs.read_file(fd, name, info["size"] + 1)
                verify_file(name, data[name], info)
        except (Damaged, safefs.NotOurs) as e:
            self._damaged(shard, key, key, str(e) if isinstance(e, Damaged) else e.strerror)
            return None
        except FileNotFoundError:
            # A published entry is complete for as long as it stays in place (removal renames it away
            # first, and deletes meta.json last), so a missing file is damage only if the directory we
            # read is still there, and an empty directory is nothing at all.
            if _same(fd, shard, key) and os.listdir(fd):
                self._damaged(shard, key, key, f"{name} is missing")
            return None
        except OSError as e:
            warn_once(("read", key), f"mgjit cache: cannot read {name} of {self._where(key)} ({e.strerror}); "
                                     f"recompiling")
            return None
        try:
            os.utime(META, dir_fd=fd, follow_symlinks=False)
        except OSError:
            pass  # a read-only cache still serves hits; only its LRU order stops advancing
        return Entry(key, rec["meta"], self._path / key[:2] / key, data)

    def _get_remote(self, key: str, wanted: Wanted) -> Entry | None:
        assert self.redis is not None
        got = self.redis.fetch(key, wanted)
        if got is None:
            return None
        members, rec, raw = got
        return self._publish(key, members, rec["meta"], raw)

    def _damaged(self, parent: int, name: str, key: str, reason: str) -> None:
        warn_once(("damaged", key), f"mgjit cache: ignoring damaged entry {self._where(key)}: {reason}; "
                                    f"it will be recompiled")
        self._discard(parent, name)

    # ------------------------------------------------------------------------------------------ store

    def put(self, key: str, files: Mapping[str, bytes], meta: Mapping[str, Any]) -> Entry:
        """Store `files` and the JSON-able `meta` under `key` and return the entry.

        Never fails for lack of a writable cache: it warns once and returns an in-memory entry. Entry.meta
        is `meta` after a JSON round trip (tuples become lists), exactly as a later `get` returns it.
        """
        check_key(key)
        blobs = {}
        for name, data in files.items():
            check_name(name)
            blobs[name] = data if isinstance(data, bytes) else bytes(data)
        raw = make_record(key, blobs, meta)
        entry = self._publish(key, blobs, parse_record(raw, key)["meta"], raw)
        if self.redis is not None:
            self.redis.submit(key, blobs, raw)
        return entry

    def _publish(self, key: str, files: Mapping[str, bytes], meta: dict[str, Any], raw: bytes) -> Entry:
        try:
            with self._root_fd(create=True) as rfd:
                assert rfd is not None
                won = self._write(rfd, key, files, raw)
        except OSError as e:
            warn_once(
                ("unwritable", str(self._path)),
                f"mgjit cache: cannot write to {self._path} ({e.strerror or e}); compiled kernels are kept in "
                f"memory only",
            )
            return Entry(key, meta, None, files)
        if won:
            self._account(key, len(raw) + sum(len(b) for b in files.values()))
        return Entry(key, meta, self._path / key[:2] / key, files)

    def _write(self, rfd: int, key: str, files: Mapping[str, bytes], raw: bytes) -> bool:
        """Write the entry into .tmp and rename it into place; False if another writer published it first."""
        tmp = safefs.make_dir(_TMP, rfd)
        try:
            name = f"{key}.{os.getpid()}.{secrets.token_hex(4)}"
            os.mkdir(name, 0o700, dir_fd=tmp)
            try:
                fd = safefs.open_dir(name, tmp)
                try:
                    for file, data in files.items():
                        safefs.write_file(fd, file, data)
                    # meta.json last: its presence marks a complete entry even before the rename.
                    safefs.write_file(fd, META, raw)
                    safefs.fsync_dir(fd)
                finally:
                    os.close(fd)
                return self._rename_into_place(rfd, tmp, name, key)
            except BaseException:
                safefs.remove(tmp, name)
                raise
        finally:
            os.close(tmp)

    def _rename_into_place(self, rfd: int, tmp: int, name: str, key: str) -> bool:
        last: OSError | None = None
        for _ in range(4):
            try:
                shard = safefs.make_dir(key[:2], rfd)
            except safefs.NotOurs as e:
                last = e
                self._discard(rfd, key[:2])  # a file or link at the shard's place
                continue
            try:
                try:
                    os.rename(name, key, src_dir_fd=tmp, dst_dir_fd=shard)
                except FileNotFoundError as e:
                    last = e  # a concurrent clear removed the shard: make it again
                    continue
                except OSError as e:
                    # ENOTEMPTY/EEXIST: an entry is there. EBUSY: some network filesystems say this instead.
                    # ENOTDIR: a file or a link is there.
                    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY, errno.ENOTDIR):
                        raise
                    last = e
                    if e.errno != errno.ENOTDIR and _has_meta(shard, key):
                        safefs.remove(tmp, name)
                        return False
                    self._discard(shard, key)  # a damaged remnant without meta.json, a file or a link
                    continue
                safefs.fsync_dir(shard)
                return True
            finally:
                os.close(shard)
        assert last is not None
        raise last

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the Redis write-behind queue is empty; True if it is (or there is no Redis)."""
        return True if self.redis is None else self.redis.flush(timeout)

    # ----------------------------------------------------------------------------------- housekeeping

    def _discard(self, parent: int, name: str) -> None:
        """Remove `name` from the directory `parent`: rename it into the trash (atomic for readers), then
        delete it there without following links."""
        try:
            with self._root_fd(create=False) as rfd:
                if rfd is None:
                    return
                trash = self._trash(rfd)
                try:
                    dest = f"{name}.{os.getpid()}.{secrets.token_hex(4)}"
                    os.rename(name, dest, src_dir_fd=parent, dst_dir_fd=trash)
                    safefs.remove(trash, dest, last=META)
                finally:
                    os.close(trash)
        except OSError:
            return  # already gone, or a read-only cache where ignoring the entry is all we can do

    def _trash(self, rfd: int) -> int:
        try:
            return safefs.make_dir(_TRASH, rfd)
        except safefs.NotOurs:
            safefs.remove(rfd, _TRASH)  # a file or link at .trash: remove the link itself, nothing it names
            return safefs.make_dir(_TRASH, rfd)

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
            self._remove_entry(info.key)
            total -= info.size
            removed.append(info)
        return removed

    def _remove_entry(self, key: str) -> None:
        try:
            with self._root_fd(create=False) as rfd:
                shard = None if rfd is None else safefs.open_dir(key[:2], rfd)
        except OSError:
            return
        if shard is not None:
            try:
                self._discard(shard, key)
            finally:
                os.close(shard)

    def _sweep(self) -> None:
        """Delete what crashed writers and interrupted removals left behind."""
        now = time.time()
        try:
            with self._root_fd(create=False) as rfd:
                if rfd is None:
                    return
                for sub, min_age in ((_TMP, _STALE_TMP_S), (_TRASH, 0.0)):
                    try:
                        fd = safefs.open_dir(sub, rfd)
                    except safefs.NotOurs:
                        safefs.remove(rfd, sub)
                        continue
                    except OSError:
                        continue
                    try:
                        for name in os.listdir(fd):
                            try:
                                if now - os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime >= min_age:
                                    safefs.remove(fd, name, last=META)
                            except OSError:
                                pass  # removed by a concurrent sweep
                    finally:
                        os.close(fd)
        except OSError:
            return

    def entries(self, with_meta: bool = False) -> list[EntryInfo]:
        """Scan the store (stat only, unless `with_meta`: then meta.json is parsed too; None if damaged)."""
        out: list[EntryInfo] = []
        try:
            with self._root_fd(create=False) as rfd:
                if rfd is None:
                    return out
                for shard_name in os.listdir(rfd):
                    if len(shard_name) == 2 and KEY_RE.fullmatch(shard_name + "000000"):
                        out += self._scan_shard(rfd, shard_name, with_meta)
        except OSError:
            pass
        return out

    def _scan_shard(self, rfd: int, shard_name: str, with_meta: bool) -> list[EntryInfo]:
        try:
            shard = safefs.open_dir(shard_name, rfd)
        except OSError:
            return []
        out = []
        try:
            for key in os.listdir(shard):
                if KEY_RE.fullmatch(key) and key.startswith(shard_name):
                    info = self._scan_entry(shard, key, with_meta)
                    if info is not None:
                        out.append(info)
        except OSError:
            pass
        finally:
            os.close(shard)
        return out

    def _scan_entry(self, shard: int, key: str, with_meta: bool) -> EntryInfo | None:
        try:
            fd = safefs.open_dir(key, shard)
        except OSError:
            return None  # removed while we looked, or not an entry (get removes it)
        try:
            size, last_used = 0, None
            with os.scandir(fd) as it:
                for f in it:
                    st = f.stat(follow_symlinks=False)
                    size += st.st_size
                    if f.name == META:
                        last_used = st.st_mtime
            if last_used is None:  # damaged; the directory's own time ranks it for eviction
                last_used = os.fstat(fd).st_mtime
            meta = None
            if with_meta:
                try:
                    meta = parse_record(safefs.read_file(fd, META, MAX_META_BYTES + 1), key)["meta"]
                except (OSError, Damaged):
                    pass
        except OSError:
            return None
        finally:
            os.close(fd)
        return EntryInfo(key, self._path / key[:2] / key, size, last_used, meta)

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
                    self._remove_entry(info.key)
                    removed.append(info)
            infos = [i for i in infos if i.last_used >= cutoff]
        evicted = self._evict(infos, self.max_bytes if max_bytes is None else max_bytes)
        with self._lock:
            self._total = sum(i.size for i in infos) - sum(i.size for i in evicted)
        return removed + evicted

    def clear(self) -> list[EntryInfo]:
        """Remove every entry; return those removed."""
        return self.prune(max_bytes=0)


def _same(fd: int, shard: int, key: str) -> bool:
    """Whether the directory open as `fd` is still the entry `key` of `shard`."""
    try:
        a, b = os.fstat(fd), os.stat(key, dir_fd=shard, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)


def _has_meta(shard: int, key: str) -> bool:
    try:
        fd = safefs.open_dir(key, shard)
    except OSError:
        return False
    try:
        os.stat(META, dir_fd=fd, follow_symlinks=False)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


_default: tuple[tuple[str | None, ...], Store] | None = None
_default_lock = threading.Lock()

_ENVIRONMENT = ("MGJIT_CACHE_DIR", "XDG_CACHE_HOME", "MGJIT_CACHE_MAX_BYTES", "MGJIT_CACHE_REDIS",
                "MGJIT_CACHE_REDIS_KEY")


def default_store() -> Store:
    """The process-wide store, configured from the environment.

    It is rebuilt if one of its variables changed since, so that setting one in a notebook after
    `import mgjit` takes effect.
    """
    global _default
    env = tuple(os.environ.get(v) for v in _ENVIRONMENT)
    current = _default
    if current is None or current[0] != env:
        with _default_lock:
            if _default is None or _default[0] != env:
                _default = (env, Store.from_env())
            current = _default
    return current[1]

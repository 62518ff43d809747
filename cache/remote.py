"""A Redis second tier, authenticated: read-through on a local miss, write-behind on put.

The server is not trusted. Each entry travels as one blob in our own framing, never pickle, sealed with an
HMAC-SHA256 under a secret that the user configures (MGJIT_CACHE_REDIS_KEY, the same on every machine that
shares the cache) over the entry's key and its content::

    b"MGJITC\\x00\\x02"  u32 count  { u16 name_len, name, u64 data_len, data } * count  hmac(key, all before)

so a blob that the server, or anyone who can write to it, made or altered or moved to another key is a miss
with one warning. Its first member is the entry's meta.json; the store then checks every file's checksum as
for a local entry. Without a key the tier stays off (one warning): an unauthenticated shared cache would run
whatever kernel its server hands out.

The client is redis-py (the `redis` extra: pip install 'mgjit[redis]'), imported on the first local miss or
put, never by a local hit. If the server is unreachable or misbehaves, the tier switches itself off for the
rest of the process with one warning, and the local store carries on alone. Size the server with `maxmemory`
and an LRU policy (`allkeys-lru`): mgjit does not evict from Redis.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import os
import struct
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ._warn import warn_once
from .keys import META
from .records import Damaged, Wanted, parse_record, verify_file

PREFIX = "mgjit:"
MAGIC = b"MGJITC\x00\x02"
_TAG = 32
SECRET_VARIABLE = "MGJIT_CACHE_REDIS_KEY"
MIN_SECRET = 16
CONNECT_TIMEOUT = 1.0
# A get waits on this at most once per process: after a failure the tier is off.
READ_TIMEOUT = 2.0
# The writer thread is not in anyone's way, so it may wait longer for a big blob.
WRITE_TIMEOUT = 10.0
# Puts beyond this many unsent ones are not sent to Redis (the local store still has them).
MAX_PENDING = 256


def safe_url(url: str) -> str:
    """The URL without its password, for messages. ValueError if it is not a redis:// URL."""
    u = urlsplit(url)
    if u.scheme not in ("redis", "rediss", "unix") or not (u.hostname or u.path):
        raise ValueError(f"expected redis://host:port/db, got {url.split('@')[-1]!r}")
    if u.scheme == "unix":
        return f"unix://{u.path}"
    try:
        port = u.port or 6379
    except ValueError:
        raise ValueError(f"bad port in {url.split('@')[-1]!r}") from None
    db = u.path.strip("/") or "0"
    if not db.isdigit():
        raise ValueError(f"the database in {url.split('@')[-1]!r} must be a number")
    return f"{u.scheme}://{u.hostname}:{port}/{db}"


def _seal(secret: bytes, key: str, body: bytes) -> bytes:
    return hmac.new(secret, b"mgjit-cache-entry\0" + key.encode() + b"\0" + body, hashlib.sha256).digest()


def encode_blob(secret: bytes, key: str, members: Mapping[str, bytes]) -> bytes:
    """Frame named byte strings as one blob sealed for `key`."""
    out = [MAGIC, struct.pack(">I", len(members))]
    for name, data in members.items():
        nb = name.encode()
        out += (struct.pack(">H", len(nb)), nb, struct.pack(">Q", len(data)), data)
    body = b"".join(out)
    return body + _seal(secret, key, body)


def decode_blob(secret: bytes, key: str, blob: bytes) -> dict[str, bytes]:
    """The members of a blob from `encode_blob` for `key`; Damaged if it is not one, was sealed with another
    secret or for another key, or was altered."""
    if not isinstance(blob, bytes) or len(blob) < len(MAGIC) + 4 + _TAG or not blob.startswith(MAGIC):
        raise Damaged("not an mgjit cache blob")
    body, tag = blob[:-_TAG], blob[-_TAG:]
    if not hmac.compare_digest(_seal(secret, key, body), tag):
        raise Damaged(f"its authentication fails (altered, for another key, or sealed with another "
                      f"{SECRET_VARIABLE})")
    mv = memoryview(body)
    pos = len(MAGIC)
    (count,) = struct.unpack_from(">I", mv, pos)
    pos += 4
    members: dict[str, bytes] = {}
    try:
        for _ in range(count):
            (n,) = struct.unpack_from(">H", mv, pos)
            name = bytes(mv[pos + 2 : pos + 2 + n]).decode()
            pos += 2 + n
            (size,) = struct.unpack_from(">Q", mv, pos)
            pos += 8
            if pos + size > len(body) or name in members:
                raise ValueError
            members[name] = bytes(mv[pos : pos + size])
            pos += size
    except (struct.error, UnicodeDecodeError, ValueError):
        raise Damaged("the blob's framing is broken") from None
    if pos != len(body):
        raise Damaged("the blob has trailing bytes")
    return members


def open_entry(secret: bytes, key: str, blob: bytes, wanted: Wanted) -> tuple[dict[str, bytes], dict, bytes]:
    """The files, record and meta.json of an authenticated blob; Damaged if it is not a whole entry of `key`
    that the reader wants."""
    members = decode_blob(secret, key, blob)
    if META not in members:
        raise Damaged("the blob has no meta.json")
    raw = members.pop(META)
    rec = parse_record(raw, key)
    wanted.meta(rec)
    if set(members) != set(rec["files"]):
        raise Damaged("the blob's files do not match its meta.json")
    for name, info in rec["files"].items():
        verify_file(name, members[name], info)
    return members, rec, raw


class RedisTier:
    """The Redis tier of one server for this process (see `tier_for`)."""

    def __init__(self, url: str, secret: bytes) -> None:
        self.url = url
        self.shown = safe_url(url)
        self._secret = secret
        self._down: str | None = None
        self._reset()
        # After fork the child has no writer thread and must not share the parent's lock or queue.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[float, Any] = {}
        self._cv = threading.Condition()  # guards the write-behind queue
        self._queue: deque[tuple[str, Mapping[str, bytes], bytes]] = deque()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"RedisTier({self.shown}{', down' if self._down else ''})"

    def where(self, key: str) -> str:
        """The entry's address, for messages."""
        return f"{self.shown} {PREFIX}{key[:16]}…"

    def _client(self, timeout: float) -> Any:
        """A redis-py client with this timeout (one per timeout; redis-py pools and fork-checks connections)."""
        with self._lock:
            client = self._clients.get(timeout)
            if client is None:
                try:
                    import redis
                except ImportError:
                    raise OSError("the redis package is not installed: pip install 'mgjit[redis]'") from None
                client = redis.Redis.from_url(self.url, socket_timeout=timeout,
                                              socket_connect_timeout=min(timeout, CONNECT_TIMEOUT))
                self._clients[timeout] = client
            return client

    def _call(self, timeout: float, command: str, *args: Any) -> Any:
        """Run one command; OSError (with what went wrong) for any failure of the server or the client."""
        client = self._client(timeout)
        try:
            return getattr(client, command)(*args)
        except OSError:
            raise
        except Exception as e:  # redis.RedisError and its kin: a refused AUTH, a protocol error, a timeout
            raise OSError(f"{type(e).__name__}: {e}") from None

    def _fail(self, err: BaseException) -> None:
        with self._lock:
            first = self._down is None
            self._down = str(err) or type(err).__name__
        if first:
            # Before the queue is dropped, so that whoever waits in flush() has seen the warning.
            warn_once(("redis", self.shown),
                      f"mgjit cache: Redis at {self.shown} is unavailable ({err}); using the local cache only")
        with self._cv:
            self._queue.clear()
            self._cv.notify_all()

    def fetch(self, key: str, wanted: Wanted) -> tuple[dict[str, bytes], dict, bytes] | None:
        """The files, record and meta.json stored for `key`, or None: absent, the tier is off, or the blob
        is not an authenticated entry the reader wants (one warning; it is deleted)."""
        if self._down is not None:
            return None
        try:
            blob = self._call(READ_TIMEOUT, "get", PREFIX + key)
        except OSError as e:
            self._fail(e)
            return None
        if blob is None:
            return None
        try:
            return open_entry(self._secret, key, blob, wanted)
        except Damaged as e:
            warn_once(("damaged", self.where(key)),
                      f"mgjit cache: ignoring damaged entry {self.where(key)}: {e}; it will be recompiled")
            self.delete(key)
            return None

    def delete(self, key: str) -> None:
        """Remove a damaged blob so that the next put replaces it."""
        if self._down is not None:
            return
        try:
            self._call(READ_TIMEOUT, "delete", PREFIX + key)
        except OSError as e:
            self._fail(e)

    def submit(self, key: str, files: Mapping[str, bytes], meta_json: bytes) -> None:
        """Queue an entry for the writer thread; returns at once."""
        if self._down is not None:
            return
        with self._cv:
            if len(self._queue) >= MAX_PENDING:
                return
            self._queue.append((key, files, meta_json))
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_behind, name="mgjit-cache-redis", daemon=True)
                self._thread.start()
                # Give queued writes a moment at exit; a daemon thread alone would be killed mid-write.
                atexit.register(self.flush, 5.0)
            self._cv.notify_all()

    def _write_behind(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                item = self._queue[0]
            key, files, meta_json = item
            try:
                blob = encode_blob(self._secret, key, {META: meta_json, **files})
                self._call(WRITE_TIMEOUT, "set", PREFIX + key, blob)
            except OSError as e:
                self._fail(e)
            with self._cv:
                if self._queue and self._queue[0] is item:
                    self._queue.popleft()
                self._cv.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for queued writes; True if none is left."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue, timeout)

    def status(self) -> str:
        """A one-line health report."""
        try:
            pong = self._call(READ_TIMEOUT, "ping")
            keys = self._call(READ_TIMEOUT, "dbsize")
        except OSError as e:
            return f"{self.shown} unreachable ({e})"
        return f"{self.shown} reachable ({'PONG' if pong else pong}, {keys} keys), entries authenticated"


_tiers: dict[tuple[str, bytes], RedisTier] = {}
_tiers_lock = threading.Lock()


def tier_for(url: str) -> RedisTier | None:
    """The process's tier for `url` and the configured secret, shared by every Store, so a dead server costs
    one timeout and one warning per process. None, with one warning, if `url` is not a Redis URL or no usable
    secret is configured."""
    secret = os.environ.get(SECRET_VARIABLE, "")
    try:
        shown = safe_url(url)
    except ValueError as e:
        warn_once(("redis-url", url), f"mgjit cache: ignoring MGJIT_CACHE_REDIS: {e}")
        return None
    if len(secret) < MIN_SECRET:
        warn_once(("redis-key", url), f"mgjit cache: not using Redis at {shown}: {SECRET_VARIABLE} "
                  f"{'is shorter than ' + str(MIN_SECRET) + ' characters' if secret else 'is not set'}. Entries "
                  f"from a shared server are only trusted when sealed with a secret of yours: set "
                  f"{SECRET_VARIABLE} to the same random string (e.g. from `openssl rand -hex 32`) on every "
                  f"machine that shares the cache")
        return None
    with _tiers_lock:
        tier = _tiers.get((url, secret.encode()))
        if tier is None:
            tier = _tiers[(url, secret.encode())] = RedisTier(url, secret.encode())
        return tier

"""A Redis second tier: read-through on a local miss, write-behind on put.

The client speaks RESP over a plain socket with short timeouts (no redis-py). An entry travels as one blob
in our own framing, never pickle::

    b"MGJITC\\x00\\x01"  u32 count  { u16 name_len, name, u64 data_len, data } * count  sha256(all before)

Its first member is the entry's meta.json; the store verifies every file's checksum after a fetch. If the
server is unreachable or misbehaves, the tier switches itself off for the rest of the process with one
warning, and the local store carries on alone. Size the server with `maxmemory` and an LRU policy
(`allkeys-lru`): mgjit does not evict from Redis.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import socket
import struct
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ._warn import warn_once

PREFIX = "mgjit:"
MAGIC = b"MGJITC\x00\x01"
CONNECT_TIMEOUT = 1.0
# A get waits on this at most once per process: after a failure the tier is off.
READ_TIMEOUT = 2.0
# The writer thread is not in anyone's way, so it may wait longer for a big blob.
WRITE_TIMEOUT = 10.0
# Puts beyond this many unsent ones are not sent to Redis (the local store still has them).
MAX_PENDING = 256
# A reply larger than this is not a cache entry: refuse it rather than allocate it.
MAX_BULK = 512 << 20


class RedisError(OSError):
    """The server answered with an error or broke the protocol."""


@dataclass(frozen=True)
class RedisURL:
    """A parsed redis://[[user]:password@]host[:port][/db] address."""

    host: str
    port: int
    db: int
    username: str | None
    password: str | None

    def __str__(self) -> str:
        # Never shows the password: this goes into warnings and `stats`.
        return f"redis://{self.host}:{self.port}/{self.db}"


def parse_url(url: str) -> RedisURL:
    """Parse a redis:// URL; ValueError if it is not one."""
    u = urlsplit(url)
    if u.scheme != "redis" or not u.hostname:
        raise ValueError(f"expected redis://host:port/db, got {url!r}")
    path = u.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"the database in {url!r} must be a number")
    return RedisURL(
        host=u.hostname,
        port=u.port or 6379,
        db=int(path or 0),
        username=unquote(u.username) if u.username else None,
        password=unquote(u.password) if u.password is not None else None,
    )


class Connection:
    """One RESP connection: `command(*args)` sends a command and returns the decoded reply."""

    def __init__(self, url: RedisURL, timeout: float) -> None:
        self._sock = socket.create_connection((url.host, url.port), timeout=min(timeout, CONNECT_TIMEOUT))
        try:
            self._sock.settimeout(timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._file = self._sock.makefile("rb")
            if url.password is not None:
                self.command("AUTH", *([url.username] if url.username else []), url.password)
            if url.db:
                self.command("SELECT", url.db)
        except BaseException:
            self._sock.close()
            raise

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def command(self, *args: str | bytes | int) -> Any:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out += (b"$%d\r\n" % len(b), b, b"\r\n")
        self._sock.sendall(b"".join(out))
        return self._reply()

    def _reply(self) -> Any:
        line = self._file.readline(65536)
        if not line.endswith(b"\r\n"):
            raise RedisError("connection closed by the server" if not line else "malformed reply")
        kind, rest = line[:1], line[1:-2]
        try:
            if kind == b"+":
                return rest.decode()
            if kind == b"-":
                raise RedisError(rest.decode(errors="replace"))
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                if n > MAX_BULK:
                    raise RedisError(f"reply of {n} bytes is too large")
                data = self._file.read(n + 2)
                if len(data) != n + 2 or not data.endswith(b"\r\n"):
                    raise RedisError("truncated reply")
                return data[:-2]
            if kind == b"*":
                n = int(rest)
                return None if n < 0 else [self._reply() for _ in range(n)]
        except ValueError:
            raise RedisError(f"malformed reply {line[:40]!r}") from None
        raise RedisError(f"unknown reply type {line[:40]!r}")


def encode_blob(members: Mapping[str, bytes]) -> bytes:
    """Frame named byte strings as one checksummed blob."""
    out = [MAGIC, struct.pack(">I", len(members))]
    for name, data in members.items():
        nb = name.encode()
        out += (struct.pack(">H", len(nb)), nb, struct.pack(">Q", len(data)), data)
    body = b"".join(out)
    return body + hashlib.sha256(body).digest()


def decode_blob(blob: bytes) -> dict[str, bytes]:
    """The members of a blob from `encode_blob`; ValueError if it is not one, truncated or altered."""
    if len(blob) < len(MAGIC) + 4 + 32 or not blob.startswith(MAGIC):
        raise ValueError("not an mgjit cache blob")
    body, digest = blob[:-32], blob[-32:]
    if hashlib.sha256(body).digest() != digest:
        raise ValueError("the blob fails its sha256 checksum")
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
        raise ValueError("the blob's framing is broken") from None
    if pos != len(body):
        raise ValueError("the blob has trailing bytes")
    return members


class RedisTier:
    """The Redis tier of one server for this process (see `tier_for`)."""

    def __init__(self, url: str) -> None:
        self.url = parse_url(url)
        self._down: str | None = None
        self._reset()
        # After fork the child has no writer thread and must not share the parent's sockets or locks.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()  # guards the foreground connection
        self._conn: Connection | None = None
        self._cv = threading.Condition()  # guards the write-behind queue
        self._queue: deque[tuple[str, Mapping[str, bytes], bytes]] = deque()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"RedisTier({self.url}{', down' if self._down else ''})"

    def where(self, key: str) -> str:
        """The entry's address, for messages."""
        return f"{self.url} {PREFIX}{key}"

    def _fail(self, err: BaseException) -> None:
        with self._lock:
            first = self._down is None
            self._down = str(err) or type(err).__name__
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        if first:
            # Before the queue is dropped, so that whoever waits in flush() has seen the warning.
            warn_once(
                ("redis", str(self.url)),
                f"mgjit cache: Redis at {self.url} is unavailable ({err}); using the local cache only",
            )
        with self._cv:
            self._queue.clear()
            self._cv.notify_all()

    def _command(self, *args: str | bytes | int) -> Any:
        with self._lock:
            if self._conn is None:
                self._conn = Connection(self.url, READ_TIMEOUT)
            try:
                return self._conn.command(*args)
            except BaseException:
                self._conn.close()
                self._conn = None
                raise

    def fetch(self, key: str) -> bytes | None:
        """The blob stored for `key`, or None (absent, or the tier is off)."""
        if self._down is not None:
            return None
        try:
            reply = self._command("GET", PREFIX + key)
        except OSError as e:
            self._fail(e)
            return None
        return reply if isinstance(reply, bytes) else None

    def delete(self, key: str) -> None:
        """Remove a damaged blob so that the next put replaces it."""
        if self._down is not None:
            return
        try:
            self._command("DEL", PREFIX + key)
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
        conn: Connection | None = None
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                item = self._queue[0]
            key, files, meta_json = item
            try:
                if conn is None:
                    conn = Connection(self.url, WRITE_TIMEOUT)
                conn.command("SET", PREFIX + key, encode_blob({"meta.json": meta_json, **files}))
            except OSError as e:
                if conn is not None:
                    conn.close()
                    conn = None
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
        """A one-line health report from a fresh connection."""
        try:
            conn = Connection(self.url, READ_TIMEOUT)
            try:
                pong = conn.command("PING")
                keys = conn.command("DBSIZE")
            finally:
                conn.close()
        except OSError as e:
            return f"{self.url} unreachable ({e})"
        return f"{self.url} reachable ({pong}, {keys} keys in db {self.url.db})"


_tiers: dict[str, RedisTier] = {}
_tiers_lock = threading.Lock()


def tier_for(url: str) -> RedisTier:
    """The process's tier for `url`, shared by every Store, so a dead server costs one timeout and one
    warning per process. ValueError if `url` is not a redis:// URL."""
    with _tiers_lock:
        tier = _tiers.get(url)
        if tier is None:
            tier = _tiers[url] = RedisTier(url)
        return tier

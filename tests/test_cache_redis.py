"""The Redis tier of mgjit.cache against a real redis-server on loopback."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import time
import warnings

import pytest
from mgjit.cache import _warn, remote
from mgjit.cache.cli import main
from mgjit.cache.remote import Connection, RedisError, decode_blob, encode_blob, parse_url
from mgjit.cache.store import CacheWarning, Store, hash_parts

REDIS = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(
    REDIS is None, reason="redis-server is not installed (CI installs it: apt-get install -y redis-server)"
)

META = {"name": "softmax", "target": "sm_90a", "specialization": ["f16", 1024], "mgjit_version": "0.1.0"}
FILES = {"kernel.cubin": b"\x7fELF" + bytes(range(256)) * 64, "kernel.ptx": b"// ptx\n" * 100, "ptxas.txt": b"ok"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A throwaway redis-server; `url(db)` addresses it."""

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.password = None
        if "--requirepass" in extra:
            self.password = extra[extra.index("--requirepass") + 1]
        self.proc = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.conn().close()
                return
            except OSError as e:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from e
                time.sleep(0.02)

    def url(self, db: int = 0) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def conn(self, db: int = 0) -> Connection:
        return Connection(parse_url(self.url(db)), 2.0)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def server():
    if REDIS is None:
        pytest.skip("redis-server is not installed (CI installs it: apt-get install -y redis-server)")
    s = Server()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def fresh_state():
    # Every test gets its own first warning and its own tier objects (the tier of a URL is per process).
    _warn._warned.clear()
    remote._tiers.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        yield


def key(n) -> str:
    return hash_parts("redis-test", n)


def stores(tmp_path, url: str) -> tuple[Store, Store]:
    """Two machines' worth of local stores sharing one Redis."""
    return Store(tmp_path / "a", redis_url=url), Store(tmp_path / "b", redis_url=url)


# ------------------------------------------------------------------------------------- no server


def test_parse_url():
    u = parse_url("redis://cachehost:6380/3")
    assert (u.host, u.port, u.db, u.username, u.password) == ("cachehost", 6380, 3, None, None)
    u = parse_url("redis://bob:s%40cret@10.0.0.1")
    assert (u.host, u.port, u.db, u.username, u.password) == ("10.0.0.1", 6379, 0, "bob", "s@cret")
    assert str(u) == "redis://10.0.0.1:6379/0"  # no password in messages
    for bad in ("http://host:1/0", "redis://", "redis://host/x", "host:6379"):
        with pytest.raises(ValueError):
            parse_url(bad)


def test_blob_round_trip_and_tamper_detection():
    members = {"meta.json": b"{}", **FILES, "empty.txt": b""}
    blob = encode_blob(members)
    assert decode_blob(blob) == members
    assert list(decode_blob(blob)) == list(members)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 1
    for bad in (b"", b"garbage" * 20, blob[:-1], bytes(flipped), blob + b"x", b"\x80\x04pickle" + blob):
        with pytest.raises(ValueError):
            decode_blob(bad)


def test_bad_url_warns_and_stays_local(tmp_path):
    with pytest.warns(CacheWarning, match="MGJIT_CACHE_REDIS"):
        s = Store(tmp_path, redis_url="rediss://host:1/0")
    assert s.redis is None
    s.put(key(0), FILES, META)
    assert s.get(key(0)) is not None


def test_server_down_means_local_only_with_one_warning(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    a, b = stores(tmp_path, url)
    with pytest.warns(CacheWarning, match="unavailable") as rec:
        for i in range(3):
            assert a.get(key(i)) is None
            assert a.put(key(i), FILES, META).path is not None
            assert a.get(key(i)).read("kernel.cubin") == FILES["kernel.cubin"]
            assert b.get(key(i)) is None
        a.flush(5)
    assert len(rec) == 1 and url in str(rec[0].message)


def test_put_does_not_wait_for_a_hung_server(tmp_path, monkeypatch):
    # A server that accepts connections (the kernel's backlog does) but never answers.
    monkeypatch.setattr(remote, "WRITE_TIMEOUT", 0.5)
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        store = Store(tmp_path, redis_url=f"redis://127.0.0.1:{hung.getsockname()[1]}/0")
        with pytest.warns(CacheWarning, match="unavailable"):
            t0 = time.perf_counter()
            for i in range(5):
                store.put(key(i), FILES, META)
            elapsed = time.perf_counter() - t0
            assert store.flush(5)  # the writer gives up after WRITE_TIMEOUT and drops the queue
    assert elapsed < 0.25, f"put blocked for {elapsed:.3f} s"
    assert len(store.entries()) == 5


# ---------------------------------------------------------------------------------- with a server


@needs_redis
def test_put_writes_behind_and_another_store_reads_through(tmp_path, server):
    a, b = stores(tmp_path, server.url())
    a.put(key(0), FILES, META)
    assert a.flush(5)
    assert b.entries() == []
    got = b.get(key(0), expect={"target": "sm_90a"})
    assert got is not None
    assert got.meta == META
    for name, data in FILES.items():
        assert got.read(name) == data
    # published into b's local store: the next process on that machine hits on disk
    assert got.path == tmp_path / "b" / key(0)[:2] / key(0)
    assert [i.key for i in b.entries()] == [key(0)]
    assert Store(tmp_path / "b").get(key(0)).read("kernel.cubin") == FILES["kernel.cubin"]


@needs_redis
def test_blob_is_our_framing(tmp_path, server):
    a = Store(tmp_path, redis_url=server.url())
    a.put(key(1), FILES, META)
    a.flush(5)
    c = server.conn()
    blob = c.command("GET", "mgjit:" + key(1))
    c.close()
    members = decode_blob(blob)
    assert list(members) == ["meta.json", *FILES]
    assert members["kernel.cubin"] == FILES["kernel.cubin"]
    assert members["meta.json"] == (a.get(key(1)).path / "meta.json").read_bytes()


def _store_raw(server, k: str, blob: bytes) -> None:
    c = server.conn()
    assert c.command("SET", "mgjit:" + k, blob) == "OK"
    c.close()


def _exists(server, k: str) -> int:
    c = server.conn()
    try:
        return c.command("EXISTS", "mgjit:" + k)
    finally:
        c.close()


@needs_redis
def test_garbage_blob_is_a_miss_and_is_deleted(tmp_path, server):
    k = key(2)
    _store_raw(server, k, b"\x80\x04\x95 not ours")
    b = Store(tmp_path, redis_url=server.url())
    with pytest.warns(CacheWarning, match="damaged") as rec:
        assert b.get(k) is None
    assert len(rec) == 1 and f"mgjit:{k}" in str(rec[0].message)
    assert _exists(server, k) == 0
    assert b.entries() == []


@needs_redis
def test_truncated_blob_is_a_miss(tmp_path, server):
    k = key(3)
    a = Store(tmp_path / "a", redis_url=server.url())
    a.put(k, FILES, META)
    a.flush(5)
    c = server.conn()
    blob = c.command("GET", "mgjit:" + k)
    c.close()
    _store_raw(server, k, blob[: len(blob) // 2])
    with pytest.warns(CacheWarning, match="checksum"):
        assert Store(tmp_path / "b", redis_url=server.url()).get(k) is None


@needs_redis
def test_blob_with_a_wrong_file_checksum_is_a_miss(tmp_path, server):
    # A well-framed blob whose cubin does not match the sha256 in its meta.json.
    k = key(4)
    a = Store(tmp_path / "a", redis_url=server.url())
    a.put(k, FILES, META)
    assert a.flush(5)  # or the write-behind could overwrite the bad blob below
    meta_json = (a.get(k).path / "meta.json").read_bytes()
    _store_raw(server, k, encode_blob({"meta.json": meta_json, **FILES, "kernel.cubin": b"\x7fELF evil"}))
    b = Store(tmp_path / "b", redis_url=server.url())
    with pytest.warns(CacheWarning, match="kernel.cubin"):
        assert b.get(k) is None
    assert b.entries() == [] and _exists(server, k) == 0


@needs_redis
def test_blob_for_another_key_is_a_miss(tmp_path, server):
    a = Store(tmp_path / "a", redis_url=server.url())
    a.put(key(5), FILES, META)
    a.flush(5)
    c = server.conn()
    c.command("COPY", "mgjit:" + key(5), "mgjit:" + key(6))
    c.close()
    with pytest.warns(CacheWarning, match="names key"):
        assert Store(tmp_path / "b", redis_url=server.url()).get(key(6)) is None


@needs_redis
def test_blob_for_another_target_is_a_miss(tmp_path, server):
    a, b = stores(tmp_path, server.url())
    a.put(key(7), FILES, META)
    a.flush(5)
    with pytest.warns(CacheWarning, match="target"):
        assert b.get(key(7), expect={"target": "sm_100a"}) is None


@needs_redis
def test_database_and_password_from_the_url(tmp_path):
    srv = Server("--requirepass", "s3cret")
    try:
        a, b = stores(tmp_path, srv.url(db=2))
        a.put(key(8), FILES, META)
        assert a.flush(5)
        for db, expected in ((2, 1), (0, 0)):
            c = srv.conn(db=db)
            assert c.command("EXISTS", "mgjit:" + key(8)) == expected
            c.close()
        assert b.get(key(8)) is not None
        with pytest.raises(RedisError):
            Connection(parse_url(f"redis://:wrong@127.0.0.1:{srv.port}/0"), 2.0)
    finally:
        srv.stop()


@needs_redis
def test_server_dying_mid_session_warns_once_and_goes_local(tmp_path):
    srv = Server()
    a, b = stores(tmp_path, srv.url())
    a.put(key(9), FILES, META)
    a.flush(5)
    assert b.get(key(9)) is not None
    srv.stop()
    with pytest.warns(CacheWarning, match="unavailable") as rec:
        for i in range(10, 13):
            assert b.get(key(i)) is None
            assert b.put(key(i), FILES, META).path is not None
            assert b.get(key(i)) is not None
        b.flush(5)
    assert len(rec) == 1


@needs_redis
def test_stats_reports_redis(tmp_path, server, monkeypatch):
    monkeypatch.setenv("MGJIT_CACHE_REDIS", server.url())
    out = io.StringIO()
    main(["--dir", str(tmp_path), "stats"], out=out)
    assert f"redis:     redis://127.0.0.1:{server.port}/0 reachable (PONG," in out.getvalue()
    monkeypatch.setenv("MGJIT_CACHE_REDIS", f"redis://127.0.0.1:{free_port()}/0")
    out = io.StringIO()
    main(["--dir", str(tmp_path), "stats"], out=out)
    assert "unreachable" in out.getvalue()


@needs_redis
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12+
def test_forked_child_gets_its_own_connection_and_writer(tmp_path, server):
    # The autotuner compiles in forked workers: a child must not reuse the parent's socket or thread.
    store = Store(tmp_path, redis_url=server.url())
    store.put(key(20), FILES, META)
    assert store.flush(5)
    assert store.get(key(20)) is not None
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            store.put(key(21), FILES, META)
            ok = store.flush(5) and store.redis.fetch(key(20)) is not None
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _exists(server, key(21)) == 1
    store.put(key(22), FILES, META)  # the parent's writer still works
    assert store.flush(5) and _exists(server, key(22)) == 1

"""The Redis tier of mgjit.cache against a real redis-server on loopback: an authenticated, untrusted tier."""

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
from mgjit.cache.records import ANY, Damaged
from mgjit.cache.remote import decode_blob, encode_blob, safe_url
from mgjit.cache.store import CacheWarning, Store, hash_parts

redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install 'mgjit[redis]')")
REDIS = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(
    REDIS is None, reason="redis-server is not installed (CI installs it: apt-get install -y redis-server)"
)

META = {"name": "softmax", "target": "sm_90a", "specialization": ["f16", 1024], "mgjit_version": "0.1.0"}
FILES = {"kernel.cubin": b"\x7fELF" + bytes(range(256)) * 64, "kernel.ptx": b"// ptx\n" * 100, "ptxas.txt": b"ok"}
SECRET = "a-test-secret-of-32-characters.."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A throwaway redis-server; `url(db)` addresses it, `client(db)` talks to it directly."""

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
                self.client().ping()
                return
            except redis.RedisError as e:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from e
                time.sleep(0.02)

    def url(self, db: int = 0) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0):
        return redis.Redis.from_url(self.url(db), socket_timeout=2.0)

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
def fresh_state(monkeypatch):
    # Every test gets its own first warning and its own tier objects (the tier of a URL is per process).
    _warn._warned.clear()
    remote._tiers.clear()
    monkeypatch.setenv("MGJIT_CACHE_REDIS_KEY", SECRET)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        yield


def key(n) -> str:
    return hash_parts("redis-test", n)


def stores(tmp_path, url: str) -> tuple[Store, Store]:
    """Two machines' worth of local stores sharing one Redis."""
    return Store(tmp_path / "a", redis_url=url), Store(tmp_path / "b", redis_url=url)


# ------------------------------------------------------------------------------------- no server


def test_urls_are_shown_without_passwords():
    assert safe_url("redis://cachehost:6380/3") == "redis://cachehost:6380/3"
    assert safe_url("redis://bob:s%40cret@10.0.0.1") == "redis://10.0.0.1:6379/0"
    for bad in ("http://host:1/0", "redis://", "redis://host/x", "host:6379"):
        with pytest.raises(ValueError):
            safe_url(bad)


def test_blob_round_trip_and_authentication():
    k = key(0)
    members = {"meta.json": b"{}", **FILES, "empty.txt": b""}
    blob = encode_blob(SECRET.encode(), k, members)
    assert decode_blob(SECRET.encode(), k, blob) == members
    assert list(decode_blob(SECRET.encode(), k, blob)) == list(members)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 1
    for bad in (b"", b"garbage" * 20, blob[:-1], bytes(flipped), blob + b"x", b"\x80\x04pickle" + blob):
        with pytest.raises(Damaged):
            decode_blob(SECRET.encode(), k, bad)
    with pytest.raises(Damaged, match="authentication fails"):
        decode_blob(b"another secret of the same size", k, blob)  # sealed by someone without our secret
    with pytest.raises(Damaged, match="authentication fails"):
        decode_blob(SECRET.encode(), key(1), blob)  # moved to another key


@pytest.mark.parametrize("secret,why", [(None, "is not set"), ("short", "is shorter than 16")])
def test_without_a_secret_redis_is_not_used(tmp_path, monkeypatch, secret, why):
    if secret is None:
        monkeypatch.delenv("MGJIT_CACHE_REDIS_KEY")
    else:
        monkeypatch.setenv("MGJIT_CACHE_REDIS_KEY", secret)
    with pytest.warns(CacheWarning, match=f"not using Redis at redis://host:1/0: MGJIT_CACHE_REDIS_KEY {why}"):
        s = Store(tmp_path, redis_url="redis://:pw@host:1/0")
    assert s.redis is None and s.put(key(0), FILES, META).path is not None


def test_bad_url_warns_and_stays_local(tmp_path):
    with pytest.warns(CacheWarning, match="MGJIT_CACHE_REDIS"):
        s = Store(tmp_path, redis_url="http://host:1/0")
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
    blob = server.client().get("mgjit:" + key(1))
    members = decode_blob(SECRET.encode(), key(1), blob)
    assert list(members) == ["meta.json", *FILES]
    assert members["kernel.cubin"] == FILES["kernel.cubin"]
    assert members["meta.json"] == (a.get(key(1)).path / "meta.json").read_bytes()


def _store_raw(server, k: str, blob: bytes) -> None:
    assert server.client().set("mgjit:" + k, blob)


def _exists(server, k: str) -> int:
    return server.client().exists("mgjit:" + k)


@needs_redis
def test_garbage_blob_is_a_miss_and_is_deleted(tmp_path, server):
    k = key(2)
    _store_raw(server, k, b"\x80\x04\x95 not ours")
    b = Store(tmp_path, redis_url=server.url())
    with pytest.warns(CacheWarning, match="damaged") as rec:
        assert b.get(k) is None
    assert len(rec) == 1 and f"mgjit:{k[:16]}…" in str(rec[0].message)
    assert _exists(server, k) == 0
    assert b.entries() == []


@needs_redis
def test_truncated_blob_is_a_miss(tmp_path, server):
    k = key(3)
    a = Store(tmp_path / "a", redis_url=server.url())
    a.put(k, FILES, META)
    a.flush(5)
    blob = server.client().get("mgjit:" + k)
    _store_raw(server, k, blob[: len(blob) // 2])
    with pytest.warns(CacheWarning, match="authentication fails"):
        assert Store(tmp_path / "b", redis_url=server.url()).get(k) is None


@needs_redis
def test_a_blob_sealed_with_our_secret_is_still_checked_like_a_local_entry(tmp_path, server):
    # Someone holding the secret (a buggy build) seals a blob whose cubin does not match its meta.json.
    k = key(4)
    a = Store(tmp_path / "a", redis_url=server.url())
    a.put(k, FILES, META)
    assert a.flush(5)  # or the write-behind could overwrite the bad blob below
    meta_json = (a.get(k).path / "meta.json").read_bytes()
    _store_raw(server, k, encode_blob(SECRET.encode(), k, {"meta.json": meta_json, **FILES,
                                                            "kernel.cubin": b"\x7fELF evil"}))
    b = Store(tmp_path / "b", redis_url=server.url())
    with pytest.warns(CacheWarning, match="kernel.cubin"):
        assert b.get(k) is None
    assert b.entries() == [] and _exists(server, k) == 0


@needs_redis
def test_a_planted_blob_is_a_miss(tmp_path, server):
    """The server (or anyone who can write to it) plants a whole, self-consistent entry of its own making,
    framed and checksummed as mgjit would, but without the secret: it is never loaded."""
    k = key(5)
    planter = Store(tmp_path / "planter")
    meta_json = (planter.put(k, {**FILES, "kernel.cubin": b"\x7fELF evil"}, META).path / "meta.json").read_bytes()
    _store_raw(server, k, encode_blob(b"the attacker's own secret", k, {"meta.json": meta_json, **FILES,
                                                                          "kernel.cubin": b"\x7fELF evil"}))
    b = Store(tmp_path / "b", redis_url=server.url())
    with pytest.warns(CacheWarning, match="authentication fails") as rec:
        assert b.get(k) is None
    assert len(rec) == 1 and b.entries() == []


@needs_redis
def test_blob_copied_to_another_key_is_a_miss(tmp_path, server):
    a = Store(tmp_path / "a", redis_url=server.url())
    a.put(key(5), FILES, META)
    a.flush(5)
    server.client().copy("mgjit:" + key(5), "mgjit:" + key(6))
    with pytest.warns(CacheWarning, match="authentication fails"):
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
            assert srv.client(db=db).exists("mgjit:" + key(8)) == expected
        assert b.get(key(8)) is not None
        wrong = Store(tmp_path / "c", redis_url=f"redis://:wrong@127.0.0.1:{srv.port}/2")
        with pytest.warns(CacheWarning, match="unavailable"):
            assert wrong.get(key(8)) is None
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
    assert f"redis:     redis://127.0.0.1:{server.port}/0 reachable (PONG, " in out.getvalue()
    assert "entries authenticated" in out.getvalue()
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
            ok = store.flush(5) and store.redis.fetch(key(20), ANY) is not None
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _exists(server, key(21)) == 1
    store.put(key(22), FILES, META)  # the parent's writer still works
    assert store.flush(5) and _exists(server, key(22)) == 1

"""The on-disk store of mgjit.cache: round trips, damage, security, eviction, configuration."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import warnings

import pytest
from mgjit.cache import _warn
from mgjit.cache.store import (
    DEFAULT_MAX_BYTES,
    CacheWarning,
    Store,
    default_store,
    hash_parts,
    parse_size,
)

META = {"name": "add", "target": "sm_90a", "specialization": ("f32", 16, True), "mgjit_version": "0.1.0"}


def files_for(tag: str, cubin_size: int = 4096) -> dict[str, bytes]:
    return {
        "kernel.cubin": (tag.encode() * cubin_size)[:cubin_size],
        "kernel.ptx": f"// ptx of {tag}\n".encode() * 50,
        "ptxas.txt": f"ptxas info: {tag} used 32 registers\n".encode(),
    }


@pytest.fixture(autouse=True)
def fresh_warnings():
    # Each test must see its own first warning; the once-per-process memory would hide it.
    _warn._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # an unexpected warning fails the test
        yield


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "cache")


def key(n: int | str) -> str:
    return hash_parts("test", n)


def entry_dir(store: Store, k: str):
    return store.root / k[:2] / k


def put(store: Store, n: int | str = 0, **kw):
    return store.put(key(n), files_for(str(n), **kw), {**META, "name": f"k{n}"})


def assert_damaged_miss(store: Store, k: str, fragment: str = "") -> None:
    """get() is a miss with one warning naming the entry, and the entry is gone."""
    with pytest.warns(CacheWarning) as rec:
        assert store.get(k) is None
    assert len(rec) == 1
    msg = str(rec[0].message)
    # The entry once, briefly: its key's start and the directory (whole paths made warnings unreadable).
    assert f"{k[:16]}… in {store.root}:" in msg and fragment in msg and msg.count(str(store.root)) == 1
    assert not entry_dir(store, k).exists()
    # The next compile can publish again, and the result is a hit.
    store.put(k, files_for("again"), META)
    assert store.get(k).read("kernel.cubin") == files_for("again")["kernel.cubin"]


# ----------------------------------------------------------------------------------------- keys


def test_hash_parts_is_pinned():
    # The encoding is part of every cache key: a change must be deliberate (and bump the prefix).
    assert hash_parts("a", 1, 2.5, None, True, b"x", (1,), [1], {"k": "v"}) == (
        "febf9a3d972359f81d5574a00e30a30a8293900afe1c0591ea90ddbcfa550808"
    )


def test_hash_parts_is_type_tagged_and_length_prefixed():
    distinct = [
        hash_parts("ab", "c"),
        hash_parts("a", "bc"),
        hash_parts(1),
        hash_parts(1.0),
        hash_parts(True),
        hash_parts("1"),
        hash_parts(b"1"),
        hash_parts([1]),
        hash_parts((1,)),
        hash_parts(None),
        hash_parts(0.0),
        hash_parts(-0.0),
        hash_parts({"a": 1}),
        hash_parts({"a": 1.0}),
        hash_parts((("a", 1),)),
    ]
    assert len(set(distinct)) == len(distinct)
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in distinct)


def test_hash_parts_dicts_ignore_insertion_order_but_not_content():
    assert hash_parts({"a": 1, "b": [2, {"c": None}]}) == hash_parts({"b": [2, {"c": None}], "a": 1})
    assert hash_parts({"a": 1, "b": 2}) != hash_parts({"a": 2, "b": 1})
    assert hash_parts({1: "x", "1": "y"}) == hash_parts({"1": "y", 1: "x"})


def test_hash_parts_rejects_unstable_types():
    with pytest.raises(TypeError):
        hash_parts(object())
    with pytest.raises(TypeError):
        hash_parts({"s": {1, 2}})


def test_invalid_keys_and_names_are_caller_errors(store):
    for bad in ("", "xyz", "ABCDEF0123", "../../etc", "a" * 200):
        with pytest.raises(ValueError):
            store.get(bad)
    for bad in ("../evil", "meta.json", ".hidden", "a/b", ""):
        with pytest.raises(ValueError):
            store.put(key(1), {bad: b"x"}, META)


# ------------------------------------------------------------------------------------ round trip


def test_put_then_get_round_trips(store):
    k = key(0)
    put_entry = put(store, 0)
    assert put_entry.path == entry_dir(store, k)
    # meta comes back exactly as a later get returns it (tuples become JSON lists)
    assert put_entry.meta == {**META, "name": "k0", "specialization": ["f32", 16, True]}
    got = store.get(k)
    assert got is not None and got.key == k
    assert got.meta == put_entry.meta
    assert got.path == put_entry.path
    assert set(got.names) == {"kernel.cubin", "kernel.ptx", "ptxas.txt"}
    for name, data in files_for("0").items():
        assert got.read(name) == data
    with pytest.raises(KeyError):
        got.read("kernel.sass")
    rec = json.loads((got.path / "meta.json").read_text())
    assert rec["key"] == k and rec["format"] == 2 and rec["size"] == sum(map(len, files_for("0").values()))
    assert rec["created"] <= time.time()
    assert set(rec["files"]) == set(got.names)


def test_miss_is_silent_and_creates_nothing(store):
    assert store.get(key("absent")) is None
    assert not store.root.exists()


def test_put_leaves_no_temporaries(store):
    for i in range(3):
        put(store, i)
    assert list((store.root / ".tmp").iterdir()) == []
    assert len(store.entries()) == 3


def test_second_put_of_a_key_keeps_the_first(store):
    k = key(0)
    put(store, 0)
    first = (entry_dir(store, k) / "meta.json").read_bytes()
    again = store.put(k, files_for("0"), {**META, "name": "k0"})
    assert again.path == entry_dir(store, k)
    assert (entry_dir(store, k) / "meta.json").read_bytes() == first
    assert [i.key for i in store.entries()] == [k]
    assert list((store.root / ".tmp").iterdir()) == []


def test_get_bumps_last_use(store):
    e = put(store, 0)
    old = time.time() - 3600
    os.utime(e.path / "meta.json", (old, old))
    assert store.entries()[0].last_used == pytest.approx(old)
    store.get(e.key)
    assert store.entries()[0].last_used > old + 3000


# ---------------------------------------------------------------------------------------- damage


def test_truncated_cubin_is_a_miss(store):
    e = put(store, 0)
    cubin = e.path / "kernel.cubin"
    cubin.write_bytes(cubin.read_bytes()[:100])
    assert_damaged_miss(store, e.key, "kernel.cubin")


def test_corrupted_cubin_of_the_right_size_is_a_miss(store):
    e = put(store, 0)
    cubin = e.path / "kernel.cubin"
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.write_bytes(bytes(data))
    assert_damaged_miss(store, e.key, "checksum")


def test_garbage_json_is_a_miss(store):
    e = put(store, 0)
    (e.path / "meta.json").write_bytes(b"\x00\xff{not json")
    assert_damaged_miss(store, e.key, "JSON")


def test_truncated_json_is_a_miss(store):
    e = put(store, 0)
    meta = e.path / "meta.json"
    meta.write_bytes(meta.read_bytes()[:40])
    assert_damaged_miss(store, e.key, "JSON")


@pytest.mark.parametrize(
    "record",
    [[1, 2, 3], {"format": 3}, {"format": 2, "key": None}, "just a string"],
    ids=["list", "future-format", "no-fields", "string"],
)
def test_json_of_the_wrong_shape_is_a_miss(store, record):
    e = put(store, 0)
    rec = json.loads((e.path / "meta.json").read_text())
    if isinstance(record, dict) and record.get("key", 0) is None:
        record = {**record, "key": rec["key"]}
    (e.path / "meta.json").write_text(json.dumps(record))
    assert_damaged_miss(store, e.key)


def test_missing_json_is_a_miss(store):
    e = put(store, 0)
    (e.path / "meta.json").unlink()
    assert_damaged_miss(store, e.key, "meta.json is missing")


def test_missing_cubin_is_a_miss(store):
    e = put(store, 0)
    (e.path / "kernel.cubin").unlink()
    assert_damaged_miss(store, e.key, "kernel.cubin is missing")


def test_missing_ptx_is_a_miss(store):
    e = put(store, 0)
    (e.path / "kernel.ptx").unlink()
    assert_damaged_miss(store, e.key, "kernel.ptx is missing")


def test_truncated_ptx_is_a_miss(store):
    e = put(store, 0)
    (e.path / "kernel.ptx").write_bytes(b"// short")
    assert_damaged_miss(store, e.key, "kernel.ptx has 8 bytes")


def test_corrupted_ptx_is_a_miss(store):
    e = put(store, 0)
    ptx = e.path / "kernel.ptx"
    ptx.write_bytes(ptx.read_bytes().replace(b"ptx", b"xtp"))
    assert_damaged_miss(store, e.key, "kernel.ptx fails its sha256 checksum")


def test_entry_stays_readable_after_eviction(store):
    # get returns a verified snapshot: another process evicting the entry cannot break a later read.
    e = put(store, 0)
    got = store.get(e.key)
    store.clear()
    assert not e.path.exists()
    for name, data in files_for("0").items():
        assert got.read(name) == data


def test_entry_filed_under_another_key_is_a_miss(store):
    # An entry copied (or planted) under another key's directory: the key inside the JSON decides.
    e = put(store, 0)
    other = key("other")
    os.makedirs(entry_dir(store, other).parent, exist_ok=True)
    os.rename(e.path, entry_dir(store, other))
    assert_damaged_miss(store, other, "names key")


def test_tampered_checksum_field_is_a_miss(store):
    e = put(store, 0)
    rec = json.loads((e.path / "meta.json").read_text())
    rec["files"]["kernel.cubin"]["sha256"] = "0" * 64
    (e.path / "meta.json").write_text(json.dumps(rec))
    assert_damaged_miss(store, e.key, "meta.json fails its digest")


def test_a_consistent_record_with_a_wrong_checksum_is_a_miss(store):
    from mgjit.cache.records import _digest
    e = put(store, 0)
    rec = json.loads((e.path / "meta.json").read_text())
    rec["files"]["kernel.cubin"]["sha256"] = "0" * 64
    rec["digest"] = _digest(rec)
    (e.path / "meta.json").write_text(json.dumps(rec))
    assert_damaged_miss(store, e.key, "kernel.cubin fails its sha256 checksum")


@pytest.mark.parametrize("field,value", [("threads", 384), ("params", [{"dtype": "f16"}]), ("name", "k1")])
def test_a_changed_meta_value_is_a_miss(store, field, value):
    """The caller's meta decides how a kernel is launched: a flipped thread count or dtype must not load."""
    e = put(store, 0)
    rec = json.loads((e.path / "meta.json").read_text())
    rec["meta"][field] = value
    (e.path / "meta.json").write_text(json.dumps(rec))
    assert_damaged_miss(store, e.key, "digest")


def test_oversized_cubin_is_a_miss(store):
    e = put(store, 0)
    with open(e.path / "kernel.cubin", "ab") as f:
        f.write(b"\x90" * 1000)
    assert_damaged_miss(store, e.key, "kernel.cubin")


def test_entry_of_another_mgjit_version_is_a_miss(store):
    e = put(store, 0)
    assert_expect_mismatch(store, e.key, {"mgjit_version": "0.2.0"}, "mgjit_version")


def test_entry_for_another_target_is_a_miss(store):
    e = put(store, 0)
    assert_expect_mismatch(store, e.key, {"target": "sm_100a"}, "target")


def assert_expect_mismatch(store, k, expect, field):
    with pytest.warns(CacheWarning, match=field):
        assert store.get(k, expect=expect) is None
    assert not entry_dir(store, k).exists()


def test_expect_compares_in_json_form(store):
    e = put(store, 0)
    got = store.get(e.key, expect={"target": "sm_90a", "specialization": ("f32", 16, True)})
    assert got is not None


def test_damage_in_a_read_only_store_is_ignored_not_fatal(store, monkeypatch):
    # Removal can fail (a shared read-only cache): the entry is still a miss, with one warning.
    e = put(store, 0)
    (e.path / "kernel.cubin").write_bytes(b"short")
    monkeypatch.setattr(os, "rename", _raise_eacces)
    with pytest.warns(CacheWarning):
        assert store.get(e.key) is None
    assert store.get(e.key) is None  # the warning is not repeated
    assert e.path.exists()


def _raise_eacces(*args, **kwargs):
    raise PermissionError(13, "Permission denied")


# ------------------------------------------------------------------------------ unwritable / security


def test_unwritable_dir_gives_in_memory_entries_with_one_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = Store(blocker / "cache")  # mkdir fails for every user, root included
    with pytest.warns(CacheWarning, match="in memory only") as rec:
        e1 = put(store, 1)
        e2 = put(store, 2)
    assert len(rec) == 1 and str(blocker) in str(rec[0].message)
    assert e1.path is None and e2.path is None
    assert e1.read("kernel.ptx") == files_for("1")["kernel.ptx"]
    assert e1.meta["name"] == "k1"
    assert store.get(key(1)) is None


def test_rename_failure_gives_in_memory_entry(store, monkeypatch):
    put(store, 0)  # the store exists and works ...
    monkeypatch.setattr(os, "rename", _raise_eacces)  # ... until publishing fails (e.g. quota)
    with pytest.warns(CacheWarning, match="in memory only"):
        e = put(store, 1)
    assert e.path is None and e.read("kernel.cubin") == files_for("1")["kernel.cubin"]
    monkeypatch.undo()
    assert list((store.root / ".tmp").iterdir()) == []


def test_store_is_private(store):
    e = put(store, 0)
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(e.path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(e.path).st_mode) == 0o700
    for f in e.path.iterdir():
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600


def test_put_after_damaged_remnant_replaces_it(store):
    # A directory without meta.json at the entry's place (say, a half-deleted entry) must not block puts.
    k = key(0)
    d = entry_dir(store, k)
    d.mkdir(parents=True)
    (d / "kernel.cubin").write_bytes(b"junk")
    e = put(store, 0)
    assert e.path == d
    assert store.get(k).read("kernel.cubin") == files_for("0")["kernel.cubin"]


# -------------------------------------------------------------------------------------- eviction


def test_parse_size():
    assert parse_size("2G") == 2 << 30
    assert parse_size("500M") == 500 << 20
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("64k") == 64 << 10
    assert parse_size("100") == 100
    assert parse_size(" 3 mb ") == 3 << 20
    for bad in ("", "G", "2X", "-1G", "1e9"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_lru_eviction_after_put(tmp_path):
    store = Store(tmp_path / "c", max_bytes=40_000)
    now = time.time()
    for i in range(3):
        e = put(store, i, cubin_size=8000)
        os.utime(e.path / "meta.json", (now - 1000 + i, now - 1000 + i))  # 0 oldest, 2 newest
    store.get(key(0))  # 0 becomes the most recent
    for i in range(3, 6):
        put(store, i, cubin_size=8000)
    left = {i.key for i in store.entries()}
    assert sum(i.size for i in store.entries()) <= 40_000
    assert key(0) in left and key(5) in left
    assert key(1) not in left  # the least recently used went first


def test_eviction_keeps_the_entry_just_written(tmp_path):
    store = Store(tmp_path / "c", max_bytes=1000)
    put(store, 0, cubin_size=5000)
    e = put(store, 1, cubin_size=5000)
    assert [i.key for i in store.entries()] == [e.key]
    assert store.get(e.key) is not None


def test_prune_sweeps_stale_temporaries_only(store):
    put(store, 0)
    stale = store.root / ".tmp" / "dead.123.abcd"
    young = store.root / ".tmp" / "busy.456.ef01"
    for d in (stale, young):
        d.mkdir()
        (d / "kernel.cubin").write_bytes(b"x")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    store.prune()
    assert not stale.exists() and young.exists()
    assert len(store.entries()) == 1


def test_prune_older_than_and_max_bytes(store):
    now = time.time()
    for i in range(4):
        e = put(store, i)
        os.utime(e.path / "meta.json", (now - 86400 * (10 - i),) * 2)  # 0: 10 days ... 3: 7 days
    removed = store.prune(older_than=8.5 * 86400)
    assert {i.key for i in removed} == {key(0), key(1)}
    # Room for one entry (sizes differ by a byte or two: the float in meta.json varies in length).
    removed = store.prune(max_bytes=max(i.size for i in store.entries()))
    assert [i.key for i in removed] == [key(2)]
    assert [i.key for i in store.entries()] == [key(3)]


# --------------------------------------------------------------------------------- configuration


def test_default_store_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("MGJIT_CACHE_MAX_BYTES", "2G")
    monkeypatch.delenv("MGJIT_CACHE_REDIS", raising=False)
    s = default_store()
    assert s is default_store()
    assert s.root == tmp_path / "a" and s.max_bytes == 2 << 30 and s.redis is None
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path / "b"))
    assert default_store().root == tmp_path / "b"


def test_default_dir_uses_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("MGJIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("MGJIT_CACHE_MAX_BYTES", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_store().root == tmp_path / "xdg" / "mgjit"
    assert default_store().max_bytes == DEFAULT_MAX_BYTES
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # invalid per the XDG spec
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store().root == tmp_path / "home" / ".cache" / "mgjit"


def test_bad_max_bytes_warns_and_uses_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MGJIT_CACHE_MAX_BYTES", "lots")
    with pytest.warns(CacheWarning, match="MGJIT_CACHE_MAX_BYTES"):
        assert Store.from_env().max_bytes == DEFAULT_MAX_BYTES


def test_cache_import_and_hit_stay_light(tmp_path):
    # A hit must not pull in MLIR, torch, numpy or sockets (the Redis tier loads only when configured).
    code = """
import sys
import mgjit
before = set(sys.modules)
from mgjit.cache.store import Store, hash_parts
s = Store(sys.argv[1])
k = hash_parts("light")
s.put(k, {"kernel.cubin": b"x"}, {"name": "n"})
assert s.get(k) is not None
heavy = [m for m in set(sys.modules) - before
         if m.split(".")[0] in ("torch", "numpy", "mlir", "numba_cuda_mlir", "socket", "cuda")]
assert not heavy, heavy
"""
    env = {k: v for k, v in os.environ.items() if k != "MGJIT_CACHE_REDIS"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, timeout=60)


def test_a_checkout_imports_its_own_cache_and_autotune(tmp_path):
    """mgjit/ beside cache/ and autotune/ (a checkout, or a tree copied from one and put first on sys.path, as
    tools and benchmarks/rows_ab.py do) imports mgjit.cache and mgjit.autotune from that tree, not from the
    checkout an editable install maps them to; a wheel's layout (both inside mgjit/) registers nothing, and nor does
    an mgjit/ beside a project's own packages of those names."""
    import shutil
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    skip = shutil.ignore_patterns("__pycache__")
    code = """
import sys
sys.path.insert(0, sys.argv[1])
import mgjit, mgjit.cache.store, mgjit.autotune.tuner
print(mgjit._CHECKOUT)
for m in (mgjit, mgjit.cache, mgjit.cache.store, mgjit.autotune, mgjit.autotune.tuner):
    print(m.__file__)
"""
    checkout, wheel, project = tmp_path / "checkout", tmp_path / "wheel", tmp_path / "project"
    for name in ("mgjit", "cache", "autotune"):
        shutil.copytree(os.path.join(root, name), checkout / name, ignore=skip)
        shutil.copytree(os.path.join(root, name), wheel / "mgjit" / name if name != "mgjit" else wheel / name,
                        ignore=skip, dirs_exist_ok=True)
    shutil.copytree(os.path.join(root, "mgjit"), project / "mgjit", ignore=skip)  # beside a project's own packages
    for name in ("cache", "autotune"):
        (project / name).mkdir()
        (project / name / "__init__.py").write_text("")
    for tree, registered in ((checkout, str(checkout)), (wheel, "None")):
        lines = subprocess.run([sys.executable, "-c", code, str(tree)], check=True, capture_output=True, text=True,
                               timeout=60, cwd=tmp_path).stdout.split()
        assert lines[0] == registered, lines
        assert all(line.startswith(str(tree)) for line in lines[1:]), lines
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import mgjit; print(mgjit._CHECKOUT)"
    assert subprocess.run([sys.executable, "-c", probe, str(project)], check=True, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path).stdout.split() == ["None"]

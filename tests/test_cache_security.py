"""The disk store against a hostile co-user and a mistaken MGJIT_CACHE_DIR (issue 14 items 4 to 7).

A directory others can write, or another uid owns, is never read; no link inside the cache is followed; nothing
that is not one of mgjit's entries is deleted; and whatever is found at an entry's place (a file, a link, an
entry of another build) is a miss with one warning that heals on the next compile. Each test plants a
self-consistent entry (checksums and all) and checks that its kernel is never returned.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest
from mgjit.cache import _warn
from mgjit.cache.records import _digest
from mgjit.cache.root import MARKER
from mgjit.cache.store import CacheWarning, Store, hash_parts

META = {"name": "add", "target": "sm_90a", "mgjit_version": "0.1.0"}
GOOD = {"kernel.cubin": b"\x7fELF good kernel" * 64, "kernel.ptx": b"// good\n"}
EVIL = {"kernel.cubin": b"\x7fELF planted kernel" * 64, "kernel.ptx": b"// planted\n"}
K = hash_parts("security", 0)


@pytest.fixture(autouse=True)
def fresh_warnings(tmp_path, monkeypatch):
    _warn._warned.clear()
    # The per-user fallback directory lives in the test's own tree, never in the real home.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        yield


def plant(tmp_path, name: str = "attacker"):
    """A self-consistent entry of K holding the planted kernel, made by a store of its own; its directory."""
    e = Store(tmp_path / name).put(K, EVIL, META)
    return e.path


def victim_files(tmp_path):
    """A directory of a user's work, shaped like cache entries and leftovers, to check nothing is deleted."""
    work = tmp_path / "work"
    (work / "ab" / ("ab" + "0" * 62)).mkdir(parents=True)
    (work / "ab" / ("ab" + "0" * 62) / "thesis.tex").write_text("years of work")
    (work / "old").mkdir()
    (work / "old" / "notes.txt").write_text("notes")
    os.utime(work / "old", (1, 1))
    return work


def snapshot(d) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------- item 4: whose root


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_directory_others_can_write_is_never_read(tmp_path, mode):
    shared = tmp_path / "shared"
    shutil.copytree(plant(tmp_path).parent.parent, shared)
    os.chmod(shared, mode)
    store = Store(shared)
    with pytest.warns(CacheWarning) as rec:
        assert store.get(K) is None
    msg = str(rec[0].message)
    assert len(rec) == 1 and f"not using {shared}: others can write to it (mode {mode:o})" in msg
    assert f"chmod go-w {shared}" in msg and f"Using {tmp_path / 'xdg' / 'mgjit'} instead" in msg
    assert store.root == tmp_path / "xdg" / "mgjit"
    assert store.put(K, GOOD, META).path.parent.parent == store.root
    assert store.get(K).read("kernel.cubin") == GOOD["kernel.cubin"]
    assert Store(shared).root != shared  # every store refuses it; the warning is not repeated


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_a_directory_another_uid_owns_is_never_read(tmp_path):
    theirs = tmp_path / "theirs"
    shutil.copytree(plant(tmp_path).parent.parent, theirs)
    os.chmod(theirs, 0o700)
    os.chown(theirs, 12345, 12345)
    with pytest.warns(CacheWarning, match=r"owned by uid 12345, not by you .*point MGJIT_CACHE_DIR"):
        assert Store(theirs).get(K) is None


def test_when_the_user_directory_is_refused_too_a_private_one_is_used(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    os.chmod(tmp_path, 0o700)
    (tmp_path / "mgjit").mkdir()
    os.chmod(tmp_path / "mgjit", 0o777)  # the per-user default is no better
    store = Store(shared)
    with pytest.warns(CacheWarning, match="not using"):
        e = store.put(K, GOOD, META)
    assert e.path is not None and store.root not in (shared, tmp_path / "mgjit")
    assert (os.stat(store.root).st_mode & 0o777) == 0o700 and store.get(K) is not None


# --------------------------------------------------------------------------------- item 5: no links


def test_a_linked_entry_is_not_followed(tmp_path):
    planted = plant(tmp_path)
    store = Store(tmp_path / "cache")
    store.put(hash_parts("other"), GOOD, META)  # the cache exists and is ours
    (store.root / K[:2]).mkdir(exist_ok=True)
    os.symlink(planted, store.root / K[:2] / K)
    with pytest.warns(CacheWarning, match="a link or a file is where a directory should be") as rec:
        assert store.get(K) is None
    assert len(rec) == 1 and not os.path.lexists(store.root / K[:2] / K)
    assert Store(tmp_path / "attacker").get(K).read("kernel.cubin") == EVIL["kernel.cubin"]  # untouched
    assert store.put(K, GOOD, META).path is not None and store.get(K).read("kernel.cubin") == GOOD["kernel.cubin"]


def test_a_linked_shard_is_not_followed(tmp_path):
    planted = plant(tmp_path)
    store = Store(tmp_path / "cache")
    store.put(hash_parts("other"), GOOD, META)
    shutil.rmtree(store.root / K[:2], ignore_errors=True)
    os.symlink(planted.parent, store.root / K[:2])
    with pytest.warns(CacheWarning, match="a link or a file"):
        assert store.get(K) is None
    assert planted.is_dir() and not os.path.lexists(store.root / K[:2])
    assert store.put(K, GOOD, META).path is not None and store.get(K).read("kernel.cubin") == GOOD["kernel.cubin"]


@pytest.mark.parametrize("name", ["meta.json", "kernel.cubin"])
def test_a_linked_file_is_not_read(tmp_path, name):
    planted = plant(tmp_path)
    store = Store(tmp_path / "cache")
    e = store.put(K, GOOD, META)
    (e.path / name).unlink()
    os.symlink(planted / name, e.path / name)
    with pytest.warns(CacheWarning, match=f"{name} is not a regular file"):
        assert store.get(K) is None
    assert (planted / name).is_file()


def test_a_linked_root_is_the_users_choice(tmp_path):
    real = tmp_path / "real"
    Store(real).put(K, GOOD, META)
    os.symlink(real, tmp_path / "link")
    assert Store(tmp_path / "link").get(K).read("kernel.cubin") == GOOD["kernel.cubin"]


# --------------------------------------------------------------------- item 6: nothing else deleted


def test_a_directory_mgjit_did_not_make_is_not_used(tmp_path, monkeypatch):
    work = victim_files(tmp_path)
    before = snapshot(work)
    store = Store(work)
    with pytest.warns(CacheWarning, match=r"holds files that mgjit did not make \('old'\).*new or empty directory"):
        store.clear()
    store.put(K, GOOD, META)
    store.prune(max_bytes=0)
    assert snapshot(work) == before and not (work / MARKER).exists()


def test_the_cache_marks_its_root_and_adopts_only_its_own_layout(tmp_path):
    store = Store(tmp_path / "new")
    store.put(K, GOOD, META)
    assert (store.root / MARKER).is_file()
    old = tmp_path / "older-cache"  # a cache of an mgjit that did not mark its root
    shutil.copytree(store.root, old)
    (old / MARKER).unlink()
    (old / "autotune").mkdir()
    assert Store(old).get(K) is not None and (old / MARKER).is_file()


@pytest.mark.parametrize("leftover", [".trash", ".tmp"])
def test_a_linked_trash_or_tmp_deletes_nothing_it_names(tmp_path, leftover):
    work = victim_files(tmp_path)
    before = snapshot(work)
    store = Store(tmp_path / "cache")
    store.put(K, GOOD, META)
    shutil.rmtree(store.root / leftover, ignore_errors=True)
    os.symlink(work, store.root / leftover)
    (store.root / K[:2] / K / "kernel.cubin").write_bytes(b"damaged")  # a removal goes through .trash
    with pytest.warns(CacheWarning, match="damaged"):
        assert store.get(K) is None
    store.prune(max_bytes=0)
    store.clear()
    assert snapshot(work) == before


def test_clear_removes_only_entries(tmp_path):
    store = Store(tmp_path / "cache")
    store.put(K, GOOD, META)
    (store.root / K[:2] / "README").write_text("mine")
    (store.root / "autotune").mkdir()
    (store.root / "autotune" / "result.json").write_text("{}")
    assert [i.key for i in store.clear()] == [K]
    assert (store.root / K[:2] / "README").read_text() == "mine" and (store.root / "autotune" / "result.json").exists()


# ---------------------------------------------------------------- item 7: what is at an entry's place


def _rewrite(path, change) -> None:
    rec = json.loads((path / "meta.json").read_text())
    change(rec)
    rec["digest"] = _digest(rec)
    (path / "meta.json").write_text(json.dumps(rec))


@pytest.mark.parametrize("damage", ["meta-dir", "entry-file", "shard-file", "fifo"])
def test_what_replaces_an_entry_is_a_miss_that_heals(tmp_path, damage):
    store = Store(tmp_path / "cache")
    e = store.put(K, GOOD, META)
    if damage == "meta-dir":
        (e.path / "meta.json").unlink()
        (e.path / "meta.json").mkdir()
    elif damage == "entry-file":
        shutil.rmtree(e.path)
        e.path.write_text("x")
    elif damage == "shard-file":
        shutil.rmtree(e.path.parent)
        e.path.parent.write_text("x")
    else:
        (e.path / "kernel.cubin").unlink()
        os.mkfifo(e.path / "kernel.cubin")
    with pytest.warns(CacheWarning) as rec:
        assert store.get(K) is None
        assert store.get(K) is None
    assert len(rec) == 1
    assert store.put(K, GOOD, META).path == e.path
    assert store.get(K).read("kernel.cubin") == GOOD["kernel.cubin"]


def test_an_entry_lacking_what_the_reader_needs_is_a_miss(tmp_path):
    from mgjit.cache import Wanted
    store = Store(tmp_path / "cache")
    e = store.put(K, GOOD, {**META, "registers": 32})

    def check(meta):
        if type(meta["registers"]) is not int:
            raise ValueError("registers")

    wanted = Wanted(META, ("kernel.cubin", "kernel.ptx"), check)
    assert store.get(K, wanted=wanted) is not None
    _rewrite(e.path, lambda rec: rec["meta"].pop("registers"))
    with pytest.warns(CacheWarning, match=r"does not fit this mgjit \(KeyError: 'registers'\)"):
        assert store.get(K, wanted=wanted) is None
    e = store.put(K, GOOD, {**META, "registers": 32})
    _warn._warned.clear()  # a damaged key warns once per process
    (e.path / "kernel.ptx").unlink()
    _rewrite(e.path, lambda rec: rec["files"].pop("kernel.ptx"))
    with pytest.warns(CacheWarning, match="it has no kernel.ptx"):
        assert store.get(K, wanted=wanted) is None


def compile_fresh():
    """Compile through a new kernel object, as a new process would: only the disk cache can answer."""
    torch = pytest.importorskip("torch")
    import mgjit

    @mgjit.kernel
    def add_two(x, out, BLOCK: mgjit.constexpr):
        out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)] + 2.0

    x = torch.zeros(256)
    return add_two.compile(x, x, BLOCK=256, target="sm_90a")


@pytest.mark.parametrize("damage", ["no-mlir-file", "no-registers", "no-params", "bad-dtype", "bool-threads",
                                    "tma-names-nothing"])
def test_an_entry_of_another_build_is_a_miss_not_a_crash(tmp_path, monkeypatch, damage):
    """A consistent entry (checksums and digest right) lacking a file or a field that this mgjit reads used to
    crash every run with a bare KeyError until the cache was cleared."""
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path / "cache"))
    first = compile_fresh()
    path = tmp_path / "cache" / first.key[:2] / first.key

    def change(rec):
        meta = rec["meta"]
        if damage == "no-mlir-file":
            rec["files"].pop("kernel.mlir")
            (path / "kernel.mlir").unlink()
        elif damage == "no-registers":
            meta.pop("registers")
        elif damage == "no-params":
            meta.pop("params")
        elif damage == "bad-dtype":
            meta["params"][0]["dtype"] = "float128"
        elif damage == "bool-threads":
            meta["threads"] = True
        else:
            meta["tma"] = [{"param": 7, "box": [64], "swizzle": 128}]

    _rewrite(path, change)
    with pytest.warns(CacheWarning, match="damaged entry") as rec:
        again = compile_fresh()
    assert len(rec) == 1 and not again.from_cache and again.cubin == first.cubin
    assert compile_fresh().from_cache  # healed: the recompiled entry replaced the damaged one


def test_the_command_line_does_not_clear_a_refused_directory(tmp_path, capsys):
    import io
    from mgjit.cache.cli import main
    work = victim_files(tmp_path)
    before = snapshot(work)
    Store(tmp_path / "xdg" / "mgjit").put(K, GOOD, META)  # the fallback holds an entry: it is not cleared either
    out = io.StringIO()
    with pytest.warns(CacheWarning, match="not using"):
        assert main(["--dir", str(work), "clear"], out=out) == 1
    assert f"not clearing or pruning {work}" in out.getvalue()
    assert snapshot(work) == before and Store(tmp_path / "xdg" / "mgjit").get(K) is not None

"""A seeded, bounded mutation fuzzer for cache entries (issue 14): 10,000 mutated entries, each read back the
way the compiler reads one (`compiler.load_cached`: records, checksums, the files and fields it needs).

Mutations, one to three per entry, over every file of an entry and the entry's and shard's directories: byte
flips, truncations, extensions, removed and added files, removed and added JSON fields, JSON type changes
(with the record's digest recomputed half the time, as an entry of another build would be), a file, link,
FIFO or directory in place of another, links to a planted, self-consistent entry holding another kernel, hard
links, permission changes. Every read must be a miss, or a hit on the intact kernel, with at most one
warning and no exception; and every tenth mutated entry must heal (the next put and get return the intact
kernel). No ptxas or MLIR runs: the entries are written in-process, so this takes seconds.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import warnings
from pathlib import Path

import pytest
from mgjit import compiler
from mgjit.cache import _warn, safefs
from mgjit.cache.records import _digest
from mgjit.cache.store import Store, hash_parts

SEED = 20261125
COUNT = 10_000
KEY = hash_parts("fuzz", 1)


def kernel_meta(threads: int, dtype: str) -> dict:
    """The meta of a compiled kernel, with every field `compiler.check_meta` reads."""
    from mgjit._version import VERSION
    return {"name": "fuzzed", "target": "sm_90a", "mgjit_version": VERSION, "specialization": ["x", dtype, 256],
            "params": [{"kind": "tensor", "rank": 1, "mlir": "f32", "dtype": dtype, "name": "x"},
                       {"kind": "scalar", "rank": 0, "mlir": "i32", "dtype": "int32", "name": "n"}],
            "registers": 32, "spills": 0, "smem_bytes": 0, "threads": threads, "num_warpgroups": 1,
            "cluster": [1, 1, 1], "tma": [{"param": 0, "box": [64], "swizzle": 128}], "warnings": [],
            "compile_seconds": 0.5}


def kernel_files(tag: bytes) -> dict[str, bytes]:
    return {name: tag + b":" + name.encode() + bytes(range(256)) * 2 for name in compiler.ARTIFACTS}


# Fields nothing reads to load or launch a kernel (`python -m mgjit.cache list` shows them, ptxas' warnings
# are shown when present).
DESCRIPTIVE = ("specialization", "compile_seconds", "warnings")
# What the compiler derives from the call's specialization (compiler.spec_meta) and asks an entry to hold.
EXPECTED = ("name", "target", "mgjit_version", "specialization", "params", "num_warpgroups", "cluster")
GOOD_FILES, GOOD_META = kernel_files(b"intact"), kernel_meta(128, "float32")
EVIL_FILES, EVIL_META = kernel_files(b"planted"), kernel_meta(384, "float16")


class Fuzzer:
    def __init__(self, tmp: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.tmp = tmp
        self.store = Store(tmp / "cache")
        self.store.put(KEY, GOOD_FILES, GOOD_META)
        self.entry = self.store.root / KEY[:2] / KEY
        self.pristine = {p.name: p.read_bytes() for p in self.entry.iterdir()}
        self.evil = Store(tmp / "attacker").put(KEY, EVIL_FILES, EVIL_META).path
        self.chmodded = False
        self.outside = tmp / "outside"
        self.outside.mkdir()
        for name, data in self.pristine.items():
            (self.outside / name).write_bytes(data)

    # -- the entry, fresh for each mutation
    def lay_out(self) -> None:
        self.entry.parent.mkdir(exist_ok=True)
        self.entry.mkdir()
        for name, data in self.pristine.items():
            (self.entry / name).write_bytes(data)

    def clean(self) -> None:
        """Restore permissions and remove whatever the mutation and the read left at the shard's place."""
        shard = self.entry.parent
        if shard.is_symlink() or (os.path.lexists(shard) and not shard.is_dir()):
            shard.unlink()
            return
        if not os.path.lexists(shard):
            return
        if self.chmodded:
            for p in [shard, *shard.rglob("*")]:
                if not p.is_symlink():
                    os.chmod(p, 0o700 if p.is_dir() else 0o600)
            self.chmodded = False
        shutil.rmtree(shard)

    # -- mutations
    def targets(self) -> list[str]:
        """What is left to mutate: never through a link planted by an earlier mutation (that would alter the
        planted entry, not ours)."""
        shard = self.entry.parent
        if shard.is_symlink() or not shard.is_dir():
            return []
        if self.entry.is_symlink() or not self.entry.is_dir():
            return ["<shard>"]
        return sorted(os.listdir(self.entry)) + ["<entry>", "<shard>"]

    def mutate(self) -> str:
        targets = self.targets()
        if not targets:
            return "nothing left to mutate"
        target = self.rng.choice(targets)
        if target == "<entry>":
            return self.mutate_dir(self.entry, "entry")
        if target == "<shard>":
            return self.mutate_dir(self.entry.parent, "shard")
        if target == "meta.json" and self.rng.random() < 0.5:
            return self.mutate_json()
        return self.mutate_file(self.entry / target)

    def mutate_file(self, path: Path) -> str:
        rng, name = self.rng, path.name
        if path.is_symlink() or not path.is_file():
            return f"{name}: left alone (not a file)"
        data = path.read_bytes()
        kind = rng.choice(["flip", "truncate", "extend", "remove", "dir", "link-planted", "link-same", "link-loop",
                           "hardlink-same", "hardlink-planted", "fifo", "chmod", "swap"])
        if kind == "flip" and data:
            i = rng.randrange(len(data))
            _replace(path, data[:i] + bytes([data[i] ^ rng.randrange(1, 256)]) + data[i + 1:])
        elif kind == "truncate":
            _replace(path, data[:rng.randrange(len(data) + 1)])
        elif kind == "extend":
            _replace(path, data + rng.randbytes(rng.randrange(1, 64)))
        elif kind == "remove":
            path.unlink()
        elif kind == "dir":
            path.unlink()
            path.mkdir()
            (path / "inner").write_bytes(b"x")
        elif kind.startswith("link") or kind.startswith("hardlink"):
            source = {"planted": self.evil / name, "same": self.outside / name}.get(kind.split("-")[1], path)
            path.unlink()
            if kind.startswith("hardlink"):
                try:
                    os.link(source, path)
                except OSError:  # some sandboxes refuse hard links: the file is then just removed
                    kind += " (refused)"
            else:
                os.symlink(source, path)
        elif kind == "fifo":
            path.unlink()
            os.mkfifo(path)
        elif kind == "chmod":
            _replace(path, data)  # a file of its own (not one hard-linked from elsewhere)
            os.chmod(path, rng.choice([0, 0o200, 0o777]))
            self.chmodded = True
        elif kind == "swap":  # another file's content under this name
            _replace(path, self.pristine[rng.choice(sorted(self.pristine))])
        return f"{name}: {kind}"

    def mutate_json(self) -> str:
        path = self.entry / "meta.json"
        if path.is_symlink() or not path.is_file():
            return "meta.json: left alone (not a file)"
        try:
            rec = json.loads(path.read_bytes())
        except ValueError:  # already damaged by an earlier mutation
            return self.mutate_file(path)
        rng = self.rng
        nodes = list(_nodes(rec))
        parent, k = rng.choice(nodes)
        kind = rng.choice(["remove", "add", "type", "value"])
        if kind == "remove":
            del parent[k]
        elif kind == "add":
            target = parent[k] if isinstance(parent[k], (dict, list)) else parent
            value = rng.choice([0, "x", None, [], {}, 1.5, True])
            if isinstance(target, dict):
                target[f"extra{rng.randrange(9)}"] = value
            else:
                target.insert(rng.randrange(len(target) + 1), value)
        elif kind == "type":
            parent[k] = rng.choice([v for v in (0, -1, "32", None, [], {}, 1.0, True, [1, 2], {"a": 1})
                                    if type(v) is not type(parent[k])])
        else:
            v = parent[k]
            parent[k] = (v + 1 if type(v) is int else v + "x" if isinstance(v, str) else not v
                         if isinstance(v, bool) else v)
        # Half the time the record stays consistent: an entry written by another build (fields missing, added
        # or of another type), not damage. A value changed under a recomputed digest is a forgery of our own
        # records, which the key alone guards.
        # Removing or adding a list item under a recomputed digest (a TMA descriptor less) is forgery too.
        consistent = kind != "value" and isinstance(parent, dict) and rng.random() < 0.5
        if consistent and isinstance(rec, dict):
            try:
                rec["digest"] = _digest(rec)
            except (TypeError, ValueError):
                pass
        _replace(path, json.dumps(rec).encode())
        return f"meta.json: {kind} {k!r}{' (consistent)' if consistent else ''}"

    def mutate_dir(self, path: Path, what: str) -> str:
        rng = self.rng
        kind = rng.choice(["file", "link-planted", "chmod", "extra-file", "extra-dir", "empty"])
        if what == "shard" and kind in ("extra-file", "extra-dir", "empty"):
            kind = "extra-file"
        if path.is_symlink() or not path.is_dir():
            return f"{what}: left alone"
        if kind == "file":
            self.clean_dir(path)
            path.write_bytes(b"not a directory")
        elif kind == "link-planted":
            self.clean_dir(path)
            os.symlink(self.evil if what == "entry" else self.evil.parent, path)
        elif kind == "chmod":
            os.chmod(path, rng.choice([0, 0o500, 0o777]))
            self.chmodded = True
        elif kind == "extra-file":
            (path / rng.choice(["kernel.sass", "x", KEY[:2] + "0" * 62])).write_bytes(b"extra")
        elif kind == "extra-dir":
            (path / "nested").mkdir(exist_ok=True)
        else:
            self.clean_dir(path)
            path.mkdir()
        return f"{what}: {kind}"

    def clean_dir(self, path: Path) -> None:
        for p in path.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        path.rmdir()

    # -- one mutated entry
    def read(self):
        _warn._warned.clear()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            compiled = compiler.load_cached(self.store, KEY, {k: GOOD_META[k] for k in EXPECTED})
            if self.rng.random() < 0.1:
                self.store.entries(with_meta=True)  # what `python -m mgjit.cache list` does
        return compiled, seen

    def intact(self, compiled) -> bool:
        """The intact kernel: its files, and every field of its meta as written. An entry of another build
        (consistent, see mutate_json) may add fields, or lack ones that only describe the kernel."""
        good = json.loads(json.dumps(GOOD_META))
        return compiled.files == GOOD_FILES and all(
            k in DESCRIPTIVE if k not in compiled.meta else k in DESCRIPTIVE or _covers(compiled.meta[k], v)
            for k, v in good.items())


def _replace(path: Path, data: bytes) -> None:
    """New content under `path`, never written through a hard link into the file it shares."""
    path.unlink()
    path.write_bytes(data)


def _covers(got, good) -> bool:
    """`got` holds `good`: the same values and types, where dicts may carry more keys."""
    if isinstance(good, dict):
        return isinstance(got, dict) and all(k in got and _covers(got[k], v) for k, v in good.items())
    if isinstance(good, list):
        return isinstance(got, list) and len(got) == len(good) and all(map(_covers, got, good))
    return type(got) is type(good) and got == good


def _nodes(x, depth=0):
    """(container, key) of every value in a JSON document."""
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        yield x, k
        if depth < 4:
            yield from _nodes(v, depth + 1)


def test_ten_thousand_mutated_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(safefs.os, "fsync", lambda fd: None)  # durability is not under test: speed is
    fuzz = Fuzzer(tmp_path, SEED)
    outcomes = {"miss": 0, "hit": 0, "warned": 0}
    for i in range(COUNT):
        fuzz.clean()
        fuzz.lay_out()
        done = [fuzz.mutate() for _ in range(fuzz.rng.choice([1, 1, 1, 2, 3]))]
        where = f"seed {SEED}, entry {i}: {'; '.join(done)}"
        try:
            compiled, seen = fuzz.read()
        except Exception as e:  # noqa: BLE001 - any exception is the failure this test looks for
            pytest.fail(f"{where}: {type(e).__name__}: {e}")
        assert len(seen) <= 1, f"{where}: {len(seen)} warnings: {[str(w.message) for w in seen]}"
        assert compiled is None or fuzz.intact(compiled), f"{where}: a hit on another kernel: {compiled.meta}"
        outcomes["miss" if compiled is None else "hit"] += 1
        outcomes["warned"] += len(seen)
        if i % 10 == 0:  # the damage heals: the next compile publishes and the one after hits
            fuzz.clean()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fuzz.store.put(KEY, GOOD_FILES, GOOD_META)
            compiled, seen = fuzz.read()
            assert compiled is not None and fuzz.intact(compiled) and not seen, f"{where}: did not heal"
    # The mutations reached both outcomes and the warnings: the fuzzer is not vacuous.
    assert outcomes["miss"] > COUNT // 2 and outcomes["hit"] > 0 and outcomes["warned"] > COUNT // 2, outcomes
    planted = Store(tmp_path / "attacker").get(KEY)
    assert planted is not None and planted.read("kernel.cubin") == EVIL_FILES["kernel.cubin"]  # never deleted


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_short_runs_of_other_seeds(tmp_path, monkeypatch, seed):
    """A few hundred entries under other seeds, so that a failure is not an accident of one sequence."""
    monkeypatch.setattr(safefs.os, "fsync", lambda fd: None)
    fuzz = Fuzzer(tmp_path, seed)
    for i in range(300):
        fuzz.clean()
        fuzz.lay_out()
        done = [fuzz.mutate() for _ in range(fuzz.rng.choice([1, 2, 3]))]
        compiled, seen = fuzz.read()
        assert len(seen) <= 1 and (compiled is None or fuzz.intact(compiled)), f"seed {seed}, {i}: {done}"
    assert stat.S_IMODE(os.stat(fuzz.store.root).st_mode) == 0o700

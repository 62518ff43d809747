"""Many processes writing, reading and evicting one store at once.

Each writer puts content unique to itself (its index is in the files and in meta), so a check that an
entry's files all come from the writer named in its meta catches any mixing of two writers' entries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from mgjit.cache import _warn
from mgjit.cache.store import CacheWarning, Store, hash_parts

N = 16

# Shared by the test and the child processes (run as `python -c`, so the test module need not be importable).
COMMON = '''
import hashlib

def payload(key, writer):
    seed = hashlib.sha256(f"{key}:{writer}".encode()).digest()
    return {
        "kernel.cubin": seed * 4096,  # 128 KiB: big enough that writes overlap
        "kernel.ptx": b"// writer %d\\n" % writer * 1000,
        "ptxas.txt": b"ptxas: writer %d" % writer,
    }

def check(entry):
    """The entry is whole and all of it comes from the writer its meta names."""
    writer = entry.meta["writer"]
    for name, data in payload(entry.key, writer).items():
        assert entry.read(name) == data, (entry.key, name, writer)
'''

CHILD = (
    COMMON
    + """
import json, os, sys, time, warnings
warnings.simplefilter("error")  # a damaged entry seen by anyone fails the test
from mgjit.cache.store import Store

root, index, ready, go, max_bytes = sys.argv[1:6]
mine, others = json.loads(sys.argv[6]), json.loads(sys.argv[7])
index = int(index)
store = Store(root, max_bytes=int(max_bytes))
open(os.path.join(ready, str(index)), "w").close()
while not os.path.exists(go):
    time.sleep(0.0005)
paths, hits = [], 0
for key in mine:
    entry = store.put(key, payload(key, index), {"name": "k", "writer": index})
    assert entry.path is not None, "put fell back to memory"
    check(entry)
    paths.append(str(entry.path))
    for other in others:
        got = store.get(other)
        if got is not None:
            check(got)
            hits += 1
print(json.dumps({"paths": paths, "hits": hits}))
"""
)

namespace: dict = {}
exec(COMMON, namespace)
payload, check = namespace["payload"], namespace["check"]


@pytest.fixture(autouse=True)
def strict_warnings():
    _warn._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        yield


def run_children(
    tmp_path: Path, plan: list[tuple[list[str], list[str]]], max_bytes: int = 1 << 30, read_keys: list[str] = ()
) -> list[dict]:
    """Start one child per (keys to put, keys to get) in `plan`, release them at once, and meanwhile read
    `read_keys` in this process. Returns the children's reports."""
    root, ready, go = tmp_path / "cache", tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "MGJIT_CACHE_REDIS"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                str(root),
                str(i),
                str(ready),
                str(go),
                str(max_bytes),
                json.dumps(mine),
                json.dumps(others),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i, (mine, others) in enumerate(plan)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(ready)) < len(procs):
            assert time.monotonic() < deadline, "children did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.005)
        go.touch()
        reader = Store(root, max_bytes=max_bytes)
        reads = 0
        while any(p.poll() is None for p in procs):
            for k in read_keys:
                got = reader.get(k)
                if got is not None:
                    check(got)
                    reads += 1
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    return [json.loads(out) for out, _ in outputs]


def entry_dirs(root: Path) -> list[Path]:
    return [d for shard in root.iterdir() if len(shard.name) == 2 for d in shard.iterdir()]


def test_same_key_from_16_processes_gives_one_valid_entry(tmp_path):
    k = hash_parts("same key")
    reports = run_children(tmp_path, [([k], [k])] * N, read_keys=[k])
    root = tmp_path / "cache"
    assert entry_dirs(root) == [root / k[:2] / k]
    assert all(r["paths"] == [str(root / k[:2] / k)] for r in reports)
    assert list((root / ".tmp").iterdir()) == []
    entry = Store(root).get(k)
    check(entry)
    assert 0 <= entry.meta["writer"] < N


def test_different_keys_from_16_processes_all_land(tmp_path):
    keys = [[hash_parts("key", i, j) for j in range(3)] for i in range(N)]
    everyone = [k for ks in keys for k in ks]
    reports = run_children(tmp_path, [(ks, everyone[::5]) for ks in keys], read_keys=everyone)
    root = tmp_path / "cache"
    assert sorted(d.name for d in entry_dirs(root)) == sorted(everyone)
    assert list((root / ".tmp").iterdir()) == []
    store = Store(root)
    for i, ks in enumerate(keys):
        for k in ks:
            entry = store.get(k)
            check(entry)
            assert entry.meta["writer"] == i
    assert sum(r["hits"] for r in reports) > 0  # the readers did overlap with the writers


def test_concurrent_eviction_never_serves_a_partial_entry(tmp_path):
    # A limit of ~6 entries for 48: every put evicts while others read, so readers race removals.
    entry_size = len(b"".join(payload("x" * 64, 0).values())) + 600
    limit = 6 * entry_size
    keys = [[hash_parts("evict", i, j) for j in range(3)] for i in range(N)]
    everyone = [k for ks in keys for k in ks]
    run_children(tmp_path, [(ks, everyone[i::4]) for i, ks in enumerate(keys)], max_bytes=limit, read_keys=everyone)
    store = Store(tmp_path / "cache", max_bytes=limit)
    left = store.entries()
    assert 0 < len(left) < len(everyone)
    for info in left:
        check(store.get(info.key))
    # Each process enforces the limit from its own running total, so the store may overshoot a little
    # while they race; a prune settles it.
    store.prune()
    assert sum(i.size for i in store.entries()) <= limit
    assert list((tmp_path / "cache" / ".trash").iterdir()) == []

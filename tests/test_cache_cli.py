"""`python -m mgjit.cache`: list, stats, clear, prune."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest
from mgjit.cache import _warn
from mgjit.cache.cli import human_size, main
from mgjit.cache.store import Store, hash_parts


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("MGJIT_CACHE_DIR", "MGJIT_CACHE_MAX_BYTES", "MGJIT_CACHE_REDIS"):
        monkeypatch.delenv(var, raising=False)
    _warn._warned.clear()


def fill(root, n: int, days_ago=None) -> list[str]:
    """Put n kernels; entry i was last used days_ago[i] days ago (default: i minutes ago)."""
    store = Store(root)
    keys = []
    now = time.time()
    for i in range(n):
        k = hash_parts("cli", i)
        e = store.put(
            k,
            {"kernel.cubin": bytes([i]) * 10_000, "kernel.ptx": b"// ptx\n", "ptxas.txt": b"ok\n"},
            {
                "name": f"matmul_{i}",
                "target": "sm_90a",
                "specialization": {"BM": 128, "dtype": "bf16", "i": i},
                "mgjit_version": "0.1.0",
            },
        )
        t = now - (days_ago[i] * 86400 if days_ago else i * 60)
        os.utime(e.path / "meta.json", (t, t))
        keys.append(k)
    return keys


def run(*argv: str) -> str:
    out = io.StringIO()
    assert main(list(argv), out=out) == 0
    return out.getvalue()


def test_list_shows_name_specialization_target_size_last_use(tmp_path):
    keys = fill(tmp_path, 3)
    lines = run("--dir", str(tmp_path), "list").splitlines()
    assert lines[0].split() == ["KEY", "NAME", "TARGET", "SIZE", "LAST", "USE", "SPECIALIZATION"]
    assert len(lines) == 4
    infos = {i.key: i for i in Store(tmp_path).entries()}
    # most recently used first
    for line, i in zip(lines[1:], range(3), strict=True):
        info = infos[keys[i]]
        assert line.startswith(keys[i][:12])
        assert f"matmul_{i}" in line
        assert f'{{"BM":128,"dtype":"bf16","i":{i}}}' in line
        assert "sm_90a" in line and human_size(info.size) in line and "KiB" in line
        assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.last_used)) in line
        assert line.endswith(f'{{"BM":128,"dtype":"bf16","i":{i}}}')  # whole, however long


def test_list_marks_damaged_entries(tmp_path):
    keys = fill(tmp_path, 2)
    (tmp_path / keys[1][:2] / keys[1] / "meta.json").write_text("{broken")
    out = run("--dir", str(tmp_path), "list")
    damaged = [line for line in out.splitlines() if line.startswith(keys[1][:12])]
    assert len(damaged) == 1 and "(damaged)" in damaged[0]
    assert "matmul_0" in out


def test_list_of_an_empty_store(tmp_path):
    assert run("--dir", str(tmp_path / "none"), "list") == f"no entries in {tmp_path / 'none'}\n"


def test_stats(tmp_path, monkeypatch):
    fill(tmp_path, 3)
    monkeypatch.setenv("MGJIT_CACHE_MAX_BYTES", "500M")
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    out = run("stats")
    total = sum(i.size for i in Store(tmp_path).entries())
    assert f"directory: {tmp_path}\n" in out
    assert "entries:   3\n" in out
    assert f"size:      {human_size(total)} ({total} bytes)\n" in out
    assert f"limit:     500.0 MiB ({500 << 20} bytes)\n" in out
    assert "redis:     not configured\n" in out


def test_clear(tmp_path):
    fill(tmp_path, 3)
    assert run("--dir", str(tmp_path), "clear").startswith("removed 3 entries (")
    assert Store(tmp_path).entries() == []
    assert "entries:   0" in run("--dir", str(tmp_path), "stats")


def test_prune_to_max_bytes_drops_least_recently_used(tmp_path):
    keys = fill(tmp_path, 4)  # entry 3 is the least recently used
    size = max(i.size for i in Store(tmp_path).entries())
    out = run("--dir", str(tmp_path), "prune", "--max-bytes", str(2 * size))
    assert out.startswith("removed 2 entries (")
    assert {i.key for i in Store(tmp_path).entries()} == {keys[0], keys[1]}


def test_prune_with_size_suffix(tmp_path):
    fill(tmp_path, 4)
    run("--dir", str(tmp_path), "prune", "--max-bytes", "15K")
    assert len(Store(tmp_path).entries()) == 1


def test_prune_older_than_days(tmp_path):
    keys = fill(tmp_path, 4, days_ago=[0, 3, 10, 40])
    out = run("--dir", str(tmp_path), "prune", "--older-than", "7")
    assert out.startswith("removed 2 entries (") and "; kept 2 entries (" in out
    assert {i.key for i in Store(tmp_path).entries()} == {keys[0], keys[1]}


def test_prune_without_options_enforces_the_configured_limit(tmp_path, monkeypatch):
    keys = fill(tmp_path, 3)
    monkeypatch.setenv("MGJIT_CACHE_MAX_BYTES", "12K")
    run("--dir", str(tmp_path), "prune")
    assert [i.key for i in Store(tmp_path).entries()] == [keys[0]]


def test_bad_arguments_exit_2(tmp_path, capsys):
    for argv in (["prune", "--max-bytes", "lots"], ["prune", "--older-than", "x"], ["frobnicate"], []):
        with pytest.raises(SystemExit) as exc:
            main(["--dir", str(tmp_path), *argv])
        assert exc.value.code == 2


def test_python_dash_m(tmp_path):
    keys = fill(tmp_path, 2)
    env = {**os.environ, "MGJIT_CACHE_DIR": str(tmp_path)}
    env.pop("MGJIT_CACHE_REDIS", None)
    out = subprocess.run(
        [sys.executable, "-m", "mgjit.cache", "list"], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert keys[0][:12] in out and "matmul_1" in out
    help_text = subprocess.run(
        [sys.executable, "-m", "mgjit.cache", "--help"], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    for cmd in ("list", "stats", "clear", "prune"):
        assert cmd in help_text

"""Stand-ins for the compiler core that the autotuner tests drive: a kernel with the `mgjit.kernel`
interface whose compile obeys made-up static rules and ptxas numbers and keeps a disk cache, and a timer
that returns a time per config and counts its calls. Shared by the tests/test_autotune_*.py modules."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from mgjit.errors import CompileError

SMEM_LIMIT = 227 * 1024  # bytes of shared memory a Hopper block may use


@dataclass(frozen=True)
class FakeCompiled:
    name: str
    key: str
    target: str
    registers: int
    spills: int
    smem_bytes: int
    threads: int


class FakeKernel:
    """`matmul(a, b, c, M, N, K, BM, BN, BK, STAGES)`-like kernel. Its compile raises CompileError for a
    config over the shared-memory budget, reports spills for BN == 512 and an optional `registers` table,
    and caches results as JSON files in `cache_dir` (the transport between forked compile workers and the
    parent, as the real disk cache is). A launch runs `body(named_args, config)` and records the config."""

    def __init__(self, cache_dir: Path, *, name: str = "matmul",
                 arg_names: tuple[str, ...] = ("a", "b", "c", "M", "N", "K", "BM", "BN", "BK", "STAGES"),
                 constexpr_names: tuple[str, ...] = ("BM", "BN", "BK", "STAGES"),
                 body=None, source: str = "v1", registers=None, crash_on=None):
        self.name = name
        self.arg_names = list(arg_names)
        self.constexpr_names = list(constexpr_names)
        self.cache_dir = Path(cache_dir)
        self.body = body
        self.source = source
        self.registers = registers or (lambda constexprs, num_warpgroups: 128)
        self.crash_on = crash_on  # constexprs dict on which compile raises a non-CompileError
        self.misses = 0  # compiles done in this process (children's are counted in their cache files)
        self.hits = 0
        self.launches: list[tuple[dict, int, tuple, object]] = []  # (constexprs, warpgroups, cluster, grid)

    def source_key(self) -> str:
        return hashlib.sha256(f"{self.name}:{self.source}".encode()).hexdigest()

    def _bind(self, args, kwargs) -> tuple[dict, dict]:
        """Like the core: positional arguments bind to the parameters in order, the rest by name, all
        required (this fake has no defaults). Returns (runtime values by name, constexprs)."""
        if len(args) > len(self.arg_names):
            raise TypeError(f"{self.name}: {len(args)} positional arguments for {len(self.arg_names)} parameters")
        bound = dict(zip(self.arg_names, args, strict=False))
        for name, value in kwargs.items():
            if name not in self.arg_names or name in bound:
                raise TypeError(f"{self.name}: unexpected or repeated argument {name!r}")
            bound[name] = value
        if set(bound) != set(self.arg_names):
            raise TypeError(f"{self.name}: missing {sorted(set(self.arg_names) - set(bound))}")
        return ({n: v for n, v in bound.items() if n not in self.constexpr_names},
                {n: v for n, v in bound.items() if n in self.constexpr_names})

    def compile(self, *args, target=None, num_warpgroups=None, cluster=None, **kwargs) -> FakeCompiled:
        runtime, constexprs = self._bind(args, kwargs)
        target = target or "sm_90a"
        num_warpgroups = num_warpgroups or 1  # the kernel's default
        spec = [str(getattr(a, "dtype", type(a).__name__)) for a in runtime.values()]
        key = hashlib.sha256(json.dumps([self.source_key(), spec, sorted(constexprs.items()),
                                         num_warpgroups, cluster, target]).encode()).hexdigest()[:24]
        path = self.cache_dir / f"{key}.json"
        if path.exists():
            self.hits += 1
            entry = json.loads(path.read_text())
            return FakeCompiled(**entry["compiled"])
        if self.crash_on is not None and all(constexprs.get(k) == v for k, v in self.crash_on.items()):
            raise ValueError(f"internal compiler error on {constexprs}")
        self.misses += 1
        smem = (constexprs["BM"] + constexprs["BN"]) * constexprs["BK"] * 2 * constexprs["STAGES"]
        if smem > SMEM_LIMIT:
            raise CompileError(f"kernel needs {smem} bytes of shared memory, the limit is {SMEM_LIMIT}",
                               rule="smem-budget")
        compiled = FakeCompiled(self.name, key, target, self.registers(constexprs, num_warpgroups),
                                64 if constexprs["BN"] == 512 else 0, smem, 128 * num_warpgroups)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "compiled": compiled.__dict__}))
        os.replace(tmp, path)
        return compiled

    def compiled_by_pid(self) -> list[int]:
        return [json.loads(p.read_text())["pid"] for p in self.cache_dir.glob("*.json")]

    def __getitem__(self, grid):
        def launch(*args, num_warpgroups=None, cluster=None, **kwargs):
            runtime, constexprs = self._bind(args, kwargs)
            self.launches.append((constexprs, num_warpgroups, cluster, grid))
            if self.body is not None:
                self.body(runtime, constexprs)

        return launch


class FakeTimer:
    """Times a config by looking it up: `times(config) -> ms`. It launches the run `runs` times (as a
    real timer launches many) and reads which config the kernel actually launched, so a run that does not
    launch its config is caught. Counts its calls."""

    def __init__(self, kernel: FakeKernel, times, device: str = "fake-gpu", runs: int = 3):
        self.kernel = kernel
        self.times = times
        self.device = device
        self.runs = runs
        self.calls = 0
        self.timed: list = []

    def __call__(self, run) -> float:
        self.calls += 1
        for _ in range(self.runs):
            run()
        constexprs, num_warpgroups, cluster, _ = self.kernel.launches[-1]
        launched = ({k: constexprs[k] for k in run.config.kwargs}, num_warpgroups, cluster)
        expected = (dict(run.config.kwargs), run.config.num_warpgroups, run.config.cluster)
        assert launched == expected, f"run launched {launched}, not {run.config}"
        self.timed.append(run.config)
        return self.times(run.config)


@pytest.fixture
def cache_dirs(tmp_path, monkeypatch):
    """A fresh kernel cache (fake) and autotune store for each test."""
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path / "mgjit-cache"))
    monkeypatch.setenv("MGJIT_AUTOTUNE_QUIET", "1")
    return tmp_path

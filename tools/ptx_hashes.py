"""PTX hashes of every kernel the CPU test suite and the examples compile, for sm_90a and sm_100a.

A restructure of the compiler must not change what it emits. This script records, for every fresh compile
that happens while the CPU test suite runs (and for every example's kernel), the SHA-256 of the PTX for the
target asked for and for the other target too (and of the IR, with its layouts and source lines, that the PTX
was lowered from), and compares two such records:

    python tools/ptx_hashes.py record before.json        # on the old tree
    python tools/ptx_hashes.py record after.json         # on the new tree
    python tools/ptx_hashes.py compare before.json after.json

A record is keyed by (test, kernel, n-th compile of that kernel in that test, target). Where the PTX could not
be produced the record holds the error's type and first line instead. Compiles in child processes (the
autotuner's workers, the examples run as scripts) are not seen; the examples are compiled here directly.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.util
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# This checkout's mgjit, not the one an editable install points at (the last `pip install -e`: a CI clone's after
# .ci/run), which a record of another tree would silently measure instead.
sys.path.insert(0, str(ROOT))
TARGETS = ("sm_90a", "sm_100a")
EXAMPLES = ("vector_add", "softmax", "rmsnorm", "matmul_hopper", "matmul_blackwell")


def _compile_entry():
    """(owner, attribute) of the function that compiles one specialization afresh, in this tree's layout, and
    a function mapping that entry's arguments to (kernel name, target, a call with another target)."""
    try:
        import mgjit.compiler as owner  # compile_specialization(source, spec: Specialization, key)
        import dataclasses
        owner.compile_specialization

        def with_target(args, kwargs, target):
            return (args[0], dataclasses.replace(args[1], target=target), *args[2:]), kwargs

        def target_of(args, kwargs):
            return args[1].target

        return owner, "compile_specialization", with_target, target_of
    except AttributeError:
        from mgjit.jit import Kernel  # the tree before the restructure: Kernel._compile_fresh(key, spec, consts, target, ...)

        def with_target(args, kwargs, target):
            return args[:4] + (target,) + args[5:], kwargs

        def target_of(args, kwargs):
            return args[4]

        return Kernel, "_compile_fresh", with_target, target_of


class Recorder:
    def __init__(self):
        self.records: dict[str, str] = {}
        self.counts: collections.Counter = collections.Counter()
        self.last_ptx: str | None = None
        self.context = "examples"

    def install(self) -> None:
        import mgjit.mlir as mlir_shim
        original_to_ptx = mlir_shim.to_ptx

        def to_ptx(module):
            self.last_ptx = original_to_ptx(module)
            return self.last_ptx

        mlir_shim.to_ptx = to_ptx
        owner, name, with_target, target_of = _compile_entry()
        original = getattr(owner, name)
        recorder = self

        def compile_both(*args, **kwargs):
            asked = target_of(args, kwargs)
            result, error = None, None
            for target in (asked, *[t for t in TARGETS if t != asked]):
                a, k = with_target(args, kwargs, target)
                recorder.last_ptx = None
                try:
                    out = original(*a, **k)
                    outcome = None
                except Exception as e:  # recorded, and raised again for the target the caller asked for
                    out, outcome = None, e
                recorder.note(_kernel_name(args), target, outcome, _ir_text(out))
                if target == asked:
                    result, error = out, outcome
            if error is not None:
                raise error
            return result

        setattr(owner, name, compile_both)

    def note(self, kernel: str, target: str, error: Exception | None, ir_text: str | None) -> None:
        base = f"{self.context}::{kernel}::{target}"
        n = self.counts[base]
        self.counts[base] += 1
        if ir_text is not None:
            self.records[f"{base}#{n}::ir"] = hashlib.sha256(ir_text.encode()).hexdigest()
        if self.last_ptx is not None:
            value = hashlib.sha256(self.last_ptx.encode()).hexdigest()
            if error is not None:
                value += f" (then {type(error).__name__})"
        else:
            first = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else ""
            first = re.sub(r" at 0x[0-9a-f]+", "", first)  # object addresses differ between runs
            value = f"error {type(error).__name__}: {first}"
        self.records[f"{base}#{n}"] = value


def _ir_text(compiled) -> str | None:
    """The IR (with layouts and source lines) a compile produced, where its result keeps it."""
    files = getattr(compiled, "files", None)
    return files["kernel.ir"].decode() if files and "kernel.ir" in files else None


def _kernel_name(args) -> str:
    for a in args:
        name = getattr(a, "name", None)
        if isinstance(name, str):
            return name
    return "?"


class Plugin:
    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def pytest_runtest_setup(self, item):
        self.recorder.context = item.nodeid

    def pytest_runtest_call(self, item):
        self.recorder.context = item.nodeid


def _compile_examples(recorder: Recorder) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    for name in EXAMPLES:
        recorder.context = f"examples/{name}.py"
        spec = importlib.util.spec_from_file_location(f"_example_{name}", ROOT / "examples" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "setup"):
            inputs, out = module.setup("meta")
            try:
                module.compile(*inputs, out, target="sm_90a")
            except Exception as e:
                print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
        else:  # matmul_hopper: its kernel and default config
            import torch
            x = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
            module.matmul_kernel.compile(*[x] * len(module.matmul_kernel.runtime_names), **module.DEFAULT_CONFIG,
                                         target="sm_90a")


def record(path: str, pytest_args: list[str]) -> int:
    import pytest
    os.environ.setdefault("MGJIT_CACHE_DIR", tempfile.mkdtemp(prefix="mgjit-ptx-hashes-"))
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    recorder = Recorder()
    recorder.install()
    # In this process (-n 0 over pyproject's two workers): the recorder sees the compiles that happen here.
    status = pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", "-m", "not gpu", str(ROOT / "tests"),
                          *pytest_args], plugins=[Plugin(recorder)])
    _compile_examples(recorder)
    Path(path).write_text(json.dumps(recorder.records, indent=1, sort_keys=True) + "\n")
    print(f"{len(recorder.records)} compiles recorded in {path} (pytest exit {status})")
    return 0


def _load(path: str) -> dict[str, str]:
    return {k: re.sub(r" at 0x[0-9a-f]+", "", v) for k, v in json.loads(Path(path).read_text()).items()}


def compare(before: str, after: str) -> int:
    a, b = _load(before), _load(after)
    changed = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    for k in changed:
        print(f"changed  {k}\n    before {a[k]}\n    after  {b[k]}")
    for k in only_a:
        print(f"gone     {k}  ({a[k]})")
    for k in only_b:
        print(f"new      {k}  ({b[k]})")
    same = len(a.keys() & b.keys()) - len(changed)
    print(f"{same} identical, {len(changed)} changed, {len(only_a)} only before, {len(only_b)} only after")
    return 0 if not (changed or only_a or only_b) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="run the CPU suite and the examples, record PTX hashes")
    r.add_argument("out")
    r.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -k lowering)")
    c = sub.add_parser("compare", help="compare two records; exit 1 if any differs")
    c.add_argument("before")
    c.add_argument("after")
    args = parser.parse_args()
    if args.command == "record":
        return record(args.out, args.pytest_args)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())

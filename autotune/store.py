"""Per-config tuning results on disk, beside the kernel cache, so that a new process times nothing twice.

One JSON file per (kernel source key, device, tuning key) maps each config's canonical key to its time or
its prune reason. Results are kept per config, not just the winner, so that adding a config to the list
times only that config. Writes are atomic (temporary file + `os.replace`); a file that does not parse or
does not match its schema is treated as empty, with one warning, and rewritten by the next sweep."""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1

# Corrupt files already warned about in this process: one warning each, however many stores read them.
_WARNED: set[Path] = set()


@dataclass(frozen=True)
class Result:
    """One config's outcome: a time in milliseconds, or the reason it was pruned (exactly one of them)."""

    ms: float | None = None
    pruned: str | None = None

    def __post_init__(self) -> None:
        if (self.ms is None) == (self.pruned is None):
            raise ValueError(f"a Result holds either ms or pruned; got ms={self.ms!r}, pruned={self.pruned!r}")

    def to_json(self) -> dict[str, Any]:
        return {"ms": self.ms} if self.ms is not None else {"pruned": self.pruned}

    @classmethod
    def from_json(cls, data: Any) -> Result:
        if isinstance(data, dict) and set(data) == {"ms"} and isinstance(data["ms"], (int, float)) \
                and not isinstance(data["ms"], bool) and math.isfinite(data["ms"]) and data["ms"] >= 0:
            return cls(ms=float(data["ms"]))
        if isinstance(data, dict) and set(data) == {"pruned"} and isinstance(data["pruned"], str):
            return cls(pruned=data["pruned"])
        raise ValueError(f"expected {{'ms': finite number >= 0}} or {{'pruned': str}}; got {data!r}")


def default_root() -> Path:
    """`<kernel cache root>/autotune`: beside the kernels, under the same `MGJIT_CACHE_DIR`. The kernel
    store only scans its two-character shard folders, so this folder is never taken for an entry."""
    from ..cache.store import default_store

    return default_store().root / "autotune"


class ResultStore:
    """The directory of tuning results. Keys: the kernel's source key, the device name and the tuning key
    values (JSON-able); values: config key -> Result."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def path(self, kernel_name: str, source_key: str, device: str, key: Any) -> Path:
        digest = hashlib.sha256(_identity(source_key, device, key).encode()).hexdigest()[:32]
        safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", kernel_name)[:64]
        return self.root / f"{safe_name}-{digest}.json"

    def load(self, kernel_name: str, source_key: str, device: str, key: Any) -> dict[str, Result]:
        path = self.path(kernel_name, source_key, device, key)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return {}
        try:
            return _parse(text, source_key, device, key)
        except ValueError as error:
            if path not in _WARNED:
                _WARNED.add(path)
                warnings.warn(f"mgjit.autotune: ignoring corrupt tuning results {path} ({error}); "
                              f"the configs will be tuned again and the file rewritten", stacklevel=3)
            return {}

    def save(self, kernel_name: str, source_key: str, device: str, key: Any,
             results: Mapping[str, Result]) -> None:
        """Merge `results` into the stored ones (new wins) and write the file atomically. A store that
        cannot be written warns and tuning goes on: the results are only lost for the next process."""
        path = self.path(kernel_name, source_key, device, key)
        merged = {**self.load(kernel_name, source_key, device, key), **results}
        document = {"version": FORMAT_VERSION, "kernel": kernel_name, "source_key": source_key,
                    "device": device, "key": _jsonable(key),
                    "configs": {k: r.to_json() for k, r in sorted(merged.items())}}
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=self.root)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(document, f, indent=1)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as error:
            warnings.warn(f"mgjit.autotune: could not save tuning results to {path}: {error}", stacklevel=3)


def _jsonable(key: Any) -> Any:
    # Tuples become lists in JSON; compare and hash in that form so a loaded key equals the given one.
    return json.loads(json.dumps(key))


def _identity(source_key: str, device: str, key: Any) -> str:
    return json.dumps([source_key, device, _jsonable(key)], sort_keys=True, separators=(",", ":"))


def _parse(text: str, source_key: str, device: str, key: Any) -> dict[str, Result]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise ValueError(f"expected a JSON object with version {FORMAT_VERSION}")
    if (document.get("source_key"), document.get("device"), document.get("key")) != \
            (source_key, device, _jsonable(key)):
        raise ValueError("its source key, device or tuning key is not the one its name stands for")
    configs = document.get("configs")
    if not isinstance(configs, dict):
        raise ValueError("expected 'configs' to be an object of config key -> result")
    return {config_key: Result.from_json(result) for config_key, result in configs.items()}

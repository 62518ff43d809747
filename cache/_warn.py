"""Warnings of the cache, each given at most once per process."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Hashable


class CacheWarning(UserWarning):
    """A cache problem that mgjit worked around (the kernel is recompiled or kept in memory)."""


_warned: set[Hashable] = set()
_lock = threading.Lock()


def warn_once(tag: Hashable, message: str) -> None:
    """Warn with `message` unless a warning with the same `tag` was already given in this process.

    Python's own once-per-location filter is not enough: pytest and notebooks reset it, and one damaged
    path must not flood the log when every kernel in a notebook cell misses on it.
    """
    with _lock:
        if tag in _warned:
            return
        _warned.add(tag)
    warnings.warn(message, CacheWarning, stacklevel=3)

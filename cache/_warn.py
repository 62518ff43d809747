"""Warnings of the cache, each given at most once per process."""

from __future__ import annotations

import os
import sys
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
    warnings.warn(message, CacheWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The stack level of the first frame outside mgjit's packages: the user's line that led here, so the
    warning shows that line rather than one of mgjit's."""
    own = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in
                (sys.modules.get(n) for n in ("mgjit", "mgjit.cache", "mgjit.autotune")) if m and m.__file__)
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(own):
        frame = frame.f_back
        level += 1
    return level

"""The sweep's progress bar: tqdm on a terminal, nothing in logs, under `MGJIT_AUTOTUNE_QUIET=1`, or
where tqdm is not installed (it is optional)."""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator


def enabled() -> bool:
    return os.environ.get("MGJIT_AUTOTUNE_QUIET", "") not in ("1", "true", "yes") and sys.stderr.isatty()


@contextlib.contextmanager
def bar(total: int, desc: str) -> Iterator[Callable[[], None]]:
    """A context giving `tick()`, which advances a bar of `total` steps by one."""
    if total <= 0 or not enabled():
        yield lambda: None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield lambda: None
        return
    with tqdm(total=total, desc=desc, unit="config", leave=False, file=sys.stderr) as progress:
        yield lambda: progress.update(1)

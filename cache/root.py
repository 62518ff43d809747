"""The cache's root directory: used only if it is ours alone, and marked as mgjit's before anything in it is
deleted.

A root is refused when another user owns it or anyone but its owner may write to it (they could plant
kernels), and when it holds things mgjit did not put there (housekeeping would delete them: think
MGJIT_CACHE_DIR=$HOME). mgjit marks the roots it creates, or adopts, with a MARKER file. A store whose root is
refused uses a private directory instead (see `Store`), with one warning that says why and how to fix it.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from .safefs import _O_CLOEXEC, _O_DIRECTORY, _O_NOFOLLOW, _euid

MARKER = ".mgjit-cache"
_MARKER_TEXT = (b"This directory is mgjit's kernel cache (python -m mgjit.cache). mgjit deletes entries, and what\n"
                b"its crashed writers left, in the two-character folders, .tmp and .trash here.\n")
# What mgjit itself puts in a root: shards of entries, its scratch folders, the autotuner's results, the
# compiled launcher, the marker. A directory holding only these may be adopted.
_OURS = re.compile(r"[0-9a-f]{2}|\.tmp|\.trash|autotune|launcher|" + re.escape(MARKER))


class Unsafe(Exception):
    """A root that must not be used: `why` it is refused and how to `fix` it."""

    def __init__(self, why: str, fix: str) -> None:
        super().__init__(why)
        self.why = why
        self.fix = fix


def open_root(path: Path, create: bool) -> int | None:
    """A descriptor of the verified root at `path` (created 0700 if `create` and missing), or None if there is
    none and not `create`. Unsafe if it must not be used; OSError if it cannot be created."""
    if create:
        os.makedirs(path.parent, 0o700, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    try:
        # The root itself may be a link (the user's choice): what it reaches is checked below.
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        if create:
            raise  # a file at its place or above it: nothing can be cached there
        return None
    try:
        _check(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if st.st_uid != _euid():
        raise Unsafe(f"it is owned by uid {st.st_uid}, not by you (uid {_euid()}), who could plant kernels in it",
                     "point MGJIT_CACHE_DIR at a directory of your own")
    if st.st_mode & 0o022:
        raise Unsafe(f"others can write to it (mode {stat.S_IMODE(st.st_mode):o}) and could plant kernels in it",
                     f"run `chmod go-w {path}`, or point MGJIT_CACHE_DIR at a directory of your own")
    try:
        marker = os.stat(MARKER, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        _adopt(fd)
        return
    if not stat.S_ISREG(marker.st_mode):
        raise Unsafe(f"its {MARKER} is not a file", f"remove {path / MARKER}")


def _adopt(fd: int) -> None:
    """Mark a root that holds nothing but what mgjit makes (a new or empty directory, or an older cache)."""
    foreign = sorted(n for n in os.listdir(fd) if not _OURS.fullmatch(n))
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise Unsafe(f"it holds files that mgjit did not make ({shown}), and mgjit deletes what it finds in "
                     f"its cache", "point MGJIT_CACHE_DIR at a new or empty directory")
    try:
        mfd = os.open(MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600, dir_fd=fd)
    except FileExistsError:
        return  # another process marked it meanwhile
    except OSError:
        return  # a read-only cache: nothing in it can be deleted either
    with open(mfd, "wb") as f:
        f.write(_MARKER_TEXT)


def user_dir() -> Path:
    """This user's default cache directory: ($XDG_CACHE_HOME or ~/.cache)/mgjit."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "mgjit"


def fallback(refused: Path) -> Path:
    """A private directory to use instead of a refused root: the user's default one if that is usable, else a
    new temporary directory of this process (removed at exit)."""
    candidate = Path(os.path.abspath(user_dir()))
    if candidate != refused:
        try:
            fd = open_root(candidate, create=True)
        except (Unsafe, OSError):
            pass
        else:
            assert fd is not None
            os.close(fd)
            return candidate
    private = Path(tempfile.mkdtemp(prefix="mgjit-cache-"))
    atexit.register(shutil.rmtree, private, True)
    return private

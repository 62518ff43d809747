"""Files of the cache, reached only through verified directory descriptors, never through a symbolic link.

Every name inside the cache is opened relative to the descriptor of its directory with O_NOFOLLOW, and must be
what we expect: a directory or a regular file, owned by us. A link, a FIFO, a device or someone else's file at
an entry's place is damage (`NotOurs`), never followed, read or deleted through. Removal renames a thing away
and then deletes it through descriptors, so a link planted anywhere in the cache deletes at most the link.
"""

from __future__ import annotations

import errno
import os
import stat

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted at a file's place must not block the open
DIR_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
# A damaged entry with directories inside is deleted this deep at most; a deeper tree is not ours.
_MAX_DEPTH = 4


class NotOurs(OSError):
    """A name in the cache that is a link, not a directory or regular file, or owned by another user."""


def _euid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


def check_owned(st: os.stat_result, what: str) -> None:
    """NotOurs unless `st` belongs to this user."""
    if st.st_uid != _euid():
        raise NotOurs(errno.EPERM, f"{what} is owned by uid {st.st_uid}, not by you")


def open_dir(name: str, dir_fd: int) -> int:
    """A descriptor of the directory `name` in `dir_fd`, owned by us; FileNotFoundError if there is none,
    NotOurs if something else is there."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise NotOurs(e.errno, "a link or a file is where a directory should be") from None
        raise
    try:
        check_owned(os.fstat(fd), name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dir(name: str, dir_fd: int) -> int:
    """`open_dir`, creating the directory (0700) if it is missing."""
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    return open_dir(name, dir_fd)


def read_file(dir_fd: int, name: str, limit: int) -> bytes:
    """Up to `limit` bytes of the regular file `name` in `dir_fd`; NotOurs if it is anything else."""
    try:
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.EISDIR, errno.ENXIO):
            raise NotOurs(e.errno, f"{name} is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotOurs(errno.EINVAL, f"{name} is not a regular file")
        check_owned(st, name)
    except BaseException:
        os.close(fd)
        raise
    with open(fd, "rb") as f:
        return f.read(limit)


def write_file(dir_fd: int, name: str, data: bytes) -> None:
    """Create the file `name` (0600) in `dir_fd` with `data`, synced to disk."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600, dir_fd=dir_fd)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not fsync directories; the data files are already synced


def remove(dir_fd: int, name: str, last: str | None = None, depth: int = 0) -> None:
    """Delete `name` in `dir_fd` without following links: a link or file is unlinked, a directory emptied
    (the file named `last` deleted last) and removed. Errors (a concurrent removal) are ignored."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dir_fd)
            return
        if depth >= _MAX_DEPTH:
            return
        fd = open_dir(name, dir_fd)
    except OSError:
        return
    try:
        for child in sorted(os.listdir(fd), key=lambda n: n == last):
            remove(fd, child, depth=depth + 1)
    except OSError:
        pass
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        pass

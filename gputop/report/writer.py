"""Write a report atomically: a temp file in the same directory, fsync, then rename over the target.

A full disk or an unwritable directory leaves no half-written report behind (and an existing report at
the path untouched); the user gets one line saying what went wrong and what to do.

A target that is not a regular file (a device such as ``/dev/full``, a FIFO, a terminal) or names a file
descriptor (``-o /dev/stdout``) is written in place: renaming over it would replace the device node (or
the /dev/stdout symlink) with a regular file.  Reports are UTF-8 whatever the
locale (`encode_text`), on stdout too (`write_stdout`).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
from typing import Optional

from gputop.errors import GputopError

_HINTS = {
    errno.ENOSPC: "the disk is full; free some space or write elsewhere with -o",
    errno.EDQUOT: "you are over your disk quota; free space or write elsewhere with -o",
    errno.EACCES: "you cannot write there; choose a directory you own with -o",
    errno.EPERM: "you cannot write there; choose a directory you own with -o",
    errno.EROFS: "the file system is read-only; write elsewhere with -o",
    errno.ENOENT: "the directory does not exist; create it or choose another with -o",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EISDIR: "that path is a directory; give a file name with -o",
}


def _error(path: str, exc: OSError) -> GputopError:
    hint = _HINTS.get(exc.errno or 0, "check the path and the disk")
    return GputopError(f"cannot write report to {path}: {exc.strerror or exc} ({hint})")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def encode_text(text: str) -> bytes:
    """`text` as UTF-8 bytes, whatever the locale.

    Under an ASCII locale psutil decodes non-ASCII bytes from /proc (command lines, paths) to lone
    surrogates; surrogateescape turns them back into the original bytes, which is what the user typed.
    """
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that is not an escaped byte: show it, never fail on it
        return text.encode("utf-8", "backslashreplace")


def write_stdout(text: str) -> None:
    """Write `text` to stdout as UTF-8 bytes: an ASCII locale (LANG=C) must not fail on '·' or a path."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # stdout replaced by a text-only stream (an embedding app, a test's StringIO)
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    sys.stdout.flush()  # anything already written as text goes first
    buffer.write(encode_text(text))
    buffer.flush()


_FD_LINK = re.compile(r"/(proc/(self|\d+)|dev)/fd/\d+")


def _is_fd_alias(target: str) -> bool:
    """`target` is (a symlink to) an open file descriptor's name: /dev/stdout, /dev/fd/3, /proc/self/fd/1."""
    path = target
    for _ in range(8):  # a symlink chain; /dev/stdout -> /proc/self/fd/1 is two hops at most in practice
        if _FD_LINK.fullmatch(path):
            return True
        if not os.path.islink(path):
            return False
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return False


def _in_place_flags(target: str) -> Optional[int]:
    """Open flags to write `target` in place, or None to replace it atomically.

    An existing non-regular file (a device such as /dev/full, a FIFO, a terminal) has no content to keep
    and must not be replaced by a regular file.  A descriptor's name (``-o /dev/stdout``) is the
    caller's redirection: append to what the shell opened (it truncated it already, or asked for >>).
    """
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return None  # not there yet (or unreachable): the atomic path creates it or reports the error
    if _is_fd_alias(target):
        return os.O_WRONLY | os.O_APPEND | os.O_NOCTTY
    if not stat.S_ISREG(mode):
        return os.O_WRONLY | os.O_NOCTTY
    return None


def _write_in_place(path: str, target: str, flags: int, data: bytes) -> None:
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        raise _error(path, exc) from None
    try:
        _write_all(fd, data)
    except OSError as exc:
        raise _error(path, exc) from None
    finally:
        os.close(fd)


def write_report(path: str, text: str) -> None:
    """Replace `path` with `text` (UTF-8) all at once, or raise GputopError and leave `path` as it was.

    A device, FIFO or /dev/stdout is written in place instead (it has no "as it was" to keep)."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise GputopError(f"cannot write report to {path}: it is a directory (give a file name with -o)")
    data = encode_text(text)
    flags = _in_place_flags(target)
    if flags is not None:
        _write_in_place(path, target, flags, data)
        return
    directory = os.path.dirname(target)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
        try:
            _write_all(fd, data)
            os.fsync(fd)
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a report is an ordinary file
        finally:
            os.close(fd)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise _error(path, exc) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass

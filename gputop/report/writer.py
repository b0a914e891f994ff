"""Write a report atomically: a temp file in the same directory, fsync, then rename over the target.

A full disk or an unwritable directory leaves no half-written report behind (and an existing report at
the path untouched); the user gets one line saying what went wrong and what to do.
"""

from __future__ import annotations

import errno
import os
import tempfile

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


def write_report(path: str, text: str) -> None:
    """Replace `path` with `text` (UTF-8) all at once, or raise GputopError and leave `path` as it was."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise GputopError(f"cannot write report to {path}: it is a directory (give a file name with -o)")
    directory = os.path.dirname(target)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
        try:
            _write_all(fd, text.encode("utf-8"))
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

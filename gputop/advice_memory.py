"""The worker count gputop last advised for each job, kept on disk so a user who asks twice gets one answer.

A report estimates the workers a job needs from a sampled input share; the count is a step function of a noisy
share, so two reports on an unchanged job whose share sits near a step (3.0 workers: share 0.706) would advise 3
and then 4.  `suggested_workers` keeps the count advised before for the same job while the new window's interval
still holds it, and says so; this mapping is where that count is kept between `gputop report` runs, the TUI and
`gputop serve` (one file, so `r`, the screen and a second report agree).

A job is its anchor process's PID with that process's start time (a reused PID is another job).  The file is
`$XDG_STATE_HOME/gputop/advice.json` (default `~/.local/state/gputop/advice.json`); entries older than
`KEEP_S` are dropped.  Nothing here may fail a report: an unreadable or unwritable file leaves the memory in
this process only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Optional

KEEP_S = 7 * 24 * 3600.0  # a week: a long training run is still the same job
MAX_ENTRIES = 256  # the newest kept; one entry per job ever advised on


def default_path() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gputop", "advice.json")


class AdviceMemory(MutableMapping[str, int]):
    """job key -> workers advised, as in `path`: read again whenever the file changed since this process last read
    or wrote it, and merged on every write, entry by entry, the newest `at` winning.

    Several processes share the file: the TUI left open for hours, `gputop report` runs beside it, `serve`.  Read
    only once, the TUI would advise its own count after a report had moved the job's (the screen and the ticket
    disagreeing), and its next write would drop the entries the others had added since.  A write holds an
    advisory lock on the file's folder from the read to the rename (POSIX), so two writers never lose each
    other's entries (and no lock file is left beside it)."""

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path  # None: `default_path()`, resolved on first use (the environment of that moment)
        self._entries: Optional[dict[str, dict[str, float]]] = None  # key -> {"workers": n, "at": unix time}
        self._seen: Optional[tuple[int, int, int]] = None  # the file as last read or written here (see _signature)

    def _signature(self) -> Optional[tuple[int, int, int]]:
        """The file's (inode, size, mtime in ns): a rename or a rewrite changes it; None when there is none."""
        try:
            st = os.stat(self.path or default_path())
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _read_file(self) -> dict[str, dict[str, float]]:
        import json  # on the first job advised on: the monitor's start loads nothing it may not need

        entries: dict[str, dict[str, float]] = {}
        try:
            with open(self.path or default_path(), encoding="utf-8") as f:
                raw = json.load(f)
            now = time.time()
            for key, entry in raw.items() if isinstance(raw, dict) else ():
                if isinstance(entry, dict) and isinstance(entry.get("workers"), int) and now - float(entry.get("at", 0)) < KEEP_S:
                    entries[str(key)] = {"workers": entry["workers"], "at": float(entry["at"])}
        except (OSError, ValueError, TypeError):
            pass  # none yet, or unreadable: start empty (the advice is then this window's alone)
        return entries

    def _load(self) -> dict[str, dict[str, float]]:
        if self.path is None:
            self.path = default_path()
        signature = self._signature()
        if self._entries is None or (signature is not None and signature != self._seen):
            self._seen = signature
            merged = self._read_file()
            for key, entry in (self._entries or {}).items():  # ours where newer (kept here when the file was not)
                if key not in merged or entry["at"] > merged[key]["at"]:
                    merged[key] = entry
            self._entries = merged
        return self._entries

    def _save(self) -> None:
        import json

        from gputop.errors import GputopError
        from gputop.report.writer import write_report  # all at once: a reader never sees half a file

        path = self.path or default_path()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with _locked(os.path.dirname(path)):
                entries = self._load()  # what another process wrote since, merged under the lock
                newest = dict(sorted(entries.items(), key=lambda kv: kv[1]["at"])[-MAX_ENTRIES:])
                write_report(path, json.dumps(newest))
                self._seen = self._signature()
        except (OSError, GputopError):
            pass  # a read-only home or a full disk: the memory lasts as long as this process

    def __getitem__(self, key: str) -> int:
        return int(self._load()[key]["workers"])

    def __setitem__(self, key: str, workers: int) -> None:
        entries = self._load()
        if key in entries and entries[key]["workers"] == workers and time.time() - entries[key]["at"] < KEEP_S / 2:
            return  # unchanged: no write per diagnosis
        entries[key] = {"workers": int(workers), "at": time.time()}
        self._save()

    def __delitem__(self, key: str) -> None:
        del self._load()[key]
        self._save()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._load()))

    def __len__(self) -> int:
        return len(self._load())


@contextmanager
def _locked(folder: str) -> Iterator[None]:
    """An exclusive advisory lock on `folder` for the block; none where flock is missing."""
    try:
        import fcntl
    except ImportError:  # not POSIX: writers may then race, the last one winning
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)

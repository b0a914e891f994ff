"""Record the snapshot stream to a file, read it back, and replay it with pause / seek / speed.

File format (version 1) - a concatenation of gzip members, one JSON line each:

* member 1: ``{"format": "gputop-recording", "version": 1, "gputop": VERSION, "machine": {...}}``
* then one member per snapshot: ``{"snapshot": {...}, "stacks_unchanged": [pid, ...]}``

Why this shape:

* compressed, yet ``zcat FILE`` prints plain JSON lines;
* append-only: each snapshot is one ``write()`` of a complete gzip member, so a reader of a file that is
  still growing sees whole members (a member cut short at the end is simply the part not written yet);
* damage stays local: a truncated or corrupt member ends the replay there, with one warning line, and
  everything before it replays.

A stack dump is refreshed every ~2 s but every 1 s snapshot references it; a line lists the PIDs whose
dump is the same object as in the previous line under ``stacks_unchanged`` instead of repeating them,
and the reader restores them (shared, as in the live `History`).
"""

from __future__ import annotations

import bisect
import errno
import gzip
import json
import os
import statistics
import threading
import time
import zlib
from typing import Any, Callable, Optional

from gputop import __version__
from gputop.errors import GputopError
from gputop.model import MachineInfo, ProcessStacks, Snapshot, from_jsonable, to_jsonable

FORMAT = "gputop-recording"
VERSION = 1
_GZIP_MAGIC = b"\x1f\x8b"


def _disk_error(path: str, exc: OSError, doing: str) -> GputopError:
    hint = {
        errno.ENOSPC: "free some disk space or record to another disk",
        errno.EDQUOT: "you are over your disk quota; free space or record elsewhere",
        errno.EACCES: "choose a file in a directory you can write to",
        errno.EPERM: "choose a file in a directory you can write to",
        errno.EROFS: "the file system is read-only; record to another directory",
        errno.ENOENT: "the directory does not exist; create it first",
        errno.EISDIR: "that is a directory; give a file name",
    }.get(exc.errno or 0, "check the path and the disk")
    return GputopError(f"cannot {doing} recording {path}: {exc.strerror or exc} ({hint})")


class RecordingWriter:
    """Appends snapshots to a recording. Every `write` lands on disk as one complete gzip member."""

    def __init__(self, path: str, machine: MachineInfo) -> None:
        self.path = path
        self.count = 0
        self._last_stacks: dict[int, ProcessStacks] = {}
        try:
            self._fd: Optional[int] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        except OSError as exc:
            raise _disk_error(path, exc, "create") from None
        header = {"format": FORMAT, "version": VERSION, "gputop": __version__, "created": time.time(), "machine": to_jsonable(machine)}
        self._append(header)

    def _append(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            raise GputopError(f"recording {self.path} is closed")
        data = gzip.compress(json.dumps(record, separators=(",", ":")).encode() + b"\n", compresslevel=6, mtime=0)
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            # what is on disk is a cut member at worst: the reader replays everything before it
            self.close()
            raise _disk_error(self.path, exc, "write") from None

    def write(self, snapshot: Snapshot) -> None:
        data = to_jsonable(snapshot)
        unchanged: list[int] = []
        job = snapshot.job
        if job is not None and job.stacks:
            fresh = {}
            for pid, stacks in job.stacks.items():
                if self._last_stacks.get(pid) is stacks or self._last_stacks.get(pid) == stacks:
                    unchanged.append(pid)
                else:
                    fresh[str(pid)] = to_jsonable(stacks)
            data["job"]["stacks"] = fresh
            self._last_stacks = dict(job.stacks)
        else:
            self._last_stacks = {}
        record: dict[str, Any] = {"snapshot": data}
        if unchanged:
            record["stacks_unchanged"] = unchanged
        self._append(record)
        self.count += 1

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "RecordingWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_READ_CHUNK = 8192  # a snapshot member is a few KB: small chunks keep `unused_data` copies small


def _members(data: bytes) -> tuple[list[bytes], Optional[str]]:
    """Split the file into decompressed JSON lines, stopping at the first damage (returned as a reason)."""
    lines: list[bytes] = []
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        if bytes(view[pos : pos + 2]) != _GZIP_MAGIC:
            return lines, f"corrupt data at byte {pos}"
        d = zlib.decompressobj(wbits=31)
        parts: list[bytes] = []
        cur = pos
        try:
            while not d.eof and cur < len(data):
                chunk = view[cur : cur + _READ_CHUNK]
                parts.append(d.decompress(chunk))
                cur += len(chunk)
        except zlib.error as exc:
            return lines, f"corrupt data at byte {pos} ({exc})"
        if not d.eof:
            # a member cut short: the file is truncated, or still being written
            return lines, f"truncated at byte {len(data)}"
        lines.extend(line for line in b"".join(parts).split(b"\n") if line.strip())
        pos = cur - len(d.unused_data)
    return lines, None


def read_recording(path: str) -> tuple[MachineInfo, list[Snapshot], Optional[str]]:
    """(machine, snapshots, warning). Damage ends the list with a one-line warning; no header is an error."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise GputopError(f"no recording at {path} (check the path; record one with `gputop record -o FILE`)") from None
    except IsADirectoryError:
        raise GputopError(f"{path} is a directory, not a recording") from None
    except OSError as exc:
        raise GputopError(f"cannot read recording {path}: {exc.strerror or exc}") from None
    lines, damage = _members(data)
    if not lines:
        what = "is empty" if not data else "is not a gputop recording (no readable header)"
        raise GputopError(f"{path} {what}; record one with `gputop record -o FILE`")
    try:
        header = json.loads(lines[0])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise GputopError(f"{path} is not a gputop recording (no gputop header); record one with `gputop record -o FILE`")
    if header.get("version", 0) > VERSION:
        raise GputopError(f"{path} is a version {header.get('version')} recording; this gputop reads version {VERSION} (upgrade gputop)")
    machine = from_jsonable(MachineInfo, header["machine"])
    snapshots: list[Snapshot] = []
    last_stacks: dict[int, ProcessStacks] = {}
    for i, raw in enumerate(lines[1:], start=2):
        try:
            record = json.loads(raw)
            data = record["snapshot"]
            job = data.get("job")
            fresh_stacks = {}
            if job is not None:
                fresh_stacks = {int(pid): from_jsonable(ProcessStacks, s) for pid, s in (job.get("stacks") or {}).items()}
                job["stacks"] = {}
            snap = from_jsonable(Snapshot, data)
            if snap.job is not None:
                stacks = {pid: last_stacks[pid] for pid in record.get("stacks_unchanged", ()) if pid in last_stacks}
                stacks.update(fresh_stacks)
                snap.job.stacks.update(stacks)  # the dict was built for this snapshot: filling it is safe
                last_stacks = stacks
            else:
                last_stacks = {}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            damage = damage or f"unreadable record {i} ({type(exc).__name__})"
            break
        snapshots.append(snap)
    warning = None
    if damage:
        span = f"{snapshots[-1].timestamp - snapshots[0].timestamp:.0f} s" if len(snapshots) > 1 else "0 s"
        warning = f"recording {path} is damaged ({damage}); replaying the {len(snapshots)} snapshots ({span}) before it"
    return machine, snapshots, warning


class ReplaySource:
    """A recording as a snapshot source for the TUI (`.machine`, `.poll()`, `.close()`), with controls.

    Replay time runs at `speed` times the wall clock from where it was started, paused or sought.
    `poll()` returns the latest snapshot at or before the current position.  `drain()` returns every
    snapshot passed since the previous `drain()` (a TUI that wants a complete history at speed > 1), and
    `generation` changes on every seek so a consumer knows to rebuild its history from `history_until()`.
    """

    def __init__(self, path: str, speed: float = 1.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.machine, self.snapshots, self.warning = read_recording(path)
        if not self.snapshots:
            raise GputopError(f"{path} holds no snapshots (the recording stopped before its first sample)")
        self._clock = clock
        self._lock = threading.Lock()
        self._times = [s.timestamp - self.snapshots[0].timestamp for s in self.snapshots]
        self._speed = self._check_speed(speed)
        self._anchor_wall = clock()
        self._anchor_pos = 0.0
        self._paused = False
        self._drained = 0  # index of the next snapshot drain() hands out
        self.generation = 0
        gaps = [b - a for a, b in zip(self._times, self._times[1:]) if b > a]
        self.interval = statistics.median(gaps) if gaps else 1.0

    @staticmethod
    def _check_speed(speed: float) -> float:
        if not speed or speed <= 0 or speed != speed:
            raise GputopError(f"replay speed must be greater than 0 (got {speed})")
        return float(speed)

    # ---------------------------------------------------------------- position
    @property
    def duration(self) -> float:
        return self._times[-1]

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def position(self) -> float:
        """Seconds from the recording's start (0..duration)."""
        with self._lock:
            return self._position_locked()

    def _position_locked(self) -> float:
        pos = self._anchor_pos
        if not self._paused:
            pos += (self._clock() - self._anchor_wall) * self._speed
        return max(0.0, min(self.duration, pos))

    @property
    def finished(self) -> bool:
        return self.position >= self.duration

    def _rebase(self) -> None:
        self._anchor_pos = self._position_locked()
        self._anchor_wall = self._clock()

    # ---------------------------------------------------------------- controls
    def pause(self) -> None:
        with self._lock:
            self._rebase()
            self._paused = True

    def resume(self) -> None:
        with self._lock:
            self._rebase()
            self._paused = False

    def toggle_pause(self) -> None:
        (self.resume if self._paused else self.pause)()

    def set_speed(self, speed: float) -> None:
        with self._lock:
            self._rebase()
            self._speed = self._check_speed(speed)

    def seek(self, seconds: float) -> None:
        """Jump to `seconds` from the start (clamped to 0..duration)."""
        with self._lock:
            self._anchor_pos = max(0.0, min(self.duration, float(seconds)))
            self._anchor_wall = self._clock()
            self._drained = self._index_at(self._anchor_pos)
            self.generation += 1

    def seek_by(self, delta: float) -> None:
        self.seek(self.position + delta)

    # ---------------------------------------------------------------- data
    def _index_at(self, pos: float) -> int:
        """Number of snapshots at or before `pos` (at least 1: the first is shown at 0)."""
        return max(1, bisect.bisect_right(self._times, pos + 1e-9))

    def poll(self) -> Snapshot:
        with self._lock:
            return self.snapshots[self._index_at(self._position_locked()) - 1]

    def drain(self) -> list[Snapshot]:
        with self._lock:
            end = self._index_at(self._position_locked())
            out = self.snapshots[self._drained : end]
            self._drained = max(self._drained, end)
            return out

    def history_until(self) -> list[Snapshot]:
        """Every snapshot up to the current position (rebuild a history after a seek)."""
        with self._lock:
            end = self._index_at(self._position_locked())
            self._drained = end
            return self.snapshots[:end]

    def close(self) -> None:
        pass

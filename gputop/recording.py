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
and the reader restores them (shared, as in the live `History`).  Every `KEYFRAME_EVERY`-th line repeats
all dumps, so a reader can start decoding near any point (seek) without reading from the beginning.

A snapshot of `serve`'s and `record`'s pipeline carries its counter watch's latest window
(``counter_health``: `gputop check`'s counter lines that warn or fail); a recording written before it
existed has no such key and reads back with ``counter_health`` None.

Reading never holds the whole recording: `RecordingIndex` keeps each snapshot's place in the file
(a few bytes each) and decodes the range asked for; `ReplaySource` plays through it, and `report
--from` decodes only the window it reports on.  `read_recording` (everything as a list) is for short
recordings and tests.
"""

from __future__ import annotations

import bisect
import errno
import gzip
import json
import os
import re
import statistics
import threading
import time
import zlib
from array import array
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator, Optional

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
        header = {
            "format": FORMAT,
            "version": VERSION,
            "gputop": __version__,
            "created": time.time(),
            "machine": to_jsonable(machine),
        }
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
        keyframe = self.count % KEYFRAME_EVERY == 0  # every dump in full: a reader can start here
        written: dict[int, ProcessStacks] = {}
        record: dict[str, Any] = {"snapshot": data}
        job = snapshot.job
        if job is not None and job.stacks:
            data["job"]["stacks"], unchanged = self._share(job.stacks, keyframe, written)
            if unchanged:
                record["stacks_unchanged"] = unchanged
        # several jobs followed (`record` of a machine): each tree's dumps are shared the same way
        jobs_unchanged = []
        for tree_json, tree in zip(data["jobs"], snapshot.jobs):
            tree_json["stacks"], unchanged = self._share(tree.stacks, keyframe, written)
            jobs_unchanged.append(unchanged)
        if any(jobs_unchanged):
            record["jobs_stacks_unchanged"] = jobs_unchanged
        self._last_stacks = written
        self._append(record)
        self.count += 1

    def _share(
        self, stacks: dict[int, ProcessStacks], keyframe: bool, written: dict[int, ProcessStacks]
    ) -> tuple[dict[str, Any], list[int]]:
        """(the dumps that changed since the previous line, as JSON; the PIDs of those that did not)."""
        fresh: dict[str, Any] = {}
        unchanged: list[int] = []
        for pid, dump in stacks.items():
            last = self._last_stacks.get(pid)
            if not keyframe and (last is dump or last == dump):
                unchanged.append(pid)
            else:
                fresh[str(pid)] = to_jsonable(dump)
            written[pid] = dump
        return fresh, unchanged

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


_READ_CHUNK = 65536  # bytes read from the file at a time
_FEED_CHUNK = 8192  # bytes fed to zlib at a time: a snapshot member is a few KB, `unused_data` copies stay small
# A snapshot member begins {"snapshot":{"timestamp":T: the index reads T without parsing the whole line.
_TIMESTAMP = re.compile(rb'\{"snapshot":\{"timestamp":(-?[0-9][0-9.eE+-]*)[,}]')
_UNCHANGED = b',"stacks_unchanged":['
_JOBS_UNCHANGED = b',"jobs_stacks_unchanged":['
# The writer repeats every stack dump in full every KEYFRAME_EVERY snapshots (a "keyframe": a line with no
# stacks_unchanged), so a reader can start decoding anywhere by going back at most that many lines.
KEYFRAME_EVERY = 60
# A replay hands out at most this many decoded snapshots at once (~80 KB each on 8 GPUs): the TUI's history
# keeps no more.  `report --from` passes its own limit to `read_recording_tail`.
DEFAULT_WINDOW = 600


def _iter_members(f: BinaryIO, start: int, damage: list[str]) -> Iterator[tuple[int, bytes]]:
    """(offset, decompressed bytes) of each whole gzip member from `start`, reading the file in chunks.

    Stops at the first damage, appending the reason to `damage`: a member cut short (the file is
    truncated, or still being written) or bytes that are not a gzip member."""
    f.seek(start)
    buf = b""
    buf_offset = start  # file offset of buf[0]
    pos = 0  # where the next member starts in buf
    while True:
        if len(buf) - pos < 2:
            buf, buf_offset, pos = buf[pos:] + f.read(_READ_CHUNK), buf_offset + pos, 0
            if not buf:
                return
            if len(buf) < 2:
                damage.append(f"truncated at byte {buf_offset + len(buf)}")
                return
        member = buf_offset + pos
        if buf[pos : pos + 2] != _GZIP_MAGIC:
            damage.append(f"corrupt data at byte {member}")
            return
        d = zlib.decompressobj(wbits=31)
        parts: list[bytes] = []
        try:
            while not d.eof:
                if pos >= len(buf):
                    buf, buf_offset, pos = f.read(_READ_CHUNK), buf_offset + len(buf), 0
                    if not buf:
                        # a member cut short: the file is truncated, or still being written
                        damage.append(f"truncated at byte {buf_offset}")
                        return
                piece = buf[pos : pos + _FEED_CHUNK]
                parts.append(d.decompress(piece))
                pos += len(piece)
        except zlib.error as exc:
            damage.append(f"corrupt data at byte {member} ({exc})")
            return
        pos -= len(d.unused_data)  # the next member starts right after this one's trailer
        yield member, b"".join(parts)


def _lines(data: bytes) -> list[bytes]:
    return [line for line in data.split(b"\n") if line.strip()]


def _open_error(path: str, exc: OSError) -> GputopError:
    if isinstance(exc, FileNotFoundError):
        return GputopError(f"no recording at {path} (check the path; record one with `gputop record -o FILE`)")
    if isinstance(exc, IsADirectoryError):
        return GputopError(f"{path} is a directory, not a recording")
    return GputopError(f"cannot read recording {path}: {exc.strerror or exc}")


class _Unreadable(Exception):
    """A line the index accepted that does not decode to a snapshot (reported like other damage)."""


class RecordingIndex:
    """Where each snapshot of a recording is, and decoding of any range of them with bounded memory.

    Opening scans the file once (decompression only, no JSON decoding of the snapshots) and keeps three
    numbers per snapshot: its member's offset, its line in the member, its timestamp; and which lines
    are keyframes.  A 24 h recording at 1 Hz indexes in ~1 MB, where its decoded snapshots take GBs.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._file: Optional[BinaryIO] = open(path, "rb")
        except OSError as exc:
            raise _open_error(path, exc) from None
        try:
            self._scan()
        except BaseException:
            self.close()
            raise

    def _scan(self) -> None:
        assert self._file is not None
        damage: list[str] = []
        members = _iter_members(self._file, 0, damage)
        header_member = next(members, None)
        header_lines = _lines(header_member[1]) if header_member is not None else []
        if header_member is None or not header_lines:
            size = os.fstat(self._file.fileno()).st_size
            what = "is empty" if not size else "is not a gputop recording (no readable header)"
            raise GputopError(f"{self.path} {what}; record one with `gputop record -o FILE`")
        try:
            header = json.loads(header_lines[0])
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise GputopError(
                f"{self.path} is not a gputop recording (no gputop header); record one with `gputop record -o FILE`"
            )
        if header.get("version", 0) > VERSION:
            raise GputopError(
                f"{self.path} is a version {header.get('version')} recording; this gputop reads version {VERSION} (upgrade gputop)"
            )
        self.machine = from_jsonable(MachineInfo, header["machine"])
        self._offsets = array("q")
        self._line_numbers = array("l")
        self.timestamps = array("d")
        self._keyframes = array("q")  # indices of the lines that need no earlier line for their stacks
        self._damage: Optional[str] = None

        def add(offset: int, line_number: int, line: bytes) -> bool:
            timestamp = _timestamp(line)
            if timestamp is None:
                self._damage = f"unreadable record {len(self) + 2}"
                return False
            # JSON escapes quotes inside strings, so this key followed by a list only appears as the record's
            # own key; a false match would only cost an earlier start, never a wrong stack
            if _UNCHANGED not in line and _JOBS_UNCHANGED not in line:
                self._keyframes.append(len(self))
            self._offsets.append(offset)
            self._line_numbers.append(line_number)
            self.timestamps.append(timestamp)
            return True

        ok = all(add(header_member[0], n, line) for n, line in enumerate(header_lines[1:], start=1))
        if ok:
            for offset, data in members:
                if not all(add(offset, n, line) for n, line in enumerate(_lines(data))):
                    break
        self._damage = self._damage or (damage[0] if damage else None)
        self._cached_member: tuple[int, list[bytes]] = (-1, [])

    def __len__(self) -> int:
        return len(self.timestamps)

    def warning(self, readable: Optional[int] = None) -> Optional[str]:
        """The one-line damage warning (None for an intact file); `readable`: snapshots before the damage."""
        if self._damage is None:
            return None
        n = len(self) if readable is None else readable
        span = f"{self.timestamps[n - 1] - self.timestamps[0]:.0f} s" if n > 1 else "0 s"
        return f"recording {self.path} is damaged ({self._damage}); replaying the {n} snapshots ({span}) before it"

    def _line(self, i: int) -> bytes:
        offset = self._offsets[i]
        if self._cached_member[0] != offset:
            assert self._file is not None, "the recording is closed"
            damage: list[str] = []
            member = next(_iter_members(self._file, offset, damage), None)
            if member is None:  # the file changed under us (rewritten, truncated) since it was indexed
                raise _Unreadable(f"record {i + 2} is gone ({damage[0] if damage else 'end of file'})")
            self._cached_member = (offset, _lines(member[1]))
        return self._cached_member[1][self._line_numbers[i]]

    def snapshots(self, start: int, stop: int) -> Iterator[Snapshot]:
        """Decode snapshots start..stop-1.  Stack dumps unchanged from the previous line are restored
        (shared objects, as in the live History) by decoding from the keyframe at or before `start`.
        Raises `_Unreadable` at a line that does not decode."""
        stop = min(stop, len(self))
        if start >= stop:
            return
        k = bisect.bisect_right(self._keyframes, start) - 1
        first = self._keyframes[k] if k >= 0 else 0
        last_stacks: dict[int, ProcessStacks] = {}
        for i in range(first, stop):
            try:
                record = json.loads(self._line(i))
                data = record["snapshot"]
                read: dict[int, ProcessStacks] = {}

                def restore(tree: dict[str, Any], unchanged: list[int]) -> dict[int, ProcessStacks]:
                    stacks = {pid: last_stacks[pid] for pid in unchanged if pid in last_stacks}
                    stacks.update((int(pid), from_jsonable(ProcessStacks, s)) for pid, s in (tree.get("stacks") or {}).items())
                    tree["stacks"] = {}  # filled in after decoding, with the shared objects
                    read.update(stacks)
                    return stacks

                job = data.get("job")
                job_stacks = restore(job, record.get("stacks_unchanged", [])) if job is not None else {}
                trees = data.get("jobs") or []
                jobs_unchanged = record.get("jobs_stacks_unchanged") or [[] for _ in trees]
                jobs_stacks = [restore(tree, unchanged) for tree, unchanged in zip(trees, jobs_unchanged)]
                last_stacks = read
                if i < start:
                    continue  # decoded only for its stacks
                snap = from_jsonable(Snapshot, data)
                # the dicts were built for this snapshot: filling them is safe
                if snap.job is not None:
                    snap.job.stacks.update(job_stacks)
                for tree_obj, stacks in zip(snap.jobs, jobs_stacks):
                    tree_obj.stacks.update(stacks)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise _Unreadable(f"unreadable record {i + 2} ({type(exc).__name__})") from None
            yield snap

    def close(self) -> None:
        f, self._file = getattr(self, "_file", None), None
        if f is not None:
            f.close()

    def __enter__(self) -> "RecordingIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timestamp(line: bytes) -> Optional[float]:
    match = _TIMESTAMP.match(line)
    try:
        if match is not None:
            return float(match.group(1))
        value = json.loads(line)["snapshot"]["timestamp"]  # written by something other than RecordingWriter
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    except (ValueError, KeyError, TypeError):
        return None


def read_recording(path: str) -> tuple[MachineInfo, list[Snapshot], Optional[str]]:
    """(machine, snapshots, warning). Damage ends the list with a one-line warning; no header is an error.

    This holds every snapshot in memory (~80 KB each on 8 GPUs): for long recordings use
    `RecordingIndex` (or `ReplaySource`), which decode only the range asked for."""
    with RecordingIndex(path) as index:
        snapshots: list[Snapshot] = []
        try:
            snapshots.extend(index.snapshots(0, len(index)))
        except _Unreadable as exc:
            index._damage = str(exc)
        return index.machine, snapshots, index.warning(len(snapshots))


@dataclass(frozen=True)
class RecordingSpan:
    """What a whole recording covers (readable part), next to the window a report decoded from it."""

    snapshots: int
    start: float
    end: float


def read_recording_tail(
    path: str, limit: int = DEFAULT_WINDOW
) -> tuple[MachineInfo, list[Snapshot], Optional[str], RecordingSpan]:
    """(machine, the last `limit` snapshots, warning, span of the whole recording), in bounded memory.

    Only the tail is decoded (from the keyframe before it); the rest of the file is only indexed."""
    with RecordingIndex(path) as index:
        n = len(index)
        snapshots: list[Snapshot] = []
        if n:
            try:
                snapshots.extend(index.snapshots(max(0, n - limit), n))
            except _Unreadable as exc:
                index._damage = str(exc)
                n = max(0, n - limit) + len(snapshots)
        span = RecordingSpan(n, index.timestamps[0], index.timestamps[n - 1]) if n else RecordingSpan(0, 0.0, 0.0)
        return index.machine, snapshots, index.warning(n), span


class ReplaySource:
    """A recording as a snapshot source for the TUI (`.machine`, `.poll()`, `.close()`), with controls.

    Replay time runs at `speed` times the wall clock from where it was started, paused or sought.
    `poll()` returns the latest snapshot at or before the current position.  `drain()` returns every
    snapshot passed since the previous `drain()` (a TUI that wants a complete history at speed > 1), and
    `generation` changes on every seek so a consumer knows to rebuild its history from `history_until()`.

    Memory stays bounded however long the recording: the file is indexed (`RecordingIndex`), snapshots
    are decoded as they are played, and `drain()` / `history_until()` hand out at most `window` of them
    (the TUI's history keeps no more anyway).
    """

    def __init__(
        self, path: str, speed: float = 1.0, *, clock: Callable[[], float] = time.monotonic, window: int = DEFAULT_WINDOW
    ) -> None:
        self.path = path
        self._index = RecordingIndex(path)
        if not len(self._index):
            self._index.close()
            raise GputopError(f"{path} holds no snapshots (the recording stopped before its first sample)")
        self.machine = self._index.machine
        self.warning = self._index.warning()
        self.window = max(1, window)
        self._clock = clock
        self._lock = threading.Lock()
        t0 = self._index.timestamps[0]
        self._times = array("d", (t - t0 for t in self._index.timestamps))
        self._speed = self._check_speed(speed)
        self._anchor_wall = clock()
        self._anchor_pos = 0.0
        self._paused = False
        self._drained = 0  # index of the next snapshot drain() hands out
        self.generation = 0
        self._stream: Optional[Iterator[Snapshot]] = None  # decoding onwards from _stream_at, stacks restored
        self._stream_at = 0
        self._last: Optional[tuple[int, Snapshot]] = None  # the latest snapshot handed out, and its index
        gaps = [b - a for a, b in zip(self._times[:3601], self._times[1:3601]) if b > a]
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

    def _decoded(self, start: int, stop: int) -> list[Snapshot]:
        """Snapshots start..stop-1, decoding on from where the previous call stopped when it can."""
        out: list[Snapshot] = []
        i = start
        if self._last is not None and self._last[0] == i and i < stop:
            out.append(self._last[1])  # the one poll() just returned: the same object again
            i += 1
        if i < stop:
            if self._stream is None or not self._stream_at <= i <= self._stream_at + KEYFRAME_EVERY:
                self._stream, self._stream_at = self._index.snapshots(i, len(self._index)), i
            try:
                while self._stream_at < stop:
                    snap = next(self._stream)
                    if self._stream_at >= i:
                        out.append(snap)
                    self._stream_at += 1
            except _Unreadable as exc:
                self._stream = None
                raise GputopError(f"recording {self.path} is damaged ({exc}); replay stops there") from None
        if out:
            self._last = (stop - 1, out[-1])
        return out

    def poll(self) -> Snapshot:
        with self._lock:
            end = self._index_at(self._position_locked())
            return self._decoded(end - 1, end)[0]

    def drain(self) -> list[Snapshot]:
        with self._lock:
            end = self._index_at(self._position_locked())
            out = self._decoded(max(self._drained, end - self.window), end)
            self._drained = max(self._drained, end)
            return out

    def history_until(self) -> list[Snapshot]:
        """The snapshots up to the current position, the latest `window` of them (rebuild a history after a seek)."""
        with self._lock:
            end = self._index_at(self._position_locked())
            self._drained = end
            return self._decoded(max(0, end - self.window), end)

    def close(self) -> None:
        with self._lock:
            self._stream = None
            self._index.close()

"""Each rank's flight recorder, read from the dump its job writes: what the ranks' collectives did, for the
hang finding (gputop.analysis.collectives aligns them).

PyTorch's flight recorder is on when the rank's environment sets ``TORCH_FR_BUFFER_SIZE`` (older name
``TORCH_NCCL_TRACE_BUFFER_SIZE``).  It lives in the rank's memory; a dump reaches disk at
``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (older name ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, default
``/tmp/nccl_trace_rank_``) when the job writes one: NCCL's watchdog on a timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT=1``), or the job itself from a thread
(``torch._C._distributed_c10d._dump_fr_trace()``), as tests/jobs/collective_job.py does.  That file is
what this module reads, through the rank's own root (``/proc/PID/root``) so a container's path resolves.

The dump is a pickle (the format torch's ``fr_trace`` reads) or JSON (``_dump_fr_trace_json``).  The
pickle is read with an unpickler that resolves no globals: the dump holds only dicts, lists, strings and
numbers, and a file that asks for anything else is refused, so a planted file cannot run code here.
Files owned by another user than the rank's are refused too.  Reading never touches the job.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from typing import Any, Optional

from gputop.collect.procfs import read_environ
from gputop.model import CHANNEL_DUMP, CollectiveEntry, FlightRecord

BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"
MAX_DUMP_BYTES = 64 << 20
KEEP_DONE = 1  # completed collectives kept per process group before the pending ones
KEEP_ENTRIES = 16  # at most this many per process group


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the dump asks for {module}.{name}: not a flight recorder dump")


def recorder_on(env: dict[str, str]) -> bool:
    """The rank's environment turns the flight recorder on (a buffer size above 0)."""
    for name in BUFFER_VARS:
        try:
            if int(env.get(name, "0") or "0") > 0:
                return True
        except ValueError:
            continue
    return False


def dump_path(env: dict[str, str], rank: Optional[int]) -> str:
    """Where the rank's dump lands, as the rank sees its filesystem."""
    prefix = next((env[v] for v in DUMP_VARS if env.get(v)), DEFAULT_DUMP_PREFIX)
    return f"{prefix}{rank if rank is not None else 0}"


def _frame(f: Any) -> str:
    if isinstance(f, dict):
        return f"{f.get('name', '?')} ({os.path.basename(str(f.get('filename', '?')))}:{f.get('line', '?')})"
    return str(f)


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(n) for n in shape) for shape in value or () if isinstance(shape, (list, tuple)))


def _entry(e: dict[str, Any], groups: dict[str, str]) -> CollectiveEntry:
    pg = e.get("process_group") or ("", "")
    name = str(pg[0]) if len(pg) > 0 else ""
    state = str(e.get("state", ""))
    created = e.get("time_created_ns")
    return CollectiveEntry(
        seq=int(e.get("collective_seq_id") or 0),
        op=str(e.get("profiling_name", "?")),
        process_group=name,
        group_desc=str(pg[1]) if len(pg) > 1 else groups.get(name, ""),
        sizes=_sizes(e.get("input_sizes")),
        dtypes=tuple(str(d) for d in e.get("input_dtypes") or ()),
        state=state,
        done=state == "completed" or bool(e.get("retired")),
        created=created / 1e9 if isinstance(created, (int, float)) else 0.0,
        timeout_ms=int(e["timeout_ms"]) if isinstance(e.get("timeout_ms"), (int, float)) else None,
        frames=tuple(_frame(f) for f in e.get("frames") or ()),
    )


def _groups(pg_config: Any, entries: list[CollectiveEntry]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(group name, its ranks).  torch 2.13's gloo recorder files the default group under "" in pg_config
    while its entries name it "0": a lone unnamed config is the entries' only group."""
    out: dict[str, tuple[int, ...]] = {}
    names = {e.process_group for e in entries}
    for key, config in (pg_config or {}).items():
        try:
            ranks = json.loads(config.get("ranks", "[]")) if isinstance(config.get("ranks"), str) else config.get("ranks")
            members = tuple(int(r) for r in ranks)
        except (ValueError, TypeError, AttributeError):
            continue
        name = str(key)
        if name == "" and len(pg_config) == 1 and len(names) == 1:
            name = next(iter(names))
        out[name] = members
    return tuple(sorted(out.items()))


def parse_dump(
    data: bytes, *, pid: int = 0, rank: Optional[int] = None, source: str = "", written: float = 0.0, channel: str = CHANNEL_DUMP
) -> FlightRecord:
    """A flight recorder dump (pickle or JSON) as gputop keeps it; its `error` says what was wrong with it."""
    try:
        if data[:1] == b"{":
            raw = json.loads(data)
        else:
            raw = _DataOnly(io.BytesIO(data)).load()
        if not isinstance(raw, dict) or not isinstance(raw.get("entries", []), list):
            raise ValueError("no entries")
        all_entries = [_entry(e, {}) for e in raw.get("entries", []) if isinstance(e, dict)]
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, KeyError, IndexError, AttributeError) as exc:
        why = f"{source or 'the dump'} is not a flight recorder dump ({exc})"
        return FlightRecord(pid, rank, source, written, error=why, channel=channel)
    kept: list[CollectiveEntry] = []
    for group in sorted({e.process_group for e in all_entries}):
        mine = sorted((e for e in all_entries if e.process_group == group and e.seq > 0), key=lambda e: e.seq)
        first_pending = next((i for i, e in enumerate(mine) if not e.done), len(mine))
        kept += mine[max(0, first_pending - KEEP_DONE) :][:KEEP_ENTRIES]
    return FlightRecord(pid, rank, source, written, tuple(kept), _groups(raw.get("pg_config"), all_entries), channel=channel)


class FlightRecorderReader:
    """Reads each rank's dump when it changed (keyed by path, mtime and size); nothing for ranks without the recorder."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[tuple[str, float, int], FlightRecord]] = {}

    def wants_live_read(self, pid: int, rank: Optional[int], started: float = 0.0) -> bool:
        """The rank's recorder is on and it has written no dump file (none, or only an earlier run's, older
        than the rank's `started`): only an in-process read can see it."""
        env = read_environ(pid)
        if env is None or not recorder_on(env):
            return False
        path = dump_path(env, rank)
        try:
            return os.stat(f"/proc/{pid}/root{path}" if path.startswith("/") else path).st_mtime < started
        except OSError:
            return True

    def read(
        self, pid: int, rank: Optional[int], started: float = 0.0, live: Optional[FlightRecord] = None
    ) -> Optional[FlightRecord]:
        """The rank's record (None: its recorder is off); a rank that exited keeps its last one.  A dump older
        than the rank (`started`, its start time) is an earlier run's left in the same place: not read.  With no
        dump file, `live` (a read through the rank's debug server or from inside it, `gputop.inject.fr_read`) stands
        in for it."""
        env = read_environ(pid)
        if env is None:
            cached = self._cache.get(pid)
            return cached[1] if cached is not None else None
        if not recorder_on(env):
            return None
        try:
            uid: Optional[int] = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            uid = None
        path = dump_path(env, rank)
        seen = f"/proc/{pid}/root{path}" if path.startswith("/") else path
        try:
            st = os.stat(seen)
        except OSError:
            if live is not None:
                self._cache[pid] = ((path, -1.0, -1), live)  # kept should the rank exit
                return live
            return FlightRecord(
                pid, rank, path, error=f"no dump at {path}, and no in-process read yet (one starts once a rank stands still)"
            )
        if uid is not None and st.st_uid not in (uid, os.getuid()):
            return FlightRecord(pid, rank, path, error=f"{path} belongs to another user: not read")
        if st.st_mtime < started:
            if live is not None:
                return live
            return FlightRecord(pid, rank, path, error=f"the dump at {path} predates this rank (an earlier run's): not read")
        if st.st_size > MAX_DUMP_BYTES:
            return FlightRecord(pid, rank, path, error=f"{path} is {st.st_size >> 20} MiB: too large to read each second")
        key = (path, st.st_mtime, st.st_size)
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            with open(seen, "rb") as f:
                data = f.read(MAX_DUMP_BYTES + 1)
        except OSError as exc:
            return FlightRecord(pid, rank, path, error=f"cannot read {path}: {exc.strerror}")
        record = parse_dump(data, pid=pid, rank=rank, source=path, written=st.st_mtime)
        self._cache[pid] = (key, record)
        return record

    def forget_except(self, pids: set[int]) -> None:
        for pid in [p for p in self._cache if p not in pids]:
            del self._cache[pid]

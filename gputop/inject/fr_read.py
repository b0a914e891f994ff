"""Read a rank's flight recorder live, for a job that turned the recorder on but writes no dump file.

A rank that runs PyTorch's debug server (``torch.distributed.debug.start_debug_server()``) is asked through it
(``fr_trace_json`` over loopback HTTP, `gputop.collect.debug_server`) and nothing is injected, whatever the
answer: the job chose that channel.  Only a rank without one is read from inside (`read_live`).

The in-process read injects `gputop.inject.fr_agent` under the injection's rules (`gputop.inject.injector`): one
injection into a process at a time (`InjectionLock`), a stopped or exited process or another user's refused
in one line, the agent's thread started by the safe-point injector from a thread parked at a safe point (so
it runs while the main thread waits in a collective, sleeps, or blocks in a read), a bootstrap that failed
said as such.  The agent calls ``_dump_fr_trace_json()`` once and answers in its private run directory; the
JSON goes through the same parser as the dump files (`gputop.collect.flight_recorder.parse_dump`).  Every
failure comes back as the record's one-line `error`, never raised: the hang finding then comes from stacks
and says why the recorder was not read.

`LiveRecorderReads` runs these reads in the background for the collector, once per rank per `REREAD_S` (a
failed one again after `RETRY_S`); a report's end lets the reads in flight land (`wait_idle`, at most `LAND_S`),
so the ticket does not call a rank unread a second before its read answers.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Optional, Sequence

from gputop.collect import debug_server
from gputop.collect.flight_recorder import MAX_DUMP_BYTES, parse_dump
from gputop.errors import GputopError
from gputop.inject import injector
from gputop.model import CHANNEL_DEBUG_SERVER, CHANNEL_IN_PROCESS, FlightRecord

FR_AGENT_FILES = ("inject/fr_agent.py", "inject/agent.py")
ANSWER_S = 5.0  # the read itself takes milliseconds; this bounds a thread the job could not schedule
REREAD_S = 60.0  # a rank's recorder is read again at most this often while the job still looks stuck
RETRY_S = 10.0  # ... and a read that failed (no safe thread in time on a loaded box), this often
LAND_S = 2 * ANSWER_S  # a report's end waits at most this long for the reads in flight (the injection, then the answer)

OFF_VAR = "GPUTOP_NO_RECORDER_READ"  # set (to anything but "" or "0"): gputop never injects to read a recorder
# (a rank's debug server is still asked: that is no injection)

Reader = Callable[[int, Optional[int]], FlightRecord]


def reads_turned_off() -> bool:
    """The user turned the in-process reads off (`OFF_VAR`): the hang finding then comes from dumps or stacks."""
    return os.environ.get(OFF_VAR, "") not in ("", "0")


def source_of(pid: int) -> str:
    return f"an in-process read of PID {pid}"


def read_live(pid: int, rank: Optional[int]) -> FlightRecord:
    """The rank's flight recorder: through its debug server when it runs one (nothing injected), else from
    inside it (unless `OFF_VAR` turned that off)."""
    server = debug_server.find(pid)
    if server is not None:
        return read_through_debug_server(server, rank)
    if reads_turned_off():
        return FlightRecord(
            pid, rank, source_of(pid), error=f"in-process reads are turned off (${OFF_VAR}) and the rank runs no debug server"
        )
    return read_in_process(pid, rank)


def read_through_debug_server(server: debug_server.DebugServer, rank: Optional[int]) -> FlightRecord:
    """``fr_trace_json`` from the rank's debug server; the record's `error` says why not."""
    source = server.describe()
    asked = time.time()
    try:
        data = debug_server.call(server, "fr_trace_json")
    except debug_server.DebugServerError as exc:
        debug_server.SERVERS.forget(server)
        return FlightRecord(server.pid, rank, source, error=str(exc), channel=CHANNEL_DEBUG_SERVER)
    return parse_dump(data, pid=server.pid, rank=rank, source=source, written=asked, channel=CHANNEL_DEBUG_SERVER)


def read_in_process(pid: int, rank: Optional[int], results_root: Optional[tuple[str, str]] = None) -> FlightRecord:
    """The rank's flight recorder, read once from inside it; the record's `error` says why not, in one line."""
    source = source_of(pid)
    try:
        target = injector.inspect_target(pid)
        with injector.InjectionLock(pid, "gputop flight recorder read"):
            run = injector.prepare_run_dir(target, {"read": "flight recorder"}, results_root, files=FR_AGENT_FILES)
            try:
                at_injection = time.time()
                injector.inject_agent(target, run, agent_file="fr_agent.py", thread_name="gputop-fr-agent")
                return _answer(pid, rank, run, at_injection)
            finally:
                injector.remove_run_dir(run)
    except GputopError as exc:
        return FlightRecord(pid, rank, source, error=f"the in-process read was refused: {exc}")


def _answer(pid: int, rank: Optional[int], run: injector.RunDir, at_injection: float) -> FlightRecord:
    """Wait (bounded) for the agent's answer and parse the recorder it handed back."""
    source = source_of(pid)
    deadline = time.monotonic() + ANSWER_S
    answer = None
    while answer is None and time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        answer = injector.read_private_json(run.host_path, "result.json")
        if answer is None:
            time.sleep(0.05)  # polling the agent's private directory within the deadline
    if answer is None:
        failed = injector.bootstrap_error(run)
        why = f"the agent's thread could not start: {failed}" if failed else f"the agent did not answer within {ANSWER_S:g} s"
        if not os.path.exists(f"/proc/{pid}"):
            why = "the process exited during the read"
        return FlightRecord(pid, rank, source, error=f"in-process read of PID {pid}: {why}")
    if answer.get("error"):
        return FlightRecord(pid, rank, source, error=f"in-process read of PID {pid}: {answer['error']}")
    data = injector.read_private_bytes(run.host_path, str(answer.get("file") or ""), MAX_DUMP_BYTES)
    if not data:
        return FlightRecord(pid, rank, source, error=f"in-process read of PID {pid}: the agent handed back no recorder")
    return parse_dump(data[:MAX_DUMP_BYTES], pid=pid, rank=rank, source=source, written=at_injection, channel=CHANNEL_IN_PROCESS)


class LiveRecorderReads:
    """The collector's in-process reads: started in the background (one thread a rank, never two at once for the
    same rank), each rank read at most once per `every_s`; the latest record of each rank kept for `get`."""

    def __init__(self, read: Reader = read_live, every_s: float = REREAD_S, retry_s: float = RETRY_S) -> None:
        self._read = read
        self._every_s = every_s
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified as each read ends
        self._records: dict[int, FlightRecord] = {}
        self._started: dict[int, float] = {}  # pid -> monotonic time its latest read started
        self._running: set[int] = set()

    def request(self, ranks: Sequence[tuple[int, Optional[int]]]) -> list[int]:
        """Start a read of each (pid, rank) not being read and not read within `every_s` (`retry_s` after a
        failed read); the PIDs started."""
        now = time.monotonic()
        with self._lock:
            due = [(pid, rank) for pid, rank in ranks if pid not in self._running and now >= self._next_read(pid)]
            for pid, _rank in due:
                self._running.add(pid)
                self._started[pid] = now
        for pid, rank in due:
            threading.Thread(target=self._run, args=(pid, rank), name=f"gputop-fr-read-{pid}", daemon=True).start()
        return [pid for pid, _rank in due]

    def _next_read(self, pid: int) -> float:
        if pid not in self._started:
            return 0.0
        last = self._records.get(pid)
        return self._started[pid] + (self._retry_s if last is not None and last.error else self._every_s)

    def _run(self, pid: int, rank: Optional[int]) -> None:
        try:
            record = self._read(pid, rank)
        except Exception as exc:  # a read never takes the collector down; its record says why
            record = FlightRecord(pid, rank, source_of(pid), error=f"in-process read failed: {type(exc).__name__}: {exc}")
        with self._lock:
            self._records[pid] = record
            self._running.discard(pid)
            self._idle.notify_all()

    def get(self, pid: int) -> Optional[FlightRecord]:
        with self._lock:
            return self._records.get(pid)

    def busy(self) -> bool:
        with self._lock:
            return bool(self._running)

    def wait_idle(self, timeout: float) -> bool:
        """Block until no read is in flight, at most `timeout` s; whether none is."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, timeout)

    def forget_except(self, pids: set[int]) -> None:
        with self._lock:
            for table in (self._records, self._started):
                for pid in [p for p in table if p not in pids]:
                    del table[pid]

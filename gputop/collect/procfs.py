"""Readers of /proc: a process's children, names, command line, environment and status, and the
`ProcessTable` that keeps one psutil handle per live process between scans.

A process is identified by (pid, create_time) throughout, so a new process that inherits an old PID is
never taken for the old one.  Nothing here interprets what a process is for (see `job_tree`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from typing import Optional

import psutil

from gputop.model import ProcessProgress, ProcInfo, ThreadProgress

# psutil status names -> the letters of /proc/PID/stat and ps(1)
_STATE_LETTERS = {
    "running": "R",
    "sleeping": "S",
    "disk-sleep": "D",
    "stopped": "T",
    "tracing-stop": "t",
    "zombie": "Z",
    "dead": "X",
    "idle": "I",
    "parked": "P",
    "wake-kill": "K",
    "waking": "W",
}

ProcKey = tuple[int, float]  # (pid, create_time)


def children_pids(pid: int) -> list[int]:
    """Direct children, from /proc/PID/task/*/children (no scan of all of /proc)."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    found_file = False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found_file = True
                kids.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    if not found_file:  # kernel without CONFIG_PROC_CHILDREN
        try:
            return [c.pid for c in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    return kids


def read_thread_comm(pid: int, tid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm", "rb") as f:
            return f.read().rstrip(b"\n").decode("utf-8", "replace")
    except OSError:
        return None


def _read_nul_separated(pid: int, name: str) -> Optional[list[bytes]]:
    """/proc/PID/<name> (cmdline, environ) split at its NULs, or None where we may not read it.

    Read as bytes and decoded by the caller as UTF-8: the locale's encoding (ASCII under LANG=C) would
    turn every non-ASCII path into lone surrogates."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if raw.endswith(b"\0"):
        raw = raw[:-1]
    return raw.split(b"\0") if raw else []


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def read_environ(pid: int) -> Optional[dict[str, str]]:
    """The process's initial environment, or None where we may not read it (another user, no root)."""
    items = _read_nul_separated(pid, "environ")
    if items is None:
        return None
    env = {}
    for item in items:
        key, sep, value = item.partition(b"=")
        if sep:
            env[_text(key)] = _text(value)
    return env


def read_cmdline(pid: int) -> tuple[str, ...]:
    """The command line (empty for zombies, kernel threads and processes we may not read)."""
    items = _read_nul_separated(pid, "cmdline") or []
    if len(items) == 1 and b" " in items[0]:  # a process that rewrote its title (setproctitle) as one string
        items = items[0].split(b" ")
    return tuple(_text(item) for item in items)


def int_or_none(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# ----------------------------------------------------------------- process table


@dataclass(frozen=True)
class ProcStat:
    """The few fields of /proc/PID/stat that identify a process and place it in the tree."""

    comm: str
    state: str
    ppid: int
    start_ticks: int  # start time in clock ticks since boot: with the PID, names one process for good
    flags: int = 0  # the kernel's PF_* bits (PF_EXITING: being torn down, not yet a zombie)
    cpu_ticks: int = 0  # user + system time of all its threads, in clock ticks


def read_stat(pid: int, tid: Optional[int] = None) -> Optional[ProcStat]:
    """/proc/PID/stat, or with `tid` one thread's /proc/PID/task/TID/stat (its own CPU time)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm sits in parentheses and may itself hold spaces or ')': split at the last ')'
    left, right = raw.find(b"("), raw.rfind(b")")
    fields = raw[right + 2 :].split()
    try:
        return ProcStat(
            comm=raw[left + 1 : right].decode("utf-8", "replace"),
            state=fields[0].decode(),
            ppid=int(fields[1]),
            start_ticks=int(fields[19]),
            flags=int(fields[6]),
            cpu_ticks=int(fields[11]) + int(fields[12]),
        )
    except (IndexError, ValueError):
        return None


def read_tracer(pid: int) -> Optional[str]:
    """What traces the process ("PID 123 (gdb)", from TracerPid in /proc/PID/status); None: no tracer."""
    tracer = int_or_none(read_status_fields(f"/proc/{pid}/status", ("TracerPid",)).get("TracerPid", "").strip())
    if not tracer:
        return None
    stat = read_stat(tracer)
    return f"PID {tracer} ({stat.comm})" if stat is not None else f"PID {tracer}"


def _session_of(pid: int) -> Optional[int]:
    """The process's session id (None: gone)."""
    try:
        return os.getsid(pid)
    except OSError:
        return None


def read_exit_status(pid: int) -> Optional[int]:
    """A zombie's exit status as waitpid(2) gives it (/proc/PID/stat field 52, Linux 3.5+; 0 while it runs); None
    where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        return int(raw[raw.rfind(b")") + 2 :].split()[49])
    except (OSError, IndexError, ValueError):
        return None


def read_status_fields(path: str, keys: tuple[str, ...]) -> dict[str, str]:
    """The named fields of a /proc status file (the text after each colon); {} where unreadable."""
    try:
        with open(path, "rb") as f:
            raw = b"\n" + f.read()
    except OSError:
        return {}
    # A search per key, not a loop over the ~57 lines as text: read_progress reads two of these a thread
    # beside every dump, and the line loop took 3 times as long as the read.
    found: dict[str, str] = {}
    for key in keys:
        start = raw.find(b"\n" + key.encode() + b":")
        if start >= 0:
            start += len(key) + 2
            end = raw.find(b"\n", start)
            found[key] = raw[start : end if end >= 0 else None].decode("utf-8", "replace").strip()
    return found


def read_status_field(pid: int | str, key: str) -> Optional[str]:
    """One field of /proc/PID/status (CapEff, NSpid, ...), the text after its colon."""
    return read_status_fields(f"/proc/{pid}/status", (key,)).get(key)


def read_ns_pids(pid: int) -> tuple[int, ...]:
    """/proc/PID/status NSpid: the process's PID in each PID namespace it belongs to, outermost (ours)
    first and its own innermost last; () on kernels before 4.1 or where unreadable."""
    field = read_status_field(pid, "NSpid")
    try:
        return tuple(int(x) for x in field.split()) if field else ()
    except ValueError:
        return ()


# ----------------------------------------------------------------- progress counters

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_SWITCH_KEYS = ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")


def read_io_chars(pid: int) -> tuple[Optional[int], Optional[int]]:
    """(rchar, wchar) of /proc/PID/io: bytes passed through read/write-like calls, cache or not.
    (None, None) where the file is not ours to read (it needs ptrace-read rights)."""
    fields = read_status_fields(f"/proc/{pid}/io", ("rchar", "wchar"))
    return int_or_none(fields.get("rchar")), int_or_none(fields.get("wchar"))


def read_thread_progress(pid: int, tid: int) -> Optional[ThreadProgress]:
    switches = read_status_fields(f"/proc/{pid}/task/{tid}/status", _SWITCH_KEYS)
    stat = read_stat(pid, tid)
    voluntary = int_or_none(switches.get("voluntary_ctxt_switches"))
    involuntary = int_or_none(switches.get("nonvoluntary_ctxt_switches"))
    if stat is None or voluntary is None or involuntary is None:
        return None  # the thread ended between the listing and the read
    return ThreadProgress(tid=tid, voluntary_switches=voluntary, involuntary_switches=involuntary, cpu_ticks=stat.cpu_ticks)


def read_progress(pid: int) -> Optional[ProcessProgress]:
    """Counters that move while `pid` makes progress (CPU time, I/O bytes, each thread's context switches);
    None if it is gone.  About 2 small reads a thread: cheap next to the py-spy dump it goes with."""
    stat = read_stat(pid)
    if stat is None:
        return None
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        tids = []
    threads = tuple(t for t in (read_thread_progress(pid, tid) for tid in tids) if t is not None)
    read_chars, write_chars = read_io_chars(pid)
    return ProcessProgress(
        cpu_seconds=stat.cpu_ticks / CLOCK_TICKS,
        io_read_chars=read_chars,
        io_write_chars=write_chars,
        threads=threads,
    )


PF_EXITING = 0x4  # /proc/PID/stat flags: set as the kernel starts tearing the process down (before the zombie)


def process_alive(pid: int) -> bool:
    """Running (or sleeping...) rather than gone, exiting or a zombie.

    A SIGKILLed process loses its memory and /proc/PID/exe a moment before /proc shows it as a zombie;
    py-spy fails in that moment ("No such process", "Failed to get process executable name").  The
    kernel marks the process PF_EXITING before either, so it counts as gone here from then on.
    """
    stat = read_stat(pid)  # /proc/PID/stat is readable for every process, whoever owns it
    return stat is not None and stat.state not in ("Z", "X") and not stat.flags & PF_EXITING


def stopped_by(pid: int) -> Optional[str]:
    """What holds `pid` stopped, in words, or None while it runs (or sleeps, or is gone).  State ``T`` is a
    job-control stop (SIGSTOP, SIGTSTP from a Ctrl-Z, a scheduler's suspend: the kernel does not say which);
    ``t`` is a debugger's stop, and /proc names the debugger (TracerPid)."""
    stat = read_stat(pid)
    if stat is None or stat.state not in ("T", "t"):
        return None
    if stat.state == "t":
        tracer = read_tracer(pid)
        return f"by the debugger {tracer}" if tracer else "by a debugger"
    return "SIGSTOP"


@dataclass
class Tracked:
    """What we remember about one (pid, create_time): static facts read once, and the psutil handle
    whose cpu_percent() needs the previous call's times."""

    proc: psutil.Process
    key: ProcKey
    start_ticks: int
    cmdline: tuple[str, ...]
    env: Optional[dict[str, str]]
    comm: str = ""
    ppid: int = 0
    cpu_ticks: int = 0  # CPU time at the last stat read (decides whose stacks may have changed)
    cpu_primed: bool = False
    last: Optional[ProcInfo] = None


class ProcessTable:
    """psutil.Process objects kept between collects, keyed by (pid, create_time).

    Each scan (one collect) starts with `begin_scan()`; within it a PID's /proc/PID/stat is read once.
    """

    def __init__(self) -> None:
        self._by_pid: dict[int, Tracked] = {}
        self._seen: set[int] = set()  # PIDs looked up since the last prune()
        self._checked: set[int] = set()  # PIDs whose stat was read in this scan
        self._children: dict[int, list[int]] = {}  # children lists read in this scan
        self._thread_names: dict[int, dict[int, tuple[Optional[str], bool]]] = {}  # pid -> tid -> (comm, settled)
        self._lock = threading.Lock()

    def begin_scan(self) -> None:
        with self._lock:
            self._checked = set()
            self._children = {}

    def get(self, pid: int) -> Optional[Tracked]:
        """The live process behind `pid` (a new one if the PID was reused), or None if it is gone."""
        with self._lock:
            self._seen.add(pid)
            tracked = self._by_pid.get(pid)
            if tracked is not None and pid in self._checked:
                return tracked
            stat = read_stat(pid)
            if stat is None or stat.state in ("Z", "X"):  # gone, or a zombie waiting to be reaped
                self._by_pid.pop(pid, None)
                return None
            self._checked.add(pid)
            if tracked is not None and tracked.start_ticks == stat.start_ticks:
                tracked.comm, tracked.ppid, tracked.cpu_ticks = stat.comm, stat.ppid, stat.cpu_ticks
                return tracked
            # first sight, or the PID now belongs to a newer process: start afresh
            try:
                proc = psutil.Process(pid)
                key = (pid, proc.create_time())
            except psutil.Error:
                self._by_pid.pop(pid, None)
                return None
            tracked = Tracked(
                proc=proc,
                key=key,
                start_ticks=stat.start_ticks,
                cmdline=read_cmdline(pid),
                env=read_environ(pid),
                comm=stat.comm,
                ppid=stat.ppid,
                cpu_ticks=stat.cpu_ticks,
            )
            self._by_pid[pid] = tracked
            return tracked

    def children(self, pid: int) -> list[int]:
        """Direct children of `pid`, read once per scan."""
        with self._lock:
            kids = self._children.get(pid)
        if kids is None:
            kids = children_pids(pid)
            with self._lock:
                self._children[pid] = kids
        return kids

    def threads_named(self, pid: int, comm: str) -> tuple[int, ...]:
        """TIDs of `pid`'s threads called `comm`.  A thread's name is read when it is first seen and once
        more a scan later (a thread names itself just after it starts), not on every scan."""
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return ()
        with self._lock:
            known = self._thread_names.setdefault(pid, {})
            stale = [t for t in known if t not in tids]
            for tid in stale:
                del known[tid]
            todo = [t for t in tids if t not in known or not known[t][1]]
        for tid in todo:
            name = read_thread_comm(pid, tid)
            with self._lock:
                settled = tid in known  # second reading: keep it from now on
                known[tid] = (name, settled)
        target = comm
        with self._lock:
            return tuple(sorted(t for t, (name, _) in known.items() if name == target))

    def is_current(self, tracked: Tracked) -> bool:
        """Is this exact process (not a successor on its PID) still alive?"""
        current = self.get(tracked.key[0])
        return current is not None and current.key == tracked.key

    def info(self, tracked: Tracked) -> ProcInfo:
        """A fresh ProcInfo (state, CPU %, RSS, last core); marks it exited if it is gone."""
        proc = tracked.proc
        try:
            with proc.oneshot():  # one read of /proc/PID/stat serves all but RSS
                status = proc.status()
                name = proc.name()
                ppid = proc.ppid()
                cpu = proc.cpu_percent(interval=None)
                try:
                    rss: Optional[int] = proc.memory_info().rss
                except psutil.AccessDenied:
                    rss = None
                try:
                    core: Optional[int] = proc.cpu_num()
                except (psutil.AccessDenied, AttributeError):
                    core = None
        except psutil.NoSuchProcess:
            return self.mark_exited(tracked)
        except psutil.AccessDenied:
            status, name, ppid, cpu, rss, core = "?", tracked.comm or "?", tracked.ppid, None, None, None
        letter = _STATE_LETTERS.get(status, status[:1].upper() if status else "?")
        # psutil's first cpu_percent() has nothing to compare with and says 0.0: report "not yet known".
        cpu_percent = cpu if tracked.cpu_primed else None
        tracked.cpu_primed = True
        info = ProcInfo(
            pid=tracked.key[0],
            ppid=ppid,
            name=name,
            cmdline=tracked.cmdline,
            state=letter,
            cpu_percent=cpu_percent,
            rss=rss,
            core=core,
            create_time=tracked.key[1],
            exited=status == psutil.STATUS_ZOMBIE,
            tracer=read_tracer(tracked.key[0]) if letter in ("T", "t") else None,
            exit_status=read_exit_status(tracked.key[0]) if letter == "Z" else None,
            session=_session_of(tracked.key[0]),
        )
        tracked.last = info
        return info

    def mark_exited(self, tracked: Tracked) -> ProcInfo:
        last = tracked.last or ProcInfo(pid=tracked.key[0], ppid=0, name="?", cmdline=tracked.cmdline, create_time=tracked.key[1])
        tracked.last = replace(last, exited=True, state="X", cpu_percent=None)
        return tracked.last

    def prune(self) -> None:
        """Forget processes not looked up since the last prune (exited workers of past epochs, ...)."""
        with self._lock:
            for pid in [p for p in self._by_pid if p not in self._seen]:
                del self._by_pid[pid]
            for pid in [p for p in self._thread_names if p not in self._seen]:
                del self._thread_names[pid]
            self._seen = set()

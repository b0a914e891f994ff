"""Processes in tests: wait on conditions with deadlines, start processes that are always reaped, look into /proc."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence, TypeVar

import psutil

from tests.harness.box_load import BoxLoad

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 20.0,
    interval: float = 0.05,
    what: str = "condition",
    state: Optional[Callable[[], object]] = None,
) -> T:
    """Poll `predicate` until it returns something truthy; fail the test at the deadline.

    This is a deadline on a condition, not a sleep used as synchronisation. `state`, when given, says in the
    failure what was seen instead (the verdict that stood at the deadline), so a failure on CI explains itself.
    """
    deadline = time.monotonic() + timeout
    box = BoxLoad()
    last_exc: Optional[BaseException] = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the condition may not be evaluable yet (file missing, ...)
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            if state is not None:
                detail += f"; at the deadline: {state()}"
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}; {box.since()}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server or a torchrun rendezvous the test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Spawner:
    """Starts child processes in their own process group and kills every group at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self._reaped: list[subprocess.Popen] = []

    def __call__(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(list(argv), **kwargs)
        self.procs.append(proc)
        return proc

    def python(self, code_or_args: Sequence[str] | str, **kwargs) -> subprocess.Popen:
        argv = [sys.executable, "-c", code_or_args] if isinstance(code_or_args, str) else [sys.executable, *code_or_args]
        return self(argv, **kwargs)

    def reap_all(self) -> None:
        for proc in self.procs:
            self.reap(proc)

    def reap(self, proc: subprocess.Popen) -> None:
        """Kill and reap one process this spawner started, with its whole tree (a test done with a job stops its
        CPU use there, not at teardown); teardown's `reap_all` passes over it."""
        if proc in self._reaped:  # its PID (and group ID) may be another process's by now
            return
        self._reaped.append(proc)
        # Launchers such as torchrun start each rank in a session of its own, out of reach of the
        # group kill below; take the whole tree while the launcher still holds it together. Each
        # multiprocessing resource tracker is spared until the rest is dead: it then unlinks the named
        # semaphores of its job's spawn-context queues and exits. Killed with the rest, it left them in
        # /dev/shm for good (two for every torch.multiprocessing.spawn job).
        descendants = _descendants(proc.pid)
        trackers = [d for d in descendants if _is_resource_tracker(d)]
        for descendant in descendants:
            if descendant not in trackers:
                try:
                    descendant.kill()
                except psutil.Error:
                    pass
        if proc.poll() is None:
            try:
                if trackers:
                    proc.kill()  # the leader alone: the group kill below comes after the trackers are done
                else:
                    os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        psutil.wait_procs(trackers, timeout=10)
        # the group may hold grandchildren (DataLoader workers) even after the leader exited
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


EXEC_SETTLE_S = 5.0  # how long a process caught in the middle of its exec may take to show its command line


def _is_resource_tracker(process: psutil.Process) -> bool:
    # A process caught in the middle of its exec shows an empty command line: a job reaped ~70 ms after it started
    # its tracker (a loaded box) killed it in that window, and its semaphores stayed in /dev/shm
    deadline = time.monotonic() + EXEC_SETTLE_S
    try:
        while not (cmdline := process.cmdline()) and process.status() != psutil.STATUS_ZOMBIE:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)  # a poll on the process's own state, bounded by the deadline above
        return "multiprocessing.resource_tracker" in " ".join(cmdline)
    except psutil.Error:
        return False


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


class Ran(NamedTuple):
    """What a gputop command did: its exit status and output (decoded as UTF-8, whatever the locale)."""

    rc: int
    out: str
    err: str


def start_gputop(
    spawn, *args: str, env: Optional[dict] = None, python: str = sys.executable, cwd: Optional[Path] = None
) -> subprocess.Popen:
    """`python -m gputop ARGS` started as a child of the `spawn` fixture (so it is reaped); `finish` it."""
    return spawn(
        [python, "-m", "gputop", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(cwd) if cwd else None
    )


def finish(proc: subprocess.Popen, timeout: float = 90) -> Ran:
    """Wait for a `start_gputop` command to end and take what it wrote."""
    out, err = proc.communicate(timeout=timeout)
    return Ran(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def run_gputop(
    spawn, *args: str, env: Optional[dict] = None, timeout: float = 90, python: str = sys.executable, cwd: Optional[Path] = None
) -> Ran:
    """`python -m gputop ARGS` as a child of the `spawn` fixture (so it is reaped), run to the end."""
    return finish(start_gputop(spawn, *args, env=env, python=python, cwd=cwd), timeout=timeout)


def children(pid: int) -> set[int]:
    kids: set[int] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            kids |= {int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()}
        except OSError:
            continue
    return kids


def thread_ids(pid: int) -> set[int]:
    return {int(tid) for tid in os.listdir(f"/proc/{pid}/task")}

"""Many safe-point injections into one live job, each checked against the job's own counter.

`hammer` injects N times in a row (in this process: the injector's own path, without the helper's start
per call) and after each waits, with a deadline, for the job's counter to move.  A job that stops moving
is frozen, one that is gone is dead: the tally says which injection it followed.  Each injection also
starts gputop's real bootstrap, whose agent file leaves a file of its own, so a test counts what really ran.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gputop.collect.procfs import process_alive
from gputop.inject import safepoint
from gputop.inject.injector import bootstrap_code
from tests.harness.processes import wait_until

ALLOCATING_JOB = str(Path(__file__).resolve().parents[1] / "jobs" / "harm_job.py")  # with no options: issue 26's job
# train_job.py's nearest shape (num_workers=0, 64 small tensors collated a batch): for its torchrun ranks
ALLOCATING = ("--workers", "0", "--batch-size", "64")
MOVE_TIMEOUT_S = 10.0  # a step takes milliseconds: a job that takes no step in 10 s is frozen


@dataclass
class Tally:
    ran: int = 0
    refused: Counter = field(default_factory=Counter)
    syscalls: Counter = field(default_factory=Counter)
    frozen_after: list = field(default_factory=list)  # injection indices after which the job stopped moving
    dead_after: list = field(default_factory=list)
    slowest_s: float = 0.0
    failed_calls: int = 0  # reached the call, but the job could not start the line's thread

    @property
    def harmed(self) -> bool:
        return bool(self.frozen_after or self.dead_after)


def start_allocating_job(
    spawn, directory: Path, name: str, workers: int = 0, seconds: float = 0.0
) -> tuple[int, Callable[[], int]]:
    """tests/jobs/harm_job.py as issue 26's job (num_workers=0, 64 small tensors a batch), once it has taken steps:
    (pid, its step count, read from its step word: every step, not every 20th).  With `seconds` the job returns
    from main after that long in its loop; its stderr is in NAME.err."""
    counter = directory / f"{name}.count"
    word = directory / f"{name}.word"
    word.write_bytes(bytes(8))  # made here, so that it can be mapped before the job has started
    proc = spawn(
        [
            sys.executable,
            ALLOCATING_JOB,
            str(counter),
            "--workers",
            str(workers),
            "--seconds",
            str(seconds),
            "--step-word",
            str(word),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(directory / f"{name}.err", "w"),
    )
    read = step_word(word)
    wait_until(lambda: read() > 0 or proc.poll() is not None, timeout=120, what=f"{name} to take steps")
    assert proc.poll() is None, (directory / f"{name}.err").read_text()[-2000:]
    return proc.pid, read


def step_word(path: Path) -> Callable[[], int]:
    """The step count harm_job.py stores with --step-word: one native 8-byte word of `path`, mapped shared (the
    job's page), read with one aligned load, so a read never sees half of a store."""
    with open(path, "rb") as f:
        word = memoryview(mmap.mmap(f.fileno(), 8, access=mmap.ACCESS_READ)).cast("q")
    return lambda: int(word[0])


def step_counter(path: Path) -> Callable[[], int]:
    def read() -> int:
        try:
            return int(path.read_text() or 0)
        except (OSError, ValueError):
            return -1

    return read


def size_counter(path: Path) -> Callable[[], int]:
    """A step log's size: it grows by a line every step."""

    def read() -> int:
        try:
            return os.path.getsize(path)
        except OSError:
            return -1

    return read


# The agent file each injected bootstrap runs (on its own daemon thread, as the benchmark's does): it
# leaves one file in the marker directory, so a test counts the bootstraps that really ran.
MARKER_AGENT = "import os, uuid\nopen(os.path.join({!r}, uuid.uuid4().hex), 'w').close()\n"


def hammer(pid: int, count: int, progress: Callable[[], int], marker_dir: Path) -> Tally:
    """`count` injections of gputop's real bootstrap (bootstrap_code) into `pid`, checking after each that
    the job takes another step (`progress`: a counter that moves every step or few)."""
    tally = Tally()
    marker_dir.mkdir(parents=True, exist_ok=True)
    agent = marker_dir.parent / f"{marker_dir.name}-agent.py"
    agent.write_text(MARKER_AGENT.format(str(marker_dir)))
    bootstrap = bootstrap_code(str(agent), thread_name="gputop-test-agent")
    for i in range(count):
        started = time.monotonic()
        try:
            outcome = safepoint.inject(pid, bootstrap)
            tally.ran += outcome.ran
            tally.syscalls[outcome.syscall] += 1
            tally.failed_calls += outcome.result != 0
        except safepoint.Refused as exc:
            tally.refused[str(exc)] += 1
        tally.slowest_s = max(tally.slowest_s, time.monotonic() - started)
        # counted once the injection is over: the step waited for ends after it (the borrowed thread is often
        # not the one that steps, so the job steps during the injection too; those steps prove nothing)
        before = progress()
        try:
            wait_until(
                lambda: progress() > before or not process_alive(pid),
                timeout=MOVE_TIMEOUT_S,
                interval=0.002,
                what=f"job {pid} to take a step after injection {i}",
            )
        except AssertionError:
            tally.frozen_after.append(i)
            break
        if not process_alive(pid):
            tally.dead_after.append(i)
            break
    return tally


def markers(marker_dir: Path) -> int:
    return sum(1 for _ in marker_dir.iterdir()) if marker_dir.exists() else 0

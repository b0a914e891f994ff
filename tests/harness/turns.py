"""Turns at the box's CPUs for tests run side by side (pytest-xdist's workers).

Most integration tests wait: for a job to start, a py-spy round, a 12 s report window.  Side by side they
overlap their waits.  A test whose bar depends on the CPU it gets must not share the cores with more than its
bar allows, so every test takes a number of the run's slots (one per worker) for as long as it runs, and a
measured test (acceptance or ``alone``) also takes the measured turn, which one test holds at a time:

- a shared test takes one slot: three run side by side;
- an acceptance test (live jobs judged by their shares and verdicts; the jobs mostly sleep) takes the measured
  turn and one slot where the shared tests beside it run at a lower CPU priority (tests/harness/cpu_priority.py),
  else two: never another acceptance test beside it, and shared tests only at a lower priority or one at a time;
- a test marked ``alone`` (a rate measured against the truth, a CPU-bound job's bound, a deadline that includes a
  torch import) takes them all: it runs with none beside it.

The slots are lock files (`fcntl.flock`, one open file description per worker process).  A measured test waits
for the measured turn first, outside the gate, so a measured test waiting for another holds up no shared test.
Then a test takes the gate and keeps it until it holds all the slots it needs, taking each as it frees: a test
waiting for three slots holds those it has, so a stream of one-slot tests cannot starve it, and only the gate's
holder takes slots, so two tests each holding part of what they need cannot wait on each other.  A worker whose
next test is also ``alone`` keeps all the slots from one to the next (a module's tests reading one fixture's
series, say): let go, the shared tests queued meanwhile would take them, and each of its tests would wait for the
box to drain again.  Outside xdist (one process) there is nobody to share with and the conftest takes no turn.
"""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

SLOT_POLL_S = 0.05  # how often the gate's holder looks for a freed slot (flock cannot wait on any of several)


class Turns:
    def __init__(self, directory: Path, slots: int = 3) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._gate: IO[str] = open(directory / "gate", "a+")
        self._slots: list[IO[str]] = [open(directory / f"slot{i}", "a+") for i in range(slots)]
        self._measured: IO[str] = open(directory / "measured", "a+")
        self._measured_held = False
        self._held: list[IO[str]] = []
        self._idle = threading.Event()  # never set: the poll's wait

    @property
    def slots(self) -> int:
        return len(self._slots)

    @property
    def held(self) -> int:
        """How many slots this worker holds now (between tests too, when it keeps its turn)."""
        return len(self._held)

    @property
    def measuring(self) -> bool:
        """Whether this worker holds the measured turn (an acceptance or alone test's)."""
        return self._measured_held

    def hold(self, weight: int, measured: bool = False) -> None:
        """Hold exactly `weight` slots (1 to all of them), and the measured turn with `measured`: more slots are
        taken through the gate as they free, extras are let go at once.  The measured turn (one acceptance or alone
        test at a time) is waited for before the gate, so a measured test waiting for another does not hold up the
        shared tests behind it.  A worker that already holds enough does not touch the gate: a run of ``alone``
        tests keeps its turn from one test to the next, so the tests others queued meanwhile cannot slip in between
        them (each would cost a wait for everything beside to drain again)."""
        if not 1 <= weight <= len(self._slots):
            raise ValueError(f"a turn takes 1 to {len(self._slots)} slots, not {weight}")
        while len(self._held) > weight:
            fcntl.flock(self._held.pop(), fcntl.LOCK_UN)
        if self._measured_held and not measured:
            fcntl.flock(self._measured, fcntl.LOCK_UN)
            self._measured_held = False
        elif measured and not self._measured_held:
            fcntl.flock(self._measured, fcntl.LOCK_EX)
            self._measured_held = True
        if len(self._held) == weight:
            return
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            while len(self._held) < weight:
                for slot in self._slots:
                    if slot not in self._held and len(self._held) < weight and _take(slot):
                        self._held.append(slot)
                if len(self._held) < weight:
                    self._idle.wait(SLOT_POLL_S)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def release(self) -> None:
        """Let go of every slot held, and of the measured turn."""
        while self._held:
            fcntl.flock(self._held.pop(), fcntl.LOCK_UN)
        if self._measured_held:
            fcntl.flock(self._measured, fcntl.LOCK_UN)
            self._measured_held = False

    @contextmanager
    def turn(self, weight: int, measured: bool = False) -> Iterator[None]:
        """Hold `weight` slots (1 to all of them), and the measured turn with `measured`, from when they are free
        until the block ends."""
        self.hold(weight, measured)
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        self.release()
        self._gate.close()
        self._measured.close()
        for slot in self._slots:
            slot.close()


def _take(slot: IO[str]) -> bool:
    try:
        fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def turns_directory(run_id: str) -> Path:
    """Where one run's workers meet: private to the user, one per run (xdist's testrunuid)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"gputop-test-turns-{os.geteuid()}-{run_id}"

"""Turns at the box's CPUs for tests run side by side (pytest-xdist's workers).

Most integration tests wait: for a job to start, a py-spy round, a 12 s report window.  Side by side they
overlap their waits.  A test whose bar depends on the CPU it gets (a rate measured against the truth, a
statistical series, a deadline that includes a torch import) must not share the cores with another test's
jobs: marked ``alone``, it waits until the tests running beside it end, and runs with none beside it.

A readers-writer lock over two files (`fcntl.flock`, one open file description per worker process): a shared
test holds the turn lock shared, an ``alone`` test holds it exclusive.  Every test passes through a gate first
and an ``alone`` test keeps the gate until it has its turn, so a stream of shared tests cannot starve it.
Outside xdist (one process) there is nobody to share with and `turn` costs two uncontended flocks.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


class Turns:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._gate: IO[str] = open(directory / "gate", "a+")
        self._turn: IO[str] = open(directory / "turn", "a+")

    @contextmanager
    def turn(self, alone: bool) -> Iterator[None]:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._turn, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._turn, fcntl.LOCK_UN)

    def close(self) -> None:
        self._gate.close()
        self._turn.close()


def turns_directory(run_id: str) -> Path:
    """Where one run's workers meet: private to the user, one per run (xdist's testrunuid)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"gputop-test-turns-{os.geteuid()}-{run_id}"

"""A recording of gputop watching a live job (tests/fixtures/recordings/), replayed through the diagnosis a snapshot
at a time, as the monitor diagnoses it: what the replay tests of the demo scenarios and of the framework jobs read."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from gputop.analysis.diagnosis import diagnose, verdict_line
from gputop.history import History
from gputop.model import Finding, MachineInfo, Snapshot
from gputop.recording import read_recording
from tests.harness.attach import VERDICT_DEADLINE_S

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "recordings"


@dataclass
class Replay:
    name: str
    meta: dict
    machine: MachineInfo
    snaps: list[Snapshot]

    @classmethod
    def read(cls, name: str) -> "Replay":
        """tests/fixtures/recordings/NAME.gputop and the JSON its recorder wrote beside it."""
        path = FIXTURES / f"{name}.gputop"
        meta = json.loads(path.with_suffix(".json").read_text())
        machine, snaps, warning = read_recording(str(path))
        assert warning is None, warning
        return cls(name, meta, machine, snaps)

    def history(self, until: int) -> History:
        history = History(self.machine, capacity=len(self.snaps) + 1)
        for snap in self.snaps[: until + 1]:
            history.append(snap)
        return history

    def diagnosed(self, until: int) -> list[Finding]:
        return diagnose(self.history(until))

    def first_from(
        self, start: int, wanted: Callable[[list[Finding], History], bool], deadline_s: float = VERDICT_DEADLINE_S
    ) -> tuple[int, list[Finding], History]:
        """The first snapshot from `start` (for `deadline_s` of them) whose findings, with the history up to it, are
        `wanted`: that snapshot's index, its findings and the history; fails naming each verdict seen on the way."""
        history = self.history(start - 1)
        begun = self.snaps[start].timestamp
        seen: list[str] = []
        for i in range(start, len(self.snaps)):
            snap = self.snaps[i]
            if snap.timestamp - begun > deadline_s:
                break
            history.append(snap)
            findings = diagnose(history)
            if wanted(findings, history):
                return i, findings, history
            seen.append(f"{snap.timestamp - begun:4.0f} s: {verdict_line(findings)}")
        raise AssertionError(f"{self.name}: no such verdict within {deadline_s:.0f} s:\n" + "\n".join(seen))


def record_named(doc: str, what: str, names: Sequence[str], record: Callable[[str], object]) -> int:
    """A re-recording script's command line (scripts/record_*_fixtures.py): record each `what` named, or all of
    `names`; an unknown one is a usage error that lists them."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(what, nargs="*", metavar=what.upper(), help="default: all of " + ", ".join(names))
    chosen = getattr(parser.parse_args(), what)
    unknown = [name for name in chosen if name not in names]
    if unknown:
        parser.error(f"no {what} {', '.join(unknown)}; choose from {', '.join(names)}")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name in chosen or names:
        record(name)
    return 0


def load_script(name: str) -> Any:
    """scripts/NAME.py as a module (a re-recording script's digests are its fixtures' keys)."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)

"""tests/harness/turns.py: side by side, an ``alone`` test runs with no other beside it and is not starved."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from tests.harness.turns import Turns

DEADLINE_S = 10.0


def _wait_for(condition, what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < end, f"not within {DEADLINE_S:.0f} s: {what}"
        time.sleep(0.005)


def _held(path) -> bool:
    """Whether another open file description holds `path`'s flock (a non-blocking probe)."""
    with open(path, "a+") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False


def _waited_on(path) -> bool:
    """Whether some process is blocked waiting for `path`'s flock (a waiter's line in /proc/locks has "->")."""
    inode = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and fields[fields.index("->") + 1] == "FLOCK" and fields[-3].split(":")[-1] == str(inode):
            return True
    return False


def test_an_alone_turn_waits_for_the_shared_ones_and_the_next_waits_for_it(tmp_path):
    shared, alone, later = Turns(tmp_path), Turns(tmp_path), Turns(tmp_path)  # three workers
    order: list[str] = []
    release_alone = threading.Event()

    def run_alone():
        with alone.turn(3):
            order.append("alone")
            release_alone.wait(DEADLINE_S)

    def run_later():
        with later.turn(1):
            order.append("later")

    try:
        with shared.turn(1):
            with Turns(tmp_path).turn(1), Turns(tmp_path).turn(1):  # three shared turns run side by side
                order.append("three shared at once")
            first = threading.Thread(target=run_alone)
            first.start()
            _wait_for(lambda: _held(tmp_path / "gate"), "the alone test waits at the gate, holding it")
            assert order == ["three shared at once"]  # it has not started beside a shared test
        _wait_for(lambda: order[-1:] == ["alone"], "the alone test starts once the shared one ended")
        second = threading.Thread(target=run_later)
        second.start()
        # a waiting test keeps the gate until its turn comes: held, the next test waits behind the alone one
        _wait_for(lambda: _held(tmp_path / "gate") or order[-1] == "later", "the next test waits at its turn")
        assert order[-1] == "alone"  # it does not start beside the alone test
        release_alone.set()
        first.join(DEADLINE_S)
        second.join(DEADLINE_S)
        assert order == ["three shared at once", "alone", "later"]
    finally:
        release_alone.set()
        for turns in (shared, alone, later):
            turns.close()


def test_an_acceptance_turn_runs_beside_one_shared_test_never_two_nor_another_acceptance_test(tmp_path):
    workers = [Turns(tmp_path) for _ in range(4)]
    running: list[str] = []
    most_beside: list[int] = []
    lock = threading.Lock()
    release = {name: threading.Event() for name in ("acceptance", "shared1", "shared2", "acceptance2")}

    def run(turns: Turns, name: str, weight: int) -> None:
        with turns.turn(weight):
            with lock:
                running.append(name)
                most_beside.append(len(running))
            release[name].wait(DEADLINE_S)
            with lock:
                running.remove(name)

    threads = []
    try:
        # each started once the one before is in (or waits at the gate): threads started together take the gate
        # in any order
        started_when = {
            "acceptance": (lambda: running == ["acceptance"], "the acceptance test's turn"),
            "shared1": (lambda: running == ["acceptance", "shared1"], "one shared test beside the acceptance test"),
            "shared2": (lambda: _held(tmp_path / "gate"), "the second shared test waits, holding the gate"),
            "acceptance2": (lambda: True, ""),
        }
        for turns, name, weight in zip(workers, release, (2, 1, 1, 2)):
            threads.append(threading.Thread(target=run, args=(turns, name, weight)))
            threads[-1].start()
            _wait_for(*started_when[name])
        assert running == ["acceptance", "shared1"]  # not a third beside them: the acceptance test takes two slots
        release["shared1"].set()
        _wait_for(lambda: running == ["acceptance", "shared2"], "the waiting shared test takes the freed slot")
        release["acceptance"].set()
        # the second acceptance test needs two slots: the first's two free, it starts beside shared2
        _wait_for(lambda: sorted(running) == ["acceptance2", "shared2"], "the second acceptance test starts")
        release["shared2"].set()
        release["acceptance2"].set()
        for thread in threads:
            thread.join(DEADLINE_S)
        assert max(most_beside) == 2 and not running
    finally:
        for event in release.values():
            event.set()
        for turns in workers:
            turns.close()


def test_a_turn_takes_one_to_all_of_the_slots(tmp_path):
    turns = Turns(tmp_path)
    try:
        with pytest.raises(ValueError, match="1 to 3 slots, not 4"):
            with turns.turn(4):
                pass
    finally:
        turns.close()


def test_a_worker_keeps_its_alone_turn_from_one_alone_test_to_the_next(tmp_path):
    """A run of alone tests (a module's tests over one fixture's series) keeps the slots between them: a shared test
    queued meanwhile runs after the run, not between two of its tests, and it gets in once the worker holds fewer."""
    alone, shared = Turns(tmp_path), Turns(tmp_path)
    order: list[str] = []

    def run_shared():
        with shared.turn(1):
            order.append("shared")

    waiting = threading.Thread(target=run_shared)
    try:
        alone.hold(3)
        order.append("alone 1")
        waiting.start()
        _wait_for(lambda: _held(tmp_path / "gate"), "the shared test waits at the gate")
        alone.hold(3)  # the next alone test: it holds enough already and does not touch the gate
        order.append("alone 2")
        assert alone.held == 3 and order == ["alone 1", "alone 2"]
        alone.hold(2)  # an acceptance test next: one slot let go, and the waiting shared test takes it
        _wait_for(lambda: order[-1:] == ["shared"], "the shared test runs beside the acceptance test")
        assert alone.held == 2
        alone.release()
        assert alone.held == 0
        waiting.join(DEADLINE_S)
    finally:
        alone.release()
        waiting.join(DEADLINE_S)
        for turns in (alone, shared):
            turns.close()


class _Item:
    """What `turn_of` reads of a collected test: its ``alone`` marker (and the marker's arguments) and its lane."""

    def __init__(self, lane: str, alone: Optional[dict] = None, load_tolerant: bool = False) -> None:
        from tests.conftest import _LANE

        self.alone = None if alone is None else pytest.mark.alone(**alone).mark
        self.load_tolerant = pytest.mark.load_tolerant.mark if load_tolerant else None
        self.stash = pytest.Stash()
        self.stash[_LANE] = lane

    def get_closest_marker(self, name: str):
        return {"alone": self.alone, "load_tolerant": self.load_tolerant}.get(name)


@pytest.mark.parametrize("prioritized", [True, False], ids=["shared-tests-at-lower-priority", "no-priority"])
def test_each_lane_takes_its_turn(prioritized):
    from tests.conftest import SIDE_BY_SIDE_WORKERS as ALL
    from tests.conftest import turn_of

    assert turn_of(_Item("integration", alone={}), prioritized) == (ALL, True)  # type: ignore[arg-type]
    series = _Item("acceptance", alone={"unless_prioritized": True})
    assert turn_of(series, prioritized) == ((1, True) if prioritized else (ALL, True))  # type: ignore[arg-type]
    deadline = _Item("integration", alone={"unless_prioritized": True})  # measured at full priority, not shared
    assert turn_of(deadline, prioritized) == turn_of(series, prioritized)  # type: ignore[arg-type]
    # one shared test beside it at the same priority, or every other worker's at a lower one
    assert turn_of(_Item("acceptance"), prioritized) == ((1, True) if prioritized else (ALL - 1, True))  # type: ignore[arg-type]
    assert turn_of(_Item("integration"), prioritized) == turn_of(_Item("unit"), prioritized) == (1, False)  # type: ignore[arg-type]
    # a verdict more load can only confirm: the measured turn, two shared tests beside it at any priority
    assert turn_of(_Item("acceptance", load_tolerant=True), prioritized) == (1, True)  # type: ignore[arg-type]


@pytest.mark.parametrize("prioritized", [True, False], ids=["shared-tests-at-lower-priority", "no-priority"])
def test_an_alone_test_marked_then_acceptance_lowers_its_turn_to_an_acceptance_tests(tmp_path, monkeypatch, prioritized):
    import tests.conftest as conftest

    turns = Turns(tmp_path, slots=conftest.SIDE_BY_SIDE_WORKERS)
    monkeypatch.setattr(conftest, "_TURNS", [turns])
    monkeypatch.setattr(conftest, "_PRIORITY", [object() if prioritized else None])
    case_study, plain = _Item("acceptance", alone={"then_acceptance": True}), _Item("acceptance", alone={})
    try:
        assert conftest.turn_of(case_study, prioritized) == (conftest.SIDE_BY_SIDE_WORKERS, True)  # type: ignore[arg-type]
        turns.hold(conftest.SIDE_BY_SIDE_WORKERS, measured=True)
        conftest.lower_to_acceptance(plain)  # type: ignore[arg-type]
        assert turns.held == conftest.SIDE_BY_SIDE_WORKERS  # not so marked: it keeps the box
        conftest.lower_to_acceptance(case_study)  # type: ignore[arg-type]
        # one shared test beside it, with or without the CPU priority (its processes run among the box's sessions)
        assert (turns.held, turns.measuring) == (conftest.SIDE_BY_SIDE_WORKERS - 1, True)
    finally:
        turns.close()


def test_only_an_alone_test_followed_by_another_keeps_its_turn():
    from tests.conftest import keeps_turn

    alone, alone_next = _Item("acceptance", alone={}), _Item("integration", alone={})
    acceptance, shared = _Item("acceptance"), _Item("integration")
    assert keeps_turn(alone, alone_next, True) and keeps_turn(alone, alone_next, False)  # type: ignore[arg-type]
    for item, nextitem in ((alone, acceptance), (alone, shared), (alone, None), (acceptance, acceptance), (shared, shared)):
        assert not keeps_turn(item, nextitem, True)  # type: ignore[arg-type]
    series = _Item("acceptance", alone={"unless_prioritized": True})
    assert keeps_turn(series, series, False) and not keeps_turn(series, series, True)  # type: ignore[arg-type]


@pytest.mark.timeout(60)  # a waiter wrongly holding the gate would block the shared turn for good
def test_one_measured_test_at_a_time_and_one_waiting_holds_up_no_shared_test(tmp_path):
    """Two acceptance tests (one slot and the measured turn each, the shared tests at a lower priority) never run
    together; the second waits for the measured turn before the gate, so shared tests still start beside the first."""
    first, second, shared = Turns(tmp_path), Turns(tmp_path), Turns(tmp_path)
    running: list[str] = []
    release_first = threading.Event()

    def run(turns: Turns, name: str, weight: int, measured: bool, until: Optional[threading.Event] = None) -> None:
        with turns.turn(weight, measured):
            running.append(name)
            if until is not None:
                until.wait(DEADLINE_S)
            running.remove(name)

    threads = [
        threading.Thread(target=run, args=(first, "first", 1, True, release_first)),
        threading.Thread(target=run, args=(second, "second", 1, True)),
    ]
    try:
        threads[0].start()
        _wait_for(lambda: running == ["first"], "the first acceptance test runs")
        threads[1].start()
        _wait_for(lambda: _waited_on(tmp_path / "measured"), "the second waits for the measured turn")
        assert not _held(tmp_path / "gate")  # waiting before the gate, not in it
        with shared.turn(1):  # a shared test starts beside the first acceptance test
            assert running == ["first"]
        release_first.set()
        for thread in threads:
            thread.join(DEADLINE_S)
        assert not running and not first.measuring and not second.measuring
    finally:
        release_first.set()
        for turns in (first, second, shared):
            turns.close()


def _run_priority_child(script: str, tag: str) -> dict:
    """What `script` saw of the run's cgroups, run in a process of its own with the priority on (it moves itself
    between groups); skips where the kernel offers no writable cgroup v1 cpu controller."""
    import json
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", script, f"{tag}-{os.getpid()}"],
        env=dict(os.environ, GPUTOP_TEST_CPU_PRIORITY="1"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    if seen is None:
        pytest.skip("no writable cgroup v1 cpu controller here: the suite keeps its exclusive turns")
    return seen


_PRIORITY_CHILD = """
import json, os, subprocess, sys
from tests.harness.cpu_priority import CpuPriority, in_group
priority = CpuPriority.for_run(sys.argv[1])
if priority is None:
    print(json.dumps(None)); sys.exit()
children = {}
for name, move in (("shared", priority.lower), ("measured", priority.measure), ("alone", priority.restore)):
    move()
    children[name] = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
seen = {"shares": [(g / "cpu.shares").read_text().strip() for g in (priority.measured, priority.shared)]}
seen.update({name: [in_group(child.pid, g) for g in (priority.measured, priority.shared)] for name, child in children.items()})
seen["self"] = [in_group(os.getpid(), g) for g in (priority.measured, priority.shared)]
for child in children.values():
    child.communicate(b"")
priority.remove()
seen["removed"] = not priority.measured.exists() and not priority.shared.exists()
print(json.dumps(seen))
"""


@pytest.mark.integration  # a real cgroup, and processes started in it
def test_each_test_starts_its_processes_in_its_own_priority_group(tmp_path):
    from tests.harness.cpu_priority import MEASURED_SHARES, SHARED_SHARES

    seen = _run_priority_child(_PRIORITY_CHILD, "check")
    assert seen == {
        "shares": [str(MEASURED_SHARES), str(SHARED_SHARES)],
        # [in the measured group, in the shared group]: each child stays where it started, whatever its parent does
        "shared": [False, True],
        "measured": [True, False],
        "alone": [False, False],
        "self": [False, False],  # back where it was
        "removed": True,
    }


_REMOVED_CHILD = """
import json, sys
from tests.harness.cpu_priority import CpuPriority, in_group
first, second = CpuPriority.for_run(sys.argv[1]), CpuPriority.for_run(sys.argv[1])
if first is None:
    print(json.dumps(None)); sys.exit()
first.remove()  # a worker that ends first, while the other sits in neither group
second.lower()
seen = {"shares": (second.shared / "cpu.shares").read_text().strip(), "in": in_group(__import__("os").getpid(), second.shared)}
second.remove()
seen["removed"] = not second.measured.exists() and not second.shared.exists()
print(json.dumps(seen))
"""


@pytest.mark.integration  # a real cgroup
def test_a_group_removed_by_the_first_worker_out_is_made_again_for_the_others(tmp_path):
    """Each worker removes the run's groups as it ends; a worker that ends first removes them while they are
    empty, and the others must still enter them (an xdist worker crashed on a missing cgroup.procs)."""
    from tests.harness.cpu_priority import SHARED_SHARES

    seen = _run_priority_child(_REMOVED_CHILD, "removed")
    assert seen == {"shares": str(SHARED_SHARES), "in": True, "removed": True}

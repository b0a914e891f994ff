"""tests/harness/turns.py: side by side, an ``alone`` test runs with no other beside it and is not starved."""

from __future__ import annotations

import fcntl
import threading
import time

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


def test_an_alone_turn_waits_for_the_shared_ones_and_the_next_waits_for_it(tmp_path):
    shared, alone, later = Turns(tmp_path), Turns(tmp_path), Turns(tmp_path)  # three workers
    order: list[str] = []
    release_alone = threading.Event()

    def run_alone():
        with alone.turn(alone=True):
            order.append("alone")
            release_alone.wait(DEADLINE_S)

    def run_later():
        with later.turn(alone=False):
            order.append("later")

    try:
        with shared.turn(alone=False):
            with Turns(tmp_path).turn(alone=False):  # shared turns run side by side
                order.append("two shared at once")
            first = threading.Thread(target=run_alone)
            first.start()
            _wait_for(lambda: _held(tmp_path / "gate"), "the alone test waits at the gate, holding it")
            assert order == ["two shared at once"]  # it has not started beside a shared test
        _wait_for(lambda: order[-1:] == ["alone"], "the alone test starts once the shared one ended")
        second = threading.Thread(target=run_later)
        second.start()
        # a waiting test keeps the gate until its turn comes: held, the next test waits behind the alone one
        _wait_for(lambda: _held(tmp_path / "gate") or order[-1] == "later", "the next test waits at its turn")
        assert order[-1] == "alone"  # it does not start beside the alone test
        release_alone.set()
        first.join(DEADLINE_S)
        second.join(DEADLINE_S)
        assert order == ["two shared at once", "alone", "later"]
    finally:
        release_alone.set()
        for turns in (shared, alone, later):
            turns.close()

"""PollLoop.prefetch: the TUI takes its first poll while Textual loads (gputop/commands/tui.py).

The prefetched batch is delivered once: by `run()` if nobody took it, else not at all, and then `run()`
polls one interval later. A hung or failing first poll behaves as a hung or failing poll.
"""

from __future__ import annotations

import threading

from gputop.errors import GputopError
from gputop.source import PollLoop
from tests.harness.processes import wait_until


class CountingSource:
    """poll() returns 1, 2, 3, ...; `hang_first` makes the first poll wait for `release`."""

    def __init__(self, hang_first: bool = False, fail_first: bool = False) -> None:
        self.polls = 0
        self.hang_first = hang_first
        self.fail_first = fail_first
        self.release = threading.Event()

    def poll(self) -> int:
        self.polls += 1
        if self.polls == 1 and self.hang_first:
            self.release.wait(30)
        if self.polls == 1 and self.fail_first:
            raise GputopError("NVML did not answer")
        return self.polls


def first_poll_done() -> bool:
    return not any(t.name == "gputop-first-poll" for t in threading.enumerate())


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run_loop(loop: PollLoop, clock: FakeClock) -> list[tuple[float, list]]:
    delivered: list[tuple[float, list]] = []
    loop.run(lambda batch: delivered.append((clock.now, batch.snapshots)))
    return delivered


def test_run_delivers_the_prefetched_batch_first_and_only_once():
    source, clock = CountingSource(), FakeClock()
    loop = PollLoop(source, 1.0, seconds=2.0, clock=clock, sleep=clock.sleep)
    loop.prefetch()
    wait_until(lambda: source.polls == 1 and first_poll_done(), what="the prefetch")
    delivered = run_loop(loop, clock)
    # the prefetched 1 at once (no second poll for it), then one poll a tick: every poll delivered once
    assert delivered == [(0.0, [1]), (1.0, [2]), (2.0, [3])]
    assert source.polls == 3


def test_a_taken_prefetch_is_not_delivered_again_and_the_next_poll_waits_an_interval():
    source, clock = CountingSource(), FakeClock()
    loop = PollLoop(source, 1.0, seconds=2.0, clock=clock, sleep=clock.sleep)
    loop.prefetch()
    wait_until(lambda: source.polls == 1 and first_poll_done(), what="the prefetch")
    taken = loop.take_prefetched()
    assert taken is not None and taken.snapshots == [1]
    assert loop.take_prefetched() is None  # handed out once
    assert run_loop(loop, clock) == [(1.0, [2]), (2.0, [3])]


def test_take_prefetched_never_waits_for_a_poll_still_running():
    source = CountingSource(hang_first=True)
    loop = PollLoop(source, 1.0)
    loop.prefetch()
    try:
        wait_until(lambda: source.polls == 1, what="the first poll to start")
        assert loop.take_prefetched() is None  # still polling: run() will deliver it
    finally:
        source.release.set()
    wait_until(first_poll_done, what="the prefetch")
    assert loop.take_prefetched().snapshots == [1]


def test_stop_ends_run_while_the_prefetched_poll_hangs():
    source = CountingSource(hang_first=True)
    loop = PollLoop(source, 1.0)
    loop.prefetch()
    runner = threading.Thread(target=loop.run, args=(lambda batch: None,), daemon=True)
    try:
        runner.start()
        wait_until(lambda: source.polls == 1, what="the first poll to start")
        loop.stop()
        runner.join(5)
        assert not runner.is_alive(), "run() kept waiting for a hung first poll after stop()"
    finally:
        source.release.set()


def test_a_failed_prefetch_is_a_failed_poll():
    source, clock = CountingSource(fail_first=True), FakeClock()
    errors: list[Exception] = []
    loop = PollLoop(source, 1.0, seconds=1.0, clock=clock, sleep=clock.sleep, on_error=errors.append)
    loop.prefetch()
    wait_until(lambda: source.polls == 1 and first_poll_done(), what="the prefetch")
    assert loop.take_prefetched() is None  # nothing to show: run() reports it
    assert run_loop(loop, clock) == [(1.0, [2])]
    assert [str(e) for e in errors] == ["NVML did not answer"]


def test_a_source_is_not_called_closed_while_its_prefetched_poll_runs():
    source = CountingSource(hang_first=True)
    loop = PollLoop(source, 1.0)
    assert loop.prefetch_finished(0)  # nothing prefetched: nothing running
    loop.prefetch()
    try:
        wait_until(lambda: source.polls == 1, what="the first poll to start")
        assert not loop.prefetch_finished(0.05)
    finally:
        source.release.set()
    assert loop.prefetch_finished(5)

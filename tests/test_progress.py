"""Progress counters beside every stack dump, and the one native dump of a process frozen for 10 s."""

from __future__ import annotations

import subprocess

import pytest

from gputop.collect import stacks as stacks_mod
from gputop.collect.job_tree import JobCollector
from gputop.collect.procfs import read_progress
from gputop.collect.stack_schedule import FreezeWatch
from gputop.model import Frame, ProcessProgress, ProcessStacks, ThreadProgress, ThreadStack
from tests.harness.processes import wait_until

needs_py_spy = pytest.mark.skipif(stacks_mod.find_py_spy() is None, reason="py-spy is not installed")
DEADLINE = 60

# One thread loops on a short sleep (slow but live), the main thread is parked on an Event (stuck).
SLEEPER_AND_BLOCKED = """
import threading, time
def slow_but_live():
    while True:
        time.sleep(0.02)
threading.Thread(target=slow_but_live, name="slow", daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""
# The main thread itself loops on a short sleep: identical stacks every dump, yet it moves.
MAIN_SLEEPS = """
import time
print("ready", flush=True)
def poll_forever():
    while True:
        time.sleep(0.02)
poll_forever()
"""


def _start(spawn, code: str) -> subprocess.Popen:
    proc = spawn.python(code, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    return proc


def _switches(progress: ProcessProgress, tid: int) -> int:
    return next(t.voluntary_switches for t in progress.threads if t.tid == tid)


@needs_py_spy
@pytest.mark.slow
def test_each_dump_carries_counters_that_tell_slow_from_stuck(spawn):
    proc = _start(spawn, SLEEPER_AND_BLOCKED)
    first = stacks_mod.dump_stacks([proc.pid])[proc.pid]
    assert first.error is None and first.progress is not None and not first.native
    by_name = {t.thread_name: t.os_thread_id for t in first.threads}
    slow_tid, main_tid = by_name["slow"], by_name["MainThread"]
    assert {slow_tid, main_tid} <= {t.tid for t in first.progress.threads}
    assert first.progress.io_read_chars is not None and first.progress.cpu_seconds > 0

    # the sleeping thread gains voluntary switches between dumps; the blocked main thread gains none
    later = wait_until(
        lambda: (
            (d := stacks_mod.dump_stacks([proc.pid])[proc.pid]).progress
            and _switches(d.progress, slow_tid) >= _switches(first.progress, slow_tid) + 20
            and d
        ),
        timeout=DEADLINE,
        what="the sleeping thread to switch 20 times",
    )
    assert _switches(later.progress, main_tid) == _switches(first.progress, main_tid)


@pytest.mark.slow
def test_progress_of_a_gone_process_is_none(spawn):
    proc = spawn(["true"])
    proc.wait(timeout=10)
    assert read_progress(proc.pid) is None


# ----------------------------------------------------------------- the freeze watch (pure)


def _dump(t: float, *, line: int = 7, switches: int = 5, io: int = 100, pid: int = 10) -> ProcessStacks:
    frames = (Frame("Event.wait", "threading.py", 629), Frame("<module>", "train.py", line))
    stacks = ProcessStacks(
        pid=pid,
        timestamp=t,
        threads=(ThreadStack(1, "MainThread", pid, False, False, frames),),
        progress=ProcessProgress(
            cpu_seconds=1.0, io_read_chars=io, io_write_chars=0, threads=(ThreadProgress(pid, switches, 0, 100),)
        ),
    )
    return stacks


def test_freeze_watch_asks_for_one_native_dump_after_ten_still_seconds():
    watch, key = FreezeWatch(10.0), (10, 1.0)
    assert [watch.observe(key, _dump(t)) for t in (0, 2, 4, 6, 8)] == [False] * 5
    assert watch.observe(key, _dump(10))
    native = _dump(10.5, switches=9)  # the native dump's ptrace pause cost it context switches
    watch.taken(key, native)
    assert watch.frozen(key)
    # the freeze goes on from the counters read after the native dump: no second native dump
    assert [watch.observe(key, _dump(t, switches=9)) for t in (12, 20, 40)] == [False] * 3
    assert watch.frozen(key)
    # it moves (a new line): the freeze is over, and a new one would need another 10 s
    assert not watch.observe(key, _dump(42, line=8, switches=9)) and not watch.frozen(key)


@pytest.mark.parametrize("change", [{"switches": 15}, {"io": 200}, {"line": 9}], ids=["switch", "io", "stack"])
def test_freeze_watch_restarts_the_clock_when_anything_moves(change):
    """Moving is what the hang check calls it (analysis/freeze.py): another stack, I/O, or the main thread
    woken at least once a second (10 switches in 9 s)."""
    watch, key = FreezeWatch(10.0), (10, 1.0)
    watch.observe(key, _dump(0))
    assert not watch.observe(key, _dump(9, **change))  # moved at 9 s ...
    assert not watch.observe(key, _dump(12, **change))  # ... so 12 s is 3 s into a new freeze
    assert watch.observe(key, _dump(19, **change))


def test_freeze_watch_ignores_failed_dumps_and_forgets_gone_processes():
    watch, key = FreezeWatch(10.0), (10, 1.0)
    watch.observe(key, _dump(0))
    assert not watch.observe(key, ProcessStacks(pid=10, timestamp=11, error="torn"))
    assert not watch.observe(key, _dump(12))  # the failed dump ended the freeze
    watch.forget_except(set())
    assert not watch.observe(key, _dump(30))


# ----------------------------------------------------------------- the collector takes it


@needs_py_spy
@pytest.mark.slow
def test_a_frozen_main_thread_gets_one_native_dump_and_a_slow_one_none(spawn):
    stuck = _start(spawn, SLEEPER_AND_BLOCKED)
    polling = _start(spawn, MAIN_SLEEPS)
    taken: list[int] = []

    def native_dump(pid: int) -> ProcessStacks:
        taken.append(pid)
        return stacks_mod.dump_native(pid)

    made = []
    try:
        for proc in (stuck, polling):
            made.append(JobCollector(proc.pid, stack_interval=0.3, native_dump=native_dump, native_after=1.5))
        stuck_collector, polling_collector = made
        tree = wait_until(
            lambda: (t := stuck_collector.collect()).native_stacks.get(stuck.pid) and t,
            timeout=DEADLINE,
            what="the native dump of the frozen process",
        )
        native = tree.native_stacks[stuck.pid]
        assert native.native and native.error is None and native.progress is not None
        main = next(t for t in native.threads if t.thread_name == "MainThread")
        assert any(f.name == "Event.wait" for f in main.frames)
        assert any(f.module and ".so" in f.module for f in main.frames), main.frames  # C frames: the point of it
        assert not tree.stacks[stuck.pid].native  # the regular stacks stay the nonblocking ones
        # several more rounds of the same freeze: still that one native dump, and none for the slow process
        rounds = stuck_collector._schedule.round
        wait_until(lambda: stuck_collector._schedule.round >= rounds + 8, timeout=DEADLINE, what="8 more rounds")
        wait_until(lambda: polling_collector._schedule.round >= 12, timeout=DEADLINE, what="12 rounds of the slow one")
        assert taken == [stuck.pid]
        assert stuck_collector.collect().native_stacks[stuck.pid] is native
        assert polling_collector.collect().native_stacks == {}
    finally:
        for collector in made:
            collector.close()

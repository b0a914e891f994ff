"""One freeze detector (gputop/analysis/freeze.py): the hang check, the collector's native-dump watch and
serve's last-progress gauge judge the same dumps the same way."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gputop.analysis.checks.hang import frozen_run
from gputop.analysis.freeze import main_thread_moved, main_thread_sample
from gputop.analysis.stack_classes import COLLECTIVE
from gputop.collect.stack_schedule import FreezeWatch
from gputop.exporter import Exporter
from tests.harness import histories as hb

PID = 1000
SECONDS = 14


def dumps(switches_per_s: float) -> list:
    """One dump a second of a main thread parked at the same frames, woken `switches_per_s` times a second
    (no CPU, no I/O: neither speaks for it)."""
    return [
        hb.stacks_of(PID, hb.STATE_FRAMES[COLLECTIVE], hb.T0 + t, progress=hb.progress_of(PID, t, switches_per_s=switches_per_s))
        for t in range(SECONDS + 1)
    ]


class DumpSource:
    """A one-rank job whose snapshots carry the given dumps, one per poll."""

    def __init__(self, stacks: list) -> None:
        scenario = hb.Scenario(seconds=SECONDS, ranks=[hb.RankSpec(pid=PID, rank=0, gpus=(0,), state=lambda t: COLLECTIVE)])
        history = hb.build(scenario)
        self.machine = history.machine
        self.snapshots = [replace(s, job=replace(s.job, stacks={PID: d})) for s, d in zip(history, stacks)]

    def poll(self):
        return self.snapshots.pop(0)

    def close(self) -> None:
        pass


def judged_still_by_the_native_dump_watch(stacks: list) -> bool:
    watch = FreezeWatch(after=10.0)
    return any([watch.observe((PID, 1.0), d) for d in stacks])


def judged_still_by_serve(stacks: list) -> bool:
    source = DumpSource(stacks)
    exporter = Exporter(source, interval=1.0, diagnose=lambda history: [], log=lambda line: None)
    for _ in stacks:
        exporter.cycle()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    [last_progress] = [
        s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == "gputop_rank_last_progress_timestamp_seconds"
    ]
    return last_progress == hb.T0  # never seen to move after its first dump


def judged_still_by_the_hang_check(stacks: list) -> bool:
    samples = [main_thread_sample(d) for d in stacks]
    run = frozen_run(PID, [replace(s, state=COLLECTIVE) for s in samples if s is not None])
    assert run is not None and run.still is not None
    return run.still and run.still_seconds == SECONDS


@pytest.mark.parametrize(
    "switches_per_s, still",
    [(0.0, True), (0.5, True), (3.0, False)],
    ids=["parked", "woken-every-2-s", "woken-3-times-a-second"],
)
def test_the_hang_check_the_native_dump_watch_and_serve_agree(switches_per_s, still):
    stacks = dumps(switches_per_s)
    assert judged_still_by_the_hang_check(stacks) is still
    assert judged_still_by_the_native_dump_watch(stacks) is still
    assert judged_still_by_serve(stacks) is still


def test_dumps_without_counters_are_judged_by_cpu_use_only_where_it_is_asked_for():
    before, after = (main_thread_sample(replace(d, progress=None)) for d in dumps(0.0)[:2])
    assert before is not None and after is not None
    assert main_thread_moved(PID, before, after) is None  # equal stacks, nothing more to go by
    assert main_thread_moved(PID, before, after, cpu_percent=40.0) is True
    assert main_thread_moved(PID, before, after, cpu_percent=0.0) is False
    moved = main_thread_sample(hb.stacks_of(PID, hb.STATE_FRAMES[COLLECTIVE][1:], after.timestamp + 1))
    assert moved is not None and main_thread_moved(PID, after, moved) is True  # another place

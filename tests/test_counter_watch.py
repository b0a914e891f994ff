"""The pipeline's counter watch (`Pipeline(..., watch=CounterCadence(...))`, collect/counters.py): `gputop check`'s counter
lines on a slow cadence, on the snapshots, in the exporter's health families and in recordings.

The simulated machine is the real pynvml wrappers over the fake library and the real sysfs reader over the
simulated machine's tree, on a manual clock."""

from __future__ import annotations

import argparse
import json

import pytest

from gputop.backend import SimulatedMachine
from gputop.cli import build_parser, main
from gputop.exporter import Exporter
from gputop.model import Snapshot, from_jsonable, to_jsonable
from gputop.pipeline import WATCH_COUNTERS_S, CounterCadence, Pipeline, following_pipeline
from gputop.recording import RecordingWriter, read_recording
from gputop.sim.fake_nvml import ManualClock

SPEC = "h100-sxm-8+pcie-replay=3+kernel-xid=5:48"
CADENCE = 60.0


def flagged(snap: Snapshot) -> dict[str, tuple[tuple[int, ...], str]]:
    health = snap.counter_health
    assert health is not None
    return {c.id: (c.gpus, c.status) for c in health.checks}


def problems(exporter: Exporter) -> set[tuple[str, str, str]]:
    return {
        (s.labels["gpu"], s.labels["rule"], s.labels["severity"])
        for family in exporter.collect()
        if family.name == "gputop_gpu_health_problem"
        for s in family.samples
    }


@pytest.fixture
def watched():
    clock = ManualClock(1_700_000_000.0)
    with Pipeline(SimulatedMachine(SPEC, clock=clock), watch=CounterCadence(CADENCE)) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0  # the fake's 20 ms PCIe sampling sleep is not under test
        yield pipeline, clock


def test_a_log_xid_counts_at_once_and_a_climbing_counter_after_one_cadence(watched):
    pipeline, clock = watched
    exporter = Exporter(pipeline, diagnose=lambda history: [], log=lambda line: None)
    first = pipeline.poll()
    exporter.update(first)
    # one reading: the kernel log's XID shows; the replay counter cannot be seen climbing yet
    assert flagged(first) == {"xid": ((5,), "fail")}
    assert first.counter_health is not None and first.counter_health.seconds == 0.0
    assert problems(exporter) == {("5", "xid", "critical")}
    clock.advance(CADENCE / 2)
    between = pipeline.poll()
    assert between.counter_health is first.counter_health  # not read again before the cadence
    clock.advance(CADENCE / 2)
    second = pipeline.poll()
    exporter.update(second)
    assert second.counter_health is not None and second.counter_health.seconds == CADENCE
    assert flagged(second) == {"xid": ((5,), "fail"), "pcie.replay": ((3,), "fail")}
    assert problems(exporter) == {("5", "xid", "critical"), ("3", "pcie.replay", "critical")}
    health = {int(s.labels["gpu"]): s.value for f in exporter.collect() if f.name == "gputop_gpu_health" for s in f.samples}
    assert {i for i, v in health.items() if v} == {3, 5} and health[3] == health[5] == 2.0


def test_an_xid_both_sources_see_is_one_series():
    """NVML's XID event (the samples' rule) and the check's XID line (the watch's) name the same rule: one
    series per GPU and rule, or the exposition would repeat a label set."""
    clock = ManualClock(1_700_000_000.0)
    with Pipeline(SimulatedMachine("h100-sxm-8+xid=2:48", clock=clock), watch=CounterCadence(CADENCE)) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0
        exporter = Exporter(pipeline, diagnose=lambda history: [], log=lambda line: None)
        for _ in range(2):
            snap = pipeline.poll()
            exporter.update(snap)
            clock.advance(CADENCE)
    assert flagged(snap) == {"xid": ((2,), "fail")}
    series = [
        (s.labels["gpu"], s.labels["rule"], s.labels["severity"])
        for family in exporter.collect()
        if family.name == "gputop_gpu_health_problem"
        for s in family.samples
    ]
    assert series == [("2", "xid", "critical")]


def test_unwatched_snapshots_carry_nothing():
    clock = ManualClock(1_700_000_000.0)
    with Pipeline(SimulatedMachine(SPEC, clock=clock)) as pipeline:
        assert pipeline.counters is None
        assert pipeline.poll().counter_health is None


def test_a_recording_keeps_the_window_and_an_older_one_reads_without_it(watched, tmp_path):
    pipeline, clock = watched
    snaps = []
    for _ in range(3):
        snaps.append(pipeline.poll())
        clock.advance(CADENCE)
    path = str(tmp_path / "rec.gz")
    with RecordingWriter(path, pipeline.machine) as writer:
        for snap in snaps:
            writer.write(snap)
    _, back, warning = read_recording(path)
    assert warning is None
    assert [s.counter_health for s in back] == [s.counter_health for s in snaps]
    assert "pcie.replay" in flagged(back[-1])
    old = to_jsonable(snaps[-1])
    del old["counter_health"]  # as a recording written before the watch existed
    assert from_jsonable(Snapshot, old).counter_health is None


def test_report_from_a_recording_finds_what_the_watch_saw(watched, tmp_path, capsys):
    """`gputop report --from` a recording of a watched machine: the window's lines are findings on their GPU,
    as `serve` exported them, without a machine check of its own."""
    pipeline, clock = watched
    path, out = str(tmp_path / "rec.gz"), tmp_path / "report.json"
    with RecordingWriter(path, pipeline.machine) as writer:
        for _ in range(3):
            writer.write(pipeline.poll())
            clock.advance(CADENCE)
    assert main(["report", "--from", path, "--format", "json", "-o", str(out)]) == 0
    found = {f["id"]: (f["gpus"], f["severity"]) for f in json.loads(out.read_text())["findings"]}
    assert found["check.pcie.replay"] == ([3], "critical")
    assert found["check.xid"] == ([5], "critical")  # the kernel log's XID 48: NVML's events do not have it


def test_serve_and_record_watch_every_minute_unless_told(tmp_path):
    parser = build_parser()
    for command in (["serve"], ["record", "-o", str(tmp_path / "r.gz")]):
        args = parser.parse_args([*command, "--simulate", "h100-sxm-8"])
        with following_pipeline(args) as pipeline:
            assert pipeline.counters is not None and pipeline.counters.cadence == WATCH_COUNTERS_S
        args = parser.parse_args([*command, "--simulate", "h100-sxm-8", "--watch-counters", "0"])
        with following_pipeline(args) as pipeline:
            assert pipeline.counters is None
    with following_pipeline(argparse.Namespace(simulate="h100-sxm-8", watch_counters=5.0)) as pipeline:
        assert pipeline.counters is not None and pipeline.counters.cadence == 5.0


def test_a_negative_cadence_is_one_line_of_usage_error(capsys):
    assert main(["serve", "--watch-counters", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--watch-counters: '-1' must be 0 (off) or more seconds" in err

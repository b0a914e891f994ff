"""Record / read / replay: round trip, a growing file, damage, disk full, and the replay controls."""

from __future__ import annotations

import errno
import gzip
import json
import os

import pytest

from gputop.analysis.stack_classes import FORWARD_BACKWARD, WAITING_FOR_DATA
from gputop.errors import GputopError
from gputop.recording import RecordingWriter, ReplaySource, read_recording
from tests.harness.histories import Scenario, build, cycle, eight_ranks, record, worker_busy_frames


def snapshots(seconds=9):
    sc = Scenario(
        seconds=seconds,
        ranks=eight_ranks(
            state=cycle([WAITING_FOR_DATA, FORWARD_BACKWARD]),
            workers=lambda t: (5000, 5001),
            worker_frames=lambda t, w: worker_busy_frames(int(t)),
        ),
    )
    hist = build(sc)
    return hist.machine, list(hist)


def test_round_trip_is_equal_and_shares_unchanged_stacks(tmp_path):
    machine, snaps = snapshots()
    path = record(tmp_path / "run.gtr", machine, snaps)
    machine2, snaps2, warning = read_recording(str(path))
    assert warning is None
    assert machine2 == machine
    assert snaps2 == snaps
    # 1 s snapshots between 2 s stack refreshes reference the same dump object, as in a live History
    assert snaps2[0].job.stacks[1000] is snaps2[1].job.stacks[1000]
    assert snaps2[1].job.stacks[1000] is not snaps2[2].job.stacks[1000]


def test_file_is_compressed_json_lines_that_zcat_reads(tmp_path):
    machine, snaps = snapshots()
    path = record(tmp_path / "run.gtr", machine, snaps)
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f]
    assert lines[0]["format"] == "gputop-recording" and lines[0]["machine"]["hostname"] == "trainbox"
    assert len(lines) == 1 + len(snaps) and "snapshot" in lines[1]
    uncompressed = sum(len(json.dumps(line)) for line in lines)
    assert os.path.getsize(path) < uncompressed / 3


def test_growing_file_is_readable_while_written(tmp_path):
    machine, snaps = snapshots()
    path = tmp_path / "live.gtr"
    w = RecordingWriter(str(path), machine)
    try:
        for s in snaps[:4]:
            w.write(s)
        _m, got, warning = read_recording(str(path))
        assert got == snaps[:4] and warning is None
        # a writer caught half-way through a member: the reader sees the whole members before it
        member = gzip.compress(b'{"snapshot": {"timestamp": 1}}\n')
        with open(path, "ab") as f:
            f.write(member[: len(member) // 2])
        _m, got, warning = read_recording(str(path))
        assert got == snaps[:4]
        assert "truncated" in warning and "\n" not in warning
    finally:
        w.close()


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_truncated_file_replays_up_to_the_damage(tmp_path, cut):
    machine, snaps = snapshots()
    path = record(tmp_path / "run.gtr", machine, snaps)
    data = path.read_bytes()
    path.write_bytes(data[:-cut])
    _m, got, warning = read_recording(str(path))
    assert got == snaps[:-1]
    assert warning.startswith(f"recording {path} is damaged (truncated") and f"the {len(snaps) - 1} snapshots" in warning


def test_corrupt_member_in_the_middle_stops_there(tmp_path):
    machine, snaps = snapshots()
    path = tmp_path / "run.gtr"
    record(path, machine, snaps[:3])
    good = path.stat().st_size
    record(tmp_path / "all.gtr", machine, snaps)
    data = bytearray((tmp_path / "all.gtr").read_bytes())
    data[good + 30 : good + 40] = b"\x00" * 10  # inside the 4th snapshot's deflate data
    path.write_bytes(bytes(data))
    _m, got, warning = read_recording(str(path))
    assert got == snaps[:3]
    assert "corrupt data at byte" in warning


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", "is empty"),
        (b"hello, not gzip\n", "not a gputop recording"),
        (gzip.compress(b'{"x": 1}\n', mtime=0), "not a gputop recording"),
    ],
)
def test_not_a_recording_is_one_line_error(tmp_path, content, message):
    path = tmp_path / "bad.gtr"
    path.write_bytes(content)
    with pytest.raises(GputopError, match=message) as exc:
        read_recording(str(path))
    assert "\n" not in str(exc.value)


def test_missing_file_is_one_line_error(tmp_path):
    with pytest.raises(GputopError, match="no recording at .*gputop record -o FILE"):
        ReplaySource(str(tmp_path / "nope.gtr"))


def test_disk_full_on_create_is_one_line_error():
    machine, _snaps = snapshots(1)
    with pytest.raises(GputopError, match=r"cannot write recording /dev/full: No space left on device \(free some disk space"):
        RecordingWriter("/dev/full", machine)


def test_missing_directory_is_one_line_error(tmp_path):
    machine, _snaps = snapshots(1)
    with pytest.raises(GputopError, match="does not exist"):
        RecordingWriter(str(tmp_path / "no" / "such" / "x.gtr"), machine)


def test_disk_full_mid_recording_keeps_a_replayable_prefix(tmp_path, monkeypatch):
    machine, snaps = snapshots()
    path = tmp_path / "run.gtr"
    w = RecordingWriter(str(path), machine)
    for s in snaps[:5]:
        w.write(s)
    real_write = os.write

    def half_then_enospc(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_enospc)
    with pytest.raises(GputopError, match="No space left on device"):
        w.write(snaps[5])
    monkeypatch.undo()
    _m, got, warning = read_recording(str(path))
    assert got == snaps[:5] and "truncated" in warning


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_replay_position_speed_pause_seek(tmp_path):
    machine, snaps = snapshots(20)
    path = record(tmp_path / "run.gtr", machine, snaps)
    clock = FakeClock()
    src = ReplaySource(str(path), speed=2.0, clock=clock)
    assert src.machine == machine and src.duration == 20.0 and src.interval == 1.0
    assert src.poll() == snaps[0] and src.poll() is src.poll() and src.position == 0.0
    clock.now += 3.0  # 3 s of wall time at 2x
    assert src.position == 6.0 and src.poll().timestamp == snaps[6].timestamp
    assert [s.timestamp for s in src.drain()] == [s.timestamp for s in snaps[:7]]
    src.pause()
    clock.now += 10.0
    assert src.position == 6.0 and src.drain() == []
    src.resume()
    src.set_speed(0.5)
    clock.now += 4.0
    assert src.position == 8.0
    assert [s.timestamp for s in src.drain()] == [s.timestamp for s in snaps[7:9]]
    gen = src.generation
    src.seek(3.5)
    assert src.generation == gen + 1 and src.position == 3.5
    assert src.poll().timestamp == snaps[3].timestamp
    assert len(src.history_until()) == 4
    src.seek(1e9)
    assert src.position == 20.0 and src.finished and src.poll().timestamp == snaps[-1].timestamp
    src.seek(-5)
    assert src.position == 0.0
    src.seek_by(2.0)
    assert src.position == 2.0
    with pytest.raises(GputopError, match="greater than 0"):
        src.set_speed(0)


# ---------------------------------------------------------------- bounded reading: index, keyframes, windows


def still_snapshots(seconds):
    """A job whose stack dumps are never refreshed (the collector keeps an idle process's last dump):
    every line after the first says "stacks unchanged" for every PID."""
    import dataclasses

    machine, snaps = snapshots(seconds)
    kept = snaps[0].job.stacks
    return machine, [dataclasses.replace(s, job=dataclasses.replace(s.job, stacks=dict(kept))) for s in snaps]


@pytest.mark.parametrize("keyframe_every", [60, 10**9], ids=["keyframes", "no-keyframes (older files)"])
def test_any_range_decodes_with_its_stacks(tmp_path, monkeypatch, keyframe_every):
    import gputop.recording as recording

    monkeypatch.setattr(recording, "KEYFRAME_EVERY", keyframe_every)
    machine, snaps = still_snapshots(150)
    path = record(tmp_path / "still.gtr", machine, snaps)
    with recording.RecordingIndex(str(path)) as index:
        assert len(index) == len(snaps) and list(index.timestamps) == [s.timestamp for s in snaps]
        assert list(index._keyframes) == ([0, 60, 120] if keyframe_every == 60 else [0])
        for start in (0, 1, 59, 60, 61, 119, 130, 148):
            got = list(index.snapshots(start, start + 3))
            assert got == snaps[start : start + 3], start
            assert got[0].job.stacks[1000].threads  # restored from the line that carried the dump in full
            assert got[1].job.stacks[1000] is got[2].job.stacks[1000]  # shared, as in a live History


def test_keyframes_repeat_every_dump_and_nothing_else(tmp_path):
    machine, snaps = still_snapshots(130)
    path = record(tmp_path / "still.gtr", machine, snaps)
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f][1:]
    assert [i for i, line in enumerate(lines) if "stacks_unchanged" not in line] == [0, 60, 120]
    assert (
        len(lines[60]["snapshot"]["job"]["stacks"]) == len(snaps[60].job.stacks) and lines[61]["snapshot"]["job"]["stacks"] == {}
    )


def _retained_bytes(make):
    """Bytes still allocated (tracemalloc) while the object `make()` returns is alive."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = make()
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del kept
    return retained


@pytest.mark.slow
def test_replay_memory_does_not_grow_with_the_recording(tmp_path):
    from gputop.recording import RecordingIndex

    machine, snaps = snapshots(120)
    short = record(tmp_path / "short.gtr", machine, snaps[:40])
    long = record(tmp_path / "long.gtr", machine, snaps)

    def played(path, last):
        src = ReplaySource(str(path), window=10, clock=FakeClock())
        src.seek(1e9)
        assert len(src.history_until()) == 10 and src.poll() == last
        return src

    played(short, snaps[39]).close()  # first calls fill caches (imports, regexes): not what is measured
    index_growth = _retained_bytes(lambda: RecordingIndex(str(long))) - _retained_bytes(lambda: RecordingIndex(str(short)))
    replay = _retained_bytes(lambda: played(long, snaps[-1]))
    held = _retained_bytes(lambda: read_recording(str(long)))
    print(f"index: +{index_growth} B for 80 more snapshots; replay of 121 snapshots keeps {replay} B; read_recording {held} B")
    # the index costs a few dozen bytes per snapshot; a replay keeps about one decoded snapshot and one
    # member of the file, whatever the length; read_recording holds all of them
    assert index_growth < 80 * 64, index_growth
    assert replay < held / 20, (replay, held)


def test_replay_hands_out_at_most_its_window(tmp_path):
    machine, snaps = snapshots(100)
    path = record(tmp_path / "run.gtr", machine, snaps)
    clock = FakeClock()
    src = ReplaySource(str(path), speed=10.0, clock=clock, window=12)
    clock.now += 1.0  # 10 s of recording in one step: all fit
    assert src.drain() == snaps[:11]
    clock.now += 5.0  # 50 s more: the last 12 of them (a history keeps no more)
    assert src.drain() == snaps[49:61]
    src.seek(30)
    history = src.history_until()
    assert history == snaps[19:31] and src.poll() is history[-1]
    src.close()


def test_report_from_reads_only_the_tail_and_says_which_span(tmp_path):
    from gputop.commands.report import history_from_recording
    from gputop.report.jsonreport import render_json
    from gputop.report.markdown import render_markdown

    machine, snaps = snapshots(100)
    path = record(tmp_path / "run.gtr", machine, snaps)
    hist, rec = history_from_recording(str(path), limit=30)
    assert list(hist) == snaps[-30:]
    assert rec == {
        "file": str(path),
        "snapshots": 101,
        "start": snaps[0].timestamp,
        "end": snaps[-1].timestamp,
        "seconds": 100.0,
        "window_limit": 30,
        "whole": False,
    }
    md = render_markdown(hist, [], recording=rec)
    assert f"Read from the recording `{path}`, which spans 100 s (101 samples)" in md
    assert "This report covers its last 30 samples only (at most 30, to bound memory)" in md
    assert json.loads(render_json(hist, [], recording=rec))["recording"]["whole"] is False
    hist, rec = history_from_recording(str(path), limit=1000)
    assert list(hist) == snaps and rec["whole"] is True
    assert f"Read from the recording `{path}`: all of it." in render_markdown(hist, [], recording=rec)


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_record_keeps_a_tiny_history_however_long_it_runs(tmp_path, monkeypatch, capsys):
    from gputop.cli import build_parser
    from gputop.commands import record as record_cmd

    histories = []
    real_observe = record_cmd.observe

    def observe(*args, **kwargs):
        histories.append(real_observe(*args, **kwargs))
        return histories[-1]

    monkeypatch.setattr(record_cmd, "observe", observe)
    out = tmp_path / "sim.gtr"
    args = build_parser().parse_args(["record", "-o", str(out), "--simulate", "--seconds", "1.5", "--interval", "0.1"])
    assert record_cmd.run(args) == 0
    _m, snaps, _w = read_recording(str(out))
    assert len(snaps) >= 8 and len(histories[0]) == record_cmd.RECORD_HISTORY == histories[0].capacity
    span = snaps[-1].timestamp - snaps[0].timestamp
    assert f"recorded {len(snaps)} snapshots ({span:.0f} s)" in capsys.readouterr().err


# ---------------------------------------------------------------- NVLink rates: compact in memory, links on disk


def test_simulated_nvlinks_round_trip_with_their_wiring_shared(tmp_path):
    from gputop.model import NvLinks
    from tests.harness.histories import simulated_history

    hist = simulated_history("h100-sxm-8+nvlink-down=3", seconds=3)
    snaps = list(hist)
    path = record(tmp_path / "run.gtr", hist.machine, snaps)
    with gzip.open(path, "rt") as f:
        line = json.loads(f.readlines()[2])
    links = line["snapshot"]["gpus"][3]["nvlink"]  # on disk: one object per link, as `gputop snapshot --json`
    assert len(links) == 18 and sum(not link["active"] for link in links) == 4
    assert {"link", "active", "remote_bus_id", "remote_kind", "tx_bytes_per_s", "rx_bytes_per_s"} == set(links[0])
    _m, back, warning = read_recording(str(path))
    assert warning is None and back == snaps
    assert isinstance(back[1].gpus[3].nvlink, NvLinks)
    # read back, the snapshots share each GPU's wiring as the live ones do: one object, not one per snapshot
    assert back[1].gpus[3].nvlink.wiring is back[2].gpus[3].nvlink.wiring
    assert back[1].gpus[3].nvlink.rates != back[2].gpus[3].nvlink.rates  # the load moved between them


def test_a_recording_written_before_the_compact_layout_reads(tmp_path):
    # a snapshot line as gputop wrote it when every link was an object of its own (and before `jobs` existed)
    link = {"link": 0, "active": True, "remote_bus_id": "0000:A0:00.0", "remote_kind": "switch"}
    old = {
        "timestamp": 1700000000.0,
        "host": {"cpu_percent": [12.5, 3]},
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-0",
                "name": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": "00000000:18:00.0",
                "nvlink": [
                    {**link, "tx_bytes_per_s": 2.5e9, "rx_bytes_per_s": 2400000000},
                    {**link, "link": 1, "active": False, "tx_bytes_per_s": None, "rx_bytes_per_s": None},
                ],
            }
        ],
    }
    header = {"format": "gputop-recording", "version": 1, "gputop": "0.9", "machine": {"hostname": "old"}}
    path = tmp_path / "old.gtr"
    path.write_bytes(b"".join(gzip.compress(json.dumps(r).encode() + b"\n") for r in (header, {"snapshot": old})))
    machine, (snap,), warning = read_recording(str(path))
    assert warning is None and machine.hostname == "old"
    first, second = snap.gpus[0].nvlink
    assert (first.link, first.active, first.remote_kind, first.tx_bytes_per_s, first.rx_bytes_per_s) == (
        0,
        True,
        "switch",
        2.5e9,
        2.4e9,
    )
    assert isinstance(first.rx_bytes_per_s, float)
    assert (second.link, second.active, second.tx_bytes_per_s, second.rx_bytes_per_s) == (1, False, None, None)

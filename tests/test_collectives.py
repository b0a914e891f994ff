"""Flight recorder alignment on real dumps (tests/fixtures/flight_recorder/, recorded from a 3-rank gloo job
by tests/jobs/record_fr_fixtures.py), and against PyTorch's own analyzer (`fr_trace`) on the same files."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gputop.analysis.collectives import align, stack_groups
from gputop.collect.flight_recorder import FlightRecorderReader, parse_dump
from gputop.model import FlightRecord
from tests.harness.processes import wait_until

FIXTURES = Path(__file__).parent / "fixtures" / "flight_recorder"


def records(case: str) -> list[FlightRecord]:
    meta = json.loads((FIXTURES / case / "case.json").read_text())
    return [parse_dump((FIXTURES / case / f"rank_{r}").read_bytes(), pid=100 + r, rank=r) for r in range(meta["ranks"])]


def test_stuck_rank_is_missing_from_the_collective_the_others_wait_in():
    (wait,) = align(records("stuck"))
    assert (wait.op, wait.seq, wait.process_group) == ("gloo:all_reduce", 4, "0")
    assert wait.entered == (0, 1) and wait.missing == (2,) and not wait.mismatched
    assert wait.sizes == ((1024,),) and wait.dtype == "Float"
    assert wait.last_seq == {0: 4, 1: 4, 2: 3}
    assert wait.timeout_ms == 600_000
    assert wait.frames[0].startswith("all_reduce (distributed_c10d.py:")
    figures = wait.figures(now=wait.since + 20)
    assert figures["waited_s"] == 20.0 and figures["killed_in_s"] == 580.0
    assert "ranks 0, 1 entered; rank 2 never did" in wait.line()


def test_mismatched_collective_is_named_with_its_op():
    (wait,) = align(records("mismatch"))
    assert (wait.op, wait.seq) == ("gloo:all_reduce", 4)
    assert wait.entered == (0, 1) and wait.missing == () and wait.mismatched == {2: "gloo:broadcast"}
    assert "rank 2 entered gloo:broadcast instead" in wait.line()


def test_other_sizes_are_named():
    (wait,) = align(records("size"))
    assert wait.entered == (0, 1) and wait.other_sizes == {2: ((2048,),)} and not wait.missing


def test_exited_rank_is_missing():
    (wait,) = align(records("exit"))
    assert wait.seq == 4 and wait.missing == (2,)


def test_a_rank_without_a_record_is_unknown_not_missing():
    recs = records("stuck")
    recs[1] = FlightRecord(101, 1, "/tmp/x1", error="no dump at /tmp/x1 yet")
    (wait,) = align(recs)
    assert wait.entered == (0,) and wait.missing == (2,) and wait.unknown == (1,)


def test_healthy_records_have_no_wait():
    recs = records("stuck")
    done = [FlightRecord(r.pid, r.rank, r.source, entries=tuple(e for e in r.entries if e.done), groups=r.groups) for r in recs]
    assert align(done) == []


def test_a_planted_pickle_is_refused():
    evil = pickle.dumps(subprocess.Popen)  # a global: the reader must not resolve it
    rec = parse_dump(evil, rank=0, source="/tmp/fr0")
    assert rec.error is not None and "not a flight recorder dump" in rec.error and not rec.entries


def test_json_dumps_read_alike():
    raw = pickle.loads((FIXTURES / "stuck" / "rank_0").read_bytes())
    as_json = parse_dump(json.dumps(raw).encode(), rank=0)
    assert as_json.entries == parse_dump((FIXTURES / "stuck" / "rank_0").read_bytes(), rank=0).entries


def test_stack_groups_name_the_outliers():
    many, others = stack_groups({0: "all_reduce (c10d.py:1)", 1: "all_reduce (c10d.py:1)", 2: "load (job.py:9)"})
    assert many is not None and many.ranks == (0, 1) and [(g.frame, g.ranks) for g in others] == [("load (job.py:9)", (2,))]
    assert stack_groups({0: "a", 1: "b"})[0] is None


def _fr_trace(folder: Path, tmp_path: Path) -> list:
    """torch's analyzer on the dumps: its collectives that did not pass (missing ranks or a mismatch).
    torch 2.13's gloo recorder files the default group under "" in pg_config while its entries say "0",
    and fr_trace then fails (KeyError ('0', 2)); the copies given to it name the group as NCCL's dumps do."""
    given = tmp_path / folder.name
    given.mkdir()
    for dump in sorted(folder.glob("rank_*")):
        raw = pickle.loads(dump.read_bytes())
        if list(raw["pg_config"]) == [""]:
            raw["pg_config"] = {"0": dict(raw["pg_config"][""], name="0", desc="default_pg")}
        (given / dump.name).write_bytes(pickle.dumps(raw))
    out = tmp_path / f"{folder.name}.pkl"
    ran = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(given), "-p", "rank_", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    _types, db = pickle.loads(out.read_bytes())
    return [c for c in db.collectives if c.missing_ranks or not c.pass_check]


@pytest.mark.integration  # runs torch's own fr_trace in a subprocess: seconds each
@pytest.mark.parametrize("case", ["stuck", "exit"])
def test_missing_ranks_and_seq_equal_torchs_fr_trace(case, tmp_path):
    pytest.importorskip("torch.distributed.flight_recorder")
    theirs = _fr_trace(FIXTURES / case, tmp_path)
    (wait,) = align(records(case))
    assert [(c.collective_seq_id, set(c.missing_ranks or ())) for c in theirs] == [(wait.seq, set(wait.missing))]
    assert theirs[0].collective_name == wait.op


@pytest.mark.integration  # runs torch's own fr_trace in a subprocess: seconds each
@pytest.mark.parametrize("case", ["mismatch", "size"])
def test_mismatches_split_the_ranks_as_torchs_fr_trace_does(case, tmp_path):
    # fr_trace takes one rank's entry as the reference (here the odd rank's) and lists the others as mismatched;
    # gputop takes the entry most ranks agree on: the same seq id, and the same two sides
    pytest.importorskip("torch.distributed.flight_recorder")
    (theirs,) = _fr_trace(FIXTURES / case, tmp_path)
    (wait,) = align(records(case))
    odd = set(wait.mismatched) | set(wait.other_sizes)
    assert theirs.collective_seq_id == wait.seq and not theirs.missing_ranks and not wait.missing
    sides = {frozenset(theirs.mismatch_collectives), frozenset(theirs.expected_ranks - set(theirs.mismatch_collectives))}
    assert sides == {frozenset(wait.entered), frozenset(odd)}


def test_the_reader_finds_the_dump_by_the_ranks_environment_and_skips_an_earlier_runs(spawn, tmp_path):
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="100", TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "fr_"))
    rank = spawn(["sleep", "60"], env=env)
    plain = spawn(["sleep", "60"], env={k: v for k, v in env.items() if not k.startswith("TORCH_FR")})
    started = psutil.Process(rank.pid).create_time()
    reader = FlightRecorderReader()
    wait_until(lambda: reader.read(rank.pid, 2, started) is not None, what="the environment to be readable")
    assert reader.read(plain.pid, 2, started) is None  # recorder off: nothing to say
    assert "no dump at" in (reader.read(rank.pid, 2, started).error or "")
    shutil.copyfile(FIXTURES / "stuck" / "rank_2", tmp_path / "fr_2")
    got = reader.read(rank.pid, 2, started)
    assert got.error is None and got.source == str(tmp_path / "fr_2") and max(e.seq for e in got.entries) == 3
    os.utime(tmp_path / "fr_2", (started - 60, started - 60))
    assert "predates this rank" in (reader.read(rank.pid, 2, started).error or "")


def test_an_in_process_read_stands_in_only_where_the_rank_writes_no_dump(spawn, tmp_path):
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="100", TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "fr_"))
    rank = spawn(["sleep", "60"], env=env)
    plain = spawn(["sleep", "60"], env={k: v for k, v in env.items() if not k.startswith("TORCH_FR")})
    started = psutil.Process(rank.pid).create_time()
    reader = FlightRecorderReader()
    live = FlightRecord(rank.pid, 2, "an in-process read", entries=records("stuck")[2].entries)
    wait_until(lambda: reader.wants_live_read(rank.pid, 2, started), what="the environment to be readable")
    assert not reader.wants_live_read(plain.pid, 2, started)  # recorder off: nothing to read, nothing injected
    assert reader.read(rank.pid, 2, started, live) is live
    shutil.copyfile(FIXTURES / "stuck" / "rank_2", tmp_path / "fr_2")  # the job writes dumps: those are read
    assert not reader.wants_live_read(rank.pid, 2, started)
    assert reader.read(rank.pid, 2, started, live).source == str(tmp_path / "fr_2")
    os.utime(tmp_path / "fr_2", (started - 60, started - 60))  # an earlier run's dump is no dump of this one
    assert reader.wants_live_read(rank.pid, 2, started) and reader.read(rank.pid, 2, started, live) is live


def test_live_reads_run_once_per_rank_at_a_time_and_say_why_a_read_failed():
    import threading

    from gputop.inject.fr_read import LiveRecorderReads

    calls: list[int] = []
    go = threading.Event()

    def read(pid, rank):
        calls.append(pid)
        go.wait(30)
        if pid == 2:
            raise OSError("boom")
        return FlightRecord(pid, rank, "in-process")

    reads = LiveRecorderReads(read, every_s=3600, retry_s=0)
    assert reads.request([(1, 0), (2, 1)]) == [1, 2]
    assert reads.request([(1, 0), (2, 1)]) == []  # still running: never two reads of one rank at once
    assert not reads.wait_idle(0.05) and reads.busy()  # a report's end waits for them, bounded
    go.set()
    assert reads.wait_idle(30) and not reads.busy()  # ... and goes on as the last one lands
    assert reads.get(1).error is None and "OSError: boom" in reads.get(2).error
    assert reads.request([(1, 0)]) == [] and sorted(calls) == [1, 2]  # read within every_s: not again
    assert reads.request([(2, 1)]) == [2]  # a failed read is tried again after retry_s
    wait_until(lambda: not reads.busy(), what="the retry to end")
    reads.forget_except({1})
    assert reads.get(2) is None and reads.request([(2, 1)]) == [2]


def test_a_reports_end_lets_the_recorder_reads_in_flight_land():
    # `gputop report` flushes before its last poll: a rank whose read is a moment from answering is named from
    # its recorder, not "no recorder read" (each rank is read on its own thread and they land apart on a busy box)
    import threading

    from gputop.collect.job_tree import JobCollector

    go = threading.Event()

    def read(pid, rank):
        go.wait(30)
        return FlightRecord(pid, rank, "in-process")

    job = JobCollector(os.getpid(), stacks_enabled=False, dump=lambda pids: {}, native_dump=None, recorder_read=read)
    try:
        reads = job._live_recorders
        assert reads is not None and reads.request([(12345, 2)]) == [12345]
        flushed = threading.Thread(target=job.flush_samples)
        flushed.start()
        flushed.join(0.2)
        assert flushed.is_alive() and reads.get(12345) is None  # the report's end waits for the read ...
        go.set()
        flushed.join(30)
        assert not flushed.is_alive() and reads.get(12345).error is None  # ... and goes on once it has landed
    finally:
        go.set()
        job.close()

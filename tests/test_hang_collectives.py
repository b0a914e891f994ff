"""Hangs on real jobs, through `gputop report --pid`: a stopped job is said to be stopped (no verdict from its
frozen stack), and a gloo job whose rank 2 never enters the collective is named from the ranks' flight
recorders (the op, its sequence id, who entered, who did not and where it is) or, without them, from stacks."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
from pathlib import Path

import pytest

from tests.harness.processes import free_port, run_gputop, wait_until
from tests.harness.train_jobs import START_TIMEOUT_S, start, wait_ready

JOB = str(Path(__file__).parent / "jobs" / "collective_job.py")
REPORT_S = "12"


def _hang(report: dict) -> dict:
    found = [f for f in report["findings"] if f["id"] == "hang"]
    assert found, [(f["id"], f["summary"]) for f in report["findings"]]
    return found[0]


def _report(spawn, pid: int) -> dict:
    ran = run_gputop(spawn, "report", "--pid", str(pid), "--seconds", REPORT_S, "--format", "json", timeout=120)
    assert ran.rc == 0, ran.err[-2000:]
    return json.loads(ran.out)


@pytest.mark.slow
def test_stopped_job_is_stopped_not_hung_nor_input_bound(spawn, tmp_path):
    proc, _ = start(spawn, tmp_path, "stopped", "--workers", "0", "--sample-ms", "10")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T", what="state T")
        report = _report(spawn, proc.pid)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    ids = [f["id"] for f in report["findings"]]
    top = report["findings"][0]
    assert top["id"] == "stopped", ids
    assert "Stopped, not hung" in top["summary"] and "by a signal" in top["summary"], top["summary"]
    assert f"kill -CONT {proc.pid}" in top["fix"]
    assert not {"hang", "starvation", "hiccup", "straggler"} & set(ids), ids


def _collective_job(spawn, tmp_path: Path, *, recorder: bool, case: str = "stuck", dump_every: int = 1, args=()) -> tuple:
    """3 gloo ranks under torchrun; after 3 all-reduces rank 2 breaks the pattern (`case`: stuck in its own
    code, or a broadcast instead), the others enter the 4th.  `dump_every` 0: the ranks write no dump."""
    dumps = tmp_path / "fr"
    dumps.mkdir()
    env = dict(os.environ)
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"):
        env.pop(name, None)
    if recorder:
        env.update(TORCH_FR_BUFFER_SIZE="100", TORCH_FR_DUMP_TEMP_FILE=str(dumps / "rank_"))
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), JOB, "--case", case, "--odd-rank", "2", "--dump-every", str(dump_every),
        "--ready", str(tmp_path / "ready"), *args,
    ]  # fmt: skip
    with open(tmp_path / "job.log", "wb") as log:
        proc = spawn(argv, stdout=log, stderr=log, env=env)
    records = wait_ready(tmp_path / "ready", 3, proc, START_TIMEOUT_S, tmp_path / "job.log")
    return proc, {r["rank"]: pid for pid, r in records.items()}, dumps


def _pending(path: Path) -> set[int]:
    return {e["collective_seq_id"] for e in pickle.loads(path.read_bytes())["entries"] if not e["retired"]}


@pytest.mark.slow
def test_flight_recorder_names_the_collective_and_the_missing_rank(spawn, tmp_path):
    proc, pids, dumps = _collective_job(spawn, tmp_path, recorder=True)
    # the ranks' dumps caught up (their first dump with frames takes seconds: torch symbolizes them once)
    wait_until(lambda: all(4 in _pending(dumps / f"rank_{r}") for r in (0, 1)), timeout=90, what="dumps with seq 4 pending")
    report = _report(spawn, proc.pid)
    hang = _hang(report)
    c = hang["figures"]["collective"]
    assert (c["source"], c["op"], c["seq"], c["process_group"]) == ("flight recorder", "gloo:all_reduce", 4, "0"), c
    assert c["entered"] == [0, 1] and c["missing"] == [2] and c["mismatched"] == {}, c
    assert c["sizes"] == [[1024]] and c["dtype"] == "Float" and c["timeout_ms"] == 600_000
    assert c["where"]["2"].startswith("load_next_shard (collective_job.py:"), c["where"]
    assert c["waited_s"] > 0 and c["killed_in_s"] < 600
    assert "gloo:all_reduce #4" in hang["summary"] and "rank 2 (at load_next_shard" in hang["summary"], hang["summary"]
    assert pids[2] in hang["pids"]


@pytest.mark.slow
def test_without_the_recorder_stacks_name_the_outlier_and_how_to_turn_it_on(spawn, tmp_path):
    proc, pids, _ = _collective_job(spawn, tmp_path, recorder=False)
    report = _report(spawn, proc.pid)
    hang = _hang(report)
    c = hang["figures"]["collective"]  # what stacks alone say: the op, who waits in it and who is elsewhere
    assert c["source"] == "stacks" and c["op"] == "all_reduce" and c["seq"] is None, c
    assert c["entered"] == [0, 1] and c["missing"] == [2] and c["where"]["2"].startswith("load_next_shard ("), c
    text = "\n".join(hang["evidence"])
    assert "stacks: ranks 0, 1 at all_reduce" in text and "rank 2 elsewhere, at load_next_shard" in text, text
    assert "no flight recorder: export TORCH_FR_BUFFER_SIZE" in text
    assert "TORCH_FR_BUFFER_SIZE" in hang["fix"]


@pytest.mark.slow
def test_a_rank_in_another_collective_is_named_as_a_mismatch(spawn, tmp_path):
    proc, pids, dumps = _collective_job(spawn, tmp_path, recorder=True, case="mismatch")
    wait_until(lambda: all(4 in _pending(dumps / f"rank_{r}") for r in (0, 1, 2)), timeout=90, what="dumps with seq 4 pending")
    hang = _hang(_report(spawn, proc.pid))
    c = hang["figures"]["collective"]
    assert (c["op"], c["seq"]) == ("gloo:all_reduce", 4) and c["entered"] == [0, 1] and c["missing"] == []
    assert c["mismatched"] == {"2": "gloo:broadcast"}, c
    assert "rank 2" in hang["summary"] and "entered another collective" in hang["summary"], hang["summary"]


def _release(path: Path, stuck_in: str) -> None:
    if stuck_in == "sleep":
        path.touch()
    else:  # the FIFO the rank reads: a byte lets it go
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)


@pytest.mark.slow
@pytest.mark.parametrize("stuck_in", ["sleep", "read"])
def test_a_recorder_without_dump_files_is_read_in_process_and_the_job_goes_on(spawn, tmp_path, stuck_in):
    # the recorder is on, no rank writes a dump: gputop reads each rank's recorder from inside it, on the ranks
    # waiting in the all-reduce (main thread in gloo's wait) and on rank 2, stuck in a sleep loop or a read
    release = tmp_path / "release"
    if stuck_in == "read":
        os.mkfifo(release)
    proc, pids, dumps = _collective_job(
        spawn, tmp_path, recorder=True, dump_every=0,
        args=("--stuck-in", stuck_in, "--release", str(release), "--finish-steps", "3"),
    )  # fmt: skip
    report = _report(spawn, proc.pid)
    assert not list(dumps.iterdir())  # nothing on disk: what gputop names came from the in-process reads
    named = [f for f in report["findings"] if (f["figures"].get("collective") or {}).get("source") == "flight recorder"]
    assert named, [(f["id"], f["summary"], f["evidence"]) for f in report["findings"]]
    c = named[0]["figures"]["collective"]
    assert (c["op"], c["seq"], c["process_group"]) == ("gloo:all_reduce", 4, "0"), c
    assert c["entered"] == [0, 1] and c["missing"] == [2] and c["last_seq"] == {"0": 4, "1": 4, "2": 3}, c
    assert c["where"]["2"].startswith("load_next_shard (collective_job.py:"), c["where"]
    assert pids[2] in named[0]["pids"]
    # unharmed: released, rank 2 enters the all-reduce, every rank takes its last steps and the job exits 0
    _release(release, stuck_in)
    assert proc.wait(timeout=START_TIMEOUT_S) == 0, (tmp_path / "job.log").read_text()[-2000:]


@pytest.mark.slow
def test_a_refused_in_process_read_leaves_the_finding_from_stacks_and_says_why(spawn, tmp_path):
    from gputop.inject.injector import InjectionLock

    proc, pids, _ = _collective_job(spawn, tmp_path, recorder=True, dump_every=0)
    with InjectionLock(pids[2], "a test holding rank 2"):  # another injection runs in rank 2: its read is refused
        hang = _hang(_report(spawn, proc.pid))
    c = hang["figures"]["collective"]
    assert c["source"] == "stacks" and c["entered"] == [0, 1] and c["missing"] == [2], c
    refused = [line for line in hang["evidence"] if line.startswith("flight recorder on, not read:")]
    assert len(refused) == 1 and f"PID {pids[2]} already has a gputop injection running" in refused[0], hang["evidence"]


# ---------------------------------------------------------------- the same decisions on built histories

from gputop.analysis.diagnosis import diagnose  # noqa: E402
from gputop.analysis.stack_classes import COLLECTIVE, IN_DATASET  # noqa: E402
from tests.harness import histories as hb  # noqa: E402


def _stopped_at(t0: float, tracer=None):
    return lambda t: ("t" if tracer else "T", tracer) if t >= t0 else ("R", None)


def test_a_rank_stopped_by_a_tracer_is_named_with_it_and_the_waiters_fold_into_it():
    ranks = hb.eight_ranks(state=lambda t: COLLECTIVE if t >= 20 else IN_DATASET, cpu=lambda t: 0.0 if t >= 20 else 30.0)
    ranks[3] = hb.RankSpec(
        ranks[3].pid, 3, gpus=(3,), state=lambda t: IN_DATASET, cpu=lambda t: 0.0, proc_state=_stopped_at(20, "PID 812 (gdb)")
    )
    findings = diagnose(hb.build(hb.Scenario(seconds=60, util=lambda g, t: 0.0 if t >= 20 else 95.0, ranks=ranks)))
    top = findings[0]
    assert top.id == "stopped" and "by its tracer, PID 812 (gdb)" in top.summary, [(f.id, f.summary) for f in findings]
    assert "7 other rank(s) wait for it" in top.summary and "detach" in top.fix
    assert not {"hang", "starvation"} & {f.id for f in findings}


def test_a_single_snapshot_in_state_t_is_not_a_stop():
    # py-spy's dumps stop a process for milliseconds: one snapshot that caught it proves nothing
    ranks = hb.eight_ranks(proc_state=lambda t: ("t", None) if t >= 30 else ("R", None))
    history = hb.build(hb.Scenario(seconds=30, ranks=ranks))
    assert history.latest.job.ranks[0].proc.state == "t"  # the newest snapshot caught it
    assert "stopped" not in {f.id for f in diagnose(history)}

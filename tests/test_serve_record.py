"""`gputop serve` and `gputop record` run the one pipeline: a recording holds what serve exports.

The same machine and job give the same job trees in serve's metrics and in the recording (the real
commands, as processes, beside a real training job on the simulated GPUs), and `gputop report --from`
the recording gives the findings serve exported (the real exporter, recording writer and report
command over the same snapshots, of a machine running two jobs).
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputop.analysis.stack_classes import COLLECTIVE, FORWARD_BACKWARD, WAITING_FOR_DATA
from gputop.cli import main
from gputop.exporter import FINDING_LABELS, Exporter, job_label
from gputop.recording import read_recording
from gputop.source import jobs_of
from tests.harness import histories as hb
from tests.harness.processes import free_port, wait_until
from tests.harness.train_jobs import ATTACH_LOOP, start

# ----------------------------------------------------------------- the same snapshots, two sinks


class SnapshotSource:
    """The pipeline as the exporter sees it: a machine and one snapshot per poll."""

    def __init__(self, machine, snapshots) -> None:
        self.machine = machine
        self.snapshots = list(snapshots)
        self.polled = 0

    def poll(self):
        self.polled += 1
        return self.snapshots[self.polled - 1]

    def close(self) -> None:
        pass


def two_jobs(seconds: float = 40.0):
    """A machine of 4 GPUs running two jobs: launcher 100's two ranks starve for data (GPUs 0-1), launcher
    200's two ranks hang in a collective from t=10 s (GPUs 2-3).  Snapshots as the pipeline makes them
    when it follows both: the trees in `Snapshot.jobs`, none in `Snapshot.job`."""
    starving = hb.Scenario(
        seconds=seconds,
        gpu_count=4,
        util=lambda g, t: 30.0,
        ranks=[
            hb.RankSpec(
                pid=1000 + i,
                rank=i,
                gpus=(i,),
                state=hb.cycle([WAITING_FOR_DATA, WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD]),
                workers=lambda t, i=i: (5000 + 10 * i, 5001 + 10 * i),
            )
            for i in range(2)
        ],
    )
    hung = hb.Scenario(
        seconds=seconds,
        gpu_count=4,
        util=lambda g, t: 95.0 if t < 10 else 0.0,
        ranks=[
            hb.RankSpec(
                pid=2000 + i,
                rank=i,
                gpus=(2 + i,),
                state=lambda t: FORWARD_BACKWARD if t < 10 else COLLECTIVE,
                cpu=lambda t: 30.0 if t < 10 else 0.0,
            )
            for i in range(2)
        ],
    )
    first, second = hb.build(starving), hb.build(hung)
    snapshots = []
    for a, b in zip(first, second):
        other = replace(b.job, root_pid=200, launcher=replace(b.job.launcher, pid=200))
        snapshots.append(replace(a, gpus=a.gpus[:2] + b.gpus[2:], job=None, jobs=(a.job, other)))
    return first.machine, snapshots


def exported_findings(text: str) -> dict[str, set[tuple[str, str, str]]]:
    """serve's active findings per job: {job: {(kind, severity, label)}}."""
    found: dict[str, set[tuple[str, str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gputop_finding" and sample.value == 1:
                labels = sample.labels
                found.setdefault(labels["job"], set()).add((labels["kind"], labels["severity"], labels["label"]))
    return found


def reported_findings(path: Path, out: Path, *job: str) -> set[tuple[str, str, str]]:
    """`gputop report --from PATH [--job J] --format json`'s findings, labelled as serve labels them."""
    assert main(["report", "--from", str(path), *(["--job", *job] if job else []), "--format", "json", "-o", str(out)]) == 0
    findings = json.loads(out.read_text())["findings"]
    return {(f["id"], f["severity"], FINDING_LABELS[f["label"]]) for f in findings if f["label"] in FINDING_LABELS}


def test_report_from_a_recording_gives_the_findings_serve_exported_for_each_job(tmp_path, capsys):
    from prometheus_client import CollectorRegistry, generate_latest

    machine, snapshots = two_jobs()
    source = SnapshotSource(machine, snapshots)
    exporter = Exporter(source, interval=1.0, log=lambda line: None)
    for _ in snapshots:
        exporter.cycle()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    exported = exported_findings(generate_latest(registry).decode())
    first, second = f"{machine.hostname}:100", f"{machine.hostname}:200"  # jobs on one machine: host and launcher PID
    assert set(exported) == {first, second}
    assert ("hang", "critical", "code") in exported[second] and not any(kind == "hang" for kind, _, _ in exported[first])

    path = hb.record(tmp_path / "machine.gtr", machine, snapshots)  # what `gputop record` writes of them
    assert reported_findings(path, tmp_path / "100.json", first) == exported[first]  # serve's label picks the job
    assert reported_findings(path, tmp_path / "200.json", "200") == exported[second]  # and so does its PID
    capsys.readouterr()
    # without --job: the first job, and a line that names the others and how to choose
    assert reported_findings(path, tmp_path / "first.json") == exported[first]
    err = capsys.readouterr().err
    assert "holds 2 jobs; reporting on job 100 (the others: 200; choose with --job PID)" in err


def test_a_recording_of_several_jobs_reads_back_equal_with_unchanged_dumps_shared(tmp_path):
    """Each tree's stack dumps are written once per refresh, as the one attached job's are (a dump taken
    every 2 s, snapshots every 1 s); read back, equal snapshots, the unchanged dumps shared objects, and a
    read from the middle (a seek, `report --from`'s window) restores them from the keyframe before it."""
    import gzip

    from gputop.recording import RecordingIndex

    machine, snapshots = two_jobs(seconds=9)
    path = hb.record(tmp_path / "machine.gtr", machine, snapshots)
    _machine, read, warning = read_recording(str(path))
    assert warning is None and read == snapshots
    first, second, third = (snap.jobs for snap in read[:3])
    assert first[1].stacks[2000] is second[1].stacks[2000] and second[1].stacks[2000] is not third[1].stacks[2000]
    with RecordingIndex(str(path)) as index:
        assert list(index.snapshots(5, 7)) == snapshots[5:7]
    # on disk, the second snapshot repeats none of the first one's dumps: it names them instead
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f]
    second_line = lines[2]
    assert [tree["stacks"] for tree in second_line["snapshot"]["jobs"]] == [{}, {}]
    assert [sorted(pids) for pids in second_line["jobs_stacks_unchanged"]] == [sorted(t.stacks) for t in first]


def test_report_from_names_the_jobs_a_recording_holds_for_a_job_it_does_not(tmp_path, capsys):
    machine, snapshots = two_jobs(seconds=4)
    path = hb.record(tmp_path / "machine.gtr", machine, snapshots)
    assert main(["report", "--from", str(path), "--job", "300"]) == 2
    err = capsys.readouterr().err
    assert err == f"gputop: --job 300: {path} holds no such job (its jobs: 100, 200)\n"


# ----------------------------------------------------------------- the real commands beside a real job

# The commands as a user runs them, in processes of their own; only the simulated GPUs' process lists are
# scripted (no real GPU here): the job's rank holds GPU 3.
ON_GPU_3 = """
import sys
from gputop.sim.synthetic import SyntheticLoad
SyntheticLoad.processes = lambda self, gpu: [({pid}, 1 << 30)] if gpu == 3 else []
from gputop.cli import main
sys.exit(main(sys.argv[1:]))
"""
SAME_OPTIONS = ["--simulate", "h100-sxm-8", "--interval", "0.5", "--stack-interval", "0.5"]


def scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def exported_trees(samples: dict[str, list]) -> set[tuple]:
    """{(job, rank, pid, gpu, live workers)} from serve's rank and worker metrics."""
    workers = {(s.labels["job"], s.labels["rank"]): s.value for s in samples.get("gputop_dataloader_workers", [])}
    return {
        (s.labels["job"], s.labels["rank"], s.labels["pid"], s.labels["gpu"], workers[(s.labels["job"], s.labels["rank"])])
        for s in samples.get("gputop_rank_info", [])
    }


def recorded_trees(snapshot, hostname: str) -> set[tuple]:
    """The same, from a recorded snapshot's job trees (the job labelled as serve labels it on `hostname`)."""
    return {
        (
            job_label(tree, hostname),
            str(rank.rank if rank.rank is not None else position),
            str(rank.proc.pid),
            str(gpu),
            float(sum(1 for w in rank.workers if not w.exited)),
        )
        for tree in jobs_of(snapshot)
        for position, rank in enumerate(tree.ranks)
        for gpu in rank.gpus
    }


@pytest.mark.slow
def test_record_and_serve_of_the_same_machine_and_job_hold_the_same_job_trees(spawn, tmp_path):
    # one rank with two persistent DataLoader workers (the same PIDs all along), found through the GPU
    job, records = start(spawn, tmp_path, "loop", *ATTACH_LOOP, "--workers", "2", "--persistent", "--length", "100000")
    (pid,) = records
    code = ON_GPU_3.format(pid=pid)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    serve = spawn.python(
        ["-c", code, "serve", "--listen", f"127.0.0.1:{port}", *SAME_OPTIONS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    path = tmp_path / "machine.gtr"
    record = spawn.python(
        ["-c", code, "record", "-o", str(path), "--seconds", "5", *SAME_OPTIONS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _out, err = record.communicate(timeout=120)
    assert record.returncode == 0, err

    machine, snapshots, warning = read_recording(str(path))
    assert warning is None and snapshots
    recorded = recorded_trees(snapshots[-1], machine.hostname)
    # the job's rank on GPU 3 with its two workers, the job named by this host and its launcher's PID
    assert recorded == {(f"{machine.hostname}:{pid}", "0", str(pid), "3", 2.0)}
    assert any(tree.stacks for snap in snapshots for tree in jobs_of(snap))  # followed with its stacks

    def exported() -> set[tuple]:
        if serve.poll() is not None:
            raise AssertionError(f"gputop serve exited {serve.returncode}: {serve.stderr.read()}")
        try:
            return exported_trees(scrape(url))
        except OSError:  # not listening yet
            return set()

    try:
        wait_until(lambda: exported() == recorded, timeout=60, what="serve to export the recorded tree")
    except AssertionError as exc:  # say what differs
        raise AssertionError(f"{exc}: recorded {recorded}, exported {exported()}") from None
    serve.send_signal(signal.SIGTERM)
    _out, err = serve.communicate(timeout=30)
    assert serve.returncode == 0 and "Traceback" not in err, err
    assert job.poll() is None  # neither command disturbed the job

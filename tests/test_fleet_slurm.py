"""`--slurm-job ID`: from a Slurm job id to its nodes (squeue, `scontrol show hostnames`) and to the job label
their `gputop serve` exported.  Slurm's two commands are small stand-in scripts on PATH that answer as Slurm's
do (a bracketed node list, one hostname a line, Slurm's error for an unknown job); Prometheus is the stand-in
over a real loopback socket, answering from the synthetic fleet of tests/harness/fleet_scale.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gputop.cli import main
from tests.harness import fleet_scale as fs
from tests.harness.prometheus_api import PrometheusStandIn
from tests.test_fleet import PromLike

SLURM_JOB = "4242"  # labelled by Slurm's id in Prometheus (`slurm-4242.0`)
TORCHRUN_SLURM_JOB = "5151"  # torchrun under Slurm: labelled with the rendezvous id (`llama-256`)
OTHER_HOSTS = ("gpu-a", "gpu-b")

SQUEUE = """#!{python}
import sys
args = sys.argv[1:]
assert args[:2] == ["-h", "-j"] and args[3:] == ["-o", "%N"], args
jobs = {jobs!r}
if args[2] not in jobs:
    sys.stderr.write("slurm_load_jobs error: Invalid job id specified\\n")
    sys.exit(1)
print(jobs[args[2]])
"""

SCONTROL = """#!{python}
import re, sys
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
for part in re.findall(r"[^,\\[]+(?:\\[[^\\]]*\\])?", sys.argv[3]):
    m = re.match(r"(.*)\\[(\\d+)-(\\d+)\\]$", part)
    if not m:
        print(part)
        continue
    for i in range(int(m.group(2)), int(m.group(3)) + 1):
        print(f"{{m.group(1)}}{{i:0{{len(m.group(2))}}d}}")
"""


def fake_slurm(bin_dir: Path, jobs: dict[str, str]) -> None:
    """squeue and scontrol on `bin_dir`: `jobs` maps a running job's id to its node list as squeue prints it."""
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("squeue", SQUEUE), ("scontrol", SCONTROL)):
        path = bin_dir / name
        path.write_text(text.format(python=sys.executable, jobs=jobs))
        path.chmod(0o755)


@pytest.fixture
def prometheus():
    """16 nodes of the torchrun job `llama-256` (node000..node015) and a 2-node job labelled by Slurm."""
    fleet = fs.Fleet.of(16)
    other = [
        (name, {**labels, "job": f"slurm-{SLURM_JOB}.0", "Hostname": OTHER_HOSTS[int(labels["Hostname"][-1])]}, value)
        for name, labels, value in fs.fleet_pages(fs.Fleet.of(2))
        if labels.get("job") == fs.JOB
    ]
    server = PrometheusStandIn(PromLike([], fs.PAGE_AT, samples=[*fs.fleet_pages(fleet), *other])).start()
    try:
        yield server.url
    finally:
        server.stop()


def report(url: str, tmp_path: Path, *more: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    code = main(["report", "--prometheus", url, "--format", "json", "-o", str(out), *more])
    return code, json.loads(out.read_text()) if code == 0 else {}


def test_a_slurm_job_labelled_by_torchrun_is_found_by_its_nodes(prometheus, tmp_path, monkeypatch):
    fake_slurm(tmp_path / "bin", {TORCHRUN_SLURM_JOB: "node[004-007],node[012-013]"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    code, data = report(prometheus, tmp_path, "--slurm-job", TORCHRUN_SLURM_JOB)
    assert code == 0 and data["job"] == fs.JOB, data.get("job")
    # the stand-in holds no series of the stopped node (node013) at all; Slurm says the job runs there
    silent = [n["node"] for n in data["nodes"] if not n["reporting"]]
    assert len(data["nodes"]) == 16 and silent == ["node013"], silent
    assert {"kind": "stopped_reporting", "node": "node013"}.items() <= next(
        o for o in data["outliers"] if o["kind"] == "stopped_reporting"
    ).items()


def test_a_slurm_job_is_found_by_the_label_slurm_gives_it(prometheus, tmp_path, monkeypatch):
    fake_slurm(tmp_path / "bin", {SLURM_JOB: "gpu-a,gpu-b"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    code, data = report(prometheus, tmp_path, "--slurm-job", SLURM_JOB)
    assert code == 0 and data["job"] == f"slurm-{SLURM_JOB}.0", data.get("job")
    assert sorted(n["node"] for n in data["nodes"]) == list(OTHER_HOSTS)


@pytest.mark.parametrize("command", ["report", "fleet"])
def test_without_slurm_it_is_one_line(prometheus, tmp_path, monkeypatch, capsys, command):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing of Slurm's there
    argv = [command, "--prometheus", prometheus, "--slurm-job", SLURM_JOB]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("gputop: --slurm-job needs Slurm's squeue and scontrol, not found on PATH here") and err.count("\n") == 1
    )
    assert "--job" in err


def test_an_unknown_slurm_job_a_bad_id_and_nodes_without_serve_are_one_line_each(prometheus, tmp_path, monkeypatch, capsys):
    fake_slurm(tmp_path / "bin", {"777": "cpu[01-02]"})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    cases = [
        (["--slurm-job", "999"], 1, "squeue failed: slurm_load_jobs error: Invalid job id specified"),
        (["--slurm-job", "12;rm"], 2, "--slurm-job '12;rm' is not a Slurm job id"),
        (["--slurm-job", "777"], 1, "Slurm job 777 runs on cpu01, cpu02, but no gputop serve there exports a job"),
        (["--slurm-job", SLURM_JOB, "--job", fs.JOB], 2, "give --job or --slurm-job, not both"),
    ]
    for more, code, said in cases:
        assert main(["report", "--prometheus", prometheus, *more]) == code, more
        err = capsys.readouterr().err
        assert err.startswith("gputop: ") and said in err and err.count("\n") == 1, err
    assert main(["report", "--slurm-job", SLURM_JOB]) == 2
    assert "add --prometheus URL" in capsys.readouterr().err

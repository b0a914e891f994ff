"""From a Slurm job id to the job gputop's Prometheus series call it: `--slurm-job ID`.

A Slurm user knows a job id, not its hostnames nor the `job` label the nodes' `gputop serve` exported.
`squeue -h -j ID -o %N` gives the job's node list (`gpu-[001-004,010]`), `scontrol show hostnames` expands
it; the label is the one `gputop.fleet.identity` derives under Slurm (`slurm-ID`, `slurm-ID.STEP`), else
(torchrun under Slurm labels the job with its rendezvous id) the job Prometheus sees on most of those nodes."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Optional

from gputop.errors import GputopError, UsageError
from gputop.fleet.prometheus import Query
from gputop.fleet.view import MACHINE_JOB, short_hostname

SLURM_TIMEOUT_S = 15.0
# a job, an array task (123_4) or a het-job component (123+1), optionally a step
_JOB_ID = re.compile(r"^\d+([_+]\d+)?(\.\d+)?$")


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GputopError(f"{what} did not answer in {SLURM_TIMEOUT_S:.0f} s (is slurmctld reachable from here?)") from None
    except OSError as exc:
        raise GputopError(f"{what} could not run: {exc.strerror or exc}") from None
    if done.returncode != 0:
        said = next((line.strip() for line in done.stderr.splitlines() if line.strip()), f"exit status {done.returncode}")
        raise GputopError(f"{what} failed: {said}")
    return done.stdout


def slurm_job_nodes(job_id: str) -> list[str]:
    """The hostnames of Slurm job `job_id` (running), from squeue and scontrol; one line for what goes wrong."""
    if not _JOB_ID.match(job_id.strip()):
        raise UsageError(f"--slurm-job {job_id!r} is not a Slurm job id (such as 123456, 123456_7 or 123456.0)")
    job_id = job_id.strip()
    squeue, scontrol = shutil.which("squeue"), shutil.which("scontrol")
    if squeue is None or scontrol is None:
        missing = " and ".join(name for name, path in (("squeue", squeue), ("scontrol", scontrol)) if path is None)
        raise UsageError(
            f"--slurm-job needs Slurm's {missing}, not found on PATH here: run it where Slurm's commands are (a login "
            "node), or give the job's label with --job"
        )
    listed = [line.strip() for line in _run([squeue, "-h", "-j", job_id.split(".")[0], "-o", "%N"], "squeue").splitlines()]
    nodelist = ",".join(line for line in listed if line)
    if not nodelist:
        raise GputopError(f"Slurm job {job_id} has no nodes (squeue lists it pending or not at all): it must be running")
    hosts = [line.strip() for line in _run([scontrol, "show", "hostnames", nodelist], "scontrol show hostnames").splitlines()]
    return [h for h in hosts if h]


def slurm_job_label(query: Query, job_id: str, hosts: list[str], where: str) -> str:
    """The `job` label of Slurm job `job_id` in Prometheus: `slurm-ID` (or its step, the one on most nodes),
    else the job seen on most of its `hosts` (a Hostname matches by its short name)."""
    on_hosts: dict[str, set[str]] = {}
    for s in query("gputop_job_info"):
        label = s.labels.get("job", "")
        if label and label != MACHINE_JOB:
            on_hosts.setdefault(label, set()).add(short_hostname(s.labels.get("Hostname", "")))
    base = job_id.split(".")[0]
    named = [
        label
        for label in on_hosts
        if label == f"slurm-{job_id}" or label.startswith(f"slurm-{base}.") or label == f"slurm-{base}"
    ]
    if named:
        return max(named, key=lambda label: (label == f"slurm-{job_id}", len(on_hosts[label]), label))
    wanted = {short_hostname(h) for h in hosts}
    overlap: dict[str, int] = {label: len(seen & wanted) for label, seen in on_hosts.items()}
    best: Optional[str] = max(
        (label for label, n in overlap.items() if n), key=lambda label: (overlap[label], label), default=None
    )
    if best is None:
        shown = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
        known = ", ".join(sorted(on_hosts)) or "none"
        raise GputopError(
            f"Slurm job {job_id} runs on {shown}, but no gputop serve there exports a job to Prometheus at {where} "
            f"(jobs there: {known}): is gputop serve running on those nodes and scraped?"
        )
    return best


def resolve_job(query: Query, job: Optional[str], slurm_job: Optional[str], where: str) -> tuple[Optional[str], tuple[str, ...]]:
    """--job as given, or --slurm-job's label and the job's nodes as Slurm names them; both at once is a
    usage error."""
    if slurm_job is None:
        return job, ()
    if job is not None:
        raise UsageError("give --job or --slurm-job, not both")
    hosts = slurm_job_nodes(slurm_job)
    return slurm_job_label(query, slurm_job, hosts, where), tuple(hosts)

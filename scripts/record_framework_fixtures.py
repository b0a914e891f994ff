#!/usr/bin/env python
"""Record gputop attached to each framework job once into tests/fixtures/recordings/, for the replay tests.

    python scripts/record_framework_fixtures.py                  # every case (about 13 minutes on 2 cores)
    python scripts/record_framework_fixtures.py lightning-hang   # just these

Each case is a live job of the frameworks people train with (real Lightning, transformers + Accelerate, torchdata,
DeepSpeed; CPU only, nothing downloaded: tests/jobs/train_job.py) in one of its modes (starved, tuned, hang,
straggler), or the plain loop in one of the diagnosis modes (starved, starved0, hang, compute): tests/harness/
train_jobs.py FRAMEWORK_CASES.  Each is started as the live tests start it and, once ready, watched by gputop's real
attach pipeline (/proc discovery, py-spy dumps every 0.5 s, progress counters) as `tests/harness/attach.py`'s
Observer watches it, for `RECORD_S`: past the 30 s verdict deadline.  gputop's own `RecordingWriter` writes every
poll.  Beside each recording a small JSON says what the replays need (each rank's PID, the PID attached to, the
framework versions, the recording format, the digest of the job's source and of the options the case starts it
with, the box's load meanwhile, why it showed no GPU).  `tests/test_framework_replays.py` fails, naming this script,
when the job's source, a case's options or the recording format changed since.

Run it on a quiet box: the recordings are the verdicts' evidence, and a busy box records a busy box.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gputop.backend import RealMachine  # noqa: E402
from gputop.pipeline import Following, Pipeline  # noqa: E402
from gputop.recording import VERSION, RecordingWriter  # noqa: E402
from tests.harness import train_jobs  # noqa: E402
from tests.harness.attach import STACK_INTERVAL_S  # noqa: E402
from tests.harness.processes import Spawner  # noqa: E402
from tests.harness.replay import FIXTURES, record_named  # noqa: E402

RECORD_S = 36.0  # the live tests' 30 s verdict deadline, and the verdict seen to hold a little past it
START_DEADLINE_S = 180.0  # importing lightning/transformers on 2 cores is slow; not part of any bar
PACKAGES = ("torch", "lightning", "transformers", "accelerate", "torchdata", "deepspeed")


def source_digest(name: str) -> str:
    """The job's source and the options case `name` starts it with: a change to either makes its recording stale
    (a case added or changed leaves the others' recordings as they are)."""
    case = train_jobs.FRAMEWORK_CASES[name]
    digest = hashlib.sha256((REPO / "tests/jobs/train_job.py").read_bytes())
    digest.update(json.dumps([name, train_jobs.case_options(case), case.ranks, case.torchrun]).encode())
    return digest.hexdigest()[:16]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def record(name: str) -> Path:
    case = train_jobs.FRAMEWORK_CASES[name]
    path = FIXTURES / f"framework-{name}.gputop"
    partial = path.with_suffix(".partial")
    spawn = Spawner()
    loads: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="gputop-record-") as tmp:
            proc, records = train_jobs.start(
                spawn,
                Path(tmp),
                "job",
                *train_jobs.case_options(case, Path(tmp)),
                ranks=case.ranks,
                torchrun=case.torchrun,
                timeout=START_DEADLINE_S,
            )
            ranks = {record["rank"]: pid for pid, record in records.items()}
            attached = proc.pid if case.attach == "launcher" else ranks[int(case.attach.removeprefix("rank"))]
            pipeline = Pipeline(RealMachine(), follow=Following(pid=attached, stack_interval=STACK_INTERVAL_S))
            machine_gpu_error = pipeline.machine.gpu_error
            try:
                with RecordingWriter(str(partial), pipeline.machine) as writer:
                    started = tick = time.monotonic()
                    while time.monotonic() - started < RECORD_S:
                        writer.write(pipeline.poll())
                        loads.append(os.getloadavg()[0])
                        if proc.poll() is not None:
                            raise SystemExit(f"{name}: the job exited with {proc.returncode} while recorded")
                        tick += STACK_INTERVAL_S
                        time.sleep(max(0.0, tick - time.monotonic()))
                    count = writer.count
            finally:
                pipeline.close()
    finally:
        spawn.reap_all()
    os.replace(partial, path)
    meta = {
        "case": name,
        "framework": case.framework,
        "mode": case.mode,
        "ranks": {str(rank): pid for rank, pid in sorted(ranks.items())},
        "attached": attached,
        "launcher": proc.pid,
        "snapshots": count,
        "versions": {package: _version(package) for package in PACKAGES},
        "recording_version": VERSION,
        "source_digest": source_digest(name),
        "recorded": datetime.date.today().isoformat(),
        "load_average": {"min": round(min(loads), 2), "max": round(max(loads), 2)},
        "cpus": os.cpu_count(),
        "gpu_error": machine_gpu_error,  # why the box showed no GPU (None: it had one); the no-GPU verdicts rest on it
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{name}: {count} snapshots, {path.stat().st_size // 1024} KiB, load {meta['load_average']}", flush=True)
    return path


def main() -> int:
    return record_named(__doc__ or "", "case", sorted(train_jobs.FRAMEWORK_CASES), record)


if __name__ == "__main__":
    raise SystemExit(main())

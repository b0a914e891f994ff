#!/usr/bin/env python
"""Record each `gputop demo` scenario once into tests/fixtures/recordings/, for the replay tests.

    python scripts/record_demo_fixtures.py              # every scenario (about 15 minutes on 2 cores)
    python scripts/record_demo_fixtures.py starved ...  # just these

Each recording is what `gputop demo` sees: the real demo job (4 ranks) on the simulated 8-GPU machine,
attached from the job's start and polled once a second by the real pipeline (py-spy dumps and dense
samples included), written by gputop's own `RecordingWriter`.  It runs until every rank has been in its
loop for `AFTER_LOOP_S` (the starved scenario a whole share window longer, for its first-against-later
check).  Beside each recording a small JSON says what the tests need to know about it (the scenario's
resolved settings, the line of `loss.item()`, the digest of the demo job's source, the recording format
version, the box's load while it ran).  `tests/test_demo_replays.py` fails, naming this script, when the
demo job's source or the recording format has changed since (the recordings would no longer be the job
the code runs).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gputop.analysis.thresholds import SHARE_WINDOW_S  # noqa: E402
from gputop.backend import SimulatedMachine  # noqa: E402
from gputop.pipeline import Following, Pipeline  # noqa: E402
from gputop.recording import VERSION, RecordingWriter  # noqa: E402
from gputop.sim.demo_launcher import DemoJob  # noqa: E402
from gputop.sim.scenarios import SCENARIOS  # noqa: E402
from tests.harness.replay import record_named  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "recordings"
RANKS = 4  # as the live demo tests: 4 ranks start faster on a small box than 8; the profiles are the same
AFTER_LOOP_S = 45.0  # past the 30 s verdict deadline, with room to see the verdict hold
LONGER = {"starved": SHARE_WINDOW_S + 5.0}  # a whole share window past the first verdict
STARTUP_CAP_S = 240.0  # the live tests' start-up bound
# the files whose code decides what a demo job does: a change to one makes the recordings stale
SOURCES = ("gputop/sim/demo_job.py", "gputop/sim/scenarios.py", "gputop/sim/distributed.py", "gputop/sim/kernels.py")


def source_digest() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (REPO / name).read_bytes())
    return digest.hexdigest()[:16]


def item_line() -> int:
    """The line of `running_loss += loss.item()` in demo_job.py (where the sync-bound hosts park), read from the
    source text: importing the job would import torch."""
    lines = (REPO / "gputop/sim/demo_job.py").read_text().splitlines()
    return 1 + next(i for i, text in enumerate(lines) if "running_loss += loss.item()" in text)


def _every_rank_in_its_loop(snap) -> bool:
    ranks = snap.job.ranks if snap.job is not None else ()
    return len(ranks) == RANKS and all(r.loop_started is not None for r in ranks)


def _live_facts(job: DemoJob, last, steps: list[tuple[float, list[int]]]) -> dict:
    """What the recording itself cannot hold, read from the job at the recording's end: each rank's steps a
    second over the last 3 s (the job's own counters), the evaluations rank 0 printed, and whether a rank's
    environment narrows its GPUs (CUDA_VISIBLE_DEVICES)."""
    end_t, end_counts = steps[-1]
    then_t, then_counts = next((t, c) for t, c in reversed(steps) if end_t - t >= 3.0)
    rates = [round((a - b) / (end_t - then_t), 2) for a, b in zip(end_counts, then_counts)]
    environ = {}
    for rank in last.job.ranks if last.job is not None else ():
        try:
            environ[str(rank.rank)] = psutil.Process(rank.proc.pid).environ().get("CUDA_VISIBLE_DEVICES")
        except psutil.Error:
            environ[str(rank.rank)] = "unreadable"
    return {
        "steps_per_s_last_3s": rates,
        "eval_lines": sum("eval accuracy" in line for line in job.log_tail(200)),
        "cuda_visible_devices": environ,
    }


def record(scenario: str) -> Path:
    job = DemoJob(scenario, gpus=RANKS)
    path = FIXTURES / f"demo-{scenario}.gputop"
    partial = path.with_suffix(".partial")
    loads: list[float] = []
    steps: list[tuple[float, list[int]]] = []
    job.start()
    try:
        pipeline = Pipeline(SimulatedMachine("h100-sxm-8", load=job.load_model()), follow=Following(pid=job.launcher_pid))
        try:
            with RecordingWriter(str(partial), pipeline.machine) as writer:
                started = time.monotonic()
                in_loop_at = None
                tick = started
                while True:
                    snap = pipeline.poll()
                    writer.write(snap)
                    loads.append(os.getloadavg()[0])
                    steps.append((time.monotonic(), job.step_counts()))
                    now = time.monotonic()
                    if in_loop_at is None and _every_rank_in_its_loop(snap):
                        in_loop_at = now
                    if in_loop_at is not None and now - in_loop_at >= AFTER_LOOP_S + LONGER.get(scenario, 0.0):
                        break
                    if in_loop_at is None and now - started > STARTUP_CAP_S:
                        raise SystemExit(f"{scenario}: the ranks never all began their loop ({job.failure() or job.log_tail(5)})")
                    tick += 1.0
                    time.sleep(max(0.0, tick - time.monotonic()))
                count = writer.count
            live = _live_facts(job, snap, steps)
        finally:
            pipeline.close()
    finally:
        job.stop()
    os.replace(partial, path)
    meta = {
        "scenario": scenario,
        "ranks": RANKS,
        "hang_rank": job.config.hang_rank,
        "item_line": item_line(),
        "snapshots": count,
        "recording_version": VERSION,
        "source_digest": source_digest(),
        "recorded": datetime.date.today().isoformat(),
        "load_average": {"min": round(min(loads), 2), "max": round(max(loads), 2)},
        "cpus": os.cpu_count(),
        "live": live,
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{scenario}: {count} snapshots, {path.stat().st_size // 1024} KiB, load {meta['load_average']}", flush=True)
    return path


def main() -> int:
    return record_named(__doc__ or "", "scenario", list(SCENARIOS), record)


if __name__ == "__main__":
    raise SystemExit(main())

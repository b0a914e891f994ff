"""Apps over scripted sources for the TUI tests, and waits (on conditions, never sleeps) until they have drawn."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from gputop.model import LABEL_CODE, Finding
from gputop.tui.app import GputopApp
from tests.harness.box_load import BoxLoad
from tests.harness.histories import (
    ScriptedSource,
    fixed_diagnose,
    make_machine,
    make_snapshots,
)


async def wait_for(pilot, condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Let the app run until `condition()` holds; fail at the deadline (a condition, not a sleep)."""
    deadline = time.monotonic() + timeout
    box = BoxLoad()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; {box.since()}")
        await pilot.pause(0.02)


async def settle(pilot, app: GputopApp, source: ScriptedSource, diagnosis: bool = True) -> None:
    """Wait until every scripted snapshot is on screen (and the first verdict, when asked)."""
    await wait_for(
        pilot,
        lambda: source.exhausted and app.monitor.snapshots_seen == source.polls and (not diagnosis or app.diagnoses_done >= 1),
        "the scripted snapshots to be drawn",
    )
    await pilot.pause()


def build_app(
    count: int = 90,
    *,
    with_job: bool = False,
    lose_gpu: Optional[tuple[int, int]] = None,
    cores: int = 128,
    gpus: int = 8,
    tmp_path=None,
    controls=None,
    source: Optional[ScriptedSource] = None,
    workers: int = 2,
) -> tuple[GputopApp, ScriptedSource]:
    source = source or ScriptedSource(
        make_machine(gpus=gpus, cores=cores),
        make_snapshots(count, gpus=gpus, cores=cores, with_job=with_job, lose_gpu=lose_gpu, workers=workers),
    )
    app = GputopApp(
        source,
        interval=0.001,  # the script is consumed as fast as the app draws it
        diagnose=fixed_diagnose,
        screenshot_dir=str(tmp_path) if tmp_path else None,
        report_dir=str(tmp_path) if tmp_path else None,
        controls=controls,
    )
    # the script is on screen within ~0.4 s; waiting the live default for the first verdict would only idle
    app.first_verdict_delay = 0.05
    return app, source


# A trace's result as `gputop trace` returns it: one rank spending 41% in communication, and its finding.
TRACE_COMM_FINDING = Finding(
    id="trace_communication",
    title="Communication-bound (> 30% of the step)",
    severity="warning",
    confidence=0.8,
    label=LABEL_CODE,
    summary="Communication takes 41% of rank 0's time (the rule: > 30%)",
    evidence=("rank 0: communication 41% of the main thread's wall time",),
    fix="communicate less often",
)
TRACE_RANK = {
    "rank": 0,
    "pid": 4242,
    "phases": {"data": 0.1, "forward": 0.2, "backward": 0.2, "comm": 0.41, "optimizer": 0.05, "sync": 0.0, "other": 0.04},
    "steps_per_s": 3.5,
    "trace_file": "/tmp/x/rank0.pid4242.pt.trace.json.gz",
    "gpu": None,
    "top_ops": [],
}


async def run_the_check(pilot, app: GputopApp) -> None:
    """Key c: the (scripted) machine check runs; its dialog is closed again."""
    await pilot.press("c")
    await wait_for(pilot, lambda: app.monitor.check is not None, "the scripted check")
    await pilot.press("escape")


async def write_the_report(pilot, directory: Path) -> Path:
    """Key r: the report the app writes into `directory` (its report_dir)."""
    await pilot.press("r")
    await wait_for(pilot, lambda: list(directory.glob("gputop-report-*.md")), "the report file")
    (path,) = directory.glob("gputop-report-*.md")
    return path

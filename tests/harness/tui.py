"""Apps over scripted sources for the TUI tests, and waits (on conditions, never sleeps) until they have drawn."""

from __future__ import annotations

import time
from typing import Callable, Optional

from gputop.tui.app import GputopApp
from tests.harness.histories import (
    ScriptedSource,
    fixed_diagnose,
    make_machine,
    make_snapshots,
)


async def wait_for(pilot, condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Let the app run until `condition()` holds; fail at the deadline (a condition, not a sleep)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)


async def settle(pilot, app: GputopApp, source: ScriptedSource, diagnosis: bool = True) -> None:
    """Wait until every scripted snapshot is on screen (and the first verdict, when asked)."""
    await wait_for(
        pilot,
        lambda: source.exhausted
        and app.snapshots_seen == source.polls
        and (not diagnosis or app.diagnoses_done >= 1),
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

"""Fixtures for the TUI tests: apps over scripted sources, and a wait for "all data is on screen"."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Callable, Optional

import pytest

from gputop.tui.app import GputopApp
from tests.tui.fakes import ScriptedSource, fixed_diagnose, make_machine, make_snapshots


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
) -> tuple[GputopApp, ScriptedSource]:
    source = source or ScriptedSource(
        make_machine(gpus=gpus, cores=cores), make_snapshots(count, gpus=gpus, cores=cores, with_job=with_job, lose_gpu=lose_gpu)
    )
    app = GputopApp(
        source,
        interval=0.001,  # the script is consumed as fast as the app draws it
        diagnose=fixed_diagnose,
        screenshot_dir=str(tmp_path) if tmp_path else None,
        report_dir=str(tmp_path) if tmp_path else None,
        controls=controls,
    )
    return app, source


@pytest.fixture
def close_sources():
    """Sources block in poll() once their script is used up; release them at the end of the test."""
    sources: list[ScriptedSource] = []
    yield sources.append
    for source in sources:
        source.close()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` tests in this folder on a fresh event loop (pytest-asyncio is not a dependency)."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None

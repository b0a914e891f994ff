"""Snapshot tests of the machine check (key c): its screen, and the GPU cards it marks, from a scripted check
over the simulated machine (deterministic: a ManualClock, no waiting)."""

from __future__ import annotations

import pytest

from tests.harness.machine_check import scripted_check
from tests.harness.tui import build_app, settle, wait_for

SIZES = [(80, 24), (160, 48)]
FAULTS = "h100-sxm-8+pcie-replay=3+aer=5"


def _snap(snap_compare, size, *, close: bool):
    app, source = build_app(with_job=True)
    app.actions.machine_check = scripted_check(FAULTS)

    async def run_before(pilot):
        await settle(pilot, app, source)
        await pilot.press("c")
        await wait_for(pilot, lambda: app.monitor.check is not None, "the scripted check")
        if close:
            await pilot.press("escape")
        await pilot.pause()

    try:
        return snap_compare(app, terminal_size=size, run_before=run_before)
    finally:
        source.close()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_check_screen(snap_compare, size):
    assert _snap(snap_compare, size, close=False)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cards_marked_by_the_check(snap_compare, size):
    assert _snap(snap_compare, size, close=True)

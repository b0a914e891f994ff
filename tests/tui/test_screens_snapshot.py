"""Snapshot tests: every screen at 80x24 and 160x48 from deterministic data (fixed clock, scripted source).

Regenerate after an intended change with `python -m pytest tests/tui --snapshot-update` and look at
the report before committing.
"""

from __future__ import annotations

import pytest

from tests.harness.tui import build_app, settle, wait_for

SIZES = [(80, 24), (160, 48)]


def _snap(snap_compare, size, *, keys=(), with_job=True, lose_gpu=None, before=None, workers=2):
    app, source = build_app(with_job=with_job, lose_gpu=lose_gpu, workers=workers)

    async def run_before(pilot):
        await settle(pilot, app, source)
        if before is not None:
            await before(pilot, app)
        for key in keys:
            await pilot.press(key)
        await pilot.pause()

    try:
        return snap_compare(app, terminal_size=size, run_before=run_before)
    finally:
        source.close()  # only now: closing earlier would end a poll with an error on screen


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main(snap_compare, size):
    assert _snap(snap_compare, size)


def test_main_at_100x30_a_common_ssh_window(snap_compare):
    # one line per GPU, so the job tree (the tuned demo's 8 ranks with 3 workers each) and the stacks
    # keep a third of the screen
    assert _snap(snap_compare, (100, 30), workers=3)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_main_without_job(snap_compare, size):
    assert _snap(snap_compare, size, with_job=False)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_paused(snap_compare, size):
    assert _snap(snap_compare, size, keys=["p"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_help(snap_compare, size):
    assert _snap(snap_compare, size, keys=["question_mark"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_topology(snap_compare, size):
    assert _snap(snap_compare, size, keys=["T"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_findings(snap_compare, size):
    assert _snap(snap_compare, size, keys=["f"])


@pytest.mark.parametrize("size", [(20, 5), (59, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_too_small(snap_compare, size):
    assert _snap(snap_compare, size)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_no_color(snap_compare, size, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert _snap(snap_compare, size)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_lost_mid_run(snap_compare, size):
    assert _snap(snap_compare, size, lose_gpu=(3, 70))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_job_tree_with_stacks(snap_compare, size):
    async def select_rank0(pilot, app):
        await pilot.press("down")  # launcher -> rank 0
        if size[0] < 100:
            await pilot.press("enter")  # compact: the stacks replace the job list
        await wait_for(pilot, lambda: app.query_one("#stacks").row is not None, "a selected row")

    assert _snap(snap_compare, size, before=select_rank0)

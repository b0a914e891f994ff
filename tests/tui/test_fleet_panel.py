"""The local view of a job with ranks on other machines too: the job panel says which of them run here."""

from __future__ import annotations

from dataclasses import replace

from gputop.tui.widgets.job_panel import JobPanel
from tests.harness.histories import ScriptedSource, make_machine, make_snapshots
from tests.harness.tui import build_app, settle


async def test_the_job_panel_says_which_ranks_of_the_job_run_here(close_sources):
    def node_zero_of_two(snap):
        ranks = tuple(replace(r, world_size=16, node_rank=0, nnodes=2, job_id="run-1") for r in snap.job.ranks)
        return replace(snap, job=replace(snap.job, ranks=ranks))

    source = ScriptedSource(make_machine(), [node_zero_of_two(s) for s in make_snapshots(10, with_job=True)])
    app, _ = build_app(source=source)
    close_sources(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        head = app.query_one(JobPanel).lines_text[0]
    assert "ranks 0–7 of 16 here (node 0 of 2)" in head, head
    assert "8 ranks" not in head


async def test_a_job_on_this_machine_alone_counts_its_ranks(close_sources):
    app, source = build_app(10, with_job=True)
    close_sources(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        head = app.query_one(JobPanel).lines_text[0]
    assert "· 8 ranks ·" in head and " here" not in head, head

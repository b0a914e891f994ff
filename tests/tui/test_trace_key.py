"""The TUI's trace (key t, issue 13): it asks before injecting, runs `gputop trace`'s call in the background,
shows the per-rank table, and its findings join the verdict."""

from __future__ import annotations

from gputop.tracing import TraceResult
from gputop.tui.trace_screen import TraceScreen
from tests.harness.tui import TRACE_COMM_FINDING, TRACE_RANK, build_app, settle, wait_for

COMM, RANK = TRACE_COMM_FINDING, TRACE_RANK


async def test_trace_key_asks_then_traces_the_job_and_adds_its_finding(close_sources):
    app, source = build_app(10, with_job=True)
    close_sources(source)
    calls = []

    def scripted_trace(pid, *, seconds, progress):
        calls.append((pid, seconds))
        progress(0.5, "profiling 1 rank(s): 0 done")
        return TraceResult(target=f"PID {pid}", ranks=(RANK,), findings=(COMM,), seconds=seconds)

    app.actions.trace_runner = scripted_trace
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, source)
        await pilot.press("t")
        assert isinstance(app.screen, TraceScreen)
        await pilot.pause()
        assert calls == []  # nothing is injected before the user says yes
        await pilot.press("y")
        await wait_for(pilot, lambda: app.monitor.trace is not None, "the trace")
        assert calls == [(app.screen.pid, 5.0)]
        body = str(app.screen.query_one("#bench-body").render())
        assert "comm" in body and "41%" in body and "Communication takes 41%" in body
        await pilot.press("escape")
        await wait_for(
            pilot,
            lambda: (
                app.monitor.verdict is not None and any(f.id == "trace_communication" for f in app.monitor.verdict.findings or ())
            ),
            "the trace's finding in the diagnosis",
        )


async def test_trace_key_without_a_job_says_what_to_do(close_sources):
    app, source = build_app(10)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press("t")
        await pilot.pause()
        assert not isinstance(app.screen, TraceScreen)
        assert any("attach to a training job" in str(n.message) for n in app._notifications)

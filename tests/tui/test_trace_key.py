"""The TUI's trace (key t, issue 13): it asks before injecting, runs `gputop trace`'s call in the background,
shows the per-rank table, and its findings join the verdict."""

from __future__ import annotations

from gputop.model import LABEL_CODE, Finding
from gputop.tracing import TraceResult
from gputop.tui.trace_screen import TraceScreen
from tests.harness.tui import build_app, settle, wait_for

COMM = Finding(id="trace_communication", title="Communication-bound (> 30% of the step)", severity="warning",
               confidence=0.8, label=LABEL_CODE, summary="Communication takes 41% of rank 0's time (the rule: > 30%)",
               evidence=("rank 0: communication 41% of the main thread's wall time",), fix="communicate less often")
RANK = {"rank": 0, "pid": 4242, "phases": {"data": 0.1, "forward": 0.2, "backward": 0.2, "comm": 0.41, "optimizer": 0.05,
                                           "sync": 0.0, "other": 0.04},
        "steps_per_s": 3.5, "trace_file": "/tmp/x/rank0.pid4242.pt.trace.json.gz", "gpu": None, "top_ops": []}


async def test_trace_key_asks_then_traces_the_job_and_adds_its_finding(close_sources):
    app, source = build_app(10, with_job=True)
    close_sources(source)
    calls = []

    def scripted_trace(pid, *, seconds, progress):
        calls.append((pid, seconds))
        progress(0.5, "profiling 1 rank(s): 0 done")
        return TraceResult(target=f"PID {pid}", ranks=(RANK,), findings=(COMM,), seconds=seconds)

    app.trace_runner = scripted_trace
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, source)
        await pilot.press("t")
        assert isinstance(app.screen, TraceScreen)
        await pilot.pause()
        assert calls == []  # nothing is injected before the user says yes
        await pilot.press("y")
        await wait_for(pilot, lambda: app.last_trace is not None, "the trace")
        assert calls == [(app.screen.pid, 5.0)]
        body = str(app.screen.query_one("#bench-body").render())
        assert "comm" in body and "41%" in body and "Communication takes 41%" in body
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.verdict is not None and any(f.id == "trace_communication"
                                                                       for f in app.verdict.findings or ()),
                       "the trace's finding in the diagnosis")


async def test_trace_key_without_a_job_says_what_to_do(close_sources):
    app, source = build_app(10)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press("t")
        await pilot.pause()
        assert not isinstance(app.screen, TraceScreen)
        assert any("attach to a training job" in str(n.message) for n in app._notifications)

"""The TUI's verdict and its `r` report come from `findings()` (analysis/findings.py), the call `gputop report`
and `gputop serve` make: one path, the counter watch's fallback included (issue 39).  The monitor's `assess` is what
both the verdict and the `r` report call."""

from __future__ import annotations

from gputop.analysis import findings as findings_module
from gputop.analysis.diagnosis import verdict_line
from gputop.analysis.findings import findings
from gputop.backend import SimulatedMachine
from gputop.history import History
from gputop.pipeline import CounterCadence, Pipeline
from gputop.sim.fake_nvml import ManualClock
from gputop.tui.app import GputopApp

CADENCE = 60.0


def test_the_tuis_findings_are_findings_on_the_same_history_counter_watch_included(monkeypatch):
    clock = ManualClock(1_700_000_000.0)
    # a replay counter climbing on GPU 3 and an XID in the kernel log: only the counter watch sees them
    with Pipeline(
        SimulatedMachine("h100-sxm-8+pcie-replay=3+kernel-xid=5:48", clock=clock), watch=CounterCadence(CADENCE)
    ) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0
        history = History(pipeline.machine, capacity=10)
        for _ in range(3):
            history.append(pipeline.poll())
            clock.advance(CADENCE)
        assert history.latest is not None and history.latest.counter_health is not None
        app = GputopApp(pipeline, interval=1.0)
        calls = []

        def spy(*args, **kwargs):
            calls.append(args)
            return findings(*args, **kwargs)

        monkeypatch.setattr(findings_module, "findings", spy)
        on_screen, line = app.monitor.assess(history, None, None, None)
        monkeypatch.undo()
    assert calls == [(history, None, None, None)]  # the app called findings(), and nothing of its own
    from_findings = findings(history, None, None, None)
    assert [f.id for f in on_screen] == [f.id for f in from_findings]
    assert [f.summary for f in on_screen] == [f.summary for f in from_findings]
    # the counter watch's lines joined the verdict (without a machine check, the watch stands for it)
    assert {"check.pcie.replay", "check.xid"} <= {f.id for f in on_screen}, [f.id for f in on_screen]
    assert line == verdict_line(from_findings, count_more=False)

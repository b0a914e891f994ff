"""Attach gputop's real pipeline to a running job and diagnose it sample by sample.

The `observe` fixture (conftest.py) hands out Observers and closes them at teardown.
"""

from __future__ import annotations

from typing import Optional

from gputop.analysis.diagnosis import build_context, diagnose
from gputop.backend import RealMachine
from gputop.history import History
from gputop.pipeline import Following, Pipeline

VERDICT_DEADLINE_S = 30.0  # every attach test's verdict bar (issues 11 and 12)
STACK_INTERVAL_S = 0.5
HEALTHY_DUMPS = 12  # distinct dumps of a rank before a healthy verdict counts (4 s of the loop's dense samples)


class Observer:
    """Polls a real pipeline attached to the job; each `step()` is one sample, then a fresh diagnosis."""

    def __init__(self, pid: int, *, pipeline: Optional[Pipeline] = None) -> None:
        # a ready-made pipeline (the demo's simulated machine, say) instead of the plain attach one
        self.pipeline = pipeline or Pipeline(RealMachine(), follow=Following(pid=pid, stack_interval=STACK_INTERVAL_S))
        self.history = History(self.pipeline.machine)
        self.findings: list = []

    def step(self) -> list:
        self.history.append(self.pipeline.poll())
        self.findings = diagnose(self.history)
        return self.findings

    def close(self) -> None:
        self.pipeline.close()

    def ranks_seen(self) -> str:
        """Each rank as the diagnosis sees it (samples, input share, its three commonest states): what a failed
        wait for a finding that compares ranks prints beside the verdict."""
        ctx = build_context(self.history)
        if ctx is None:
            return "no snapshot yet"
        return "; ".join(
            f"{r.label}: {r.n} samples{'' if r.measured else ' (too few)'}, input {r.input_fraction:.2f}, "
            + ", ".join(f"{state} {count}" for state, count in r.states.most_common(3))
            for r in ctx.ranks.values()
        )


def dumps_of(history: History, pid: int) -> int:
    """How many distinct stack dumps of `pid` a history holds (an Observer's, or a replay's)."""
    return len({s.job.stacks[pid].timestamp for s in history if s.job and pid in s.job.stacks and not s.job.stacks[pid].error})


def ranks_with_workers(history: History) -> dict[int, int]:
    """{rank PID: its DataLoader workers} in the latest snapshot's job tree ({} before there is one)."""
    tree = history.latest.job if history.latest else None
    return {rank.proc.pid: len(rank.workers) for rank in tree.ranks} if tree else {}

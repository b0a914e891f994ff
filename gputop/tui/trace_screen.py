"""The TUI's trace (key `t`): `gputop trace` of the attached job, after asking, in the background.

The dialog says what will be injected and for how long, and waits for `y`.  The trace then runs in an app
worker (`run_trace`, the same call as the command) through the benchmark's flow (`actions.BackgroundActions`):
closing the dialog does not stop it, the result shows in the dialog while it is open and as a notification
otherwise, and its findings join the app's.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from gputop.model import JobTree
from gputop.tui.screens import BenchScreen

TRACE_SECONDS = 5.0


def trace_target(job: Optional[JobTree]) -> Optional[tuple[int, str]]:
    """(PID to trace, label): the launcher when there is one (every rank is traced), else the first rank."""
    if job is None or not job.ranks:
        return None
    if job.launcher is not None:
        return job.launcher.pid, f"launcher {job.launcher.pid}, {len(job.ranks)} rank(s)"
    rank = job.ranks[0]
    return rank.proc.pid, f"PID {rank.proc.pid}" + (f", {len(job.ranks)} ranks" if len(job.ranks) > 1 else "")


class TraceScreen(BenchScreen):
    """Ask, show progress, then the per-rank phase table and the findings (the benchmark dialog's layout
    and progress display, with its own question)."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Close (a running trace goes on)", id="trace.close"),
        Binding("y", "start", "Inject the trace agent and profile", id="trace.start"),
    ]

    def __init__(self, pid: int, label: str, start: Callable[[int], None]) -> None:
        super().__init__(pid, label, lambda p, _inject: start(p))

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="trace"):
            yield Static(Text(f"Trace: {self.label}", style="bold"))
            yield Static(
                Text.assemble(
                    ("y", "bold"),
                    f"    inject a small agent into every rank; it runs torch.profiler for {TRACE_SECONDS:g} s, then\n"
                    "         stops it and leaves nothing behind (nothing is paused; ops cost a little more while it records)\n",
                    ("Esc", "bold"),
                    "  cancel",
                ),
                id="bench-body",
            )
            yield ProgressBar(total=1.0, show_eta=False, id="bench-progress")
            yield Static("", id="bench-status")

    def action_start(self, allow_inject: bool = True) -> None:
        super().action_start(True)
        self.query_one("#bench-body", Static).update(Text("running: trace agent injected into every rank", style="bold"))

    def show_result(self, lines: Sequence[str], error: Optional[str] = None) -> None:
        super().show_result(lines, error)
        self.query_one("#bench-status", Static).update(Text("Esc closes · f shows the findings", style="dim"))

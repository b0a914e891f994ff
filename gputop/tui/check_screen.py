"""The TUI's machine check (key `c`): `gputop check` over the live source, its lines in a screen.

The check runs in a worker thread (`run_machine_check`): it reads the GPU details and the kernel's side
now, lets the app's own collector keep polling for a few seconds, reads them again and judges the
snapshots the app took in between (`check_window.Evidence`), so nothing is polled twice.  A failing or
warning check also marks the GPU cards it names (`look.card_marks`).
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from gputop.analysis.machine_check import FAIL, PASS, SKIP, WARN, CheckReport
from gputop.errors import GputopError
from gputop.model import CheckResult, Snapshot
from gputop.source import OverPipeline, Source
from gputop.tui import look
from gputop.tui.modal import _Modal

CHECK_SECONDS = 5.0  # the window the TUI's check watches (the command's default is 10 s)

_STATUS_LOOK = {
    FAIL: ("✖", look.BAD_BOLD),
    WARN: ("▲", look.WARN_BOLD),
    PASS: ("●", look.GOOD),
    SKIP: ("○", look.DIM),
}


def run_machine_check(
    source: Source, window: Callable[[], Sequence[Snapshot]], stop: threading.Event, seconds: float = CHECK_SECONDS
) -> CheckReport:
    """The check over a live pipeline: details and kernel readings at the start and the end of `seconds`,
    judged with the snapshots of the window (`window()`: the app's latest at the start and those since)."""
    from gputop.check_window import Evidence
    from gputop.pipeline import Pipeline

    live = source.live_pipeline if isinstance(source, OverPipeline) else source
    if not isinstance(live, Pipeline):
        raise GputopError("the machine check reads the live machine; a replay has no NVML or kernel log to read")

    evidence = Evidence(live)
    try:
        stop.wait(seconds)  # the app's collector keeps polling meanwhile: a window, not synchronisation
        return evidence.finish(window(), window=seconds)
    finally:
        evidence.close()


def result_text(result: CheckResult) -> Text:
    symbol, style = _STATUS_LOOK.get(result.status, ("?", look.DIM))
    text = Text()
    text.append(f"{symbol} {result.status.upper():<4} ", style=style)
    text.append(f"{result.title}: ", style="bold")
    text.append(result.value)
    text.append(f"  (expected {result.expected})", style=look.DIM)
    return text


class CheckScreen(_Modal):
    """`gputop check`'s lines: "running…" until the worker hands the report over."""

    BINDINGS = [Binding("escape,q,c", "app.pop_screen", "Close", id="check.close")]

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.report: Optional[CheckReport] = None
        self.error: Optional[str] = None
        self.closed = False
        self._ready = False

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="check"):
            yield Static(Text("Machine check (gputop check): is the machine fit, before an infra ticket?", style="bold"))
            yield Static(Text(f"watching the machine for {self.seconds:g} s…", style=look.DIM), id="check-body")

    def on_mount(self) -> None:
        self._ready = True  # (`is_mounted` only turns true after the mount handlers ran)
        self._show()

    def on_unmount(self) -> None:
        self.closed = True

    def show_report(self, report: CheckReport) -> None:
        self.report = report
        self._show()

    def show_error(self, message: str) -> None:
        self.error = message
        self._show()

    def _show(self) -> None:
        """What the worker handed over, once this screen is on (a fast check can finish before it mounts)."""
        if not self._ready or self.closed or (self.report is None and self.error is None):
            return
        body = self.query_one("#check-body", Static)
        if self.error is not None:
            body.update(Text(self.error, style=look.BAD_BOLD))
            return
        report = self.report
        assert report is not None  # (checked on entry: a report or an error)
        text = Text()
        order = {FAIL: 0, WARN: 1}  # what needs a look first: a small terminal shows the top of the list
        for i, result in enumerate(sorted(report.results, key=lambda r: order.get(r.status, 2))):
            if i:
                text.append("\n")
            text.append_text(result_text(result))
        verdict_style = look.BAD_BOLD if report.exit_code == 3 else look.WARN_BOLD if report.exit_code == 4 else look.GOOD_BOLD
        text.append(f"\n\n{report.summary}", style=verdict_style)
        text.append(
            '\nEsc closes · r writes a report with a "For the infra team" section · `gputop check --json` for scripts',
            style=look.DIM,
        )
        body.update(text)

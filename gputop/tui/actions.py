"""The monitor's background actions: the loader benchmark (key b), the trace (t), the machine check (c) and
the report (r), each with its confirmation, its progress and its result.

`BackgroundActions` is the one helper the app hands these keys to.  It reads the monitor (`gputop.monitor`:
its source, its history, its findings) and shows what it does through an `ActionsView` (the app is one: its
dialogs, notifications and workers, the job panel's selected row, the cards' check marks).  Each action runs
in a worker thread, so the screen keeps drawing; closing a dialog does not stop its run: the result shows in
the dialog while it is open, and as a notification otherwise.  The benchmark and the trace go through one
flow (`DialogTask`, `_start`): ask in a dialog, run with progress, keep the result, show it.  What an
action found is kept by the monitor (`Monitor.bench`, `trace`, `check`) and joins its diagnosis and the
`r` report.

The code behind each key is imported when the key is pressed: a monitor that is never asked for a
benchmark does not pay its import time and memory at start (the first frame, the RSS bar).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, Protocol, Sequence, TypeVar

from gputop.errors import GputopError
from gputop.history import History
from gputop.model import Snapshot
from gputop.monitor import Monitor
from gputop.source import Source

if TYPE_CHECKING:
    from gputop.analysis.machine_check import CheckReport
    from gputop.bench import BenchResult
    from gputop.tracing import TraceResult
    from gputop.tui.check_screen import CheckScreen
    from gputop.tui.screens import BenchScreen
    from gputop.tui.widgets.job_panel import JobRow

BENCH_SECONDS = 15.0  # the loader benchmark's bound (its active sweep is fitted into it)


class Progress(Protocol):
    def __call__(self, fraction: float, message: str) -> None: ...


class TraceRunner(Protocol):
    """`gputop trace`'s call (`gputop.tracing.run_trace`); tests put a scripted one in its place."""

    def __call__(self, pid: int, *, seconds: float, progress: Progress) -> "TraceResult": ...


class MachineCheck(Protocol):
    """The machine check over the live source (`check_screen.run_machine_check`); tests script it."""

    def __call__(
        self, source: Source, window: Callable[[], Sequence[Snapshot]], stop: threading.Event, seconds: float
    ) -> "CheckReport": ...


class Summarised(Protocol):
    """A result a dialog can show: the benchmark's and the trace's."""

    def summary_lines(self) -> list[str]: ...


R = TypeVar("R", bound=Summarised)


@dataclass(frozen=True)
class DialogTask(Generic[R]):
    """One run behind a dialog: the benchmark or the trace."""

    name: str  # "benchmark", "trace": the notification's title, the failure's prefix, the worker group
    feature: str  # what is missing when its code is not in this build ("the loader benchmark")
    run: Callable[[Progress], R]  # blocking, in a worker thread
    keep: Callable[[R], None]  # on the UI thread, with the result


def _run_benchmark(pid: int, *, seconds: float, allow_inject: bool, progress: Progress) -> "BenchResult":
    from gputop.bench import run_benchmark

    return run_benchmark(pid, seconds=seconds, allow_inject=allow_inject, progress=progress)


def _run_trace(pid: int, *, seconds: float, progress: Progress) -> "TraceResult":
    from gputop.tracing import run_trace

    return run_trace(pid, seconds=seconds, progress=progress)


def _run_machine_check(
    source: Source, window: Callable[[], Sequence[Snapshot]], stop: threading.Event, seconds: float
) -> "CheckReport":
    from gputop.tui.check_screen import run_machine_check

    return run_machine_check(source, window, stop, seconds)


class ActionsView(Protocol):
    """What the actions show through (`GputopApp`): Textual's calls to show dialogs, notify and run workers, the
    screen on top, the job panel's selected row and the GPU cards' marks from a machine check."""

    @property
    def screen(self) -> Any: ...

    def selected_row(self) -> "Optional[JobRow]": ...

    def show_check_marks(self, report: "CheckReport") -> None: ...

    @property
    def notify(self) -> Callable[..., Any]: ...

    @property
    def call_from_thread(self) -> Callable[..., Any]: ...

    @property
    def push_screen(self) -> Callable[..., Any]: ...

    @property
    def run_worker(self) -> Callable[..., Any]: ...


class BackgroundActions:
    """Keys b, t, c and r over `monitor`, shown through `view`; their results go to the monitor."""

    def __init__(self, monitor: Monitor, view: ActionsView) -> None:
        self.monitor = monitor
        self.view = view
        self.trace_runner: TraceRunner = _run_trace
        self.machine_check: MachineCheck = _run_machine_check
        self.check_seconds: Optional[float] = None  # the check's window; None: check_screen.CHECK_SECONDS
        self._check_screen: Optional[CheckScreen] = None  # the check's dialog, once opened

    # ------------------------------------------------------------------ benchmark and trace: one flow
    def start_bench(self) -> None:
        """Key b: the benchmark of the selected rank (or the job's first), once the user picks a tier."""
        target = self._bench_target()
        if target is None:
            self._attach_first()
            return
        from gputop.tui.screens import BenchScreen

        def confirmed(pid: int, allow_inject: bool) -> None:
            def run(progress: Progress) -> "BenchResult":
                return _run_benchmark(pid, seconds=BENCH_SECONDS, allow_inject=allow_inject, progress=progress)

            self._start(dialog, DialogTask("benchmark", "the loader benchmark", run, self.monitor.keep_bench))

        dialog = BenchScreen(*target, confirmed)
        self.view.push_screen(dialog)

    def start_trace(self) -> None:
        """Key t: the trace of the attached job (every rank through its launcher), once the user says yes."""
        from gputop.tui.trace_screen import TRACE_SECONDS, TraceScreen, trace_target

        snapshot = self.monitor.history.latest
        target = trace_target(snapshot.job if snapshot is not None else None)
        if target is None:
            self._attach_first()
            return

        def confirmed(pid: int) -> None:
            def run(progress: Progress) -> "TraceResult":
                return self.trace_runner(pid, seconds=TRACE_SECONDS, progress=progress)

            self._start(dialog, DialogTask("trace", "the trace", run, self.monitor.keep_trace))

        dialog = TraceScreen(*target, confirmed)
        self.view.push_screen(dialog)

    def _attach_first(self) -> None:
        self.view.notify("attach to a training job first (gputop --pid PID, or Enter on a process)", severity="warning")

    def _bench_target(self) -> Optional[tuple[int, str]]:
        snapshot = self.monitor.history.latest
        row = self.view.selected_row()
        job = snapshot.job if snapshot else None
        if row is not None and row.kind == "rank":
            return row.pid, row.label.lstrip("├└│ ")
        if job is not None and job.ranks:
            rank = min(job.ranks, key=lambda r: r.rank if r.rank is not None else 1 << 30)
            name = f"rank {rank.rank}" if rank.rank is not None else "main process"
            return rank.proc.pid, f"{name} {rank.proc.pid}"
        if row is not None:
            return row.pid, row.label
        return None

    def _start(self, dialog: "BenchScreen", task: DialogTask[R]) -> None:
        """Run `task` in a worker; its progress and result go to `dialog` while it is open."""
        self.view.run_worker(lambda: self._run(dialog, task), thread=True, group=task.name, exclusive=True)

    def _run(self, dialog: "BenchScreen", task: DialogTask[R]) -> None:
        view = self.view

        def progress(fraction: float, message: str) -> None:
            if dialog.is_mounted:
                view.call_from_thread(dialog.show_progress, fraction, message)

        try:
            result = task.run(progress)
        except ImportError:
            view.call_from_thread(self._finished, dialog, task, None, f"{task.feature} is not available in this build")
        except GputopError as exc:
            view.call_from_thread(self._finished, dialog, task, None, str(exc))
        except Exception as exc:  # a bug in a run must not take the monitor down
            view.call_from_thread(self._finished, dialog, task, None, f"{task.name} failed: {type(exc).__name__}: {exc}")
        else:
            view.call_from_thread(self._finished, dialog, task, result, None)

    def _finished(self, dialog: "BenchScreen", task: DialogTask[R], result: Optional[R], error: Optional[str]) -> None:
        if result is not None:
            task.keep(result)  # (the monitor asks for a verdict with it)
        lines = list(result.summary_lines()) if result is not None else []
        if dialog.is_mounted:
            dialog.show_result(lines, error)
        elif error:
            self.view.notify(error, title=task.name, severity="error", timeout=8)
        else:
            self.view.notify(lines[0] if lines else f"{task.name} done", title=task.name, timeout=8)

    # ------------------------------------------------------------------ machine check (key c)
    def start_check(self) -> None:
        """`gputop check` over the live source: its window is the monitor's latest snapshot and those it takes
        while the check runs (nothing is polled twice)."""
        from gputop.tui.check_screen import CHECK_SECONDS, CheckScreen

        if isinstance(self.view.screen, CheckScreen):
            return
        if self.check_seconds is None:
            self.check_seconds = CHECK_SECONDS
        seconds = self.check_seconds
        screen = self._check_screen = CheckScreen(seconds)
        self.view.push_screen(screen)
        monitor, view = self.monitor, self.view
        latest = monitor.history.latest
        start = latest.timestamp if latest is not None else float("-inf")

        def window() -> list[Snapshot]:
            snapshots: list[Snapshot] = view.call_from_thread(lambda: [s for s in monitor.history if s.timestamp >= start])
            return snapshots

        def run() -> None:
            try:
                report = self.machine_check(monitor.source, window, monitor.collection_stopped, seconds)
            except GputopError as exc:
                view.call_from_thread(self._check_done, None, str(exc))
            except Exception as exc:  # a check bug must not take the monitor down
                view.call_from_thread(self._check_done, None, f"the machine check failed: {type(exc).__name__}: {exc}")
            else:
                view.call_from_thread(self._check_done, report, None)

        view.run_worker(run, thread=True, group="check", exclusive=True)

    def _check_done(self, report: Optional["CheckReport"], error: Optional[str]) -> None:
        screen = self._check_screen
        if report is not None:
            self.monitor.keep_check(report)
            self.view.show_check_marks(report)
        if screen is not None and not screen.closed:  # (it may not be mounted yet: it shows what it got on mount)
            if report is not None:
                screen.show_report(report)
            else:
                screen.show_error(error or "")
        elif error:
            self.view.notify(error, title="machine check", severity="error", timeout=8)
        elif report is not None:
            self.view.notify(report.summary, title="machine check", timeout=8)

    # ------------------------------------------------------------------ report (key r)
    def write_report(self, directory: Optional[str]) -> None:
        """The markdown report of what the screen shows (its history, bench, trace and check) into
        `directory` (None: the working directory)."""
        view, monitor = self.view, self.monitor
        if not len(monitor.history):
            view.notify("nothing observed yet", severity="warning")
            return
        history = monitor.history.copy()  # the worker's own: the monitor keeps appending to its history
        view.notify("writing the report…", timeout=2)
        bench, trace, check = monitor.bench, monitor.trace, monitor.check
        view.run_worker(lambda: self._write(history, bench, trace, check, directory), thread=True, group="report")

    def _write(
        self,
        history: History,
        bench: Optional["BenchResult"],
        trace: Optional["TraceResult"],
        check: Optional["CheckReport"],
        directory: Optional[str],
    ) -> None:
        view = self.view
        try:
            from gputop.report.markdown import render_markdown
            from gputop.report.writer import write_report

            # the findings the screen shows (same window, bench, trace and check), so the ticket agrees with it
            findings, _line = self.monitor.assess(history, bench, trace, check)
            text = render_markdown(history, findings, bench=bench, command="gputop (TUI, key r)", infra=check, trace=trace)
            path = (
                Path(directory or os.getcwd()) / f"gputop-report-{history.machine.hostname}-{time.strftime('%Y%m%d-%H%M%S')}.md"
            )
            write_report(str(path), text)
        except ImportError:
            view.call_from_thread(view.notify, "reports are not available in this build", severity="error")
        except (GputopError, OSError) as exc:
            view.call_from_thread(view.notify, str(exc), title="report not written", severity="error", timeout=8)
        else:
            view.call_from_thread(view.notify, f"wrote {path}", title="report", timeout=8)

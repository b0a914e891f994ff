"""The stacks panel: the selected process's Python stacks (innermost last), per-rank main-thread
states, and the aggregated view across DataLoader workers ("6/8 workers in PIL.ImageFile.load")."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Optional

from textual.binding import Binding
from textual.strip import Strip

from gputop.model import JobTree, ProcessStacks, ThreadStack
from gputop.tui import look
from gputop.tui.canvas import LineBuilder, LineCanvas
from gputop.tui.widgets.job_panel import JobRow


def _stack_classes() -> Optional[ModuleType]:
    """The attach engineer's helpers, or None while they are not there (the panel then shows less)."""
    try:
        from gputop.analysis import stack_classes
    except ImportError:  # pragma: no cover - the module exists in the skeleton
        return None
    return stack_classes


def main_thread_of(stacks: ProcessStacks) -> Optional[ThreadStack]:
    helpers = _stack_classes()
    finder = getattr(helpers, "main_thread", None)
    if finder is not None:
        found: Optional[ThreadStack] = finder(stacks)
        return found
    for thread in stacks.threads:
        if thread.thread_name == "MainThread":
            return thread
    return stacks.threads[0] if stacks.threads else None


class StacksPanel(LineCanvas, can_focus=True):
    BINDINGS = [
        Binding("up,k", "scroll_lines(-1)", "Scroll up", show=False, id="stacks.up"),
        Binding("down,j", "scroll_lines(1)", "Scroll down", show=False, id="stacks.down"),
        Binding("pageup", "scroll_lines(-10)", "Page up", show=False, id="stacks.pageup"),
        Binding("pagedown", "scroll_lines(10)", "Page down", show=False, id="stacks.pagedown"),
    ]

    DEFAULT_CSS = """
    StacksPanel { height: 1fr; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.job: Optional[JobTree] = None
        self.row: Optional[JobRow] = None
        self.now: float = 0.0
        self._offset = 0

    def update_data(self, job: Optional[JobTree], row: Optional[JobRow], now: float) -> None:
        if job is None and self.job is None and row == self.row:
            return  # the "attach to a job" hint does not change with time
        if row is not None and self.row is not None and row.pid != self.row.pid:
            self._offset = 0
        self.job = job
        self.row = row
        self.now = now
        self.redraw()

    def action_scroll_lines(self, delta: int) -> None:
        self._offset = max(0, self._offset + delta)
        self.redraw()

    def on_focus(self) -> None:
        self.redraw()

    def on_blur(self) -> None:
        self.redraw()

    # ------------------------------------------------------------------ content
    def content(self, width: int) -> tuple[LineBuilder, list[LineBuilder]]:
        title = LineBuilder().add(" STACKS", look.ACCENT_BOLD)
        body: list[LineBuilder] = []
        job, row = self.job, self.row
        if job is None:
            body.append(LineBuilder().add("  Attach to a job to see its Python stacks:", look.DIM))
            body.append(LineBuilder().add("  Enter on a process, or run gputop --pid PID.", look.DIM))
            return title, body
        if row is None:
            body.append(LineBuilder().add("  Select a process (j/k).", look.DIM))
            return title, body
        title.add(f"  {row.label.lstrip('├└│ ')}", look.BOLD)
        if job.stacks_error:
            body.append(LineBuilder().add("  " + job.stacks_error, look.WARN))
        if row.kind == "launcher" or row.pid == job.root_pid and row.kind not in ("rank", "worker"):
            self._rank_summary(job, body)
            self._worker_summary(job, [w.pid for r in job.ranks for w in r.workers], body)
            return title, body
        stacks = job.stacks.get(row.pid)
        if row.exited:
            title.add("  exited", look.BAD_BOLD)
            if stacks is not None:
                title.add(" (last stacks)", look.DIM)
        if stacks is not None and stacks.timestamp and self.now:
            title.add(f"  {max(0.0, self.now - stacks.timestamp):.0f}s old", look.DIM)
        if row.kind == "rank" and row.note:
            body.append(
                LineBuilder()
                .add("  main thread: ", look.LABEL)
                .add(row.note, look.WARN_BOLD if row.note == "waiting for data" else look.BOLD)
            )
        if stacks is None:
            if not job.stacks_error:
                body.append(LineBuilder().add("  no stacks yet (py-spy refreshes every few seconds)", look.DIM))
        elif stacks.error:
            body.append(LineBuilder().add("  " + stacks.error, look.WARN))
        else:
            self._threads(stacks, body)
        if row.kind == "rank":
            for rank in job.ranks:
                if rank.proc.pid == row.pid and rank.workers:
                    self._worker_summary(job, [w.pid for w in rank.workers], body)
        return title, body

    def _threads(self, stacks: ProcessStacks, body: list[LineBuilder]) -> None:
        main = main_thread_of(stacks)
        ordered = ([main] if main is not None else []) + [t for t in stacks.threads if t is not main]
        for thread in ordered:
            name = thread.thread_name or f"thread {thread.thread_id}"
            head = LineBuilder().add(f"  {name}", look.BOLD)
            head.add("  active" if thread.active else "  idle", look.GOOD if thread.active else look.DIM)
            if thread.owns_gil:
                head.add(" GIL", look.WARN)
            body.append(head)
            frames = thread.frames if thread is main else thread.frames[:1]
            # py-spy gives innermost first; people read stacks outermost first, innermost last
            for k, frame in enumerate(reversed(frames)):
                last = k == len(frames) - 1
                line = LineBuilder().add("    " + ("→ " if last else "  "), look.ACCENT)
                line.add(frame.name, look.BOLD if last else look.PLAIN)
                line.add(f"  {os.path.basename(frame.filename)}:{frame.line}", look.LABEL)
                body.append(line)

    def _rank_summary(self, job: JobTree, body: list[LineBuilder]) -> None:
        if not job.ranks:
            return
        body.append(LineBuilder().add("  main thread per rank", look.LABEL))
        for rank in sorted(job.ranks, key=lambda r: r.rank if r.rank is not None else 1 << 30):
            state = rank.main_thread_state or "n/a"
            name = f"rank {rank.rank}" if rank.rank is not None else f"pid {rank.proc.pid}"
            body.append(
                LineBuilder()
                .add(f"    {name:<8}", look.BOLD)
                .add(state, look.WARN_BOLD if state == "waiting for data" else look.PLAIN)
            )

    def _worker_summary(self, job: JobTree, worker_pids: list[int], body: list[LineBuilder]) -> None:
        if not worker_pids:
            return
        helpers = _stack_classes()
        aggregate = getattr(helpers, "aggregate_worker_leaves", None)
        if aggregate is None:
            return
        leaves = aggregate(job.stacks, worker_pids)
        if not leaves:
            return
        body.append(LineBuilder().add(f"  workers ({len(worker_pids)}), hottest frames", look.LABEL))
        for text, count, total in leaves[:5]:
            body.append(LineBuilder().add(f"    {count}/{total} workers in ", look.PLAIN).add(text, look.BOLD))

    def build(self, width: int, height: int) -> list[Strip]:
        title, body = self.content(width)
        room = max(0, height - 1)
        self._offset = max(0, min(self._offset, max(0, len(body) - room)))
        shown = body[self._offset : self._offset + room]
        if self._offset:
            title.right(f"↑{self._offset} ", width, look.DIM)
        lines = [title.section(width)] + [line.strip(width) for line in shown]
        if self._offset + room < len(body) and shown:
            lines[-1] = (
                LineBuilder()
                .add(f"    … {len(body) - self._offset - room + 1} more lines (Tab here, j/k)", look.DIM)
                .strip(width)
            )
        return lines

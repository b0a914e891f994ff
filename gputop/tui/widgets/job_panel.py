"""The job panel: launcher → rank → DataLoader workers, or the machine's GPU processes.

Rows are flattened from the tree; the cursor is kept on the same PID across
updates, so a refresh never moves the selection under the user's hands.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Sequence

from textual.binding import Binding
from textual.message import Message
from textual.strip import Strip

from gputop import units
from gputop.model import JobTree, ProcInfo, Rank, Snapshot, device_label
from gputop.tui import look
from gputop.tui.canvas import LineBuilder, LineCanvas

GPU_COLUMN = 6  # "GPU0" and room; a process on several GPUs is cut ("GPU0,…")
MIG_GPU_COLUMN = 14  # "GPU0/GI1" (a MIG instance) and room for a second


@dataclass(frozen=True)
class JobRow:
    pid: int
    kind: str  # "launcher" | "rank" | "worker" | "process" | "job"
    label: str  # tree text, e.g. "├ rank 0"
    gpus: str = ""
    cpu: Optional[float] = None
    state: str = ""
    extra: str = ""  # RSS for ranks, core for workers, memory for NVML processes
    note: str = ""  # main-thread state, command line
    exited: bool = False
    job_root: Optional[int] = None  # discovered job this row belongs to (Enter attaches to it)


def command_text(proc: ProcInfo) -> str:
    """'python train.py --bs 64' from the command line, or the comm name."""
    argv = list(proc.cmdline)
    if not argv:
        return proc.name
    argv[0] = os.path.basename(argv[0])
    return " ".join(argv)


def ranks_text(job: JobTree) -> str:
    """'8 ranks', or for a job with ranks on other machines too, 'ranks 0–7 of 16 here (node 0 of 2)'."""
    world = max((r.world_size for r in job.ranks if r.world_size), default=0)
    here = sorted(r.rank for r in job.ranks if r.rank is not None)
    if world <= len(job.ranks) or not here:
        return f"{len(job.ranks)} ranks"
    if here == list(range(here[0], here[-1] + 1)):
        span = f"rank {here[0]}" if len(here) == 1 else f"ranks {here[0]}–{here[-1]}"
    else:
        span = "ranks " + ",".join(str(r) for r in here)
    node = next((r.node_rank for r in job.ranks if r.node_rank is not None), None)
    nnodes = next((r.nnodes for r in job.ranks if r.nnodes), None)
    where = "" if node is None else f" (node {node} of {nnodes})" if nnodes else f" (node {node})"
    return f"{span} of {world} here{where}"


def _proc_state(proc: ProcInfo) -> str:
    return "exited" if proc.exited else proc.state


def job_rows(job: JobTree, job_root: Optional[int] = None, fold_workers: bool = False) -> list[JobRow]:
    """The tree as rows; `fold_workers` counts each rank's workers on its own row instead (a short panel
    then still shows every rank)."""
    rows: list[JobRow] = []
    ranks = sorted(job.ranks, key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.proc.pid))
    if job.launcher is not None:
        launcher = job.launcher
        rows.append(
            JobRow(
                pid=launcher.pid,
                kind="launcher",
                label=f"{launcher.name} {launcher.pid}",
                cpu=launcher.cpu_percent,
                state=_proc_state(launcher),
                extra=units.short_bytes(launcher.rss) if launcher.rss is not None else "",
                note=command_text(launcher),
                exited=launcher.exited,
                job_root=job_root,
            )
        )
    indent = "" if job.launcher is None else " "
    for i, rank in enumerate(ranks):
        last_rank = i == len(ranks) - 1
        branch = indent + ("└ " if last_rank else "├ ") if job.launcher is not None else ""
        rows.append(_rank_row(rank, branch, job_root, fold_workers))
        if fold_workers:
            continue
        cont = indent + ("  " if last_rank else "│ ") if job.launcher is not None else ""
        workers = sorted(rank.workers, key=lambda w: w.pid)
        for j, worker in enumerate(workers):
            twig = "└ " if j == len(workers) - 1 else "├ "
            rows.append(
                JobRow(
                    pid=worker.pid,
                    kind="worker",
                    label=f"{cont}{twig}worker {worker.pid}",
                    cpu=worker.cpu_percent,
                    state=_proc_state(worker),
                    extra="" if worker.core is None else f"core {worker.core}",
                    exited=worker.exited,
                    job_root=job_root,
                )
            )
    return rows


def _rank_row(rank: Rank, branch: str, job_root: Optional[int], fold_workers: bool = False) -> JobRow:
    proc = rank.proc
    name = f"rank {rank.rank}" if rank.rank is not None else proc.name
    live = sum(1 for w in rank.workers if not w.exited)
    folded = f" +{live}w" if fold_workers and live else ""  # its DataLoader workers, counted
    return JobRow(
        pid=proc.pid,
        kind="rank",
        label=f"{branch}{name} {proc.pid}{folded}",
        # "?": inferred from CUDA_VISIBLE_DEVICES + LOCAL_RANK (NVML's PIDs are not visible in this container)
        # "GPU0/GI1": on GPU instance 1 of GPU 0 (MIG)
        gpus=",".join(f"{device_label(*d)}{'?' if rank.gpu_mapping == 'inferred' else ''}" for d in rank.devices) or "-",
        cpu=proc.cpu_percent,
        state=_proc_state(proc),
        extra=units.short_bytes(proc.rss) if proc.rss is not None else "",
        note=rank.main_thread_state or "",
        exited=proc.exited,
        job_root=job_root,
    )


def gpu_process_rows(snapshot: Snapshot) -> list[JobRow]:
    """Flat NVML process list: one row per PID with the GPUs it holds memory on.

    Shown only when no GPU process could be placed in a job: in a container, NVML's PIDs are another PID
    namespace's, and in a replay another machine's, so this machine's /proc under the same number is some
    other process (or none); the row says only what the snapshot holds."""
    by_pid: dict[int, list[tuple[int, Optional[int]]]] = {}
    instances: dict[tuple[int, int], int] = {}  # (pid, GPU) -> the GPU instance NVML lists it on (MIG)
    for gpu in snapshot.gpus:
        for proc in gpu.processes or ():
            by_pid.setdefault(proc.pid, []).append((gpu.index, proc.used_memory))
        for mig in gpu.mig or ():
            for proc in mig.processes or ():
                instances[(proc.pid, gpu.index)] = mig.gpu_instance_id
    rows = []
    for pid in sorted(by_pid):
        entries = by_pid[pid]
        memory = [m for _, m in entries if m is not None]
        rows.append(
            JobRow(
                pid=pid,
                kind="process",
                label=f"pid {pid}",
                gpus=",".join(device_label(g, instances.get((pid, g))) for g, _ in entries),
                extra=units.short_bytes(sum(memory)) if memory else "n/a",
                note="",  # the snapshot holds no command for it (the docstring says why)
                job_root=pid,
            )
        )
    return rows


class JobPanel(LineCanvas, can_focus=True):
    """Selectable rows; Enter attaches (no job) or opens the stacks (compact layout)."""

    BINDINGS = [
        Binding("up,k", "move(-1)", "Up", show=False, id="job.up"),
        Binding("down,j", "move(1)", "Down", show=False, id="job.down"),
        Binding("pageup", "move(-10)", "Page up", show=False, id="job.pageup"),
        Binding("pagedown", "move(10)", "Page down", show=False, id="job.pagedown"),
        Binding("enter", "choose", "Attach / stacks", show=False, id="job.choose"),
    ]

    DEFAULT_CSS = """
    JobPanel { height: 1fr; }
    """

    class Chosen(Message):
        def __init__(self, row: JobRow) -> None:
            super().__init__()
            self.row = row

    class Resized(Message):
        """The panel's height changed: its rows may fold or unfold the workers (see app._job_rows)."""

    class Selected(Message):
        def __init__(self, row: Optional[JobRow]) -> None:
            super().__init__()
            self.row = row

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.rows: list[JobRow] = []
        self.title = "GPU processes"
        self.hint = ""
        self.warnings: Sequence[str] = ()
        self.selected_pid: Optional[int] = None
        self._top = 0

    @property
    def selected(self) -> Optional[JobRow]:
        for row in self.rows:
            if row.pid == self.selected_pid:
                return row
        return None

    def update_data(self, title: str, hint: str, rows: list[JobRow], warnings: Sequence[str] = ()) -> None:
        if (title, hint, rows, tuple(warnings)) == (self.title, self.hint, self.rows, tuple(self.warnings)):
            return  # nothing changed: no rebuild, no repaint
        before = self.selected
        self.title = title
        self.hint = hint
        self.rows = rows
        self.warnings = warnings
        if self.selected is None:
            self.selected_pid = rows[0].pid if rows else None
        if self.selected != before:
            self.post_message(self.Selected(self.selected))
        self.redraw()

    def action_move(self, delta: int) -> None:
        if not self.rows:
            return
        index = next((i for i, r in enumerate(self.rows) if r.pid == self.selected_pid), 0)
        index = max(0, min(len(self.rows) - 1, index + delta))
        if self.rows[index].pid != self.selected_pid:
            self.selected_pid = self.rows[index].pid
            self.post_message(self.Selected(self.rows[index]))
            self.redraw()

    def action_choose(self) -> None:
        row = self.selected
        if row is not None:
            self.post_message(self.Chosen(row))

    def on_focus(self) -> None:
        self.redraw()

    def on_resize(self) -> None:
        self.post_message(self.Resized())

    def on_blur(self) -> None:
        self.redraw()

    def build(self, width: int, height: int) -> list[Strip]:
        lines: list[Strip] = []
        head = LineBuilder().add(" " + self.title, look.ACCENT_BOLD)
        if self.hint:
            head.add("  " + self.hint, look.DIM)
        lines.append(head.section(width))
        for warning in self.warnings:
            lines.append(LineBuilder().add(" ▲ " + warning, look.WARN_BOLD).strip(width))
        if not self.rows:
            lines.append(LineBuilder().add("   no GPU processes", look.DIM).strip(width))
            return lines
        name_w = max(12, min(34, max(len(r.label) for r in self.rows) + 1))
        # wider for a rank on a MIG instance ("GPU0/GI1"), else as wide as "GPU0,…"
        gpu_w = max([GPU_COLUMN] + [min(MIG_GPU_COLUMN, len(r.gpus) + 1) for r in self.rows if "/GI" in r.gpus])
        columns = LineBuilder().add(" " + "PROCESS".ljust(name_w), look.LABEL)
        columns.add("GPU".ljust(gpu_w) + "  CPU% S ".ljust(9) + "RSS/core".ljust(9) + "state / command", look.LABEL)
        lines.append(columns.strip(width))
        room = max(1, height - len(lines))
        index = next((i for i, r in enumerate(self.rows) if r.pid == self.selected_pid), 0)
        if index < self._top:
            self._top = index
        elif index >= self._top + room:
            self._top = index - room + 1
        self._top = max(0, min(self._top, max(0, len(self.rows) - room)))
        focused = self.has_focus
        for row in self.rows[self._top : self._top + room]:
            line = LineBuilder()
            selected = row.pid == self.selected_pid
            marker = "▶" if selected else " "
            base = look.SELECTED if selected and focused else look.BOLD if selected else None
            line.add(marker, look.ACCENT_BOLD)
            label_style = base or (look.DIM if row.exited else look.BOLD if row.kind in ("launcher", "rank") else look.PLAIN)
            line.add(look.ellipsize(row.label, name_w - 1).ljust(name_w), label_style)
            line.add(look.ellipsize(row.gpus, gpu_w).ljust(gpu_w), look.ACCENT)
            cpu = "" if row.cpu is None else f"{row.cpu:5.0f}%"
            line.add(cpu.rjust(7), look.load_style(row.cpu) if row.cpu is not None else None)
            state_style = look.BAD_BOLD if row.state in ("D", "Z", "exited") else None
            line.add(" " + (row.state[:1] if row.state != "exited" else "✝").ljust(1) + " ", state_style)
            line.add(row.extra.ljust(9)[:9])
            if row.exited:
                line.add("exited", look.BAD_BOLD)
            else:
                line.add(row.note, look.WARN if row.note == "waiting for data" else look.LABEL)
            lines.append(line.strip(width))
        if self._top + room < len(self.rows):
            lines[-1] = (
                LineBuilder().add(f"   … {len(self.rows) - self._top - room + 1} more (j/k to scroll)", look.DIM).strip(width)
            )
        return lines

"""The live Textual monitor: GPU grid, CPU heatmap, job tree with stacks, verdict line.

Four parts: `gputop.monitor.Monitor` collects, keeps the history, schedules the diagnosis and keeps what the
background actions found (no Textual there); `GputopApp` (here) is the view and the keys over it;
`main_screen.MainScreen` lays the widgets out and draws a window of snapshots on them;
`actions.BackgroundActions` runs the keys that start work in the background (bench, trace, check, report).

The monitor's collector thread hands each batch of snapshots to the app, which posts it to itself as a message,
so snapshots are kept and drawn on the event loop's thread.  Drawing is done by line widgets that repaint only
the cells that changed (see `canvas.py`), which keeps the bytes sent over SSH and the CPU used per refresh small.
"""

from __future__ import annotations

import asyncio
import gc
import os
import select
import signal
import sys
import time
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from textual import events, work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.message import Message

from gputop import units
from gputop.errors import GputopError
from gputop.heap import give_back_freed_memory
from gputop.model import MachineInfo, Snapshot
from gputop.monitor import DIAGNOSE_EVERY, Diagnose, Monitor, Verdict, drawn_window_s
from gputop.signals import STOP_SIGNALS
from gputop.source import Attachable, Focusable, PollLoop, Seekable, Source
from gputop.tui import partial_updates, strip_cycles
from gputop.tui.look import key_display
from gputop.tui.main_screen import MainScreen
from gputop.tui.starting import StartingPipeline
from gputop.tui.widgets.job_panel import JobPanel
from gputop.tui.widgets.stacks import StacksPanel
from gputop.tui.widgets.status import verdict_severity

if TYPE_CHECKING:
    from gputop.analysis.machine_check import CheckReport
    from gputop.tui.actions import BackgroundActions
    from gputop.tui.screens import TooSmallScreen
    from gputop.tui.widgets.job_panel import JobRow

partial_updates.install()  # write only the changed cells (see partial_updates.py)
strip_cycles.install()  # each frame's lines freed by refcounting, not the cyclic GC (see strip_cycles.py)

MIN_SIZE = (60, 16)  # below this: the "terminal too small" screen
INTERVAL_STEPS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
# Allocations between collections of the youngest generation in the monitor's process, instead of 700: a frame
# and a poll make thousands of short-lived objects, and collecting 1.3 times a second promoted the survivors of
# half-built frames to the older generations, which cost more to scan (150 s in a pty, gen-0 and gen-1
# collections: 0.117 s of CPU at 700, 0.066 s at 7,000).  Reference counting frees all but cycles at once.
GC_YOUNG_THRESHOLD = 7000
VERDICT_WAITS_FOR_FRAME = 0.25  # seconds past the next snapshot's due time before a verdict is drawn alone
SEEK_STEP = 10.0  # replay seek, seconds
# Seconds between checks that the terminal is still there (`_exit_if_terminal_gone`): each is a poll(2) of stdin
# and a wake-up of the event loop, which at one a second came to a tenth of the main thread's wake-ups; a hung-up
# terminal is left within this long either way.
HANGUP_CHECK_EVERY = 5.0
# Seconds between hand-backs of the heap's freed pages (gputop/heap.py); the first is made once the first verdict
# is on screen, when start-up's transient allocations (imports, the first frames and diagnosis) have been freed.
HEAP_TRIM_EVERY = 60.0


class SnapshotReady(Message):
    def __init__(self, snapshots: list[Snapshot], reset: bool = False) -> None:
        super().__init__()
        self.snapshots = snapshots
        self.reset = reset  # start the history over (a replay was sought)


class MachineKnown(Message):
    """The source's machine changed (a starting pipeline read the GPUs): posted before its first snapshot."""

    def __init__(self, machine: MachineInfo) -> None:
        super().__init__()
        self.machine = machine


class PollFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class CouldNotStart(Message):
    """The starting pipeline failed (a bad spec, a PID that is gone): the app ends and run_app raises it."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error


class Diagnosed(Message):
    def __init__(self, verdict: Verdict) -> None:
        super().__init__()
        self.verdict = verdict


class GputopApp(App[None]):
    """The view and the keys over a `Monitor` (its `MonitorView`, and the background actions' `ActionsView`)."""

    CSS_PATH = "app.tcss"
    TITLE = "gputop"
    # seconds from the first snapshot to the first verdict: after the first frame is on screen, not inside it
    first_verdict_delay = 0.5
    ENABLE_COMMAND_PALETTE = False

    BINDINGS = [
        Binding("q", "quit", "Quit", priority=True, id="quit"),
        Binding("ctrl+c", "quit", "Quit", priority=True, show=False, id="quit.ctrl_c"),
        Binding("question_mark,h,f1", "help", "Help", id="help"),
        Binding("p", "pause", "Pause", id="pause"),
        Binding("plus,equals_sign", "interval(-1)", "Faster refresh", show=False, id="interval.faster"),
        Binding("minus,underscore", "interval(1)", "Slower refresh", show=False, id="interval.slower"),
        Binding("T", "topology", "Topology", id="topology"),
        Binding("f", "findings", "Findings", id="findings"),
        Binding("b", "bench", "Bench loader", id="bench"),
        Binding("r", "report", "Report", id="report"),
        Binding("c", "check", "Machine check", id="check"),
        Binding("t", "trace", "Trace every rank", show=False, id="trace"),
        Binding("s", "screenshot", "Screenshot", id="screenshot"),
        Binding("tab", "app.focus_next", "Next panel", show=False, id="focus.next"),
        Binding("shift+tab", "app.focus_previous", "Previous panel", show=False, id="focus.previous"),
        Binding("escape", "close_stacks", "Back to the job list", show=False, id="stacks.close"),
        # replay only (hidden and disabled without `controls`, see check_action)
        Binding("space", "pause", "Pause replay", id="replay.pause"),
        Binding("left", "seek(-1)", "Seek back 10 s", id="replay.back"),
        Binding("right", "seek(1)", "Seek forward 10 s", id="replay.forward"),
        Binding("less_than_sign", "speed(0.5)", "Slower replay", id="replay.slower"),
        Binding("greater_than_sign", "speed(2.0)", "Faster replay", id="replay.faster"),
    ]
    REPLAY_ACTIONS = ("seek", "speed")

    def __init__(
        self,
        source: Source,
        *,
        interval: float = 1.0,
        subtitle: Optional[str] = None,
        controls: Optional[Seekable] = None,
        diagnose: Optional[Diagnose] = None,
        screenshot_dir: Optional[str] = None,
        report_dir: Optional[str] = None,
        history_capacity: Optional[int] = None,
        poll_loop: Optional[PollLoop] = None,
    ) -> None:
        super().__init__()
        self.monitor = Monitor(
            source,
            self,
            interval=interval,
            diagnose=diagnose,
            history_capacity=history_capacity,
            poll_loop=poll_loop,
            starting=source if isinstance(source, StartingPipeline) else None,
        )
        self.start_error: Optional[BaseException] = None  # why the source could not start (run_app raises it)
        self._leaving = False  # a stop signal or q asked the monitor to end (a start failing after it is not an error)
        self.sub_title = subtitle or ""
        # replay controls: the source's own when it is a recording (tests may hand in others)
        self.controls = controls if controls is not None else (source if isinstance(source, Seekable) else None)
        self.replay_speed = float(getattr(controls, "speed", 1.0) or 1.0)
        self.screenshot_dir = screenshot_dir
        self.report_dir = report_dir
        self._verdict_drawn = True  # whether the monitor's verdict is on the verdict line yet
        self.diagnoses_done = 0  # verdicts drawn
        self.poll_error: Optional[str] = None  # the last one notified (the same one again is not)
        self._too_small: Optional[TooSmallScreen] = None  # shown while the terminal is below MIN_SIZE

    @cached_property
    def actions(self) -> "BackgroundActions":
        """Keys b, t, c, r (made at the first of them: not before the first frame)."""
        from gputop.tui.actions import BackgroundActions

        return BackgroundActions(self.monitor, self)

    def get_driver_class(self) -> type:
        from gputop.tui.input_thread import quiet_driver

        return quiet_driver(super().get_driver_class())  # Textual's, with an input thread that sleeps

    def get_default_screen(self) -> MainScreen:
        return MainScreen(self.monitor.machine, self.key_hints(), on_ready=self._main_ready, on_drawn=self._release_pipeline)

    @property
    def main(self) -> MainScreen:
        """The main screen, even while a dialog or the too-small screen is on top."""
        screen = self.screen_stack[0]
        assert isinstance(screen, MainScreen)
        return screen

    def check_action(self, action: str, parameters: tuple[object, ...]) -> Optional[bool]:
        if action in self.REPLAY_ACTIONS and self.controls is None:
            return False
        return True

    def key_hints(self) -> list[tuple[str, str]]:
        return [(key_display(b.key.split(",")[0]), b.description) for b in self.global_bindings() if b.show]

    def global_bindings(self) -> list[Binding]:
        """The app's bindings as the help screen lists them (replay keys only when replaying)."""
        replay_ids = {"replay.pause", "replay.back", "replay.forward", "replay.slower", "replay.faster"}
        return [b for b in self.BINDINGS if isinstance(b, Binding) and (self.controls is not None or b.id not in replay_ids)]

    # ------------------------------------------------------------------ start, size, stop
    def _main_ready(self) -> None:
        """The main screen's widgets are mounted: draw what there is, start collecting and the timers."""
        monitor = self.monitor
        self._apply_size(self.size.width, self.size.height)
        self._set_header()
        self.main.header.subtitle = self.sub_title
        self.main.header.set_machine(monitor.machine, monitor.reading_gpus)
        self.main.jobs.focus()
        first = monitor.take_prefetched()  # taken while Textual loaded (commands/tui.py)
        if first is not None:
            self._adopt_machine(monitor.source.machine)  # the prefetched poll may have been the pipeline's first
            self._receive(first.snapshots, first.reset)  # so the very first frame shows its readings
        monitor.start_collecting()
        monitor.view_ready.set()
        self.call_after_refresh(self._started)
        self.set_interval(DIAGNOSE_EVERY, monitor.diagnose_soon)
        stdin = _stdin_fd()
        if not self.is_headless and stdin is not None and os.isatty(stdin):
            self.set_interval(HANGUP_CHECK_EVERY, self._exit_if_terminal_gone)
        if not self.is_headless:
            self._exit_on_stop_signals()

    def _exit_on_stop_signals(self) -> None:
        """`kill PID` (SIGTERM) and a closed terminal (SIGHUP) end the monitor as q does: the terminal restored and
        the source closed (the simulated machine's trees under /dev/shm removed), where the default action killed
        it mid-frame and left both.  A signal the user set to be ignored (`nohup`) stays ignored."""
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is signal.SIG_IGN:
                continue
            try:
                loop.add_signal_handler(sig, self._exit_on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signal here
                pass

    def _exit_on_signal(self, sig: int) -> None:
        self._leaving = True
        self.monitor.stop()
        self.exit(return_code=128 + sig)  # the shell's code for a process a signal ended

    def _release_pipeline(self) -> None:
        """The first frame is on the terminal: a pipeline held until now starts building (see starting.py)."""
        source = self.monitor.source
        if isinstance(source, StartingPipeline):
            source.release()

    def _started(self) -> None:
        """After the first frame: the cyclic GC back on (commands/tui.py turns it off for start-up); and the
        pipeline released if the first frame was not the main screen's (a terminal too small for it).

        Not gc.freeze() as well: measured, it kept start-up's garbage for good (RSS +0.5 MiB at 35 s, +0.2
        after a gc.collect() first) and saved no CPU one could see at one poll a second.  (`run_app` sets how
        often the youngest generation is collected.)"""
        gc.enable()
        self._release_pipeline()

    def on_unmount(self) -> None:
        self.monitor.stop()
        self.monitor.view_ready.clear()

    def on_resize(self, event: events.Resize) -> None:
        self._apply_size(event.size.width, event.size.height)

    def on_job_panel_resized(self, _message: JobPanel.Resized) -> None:
        self._render_all()  # the job rows depend on the panel's height (workers fold when ranks would not fit)

    def _apply_size(self, width: int, height: int) -> None:
        too_small = width < MIN_SIZE[0] or height < MIN_SIZE[1]
        if too_small:
            from gputop.tui.screens import TooSmallScreen

            if self._too_small is None:
                self._too_small = TooSmallScreen(MIN_SIZE)
                self.push_screen(self._too_small)
            elif self._too_small.is_mounted:
                self._too_small.show(width, height)
            return
        if self._too_small is not None:
            screen, self._too_small = self._too_small, None
            if screen in self.screen_stack and self.screen is screen:
                self.pop_screen()  # (with another screen on top of it, it is left where it is)
            self.call_after_refresh(self._render_all)
        self.main.fit(width, height)

    def on_main_screen_stacks_shown(self, message: MainScreen.StacksShown) -> None:
        source = self.monitor.source
        if isinstance(source, Attachable):
            source.want_stacks(message.shown)

    def on_main_screen_attach_wanted(self, message: MainScreen.AttachWanted) -> None:
        self.attach_job(message.pid)

    def action_close_stacks(self) -> None:
        self.main.close_stacks()

    # ------------------------------------------------------------------ the monitor's hand-overs (MonitorView)
    def snapshots_ready(self, snapshots: list[Snapshot], reset: bool, machine: Optional[MachineInfo]) -> None:
        if machine is not None:
            self.post_message(MachineKnown(machine))
        self.post_message(SnapshotReady(snapshots, reset))

    def poll_failed(self, error: str) -> None:
        self.post_message(PollFailed(error))

    def could_not_start(self, error: Exception) -> None:
        self.post_message(CouldNotStart(error))

    def diagnosed(self, verdict: Verdict) -> None:
        self.post_message(Diagnosed(verdict))

    def run_in_background(self, job: Callable[[], None]) -> None:
        # On the event loop's executor thread, as a Textual thread worker runs, without the worker: making one
        # every DIAGNOSE_EVERY seconds cost the main thread as much as the verdict line it draws.  The job
        # catches its own errors and hands over its result (`Monitor._run_diagnosis`).
        asyncio.get_running_loop().run_in_executor(None, job)

    # ------------------------------------------------------------------ the actions' hand-overs (ActionsView)
    def selected_row(self) -> "Optional[JobRow]":
        return self.main.selected

    def show_check_marks(self, report: "CheckReport") -> None:
        from gputop.tui.look import card_marks

        grid = self.main.grid
        grid.check_marks = card_marks(report)
        grid.redraw()

    # ------------------------------------------------------------------ snapshot -> screen
    def on_could_not_start(self, message: CouldNotStart) -> None:
        if self._leaving:
            # a stop signal or q closed the pipeline while it was still being built: its build then fails, and
            # that is the way out already taken (a SIGHUP during start-up exited 1 instead of 129)
            return
        self.start_error = message.error  # run_app raises it once the terminal is restored: the command's one line
        self.exit(return_code=1)

    def on_machine_known(self, message: MachineKnown) -> None:
        self._adopt_machine(message.machine)

    def _adopt_machine(self, machine: MachineInfo) -> None:
        """The GPUs are read: their machine replaces the host-only one the start-up frames were drawn for."""
        if not self.screen_stack:
            return  # shutting down: q (or the end of a test) came as the GPUs were read, and the screens are gone
        if self.monitor.adopt_machine(machine):
            self.main.set_machine(machine)
            self._apply_size(self.size.width, self.size.height)

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self._receive(message.snapshots, message.reset)

    def _receive(self, snapshots: list[Snapshot], reset: bool) -> None:
        first_verdict_due = self.monitor.receive(snapshots, reset)
        if self.poll_error:
            self.poll_error = None
        if first_verdict_due:  # soon, but after the first frame is on screen
            self.set_timer(self.first_verdict_delay, lambda: self.monitor.diagnose_soon(force=True))
        self._render_all()

    def on_poll_failed(self, message: PollFailed) -> None:
        if self.monitor.stopped:
            return  # the source was closed under a poll on the way out
        if message.error != self.poll_error:
            self.poll_error = message.error
            self.notify(message.error, title="collection failed", severity="error", timeout=6)

    def _main_visible(self) -> bool:
        return self.screen is self.screen_stack[0] if self.screen_stack else False

    def _render_all(self) -> None:
        # Skip UI work while paused or while another screen covers the main one.
        monitor = self.monitor
        if monitor.paused or not self._main_visible():
            return
        snapshot = monitor.history.latest
        if snapshot is None:
            return
        self._draw_verdict()  # one that came since the last frame (see on_diagnosed)
        if monitor.restarting is not None:  # where it stands (the case study's stage) in the subtitle's place
            self.main.header.set_subtitle(monitor.restarting.narration, before_versions=True)
        snapshots = monitor.history.window(drawn_window_s(monitor.interval))
        self.main.show(snapshots, monitor.interval, gpu_users(snapshot), reading_gpus=monitor.reading_gpus)
        if self.controls is not None:
            self._set_header()

    @work(thread=True, group="attach", exclusive=True)
    def attach_job(self, pid: int) -> None:
        """Follow the job behind `pid` (Enter on a process); a one-line notification says how it went."""
        source = self.monitor.source
        if not isinstance(source, Attachable):
            self.call_from_thread(self.notify, f"this view cannot attach; run gputop --pid {pid}", severity="warning", timeout=6)
            return
        try:
            source.attach(pid)
        except GputopError as exc:
            self.call_from_thread(self.notify, str(exc), title="attach failed", severity="error", timeout=8)
            return
        self.call_from_thread(self.notify, f"attached to PID {pid}", timeout=3)
        self.call_from_thread(lambda: source.want_stacks(bool(self.main.stacks.display)))

    # ------------------------------------------------------------------ the verdict
    def on_diagnosed(self, message: Diagnosed) -> None:
        verdict = message.verdict
        if not self.monitor.took_verdict(verdict) or not self.screen_stack:
            return  # shutting down
        self._verdict_drawn = False
        screens = sys.modules.get("gputop.tui.screens")  # loaded once a dialog was opened; not before (start-up)
        if screens is not None and isinstance(self.screen, screens.FindingsScreen) and verdict.findings is not None:
            self.screen.show(verdict.findings, verdict.line)  # it follows the diagnosis while open
        if not self.monitor.paused and self.monitor.interval < DIAGNOSE_EVERY and self._main_visible():
            # Drawn with the next snapshot's frame (`_render_all`): a frame of its own would cost Textual a
            # pass over the whole screen every DIAGNOSE_EVERY seconds.  The timer draws it if none comes.
            self.set_timer(self.monitor.interval + VERDICT_WAITS_FOR_FRAME, self._draw_verdict)
        else:
            self._draw_verdict()

    def _draw_verdict(self) -> None:
        verdict = self.monitor.verdict
        if self._verdict_drawn or verdict is None or self.monitor.stopped or not self.screen_stack:
            return
        self._verdict_drawn = True
        self.diagnoses_done += 1  # (counted once on screen: tests and screenshots wait for it)
        if self.diagnoses_done == 1:  # start-up is over
            give_back_freed_memory()
            self.set_interval(HEAP_TRIM_EVERY, give_back_freed_memory)
        findings = verdict.findings or []
        extra = max(0, len([f for f in findings if f.id != "healthy"]) - 1)
        self.main.verdict.set_verdict(verdict.line, verdict_severity(findings), extra)

    def _exit_if_terminal_gone(self) -> None:
        # With SIGHUP ignored (`nohup`, some multiplexers and job wrappers) nothing stops us when the ssh
        # session or the window goes away, and Textual's input thread then spins on end-of-file at ~80% of
        # a core, for good, on a machine people pay for by the hour.  So notice the hang-up ourselves.
        if terminal_hung_up():
            self.monitor.stop()
            self.exit(return_code=1, message="gputop: the terminal went away (hang-up); exiting")

    # ------------------------------------------------------------------ the monitor's own keys
    async def action_quit(self) -> None:
        self._leaving = True
        self.monitor.stop()
        self.exit()

    def action_help(self) -> None:
        from gputop.tui.screens import BenchScreen, HelpScreen

        if isinstance(self.screen, HelpScreen):
            return
        sections: list[tuple[str, Iterable[BindingType]]] = [
            ("Global", self.global_bindings()),
            ("Job panel", JobPanel.BINDINGS),
            ("Stacks panel", StacksPanel.BINDINGS),
            ("Benchmark dialog", BenchScreen.BINDINGS),
        ]
        self.push_screen(HelpScreen(sections))

    def _set_header(self) -> None:
        self.main.header.set_state(interval=self.monitor.interval, paused=self.monitor.paused, replay=self._replay_tag())

    def action_pause(self) -> None:
        paused = self.monitor.paused = not self.monitor.paused
        if self.controls is not None:
            (self.controls.pause if paused else self.controls.resume)()
        self._set_header()
        if not paused:
            self._render_all()

    def action_interval(self, direction: int) -> None:
        steps = INTERVAL_STEPS
        interval = self.monitor.interval
        current = min(range(len(steps)), key=lambda i: abs(steps[i] - interval))
        new = steps[max(0, min(len(steps) - 1, current + direction))]
        if new != interval:
            self.monitor.set_interval(new)
            self._set_header()
            self.notify(f"refresh every {new:g} s", timeout=2)

    def action_topology(self) -> None:
        from gputop.tui.screens import TopologyScreen

        if not isinstance(self.screen, TopologyScreen):
            self.push_screen(TopologyScreen(self.monitor.machine, self.monitor.history.latest))

    def action_findings(self) -> None:
        from gputop.tui.screens import FindingsScreen

        if not isinstance(self.screen, FindingsScreen):
            verdict = self.monitor.verdict
            self._focus_sampling(True)  # the shares the screen shows are read closely: sample densely meanwhile
            self.push_screen(
                FindingsScreen(verdict.findings if verdict else None, verdict.line if verdict else ""),
                callback=lambda _result: self._focus_sampling(False),
            )

    def _focus_sampling(self, focused: bool) -> None:
        source = self.monitor.source
        if isinstance(source, Focusable):
            source.focus_sampling(focused)

    def action_screenshot(self, filename: Optional[str] = None, path: Optional[str] = None) -> None:
        """Key s: the screen as SVG, named after the host and the time, into screenshot_dir (or `path`)."""
        directory = path or self.screenshot_dir or os.getcwd()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        filename = filename or f"gputop-{self.monitor.machine.hostname}-{stamp}.svg"
        try:
            path = self.save_screenshot(filename=filename, path=directory)
        except OSError as exc:
            self.notify(f"could not save the screenshot in {directory}: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"saved {path}", title="screenshot", timeout=5)

    # --- the background actions (actions.py)
    def action_bench(self) -> None:
        self.actions.start_bench()

    def action_trace(self) -> None:
        self.actions.start_trace()

    def action_check(self) -> None:
        self.actions.start_check()

    def action_report(self) -> None:
        self.actions.write_report(self.report_dir)

    # --- replay
    def _replay_tag(self) -> Optional[str]:
        controls = self.controls
        if controls is None:
            return None
        position = getattr(controls, "position", None)
        duration = getattr(controls, "duration", None)
        tag = "REPLAY"
        if position is not None and duration is not None:
            tag += f" {units.mmss(position)}/{units.mmss(duration)}"
        if self.replay_speed != 1.0:
            tag += f" ×{self.replay_speed:g}"
        return tag

    def action_seek(self, direction: int) -> None:
        if self.controls is None:
            return
        position = getattr(self.controls, "position", 0.0) or 0.0
        self.controls.seek(max(0.0, position + direction * SEEK_STEP))
        if not isinstance(self.monitor.source, Seekable):
            self.monitor.restart_history()  # keep the series in time order
        self.monitor.wake()

    def action_speed(self, factor: float) -> None:
        if self.controls is None:
            return
        self.replay_speed = max(0.125, min(64.0, self.replay_speed * factor))
        self.controls.set_speed(self.replay_speed)
        self._set_header()


# ------------------------------------------------------------------ helpers (pure)
def gpu_users(snapshot: Snapshot) -> dict[int, str]:
    """GPU index -> who uses it: 'r0 1234' from the job's ranks, else 'pid 1234' (+N more) from NVML."""
    users: dict[int, str] = {}
    job = snapshot.job
    if job is not None:
        for rank in job.ranks:
            for gpu in rank.gpus:
                label = f"r{rank.rank} {rank.proc.pid}" if rank.rank is not None else f"pid {rank.proc.pid}"
                users[gpu] = label if gpu not in users else users[gpu].split(" ")[0] + "+…"
    for sample in snapshot.gpus:
        if sample.index in users or not sample.processes:
            continue
        pids = [p.pid for p in sample.processes]
        users[sample.index] = f"pid {pids[0]}" + (f" +{len(pids) - 1}" if len(pids) > 1 else "")
    return users


def _stdin_fd() -> Optional[int]:
    stdin = sys.__stdin__
    if stdin is None:
        return None
    try:
        return stdin.fileno()
    except (AttributeError, ValueError, OSError):  # no stdin at all
        return None


def terminal_hung_up() -> bool:
    """True once the terminal on stdin has hung up; never reads from it.  (A hung-up terminal is no
    longer a tty to isatty(), so ask this only of one that was.)"""
    fd = _stdin_fd()
    if fd is None:
        return False
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: poll still reports POLLHUP/POLLERR/POLLNVAL
    return any(events & (select.POLLHUP | select.POLLNVAL) for _fd, events in poller.poll(0))


# ------------------------------------------------------------------ entry points
def run_app(
    source: Source,
    *,
    interval: float = 1.0,
    subtitle: Optional[str] = None,
    controls: Optional[Seekable] = None,
    poll_loop: Optional[PollLoop] = None,
) -> int:
    """Run the TUI on `source` (.machine, .poll(), .close()) until the user quits; closes the source.

    `poll_loop`: the loop over `source`, when the caller made it early to prefetch the first poll."""
    from gputop.tui.glyph_fallback import fit_glyphs_to

    fit_glyphs_to(sys.__stderr__)  # Textual draws on stderr
    app = GputopApp(source, interval=interval, subtitle=subtitle, controls=controls, poll_loop=poll_loop)
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])  # this process is the monitor's from now on
    if poll_loop is None:
        app.monitor.start_collecting()  # the first poll runs while Textual sets up (a given loop has prefetched it)
    try:
        app.run()
    finally:
        # Close the source only once the collector has left poll(): closing NVML under a running call can crash.
        if app.monitor.collector_stopped.is_set() or app.monitor.wait_for_collector():
            source.close()
    if app.start_error is not None:
        raise app.start_error  # printed by the command line as its one line, on the restored terminal
    return int(app.return_code or 0)

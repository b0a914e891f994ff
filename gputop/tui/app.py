"""The live Textual monitor: GPU grid, CPU heatmap, job tree with stacks, verdict line.

Three parts: `GputopApp` (here) collects, keeps the history, schedules the diagnosis and answers the
monitor's own keys; `main_screen.MainScreen` lays the widgets out and draws a window of snapshots on them;
`actions.BackgroundActions` runs the keys that start work in the background (bench, trace, check, report).

Collection runs the one poll loop (`source.PollLoop`) on a long-lived daemon thread,
which posts each snapshot to the app as a message: polls never overlap,
a slow NVML or py-spy call never blocks keys or drawing, and quitting never
waits for a hung driver call.  Drawing is done by line widgets that repaint only
the cells that changed (see `canvas.py`), which keeps the bytes sent over SSH
and the CPU used per refresh small.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from textual import events, work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.message import Message

from gputop import units
from gputop.advice_memory import AdviceMemory
from gputop.analysis.thresholds import DIAGNOSIS_WINDOW_S
from gputop.errors import GputopError
from gputop.heap import give_back_freed_memory
from gputop.history import History
from gputop.model import Finding, MachineInfo, Snapshot
from gputop.signals import STOP_SIGNALS
from gputop.source import Attachable, Batch, Focusable, PollLoop, Restarting, Seekable, Source
from gputop.tui import partial_updates, strip_cycles
from gputop.tui.look import key_display
from gputop.tui.main_screen import MainScreen
from gputop.tui.starting import StartingPipeline
from gputop.tui.widgets.job_panel import JobPanel
from gputop.tui.widgets.stacks import StacksPanel
from gputop.tui.widgets.status import verdict_severity

if TYPE_CHECKING:
    from gputop.analysis.machine_check import CheckReport
    from gputop.bench import BenchResult
    from gputop.tracing import TraceResult
    from gputop.tui.actions import BackgroundActions
    from gputop.tui.screens import TooSmallScreen

partial_updates.install()  # write only the changed cells (see partial_updates.py)
strip_cycles.install()  # each frame's lines freed by refcounting, not the cyclic GC (see strip_cycles.py)

MIN_SIZE = (60, 16)  # below this: the "terminal too small" screen
INTERVAL_STEPS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
# Seconds between verdict updates.  Each diagnosis reads the whole window (3-4 ms of CPU on eight GPUs, more
# with a job): at 3 s it was a tenth of the TUI's CPU.  The first verdict is asked for at once
# (`first_verdict_delay`), and the verdict's 30 s bar leaves room for a few of these steps.  Without an
# attached job the verdict only sums up what the cards already show each second (health, idle GPUs), so it
# is renewed half as often.
DIAGNOSE_EVERY = 5.0
DIAGNOSE_EVERY_WITHOUT_JOB = 10.0
# Allocations between collections of the youngest generation in the monitor's process, instead of 700: a frame
# and a poll make thousands of short-lived objects, and collecting 1.3 times a second promoted the survivors of
# half-built frames to the older generations, which cost more to scan (150 s in a pty, gen-0 and gen-1
# collections: 0.117 s of CPU at 700, 0.066 s at 7,000).  Reference counting frees all but cycles at once.
GC_YOUNG_THRESHOLD = 7000
# The widest sparkline spans at most ~ width seconds-per-cell x cells: the frames read this window of history
SPARKLINE_WINDOW_S = 180.0
SPARKLINE_CELLS_MAX = 200
VERDICT_WAITS_FOR_FRAME = 0.25  # seconds past the next snapshot's due time before a verdict is drawn alone
SEEK_STEP = 10.0  # replay seek, seconds
COLLECTOR_STOP_TIMEOUT = 3.0
# Seconds between checks that the terminal is still there (`_exit_if_terminal_gone`): each is a poll(2) of stdin
# and a wake-up of the event loop, which at one a second came to a tenth of the main thread's wake-ups; a hung-up
# terminal is left within this long either way.
HANGUP_CHECK_EVERY = 5.0
# Seconds between hand-backs of the heap's freed pages (gputop/heap.py); the first is made once the first verdict
# is on screen, when start-up's transient allocations (imports, the first frames and diagnosis) have been freed.
HEAP_TRIM_EVERY = 60.0

# The findings the app shows (tests put scripted ones in): (history, bench, trace, check results) -> (findings,
# verdict line); `findings()` unless a test says otherwise
Diagnose = Callable[
    [History, "Optional[BenchResult]", "Optional[TraceResult]", "Optional[CheckReport]"], tuple[list[Finding], str]
]


@dataclass(frozen=True)
class Verdict:
    findings: Optional[list[Finding]]
    line: str


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


# the screen advises as `gputop report` did on this job, and the other way round: one file (read again when changed)
_ADVICE_MEMORY = AdviceMemory()


def _default_diagnose(
    history: History, bench: "Optional[BenchResult]", trace: "Optional[TraceResult]", check: "Optional[CheckReport]"
) -> tuple[list[Finding], str]:
    """`findings()`, the one assembly every sink uses, so the screen, the `r` report and `gputop report` say the
    same: the diagnosis, the trace's and the machine check's findings (the counter watch's when no check ran)."""
    from gputop.analysis.diagnosis import verdict_line
    from gputop.analysis.findings import findings

    found = findings(history, bench, trace, check, memory=_ADVICE_MEMORY)
    return found, verdict_line(found, count_more=False)  # the verdict line adds "+N more (f)" itself


class GputopApp(App[None]):
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
        self._restarting: Optional[Restarting] = None
        self.source = source  # (the setter: what kind of source it is, too)
        self.machine = source.machine
        # a pipeline still starting answers with the host's side alone until NVML has read the GPUs
        self.reading_gpus = isinstance(source, StartingPipeline) and source.reading_gpus
        self.start_error: Optional[BaseException] = None  # why the source could not start (run_app raises it)
        self.interval = interval
        self.sub_title = subtitle or ""
        # replay controls: the source's own when it is a recording (tests may hand in others)
        self.controls = controls if controls is not None else (source if isinstance(source, Seekable) else None)
        self.replay_speed = float(getattr(controls, "speed", 1.0) or 1.0)
        self._diagnose: Diagnose = diagnose or _default_diagnose
        self.screenshot_dir = screenshot_dir
        self.report_dir = report_dir
        self.history = self._new_history(self.machine, history_capacity or 600)
        self.paused = False
        self.verdict: Optional[Verdict] = None
        self._verdict_drawn = True  # whether self.verdict is on the verdict line yet
        self.snapshots_seen = 0
        self.diagnoses_done = 0
        self.poll_error: Optional[str] = None
        self._diagnosing = False
        self._diagnosed_at = -math.inf  # when the last diagnosis was asked for (time.monotonic)
        # `poll_loop`: one made (and perhaps prefetched) before the app, on this source and interval
        self._poll_loop = poll_loop if poll_loop is not None else PollLoop(source, interval)
        self._poll_loop.on_error = self._poll_failed
        if isinstance(source, StartingPipeline):
            source.when_built(self._poll_loop.wake)  # the first GPU sample as soon as NVML can give it
        self._collector: Optional[threading.Thread] = None
        self.collector_stopped = threading.Event()
        self._mounted = threading.Event()
        self._machine_posted = self.machine  # the collector's: the machine its last MachineKnown carried
        self._first_verdict_asked = False
        self._too_small: Optional[TooSmallScreen] = None  # shown while the terminal is below MIN_SIZE

    @property
    def source(self) -> Source:
        return self._source

    @source.setter
    def source(self, source: Source) -> None:
        self._source = source
        # decided once a source, not every frame: a runtime Protocol check walks its members with hasattr
        self._restarting = source if isinstance(source, Restarting) else None

    @cached_property
    def actions(self) -> "BackgroundActions":
        """Keys b, t, c, r and what they found (made at the first diagnosis or key: not before the first frame)."""
        from gputop.tui.actions import BackgroundActions

        return BackgroundActions(self)

    def get_driver_class(self) -> type:
        from gputop.tui.input_thread import quiet_driver

        return quiet_driver(super().get_driver_class())  # Textual's, with an input thread that sleeps

    def get_default_screen(self) -> MainScreen:
        return MainScreen(self.machine, self.key_hints(), on_ready=self._main_ready, on_drawn=self._release_pipeline)

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
        self._apply_size(self.size.width, self.size.height)
        self._set_header()
        self.main.header.subtitle = self.sub_title
        self.main.header.set_machine(self.machine, self.reading_gpus)
        self.main.jobs.focus()
        first = self._poll_loop.take_prefetched()  # taken while Textual loaded (commands/tui.py)
        if first is not None:
            self._adopt_machine(self.source.machine)  # the prefetched poll may have been the pipeline's first
            self._receive(first.snapshots, first.reset)  # so the very first frame shows its readings
        self.start_collecting()
        self._mounted.set()
        self.call_after_refresh(self._started)
        self.set_interval(DIAGNOSE_EVERY, self._diagnose_soon)
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
        self._stop_collector()
        self.exit(return_code=128 + sig)  # the shell's code for a process a signal ended

    def _release_pipeline(self) -> None:
        """The first frame is on the terminal: a pipeline held until now starts building (see starting.py)."""
        if isinstance(self.source, StartingPipeline):
            self.source.release()

    def _started(self) -> None:
        """After the first frame: the cyclic GC back on (commands/tui.py turns it off for start-up); and the
        pipeline released if the first frame was not the main screen's (a terminal too small for it).

        Not gc.freeze() as well: measured, it kept start-up's garbage for good (RSS +0.5 MiB at 35 s, +0.2
        after a gc.collect() first) and saved no CPU one could see at one poll a second.  (`run_app` sets how
        often the youngest generation is collected.)"""
        gc.enable()
        self._release_pipeline()

    def start_collecting(self) -> None:
        """Start the collector thread (idempotent). Without a prefetching loop `run_app` calls it before the UI
        starts, so the first poll runs while Textual sets up the screen; snapshots are posted only once the
        app is mounted."""
        if self._collector is None:
            self._collector = threading.Thread(target=self._collect, name="gputop-collect", daemon=True)
            self._collector.start()

    def on_unmount(self) -> None:
        self._stop_collector()
        self._mounted.clear()

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
        if isinstance(self.source, Attachable):
            self.source.want_stacks(message.shown)

    def on_main_screen_attach_wanted(self, message: MainScreen.AttachWanted) -> None:
        self.attach_job(message.pid)

    def action_close_stacks(self) -> None:
        self.main.close_stacks()

    @property
    def collection_stopped(self) -> threading.Event:
        """Set once collection is told to stop (quitting): work beside it (a timed check) waits on it."""
        return self._poll_loop.stop_event

    # ------------------------------------------------------------------ collection (off the event loop)
    def _collect(self) -> None:
        try:
            self._poll_loop.run(self._post_batch)
        finally:
            self.collector_stopped.set()

    def _post_batch(self, batch: Batch) -> None:
        # snapshots go to the app only once it is mounted (the first poll runs while Textual starts)
        while not self._mounted.wait(0.05):
            if self._poll_loop.stopped:
                return
        if self._poll_loop.stopped:
            return
        machine = self._poll_loop.source.machine  # the polled source's (self.source may be the pipeline it built)
        if machine is not self._machine_posted:  # read here, between polls: it belongs to this batch
            self._machine_posted = machine
            self.post_message(MachineKnown(machine))
        self.post_message(SnapshotReady(batch.snapshots, batch.reset))

    def _poll_failed(self, exc: Exception) -> None:
        if isinstance(self._poll_loop.source, StartingPipeline) and self._poll_loop.source.failure is exc:
            self._poll_loop.stop()  # the pipeline could not be built: nothing to monitor
            self.post_message(CouldNotStart(exc))
            return
        # a collector bug must not kill the monitor: say it, and poll again on the next tick
        self.post_message(PollFailed(str(exc) if isinstance(exc, GputopError) else f"{type(exc).__name__}: {exc}"))

    def on_could_not_start(self, message: CouldNotStart) -> None:
        self.start_error = message.error  # run_app raises it once the terminal is restored: the command's one line
        self.exit(return_code=1)

    def _stop_collector(self) -> None:
        self._poll_loop.stop()

    def wait_for_collector(self, timeout: float = COLLECTOR_STOP_TIMEOUT) -> bool:
        """Whether no poll is running any more (waiting up to `timeout`): the collector has stopped, or it
        never started (the app ended before it mounted) and the prefetched poll, if any, has returned."""
        if self._collector is None:
            self._poll_loop.stop()
            return self._poll_loop.prefetch_finished(timeout)
        return self.collector_stopped.wait(timeout)

    # ------------------------------------------------------------------ snapshot -> screen
    def on_machine_known(self, message: MachineKnown) -> None:
        self._adopt_machine(message.machine)

    def _adopt_machine(self, machine: MachineInfo) -> None:
        """The GPUs are read: their machine replaces the host-only one the start-up frames were drawn for."""
        if machine is self.machine:
            return
        self.machine = machine
        self.reading_gpus = False
        self.history = self._new_history(machine, self.history.capacity)  # the host-only samples are not kept
        if isinstance(self.source, StartingPipeline) and self.source.pipeline is not None:
            self.source = self.source.pipeline  # attach, stacks, the check: the pipeline itself from now on
        self.main.set_machine(machine)
        self._apply_size(self.size.width, self.size.height)

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self._receive(message.snapshots, message.reset)

    def _receive(self, snapshots: list[Snapshot], reset: bool) -> None:
        if reset:
            self.history = self._new_history(self.machine, self.history.capacity)
        for snapshot in snapshots:
            latest = self.history.latest
            if latest is not None and snapshot.timestamp <= latest.timestamp:
                continue  # the same sample again (a paused replay, a stalled source): keep time moving forward
            self.history.append(snapshot)
        self.snapshots_seen += len(snapshots)
        if self.poll_error:
            self.poll_error = None
        if not self._first_verdict_asked and len(self.history) and not self.reading_gpus:
            self._first_verdict_asked = True
            # first verdict soon, but after the first frame is on screen
            self.set_timer(self.first_verdict_delay, lambda: self._diagnose_soon(force=True))
        self._render_all()

    def on_poll_failed(self, message: PollFailed) -> None:
        if self._poll_loop.stopped:
            return  # the source was closed under a poll on the way out
        if message.error != self.poll_error:
            self.poll_error = message.error
            self.notify(message.error, title="collection failed", severity="error", timeout=6)

    def _main_visible(self) -> bool:
        return self.screen is self.screen_stack[0] if self.screen_stack else False

    def _render_all(self) -> None:
        # Skip UI work while paused or while another screen covers the main one.
        if self.paused or not self._main_visible():
            return
        snapshot = self.history.latest
        if snapshot is None:
            return
        self._draw_verdict()  # one that came since the last frame (see on_diagnosed)
        if self._restarting is not None:  # where it stands (the case study's stage) in the subtitle's place
            self.main.header.set_subtitle(self._restarting.narration, before_versions=True)
        snapshots = self.history.window(self._sparkline_window_s())
        self.main.show(snapshots, self.interval, gpu_users(snapshot), reading_gpus=self.reading_gpus)
        if self.controls is not None:
            self._set_header()

    @work(thread=True, group="attach", exclusive=True)
    def attach_job(self, pid: int) -> None:
        """Follow the job behind `pid` (Enter on a process); a one-line notification says how it went."""
        source = self.source
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

    # ------------------------------------------------------------------ diagnosis (thread, every few seconds)
    def assess(
        self,
        history: History,
        bench: "Optional[BenchResult]",
        trace: "Optional[TraceResult]",
        check: "Optional[CheckReport]",
    ) -> tuple[list[Finding], str]:
        """The findings and the verdict line for `history` with the background actions' results: what the
        verdict shows and the `r` report writes (blocking: call it from a worker)."""
        return self._diagnose(history, bench, trace, check)

    def diagnose_now(self) -> None:
        """A new verdict now (an action's result came in), even while paused."""
        self._diagnose_soon(force=True)

    def _diagnose_soon(self, force: bool = False) -> None:
        if self._diagnosing or not len(self.history) or self.reading_gpus or (self.paused and not force):
            return
        latest = self.history.latest
        now = time.monotonic()
        if (
            not force
            and latest is not None
            and latest.job is None
            and now - self._diagnosed_at < DIAGNOSE_EVERY_WITHOUT_JOB - 0.5
        ):
            return
        self._diagnosed_at = now
        self._diagnosing = True
        actions = self.actions
        # On the event loop's executor thread, as a Textual thread worker runs, without the worker: making one
        # every DIAGNOSE_EVERY seconds cost the main thread as much as the verdict line it draws.  The call
        # catches its own errors and posts its result (`_run_diagnosis`).
        asyncio.get_running_loop().run_in_executor(
            None, self._run_diagnosis, self.history_copy(), actions.bench, actions.trace, actions.check
        )

    def _new_history(self, machine: MachineInfo, capacity: int) -> History:
        """The screen's history: the snapshots the sparklines and the diagnosis read at full rate, the older part
        of the 10 minutes thinned (`History.dense`): about half the memory a full-rate history takes."""
        full_rate_s = max(self._sparkline_window_s(), DIAGNOSIS_WINDOW_S)
        return History(machine, capacity=capacity, dense=math.ceil(full_rate_s / self.interval) + 10)

    def _sparkline_window_s(self) -> float:
        """The seconds of history a frame draws (the widest sparkline's span at this interval)."""
        return max(SPARKLINE_WINDOW_S, self.interval * SPARKLINE_CELLS_MAX)

    def history_copy(self) -> History:
        """A History of its own for a worker thread: the app keeps appending to the live one."""
        return self.history.copy()

    def _run_diagnosis(
        self,
        history: History,
        bench: "Optional[BenchResult]",
        trace: "Optional[TraceResult]",
        check: "Optional[CheckReport]",
    ) -> None:
        try:
            findings, line = self.assess(history, bench, trace, check)
            verdict = Verdict(list(findings), line)
        except ImportError:
            verdict = Verdict(None, "Verdict: diagnosis is not available in this build")
        except Exception as exc:  # a diagnosis bug must not take the monitor down
            verdict = Verdict(None, f"Verdict: diagnosis failed ({type(exc).__name__}: {exc})")
        self.post_message(Diagnosed(verdict))

    def on_diagnosed(self, message: Diagnosed) -> None:
        self._diagnosing = False
        if self._poll_loop.stopped or not self.screen_stack:
            return  # shutting down
        self.verdict = message.verdict
        self._verdict_drawn = False
        screens = sys.modules.get("gputop.tui.screens")  # loaded once a dialog was opened; not before (start-up)
        if screens is not None and isinstance(self.screen, screens.FindingsScreen) and message.verdict.findings is not None:
            self.screen.show(message.verdict.findings, message.verdict.line)  # it follows the diagnosis while open
        if not self.paused and self.interval < DIAGNOSE_EVERY and self._main_visible():
            # Drawn with the next snapshot's frame (`_render_all`): a frame of its own would cost Textual a
            # pass over the whole screen every DIAGNOSE_EVERY seconds.  The timer draws it if none comes.
            self.set_timer(self.interval + VERDICT_WAITS_FOR_FRAME, self._draw_verdict)
        else:
            self._draw_verdict()

    def _draw_verdict(self) -> None:
        if self._verdict_drawn or self.verdict is None or self._poll_loop.stopped or not self.screen_stack:
            return
        self._verdict_drawn = True
        self.diagnoses_done += 1  # (counted once on screen: tests and screenshots wait for it)
        if self.diagnoses_done == 1:  # start-up is over
            give_back_freed_memory()
            self.set_interval(HEAP_TRIM_EVERY, give_back_freed_memory)
        findings = self.verdict.findings or []
        extra = max(0, len([f for f in findings if f.id != "healthy"]) - 1)
        self.main.verdict.set_verdict(self.verdict.line, verdict_severity(findings), extra)

    def _exit_if_terminal_gone(self) -> None:
        # With SIGHUP ignored (`nohup`, some multiplexers and job wrappers) nothing stops us when the ssh
        # session or the window goes away, and Textual's input thread then spins on end-of-file at ~80% of
        # a core, for good, on a machine people pay for by the hour.  So notice the hang-up ourselves.
        if terminal_hung_up():
            self._stop_collector()
            self.exit(return_code=1, message="gputop: the terminal went away (hang-up); exiting")

    # ------------------------------------------------------------------ the monitor's own keys
    async def action_quit(self) -> None:
        self._stop_collector()
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
        self.main.header.set_state(interval=self.interval, paused=self.paused, replay=self._replay_tag())

    def action_pause(self) -> None:
        self.paused = not self.paused
        if self.controls is not None:
            (self.controls.pause if self.paused else self.controls.resume)()
        self._set_header()
        if not self.paused:
            self._render_all()

    def action_interval(self, direction: int) -> None:
        steps = INTERVAL_STEPS
        current = min(range(len(steps)), key=lambda i: abs(steps[i] - self.interval))
        new = steps[max(0, min(len(steps) - 1, current + direction))]
        if new != self.interval:
            self.interval = self._poll_loop.interval = new
            kept = self.history  # its full-rate part was sized for the old interval (`_new_history`)
            self.history = self._new_history(kept.machine, kept.capacity)
            for snapshot in kept:
                self.history.append(snapshot)
            self._poll_loop.wake()  # start the new cadence now
            self._set_header()
            self.notify(f"refresh every {new:g} s", timeout=2)

    def action_topology(self) -> None:
        from gputop.tui.screens import TopologyScreen

        if not isinstance(self.screen, TopologyScreen):
            self.push_screen(TopologyScreen(self.machine, self.history.latest))

    def action_findings(self) -> None:
        from gputop.tui.screens import FindingsScreen

        if not isinstance(self.screen, FindingsScreen):
            verdict = self.verdict
            self._focus_sampling(True)  # the shares the screen shows are read closely: sample densely meanwhile
            self.push_screen(
                FindingsScreen(verdict.findings if verdict else None, verdict.line if verdict else ""),
                callback=lambda _result: self._focus_sampling(False),
            )

    def _focus_sampling(self, focused: bool) -> None:
        if isinstance(self.source, Focusable):
            self.source.focus_sampling(focused)

    def action_screenshot(self, filename: Optional[str] = None, path: Optional[str] = None) -> None:
        """Key s: the screen as SVG, named after the host and the time, into screenshot_dir (or `path`)."""
        directory = path or self.screenshot_dir or os.getcwd()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        filename = filename or f"gputop-{self.machine.hostname}-{stamp}.svg"
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
        if not isinstance(self.source, Seekable):
            self.history = self._new_history(self.machine, self.history.capacity)  # keep the series in time order
        self._poll_loop.wake()

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
        app.start_collecting()  # the first poll runs while Textual sets up (a given loop has prefetched it)
    try:
        app.run()
    finally:
        # Close the source only once the collector has left poll(): closing NVML under a running call can crash.
        if app.collector_stopped.is_set() or app.wait_for_collector():
            source.close()
    if app.start_error is not None:
        raise app.start_error  # printed by the command line as its one line, on the restored terminal
    return int(app.return_code or 0)

"""The live monitor without its screen: collection, history, the diagnosis' schedule and what it concluded.

`Monitor` owns the collector thread (the one poll loop, `source.PollLoop`, on a long-lived daemon thread: polls
never overlap, a slow NVML or py-spy call never blocks the screen, and quitting never waits for a hung driver
call), the history the screen draws and the diagnosis reads, when the next diagnosis runs, the background
actions' results (the loader benchmark's, the trace's, the machine check's) and the findings, from
`analysis.findings.findings()`: the one assembly `gputop report` and `gputop serve` make too.

It draws nothing and imports no Textual.  What it hands out goes through a `MonitorView` (the TUI's app is one):
snapshots and poll failures from the collector thread, verdicts from the diagnosis thread, and the view's way of
running a diagnosis in the background.  Everything else is called on the view's own thread.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Protocol

from gputop.advice_memory import AdviceMemory
from gputop.analysis.thresholds import DIAGNOSIS_WINDOW_S
from gputop.errors import GputopError
from gputop.history import History
from gputop.model import Finding, MachineInfo, Snapshot
from gputop.source import Batch, PollLoop, Restarting, Source

if TYPE_CHECKING:
    from gputop.analysis.machine_check import CheckReport
    from gputop.bench import BenchResult
    from gputop.tracing import TraceResult

# Seconds between verdict updates.  Each diagnosis reads the whole window (3-4 ms of CPU on eight GPUs, more
# with a job): at 3 s it was a tenth of the TUI's CPU.  The first verdict is asked for at once
# (`Monitor.receive`), and the verdict's 30 s bar leaves room for a few of these steps.  Without an
# attached job the verdict only sums up what the cards already show each second (health, idle GPUs), so it
# is renewed half as often.
DIAGNOSE_EVERY = 5.0
DIAGNOSE_EVERY_WITHOUT_JOB = 10.0
# The widest sparkline spans at most ~ width seconds-per-cell x cells: the frames read this window of history
SPARKLINE_WINDOW_S = 180.0
SPARKLINE_CELLS_MAX = 200
COLLECTOR_STOP_TIMEOUT = 3.0
VIEW_READY_CHECK_S = 0.05  # how often a batch waiting for the view looks whether collection was stopped meanwhile

# The findings the monitor shows (tests put scripted ones in): (history, bench, trace, check results) ->
# (findings, verdict line); `findings()` unless a test says otherwise
Diagnose = Callable[
    [History, "Optional[BenchResult]", "Optional[TraceResult]", "Optional[CheckReport]"], tuple[list[Finding], str]
]


@dataclass(frozen=True)
class Verdict:
    findings: Optional[list[Finding]]  # None: the diagnosis could not run (the line says why)
    line: str


# the screen advises as `gputop report` did on this job, and the other way round: one file (read again when changed)
_ADVICE_MEMORY = AdviceMemory()


def diagnose_with_findings(
    history: History, bench: "Optional[BenchResult]", trace: "Optional[TraceResult]", check: "Optional[CheckReport]"
) -> tuple[list[Finding], str]:
    """`findings()`, the one assembly every sink uses, so the screen, the `r` report and `gputop report` say the
    same: the diagnosis, the trace's and the machine check's findings (the counter watch's when no check ran)."""
    from gputop.analysis.diagnosis import verdict_line
    from gputop.analysis.findings import findings

    found = findings(history, bench, trace, check, memory=_ADVICE_MEMORY)
    return found, verdict_line(found, count_more=False)  # the verdict line adds "+N more (f)" itself


def drawn_window_s(interval: float) -> float:
    """The seconds of history a frame draws at `interval` (the widest sparkline's span)."""
    return max(SPARKLINE_WINDOW_S, interval * SPARKLINE_CELLS_MAX)


class Starting(Protocol):
    """A source still building its pipeline (`tui.starting.StartingPipeline`): the host's side until NVML has
    read the GPUs, then the pipeline's."""

    @property
    def reading_gpus(self) -> bool: ...

    @property
    def failure(self) -> Optional[Exception]: ...

    @property
    def pipeline(self) -> Optional[Source]: ...

    def when_built(self, callback: Callable[[], None]) -> None: ...


class MonitorView(Protocol):
    """What the monitor hands to whoever shows it (the TUI's app)."""

    def snapshots_ready(self, snapshots: list[Snapshot], reset: bool, machine: Optional[MachineInfo]) -> None:
        """From the collector thread: new snapshots (`reset`: start the history over, a replay was sought);
        `machine`: the source's machine changed before them (a starting pipeline read the GPUs), else None."""

    def poll_failed(self, error: str) -> None:
        """From the collector thread: a poll failed (one line); collection goes on."""

    def could_not_start(self, error: Exception) -> None:
        """From the collector thread: the starting pipeline failed (a bad spec, a PID that is gone); collection
        has stopped."""

    def diagnosed(self, verdict: Verdict) -> None:
        """From the diagnosis' thread: a verdict; hand it back with `Monitor.took_verdict` on the view's thread."""

    def run_in_background(self, job: Callable[[], None]) -> None:
        """Run `job` (a diagnosis, which reports through `diagnosed`) off the view's thread."""


class Monitor:
    """The live monitor's state and work, for a view to show: see the module docstring."""

    def __init__(
        self,
        source: Source,
        view: MonitorView,
        *,
        interval: float = 1.0,
        diagnose: Optional[Diagnose] = None,
        history_capacity: Optional[int] = None,
        poll_loop: Optional[PollLoop] = None,
        starting: Optional[Starting] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`poll_loop`: one made (and perhaps prefetched) before the monitor, on this source and interval;
        `starting`: the source when it is a pipeline still starting; `clock`: when diagnoses are due."""
        self.view = view
        self.source = source  # (the setter: whether it restarts, too)
        self.machine = source.machine
        self.starting = starting
        # a pipeline still starting answers with the host's side alone until NVML has read the GPUs
        self.reading_gpus = starting is not None and starting.reading_gpus
        self.interval = interval
        self.diagnose: Diagnose = diagnose or diagnose_with_findings
        self.history = self._new_history(self.machine, history_capacity or 600)
        self.paused = False  # no scheduled diagnosis while paused (an action's result still gets one)
        self.verdict: Optional[Verdict] = None  # the latest
        self.snapshots_seen = 0
        # the background actions' latest results: they join the diagnosis and the report
        self.bench: Optional[BenchResult] = None
        self.trace: Optional[TraceResult] = None
        self.check: Optional[CheckReport] = None
        self._clock = clock
        self._diagnosing = False
        self._diagnosed_at = -math.inf  # when the last diagnosis was asked for (`clock`)
        self._first_verdict_asked = False
        self._poll_loop = poll_loop if poll_loop is not None else PollLoop(source, interval)
        self._poll_loop.on_error = self._poll_failed
        if starting is not None:
            starting.when_built(self._poll_loop.wake)  # the first GPU sample as soon as NVML can give it
        self._collector: Optional[threading.Thread] = None
        self.collector_stopped = threading.Event()
        # set by the view once it can take snapshots: until then the collector holds its batch
        self.view_ready = threading.Event()
        self._machine_posted = self.machine  # the collector's: the machine its last batch came with

    @property
    def source(self) -> Source:
        return self._source

    @source.setter
    def source(self, source: Source) -> None:
        self._source = source
        # decided once a source, not every frame: a runtime Protocol check walks its members with hasattr
        self.restarting: Optional[Restarting] = source if isinstance(source, Restarting) else None

    # ------------------------------------------------------------------ collection (a thread of its own)
    def start_collecting(self) -> None:
        """Start the collector thread (idempotent).  It may start before the view is ready: the first poll
        then runs while the view sets up, and its batch waits for `view_ready`."""
        if self._collector is None:
            self._collector = threading.Thread(target=self._collect, name="gputop-collect", daemon=True)
            self._collector.start()

    def take_prefetched(self) -> Optional[Batch]:
        """The poll loop's prefetched first batch, if it is ready now (see `PollLoop.take_prefetched`)."""
        return self._poll_loop.take_prefetched()

    def wake(self) -> None:
        """Poll now (a new interval, a seek)."""
        self._poll_loop.wake()

    def stop(self) -> None:
        """Stop collecting (quitting); a poll under way finishes on its own."""
        self._poll_loop.stop()

    @property
    def stopped(self) -> bool:
        return self._poll_loop.stopped

    @property
    def collection_stopped(self) -> threading.Event:
        """Set once collection is told to stop (quitting): work beside it (a timed check) waits on it."""
        return self._poll_loop.stop_event

    def wait_for_collector(self, timeout: float = COLLECTOR_STOP_TIMEOUT) -> bool:
        """Whether no poll is running any more (waiting up to `timeout`): the collector has stopped, or it
        never started (the view ended before it was ready) and the prefetched poll, if any, has returned."""
        if self._collector is None:
            self._poll_loop.stop()
            return self._poll_loop.prefetch_finished(timeout)
        return self.collector_stopped.wait(timeout)

    def _collect(self) -> None:
        try:
            self._poll_loop.run(self._deliver)
        finally:
            self.collector_stopped.set()

    def _deliver(self, batch: Batch) -> None:
        while not self.view_ready.wait(VIEW_READY_CHECK_S):
            if self._poll_loop.stopped:
                return
        if self._poll_loop.stopped:
            return
        machine = self._poll_loop.source.machine  # the polled source's (self.source may be the pipeline it built)
        changed = None
        if machine is not self._machine_posted:  # read here, between polls: it belongs to this batch
            self._machine_posted = changed = machine
        self.view.snapshots_ready(batch.snapshots, batch.reset, changed)

    def _poll_failed(self, exc: Exception) -> None:
        if self.starting is not None and self.starting.failure is exc:
            self._poll_loop.stop()  # the pipeline could not be built: nothing to monitor
            self.view.could_not_start(exc)
            return
        # a collector bug must not kill the monitor: say it, and poll again on the next tick
        self.view.poll_failed(str(exc) if isinstance(exc, GputopError) else f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ history (the view's thread)
    def receive(self, snapshots: list[Snapshot], reset: bool) -> bool:
        """Keep `snapshots` (after starting over, with `reset`).  True once, when the first verdict is due: the
        view asks for it (`diagnose_soon(force=True)`) once it has drawn them."""
        if reset:
            self.restart_history()
        for snapshot in snapshots:
            latest = self.history.latest
            if latest is not None and snapshot.timestamp <= latest.timestamp:
                continue  # the same sample again (a paused replay, a stalled source): keep time moving forward
            self.history.append(snapshot)
        self.snapshots_seen += len(snapshots)
        if not self._first_verdict_asked and len(self.history) and not self.reading_gpus:
            self._first_verdict_asked = True
            return True
        return False

    def adopt_machine(self, machine: MachineInfo) -> bool:
        """The GPUs are read: their machine replaces the host-only one.  False when it is the one already kept."""
        if machine is self.machine:
            return False
        self.machine = machine
        self.reading_gpus = False
        self.history = self._new_history(machine, self.history.capacity)  # the host-only samples are not kept
        built = self.starting.pipeline if self.starting is not None else None
        if built is not None and self.source is not built:
            self.source = built  # attach, stacks, the check: the pipeline itself from now on
        return True

    def set_interval(self, interval: float) -> None:
        """Poll every `interval` seconds from now on; the history keeps its snapshots, resized for the new rate."""
        self.interval = self._poll_loop.interval = interval
        kept = self.history  # its full-rate part was sized for the old interval (`_new_history`)
        self.history = self._new_history(kept.machine, kept.capacity)
        for snapshot in kept:
            self.history.append(snapshot)
        self._poll_loop.wake()  # start the new cadence now

    def restart_history(self) -> None:
        """An empty history (a replay sought back: the series stays in time order)."""
        self.history = self._new_history(self.machine, self.history.capacity)

    def _new_history(self, machine: MachineInfo, capacity: int) -> History:
        """The monitor's history: the snapshots the sparklines and the diagnosis read at full rate, the older part
        of the 10 minutes thinned (`History.dense`): about half the memory a full-rate history takes."""
        full_rate_s = max(drawn_window_s(self.interval), DIAGNOSIS_WINDOW_S)
        return History(machine, capacity=capacity, dense=math.ceil(full_rate_s / self.interval) + 10)

    # ------------------------------------------------------------------ the diagnosis
    def assess(
        self,
        history: History,
        bench: "Optional[BenchResult]",
        trace: "Optional[TraceResult]",
        check: "Optional[CheckReport]",
    ) -> tuple[list[Finding], str]:
        """The findings and the verdict line for `history` with the background actions' results: what the
        verdict shows and the `r` report writes (blocking: call it off the view's thread)."""
        return self.diagnose(history, bench, trace, check)

    def diagnose_soon(self, force: bool = False) -> bool:
        """Start a diagnosis in the background (the view calls this every DIAGNOSE_EVERY seconds), unless one is
        running, nothing was kept yet, the GPUs are still being read, or the monitor is paused; without a job
        attached, unless the last was asked for under DIAGNOSE_EVERY_WITHOUT_JOB ago.  `force` (an action's
        result, the first verdict) skips the last two rules.  Whether one started."""
        if self._diagnosing or not len(self.history) or self.reading_gpus or (self.paused and not force):
            return False
        latest = self.history.latest
        now = self._clock()
        if (
            not force
            and latest is not None
            and latest.job is None
            and now - self._diagnosed_at < DIAGNOSE_EVERY_WITHOUT_JOB - 0.5
        ):
            return False
        self._diagnosed_at = now
        self._diagnosing = True
        # the diagnosis reads a history of its own: this one keeps growing meanwhile
        history, bench, trace, check = self.history.copy(), self.bench, self.trace, self.check
        self.view.run_in_background(lambda: self._run_diagnosis(history, bench, trace, check))
        return True

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
        self.view.diagnosed(verdict)

    def took_verdict(self, verdict: Verdict) -> bool:
        """The view got `verdict` (on its thread): the next diagnosis may start.  False when collection has
        stopped (quitting): the verdict is not kept."""
        self._diagnosing = False
        if self._poll_loop.stopped:
            return False
        self.verdict = verdict
        return True

    # ------------------------------------------------------------------ the background actions' results
    def keep_bench(self, result: "BenchResult") -> None:
        """The loader benchmark's result: it joins a verdict asked for now."""
        self.bench = result
        self.diagnose_soon(force=True)

    def keep_trace(self, result: "TraceResult") -> None:
        """The trace's result: it joins a verdict asked for now."""
        self.trace = result
        self.diagnose_soon(force=True)

    def keep_check(self, report: "CheckReport") -> None:
        """The machine check's report: it joins the next scheduled verdict (the check's dialog shows it now)."""
        self.check = report

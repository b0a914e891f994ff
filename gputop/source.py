"""Where snapshots come from, written down once: the contracts, and the one loop that polls them.

A `Source` gives snapshots; the live `Pipeline` and a recording's `ReplaySource` are the two the
commands use (tests add scripted ones). Some sources can do more, and say so by the protocol they
follow, not by attributes a consumer probes for:

    Source      .machine, .poll() -> Snapshot, .close()          every source
    Attachable  .attach(pid), .want_stacks(wanted)               the live pipeline (follow a job)
    Focusable   .focus_sampling(focused)                         the live pipeline (denser samples for a while)
    Seekable    .pause() .resume() .seek(t) .set_speed(x), .position .duration .speed .paused,
                .generation, .drain(), .history_until()          a recording being replayed

What a snapshot says of the jobs is read in one way too (`jobs_of`, `JobTree.anchor`): the jobs `serve`
exports, `record` keeps and `report --from` diagnoses are the same trees.

`PollLoop` is the only poll loop: the TUI's collector thread, `report`, `record` and `demo --no-tui`
all run it. It polls, hands the batch over, and waits for the next tick; polls never overlap, a
slow poll delays the next tick instead of piling up, and `stop()` / `wake()` take effect at once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Protocol, Sequence, runtime_checkable

from gputop.model import JobTree, MachineInfo, Snapshot

if TYPE_CHECKING:
    from gputop.pipeline import Pipeline


def jobs_of(snapshot: Snapshot) -> tuple[JobTree, ...]:
    """The jobs a snapshot carries: `Snapshot.jobs` when it holds several (followed with their stacks, or
    with none followed the GPU processes grouped into jobs), else the one job in `Snapshot.job`."""
    if snapshot.jobs:
        return snapshot.jobs
    return (snapshot.job,) if snapshot.job is not None else ()


def for_job(snapshot: Snapshot, tree: Optional[JobTree]) -> Snapshot:
    """The snapshot as if `tree` were the only job followed (None: no job): what a job's diagnosis reads,
    the same from a live pipeline that follows several jobs as from a recording of it."""
    return replace(snapshot, job=tree, jobs=())


@runtime_checkable
class Source(Protocol):
    """Snapshots, one per `poll()`; `poll()` blocks (NVML, /proc, a file), so call it off any UI thread."""

    machine: MachineInfo

    def poll(self) -> Snapshot: ...

    def close(self) -> None: ...


@runtime_checkable
class Attachable(Protocol):
    """A live source that can follow a training job."""

    def attach(self, pid: int) -> None:
        """Follow the job behind `pid` from the next poll on; GputopError (and the old job kept) if it cannot."""

    def want_stacks(self, wanted: bool) -> None:
        """Dump the job's stacks only while someone shows or keeps them (py-spy costs the job a little)."""


@runtime_checkable
class Focusable(Protocol):
    """A live source whose sampling of the job can be made denser for a while."""

    def focus_sampling(self, focused: bool) -> None:
        """Sample the ranks' main threads densely while someone reads the shares closely (the findings screen)."""


@runtime_checkable
class Restarting(Protocol):
    """A live source that starts over now and then (the case study's next stage, a new job on the same machine);
    `narration` says where it stands (the header shows it)."""

    generation: int  # changes when it starts over: the reader starts its history over
    narration: str


@runtime_checkable
class OverPipeline(Protocol):
    """A source that polls a live pipeline of its own (a stepped clock, the case study's stages): what needs
    the live machine itself (the machine check's NVML and kernel readings) reads `live_pipeline`."""

    @property
    def live_pipeline(self) -> "Pipeline": ...


@runtime_checkable
class Seekable(Protocol):
    """A recording played back: its own clock, which the reader can pause, seek and speed up."""

    generation: int  # changes on every seek: a reader rebuilds its history from history_until()

    @property
    def position(self) -> float: ...

    @property
    def duration(self) -> float: ...

    @property
    def speed(self) -> float: ...

    @property
    def paused(self) -> bool: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def seek(self, position: float) -> None: ...

    def set_speed(self, speed: float) -> None: ...

    def drain(self) -> Sequence[Snapshot]:
        """Every snapshot passed since the previous drain (a fast replay keeps a complete history)."""

    def history_until(self) -> Sequence[Snapshot]:
        """The snapshots up to the current position (at most the source's window)."""


class Batch(NamedTuple):
    """What one tick of the loop produced."""

    snapshots: list[Snapshot]
    reset: bool = False  # a replay was sought: the reader starts its history over


class PollLoop:
    """Poll `source` every `interval` seconds until `stop()`, or until `seconds` have passed.

    `run(deliver)` polls at once, then on every tick (one more sample at the deadline, so a bounded
    run covers all of it). A Seekable source hands over every snapshot its clock passed; any other
    is polled once a tick. A poll that raises ends the loop, unless `on_error` takes the exception
    (the TUI shows it and keeps going). `interval` may be changed while it runs; `wake()` starts the
    next tick now (a new interval, a seek).
    """

    def __init__(
        self,
        source: Source,
        interval: float,
        *,
        seconds: Optional[float] = None,
        on_error: Optional[Callable[[Exception], None]] = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Optional[Callable[[float], None]] = None,
    ) -> None:
        """`clock` and `sleep` replace the monotonic clock and the wait between ticks (tests that run
        a loop on a fake clock); with `sleep`, `wake()` and `stop()` act after the current wait."""
        self.source = source
        self.interval = interval
        self.seconds = seconds
        self.on_error = on_error
        self._clock = clock
        self._sleep = sleep
        self._stop = threading.Event()
        self._wake = threading.Event()
        # what kind of source it is, decided once: a runtime Protocol check walks the protocol's members with
        # hasattr every time, and two a poll were a tenth of the collector thread's CPU in the TUI
        self._seekable = source if isinstance(source, Seekable) else None
        self._restarting = source if isinstance(source, Restarting) else None
        counted = self._seekable or self._restarting  # a source that says when it starts over
        self._generation = counted.generation if counted is not None else None
        self.started: Optional[float] = None
        self._first: Optional[threading.Thread] = None  # prefetch(): the first batch, taken ahead of run()
        self._first_result: Optional[tuple[Optional[Batch], Optional[Exception]]] = None
        self._first_taken = False  # take_prefetched() handed the first batch out: run() starts one interval on

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def stop_event(self) -> threading.Event:
        """Set once the loop is stopped: work that runs beside the loop (a timed check) waits on it."""
        return self._stop

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def elapsed(self) -> float:
        return 0.0 if self.started is None else self._clock() - self.started

    def prefetch(self) -> None:
        """Take the first batch now, on a thread of its own, ahead of `run()`.

        The TUI calls it before it loads Textual: the first poll then runs while the screen library
        loads, and the first frame can show it (`take_prefetched`) instead of waiting for a poll after.
        `run()` delivers the batch first if nobody took it, else waits one interval before polling."""
        if self._first is not None:
            return

        def take() -> None:
            try:
                self._first_result = (self.next_batch(), None)
            except Exception as exc:  # handed to whoever takes the batch, as that poll's failure
                self._first_result = (None, exc)

        self._first = threading.Thread(target=take, name="gputop-first-poll", daemon=True)
        self._first.start()

    def take_prefetched(self) -> Optional[Batch]:
        """The prefetched batch if it is ready now (never waits); None if there is none, it is still being
        taken (`run()` will deliver it), or it failed (`run()` will poll again)."""
        first = self._first
        if first is None or first.is_alive() or self._first_result is None:
            return None
        batch, _error = self._first_result
        if batch is None:
            return None
        self._first, self._first_result, self._first_taken = None, None, True
        return batch

    def prefetch_finished(self, timeout: float) -> bool:
        """Whether no prefetched poll is still running, after waiting up to `timeout` for it (a source may
        be closed only once no poll is inside it)."""
        first = self._first
        if first is not None:
            first.join(timeout)
            return not first.is_alive()
        return True

    def _first_batch(self) -> Optional[Batch]:
        """The prefetched batch, waited for (None: stopped meanwhile, or prefetched but taken already)."""
        first, self._first = self._first, None
        while first is not None and first.is_alive():  # a hung first poll must not keep stop() from ending the loop
            if self._stop.wait(0.05):
                return None
        result, self._first_result = self._first_result, None
        if result is None:  # nothing prefetched, or the thread died without a result (BaseException)
            return None if self._first_taken else self.next_batch()
        batch, error = result
        if error is not None:
            raise error
        return batch

    def next_batch(self) -> Batch:
        seekable, restarting = self._seekable, self._restarting
        if seekable is not None:
            generation = seekable.generation
            if generation != self._generation:
                self._generation = generation
                return Batch(list(seekable.history_until()), reset=True)
            return Batch(list(seekable.drain()))
        if restarting is not None:
            generation = restarting.generation  # read before the poll: a restart under it resets the next batch
            snapshot = restarting.poll()
            reset, self._generation = generation != self._generation, generation
            return Batch([snapshot], reset=reset)
        return Batch([self.source.poll()])

    def run(self, deliver: Callable[[Batch], None]) -> None:
        start = self.started = self._clock()
        deadline = None if self.seconds is None else start + self.seconds
        next_tick = start
        first = True
        while not self._stop.is_set():
            try:
                batch = self._first_batch() if first else self.next_batch()
            except Exception as exc:
                if self._stop.is_set():
                    return  # the source was closed under a poll on the way out
                if self.on_error is None:
                    raise
                self.on_error(exc)
            else:
                if batch is not None and (batch.snapshots or batch.reset):
                    deliver(batch)
            first = False
            now = self._clock()
            if deadline is not None and now >= deadline:
                return
            # the next tick on the cadence; after a poll slower than the interval, now (never a burst)
            next_tick = max(next_tick + self.interval, now)
            wait = (next_tick if deadline is None else min(next_tick, deadline)) - now
            if wait > 0 and self._sleep is not None:
                self._sleep(wait)
                woken = self._wake.is_set()
            else:
                woken = wait <= 0 or self._wake.wait(wait)
            if woken:
                self._wake.clear()  # woken (new interval, a seek): the cadence starts over from here
                next_tick = self._clock()

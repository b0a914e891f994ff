"""The live pipeline while NVML starts, so that the monitor's first frame never waits for it.

On a real machine without persistence mode, `nvmlInit` and the static reads (names, bus IDs, links,
topology) can take seconds.  `StartingPipeline` builds the `Pipeline` on a thread of its own (ctypes releases
the GIL during the driver's calls) and, until it is built, answers polls with the host's side alone: the CPU
heatmap from psutil and, with a PID, the job tree from /proc, no GPUs (the cards say "reading GPUs…").

The monitor holds the build (`held=True`) until its first frame is on the terminal (`release`): the build
is ~40 ms of Python before any driver call (importing pynvml and the collectors, assembling the pipeline;
more with the simulated NVML), and on a thread beside the first frame it takes that much from the frame
under the one GIL, more on a loaded box where the two threads hand the GIL to each other.  Measured with
`--simulate` (CPU the process had used at its first frame, medians): 0.23 s built at once, 0.19-0.20 s held
(a one-widget Textual app: 0.16-0.17 s).  The price: where `nvmlInit` takes seconds, the cards come that
much plus the first frame's ~0.2 s after start, not the `nvmlInit` alone.

From its first poll after the build it is the pipeline: the snapshot is the pipeline's, and `machine`
becomes the pipeline's machine (read by the poller between polls, so it always belongs to the snapshots that
follow).

Nothing here imports Textual: it is a `Source` like any other.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

from gputop.errors import GputopError
from gputop.model import MachineInfo, Snapshot

if TYPE_CHECKING:
    from gputop.collect.host import HostCollector
    from gputop.collect.job_tree import JobCollector
    from gputop.pipeline import Pipeline

HELD_AT_MOST_S = 3.0  # a held build starts by itself after this long (a caller that never releases it)

# Builds the pipeline around the host collector (and the job's collector, with a PID) already polling.
BuildPipeline = Callable[["HostCollector", "Optional[JobCollector]"], "Pipeline"]


class StartingPipeline:
    """A `Source` (and Attachable, Focusable) that is the host's side until `build` has returned the pipeline."""

    def __init__(
        self,
        build: BuildPipeline,
        *,
        pid: Optional[int] = None,
        stack_interval: float = 2.0,
        simulated: Optional[str] = None,
        clock: Callable[[], float] = time.time,
        held: bool = False,
    ) -> None:
        """`pid`: the job to follow from the start (its collector is made on the build thread at once, before
        the pipeline, and handed to `build`); `simulated`: the `--simulate` spec, for the header's tag meanwhile;
        `held`: `build` waits for `release()` (or HELD_AT_MOST_S)."""
        from gputop.collect.host import HostCollector

        self._host = HostCollector()
        self._clock = clock
        self._simulated = simulated is not None
        self._provisional = MachineInfo(
            hostname=self._host.hostname,
            cpu_model=self._host.cpu_model,
            cpu_count=self._host.cpu_count,
            simulated=simulated,
        )
        self.machine: MachineInfo = self._provisional
        self.pipeline: Optional[Pipeline] = None  # once built
        self.failure: Optional[Exception] = None  # why it could not be built (raised by every poll)
        self._job: Optional[JobCollector] = None
        self._stacks_wanted = True
        self._focused = False
        self._lock = threading.Lock()  # close() against the build's end
        self._closed = False
        self._built = threading.Event()  # set when the build has ended, built or failed
        self._released = threading.Event()  # the build may start
        if not held:
            self._released.set()
        self._when_built: list[Callable[[], None]] = []
        self._builder = threading.Thread(
            target=self._build, args=(build, pid, stack_interval), name="gputop-pipeline-start", daemon=True
        )
        self._builder.start()

    @property
    def reading_gpus(self) -> bool:
        """True until the first poll that the pipeline answered."""
        return self.machine is self._provisional

    def _build(self, build: BuildPipeline, pid: Optional[int], stack_interval: float) -> None:
        job = None
        try:
            if pid is not None:
                from gputop.collect.job_tree import JobCollector

                job = self._job = JobCollector(pid, stack_interval=stack_interval, stacks_wanted=self._stacks_wanted)
            self._released.wait(HELD_AT_MOST_S)
            if self._closed:  # closed while held (the monitor ended before its first frame): build nothing
                self._job = None
                if job is not None:
                    job.close()
                self._host.close()
                self._ended()
                return
            pipeline = build(self._host, job)
        except Exception as exc:  # raised by the next poll: the monitor ends with it (Monitor._poll_failed)
            self._job = None
            if job is not None:
                job.close()
            self.failure = exc
            self._ended()
            return
        with self._lock:
            if not self._closed:
                self.pipeline = pipeline
        if self.pipeline is None:  # closed while it was built: nobody will poll it
            pipeline.close()
        self._ended()

    def _ended(self) -> None:
        with self._lock:
            self._built.set()
            callbacks, self._when_built = self._when_built, []
        for callback in callbacks:
            callback()

    def release(self) -> None:
        """Let a held build start (the monitor calls it once its first frame is on the terminal)."""
        self._released.set()

    @property
    def released(self) -> bool:
        """Whether the build may start (released, or never held)."""
        return self._released.is_set()

    def when_built(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the build thread) once the build has ended, or now if it has: a poller wakes
        up to take the first GPU sample at once instead of at its next tick."""
        with self._lock:
            if not self._built.is_set():
                self._when_built.append(callback)
                return
        callback()

    def wait_built(self, timeout: float) -> bool:
        """Whether the build has ended (built or failed), waiting up to `timeout`."""
        return self._built.wait(timeout)

    def raise_if_failed(self) -> None:
        """The build's error, if it has failed already (a bad spec fails before a frame is drawn)."""
        if self.failure is not None:
            raise self.failure

    # ------------------------------------------------------------------ Source
    def poll(self) -> Snapshot:
        pipeline = self.pipeline
        if pipeline is not None:
            if self.machine is self._provisional:
                pipeline.want_stacks(self._stacks_wanted)  # what was asked of the job meanwhile
                pipeline.focus_sampling(self._focused)
                self.machine = pipeline.machine
            return pipeline.poll()
        if self.failure is not None:
            raise self.failure
        host = self._host.sample()
        now = self._clock()
        job = self._job
        tree = job.collect((), now) if job is not None else None  # no GPUs yet: ranks without theirs
        return Snapshot(timestamp=now, host=host, job=tree, simulated=self._simulated)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pipeline = self.pipeline
        self._released.set()  # a held build ends at once
        if pipeline is not None:
            pipeline.close()  # it closes the host's and the job's collectors too
        elif self._built.is_set():  # failed: only the host collector is left
            self._host.close()
        # else: the build is still running (a hung nvmlInit); it closes what it built when it returns

    # ------------------------------------------------------------------ Attachable, Focusable
    def attach(self, pid: int) -> None:
        pipeline = self.pipeline
        if pipeline is None:
            raise GputopError("the GPUs are still being read; try again in a moment")
        pipeline.attach(pid)

    def want_stacks(self, wanted: bool) -> None:
        self._stacks_wanted = wanted
        pipeline, job = self.pipeline, self._job
        if pipeline is not None:
            pipeline.want_stacks(wanted)
        elif job is not None:
            job.stacks_wanted = wanted

    def focus_sampling(self, focused: bool) -> None:
        self._focused = focused
        pipeline, job = self.pipeline, self._job
        if pipeline is not None:
            pipeline.focus_sampling(focused)
        elif job is not None:
            job.focus_sampling(focused)

"""What the headless commands that watch a while share: the live source, the watch, a progress bar.

`report` observes for a while and keeps everything; `record` observes until told to stop and keeps
next to nothing (every snapshot goes to the file). Both run the one poll loop (`source.PollLoop`).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Callable, Optional, TextIO

from gputop.history import History
from gputop.model import Snapshot
from gputop.signals import StopSignals
from gputop.source import Batch, PollLoop, Source

if TYPE_CHECKING:
    from gputop.pipeline import Pipeline

BAR_WIDTH = 30


class Progress:
    """A one-line progress bar on a terminal; silent when the stream is not a terminal (pipes, CI logs)."""

    def __init__(self, stream: TextIO, what: str) -> None:
        self.stream = stream
        self.what = what
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        self._shown = False

    def update(self, fraction: float, message: str = "") -> None:
        if not self.enabled:
            return
        fraction = max(0.0, min(1.0, fraction))
        filled = int(round(fraction * BAR_WIDTH))
        bar = "█" * filled + "░" * (BAR_WIDTH - filled)
        self.stream.write(f"\r{self.what} {bar} {100 * fraction:3.0f}% {message}\x1b[K")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


def live_source(args: argparse.Namespace) -> Pipeline:
    """The live pipeline a command asked for; with --pid, stacks are collected the whole time (kept)."""
    from gputop.pipeline import pipeline_from_args  # lazy: a --from report needs no collectors

    pipeline = pipeline_from_args(args)
    pipeline.want_stacks(True)
    return pipeline


def observe(
    source: Source,
    seconds: float,
    interval: float,
    *,
    on_snapshot: Optional[Callable[[Snapshot], None]] = None,
    progress: Optional[Progress] = None,
    capacity: Optional[int] = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Optional[Callable[[float], None]] = None,
) -> History:
    """Poll `source` every `interval` s for `seconds` s (one sample at the start and one at the end).

    The history keeps every sample (a report needs them all), or the last `capacity` when given (a
    recording streams its samples to `on_snapshot` and must not hold them: memory stays flat).
    Ctrl-C ends the observation early and keeps what was collected.
    """
    history = History(source.machine, capacity=capacity or int(seconds / interval) + 16)
    loop = PollLoop(source, interval, seconds=seconds, clock=clock, sleep=sleep)
    samples = 0

    def keep(batch: Batch) -> None:
        nonlocal samples
        for snap in batch.snapshots:
            history.append(snap)
            samples += 1
            if on_snapshot is not None:
                on_snapshot(snap)
        if progress is not None:
            elapsed = loop.elapsed()
            progress.update(elapsed / seconds if seconds > 0 else 1.0, f"{elapsed:.0f}/{seconds:.0f} s")

    try:
        with StopSignals():
            loop.run(keep)
    except KeyboardInterrupt:
        if not samples:
            raise
        print(f"\ngputop: interrupted after {samples} samples", file=sys.stderr)
    finally:
        if progress is not None:
            progress.done()
    return history

"""One freeze detector: did a process's main thread move between two of its dumps?

Three places ask it, and all ask here: the hang check (`checks.hang.frozen_run`: how long a stack has
stood still), the collector (`collect.stack_schedule.FreezeWatch`: when a frozen main thread is due its
one native dump) and the exporter (`gputop_rank_last_progress_timestamp_seconds`: when a rank last moved).

Each asks it the same way: from the dump where the thread was last seen to move (the freeze's start)
to the newest one, never only between the last two dumps: a thread woken once every two seconds shows
one switch in half the one-second pairs, and would look alive in those, while over the freeze it wakes
at half the rate that counts as life.  `freeze_start` keeps that start for the watchers that follow
dumps as they come; `checks.hang.frozen_run` looks back over a window for the earliest one.

Equal stacks alone do not say a thread stood still: a loop waiting for data shows the same frames in
every dump.  A thread moved when its stack stands at another place, or when the progress counters read
beside the dumps show life (`observations.Movement.alive`: it woke, used CPU or moved bytes at the rates
in `thresholds`).  Where a dump carries no counters (an older collector or recording) the counters
cannot tell; a caller may then let the process's CPU use speak (`cpu_percent`).
"""

from __future__ import annotations

from typing import Optional

from gputop.analysis.observations import StackSample, movement, stack_sample
from gputop.analysis.stack_classes import main_thread
from gputop.model import ProcessStacks

# Where the dumps carry no counters, a main thread with the same stack counts as moved if its process
# used this much CPU (percent of one core) meanwhile.
PROGRESS_CPU_PERCENT = 1.0


def main_thread_sample(stacks: ProcessStacks) -> Optional[StackSample]:
    """The main thread of one dump as the detector compares it (None: the dump failed or shows no thread)."""
    if stacks.error is not None:
        return None
    thread = main_thread(stacks)
    if thread is None:
        return None
    return stack_sample(stacks, thread, None, thread.frames)


def same_place(before: StackSample, after: StackSample) -> bool:
    """Both dumps show the main thread at the same place: the same frames, in the same state."""
    return before.signature == after.signature and before.state == after.state


def main_thread_moved(
    pid: int,
    before: StackSample,
    after: StackSample,
    *,
    cpu_counts: bool = True,
    io_counts: bool = True,
    cpu_percent: Optional[float] = None,
) -> Optional[bool]:
    """True: the main thread of `pid` moved from `before` to `after`; False: it stood still; None: the
    stacks are equal and nothing says more (no counters, and no `cpu_percent` given).

    `cpu_counts=False` where CPU time is no evidence of life (CUDA spin-waits at a sync); `io_counts=False`
    where other threads' I/O would speak for this one (see `Movement.alive`)."""
    if not same_place(before, after):
        return True
    counters = movement(pid, before, after)
    if counters is None:
        return None if cpu_percent is None else cpu_percent >= PROGRESS_CPU_PERCENT
    return counters.alive(cpu_counts=cpu_counts, io_counts=io_counts)


def freeze_start(
    pid: int,
    start: Optional[StackSample],
    sample: StackSample,
    *,
    cpu_counts: bool = True,
    io_counts: bool = True,
    cpu_percent: Optional[float] = None,
) -> StackSample:
    """Where the main thread's freeze began, after the newer dump `sample`: `start` while the thread stood
    still from it to `sample`, else `sample` (it moved, or nothing tells: a new freeze starts there)."""
    if start is None:
        return sample
    moved = main_thread_moved(pid, start, sample, cpu_counts=cpu_counts, io_counts=io_counts, cpu_percent=cpu_percent)
    return start if moved is False else sample

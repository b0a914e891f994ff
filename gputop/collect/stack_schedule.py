"""Which processes each stack round dumps, and when.

py-spy costs ~15 ms of CPU per dump (mostly reading libpython's symbols), so dumping every process of
a job of 8 ranks x 3 epoch-restarting workers every 2 s kept a fifth of a core busy.  The ranks' main
threads carry the diagnosis (waiting for data, forward/backward, collective) and are dumped every
round; DataLoader workers and the launcher take turns, and one that used no CPU since a dump that
showed no change waits longer still (yet not forever: a worker hung in dataset code is a finding).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from gputop.analysis.freeze import freeze_start, main_thread_sample
from gputop.analysis.observations import StackSample
from gputop.collect.procfs import ProcKey, Tracked
from gputop.model import ProcessStacks, ThreadStack

OTHERS_EVERY_ROUNDS = 3  # workers and the launcher: each dumped about once in this many rounds
IDLE_EVERY_ROUNDS = 5  # ... at most this rarely when it sat still (no CPU, unchanged stacks)
IDLE_CPU_TICKS = 1  # "no CPU": at most one clock tick (10 ms) since its last dump


@dataclass
class _DumpRecord:
    round: int  # the round of its last dump
    cpu_ticks: int  # its CPU time at that dump
    threads: Optional[tuple[ThreadStack, ...]]  # the threads that dump found (None: it failed)
    unchanged: bool  # that dump found the same threads as the one before


class StackSchedule:
    """Chooses the processes each stack round dumps: every rank, plus the workers' and launcher's turn."""

    def __init__(self) -> None:
        self.round = 0
        self._records: dict[ProcKey, _DumpRecord] = {}

    def plan(self, ranks: list[Tracked], others: list[Tracked], *, full: bool = False) -> list[Tracked]:
        """Ranks always; of `others` (workers, launcher) a third, never-dumped ones first, then the
        longest-waiting; one that sat still is skipped until IDLE_EVERY_ROUNDS passed.  `full`: all."""
        live = {t.key for t in ranks} | {t.key for t in others}
        for key in [k for k in self._records if k not in live]:
            del self._records[key]
        if full or self.round == 0:
            return ranks + others
        queue = []
        for tracked in others:
            record = self._records.get(tracked.key)
            if record is None:
                queue.append((0, 0, tracked))  # a new worker (an epoch started): show it soon
                continue
            age = self.round - record.round
            sat_still = record.unchanged and tracked.cpu_ticks - record.cpu_ticks <= IDLE_CPU_TICKS
            if sat_still and age < IDLE_EVERY_ROUNDS:
                continue  # nothing it ran could have moved its stack: the last one still holds
            queue.append((1, -age, tracked))
        queue.sort(key=lambda item: item[:2])
        turn = -(-len(others) // OTHERS_EVERY_ROUNDS)
        return ranks + [tracked for *_, tracked in queue[:turn]]

    def done(self, dumped: list[Tracked], fresh: dict[int, ProcessStacks]) -> None:
        """Remember what this round found; the next round is one later."""
        for tracked in dumped:
            stacks = fresh.get(tracked.key[0])
            if stacks is None:
                continue
            before = self._records.get(tracked.key)
            threads = stacks.threads if stacks.error is None else None
            unchanged = threads is not None and before is not None and before.threads == threads
            self._records[tracked.key] = _DumpRecord(self.round, tracked.cpu_ticks, threads, unchanged)
        self.round += 1


# ----------------------------------------------------------------- when to take a native dump

# A main thread whose Python stack has not changed for this long, while its progress counters stood
# still, gets one `py-spy dump --native` (a short pause) to name the C frame it waits in:
# cudaStreamSynchronize, an NCCL kernel wait, a futex.
NATIVE_AFTER_S = 10.0
# A rank whose main thread has stood still this long gets the job's flight recorders read in-process
# (`gputop.inject.fr_read`), where the recorder is on and no dump file is written: a healthy step moves its
# main thread many times a second, and a hang's finding needs the read done within a 12 s report.
LIVE_READ_AFTER_S = 3.0


@dataclass
class _Freeze:
    start: StackSample  # the main thread in the first dump of the freeze (its counters: after the native dump)
    since: float  # that dump's timestamp
    native_taken: bool = False


class FreezeWatch:
    """Follows each process's main thread across regular dumps and says when one is due its single
    native dump: it stood still (`gputop.analysis.freeze`, the judgement the hang check makes: the same
    Python frames, and no wake-up or I/O of the main thread) for `after` seconds.  CPU time is not asked
    to stand still: CUDA spin-waits at a sync by default, so a rank stuck in `.item()` behind a hung
    collective burns a core.  A dump without counters ends the freeze (nothing tells a slow thread from
    a stuck one then)."""

    def __init__(self, after: float = NATIVE_AFTER_S) -> None:
        self.after = after
        self._freezes: dict[ProcKey, _Freeze] = {}

    def observe(self, key: ProcKey, stacks: ProcessStacks) -> bool:
        """Take in a fresh regular dump of the process `key`; True when it is due its native dump now."""
        sample = main_thread_sample(stacks)
        if sample is None or sample.progress is None:
            self._freezes.pop(key, None)
            return False
        freeze = self._freezes.get(key)
        start = freeze_start(key[0], freeze.start if freeze else None, sample, cpu_counts=False)
        if freeze is None or start is sample:
            self._freezes[key] = _Freeze(sample, sample.timestamp)
            return False
        return not freeze.native_taken and sample.timestamp - freeze.since >= self.after

    def taken(self, key: ProcKey, native: ProcessStacks) -> None:
        """The native dump was taken.  Its pause (ptrace) itself costs the target context switches, so the
        freeze goes on from the counters read right after it: one native dump per freeze, not one per 10 s."""
        freeze = self._freezes.get(key)
        if freeze is None:
            return
        freeze.native_taken = True
        if native.progress is not None and native.timestamp >= freeze.start.timestamp:
            freeze.start = replace(freeze.start, timestamp=native.timestamp, progress=native.progress)

    def frozen_for(self, key: ProcKey, at: float) -> float:
        """How long (seconds, up to the dump taken at `at`) this process's main thread has stood still; 0 while it moves."""
        freeze = self._freezes.get(key)
        return max(0.0, at - freeze.since) if freeze is not None else 0.0

    def frozen(self, key: ProcKey) -> bool:
        """Has this process's native dump been taken in a freeze that still lasts?"""
        freeze = self._freezes.get(key)
        return freeze is not None and freeze.native_taken

    def forget_except(self, live: set[ProcKey]) -> None:
        for key in [k for k in self._freezes if k not in live]:
            del self._freezes[key]

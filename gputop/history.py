"""Bounded history of snapshots: memory stays flat however long gputop runs."""

from __future__ import annotations

from collections import deque
from typing import Iterator, Optional

from gputop.model import MachineInfo, Snapshot

DEFAULT_CAPACITY = 600  # 10 minutes at the default 1 s interval


class History:
    """A ring buffer of snapshots plus the machine they came from.

    Snapshots share unchanged sub-objects (a stack dump refreshed every 2 s is
    referenced, not copied, by the 1 s snapshots between refreshes; a GPU's
    NVLink wiring and every reading equal to the previous sample's are one
    object), so the buffer's size is the per-GPU numbers that move: about
    7.7 KB a snapshot of 8 H100s, 4.4 MiB at the default capacity
    (benchmarks/bench_history_memory.py).
    """

    def __init__(self, machine: MachineInfo, capacity: int = DEFAULT_CAPACITY) -> None:
        self.machine = machine
        self.capacity = capacity
        self._snapshots: deque[Snapshot] = deque(maxlen=capacity)

    def copy(self) -> "History":
        """A History of its own with the same snapshots (references: snapshots are frozen), for a thread to
        read while this one keeps growing."""
        copy = History(self.machine, self.capacity)
        copy._snapshots = self._snapshots.copy()
        return copy

    def append(self, snapshot: Snapshot) -> None:
        self._snapshots.append(snapshot)

    def __len__(self) -> int:
        return len(self._snapshots)

    def __iter__(self) -> Iterator[Snapshot]:
        return iter(self._snapshots)

    @property
    def latest(self) -> Optional[Snapshot]:
        return self._snapshots[-1] if self._snapshots else None

    def window(self, seconds: float) -> list[Snapshot]:
        """Snapshots from the last `seconds` of history (by snapshot timestamp)."""
        if not self._snapshots:
            return []
        cutoff = self._snapshots[-1].timestamp - seconds
        out = [s for s in reversed(self._snapshots) if s.timestamp >= cutoff]
        out.reverse()
        return out

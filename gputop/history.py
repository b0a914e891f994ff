"""Bounded history of snapshots: memory stays flat however long gputop runs."""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import Iterator, Optional

from gputop.model import MachineInfo, Snapshot

DEFAULT_CAPACITY = 600  # 10 minutes at the default 1 s interval


class History:
    """A ring buffer of snapshots plus the machine they came from.

    Snapshots share unchanged sub-objects (a stack dump refreshed every 2 s is
    referenced, not copied, by the 1 s snapshots between refreshes; a GPU's
    NVLink wiring and every reading equal to the previous sample's are one
    object), so the buffer's size is the per-GPU numbers that move
    (benchmarks/bench_history_memory.py: ~15.8 KB a snapshot of 8 H100s with their NICs).

    `dense`: keep only the newest `dense` snapshots at full rate; older ones are thinned to one every
    `sparse_every_s` seconds, still within the span of `capacity` snapshots at full rate.  The TUI's history
    does this: its sparklines and the diagnosis read the last few minutes at full rate, and only the
    long-hiccup search reads further back, already one snapshot per 5 s.  It holds 288 snapshots for 10
    minutes instead of 600.  None (the default): every snapshot is kept.
    """

    def __init__(
        self, machine: MachineInfo, capacity: int = DEFAULT_CAPACITY, *, dense: Optional[int] = None, sparse_every_s: float = 5.0
    ) -> None:
        self.machine = machine
        self.capacity = capacity
        self.dense = dense if dense is not None and dense < capacity else None
        self.sparse_every_s = sparse_every_s
        self._snapshots: deque[Snapshot] = deque(maxlen=self.dense or capacity)
        # the thinned older part, oldest first; its length bound keeps the span `capacity` snapshots would cover
        sparse_len = 0 if self.dense is None else max(1, math.ceil((capacity - self.dense) / max(1.0, sparse_every_s)))
        self._sparse: deque[Snapshot] = deque(maxlen=sparse_len)

    def copy(self) -> "History":
        """A History of its own with the same snapshots (references: snapshots are frozen), for a thread to
        read while this one keeps growing."""
        copy = History(self.machine, self.capacity, dense=self.dense, sparse_every_s=self.sparse_every_s)
        copy._snapshots = self._snapshots.copy()
        copy._sparse = self._sparse.copy()
        return copy

    def append(self, snapshot: Snapshot) -> None:
        snapshots = self._snapshots
        if self.dense is not None and len(snapshots) == snapshots.maxlen:
            leaving = snapshots[0]  # pushed out of the full-rate part: kept if it starts a new sparse step
            if not self._sparse or leaving.timestamp - self._sparse[-1].timestamp >= self.sparse_every_s - 1e-6:
                self._sparse.append(leaving)
        snapshots.append(snapshot)

    def __len__(self) -> int:
        return len(self._sparse) + len(self._snapshots)

    def __iter__(self) -> Iterator[Snapshot]:
        return itertools.chain(self._sparse, self._snapshots)

    @property
    def latest(self) -> Optional[Snapshot]:
        return self._snapshots[-1] if self._snapshots else None

    def window(self, seconds: float) -> list[Snapshot]:
        """Snapshots from the last `seconds` of history (by snapshot timestamp)."""
        if not self._snapshots:
            return []
        cutoff = self._snapshots[-1].timestamp - seconds
        out = [s for s in itertools.chain(reversed(self._snapshots), reversed(self._sparse)) if s.timestamp >= cutoff]
        out.reverse()
        return out

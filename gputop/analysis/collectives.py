"""Which collective a hung job waits in, from its ranks' flight recorders: aligned by process group and
sequence id as PyTorch's own ``fr_trace`` does, live.  Pure: `FlightRecord`s in, a `CollectiveWait` out.

Within a process group every rank numbers its collectives alike (``collective_seq_id`` from 1), so the
rank that waits longest waits in the lowest pending sequence id of its group.  For that id, each member:

- entered it: its recorder holds that id, with the same op and sizes as the ranks that agree most;
- entered another collective under that id (a mismatch: a broadcast where the others all-reduce), or the
  same op with other sizes;
- is missing: its recorder never reached that id (it is stuck in its own code, stopped, or gone);
- is unknown: no readable record of it.

Without recorders, `stack_groups` groups the ranks by where their main threads stand: the many that wait
in one collective frame against the few that do not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from gputop.model import CollectiveEntry, FlightRecord

# how to turn the recorder on so gputop can read it live: from inside the ranks once one stands still
# (gputop.inject.fr_read), or from the dumps the job writes (gputop.collect.flight_recorder)
ENABLE_HINT = (
    "export TORCH_FR_BUFFER_SIZE=2000  # flight recorder: gputop reads it from inside the ranks once they stand still, "
    "or the dumps the job writes ($TORCH_FR_DUMP_TEMP_FILE<rank>; see docs/hangs.md)"
)


@dataclass(frozen=True)
class CollectiveWait:
    """The collective a process group waits in, and each member's part in it."""

    op: str
    seq: int
    process_group: str
    group_desc: str
    sizes: tuple[tuple[int, ...], ...]
    dtype: Optional[str]
    members: tuple[int, ...]
    entered: tuple[int, ...]
    missing: tuple[int, ...]
    mismatched: dict[int, str] = field(default_factory=dict)  # rank -> the op it entered instead
    other_sizes: dict[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)  # rank -> its sizes (same op)
    unknown: tuple[int, ...] = ()  # members with no readable record
    last_seq: dict[int, int] = field(default_factory=dict)  # rank -> the last sequence id its recorder holds
    timeout_ms: Optional[int] = None
    since: Optional[float] = None  # when the first rank entered it (seconds since the epoch)
    frames: tuple[str, ...] = ()  # where the entered ranks called it, innermost first

    @property
    def broken(self) -> bool:
        """Some member did not enter it as the others did."""
        return bool(self.missing or self.mismatched or self.other_sizes)

    def waited(self, now: float) -> Optional[float]:
        return max(0.0, now - self.since) if self.since else None

    def figures(self, now: Optional[float] = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "op": self.op,
            "seq": self.seq,
            "process_group": self.process_group,
            "group_desc": self.group_desc,
            "sizes": [list(s) for s in self.sizes],
            "dtype": self.dtype,
            "entered": list(self.entered),
            "missing": list(self.missing),
            "mismatched": {str(r): op for r, op in self.mismatched.items()},
            "other_sizes": {str(r): [list(s) for s in sizes] for r, sizes in self.other_sizes.items()},
            "unknown": list(self.unknown),
            "last_seq": {str(r): s for r, s in self.last_seq.items()},
            "timeout_ms": self.timeout_ms,
        }
        if now is not None:
            waited = self.waited(now)
            out["waited_s"] = round(waited, 1) if waited is not None else None
            if waited is not None and self.timeout_ms:
                out["killed_in_s"] = round(max(0.0, self.timeout_ms / 1000.0 - waited), 1)
        return out

    def line(self) -> str:
        """One line: "gloo:all_reduce #4 (group 0:default_pg, [1024] Float): ranks 0, 1 entered; rank 2 never did"."""
        shape = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in self.sizes) or "no tensors"
        parts = [f"{_ranks(self.entered)} entered" if self.entered else "no rank entered"]
        if self.missing:
            parts.append(f"{_ranks(self.missing)} never did")
        parts += [f"rank {r} entered {op} instead" for r, op in sorted(self.mismatched.items())]
        parts += [f"rank {r} entered it with sizes {_shape(s)}" for r, s in sorted(self.other_sizes.items())]
        if self.unknown:
            parts.append(f"{_ranks(self.unknown)}: no recorder read")
        group = f"{self.process_group}:{self.group_desc}" if self.group_desc else self.process_group
        return f"{self.op} #{self.seq} (group {group}, {shape} {self.dtype or ''}".rstrip() + "): " + "; ".join(parts)


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _shape(sizes: tuple[tuple[int, ...], ...]) -> str:
    return ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sizes)


def _members(group: str, records: Sequence[FlightRecord]) -> tuple[int, ...]:
    for rec in records:
        for name, ranks in rec.groups:
            if name == group and ranks:
                return tuple(sorted(ranks))
    return tuple(sorted(r.rank for r in records if r.rank is not None))


def align_group(group: str, records: Mapping[int, FlightRecord]) -> Optional[CollectiveWait]:
    """The collective `group` waits in (its lowest pending sequence id), or None when nothing is pending."""
    valid = [r for r in records.values() if r.error is None]
    by_rank: dict[int, dict[int, CollectiveEntry]] = {
        rank: {e.seq: e for e in rec.entries if e.process_group == group} for rank, rec in records.items() if rec.error is None
    }
    pending = [e.seq for entries in by_rank.values() for e in entries.values() if not e.done]
    if not pending:
        return None
    seq = min(pending)
    at_seq = {rank: entries[seq] for rank, entries in by_rank.items() if seq in entries}
    votes = Counter((e.op, e.sizes) for e in at_seq.values())
    # the op and sizes most ranks entered; on a tie, the lowest rank's
    top = max(votes.values())
    op, sizes = next((e.op, e.sizes) for _r, e in sorted(at_seq.items()) if votes[(e.op, e.sizes)] == top)
    members = _members(group, valid) or tuple(sorted(records))
    entered, missing, unknown = [], [], []
    mismatched: dict[int, str] = {}
    other_sizes: dict[int, tuple[tuple[int, ...], ...]] = {}
    for rank in members:
        if rank not in by_rank:
            unknown.append(rank)
        elif rank not in at_seq:
            missing.append(rank)
        elif at_seq[rank].op != op:
            mismatched[rank] = at_seq[rank].op
        elif at_seq[rank].sizes != sizes:
            other_sizes[rank] = at_seq[rank].sizes
        else:
            entered.append(rank)
    agreeing = [at_seq[r] for r in entered] or list(at_seq.values())
    first = min(agreeing, key=lambda e: e.created)
    return CollectiveWait(
        op=op,
        seq=seq,
        process_group=group,
        group_desc=first.group_desc,
        sizes=sizes,
        dtype=first.dtypes[0] if first.dtypes else None,
        members=members,
        entered=tuple(entered),
        missing=tuple(missing),
        mismatched=mismatched,
        other_sizes=other_sizes,
        unknown=tuple(unknown),
        last_seq={rank: max(entries, default=0) for rank, entries in sorted(by_rank.items())},
        timeout_ms=first.timeout_ms,
        since=first.created or None,
        frames=first.frames,
    )


def align(records: Sequence[FlightRecord]) -> list[CollectiveWait]:
    """The collectives the job's process groups wait in, the broken ones first, then the longest waiting."""
    by_rank = {r.rank: r for r in records if r.rank is not None}
    groups = sorted({e.process_group for r in by_rank.values() if r.error is None for e in r.entries})
    waits = [w for w in (align_group(g, by_rank) for g in groups) if w is not None]
    return sorted(waits, key=lambda w: (not w.broken, w.since or 0.0))


def last_collectives(record: FlightRecord) -> list[tuple[str, str, CollectiveEntry]]:
    """Per process group: ("completed", its last completed collective) and ("pending", the first it waits in)."""
    out = []
    for group in sorted({e.process_group for e in record.entries}):
        mine = sorted((e for e in record.entries if e.process_group == group), key=lambda e: e.seq)
        done = [e for e in mine if e.done]
        pending = [e for e in mine if not e.done]
        if done:
            out.append((group, "completed", done[-1]))
        if pending:
            out.append((group, "pending", pending[0]))
    return out


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose main threads stand at the same innermost frame."""

    frame: str
    ranks: tuple[int, ...]


def stack_groups(frames_by_rank: Mapping[int, str]) -> tuple[Optional[StackGroup], list[StackGroup]]:
    """(the largest group, the others): without a recorder, the many ranks waiting at one frame against the
    few elsewhere (the outliers, each group with its frame).  No majority group when every rank stands alone."""
    groups: dict[str, list[int]] = {}
    for rank, frame in sorted(frames_by_rank.items()):
        groups.setdefault(frame, []).append(rank)
    ordered = sorted((StackGroup(f, tuple(r)) for f, r in groups.items()), key=lambda g: (-len(g.ranks), g.ranks))
    if not ordered or len(ordered[0].ranks) < 2:
        return None, ordered
    return ordered[0], ordered[1:]

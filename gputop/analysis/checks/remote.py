"""Waiting for another node: every rank here spends most of its time in collectives, still moving, while
the job has ranks on other machines.  Nothing here holds the job back; a rank elsewhere does (a straggler
or a slow link there), and only a view across nodes can name it (`gputop report --prometheus`).
A frozen wait is the hang check's (`checks.hang.remote_holdup`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gputop.analysis.checks.hang import makes_progress
from gputop.analysis.numbers import Share
from gputop.analysis.observations import Context, RankObs
from gputop.analysis.stack_classes import COLLECTIVE
from gputop.analysis.thresholds import INPUT_BOUND_HIGH
from gputop.model import LABEL_CODE, Finding

# Every rank here waits in collectives at least this share of its time (its interval's low end): the
# job's pace is set elsewhere.
REMOTE_WAIT_MIN_SHARE = 0.5


@dataclass(frozen=True)
class RemoteWait:
    """What was decided (no wording): the ranks here, their collective shares, and the job beyond them."""

    ranks: tuple[RankObs, ...]
    shares: tuple[Share, ...]  # each rank's share of time in a collective
    world_size: int
    node_rank: Optional[int]
    nnodes: Optional[int]
    job_id: Optional[str]


def remote_wait(ctx: Context) -> Optional[RemoteWait]:
    ranks = tuple(sorted(ctx.ranks.values(), key=lambda r: (r.rank is None, r.rank, r.pid)))
    world = max((r.world_size for r in ranks if r.world_size), default=0)
    if not ranks or world <= len(ranks) or any(r.last is not None and r.last.exited for r in ranks):
        return None
    if any(not r.counts.enough for r in ranks) or not any(makes_progress(r) for r in ranks):
        return None  # too few samples yet, or frozen (the hang check's case)
    shares = tuple(r.share(COLLECTIVE) for r in ranks)
    if any(s.low < REMOTE_WAIT_MIN_SHARE for s in shares) or any(r.input_share.point >= INPUT_BOUND_HIGH for r in ranks):
        return None  # a rank here computes, or waits for its own data: the local checks' case
    first = ranks[0]
    return RemoteWait(ranks, shares, world, first.node_rank, first.nnodes, next((r.job_id for r in ranks if r.job_id), None))


def remote_wait_finding(d: RemoteWait) -> Finding:
    """The wording: the ranks here wait for ranks elsewhere, and the command that names them."""
    here = sorted(r.rank for r in d.ranks if r.rank is not None)
    span = f"ranks {here[0]}–{here[-1]}" if len(here) > 1 else (f"rank {here[0]}" if here else f"{len(d.ranks)} ranks")
    node = f", node {d.node_rank} of {d.nnodes}" if d.node_rank is not None and d.nnodes else ""
    lowest = min(s.point for s in d.shares)
    command = f"gputop report --prometheus URL --job {d.job_id or 'ID'}"
    return Finding(
        id="remote_wait",
        title="Waiting for ranks on another node",
        severity="warning",
        confidence=0.6,
        label=LABEL_CODE,
        summary=(
            f"All {len(d.ranks)} rank(s) here ({span} of {d.world_size}{node}) wait in collectives {lowest:.0%}+ of the time "
            f"for a rank on another node: the job's pace is set elsewhere; find that rank with `{command}`"
        ),
        evidence=tuple(
            f"{r.label}: in a collective {s.text()} of {r.counts.n} {r.counts.unit}" for r, s in zip(d.ranks, d.shares)
        )
        + (f"the job has {d.world_size} ranks; {len(d.ranks)} run on this machine",),
        fix=f"{command}  # names the straggling rank and its node, from every node's gputop serve",
        pids=tuple(r.pid for r in d.ranks),
        gpus=tuple(sorted({g for r in d.ranks for g in r.gpus})),
        figures={"collective_share": [s.point for s in d.shares], "world_size": d.world_size},
    )


def check_remote_wait(ctx: Context) -> list[Finding]:
    decided = remote_wait(ctx)
    return [remote_wait_finding(decided)] if decided is not None else []

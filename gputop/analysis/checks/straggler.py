"""Straggler rank: one rank's input holds back the others."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Optional

from gputop.analysis.checks.input import hot_worker_frames
from gputop.analysis.numbers import confidence_from, mean
from gputop.analysis.observations import WAIT_FRAMES, Context, RankObs, frames_from, outer_frames, pooled_counts
from gputop.analysis.prediction import Forecast, predict_straggler, step_rate
from gputop.analysis.stack_classes import COLLECTIVE, EXPLICIT_SYNC, FORWARD_BACKWARD, IN_DATASET, WAITING_FOR_DATA
from gputop.analysis.thresholds import (
    INPUT_BOUND_HIGH,
    INPUT_BOUND_MODERATE,
    STRAGGLER_OTHERS_SYNC_MIN,
)
from gputop.model import LABEL_CODE, Finding
from gputop.units import fraction as pct

_SYNC_STATES = (COLLECTIVE, FORWARD_BACKWARD, EXPLICIT_SYNC)


@dataclass(frozen=True)
class Straggler:
    """What `check_straggler` decided: a minority of ranks wait for data while the rest wait for them."""

    slow: tuple[RankObs, ...]  # the input-bound ranks
    fast: tuple[RankObs, ...]  # the others, not input-bound
    worst: RankObs
    others_sync: float  # the others' mean share in collectives, forward/backward or a sync
    others_coll: float  # ... in collectives alone
    frames: tuple[str, ...]  # where the worst waits, then where the others wait
    hot_workers: Optional[str]  # the worst rank's workers' hottest frame, in words
    min_samples: int  # the fewest samples of any rank compared
    prediction: Optional[Forecast] = None  # what the job gains at the other ranks' pace


def check_straggler(ctx: Context, *, exclude: Collection[int] = frozenset()) -> list[Finding]:
    decided = straggler(ctx, exclude=exclude)
    return [straggler_finding(decided)] if decided is not None else []


def straggler(ctx: Context, *, exclude: Collection[int] = frozenset()) -> Optional[Straggler]:
    """The decision: at most half the ranks input-bound, every other one fed and waiting for them."""
    ranks = [r for r in ctx.ranks.values() if r.pid not in exclude and r.measured]
    if len(ranks) < 2:
        return None
    slow = [r for r in ranks if r.input_fraction >= INPUT_BOUND_HIGH]
    fast = [r for r in ranks if r.input_fraction < INPUT_BOUND_MODERATE]
    if not slow or len(slow) > len(ranks) // 2 or len(slow) + len(fast) != len(ranks):
        return None
    others_sync = mean(r.fraction(*_SYNC_STATES) for r in fast) or 0.0
    if others_sync < STRAGGLER_OTHERS_SYNC_MIN:
        return None
    worst = max(slow, key=lambda r: r.input_fraction)
    sample = next((s for s in reversed(worst.samples) if s.state in (WAITING_FOR_DATA, IN_DATASET) and s.frames), None)
    other_sample = next(
        (s for state in _SYNC_STATES for r in fast for s in reversed(r.samples) if s.state == state and s.frames), None
    )
    frames: tuple[str, ...] = ()
    if sample is not None:
        frames += frames_from(sample.frames, WAIT_FRAMES)
    if other_sample is not None:
        frames += outer_frames(other_sample.frames, 2)
    hot = hot_worker_frames(worst)
    return Straggler(
        slow=tuple(slow),
        fast=tuple(fast),
        worst=worst,
        others_sync=others_sync,
        others_coll=mean(r.fraction(COLLECTIVE) for r in fast) or 0.0,
        frames=frames,
        hot_workers=hot[0] if hot else None,
        min_samples=min(r.n for r in ranks),
        prediction=predict_straggler(pooled_counts(fast).share(COLLECTIVE)).with_rate(step_rate(ctx)),
    )


def straggler_finding(d: Straggler) -> Finding:
    worst = d.worst
    evidence = [f"{r.label}: waits for data {r.input_share.text()} of {r.n:,} {r.counts.unit}" for r in d.slow] + [
        f"the other {len(d.fast)} ranks: input {pct(mean(r.input_fraction for r in d.fast) or 0)}, in collective/backward/sync {pct(d.others_sync)} "
        f"(collective alone {pct(d.others_coll)})"
    ]
    if d.hot_workers:
        evidence.append(d.hot_workers)
    return Finding(
        id="straggler",
        title="Straggler rank: one rank's loader holds back the others",
        severity="warning",
        confidence=confidence_from(d.min_samples, 15, (worst.input_fraction - INPUT_BOUND_MODERATE) / INPUT_BOUND_HIGH),
        label=LABEL_CODE,
        summary=f"Straggler: {worst.name} waits for data {worst.input_share.text()} of the time while "
        f"{len(d.fast)} other ranks wait for it",
        evidence=tuple(evidence),
        frames=d.frames,
        fix=(
            f"look at what is different on {worst.name}: its shard, its workers, its CPU cores\n"
            "# uneven shards: DistributedSampler(dataset, shuffle=True, drop_last=True)\n"
            "# slow samples on one shard: cache/pre-decode them; give every rank the same num_workers"
        ),
        gpus=tuple(sorted(worst.gpus)),
        pids=tuple(r.pid for r in d.slow),
        figures={"prediction": d.prediction.figures()} if d.prediction is not None else {},
    )

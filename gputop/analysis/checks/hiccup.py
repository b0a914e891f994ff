"""Periodic hiccup: a saw-tooth in utilization, and its cause."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Collection, Optional, Sequence, Union

from gputop.analysis.advice import STACKS_HINT
from gputop.analysis.numbers import Share, mean, percentile, share_of
from gputop.analysis.observations import (
    EPOCH_START_FRAME_NAMES,
    WAIT_FRAMES,
    Context,
    GpuObs,
    RankObs,
    frames_from,
    has_frame,
    outer_frames,
    pooled_counts,
)
from gputop.analysis.prediction import Forecast, Unpredictable, predict_restarts, step_rate
from gputop.analysis.stack_classes import COLLECTIVE, INPUT_WAIT_STATES, WAITING_FOR_DATA
from gputop.analysis.thresholds import (
    COLLAPSE_HIGH,
    COLLAPSE_LOW,
    COMMUNICATION_HEAVY,
    EVIDENCE_RANKS,
    HICCUP_ACF_MIN,
    HICCUP_COLLAPSE,
    HICCUP_MAX_GAP_CV,
    HICCUP_MAX_PERIOD_S,
    HICCUP_MIN_LOSS,
    HICCUP_MIN_PEAK,
    HICCUP_MIN_PERIODS,
    HICCUP_MIN_SAMPLES,
    HICCUP_MIN_SWING,
    INPUT_BOUND_MODERATE,
    LOW_UTILIZATION,
    PERIOD_MATCH_TOLERANCE,
)
from gputop.model import LABEL_CODE, Finding
from gputop.units import fraction as pct


def _detrend(values: Sequence[float]) -> list[float]:
    n = len(values)
    xs = range(n)
    mx = (n - 1) / 2.0
    my = sum(values) / n
    sxx = sum((x - mx) ** 2 for x in xs) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, values)) / sxx
    return [y - (my + slope * (x - mx)) for x, y in zip(xs, values)]


def autocorrelation(values: Sequence[float], max_lag: int) -> list[float]:
    """Normalized autocorrelation of the (linearly detrended) series for lags 0..max_lag."""
    x = _detrend(values)
    var = sum(v * v for v in x)
    if var <= 1e-9:
        return [1.0] + [0.0] * max_lag
    n = len(x)
    return [sum(x[i] * x[i + lag] for i in range(n - lag)) / var * n / (n - lag) if lag else 1.0 for lag in range(max_lag + 1)]


def _fill(values: Sequence[Optional[float]]) -> Optional[list[float]]:
    """Fill short gaps by carrying the last value; None when more than a fifth is missing."""
    if sum(v is None for v in values) > len(values) / 5:
        return None
    out: list[float] = []
    last = next((v for v in values if v is not None), 0.0)
    for v in values:
        last = v if v is not None else last
        out.append(float(last))
    return out


def detect_period(series_list: Sequence[Sequence[Optional[float]]], max_lag: Optional[int] = None) -> Optional[tuple[int, float]]:
    """(lag in samples, ACF value) of the dominant period shared by the series, or None.

    The ACF is averaged over the GPUs (independent ranks are out of phase, but share the period). The lag is
    the highest local maximum after the ACF first dips below zero, and must repeat HICCUP_MIN_PERIODS times.
    """
    filled = [f for f in (_fill(s) for s in series_list) if f is not None and len(f) >= HICCUP_MIN_SAMPLES]
    if not filled:
        return None
    n = min(len(f) for f in filled)
    max_lag = min(n // HICCUP_MIN_PERIODS, max_lag or n)
    if max_lag < 2:
        return None
    acfs = [autocorrelation(f[-n:], max_lag) for f in filled]
    acf = [sum(a[i] for a in acfs) / len(acfs) for i in range(max_lag + 1)]
    dipped = next((i for i in range(1, max_lag + 1) if acf[i] < 0), None)
    if dipped is None:
        return None
    best: Optional[tuple[int, float]] = None
    for lag in range(max(2, dipped), max_lag + 1):
        left = acf[lag - 1]
        right = acf[lag + 1] if lag + 1 <= max_lag else -1.0
        if acf[lag] >= left and acf[lag] >= right and acf[lag] >= HICCUP_ACF_MIN:
            if best is None or acf[lag] > best[1] + 0.05:
                best = (lag, acf[lag])
            if best is not None:
                break  # the first strong peak is the fundamental; later ones are its multiples
    return best


def collapse_starts(values: Sequence[Optional[float]]) -> list[int]:
    """Indices where utilization collapses: <= COLLAPSE_LOW x p90 after having been >= COLLAPSE_HIGH x p90."""
    peak = percentile([v for v in values if v is not None], 90) or 0.0
    starts: list[int] = []
    armed = False
    for i, v in enumerate(values):
        if v is None:
            continue
        if v >= COLLAPSE_HIGH * peak:
            armed = True
        elif armed and v <= COLLAPSE_LOW * peak:
            starts.append(i)
            armed = False
    return starts


def detect_collapse_period(
    series_list: Sequence[Sequence[Optional[float]]], timestamps: Sequence[float]
) -> Optional[tuple[float, int, list[float]]]:
    """(period s, collapses, gaps) from regular collapse events, using the GPU with the most collapses."""
    best: Optional[tuple[float, int, list[float]]] = None
    for values in series_list:
        starts = collapse_starts(values)
        if len(starts) < HICCUP_MIN_PERIODS:
            continue
        gaps = [timestamps[b] - timestamps[a] for a, b in zip(starts, starts[1:])]
        avg = statistics.fmean(gaps)
        if avg <= 0 or statistics.pstdev(gaps) / avg > HICCUP_MAX_GAP_CV:
            continue
        if best is None or len(starts) > best[1]:
            best = (statistics.median(gaps), len(starts), gaps)
    return best


@dataclass(frozen=True)
class WorkerRestarts:
    """How often the ranks' DataLoader worker PID sets were replaced (epoch boundaries without
    persistent_workers)."""

    count: int  # restarts per rank, rounded
    period_s: Optional[float]  # the median spacing of one rank's restarts
    per_rank: tuple[int, ...]  # restarts seen on each rank that had any
    duration_s: float  # over this long a window


def _restart_times(rank: RankObs) -> list[float]:
    """When this rank's worker PID set was replaced by a disjoint one."""
    prev: Optional[frozenset[int]] = None
    times: list[float] = []
    for t, pids in rank.worker_sets:
        if prev is not None and pids and prev and not (pids & prev):
            times.append(t)
        if pids:
            prev = pids
    return times


def _worker_restarts(ctx: Context) -> WorkerRestarts:
    per_rank = [times for times in (_restart_times(r) for r in ctx.ranks.values()) if times]
    if not per_rank:
        return WorkerRestarts(0, None, (), ctx.duration)
    with_workers = max(1, len([r for r in ctx.ranks.values() if any(r.worker_sets)]))
    restarts = sum(len(times) for times in per_rank) / with_workers
    period = None
    if restarts >= 1:
        # spacing per rank, then the median
        gaps = [b - a for times in per_rank for a, b in zip(times, times[1:])]
        period = statistics.median(gaps) if gaps else None
    return WorkerRestarts(int(round(restarts)), period, tuple(len(times) for times in per_rank), ctx.duration)


def _restart_evidence(r: WorkerRestarts) -> list[str]:
    if not r.per_rank:
        return []
    low, high = min(r.per_rank), max(r.per_rank)
    spread = f"{low}" if low == high else f"{low}-{high}"
    return [f"DataLoader worker PIDs replaced {spread} times on each of {len(r.per_rank)} rank(s) in {r.duration_s:.0f} s"]


@dataclass(frozen=True)
class HiccupPeriod:
    """The saw-tooth's period and how it was found: the autocorrelation's peak, or regular collapses."""

    seconds: float
    regularity: float  # the autocorrelation at the period's lag, or 1 − the collapse gaps' variation
    lag: int  # samples (0: from collapse events)
    interval_s: float  # seconds per sample
    collapses: int = 0
    gaps: tuple[float, ...] = ()  # seconds between collapses


@dataclass(frozen=True)
class GpuSwing:
    index: int
    p10: float
    mean: float
    p90: float


HICCUP_CAUSES = {
    "restarts": "epoch-boundary worker restarts",
    "loader": "loader stalls",
    "collective": "collective waits",
    "unknown": "cause not determined",
}


@dataclass(frozen=True)
class Hiccup:
    """What `check_hiccup` decided: a periodic collapse of utilization, its period, and its cause."""

    period: HiccupPeriod
    swings: tuple[GpuSwing, ...]  # the GPUs whose utilization swings
    cause: str  # a key of HICCUP_CAUSES
    restarts: WorkerRestarts
    epoch_starts: int  # stack dumps that caught a rank starting new workers
    wait_share: Optional[Share]  # the ranks' pooled data-wait share
    coll_share: Optional[Share]  # ... and collective-wait share
    share_span: str  # where those shares come from, in words
    frames: tuple[str, ...]
    pids: tuple[int, ...]
    duration_s: float

    @property
    def severity(self) -> str:
        mean_util = mean(o.mean for o in self.swings) or 0.0
        return "critical" if mean_util < LOW_UTILIZATION else "warning"


@dataclass(frozen=True)
class RestartStalls:
    """No GPU data (a CPU-only job, no driver): worker restarts every epoch are periodic stalls on their own."""

    restarts: WorkerRestarts
    pids: tuple[int, ...]


def check_hiccup(
    ctx: Context, *, exclude_gpus: Collection[int] = frozenset(), max_period_s: float = HICCUP_MAX_PERIOD_S
) -> list[Finding]:
    decided = hiccup(ctx, exclude_gpus=exclude_gpus, max_period_s=max_period_s)
    if isinstance(decided, RestartStalls):
        return [restart_stalls_finding(decided)]
    return [hiccup_finding(decided, hiccup_forecast(ctx, decided))] if decided is not None else []


def _swinging_gpus(ctx: Context, exclude_gpus: Collection[int]) -> list[GpuObs]:
    """The GPUs whose utilization swings widely: collapsing to near zero, or losing much of its peak."""
    swing: list[GpuObs] = []
    for o in ctx.focus_gpus():
        if o.index in exclude_gpus or o.lost_at is not None or len(o.util_values) < HICCUP_MIN_SAMPLES:
            continue
        p90, p10 = percentile(o.util_values, 90), percentile(o.util_values, 10)
        if p90 is None or p10 is None or p90 - p10 < HICCUP_MIN_SWING or p90 < HICCUP_MIN_PEAK:
            continue
        if p10 <= HICCUP_COLLAPSE or p90 - (o.mean_util or 0.0) >= HICCUP_MIN_LOSS:
            swing.append(o)
    return swing


def _period(ctx: Context, swing: Sequence[GpuObs], max_period_s: float) -> Optional[HiccupPeriod]:
    """The period shared by the swinging GPUs: the autocorrelation's, else that of regular collapses."""
    if not swing:
        return None
    found = detect_period([o.util for o in swing], max_lag=int(max_period_s / max(ctx.interval, 1e-3)))
    if found is not None:
        lag, acf = found
        return HiccupPeriod(lag * ctx.interval, acf, lag, ctx.interval)
    events = detect_collapse_period([o.util for o in swing], swing[0].timestamps)
    if events is None:
        return None
    period, count, gaps = events
    regularity = 1.0 - statistics.pstdev(gaps) / statistics.fmean(gaps)  # regularity stands in for the ACF
    return HiccupPeriod(period, regularity, 0, ctx.interval, count, tuple(gaps))


def _swing(o: GpuObs) -> GpuSwing:
    return GpuSwing(o.index, percentile(o.util_values, 10) or 0.0, o.mean_util or 0.0, percentile(o.util_values, 90) or 0.0)


def _hiccup_cause(
    ctx: Context, period_s: float, restarts: WorkerRestarts, epoch_starts: int, measured: Sequence[RankObs]
) -> tuple[str, tuple[str, ...]]:
    """(cause key, frames that show it): restarts that match the period, else the larger of the data and
    collective waits, when large enough."""
    pooled = pooled_counts(measured)
    wait = pooled.share(*INPUT_WAIT_STATES).point if measured else None
    coll = pooled.share(COLLECTIVE).point if measured else None
    restart_matches = restarts.period_s is not None and abs(restarts.period_s - period_s) <= PERIOD_MATCH_TOLERANCE * period_s
    if restarts.count >= 2 and (restart_matches or epoch_starts):
        if not epoch_starts:
            return "restarts", ()
        sample = next(s for r in ctx.ranks.values() for s in r.samples if has_frame(s.frames, EPOCH_START_FRAME_NAMES))
        return "restarts", frames_from(sample.frames, ("_MultiProcessingDataLoaderIter.__init__",), outer=3)
    if wait is not None and wait >= INPUT_BOUND_MODERATE and (coll is None or wait >= coll):
        found = next((s for r in measured for s in reversed(r.samples) if s.state == WAITING_FOR_DATA and s.frames), None)
        return "loader", frames_from(found.frames, WAIT_FRAMES) if found is not None else ()
    if coll is not None and coll >= COMMUNICATION_HEAVY:
        found = next((s for r in measured for s in reversed(r.samples) if s.state == COLLECTIVE and s.frames), None)
        return "collective", outer_frames(found.frames, 4) if found is not None else ()
    return "unknown", ()


def hiccup(
    ctx: Context, *, exclude_gpus: Collection[int] = frozenset(), max_period_s: float = HICCUP_MAX_PERIOD_S
) -> Union[Hiccup, RestartStalls, None]:
    """The decision: does utilization collapse periodically, at what period, and why?"""
    restarts = _worker_restarts(ctx)
    swing = _swinging_gpus(ctx, exclude_gpus)
    period = _period(ctx, swing, max_period_s)
    if period is None:
        if restarts.count >= 3 and restarts.period_s and not ctx.have_gpu_data:
            return RestartStalls(restarts, tuple(ctx.ranks))
        return None
    epoch_starts = sum(1 for r in ctx.ranks.values() for s in r.samples if has_frame(s.frames, EPOCH_START_FRAME_NAMES))
    measured = [r for r in ctx.ranks.values() if r.n >= 2]
    pooled = pooled_counts(measured)
    cause, frames = _hiccup_cause(ctx, period.seconds, restarts, epoch_starts, measured)
    return Hiccup(
        period=period,
        swings=tuple(_swing(o) for o in swing),
        cause=cause,
        restarts=restarts,
        epoch_starts=epoch_starts,
        wait_share=pooled.share(*INPUT_WAIT_STATES) if measured else None,
        coll_share=pooled.share(COLLECTIVE) if measured else None,
        share_span=ctx.share_span(pooled) if measured else "",
        frames=frames,
        pids=tuple(r.pid for r in measured),
        duration_s=ctx.duration,
    )


# ----------------------------------------------------------------- the hiccup findings' wording

_HICCUP_FIXES = {
    "restarts": "keep the workers alive across epochs and prefetch deeper\nDataLoader(..., persistent_workers=True, prefetch_factor=4)",
    "loader": (
        "smooth the loader: more workers, deeper prefetch, cache slow samples\n"
        "DataLoader(..., num_workers=N, prefetch_factor=4, pin_memory=True, persistent_workers=True)\n"
        "# if every k-th batch is slow: pre-decode/cache those samples"
    ),
    "collective": (
        "cut the all-reduce cost or its skew\n"
        "with model.no_sync(): loss.backward()  # accumulate k micro-batches, all-reduce once\n"
        "# check `nvidia-smi topo -m` (NVLink vs PIX/SYS) and stragglers; try NCCL_P2P_DISABLE=1 only as an experiment"
    ),
    "unknown": f"{STACKS_HINT}\n# loader stalls show as 'waiting for data', all-reduce waits as 'collective/barrier'",
}
_HICCUP_CONFIDENCE = {"restarts": 0.85, "loader": 0.75, "collective": 0.7, "unknown": 0.5}


def _period_text(h: Hiccup) -> str:
    p = h.period
    if p.lag:
        return (
            f"period {p.seconds:.1f} s (autocorrelation {p.regularity:.2f} at lag {p.lag} samples of {p.interval_s:.1f} s), "
            f"{h.duration_s / p.seconds:.0f} cycles seen"
        )
    return (
        f"period ~{p.seconds:.0f} s: {p.collapses} collapses, {', '.join(f'{g:.0f}' for g in p.gaps)} s apart "
        f"(regular within {HICCUP_MAX_GAP_CV:.0%})"
    )


def _cause_evidence(h: Hiccup) -> list[str]:
    if h.cause == "restarts":
        lines = _restart_evidence(h.restarts)
        if h.restarts.period_s:
            lines.append(f"workers restart every {h.restarts.period_s:.1f} s, matching the {h.period.seconds:.1f} s period")
        if h.epoch_starts:
            lines.append(f"{h.epoch_starts} stack dump(s) caught a rank starting new workers (DataLoader.__iter__)")
        return lines
    if h.cause == "loader" and h.wait_share is not None:
        return [f"ranks wait for data {h.wait_share.text()} of the time ({h.share_span}, {len(h.pids)} rank(s))"]
    if h.cause == "collective" and h.coll_share is not None:
        return [
            f"ranks wait in collectives {h.coll_share.text()} of the time ({h.share_span}; "
            f"torch-tb-profiler flags > {pct(COMMUNICATION_HEAVY)})"
        ]
    return []


def collapsed_share(swings: Sequence[GpuObs]) -> Share:
    """The share of the swinging GPUs' readings (one a second) that sit collapsed: under half the GPU's own p90."""
    hits = total = 0
    for o in swings:
        top = percentile(o.util_values, 90) or 0.0
        hits += sum(1 for u in o.util_values if u < top / 2)
        total += len(o.util_values)
    return share_of(hits, total, source="NVML utilization, 1 a second")


def hiccup_forecast(ctx: Context, h: Hiccup) -> Optional[Forecast]:
    """What keeping the workers alive buys (restarts only: the other causes' fixes are not one change)."""
    if h.cause != "restarts":
        return None
    swings = [ctx.gpus[s.index] for s in h.swings if s.index in ctx.gpus]
    return predict_restarts(collapsed_share(swings)).with_rate(step_rate(ctx))


def hiccup_finding(h: Hiccup, forecast: Optional[Forecast] = None) -> Finding:
    """The hiccup finding's wording, made from the decision."""
    evidence = [
        f"GPU {o.index}: utilization p10 {o.p10:.0f}% / mean {o.mean:.0f}% / p90 {o.p90:.0f}%" for o in h.swings[:EVIDENCE_RANKS]
    ]
    evidence.append(_period_text(h))
    cause = HICCUP_CAUSES[h.cause]
    confidence = _HICCUP_CONFIDENCE[h.cause]
    return Finding(
        id="hiccup",
        title=f"Periodic hiccup ({cause})",
        severity=h.severity,
        confidence=round(min(0.95, confidence * (0.6 + 0.4 * min(1.0, h.period.regularity))), 2),
        label=LABEL_CODE,
        summary=f"Periodic hiccup every {h.period.seconds:.0f} s: utilization collapses ({cause})",
        evidence=tuple(evidence + _cause_evidence(h)),
        frames=h.frames,
        fix=_HICCUP_FIXES[h.cause],
        gpus=tuple(o.index for o in h.swings),
        pids=h.pids,
        figures={"prediction": forecast.figures()} if forecast is not None else {},
    )


def restart_stalls_finding(d: RestartStalls) -> Finding:
    return Finding(
        id="hiccup",
        title="Periodic stalls: DataLoader workers restart every epoch",
        severity="warning",
        confidence=0.6,
        label=LABEL_CODE,
        summary=f"Periodic stall: DataLoader workers restart every ~{d.restarts.period_s:.0f} s (no persistent_workers)",
        evidence=tuple(_restart_evidence(d.restarts)),
        fix="keep the workers alive across epochs\nDataLoader(..., persistent_workers=True, prefetch_factor=4)",
        pids=d.pids,
        figures={"prediction": Unpredictable("persistent_workers=True", "no GPU readings to time the stalls by").figures()},
    )

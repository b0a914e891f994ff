"""Periodic hiccup: a saw-tooth in utilization, and its cause."""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

from gputop.analysis.advice import STACKS_HINT
from gputop.analysis.numbers import mean, percentile
from gputop.analysis.observations import (
    EPOCH_START_FRAME_NAMES,
    WAIT_FRAMES,
    Context,
    GpuObs,
    frames_from,
    has_frame,
    outer_frames,
    pooled_counts,
)
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


def _worker_restarts(ctx: Context) -> tuple[int, Optional[float], list[str]]:
    """How often the ranks' worker PID sets were replaced (epoch boundaries without persistent_workers)."""
    times: list[float] = []
    evidence: list[str] = []
    counts: list[int] = []
    for r in ctx.ranks.values():
        prev: Optional[frozenset[int]] = None
        rank_times = []
        for t, pids in r.worker_sets:
            if prev is not None and pids and prev and not (pids & prev):
                rank_times.append(t)
            if pids:
                prev = pids
        if rank_times:
            counts.append(len(rank_times))
            times += rank_times
    if not times:
        return 0, None, evidence
    spread = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
    evidence.append(f"DataLoader worker PIDs replaced {spread} times on each of {len(counts)} rank(s) in {ctx.duration:.0f} s")
    per_rank = max(1, len([r for r in ctx.ranks.values() if any(r.worker_sets)]))
    restarts = len(times) / per_rank
    period = None
    if restarts >= 1:
        # spacing per rank, then the median
        gaps = []
        for r in ctx.ranks.values():
            rt = []
            prev = None
            for t, pids in r.worker_sets:
                if prev is not None and pids and prev and not (pids & prev):
                    rt.append(t)
                if pids:
                    prev = pids
            gaps += [b - a for a, b in zip(rt, rt[1:])]
        period = statistics.median(gaps) if gaps else None
    return int(round(restarts)), period, evidence


def check_hiccup(
    ctx: Context, *, exclude_gpus: set[int] = frozenset(), max_period_s: float = HICCUP_MAX_PERIOD_S
) -> list[Finding]:
    gpus = [
        o
        for o in ctx.focus_gpus()
        if o.index not in exclude_gpus and o.lost_at is None and len(o.util_values) >= HICCUP_MIN_SAMPLES
    ]
    restarts, restart_period, restart_evidence = _worker_restarts(ctx)
    epoch_starts = sum(1 for r in ctx.ranks.values() for s in r.samples if has_frame(s.frames, EPOCH_START_FRAME_NAMES))
    found = None
    swing_gpus: list[GpuObs] = []
    for o in gpus:
        p90, p10 = percentile(o.util_values, 90), percentile(o.util_values, 10)
        if p90 is None or p10 is None or p90 - p10 < HICCUP_MIN_SWING or p90 < HICCUP_MIN_PEAK:
            continue
        if p10 <= HICCUP_COLLAPSE or p90 - (o.mean_util or 0.0) >= HICCUP_MIN_LOSS:
            swing_gpus.append(o)
    evidence: list[str] = []
    if swing_gpus:
        found = detect_period([o.util for o in swing_gpus], max_lag=int(max_period_s / max(ctx.interval, 1e-3)))
    if found is not None:
        lag, acf = found
        period = lag * ctx.interval
        evidence_period = f"period {period:.1f} s (autocorrelation {acf:.2f} at lag {lag} samples of {ctx.interval:.1f} s), {ctx.duration / period:.0f} cycles seen"
    elif swing_gpus:
        events = detect_collapse_period([o.util for o in swing_gpus], swing_gpus[0].timestamps)
        if events is not None:
            period, count, gaps = events
            acf = 1.0 - statistics.pstdev(gaps) / statistics.fmean(gaps)  # regularity stands in for the ACF
            found = (0, acf)
            evidence_period = (
                f"period ~{period:.0f} s: {count} collapses, {', '.join(f'{g:.0f}' for g in gaps)} s apart "
                f"(regular within {HICCUP_MAX_GAP_CV:.0%})"
            )
    if found is None:
        if restarts >= 3 and restart_period and not ctx.have_gpu_data:
            # no GPU data (CPU-only job / no driver): worker restarts are periodic stalls on their own
            return [
                Finding(
                    id="hiccup",
                    title="Periodic stalls: DataLoader workers restart every epoch",
                    severity="warning",
                    confidence=0.6,
                    label=LABEL_CODE,
                    summary=f"Periodic stall: DataLoader workers restart every ~{restart_period:.0f} s (no persistent_workers)",
                    evidence=tuple(restart_evidence),
                    fix="keep the workers alive across epochs\nDataLoader(..., persistent_workers=True, prefetch_factor=4)",
                    pids=tuple(ctx.ranks),
                )
            ]
        return []
    acf = found[1]
    for o in swing_gpus[:EVIDENCE_RANKS]:
        evidence.append(
            f"GPU {o.index}: utilization p10 {percentile(o.util_values, 10):.0f}% / mean {o.mean_util:.0f}% / p90 {percentile(o.util_values, 90):.0f}%"
        )
    evidence.append(evidence_period)
    measured = [r for r in ctx.ranks.values() if r.n >= 2]
    pooled = pooled_counts(measured)
    wait_share = pooled.share(*INPUT_WAIT_STATES) if measured else None
    coll_share = pooled.share(COLLECTIVE) if measured else None
    wait = wait_share.point if wait_share else None
    coll = coll_share.point if coll_share else None
    frames: tuple[str, ...] = ()
    restart_matches = restart_period is not None and abs(restart_period - period) <= PERIOD_MATCH_TOLERANCE * period
    if restarts >= 2 and (restart_matches or epoch_starts):
        cause = "epoch-boundary worker restarts"
        evidence += restart_evidence
        if restart_period:
            evidence.append(f"workers restart every {restart_period:.1f} s, matching the {period:.1f} s period")
        if epoch_starts:
            evidence.append(f"{epoch_starts} stack dump(s) caught a rank starting new workers (DataLoader.__iter__)")
            sample = next(s for r in ctx.ranks.values() for s in r.samples if has_frame(s.frames, EPOCH_START_FRAME_NAMES))
            frames = frames_from(sample.frames, ("_MultiProcessingDataLoaderIter.__init__",), outer=3)
        fix = "keep the workers alive across epochs and prefetch deeper\nDataLoader(..., persistent_workers=True, prefetch_factor=4)"
        confidence = 0.85
    elif wait is not None and wait >= INPUT_BOUND_MODERATE and (coll is None or wait >= coll):
        cause = "loader stalls"
        evidence.append(
            f"ranks wait for data {wait_share.text()} of the time ({ctx.share_span(pooled)}, {len(measured)} rank(s))"
        )
        sample = next((s for r in measured for s in reversed(r.samples) if s.state == WAITING_FOR_DATA and s.frames), None)
        if sample is not None:
            frames = frames_from(sample.frames, WAIT_FRAMES)
        fix = (
            "smooth the loader: more workers, deeper prefetch, cache slow samples\n"
            "DataLoader(..., num_workers=N, prefetch_factor=4, pin_memory=True, persistent_workers=True)\n"
            "# if every k-th batch is slow: pre-decode/cache those samples"
        )
        confidence = 0.75
    elif coll is not None and coll >= COMMUNICATION_HEAVY:
        cause = "collective waits"
        evidence.append(
            f"ranks wait in collectives {coll_share.text()} of the time ({ctx.share_span(pooled)}; "
            f"torch-tb-profiler flags > {pct(COMMUNICATION_HEAVY)})"
        )
        sample = next((s for r in measured for s in reversed(r.samples) if s.state == COLLECTIVE and s.frames), None)
        if sample is not None:
            frames = outer_frames(sample.frames, 4)
        fix = (
            "cut the all-reduce cost or its skew\n"
            "with model.no_sync(): loss.backward()  # accumulate k micro-batches, all-reduce once\n"
            "# check `nvidia-smi topo -m` (NVLink vs PIX/SYS) and stragglers; try NCCL_P2P_DISABLE=1 only as an experiment"
        )
        confidence = 0.7
    else:
        cause = "cause not determined"
        fix = f"{STACKS_HINT}\n# loader stalls show as 'waiting for data', all-reduce waits as 'collective/barrier'"
        confidence = 0.5
    mean_util = mean(o.mean_util for o in swing_gpus) or 0.0
    severity = "critical" if mean_util < LOW_UTILIZATION else "warning"
    return [
        Finding(
            id="hiccup",
            title=f"Periodic hiccup ({cause})",
            severity=severity,
            confidence=round(min(0.95, confidence * (0.6 + 0.4 * min(1.0, acf))), 2),
            label=LABEL_CODE,
            summary=f"Periodic hiccup every {period:.0f} s: utilization collapses ({cause})",
            evidence=tuple(evidence),
            frames=frames,
            fix=fix,
            gpus=tuple(o.index for o in swing_gpus),
            pids=tuple(r.pid for r in measured),
        )
    ]

"""Input pipeline: continuous starvation, and low utilization when no job is attached."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Collection, Optional, Sequence

from gputop.analysis.advice import STACKS_HINT, WorkerAdvice, loader_code, producer_bound, suggested_workers, workers_now
from gputop.analysis.checks.hang import WORKER_TIMEOUT_FIX, StuckWorker, stuck_worker
from gputop.analysis.numbers import Share, confidence_from, mean_share, measured_share, wilson_interval
from gputop.analysis.observations import (
    WAIT_FRAMES,
    Context,
    RankObs,
    StateCounts,
    bench_recommendation,
    bench_wait_fraction,
    dataset_frames,
    dense_counts,
    frames_from,
    pooled_counts,
)
from gputop.analysis.prediction import (
    Forecast,
    Unpredictable,
    core_use,
    epoch_batches,
    predict_cheaper_input,
    predict_workers,
    step_rate,
)
from gputop.analysis.stack_classes import (
    IN_DATASET,
    INPUT_WAIT_STATES,
    WAITING_FOR_DATA,
    WORKER_IDLE,
    WORKER_NO_STACK,
    aggregate_worker_leaves,
)
from gputop.analysis.thresholds import (
    BUSY_UTILIZATION,
    EVIDENCE_RANKS,
    HANG_UTILIZATION_MAX,
    INPUT_BOUND_HIGH,
    INPUT_BOUND_MODERATE,
    INPUT_PHASE_MAX_S,
    INPUT_PHASE_OPEN_MAX_S,
    LOW_UTILIZATION,
    MIN_STACK_SAMPLES,
    POOL_WAIT_S,
    WILSON_Z,
)
from gputop.model import LABEL_CODE, Finding
from gputop.units import fraction as pct
from gputop.units import gib


def pooled_input_share(ranks: Sequence[RankObs]) -> Share:
    """The share of all these ranks' samples spent in the input pipeline, pooled across ranks."""
    return pooled_counts(ranks).share(*INPUT_WAIT_STATES)


def surely_at_least(share: Share, level: float) -> bool:
    """The share reaches `level` and its one-sided lower bound (~84%) does too: one waiting dump in 19
    is not evidence of a 5% wait; 24 in 240 is."""
    return share.point >= level and wilson_interval(share.point, share.effective, WILSON_Z)[0] >= level


def gpu_idle_share(ctx: Context) -> Optional[Share]:
    """The job's GPUs' idle share (1 − utilization) over the window, with its interval, or None."""
    if not ctx.have_gpu_data:
        return None
    values = [1.0 - u / 100.0 for o in ctx.focus_gpus() for u in o.util_values]
    return mean_share(values, "NVML utilization, 1 a second")


PHASE_BIN_S = 1.0  # dense samples are judged a second at a time: a second mostly in input is an input second


def input_timeline(rank: RankObs) -> list[tuple[float, int, int]]:
    """(time, input samples, samples) in time order over the whole diagnosis window (a pause's shape needs
    more than the share window shows), start-up left out: one per second of dense samples, else one per
    stack dump (1 or 0 of 1)."""
    if not rank.stretches:
        return [
            (s.timestamp, int(s.state in INPUT_WAIT_STATES), 1)
            for s in rank.samples
            if s.state and not rank.starting_up and (rank.loop_started is None or s.timestamp >= rank.loop_started)
        ]
    counts = dense_counts(rank.stretches, None, rank.loop_started, rank.starting_up)
    bins: dict[int, list[int]] = {}
    for stretch, runs in zip(counts.stretches, counts.runs):
        period = 1.0 / stretch.rate
        t = stretch.end - sum(n for _, n in runs) * period  # the kept samples end with the stretch
        for state, n in runs:
            for k in range(n):
                hits = bins.setdefault(int((t + k * period) // PHASE_BIN_S), [0, 0])
                hits[0] += state in INPUT_WAIT_STATES
                hits[1] += 1
            t += n * period
    return [(b * PHASE_BIN_S, hits, total) for b, (hits, total) in sorted(bins.items())]


def input_phase(rank: RankObs) -> Optional[tuple[float, float, float]]:
    """(start, seconds, input share outside it) when this rank's input time forms one stretch: a phase.

    It is one when the longest run of input items (dumps in input, or seconds mostly in input) lasted at
    most INPUT_PHASE_MAX_S (or, still going at the end of the window, INPUT_PHASE_OPEN_MAX_S), and outside
    it the rank is not input-bound: its samples there, not its seconds, are under INPUT_BOUND_MODERATE in
    input.  A rank in input 44% of every second has no input second but the odd one; that is continuous
    starvation, and its samples outside that second say so."""
    timeline = input_timeline(rank)
    inside = [hits * 2 > total for _, hits, total in timeline]
    best: Optional[tuple[int, int]] = None  # [i, j) of the longest run
    i = 0
    while i < len(timeline):
        if inside[i]:
            j = i
            while j < len(timeline) and inside[j]:
                j += 1
            if best is None or j - i > best[1] - best[0]:
                best = (i, j)
            i = j
        else:
            i += 1
    if best is None:
        return None
    i, j = best
    outside = timeline[:i] + timeline[j:]
    outside_samples = sum(total for _, _, total in outside)
    outside_share = sum(hits for _, hits, _ in outside) / outside_samples if outside_samples else 1.0
    # the stretch lasts from its first input item to the next other one (or its last one, if still open)
    start = timeline[i][0]
    end = timeline[j][0] if j < len(timeline) else timeline[j - 1][0]
    limit = INPUT_PHASE_MAX_S if j < len(timeline) else INPUT_PHASE_OPEN_MAX_S
    if end - start > limit or len(outside) < MIN_STACK_SAMPLES or outside_share >= INPUT_BOUND_MODERATE:
        return None
    return start, end - start, outside_share


InputPhase = tuple[float, float, float]  # (start, seconds, input share outside it): see `input_phase`


@dataclass(frozen=True)
class Starvation:
    """What `check_starvation` decided and the numbers behind it; `starvation_finding` words it."""

    measured: tuple[RankObs, ...]  # ranks with a measured state share
    worst: Optional[RankObs]  # the rank with the largest input share (None: the benchmark alone)
    job_share: Share  # the job's input share (the benchmark's when it ran)
    pooled: Optional[StateCounts]  # the measured ranks' samples, pooled
    share_span: str  # where the sampled share comes from, in words
    window_s: Optional[float]  # the shares cover the last this many seconds (None: the whole window)
    bench_wait: Optional[float]  # the benchmark's measured data-wait fraction
    bench_how: str
    gpu_mean: Optional[float]  # the job's GPUs' mean utilization
    in_dataset: bool  # the worst rank runs dataset code itself (num_workers=0) more than it waits
    frames: tuple[str, ...]  # where the worst rank waits (and where its workers are busiest)
    hot_workers: Optional[str]  # "2/2 workers of rank 0 in X"
    bench_settings: Optional[dict[str, Any]]  # the active benchmark's recommended loader settings
    bench_workers_needed: Optional[int]
    advice: Optional[WorkerAdvice]  # the worker estimate from the shares (without a benchmark's settings)
    cpu_bound: bool  # every core is busy: more workers cannot help
    phases: tuple[InputPhase, ...]  # the input-bound ranks' one stretch of input each (all or none)
    stuck: Optional[StuckWorker]  # a dead or frozen worker the wait is for
    n_samples: int
    prediction: Optional[Forecast] = None  # what the fix buys (None: the fix changes nothing to predict)

    @property
    def highly(self) -> bool:
        return self.job_share.point >= INPUT_BOUND_HIGH

    @property
    def overlapped(self) -> bool:
        """CUDA runs ahead of the host: a host wait while the GPUs stay busy is overlapped, not lost."""
        return self.gpu_mean is not None and self.gpu_mean >= BUSY_UTILIZATION

    @property
    def one_pause(self) -> bool:
        """One pause for data (an epoch start, an evaluation or checkpoint that ended with its own loader)
        inside an otherwise fed window: a phase, not continuous starvation."""
        return self.stuck is None and bool(self.phases) and self.bench_wait is None

    @property
    def severity(self) -> str:
        if self.overlapped or self.one_pause or self.stuck is not None:
            return "info"
        return "critical" if self.highly else "warning"


def check_starvation(ctx: Context, *, exclude: Collection[int] = frozenset(), cpu_bound: bool = False) -> list[Finding]:
    decided = starvation(ctx, exclude=exclude, cpu_bound=cpu_bound)
    return [starvation_finding(decided)] if decided is not None else []


def _sampled_input(ctx: Context, measured: Sequence[RankObs]) -> tuple[Optional[StateCounts], Optional[Share], str]:
    """(pooled counts, the job's input share, where it comes from) of the ranks' own samples."""
    if not measured:
        return None, None, ""
    pooled = pooled_counts(measured)
    return pooled, pooled.share(*INPUT_WAIT_STATES), ctx.share_span(pooled)


def _waiting_frames(worst: RankObs) -> tuple[tuple[str, ...], Optional[str]]:
    """(frames, hot workers line): where the worst rank waits for data, then its workers' hottest frame."""
    frames: tuple[str, ...] = ()
    sample = next((s for s in reversed(worst.samples) if s.state in (WAITING_FOR_DATA, IN_DATASET) and s.frames), None)
    if sample is not None:
        frames = dataset_frames(sample.frames) if sample.state == IN_DATASET else frames_from(sample.frames, WAIT_FRAMES)
    hot = hot_worker_frames(worst)
    if hot is None:
        return frames, None
    return frames + hot[1], hot[0]


def _one_pause_phases(measured: Sequence[RankObs]) -> tuple[InputPhase, ...]:
    """Each input-bound rank's one stretch of input, when every one of them has one; () otherwise."""
    phases = [input_phase(r) for r in measured if r.input_fraction >= INPUT_BOUND_MODERATE]
    found = tuple(ph for ph in phases if ph is not None)
    return found if phases and len(found) == len(phases) else ()


def loop_just_began(ctx: Context, rank: RankObs) -> bool:
    """The rank's share is not ready to pool yet: it is seen still starting up (the others, already stepping,
    wait for it in their first collective: their loop has not begun either, until the collector gives up on
    it), or it is in its loop, began it less than POOL_WAIT_S ago, and has too few samples yet."""
    if rank.measured:
        return False
    if rank.starting_up:
        return bool(rank.samples or rank.stretches)
    return rank.loop_started is not None and ctx.snaps[-1].timestamp - rank.loop_started < POOL_WAIT_S


def starvation(ctx: Context, *, exclude: Collection[int] = frozenset(), cpu_bound: bool = False) -> Optional[Starvation]:
    """The decision: is the job surely input-bound (at least INPUT_BOUND_MODERATE), by its samples or a benchmark?"""
    ranks = [r for r in ctx.ranks.values() if r.pid not in exclude and r.n >= 1]
    bench_wait, bench_how = bench_wait_fraction(ctx.bench)
    measured = [r for r in ranks if r.measured]
    pending = [r for r in ctx.ranks.values() if r.pid not in exclude and loop_just_began(ctx, r)]
    if bench_wait is None and measured and pending:
        return None  # a rank whose loop just began is still being measured: the share waits to pool it
    pooled, job_share, span = _sampled_input(ctx, measured)
    n_samples = pooled.n if pooled is not None else 0
    if bench_wait is not None:
        # the benchmark times every batch (or samples at 100 Hz): it replaces the sampled share
        job_share = measured_share(bench_wait, 100, bench_how)
        n_samples = max(n_samples, 100)
    if job_share is None or not surely_at_least(job_share, INPUT_BOUND_MODERATE):
        return None  # not input-bound, or too few samples to tell 5% from noise
    worst = max(measured, key=lambda r: r.input_fraction) if measured else None
    frames, hot = _waiting_frames(worst) if worst is not None else ((), None)
    rec = bench_recommendation(ctx.bench)
    needed = ((ctx.bench or {}).get("recommendation", {}).get("workers_needed")) if rec else None
    advice = None if rec else suggested_workers(ctx, measured or ranks, job_share, gpu_idle_share(ctx))
    decided = Starvation(
        measured=tuple(measured),
        worst=worst,
        job_share=job_share,
        pooled=pooled,
        share_span=span,
        window_s=ctx.share_window,
        bench_wait=bench_wait,
        bench_how=bench_how,
        gpu_mean=ctx.focus_utilization(),
        in_dataset=worst is not None and worst.states[IN_DATASET] > worst.states[WAITING_FOR_DATA],
        frames=frames,
        hot_workers=hot,
        bench_settings=rec,
        bench_workers_needed=needed,
        advice=advice,
        cpu_bound=cpu_bound,
        phases=_one_pause_phases(measured),
        stuck=next((s for s in (stuck_worker(r) for r in ctx.ranks.values()) if s is not None), None),
        n_samples=n_samples,
    )
    return replace(decided, prediction=starvation_forecast(ctx, decided, measured or ranks))


CACHED = "preprocessing made cheap (decoded samples cached)"


def starvation_forecast(ctx: Context, d: Starvation, ranks: Sequence[RankObs]) -> Optional[Forecast]:
    """What the starvation finding's fix buys: more workers (the advice, or the benchmark's count), or, with the
    cores saturated, cheaper preprocessing.  None where the fix changes nothing (a one-off pause)."""
    if d.one_pause:
        return None
    if d.stuck is not None:
        return Unpredictable("the stuck worker fixed", "the job waits on one stuck worker, not for throughput", step_rate(ctx))
    if d.cpu_bound:
        return loader_forecast(ctx, ranks, d.job_share, None)
    after = d.advice.workers if d.advice is not None else (d.bench_settings or {}).get("num_workers")
    if not isinstance(after, int):
        return Unpredictable("more workers", "no worker count was advised", step_rate(ctx))
    return loader_forecast(ctx, ranks, d.job_share, after)


def loader_forecast(ctx: Context, ranks: Sequence[RankObs], share: Share, workers_after: Optional[int]) -> Forecast:
    """What a loader change buys these ranks, waiting for data `share` of the time: `workers_after` workers, or
    (None) preprocessing made cheap.  In steps/s where the window timed the steps (`step_rate`)."""
    now, epoch = step_rate(ctx), epoch_batches(ctx)
    idle = gpu_idle_share(ctx)
    if workers_after is None:
        return predict_cheaper_input(share, idle, CACHED, core_use(ctx)).with_rate(now, epoch)
    cpu = producer_bound(ranks)[0] == "cpu"
    forecast = predict_workers(workers_now(ranks), workers_after, share, cpu_bound=cpu, cores=core_use(ctx), gpu_idle=idle)
    return forecast.with_rate(now, epoch)


def measured_loader_forecast(ctx: Context, workers_after: Optional[int]) -> Optional[Forecast]:
    """`loader_forecast` of the window's measured ranks at their pooled input share (None: none measured yet)."""
    ranks = [r for r in ctx.ranks.values() if r.measured]
    return loader_forecast(ctx, ranks, pooled_input_share(ranks), workers_after) if ranks else None


# ----------------------------------------------------------------- the starvation finding's wording


def _starvation_evidence(d: Starvation) -> list[str]:
    evidence: list[str] = []
    if d.bench_wait is not None:
        evidence.append(f"benchmark: data wait {pct(d.bench_wait)} of wall time, measured by {d.bench_how}")
    for r in sorted(d.measured, key=lambda r: -r.input_fraction)[:EVIDENCE_RANKS]:
        counts = r.states
        evidence.append(
            f"{r.label}: input {r.input_share.text()} of {r.n:,} {r.counts.unit} "
            f"(waiting for data {counts[WAITING_FOR_DATA]:,}, in dataset code {counts[IN_DATASET]:,})"
        )
    if len(d.measured) > EVIDENCE_RANKS:
        evidence.append(f"… {len(d.measured) - EVIDENCE_RANKS} more rank(s)")
    if d.pooled is not None:
        sampled = d.pooled.share(*INPUT_WAIT_STATES)
        evidence.append(f"all {len(d.measured)} rank(s): input {sampled.text()} of {d.share_span}")
        if d.pooled.startup_left_out:
            evidence.append(f"start-up left out: {d.pooled.startup_left_out:,} samples before the training loop's first step")
    if d.gpu_mean is not None:
        evidence.append(f"GPU utilization of the job's GPUs: mean {d.gpu_mean:.0f}%")
    if d.overlapped:
        evidence.append(f"the GPUs stay busy (≥{BUSY_UTILIZATION:.0f}%), so the host-side wait overlaps GPU work")
    if d.hot_workers is not None:
        evidence.append(d.hot_workers)
    if d.one_pause:
        longest = max(ph[1] for ph in d.phases)
        evidence.append(
            f"{len(d.phases)} rank(s): the input dumps fall in one stretch of at most {longest:.0f} s; "
            f"outside it they wait for data {pct(max(ph[2] for ph in d.phases))} of the time"
        )
    if d.stuck is not None:
        evidence.append(d.stuck.what)
    return evidence


def _starvation_fix(d: Starvation) -> str:
    if d.stuck is not None:
        # The wait is the stuck (or dead) worker's, not a lack of throughput: more workers would not help.
        return "\n".join(["fix the stuck worker first (see the hang finding); more workers would not help", WORKER_TIMEOUT_FIX])
    if d.one_pause:
        return (
            "nothing to do for a one-off pause; if it recurs every epoch, keep the workers alive\n"
            "DataLoader(..., persistent_workers=True)  # no re-fork at each epoch start"
        )
    if d.cpu_bound:
        return "\n".join(
            [
                "make preprocessing cheaper (the cores are already saturated)",
                "# more workers cannot help while every core is busy:",
                "# cache decoded/resized samples once (tensors in RAM or on local disk), pack files (WebDataset),",
                "# or decode on the GPU (NVIDIA DALI); keep num_workers <= free cores",
            ]
        )
    if d.bench_settings is not None:
        workers = d.bench_settings.get("num_workers")
        action = "apply the benchmark's loader settings" + (
            f": num_workers = {workers} (measured by the active benchmark)" if workers is not None else ""
        )
        fix_lines = [action, loader_code(d.bench_settings)]
    else:
        assert d.advice is not None  # decided with the estimate whenever no benchmark settings came
        kwargs = {"num_workers": d.advice.workers, "prefetch_factor": 4, "pin_memory": True, "persistent_workers": True}
        action = f"{d.advice.action()}, prefetch, pin memory"
        if d.advice.capped and d.advice.bound == "cpu":
            action += "; make each sample cheaper too (the cores cap the workers)"
        fix_lines = [action, loader_code(kwargs), d.advice.arithmetic]
    if d.in_dataset:
        fix_lines.insert(1, "# num_workers=0: the training process decodes every batch itself")
    return "\n".join(fix_lines)


def _starvation_summary(d: Starvation) -> str:
    who = d.worst.name if d.worst is not None else "the benchmarked rank"
    shown = (d.worst.input_share if d.worst is not None and d.bench_wait is None else d.job_share).text()
    level = "highly" if d.highly else "moderately"
    if d.stuck is not None:
        return f"{who} waits for data {shown} of the time because a DataLoader worker is stuck or dead"
    if d.one_pause:
        longest = max(ph[1] for ph in d.phases)
        return (
            f"One pause for data of {longest:.0f} s (an epoch start, evaluation or checkpoint); "
            f"otherwise not input-bound (data wait {pct(max(ph[2] for ph in d.phases))})"
        )
    if d.overlapped:
        return f"Host waits for data {shown} of the time, but the GPUs stay busy"
    if d.in_dataset:
        return f"Input-bound ({level}): {who} spends {shown} of its time in dataset code (num_workers=0)"
    return f"Input-bound ({level}): {who} waits for data {shown} of the time"


def _starvation_figures(d: Starvation) -> dict[str, Any]:
    figures: dict[str, Any] = {"input_share": d.job_share.to_dict()}
    if d.measured:
        figures["ranks"] = {str(r.pid): r.input_share.to_dict() for r in d.measured}
        figures["window_s"] = d.window_s
    if d.advice is not None:
        figures["workers"] = d.advice.figures()
    else:
        workers = d.bench_settings.get("num_workers") if d.bench_settings else None
        figures["workers"] = {"num_workers": workers, "source": "active benchmark", "workers_needed": d.bench_workers_needed}
    if d.prediction is not None:
        figures["prediction"] = d.prediction.figures()
    return figures


def starvation_finding(d: Starvation) -> Finding:
    """The starvation finding's wording, all of it made here from the decision."""
    margin = (d.job_share.point - INPUT_BOUND_MODERATE) / (INPUT_BOUND_HIGH - INPUT_BOUND_MODERATE)
    return Finding(
        id="starvation",
        title="Continuous starvation: the DataLoader cannot feed the GPUs",
        severity=d.severity,
        confidence=confidence_from(d.n_samples, 15, margin),
        label=LABEL_CODE,
        summary=_starvation_summary(d),
        evidence=tuple(_starvation_evidence(d)),
        frames=d.frames,
        fix=_starvation_fix(d),
        gpus=tuple(sorted({g for r in d.measured for g in r.gpus})),
        pids=tuple(r.pid for r in d.measured if r.input_fraction >= INPUT_BOUND_MODERATE),
        figures=_starvation_figures(d),
    )


def hot_worker_frames(rank: RankObs) -> Optional[tuple[str, tuple[str, ...]]]:
    """The hottest activity across this rank's current workers: ("2/2 workers of rank 0 in X", (X,))."""
    current = rank.worker_sets[-1][1] if rank.worker_sets else frozenset()
    stacks = {p: w.last_stacks for p, w in rank.workers.items() if p in current and w.last_stacks is not None}
    if not stacks:
        return None
    for text, count, total in aggregate_worker_leaves(stacks, sorted(current)):
        if text not in (WORKER_IDLE, WORKER_NO_STACK):
            return f"{count}/{total} workers of {rank.name} in {text}", (text,)
    return None


def check_low_utilization(ctx: Context, *, exclude_gpus: Collection[int] = frozenset()) -> list[Finding]:
    """GPU data only (no job attached): say the utilization is low and how to learn why - never guess the cause."""
    if not ctx.have_gpu_data or len(ctx.snaps) < MIN_STACK_SAMPLES:
        return []
    busy_candidates = [
        o
        for o in ctx.focus_gpus()
        if o.index not in exclude_gpus and (o.process_pids or any(o.holds_memory(m) for m in o.memory))
    ]
    low = [o for o in busy_candidates if o.mean_util is not None and HANG_UTILIZATION_MAX < o.mean_util < LOW_UTILIZATION]
    if not low:
        return []
    evidence = tuple(f"GPU {o.index}: mean utilization {o.mean_util:.0f}%, memory {gib(o.memory[-1])} held" for o in low)
    return [
        Finding(
            id="low_utilization",
            title="Low GPU utilization (cause needs the job's stacks)",
            severity="warning",
            confidence=0.5,
            label=LABEL_CODE,
            summary=f"GPU utilization is low ({', '.join(f'GPU {o.index} {o.mean_util:.0f}%' for o in low[:4])})",
            evidence=evidence,
            fix=f"{STACKS_HINT}\n# it tells a starving DataLoader from a collective wait or a sync",
            gpus=tuple(o.index for o in low),
        )
    ]

"""Input pipeline: continuous starvation, and low utilization when no job is attached."""

from __future__ import annotations

from typing import Optional, Sequence

from gputop.analysis.advice import STACKS_HINT, loader_code, suggested_workers
from gputop.analysis.checks.hang import WORKER_TIMEOUT_FIX, stuck_worker
from gputop.analysis.numbers import Share, confidence_from, mean, mean_share, measured_share, wilson_interval
from gputop.analysis.observations import (
    WAIT_FRAMES,
    Context,
    RankObs,
    bench_recommendation,
    bench_wait_fraction,
    dataset_frames,
    dense_counts,
    frames_from,
    pooled_counts,
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


def input_timeline(rank: RankObs) -> list[tuple[float, bool]]:
    """(time, in the input pipeline) in time order over the whole diagnosis window (a pause's shape needs
    more than the share window shows), start-up left out: one per second of dense samples (mostly input
    or not), else one per stack dump."""
    if not rank.stretches:
        return [
            (s.timestamp, s.state in INPUT_WAIT_STATES)
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
    return [(b * PHASE_BIN_S, hits * 2 > total) for b, (hits, total) in sorted(bins.items())]


def input_phase(rank: RankObs) -> Optional[tuple[float, float, float]]:
    """(start, seconds, input share outside it) when this rank's input time forms one stretch: a phase.

    It is one when the longest run of consecutive input dumps (or seconds, from dense samples) holds most
    of them, lasted at most INPUT_PHASE_MAX_S (or, still going at the end of the window,
    INPUT_PHASE_OPEN_MAX_S), and outside it the rank is not input-bound."""
    timeline = input_timeline(rank)
    best: Optional[tuple[int, int]] = None  # [i, j) of the longest run
    i = 0
    while i < len(timeline):
        if timeline[i][1]:
            j = i
            while j < len(timeline) and timeline[j][1]:
                j += 1
            if best is None or j - i > best[1] - best[0]:
                best = (i, j)
            i = j
        else:
            i += 1
    if best is None:
        return None
    i, j = best
    hits = sum(1 for _, inside in timeline if inside)
    outside = timeline[:i] + timeline[j:]
    outside_share = (hits - (j - i)) / len(outside) if outside else 1.0
    # the stretch lasts from its first input item to the next other one (or its last one, if still open)
    start = timeline[i][0]
    end = timeline[j][0] if j < len(timeline) else timeline[j - 1][0]
    limit = INPUT_PHASE_MAX_S if j < len(timeline) else INPUT_PHASE_OPEN_MAX_S
    if end - start > limit or len(outside) < MIN_STACK_SAMPLES or outside_share >= INPUT_BOUND_MODERATE:
        return None
    return start, end - start, outside_share


def check_starvation(ctx: Context, *, exclude: set[int] = frozenset(), cpu_bound: bool = False) -> list[Finding]:
    ranks = [r for r in ctx.ranks.values() if r.pid not in exclude and r.n >= 1]
    bench_wait, bench_how = bench_wait_fraction(ctx.bench)
    gpu_mean = mean(o.mean_util for o in ctx.focus_gpus()) if ctx.have_gpu_data else None

    measured = [r for r in ranks if r.measured]
    if not measured and bench_wait is None:
        return []

    evidence: list[str] = []
    frames: tuple[str, ...] = ()
    figures: dict = {}
    if measured:
        pooled = pooled_counts(measured)
        job_share = pooled.share(*INPUT_WAIT_STATES)
        worst = max(measured, key=lambda r: r.input_fraction)
        for r in sorted(measured, key=lambda r: -r.input_fraction)[:EVIDENCE_RANKS]:
            counts = r.states
            evidence.append(
                f"{r.label}: input {r.input_share.text()} of {r.n:,} {r.counts.unit} "
                f"(waiting for data {counts[WAITING_FOR_DATA]:,}, in dataset code {counts[IN_DATASET]:,})"
            )
        if len(measured) > EVIDENCE_RANKS:
            evidence.append(f"… {len(measured) - EVIDENCE_RANKS} more rank(s)")
        evidence.append(f"all {len(measured)} rank(s): input {job_share.text()} of {ctx.share_span(pooled)}")
        if pooled.startup_left_out:
            evidence.append(f"start-up left out: {pooled.startup_left_out:,} samples before the training loop's first step")
        figures["input_share"] = job_share.to_dict()
        figures["ranks"] = {str(r.pid): r.input_share.to_dict() for r in measured}
        figures["window_s"] = ctx.share_window
        n_samples = pooled.n
    else:
        worst = None
        n_samples = 0
    if bench_wait is not None:
        # the benchmark times every batch (or samples at 100 Hz): it replaces the sampled share
        evidence.insert(0, f"benchmark: data wait {pct(bench_wait)} of wall time, measured by {bench_how}")
        job_share = measured_share(bench_wait, 100, bench_how)
        figures["input_share"] = job_share.to_dict()
        n_samples = max(n_samples, 100)
    job_fraction = job_share.point

    if not surely_at_least(job_share, INPUT_BOUND_MODERATE):
        return []  # not input-bound, or too few samples to tell 5% from noise
    if gpu_mean is not None:
        evidence.append(f"GPU utilization of the job's GPUs: mean {gpu_mean:.0f}%")

    level = "highly" if job_fraction >= INPUT_BOUND_HIGH else "moderately"
    severity = "critical" if level == "highly" else "warning"
    if gpu_mean is not None and gpu_mean >= BUSY_UTILIZATION:
        # CUDA runs ahead of the host: a host wait while the GPUs stay busy is overlapped, not lost.
        severity = "info"
        evidence.append(f"the GPUs stay busy (≥{BUSY_UTILIZATION:.0f}%), so the host-side wait overlaps GPU work")

    who = worst.name if worst is not None else "the benchmarked rank"
    shown = (worst.input_share if worst is not None and bench_wait is None else job_share).text()
    in_dataset = worst is not None and worst.states[IN_DATASET] > worst.states[WAITING_FOR_DATA]
    if worst is not None:
        sample = next((s for s in reversed(worst.samples) if s.state in (WAITING_FOR_DATA, IN_DATASET) and s.frames), None)
        if sample is not None:
            frames = dataset_frames(sample.frames) if sample.state == IN_DATASET else frames_from(sample.frames, WAIT_FRAMES)
        hot = hot_worker_frames(worst)
        if hot:
            frames = frames + hot[1]
            evidence.append(hot[0])

    rec = bench_recommendation(ctx.bench)
    if rec:
        kwargs = rec
        measured_workers = rec.get("num_workers")
        action = "apply the benchmark's loader settings" + (
            f": num_workers = {measured_workers} (measured by the active benchmark)" if measured_workers is not None else ""
        )
        figures["workers"] = {
            "num_workers": measured_workers,
            "source": "active benchmark",
            "workers_needed": (ctx.bench or {}).get("recommendation", {}).get("workers_needed"),
        }
    else:
        advice = suggested_workers(ctx, measured or ranks, job_share, gpu_idle_share(ctx))
        arithmetic = advice.arithmetic
        kwargs = {"num_workers": advice.workers, "prefetch_factor": 4, "pin_memory": True, "persistent_workers": True}
        action = f"{advice.action()}, prefetch, pin memory"
        if advice.capped and advice.bound == "cpu":
            action += "; make each sample cheaper too (the cores cap the workers)"
        figures["workers"] = advice.figures()
    fix_lines = [action, loader_code(kwargs)]
    if not rec:
        fix_lines.append(arithmetic)
    if in_dataset:
        fix_lines.insert(1, "# num_workers=0: the training process decodes every batch itself")
    if cpu_bound:
        action = "make preprocessing cheaper (the cores are already saturated)"
        fix_lines = [
            action,
            "# more workers cannot help while every core is busy:",
            "# cache decoded/resized samples once (tensors in RAM or on local disk), pack files (WebDataset),",
            "# or decode on the GPU (NVIDIA DALI); keep num_workers <= free cores",
        ]
    if in_dataset:
        summary = f"Input-bound ({level}): {who} spends {shown} of its time in dataset code (num_workers=0)"
    else:
        summary = f"Input-bound ({level}): {who} waits for data {shown} of the time"
    if severity == "info":
        summary = f"Host waits for data {shown} of the time, but the GPUs stay busy"
    phases = [input_phase(r) for r in measured if r.input_fraction >= INPUT_BOUND_MODERATE]
    stuck = next((s for s in (stuck_worker(r) for r in ctx.ranks.values()) if s is not None), None)
    if stuck is None and phases and all(phases) and bench_wait is None:
        # One pause for data (an epoch start, an evaluation or checkpoint that ended with its own loader)
        # inside an otherwise fed window: a phase, not continuous starvation.
        longest = max(phases, key=lambda ph: ph[1])
        severity = "info"
        summary = (
            f"One pause for data of {longest[1]:.0f} s (an epoch start, evaluation or checkpoint); "
            f"otherwise not input-bound (data wait {pct(max(ph[2] for ph in phases))})"
        )
        evidence.append(
            f"{len(phases)} rank(s): the input dumps fall in one stretch of at most {longest[1]:.0f} s; "
            f"outside it they wait for data {pct(max(ph[2] for ph in phases))} of the time"
        )
        fix_lines = [
            "nothing to do for a one-off pause; if it recurs every epoch, keep the workers alive",
            "DataLoader(..., persistent_workers=True)  # no re-fork at each epoch start",
        ]
    if stuck is not None:
        # The wait is the stuck (or dead) worker's, not a lack of throughput: more workers would not help.
        severity = "info"
        summary = f"{who} waits for data {shown} of the time because a DataLoader worker is stuck or dead"
        evidence.append(stuck.what)
        fix_lines = [
            "fix the stuck worker first (see the hang finding); more workers would not help",
            WORKER_TIMEOUT_FIX,
        ]
    margin = (job_fraction - INPUT_BOUND_MODERATE) / (INPUT_BOUND_HIGH - INPUT_BOUND_MODERATE)
    return [
        Finding(
            id="starvation",
            title="Continuous starvation: the DataLoader cannot feed the GPUs",
            severity=severity,
            confidence=confidence_from(n_samples, 15, margin),
            label=LABEL_CODE,
            summary=summary,
            evidence=tuple(evidence),
            frames=frames,
            fix="\n".join(fix_lines),
            gpus=tuple(sorted({g for r in measured for g in r.gpus})),
            pids=tuple(r.pid for r in measured if r.input_fraction >= INPUT_BOUND_MODERATE),
            figures=figures,
        )
    ]


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


def check_low_utilization(ctx: Context, *, exclude_gpus: set[int] = frozenset()) -> list[Finding]:
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

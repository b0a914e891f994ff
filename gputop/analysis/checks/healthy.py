"""Nothing wrong found: the plain-words summary (healthy / collecting)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional

from gputop.analysis.advice import STACKS_HINT
from gputop.analysis.checks.input import loop_just_began, pooled_input_share
from gputop.analysis.checks.kernels import busy, mean_sm_active
from gputop.analysis.numbers import Share, confidence_from
from gputop.analysis.observations import Context, pooled_counts
from gputop.analysis.thresholds import INPUT_BOUND_MODERATE, LOW_UTILIZATION, MIN_SAMPLED_SECONDS, MIN_STACK_SAMPLES
from gputop.model import Finding
from gputop.units import fraction as pct


@dataclass(frozen=True)
class Quiet:
    """What the data say when no check found a problem; `healthy_finding` words it."""

    stage: str  # "no_stacks": stacks unavailable; "starting": no step yet; "collecting": too few samples; "healthy"
    gpu_mean: Optional[float]  # the focus GPUs' mean utilization
    n_gpus: int  # how many GPUs that covers
    duration_s: float
    gpu_error: Optional[str]  # why there is no GPU data
    stacks_error: Optional[str]
    startup_left_out: int  # samples left out before the first step ("starting")
    dense: bool  # the ranks are sampled densely ("collecting": seconds, not dumps)
    most_seconds: float  # the best-sampled rank's seconds of loop so far ("collecting", dense; the least-sampled
    # rank's while one whose loop just began is waited for)
    most_dumps: int  # ... its dumps ("collecting", not dense)
    input_share: Optional[Share]  # the measured ranks' pooled input share
    share_span: str
    top_state: Optional[tuple[str, float]]  # the ranks' commonest main-thread state and its share
    job_attached: bool
    job_processes: bool  # some GPU runs a process
    n_snaps: int
    sm_mean: Optional[float] = None  # the focus GPUs' mean SM activity where GPM knows it: what "busy" means there


def quiet(ctx: Context) -> Quiet:
    """The decision for the plain-words summary: which stage the job is in, and the numbers to show."""
    focus = ctx.focus_gpus()
    live = [r for r in ctx.ranks.values() if not (r.last is not None and r.last.exited)]
    measured = [r for r in live if r.measured]
    latest_job = next((s.job for s in reversed(ctx.snaps) if s.job is not None), None)
    stacks_error = (latest_job.stacks_error if latest_job else None) or next(
        (r.stacks_error for r in live if r.stacks_error), None
    )
    # a rank whose loop just began is waited for, as the starvation check waits for it (POOL_WAIT_S)
    pending = [r for r in live if loop_just_began(ctx, r)] if measured else []
    if live and not measured:
        stage = "no_stacks" if stacks_error else "starting" if all(r.starting_up for r in live) else "collecting"
    else:
        stage = "collecting" if pending else "healthy"
    states: Counter[str] = Counter()
    for r in measured:
        states.update(r.states)
    top = states.most_common(1)[0] if measured else None
    return Quiet(
        stage=stage,
        gpu_mean=ctx.focus_utilization(),
        n_gpus=len(focus),
        duration_s=ctx.duration,
        gpu_error=ctx.history.machine.gpu_error,
        stacks_error=stacks_error,
        startup_left_out=sum(r.counts.startup_left_out for r in live),
        dense=any(r.counts.dense for r in live),
        most_seconds=min(r.counts.seconds for r in pending) if pending else max((r.counts.seconds for r in live), default=0.0),
        most_dumps=max((r.n for r in live), default=0),
        # the job's figure, as check_starvation has it
        input_share=pooled_input_share(measured) if measured else None,
        share_span=ctx.share_span(pooled_counts(measured)) if measured else "",
        top_state=(top[0], top[1] / max(1, sum(states.values()))) if top is not None else None,
        job_attached=bool(ctx.ranks),
        job_processes=any(o.process_pids for o in ctx.gpus.values()),
        n_snaps=len(ctx.snaps),
        sm_mean=mean_sm_active(focus),
    )


def healthy_finding(ctx: Context) -> Finding:
    """Nothing wrong found: say so plainly, with the numbers - or say that stacks are still being collected."""
    return quiet_finding(quiet(ctx))


def _gpu_text(q: Quiet) -> str:
    if q.gpu_mean is None:
        return ""
    sm = "" if q.sm_mean is None else f", SMs {q.sm_mean:.0f}% active"  # GPM: both numbers, busy by the SMs
    return f"GPUs busy ({q.gpu_mean:.0f}%{sm})" if busy(q.gpu_mean, q.sm_mean) else f"GPUs at {q.gpu_mean:.0f}%{sm}"


def _not_yet_finding(q: Quiet, evidence: list[str]) -> Finding:
    """The stages before a verdict: stacks unavailable, starting up, collecting."""
    gpu_text = _gpu_text(q)
    if q.stage == "no_stacks":
        evidence.append(f"stacks unavailable: {q.stacks_error}")
        summary = "No problem in the GPU/CPU data; stacks unavailable, so the input pipeline was not checked"
        return Finding(
            "healthy", "No problem found (without stacks)", "info", 0.4, "", summary, tuple(evidence), fix=q.stacks_error or ""
        )
    if q.stage == "starting":
        summary = "Starting up: no training step seen yet (imports, model build, workers starting)" + (
            f"; {gpu_text}" if gpu_text else ""
        )
        evidence.append(f"{q.startup_left_out:,} samples so far, left out of the shares until the first step")
        return Finding("collecting", "Starting up", "info", 0.3, "", summary, tuple(evidence))
    if q.dense:
        summary = f"Collecting samples: {q.most_seconds:.1f}/{MIN_SAMPLED_SECONDS:.0f} s of the training loop per rank so far"
    else:
        summary = f"Collecting stacks: {q.most_dumps}/{MIN_STACK_SAMPLES} dumps per rank so far"
    summary += f"; {gpu_text}" if gpu_text else ""
    return Finding("collecting", "Collecting stacks", "info", 0.3, "", summary, tuple(evidence))


def _healthy_summary(q: Quiet, parts: list[str]) -> str:
    low = q.gpu_mean is not None and not busy(q.gpu_mean, q.sm_mean)
    if low and not q.job_attached and not q.job_processes:
        return "Healthy: GPUs idle, no job running"
    if low:
        return "No known problem found, but " + ", ".join(parts)
    if parts:
        return "Healthy: " + ", ".join(parts)
    return "Healthy: nothing wrong found"


def quiet_finding(q: Quiet) -> Finding:
    """The plain-words summary's wording: healthy, or which stage the diagnosis waits in."""
    evidence: list[str] = []
    if q.gpu_mean is not None:
        evidence.append(f"GPU utilization: mean {q.gpu_mean:.0f}% over {q.n_gpus} GPU(s) for {q.duration_s:.0f} s")
    elif q.gpu_error:
        evidence.append(f"no GPU data: {q.gpu_error}")
    if q.stage != "healthy":
        return _not_yet_finding(q, evidence)
    gpu_text = _gpu_text(q)
    parts = [gpu_text] if gpu_text else []
    if q.input_share is not None and q.top_state is not None:
        share = q.input_share
        evidence.append(
            f"the ranks wait for data {share.text()} of the time ({q.share_span}; TF Profiler: < 5% is not input-bound)"
        )
        noise = ", within noise of 5%" if share.point >= INPUT_BOUND_MODERATE else ""
        parts.append(f"not input-bound (data wait {share.text()}{noise})")
        evidence.append(f"ranks' main threads mostly {q.top_state[0]} ({pct(q.top_state[1])} of samples)")
        if q.gpu_mean is not None and q.gpu_mean < LOW_UTILIZATION:
            parts.append(f"ranks mostly {q.top_state[0]}")
    fix = ""
    if not q.job_attached:
        evidence.append("no job attached: stack-based checks (starvation, hang, straggler) did not run")
        fix = STACKS_HINT
    summary = _healthy_summary(q, parts)
    return Finding(
        id="healthy",
        title="Healthy" if summary.startswith("Healthy") else "No known problem found",
        severity="info",
        confidence=confidence_from(q.n_snaps, 30),
        label="",
        summary=summary,
        evidence=tuple(evidence),
        fix=fix,
    )

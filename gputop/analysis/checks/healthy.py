"""Nothing wrong found: the plain-words summary (healthy / collecting)."""

from __future__ import annotations

from collections import Counter

from gputop.analysis.advice import STACKS_HINT
from gputop.analysis.checks.input import pooled_input_share
from gputop.analysis.numbers import confidence_from, mean
from gputop.analysis.observations import Context, pooled_counts
from gputop.analysis.thresholds import INPUT_BOUND_MODERATE, LOW_UTILIZATION, MIN_SAMPLED_SECONDS, MIN_STACK_SAMPLES
from gputop.model import Finding
from gputop.units import fraction as pct


def healthy_finding(ctx: Context) -> Finding:
    """Nothing wrong found: say so plainly, with the numbers - or say that stacks are still being collected."""
    evidence: list[str] = []
    focus = ctx.focus_gpus()
    gpu_mean = mean(o.mean_util for o in focus) if ctx.have_gpu_data else None
    if gpu_mean is not None:
        evidence.append(f"GPU utilization: mean {gpu_mean:.0f}% over {len(focus)} GPU(s) for {ctx.duration:.0f} s")
    elif ctx.history.machine.gpu_error:
        evidence.append(f"no GPU data: {ctx.history.machine.gpu_error}")
    gpu_text = (
        f"GPUs busy ({gpu_mean:.0f}%)"
        if gpu_mean is not None and gpu_mean >= LOW_UTILIZATION
        else (f"GPUs at {gpu_mean:.0f}%" if gpu_mean is not None else "")
    )
    live = [r for r in ctx.ranks.values() if not (r.last is not None and r.last.exited)]
    measured = [r for r in live if r.measured]
    latest_job = next((s.job for s in reversed(ctx.snaps) if s.job is not None), None)
    stacks_error = (latest_job.stacks_error if latest_job else None) or next(
        (r.stacks_error for r in live if r.stacks_error), None
    )
    fix = ""
    if live and not measured and stacks_error:
        evidence.append(f"stacks unavailable: {stacks_error}")
        summary = "No problem in the GPU/CPU data; stacks unavailable, so the input pipeline was not checked"
        return Finding(
            "healthy", "No problem found (without stacks)", "info", 0.4, "", summary, tuple(evidence), fix=stacks_error
        )
    if live and not measured and all(r.starting_up for r in live):
        left_out = sum(r.counts.startup_left_out for r in live)
        summary = "Starting up: no training step seen yet (imports, model build, workers starting)" + (
            f"; {gpu_text}" if gpu_text else ""
        )
        evidence.append(f"{left_out:,} samples so far, left out of the shares until the first step")
        return Finding("collecting", "Starting up", "info", 0.3, "", summary, tuple(evidence))
    if live and not measured:
        if any(r.counts.dense for r in live):
            most = max((r.counts.seconds for r in live), default=0.0)
            summary = f"Collecting samples: {most:.1f}/{MIN_SAMPLED_SECONDS:.0f} s of the training loop per rank so far"
        else:
            most = max((r.n for r in live), default=0)
            summary = f"Collecting stacks: {most}/{MIN_STACK_SAMPLES} dumps per rank so far"
        summary += f"; {gpu_text}" if gpu_text else ""
        return Finding("collecting", "Collecting stacks", "info", 0.3, "", summary, tuple(evidence))
    parts = [gpu_text] if gpu_text else []
    if measured:
        share = pooled_input_share(measured)  # the job's figure, as check_starvation has it
        wait = share.point
        evidence.append(
            f"the ranks wait for data {share.text()} of the time ({ctx.share_span(pooled_counts(measured))}; "
            "TF Profiler: < 5% is not input-bound)"
        )
        noise = ", within noise of 5%" if wait >= INPUT_BOUND_MODERATE else ""
        parts.append(f"not input-bound (data wait {share.text()}{noise})")
        states = Counter()
        for r in measured:
            states.update(r.states)
        top_state, top_n = states.most_common(1)[0]
        evidence.append(f"ranks' main threads mostly {top_state} ({pct(top_n / max(1, sum(states.values())))} of samples)")
        if gpu_mean is not None and gpu_mean < LOW_UTILIZATION:
            parts.append(f"ranks mostly {top_state}")
    if not ctx.ranks:
        evidence.append("no job attached: stack-based checks (starvation, hang, straggler) did not run")
        fix = STACKS_HINT
    job_procs = any(o.process_pids for o in ctx.gpus.values())
    if gpu_mean is not None and gpu_mean < LOW_UTILIZATION and not ctx.ranks and not job_procs:
        summary = "Healthy: GPUs idle, no job running"
    elif gpu_mean is not None and gpu_mean < LOW_UTILIZATION:
        summary = "No known problem found, but " + ", ".join(parts)
    elif parts:
        summary = "Healthy: " + ", ".join(parts)
    else:
        summary = "Healthy: nothing wrong found"
    return Finding(
        id="healthy",
        title="Healthy" if summary.startswith("Healthy") else "No known problem found",
        severity="info",
        confidence=confidence_from(len(ctx.snaps), 30),
        label="",
        summary=summary,
        evidence=tuple(evidence),
        fix=fix,
    )

"""Diagnosis: is it the infrastructure, or the training code?

Pure functions over a `History` (plus, optionally, a loader benchmark result).
Nothing here touches the outside world but one read: the source line of a frame
parked at a host-device sync, to name it (`loss.item()`); every finding is
testable from a hand-built or recorded history.

Layout: `thresholds` (every number, with its source), `observations` (per-rank
and per-GPU series built once: the `Context`), `advice` (worker counts and their
caps), one module per family in `checks/`, and this module: the order the checks
run in, how their results feed each other, and the sort.

Each check is a decision and its wording, kept apart: a function that returns a frozen dataclass of what
was decided and the numbers behind it (`starvation` -> `Starvation`, `hiccup` -> `Hiccup`, `_rank_hang`
-> `RankHang`, `misplacement` -> `CrowdedRanks`/..., `quiet` -> `Quiet`), and one function per finding
kind that makes the title, summary, evidence and fix from it (`starvation_finding`, `hiccup_finding`, ...).
A wording change touches only the latter; `check_*` joins the two.

The findings follow the three idle profiles and the troubleshooting table of
the seed article ("8 GPUs, 7 idle"):

* continuous starvation  -> ranks wait for data / run dataset code (TF Profiler scale)
* periodic hiccup        -> a saw-tooth in utilization; cause: loader stalls, epoch-boundary
                            worker restarts, or collective waits
* silent misfire / hang  -> no progress whatever the utilization: frozen stacks with still counters,
                            GPUs idle with memory held or spinning in a collective; the culprit
                            rank and its stuck frame named
* sync in the loop       -> ranks parked at a host-device sync while their GPUs are half idle
* rank misplacement      -> several ranks on one GPU; one GPU busy while the job has several ranks;
                            without --pid, most GPUs idle next to a busy one
* straggler rank         -> one rank waits for data while the others wait in a collective
* CPU-bound input        -> workers pinned at 100% with the cores saturated; more workers than cores
* memory pressure        -> memory nearly full (OOM / fragmentation row of the table)
* infrastructure         -> PCIe link below max under load, throttling, ECC / remapped rows, XIDs,
                            inactive NVLink links, a lost GPU
* healthy                -> said plainly; never invent a problem

Findings resting on stacks and CPU data (starvation, hang, straggler, CPU-bound)
need no GPU data at all: they read `Rank.main_thread_state`, `JobTree.stacks`
and the host/process CPU numbers.

`Finding.fix` convention: the first line is a short action (used in the verdict
line); any further lines are code or settings, rendered as a code block.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, MutableMapping, Optional, Sequence

from gputop.analysis.advice import ESTIMATE_SOURCE
from gputop.analysis.checks.cpu import check_cpu_bound, cpu_facts
from gputop.analysis.checks.hang import check_hang
from gputop.analysis.checks.healthy import healthy_finding
from gputop.analysis.checks.hiccup import check_hiccup, detect_period
from gputop.analysis.checks.infra import check_infrastructure
from gputop.analysis.checks.input import check_low_utilization, check_starvation
from gputop.analysis.checks.kernels import check_kernels
from gputop.analysis.checks.memory import check_memory_pressure
from gputop.analysis.checks.near_cpus import check_near_cpus
from gputop.analysis.checks.placement import check_misplacement
from gputop.analysis.checks.remote import check_remote_wait
from gputop.analysis.checks.straggler import check_straggler
from gputop.analysis.checks.sync import check_sync_bound
from gputop.analysis.numbers import mean, percentile
from gputop.analysis.observations import (
    BenchInput,
    Context,
    bench_dict,
    collect_gpu_observations,
    collect_rank_observations,
    job_loop_start,
)
from gputop.analysis.thresholds import (
    DIAGNOSIS_WINDOW_S,
    HANG_MIN_SECONDS,
    HICCUP_MAX_PERIOD_S,
    INPUT_BOUND_HIGH,
    LONG_HICCUP_MAX_PERIOD_S,
    LONG_WINDOW_S,
    LONG_WINDOW_STRIDE_S,
    SHARE_WINDOW_S,
)
from gputop.history import History
from gputop.model import SEVERITY_ORDER, Finding, Snapshot

# Re-exported for callers that import them from here (older code and tests).
__all__ = [
    "DIAGNOSIS_WINDOW_S",
    "HANG_MIN_SECONDS",
    "INDEPENDENT_CHECKS",
    "INPUT_BOUND_HIGH",
    "SEVERE",
    "build_context",
    "collect_rank_observations",
    "detect_period",
    "diagnose",
    "mean",
    "percentile",
    "severe",
    "verdict_line",
]

_SUMMARY_IDS = ("healthy", "collecting", "no_data")
SEVERE = "critical"


# Families that read the context alone and stand on their own (no other finding changes them): append a
# `check(ctx) -> list[Finding]` here to add one.  The job's own checks (hang, placement, straggler, input,
# hiccup, CPU) depend on each other's results and run in that order in `_job_findings`.
INDEPENDENT_CHECKS: list[Callable[[Context], list[Finding]]] = [
    check_memory_pressure,
    check_infrastructure,
    check_remote_wait,  # the job's ranks elsewhere set its pace
    check_kernels,  # GPM: tensor cores idle, memory-bandwidth-bound
]


def build_context(
    history: History, bench: BenchInput = None, *, window: Optional[float] = DIAGNOSIS_WINDOW_S, stride_s: float = 0.0
) -> Optional[Context]:
    """The observations every check reads, over the last `window` seconds (None: all); None without data.
    `stride_s`: keep one snapshot per that many seconds (a cheap view of a long window)."""
    snaps = history.window(window) if window is not None else list(history)
    if stride_s > 0 and snaps:
        thinned = [snaps[0]]
        for s in snaps[1:]:
            if s.timestamp - thinned[-1].timestamp >= stride_s - 1e-6:
                thinned.append(s)
        snaps = thinned
    if not snaps:
        return None
    times = [s.timestamp for s in snaps]
    dts = [b - a for a, b in zip(times, times[1:]) if b > a]
    # live: the shares cover the last minute, so a phase that ended does not dilute this one; a report: all
    share_window = SHARE_WINDOW_S if window is not None and window > SHARE_WINDOW_S else None
    ranks = collect_rank_observations(snaps, times[-1] - share_window if share_window else None)
    return Context(
        history=history,
        snaps=snaps,
        ranks=ranks,
        share_window=share_window,
        gpus=collect_gpu_observations(snaps, util_from=job_loop_start(ranks)),
        bench=bench_dict(bench),
        duration=times[-1] - times[0],
        interval=statistics.median(dts) if dts else 1.0,
    )


def advice_key(ctx: Context) -> Optional[str]:
    """The job the window shows, as `advice_memory` keys it: its anchor process's PID and start time."""
    job = ctx.job
    if job is None:
        return None
    anchor = job.launcher or next((r.proc for r in job.ranks if r.proc.pid == job.root_pid), None)
    if anchor is None and job.ranks:
        anchor = job.ranks[0].proc
    return f"{anchor.pid}@{anchor.create_time:.2f}" if anchor is not None else None


def _remember_advice(key: str, found: Sequence[Finding], memory: MutableMapping[str, int]) -> None:
    """Keep the workers the starvation finding advised (a two-sided estimate under the cap) for the next look."""
    advised = next((f.figures.get("workers") for f in found if f.id == "starvation" and f.figures), None)
    if not advised or advised.get("source") != ESTIMATE_SOURCE:
        return
    if advised.get("one_sided") or advised.get("capped"):
        return  # "at least N" and the cap are not estimates to hold on to
    memory[key] = int(advised["num_workers"])


def diagnose(
    history: History,
    bench: BenchInput = None,
    *,
    window: Optional[float] = DIAGNOSIS_WINDOW_S,
    memory: Optional[MutableMapping[str, int]] = None,
) -> list[Finding]:
    """All findings over the last `window` seconds of history (None: all of it), most severe first; never empty.

    `memory` (job key -> workers, `gputop.advice_memory.AdviceMemory`): the workers advised by an earlier look
    at the same job; the advice keeps that count while this window's interval holds it, and is kept there."""
    ctx = build_context(history, bench, window=window)
    if ctx is None:
        return [
            Finding(
                id="no_data",
                title="No data yet",
                severity="info",
                confidence=1.0,
                label="",
                summary="No data yet: nothing has been sampled",
                fix="Wait a few seconds, or run `gputop report --seconds 30`.",
            )
        ]
    key = advice_key(ctx) if memory is not None else None
    if key is not None and memory is not None:
        ctx.advised_before = memory.get(key)
    long_window = LONG_WINDOW_S if window is not None else None
    findings = _job_findings(ctx, lambda: build_context(history, bench, window=long_window, stride_s=LONG_WINDOW_STRIDE_S))
    for check in INDEPENDENT_CHECKS:
        findings += check(ctx)
    if not any(f.severity in ("critical", "warning") for f in findings):
        findings.insert(0, healthy_finding(ctx))
    # the plain-words summary (healthy / collecting) leads the info findings it sums up
    findings.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 9), f.id not in _SUMMARY_IDS, -f.confidence))
    if key is not None and memory is not None:
        _remember_advice(key, findings, memory)
    return findings


# the last long-window hiccup search: (the machine, the stride it fell in, GPUs left out), the newest snapshot
# it read, and its findings.  Not keyed on the history object nor its first sample: the TUI diagnoses a fresh
# copy of its history each time, and a full history drops its first sample every poll, so either key missed
# every time and the long window (collect_gpu_observations over 600 s) was rebuilt on each diagnosis.
_LongHiccupKey = tuple[int, int, frozenset[int]]
_long_hiccups: list[tuple[Optional[_LongHiccupKey], Optional[Snapshot], list[Finding]]] = [(None, None, [])]


def _still_holds(ctx: Context, anchor: Optional[Snapshot]) -> bool:
    """Whether `ctx`'s window holds `anchor` itself (the same snapshot object, not an equal one): the same
    history moved on (or a copy of it), not another history of the same machine at the same times."""
    if anchor is None:
        return False
    for snap in reversed(ctx.snaps):
        if snap is anchor:
            return True
        if snap.timestamp < anchor.timestamp:
            return False
    return False


def _job_findings(ctx: Context, long_context: Callable[[], Optional[Context]]) -> list[Finding]:
    """The checks that interpret the job, in the order their results feed each other.

    A hung rank is not also starving or straggling; a straggler is not also the job's starvation; a saw-tooth
    absorbs the starvation it explains; CPU saturation matters only while the job is input-bound.
    """
    findings: list[Finding] = []
    hangs = check_hang(ctx)
    findings += hangs
    hung_pids = {p for f in hangs for p in f.pids}
    hung_gpus = {g for f in hangs for g in f.gpus}
    findings += check_misplacement(ctx)
    findings += check_near_cpus(ctx)  # the CPUs' side of the placement
    stragglers = check_straggler(ctx, exclude=hung_pids)
    findings += stragglers
    facts = cpu_facts(ctx)
    hiccups = check_hiccup(ctx, exclude_gpus=hung_gpus)
    if not hiccups and ctx.snaps[-1].timestamp - next(iter(ctx.history)).timestamp > 3 * HICCUP_MAX_PERIOD_S:
        # epoch-level hiccups: a period of minutes shows only in the longer history.  A period of minutes
        # does not change from one second to the next: the search runs once per LONG_WINDOW_STRIDE_S.
        key: _LongHiccupKey = (
            id(ctx.history.machine),
            int(ctx.snaps[-1].timestamp // LONG_WINDOW_STRIDE_S),
            frozenset(hung_gpus),
        )
        cached_key, anchor, found = _long_hiccups[0]
        if cached_key != key or not _still_holds(ctx, anchor):
            long = long_context()
            found = check_hiccup(long, exclude_gpus=hung_gpus, max_period_s=LONG_HICCUP_MAX_PERIOD_S) if long else []
            _long_hiccups[0] = (key, ctx.snaps[-1], found)
        hiccups = list(found)
    starvation = check_starvation(
        ctx,
        exclude=hung_pids | {p for f in stragglers for p in f.pids},
        cpu_bound=facts.cores_busy,
    )
    if not ctx.ranks:
        starvation += check_low_utilization(ctx, exclude_gpus=hung_gpus)
    if hiccups and starvation and starvation[0].id == "starvation":
        # A saw-tooth is the more specific shape of the same data wait: keep one finding, with both proofs.
        h = hiccups[0]
        s = starvation[0]
        severity = "critical" if SEVERITY_ORDER[s.severity] == 0 else h.severity
        hiccups[0] = dataclasses.replace(h, severity=severity, evidence=h.evidence + s.evidence)
        starvation = []
    findings += hiccups + starvation
    input_bound = any(f.id in ("starvation", "hiccup", "straggler") and f.severity in ("critical", "warning") for f in findings)
    findings += check_cpu_bound(ctx, facts, input_bound=input_bound, hung_gpus=frozenset(hung_gpus))
    findings += check_sync_bound(ctx, exclude=hung_pids)
    return findings


def verdict_line(findings: Sequence[Finding], *, count_more: bool = True) -> str:
    """The always-visible one-liner: the top finding and its first action, plus how many more need a look
    (`count_more=False`: without that count, for a screen that shows it itself)."""
    if not findings:
        return "No verdict yet"
    top = findings[0]
    line = top.summary
    action = top.fix.splitlines()[0].strip() if top.fix else ""
    if action and top.severity != "info":
        line += f" → {action}"
    more = sum(1 for f in findings[1:] if f.severity in ("critical", "warning"))
    if more and count_more:
        line += f" (+{more} more)"
    return line


def severe(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == SEVERE]

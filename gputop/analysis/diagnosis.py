"""Diagnosis: is it the infrastructure, or the training code?

Pure functions over a `History` (plus, optionally, a loader benchmark result).
Nothing here touches the outside world, so every finding is testable from a
hand-built or recorded history.

The findings follow the three idle profiles and the troubleshooting table of
the seed article ("8 GPUs, 7 idle"):

* continuous starvation  -> ranks wait for data / run dataset code (TF Profiler scale)
* periodic hiccup        -> a saw-tooth in utilization; cause: loader stalls, epoch-boundary
                            worker restarts, or collective waits
* silent misfire / hang  -> memory held, utilization ~0, the stuck frame named
* rank misplacement      -> several ranks on one GPU; one GPU busy while the job has several ranks
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

import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from gputop.analysis.stack_classes import (
    COLLECTIVE,
    EXPLICIT_SYNC,
    FORWARD_BACKWARD,
    IN_DATASET,
    WAITING_FOR_DATA,
    WORKER_IDLE,
    WORKER_NO_STACK,
    aggregate_worker_leaves,
    classify_main_thread,
    format_frame,
    main_thread,
    own_frames,
)
from gputop.analysis.loader_math import MARGIN as LOADER_MARGIN
from gputop.analysis.loader_math import workers_needed
from gputop.analysis.xids import XidMeaning, distinct_xids, meaning_of
from gputop.history import History
from gputop.model import (
    LABEL_CODE,
    LABEL_INFRA,
    SEVERITIES,
    Finding,
    Frame,
    GpuSample,
    ProcInfo,
    ProcessStacks,
    Snapshot,
)

# ----------------------------------------------------------------- thresholds
# Input-bound scale of TF Profiler's input-pipeline analyzer (FACTS.md "Thresholds others use"):
# input time >= 20% of step time is "highly input-bound", >= 5% "moderately", below that "not input-bound".
INPUT_BOUND_HIGH = 0.20
INPUT_BOUND_MODERATE = 0.05
# torch-tb-profiler advises on communication > 10% of the step (FACTS.md).
COMMUNICATION_HEAVY = 0.10
# torch-tb-profiler advises on GPU utilization < 0.5 (FACTS.md).
LOW_UTILIZATION = 50.0
# The seed case study calls >= 90% utilization tuned; a host-side data wait while the GPUs stay this busy
# is overlapped with GPU work (CUDA runs ahead of the host), so it costs nothing.
BUSY_UTILIZATION = 90.0
# Stack fractions need a few dumps: 5 distinct dumps is ~10 s at the default 2 s stack interval.
MIN_STACK_SAMPLES = 5
# A hang must last this long: far longer than any one step of a sane job, yet short enough to name the
# stuck frame within the 30 s the issue allows for a verdict.
HANG_MIN_SECONDS = 10.0
# NVML reports whole percents and an idle GPU reads 0; 1% allows for a driver housekeeping blip.
HANG_UTILIZATION_MAX = 1.0
# "Memory held": more than a bare CUDA context (~0.3-0.5 GiB per process).
HELD_MEMORY_BYTES = 1 << 30
# A worker or rank burning >= 90% of one core is CPU-bound; the article (2.1) calls host CPU > 90% for long
# a preprocessing bottleneck.
PROCESS_PINNED_PERCENT = 90.0
CORES_SATURATED_PERCENT = 90.0
# Saw-tooth detection on the utilization series (sampled at the poll interval, ~1 s):
HICCUP_MIN_SAMPLES = 12  # fewer than this and no period can be seen three times
HICCUP_MIN_PERIODS = 3  # a period must repeat at least 3 times inside the window
HICCUP_ACF_MIN = 0.35  # autocorrelation at the period; white noise stays near 0, a clean saw-tooth near 1
HICCUP_MIN_SWING = 25.0  # p90 - p10 in percentage points: the article's 0% <-> 90% "electrocardiogram"
HICCUP_MIN_PEAK = 50.0  # the GPU must get at least half busy between collapses (a starved GPU stays ~1/3 busy)
# ...and the dips must cost something: troughs collapse to <= 30% (the article's "0% <-> 90%"), or the mean sits
# >= 15 points under the p90 peak.  A short optimizer/all-reduce dip every few seconds in a healthy DDP job
# (mean a few points under its peak, troughs ~40%) is the normal step rhythm, not a hiccup.
HICCUP_COLLAPSE = 30.0
HICCUP_MIN_LOSS = 15.0
# Collapse events (when the period wanders, e.g. epochs of uneven length on a loaded box): a collapse starts when
# utilization falls from >= 60% of the p90 peak to <= 25% of it; the gaps between collapse starts must be regular
# (coefficient of variation <= 0.5) for "periodic".
COLLAPSE_HIGH = 0.6
COLLAPSE_LOW = 0.25
HICCUP_MAX_GAP_CV = 0.5
# Epoch-boundary worker restarts explain a period when restarts repeat at that period within 35%.
PERIOD_MATCH_TOLERANCE = 0.35
# Straggler: one rank input-bound (TF "highly") while the others are not (TF "not input-bound") and spend at
# least half their time in a collective / backward waiting for it.
STRAGGLER_OTHERS_SYNC_MIN = 0.5
# PCIe: idle GPUs drop the link generation to save power (FACTS.md), so judge the generation only under load.
PCIE_LOAD_UTILIZATION = 30.0
# Throttling counts when a reason is active in at least this share of samples.
THROTTLE_MIN_FRACTION = 0.2
# A GPU whose enforced power limit is below 90% of its peers' has had its limit lowered (same model, same box).
POWER_LIMIT_LOWERED = 0.9
# Memory >= 95% of the card for half the window: the next larger batch or shape OOMs (article 5.3, OOM row).
MEMORY_NEARLY_FULL = 0.95
# Rank misplacement without --pid: the busy GPU mean and the idle GPUs' mean.
MISPLACED_BUSY_UTILIZATION = 50.0
MISPLACED_IDLE_UTILIZATION = 5.0

# The window diagnose() looks at by default: long enough for ~60 stack dumps and three cycles of a 40 s hiccup,
# short enough that the live verdict follows a fix (more workers) within two minutes.  Reports pass window=None.
DIAGNOSIS_WINDOW_S = 120.0
# The longest hiccup period searched for (an epoch of a small dataset; longer is not a "hiccup").
HICCUP_MAX_PERIOD_S = 60.0

EVIDENCE_RANKS = 4  # per-rank / per-GPU evidence lines shown before "… N more"
_SUMMARY_IDS = ("healthy", "collecting", "no_data")
SEVERITY_ORDER = {name: i for i, name in enumerate(SEVERITIES)}  # critical < warning < info
SEVERE = "critical"

# frames of a main thread starting an epoch's workers (no persistent_workers)
_EPOCH_START_FRAME_NAMES = ("DataLoader.__iter__", "_MultiProcessingDataLoaderIter.__init__", "_get_iterator")
_STACKS_HINT = "attach with `gputop --pid PID` (or `gputop report --pid PID`) to see the stacks"


# ----------------------------------------------------------------- small numeric helpers


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Linear-interpolated percentile (q in 0..100) of the non-None values; None if there are none."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def mean(values: Iterable[Optional[float]]) -> Optional[float]:
    data = [v for v in values if v is not None]
    return sum(data) / len(data) if data else None


def _pct(fraction: float) -> str:
    return f"{100.0 * fraction:.0f}%"


def _gib(n: Optional[float]) -> str:
    return "n/a" if n is None else f"{n / (1 << 30):.1f} GiB"


def _frames_signature(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """Frames compare by name, file and line: two dumps with equal signatures stand at the same place."""
    return tuple(frames)


def _has_frame(frames: Sequence[Frame], names: Sequence[str]) -> bool:
    return any(f.name in names or f.name.endswith(tuple("." + n for n in names)) for f in frames)


def _frames_from(frames: Sequence[Frame], names: Sequence[str], outer: int = 2) -> tuple[str, ...]:
    """The innermost frame named in `names` plus `outer` callers, innermost last; the innermost few if none.

    A waiting main thread's innermost frames are queue/selector plumbing: the informative part is
    `_BaseDataLoaderIter.__next__` and the training-loop line that called it.
    """
    frames = list(frames)
    for i, f in enumerate(frames):
        if f.name in names:
            return tuple(format_frame(x) for x in reversed(frames[i : i + 1 + outer]))
    return _outer_frames(frames, outer + 1)


_WAIT_FRAMES = ("_BaseDataLoaderIter.__next__", "DataLoader.__iter__")


def _outer_frames(frames: Sequence[Frame], limit: int = 4) -> tuple[str, ...]:
    """The innermost `limit` frames as text, innermost LAST (traceback order)."""
    return tuple(format_frame(f) for f in reversed(list(frames)[:limit]))


def _dataset_frames(frames: Sequence[Frame], limit: int = 4) -> tuple[str, ...]:
    """The frames from the dataset entry point inwards (innermost last); the innermost few when none."""
    frames = list(frames)
    for i, f in enumerate(frames):
        if f.name.split(".")[-1] in ("__getitem__", "__getitems__", "__iter__", "__next__") and "torch/utils/data" not in f.filename:
            return tuple(format_frame(x) for x in reversed(frames[max(0, i + 1 - limit) : i + 1]))
    return _outer_frames(frames, limit)


# ----------------------------------------------------------------- per-rank observations


@dataclass
class StackSample:
    timestamp: float
    state: Optional[str]
    signature: tuple = ()
    frames: tuple[Frame, ...] = ()
    active: bool = True


@dataclass
class WorkerObs:
    pid: int
    samples: list[StackSample] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    last: Optional[ProcInfo] = None
    last_stacks: Optional[ProcessStacks] = None


@dataclass
class RankObs:
    """Everything the window says about one rank process."""

    pid: int
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    gpus: set[int] = field(default_factory=set)
    samples: list[StackSample] = field(default_factory=list)  # one per distinct main-thread dump
    cpu: list[float] = field(default_factory=list)
    worker_sets: list[tuple[float, frozenset[int]]] = field(default_factory=list)
    workers: dict[int, WorkerObs] = field(default_factory=dict)
    last: Optional[ProcInfo] = None
    stacks_error: Optional[str] = None

    @property
    def name(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"PID {self.pid}"

    @property
    def label(self) -> str:
        """"rank 3 (PID 1003)", or "PID 1003" for a process without a RANK."""
        return f"rank {self.rank} (PID {self.pid})" if self.rank is not None else f"PID {self.pid}"

    @property
    def states(self) -> Counter:
        return Counter(s.state for s in self.samples if s.state)

    def fraction(self, *states: str) -> float:
        n = len([s for s in self.samples if s.state])
        if not n:
            return 0.0
        counts = self.states
        return sum(counts[s] for s in states) / n

    @property
    def input_fraction(self) -> float:
        """Share of dumps in the input pipeline: waiting for workers, or running dataset code itself."""
        return self.fraction(WAITING_FOR_DATA, IN_DATASET)

    @property
    def n(self) -> int:
        return len([s for s in self.samples if s.state])


def _state_of(rank_state: Optional[str], stacks: Optional[ProcessStacks]) -> Optional[str]:
    """The collector's classification of this dump; classify it here when a recording lacks it."""
    return rank_state or (classify_main_thread(stacks) if stacks is not None else None)


def collect_rank_observations(snaps: Sequence[Snapshot]) -> dict[int, RankObs]:
    """Per rank pid: its main-thread state per DISTINCT stack dump (a dump refreshed every 2 s appears in
    several 1 s snapshots; it is counted once), its CPU, its workers over time and theirs stacks."""
    ranks: dict[int, RankObs] = {}
    for snap in snaps:
        job = snap.job
        if job is None:
            continue
        for r in job.ranks:
            pid = r.proc.pid
            obs = ranks.get(pid)
            if obs is None:
                obs = ranks[pid] = RankObs(pid=pid)
            obs.rank = r.rank if r.rank is not None else obs.rank
            obs.local_rank = r.local_rank if r.local_rank is not None else obs.local_rank
            obs.gpus.update(r.gpus)
            obs.last = r.proc
            if r.proc.cpu_percent is not None and not r.proc.exited:
                obs.cpu.append(r.proc.cpu_percent)
            obs.worker_sets.append((snap.timestamp, frozenset(w.pid for w in r.workers)))
            stacks = job.stacks.get(pid)
            if stacks is not None and stacks.error:
                obs.stacks_error = stacks.error
            if stacks is not None and not stacks.error and stacks.threads:
                if not obs.samples or stacks.timestamp > obs.samples[-1].timestamp:
                    main = main_thread(stacks)
                    frames = main.frames if main else ()
                    obs.samples.append(
                        StackSample(
                            stacks.timestamp,
                            _state_of(r.main_thread_state, stacks),
                            _frames_signature(frames),
                            frames,
                            main.active if main else True,
                        )
                    )
            elif stacks is None and r.main_thread_state:
                # a state without a dump (collector that classifies in place): one sample per snapshot
                obs.samples.append(StackSample(snap.timestamp, r.main_thread_state))
            for w in r.workers:
                wobs = obs.workers.get(w.pid)
                if wobs is None:
                    wobs = obs.workers[w.pid] = WorkerObs(w.pid)
                wobs.last = w
                if w.cpu_percent is not None and not w.exited:
                    wobs.cpu.append(w.cpu_percent)
                ws = job.stacks.get(w.pid)
                if ws is not None and not ws.error and ws.threads:
                    if not wobs.samples or ws.timestamp > wobs.samples[-1].timestamp:
                        wm = main_thread(ws)
                        wf = own_frames(wm) if wm else ()
                        wobs.last_stacks = ws
                        wobs.samples.append(StackSample(ws.timestamp, None, _frames_signature(wf), wf, wm.active if wm else True))
    return ranks


# ----------------------------------------------------------------- per-GPU series


@dataclass
class GpuObs:
    index: int
    name: str = ""
    util: list[Optional[float]] = field(default_factory=list)
    memory: list[Optional[int]] = field(default_factory=list)
    memory_total: Optional[int] = None
    timestamps: list[float] = field(default_factory=list)
    samples: list[GpuSample] = field(default_factory=list)
    lost_at: Optional[float] = None
    missing_after: Optional[float] = None

    @property
    def util_values(self) -> list[float]:
        return [u for u in self.util if u is not None]

    @property
    def mean_util(self) -> Optional[float]:
        return mean(self.util)

    def holds_memory(self, used: Optional[int]) -> bool:
        if used is None:
            return False
        return used >= HELD_MEMORY_BYTES

    @property
    def process_pids(self) -> set[int]:
        pids: set[int] = set()
        for s in self.samples:
            for p in s.processes or ():
                pids.add(p.pid)
        return pids


def collect_gpu_observations(snaps: Sequence[Snapshot]) -> dict[int, GpuObs]:
    gpus: dict[int, GpuObs] = {}
    for snap in snaps:
        present = set()
        for g in snap.gpus:
            obs = gpus.get(g.index)
            if obs is None:
                obs = gpus[g.index] = GpuObs(g.index, g.name)
            present.add(g.index)
            obs.timestamps.append(snap.timestamp)
            obs.samples.append(g)
            if g.lost:
                if obs.lost_at is None:
                    obs.lost_at = snap.timestamp
                obs.util.append(None)
                obs.memory.append(None)
                continue
            obs.util.append(g.utilization_gpu)
            obs.memory.append(g.memory_used)
            if g.memory_total:
                obs.memory_total = g.memory_total
        for index, obs in gpus.items():
            if index not in present and obs.missing_after is None:
                obs.missing_after = snap.timestamp
    return gpus


# ----------------------------------------------------------------- the context all checks share


@dataclass
class Context:
    history: History
    snaps: list[Snapshot]
    ranks: dict[int, RankObs]
    gpus: dict[int, GpuObs]
    bench: Optional[dict[str, Any]]
    duration: float
    interval: float

    @property
    def job_gpus(self) -> list[int]:
        used = sorted({g for r in self.ranks.values() for g in r.gpus})
        return [g for g in used if g in self.gpus]

    @property
    def have_gpu_data(self) -> bool:
        return any(o.util_values for o in self.gpus.values())

    def focus_gpus(self) -> list[GpuObs]:
        """GPUs the diagnosis is about: the job's, else those holding memory or processes, else all."""
        if self.job_gpus:
            return [self.gpus[i] for i in self.job_gpus]
        used = [o for o in self.gpus.values() if o.process_pids or any(o.holds_memory(m) for m in o.memory)]
        return used or list(self.gpus.values())

    def cores(self) -> int:
        latest = self.snaps[-1].host.cpu_percent if self.snaps else ()
        return len(latest) or self.history.machine.cpu_count or 1


def _bench_dict(bench: Any) -> Optional[dict[str, Any]]:
    if bench is None:
        return None
    if isinstance(bench, dict):
        return bench
    to_dict = getattr(bench, "to_dict", None)
    return to_dict() if callable(to_dict) else None


def _bench_wait_fraction(bench: Optional[dict[str, Any]]) -> tuple[Optional[float], str]:
    """The benchmark's measured data-wait fraction (active consumption first: it times every batch)."""
    if not bench:
        return None, ""
    for key, what in (("consumption", "timed __next__ (active benchmark)"), ("passive", "py-spy record at 100 Hz (passive benchmark)")):
        part = bench.get(key) or {}
        value = part.get("wait_fraction") if isinstance(part, dict) else None
        if isinstance(value, (int, float)):
            return float(value), what
    return None, ""


def _bench_recommendation(bench: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if not bench:
        return None
    rec = bench.get("recommendation")
    return rec if isinstance(rec, dict) and rec else None


# ----------------------------------------------------------------- public API


def diagnose(history: History, bench: Any = None, *, window: Optional[float] = DIAGNOSIS_WINDOW_S) -> list[Finding]:
    """All findings over the last `window` seconds of history (None: all of it), most severe first; never empty."""
    snaps = history.window(window) if window is not None else list(history)
    if not snaps:
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
    times = [s.timestamp for s in snaps]
    duration = times[-1] - times[0]
    dts = [b - a for a, b in zip(times, times[1:]) if b > a]
    ctx = Context(
        history=history,
        snaps=snaps,
        ranks=collect_rank_observations(snaps),
        gpus=collect_gpu_observations(snaps),
        bench=_bench_dict(bench),
        duration=duration,
        interval=statistics.median(dts) if dts else 1.0,
    )
    findings: list[Finding] = []
    hangs = check_hang(ctx)
    findings += hangs
    hung_pids = {p for f in hangs for p in f.pids}
    hung_gpus = {g for f in hangs for g in f.gpus}
    findings += check_misplacement(ctx)
    stragglers = check_straggler(ctx, exclude=hung_pids)
    findings += stragglers
    facts = cpu_facts(ctx)
    hiccups = check_hiccup(ctx, exclude_gpus=hung_gpus)
    starvation = check_starvation(ctx, exclude=hung_pids | {p for f in stragglers for p in f.pids}, cpu_bound=facts.saturated)
    if not ctx.ranks:
        starvation += check_low_utilization(ctx, exclude_gpus=hung_gpus)
    if hiccups and starvation and starvation[0].id == "starvation":
        # A saw-tooth is the more specific shape of the same data wait: keep one finding, with both proofs.
        h = hiccups[0]
        s = starvation[0]
        severity = "critical" if SEVERITY_ORDER[s.severity] == 0 else h.severity
        hiccups[0] = _replace(h, severity=severity, evidence=h.evidence + s.evidence)
        starvation = []
    findings += hiccups + starvation
    input_bound = any(
        f.id in ("starvation", "hiccup", "straggler") and f.severity in ("critical", "warning") for f in findings
    )
    findings += check_cpu_bound(ctx, facts, input_bound=input_bound)
    findings += check_memory_pressure(ctx)
    findings += check_infrastructure(ctx)
    if not any(f.severity in ("critical", "warning") for f in findings):
        findings.insert(0, healthy_finding(ctx))
    # the plain-words summary (healthy / collecting) leads the info findings it sums up
    findings.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 9), f.id not in _SUMMARY_IDS, -f.confidence))
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


def _replace(f: Finding, **changes: Any) -> Finding:
    import dataclasses

    return dataclasses.replace(f, **changes)


def _confidence(n_samples: int, full_at: int, margin: float = 1.0) -> float:
    """More samples and a wider margin over the threshold -> more confidence (0.3..0.95)."""
    base = min(1.0, n_samples / float(full_at))
    return round(max(0.3, min(0.95, 0.3 + 0.65 * base * max(0.0, min(1.0, margin)))), 2)


# ----------------------------------------------------------------- starvation


def _suggested_workers(
    ctx: Context, ranks: Sequence[RankObs], input_fraction: float, gpu_mean: Optional[float]
) -> tuple[int, str]:
    """Workers per rank from the loader arithmetic, and that arithmetic as one line.

    With a share `f` of the wall time spent on input, one step's GPU work takes (1 - f) of a cycle.
    With num_workers=0 the rank prepares a batch itself in f of it; with n workers that keep the rank
    waiting, each worker needs n cycles per batch.  Workers needed ≈ prep time ÷ step time × margin
    (`loader_math.workers_needed`, the same rule `gputop bench` applies to measured times).
    """
    current = max((len(r.worker_sets[-1][1]) if r.worker_sets else 0) for r in ranks) if ranks else 0
    source = f"the {_pct(input_fraction)} input share of the stack dumps"
    if gpu_mean is not None and 1.0 - gpu_mean / 100.0 > input_fraction:
        # The GPUs' idle share bounds the input share from above and is measured every second, where the
        # 2 s dumps undercount a rank that is rarely caught mid-read: size for what the GPUs lose.
        input_fraction = 1.0 - gpu_mean / 100.0
        source = f"the GPUs' {_pct(input_fraction)} idle share"
    step = max(1.0 - input_fraction, 0.05)  # a job that only ever waits still steps now and then
    prep = input_fraction if current == 0 else float(current)
    needed = max(current + 1, workers_needed(prep, step))
    arithmetic = (
        f"# workers needed ≈ prep ÷ step × {LOADER_MARGIN:g} = {prep:.2f} ÷ {step:.2f} × {LOADER_MARGIN:g}"
        f" → {needed} (prep and step as shares of a {'step' if current == 0 else 'batch'} cycle,"
        f" from {source})\n"
        f"# cap: if the workers are CPU-bound, {max(1, len(ctx.ranks))} rank(s) × num_workers must fit the"
        f" {ctx.cores()} cores; `gputop bench` measures prep, step and CPU per worker"
    )
    return needed, arithmetic


def _loader_code(kwargs: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"DataLoader(dataset, batch_size=..., {args})"


# z of the one-sided lower bound on an input fraction: ~84% confidence.  One waiting dump in 19 (5.3%) is
# not evidence of a 5% wait; 24 in 240 (10%) is.
WILSON_Z = 1.0


def wilson_lower(hits: int, n: int, z: float = WILSON_Z) -> float:
    """Lower end of the Wilson score interval for a proportion of `hits` in `n` samples."""
    if n <= 0:
        return 0.0
    p = hits / n
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / denom)


def pooled_input_fraction(ranks: Sequence[RankObs]) -> tuple[float, float]:
    """(fraction, lower bound) of all these ranks' dumps spent in the input pipeline, pooled across ranks."""
    n = sum(r.n for r in ranks)
    hits = sum(r.states[WAITING_FOR_DATA] + r.states[IN_DATASET] for r in ranks)
    return (hits / n if n else 0.0), wilson_lower(hits, n)


def check_starvation(ctx: Context, *, exclude: set[int] = frozenset(), cpu_bound: bool = False) -> list[Finding]:
    ranks = [r for r in ctx.ranks.values() if r.pid not in exclude and r.n >= 1]
    bench_wait, bench_how = _bench_wait_fraction(ctx.bench)
    gpu_mean = mean(o.mean_util for o in ctx.focus_gpus()) if ctx.have_gpu_data else None

    measured = [r for r in ranks if r.n >= MIN_STACK_SAMPLES]
    if not measured and bench_wait is None:
        return []

    evidence: list[str] = []
    frames: tuple[str, ...] = ()
    if measured:
        job_fraction, job_low = pooled_input_fraction(measured)
        worst = max(measured, key=lambda r: r.input_fraction)
        for r in sorted(measured, key=lambda r: -r.input_fraction)[:EVIDENCE_RANKS]:
            counts = r.states
            evidence.append(
                f"{r.label}: input {_pct(r.input_fraction)} of {r.n} stack dumps "
                f"(waiting for data {counts[WAITING_FOR_DATA]}, in dataset code {counts[IN_DATASET]})"
            )
        if len(measured) > EVIDENCE_RANKS:
            evidence.append(f"… {len(measured) - EVIDENCE_RANKS} more rank(s)")
        evidence.append(
            f"all {len(measured)} rank(s): input {_pct(job_fraction)} of {sum(r.n for r in measured)} dumps "
            f"(at least {_pct(job_low)} at ~84% confidence)"
        )
        n_samples = sum(r.n for r in measured)
    else:
        job_fraction = job_low = bench_wait or 0.0
        worst = None
        n_samples = 0
    if bench_wait is not None:
        # the benchmark samples at 100 Hz (or times every batch): more precise than 2 s dumps
        evidence.insert(0, f"benchmark: data wait {_pct(bench_wait)} of wall time, measured by {bench_how}")
        job_fraction = job_low = bench_wait
        n_samples = max(n_samples, 100)

    if job_fraction < INPUT_BOUND_MODERATE or job_low < INPUT_BOUND_MODERATE:
        return []  # not input-bound, or too few dumps to tell 5% from noise
    if gpu_mean is not None:
        evidence.append(f"GPU utilization of the job's GPUs: mean {gpu_mean:.0f}%")

    level = "highly" if job_fraction >= INPUT_BOUND_HIGH else "moderately"
    severity = "critical" if level == "highly" else "warning"
    if gpu_mean is not None and gpu_mean >= BUSY_UTILIZATION:
        # CUDA runs ahead of the host: a host wait while the GPUs stay busy is overlapped, not lost.
        severity = "info"
        evidence.append(f"the GPUs stay busy (≥{BUSY_UTILIZATION:.0f}%), so the host-side wait overlaps GPU work")

    who = worst.name if worst is not None else "the benchmarked rank"
    shown = worst.input_fraction if worst is not None else job_fraction
    in_dataset = worst is not None and worst.states[IN_DATASET] > worst.states[WAITING_FOR_DATA]
    if worst is not None:
        sample = next((s for s in reversed(worst.samples) if s.state in (WAITING_FOR_DATA, IN_DATASET) and s.frames), None)
        if sample is not None:
            frames = _dataset_frames(sample.frames) if sample.state == IN_DATASET else _frames_from(sample.frames, _WAIT_FRAMES)
        hot = _hot_worker_frames(worst)
        if hot:
            frames = frames + hot[1]
            evidence.append(hot[0])

    rec = _bench_recommendation(ctx.bench)
    if rec:
        kwargs = rec
        action = "apply the benchmark's loader settings"
    else:
        workers, arithmetic = _suggested_workers(ctx, measured or ranks, job_fraction, gpu_mean)
        kwargs = {"num_workers": workers, "prefetch_factor": 4, "pin_memory": True, "persistent_workers": True}
        action = f"raise num_workers to {workers}, prefetch, pin memory"
    fix_lines = [action, _loader_code(kwargs)]
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
        summary = f"Input-bound ({level}): {who} spends {_pct(shown)} of its time in dataset code (num_workers=0)"
    else:
        summary = f"Input-bound ({level}): {who} waits for data {_pct(shown)} of the time"
    if severity == "info":
        summary = f"Host waits for data {_pct(shown)} of the time, but the GPUs stay busy"
    margin = (job_fraction - INPUT_BOUND_MODERATE) / (INPUT_BOUND_HIGH - INPUT_BOUND_MODERATE)
    return [
        Finding(
            id="starvation",
            title="Continuous starvation: the DataLoader cannot feed the GPUs",
            severity=severity,
            confidence=_confidence(n_samples, 15, margin),
            label=LABEL_CODE,
            summary=summary,
            evidence=tuple(evidence),
            frames=frames,
            fix="\n".join(fix_lines),
            gpus=tuple(sorted({g for r in measured for g in r.gpus})),
            pids=tuple(r.pid for r in measured if r.input_fraction >= INPUT_BOUND_MODERATE),
        )
    ]


def _hot_worker_frames(rank: RankObs) -> Optional[tuple[str, tuple[str, ...]]]:
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
        o for o in ctx.focus_gpus() if o.index not in exclude_gpus and (o.process_pids or any(o.holds_memory(m) for m in o.memory))
    ]
    low = [o for o in busy_candidates if o.mean_util is not None and HANG_UTILIZATION_MAX < o.mean_util < LOW_UTILIZATION]
    if not low:
        return []
    evidence = tuple(f"GPU {o.index}: mean utilization {o.mean_util:.0f}%, memory {_gib(o.memory[-1])} held" for o in low)
    return [
        Finding(
            id="low_utilization",
            title="Low GPU utilization (cause needs the job's stacks)",
            severity="warning",
            confidence=0.5,
            label=LABEL_CODE,
            summary=f"GPU utilization is low ({', '.join(f'GPU {o.index} {o.mean_util:.0f}%' for o in low[:4])})",
            evidence=evidence,
            fix=f"{_STACKS_HINT}\n# it tells a starving DataLoader from a collective wait or a sync",
            gpus=tuple(o.index for o in low),
        )
    ]


# ----------------------------------------------------------------- hang / silent misfire


def _trailing_idle_seconds(obs: GpuObs) -> float:
    """How long (seconds) the GPU has been at ~0% utilization at the end of the window."""
    start = None
    for t, u in zip(reversed(obs.timestamps), reversed(obs.util)):
        if u is None or u > HANG_UTILIZATION_MAX:
            break
        start = t
    return (obs.timestamps[-1] - start) if start is not None else 0.0


def _trailing_constant(samples: Sequence[StackSample]) -> tuple[float, Optional[StackSample], int]:
    """(seconds, sample, count) the main/worker stack has stayed identical at the end of the window."""
    if not samples:
        return 0.0, None, 0
    last = samples[-1]
    first = last
    count = 0
    for s in reversed(samples):
        if s.signature != last.signature or s.state != last.state:
            break
        first = s
        count += 1
    return last.timestamp - first.timestamp, last, count


def _in_dataset_code(frames: Sequence[Frame]) -> bool:
    return any(f.name.split(".")[-1] in ("__getitem__", "__getitems__", "fetch") for f in frames)


def _stuck_worker(rank: RankObs) -> Optional[tuple[str, tuple[str, ...], WorkerObs]]:
    """A worker of this rank that is dead, or stuck in dataset code with an unchanging stack."""
    for w in rank.workers.values():
        if w.last is not None and (w.last.exited or w.last.state in ("Z", "X")):
            return (f"DataLoader worker PID {w.pid} of {rank.name} is dead (state {w.last.state}, exited={w.last.exited})", (), w)
    for w in rank.workers.values():
        secs, sample, count = _trailing_constant(w.samples)
        if sample is not None and count >= 2 and secs >= HANG_MIN_SECONDS and _in_dataset_code(sample.frames):
            cpu = mean(w.cpu[-5:])
            cpu_txt = f", CPU {cpu:.0f}%" if cpu is not None else ""
            return (
                f"DataLoader worker PID {w.pid} of {rank.name}: same stack in dataset code for {secs:.0f} s "
                f"({count} dumps{cpu_txt})",
                _dataset_frames(sample.frames),
                w,
            )
    return None


def check_hang(ctx: Context) -> list[Finding]:
    """Memory held and utilization ~0 for a sustained window, or a main thread frozen in one frame."""
    findings: list[Finding] = []
    hung: list[tuple[str, RankObs, float]] = []  # per finding: the frozen main thread's state, its rank, seconds
    claimed_gpus: set[int] = set()
    for rank in sorted(ctx.ranks.values(), key=lambda r: (r.rank is None, r.rank, r.pid)):
        if rank.last is not None and rank.last.exited:
            continue
        secs, sample, count = _trailing_constant(rank.samples)
        gpu_idle = [ctx.gpus[g] for g in sorted(rank.gpus) if g in ctx.gpus]
        idle_secs = min((_trailing_idle_seconds(o) for o in gpu_idle), default=None)
        gpu_busy = idle_secs is not None and idle_secs < HANG_MIN_SECONDS and any(o.util_values for o in gpu_idle)
        if sample is None or gpu_busy:
            continue
        state = sample.state
        stuck = _stuck_worker(rank) if state == WAITING_FOR_DATA else None
        frozen = count >= 2 and secs >= HANG_MIN_SECONDS
        if state == WAITING_FOR_DATA and not (frozen and stuck):
            continue  # a starving rank also waits; it hangs only if a worker is dead or frozen in dataset code
        if state == IN_DATASET and not frozen:
            continue
        if state in (COLLECTIVE, EXPLICIT_SYNC) and not frozen:
            continue
        if state not in (WAITING_FOR_DATA, IN_DATASET, COLLECTIVE, EXPLICIT_SYNC):
            continue
        evidence = [f"{rank.label}: main thread {state} in {count} consecutive dumps over {secs:.0f} s, same frame"]
        cpu = mean(rank.cpu[-5:])
        if cpu is not None:
            evidence.append(f"{rank.name} CPU {cpu:.0f}%")
        for o in gpu_idle:
            if o.util_values:
                evidence.append(
                    f"GPU {o.index}: utilization ≤{HANG_UTILIZATION_MAX:.0f}% for {_trailing_idle_seconds(o):.0f} s, memory {_gib(o.memory[-1])} held"
                )
        frames = _frames_from(sample.frames, _WAIT_FRAMES) if state == WAITING_FOR_DATA else _outer_frames(sample.frames, 4)
        if state == WAITING_FOR_DATA and stuck:
            what, wframes, _w = stuck
            evidence.append(what)
            frames = wframes or frames
            where = "a DataLoader worker died" if not wframes else "a DataLoader worker is stuck in dataset code"
            fix = (
                "find why that sample never loads (see the stuck frame); bound the wait with a DataLoader timeout\n"
                "DataLoader(..., timeout=120)  # raise instead of waiting forever on one worker\n"
                "# inside __getitem__: put timeouts on network/file reads; log and skip bad samples"
            )
        elif state == IN_DATASET:
            where = "its own dataset code never returns (num_workers=0)"
            frames = _dataset_frames(sample.frames)
            fix = (
                "find why __getitem__ never returns (see the stuck frame); add timeouts to its I/O\n"
                "# e.g. requests.get(url, timeout=30); open files from local disk, not a stalled mount"
            )
        elif state == COLLECTIVE:
            where = "it waits in a collective the other ranks never reached"
            fix = (
                "find the rank that did not reach the collective (a crashed or stuck rank, an uneven last batch)\n"
                "export NCCL_DEBUG=INFO TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # fail loudly instead of hanging\n"
                "dist.init_process_group(..., timeout=datetime.timedelta(minutes=5))\n"
                "DistributedSampler(..., drop_last=True)  # every rank runs the same number of steps"
            )
        else:
            where = "it waits in an explicit sync (torch.cuda.synchronize / .item())"
            fix = (
                "the host waits for GPU work that never finishes: check the last kernel/collective before it\n"
                "CUDA_LAUNCH_BLOCKING=1 python train.py  # pinpoints the kernel (debug runs only)"
            )
        held = [o for o in gpu_idle if o.holds_memory(o.memory[-1] if o.memory else None)]
        claimed_gpus.update(o.index for o in gpu_idle)
        findings.append(
            Finding(
                id="hang",
                title="Silent misfire: the job is stuck",
                severity="critical",
                confidence=_confidence(count, 6, secs / (2 * HANG_MIN_SECONDS)),
                label=LABEL_CODE,
                summary=f"Hang: {rank.name} stuck for {secs:.0f} s: {where}"
                + (f"; GPU {held[0].index} holds memory at 0%" if held else ""),
                evidence=tuple(evidence),
                frames=frames,
                fix=fix,
                gpus=tuple(o.index for o in gpu_idle),
                pids=(rank.pid,),
            )
        )
        hung.append((state, rank, secs))
    findings = _merge_collective_waiters(ctx, findings, hung)
    claimed_gpus |= {g for f in findings for g in f.gpus}
    findings += _gpu_only_hangs(ctx, claimed_gpus)
    return findings


def _merge_collective_waiters(ctx: Context, findings: list[Finding], hung: list[tuple[str, RankObs, float]]) -> list[Finding]:
    """One hang, one finding: ranks frozen in a collective wait for the rank that is stuck elsewhere.

    With a culprit (a rank stuck on data, in dataset code or in a sync) the waiters become its evidence.
    Without one, every rank waits in the collective: one finding, naming a rank that exited if there is
    one (the article's "NCCL timeout / incomplete group").
    """
    waiting = [(f, rank, secs) for f, (state, rank, secs) in zip(findings, hung) if state == COLLECTIVE]
    culprits = [f for f, (state, _r, _s) in zip(findings, hung) if state != COLLECTIVE]
    if not waiting:
        return findings
    names = ", ".join(rank.name for _f, rank, _s in waiting[:8]) + (" …" if len(waiting) > 8 else "")
    gpus = tuple(g for f, _r, _s in waiting for g in f.gpus)
    pids = tuple(p for f, _r, _s in waiting for p in f.pids)
    if culprits:
        first = culprits[0]
        merged = _replace(
            first,
            summary=first.summary + f"; {len(waiting)} other rank(s) wait for it in a collective",
            evidence=first.evidence + (f"{len(waiting)} other rank(s) frozen in a collective, waiting for it: {names}",),
            gpus=first.gpus + gpus,
            pids=first.pids + pids,
        )
        return [merged] + culprits[1:]
    first = waiting[0][0]
    longest = max(secs for _f, _r, secs in waiting)
    exited = [r for r in ctx.ranks.values() if r.last is not None and r.last.exited]
    evidence = first.evidence + (f"{len(waiting)} rank(s) frozen in the same collective: {names}",)
    summary = f"Hang: {len(waiting)} rank(s) stuck in a collective for {longest:.0f} s"
    if exited:
        evidence += tuple(f"{r.label} exited: the others wait for it" for r in exited)
        summary += f"; {exited[0].name} exited"
        gpus += tuple(g for r in exited for g in sorted(r.gpus) if g not in gpus)
    else:
        summary += "; no rank shows why (a rank outside this view, or a mismatched collective)"
    return [_replace(first, summary=summary, evidence=evidence, gpus=gpus, pids=pids)]


def _gpu_only_hangs(ctx: Context, claimed: set[int]) -> list[Finding]:
    """GPU evidence alone: memory held at ~0% for a sustained window (the third idle profile)."""
    out: list[Finding] = []
    candidates = ctx.focus_gpus() if ctx.ranks else list(ctx.gpus.values())
    stuck: list[tuple[GpuObs, float, bool]] = []
    for o in candidates:
        if o.index in claimed or not o.util_values or o.lost_at is not None:
            continue
        idle = _trailing_idle_seconds(o)
        if idle < HANG_MIN_SECONDS or not o.holds_memory(o.memory[-1] if o.memory else None):
            continue
        was_busy = any(u is not None and u > LOW_UTILIZATION for u in o.util[: max(1, len(o.util) - int(idle / max(ctx.interval, 1e-3)))])
        stuck.append((o, idle, was_busy))
    if not stuck:
        return []
    # a job whose ranks are all attached and none frozen is not hung on the GPU side alone - unless it stopped
    any_stopped = any(w for _o, _i, w in stuck)
    severity = "critical" if any_stopped or ctx.ranks else "warning"
    gpus_txt = ", ".join(f"GPU {o.index}" for o, _i, _w in stuck[:8])
    evidence = tuple(
        f"GPU {o.index}: utilization ≤{HANG_UTILIZATION_MAX:.0f}% for {idle:.0f} s"
        + (" after being busy" if was_busy else "")
        + f", memory {_gib(o.memory[-1])} held by PID(s) {', '.join(str(p) for p in sorted(o.process_pids)) or 'n/a'}"
        for o, idle, was_busy in stuck
    )
    out.append(
        Finding(
            id="hang",
            title="Silent misfire: memory held, nothing running",
            severity=severity,
            confidence=0.6 if any_stopped else 0.45,
            label=LABEL_CODE,
            summary=f"Silent misfire: {gpus_txt} {'holds' if len(stuck) == 1 else 'hold'} memory at 0% utilization for {max(i for _o, i, _w in stuck):.0f} s",
            evidence=evidence,
            fix=(
                "dump the stacks of the processes holding the memory to see where they wait\n"
                "py-spy dump --pid PID   # or: gputop --pid PID\n"
                "# a stuck DataLoader worker, a rank waiting in NCCL for a dead peer, or an OOM-retry loop"
            ),
            gpus=tuple(o.index for o, _i, _w in stuck),
            pids=tuple(sorted({p for o, _i, _w in stuck for p in o.process_pids})),
        )
    )
    return out


# ----------------------------------------------------------------- misplacement


def check_misplacement(ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    warnings: list[str] = []
    for snap in reversed(ctx.snaps):
        if snap.job is not None:
            warnings = list(snap.job.warnings)
            break
    ranks = [r for r in ctx.ranks.values() if r.last is None or not r.last.exited]
    with_gpu = [r for r in ranks if r.gpus]
    n_gpus = len(ctx.gpus) or ctx.history.machine.gpu_count
    if len(with_gpu) >= 2:
        own = Counter()
        for r in with_gpu:
            for g in r.gpus:
                own[g] += 1
        used = sorted(own)
        share = {g: c for g, c in own.items() if c >= 2}
        if len(used) == 1 or (share and len(share) == len(used)):
            # every rank on the same card(s): "8 GPUs, 7 idle"
            g = used[0]
            idle = [i for i in sorted(ctx.gpus) if i not in used]
            evidence = [f"{len(with_gpu)} ranks hold memory on GPU {', '.join(map(str, used))}"]
            if idle:
                idle_util = mean(ctx.gpus[i].mean_util for i in idle)
                evidence.append(f"{len(idle)} of {n_gpus} GPUs unused" + (f" (mean utilization {idle_util:.0f}%)" if idle_util is not None else ""))
            if g in ctx.gpus and ctx.gpus[g].mean_util is not None:
                evidence.append(f"GPU {g}: mean utilization {ctx.gpus[g].mean_util:.0f}%")
            evidence += [f"collector: {w}" for w in warnings]
            findings.append(
                Finding(
                    id="misplacement",
                    title="Rank misplacement: all ranks on one GPU",
                    severity="critical",
                    confidence=0.9,
                    label=LABEL_CODE,
                    summary=f"{len(with_gpu)} ranks share GPU {g}; {len(idle)} of {n_gpus} GPUs idle",
                    evidence=tuple(evidence),
                    fix=(
                        "bind each rank to its own GPU before any CUDA call\n"
                        "local_rank = int(os.environ['LOCAL_RANK'])\n"
                        "torch.cuda.set_device(local_rank)\n"
                        "model = DDP(model.to(local_rank), device_ids=[local_rank])\n"
                        "# and launch one process per GPU: torchrun --nproc_per_node=NUM_GPUS train.py"
                    ),
                    gpus=tuple(used),
                    pids=tuple(r.pid for r in with_gpu),
                )
            )
        elif len(share) == 1 and all(len(r.gpus) >= 2 for r in with_gpu if list(share)[0] in r.gpus):
            g = list(share)[0]
            findings.append(
                Finding(
                    id="misplacement",
                    title="Stray CUDA contexts: every rank also holds memory on one GPU",
                    severity="warning",
                    confidence=0.8,
                    label=LABEL_CODE,
                    summary=f"{share[g]} ranks also hold memory on GPU {g} (stray CUDA context)",
                    evidence=tuple([f"{r.name}: GPUs {', '.join(map(str, sorted(r.gpus)))}" for r in with_gpu[:8]] + [f"collector: {w}" for w in warnings]),
                    fix=(
                        "call torch.cuda.set_device(local_rank) first, and map checkpoints off cuda:0\n"
                        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
                        "state = torch.load(path, map_location='cpu')"
                    ),
                    gpus=(g,),
                    pids=tuple(r.pid for r in with_gpu if g in r.gpus),
                )
            )
    if not findings and not ranks and n_gpus >= 2 and ctx.have_gpu_data:
        # no job attached: several processes on one busy GPU while the others hold nothing
        busy = [o for o in ctx.gpus.values() if (o.mean_util or 0) >= MISPLACED_BUSY_UTILIZATION and len(o.process_pids) >= 2]
        idle = [
            o
            for o in ctx.gpus.values()
            if (o.mean_util or 0) < MISPLACED_IDLE_UTILIZATION and not o.process_pids and o.lost_at is None
        ]
        if len(busy) == 1 and len(idle) >= 2:
            o = busy[0]
            findings.append(
                Finding(
                    id="misplacement",
                    title="Rank misplacement: several processes share one GPU",
                    severity="critical",
                    confidence=0.7,
                    label=LABEL_CODE,
                    summary=f"{len(o.process_pids)} processes share GPU {o.index}; {len(idle)} of {n_gpus} GPUs idle",
                    evidence=(
                        f"GPU {o.index}: mean utilization {o.mean_util:.0f}%, PIDs {', '.join(map(str, sorted(o.process_pids)))}",
                        f"idle GPUs with no process: {', '.join(str(i.index) for i in idle)}",
                    ),
                    fix=(
                        "bind each rank to its own GPU before any CUDA call\n"
                        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
                        "# launch one process per GPU: torchrun --nproc_per_node=NUM_GPUS train.py"
                    ),
                    gpus=(o.index,),
                    pids=tuple(sorted(o.process_pids)),
                )
            )
    if not findings and warnings and any("GPU" in w for w in warnings):
        findings.append(
            Finding(
                id="misplacement",
                title="Rank placement warning",
                severity="warning",
                confidence=0.6,
                label=LABEL_CODE,
                summary=warnings[0],
                evidence=tuple(f"collector: {w}" for w in warnings),
                fix="torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before any CUDA call\ntorch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
            )
        )
    return findings


# ----------------------------------------------------------------- straggler


_SYNC_STATES = (COLLECTIVE, FORWARD_BACKWARD, EXPLICIT_SYNC)


def check_straggler(ctx: Context, *, exclude: set[int] = frozenset()) -> list[Finding]:
    ranks = [r for r in ctx.ranks.values() if r.pid not in exclude and r.n >= MIN_STACK_SAMPLES]
    if len(ranks) < 2:
        return []
    slow = [r for r in ranks if r.input_fraction >= INPUT_BOUND_HIGH]
    fast = [r for r in ranks if r.input_fraction < INPUT_BOUND_MODERATE]
    if not slow or len(slow) > len(ranks) // 2 or len(slow) + len(fast) != len(ranks):
        return []
    others_sync = mean(r.fraction(*_SYNC_STATES) for r in fast) or 0.0
    if others_sync < STRAGGLER_OTHERS_SYNC_MIN:
        return []
    worst = max(slow, key=lambda r: r.input_fraction)
    others_coll = mean(r.fraction(COLLECTIVE) for r in fast) or 0.0
    sample = next((s for s in reversed(worst.samples) if s.state in (WAITING_FOR_DATA, IN_DATASET) and s.frames), None)
    other_sample = next(
        (s for state in _SYNC_STATES for r in fast for s in reversed(r.samples) if s.state == state and s.frames), None
    )
    frames: tuple[str, ...] = ()
    if sample is not None:
        frames += _frames_from(sample.frames, _WAIT_FRAMES)
    if other_sample is not None:
        frames += _outer_frames(other_sample.frames, 2)
    evidence = [
        f"{r.label}: waits for data {_pct(r.input_fraction)} of {r.n} dumps" for r in slow
    ] + [
        f"the other {len(fast)} ranks: input {_pct(mean(r.input_fraction for r in fast) or 0)}, in collective/backward/sync {_pct(others_sync)} "
        f"(collective alone {_pct(others_coll)})"
    ]
    hot = _hot_worker_frames(worst)
    if hot:
        evidence.append(hot[0])
    return [
        Finding(
            id="straggler",
            title="Straggler rank: one rank's loader holds back the others",
            severity="warning",
            confidence=_confidence(min(r.n for r in ranks), 15, (worst.input_fraction - INPUT_BOUND_MODERATE) / INPUT_BOUND_HIGH),
            label=LABEL_CODE,
            summary=f"Straggler: {worst.name} waits for data {_pct(worst.input_fraction)} of the time while "
            f"{len(fast)} other ranks wait for it",
            evidence=tuple(evidence),
            frames=frames,
            fix=(
                f"look at what is different on {worst.name}: its shard, its workers, its CPU cores\n"
                "# uneven shards: DistributedSampler(dataset, shuffle=True, drop_last=True)\n"
                "# slow samples on one shard: cache/pre-decode them; give every rank the same num_workers"
            ),
            gpus=tuple(sorted(worst.gpus)),
            pids=tuple(r.pid for r in slow),
        )
    ]


# ----------------------------------------------------------------- CPU-bound input


@dataclass
class CpuFacts:
    """What the CPU numbers say about the input pipeline's producers."""

    cores: int
    host_cpu: Optional[float]  # median of the all-core mean, percent
    samples: int
    n_workers: int
    pinned_workers: list[WorkerObs]
    pinned_ranks: list[RankObs]  # num_workers=0 ranks decoding on their main thread at ~100%

    @property
    def saturated(self) -> bool:
        return self.host_cpu is not None and self.host_cpu >= CORES_SATURATED_PERCENT and bool(self.pinned_workers or self.pinned_ranks)

    @property
    def oversubscribed(self) -> bool:
        return self.n_workers > self.cores


def cpu_facts(ctx: Context) -> CpuFacts:
    host_means = [statistics.fmean(s.host.cpu_percent) for s in ctx.snaps if s.host.cpu_percent]
    current: set[int] = set()
    for r in ctx.ranks.values():
        if r.worker_sets:
            current |= r.worker_sets[-1][1]
    pinned = [
        w
        for r in ctx.ranks.values()
        for p, w in r.workers.items()
        if p in current and w.cpu and statistics.median(w.cpu) >= PROCESS_PINNED_PERCENT
    ]
    pinned_ranks = [
        r
        for r in ctx.ranks.values()
        if r.cpu
        and statistics.median(r.cpu) >= PROCESS_PINNED_PERCENT
        and r.states[IN_DATASET] > 0
        and not (r.worker_sets and r.worker_sets[-1][1])
    ]
    return CpuFacts(
        cores=ctx.cores(),
        host_cpu=statistics.median(host_means) if host_means else None,
        samples=len(host_means),
        n_workers=len(current),
        pinned_workers=pinned,
        pinned_ranks=pinned_ranks,
    )


def check_cpu_bound(ctx: Context, facts: CpuFacts, *, input_bound: bool) -> list[Finding]:
    """Producers pinned with every core busy, or more workers than cores.

    It is a problem (warning) only while the job is input-bound: a saturated CPU that keeps the GPUs fed
    costs nothing, and oversubscribed workers that mostly wait on storage are merely noted (info).
    """
    if not (facts.saturated or facts.oversubscribed):
        return []
    evidence: list[str] = []
    if facts.saturated:
        evidence.append(f"host CPU: median {facts.host_cpu:.0f}% over {facts.cores} cores for {ctx.duration:.0f} s")
        if facts.pinned_workers:
            evidence.append(f"{len(facts.pinned_workers)}/{facts.n_workers} DataLoader workers at ≥{PROCESS_PINNED_PERCENT:.0f}% of a core")
        if facts.pinned_ranks:
            evidence.append(f"{len(facts.pinned_ranks)} rank(s) decode on their main thread at ≥{PROCESS_PINNED_PERCENT:.0f}% (num_workers=0)")
    if facts.oversubscribed:
        evidence.append(f"{facts.n_workers} DataLoader workers on {facts.cores} cores ({facts.n_workers / facts.cores:.1f} per core)")
    if facts.saturated:
        summary = f"CPU-bound input: cores {facts.host_cpu:.0f}% busy, {len(facts.pinned_workers) or len(facts.pinned_ranks)} loader process(es) pinned at 100%"
    else:
        summary = f"CPU oversubscribed: {facts.n_workers} DataLoader workers on {facts.cores} cores"
    if not input_bound:
        evidence.append("the GPUs are not waiting for input, so this costs nothing now")
    n_ranks = max(1, len(ctx.ranks))
    budget = max(1, (facts.cores * 2) // 3 // n_ranks)
    return [
        Finding(
            id="cpu_bound",
            title="CPU-bound input: the cores cannot preprocess fast enough" if facts.saturated else "More DataLoader workers than cores",
            severity="warning" if input_bound else "info",
            confidence=_confidence(facts.samples, 15, 1.0 if facts.saturated else 0.6),
            label=LABEL_CODE,
            summary=summary,
            evidence=tuple(evidence),
            fix=(
                f"make each sample cheaper, and keep num_workers ≤ {budget} per rank ({facts.cores} cores, {n_ranks} rank(s))\n"
                f"DataLoader(..., num_workers={budget}, persistent_workers=True)\n"
                "# cache decoded/resized samples once; pack small files (WebDataset); decode on the GPU (NVIDIA DALI)"
            ),
            pids=tuple(w.pid for w in facts.pinned_workers) + tuple(r.pid for r in facts.pinned_ranks),
        )
    ]


# ----------------------------------------------------------------- periodic hiccup


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


def detect_collapse_period(series_list: Sequence[Sequence[Optional[float]]], timestamps: Sequence[float]) -> Optional[tuple[float, int, list[float]]]:
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


def check_hiccup(ctx: Context, *, exclude_gpus: set[int] = frozenset()) -> list[Finding]:
    gpus = [o for o in ctx.focus_gpus() if o.index not in exclude_gpus and o.lost_at is None and len(o.util_values) >= HICCUP_MIN_SAMPLES]
    restarts, restart_period, restart_evidence = _worker_restarts(ctx)
    epoch_starts = sum(1 for r in ctx.ranks.values() for s in r.samples if _has_frame(s.frames, _EPOCH_START_FRAME_NAMES))
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
        found = detect_period([o.util for o in swing_gpus], max_lag=int(HICCUP_MAX_PERIOD_S / max(ctx.interval, 1e-3)))
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
    wait = mean(r.input_fraction for r in measured) if measured else None
    coll = mean(r.fraction(COLLECTIVE) for r in measured) if measured else None
    frames: tuple[str, ...] = ()
    restart_matches = restart_period is not None and abs(restart_period - period) <= PERIOD_MATCH_TOLERANCE * period
    if restarts >= 2 and (restart_matches or epoch_starts):
        cause = "epoch-boundary worker restarts"
        evidence += restart_evidence
        if restart_period:
            evidence.append(f"workers restart every {restart_period:.1f} s, matching the {period:.1f} s period")
        if epoch_starts:
            evidence.append(f"{epoch_starts} stack dump(s) caught a rank starting new workers (DataLoader.__iter__)")
            sample = next(s for r in ctx.ranks.values() for s in r.samples if _has_frame(s.frames, _EPOCH_START_FRAME_NAMES))
            frames = _frames_from(sample.frames, ("_MultiProcessingDataLoaderIter.__init__",), outer=3)
        fix = "keep the workers alive across epochs and prefetch deeper\nDataLoader(..., persistent_workers=True, prefetch_factor=4)"
        confidence = 0.85
    elif wait is not None and wait >= INPUT_BOUND_MODERATE and (coll is None or wait >= coll):
        cause = "loader stalls"
        evidence.append(f"ranks wait for data {_pct(wait)} of the time (mean over {len(measured)} rank(s))")
        sample = next((s for r in measured for s in reversed(r.samples) if s.state == WAITING_FOR_DATA and s.frames), None)
        if sample is not None:
            frames = _frames_from(sample.frames, _WAIT_FRAMES)
        fix = (
            "smooth the loader: more workers, deeper prefetch, cache slow samples\n"
            "DataLoader(..., num_workers=N, prefetch_factor=4, pin_memory=True, persistent_workers=True)\n"
            "# if every k-th batch is slow: pre-decode/cache those samples"
        )
        confidence = 0.75
    elif coll is not None and coll >= COMMUNICATION_HEAVY:
        cause = "collective waits"
        evidence.append(f"ranks wait in collectives {_pct(coll)} of the time (torch-tb-profiler flags > {_pct(COMMUNICATION_HEAVY)})")
        sample = next((s for r in measured for s in reversed(r.samples) if s.state == COLLECTIVE and s.frames), None)
        if sample is not None:
            frames = _outer_frames(sample.frames, 4)
        fix = (
            "cut the all-reduce cost or its skew\n"
            "with model.no_sync(): loss.backward()  # accumulate k micro-batches, all-reduce once\n"
            "# check `nvidia-smi topo -m` (NVLink vs PIX/SYS) and stragglers; try NCCL_P2P_DISABLE=1 only as an experiment"
        )
        confidence = 0.7
    else:
        cause = "cause not determined"
        fix = f"{_STACKS_HINT}\n# loader stalls show as 'waiting for data', all-reduce waits as 'collective/barrier'"
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


# ----------------------------------------------------------------- memory pressure (OOM / fragmentation)


def check_memory_pressure(ctx: Context) -> list[Finding]:
    full: list[tuple[GpuObs, float]] = []
    for o in ctx.gpus.values():
        if not o.memory_total:
            continue
        fracs = [m / o.memory_total for m in o.memory if m is not None]
        if len(fracs) >= 2 and sum(f >= MEMORY_NEARLY_FULL for f in fracs) >= len(fracs) / 2:
            full.append((o, max(fracs)))
    if not full:
        return []
    return [
        Finding(
            id="memory_pressure",
            title="GPU memory nearly full (OOM / fragmentation risk)",
            severity="warning",
            confidence=0.7,
            label=LABEL_CODE,
            summary=f"GPU memory nearly full: {', '.join(f'GPU {o.index} {100 * f:.0f}%' for o, f in full[:4])}",
            evidence=tuple(f"GPU {o.index}: up to {_gib(max(m for m in o.memory if m is not None))} of {_gib(o.memory_total)}" for o, _f in full),
            fix=(
                "reduce fragmentation, or fix input shapes\n"
                "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True   # or max_split_size_mb:128\n"
                "torch.backends.cudnn.benchmark = False  # with dynamic shapes; pad/bucket inputs to fixed sizes"
            ),
            gpus=tuple(o.index for o, _f in full),
        )
    ]


# ----------------------------------------------------------------- infrastructure


def _norm(reason: str) -> str:
    return reason.replace("_", "").replace(" ", "").replace("-", "").lower()


# reason name fragments -> (what, severity). GpuIdle / AppClocks / SyncBoost / display are not problems.
_THROTTLE_KINDS = (
    ("hwthermal", "HW thermal slowdown", "critical"),
    ("hwpowerbrake", "HW power brake", "critical"),
    ("hwslowdown", "HW slowdown", "critical"),
    ("swthermal", "SW thermal slowdown", "warning"),
    ("thermal", "thermal slowdown", "warning"),
    ("powerbrake", "power brake", "critical"),
    ("slowdown", "HW slowdown", "critical"),
    ("swpowercap", "power cap", "info"),  # reaching the cap at full load is normal; a lowered limit is not
    ("powercap", "power cap", "info"),
)


def _throttle_kind(reason: str) -> Optional[tuple[str, str]]:
    key = _norm(reason)
    for fragment, what, severity in _THROTTLE_KINDS:
        if fragment in key:
            return what, severity
    return None


def check_infrastructure(ctx: Context) -> list[Finding]:
    return (check_lost_gpu(ctx) + check_pcie(ctx) + check_throttle(ctx) + check_ecc(ctx) + check_nvlink(ctx)
            + check_xids(ctx))


def _infra(id: str, title: str, severity: str, summary: str, evidence: Sequence[str], fix: str, gpus: Sequence[int], confidence: float) -> Finding:
    return Finding(
        id=id,
        title=title,
        severity=severity,
        confidence=confidence,
        label=LABEL_INFRA,
        summary=summary,
        evidence=tuple(evidence),
        fix=fix,
        gpus=tuple(gpus),
    )


def check_lost_gpu(ctx: Context) -> list[Finding]:
    lost = [o for o in ctx.gpus.values() if o.lost_at is not None or o.missing_after is not None]
    expected = ctx.history.machine.gpu_count
    seen = len(ctx.gpus)
    evidence = [
        f"GPU {o.index} ({o.samples[-1].pci_bus_id}): "
        + (f"lost at +{o.lost_at - ctx.snaps[0].timestamp:.0f} s (fell off the bus)" if o.lost_at is not None else f"missing since +{o.missing_after - ctx.snaps[0].timestamp:.0f} s")
        for o in lost
    ]
    if expected and seen < expected and not ctx.history.machine.gpu_error:
        evidence.append(f"the driver shows {seen} of the machine's {expected} GPUs")
    if not evidence:
        return []
    gpus = [o.index for o in lost]
    what = ", ".join(f"GPU {g}" for g in gpus) or f"{expected - seen} GPU(s)"
    return [
        _infra(
            "gpu_lost",
            "Lost GPU",
            "critical",
            f"{what} lost (fell off the bus)",
            evidence,
            "file a hardware ticket with the XID from the kernel log; drain the node\n"
            "dmesg -T | grep -i -E 'xid|NVRM'   # Xid 79 = fallen off the bus\n"
            "nvidia-smi -q -i GPU_INDEX",
            gpus,
            0.95,
        )
    ]


def check_pcie(ctx: Context) -> list[Finding]:
    out_ev: list[str] = []
    gpus: list[int] = []
    for o in ctx.gpus.values():
        loaded = [s for s in o.samples if not s.lost and (s.utilization_gpu or 0) >= PCIE_LOAD_UTILIZATION]
        any_s = [s for s in o.samples if not s.lost]
        width_down = [s for s in any_s if None not in (s.pcie.width_current, s.pcie.width_max) and s.pcie.width_current < s.pcie.width_max]
        gen_down = [s for s in loaded if None not in (s.pcie.gen_current, s.pcie.gen_max) and s.pcie.gen_current < s.pcie.gen_max]
        # width does not drop for power saving; generation does when idle, so it counts only under load
        bad = width_down if len(width_down) >= max(1, len(any_s) // 2) else (gen_down if len(gen_down) >= max(1, len(loaded) // 2) else [])
        if bad:
            s = bad[-1]
            p = s.pcie
            out_ev.append(
                f"GPU {o.index} ({s.pci_bus_id}): PCIe Gen{p.gen_current} x{p.width_current} of Gen{p.gen_max} x{p.width_max}"
                + (f" at {s.utilization_gpu:.0f}% utilization" if s.utilization_gpu is not None else "")
                + f" in {len(bad)} samples"
            )
            gpus.append(o.index)
    if not out_ev:
        return []
    return [
        _infra(
            "pcie_downgrade",
            "PCIe link below its maximum under load",
            "warning",
            f"PCIe link degraded on {', '.join(f'GPU {g}' for g in gpus)}",
            out_ev,
            "file a ticket: reseat the card/riser or check BIOS PCIe settings\n"
            "nvidia-smi -q -d PCI -i GPU_INDEX   # compare 'Link Width/Generation' Current vs Max under load",
            gpus,
            0.85,
        )
    ]


def check_throttle(ctx: Context) -> list[Finding]:
    """Thermal / HW-slowdown / power-brake throttling (the machine), and a power cap below the peers' limit."""
    hits: dict[int, Counter] = {}
    totals: dict[int, int] = {}
    severity_of: dict[str, str] = {}
    for o in ctx.gpus.values():
        samples = [s for s in o.samples if not s.lost and s.throttle_reasons is not None]
        totals[o.index] = len(samples)
        counts: Counter = Counter()
        for s in samples:
            for what, sev in {k for k in (_throttle_kind(r) for r in s.throttle_reasons or ()) if k}:
                counts[what] += 1
                severity_of[what] = sev
        hits[o.index] = Counter({w: n for w, n in counts.items() if totals[o.index] and n / totals[o.index] >= THROTTLE_MIN_FRACTION})
    findings: list[Finding] = []
    serious = {g: {w: n for w, n in c.items() if severity_of[w] != "info"} for g, c in hits.items()}
    serious = {g: c for g, c in serious.items() if c}
    if serious:
        kinds = sorted({w for c in serious.values() for w in c})
        sev = "critical" if any(severity_of[w] == "critical" for w in kinds) else "warning"
        evidence = []
        for g, c in sorted(serious.items()):
            o = ctx.gpus[g]
            temp = max((s.temperature for s in o.samples if not s.lost and s.temperature is not None), default=None)
            clocks = [s.clock_sm for s in o.samples if not s.lost and s.clock_sm]
            peers = [s.clock_sm for p in ctx.gpus.values() if p.index not in serious for s in p.samples if not s.lost and s.clock_sm]
            line = f"GPU {g}: " + ", ".join(f"{w} in {n}/{totals[g]} samples" for w, n in sorted(c.items()))
            if temp is not None:
                line += f"; max {temp:.0f} °C"
            if clocks:
                line += f"; SM clock median {statistics.median(clocks):.0f} MHz" + (f" (others {statistics.median(peers):.0f} MHz)" if peers else "")
            evidence.append(line)
        gpus_txt = ", ".join(f"GPU {g}" for g in sorted(serious))
        if any("thermal" in w for w in kinds):
            summary = f"Thermal throttling on {gpus_txt}"
            fix = "file a ticket: check cooling (fans, airflow, inlet temperature)\nnvidia-smi -q -d TEMPERATURE,PERFORMANCE -i GPU_INDEX"
        else:
            summary = f"{kinds[0][0].upper() + kinds[0][1:]} on {gpus_txt}"
            fix = "file a ticket: power delivery or the board asserts a slowdown\nnvidia-smi -q -d PERFORMANCE -i GPU_INDEX   # 'Clocks Event Reasons'"
        findings.append(_infra("throttle", f"Clock throttling: {', '.join(kinds)}", sev, summary, evidence, fix, sorted(serious), 0.85))
    capped = sorted(g for g, c in hits.items() if "power cap" in c)
    if capped:
        limits = {g: statistics.median([s.power_limit for s in ctx.gpus[g].samples if not s.lost and s.power_limit] or [0]) for g in ctx.gpus}
        top_limit = max(limits.values()) if limits else 0
        lowered = [g for g in capped if top_limit and limits[g] < POWER_LIMIT_LOWERED * top_limit]
        evidence = [f"GPU {g}: power cap active in {hits[g]['power cap']}/{totals[g]} samples, enforced limit {limits[g]:.0f} W" for g in capped]
        if lowered:
            evidence.append(f"the other GPUs' limit is {top_limit:.0f} W")
            findings.append(
                _infra(
                    "power_cap",
                    "Power limit lowered",
                    "warning",
                    f"Power-capped below its peers: {', '.join(f'GPU {g} at {limits[g]:.0f} W' for g in lowered)} (others {top_limit:.0f} W)",
                    evidence,
                    "file a ticket: restore the power limit (admin)\nnvidia-smi -q -d POWER -i GPU_INDEX   # 'Requested/Enforced/Default Power Limit'",
                    lowered,
                    0.8,
                )
            )
        else:
            findings.append(
                _infra(
                    "power_cap",
                    "At the power cap",
                    "info",
                    f"{', '.join(f'GPU {g}' for g in capped)} at the power cap (normal at full load)",
                    evidence,
                    "nothing to do unless clocks stay low; check the enforced limit\nnvidia-smi -q -d POWER,PERFORMANCE -i GPU_INDEX",
                    capped,
                    0.7,
                )
            )
    return findings


def check_ecc(ctx: Context) -> list[Finding]:
    crit: list[str] = []
    warn: list[str] = []
    gpus: set[int] = set()
    for o in ctx.gpus.values():
        samples = [s for s in o.samples if not s.lost]
        eccs = [s.ecc for s in samples if s.ecc is not None]
        if eccs:
            last, first = eccs[-1], eccs[0]
            unc = max(last.volatile_uncorrected or 0, last.aggregate_uncorrected or 0)
            if unc:
                crit.append(f"GPU {o.index}: {unc} uncorrectable ECC error(s) (volatile {last.volatile_uncorrected}, aggregate {last.aggregate_uncorrected})")
                gpus.add(o.index)
            grown = (last.volatile_corrected or 0) - (first.volatile_corrected or 0)
            if grown > 0:
                warn.append(f"GPU {o.index}: corrected ECC errors rose by {grown} during the window (now {last.volatile_corrected})")
                gpus.add(o.index)
        rows = [s.remapped_rows for s in samples if s.remapped_rows is not None]
        if rows:
            r = rows[-1]
            if r.failed or r.uncorrectable:
                crit.append(f"GPU {o.index}: remapped rows uncorrectable {r.uncorrectable}, remap failed={r.failed}")
                gpus.add(o.index)
            elif r.pending:
                warn.append(f"GPU {o.index}: row remapping pending (a reset is needed)")
                gpus.add(o.index)
    if not crit and not warn:
        return []
    sev = "critical" if crit else "warning"
    return [
        _infra(
            "ecc",
            "GPU memory errors (ECC / row remapping)",
            sev,
            f"Memory errors on {', '.join(f'GPU {g}' for g in sorted(gpus))}",
            crit + warn,
            "file a ticket: drain the GPU; pending remaps need a GPU reset, failed remaps an RMA\n"
            "nvidia-smi -q -d ECC,ROW_REMAPPER -i GPU_INDEX",
            sorted(gpus),
            0.9,
        )
    ]


def check_nvlink(ctx: Context) -> list[Finding]:
    latest: dict[int, tuple] = {}
    for o in ctx.gpus.values():
        for s in reversed(o.samples):
            if not s.lost and s.nvlink is not None:
                latest[o.index] = s.nvlink
                break
    machine_has_nvlink = any(any(link.active for link in links) for links in latest.values())
    evidence = []
    gpus = []
    for g, links in sorted(latest.items()):
        down = [link.link for link in links if not link.active]
        if down and (machine_has_nvlink or any(link.active for link in links)):
            evidence.append(f"GPU {g}: {len(down)} of {len(links)} NVLink links inactive (links {', '.join(map(str, down[:12]))})")
            gpus.append(g)
    if not evidence:
        return []
    return [
        _infra(
            "nvlink_down",
            "Inactive NVLink links",
            "warning",
            f"NVLink links down on {', '.join(f'GPU {g}' for g in gpus)}",
            evidence,
            "file a ticket: collectives fall back to slower paths\nnvidia-smi nvlink --status -i GPU_INDEX",
            gpus,
            0.85,
        )
    ]


def check_xids(ctx: Context) -> list[Finding]:
    """XIDs the driver reported: the hardware's go in a ticket, the ones a bad kernel causes go to the code."""
    seen: dict[tuple[int, float, int], XidMeaning] = {}
    for o in ctx.gpus.values():
        for event in distinct_xids(o.samples):
            seen[(o.index, event.timestamp, event.code)] = meaning_of(event.code)
    findings = []
    for label in (LABEL_INFRA, LABEL_CODE):
        events = sorted((key, m) for key, m in seen.items() if m.label == label)
        if not events:
            continue
        gpus = sorted({gpu for (gpu, _t, _c), _m in events})
        codes = list(dict.fromkeys(code for (_g, _t, code), _m in events))
        first = events[0][1]
        summary = (f"XID {first.code} on GPU {gpus[0]}: {first.meaning}" if len(events) == 1 else
                   f"XIDs {', '.join(map(str, codes))} on {', '.join(f'GPU {g}' for g in gpus)}")
        evidence = [f"GPU {gpu}: XID {code} at {time.strftime('%H:%M:%S UTC', time.gmtime(t))}: {m.meaning}"
                    for (gpu, t, code), m in events]
        evidence.append("the driver's own lines: dmesg -T | grep -i xid")
        fix = "\n".join(dict.fromkeys(m.action for _key, m in events))
        severity = "critical" if any(m.severity == "critical" for _key, m in events) else "warning"
        title = "GPU errors reported by the driver (XID)" if label == LABEL_INFRA else "GPU faults caused by the job (XID)"
        findings.append(Finding(id="xid" if label == LABEL_INFRA else "xid_code", title=title, severity=severity,
                                confidence=0.95, label=label, summary=summary, evidence=tuple(evidence), fix=fix,
                                gpus=tuple(gpus)))
    return findings


# ----------------------------------------------------------------- healthy


def healthy_finding(ctx: Context) -> Finding:
    """Nothing wrong found: say so plainly, with the numbers - or say that stacks are still being collected."""
    evidence: list[str] = []
    focus = ctx.focus_gpus()
    gpu_mean = mean(o.mean_util for o in focus) if ctx.have_gpu_data else None
    if gpu_mean is not None:
        evidence.append(f"GPU utilization: mean {gpu_mean:.0f}% over {len(focus)} GPU(s) for {ctx.duration:.0f} s")
    elif ctx.history.machine.gpu_error:
        evidence.append(f"no GPU data: {ctx.history.machine.gpu_error}")
    gpu_text = f"GPUs busy ({gpu_mean:.0f}%)" if gpu_mean is not None and gpu_mean >= LOW_UTILIZATION else (
        f"GPUs at {gpu_mean:.0f}%" if gpu_mean is not None else ""
    )
    live = [r for r in ctx.ranks.values() if not (r.last is not None and r.last.exited)]
    measured = [r for r in live if r.n >= MIN_STACK_SAMPLES]
    latest_job = next((s.job for s in reversed(ctx.snaps) if s.job is not None), None)
    stacks_error = (latest_job.stacks_error if latest_job else None) or next((r.stacks_error for r in live if r.stacks_error), None)
    fix = ""
    if live and not measured and stacks_error:
        evidence.append(f"stacks unavailable: {stacks_error}")
        summary = "No problem in the GPU/CPU data; stacks unavailable, so the input pipeline was not checked"
        return Finding("healthy", "No problem found (without stacks)", "info", 0.4, "", summary, tuple(evidence), fix=stacks_error)
    if live and not measured:
        most = max((r.n for r in live), default=0)
        summary = f"Collecting stacks: {most}/{MIN_STACK_SAMPLES} dumps per rank so far" + (f"; {gpu_text}" if gpu_text else "")
        return Finding("collecting", "Collecting stacks", "info", 0.3, "", summary, tuple(evidence))
    parts = [gpu_text] if gpu_text else []
    if measured:
        wait, _low = pooled_input_fraction(measured)  # the job's figure, as check_starvation has it
        n = sum(r.n for r in measured)
        evidence.append(f"median rank waits for data {_pct(wait)} of the time ({n} stack dumps; TF Profiler: < 5% is not input-bound)")
        noise = ", within noise of 5%" if wait >= INPUT_BOUND_MODERATE else ""
        parts.append(f"not input-bound (data wait {_pct(wait)}{noise})")
        states = Counter()
        for r in measured:
            states.update(r.states)
        top_state, top_n = states.most_common(1)[0]
        evidence.append(f"ranks' main threads mostly {top_state} ({_pct(top_n / max(1, sum(states.values())))} of dumps)")
        if gpu_mean is not None and gpu_mean < LOW_UTILIZATION:
            parts.append(f"ranks mostly {top_state}")
    if not ctx.ranks:
        evidence.append("no job attached: stack-based checks (starvation, hang, straggler) did not run")
        fix = _STACKS_HINT
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
        confidence=_confidence(len(ctx.snaps), 30),
        label="",
        summary=summary,
        evidence=tuple(evidence),
        fix=fix,
    )

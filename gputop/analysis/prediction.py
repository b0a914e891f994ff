"""What a fix buys: the steps/s a job would reach after a change, from what gputop measured, and what stops it.

A change removes one cost; the job then runs as fast as the next bottleneck allows.  Each bound is a speed-up
over the job now (a factor), computed from measured shares at their point and at both ends of their interval:

- *the step's compute*: a rank that waits for data a share `f` of the time spends (1 − f) of it on the step
  itself, which no loader change shortens: at most ×1/(1 − f).  Where the GPUs' busy share `u` is known, the
  GPU work of a step bounds it too: ×1/u.  Input made free (cached): the GPUs' work and the ranks' own host work
  take turns, ×1/(u + r/C) (`cached_step_bound`).
- *the workers*: n workers that keep the rank waiting make a batch each per prep time, so n' make n'/n as
  many (at num_workers=0 the rank prepares a batch in f of a step: n' workers make n'/f as many).
- *the cores*: producers cannot decode faster than the cores the job may use allow.  The job's CPU per step
  stays what it is, so the steps/s can grow at most by (cores it can get) ÷ (cores it uses now), capped by its
  cgroup; what it can get on a busy box lies between the idle cores (or a session's share) and its per-process
  fair share (`CoreUse.bound`).

The prediction is the smallest bound (its name is `limited_by`), its range the smallest bound at each end.
In steps/s where the job's step rate now is known (the job's own counters, the active benchmark's timed
batches, the trace's steps), else as a factor over the rate now.  Where gputop cannot bound a change, it says
so (`Unpredictable`, with the reason) rather than guessing.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from gputop.analysis.numbers import Share
from gputop.analysis.stack_classes import COLLECTIVE, FORWARD_BACKWARD, INPUT_WAIT_STATES
from gputop.analysis.thresholds import INTERVAL_Z

if TYPE_CHECKING:
    from gputop.analysis.observations import Context, RankObs, StateCounts
    from gputop.model import Finding, HostSample

COMPUTE = "the step's compute"
GPU_WORK = "the GPUs' work per step"
GPU_AND_HOST = "the GPUs' work and the host's own time a step"
WORKERS = "the workers"
CORES = "the cores"
MEMORY_BANDWIDTH = "the GPUs' memory traffic"
SLOW_RANK = "the other ranks' pace"
MAX_SHARE = 0.98  # a share this close to 1 leaves no step to divide by: the bound is open at that end


@dataclass(frozen=True)
class Bound:
    """One limit on the speed-up: ×`factor` (`low`–`high` from the measured intervals; `high` None: open)."""

    name: str
    factor: float
    low: float
    high: Optional[float]
    why: str  # the arithmetic, in words

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit": self.name,
            "speedup": _round(self.factor),
            "low": _round(self.low),
            "high": _round(self.high),
            "why": self.why,
        }


@dataclass(frozen=True)
class StepRate:
    """The job's steps per second per rank now, and where the figure comes from."""

    value: float
    source: str  # "the job's step counters", "timed batches (active benchmark)", "the trace's steps"
    low: Optional[float] = None  # the interval of a rate counted from samples (None: timed, its point)
    high: Optional[float] = None

    def text(self) -> str:
        if self.low is None or self.high is None or _num(self.low) == _num(self.high):
            return _num(self.value)
        return f"{_num(self.value)} ({_num(self.low)}–{_num(self.high)})"


@dataclass(frozen=True)
class Prediction:
    """What `change` buys: the smallest of `bounds`, over the step rate `now` when it is known."""

    change: str
    bounds: tuple[Bound, ...]
    assumes: str
    now: Optional[StepRate] = None
    epoch_batches: Optional[int] = None  # batches an epoch (the DataLoader's len), when known

    @property
    def limit(self) -> Bound:
        return min(self.bounds, key=lambda b: b.factor)

    @property
    def limited_by(self) -> str:
        return self.limit.name

    @property
    def factor(self) -> float:
        return self.limit.factor

    @property
    def low(self) -> float:
        return min(b.low for b in self.bounds)

    @property
    def high(self) -> Optional[float]:
        highs = [b.high for b in self.bounds if b.high is not None]
        return min(highs) if highs else None

    def with_rate(self, now: Optional[StepRate], epoch_batches: Optional[int] = None) -> "Prediction":
        return Prediction(self.change, self.bounds, self.assumes, now, epoch_batches or self.epoch_batches)

    def after(self) -> Optional[tuple[float, float, Optional[float]]]:
        """(steps/s after, low, high) when the rate now is known."""
        if self.now is None:
            return None
        now = self.now
        low, high = now.low if now.low is not None else now.value, now.high if now.high is not None else now.value
        return now.value * self.factor, low * self.low, None if self.high is None else high * self.high

    def figures(self) -> dict[str, Any]:
        """`figures["prediction"]` of the finding whose fix this is."""
        after = self.after()
        out: dict[str, Any] = {
            "change": self.change,
            "steps_per_s_now": _round(self.now.value) if self.now else None,
            "steps_per_s_after": _round(after[0]) if after else None,
            "after_low": _round(after[1]) if after else None,
            "after_high": _round(after[2]) if after else None,
            "speedup": _round(self.factor),
            "speedup_low": _round(self.low),
            "speedup_high": _round(self.high),
            "limited_by": self.limited_by,
            "assumes": self.assumes,
            "now_source": self.now.source if self.now else None,
            "now_low": _round(self.now.low) if self.now else None,
            "now_high": _round(self.now.high) if self.now else None,
            "bounds": [b.to_dict() for b in self.bounds],
            "epoch_batches": self.epoch_batches,
            "text": self.text(),
        }
        if after and self.epoch_batches and self.now:
            out["epoch_s_now"] = round(self.epoch_batches / self.now.value, 1)
            out["epoch_s_after"] = round(self.epoch_batches / after[0], 1)
        return out

    def brief(self) -> str:
        """ "~45 steps/s (38–47), limited by the step's compute" (a table's cell: the change and the rate now are
        the row's)."""
        after = self.after()
        if after is None:
            return f"~×{_num(self.factor)} ({_span(self.low, self.high, '×')}), limited by {self.limited_by}"
        return f"~{_num(after[0])} steps/s ({_span(after[1], after[2], '')}), limited by {self.limited_by}"

    def text(self) -> str:
        """ "with num_workers=9: ~45 steps/s (38–47), limited by the step's compute; now 10"."""
        after = self.after()
        if after is None or self.now is None:
            span = _span(self.low, self.high, "×")
            return f"with {self.change}: ~×{_num(self.factor)} the steps/s now ({span}), limited by {self.limited_by}"
        span = _span(after[1], after[2], "")
        line = f"with {self.change}: ~{_num(after[0])} steps/s ({span}), limited by {self.limited_by}; now {self.now.text()} ({self.now.source})"
        if self.epoch_batches:
            line += f"; an epoch {_duration(self.epoch_batches / self.now.value)} → {_duration(self.epoch_batches / after[0])}"
        return line


@dataclass(frozen=True)
class Unpredictable:
    """A change gputop cannot put a number on, and why."""

    change: str
    reason: str
    now: Optional[StepRate] = field(default=None)

    def figures(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "steps_per_s_now": _round(self.now.value) if self.now else None,
            "steps_per_s_after": None,
            "after_low": None,
            "after_high": None,
            "limited_by": None,
            "assumes": None,
            "reason": self.reason,
            "text": self.text(),
        }

    def text(self) -> str:
        return f"with {self.change}: no prediction ({self.reason})"

    def with_rate(self, now: Optional[StepRate], epoch_batches: Optional[int] = None) -> "Unpredictable":
        return Unpredictable(self.change, self.reason, now)


Forecast = Union[Prediction, Unpredictable]


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)


def _num(value: float) -> str:
    """3 significant figures at most: 45, 4.6, 0.78."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.2g}" if value < 10 else f"{value:.0f}"


def _span(low: float, high: Optional[float], unit: str) -> str:
    """ "38–47", "×2.1–2.6", "at least 38" (open above), or one figure where both ends read the same."""
    if high is None:
        return f"at least {unit}{_num(low)}"
    if _num(low) == _num(high):
        return f"{unit}{_num(low)}"
    return f"{unit}{_num(low)}–{_num(high)}"


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds:.0f} s"


# ----------------------------------------------------------------- the bounds


def _over_one_minus(share: float) -> Optional[float]:
    return None if share >= MAX_SHARE else 1.0 / (1.0 - share)


def compute_bound(input_share: Share) -> Bound:
    """The step without its wait for data: ×1/(1 − f), at f's point and both ends of its interval."""
    point = _over_one_minus(input_share.point) or 1.0 / (1.0 - MAX_SHARE)
    low = _over_one_minus(input_share.low) or point
    why = f"1 ÷ (1 − {input_share.text()} waiting for data) = ×{_num(point)}"
    return Bound(COMPUTE, point, min(low, point), _over_one_minus(input_share.high), why)


def gpu_work_bound(gpu_idle: Share) -> Optional[Bound]:
    """The GPUs' busy time a step: ×1/u, u = 1 − the idle share (None: the GPUs are as good as never busy)."""
    busy = 1.0 - gpu_idle.point
    if busy < 1.0 - MAX_SHARE:
        return None
    point = 1.0 / busy
    low = 1.0 / max(1e-9, 1.0 - gpu_idle.low)
    high = _over_one_minus(gpu_idle.high)
    return Bound(GPU_WORK, point, low, high, f"1 ÷ the GPUs' {_pct(busy)} busy share = ×{_num(point)}")


def workers_bound(workers_now: int, workers_after: int, input_share: Share) -> Bound:
    """n' workers make n'/n the batches n make (each at the pace it keeps now); at num_workers=0 the rank's own
    share f of a step in the dataset is one producer's prep: n'/f."""
    if workers_now > 0:
        factor = workers_after / workers_now
        why = f"{workers_after} ÷ {workers_now} workers = ×{_num(factor)} the batches"
        return Bound(WORKERS, factor, factor, factor, why)
    point = workers_after / max(input_share.point, 1e-9)
    low = workers_after / max(input_share.high, 1e-9)
    high = workers_after / max(input_share.low, 1e-9)
    why = f"{workers_after} workers ÷ the {input_share.text()} of a step the rank spends preparing a batch = ×{_num(point)}"
    return Bound(WORKERS, point, low, high, why)


HUNGRY_SESSION_CORES = 0.1  # a session using this much of the cores is counted as one that wants its share


def water_level(cores: float, others: Sequence[float]) -> float:
    """What one more CPU-hungry group gets where the cores are shared equally among groups and each other group
    keeps what it uses now if that is less: the level L with L + Σ min(other, L) = cores."""
    rest = sorted(others)
    for k in range(len(rest) + 1):  # the k smallest keep their use; the others and the newcomer share the rest
        level = (cores - sum(rest[:k])) / (1 + len(rest) - k)
        if k == len(rest) or level <= rest[k]:
            return max(0.0, level)
    return 0.0  # (not reached: the last k always returns)


@dataclass(frozen=True)
class CoreUse:
    """The job's CPU now, one reading a second: the cores it used, what it could get at once (those plus the host's
    idle cores), how many other processes were runnable (the load average less the job's own busy cores), and,
    where the kernel shares the cores among sessions first (autogroup), the cores each other session used."""

    used: tuple[float, ...]
    could: tuple[float, ...]
    cap: float  # cores the job may use (its cgroup's, else the host's)
    others: tuple[float, ...] = ()  # runnable processes not the job's, a reading
    host_cores: float = 0.0
    ranks: int = 1
    sessions: tuple[tuple[float, ...], ...] = ()  # a reading: the cores each session not the job's used (autogroup)
    rank_used: tuple[float, ...] = ()  # a reading: the cores the ranks themselves used (their workers left out)
    # a reading: the host's busy cores no session reading accounts for (processes born and gone between two readings)
    unattributed: tuple[float, ...] = ()

    def _fair(self, i: int, processes: Optional[int]) -> float:
        """What the job could get at reading i with `processes` CPU-hungry processes on a box busy with other work,
        if the scheduler shares the cores among processes: cores × P ÷ (others + P), at least the idle cores."""
        if processes is None or not self.others or not self.host_cores:
            return self.could[i]
        return min(self.cap, max(self.could[i], self.host_cores * processes / (self.others[i] + processes)))

    def _least(self, i: int) -> float:
        """What the job surely gets at reading i: the idle cores, and at least its session's share with every other
        runnable process a session of its own: cores ÷ (others + 1) (the scheduler's fairness at its top level)."""
        if not self.others or not self.host_cores:
            return self.could[i]
        return min(self.cap, max(self.could[i], self.host_cores / (self.others[i] + 1.0)))

    def _session_ends(self, i: int) -> tuple[float, float]:
        """(least, most) the job's session gets at reading i where the cores go to sessions first, however many
        processes each has: at most the water level over what the other sessions use now (each keeps its use
        where that is under an equal share); at least an equal share beside every session busy now
        (HUNGRY_SESSION_CORES), as if each wanted more than it got; never less than the idle cores.  The cores no
        session reading accounts for stay with whoever used them: short-lived processes, each in a session of its own
        as a test's jobs are, that a reading cannot count among the sessions.  Measured on the full 2-core box: ~1 core
        of them, and the job's session got 0.25 cores where an equal share beside the 2.2 busy sessions seen said 0.7."""
        others = self.sessions[i]
        cores = max(0.0, self.host_cores - (self.unattributed[i] if len(self.unattributed) == len(self.sessions) else 0.0))
        most = min(self.cap, max(self.could[i], water_level(cores, others)))
        hungry = sum(1 for c in others if c >= HUNGRY_SESSION_CORES)
        return min(most, max(self.could[i], cores / (hungry + 1))), most

    def _ends(self, processes: Optional[int]) -> list[tuple[float, float]]:
        if self.sessions and len(self.sessions) == len(self.used) and self.host_cores:
            return [self._session_ends(i) for i in range(len(self.used))]
        return [(self._least(i), self._fair(i, processes)) for i in range(len(self.used))]

    def bound(self, processes: Optional[int] = None, *, ranks_only: bool = False) -> Optional[Bound]:
        """×(cores it could get ÷ cores it uses), over the readings (None: too few, or unused).  `processes`: the job's
        processes after the change (ranks and their workers).

        On a quiet box every reading of "could get" agrees: the idle cores.  On a busy one it depends on how the
        kernel shares the cores.  With autogroup (on by default on many distributions) it shares them among
        sessions first, and a job's added workers share its session's part: the range is `_session_ends`.
        Without it (or not measured) it shares them among processes (more workers, more share): the range spans
        the idle cores, or a session's share if more, to the per-process share.  The point is the range's
        geometric middle.  `ranks_only`: a change that leaves the ranks' own CPU alone (the workers' goes): over the
        cores the ranks use."""
        ends = self._ends(processes)
        uses = self.rank_used if ranks_only else self.used
        if len(uses) != len(ends):
            return None
        pairs = [(lo / u, hi / u) for (lo, hi), u in zip(ends, uses) if u > 0.05]
        if len(pairs) < 3:
            return None
        low_ratios, high_ratios = [a for a, _ in pairs], [b for _, b in pairs]
        least, most = statistics.fmean(low_ratios), statistics.fmean(high_ratios)
        point = math.sqrt(least * most)
        low = least - INTERVAL_Z * statistics.stdev(low_ratios) / math.sqrt(len(pairs))
        high = most + INTERVAL_Z * statistics.stdev(high_ratios) / math.sqrt(len(pairs))
        used = statistics.fmean(uses)
        if self.sessions:
            busy = statistics.fmean(sum(1 for c in s if c >= HUNGRY_SESSION_CORES) for s in self.sessions)
            ends_text = (
                f"{used * least:.2f} (an equal share beside {busy:.1f} busy sessions) to {used * most:.2f} (the other "
                f"sessions keeping what they use now; the cores go to sessions first, autogroup)"
            )
        else:
            ends_text = (
                f"{used * least:.2f} (the idle ones, or a session's share) to {used * most:.2f} (its per-process share "
                f"beside {statistics.fmean(self.others or (0.0,)):.1f} other runnable processes)"
            )
        why = (
            f"{'the ranks themselves use' if ranks_only else 'the job uses'} {used:.2f} cores; it could get {ends_text}; "
            f"at most {self.cap:g}: "
            f"×{_num(least)}–{_num(most)}, ×{_num(point)} between ({len(pairs)} readings)"
        )
        return Bound(CORES, point, max(1.0, low), max(point, high), why)


def _pct(share: float) -> str:
    return f"{share:.0%}"


# ----------------------------------------------------------------- the changes


def predict_workers(
    workers_now: int,
    workers_after: int,
    input_share: Share,
    *,
    cpu_bound: bool,
    cores: Optional[CoreUse],
    gpu_idle: Optional[Share] = None,
) -> Forecast:
    """num_workers n → n': bounded by the step's compute, the GPUs' work, the workers' pace and the cores (a
    CPU-bound loader without CPU readings is not predicted)."""
    change = f"num_workers={workers_after}"
    if workers_after <= workers_now:
        return Unpredictable(change, f"no more workers than the {workers_now} now")
    bounds = [compute_bound(input_share), workers_bound(workers_now, workers_after, input_share)]
    gpu = gpu_work_bound(gpu_idle) if gpu_idle is not None else None
    if gpu is not None:
        bounds.append(gpu)
    assumes = "each worker keeps the pace it has now; the step's own time stays what it is"
    # Every batch costs CPU, decoded or read: the cores bound any loader.  Workers that sleep in the dataset
    # cost little, so for them this bound sits high; for CPU-bound ones it is the one that holds.
    ranks = max(1, cores.ranks) if cores is not None else 1
    core_bound = cores.bound(ranks * (1 + workers_after)) if cores is not None else None
    if core_bound is None and cpu_bound:
        return Unpredictable(change, "the workers compute, and the job's CPU use was not read often enough to bound them")
    if core_bound is not None:
        bounds.append(core_bound)
        assumes += "; the CPU a step costs (decoding included) stays what it is, and other load leaves the cores it leaves now"
    return Prediction(change, tuple(bounds), assumes)


def predict_cheaper_input(
    input_share: Share, gpu_idle: Optional[Share], change: str, cores: Optional[CoreUse] = None
) -> Forecast:
    """Preprocessing made (nearly) free (cached tensors): the steps go as fast as the GPUs' work allows, and as the
    cores allow the ranks' own CPU a step (the workers' decoding gone); without GPU readings, as the step's own
    host time allows."""
    gpu = gpu_work_bound(gpu_idle) if gpu_idle is not None else None
    if gpu is None:
        return Prediction(change, (compute_bound(input_share),), "the step's host time stays what it is")
    ranks = cores.bound(ranks_only=True) if cores is not None else None
    if ranks is None:
        return Prediction(change, (gpu,), "the host keeps up with the GPUs once the cores are free; the GPU work a step stays")
    assumes = "the GPU work a step and the ranks' own CPU a step stay; the ranks' host work and the GPUs' take turns"
    return Prediction(change, (cached_step_bound(gpu, ranks),), assumes)


def cached_step_bound(gpu: Bound, ranks: Bound) -> Bound:
    """The step once its input is free: the GPUs' work and the ranks' own host work, in turn.  The ranks' CPU a step
    (`ranks`: ×C/r, the cores the job can get over those the ranks use now) takes a share h = r/C of the step now
    on those cores; with DDP every rank starts it at once, after the all-reduce, and (gloo, or a sync in the loop) the
    GPUs wait for it: the step goes to u + h of its time, ×1/(u + h).  Measured on the 2-core box at 8 ranks: the GPUs'
    work alone (×1/u) predicted 1.3 times the steps/s cached input reached, whose GPUs were busy 74% of the step.
    At most ×1/max(u, h) (host and GPU overlapped: CUDA without a sync), the range's top."""
    point = 1.0 / (1.0 / gpu.factor + 1.0 / ranks.factor)
    low = 1.0 / (1.0 / gpu.low + 1.0 / ranks.low)
    highs = [b for b in (gpu.high, ranks.high) if b is not None]
    why = (
        f"the GPUs' work ({_pct(1.0 / gpu.factor)} of the step now) and then the ranks' own host work ({_pct(1.0 / ranks.factor)} "
        f"of it on the cores the job can get: {ranks.why}): 1 ÷ their sum = ×{_num(point)}"
    )
    return Bound(GPU_AND_HOST, point, min(low, point), max(min(highs), point) if len(highs) == 2 else None, why)


def predict_no_sync(sync_share: Share, gpu_idle: Optional[Share]) -> Forecast:
    """A host-device sync removed: host and GPU overlap, so a step takes the longer of the two instead of their
    sum: ×1/max(1 − s, u), s the share parked at the sync, u the GPUs' busy share."""
    change = "the sync removed from the loop"
    if gpu_idle is None:
        return Unpredictable(change, "the GPUs' busy share is not known (no GPU readings)")
    busy = 1.0 - gpu_idle.point
    host = 1.0 - sync_share.point
    point = 1.0 / max(host, busy, 1e-9)
    low = 1.0 / max(1.0 - sync_share.low, 1.0 - gpu_idle.low, 1e-9)
    high = 1.0 / max(1.0 - sync_share.high, 1.0 - gpu_idle.high, 1e-9)
    why = (
        f"1 ÷ max(host work {_pct(host)}, GPU work {_pct(busy)}) of a step, "
        f"with {sync_share.text()} of it parked at the sync = ×{_num(point)}"
    )
    bound = Bound(COMPUTE if host >= busy else GPU_WORK, point, min(low, point), max(high, point), why)
    return Prediction(change, (bound,), "the GPU work and the host work a step stay; they overlap once nothing syncs")


def predict_straggler(wait_share: Share) -> Forecast:
    """The slow rank brought to the others' pace: the others stop waiting for it in their collectives,
    ×1/(1 − c), c their share in collectives."""
    change = "the slow rank at the others' pace"
    point = _over_one_minus(wait_share.point)
    if point is None:
        return Unpredictable(change, "the other ranks do nothing but wait: their own step is not measured")
    low = _over_one_minus(wait_share.low) or point
    why = f"1 ÷ (1 − the other ranks' {wait_share.text()} waiting in collectives) = ×{_num(point)}"
    bound = Bound(SLOW_RANK, point, min(low, point), _over_one_minus(wait_share.high), why)
    return Prediction(change, (bound,), "the slow rank, fixed, keeps the median rank's pace")


def predict_restarts(stalled: Share) -> Forecast:
    """persistent_workers=True: the seconds the GPUs sit collapsed at each epoch's worker restart come back:
    ×1/(1 − the collapsed share)."""
    change = "persistent_workers=True"
    point = _over_one_minus(stalled.point)
    if point is None:
        return Unpredictable(change, "the GPUs are collapsed nearly all the time: the restarts are not the only stall")
    why = f"1 ÷ (1 − the {stalled.text()} of seconds the GPUs sit collapsed) = ×{_num(point)}"
    bound = Bound(COMPUTE, point, _over_one_minus(stalled.low) or point, _over_one_minus(stalled.high), why)
    return Prediction(change, (bound,), "every collapse is an epoch's worker restart, and the steps between them keep pace")


def predict_amp(dram: Sequence[float], busy: bool) -> Forecast:
    """AMP (bf16 autocast) on memory-bound kernels: what autocast runs in bf16 moves half the bytes, so the DRAM-busy
    part of the time (d, GPM, one reading a GPU a second) shrinks by up to half: between ×1 (none of the traffic
    halves) and ×1/(1 − d/2) (all of it does).  Which share halves is not measured: autocast makes the activations
    bf16 while the weights, gradients and optimizer state stay fp32 in memory, so the point takes half of it:
    ×1/(1 − d/4)."""
    change = "AMP (bf16 autocast)"
    if not busy:
        return Unpredictable(change, "the GPUs are not busy: the step waits on something else first")
    values = [v for v in dram if v is not None]
    if len(values) < 3:
        return Unpredictable(change, "fewer than 3 GPM readings of the DRAM traffic")
    d = statistics.fmean(values)
    half = INTERVAL_Z * statistics.stdev(values) / math.sqrt(len(values))

    def gain(share: float, halved: float) -> float:
        return 1.0 / (1.0 - share * halved / 2.0)

    why = (
        f"1 ÷ (1 − {_pct(d)} DRAM-busy × half of the traffic halved ÷ 2) = ×{_num(gain(d, 0.5))}; "
        f"×1 if none halves, ×{_num(gain(d, 1.0))} if all does ({len(values)} GPM readings)"
    )
    bound = Bound(MEMORY_BANDWIDTH, gain(d, 0.5), 1.0, gain(min(1.0, d + half), 1.0), why)
    assumes = (
        "the step is the GPUs' work; bf16 halves the bytes of the activations (about half the traffic), "
        "not those of the fp32 weights, gradients and optimizer state; torch.compile's fusion is not counted"
    )
    return Prediction(change, (bound,), assumes)


TENSOR_CORE_GEMM_GAIN = (2.0, 8.0)  # a GEMM on the tensor cores in bf16 against fp32 on the CUDA cores: 2x at least
# (memory-bound shapes), 8x and more for large ones (A100: 312 against 19.5 TFLOPS peak, 16x)


def predict_trace_amp(fp32_gemm_s: float, span_s: float, busy: float, now: Optional[StepRate]) -> Forecast:
    """AMP from the trace: its fp32 GEMM kernels take a share g of the GPUs' time; on the tensor cores they run k
    times faster, so a GPU-bound step takes 1 − g(1 − 1/k) of its time.  k is not measured: the range spans
    TENSOR_CORE_GEMM_GAIN, the point is its geometric middle."""
    change = "AMP (bf16 autocast)"
    if span_s <= 0 or busy < 0.5:
        return Unpredictable(change, "the GPUs are not busy: the step waits on something else first", now)
    g = min(1.0, fp32_gemm_s / span_s)
    low_k, high_k = TENSOR_CORE_GEMM_GAIN

    def gain(k: float) -> float:
        return 1.0 / (1.0 - g * (1.0 - 1.0 / k))

    mid = math.sqrt(low_k * high_k)
    why = f"fp32 GEMMs {_pct(g)} of the GPUs' time, {low_k:g}–{high_k:g}× faster on the tensor cores: ×{_num(gain(mid))}"
    bound = Bound(GPU_WORK, gain(mid), gain(low_k), gain(high_k), why)
    return Prediction(change, (bound,), "the step is the GPUs' work; the other kernels keep their time", now)


def prediction_line(figures: Optional[dict[str, Any]]) -> Optional[str]:
    """A finding's prediction in words, from its figures (the report's and the TUI's line beside the fix)."""
    predicted = (figures or {}).get("prediction")
    return str(predicted["text"]) if isinstance(predicted, dict) and predicted.get("text") else None


# ----------------------------------------------------------------- what the window measured


def core_use(ctx: "Context") -> Optional[CoreUse]:
    """The job's CPU a second over the window, start-up left out: the cores its processes used (ranks and
    workers), what it could get (those plus the host's idle cores, at most its cgroup's), and the cores the other
    sessions used (`other_sessions`)."""
    started = [r.loop_started for r in ctx.ranks.values() if r.loop_started is not None]
    since = max(started) if started else None
    cap = ctx.job_cores()
    used: list[float] = []
    could: list[float] = []
    others: list[float] = []
    sessions: list[tuple[float, ...]] = []
    rank_used: list[float] = []
    unattributed: list[float] = []
    read_sessions = True  # every reading read the sessions (a reading may find no other session busy)
    for snap in ctx.snaps:
        job = snap.job
        if job is None or not job.ranks or not snap.host.cpu_percent or (since is not None and snap.timestamp < since):
            continue
        if any(r.starting_up for r in job.ranks):
            continue
        procs = [p for r in job.ranks for p in (r.proc, *r.workers) if not p.exited]
        if any(p.cpu_percent is None for p in procs):
            continue
        mine = sum(float(p.cpu_percent or 0.0) for p in procs) / 100.0
        idle = sum(max(0.0, 100.0 - c) for c in snap.host.cpu_percent) / 100.0
        used.append(mine)
        rank_used.append(sum(float(r.proc.cpu_percent or 0.0) for r in job.ranks if not r.proc.exited) / 100.0)
        could.append(min(cap, mine + idle))
        others.append(max(0.0, snap.host.load_average[0] - mine))
        job_sessions = {p.session for p in procs if p.session is not None}
        read_sessions = read_sessions and bool(snap.host.sessions) and bool(job_sessions)
        sessions.append(other_sessions(snap.host, job_sessions))
        unattributed.append(unattributed_cores(snap.host))
    cores = float(len(ctx.snaps[-1].host.cpu_percent)) if ctx.snaps else 0.0
    by_session = tuple(sessions) if read_sessions else ()  # (every reading knows the sessions, or none is used)
    if not used:
        return None
    kept = tuple(unattributed) if by_session else ()
    return CoreUse(tuple(used), tuple(could), cap, tuple(others), cores, len(ctx.ranks), by_session, tuple(rank_used), kept)


def other_sessions(host: "HostSample", job_sessions: set[int]) -> tuple[float, ...]:
    """The cores each session not the job's used; () where the host did not read sessions or the job's are not
    known."""
    if not host.sessions or not job_sessions:
        return ()
    return tuple(c for s, c in zip(host.sessions, host.session_cores) if s not in job_sessions)


def unattributed_cores(host: "HostSample") -> float:
    """The host's busy cores no session reading accounts for: processes born and gone between two readings."""
    return max(0.0, sum(host.cpu_percent) / 100.0 - sum(host.session_cores)) if host.sessions else 0.0


def step_rate(ctx: "Context", trace: Optional[dict[str, Any]] = None) -> Optional[StepRate]:
    """The job's steps/s per rank now: the active benchmark's timed batches, else the trace's steps (the mean over
    its ranks), else the steps counted in the ranks' dense samples (`sampled_step_rate`).  None: only the shares
    are known (the prediction is then a factor)."""
    consumption = (ctx.bench or {}).get("consumption")
    if isinstance(consumption, dict) and consumption.get("batches_per_s"):
        return StepRate(float(consumption["batches_per_s"]), "timed batches (active benchmark)")
    return step_rate_of_trace((trace or {}).get("ranks") or ()) or sampled_step_rate(list(ctx.ranks.values()))


STEP_STATES = (FORWARD_BACKWARD, COLLECTIVE)  # a step's pass through the model (DDP all-reduces inside backward)
MIN_PHASE_SAMPLES = 2.0  # a phase shorter than this on average is missed too often to count steps by


@dataclass
class _Phases:
    """Runs of in-`states` and out-of-`states` samples over a rank's dense stretches."""

    entries: int = 0  # entries into the states from outside them
    inside: int = 0  # samples inside, and the runs of one sample only
    outside: int = 0
    single_inside: int = 0
    single_outside: int = 0
    runs_outside: int = 0
    seconds: float = 0.0

    def countable(self) -> bool:
        """Both phases last MIN_PHASE_SAMPLES on average, and few of their runs are a lone sample: a phase about a
        sample long slips between samples now and then, merging two steps into one."""
        if self.entries < 5 or self.seconds <= 0 or min(self.inside, self.outside) / self.entries < MIN_PHASE_SAMPLES:
            return False
        return max(self.single_inside / self.entries, self.single_outside / max(1, self.runs_outside)) <= MAX_LONE_RUNS


MAX_LONE_RUNS = 0.2


def _phases(counts: "StateCounts", states: Sequence[str]) -> _Phases:
    out = _Phases()
    for runs, stretch in zip(counts.runs, counts.stretches):
        merged: list[tuple[bool, int]] = []  # runs of in/out, adjacent states of one side joined
        for state, n in runs:
            inside = state in states
            if merged and merged[-1][0] == inside:
                merged[-1] = (inside, merged[-1][1] + n)
            else:
                merged.append((inside, n))
        for k, (inside, n) in enumerate(merged):
            out.entries += int(inside and k > 0)
            out.single_inside += int(inside and k > 0 and n == 1)
            out.inside += n if inside else 0
            out.outside += 0 if inside else n
            out.runs_outside += int(not inside)
            out.single_outside += int(not inside and 0 < k < len(merged) - 1 and n == 1)
        out.seconds += sum(n for _, n in runs) / stretch.rate
    return out


def sampled_step_rate(ranks: Sequence["RankObs"]) -> Optional[StepRate]:
    """Steps/s counted in the ranks' dense samples (py-spy record), the mean over the ranks: a step passes once
    through forward/backward, so the entries into it count the steps; with one producer (num_workers 0 or 1) a
    starved rank also waits once a step for its batch.  Counted only where both the phase and what lies between two of them last
    MIN_PHASE_SAMPLES samples on average and are seldom a lone sample (`_Phases.countable`: shorter ones slip
    between samples); None where no rank allows it."""
    rates: list[tuple[float, float, float]] = []
    for r in ranks:
        counts = r.counts
        if not counts.dense or not r.measured:
            continue
        # one producer (the rank itself, or one worker) hands over one batch at a time: a starved rank waits for
        # each.  Several workers may finish together and hand over a few at once: their waits count no steps.
        one_producer = not (r.worker_sets and len(r.worker_sets[-1][1]) > 1)
        for states in (STEP_STATES, INPUT_WAIT_STATES) if one_producer else (STEP_STATES,):
            phases = _phases(counts, states)
            if phases.countable():
                entries, seconds = phases.entries, phases.seconds
                half = INTERVAL_Z * math.sqrt(entries)
                rates.append((entries / seconds, (entries - half) / seconds, (entries + half) / seconds))
                break
    if not rates:
        return None
    n = len(rates)
    value, low, high = (sum(r[i] for r in rates) / n for i in range(3))
    return StepRate(value, f"steps counted in the dense samples ({n} rank(s))", max(0.0, low), high)


def step_rate_of_trace(ranks: Sequence[dict[str, Any]]) -> Optional[StepRate]:
    """The trace's steps/s, the mean over its ranks (None: it timed no step)."""
    rates = [float(r["steps_per_s"]) for r in ranks if isinstance(r, dict) and r.get("steps_per_s")]
    return StepRate(statistics.fmean(rates), f"the trace's steps ({len(rates)} rank(s))") if rates else None


def forecast_from(figures: dict[str, Any]) -> Forecast:
    """A finding's `figures["prediction"]` read back (a report's JSON, or to put a rate under it)."""
    now = (
        StepRate(
            float(figures["steps_per_s_now"]),
            str(figures.get("now_source") or ""),
            figures.get("now_low"),
            figures.get("now_high"),
        )
        if figures.get("steps_per_s_now")
        else None
    )
    if figures.get("reason") is not None or not figures.get("bounds"):
        return Unpredictable(str(figures.get("change") or ""), str(figures.get("reason") or "no bound measured"), now)
    bounds = tuple(
        Bound(
            str(b["limit"]),
            float(b["speedup"]),
            float(b["low"]),
            None if b.get("high") is None else float(b["high"]),
            str(b.get("why") or ""),
        )
        for b in figures["bounds"]
    )
    return Prediction(str(figures["change"]), bounds, str(figures.get("assumes") or ""), now, figures.get("epoch_batches"))


def with_step_rate(
    findings: Sequence["Finding"], now: Optional[StepRate], epoch_batches: Optional[int] = None, *, timed: bool = False
) -> list["Finding"]:
    """The findings with their predictions put in steps/s at the rate `now` (a rate measured after the diagnosis:
    the trace's, the job's own counters); a prediction that already has a rate keeps it, unless `now` is `timed`
    (the job's own counters: better than steps counted in samples)."""
    if now is None:
        return list(findings)
    out = []
    for f in findings:
        figures = f.figures.get("prediction") if f.figures else None
        if not isinstance(figures, dict) or (figures.get("steps_per_s_now") and not timed):
            out.append(f)
            continue
        rated = forecast_from(figures).with_rate(now, epoch_batches).figures()
        out.append(dataclasses.replace(f, figures={**f.figures, "prediction": rated}))
    return out


def config_forecast(config: dict[str, Any], consumption: Optional[dict[str, Any]]) -> Forecast:
    """What one loader configuration the benchmark measured would give the training: the loader alone made
    `batches_per_s` (its interval from the batches it timed), and the step outside the loader takes `step_s`,
    so the training would step at the smaller of the two rates."""
    change = f"num_workers={config.get('num_workers')}" + (
        f", prefetch_factor={config['prefetch_factor']}" if config.get("prefetch_factor") else ""
    )
    rate = float(config.get("batches_per_s") or 0.0)
    batches = int(config.get("batches") or 0)
    consumed = float((consumption or {}).get("batches_per_s") or 0.0)
    step_s = float((consumption or {}).get("step_s") or 0.0)
    if not rate or batches < 2 or not consumed or step_s <= 0:
        return Unpredictable(change, "the training's step time or this configuration's rate was not timed")
    now = StepRate(consumed, "timed batches (active benchmark)")
    half = INTERVAL_Z * rate / math.sqrt(batches)  # a count of batches in a window: Poisson's spread
    loader = Bound(
        WORKERS,
        rate / consumed,
        max(0.0, rate - half) / consumed,
        (rate + half) / consumed,
        f"the loader alone made {rate:.1f} batches/s ({batches} batches timed)",
    )
    step = 1.0 / step_s / consumed
    compute = Bound(COMPUTE, step, step, step, f"1 ÷ the {step_s * 1000:.1f} ms step outside the loader")
    return Prediction(change, (loader, compute), "the loader keeps the rate it had alone beside the training", now)


def epoch_batches(ctx: "Context") -> Optional[int]:
    """Batches an epoch per rank, where the active benchmark read the DataLoader: its dataset's len over the batch
    size (a DistributedSampler splits the dataset among the ranks).  None: not known (an iterable dataset, no
    benchmark)."""
    settings = (ctx.bench or {}).get("settings") or {}
    length, batch = settings.get("dataset_len"), settings.get("batch_size")
    if not isinstance(length, int) or not isinstance(batch, int) or batch <= 0 or settings.get("dataset_kind") == "iterable":
        return None
    if "Distributed" in str(settings.get("sampler") or ""):
        length = math.ceil(length / max(1, len(ctx.ranks)))
    return length // batch if settings.get("drop_last") else math.ceil(length / batch)

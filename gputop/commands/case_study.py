"""`gputop demo --scenario case-study`: the seed article's case study (its 5.2 table), replayed stage by stage.

Four jobs, one after another, on the simulated 8-GPU machine; each is the article's row:

1. `num_workers=0`, decode in the training process (15-25% utilization, 72 minutes an epoch);
2. `num_workers=12`, `prefetch_factor=4`, pinned memory, persistent workers: the cores saturate (31 min);
3. the preprocessed tensors cached in memory: the GPUs busy and DRAM-bound, no tensor cores (22 min);
4. AMP (bf16 autocast) and `torch.compile`: busy, a small communication share (18 min).

Each stage is watched from the end of its loader's start-up (`warm_up_steps`: the batches the DataLoader hands its
workers at once, taken by every rank) until gputop's verdict settles (the same bottleneck `SETTLE_POLLS` polls in a
row, after at least `MIN_STAGE_S`), then the next starts.  The bottleneck is read from the diagnosis of that stage's own history
(`bottleneck`), never from the stage's name, and said in the article's words; its fix is the finding's.  The
simulated costs are chosen so that the step times go as the article's epochs (72 : 31 : 22 : 18): stage 1's rank
prepares a batch in 72/22 of a GPU step, stage 2's workers get the cores' share that makes one every 31/22, stage
3 waits for the GPU alone, stage 4's bf16 kernels take 18/22 of it.  What the box measures is printed as it is.

One simulated machine (one pipeline) outlives the jobs: its GPUs follow each stage's job in turn (`FollowingLoad`)
and it attaches to that job's launcher (`CaseStudy`).  Headless, the stages print one line (or JSON object) each;
in the TUI (`CaseStudySource`) they run on a thread of their own, each stage starts the monitor's history over
(the verdict pane is gputop's diagnosis of the job running now), and the header says which stage runs and how
the stages before went.  Both end a stage by the same rule (`StageWatch`, `settled`).
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence, TextIO

from gputop.analysis.checks.input import gpu_idle_share, measured_loader_forecast
from gputop.analysis.checks.kernels import amp_forecast
from gputop.analysis.diagnosis import build_context, verdict_line
from gputop.analysis.findings import findings as diagnose_all
from gputop.analysis.observations import Context, pooled_counts
from gputop.analysis.prediction import CORES as CORES_BOUND
from gputop.analysis.prediction import CoreUse, Forecast, StepRate, core_use
from gputop.errors import GputopError
from gputop.history import History
from gputop.model import Finding, MachineInfo, Snapshot
from gputop.sim.cpu_speed import cpu_slowness
from gputop.sim.load import FollowingLoad, JobLoad
from gputop.sim.scenarios import DEFAULT_BATCH, DEFAULT_STEP_MS, DemoConfig, resolve

if TYPE_CHECKING:
    from gputop.pipeline import Pipeline

ARTICLE_MINUTES = (72.0, 31.0, 22.0, 18.0)  # an epoch at each stage, in the article's table
ARTICLE_WORKERS = 12  # the article's stage 2 DataLoader
# what a prediction bounded by the cores assumes stays put, and how far it may move before the check says it did
CPU_PER_STEP_MOVED = 0.08  # the job's CPU a rank-step, as a share: it held within 5% where the cores stayed idle
REST_CORES_MOVED = 0.25  # the cores the rest of the box used
MIN_STAGE_S = 20.0  # stacks for a share (5 dumps at 2 s) and GPM means (5 samples) with room to spare
MAX_STAGE_S = 150.0  # a verdict that never settles is reported as it stands
SETTLE_POLLS = 5
BOTTLENECKS = (  # finding id -> the article's words for that row's bottleneck, most specific first
    ("cpu_bound", "CPU preprocessing"),
    ("memory_bound", "memory bandwidth"),
    ("starvation", "CPU data loading"),
    ("hiccup", "CPU data loading"),
)
HEALTHY = "healthy, with a small communication cost"
# the diagnosis still gathers its evidence (starting up, too few stacks): no bottleneck yet, and nothing to settle on;
# on a loaded box that can outlast MIN_STAGE_S, and it must not pass for "healthy"
COLLECTING = "collecting evidence"
# the article's last step once nothing is wrong (its 5.2: the all-reduce took ~10%, so it left accumulation out)
HEALTHY_NEXT = "nothing to fix now; if the all-reduce grows with the model, accumulate gradients (accum_steps 2-4)"


@dataclass(frozen=True)
class Stage:
    number: int
    title: str
    config: DemoConfig
    short: str = ""  # the title in a few words (the TUI's header)
    # what this stage changes over the one before, as the stage before predicts it: ("workers", 12),
    # ("cache", 0): preprocessing made cheap, ("amp", 0); ("", 0): the first stage
    change: tuple[str, int] = ("", 0)


@dataclass(frozen=True)
class StageResult:
    stage: Stage
    steps_per_s: float  # per rank, over the stage's observation
    bottleneck: str  # the article's words, from the diagnosis
    finding: Finding  # the finding that named it
    verdict: str  # the diagnosis' verdict line
    settled: bool
    seconds: float
    forecast_next: Optional[Forecast] = None  # what this stage's measurements predict the next stage's change buys
    # the cores the job used and the box's 1-min load over the stage: a prediction bounded by the cores holds while
    # the rest of the box leaves the job what it left it (see docs/predictions.md)
    cores_used: Optional[float] = None
    load: Optional[float] = None
    # what the stage measured, for reading a ratio: shares of the ranks' time by state (dense samples), the GPUs'
    # busy share, the job's CPU-seconds a rank-step (its cores over its steps: not the box's load), the cores the rest
    # of the box used, gputop's own cores
    measured: Optional[dict[str, Any]] = None

    def predicted(self, previous: Optional["StageResult"]) -> dict[str, Any]:
        """The prediction the stage before made for this stage, achieved ÷ predicted, and what the prediction
        assumed that moved between the window that made it and this stage's (`assumptions_moved`)."""
        forecast = previous.forecast_next if previous is not None else None
        if forecast is None or previous is None:
            return {"predicted": None, "achieved_over_predicted": None, "assumptions_moved": []}
        figures = forecast.figures()
        after = figures.get("steps_per_s_after")
        ratio = round(self.steps_per_s / after, 2) if after else None
        moved = assumptions_moved(previous.measured, self.measured) if figures.get("limited_by") == CORES_BOUND else []
        return {"predicted": figures, "achieved_over_predicted": ratio, "assumptions_moved": moved}

    def json(self, previous: Optional["StageResult"]) -> dict[str, Any]:
        fix = self.finding.fix.splitlines()[0].strip() if self.finding.fix else ""
        if not fix and self.bottleneck == HEALTHY:
            fix = HEALTHY_NEXT
        return {
            "stage": self.stage.number,
            "title": self.stage.title,
            "steps_per_s": round(self.steps_per_s, 3),
            "speedup": None
            if previous is None or not previous.steps_per_s
            else round(self.steps_per_s / previous.steps_per_s, 2),
            "verdict": self.bottleneck,
            "finding": self.finding.id,
            "fix": fix,
            "summary": self.verdict,
            "settled": self.settled,
            "seconds": round(self.seconds, 1),
            **self.predicted(previous),
            "cores_used": None if self.cores_used is None else round(self.cores_used, 2),
            "load": None if self.load is None else round(self.load, 1),
            "measured": self.measured,
        }


def assumptions_moved(before: Optional[dict[str, Any]], after: Optional[dict[str, Any]]) -> list[str]:
    """What a prediction bounded by the cores assumes ("the CPU a step costs stays what it is, and other load leaves
    the cores it leaves now") and the next window measured otherwise: the job's CPU a step moved by more than
    `CPU_PER_STEP_MOVED`, or the rest of the box's cores by more than `REST_CORES_MOVED`.  Each in words, for a
    check that missed: on a 2-core VM the CPU a step rose 10-21% when the job went from 0.6 to 1.8 cores (each core
    slower with both busy), which the cores bound does not foresee (docs/predictions.md)."""
    before, after = before or {}, after or {}
    moved = []
    cpu_before, cpu_after = before.get("cpu_s_per_step"), after.get("cpu_s_per_step")
    if cpu_before and cpu_after is not None and abs(cpu_after / cpu_before - 1) > CPU_PER_STEP_MOVED:
        change = cpu_after / cpu_before - 1
        moved.append(
            f"the job's CPU a step {'rose' if change > 0 else 'fell'} {abs(change):.0%} ({cpu_before:.3f} → {cpu_after:.3f} CPU-s)"
        )
    rest_before, rest_after = before.get("rest_cores"), after.get("rest_cores")
    if rest_before is not None and rest_after is not None and abs(rest_after - rest_before) > REST_CORES_MOVED:
        took = "took" if rest_after > rest_before else "left"
        moved.append(f"the rest of the box {took} cores ({rest_before:.2f} → {rest_after:.2f})")
    return moved


def stages(ranks: int, cores: float, step_ms: float = DEFAULT_STEP_MS) -> list[Stage]:
    """The four rows' jobs, costed so that their step times go as the article's epochs on a box of `cores`."""
    # the article's batch on every box (the demo's own sizing would shrink it on a slow one): the stages' CPU
    # is costed below from what a sample takes on this box
    slowness = cpu_slowness()
    cpus = max(1, int(cores))
    base = resolve("tuned", gpus=ranks, step_ms=step_ms, cpu_count=cpus, batch_size=DEFAULT_BATCH, slowness=slowness)
    # stage 2 gives each sample its share of the cores; where decoding alone takes more (a slow box, many ranks
    # on few cores), every stage's step stretches alike, with a quarter to spare for the augmentations
    shortest_ms = 1.25 * ranks * base.batch_size * base.sample_cpu_ms * ARTICLE_MINUTES[2] / (cores * ARTICLE_MINUTES[1])
    if shortest_ms > step_ms:
        step_ms = round(shortest_ms, 3)
        base = resolve("tuned", gpus=ranks, step_ms=step_ms, cpu_count=cpus, batch_size=DEFAULT_BATCH, slowness=slowness)
    step_at = [step_ms * minutes / ARTICLE_MINUTES[2] for minutes in ARTICLE_MINUTES]  # stage 3 is the GPU step
    decode = base.sample_cpu_ms
    # stage 2: every rank's workers together get the cores; a batch every step_at[1] per rank needs this CPU a batch
    cpu_per_batch = cores * step_at[1] / ranks
    augment = max(0.0, cpu_per_batch / base.batch_size - decode)
    # stage 1: the rank prepares its own batches, one every step_at[0]: what the CPU does not take is storage latency
    storage = max(0.0, step_at[0] / base.batch_size - decode - augment)
    first = replace(
        base,
        scenario="case-study",
        num_workers=0,
        prefetch_factor=None,
        pin_memory=False,
        persistent_workers=False,
        storage_ms=round(storage, 3),
        augment_ms=round(augment, 3),
        kernels="unfused",
    )
    second = replace(first, num_workers=ARTICLE_WORKERS, prefetch_factor=4, pin_memory=True, persistent_workers=True)
    third = replace(second, cached=True)
    fourth = replace(third, precision="bf16", kernels="gemm", step_ms=round(step_at[3], 3))  # AMP + torch.compile
    return [
        Stage(1, "num_workers=0, decode in the training process", first, "num_workers=0, decode in the loop"),
        Stage(
            2,
            "num_workers=12, prefetch_factor=4, pin_memory, persistent_workers",
            second,
            "num_workers=12, prefetch 4, pinned, persistent",
            ("workers", ARTICLE_WORKERS),
        ),
        Stage(3, "preprocessed tensors cached in memory", third, "tensors cached in memory", ("cache", 0)),
        Stage(4, "AMP (bf16 autocast) and torch.compile", fourth, "AMP and torch.compile", ("amp", 0)),
    ]


def bottleneck(found: Sequence[Finding]) -> tuple[str, Finding]:
    """The article's name for what the diagnosis found, and the finding it rests on."""
    serious = [f for f in found if f.severity in ("critical", "warning")]
    by_id = {f.id: f for f in serious}
    for finding_id, words in BOTTLENECKS:
        if finding_id in by_id:
            return words, by_id[finding_id]
    if not serious:
        return (COLLECTING if found[0].id == "collecting" else HEALTHY), found[0]
    return serious[0].title, serious[0]  # something the article's table has no row for: the diagnosis' words


def settled(words: Sequence[str], elapsed: float, min_s: float = MIN_STAGE_S) -> bool:
    """Whether a stage's verdict has held: the same bottleneck `SETTLE_POLLS` polls in a row, after `min_s`
    (still collecting is no verdict, however long it holds)."""
    last = set(words[-SETTLE_POLLS:])
    return elapsed >= min_s and len(words) >= SETTLE_POLLS and len(last) == 1 and COLLECTING not in last


class StageJob(Protocol):
    """A stage's running job as the case study drives it: a started `DemoJob` (tests script their own)."""

    launcher_pid: Optional[int]

    def wait_until_training(self) -> float: ...

    def load_model(self) -> JobLoad: ...

    def step_counts(self) -> list[int]: ...

    def failure(self) -> Optional[str]: ...

    def stop(self) -> None: ...


def start_demo_job(stage: Stage) -> StageJob:
    from gputop.sim.demo_launcher import DemoJob

    job = DemoJob(config=stage.config)
    job.start()  # (a start that fails stops what it started)
    return job


def warm_up_steps(config: DemoConfig) -> int:
    """Steps a rank takes before its loader runs as it will: the batches its DataLoader hands its workers at once
    (num_workers × prefetch_factor).  Measured on the 2-core box, stage 2 (2 ranks, 12 workers each, prefetch 4)
    made 1.5 and 1.7 steps/s a rank over its first two 12 s windows and 2.75 and 2.6 over the next two, at the same
    cores: its first ~40 steps a rank cost the CPU of later ones and ran at 0.6 of their pace (see
    docs/predictions.md).  0 with num_workers=0."""
    return (config.num_workers or 0) * (config.prefetch_factor or 2)


class StageWatch:
    """One stage's job watched from the end of its loader's start-up (`warm_up_steps` a rank after its first
    step): a history of its own, the article's name for the verdict at every poll, the steps its ranks take.
    `observe` says when the stage is done: its verdict `settled`, or `max_s` passed since the first step.  The
    headless run and the TUI both end a stage by it."""

    def __init__(
        self, stage: Stage, machine: MachineInfo, job: StageJob, *, min_s: float = MIN_STAGE_S, max_s: float = MAX_STAGE_S
    ) -> None:
        self.stage = stage
        self.job = job
        self.min_s, self.max_s = min_s, max_s
        self.machine = machine
        self.history = History(machine)
        self.words: list[str] = []
        self.found: list[Finding] = []
        self.begun = self.started = time.monotonic()
        self.own_cpu = _own_cpu_s()
        self.counts_first = self.counts_start = job.step_counts()
        self.warm_steps = warm_up_steps(stage.config)
        self.warm = self.warm_steps == 0

    def _warm_up_over(self) -> bool:
        """Whether every rank has taken its loader's start-up steps now (then the watch starts over from here)."""
        if self.warm:
            return False
        counts = self.job.step_counts()
        if not counts or any(now - first < self.warm_steps for now, first in zip(counts, self.counts_first)):
            return False
        self.warm = True
        self.history = History(self.machine)
        self.words, self.found = [], []
        self.started, self.counts_start = time.monotonic(), counts
        self.own_cpu = _own_cpu_s()
        return True

    def observe(self, snapshot: Snapshot) -> bool:
        """Take one poll's snapshot; True once the stage is done.  GputopError if the job failed."""
        self._warm_up_over()
        self.history.append(snapshot)
        self.found = diagnose_all(self.history)
        self.words.append(bottleneck(self.found)[0])
        failure = self.job.failure()
        if failure:
            raise GputopError(failure)
        now = time.monotonic()
        return (self.warm and settled(self.words, now - self.started, self.min_s)) or now - self.begun >= self.max_s

    def result(self, next_stage: Optional[Stage] = None) -> StageResult:
        """The stage as it went, with what its measurements predict `next_stage`'s change buys."""
        seconds = time.monotonic() - self.started
        counts_end = self.job.step_counts()
        ranks = max(1, len(counts_end))
        steps_per_s = (sum(counts_end) - sum(self.counts_start)) / ranks / max(1e-9, seconds)
        words, finding = bottleneck(self.found or diagnose_all(self.history))
        settled_now = settled(self.words, seconds, self.min_s)
        ctx = build_context(self.history)
        forecast = forecast_change(ctx, next_stage.change) if next_stage is not None and ctx is not None else None
        forecast = forecast.with_rate(StepRate(steps_per_s, "the job's step counters")) if forecast is not None else None
        use = core_use(ctx) if ctx is not None else None
        loads = [s.host.load_average[0] for s in ctx.snaps] if ctx is not None else []
        measured = stage_measures(ctx, use, steps_per_s * ranks) if ctx is not None else {}
        measured["gputop_cores"] = round((_own_cpu_s() - self.own_cpu) / max(1e-9, seconds), 3)
        return StageResult(
            self.stage,
            steps_per_s,
            words,
            finding,
            verdict_line(self.found),
            settled_now,
            seconds,
            forecast,
            statistics.fmean(use.used) if use is not None else None,
            statistics.fmean(loads) if loads else None,
            measured,
        )


def _own_cpu_s() -> float:
    """gputop's own CPU-seconds so far: this process and its reaped children (py-spy)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def stage_measures(ctx: Context, use: Optional[CoreUse], job_steps_per_s: float) -> dict[str, Any]:
    """The window's figures a prediction rests on, for the stage's JSON (`StageResult.measured`)."""
    ranks = [r for r in ctx.ranks.values() if r.measured]
    pooled = pooled_counts(ranks) if ranks else None
    idle = gpu_idle_share(ctx)
    out: dict[str, Any] = {
        "shares": {s: round(c / pooled.n, 3) for s, c in pooled.counts.most_common()} if pooled and pooled.n else {},
        "samples": pooled.n if pooled else 0,
        "gpu_busy": None if idle is None else round(1.0 - idle.point, 3),
    }
    if use is not None and job_steps_per_s > 0:
        out["cpu_s_per_step"] = round(statistics.fmean(use.used) / job_steps_per_s, 4)
        # the cores the rest of the box used (other sessions, gputop, short-lived processes): a prediction bounded by
        # the cores holds while this stays what it was in the window that made it
        out["rest_cores"] = round(use.host_cores - statistics.fmean(use.could), 3) if use.host_cores else None
        out["rank_cpu_s_per_step"] = round(statistics.fmean(use.rank_used) / job_steps_per_s, 4) if use.rank_used else None
    return out


def forecast_change(ctx: Context, change: tuple[str, int]) -> Optional[Forecast]:
    """What a stage's window predicts `change` buys: more workers, preprocessing made cheap, or AMP (see
    `Stage.change`), from the diagnosis' own measurements (`gputop.analysis.prediction`); None: nothing measured."""
    kind, value = change
    if kind == "workers":
        return measured_loader_forecast(ctx, value)
    if kind == "cache":
        return measured_loader_forecast(ctx, None)
    if kind == "amp":
        return amp_forecast(ctx)
    return None


class CaseStudy:
    """The stages on one simulated machine: one pipeline whose GPUs follow each stage's job in turn
    (`FollowingLoad`) and which attaches to that job's launcher.  `start_job` starts a stage's job (the seam
    tests script); `min_stage_s` / `max_stage_s` bound a stage (`StageWatch`)."""

    def __init__(
        self,
        stage_list: Sequence[Stage],
        *,
        start_job: Callable[[Stage], StageJob] = start_demo_job,
        min_stage_s: float = MIN_STAGE_S,
        max_stage_s: float = MAX_STAGE_S,
        stack_interval: float = 2.0,
    ) -> None:
        from gputop.pipeline import case_study_pipeline

        self.stages = list(stage_list)
        self.results: list[StageResult] = []
        self._start_job = start_job
        self._bounds = (min_stage_s, max_stage_s)
        self.load = FollowingLoad()
        self.pipeline = case_study_pipeline(self.load, stack_interval=stack_interval)
        self.job: Optional[StageJob] = None
        self.watch: Optional[StageWatch] = None
        self._lock = threading.Lock()  # a poll, and a switch of the job under the GPUs, one at a time
        self._closed = False

    def poll(self) -> Snapshot:
        with self._lock:
            return self.pipeline.poll()

    def begin(self, stage: Stage) -> StageWatch:
        """Stop the previous stage's job, start this one's, wait for its ranks, and watch it from then on."""
        self._stop_job()
        with self._lock:
            if self._closed:
                raise GputopError("the case study was stopped")
            self.job = job = self._start_job(stage)
        job.wait_until_training()
        assert job.launcher_pid is not None
        with self._lock:  # (not once closed: the pipeline would follow a job nobody stops following)
            if self._closed:
                raise GputopError("the case study was stopped")
            self.load.follow(job.load_model())
            self.pipeline.attach(job.launcher_pid)
        self.watch = StageWatch(stage, self.pipeline.machine, job, min_s=self._bounds[0], max_s=self._bounds[1])
        return self.watch

    def finish(self) -> StageResult:
        """The watched stage's result (its job runs on until the next `begin` or `close`), with its prediction
        for the next stage's change."""
        assert self.watch is not None
        following = [s for s in self.stages if s.number > self.watch.stage.number]
        result = self.watch.result(following[0] if following else None)
        self.results.append(result)
        return result

    def _stop_job(self) -> None:
        with self._lock:  # the GPUs go idle before the job's board goes away under a poll
            job, self.job = self.job, None
            self.load.follow(None)
        if job is not None:
            job.stop()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._stop_job()
        self.pipeline.close()


def run_headless(study: CaseStudy, *, interval: float, out: TextIO, as_json: bool) -> None:
    """One stage after another, polled every `interval`; text, or one JSON object per stage with `as_json`."""
    previous: Optional[StageResult] = None
    for stage in study.stages:
        if not as_json:
            print(f"stage {stage.number}: {stage.title} ({stage.config.describe()})", file=out, flush=True)
        watch = study.begin(stage)
        while True:
            tick = time.monotonic()
            if watch.observe(study.poll()):
                break
            time.sleep(max(0.0, interval - (time.monotonic() - tick)))  # the refresh interval, as the TUI's
        result = study.finish()
        record = result.json(previous)
        if as_json:
            print(json.dumps(record), file=out, flush=True)
        else:
            speedup = f" ({record['speedup']}x the stage before)" if record["speedup"] else ""
            print(
                f"stage {stage.number}: {result.steps_per_s:.2f} steps/s a rank{speedup}; bottleneck: {result.bottleneck}"
                f" [{result.finding.id}]; fix: {record['fix']}\n  verdict: {result.verdict}",
                file=out,
                flush=True,
            )
            if record["predicted"] is not None:
                print(f"  predicted by stage {stage.number - 1}: {_against(record)}", file=out, flush=True)
            if result.forecast_next is not None:
                print(f"  predicts: {result.forecast_next.text()}", file=out, flush=True)
        previous = result


def _against(record: dict[str, Any]) -> str:
    """ "0.85 steps/s (0.8–0.9, limited by the cores); achieved ÷ predicted 0.92" from a stage's JSON."""
    predicted = record["predicted"]
    if predicted.get("steps_per_s_after") is None:
        return predicted.get("text") or "no prediction"
    return (
        f"{predicted['steps_per_s_after']:.2f} steps/s ({predicted['after_low']:.2f}–"
        + (f"{predicted['after_high']:.2f}" if predicted.get("after_high") is not None else "")
        + f", limited by {predicted['limited_by']}); achieved ÷ predicted {record['achieved_over_predicted']}"
        + (f"; assumed, and moved: {'; '.join(record['assumptions_moved'])}" if record.get("assumptions_moved") else "")
    )


class CaseStudySource:
    """The case study as the TUI's source (a `source.Restarting`): the stages run on a thread of their own, each
    poll's snapshot also goes to the running stage's watch, a new stage starts the TUI's history over (its
    verdict is then the new job's), and `narration` is the header's line: the stage now and those before."""

    def __init__(self, study: CaseStudy) -> None:
        self.study = study
        self.machine = study.pipeline.machine
        self.generation = 0
        self.narration = "case study: starting"
        self.error: Optional[str] = None  # why the stages stopped early, if they did
        self.finished = threading.Event()  # every stage ran (or one failed)
        self._watching: Optional[queue.Queue[Snapshot]] = None  # the running stage's snapshots
        self._thread = threading.Thread(target=self._drive, name="gputop-case-study", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poll(self) -> Snapshot:
        snapshot = self.study.poll()
        watching = self._watching
        if watching is not None:
            watching.put(snapshot)
        return snapshot

    @property
    def live_pipeline(self) -> "Pipeline":
        """The one simulated machine every stage runs on (the machine check reads it)."""
        return self.study.pipeline

    def attach(self, pid: int) -> None:
        self.study.pipeline.attach(pid)

    def want_stacks(self, wanted: bool) -> None:
        self.study.pipeline.want_stacks(wanted)

    def focus_sampling(self, focused: bool) -> None:
        self.study.pipeline.focus_sampling(focused)

    def _narrate(self, stage: Optional[Stage], starting: bool = False) -> str:
        done = " · ".join(self._stage_text(r, i) for i, r in enumerate(self.study.results))
        if stage is None:
            return f"case study done │ {done}"
        now = f"case study: stage {stage.number} of {len(self.study.stages)} — {stage.short or stage.title}"
        return now + (" (starting the job)" if starting else "") + (f" │ {done}" if done else "")

    def _stage_text(self, result: StageResult, index: int) -> str:
        """ "2: 0.78 steps/s (predicted 0.85, ×0.92), CPU preprocessing": the stage, and the stage before's prediction."""
        record = result.predicted(self.study.results[index - 1] if index else None)
        predicted = (record["predicted"] or {}).get("steps_per_s_after")
        against = f" (predicted {predicted:.2f}, ×{record['achieved_over_predicted']})" if predicted else ""
        return f"{result.stage.number}: {result.steps_per_s:.2f} steps/s{against}, {result.bottleneck}"

    def _drive(self) -> None:
        try:
            for stage in self.study.stages:
                self.narration = self._narrate(stage, starting=True)
                watch = self.study.begin(stage)
                snapshots: queue.Queue[Snapshot] = queue.Queue()
                self._watching = snapshots
                self.generation += 1  # the TUI's history starts over with this job
                self.narration = self._narrate(stage)
                while True:
                    try:
                        snapshot = snapshots.get(timeout=0.5)
                    except queue.Empty:
                        if self.study.closed:
                            return
                        continue
                    if watch.observe(snapshot):
                        break
                self._watching = None
                self.study.finish()
            self.narration = self._narrate(None)
        except GputopError as exc:
            if not self.study.closed:
                self.error = str(exc)
                self.narration = f"case study stopped: {exc}"
        finally:
            self.finished.set()

    def close(self) -> None:
        self.study.close()  # a stage still starting fails at once: its job is stopped
        self._thread.join(timeout=5.0)


def run(args: Any) -> int:
    """The case study in the TUI (the header says which stage runs and how the ones before went; the verdict is
    gputop's own), or headless with --no-tui / --json: one line (or JSON object) per stage."""
    from gputop.tui.demo import run_tui

    as_json = bool(getattr(args, "json", False))
    cores = float(len(os.sched_getaffinity(0)))
    stage_list = stages(args.gpus or 8, cores, args.step_ms or DEFAULT_STEP_MS)
    study = CaseStudy(stage_list, stack_interval=getattr(args, "stack_interval", 2.0))
    if args.no_tui or as_json:
        try:
            run_headless(study, interval=args.interval, out=sys.stdout, as_json=as_json)
        finally:
            study.close()
        return 0
    source = CaseStudySource(study)
    source.start()
    return run_tui(source, args, subtitle="case study", failure=lambda: source.error)

"""`gputop demo --scenario case-study`: the seed article's case study (its 5.2 table), replayed stage by stage.

Four jobs, one after another, on the simulated 8-GPU machine; each is the article's row:

1. `num_workers=0`, decode in the training process (15-25% utilization, 72 minutes an epoch);
2. `num_workers=12`, `prefetch_factor=4`, pinned memory, persistent workers: the cores saturate (31 min);
3. the preprocessed tensors cached in memory: the GPUs busy and DRAM-bound, no tensor cores (22 min);
4. AMP (bf16 autocast) and `torch.compile`: busy, a small communication share (18 min).

Each stage runs until gputop's verdict settles (the same bottleneck `SETTLE_POLLS` polls in a row, after at least
`MIN_STAGE_S`), then the next starts.  The bottleneck is read from the diagnosis of that stage's own history
(`bottleneck`), never from the stage's name, and said in the article's words; its fix is the finding's.  The
simulated costs are chosen so that the step times go as the article's epochs (72 : 31 : 22 : 18): stage 1's rank
prepares a batch in 72/22 of a GPU step, stage 2's workers get the cores' share that makes one every 31/22, stage
3 waits for the GPU alone, stage 4's bf16 kernels take 18/22 of it.  What the box measures is printed as it is.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, TextIO

from gputop.analysis.diagnosis import findings as diagnose_all
from gputop.analysis.diagnosis import verdict_line
from gputop.history import History
from gputop.model import Finding
from gputop.sim.scenarios import DEFAULT_STEP_MS, DemoConfig, decode_ms, resolve

ARTICLE_MINUTES = (72.0, 31.0, 22.0, 18.0)  # an epoch at each stage, in the article's table
ARTICLE_WORKERS = 12  # the article's stage 2 DataLoader
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
# the article's last step once nothing is wrong (its 5.2: the all-reduce took ~10%, so it left accumulation out)
HEALTHY_NEXT = "nothing to fix now; if the all-reduce grows with the model, accumulate gradients (accum_steps 2-4)"


@dataclass(frozen=True)
class Stage:
    number: int
    title: str
    config: DemoConfig


@dataclass(frozen=True)
class StageResult:
    stage: Stage
    steps_per_s: float  # per rank, over the stage's observation
    bottleneck: str  # the article's words, from the diagnosis
    finding: Finding  # the finding that named it
    verdict: str  # the diagnosis' verdict line
    settled: bool
    seconds: float

    def json(self, previous: Optional["StageResult"]) -> dict[str, Any]:
        fix = self.finding.fix.splitlines()[0].strip() if self.finding.fix else HEALTHY_NEXT
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
        }


def stages(ranks: int, cores: float, step_ms: float = DEFAULT_STEP_MS) -> list[Stage]:
    """The four rows' jobs, costed so that their step times go as the article's epochs on a box of `cores`."""
    base = resolve("tuned", gpus=ranks, step_ms=step_ms, cpu_count=max(1, int(cores)))
    step_at = [step_ms * minutes / ARTICLE_MINUTES[2] for minutes in ARTICLE_MINUTES]  # stage 3 is the GPU step
    decode = decode_ms(base.image_side)
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
        Stage(1, "num_workers=0, decode in the training process", first),
        Stage(2, "num_workers=12, prefetch_factor=4, pin_memory, persistent_workers", second),
        Stage(3, "preprocessed tensors cached in memory", third),
        Stage(4, "AMP (bf16 autocast) and torch.compile", fourth),
    ]


def bottleneck(found: Sequence[Finding]) -> tuple[str, Finding]:
    """The article's name for what the diagnosis found, and the finding it rests on."""
    serious = [f for f in found if f.severity in ("critical", "warning")]
    by_id = {f.id: f for f in serious}
    for finding_id, words in BOTTLENECKS:
        if finding_id in by_id:
            return words, by_id[finding_id]
    if not serious:
        return HEALTHY, found[0]
    return serious[0].title, serious[0]  # something the article's table has no row for: the diagnosis' words


def settled(words: Sequence[str], elapsed: float) -> bool:
    return elapsed >= MIN_STAGE_S and len(words) >= SETTLE_POLLS and len(set(words[-SETTLE_POLLS:])) == 1


def run_stage(stage: Stage, *, interval: float, out: TextIO, quiet: bool) -> StageResult:
    """Start the stage's job, watch it until the verdict settles, stop it."""
    from gputop.commands.demo import DEMO_PROFILE
    from gputop.pipeline import Pipeline
    from gputop.sim.demo_launcher import DemoJob

    with DemoJob(config=stage.config) as job:
        launcher = job.start()
        if not quiet:
            print(f"stage {stage.number}: {stage.title} ({stage.config.describe()})", file=out, flush=True)
        job.wait_until_training()
        pipeline = Pipeline(simulate=DEMO_PROFILE, pid=launcher, load_model=job.load_model())
        try:
            history = History(pipeline.machine)
            words: list[str] = []
            started = time.monotonic()
            counts_start = job.step_counts()
            found: list[Finding] = []
            while True:
                tick = time.monotonic()
                history.append(pipeline.poll())
                found = diagnose_all(history)
                words.append(bottleneck(found)[0])
                elapsed = time.monotonic() - started
                failure = job.failure()
                if failure:
                    raise RuntimeError(failure)
                if settled(words, elapsed) or elapsed >= MAX_STAGE_S:
                    break
                time.sleep(max(0.0, interval - (time.monotonic() - tick)))  # the refresh interval, as the TUI's
            counts_end = job.step_counts()
        finally:
            pipeline.close()
    seconds = time.monotonic() - started
    ranks = max(1, len(counts_end))
    steps_per_s = (sum(counts_end) - sum(counts_start)) / ranks / max(1e-9, seconds)
    words_now, finding = bottleneck(found)
    return StageResult(stage, steps_per_s, words_now, finding, verdict_line(found), settled(words, seconds), seconds)


def run(args: Any) -> int:
    """The headless case study: one stage after another; text, or one JSON object per stage with --json."""
    out = sys.stdout
    as_json = bool(getattr(args, "json", False))
    if not args.no_tui and not as_json:
        print("gputop demo: the case study runs headless, one stage after another (as with --no-tui)", file=out, flush=True)
    cores = float(len(os.sched_getaffinity(0)))
    ranks = args.gpus or 8
    previous: Optional[StageResult] = None
    for stage in stages(ranks, cores, args.step_ms or DEFAULT_STEP_MS):
        result = run_stage(stage, interval=args.interval, out=out, quiet=as_json)
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
        previous = result
    return 0

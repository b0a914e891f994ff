"""`gputop demo`: a real PyTorch job on a simulated 8-GPU machine, watched by gputop.

Starts the demo job (`gputop.sim.demo_launcher.DemoJob`), builds a simulated pipeline
whose GPUs are driven by the job's busy board, and runs the TUI on it; with `--no-tui`
it prints one line of per-GPU utilization per interval and a summary instead, ending with
the verdict line and one line per finding (so a script can check any scenario), and with `--workers N` the
prediction the run before made for that fix beside what this run achieved (`check_fix`).  Every
process the demo started is stopped on `q`, ctrl+c and SIGTERM/SIGHUP; if gputop is
killed outright, the job's parent-death signals take it down (see `demo_launcher`).
gputop never imports torch: the job runs in other processes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, TextIO

from gputop import advice_memory
from gputop.analysis.diagnosis import verdict_line
from gputop.analysis.findings import findings
from gputop.analysis.prediction import StepRate, prediction_line, with_step_rate
from gputop.errors import GputopError
from gputop.history import History
from gputop.report.writer import write_report
from gputop.signals import StopSignals
from gputop.tui.demo import run_tui

if TYPE_CHECKING:
    from gputop.model import Finding
    from gputop.source import Batch

    pass


@dataclass
class DemoSummary:
    """What a headless run saw once every rank was training."""

    startup_s: float  # from start until every rank took a step
    seconds: float = 0.0  # observed after that
    samples: list[tuple[Optional[float], ...]] = field(default_factory=list)  # per interval, per GPU, percent
    steps_per_s: tuple[float, ...] = ()  # per rank
    findings: list[Finding] = field(default_factory=list)  # the diagnosis of everything observed, most severe first

    def mean_util(self) -> list[Optional[float]]:
        if not self.samples:
            return []
        means: list[Optional[float]] = []
        for gpu in range(len(self.samples[0])):
            values = [value for row in self.samples if gpu < len(row) and (value := row[gpu]) is not None]
            means.append(sum(values) / len(values) if values else None)
        return means


def _check_demo_dependencies() -> None:
    missing = [name for name, module in (("PyTorch", "torch"), ("Pillow", "PIL")) if not importlib.util.find_spec(module)]
    if missing:
        raise GputopError(f"the demo runs a real training job and needs {' and '.join(missing)}: pip install 'gputop[demo]'")


def _format_util(value: Optional[float]) -> str:
    return "  --" if value is None else f"{value:4.0f}"


class _UtilizationRows:
    """Prints one row per interval: each GPU's utilization and the ranks' steps per second (the first reading
    only sets the baseline of the utilization window); keeps the rows in the summary and the snapshots in the
    history; raises GputopError once the job failed."""

    def __init__(
        self, job: Any, history: History, summary: DemoSummary, elapsed: Callable[[], float], out: TextIO, counts: Any
    ) -> None:
        self.job, self.history, self.summary, self.elapsed, self.out = job, history, summary, elapsed, out
        self.counts_last = counts  # the ranks' step counts when the observation began
        self.last = time.monotonic()
        self.baseline = True

    def __call__(self, batch: Batch) -> None:
        for taken in batch.snapshots:
            self.history.append(taken)
        if self.baseline:
            self.baseline = False
            return
        snapshot = batch.snapshots[-1]
        now = time.monotonic()
        counts = self.job.step_counts()
        row = tuple(g.utilization_gpu if not g.lost else None for g in snapshot.gpus)
        self.summary.samples.append(row)
        rate = sum(counts) - sum(self.counts_last)
        per_rank = rate / max(1, len(counts)) / max(1e-9, now - self.last)
        print(
            f"{self.elapsed():5.1f}s  " + "".join(f"{_format_util(u):>6}" for u in row) + f"  {per_rank:7.2f}",
            file=self.out,
            flush=True,
        )
        self.last, self.counts_last = now, counts
        failure = self.job.failure()
        if failure:
            raise GputopError(failure)


def observe(
    job: Any,
    source: Any,
    *,
    interval: float,
    seconds: Optional[float],
    out: TextIO,
) -> DemoSummary:
    """Headless: wait for the ranks, then poll `source` each interval and print per-GPU utilization.

    Runs `seconds` (None: until KeyboardInterrupt) after every rank took its first step; the job's
    startup (importing torch, rendezvous) is not part of the observation.
    """
    from gputop.source import PollLoop

    print(f"waiting for {job.config.ranks} ranks to start (importing torch, rendezvous)...", file=out, flush=True)
    summary = DemoSummary(startup_s=job.wait_until_training())
    gpus = source.machine.gpu_count
    print(
        f"ranks training after {summary.startup_s:.1f} s; GPU utilization % every {interval:g} s\n"
        f"{'t':>6}  " + "".join(f"{'GPU' + str(i):>6}" for i in range(gpus)) + "  steps/s",
        file=out,
        flush=True,
    )
    history = History(source.machine)
    loop = PollLoop(source, interval, seconds=seconds)
    counts_start = job.step_counts()
    show = _UtilizationRows(job, history, summary, loop.elapsed, out, counts_start)
    try:
        loop.run(show)
    except KeyboardInterrupt:
        pass  # ctrl+c / SIGTERM: end the observation and report what was seen
    summary.seconds = loop.elapsed()
    counts_end = job.step_counts()
    summary.steps_per_s = tuple((b - a) / max(1e-9, summary.seconds) for a, b in zip(counts_start, counts_end))
    summary.findings = findings(history)
    return summary


def print_summary(summary: DemoSummary, out: TextIO) -> None:
    means = summary.mean_util()
    print(f"summary over {summary.seconds:.1f} s (after a {summary.startup_s:.1f} s start):", file=out)
    print("  GPU         " + "".join(f"{i:>6}" for i in range(len(means))), file=out)
    print("  mean util % " + "".join(f"{'--' if m is None else f'{m:.0f}':>6}" for m in means), file=out)
    print("  rank        " + "".join(f"{r:>6}" for r in range(len(summary.steps_per_s))), file=out)
    print("  steps/s     " + "".join(f"{s:>6.2f}" for s in summary.steps_per_s), file=out)
    # last, for scripts: the verdict line, then one line per finding (severity, id, title)
    print(f"verdict: {verdict_line(summary.findings)}", file=out)
    for finding in summary.findings:
        print(f"finding: {finding.severity:<8} {finding.id:<14} {finding.title}", file=out)
    # what each fix buys, at the steps/s the ranks' own counters measured (restart with the change to compare)
    rate = sum(summary.steps_per_s) / len(summary.steps_per_s) if summary.steps_per_s else 0.0
    now = StepRate(rate, "the job's step counters") if rate > 0 else None
    for finding in with_step_rate(summary.findings, now, timed=True):
        line = prediction_line(finding.figures)
        if line:
            print(f"prediction: {finding.id:<14} {line}", file=out)
    out.flush()


def _fixes_path() -> str:
    """Beside the advice memory: the demo's last predictions, one a scenario and GPU count."""
    return os.path.join(os.path.dirname(advice_memory.default_path()), "demo-fixes.json")


def _read_fixes() -> dict[str, Any]:
    try:
        with open(_fixes_path(), encoding="utf-8") as f:
            raw = json.load(f)
        return raw if isinstance(raw, dict) else {}
    except (OSError, ValueError):
        return {}


def check_fix(summary: DemoSummary, scenario: str, gpus: int, workers: Optional[int], out: TextIO) -> None:
    """The one fix the starved demo checks: a run whose prediction said what `num_workers=N` buys is kept (per
    scenario and GPU count); a later run with `--workers N` prints that prediction beside the steps/s it achieved."""
    key = f"{scenario}/{gpus}"
    fixes = _read_fixes()
    before = fixes.get(key)
    rate = sum(summary.steps_per_s) / len(summary.steps_per_s) if summary.steps_per_s else 0.0
    if isinstance(before, dict) and workers is not None and before.get("change") == f"num_workers={workers}" and rate > 0:
        after, low, high = before.get("steps_per_s_after"), before.get("after_low"), before.get("after_high")
        if after:
            inside = low is not None and low <= rate <= (high if high is not None else float("inf"))
            print(
                f"fix checked: {before['change']}, predicted by the run before it: ~{after:.2f} steps/s "
                f"({low:.2f}–{'' if high is None else f'{high:.2f}'}, limited by {before.get('limited_by')}); "
                f"achieved {rate:.2f}: achieved ÷ predicted {rate / after:.2f}, {'inside' if inside else 'outside'} "
                f"the range",
                file=out,
            )
    now = StepRate(rate, "the job's step counters") if rate > 0 else None
    for finding in with_step_rate(summary.findings, now, timed=True):
        predicted = finding.figures.get("prediction") if finding.figures else None
        if finding.id == "starvation" and isinstance(predicted, dict) and predicted.get("steps_per_s_after"):
            fixes[key] = {k: predicted.get(k) for k in ("change", "steps_per_s_after", "after_low", "after_high", "limited_by")}
            try:
                os.makedirs(os.path.dirname(_fixes_path()), exist_ok=True)
                write_report(_fixes_path(), json.dumps(fixes))
            except (OSError, GputopError):
                pass  # a read-only home: the next run has nothing to check against
            break


def run(args: Any) -> int:
    _check_demo_dependencies()
    from gputop.pipeline import demo_pipeline
    from gputop.sim.demo_launcher import DemoJob

    scenario = args.scenario
    if scenario == "case-study":  # four jobs one after another on one machine (gputop/commands/case_study.py)
        from gputop.commands.case_study import run as run_case_study

        with StopSignals():
            try:
                return run_case_study(args)
            except KeyboardInterrupt:
                return 130
    job = DemoJob(
        scenario,
        workers=args.workers,
        batch_size=args.batch_size,
        step_ms=args.step_ms,
        gpus=args.gpus,
        collective_timeout_s=getattr(args, "nccl_timeout", 600.0),
    )  # bad overrides fail here, with nothing started
    out = sys.stdout
    with StopSignals(), job:
        try:
            launcher_pid = job.start()
            pipeline = demo_pipeline(launcher_pid, job.load_model(), stack_interval=getattr(args, "stack_interval", 2.0))
        except KeyboardInterrupt:
            return 130
        if not args.no_tui:
            return run_tui(pipeline, args, subtitle=f"demo: {scenario}", failure=job.failure)
        try:
            print(
                f"gputop demo: {scenario} ({job.config.describe()}); launcher PID {launcher_pid}",
                file=out,
                flush=True,
            )
            summary = observe(job, pipeline, interval=args.interval, seconds=args.seconds, out=out)
        except KeyboardInterrupt:
            return 0  # stopped before the ranks were training: nothing to summarise
        finally:
            pipeline.close()
        print_summary(summary, out)
        check_fix(summary, scenario, job.config.ranks, args.workers, out)
        return 0

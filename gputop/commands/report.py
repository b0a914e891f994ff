"""`gputop report`: observe a while (or read a recording), diagnose, and write a ticket-ready report.

gputop report [--pid PID] [--seconds 30] [--simulate] [-o FILE] [--format md|json] [--bench [--yes]] [--trace]
gputop report --from FILE [--job PID]
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Optional

from gputop.advice_memory import AdviceMemory
from gputop.analysis.diagnosis import verdict_line
from gputop.analysis.findings import findings as findings_of
from gputop.commands.observing import Progress, live_source, observe
from gputop.errors import GputopError, UsageError
from gputop.history import History
from gputop.model import Finding, Snapshot
from gputop.source import for_job, jobs_of

if TYPE_CHECKING:
    from gputop.analysis.machine_check import CheckReport
    from gputop.bench import BenchResult
    from gputop.tracing import TraceResult

BENCH_SECONDS = 15.0  # the benchmark's own bound (issue 6: the active run is <= 15 s)
# A short report still needs enough stack dumps to judge the input pipeline (diagnosis needs 5 per rank):
# aim for 10 over the observation, but never dump faster than every 0.5 s.
REPORT_STACK_DUMPS = 10
FASTEST_STACK_INTERVAL_S = 0.5
# `report --from` decodes at most this many snapshots, the latest (20 min at 1 Hz, ~100 MB on 8 GPUs):
# a day-long recording must not need GBs to report on.  The report states the span it covers.
REPORT_FROM_WINDOW = 1200


def history_from_recording(
    path: str, limit: int = REPORT_FROM_WINDOW, job: Optional[int] = None
) -> tuple[History, dict[str, Any]]:
    """The last `limit` snapshots of a recording as a history, and what the whole recording spans.

    Only that window is decoded, so a day-long recording reports in bounded memory; the report says
    which part of the recording its statistics, stacks and findings rest on.  A recording that follows
    several jobs (`record` of a machine) is reported one job at a time, as `serve` diagnoses each: `job`
    (the job's anchor PID, serve's `job` label), else the first, with a line naming the others."""
    from gputop.recording import read_recording_tail

    machine, snapshots, warning, span = read_recording_tail(path, limit)
    if warning:
        print(f"gputop: warning: {warning}", file=sys.stderr)
    if not snapshots:
        raise GputopError(f"{path} holds no snapshots (the recording stopped before its first sample)")
    snapshots = _one_job(path, snapshots, job)
    history = History(machine, capacity=len(snapshots))
    for snap in snapshots:
        history.append(snap)
    recording = {
        "file": path,
        "snapshots": span.snapshots,
        "start": span.start,
        "end": span.end,
        "seconds": round(span.end - span.start, 1),
        "window_limit": limit,
        "whole": len(snapshots) == span.snapshots,
    }
    return history, recording


def _one_job(path: str, snapshots: list[Snapshot], job: Optional[int]) -> list[Snapshot]:
    """The snapshots as `serve` diagnoses the job `job` of them (see `history_from_recording`)."""
    anchors = list(dict.fromkeys(tree.anchor for snap in snapshots for tree in jobs_of(snap)))
    if job is not None and job not in anchors:
        named = ", ".join(map(str, anchors)) or "none"
        raise UsageError(f"--job {job}: {path} holds no such job (its jobs: {named})")
    if job is None:
        followed = any(tree.stacks for snap in snapshots for tree in snap.jobs)  # not only grouped (no stacks)
        if not followed or not any(snap.job is None and len(snap.jobs) > 1 for snap in snapshots):
            return snapshots  # one job at a time (or none): the snapshots are that job's already
        job = anchors[0]
        others = ", ".join(map(str, anchors[1:]))
        print(
            f"gputop: {path} holds {len(anchors)} jobs; reporting on job {job} (the others: {others}; choose with --job PID)",
            file=sys.stderr,
        )
    return [for_job(snap, next((t for t in jobs_of(snap) if t.anchor == job), None)) for snap in snapshots]


def run_bench(args: argparse.Namespace) -> "BenchResult":
    try:
        from gputop.bench import run_benchmark
    except ImportError as exc:  # the bench engineer's module, imported only when asked for
        raise GputopError(f"the loader benchmark is not available in this install ({exc})") from None
    progress = Progress(sys.stderr, "benchmark")
    try:
        return run_benchmark(args.pid, seconds=BENCH_SECONDS, allow_inject=bool(args.yes), progress=progress.update)
    finally:
        progress.done()


def run_trace(args: argparse.Namespace) -> "TraceResult":
    from gputop.tracing import DEFAULT_SECONDS
    from gputop.tracing import run_trace as trace_job

    progress = Progress(sys.stderr, "trace")
    try:
        return trace_job(args.pid, seconds=DEFAULT_SECONDS, out_dir=getattr(args, "trace_dir", None), progress=progress.update)
    finally:
        progress.done()


def render(
    history: History,
    findings: list[Finding],
    fmt: str,
    bench: "Optional[BenchResult]",
    command: list[str],
    recording: Optional[dict[str, Any]] = None,
    infra: "Optional[CheckReport]" = None,
    trace: "Optional[TraceResult]" = None,
) -> str:
    if fmt == "json":
        from gputop.report.jsonreport import render_json

        return render_json(history, findings, bench=bench, command=command, recording=recording, infra=infra, trace=trace)
    from gputop.report.markdown import render_markdown

    return render_markdown(history, findings, bench=bench, command=command, recording=recording, infra=infra, trace=trace)


def _recording_job(text: Optional[str]) -> Optional[int]:
    """--job with --from: the job's launcher PID, or serve's `HOST:PID` label of a job on one machine."""
    if text is None:
        return None
    pid = text.rsplit(":", 1)[-1]
    if not pid.isdigit() or int(pid) <= 0:
        raise UsageError(f"--job {text!r} with --from names a job of the recording by its launcher's PID (such as 12345)")
    return int(pid)


def run(args: argparse.Namespace) -> int:
    # `--prometheus` runs gputop.commands.fleet_report instead (gputop.cli.command_module)
    if getattr(args, "slurm_job", None):
        raise UsageError("--slurm-job finds a job across nodes in Prometheus: add --prometheus URL")
    command = ["gputop", *sys.argv[1:]] if sys.argv and sys.argv[0] else ["gputop", "report"]
    recording = None
    infra = None  # a report from a recording has no NVML details or kernel readings
    if args.from_file:
        if args.bench:
            raise UsageError("--bench needs a live job; it cannot be combined with --from")
        if getattr(args, "trace", False):
            raise UsageError("--trace needs a live job; it cannot be combined with --from")
        if args.pid or args.simulate:
            raise UsageError("--from reads a recording; drop --pid and --simulate")
        history, recording = history_from_recording(args.from_file, job=_recording_job(getattr(args, "job", None)))
    else:
        if getattr(args, "job", None) is not None:
            raise UsageError(
                "--job picks a job of a recording (--from FILE) or of Prometheus (--prometheus URL); a live report takes --pid"
            )
        if args.bench and not args.pid:
            raise UsageError("--bench needs --pid PID (the training job to benchmark)")
        if getattr(args, "trace", False) and not args.pid:
            raise UsageError("--trace needs --pid PID (the training job to trace)")
        if args.yes and not args.bench:
            raise UsageError("--yes only applies with --bench")
        args.stack_interval = min(
            getattr(args, "stack_interval", 2.0), max(FASTEST_STACK_INTERVAL_S, args.seconds / REPORT_STACK_DUMPS)
        )
        pipeline = live_source(args)
        try:
            from gputop.check_window import Evidence  # `gputop check` over the same window: the infra section

            pipeline.focus_sampling(True)  # the shares a report states come from dense samples (issue 21)
            evidence = Evidence(pipeline)
            try:
                history = observe(pipeline, args.seconds, args.interval, progress=Progress(sys.stderr, "observing"))
                if args.pid:
                    pipeline.flush_samples()  # the stretch still running holds the report's last seconds; a recorder read in flight, its answer
                    history.append(pipeline.poll())
                infra = evidence.finish(history)
            finally:
                evidence.close()
        finally:
            pipeline.close()
    bench = run_bench(args) if args.bench else None
    trace = run_trace(args) if getattr(args, "trace", False) else None
    # the report covers everything it observed; the memory: a second report on the job advises as the first did
    found = findings_of(history, bench, trace, infra, window=None, memory=AdviceMemory())
    text = render(history, found, args.format, bench, command, recording, infra, trace)
    if args.output:
        from gputop.report.writer import write_report

        write_report(args.output, text)
        print(f"gputop: wrote {args.output}: {verdict_line(found)}", file=sys.stderr)
    else:
        from gputop.report.writer import write_stdout

        write_stdout(text)  # UTF-8 bytes: an ASCII locale must not fail on '·', sparklines or paths
    return 0

"""`gputop report`: observe a while (or read a recording), diagnose, and write a ticket-ready report.

    gputop report [--pid PID] [--seconds 30] [--simulate] [-o FILE] [--format md|json] [--bench [--yes]]
    gputop report --from FILE
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional, TextIO

from gputop.analysis.diagnosis import diagnose, verdict_line
from gputop.errors import GputopError, UsageError
from gputop.history import History
from gputop.model import Snapshot

BENCH_SECONDS = 15.0  # the benchmark's own bound (issue 6: the active run is <= 15 s)
BAR_WIDTH = 30
# A short report still needs enough stack dumps to judge the input pipeline (diagnosis needs 5 per rank):
# aim for 10 over the observation, but never dump faster than every 0.5 s.
REPORT_STACK_DUMPS = 10
FASTEST_STACK_INTERVAL_S = 0.5


class Progress:
    """A one-line progress bar on a terminal; silent when the stream is not a terminal (pipes, CI logs)."""

    def __init__(self, stream: TextIO, what: str) -> None:
        self.stream = stream
        self.what = what
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        self._shown = False

    def update(self, fraction: float, message: str = "") -> None:
        if not self.enabled:
            return
        fraction = max(0.0, min(1.0, fraction))
        filled = int(round(fraction * BAR_WIDTH))
        bar = "█" * filled + "░" * (BAR_WIDTH - filled)
        self.stream.write(f"\r{self.what} {bar} {100 * fraction:3.0f}% {message}\x1b[K")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


def make_pipeline(args: Any) -> Any:
    """The live pipeline; with --pid, stacks are collected the whole time (a report needs them)."""
    from gputop.pipeline import pipeline_from_args  # lazy: a --from report needs no collectors

    pipeline = pipeline_from_args(args)
    collector = getattr(pipeline, "job_collector", None)
    if collector is not None:
        collector.stacks_wanted = True
    return pipeline


def observe(
    source: Any,
    seconds: float,
    interval: float,
    *,
    on_snapshot: Optional[Callable[[Snapshot], None]] = None,
    progress: Optional[Progress] = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> History:
    """Poll `source` every `interval` s for `seconds` s (one sample at the start and one at the end).

    Ctrl-C ends the observation early and keeps what was collected.
    """
    history = History(source.machine, capacity=int(seconds / interval) + 16)
    start = clock()
    deadline = start + seconds
    next_tick = start
    try:
        while True:
            snap = source.poll()
            history.append(snap)
            if on_snapshot is not None:
                on_snapshot(snap)
            now = clock()
            if progress is not None:
                progress.update((now - start) / seconds, f"{now - start:.0f}/{seconds:.0f} s")
            if now >= deadline:
                break
            next_tick += interval
            sleep(max(0.0, min(next_tick, deadline) - now))
    except KeyboardInterrupt:
        if not len(history):
            raise
        print(f"\ngputop: interrupted after {len(history)} samples", file=sys.stderr)
    finally:
        if progress is not None:
            progress.done()
    return history


def history_from_recording(path: str) -> History:
    from gputop.recording import read_recording

    machine, snapshots, warning = read_recording(path)
    if warning:
        print(f"gputop: warning: {warning}", file=sys.stderr)
    if not snapshots:
        raise GputopError(f"{path} holds no snapshots (the recording stopped before its first sample)")
    history = History(machine, capacity=len(snapshots))
    for snap in snapshots:
        history.append(snap)
    return history


def run_bench(args: Any) -> Any:
    try:
        from gputop.bench import run_benchmark
    except ImportError as exc:  # the bench engineer's module, imported only when asked for
        raise GputopError(f"the loader benchmark is not available in this install ({exc})") from None
    progress = Progress(sys.stderr, "benchmark")
    try:
        return run_benchmark(args.pid, seconds=BENCH_SECONDS, allow_inject=bool(args.yes), progress=progress.update)
    finally:
        progress.done()


def render(history: History, findings: list, fmt: str, bench: Any, command: list[str]) -> str:
    if fmt == "json":
        from gputop.report.jsonreport import render_json

        return render_json(history, findings, bench=bench, command=command)
    from gputop.report.markdown import render_markdown

    return render_markdown(history, findings, bench=bench, command=command)


def run(args: Any) -> int:
    command = ["gputop", *sys.argv[1:]] if sys.argv and sys.argv[0] else ["gputop", "report"]
    if args.from_file:
        if args.bench:
            raise UsageError("--bench needs a live job; it cannot be combined with --from")
        if args.pid or args.simulate:
            raise UsageError("--from reads a recording; drop --pid and --simulate")
        history = history_from_recording(args.from_file)
    else:
        if args.bench and not args.pid:
            raise UsageError("--bench needs --pid PID (the training job to benchmark)")
        if args.yes and not args.bench:
            raise UsageError("--yes only applies with --bench")
        args.stack_interval = min(getattr(args, "stack_interval", 2.0), max(FASTEST_STACK_INTERVAL_S, args.seconds / REPORT_STACK_DUMPS))
        pipeline = make_pipeline(args)
        try:
            history = observe(pipeline, args.seconds, args.interval, progress=Progress(sys.stderr, "observing"))
        finally:
            pipeline.close()
    bench = run_bench(args) if args.bench else None
    findings = diagnose(history, bench, window=None)  # the report covers everything it observed
    text = render(history, findings, args.format, bench, command)
    if args.output:
        from gputop.report.writer import write_report

        write_report(args.output, text)
        print(f"gputop: wrote {args.output}: {verdict_line(findings)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0

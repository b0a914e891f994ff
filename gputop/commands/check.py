"""`gputop check`: the quick health check before an infra ticket, and the evidence the ticket needs.

    gputop check [--json] [--seconds 10] [--simulate SPEC] [--load] [--dcgm [1|2]]

It reads the GPUs' identity, modes and error counters and the kernel's side (AER counters, NIC NUMA
nodes, XIDs in the kernel log) at the start and at the end of a short window, samples the GPUs through
it, and prints one line per check (`gputop.analysis.machine_check`).  Exit status: 0 healthy, 3 an
infrastructure problem, 4 a configuration warning, 1 gputop itself failed, 2 bad usage.
Non-intrusive unless `--load` asks for a short load and all-reduce on idle GPUs.  `--dcgm [1|2]` runs
NVIDIA's own diagnostics (`dcgmi diag -r N -j`) after the window, one line per test (`analysis/dcgm_diag.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any, Optional

from gputop.analysis.dcgm_diag import ABOUT
from gputop.analysis.machine_check import CheckReport, report_jsonable
from gputop.check_window import Evidence
from gputop.commands.observing import Progress, observe

if TYPE_CHECKING:
    from gputop.pipeline import Pipeline

# What the end of the window needs (the last details, the kernel log, printing): the observation stops
# this much before --seconds so the whole command fits in it.
FINISH_S = 0.7
POLL_INTERVAL_S = 1.0
MIN_WINDOW_S = 1.0


def collect(args: argparse.Namespace, *, started: Optional[float] = None) -> CheckReport:
    """Run the window and the checks (also what the TUI's hotkey runs, in a worker thread)."""
    from gputop.pipeline import check_pipeline

    started = time.monotonic() if started is None else started
    pipeline = check_pipeline(getattr(args, "simulate", None))
    try:
        evidence = Evidence(pipeline, getattr(args, "host_root", None))
        try:
            return _collect(args, pipeline, evidence, started)
        finally:
            evidence.close()
    finally:
        pipeline.close()


def _collect(args: argparse.Namespace, pipeline: Pipeline, evidence: Evidence, started: float) -> CheckReport:
    load_run = None
    if getattr(args, "load", False):
        from gputop.collect.gpu_load import start_load

        load_run = start_load(pipeline, args.seconds)
        load_run.wait_started()
    if load_run is not None and load_run.proc is not None:
        window = args.seconds  # the load job runs this long: watch all of it (the 10 s bound does not hold with --load)
    else:
        # at least MIN_WINDOW_S even when the start ate the budget: counters need time to climb
        window = max(min(MIN_WINDOW_S, args.seconds), args.seconds - FINISH_S - (time.monotonic() - started))
    progress = Progress(sys.stderr, "checking") if getattr(args, "progress", True) else None
    history = observe(pipeline, window, min(POLL_INTERVAL_S, max(window, 0.05)), progress=progress)
    load = load_run.finish() if load_run is not None else None
    dcgm = None
    level = getattr(args, "dcgm", None)
    if level is not None:
        from gputop.collect.dcgm import collect_dcgm

        if progress is not None:
            sys.stderr.write(f"running dcgmi diag -r {level} ({ABOUT[level]})…\n")
        dcgm = collect_dcgm(level)
    return evidence.finish(history, load, window, dcgm)


def write_text(report: CheckReport, out: Any) -> None:
    for result in report.results:
        out.write(result.line() + "\n")
    out.write(f"\n{report.summary}; exit status {report.exit_code}\n")


def run(args: argparse.Namespace) -> int:
    # the 10 s bound counts from the process's start: Python and the imports take ~1-2 s of it on a busy box
    import psutil

    started = time.monotonic() - max(0.0, time.time() - psutil.Process().create_time())
    args.progress = not args.json
    report = collect(args, started=started)
    if args.json:
        json.dump(report_jsonable(report), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        import io

        from gputop.report.writer import write_stdout

        text = io.StringIO()
        write_text(report, text)
        write_stdout(text.getvalue())
    return report.exit_code

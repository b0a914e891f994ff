"""``gputop trace``: profile every rank of a live job for a bounded window, or summarise existing traces.

``--pid PID`` injects the trace agent (torch.profiler for at most 10 s or N optimizer steps) and writes one
Chrome trace per rank under ``-o DIR``; ``--from FILE|DIR`` summarises traces that already exist.  The
summary is text, or JSON with ``--json`` (``ranks``: ``{rank, pid, phases, steps_per_s, trace_file, ...}``
and ``findings``).  Progress goes to stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import json

from gputop.commands.bench import _StderrProgress
from gputop.errors import UsageError
from gputop.report.writer import write_stdout
from gputop.tracing import run_trace, trace_from_files


def run(args: argparse.Namespace) -> int:
    if args.from_file:
        if args.seconds is not None or args.steps is not None or args.output or args.with_stack:
            raise UsageError("--seconds, --steps, -o and --with-stack apply to a live trace (--pid), not to --from")
        result = trace_from_files(args.from_file)
    else:
        progress = _StderrProgress()
        try:
            result = run_trace(
                args.pid,
                seconds=args.seconds,
                steps=args.steps,
                out_dir=args.output,
                with_stack=args.with_stack,
                progress=progress,
            )
        finally:
            progress.close()
    if args.json:
        write_stdout(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        write_stdout("\n".join(result.summary_lines()) + "\n")
    return 0

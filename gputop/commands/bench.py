"""``gputop bench``: can this DataLoader feed the GPUs? Measure it and advise settings.

``--pid PID`` benchmarks a running job (passive py-spy sampling; with ``--yes`` the injected agent too);
``--loader MODULE:FUNCTION`` sweeps a factory's DataLoader without a job.  Progress goes to stderr when
it is a terminal; the result is text, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys

from gputop.bench import run_benchmark, run_offline_benchmark
from gputop.report.writer import write_stdout


class _StderrProgress:
    """One self-overwriting status line on a terminal; silent otherwise (logs and pipes stay clean)."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.width = 0

    def __call__(self, fraction: float, message: str) -> None:
        if not self.enabled:
            return
        text = f"[{fraction:4.0%}] {message}"[:100]
        sys.stderr.write("\r" + text.ljust(self.width))
        sys.stderr.flush()
        self.width = len(text)

    def close(self) -> None:
        if self.enabled and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    progress = _StderrProgress()
    try:
        if getattr(args, "loader", None):
            result = run_offline_benchmark(args.loader, seconds=args.seconds, progress=progress)
        else:
            result = run_benchmark(args.pid, seconds=args.seconds, allow_inject=bool(args.yes), progress=progress)
    finally:
        progress.close()
    if args.json:
        write_stdout(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        write_stdout("\n".join(result.summary_lines()) + "\n")  # UTF-8 even under LANG=C
    return 0

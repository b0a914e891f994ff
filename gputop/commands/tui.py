"""`gputop [tui] [--pid PID] [--simulate [PROFILE]] [--interval S]`: the live monitor on this machine."""

from __future__ import annotations

from typing import Any


def run(args: Any) -> int:
    from gputop.pipeline import pipeline_from_args
    from gputop.tui.app import run_app  # Textual loads only once the monitor is really wanted

    source = pipeline_from_args(args)
    return run_app(source, interval=getattr(args, "interval", 1.0) or 1.0)

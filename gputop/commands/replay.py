"""`gputop replay FILE [--speed X]`: play a recording in the TUI, with pause, seek and speed."""

from __future__ import annotations

import argparse
import os
import sys

from gputop.recording import ReplaySource


def run(args: argparse.Namespace) -> int:
    source = ReplaySource(args.file, speed=args.speed)  # a missing or unreadable file fails here, in one line
    if source.warning:
        print(f"gputop: warning: {source.warning}", file=sys.stderr)
    from gputop.tui.app import run_app  # lazy: the core never loads Textual

    subtitle = f"replay of {os.path.basename(args.file)} ({source.duration:.0f} s, {args.speed:g}×)"
    try:
        return run_app(source, interval=source.interval / args.speed, subtitle=subtitle, controls=source)
    finally:
        source.close()

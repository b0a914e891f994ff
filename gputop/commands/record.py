"""`gputop record -o FILE [--pid PID] [--seconds N] [--simulate]`: write the snapshot stream to a file."""

from __future__ import annotations

import sys
from typing import Any

from gputop.commands.report import Progress, make_pipeline, observe
from gputop.recording import RecordingWriter

UNBOUNDED_SECONDS = 365 * 24 * 3600.0  # "until Ctrl-C"


def run(args: Any) -> int:
    pipeline = make_pipeline(args)
    try:
        with RecordingWriter(args.output, pipeline.machine) as writer:
            seconds = args.seconds or UNBOUNDED_SECONDS
            progress = Progress(sys.stderr, f"recording {args.output}") if args.seconds else None
            if not args.seconds:
                print(f"gputop: recording to {args.output}; Ctrl-C stops", file=sys.stderr)
            history = observe(pipeline, seconds, args.interval, on_snapshot=writer.write, progress=progress)
            count = writer.count
    finally:
        pipeline.close()
    span = history.latest.timestamp - next(iter(history)).timestamp if len(history) else 0.0
    print(f"gputop: recorded {count} snapshots ({span:.0f} s) to {args.output}; replay with `gputop replay {args.output}`", file=sys.stderr)
    return 0

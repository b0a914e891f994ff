"""`gputop record -o FILE [--pid PID ...] [--seconds N] [--simulate]`: write the snapshot stream to a file.

The pipeline is `serve`'s (`gputop.pipeline.following_pipeline`): the jobs of --pid, or every job on the
GPUs, each with its stacks, so a recording holds what `gputop serve` with the same options exports, and
`gputop report --from` it gives the findings `serve` exported."""

from __future__ import annotations

import argparse
import sys

from gputop.commands.observing import Progress, observe
from gputop.model import Snapshot
from gputop.pipeline import following_pipeline
from gputop.recording import RecordingWriter

UNBOUNDED_SECONDS = 365 * 24 * 3600.0  # "until Ctrl-C"
# Every snapshot goes to the file as it is taken; the recorder itself keeps only the latest few, so its
# memory stays flat however long it runs (a history sized to --seconds would grow without bound).
RECORD_HISTORY = 2


def run(args: argparse.Namespace) -> int:
    pipeline = following_pipeline(args)
    try:
        with RecordingWriter(args.output, pipeline.machine) as writer:
            seconds = args.seconds or UNBOUNDED_SECONDS
            progress = Progress(sys.stderr, f"recording {args.output}") if args.seconds else None
            if not args.seconds:
                print(f"gputop: recording to {args.output}; Ctrl-C stops", file=sys.stderr)
            first: list[float] = []

            def on_snapshot(snap: Snapshot) -> None:
                writer.write(snap)
                if not first:
                    first.append(snap.timestamp)

            history = observe(
                pipeline, seconds, args.interval, on_snapshot=on_snapshot, progress=progress, capacity=RECORD_HISTORY
            )
            count = writer.count
    finally:
        pipeline.close()
    span = history.latest.timestamp - first[0] if first and history.latest is not None else 0.0
    print(
        f"gputop: recorded {count} snapshots ({span:.0f} s) to {args.output}; replay with `gputop replay {args.output}`",
        file=sys.stderr,
    )
    return 0

"""`gputop [tui] [--pid PID] [--simulate [PROFILE]] [--interval S]`: the live monitor on this machine."""

from __future__ import annotations

import gc
from typing import Any


def run(args: Any) -> int:
    # Start-up builds ~100k long-lived objects (Textual, pynvml, psutil, our modules) and no garbage worth
    # collecting: the cyclic collector would only rescan them, ~5% of the time to the first frame. The app
    # turns it back on once the first frame is drawn (GputopApp._started).
    gc.disable()
    from gputop.pipeline import pipeline_from_args
    from gputop.source import PollLoop

    try:
        source = pipeline_from_args(args)
    except BaseException:
        gc.enable()
        raise
    interval = getattr(args, "interval", 1.0) or 1.0
    poll_loop = PollLoop(source, interval)
    poll_loop.prefetch()  # the first poll runs while Textual loads, so the first frame has GPU readings
    from gputop.tui.app import run_app  # Textual loads only once the monitor is really wanted

    return run_app(source, interval=interval, poll_loop=poll_loop)

"""`gputop [tui] [--pid PID] [--simulate [PROFILE]] [--interval S]`: the live monitor on this machine."""

from __future__ import annotations

import argparse
import gc
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from gputop.collect.host import HostCollector
    from gputop.collect.job_tree import JobCollector
    from gputop.pipeline import Pipeline
    from gputop.tui.starting import StartingPipeline


def run(args: argparse.Namespace) -> int:
    # Start-up builds ~100k long-lived objects (Textual, pynvml, psutil, our modules) and no garbage worth
    # collecting: the cyclic collector would only rescan them, ~5% of the time to the first frame. The app
    # turns it back on once the first frame is drawn (GputopApp._started).
    gc.disable()
    from gputop.source import PollLoop

    # nvmlInit and the static GPU reads run on a thread, started once the first frame is drawn: the first frame
    # never waits for them (the GPU cards say "reading GPUs…" until the first NVML sample lands).
    try:
        source = starting_pipeline(args)
    except BaseException:
        gc.enable()
        raise
    try:
        interval = getattr(args, "interval", 1.0) or 1.0
        poll_loop = PollLoop(source, interval)
        poll_loop.prefetch()  # the first poll (the host's side) runs while Textual loads: the first frame shows it
        from gputop.tui.app import run_app  # Textual loads only once the monitor is really wanted

        source.raise_if_failed()  # a PID that is gone (its collector is made at once): its one line, before any frame
    except BaseException:
        source.close()
        gc.enable()
        raise
    return run_app(source, interval=interval, poll_loop=poll_loop)


def starting_pipeline(args: argparse.Namespace) -> "StartingPipeline":
    """The pipeline the command line asks for (args.simulate, .pid, .stack_interval), built on a thread."""
    from gputop.tui.starting import StartingPipeline

    simulate: Optional[str] = getattr(args, "simulate", None)
    stack_interval: float = getattr(args, "stack_interval", 2.0)
    if simulate is not None:
        from gputop.sim.spec import parse_spec

        parse_spec(simulate)  # a bad spec is the command's one line before any frame (the build waits for one)

    def build(host: "HostCollector", job: "Optional[JobCollector]") -> "Pipeline":
        from gputop.pipeline import tui_pipeline  # (pynvml loads on this thread too)

        return tui_pipeline(simulate, host, job, stack_interval)

    # held until the first frame is on the terminal (GputopApp._release_pipeline): see starting.py
    return StartingPipeline(build, pid=getattr(args, "pid", None), stack_interval=stack_interval, simulated=simulate, held=True)

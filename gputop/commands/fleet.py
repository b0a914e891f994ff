"""`gputop fleet --prometheus URL [--job ID | --slurm-job ID] [--interval S]`: one job across nodes, live, in the terminal.

The first view is read before the screen starts, so a bad address, an unreachable Prometheus or an unknown
job is one line and exit code as `gputop report --prometheus` gives them; later failures are the screen's
status line (gputop.tui.fleet_app), retried every interval."""

from __future__ import annotations

from typing import Any

from gputop.errors import GputopError, UsageError
from gputop.fleet.live import read_round
from gputop.fleet.prometheus import PrometheusApi
from gputop.fleet.slurm import resolve_job


def run(args: Any) -> int:
    for option, given in (("--pid", getattr(args, "pid", None)), ("--simulate", getattr(args, "simulate", None))):
        if given:
            raise UsageError(f"gputop fleet reads what the nodes' gputop serve exported to Prometheus; drop {option}")
    api = PrometheusApi(args.prometheus)
    job, slurm_hosts = resolve_job(api, args.job, getattr(args, "slurm_job", None), api.url)
    first = read_round(api, job, api.url, slurm_hosts)
    if first.error is not None:
        raise GputopError(first.error)
    from gputop.tui.fleet_app import run_fleet_app  # Textual only once there is something to show

    return run_fleet_app(api, api.url, first, auto_picked=job is None, interval=args.interval, expected_hosts=slurm_hosts)

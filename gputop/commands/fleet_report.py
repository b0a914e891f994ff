"""`gputop report --prometheus URL [--job ID | --slurm-job ID] [--format md|json]`: one job across nodes, as
a ticket report.

Reads what every node's `gputop serve` exported through Prometheus's HTTP API (`gputop.fleet.view`), names
the node and rank that hold the job back and every other outlier; the Markdown summarises a big job
(outliers first), the JSON has every node and rank."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from gputop.errors import UsageError
from gputop.fleet.prometheus import PrometheusApi, Query
from gputop.fleet.slurm import resolve_job
from gputop.fleet.view import fleet_view, judge
from gputop.report.fleet import json_text, report_json, report_markdown


def build(query: Query, url: str, job: Optional[str], fmt: str, expected_hosts: Sequence[str] = ()) -> str:
    view = fleet_view(query, job, where=url, expected_hosts=expected_hosts)
    verdict = judge(view)
    if fmt == "json":
        return json_text(report_json(view, verdict, url))
    return report_markdown(view, verdict, url)


def run(args: argparse.Namespace) -> int:
    for option, given in (
        ("--pid", args.pid),
        ("--simulate", args.simulate),
        ("--from", args.from_file),
        ("--bench", args.bench),
    ):
        if given:
            raise UsageError(f"--prometheus reads what the nodes' gputop serve exported; drop {option}")
    api = PrometheusApi(args.prometheus)
    job, slurm_hosts = resolve_job(api, args.job, getattr(args, "slurm_job", None), api.url)
    text = build(api, api.url, job, args.format, slurm_hosts)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0

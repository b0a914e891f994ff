"""`gputop report --prometheus URL [--job ID] [--format md|json]`: one job across nodes, as a ticket report.

Reads what every node's `gputop serve` exported through Prometheus's HTTP API (`gputop.fleet.view`) and
names the node that holds the job back."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from gputop.errors import UsageError
from gputop.fleet.prometheus import PrometheusApi, Query
from gputop.fleet.view import FleetRank, FleetVerdict, FleetView, fleet_view, judge


def report_json(view: FleetView, verdict: FleetVerdict, url: str) -> dict[str, Any]:
    return {
        "job": view.job,
        "prometheus": url,
        "at": view.at,
        "nnodes": view.nnodes,
        "world_size": view.world_size,
        "verdict": {"kind": verdict.kind, "node": verdict.node, "rank": verdict.rank, "summary": verdict.summary},
        "nodes": [
            {
                "node": n.hostname,
                "node_rank": n.node_rank,
                "gpus": list(n.gpus),
                "utilization": {str(g): u for g, u in sorted(n.utilization.items())},
                "gpu_health": {str(g): h for g, h in sorted(n.gpu_health.items())},
                "ranks": [r.rank for r in view.ranks if r.node == n.hostname],
                "verdict": n.verdict,
            }
            for n in view.nodes
        ],
        "ranks": [
            {
                "node": r.node,
                "node_rank": r.node_rank,
                "rank": r.rank,
                "local_rank": r.local_rank,
                "pid": r.pid,
                "gpus": list(r.gpus),
                "state": r.state,
                "data_wait_ratio": r.data_wait_ratio,
                "data_wait_interval": [r.data_wait_low, r.data_wait_high] if r.data_wait_low is not None else None,
                "last_progress": r.last_progress,
                "progress_age_s": None if r.last_progress is None else round(view.at - r.last_progress, 1),
            }
            for r in view.ranks
        ],
        "findings": [
            {
                "node": f.node,
                "kind": f.kind,
                "severity": f.severity,
                "label": f.label,
                "gpu": f.gpu,
                "device": f.device or None,
                "port": f.port,
            }
            for f in view.findings
        ],
        "other_jobs": list(view.other_jobs),
    }


def _cell(value: Optional[float], fmt: str = "{:.0%}") -> str:
    return "-" if value is None else fmt.format(value)


def _rank_line(view: FleetView, r: FleetRank) -> str:
    age = None if r.last_progress is None else view.at - r.last_progress
    gpus = ",".join(str(g) for g in r.gpus) or "-"
    return (
        f"| {r.rank} | {r.node} | {'-' if r.local_rank is None else r.local_rank} | {gpus} | {r.state or '-'} | "
        f"{_cell(r.data_wait_ratio)} | {_cell(age, '{:.0f} s ago')} |"
    )


def report_markdown(view: FleetView, verdict: FleetVerdict, url: str) -> str:
    lines = [
        f"# gputop fleet report: job {view.job}",
        "",
        f"**Verdict ({verdict.kind}):** {verdict.summary}",
        "",
        f"Read from Prometheus at {url}: {len(view.nodes)} nodes"
        + (f" of {view.nnodes}" if view.nnodes and view.nnodes != len(view.nodes) else "")
        + f", {len(view.ranks)} ranks"
        + (f" of {view.world_size}" if view.world_size and view.world_size != len(view.ranks) else "")
        + ".",
        "",
        "## Nodes",
        "",
        "| node | node rank | GPUs | ranks | GPU health | its own verdict |",
        "|---|---|---|---|---|---|",
    ]
    for n in view.nodes:
        unwell = [f"GPU{g}:{'critical' if h >= 2 else 'warning'}" for g, h in sorted(n.gpu_health.items()) if h]
        ranks = ",".join(str(r.rank) for r in view.ranks if r.node == n.hostname) or "-"
        place = "-" if n.node_rank is None else str(n.node_rank)
        lines.append(f"| {n.hostname} | {place} | {len(n.gpus)} | {ranks} | {' '.join(unwell) or 'ok'} | {n.verdict or '-'} |")
    lines += [
        "",
        "## Ranks",
        "",
        "| rank | node | local rank | GPU | state | data wait | last progress |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [_rank_line(view, r) for r in view.ranks]
    lines += ["", "## Findings by node", ""]
    if not view.findings:
        lines.append("None.")
    for f in view.findings:
        where = f" {f.part}" if f.part else ""
        lines.append(f"- **{f.node}**{where}: {f.kind} ({f.severity}, {f.label})")
    if view.other_jobs:
        lines += ["", f"Other jobs in this Prometheus: {', '.join(view.other_jobs)} (pick one with --job)."]
    return "\n".join(lines) + "\n"


def build(query: Query, url: str, job: Optional[str], fmt: str) -> str:
    view = fleet_view(query, job, where=url)
    verdict = judge(view)
    if fmt == "json":
        return json.dumps(report_json(view, verdict, url), indent=2) + "\n"
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
    text = build(api, api.url, args.job, args.format)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0

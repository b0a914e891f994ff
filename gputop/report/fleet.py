"""The fleet report's text: one job across nodes (`gputop.fleet.view`) as Markdown for a ticket and as JSON,
for `gputop report --prometheus` and the fleet view's `r` key alike.  The Markdown summarises a big job
(outliers first); the JSON has every node and rank."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from typing import Any, Optional

from gputop.fleet.view import (
    FleetNode,
    FleetRank,
    FleetVerdict,
    FleetView,
    grouped_findings,
    nodes_outliers_first,
    outliers,
    rank_ranges,
    ranks_outliers_first,
)

# The Markdown lists every node and rank up to these; a bigger job gets its outliers and a summary line
# (the JSON always has all of them).
MD_ALL_NODES_UP_TO = 16
MD_ALL_RANKS_UP_TO = 16
MD_OTHER_RANKS_SHOWN = 4  # beyond the outliers' ranks, the most stalled or waiting
FINDING_GROUPED_FROM = 4  # the same finding on this many nodes is one line naming them


def _verdict_json(verdict: FleetVerdict) -> dict[str, Any]:
    return {"kind": verdict.kind, "node": verdict.node, "rank": verdict.rank, "summary": verdict.summary}


def report_json(view: FleetView, verdict: FleetVerdict, url: str) -> dict[str, Any]:
    ranks_of: dict[str, list[int]] = {}
    for r in view.ranks:
        ranks_of.setdefault(r.node, []).append(r.rank)
    return {
        "job": view.job,
        "prometheus": url,
        "at": view.at,
        "nnodes": view.nnodes,
        "world_size": view.world_size,
        "verdict": _verdict_json(verdict),
        "outliers": [_verdict_json(v) for v in outliers(view)],
        "nodes": [
            {
                "node": n.hostname,
                "node_rank": n.node_rank,
                "gpus": list(n.gpus),
                "utilization": {str(g): u for g, u in sorted(n.utilization.items())},
                "gpu_health": {str(g): h for g, h in sorted(n.gpu_health.items())},
                "ranks": ranks_of.get(n.hostname, []),
                "verdict": n.verdict,
                "reporting": n.reporting,
                "last_seen": n.last_seen,
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
                # a node's clock a little ahead of Prometheus's makes a fresh rank's age negative: 0
                "progress_age_s": None if r.last_progress is None else round(max(0.0, view.at - r.last_progress), 1),
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
    age = None if r.last_progress is None else max(0.0, view.at - r.last_progress)
    gpus = ",".join(str(g) for g in r.gpus) or "-"
    return (
        f"| {r.rank} | {r.node} | {'-' if r.local_rank is None else r.local_rank} | {gpus} | {r.state or '-'} | "
        f"{_cell(r.data_wait_ratio)} | {_cell(age, '{:.0f} s ago')} |"
    )


def _node_row(view: FleetView, n: FleetNode, ranks_of: dict[str, list[int]]) -> str:
    unwell = [f"GPU{g}:{'critical' if h >= 2 else 'warning'}" for g, h in sorted(n.gpu_health.items()) if h]
    place = "-" if n.node_rank is None else str(n.node_rank)
    if not n.reporting:
        ago = "" if n.last_seen is None else f", last seen {view.at - n.last_seen:.0f} s ago"
        return f"| {n.hostname} | {place} | - | - | - | not reporting{ago} |"
    ranks = rank_ranges(ranks_of.get(n.hostname, []))
    return f"| {n.hostname} | {place} | {len(n.gpus)} | {ranks} | {' '.join(unwell) or 'ok'} | {n.verdict or '-'} |"


def _finding_lines(view: FleetView) -> list[str]:
    """A line per finding; one the same on FINDING_GROUPED_FROM nodes or more is one line naming them."""
    lines = []
    for f, nodes in grouped_findings(view.findings):
        where = f" {f.part}" if f.part else ""
        if len(nodes) >= FINDING_GROUPED_FROM:
            lines.append(f"- **{len(nodes)} nodes** ({', '.join(nodes[:3])} …){where}: {f.kind} ({f.severity}, {f.label})")
        else:
            lines += [f"- **{node}**{where}: {f.kind} ({f.severity}, {f.label})" for node in nodes]
    return lines


def _nodes_section(view: FleetView, found: tuple[FleetVerdict, ...]) -> list[str]:
    """The nodes' table, outliers first: every node in a small job, the outliers' and a line for the rest in a big one."""
    lines: list[str] = []
    ranks_of: dict[str, list[int]] = {}
    for r in view.ranks:
        ranks_of.setdefault(r.node, []).append(r.rank)
    nodes = nodes_outliers_first(view, found)
    shown_nodes = nodes if len(nodes) <= MD_ALL_NODES_UP_TO else nodes[: max(len({v.node for v in found}), 4)]
    lines += [
        "",
        "## Nodes",
        "",
        "| node | node rank | GPUs | ranks | GPU health | its own verdict |",
        "|---|---|---|---|---|---|",
    ]
    lines += [_node_row(view, n, ranks_of) for n in shown_nodes]
    if len(shown_nodes) < len(nodes):
        rest = nodes[len(shown_nodes) :]
        unwell = sum(1 for n in rest if any(n.gpu_health.values()))
        lines += [
            "",
            f"{len(rest)} more nodes, none an outlier"
            + (f" ({unwell} with a GPU warning)" if unwell else ", every GPU healthy")
            + ": `--format json` lists every node.",
        ]
    return lines


def _ranks_section(view: FleetView, found: tuple[FleetVerdict, ...]) -> list[str]:
    """The ranks' table, outliers first: every rank in a small job, the outliers', a few more and a line for the rest in a big one."""
    lines: list[str] = []
    ranks = ranks_outliers_first(view, found)
    named = {(v.node, v.rank) for v in found if v.rank is not None}
    if len(ranks) <= MD_ALL_RANKS_UP_TO:
        shown_ranks = ranks
    else:
        shown_ranks = [r for r in ranks if (r.node, r.rank) in named]
        shown_ranks += [r for r in ranks if (r.node, r.rank) not in named][:MD_OTHER_RANKS_SHOWN]
    lines += [
        "",
        "## Ranks",
        "",
        "| rank | node | local rank | GPU | state | data wait | last progress |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [_rank_line(view, r) for r in shown_ranks]
    if len(shown_ranks) < len(ranks):
        states = Counter(r.state or "unknown" for r in ranks)
        waits = [r.data_wait_ratio for r in ranks if r.data_wait_ratio is not None]
        lines += [
            "",
            f"{len(ranks) - len(shown_ranks)} more ranks in `--format json`. All {len(ranks)}: "
            + ", ".join(f"{count} {state}" for state, count in states.most_common())
            + (f"; data wait median {statistics.median(waits):.0%}" if waits else "")
            + ".",
        ]
    return lines


def report_markdown(view: FleetView, verdict: FleetVerdict, url: str) -> str:
    """The verdict, every outlier, then the nodes and ranks outliers first: all of them in a small job, the
    outliers' and a summary line in a big one (`--format json` has every rank)."""
    found = outliers(view)
    reporting = [n for n in view.nodes if n.reporting]
    lines = [
        f"# gputop fleet report: job {view.job}",
        "",
        f"**Verdict ({verdict.kind}):** {verdict.summary}",
        "",
        f"Read from Prometheus at {url}: {len(reporting)} nodes"
        + (f" of {view.nnodes}" if view.nnodes and view.nnodes != len(reporting) else "")
        + f", {len(view.ranks)} ranks"
        + (f" of {view.world_size}" if view.world_size and view.world_size != len(view.ranks) else "")
        + ".",
        "",
        "## Outliers",
        "",
    ]
    lines += [f"- **{v.kind}**: {v.summary}" for v in found] or ["None: no rank or node stands out."]
    lines += _nodes_section(view, found)
    lines += _ranks_section(view, found)
    lines += ["", "## Findings by node", ""]
    lines += _finding_lines(view) or ["None."]
    if view.other_jobs:
        lines += ["", f"Other jobs in this Prometheus: {', '.join(view.other_jobs)} (pick one with --job)."]
    return "\n".join(lines) + "\n"


def json_text(data: dict[str, Any]) -> str:
    """The report's JSON: a key a line, and each node, rank, finding and outlier an object on a line of its own.
    (`indent=2` would put each field on its own line, ~30,000 lines at 2,048 ranks, and runs json's pure-Python
    encoder: 5× slower than the C one used for each line here.)"""
    fields = []
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            items = ",\n".join("    " + json.dumps(item) for item in value)
            fields.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            fields.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(fields) + "\n}\n"

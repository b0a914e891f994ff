"""A job tree as JSON in the shape `gputop snapshot --json` promises (and back): output code, apart from
the collectors that build the trees."""

from __future__ import annotations

from typing import Any

from gputop.model import JobTree, from_jsonable, to_jsonable


def job_json(tree: JobTree) -> dict[str, Any]:
    """The `job` key of `gputop snapshot --json` in the issue's shape: each rank has ``pid``, ``rank``,
    ``local_rank``, ``gpus``, ``workers`` (PIDs) and ``main_thread_state``; the full worker details move
    to ``worker_procs`` and the rank's own to ``proc``; ``stacks`` maps PID -> threads -> frames
    (``name``, ``filename``, ``line``, innermost first)."""
    out: dict[str, Any] = to_jsonable(tree)
    for rank_json, rank in zip(out["ranks"], tree.ranks):
        rank_json["pid"] = rank.proc.pid
        rank_json["worker_procs"] = rank_json["workers"]
        rank_json["workers"] = [w.pid for w in rank.workers]
    return out


def job_from_json(data: dict[str, Any]) -> JobTree:
    """The inverse of `job_json`: restores each rank's full worker records from ``worker_procs``."""
    data = dict(data)
    ranks = []
    for rank_json in data.get("ranks", []):
        rank_json = {k: v for k, v in rank_json.items() if k not in ("pid", "workers")}
        rank_json["workers"] = rank_json.pop("worker_procs", [])
        ranks.append(rank_json)
    data["ranks"] = ranks
    tree: JobTree = from_jsonable(JobTree, data)
    return tree

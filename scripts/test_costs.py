"""Where a test run's time and CPU went, per lane: the table of docs/development.md and the README.

    python -m pytest --test-costs costs.jsonl [...]        # one JSON line a test (tests/conftest.py)
    python scripts/test_costs.py costs.jsonl [--top 5]
    python scripts/test_costs.py costs.jsonl --file-costs tests/harness/file_costs.json

Per lane: the tests, their wall time summed (setup, call and teardown; a side-by-side run's turn waits apart),
their CPU (the pytest process's and the processes it started and reaped), and the slowest tests by wall.  CPU
is the figure that says what a run on 2 cores can come down to: on a shared box the wall moves with the load,
the CPU much less.

``--file-costs FILE`` writes each test file's shared tests' wall seconds (the measured chain's left out) as the
JSON that orders a side-by-side run's files, the longest first (tests/harness/measured_chain.py); write it from a
clean-clone run on the 2-core box when files are added or grow.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

LANES = ("unit", "integration", "acceptance")


def read(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            sys.exit(f"test_costs: {path}:{number} is not a JSON line; pass the file `pytest --test-costs` wrote")
    return rows


def table(rows: list[dict], top: int) -> str:
    by_lane: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_lane[row.get("lane") or "?"].append(row)
    out = [
        "| lane | tests | wall (summed) | CPU | slowest by wall |",
        "|---|---|---|---|---|",
    ]
    for lane in (*LANES, *sorted(set(by_lane) - set(LANES))):
        tests = by_lane.get(lane)
        if not tests:
            continue
        wall = sum(r["wall_s"] for r in tests)
        cpu = sum(r["cpu_s"] + r["children_cpu_s"] for r in tests)
        slowest = sorted(tests, key=lambda r: r["wall_s"], reverse=True)[:top]
        named = "; ".join(f"{r['test'].split('::', 1)[-1][:60]} {r['wall_s']:.0f} s" for r in slowest)
        out.append(f"| {lane} | {len(tests)} | {wall / 60:.1f} min | {cpu / 60:.1f} min | {named} |")
    total_cpu = sum(r["cpu_s"] + r["children_cpu_s"] for r in rows)
    waited = sum(r.get("turn_wait_s", 0.0) for r in rows)
    out.append(f"\n{len(rows)} tests, {total_cpu / 60:.1f} CPU-minutes; {waited / 60:.1f} minutes waiting for side-by-side turns")
    return "\n".join(out)


def file_costs(rows: list[dict]) -> dict[str, float]:
    """{test file: the wall seconds of its tests outside the measured chain}, the longest first.  Lines written
    before the costs said "measured" leave out the acceptance lane instead (its alone integration tests then count
    with their file)."""
    costs: dict[str, float] = defaultdict(float)
    for row in rows:
        measured = row["measured"] if "measured" in row else row.get("lane") == "acceptance"
        if not measured:
            costs[row["test"].split("::", 1)[0]] += row["wall_s"]
    return {name: round(seconds, 1) for name, seconds in sorted(costs.items(), key=lambda item: (-item[1], item[0]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("costs", type=Path, help="the file `python -m pytest --test-costs FILE` wrote")
    parser.add_argument("--top", type=int, default=3, help="the slowest tests named per lane (default 3)")
    parser.add_argument(
        "--file-costs", type=Path, metavar="FILE", help="write each test file's shared seconds to FILE (JSON) instead"
    )
    args = parser.parse_args(argv)
    if not args.costs.is_file():
        sys.exit(f"test_costs: no file {args.costs}; write one with `python -m pytest --test-costs {args.costs}`")
    if args.file_costs is not None:
        costs = file_costs(read(args.costs))
        args.file_costs.write_text(json.dumps(costs, indent=1) + "\n")
        print(f"{len(costs)} files, {sum(costs.values()) / 60:.1f} minutes of shared tests, written to {args.file_costs}")
        return 0
    print(table(read(args.costs), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run every benchmark script in benchmarks/ and print the rows of benchmarks/RESULTS.md.

    python benchmarks/run_all.py [--quick] [--only NAME ...] [--with-real-attach] [--keep-output DIR]

Each `bench_*.py` runs one after another (never in parallel: they measure the machine).  A script
reports its figures as `GPUTOP-FIGURE {json}` lines (see `common.emit_figure`); for scripts that
print only their own text or `--json`, an adapter below reads those.  `--quick` passes each script
its short mode (`--quick`, or the short arguments listed in QUICK_ARGS).  The output ends with the
Markdown rows: | Figure | Goal | Measured | Command |, ready to paste into benchmarks/RESULTS.md (add the date).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parse_figures

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SKIP = {"common.py", "run_all.py"}
TIMEOUT_S = 1200
QUICK_TIMEOUT_S = 240

# Short runs for scripts without a --quick flag.
QUICK_ARGS = {
    "bench_tui.py": ["--seconds", "10", "--warmup", "3", "--repeats", "2"],
    "bench_stacks.py": ["--rounds", "3"],
    "bench_attach_overhead.py": ["--rounds", "2", "--window", "5"],
    "bench_fleet_scale.py": ["--rounds", "3"],
}
# Extra arguments a script needs so that an adapter can read its figures.
ADAPTER_ARGS = {"bench_tui.py": ["--json"], "bench_stacks.py": ["--json"], "bench_attach_overhead.py": ["--json"]}
LONG_RUNS = {"bench_soak.py": ["--real-attach", "10"]}  # with --with-real-attach


Figure = dict[str, Any]


def _last_json_line(text: str) -> Optional[Any]:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") or line.startswith("["):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _json_block(text: str) -> Optional[Any]:
    """A pretty-printed JSON document somewhere in the output (from the first line that opens one)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() in ("[", "{") or line.startswith("[{") or line.startswith('{"'):
            try:
                return json.loads("\n".join(lines[i:]))
            except ValueError:
                continue
    return _last_json_line(text)


def adapt_tui(text: str, command: str) -> list[Figure]:
    results = {r["name"]: r for r in _json_block(text) or []}
    gputop, nvitop = results.get("gputop", {}), results.get("nvitop", {})
    rows = [
        ("TUI CPU, % of one core (1 s refresh, 8 GPUs, 120x40 pty)", "<= 1.5%", "cpu_percent", "{:.2f}%", 1.5),
        ("TUI bytes/s to the terminal", "<= 5 KB/s", "bytes_per_s", "{:.0f} B/s", 5 * 1024),
        ("TUI time to first frame", "<= 0.6 s", "first_frame_s", "{:.2f} s", 0.6),
        ("TUI RSS", "<= 80 MiB", "rss_mib", "{:.0f} MiB", 80.0),
        ("TUI peak RSS", "<= 120 MiB", "peak_rss_mib", "{:.0f} MiB", 120.0),
    ]
    out = []
    for figure, goal, key, form, bar in rows:
        value = gputop.get(key)
        if value is None:
            continue
        measured = form.format(value)
        if nvitop.get(key) is not None:
            measured += f" (nvitop {form.format(nvitop[key])}, same run)"
        out.append({"figure": figure, "goal": goal, "measured": measured, "command": command, "met": value <= bar})
    return out


def adapt_stacks(text: str, command: str) -> list[Figure]:
    data = _last_json_line(text) or {}
    if "parallel_median_ms" not in data:
        return []
    workers = data.get("pids", 17) - 1
    ms, goal = data["parallel_median_ms"], data.get("goal_ms", 100.0)
    floor = f", py-spy's floor {data['floor_ms']:.0f} ms" if "floor_ms" in data else ""
    rows = [
        {
            "figure": f"Stacks of main + {workers} workers, all fresh (issue 15)",
            "goal": f"<= {goal:.0f} ms",
            "measured": f"{ms:.0f} ms (naive one after another {data.get('sequential_median_ms', float('nan')):.0f} ms, "
            f"same run{floor})",
            "command": command,
            "met": ms <= goal,
        }
    ]
    if "round_median_ms" in data:
        rnd = data["round_median_ms"]
        rows.append(
            {
                "figure": f"Stacks: gputop's refresh round, main + {workers} workers (workers in turns)",
                "goal": f"<= {goal:.0f} ms",
                "measured": f"{rnd:.0f} ms",
                "command": command,
                "met": rnd <= goal,
            }
        )
    return rows


def adapt_attach_overhead(text: str, command: str) -> list[Figure]:
    data = _last_json_line(text) or {}
    if "ratio" not in data:
        return []
    return [
        {
            "figure": "Overhead on a small torch loop (steps/s attached / alone)",
            "goal": ">= 0.99",
            "measured": f"{data['ratio']:.3f}",
            "command": command,
            "met": data["ratio"] >= 0.99,
        }
    ]


_LOADER_ROW = re.compile(
    r"^(?P<job>.+?)\s+(?P<answer>\d+\.\d)\s+(?P<cons>[+-]\d+\.\d)%\s+(?P<wait>[+-]\d+\.\d+)\s+"
    r"(?P<worst>[+-]\d+\.\d)%\s+\d+\s+\S+\s+(?P<kept>\d+|nan)%(?P<rest>.*)$"
)


def adapt_loader(text: str, command: str) -> list[Figure]:
    rows = [m.groupdict() for m in map(_LOADER_ROW.match, text.splitlines()) if m]
    if not rows:
        return []
    answer = max(float(r["answer"]) for r in rows)
    err = max(max(abs(float(r["cons"])), abs(float(r["worst"]))) for r in rows)
    n = len(rows)
    return [
        {
            "figure": f"Loader benchmark: time to answer (worst of {n} jobs)",
            "goal": "<= 15 s",
            "measured": f"{answer:.1f} s",
            "command": command,
            "met": answer <= 15.5,
        },
        {
            "figure": f"Loader benchmark: error vs known rates (worst of {n} jobs)",
            "goal": "within ±10%",
            "measured": f"{err:.1f}%",
            "command": command,
            "met": err <= 10.0,
        },
    ] + _kept_row(rows, command)


def _kept_row(rows: list[dict], command: str) -> list[Figure]:
    free = [float(r["kept"]) for r in rows if "contention" not in r["rest"]]  # nan: no figure, fails the bar
    if not free:
        return []
    worst = min(free)
    return [
        {
            "figure": f"Loader benchmark: job's steps/s during the sweep ÷ before (worst of {len(free)} jobs with free cores)",
            "goal": ">= 90%",
            "measured": f"{worst:.0f}%",
            "command": command,
            "met": worst >= 90,
        }
    ]


ADAPTERS: dict[str, Callable[[str, str], list[Figure]]] = {
    "bench_tui.py": adapt_tui,
    "bench_stacks.py": adapt_stacks,
    "bench_attach_overhead.py": adapt_attach_overhead,
    "bench_loader.py": adapt_loader,
}


def script_args(script: Path, quick: bool) -> list[str]:
    args = list(ADAPTER_ARGS.get(script.name, []))
    if quick:
        if "--quick" in script.read_text():
            args.append("--quick")
        else:
            args += QUICK_ARGS.get(script.name, [])
    return args


def run_one(script: Path, args: list[str], timeout: float, keep: Optional[Path]) -> tuple[list[Figure], str]:
    """Run a script; its figures (from GPUTOP-FIGURE lines, else its adapter) and a status line."""
    command = " ".join(["python", f"benchmarks/{script.name}", *[a for a in args if a != "--json"]])
    print(f"\n=== {command}", flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(script), *args],
            cwd=str(REPO),
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        print(out)
        return [], f"{script.name}: timed out after {timeout:.0f} s"
    took = time.monotonic() - started
    # the script's own table, minus the machine-readable lines
    print("\n".join(line for line in done.stdout.splitlines() if not line.startswith("GPUTOP-FIGURE ")))
    if done.returncode not in (0, 1):  # 1 = ran, but a goal was missed
        print(done.stderr[-3000:], file=sys.stderr)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{script.stem}.out").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    figures = parse_figures(done.stdout)
    if not figures and script.name in ADAPTERS:
        try:
            figures = ADAPTERS[script.name](done.stdout, command)
        except Exception as exc:  # an adapter out of step with its script: say so, keep going
            return [], f"{script.name}: could not read its figures ({type(exc).__name__}: {exc})"
    status = f"{script.name}: exit {done.returncode} in {took:.0f} s, {len(figures)} figure(s)"
    return figures, status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="each script's short mode (about a minute each)")
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME", help="run only these (e.g. bench_soak)")
    ap.add_argument("--with-real-attach", action="store_true", help="also the 10-minute real-attach soak")
    ap.add_argument("--keep-output", type=Path, default=None, metavar="DIR", help="save each script's full output")
    args = ap.parse_args()

    scripts = sorted(p for p in HERE.glob("bench_*.py") if p.name not in SKIP)
    if args.only:
        wanted = {n if n.endswith(".py") else f"{n}.py" for n in args.only}
        scripts = [s for s in scripts if s.name in wanted]
    runs = [(s, script_args(s, args.quick)) for s in scripts]
    if args.with_real_attach:
        runs += [(HERE / name, extra + (["--quick"] if args.quick else [])) for name, extra in LONG_RUNS.items()]
    timeout = QUICK_TIMEOUT_S if args.quick else TIMEOUT_S

    figures: list[Figure] = []
    statuses = []
    for script, extra in runs:
        got, status = run_one(script, extra, timeout, args.keep_output)
        figures += got
        statuses.append(status)

    print("\n=== runs")
    for status in statuses:
        print(f"  {status}")
    print("\n=== benchmarks/RESULTS.md rows\n")
    print("| Figure | Goal | Measured | Command |")
    print("|---|---|---|---|")
    for f in figures:
        mark = "" if f.get("met") is None else (" ✓" if f["met"] else " ✗ (goal missed)")
        print(f"| {f['figure']} | {f['goal']} | {f['measured']}{mark} | `{f['command']}` |")
    missed = [f for f in figures if f.get("met") is False]
    return 1 if missed or any("timed out" in s or "could not" in s for s in statuses) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared measurement helpers for the scripts in benchmarks/ (any of them may import this).

    import sys, pathlib; sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from common import interleave, ProcessMeter, print_table, emit_figure

* `interleave(measure_a, measure_b, rounds)`: A/B windows in one run, in ABBA order, so slow drift in
  the machine's load (other people's work on shared cores) lands on both sides equally; the figure is
  the ratio of the medians.
* `ProcessMeter(pid)`: RSS and CPU (its own plus its reaped children's, e.g. py-spy) of a process
  through psutil, as deltas between readings.
* `print_table(headers, rows)`: a plain aligned text table.
* `emit_figure(...)`: one machine-readable line per benchmark figure.  `benchmarks/run_all.py` collects
  these lines from every script and prints the rows of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import psutil

FIGURE_PREFIX = "GPUTOP-FIGURE "
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024 * 1024


# ----------------------------------------------------------------- A/B


@dataclass
class ABResult:
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # "A"/"B" in the order the windows ran

    @property
    def median_a(self) -> float:
        return statistics.median(self.a)

    @property
    def median_b(self) -> float:
        return statistics.median(self.b)

    @property
    def ratio(self) -> float:
        """median(B) / median(A)."""
        return self.median_b / self.median_a if self.median_a else float("nan")

    @property
    def pair_ratios(self) -> list[float]:
        """B/A of each round (both windows of a round ran back to back)."""
        return [b / a for a, b in zip(self.a, self.b) if a]


def abba_order(rounds: int) -> list[str]:
    """A B, B A, A B, ...: each round is a pair, alternating which side goes first."""
    order: list[str] = []
    for i in range(rounds):
        order += ["A", "B"] if i % 2 == 0 else ["B", "A"]
    return order


def interleave(
    measure_a: Callable[[], float],
    measure_b: Callable[[], float],
    rounds: int,
    *,
    on_window: Optional[Callable[[str, int, float], None]] = None,
) -> ABResult:
    """Run `rounds` pairs of windows in ABBA order; each callable measures one window and returns its figure."""
    result = ABResult()
    for i, side in enumerate(abba_order(rounds)):
        value = measure_a() if side == "A" else measure_b()
        (result.a if side == "A" else result.b).append(value)
        result.order.append(side)
        if on_window is not None:
            on_window(side, i // 2, value)
    return result


# ----------------------------------------------------------------- one process's cost


@dataclass(frozen=True)
class ProcessReading:
    at: float  # time.monotonic()
    rss: int  # bytes
    peak_rss: Optional[int]  # VmHWM, bytes (None where unreadable)
    cpu_s: float  # user + system of the process and of its reaped children


class ProcessMeter:
    """Reads one process's RSS and CPU time; `cpu_percent(a, b)` is % of one core between two readings."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._proc = psutil.Process(pid)

    def read(self) -> ProcessReading:
        with self._proc.oneshot():
            times = self._proc.cpu_times()
            rss = self._proc.memory_info().rss
        cpu = times.user + times.system + getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0)
        return ProcessReading(time.monotonic(), rss, peak_rss(self.pid), cpu)

    @staticmethod
    def cpu_percent(before: ProcessReading, after: ProcessReading) -> float:
        wall = after.at - before.at
        return 100.0 * (after.cpu_s - before.cpu_s) / wall if wall > 0 else float("nan")


def peak_rss(pid: int) -> Optional[int]:
    """VmHWM: the largest RSS the process has had."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# ----------------------------------------------------------------- waiting and stopping


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll a condition until it holds (a deadline on a condition, not a sleep); SystemExit at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise SystemExit(f"{os.path.basename(sys.argv[0])}: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def kill_group(proc: Any, timeout: float = 30.0) -> None:
    """SIGKILL a child started with start_new_session=True, and its whole group; reap it."""
    import signal

    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=timeout)
    except Exception:
        pass


# ----------------------------------------------------------------- output


def fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, spec: str = ".3f", out=None) -> None:
    """A plain aligned table; the first column left-aligned, the rest right-aligned."""
    out = out or sys.stdout
    cells = [[fmt(c, spec) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) if i == 0 else str(h).rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))
    print(line, file=out)
    print("-" * len(line), file=out)
    for row in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))), file=out)


def emit_figure(figure: str, goal: str, measured: str, command: str, met: Optional[bool] = None, **extra: Any) -> None:
    """One benchmark figure as a machine-readable line (run_all.py collects these)."""
    record = {"figure": figure, "goal": goal, "measured": measured, "command": command, "met": met, **extra}
    print(FIGURE_PREFIX + json.dumps(record, ensure_ascii=False), flush=True)


def parse_figures(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith(FIGURE_PREFIX):
            try:
                out.append(json.loads(line[len(FIGURE_PREFIX) :]))
            except ValueError:
                continue
    return out


def machine_line() -> str:
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} CPUs, 1-min load {load:.2f}, Python {sys.version.split()[0]}"

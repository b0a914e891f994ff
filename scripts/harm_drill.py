"""Issue 34's checks, as a user would run them: gputop's bench and trace into live torch jobs built to meet each
harm (tests/jobs/harm_job.py), counting what the job suffered (dead, frozen, a changed exit status, a lost or
doubled signal, a line in its stderr) and what really ran (not refused).

    python scripts/harm_drill.py            # the issue's counts (about 40 minutes on 2 cores)
    python scripts/harm_drill.py --quick    # a fifth of each, for a look
    python scripts/harm_drill.py --only exit-traced,stopped-bench

It exits 1 if any case harmed a job, hung, or really ran fewer than half its calls.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputop.collect.procfs import process_alive
from tests.harness.processes import Spawner, wait_until

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "jobs" / "harm_job.py"
LOCK_HOLDERS = REPO / "tests" / "jobs" / "lock_holders.c"
HANG_S = 120.0
MOVE_S = 30.0  # a re-forking job on a loaded 2-core box can take seconds an epoch


class Drill:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.spawn = Spawner()
        self.n = 0

    def job(self, *options: str) -> tuple[subprocess.Popen, Path, Path]:
        """A harm_job, once it has taken steps: (process, its counter file, its stderr file)."""
        self.n += 1
        counter, err = self.work / f"job{self.n}.count", self.work / f"job{self.n}.err"
        proc = self.spawn([sys.executable, str(JOB), str(counter), *options], stdout=subprocess.DEVNULL, stderr=open(err, "w"))
        wait_until(lambda: steps(counter) > 0 or proc.poll() is not None, timeout=120, what="the job to step")
        if proc.poll() is not None:
            raise SystemExit(f"the drill's job did not start: {err.read_text()[-500:]}")
        return proc, counter, err

    def gputop(self, *args: str) -> tuple[str, subprocess.Popen]:
        return "started", self.spawn([sys.executable, "-m", "gputop", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self, *args: str) -> tuple[str, int, str]:
        """(outcome, exit status, last stderr line) of one gputop command: "hung" past HANG_S."""
        _, proc = self.gputop(*args)
        try:
            _out, err = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return "hung", -1, ""
        last = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
        return "ran" if proc.returncode == 0 else "refused", proc.returncode, last


def steps(counter: Path) -> int:
    try:
        return int(counter.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1


def moves(proc: subprocess.Popen, counter: Path) -> str:
    """'' while the job steps on; else what happened to it."""
    before = steps(counter)
    try:
        wait_until(lambda: steps(counter) > before or proc.poll() is not None, timeout=MOVE_S)
    except AssertionError:
        return "frozen"
    return "" if proc.poll() is None else f"dead (exit {proc.returncode})"


def trace_args(pid: int, work: Path, seconds: str = "1") -> list[str]:
    return ["trace", "--pid", str(pid), "--seconds", seconds, "-o", str(work / f"trace-{pid}-{time.monotonic_ns()}")]


def bench_args(pid: int) -> list[str]:
    return ["bench", "--pid", str(pid), "--yes", "--json", "--seconds", "8"]


def exit_while(d: Drill, tally: Counter, command: str) -> None:
    proc, _counter, err = d.job("--seconds", "6")
    args = trace_args(proc.pid, d.work, "8") if command == "trace" else bench_args(proc.pid)
    outcome, _rc, last = d.run(*args)
    status = proc.wait(timeout=60)
    tally["harmed" if status != 0 else "exit 0"] += 1
    tally["stderr written"] += bool(err.read_text())
    # the agent ran if it saw the exit (trace) or answered (bench); a refusal before injecting did not
    tally["ran"] += outcome == "ran" or "exit" in last
    tally[outcome if outcome == "hung" else "finished"] += 1


def many_into_one(d: Drill, tally: Counter, plan: list[str], *options: str) -> None:
    proc, counter, _err = d.job(*options)
    for command in plan:
        outcome, _rc, last = d.run(*(trace_args(proc.pid, d.work) if command == "trace" else bench_args(proc.pid)))
        tally[f"{command} {outcome}"] += 1
        tally["ran"] += outcome == "ran"
        if outcome == "refused":
            tally[f"refused: {last[:200]}"] += 1
        harm = moves(proc, counter)
        if harm:
            tally[harm] += 1
            tally["harmed"] += 1
            proc, counter, _err = d.job(*options)


def signals(d: Drill, tally: Counter, runs: int) -> None:
    library = d.work / "lock_holders.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(library), str(LOCK_HOLDERS), "-lpthread"], check=True)
    proc, counter, _err = d.job("--signals", str(library))
    sent = 0
    for _ in range(runs):
        stop = threading.Event()

        def send() -> None:
            nonlocal sent
            while not stop.is_set():
                os.kill(proc.pid, signal.SIGRTMIN)
                sent += 1
                stop.wait(0.002)

        sender = threading.Thread(target=send)
        sender.start()
        try:
            outcome, _rc, last = d.run(*trace_args(proc.pid, d.work))
        finally:
            stop.set()
            sender.join()
        tally["ran"] += outcome == "ran"
        tally[f"trace {outcome}"] += 1
        if outcome == "refused":
            tally[f"refused: {last[:200]}"] += 1

    def received() -> int:
        try:
            return int(counter.read_text().split()[1])
        except (OSError, ValueError, IndexError):
            return -1

    try:
        wait_until(lambda: received() >= sent, timeout=30)
    except AssertionError:
        pass
    tally["signals sent"] = sent
    tally["signals received"] = received()
    tally["harmed"] += received() != sent or not process_alive(proc.pid)


def stopped_bench(d: Drill, tally: Counter) -> None:
    proc, _counter, _err = d.job()
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T", timeout=10)
        outcome, rc, last = d.run(*bench_args(proc.pid))
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    tally["refused in one line, said stopped" if rc != 0 and "is stopped" in last else "harmed"] += 1
    tally["ran"] += 1  # the refusal is the right outcome here


def ctrl_z(d: Drill, tally: Counter, stops: int) -> None:
    proc, counter, _err = d.job()
    _, gputop = d.gputop(*trace_args(proc.pid, d.work, "4"))
    for _ in range(stops):
        os.killpg(gputop.pid, signal.SIGSTOP)  # (Ctrl-Z's SIGTSTP is discarded in the orphaned group of a child)
        harm = moves(proc, counter)
        tally[harm or "stepped while gputop was stopped"] += 1
        tally["harmed"] += bool(harm)
        os.killpg(gputop.pid, signal.SIGCONT)
        if gputop.poll() is not None:
            break
    try:
        gputop.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        gputop.kill()
        tally["hung"] += 1
    tally["ran"] += gputop.returncode == 0
    tally[f"trace exit {gputop.returncode}"] += 1


def fresh(d: Drill, tally: Counter, runs: int) -> None:
    for _ in range(runs):
        proc, counter, _err = d.job()
        outcome, _rc, last = d.run(*trace_args(proc.pid, d.work))
        tally["ran"] += outcome == "ran"
        tally[f"trace {outcome}"] += 1
        harm = moves(proc, counter)
        tally["harmed"] += bool(harm)
        proc.kill()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fifth of each count")
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parser.parse_args()

    def n(count: int) -> int:
        return max(1, count // 5) if args.quick else count

    cases = {
        "allocating": (n(40), lambda d, t: many_into_one(d, t, ["trace"] * n(40))),
        "exit-traced": (n(10), lambda d, t: [exit_while(d, t, "trace") for _ in range(n(10))]),
        "exit-benched": (n(10), lambda d, t: [exit_while(d, t, "bench") for _ in range(n(10))]),
        "signals": (n(20), lambda d, t: signals(d, t, n(20))),
        "refork": (n(40), lambda d, t: many_into_one(d, t, ["trace"] * n(30) + ["bench"] * n(10), "--refork")),
        "stopped-bench": (1, lambda d, t: stopped_bench(d, t)),
        "ctrl-z": (1, lambda d, t: ctrl_z(d, t, 10)),
        "fresh": (n(20), lambda d, t: fresh(d, t, n(20))),
    }
    chosen = [c for c in args.only.split(",") if c] or list(cases)
    failed = False
    work = Path(tempfile.mkdtemp(prefix="gputop-harm-"))
    for name in chosen:
        calls, body = cases[name]
        (work / name).mkdir()
        drill = Drill(work / name)  # a folder a case: a job's counter file is never an earlier case's
        tally: Counter = Counter()
        started = time.monotonic()
        try:
            body(drill, tally)
        finally:
            drill.spawn.reap_all()
        bad = tally["harmed"] or tally["hung"] or tally["stderr written"] or tally["ran"] < calls / 2
        failed |= bool(bad)
        shown = ", ".join(f"{k}: {v}" for k, v in sorted(tally.items()))
        print(f"{'FAIL' if bad else 'ok  '} {name} ({calls} calls, {time.monotonic() - started:.0f}s): {shown}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

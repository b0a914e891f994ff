"""Soak: does gputop's memory or per-refresh cost grow over a day?  Three modes.

    python benchmarks/bench_soak.py [--hours 24] [--quick] [--json]          # compressed time (default)
    python benchmarks/bench_soak.py --real-attach 10 [--scenario hiccup]     # a real 10-minute attach
    python benchmarks/bench_soak.py --tui 2400                               # the TUI, history turned over

**Compressed time.**  One process plays gputop's sinks for `--hours` simulated hours at 1 Hz: a
`Pipeline` over the simulated 8-GPU machine whose clock is a `ManualClock` moved 1 s per snapshot,
a `History` (the TUI's 600-snapshot ring), a `RecordingWriter` and `diagnose()`.  Every simulated
second gets a snapshot (86,400 for 24 h) with a real host sample (psutil) and is appended to the
history.  What is skipped, because it costs real time and keeps no state per call:

* the fake NVML's 20 ms `sleep` in nvmlDeviceGetPcieThroughput (pcie_latency_s=0);
* the GPU read (all NVML calls for 8 GPUs, ~10 ms of CPU) runs every `--gpu-every` s (default 20); the
  snapshots between reuse the latest GPU readings under the new timestamp;
* the recording is written every `--gpu-every` s too (each write is one self-contained gzip member);
* diagnose() runs every `--diagnose-every` s (default 60) over the history, as a TUI refresh would.

A "refresh" is GPU read + host read + history append + recording write, timed in CPU time of the
whole process (all threads).  Per simulated hour the table shows the median refresh and diagnose cost
and the RSS at the hour's end.  CPU time on a shared box still moves with the other load (frequency,
caches, a busy sibling core), so "last hour / first hour" alone cannot tell growth from noise: at the
end of every hour the last 40 refreshes of the long-running pipeline alternate (ABBA) with refreshes
of a brand-new pipeline on the same clock, and the figure is their ratio (aged / fresh; flat = 1.00).
The RSS figure is last hour / first hour (the first hour includes filling the history).

**Real attach.**  Starts the demo job (default scenario `hiccup`: its DataLoader workers are replaced
every epoch, which exercises the process table's pruning) and `gputop record --pid LAUNCHER` at
default settings, then reads gputop's RSS and CPU (its own and its py-spy children's) once a minute.

**TUI.**  The real app (Textual, headless at 160×48) over the simulated machine, polled 50 times a
second so its 600-snapshot history fills in about 30 s and then turns over again and again: RSS when the
history is full, then after every 600 polls more.  The figure is the last RSS ÷ the RSS after the first
turn-over (the allocator settles while the first whole history is replaced; growth after that is a leak),
and a second one the last RSS above the RSS after the first 30 polls (issue 22: at most 15 MiB).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
from common import MIB, ProcessMeter, emit_figure, kill_group, machine_line, print_table, wait_for

from gputop.analysis.diagnosis import diagnose
from gputop.backend import SimulatedMachine
from gputop.history import History
from gputop.model import Snapshot
from gputop.pipeline import Pipeline
from gputop.recording import RecordingWriter, read_recording
from gputop.sim.fake_nvml import ManualClock

COMMAND = "python benchmarks/bench_soak.py"
FLAT_GOAL = 1.10  # last hour / first hour of RSS and refresh cost: within 10% counts as flat


AB_PAIRS = 40  # refreshes per hour timed side by side with a fresh pipeline


class Refresher:
    """One pipeline with the sinks a refresh feeds (history, recording): what gputop does once a second."""

    def __init__(self, simulate: str, clock: ManualClock, rec_path: str) -> None:
        self.pipeline = Pipeline(SimulatedMachine(simulate, clock=clock))
        self.pipeline.backend.library.pcie_latency_s = 0.0  # a sleep standing in for NVML's link sampling; no state
        self.history = History(self.pipeline.machine)  # the TUI's default capacity
        self.rec_path = rec_path
        self.writer = RecordingWriter(rec_path, self.pipeline.machine)

    def refresh(self) -> tuple[Snapshot, float, float]:
        """(snapshot, CPU ms of the whole process, wall ms)."""
        t0, c0 = time.perf_counter(), time.process_time()
        snap = self.pipeline.poll()
        self.history.append(snap)
        self.writer.write(snap)
        return snap, (time.process_time() - c0) * 1000, (time.perf_counter() - t0) * 1000

    def close(self) -> None:
        self.writer.close()
        self.pipeline.close()


@dataclasses.dataclass
class Hour:
    hour: int
    rss_mib: float
    refresh_ms: float  # median CPU time (all threads) of the refreshes in this hour
    refresh_p95_ms: float
    refresh_wall_ms: float  # median wall time (moves with the machine's load)
    diagnose_ms: float  # median CPU time of diagnose()
    aged_ms: float  # median CPU ms of the hour's last AB_PAIRS refreshes of the long-running pipeline...
    fresh_ms: float  # ...and of a brand-new pipeline refreshed alternately with them (same clock, same load)
    polls: int
    recording_mib: float


def compressed(args: argparse.Namespace) -> int:
    seconds = int(args.hours * 3600)
    clock = ManualClock(start=1_700_000_000.0)
    me = psutil.Process()
    hours: list[Hour] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gputop-soak-") as tmp:
        aged = Refresher(args.simulate, clock, os.path.join(tmp, "soak.gputop"))
        pipeline, history, rec_path = aged.pipeline, aged.history, aged.rec_path
        gpus = pipeline.gpu.sample() if pipeline.gpu else ()
        ab_from = 3600 - AB_PAIRS * args.gpu_every  # second of each hour where the side-by-side part starts
        fresh: Optional[Refresher] = None
        refresh_ms: list[float] = []
        refresh_cpu_ms: list[float] = []
        aged_ab: list[float] = []
        fresh_ab: list[float] = []
        diagnose_ms: list[float] = []
        findings = None
        try:
            for second in range(1, seconds + 1):
                clock.advance(1.0)
                if second % 3600 == ab_from and second + AB_PAIRS * args.gpu_every <= seconds:
                    fresh = Refresher(args.simulate, clock, os.path.join(tmp, "fresh.gputop"))
                    fresh.refresh()  # its first poll has no previous reading to diff against: not timed
                if second % args.gpu_every == 0:
                    if fresh is not None and len(aged_ab) % 2 == 1:  # ABBA: every other pair, the fresh one first
                        fresh_ab.append(fresh.refresh()[1])
                    snap, cpu_ms, wall_ms = aged.refresh()
                    gpus = snap.gpus
                    refresh_cpu_ms.append(cpu_ms)
                    refresh_ms.append(wall_ms)
                    if fresh is not None:
                        aged_ab.append(cpu_ms)
                        if len(aged_ab) % 2 == 1:
                            fresh_ab.append(fresh.refresh()[1])
                else:
                    host = pipeline.host.sample()
                    history.append(Snapshot(timestamp=clock(), host=host, gpus=gpus, job=None, simulated=True))
                if second % args.diagnose_every == 0:
                    c0 = time.process_time()
                    findings = diagnose(history)
                    diagnose_ms.append((time.process_time() - c0) * 1000)
                if second % 3600 == 0 or second == seconds:
                    if fresh is not None:
                        fresh.close()
                        os.unlink(fresh.rec_path)
                        fresh = None
                    hour = Hour(
                        hour=len(hours) + 1,
                        rss_mib=me.memory_info().rss / MIB,
                        refresh_ms=statistics.median(refresh_cpu_ms) if refresh_cpu_ms else float("nan"),
                        refresh_p95_ms=sorted(refresh_cpu_ms)[int(0.95 * (len(refresh_cpu_ms) - 1))]
                        if refresh_cpu_ms
                        else float("nan"),
                        refresh_wall_ms=statistics.median(refresh_ms) if refresh_ms else float("nan"),
                        diagnose_ms=statistics.median(diagnose_ms) if diagnose_ms else float("nan"),
                        aged_ms=statistics.median(aged_ab) if aged_ab else float("nan"),
                        fresh_ms=statistics.median(fresh_ab) if fresh_ab else float("nan"),
                        polls=len(refresh_ms),
                        recording_mib=os.path.getsize(rec_path) / MIB,
                    )
                    hours.append(hour)
                    print(
                        f"  simulated hour {hour.hour:>2}: RSS {hour.rss_mib:6.1f} MiB  refresh {hour.refresh_ms:6.2f} ms CPU "
                        f"({hour.refresh_wall_ms:.1f} wall)  diagnose {hour.diagnose_ms:6.2f} ms  ({time.monotonic() - started:.0f} s elapsed)",
                        file=sys.stderr,
                        flush=True,
                    )
                    refresh_ms, refresh_cpu_ms, diagnose_ms, aged_ab, fresh_ab = [], [], [], [], []
        finally:
            if fresh is not None:
                fresh.close()
            aged.close()
        gc.collect()
        rss_after_gc = me.memory_info().rss / MIB
        # what a replay / `report --from` of this recording costs: read_recording() loads every snapshot
        t0 = time.perf_counter()
        _, replayed, warning = read_recording(rec_path)
        readback_s = time.perf_counter() - t0
        readback_mib = me.memory_info().rss / MIB - rss_after_gc
        recorded = len(replayed)
        del replayed

    first, last = hours[0], hours[-1]
    rss_ratio = last.rss_mib / first.rss_mib
    raw_cost_ratio = last.refresh_ms / first.refresh_ms
    full = [h for h in hours if h.aged_ms == h.aged_ms]  # hours with a side-by-side part (not NaN)
    ab_last = full[-1].aged_ms / full[-1].fresh_ms
    ab_worst = max(h.aged_ms / h.fresh_ms for h in full)
    ab_median = statistics.median(h.aged_ms / h.fresh_ms for h in full)
    diag_ratio = last.diagnose_ms / first.diagnose_ms
    print(
        f"Soak, compressed time: {seconds:,} snapshots at 1 Hz ({args.hours:g} simulated h) of --simulate "
        f"{args.simulate}; GPU read + recording write every {args.gpu_every} s, diagnose every {args.diagnose_every} s"
    )
    print(
        f"{machine_line()}; took {time.monotonic() - started:.0f} s; history holds {len(history)} snapshots; "
        f"recording {last.recording_mib:.1f} MiB, {recorded:,} snapshots read back in {readback_s:.0f} s "
        f"using {readback_mib:.0f} MiB more RSS ({readback_mib * 1024 / max(1, recorded):.0f} KiB per snapshot)"
        + (f" (warning: {warning})" if warning else "")
    )
    print_table(
        [
            "sim. hour",
            "RSS MiB",
            "refresh CPU ms",
            "p95",
            "wall ms",
            "A/B aged ms",
            "A/B fresh ms",
            "aged/fresh",
            "diagnose CPU ms",
            "refreshes",
            "recording MiB",
        ],
        [
            [
                h.hour,
                h.rss_mib,
                h.refresh_ms,
                h.refresh_p95_ms,
                h.refresh_wall_ms,
                h.aged_ms,
                h.fresh_ms,
                h.aged_ms / h.fresh_ms,
                h.diagnose_ms,
                h.polls,
                h.recording_mib,
            ]
            for h in hours
        ],
        spec=".2f",
    )
    print(
        f"RSS last/first hour {rss_ratio:.3f} (after gc at the end {rss_after_gc:.1f} MiB); refresh CPU last/first hour "
        f"{raw_cost_ratio:.3f} raw (moves with the machine's load); side by side with a fresh pipeline "
        f"({AB_PAIRS} alternating refreshes at the end of each hour): aged/fresh {ab_last:.3f} in the last hour, "
        f"median over hours {ab_median:.3f}, worst hour {ab_worst:.3f} (flat: <= {FLAT_GOAL}); diagnose CPU last/first {diag_ratio:.3f}; "
        f"last verdict: {findings[0].title if findings else 'n/a'}"
    )
    quick = " --quick" if args.quick else ""
    emit_figure(
        f"Soak {args.hours:g} h compressed: RSS last/first hour",
        f"<= {FLAT_GOAL}",
        f"{rss_ratio:.3f} ({first.rss_mib:.0f} -> {last.rss_mib:.0f} MiB)",
        COMMAND + quick,
        rss_ratio <= FLAT_GOAL,
    )
    emit_figure(
        f"Soak {args.hours:g} h compressed: refresh cost after {len(full)} h / fresh pipeline, side by side",
        f"<= {FLAT_GOAL}",
        f"{ab_last:.3f} ({full[-1].aged_ms:.1f} vs {full[-1].fresh_ms:.1f} ms CPU; "
        f"median over hours {ab_median:.3f}, worst {ab_worst:.3f})",
        COMMAND + quick,
        ab_last <= FLAT_GOAL,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "hours": [dataclasses.asdict(h) for h in hours],
                    "rss_ratio": rss_ratio,
                    "aged_fresh_last": ab_last,
                    "aged_fresh_worst": ab_worst,
                    "refresh_ratio_raw": raw_cost_ratio,
                    "readback_s": readback_s,
                    "readback_mib": readback_mib,
                    "recorded": recorded,
                    "diagnose_ratio": diag_ratio,
                }
            )
        )
    return 0 if rss_ratio <= FLAT_GOAL and ab_last <= FLAT_GOAL else 1


def snapshots_in(path: str) -> int:
    try:
        return len(read_recording(path)[1])
    except Exception:  # not created yet, or only the header so far
        return 0


def real_attach(args: argparse.Namespace) -> int:
    from gputop.sim.demo_launcher import DemoJob

    minutes = args.real_attach
    every = args.sample_every
    rows = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gputop-soak-attach-") as tmp, DemoJob(args.scenario, gpus=args.gpus) as job:
        job.start()
        job.wait_until_training()
        out = os.path.join(tmp, "attach.gputop")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gputop", "record", "--pid", str(job.launcher_pid), "-o", out],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_for(lambda: proc.poll() is not None or snapshots_in(out) >= 1, 60, "gputop record's first snapshot")
            meter = ProcessMeter(proc.pid)
            prev = meter.read()
            t_start = prev.at
            samples = int(minutes * 60 / every)
            for i in range(1, samples + 1):
                time.sleep(max(0.0, t_start + i * every - time.monotonic()))  # sampling cadence, not sync
                if proc.poll() is not None:
                    raise SystemExit(f"bench_soak: gputop record exited: {proc.stderr.read().decode().strip()}")
                if job.failure():
                    raise SystemExit(f"bench_soak: {job.failure()}")
                now = meter.read()
                rows.append(
                    [
                        i * every / 60,
                        now.rss / MIB,
                        (now.peak_rss or 0) / MIB,
                        ProcessMeter.cpu_percent(prev, now),
                        os.path.getsize(out) / MIB,
                    ]
                )
                print(
                    f"  {i * every / 60:5.1f} min: RSS {now.rss / MIB:6.1f} MiB  CPU {rows[-1][3]:5.1f}%",
                    file=sys.stderr,
                    flush=True,
                )
                prev = now
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
            if proc.returncode != 0:
                raise SystemExit(f"bench_soak: gputop record failed ({proc.returncode}): {err.decode().strip()}")
            _, snaps, warning = read_recording(out)
        finally:
            if proc.poll() is None:
                kill_group(proc)
        config = job.config.describe()
    first, last = rows[0], rows[-1]
    rss_ratio, cpu_ratio = last[1] / first[1], last[3] / first[3] if first[3] else float("nan")
    print(
        f"Soak, real attach: `gputop record --pid` (defaults: 1 s refresh, stacks every 2 s) on the demo job "
        f"{args.scenario!r} ({config}) for {minutes:g} min; {machine_line()}; took {time.monotonic() - started:.0f} s"
    )
    print_table(["minute", "RSS MiB", "peak RSS MiB", "CPU % of a core", "recording MiB"], rows, spec=".2f")
    print(
        f"last / first sample: RSS {rss_ratio:.3f}, CPU {cpu_ratio:.3f} (flat: <= {FLAT_GOAL}); "
        f"{len(snaps)} snapshots recorded" + (f" (warning: {warning})" if warning else "")
    )
    cmd = f"{COMMAND} --real-attach {minutes:g}" + (f" --sample-every {every:g}" if every != 60 else "")
    emit_figure(
        f"Soak, real {minutes:g}-min attach: gputop RSS last/first",
        f"<= {FLAT_GOAL}",
        f"{rss_ratio:.3f} ({first[1]:.0f} -> {last[1]:.0f} MiB)",
        cmd,
        rss_ratio <= FLAT_GOAL,
    )
    cpu_ok = statistics.median(r[3] for r in rows)
    emit_figure(
        f"Soak, real {minutes:g}-min attach: gputop CPU (with py-spy)",
        "flat",
        f"median {cpu_ok:.1f}% of a core (first {first[3]:.1f}%, last {last[3]:.1f}%)",
        cmd,
        None,
    )
    if args.json:
        print(json.dumps({"rows": rows, "rss_ratio": rss_ratio, "cpu_ratio": cpu_ratio}))
    return 0 if rss_ratio <= FLAT_GOAL else 1


START_POLLS = 30  # the TUI's "start": its first frames drawn, its history a few snapshots long
ABOVE_START_GOAL_MIB = 15.0


def tui(args: argparse.Namespace) -> int:
    import asyncio

    from gputop.pipeline import pipeline_from_args
    from gputop.tui.app import GputopApp

    def rss() -> float:
        return psutil.Process().memory_info().rss / MIB

    async def polls(pilot, app, count: int) -> None:
        seen, done = app.monitor.history.latest, 0
        while done < count:
            await pilot.pause(0.01)
            if app.monitor.history.latest is not seen:
                seen, done = app.monitor.history.latest, done + 1

    start: list[float] = []  # RSS after START_POLLS polls: the app as it starts, before the history grows

    async def run() -> list[tuple[int, float]]:
        source = pipeline_from_args(argparse.Namespace(simulate=args.simulate, pid=None, interval=0.02))
        app = GputopApp(source, interval=0.02, history_capacity=600)
        rows = []
        try:
            async with app.run_test(size=(160, 48)) as pilot:
                await polls(pilot, app, START_POLLS)
                gc.collect()
                start.append(rss())
                while len(app.monitor.history) < app.monitor.history.capacity:
                    await pilot.pause(0.2)
                gc.collect()
                rows.append((0, rss()))
                for turn in range(1, args.tui // 600 + 1):
                    await polls(pilot, app, 600)
                    gc.collect()
                    rows.append((turn * 600, rss()))
        finally:
            source.close()
        return rows

    rows = asyncio.run(run())
    print(machine_line())
    print_table(
        ["polls after the history filled", "RSS MiB"],
        [(f"start ({START_POLLS} polls)", f"{start[0]:.1f}")] + [(n, f"{r:.1f}") for n, r in rows],
    )
    settled, last = rows[min(1, len(rows) - 1)][1], rows[-1][1]
    emit_figure(
        "TUI RSS above its own start once its 600-snapshot history has turned over",
        f"≤ {ABOVE_START_GOAL_MIB:.0f} MiB (issue 22)",
        f"+{last - start[0]:.1f} MiB ({start[0]:.1f} -> {last:.1f} MiB)",
        f"python benchmarks/bench_soak.py --tui {args.tui}",
        last - start[0] <= ABOVE_START_GOAL_MIB,
    )
    ratio = last / settled
    emit_figure(
        f"Soak, TUI history turned over {args.tui // 600} times: RSS last ÷ after the first turn-over",
        f"≤ {FLAT_GOAL:.2f}",
        f"{ratio:.3f} ({settled:.1f} -> {last:.1f} MiB; {rows[0][1]:.1f} when the history filled)",
        f"python benchmarks/bench_soak.py --tui {args.tui}",
        ratio <= FLAT_GOAL,
    )
    return 0 if ratio <= FLAT_GOAL else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    ap.add_argument("--simulate", default="h100-sxm-8", help="simulated machine (default h100-sxm-8)")
    ap.add_argument("--gpu-every", type=int, default=20, help="simulated seconds between GPU reads + writes (default 20)")
    ap.add_argument("--diagnose-every", type=int, default=60, help="simulated seconds between diagnoses (default 60)")
    ap.add_argument(
        "--real-attach",
        type=float,
        default=None,
        metavar="MINUTES",
        help="instead: a real attach to the demo job for MINUTES, sampled every --sample-every s",
    )
    ap.add_argument("--sample-every", type=float, default=60.0, help="seconds between real-attach samples (default 60)")
    ap.add_argument("--scenario", default="hiccup", help="demo scenario for --real-attach (default hiccup)")
    ap.add_argument("--gpus", type=int, default=8, help="demo ranks for --real-attach (default 8)")
    ap.add_argument(
        "--tui",
        type=int,
        default=None,
        metavar="POLLS",
        help="instead: the TUI's memory over POLLS polls after its history filled (a multiple of 600)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="<= 1 min: 3 simulated hours (or, with --real-attach, 1 min sampled every 10 s, 2 ranks)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.tui is not None:
        if args.tui < 1200:
            ap.error("--tui needs at least 1200 polls: the first 600 turn the history over once, the rest show growth")
        return tui(args)
    if args.real_attach is not None:
        if args.quick:
            args.real_attach, args.sample_every, args.gpus = 1.0, 10.0, 2
        return real_attach(args)
    if args.quick:
        args.hours = 3.0
    return compressed(args)


if __name__ == "__main__":
    sys.exit(main())

"""The counter watch's cost (`Pipeline(..., watch=CounterCadence(...))`, on by default in `gputop serve` and `record`).

    python benchmarks/bench_counters.py [--rounds 20]

Side by side in one process on the simulated 8-GPU machine (the real pynvml wrappers over the fake library,
the real sysfs reader over the simulated machine's tree): a plain poll, and one counter reading with its
judgement (the GPUs' details, the AER files, the kernel log, `gputop check`'s counter lines), each timed
`--rounds` times, ABBA-interleaved.  Then, on this machine's own /sys and kernel log, the host side alone
(what a real box adds to the NVML detail calls).  At the default cadence (60 s) the watch costs its
reading's time once a minute: the figure reports it as a share of one core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import emit_figure, machine_line, print_table

from gputop.backend import SimulatedMachine
from gputop.collect.sysfs import HostReader
from gputop.pipeline import WATCH_COUNTERS_S, CounterCadence, Pipeline
from gputop.sim.fake_nvml import ManualClock

SPEC = "h100-sxm-8+pcie-replay=3+kernel-xid=5:48"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    clock = ManualClock(1_700_000_000.0)
    polls: list[float] = []
    readings: list[float] = []
    with Pipeline(SimulatedMachine(SPEC, clock=clock), watch=CounterCadence(WATCH_COUNTERS_S)) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0  # the same for both sides: NVML's own latency is not measured
        watch = pipeline.counters
        assert watch is not None
        snap = pipeline.poll()  # the first reading
        for i in range(args.rounds):
            for side in "AB" if i % 2 == 0 else "BA":
                clock.advance(1.0)
                started = time.perf_counter()
                if side == "A":
                    snap = pipeline.poll()  # not due: a plain poll
                    polls.append(time.perf_counter() - started)
                else:
                    watch.judge(snap)  # a reading and its judgement, as on the poll that falls due
                    readings.append(time.perf_counter() - started)
    host = HostReader("/")
    real_host: list[float] = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        host.read([])
        real_host.append(time.perf_counter() - started)
    poll_ms, read_ms, host_ms = (statistics.median(v) * 1000 for v in (polls, readings, real_host))
    share = read_ms / 1000 / WATCH_COUNTERS_S
    print(machine_line())
    print_table(
        ["what", "n", "median ms", "max ms"],
        [
            ["a plain poll (8 simulated GPUs)", len(polls), f"{poll_ms:.2f}", f"{max(polls) * 1000:.2f}"],
            ["a counter reading + judgement (simulated)", len(readings), f"{read_ms:.2f}", f"{max(readings) * 1000:.2f}"],
            ["this machine's /sys AER + kernel log read", len(real_host), f"{host_ms:.2f}", f"{max(real_host) * 1000:.2f}"],
        ],
    )
    print(f"at one reading every {WATCH_COUNTERS_S:.0f} s the watch takes {share * 100:.3f}% of one core")
    emit_figure(
        "counter watch (`serve`/`record`, every 60 s): one reading of gputop check's counters and its judgement, 8 simulated GPUs",
        "< 1% of a core at the default cadence",
        f"**{read_ms:.1f} ms** a reading (a plain poll {poll_ms:.1f} ms; the real host side {host_ms:.1f} ms): "
        f"{share * 100:.3f}% of a core",
        "python benchmarks/bench_counters.py",
        met=share < 0.01,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

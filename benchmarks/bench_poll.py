"""A poll's time on the simulated 8-GPU machine, side by side with the work it avoids.

    python benchmarks/bench_poll.py [--rounds 10]

The quick-lane tests count this work instead of timing it (tests/test_pipeline.py: a steady poll's NVML calls,
none of them the blocking GetPcieThroughput; tests/test_gpu_collector.py: on an old driver the eight GPUs'
PCIe calls overlap, held at a barrier).  The times are here, in ABBA rounds so the box's load lands on both:

- old driver (every GPU on GetPcieThroughput, ~20 ms a call, as the fake's latency): one collector sample
  against the same 16 calls made one after another, as reading the GPUs in series would.  The test's bar before
  it counted was 0.2 s against the 0.32 s of the series: a ratio under 0.62.
- a steady `Pipeline.poll()` of an H100 box (byte counters: nothing blocks) against one 20 ms PCIe call; the
  test's bar before was a median under 0.1 s, five such calls.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import emit_figure, interleave, machine_line

from gputop.backend import SimulatedMachine
from gputop.collect.gpu import GpuCollector
from gputop.pipeline import Pipeline
from gputop.sim.fake_nvml import PCIE_THROUGHPUT_LATENCY_S, FakeNvmlLibrary
from gputop.sim.spec import parse_spec
from gputop.sim.synthetic import SyntheticLoad


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="ABBA rounds of each pair (default 10)")
    args = ap.parse_args()
    print(machine_line())

    import pynvml

    spec = parse_spec("h100-sxm-8+old-driver")
    fake = FakeNvmlLibrary(spec, SyntheticLoad(spec.profile.gpu_count, spec.profile.gpu.memory_total), clock=time.monotonic)
    collector = GpuCollector(library=fake)
    try:
        collector.sample()  # the static reads and the first sample are not what a poll costs
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]

        def in_series() -> None:
            for handle in handles:
                for counter in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
                    pynvml.nvmlDeviceGetPcieThroughput(handle, counter)

        old = interleave(lambda: timed(collector.sample), lambda: timed(in_series), args.rounds)
    finally:
        collector.close()
    print(f"old driver: a sample {old.median_a * 1000:.0f} ms, the 16 PCIe calls in series {old.median_b * 1000:.0f} ms")
    emit_figure(
        "A sample of 8 GPUs on GetPcieThroughput (old driver, 20 ms a call), against the same 16 calls in series",
        "ratio < 0.62 (the test's old 0.2 s bar against 0.32 s)",
        f"**{1 / old.ratio:.2f}** ({old.median_a * 1000:.0f} ms against {old.median_b * 1000:.0f} ms, {args.rounds} ABBA rounds)",
        "python benchmarks/bench_poll.py",
        met=1 / old.ratio < 0.62,
    )

    with Pipeline(SimulatedMachine("h100-sxm-8")) as pipeline:
        pipeline.poll()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        glimpse = pynvml.NVML_PCIE_UTIL_TX_BYTES
        steady = interleave(
            lambda: timed(pipeline.poll), lambda: timed(lambda: pynvml.nvmlDeviceGetPcieThroughput(handle, glimpse)), args.rounds
        )
    ratio = steady.median_a / steady.median_b
    print(f"H100: a steady poll {steady.median_a * 1000:.1f} ms, one PCIe call {steady.median_b * 1000:.1f} ms")
    emit_figure(
        f"A steady `Pipeline.poll()` of 8 simulated H100s, in GetPcieThroughput calls ({PCIE_THROUGHPUT_LATENCY_S * 1000:.0f} ms)",
        "< 5 (the test's old 0.1 s bar)",
        f"**{ratio:.2f}** ({steady.median_a * 1000:.1f} ms, slowest {max(steady.a) * 1000:.1f} ms; {args.rounds} ABBA rounds)",
        "python benchmarks/bench_poll.py",
        met=ratio < 5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

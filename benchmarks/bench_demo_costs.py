"""The demo's CPU costs: what its tuned job burns on this box, against what `gputop.sim.scenarios` predicts.

The demo sizes its dataset (JPEG side, batch) from CPU costs measured on one box and scaled to this one by
`cpu_speed.cpu_slowness()` (a short workload timed here).  This script runs the tuned job (4 ranks) at four
loader shapes, measures every process's CPU (psutil) and the steps taken, and prints side by side:

- per shape, the workers' CPU per sample and the ranks' CPU per step, measured and predicted (the constants
  times this box's slowness), and their ratio: near 1.0 where the scaling holds on this box;
- the constants fitted from this box's figures and divided by its slowness: the reference box's constants
  as this box sees them (the ones in scenarios.py were fitted here on the dev VM);
- the job's share of the cores at the shape `resolve` picks for this box (its bar: JOB_CPU_SHARE).

    python benchmarks/bench_demo_costs.py [--seconds 15] [--ranks 4]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time
from dataclasses import replace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import psutil
from common import emit_figure, machine_line, print_table

from gputop.sim import scenarios
from gputop.sim.cpu_speed import cpu_slowness
from gputop.sim.demo_launcher import DemoJob

SHAPES = [(16, 96), (16, 224), (4, 96), (4, 288)]  # (batch, JPEG side): two batches, two sizes each
COMMAND = "python benchmarks/bench_demo_costs.py"


def _cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        out[proc.pid] = times.user + times.system
    return out


def measure(config: scenarios.DemoConfig, seconds: float) -> dict[str, float]:
    """The ranks' CPU per step and the workers' CPU per sample over `seconds` of training."""
    with DemoJob(config=config) as job:
        job.start()
        job.wait_until_training()
        launcher = psutil.Process(job.launcher_pid)
        ranks = launcher.children()
        procs = ranks + [c for r in ranks for c in r.children(recursive=True)]
        before, steps_before, started = _cpu_seconds(procs), sum(job.step_counts()), time.monotonic()
        time.sleep(seconds)  # the measuring window (not synchronisation)
        after, steps_after, elapsed = _cpu_seconds(procs), sum(job.step_counts()), time.monotonic() - started
    steps = max(1, steps_after - steps_before)
    rank_pids = {r.pid for r in ranks}
    used = {pid: after[pid] - before[pid] for pid in after if pid in before}
    rank_cpu = sum(v for pid, v in used.items() if pid in rank_pids)
    worker_cpu = sum(v for pid, v in used.items() if pid not in rank_pids)
    return {
        "steps_per_s": steps / elapsed,
        "rank_step_ms": 1000 * rank_cpu / steps,
        "sample_ms": 1000 * worker_cpu / (steps * config.batch_size),
        "job_cores": (rank_cpu + worker_cpu) / elapsed,
    }


def fit(rows: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """(per batch, per sample, ns per pixel) from (batch, side, CPU per sample) by least squares."""
    # cpu_per_sample = B / batch + S + P * side^2: three unknowns, solved by the normal equations
    xs = [(1.0 / b, 1.0, side * side / 1e6) for b, side, _ in rows]
    ys = [y for _, _, y in rows]
    n = 3
    ata = [[sum(x[i] * x[j] for x in xs) for j in range(n)] for i in range(n)]
    aty = [sum(x[i] * y for x, y in zip(xs, ys)) for i in range(n)]
    for col in range(n):  # Gaussian elimination, tiny and well conditioned here
        pivot = max(range(col, n), key=lambda r: abs(ata[r][col]))
        ata[col], ata[pivot], aty[col], aty[pivot] = ata[pivot], ata[col], aty[pivot], aty[col]
        for r in range(n):
            if r != col and ata[col][col]:
                k = ata[r][col] / ata[col][col]
                ata[r] = [a - k * c for a, c in zip(ata[r], ata[col])]
                aty[r] -= k * aty[col]
    batch_ms, sample_ms, ns_per_pixel = (aty[i] / ata[i][i] for i in range(n))
    return batch_ms, sample_ms, ns_per_pixel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="measuring window per shape (default 15)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks of the tuned job (default 4)")
    args = ap.parse_args(argv)
    cpus = os.cpu_count() or 1
    slowness_before = cpu_slowness()
    base = scenarios.resolve("tuned", gpus=args.ranks, slowness=slowness_before)
    rows, measured, ratios = [], [], []
    for batch, side in SHAPES:
        config = replace(base, batch_size=batch, image_side=side)
        figures = measure(config, args.seconds)
        measured.append((batch, side, figures))
        predicted_sample = scenarios.worker_ms_per_sample(side, batch, slowness_before)
        predicted_rank = slowness_before * scenarios.RANK_STEP_CPU_MS
        ratios.append(figures["sample_ms"] / predicted_sample)
        rows.append(
            [
                f"{batch} x {side} px",
                f"{figures['steps_per_s']:.2f}",
                f"{figures['sample_ms']:.2f} / {predicted_sample:.2f}",
                f"{ratios[-1]:.2f}",
                f"{figures['rank_step_ms']:.1f} / {predicted_rank:.1f}",
                f"{figures['rank_step_ms'] / predicted_rank:.2f}",
                f"{100 * figures['job_cores'] / cpus:.0f}%",
            ]
        )
    slowness_after = cpu_slowness()
    slowness = statistics.fmean((slowness_before, slowness_after))
    print(machine_line())
    print(f"this box's CPU slowness against the reference: {slowness_before:.2f} before, {slowness_after:.2f} after")
    print_table(
        ["shape", "steps/s (all ranks)", "sample ms meas/pred", "ratio", "rank step ms meas/pred", "ratio", "job of cores"],
        rows,
    )
    batch_ms, sample_ms, ns = fit([(b, s, f["sample_ms"]) for b, s, f in measured])
    rank_ms = statistics.fmean(f["rank_step_ms"] for _, _, f in measured)
    print(
        "fitted here, divided by the slowness (scenarios.py's constants in brackets): "
        f"per batch {batch_ms / slowness:.2f} ms [{scenarios.BATCH_CPU_MS}], "
        f"per sample {sample_ms / slowness:.2f} ms [{scenarios.SAMPLE_CPU_MS}], "
        f"{ns / slowness:.1f} ns per pixel [{scenarios.SAMPLE_NS_PER_PIXEL}], "
        f"rank step {rank_ms / slowness:.1f} ms [{scenarios.RANK_STEP_CPU_MS}]"
    )
    emit_figure(
        "Demo CPU per sample, measured ÷ predicted (tuned job, 4 shapes)",
        "≈ 1.0",
        f"{min(ratios):.2f}–{max(ratios):.2f} (slowness {slowness_before:.2f})",
        COMMAND,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

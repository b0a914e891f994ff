"""Advice that works: on the demo's `starved` scenario (a real PyTorch job, Pillow decoding per sample,
num_workers=0, DistributedSampler), setting num_workers to the benchmark's recommendation removes the
data wait."""

from __future__ import annotations

import time

import pytest

from gputop.bench import resolve_rank, run_benchmark
from gputop.collect.sampler import sample_passive
from gputop.sim.demo_launcher import DemoJob
from tests.harness.processes import wait_until

RANKS = 2  # keeps 2 shared cores usable; the arithmetic per rank is the same as with 8
NO_HARM = 0.9  # the job keeps at least this share of its speed while the benchmark sweeps


def _steps_per_s(job: DemoJob, sample) -> tuple[float, object]:
    before, t0 = job.step_counts(), time.monotonic()
    value = sample()
    after, t1 = job.step_counts(), time.monotonic()
    return min(b - a for a, b in zip(before, after)) / (t1 - t0), value


@pytest.mark.slow
@pytest.mark.alone  # the benchmark's rates and the tuned run's wait: the CPU it gets is the bar
@pytest.mark.timeout(600)
def test_recommended_workers_remove_the_wait_on_the_starved_demo(tmp_path):
    root = str(tmp_path / "results")
    with DemoJob("starved", gpus=RANKS) as job:
        launcher = job.start()
        job.wait_until_training()
        wait_until(lambda: min(job.step_counts()) >= 3, timeout=60, what="warm-up steps (lazy imports)")
        starved_rate, result = _steps_per_s(
            job, lambda: run_benchmark(launcher, seconds=15, allow_inject=True, results_root=(root, root))
        )
    assert result.mode == "active", result.notes
    assert result.settings["num_workers"] == 0 and result.settings["sampler"].endswith("DistributedSampler")
    assert result.consumption["wait_fraction"] > 0.4  # starved: the GPU step is a third of each iteration
    assert result.advice["bottleneck"] is True
    workers = result.recommendation["num_workers"]
    assert workers >= 2, result.summary_lines()
    assert any(c["num_workers"] == workers for c in result.configs)  # the advice was measured, not guessed
    assert any(note.startswith("the job kept") for note in result.notes)
    kept = result.during_sweep["batches_per_s"] / result.consumption["batches_per_s"]
    assert kept > 0.5  # no stall (a forked copy once held the job's storage pipes open: 0 batches)
    if result.contention:  # no idle cores: the sweep's decoding competed with the job, and it says so
        assert any(note.startswith("measured under contention") for note in result.notes)
    else:
        assert kept >= NO_HARM

    with DemoJob("starved", gpus=RANKS, workers=workers) as fixed:
        launcher = fixed.start()
        fixed.wait_until_training()
        wait_until(lambda: min(fixed.step_counts()) >= 5, timeout=60, what="warm-up steps")
        rank_pid, worker_pids, _ranks, _text = resolve_rank(launcher)
        fixed_rate, passive = _steps_per_s(fixed, lambda: sample_passive(rank_pid, worker_pids, 6))
    assert passive.wait_fraction < 0.10, passive
    assert fixed_rate > 2 * starved_rate
    if result.contention:
        # The no-harm bar is not lowered on a busy box: it could not be measured here, and the test says so
        # instead of passing on a weaker one (everything above did hold).
        pytest.skip(
            f"no idle cores during the sweep: the job kept {kept:.0%} of its speed; the >= {NO_HARM:.0%} "
            "no-harm bar needs a box with idle cores"
        )

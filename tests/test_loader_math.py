"""The loader arithmetic: pure functions, hand-computed expectations."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gputop.analysis import loader_math as lm


def test_step_time_is_period_minus_wait():
    assert lm.step_time(10.0, 0.06) == pytest.approx(0.04)
    assert lm.step_time(0.0, 0.1) is None


def test_prep_time_counts_producers():
    assert lm.prep_time_from_rate(0, 20.0) == pytest.approx(0.05)  # the main process is one producer
    assert lm.prep_time_from_rate(4, 20.0) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "prep, step, expected",
    [(0.2, 0.05, 5), (0.1, 0.1, 2), (0.08, 0.1, 1), (0.0, 0.1, 0), (0.3, 0.025, 15)],
)
def test_workers_needed_is_ceil_prep_over_step_times_margin(prep, step, expected):
    assert lm.workers_needed(prep, step) == expected


def test_worker_cap_uses_idle_cores_and_core_share():
    assert lm.worker_cap(0, 6.0) == 7  # CPU-bound: one core per worker, plus the main process's decoding
    assert lm.worker_cap(2, 6.0, ranks_on_host=3) == 4  # two idle cores each for three ranks
    assert lm.worker_cap(2, 1.0, core_share=0.1) == 12  # workers that mostly wait on storage
    assert lm.worker_cap(0, 0.0) == 1  # a saturated host: the main process's decoding moves to one worker
    assert lm.worker_cap(2, 0.0) == 2  # ... and nothing more when it already has workers
    assert lm.worker_cap(2, 0.0, core_share=0.05) == 7  # a saturated host still fits sleepy workers
    assert lm.worker_cap(0, 100.0, core_share=0.05) == lm.HARD_MAX_WORKERS


def test_core_share_from_cpu_time_per_batch():
    cpu_bound = {"num_workers": 2, "batches_per_s": 20.0, "cpu_s_per_batch": 0.1}
    io_bound = {"num_workers": 2, "batches_per_s": 20.0, "cpu_s_per_batch": 0.01}
    assert lm.core_share_per_worker(cpu_bound) == pytest.approx(1.0)
    assert lm.core_share_per_worker(io_bound) == pytest.approx(0.1)
    assert lm.core_share_per_worker({**io_bound, "cpu_s_per_batch": 0.0001}) == lm.MIN_CORE_SHARE
    assert lm.core_share_per_worker(None) == 1.0


def test_plan_worker_counts():
    assert lm.plan_worker_counts(0, 5, 8) == [2, 5, 7]
    assert lm.plan_worker_counts(0, 5, 1) == [1]
    assert lm.plan_worker_counts(0, None, 8) == [1, 4, 8]  # offline: doublings up to the cap
    assert 2 not in lm.plan_worker_counts(2, 2, 8)  # never re-measures the current setting


def _starved_inputs(**overrides):
    # num_workers=0, 100 ms of prep per batch, 20 ms of step: the job waits 100 of every 120 ms.
    inputs = dict(
        current={"num_workers": 0, "pin_memory": False, "persistent_workers": False},
        consumption={"batches_per_s": 1 / 0.12, "wait_per_batch_s": 0.1, "wait_fraction": 0.1 / 0.12},
        configs=[
            {"num_workers": 0, "prefetch_factor": None, "pin_memory": False, "batches_per_s": 10.0, "cpu_s_per_batch": 0.1},
            {"num_workers": 7, "prefetch_factor": 2, "pin_memory": False, "batches_per_s": 68.0},
        ],
        free_cores=16.0,
    )
    inputs.update(overrides)
    return inputs


def test_recommend_starved_loader_shows_the_arithmetic():
    advice = lm.recommend(**_starved_inputs())
    assert advice["bottleneck"] is True
    # 100 ms / 20 ms * 1.25 = 6.25 -> 7 workers; 16 idle cores allow it
    assert advice["workers_needed"] == 7
    assert advice["kwargs"]["num_workers"] == 7
    assert advice["kwargs"]["persistent_workers"] is True
    text = "\n".join(advice["lines"])
    assert "100.0 ms ÷ 20.0 ms × 1.25 margin → 7" in text
    assert "num_workers=7 gives 68.0 batches/s ≥ 50.0 needed" in text
    assert "set num_workers=7" in advice["verdict"]


def test_recommend_caps_by_idle_cores_and_says_so():
    advice = lm.recommend(**_starved_inputs(free_cores=3.0))
    assert advice["kwargs"]["num_workers"] == 4  # 3 idle cores + the core the main process decodes on
    assert "more workers than the 4 that fit the idle cores" in advice["verdict"]
    # the need (7) is above the cap: it is never printed as a count to set
    assert advice["workers_needed"] == 4 and "→ more than the cap of 4" in "\n".join(advice["lines"])


def test_passive_tier_advises_more_io_bound_workers_from_shares():
    # one worker that sleeps in __getitem__ (5% of a core) while the rank waits 85% of the time
    advice = lm.recommend(
        current={"num_workers": 1},
        free_cores=1.5,
        max_workers=8,
        passive={"wait_fraction": 0.85, "worker_busy": [{"pid": 1, "busy": 0.05}]},
    )
    assert advice["bottleneck"] is True and advice["kwargs"]["num_workers"] == 8  # 1/0.15×1.25 → 9, cap 8
    assert "I/O-bound" in "\n".join(advice["lines"])
    # the same wait with CPU-bound workers on a busy host: no more workers fit, none are advised
    advice = lm.recommend(
        current={"num_workers": 2},
        free_cores=0.1,
        max_workers=8,
        passive={"wait_fraction": 0.85, "worker_busy": [{"pid": 1, "busy": 0.97}, {"pid": 2, "busy": 0.98}]},
    )
    assert advice["kwargs"]["num_workers"] == 2 and "no more workers fit" in advice["verdict"]


@pytest.mark.parametrize("free_cores", [0.0, 0.5, 3.0, 40.0])
@pytest.mark.parametrize("max_workers", [None, 2, 8])
@pytest.mark.parametrize("busy", [0.02, 0.4, 1.0])
@pytest.mark.parametrize("n_now", [0, 1, 4])
def test_no_advice_exceeds_its_cap(free_cores, max_workers, busy, n_now):
    passive = {
        "wait_fraction": 0.97,
        "dataset_fraction": 0.97 if n_now == 0 else 0.0,
        "worker_busy": [{"pid": i, "busy": busy} for i in range(n_now)],
    }
    for kwargs in ({"passive": passive}, _starved_inputs(free_cores=free_cores)):
        kwargs = dict(
            kwargs, current=dict(kwargs.get("current") or {"num_workers": n_now}), free_cores=free_cores, max_workers=max_workers
        )
        advice = lm.recommend(**kwargs)
        cap = advice["worker_cap"]
        assert cap is not None and advice["kwargs"]["num_workers"] <= max(cap, kwargs["current"]["num_workers"])
        if max_workers is not None:
            assert advice["kwargs"]["num_workers"] <= max(max_workers, kwargs["current"]["num_workers"])
        printed = [
            int(n)
            for n in re.findall(
                r"(?:num_workers=|→ (?:at most )?|needs ~?)(\d+)(?![\d.]| ms)", advice["verdict"] + "\n".join(advice["lines"])
            )
        ]
        assert all(n <= max(cap, kwargs["current"]["num_workers"]) for n in printed), (printed, cap, advice)


def test_recommend_takes_the_smallest_measured_count_that_keeps_up():
    configs = _starved_inputs()["configs"] + [{"num_workers": 6, "prefetch_factor": 2, "batches_per_s": 58.0}]
    advice = lm.recommend(**_starved_inputs(configs=configs))
    assert advice["kwargs"]["num_workers"] == 6  # 58 >= 50 * 1.05 measured, one fewer than the estimate


def test_recommend_not_the_bottleneck():
    advice = lm.recommend(
        current={"num_workers": 4, "prefetch_factor": 2, "pin_memory": True, "persistent_workers": True},
        consumption={"batches_per_s": 20.0, "wait_per_batch_s": 0.001, "wait_fraction": 0.02},
        free_cores=4.0,
    )
    assert advice["bottleneck"] is False
    assert advice["verdict"].startswith("your loader is not the bottleneck")
    assert advice["kwargs"]["num_workers"] == 4


def test_recommend_pin_memory_only_with_cuda_and_persistent_only_on_restarts():
    inputs = _starved_inputs(current={"num_workers": 2, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": False})
    inputs["configs"] = [
        {"num_workers": 2, "prefetch_factor": 2, "batches_per_s": 20.0},
        {"num_workers": 7, "prefetch_factor": 2, "batches_per_s": 68.0},
    ]
    plain = lm.recommend(**inputs)
    assert plain["kwargs"]["pin_memory"] is False
    assert plain["kwargs"]["persistent_workers"] is False
    restarting = lm.recommend(**inputs, uses_cuda=True, passive={"wait_fraction": 0.8, "epoch_restart_fraction": 0.1})
    assert restarting["kwargs"]["pin_memory"] is True
    assert restarting["kwargs"]["persistent_workers"] is True
    assert any("epoch restarts" in line for line in restarting["lines"])


def test_recommend_without_any_measurement_says_so():
    advice = lm.recommend(current={"num_workers": 0})
    assert advice["bottleneck"] is None
    assert "no batches were seen" in advice["verdict"]


def test_recommend_offline_takes_fewest_workers_near_the_best():
    configs = [
        {"num_workers": 0, "batches_per_s": 10.0},
        {"num_workers": 2, "batches_per_s": 19.5},
        {"num_workers": 4, "batches_per_s": 39.0},
        {"num_workers": 8, "batches_per_s": 41.0},
    ]
    advice = lm.recommend_offline(current={"num_workers": 0}, configs=configs)
    assert advice["kwargs"]["num_workers"] == 4  # 39 is within 10% of 41
    assert "100.0 ms" in advice["lines"][0]  # 1 producer / 10 batches/s


def test_loader_math_imports_only_the_standard_library():
    # The agent loads this file inside the training process, where gputop may not be installed.
    tree = ast.parse(Path(lm.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "math", "typing"}


def test_live_prep_time_reads_the_input_bound_training():
    waiting = {"batches_per_s": 5.0, "wait_per_batch_s": 0.15, "wait_fraction": 0.75}
    assert lm.live_prep_time(0, waiting) == pytest.approx(0.15)  # the main process builds the batch
    assert lm.live_prep_time(3, waiting) == pytest.approx(0.6)  # 3 workers make exactly 5 batches/s
    assert lm.live_prep_time(3, {**waiting, "wait_fraction": 0.01}) is None  # keeping up: says nothing
    assert lm.live_prep_time(0, None) is None


def test_recommend_prefers_the_live_prep_and_shows_the_sweep_as_a_cross_check():
    # the sweep ran under contention and saw a slower loader than the training did
    configs = [{"num_workers": 0, "batches_per_s": 5.0}, {"num_workers": 7, "batches_per_s": 50.0}]
    advice = lm.recommend(**_starved_inputs(configs=configs))
    text = "\n".join(advice["lines"])
    assert "prep time per batch = the wait at num_workers=0 = 100.0 ms" in text
    assert "cross-check, loader alone with these settings: 5.00 batches/s → 200.0 ms" in text
    assert advice["workers_needed"] == 7


def test_offline_advice_is_the_fewest_workers_near_the_best_not_the_most():
    # rates that level off: 4 workers are within 10% of 8's best, so 8 would be an over-recommendation
    configs = [
        {"num_workers": n, "prefetch_factor": 2, "pin_memory": False, "batches_per_s": rate}
        for n, rate in ((0, 5.0), (2, 10.0), (4, 19.0), (8, 20.0))
    ]
    advice = lm.recommend_offline(current={"num_workers": 0}, configs=configs)
    assert advice["kwargs"]["num_workers"] == 4
    # and when they keep scaling, the most it measured (nothing beyond what was measured)
    scaling = [dict(c, batches_per_s=5.0 * max(1, c["num_workers"])) for c in configs]
    assert lm.recommend_offline(current={"num_workers": 0}, configs=scaling)["kwargs"]["num_workers"] == 8

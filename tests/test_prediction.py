"""What a fix buys (gputop/analysis/prediction.py): the bounds' arithmetic, and the predictions the findings carry,
on hand-built histories."""

from __future__ import annotations

import pytest

from gputop.analysis import prediction as p
from gputop.analysis.diagnosis import diagnose
from gputop.analysis.numbers import share_of
from gputop.analysis.stack_classes import FORWARD_BACKWARD, IN_DATASET, WAITING_FOR_DATA
from tests.harness.histories import RankSpec, Scenario, build


def test_more_io_bound_workers_stop_at_the_steps_compute():
    wait = share_of(600, 1000)  # 60% waiting for data
    forecast = p.predict_workers(2, 9, wait, cpu_bound=False, cores=None)
    assert isinstance(forecast, p.Prediction)
    assert forecast.limited_by == p.COMPUTE  # 9/2 = x4.5 workers, but the step allows x2.5
    assert forecast.factor == pytest.approx(1 / 0.4)
    assert forecast.low <= forecast.factor <= forecast.high
    rated = forecast.with_rate(p.StepRate(10.0, "counters")).figures()
    assert rated["steps_per_s_after"] == pytest.approx(25.0)
    assert rated["after_low"] < 25.0 < rated["after_high"]
    assert rated["change"] == "num_workers=9" and rated["limited_by"] == "the step's compute"
    assert rated["text"].startswith("with num_workers=9: ~25 steps/s (") and rated["text"].endswith("now 10 (counters)")


def test_too_few_workers_are_the_bound_themselves():
    forecast = p.predict_workers(2, 3, share_of(600, 1000), cpu_bound=False, cores=None)
    assert isinstance(forecast, p.Prediction)
    assert (forecast.limited_by, forecast.factor) == (p.WORKERS, 1.5)


def test_cpu_bound_workers_stop_at_what_the_cores_decode():
    # the job uses ~0.9 of its 2 cores and nothing else runs: it can get 2, x2.2 the CPU work a second
    cores = p.CoreUse(used=(0.9, 0.95, 0.85, 0.9), could=(2.0, 2.0, 2.0, 2.0), cap=2.0)
    forecast = p.predict_workers(0, 12, share_of(800, 1000), cpu_bound=True, cores=cores)
    assert isinstance(forecast, p.Prediction)
    assert forecast.limited_by == p.CORES
    assert forecast.factor == pytest.approx(2.0 / 0.9, rel=0.05)
    # a busy box leaves no idle core: the cores bound says more workers buy nothing
    busy = p.CoreUse(used=(0.9, 0.95, 0.85, 0.9), could=(0.9, 0.95, 0.85, 0.9), cap=2.0)
    flat = p.predict_workers(0, 12, share_of(800, 1000), cpu_bound=True, cores=busy)
    assert isinstance(flat, p.Prediction) and flat.factor == pytest.approx(1.0)


def test_a_cpu_bound_loader_without_cpu_readings_is_not_guessed():
    forecast = p.predict_workers(0, 12, share_of(800, 1000), cpu_bound=True, cores=None)
    assert isinstance(forecast, p.Unpredictable)
    assert forecast.figures()["steps_per_s_after"] is None and "CPU" in forecast.reason


def test_removing_a_sync_overlaps_host_and_gpu():
    # the host parks 40% of a step at the sync, the GPUs are busy 45%: max(60%, 45%) of a step remains
    forecast = p.predict_no_sync(share_of(400, 1000), share_of(550, 1000))
    assert isinstance(forecast, p.Prediction)
    assert forecast.factor == pytest.approx(1 / 0.6) and forecast.limited_by == p.COMPUTE


def test_amp_halves_the_dram_bound_part():
    forecast = p.predict_amp([0.6, 0.62, 0.58, 0.6], busy=True)
    assert isinstance(forecast, p.Prediction)
    assert forecast.factor == pytest.approx(1 / (1 - 0.6 / 4), rel=0.01)  # half the traffic halves
    assert forecast.low == 1.0 and forecast.high == pytest.approx(1 / 0.7, rel=0.05)
    assert isinstance(p.predict_amp([0.6] * 5, busy=False), p.Unpredictable)


def test_a_prediction_reads_back_from_its_figures_and_takes_a_rate_later():
    forecast = p.predict_workers(2, 9, share_of(600, 1000), cpu_bound=False, cores=None)
    figures = forecast.figures()
    assert figures["steps_per_s_now"] is None and figures["speedup"] == pytest.approx(2.5)
    back = p.forecast_from(figures).with_rate(p.StepRate(4.0, "trace"), epoch_batches=600)
    rated = back.figures()
    assert rated["steps_per_s_after"] == pytest.approx(10.0)
    assert (rated["epoch_s_now"], rated["epoch_s_after"]) == (150.0, 60.0)
    assert "an epoch 150 s → 60 s" in rated["text"]


def _starved(
    worker_cpu: float, host_cpu: float, workers: int = 2, pattern: tuple[int, int] = (30, 20), worker_state: str = "S"
) -> Scenario:
    """One rank waiting for data 60% of the time (dense samples at 100 Hz: `pattern` samples waiting, then in the
    step, over and over), its workers at `worker_cpu`%."""
    wait, step = pattern
    pids = tuple(range(2000, 2000 + workers))
    return Scenario(
        gpu_count=1,
        cores=2,
        util=lambda g, t: 40.0,
        host_cpu=lambda c, t: host_cpu,
        ranks=[
            RankSpec(
                pid=1000,
                rank=0,
                gpus=(0,),
                state=lambda t: WAITING_FOR_DATA,
                dense=lambda t: [(WAITING_FOR_DATA, wait), (FORWARD_BACKWARD, step)] * (500 // (wait + step)),
                workers=lambda t: pids,
                worker_cpu=lambda t, w: worker_cpu,
                worker_state=lambda t, w: worker_state,
                cpu=lambda t: 10.0,
            )
        ],
    )


def test_the_starvation_finding_carries_its_prediction_io_bound():
    found = {f.id: f for f in diagnose(build(_starved(worker_cpu=5.0, host_cpu=20.0)))}
    pred = found["starvation"].figures["prediction"]
    assert pred["change"].startswith("num_workers=")
    assert pred["limited_by"] in (p.COMPUTE, p.GPU_WORK)
    assert pred["speedup"] == pytest.approx(1 / 0.4, rel=0.05)


def test_cpu_bound_workers_on_two_cores_are_bounded_by_what_the_cores_can_decode():
    # one worker uses a core; half of the 2-core box idles: the job could get ~2 cores, not the 2.5x the step allows
    found = {f.id: f for f in diagnose(build(_starved(worker_cpu=95.0, host_cpu=50.0, workers=1)))}
    pred = found["starvation"].figures["prediction"]
    assert pred["limited_by"] == p.CORES
    assert pred["speedup"] == pytest.approx(2.0 / 1.05, rel=0.05)


def test_with_every_core_busy_the_fix_is_cheaper_input_bounded_by_the_gpus_and_the_ranks_host_work():
    found = {f.id: f for f in diagnose(build(_starved(worker_cpu=95.0, host_cpu=100.0)))}
    pred = found["starvation"].figures["prediction"]
    assert pred["change"].startswith("preprocessing made cheap")
    # the GPUs busy 40% of the step, then the ranks' own 0.1 cores of the 2 they can get (5%): x1/0.45, not x1/0.4
    assert pred["limited_by"] == p.GPU_AND_HOST and pred["speedup"] == pytest.approx(1 / 0.45, rel=0.01)


def test_cached_input_runs_the_gpus_work_and_the_ranks_own_host_work_in_turn():
    # the GPUs are busy 60% of the step; the ranks use 0.2 of the 1.6 cores the job can get: their host work takes
    # 12.5% of the step on those cores.  In turn (the all-reduce lines the ranks up, the GPUs wait for the launch):
    # x1/(0.6 + 0.125); overlapped at most x1/0.6
    cores = p.CoreUse((1.0,) * 4, (1.6,) * 4, cap=2.0, host_cores=2.0, rank_used=(0.2,) * 4)
    forecast = p.predict_cheaper_input(share_of(100, 1000), share_of(400, 1000), "cached", cores)
    assert isinstance(forecast, p.Prediction) and forecast.limited_by == p.GPU_AND_HOST
    assert forecast.factor == pytest.approx(1 / (0.6 + 0.125), rel=0.01)
    assert forecast.high is not None and forecast.high >= 1 / 0.6 * 0.99


def test_a_one_off_pause_carries_no_prediction():
    ranks = [RankSpec(pid=1000, rank=0, gpus=(0,), state=lambda t: IN_DATASET if 20 <= t < 26 else FORWARD_BACKWARD)]
    found = diagnose(build(Scenario(gpu_count=1, ranks=ranks, seconds=59)))
    assert all("prediction" not in f.figures for f in found if f.id == "starvation" and "one" in f.summary.lower())


def test_steps_are_counted_in_the_dense_samples_when_each_phase_lasts_a_few_samples():
    # 100 Hz, 5 s stretches of 10 steps a second: 6 samples in the step, 4 waiting for the one worker's batch
    found = {f.id: f for f in diagnose(build(_starved(worker_cpu=5.0, host_cpu=20.0, workers=1, pattern=(4, 6))))}
    pred = found["starvation"].figures["prediction"]
    assert pred["steps_per_s_now"] == pytest.approx(10.0, rel=0.05)
    assert pred["now_low"] < 10.0 < pred["now_high"] and "dense samples" in pred["now_source"]
    assert pred["steps_per_s_after"] == pytest.approx(10.0 / 0.6, rel=0.05)  # the step's compute: 6 of 10 samples


def test_steps_are_not_counted_from_phases_that_slip_between_samples():
    # a step of one sample and a wait of one: either may fall between two samples, so no count is given
    for pattern in ((1, 1), (6, 1)):  # (6, 1): a long wait, but what lies between two waits is a lone sample
        found = {f.id: f for f in diagnose(build(_starved(worker_cpu=5.0, host_cpu=20.0, workers=1, pattern=pattern)))}
        pred = found["starvation"].figures["prediction"]
        assert pred["steps_per_s_now"] is None and pred["steps_per_s_after"] is None, pattern
        assert pred["speedup"] is not None and "the steps/s now" in pred["text"]


def test_the_fair_share_beside_other_work_raises_what_the_job_could_get():
    # the box is busy with 6 other runnable processes: idle cores say the job can get nothing more, but 1 rank 2 x 4/10 = 0.8 of the 2 cores against the 0.4 they use
    # and 3 workers get 2 x 4/10 = 0.8 of the 2 cores against the 0.4 they use, if the kernel shares by process
    cores = p.CoreUse((0.4,) * 4, (0.4,) * 4, cap=2.0, others=(6.0,) * 4, host_cores=2.0, ranks=1)
    bound = cores.bound(4)
    assert bound is not None
    assert (bound.low, bound.high) == (pytest.approx(1.0), pytest.approx(2.0))  # idle cores only .. per-process share
    assert bound.factor == pytest.approx(2**0.5)  # which one the scheduler applies (autogroup) is not measured
    unbounded = cores.bound(None)
    assert unbounded is not None and unbounded.factor == pytest.approx(1.0)
    # a job using little CPU surely gets a session's share when it wants more: 2 cores / (3 others + 1) = 0.5
    small = p.CoreUse((0.1,) * 4, (0.1,) * 4, cap=2.0, others=(3.0,) * 4, host_cores=2.0, ranks=1).bound(4)
    assert small is not None and small.low == pytest.approx(5.0)
    # on a quiet box the two agree: the idle cores
    quiet = p.CoreUse((0.9,) * 4, (2.0,) * 4, cap=2.0, others=(0.0,) * 4, host_cores=2.0, ranks=1).bound(4)
    assert quiet is not None and quiet.factor == pytest.approx(2.0 / 0.9)


def test_the_benchmark_predicts_each_configuration_it_measured():
    consumption = {"batches_per_s": 10.0, "step_s": 0.025, "wait_fraction": 0.75}
    slow = p.config_forecast({"num_workers": 2, "batches_per_s": 20.0, "batches": 100}, consumption)
    fast = p.config_forecast({"num_workers": 8, "batches_per_s": 80.0, "batches": 400}, consumption)
    assert isinstance(slow, p.Prediction) and isinstance(fast, p.Prediction)
    assert (slow.limited_by, slow.figures()["steps_per_s_after"]) == (p.WORKERS, 20.0)
    assert (fast.limited_by, fast.figures()["steps_per_s_after"]) == (p.COMPUTE, 40.0)  # 1 / 25 ms
    assert isinstance(p.config_forecast({"num_workers": 2, "batches_per_s": 20.0}, None), p.Unpredictable)


def test_the_report_shows_the_prediction_beside_the_fix():
    from gputop.report.markdown import render_markdown

    history = build(_starved(worker_cpu=5.0, host_cpu=20.0, workers=1, pattern=(4, 6)))
    text = render_markdown(history, diagnose(history))
    assert "**What it buys:** with num_workers=" in text and "limited by the step's compute" in text


def test_the_tui_finding_card_shows_the_prediction():
    from gputop.tui.screens import finding_text

    finding = next(f for f in diagnose(build(_starved(worker_cpu=5.0, host_cpu=20.0))) if f.id == "starvation")
    assert "Buys: with num_workers=" in finding_text(finding).plain


def test_a_straggler_fixed_gives_back_the_others_wait_and_persistent_workers_the_collapses():
    straggler = p.predict_straggler(share_of(300, 1000))  # the others wait for it 30% of the time
    assert isinstance(straggler, p.Prediction) and straggler.factor == pytest.approx(1 / 0.7)
    restarts = p.predict_restarts(share_of(6, 60))  # 6 of 60 seconds collapsed at the restarts
    assert isinstance(restarts, p.Prediction) and restarts.factor == pytest.approx(1 / 0.9)
    assert restarts.low <= restarts.factor <= restarts.high  # type: ignore[operator]
    assert isinstance(p.predict_straggler(share_of(999, 1000)), p.Unpredictable)  # nothing but waiting: no step to keep


def test_the_epoch_length_comes_from_the_loader_the_benchmark_read():
    from types import SimpleNamespace

    settings = {"dataset_len": 1000, "batch_size": 64, "dataset_kind": "map", "sampler": "DistributedSampler"}
    ctx = SimpleNamespace(bench={"settings": settings}, ranks={1: None, 2: None})
    assert p.epoch_batches(ctx) == 8  # 500 samples a rank, 64 a batch: 7 full and one short
    assert p.epoch_batches(SimpleNamespace(bench={"settings": {**settings, "drop_last": True}}, ranks={1: None, 2: None})) == 7
    assert p.epoch_batches(SimpleNamespace(bench={"settings": {**settings, "dataset_kind": "iterable"}}, ranks={})) is None
    assert p.epoch_batches(SimpleNamespace(bench=None, ranks={})) is None


def test_the_jobs_own_counters_replace_steps_counted_in_samples():
    history = build(_starved(worker_cpu=5.0, host_cpu=20.0, workers=1, pattern=(4, 6)))
    found = [f for f in diagnose(history) if f.id == "starvation"]
    counted = found[0].figures["prediction"]
    assert "dense samples" in counted["now_source"]
    kept = p.with_step_rate(found, p.StepRate(20.0, "the job's step counters"))[0].figures["prediction"]
    assert kept["steps_per_s_now"] == counted["steps_per_s_now"]  # a rate already there stays...
    timed = p.with_step_rate(found, p.StepRate(20.0, "the job's step counters"), timed=True)[0].figures["prediction"]
    assert timed["steps_per_s_now"] == 20.0  # ...unless the job's own counters timed it
    assert timed["steps_per_s_after"] == pytest.approx(20.0 * counted["speedup"], rel=0.01)


def test_the_traces_fp32_gemms_bound_what_amp_buys():
    from gputop.analysis.checks.trace import check_amp

    rank = {
        "rank": 0,
        "pid": 4242,
        "steps_per_s": 10.0,
        "gpu": {"compute_capability": 9, "gemm_time_s": 0.5, "fp32_gemm_time_s": 0.5, "span_s": 1.0, "busy": 0.9},
    }
    pred = check_amp([rank])[0].figures["prediction"]
    # half the GPUs' time in fp32 GEMMs, 2-8x faster on the tensor cores: x1/(1 - 0.5 (1 - 1/k))
    assert (pred["speedup_low"], pred["speedup_high"]) == (pytest.approx(4 / 3, rel=0.01), pytest.approx(16 / 9, rel=0.01))
    assert pred["steps_per_s_now"] == 10.0 and pred["steps_per_s_after"] == pytest.approx(10 / (1 - 0.5 * 0.75), rel=0.01)
    idle = p.predict_trace_amp(0.5, 1.0, 0.2, None)
    assert isinstance(idle, p.Unpredictable)


def test_the_water_level_is_what_one_more_hungry_group_gets():
    assert p.water_level(2.0, ()) == pytest.approx(2.0)  # alone: every core
    assert p.water_level(2.0, (0.6, 0.6, 0.6)) == pytest.approx(0.5)  # four groups wanting more: a quarter each
    assert p.water_level(2.0, (0.05, 1.5)) == pytest.approx((2.0 - 0.05) / 2)  # the small one keeps its 0.05
    assert p.water_level(2.0, (0.2, 0.3)) == pytest.approx(1.5)  # both under the share: the job gets the rest


def test_with_autogroup_the_jobs_session_gets_its_share_however_many_workers_it_adds():
    # stage 1 of the case study on the shared box (measured): the job used ~0.45 cores beside three sessions using
    # ~0.5 each, the box full.  Per process, 26 processes would take most of the box; per session (autogroup on),
    # the job's session gets a quarter of it: stage 2 got 0.5-0.57 cores
    readings = 5
    cores = p.CoreUse(
        (0.45,) * readings,
        (0.45,) * readings,
        cap=2.0,
        others=(6.0,) * readings,
        host_cores=2.0,
        ranks=2,
        sessions=((0.55, 0.5, 0.45),) * readings,
    )
    bound = cores.bound(26)
    assert bound is not None and "sessions" in bound.why
    assert bound.low == pytest.approx(0.5 / 0.45)  # an equal share beside 3 busy sessions: 0.5 cores
    assert bound.factor * 0.45 == pytest.approx((0.5 * p.water_level(2.0, (0.55, 0.5, 0.45))) ** 0.5)
    assert bound.factor * 0.45 < 0.6  # not the 1.6 cores of the per-process share
    # a quiet box: the other sessions hardly use the cores, the job gets what is idle
    quiet = p.CoreUse((0.9,) * readings, (1.95,) * readings, cap=2.0, host_cores=2.0, sessions=((0.05,),) * readings)
    bound = quiet.bound(26)
    assert bound is not None and bound.factor == pytest.approx(1.95 / 0.9, rel=0.01)


def test_cores_no_session_accounts_for_stay_with_whoever_used_them():
    # the full box measured: the job 0.39 cores, two busy sessions 0.2 each, ~1.2 cores of short-lived processes (each
    # in a session of its own) that no reading counts: the job's session got 0.25 cores with 24 workers, not the
    # 0.67 of an equal share beside the two sessions seen
    readings = 5
    cores = p.CoreUse(
        (0.39,) * readings,
        (0.39,) * readings,
        cap=2.0,
        host_cores=2.0,
        sessions=((0.2, 0.2),) * readings,
        unattributed=(1.2,) * readings,
    )
    bound = cores.bound(26)
    assert bound is not None
    assert bound.low == pytest.approx(1.0)  # an equal share of the 0.8 cores left beside 2 sessions (0.27): the idle 0
    assert bound.factor * 0.39 == pytest.approx((0.39 * p.water_level(0.8, (0.2, 0.2))) ** 0.5)


def test_other_sessions_leave_out_the_jobs_own_and_what_no_session_accounts_for_is_counted_apart():
    from gputop.model import HostSample

    host = HostSample(cpu_percent=(100.0, 100.0), sessions=(7, 8, 9), session_cores=(0.5, 0.6, 0.5))
    assert p.other_sessions(host, {8}) == pytest.approx((0.5, 0.5))
    assert p.unattributed_cores(host) == pytest.approx(0.4)  # 2 cores busy, 1.6 in sessions
    assert p.other_sessions(host, set()) == ()  # the job's session not known: per process, as before
    assert p.other_sessions(HostSample(cpu_percent=(50.0,)), {8}) == ()  # autogroup off: no sessions read


def test_a_worker_runnable_most_of_the_time_computes_however_little_of_a_core_a_busy_box_gives_it():
    # a busy box gives the computing worker a third of a core; it waits for the rest runnable (R), not asleep (S)
    computing = {f.id: f for f in diagnose(build(_starved(worker_cpu=30.0, host_cpu=100.0, workers=1, worker_state="R")))}
    workers = computing["starvation"].figures["workers"]
    assert workers["bound"] == "cpu" and workers["num_workers"] <= 2  # 2 cores: not the 9-11 of an I/O-bound count
    sleeping = {f.id: f for f in diagnose(build(_starved(worker_cpu=30.0, host_cpu=100.0, workers=1, worker_state="S")))}
    assert sleeping["starvation"].figures["workers"]["bound"] == "io"


def test_cached_preprocessing_is_bounded_by_what_the_ranks_themselves_use_of_the_cores():
    # the GPUs are busy 20% (x5), and the ranks' own work uses 0.5 of the 2 cores they could have (x4): in turn, x1/0.45
    cores = p.CoreUse((1.9,) * 4, (2.0,) * 4, cap=2.0, host_cores=2.0, rank_used=(0.5,) * 4)
    forecast = p.predict_cheaper_input(share_of(800, 1000), share_of(800, 1000), "cached", cores)
    assert isinstance(forecast, p.Prediction) and forecast.limited_by == p.GPU_AND_HOST
    assert forecast.factor == pytest.approx(1 / (0.2 + 0.25)) and "ranks themselves" in forecast.limit.why
    alone = p.predict_cheaper_input(share_of(800, 1000), share_of(800, 1000), "cached")
    assert isinstance(alone, p.Prediction) and alone.limited_by == p.GPU_WORK and alone.factor == pytest.approx(5.0)

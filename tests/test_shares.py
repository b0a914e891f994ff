"""Shares with their intervals, the dense samples they are counted from, start-up left out, and the advice's
range (issue 21).  Pure functions over hand-built samples; the real py-spy runs are in
tests/test_state_sampler_jobs.py and tests/acceptance/test_numbers_hold_still.py."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import pytest

from gputop.analysis.advice import workers_for
from gputop.analysis.diagnosis import diagnose
from gputop.analysis.numbers import Share, effective_samples, mean_share, measured_share, share_of, wilson_interval
from gputop.analysis.observations import RankObs, dense_counts, pooled_counts
from gputop.analysis.stack_classes import COLLECTIVE, FORWARD_BACKWARD, IDLE_OTHER, IN_DATASET, OPTIMIZER_STEP, WAITING_FOR_DATA
from gputop.collect.state_sampler import (
    BACKGROUND,
    FOCUSED,
    MIN_RATE_HZ,
    STARTUP_GIVE_UP_S,
    StartupWatch,
    StateClassifier,
    parse_speedscope,
    rate_for,
    run_lengths,
)
from gputop.model import StateSamples
from gputop.report.jsonreport import report_data
from tests.harness.histories import RankSpec, Scenario, build, cycle, progress_of

NO_DRIVER = "no NVIDIA driver found (libnvidia-ml.so.1 not loadable)"

DATASET = {"name": "Samples.__getitem__", "file": "/job/train.py", "line": 40}
FETCH = {
    "name": "_MapDatasetFetcher.fetch",
    "file": "/usr/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py",
    "line": 52,
}
NEXT = {
    "name": "_BaseDataLoaderIter.__next__",
    "file": "/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py",
    "line": 733,
}
CALL = {"name": "Module._call_impl", "file": "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", "line": 1750}
MAIN = {"name": "<module>", "file": "/job/train.py", "line": 90}
BUILD = {"name": "build_model", "file": "/job/train.py", "line": 12}


def speedscope(profile_name: str, stacks: list[list[dict]]) -> str:
    """py-spy's speedscope JSON: shared frames, one sampled profile, each sample outermost first behind the
    "thread (TID): NAME" root that --threads adds."""
    frames: list[dict] = []

    def index(frame: dict) -> int:
        if frame not in frames:
            frames.append(frame)
        return frames.index(frame)

    root = {"name": "thread (4242): MainThread", "file": "", "line": 0}
    samples = [[index(root)] + [index(f) for f in stack] for stack in stacks]
    return json.dumps(
        {
            "$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": frames},
            "profiles": [
                {
                    "type": "sampled",
                    "name": profile_name,
                    "unit": "seconds",
                    "startValue": 0.0,
                    "endValue": len(samples) / 100,
                    "samples": samples,
                    "weights": [0.01] * len(samples),
                }
            ],
        }
    )


def stretch(runs, end=100.0, rate=100.0, pid=4242) -> StateSamples:
    total = sum(n for _, n in runs)
    return StateSamples(pid, end - total / rate, end, rate, runs=tuple(runs))


# ---------------------------------------------------------------- parsing py-spy's samples


def test_speedscope_samples_become_the_main_threads_states_in_order():
    text = speedscope(
        'Thread 4242 "MainThread"',
        [
            [MAIN, BUILD],  # start-up: building the model
            [MAIN, NEXT, FETCH, DATASET],  # num_workers=0: the rank runs the dataset itself
            [MAIN, NEXT, FETCH, DATASET],
            [MAIN, CALL],  # the step
        ],
    )
    states = parse_speedscope(text, 4242, StateClassifier(4242))
    assert states == [IDLE_OTHER, IN_DATASET, IN_DATASET, FORWARD_BACKWARD]
    assert run_lengths(states) == ((IDLE_OTHER, 1), (IN_DATASET, 2), (FORWARD_BACKWARD, 1))


def test_a_python_without_thread_names_is_found_by_its_tid():
    # 3.10 targets: py-spy names the thread by its id only; the main thread's TID is the PID
    text = speedscope("Thread 4242", [[MAIN, NEXT]])
    assert parse_speedscope(text, 4242, StateClassifier(4242)) == [WAITING_FOR_DATA]
    assert parse_speedscope(speedscope("Thread 777", [[MAIN, NEXT]]), 4242, StateClassifier(4242)) == []


def test_the_sampling_budget_is_shared_among_the_ranks():
    fast = dict(cost_per_sample_s=0.00012, usable_cores=64)  # a sample's cost measured on a fast 64-core box
    assert rate_for(1, FOCUSED, **fast) == 500 and rate_for(8, FOCUSED, **fast) == 250
    assert rate_for(1000, FOCUSED, **fast) == MIN_RATE_HZ
    assert rate_for(1, BACKGROUND, **fast) == 10 and rate_for(16, BACKGROUND, **fast) == 6


def test_the_sampling_rate_keeps_py_spys_cpu_within_the_budget():
    # a VM where a sample costs 0.7 ms: on 2 cores a report gets a tenth of a core (142 Hz), not 500 Hz's 0.35
    assert rate_for(1, FOCUSED, cost_per_sample_s=0.0007, usable_cores=2) == 142
    assert rate_for(4, FOCUSED, cost_per_sample_s=0.0007, usable_cores=2) == 35
    # the same VM with 32 cores may spend 5% of them: 1.6 cores, the rate's own cap binds first
    assert rate_for(1, FOCUSED, cost_per_sample_s=0.0007, usable_cores=32) == 500
    # the screen's budget on 2 cores: 0.03 of a core, 42 samples a second over 8 ranks
    assert rate_for(8, BACKGROUND, cost_per_sample_s=0.0007, usable_cores=2) == 5
    assert rate_for(2, BACKGROUND, cost_per_sample_s=0.0007, usable_cores=2) == 10
    # never under MIN_RATE_HZ, however dear a sample
    assert rate_for(1, FOCUSED, cost_per_sample_s=1.0, usable_cores=1) == MIN_RATE_HZ


# ---------------------------------------------------------------- intervals


def test_wilson_interval_matches_the_textbook_values():
    # Wilson 95% for 8/10: 0.490-0.943 (Newcombe 1998, table I); 0/10: 0-0.278
    low, high = wilson_interval(0.8, 10)
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)
    low, high = wilson_interval(0.0, 10)
    assert low == 0.0 and round(high, 3) == 0.278


def test_samples_that_repeat_each_other_count_for_less():
    # 6,000 samples in runs of ~43 (a rank waiting 80 ms at a time, sampled at 500 Hz): ~280 switches
    assert 1000 < effective_samples(5550, 6000, 280) < 1400
    # independent samples switch ~2p(1-p)n times: worth all of them
    assert effective_samples(5550, 6000, 832) == pytest.approx(6000, rel=0.01)
    # dumps seconds apart (order unknown): independent
    assert effective_samples(5550, 6000, None) == 6000
    wide, narrow = share_of(5550, 6000, 280), share_of(5550, 6000, None)
    assert wide.low < narrow.low < 0.925 < narrow.high < wide.high


def test_the_interval_covers_the_true_share_of_a_markov_source_about_95_percent_of_the_time():
    # a two-state chain that stays in its state 95% of the time, true share 0.7: the autocorrelation-aware
    # interval should cover 0.7 in ~95% of 400 runs of 2,000 samples; the naive one far less
    rng = random.Random(7)
    stay = 0.95
    leave_in, leave_out = (1 - stay), (1 - stay) * 0.7 / 0.3  # stationary share 0.7
    covered = naive = 0
    for _ in range(400):
        inside = rng.random() < 0.7
        states = []
        for _ in range(2000):
            states.append(WAITING_FOR_DATA if inside else FORWARD_BACKWARD)
            if rng.random() < (leave_in if inside else leave_out):
                inside = not inside
        counts = dense_counts([stretch(run_lengths(states), rate=500.0)], None, None, False)
        s = counts.share(WAITING_FOR_DATA)
        covered += s.low <= 0.7 <= s.high
        n = share_of(s.hits, s.n)
        naive += n.low <= 0.7 <= n.high
    assert covered >= 0.9 * 400, covered
    assert naive < 0.6 * 400, naive


def test_share_text_and_round_trip():
    s = share_of(62, 100)
    assert s.text() == "62% (52–71%)"
    assert Share.from_dict(json.loads(json.dumps(s.to_dict()))).text() == s.text()
    assert measured_share(0.5, 56, "timed batches").text() == "50%"
    assert share_of(0, 200).text() == "0% (0–2%)"
    gpu = mean_share([0.8, 0.9, 0.85, 0.85], "NVML")
    assert gpu is not None and gpu.low < 0.85 < gpu.high and mean_share([], "NVML") is None


# ---------------------------------------------------------------- dense counts, windows and start-up


def test_dense_counts_leave_out_start_up_and_what_is_before_the_window():
    s = stretch([(IDLE_OTHER, 50), (FORWARD_BACKWARD, 10), (IN_DATASET, 40)], end=10.0, rate=10.0)  # t = 0..9.9
    everything = dense_counts([s], None, None, False)
    assert everything.n == 100 and everything.startup_left_out == 0
    loop = dense_counts([s], None, 5.0, False)  # the first step at t=5
    assert loop.n == 50 and loop.startup_left_out == 50 and loop.counts[IDLE_OTHER] == 0
    window = dense_counts([s], 7.0, 5.0, False)  # the window starts after the loop did: nothing is start-up
    assert window.n == 30 and window.startup_left_out == 0 and dict(window.counts) == {IN_DATASET: 30}
    starting = dense_counts([s], None, None, True)
    assert starting.n == 0 and starting.startup_left_out == 100


def test_a_rank_still_starting_up_is_not_measured_and_its_dumps_are_left_out_too():
    rank = RankObs(pid=1, starting_up=True, stretches=[stretch([(IN_DATASET, 900)])])
    assert not rank.measured and rank.counts.startup_left_out == 900
    rank = RankObs(pid=1, stretches=[stretch([(IN_DATASET, 900), (FORWARD_BACKWARD, 100)])], loop_started=None)
    assert rank.measured and rank.input_share.point == 0.9 and rank.counts.source == "py-spy record at 100 Hz"


def test_pooled_counts_add_the_ranks_samples():
    a = RankObs(pid=1, stretches=[stretch([(IN_DATASET, 800), (FORWARD_BACKWARD, 200)], pid=1)])
    b = RankObs(pid=2, stretches=[stretch([(IN_DATASET, 600), (FORWARD_BACKWARD, 400)], pid=2)])
    pooled = pooled_counts([a, b])
    assert pooled.n == 2000 and pooled.share(IN_DATASET).point == 0.7 and pooled.source == "py-spy record at 100 Hz"


def test_the_loop_starts_at_the_first_step_not_the_first_wait_for_data():
    clock = [0.0]
    watch = StartupWatch(clock=lambda: clock[0])
    # importing, then waiting for the first batch (the workers start): still start-up
    watch.saw_stretch(stretch([(IDLE_OTHER, 300), (WAITING_FOR_DATA, 200)], end=5.0))
    assert watch.status(4242) == (True, None)
    # the first optimizer step at t=5 + 1.0 s
    watch.saw_stretch(stretch([(WAITING_FOR_DATA, 100), (OPTIMIZER_STEP, 5), (IN_DATASET, 395)], end=10.0))
    assert watch.status(4242) == (False, pytest.approx(6.0))
    # a dump can say so first, once the rank was seen fetching
    watch.saw_dump(7, 2.0, WAITING_FOR_DATA)
    watch.saw_dump(7, 3.0, FORWARD_BACKWARD)
    assert watch.status(7) == (False, 3.0)
    # a warm-up forward before any fetch is set-up, not the loop
    watch.saw_dump(8, 1.0, FORWARD_BACKWARD)
    assert watch.status(8) == (True, None)
    watch.saw_dump(8, 4.0, IN_DATASET)
    watch.saw_dump(8, 5.0, OPTIMIZER_STEP)
    assert watch.status(8) == (False, 5.0)


def test_a_loop_never_recognised_stops_counting_as_start_up_after_a_minute():
    clock = [0.0]
    watch = StartupWatch(clock=lambda: clock[0])
    watch.saw_dump(9, 0.0, IDLE_OTHER)
    watch.saw_dump(9, 2.0, WAITING_FOR_DATA)
    assert watch.status(9) == (True, None)
    clock[0] = STARTUP_GIVE_UP_S + 1
    assert watch.status(9) == (False, 2.0)  # from its first wait for data on


def test_a_start_up_that_outlasts_the_watch_is_not_counted_from_an_early_fetch():
    """The single-gpu demo on a busy box: a fetch seen 10 s into a start-up that then imported and waited in the
    rendezvous for 50 s more.  Given up on at 60 s, the rank's loop is taken to begin then, not at the early fetch
    (which made 50 s of start-up at 0% read as a silent misfire)."""
    clock = [0.0]
    watch = StartupWatch(clock=lambda: clock[0])
    watch.saw_dump(9, 0.0, IDLE_OTHER)
    watch.saw_dump(9, 10.0, WAITING_FOR_DATA)
    watch.saw_dump(9, 12.0, IDLE_OTHER)
    watch.saw_dump(9, 58.0, IDLE_OTHER)
    clock[0] = STARTUP_GIVE_UP_S + 1
    assert watch.status(9) == (False, STARTUP_GIVE_UP_S + 1)


# ---------------------------------------------------------------- the advice's range


@pytest.mark.parametrize(
    "share,current,expected",
    [
        (0.8, 0, 5),  # 0.8 / 0.2 × 1.25 = 5
        (0.5, 0, 2),  # 1 × 1.25 → 2
        (0.8, 2, 13),  # 2 / 0.2 × 1.25 = 12.5 → 13
        (0.995, 0, None),  # the step share under 1%: nothing to divide by
    ],
)
def test_workers_for_follows_the_loader_arithmetic(share, current, expected):
    assert workers_for(share, current) == expected


# ---------------------------------------------------------------- in the diagnosis


def by_id(findings, finding_id):
    return next(f for f in findings if f.id == finding_id)


def _rank_spec(i, dense, loop_at):
    """Rank i, densely sampled as `dense(t)` says; its dumps alternate (a live loop, not a hang)."""
    return RankSpec(
        pid=1000 + i,
        rank=i,
        gpus=(i,),
        state=cycle([IN_DATASET, FORWARD_BACKWARD]),
        dense=dense,
        cpu=lambda t: 5.0,
        loop_at=loop_at,
        progress=lambda t, pid=1000 + i: progress_of(pid, t, switches_per_s=20.0, cpu_share=0.3),
    )


def _dense_job(runs, *, loop_at=None, seconds=59.0, gpu_error=NO_DRIVER, ranks=2):
    # the shares come from the dense samples alone
    dense = runs if callable(runs) else (lambda t: runs)
    return build(Scenario(seconds=seconds, gpu_error=gpu_error, ranks=[_rank_spec(i, dense, loop_at) for i in range(ranks)]))


def test_the_step_hardly_ever_caught_gives_a_one_sided_count():
    # 15 s of one rank in dataset code 95% of the time, the step caught in 4 long runs: the interval on the
    # step share reaches under 1.5%, where the count passes anything advised (32): only its lower end holds
    f = by_id(
        diagnose(_dense_job([(IN_DATASET, 475), (FORWARD_BACKWARD, 25)] * 2, gpu_error=None, seconds=15.0, ranks=1)), "starvation"
    )
    workers = f.figures["workers"]
    assert workers["one_sided"] and workers["high"] is None and workers["estimate"] is None and not workers["capped"]
    assert workers["num_workers"] == workers["low"] == 8
    assert f.fix.startswith("raise num_workers to at least 8 (the step was hardly ever caught; `b` measures it)")
    assert "num_workers=8" in f.fix  # the code says the lower bound
    assert f.figures["input_share"]["of"] == 3 * 1000  # 3 stretches in 15 s


def test_every_share_in_the_finding_and_the_report_carries_its_interval():
    hist = _dense_job([(IN_DATASET, 70), (FORWARD_BACKWARD, 30)] * 10)
    f = by_id(diagnose(hist), "starvation")
    share = f.figures["input_share"]
    assert share["share"] == 0.7 and share["low"] < 0.7 < share["high"] and share["of"] == 22_000
    assert share["source"] == "py-spy record at 200 Hz"
    assert "70% (" in f.summary and "over the last 60 s" in "\n".join(f.evidence)
    workers = f.figures["workers"]  # 0.7 / 0.3 × 1.25 = 2.9 → 3, at both ends of the interval too
    assert not workers["one_sided"] and workers["low"] <= workers["estimate"] <= workers["high"]
    data = report_data(hist, diagnose(hist, window=None))
    for rank in data["job"]["ranks"]:
        assert rank["samples"] == 11 * 1000 and rank["sampling"] == "py-spy record at 200 Hz"
        for state, s in rank["shares"].items():
            assert {"share", "low", "high", "samples", "of", "effective_samples", "confidence"} <= set(s), state
            assert s["low"] <= s["share"] <= s["high"] and s["of"] == rank["samples"]


def test_start_up_does_not_dilute_the_first_verdict():
    # 20 s of start-up (imports, model build: idle/other), then the loop waits for data 60% of the time;
    # at 30 s the verdict must already say "highly" with the loop's share, not one diluted by start-up
    def runs(t):
        return [(IDLE_OTHER, 1000)] if t <= 20 else [(IN_DATASET, 60), (FORWARD_BACKWARD, 40)] * 10

    def share_at(seconds):
        hist = _dense_job(runs, loop_at=20.0, seconds=seconds)
        return by_id(diagnose(hist), "starvation")

    early, late = share_at(30.0), share_at(120.0)
    assert "highly" in early.summary and "highly" in late.summary
    assert abs(early.figures["input_share"]["share"] - late.figures["input_share"]["share"]) <= 0.10
    assert early.figures["input_share"]["share"] == pytest.approx(0.6)
    assert any("start-up left out" in line for line in early.evidence)


def _ranks_starting_at(loops, seconds):
    """Two ranks of a job that waits for data 60% of the time; rank i's loop begins at loops[i] seconds."""

    def dense(t, loop):
        return [(IDLE_OTHER, 1000)] if t <= loop else [(IN_DATASET, 60), (FORWARD_BACKWARD, 40)] * 10

    specs = [_rank_spec(i, lambda t, loop=loop: dense(t, loop), loop) for i, loop in enumerate(loops)]
    return build(Scenario(seconds=seconds, gpu_error=NO_DRIVER, ranks=specs))


def test_the_first_verdict_waits_for_a_rank_whose_loop_just_began():
    """Rank 0 has trained for 10 s, rank 1 began 2 s ago: the job's share would be rank 0's alone (the starved
    demo's first 4 s of one rank read 0.27 where the job waits 0.67), so the verdict says it is collecting,
    not healthy and not yet starved; once rank 1 has its 4 s the two are pooled."""
    early = diagnose(_ranks_starting_at((20.0, 28.0), seconds=30.0))
    assert early[0].id == "collecting" and not [f for f in early if f.id == "starvation"], early[0].summary
    assert early[0].summary.startswith("Collecting samples: 2.0/4 s"), early[0].summary
    later = by_id(diagnose(_ranks_starting_at((20.0, 28.0), seconds=40.0)), "starvation")
    assert "highly" in later.summary and later.figures["input_share"]["share"] == pytest.approx(0.6)


def test_ranks_waiting_in_their_first_collective_for_a_late_rank_do_not_dilute_the_job_share():
    """Issue 38's CI failure: three ranks began stepping at 10 s and waited in their first all-reduce for the
    fourth, still importing until 40 s; the pooled share read 22% where every rank waits for data 60% of the
    time.  While the fourth is seen starting up there is no verdict; once it steps, the job's share counts
    from its start and is the steady one, the first time and a window later."""

    def dense(t, loop, rank):
        if t <= loop:
            return [(IDLE_OTHER, 1000)]
        if t <= 40.0:  # stepping, but every step waits for the late rank
            return [(IN_DATASET, 60), (COLLECTIVE, 940)]
        return [(IN_DATASET, 60), (FORWARD_BACKWARD, 40)] * 10

    loops = (10.0, 10.0, 10.0, 40.0)
    specs = [_rank_spec(i, lambda t, loop=loop, i=i: dense(t, loop, i), loop) for i, loop in enumerate(loops)]

    def diagnosed(seconds):
        return diagnose(build(Scenario(seconds=seconds, gpu_error=NO_DRIVER, ranks=specs)))

    waiting = diagnosed(35.0)
    assert not [f for f in waiting if f.id == "starvation"] and waiting[0].id == "collecting", waiting[0].summary
    first, later = by_id(diagnosed(50.0), "starvation"), by_id(diagnosed(120.0), "starvation")
    assert first.figures["input_share"]["share"] == pytest.approx(0.6)
    assert abs(first.figures["input_share"]["share"] - later.figures["input_share"]["share"]) <= 0.10


def test_starting_up_is_said_until_the_first_step():
    hist = _dense_job([(IDLE_OTHER, 1000)], loop_at=100.0, seconds=30.0)
    top = diagnose(hist)[0]
    assert top.id == "collecting" and top.title == "Starting up" and top.summary.startswith("Starting up")


def test_a_dump_that_reports_a_step_first_does_not_hide_the_stretchs_earlier_steps():
    # the dump at t=9 arrives before the stretch covering t=5..10 ends; that stretch's first step is at 6
    watch = StartupWatch(clock=lambda: 10.0)
    watch.saw_dump(4242, 1.0, WAITING_FOR_DATA)
    watch.saw_dump(4242, 9.0, FORWARD_BACKWARD)
    watch.saw_stretch(stretch([(WAITING_FOR_DATA, 100), (OPTIMIZER_STEP, 5), (IN_DATASET, 395)], end=10.0))
    assert watch.status(4242) == (False, pytest.approx(6.0))


def test_a_steady_share_in_dense_samples_is_no_pause_but_one_stretch_of_waiting_is():
    from gputop.analysis.checks.input import input_phase

    # 66% input spread through every second: continuous starvation, not one pause
    steady = RankObs(
        pid=1, stretches=[stretch([(IN_DATASET, 66), (FORWARD_BACKWARD, 34)] * 5, end=5.0 * k, rate=100.0) for k in range(1, 13)]
    )
    assert input_phase(steady) is None

    # fed for 30 s, then 10 s waiting, then fed again: one pause of ~10 s
    def runs(k):
        return [(IN_DATASET, 500)] if k in (7, 8) else [(FORWARD_BACKWARD, 500)]

    paused = RankObs(pid=1, stretches=[stretch(runs(k), end=5.0 * k, rate=100.0) for k in range(1, 13)])
    phase = input_phase(paused)
    assert phase is not None and 9.0 <= phase[1] <= 11.0 and phase[2] == 0.0


def test_a_steady_share_under_half_with_one_second_over_it_is_no_pause():
    """44% input in every second and one second at 60%: that second is the one "mostly input" second, but the
    samples around it wait 44% of the time, so the rank starves throughout (on a loaded 2-core box a
    transformers job read "healthy" in 3 of 10 reports this way: its one busy second was taken for a pause)."""
    from gputop.analysis.checks.input import input_phase

    def runs(k):
        return (
            [(WAITING_FOR_DATA, 60), (FORWARD_BACKWARD, 40)] * 5
            if k == 6
            else [(WAITING_FOR_DATA, 44), (FORWARD_BACKWARD, 56)] * 5
        )

    rank = RankObs(pid=1, stretches=[stretch(runs(k), end=5.0 * k, rate=100.0) for k in range(1, 13)])
    assert input_phase(rank) is None
    hist = _dense_job(
        lambda t: (
            [(WAITING_FOR_DATA, 60), (FORWARD_BACKWARD, 40)] * 5
            if 30 < t <= 31
            else [(WAITING_FOR_DATA, 44), (FORWARD_BACKWARD, 56)] * 5
        ),
        seconds=60.0,
    )
    found = by_id(diagnose(hist), "starvation")
    assert found.severity == "critical" and "highly" in found.summary, found.summary


# ---------------------------------------------------------------- asking twice


def test_a_second_look_keeps_the_count_advised_before_while_the_interval_holds_it_or_misses_it_by_one():
    # 70% (63–76%) input: the point gives 0.7 / 0.3 × 1.25 = 2.9 → 3, the interval 3–4
    hist = _dense_job([(IN_DATASET, 70), (FORWARD_BACKWARD, 30)] * 10, seconds=20.0)
    memory: dict[str, int] = {}
    first = by_id(diagnose(hist, memory=memory), "starvation").figures["workers"]
    assert (first["num_workers"], first["low"], first["high"], first["advised_before"]) == (3, 3, 4, False)
    (key,) = memory
    assert memory[key] == 3 and key == "100@0.00"  # the launcher's PID and start time

    memory[key] = 4  # an earlier look, whose share sat just above the step, advised 4: it stands
    kept = by_id(diagnose(hist, memory=memory), "starvation")
    workers = kept.figures["workers"]
    assert (workers["num_workers"], workers["estimate"], workers["point_estimate"], workers["advised_before"]) == (4, 4, 3, True)
    assert kept.fix.startswith("raise num_workers ≈ 4 (3–4)") and "num_workers=4," in kept.fix
    assert "this window's point alone gives 3 (3–4), and 4, advised before for this job, is inside the interval" in kept.fix
    assert memory[key] == 4

    # one count beyond this window's interval: the job's drift between looks, which the interval does not cover
    # (at 2-3 workers one count is x1.5); the advice stands and the stated range takes it in
    memory[key] = 5
    drifted = by_id(diagnose(hist, memory=memory), "starvation")
    workers = drifted.figures["workers"]
    assert (workers["num_workers"], workers["low"], workers["high"], workers["point_estimate"]) == (5, 3, 5, 3)
    assert drifted.fix.startswith("raise num_workers ≈ 5 (3–5)")
    assert (
        "this window's point alone gives 3 (3–4), and 5, advised before for this job, is one count from the interval"
        in drifted.fix
    )
    memory[key] = 2
    below = by_id(diagnose(hist, memory=memory), "starvation").figures["workers"]
    assert (below["num_workers"], below["low"], below["high"], below["advised_before"]) == (2, 2, 4, True)

    for far in (1, 6):  # two counts or more outside: the data moved, the advice follows them
        memory[key] = far
        moved = by_id(diagnose(hist, memory=memory), "starvation").figures["workers"]
        assert (moved["num_workers"], moved["advised_before"]) == (3, False) and memory[key] == 3


def test_at_least_and_capped_counts_are_not_remembered():
    memory: dict[str, int] = {}
    one_sided = _dense_job([(IN_DATASET, 475), (FORWARD_BACKWARD, 25)] * 2, gpu_error=None, seconds=15.0, ranks=1)
    assert by_id(diagnose(one_sided, memory=memory), "starvation").figures["workers"]["one_sided"]
    assert memory == {}


def test_the_advice_memory_survives_the_process_and_bad_files(tmp_path):
    from gputop.advice_memory import KEEP_S, AdviceMemory

    path = tmp_path / "state" / "advice.json"
    first = AdviceMemory(str(path))
    assert first.get("1@2.00") is None
    first["1@2.00"] = 4
    assert AdviceMemory(str(path))["1@2.00"] == 4  # another process (a second `gputop report`) reads it
    assert not [p for p in path.parent.iterdir() if p.name != "advice.json"]  # no temporary file left

    path.write_text(
        json.dumps({"1@2.00": {"workers": 4, "at": time.time() - KEEP_S - 1}, "3@4.00": {"workers": 5, "at": time.time()}})
    )
    assert dict(AdviceMemory(str(path))) == {"3@4.00": 5}  # over a week old: dropped
    path.write_text("{not json")
    broken = AdviceMemory(str(path))
    assert len(broken) == 0
    broken["1@2.00"] = 3  # a corrupt file is replaced, not a failed report
    assert AdviceMemory(str(path))["1@2.00"] == 3

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    nowhere = AdviceMemory(str(blocked / "gputop" / "advice.json"))  # its folder cannot be made (even as root)
    nowhere["1@2.00"] = 6
    assert nowhere["1@2.00"] == 6  # kept for this process's life


def test_a_long_lived_advice_memory_sees_what_another_process_wrote_and_drops_none_of_it(tmp_path):
    """The TUI's memory lives for hours beside `gputop report` runs: it reads the file again when it changed,
    so the screen advises what the last report did, and its own writes keep the report's entries."""
    from gputop.advice_memory import AdviceMemory

    path = str(tmp_path / "advice.json")
    screen, report = AdviceMemory(path), AdviceMemory(path)
    screen["1@2.00"] = 4
    assert report["1@2.00"] == 4
    report["1@2.00"] = 5  # a later report's window no longer held 4
    report["7@8.00"] = 2  # ... and one on another job
    assert screen["1@2.00"] == 5  # the screen follows, not its own 4
    screen["9@9.00"] = 3
    assert dict(AdviceMemory(path)) == {"1@2.00": 5, "7@8.00": 2, "9@9.00": 3}  # nobody's entry dropped


# Two processes writing their own jobs' advice at once, each write a read-merge-rename: without the lock on the
# folder, a write that read the file before the other's rename drops the other's newest entry.
CONCURRENT_WRITER = """
import sys
from gputop.advice_memory import AdviceMemory
memory = AdviceMemory(sys.argv[1])
for i in range(60):
    memory[f"{sys.argv[2]}{i}@1.00"] = 1 + i % 7
"""


@pytest.mark.integration  # two real processes
def test_two_processes_writing_at_once_lose_no_entry(tmp_path):
    path = str(tmp_path / "advice.json")
    writers = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT_WRITER, path, prefix], stderr=subprocess.PIPE) for prefix in ("1", "2")
    ]
    try:
        for writer in writers:
            _, err = writer.communicate(timeout=60)
            assert writer.returncode == 0, err.decode()
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
    from gputop.advice_memory import AdviceMemory

    assert len(AdviceMemory(path)) == 120

"""`gputop demo --scenario case-study`: the article's four stages, their costs, and how a stage's verdict is named
and settles.  The live run (four real jobs one after another) is the slow test at the end."""

from __future__ import annotations

import argparse
import json
import subprocess

import pytest

from gputop.commands import case_study
from gputop.model import Finding
from gputop.sim import scenarios
from tests.harness.box_load import BoxLoad

STEADY_REST_CORES = 0.25  # how far the rest of the box may move between stages 1 and 2 for stage 2's bar to apply


def _finding(finding_id: str, severity: str = "warning") -> Finding:
    return Finding(
        id=finding_id, title=finding_id, severity=severity, confidence=0.9, label="", summary=finding_id, fix="do it\ncode"
    )


def test_the_four_stages_are_the_articles_rows():
    first, second, third, fourth = (s.config for s in case_study.stages(8, 2.0))
    assert (first.num_workers, first.cached, first.precision) == (0, False, "fp32")
    assert (second.num_workers, second.prefetch_factor, second.pin_memory, second.persistent_workers) == (12, 4, True, True)
    assert third.cached and not second.cached and third.kernels == "unfused"
    assert (fourth.precision, fourth.kernels, fourth.cached) == ("bf16", "gemm", True)


@pytest.mark.parametrize("ranks, cores", [(8, 2.0), (2, 2.0), (8, 16.0)])
def test_the_costs_give_the_articles_step_times(ranks, cores):
    first, second, third, fourth = (s.config for s in case_study.stages(ranks, cores))
    step = third.step_ms
    decode = first.sample_cpu_ms
    # stage 1: a rank prepares its batch itself, storage latency and CPU: 72/22 of a GPU step
    assert first.batch_size * (first.storage_ms + decode + first.augment_ms) == pytest.approx(step * 72 / 22, rel=0.01)
    # stage 2: every rank's workers share the cores: a batch a rank every 31/22 of a step
    cpu_per_batch = second.batch_size * (decode + second.augment_ms)
    assert ranks * cpu_per_batch / cores == pytest.approx(step * 31 / 22, rel=0.01)
    assert fourth.step_ms == pytest.approx(step * 18 / 22, rel=0.01)


def test_a_stage_config_travels_to_the_ranks_whole():
    parser = argparse.ArgumentParser()
    scenarios.DemoConfig.add_arguments(parser)
    for stage in case_study.stages(2, 2.0):
        assert scenarios.DemoConfig.from_namespace(parser.parse_args(stage.config.to_argv())) == stage.config


@pytest.mark.parametrize(
    "found, words, finding_id",
    [
        ([_finding("starvation", "critical"), _finding("no_tensor_cores", "info")], "CPU data loading", "starvation"),
        ([_finding("starvation", "critical"), _finding("cpu_bound")], "CPU preprocessing", "cpu_bound"),
        ([_finding("memory_bound"), _finding("no_tensor_cores", "info")], "memory bandwidth", "memory_bound"),
        ([_finding("healthy", "info"), _finding("cpu_bound", "info")], case_study.HEALTHY, "healthy"),
        ([_finding("hang", "critical")], "hang", "hang"),  # no row of the article: the diagnosis' own words
        ([_finding("collecting", "info"), _finding("cpu_bound", "info")], case_study.COLLECTING, "collecting"),
    ],
)
def test_the_bottleneck_is_read_from_the_findings(found, words, finding_id):
    named, finding = case_study.bottleneck(found)
    assert (named, finding.id) == (words, finding_id)


def test_a_verdict_settles_when_it_holds_for_a_few_polls():
    steady = ["CPU data loading"] * case_study.SETTLE_POLLS
    assert case_study.settled(steady, case_study.MIN_STAGE_S)
    assert not case_study.settled(steady, case_study.MIN_STAGE_S - 1)  # too early: stacks and GPM need a window
    assert not case_study.settled(["healthy"] + steady[1:], case_study.MIN_STAGE_S)
    # a slow box still collecting stacks after MIN_STAGE_S has no verdict yet, not a healthy one
    assert not case_study.settled([case_study.COLLECTING] * 50, case_study.MAX_STAGE_S - 1)


def test_a_check_names_what_the_cores_bound_assumed_and_the_next_window_measured_otherwise():
    before = {"cpu_s_per_step": 0.2861, "rest_cores": 0.123}
    assert case_study.assumptions_moved(before, {"cpu_s_per_step": 0.30, "rest_cores": 0.30}) == []  # +5%, +0.18 cores
    assert case_study.assumptions_moved(before, {"cpu_s_per_step": 0.3467, "rest_cores": 0.202}) == [
        "the job's CPU a step rose 21% (0.286 → 0.347 CPU-s)"
    ]
    assert case_study.assumptions_moved(
        {"cpu_s_per_step": 0.3, "rest_cores": 1.5}, {"cpu_s_per_step": 0.2, "rest_cores": 0.5}
    ) == [
        "the job's CPU a step fell 33% (0.300 → 0.200 CPU-s)",
        "the rest of the box left cores (1.50 → 0.50)",
    ]
    assert case_study.assumptions_moved(None, {"cpu_s_per_step": 0.3}) == []  # nothing measured before: nothing to say
    assert case_study.assumptions_moved({"rest_cores": None}, {"rest_cores": 0.9}) == []


# Stage 2 is CPU-bound: the cores it gets are its bound, and stage 1's prediction of it reads the rest of the box in
# both.  So the first two stages run alone; stages 3 and 4 (0.1-0.17 cores, their steps bound by the simulated GPU;
# ratios 0.95-1.06 over ci20-ci26) as an acceptance test, with one shared test beside them (`lower_turn`).
@pytest.mark.acceptance  # four live jobs, one after another
@pytest.mark.slow
@pytest.mark.alone(then_acceptance=True)
def test_the_case_study_gives_the_four_verdicts_in_order_and_rising_steps(spawn, tmp_path, lower_turn):
    """Four real jobs (2 ranks each, to fit the box), one after another; one JSON object per stage."""
    box = BoxLoad()
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err_file:
        proc = spawn.python(
            ["-m", "gputop", "demo", "--scenario", "case-study", "--no-tui", "--json", "--gpus", "2"],
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
        )
    rows = []
    for line in proc.stdout:  # each stage's JSON as the stage ends
        if line.startswith("{"):
            rows.append(json.loads(line))
            if rows[-1]["stage"] == 2:
                lower_turn()
    assert proc.wait(timeout=1200) == 0, err_path.read_text()[-2000:]
    assert [r["stage"] for r in rows] == [1, 2, 3, 4]
    verdicts = [r["verdict"] for r in rows]
    assert verdicts == ["CPU data loading", "CPU preprocessing", "memory bandwidth", case_study.HEALTHY], (rows, box.since())
    assert all(set(r) >= {"stage", "steps_per_s", "verdict", "finding", "fix"} for r in rows)
    steps = [r["steps_per_s"] for r in rows]
    assert steps == sorted(steps) and steps[0] < steps[-1], steps
    # each stage after the first was predicted by the one before, from its own measurements (issue 37)
    assert rows[0]["predicted"] is None
    ratios = [r["achieved_over_predicted"] for r in rows[1:]]
    print(f"\nachieved / predicted, stages 2-4: {ratios}; {box.since()}")
    assert all(r is not None for r in ratios), (ratios, [r["predicted"] for r in rows[1:]])
    # Stages 3-4 within issue 37's band.  Stage 2's prediction is bounded by the cores the job can get beside the rest
    # of the box (other sessions, gputop, short-lived processes) and holds while that rest uses what it used in stage
    # 1.  Measured: the job's CPU a step held (within 5%) and the ratio followed the rest (0.86-1.05 with it steady
    # and under a core; 0.71-0.88 when it grew 0.17-0.43 cores; 3.96 when it shrank 1 core); on a full box 0.76 with
    # the rest steady, 0.41, and 0.81 once the cores no session accounts for were kept apart (the CPU a step then rose
    # 29%) (docs/predictions.md).  So stage 2 is held to the band where its assumption held: the rest of the box used
    # under a core in stage 1 and moved by at most STEADY_REST_CORES; otherwise the test says what the rest did.
    loads = [(r["stage"], r["load"], r["cores_used"], r["measured"]) for r in rows]  # what each stage measured
    (tmp_path / "stages.json").write_text(json.dumps(rows))  # kept with the run's basetemp, for a look afterwards
    rest = [(r["measured"] or {}).get("rest_cores") for r in rows[:2]]
    print(f"stage 2: the rest of the box used {rest[0]} cores in stage 1, {rest[1]} in stage 2")
    held = None not in rest and rest[0] < 1.0 and abs(rest[1] - rest[0]) <= STEADY_REST_CORES
    bars = ratios if held else ratios[1:]
    print(f"stage 2 {'held to the band' if held else 'not held to it: the rest of the box did not stay as it was'}")
    # The cores bound also assumes the job's CPU a step stays; on this 2-core VM it rose 10-21% from stage 1 (0.6
    # cores) to stage 2 (1.8: each core slower with both busy), and the ratio with it (0.78 at +21%).  Where it moved,
    # the check must say so (`assumptions_moved`), and the model is held to the band on what was measured: the ratio
    # times the CPU a step's change (the cores bound scales with it).
    cpu = [(r["measured"] or {}).get("cpu_s_per_step") for r in rows[:2]]
    moved = rows[1]["assumptions_moved"]
    print(f"stage 2: the job's CPU a step {cpu[0]} → {cpu[1]}; the check named as moved: {moved}")
    if held and None not in cpu and abs(cpu[1] / cpu[0] - 1) > case_study.CPU_PER_STEP_MOVED:
        assert any("CPU a step" in m for m in moved), (moved, cpu)
        bars = [ratios[0] * cpu[1] / cpu[0], *ratios[1:]]
    assert all(0.8 <= r <= 1.25 for r in bars), (ratios, bars, rest, cpu, loads, [r["predicted"] for r in rows[1:]], box.since())


def test_a_stage_shows_the_prediction_the_stage_before_made_for_it():
    from gputop.analysis.numbers import share_of
    from gputop.analysis.prediction import StepRate, predict_workers

    first, second = case_study.stages(2, 2.0)[:2]
    assert second.change == ("workers", case_study.ARTICLE_WORKERS) and first.change == ("", 0)
    forecast = predict_workers(0, 12, share_of(800, 1000), cpu_bound=False, cores=None).with_rate(StepRate(0.8, "counters"))
    before = case_study.StageResult(first, 0.8, "CPU data loading", _finding("starvation"), "", True, 20.0, forecast)
    after = case_study.StageResult(second, 3.6, "CPU preprocessing", _finding("cpu_bound"), "", True, 20.0)
    record = after.json(before)
    assert record["predicted"]["steps_per_s_after"] == pytest.approx(4.0)  # x5 the 0.8: the step's compute
    assert record["achieved_over_predicted"] == pytest.approx(0.9)
    assert before.json(None)["predicted"] is None and before.json(None)["achieved_over_predicted"] is None


def test_the_header_shows_each_stage_against_the_prediction_made_for_it():
    from types import SimpleNamespace

    from gputop.analysis.numbers import share_of
    from gputop.analysis.prediction import StepRate, predict_workers

    first, second = case_study.stages(2, 2.0)[:2]
    forecast = predict_workers(0, 12, share_of(800, 1000), cpu_bound=False, cores=None).with_rate(StepRate(0.8, "counters"))
    results = [
        case_study.StageResult(first, 0.8, "CPU data loading", _finding("starvation"), "", True, 20.0, forecast),
        case_study.StageResult(second, 3.6, "CPU preprocessing", _finding("cpu_bound"), "", True, 20.0),
    ]
    study = SimpleNamespace(results=results, pipeline=SimpleNamespace(machine=None), stages=[first, second])
    source = case_study.CaseStudySource(study)  # type: ignore[arg-type]
    assert source._narrate(None) == (
        "case study done │ 1: 0.80 steps/s, CPU data loading · 2: 3.60 steps/s (predicted 4.00, ×0.9), CPU preprocessing"
    )


def test_one_machine_follows_the_jobs_and_its_gpm_counters_only_climb():
    from gputop.sim.load import FollowingLoad

    class Board:
        def __init__(self, util: float, counted: float) -> None:
            self.util, self.counted = util, counted

        def utilization(self, gpu, now):
            return self.util

        def power_load(self, gpu, now):
            return self.util / 100

        def activity_seconds(self, gpu, now):
            return (self.counted,) * 6

        def memory_used(self, gpu, now):
            return 1 << 30

        def processes(self, gpu):
            return [(4242, 1 << 30)]

    load = FollowingLoad()
    assert (load.utilization(0, 0.0), load.memory_used(0, 0.0), load.processes(0)) == (0.0, None, [])  # no job yet: idle
    assert load.activity_seconds(0, 0.0) == (0.0,) * 6
    load.follow(Board(30.0, 5.0))
    assert (load.utilization(0, 1.0), load.activity_seconds(0, 1.0)) == (30.0, (5.0,) * 6)
    load.follow(None)  # between two stages: idle, the counters where they were
    assert (load.utilization(0, 2.0), load.activity_seconds(0, 2.0)) == (0.0, (5.0,) * 6)
    load.follow(Board(90.0, 1.0))  # the next job's board counts from its own start
    assert (load.utilization(0, 3.0), load.activity_seconds(0, 3.0)) == (90.0, (6.0,) * 6)


def test_a_source_that_starts_over_resets_its_readers_history_once():
    from gputop.source import PollLoop, Restarting
    from tests.harness.histories import make_machine, make_snapshots

    snaps = make_snapshots(4, gpus=2, cores=8)

    class NextStage:
        machine = make_machine(gpus=2, cores=8)
        generation = 0
        narration = "case study: stage 1 of 4"

        def poll(self):
            return snaps.pop(0)

        def close(self) -> None:
            pass

    source = NextStage()
    assert isinstance(source, Restarting)
    loop = PollLoop(source, 1.0)
    assert [loop.next_batch().reset for _ in range(2)] == [False, False]
    source.generation += 1  # the next stage's job: its history starts over
    assert [loop.next_batch().reset for _ in range(2)] == [True, False]


class _CountedJob:
    """A stage's job reduced to its step counters (the watch reads nothing else before a stage ends)."""

    launcher_pid = 1

    def __init__(self) -> None:
        self.counts = [0, 0]

    def step_counts(self) -> list[int]:
        return list(self.counts)

    def failure(self) -> None:
        return None


def test_a_stage_is_measured_from_the_end_of_its_loaders_start_up():
    from tests.harness.histories import machine, make_snapshots

    first, second = case_study.stages(2, 2.0)[:2]
    assert case_study.warm_up_steps(first.config) == 0  # num_workers=0: nothing handed out at once
    assert case_study.warm_up_steps(second.config) == 12 * 4  # 12 workers, prefetch 4
    job = _CountedJob()
    watch = case_study.StageWatch(second, machine(gpus=2, cores=2), job, min_s=0.0)
    snapshots = make_snapshots(3, gpus=2, cores=2)
    job.counts = [47, 60]  # rank 0 is one step short of its loader's start-up
    watch.observe(snapshots[0])
    assert not watch.warm and watch.counts_start == [0, 0]
    job.counts = [48, 61]
    watch.observe(snapshots[1])
    assert watch.warm and watch.counts_start == [48, 61] and len(watch.history) == 1  # watched from here, afresh
    job.counts = [50, 63]
    watch.observe(snapshots[2])
    assert watch.counts_start == [48, 61]

"""`gputop demo --scenario case-study` in the TUI: one simulated machine follows each stage's job in turn, the
header says which stage runs and how the ones before went, and the verdict is gputop's diagnosis of the job that
runs now (its history starts over with each stage).  The stages' jobs are scripted through the case study's
own seam (`CaseStudy(start_job=...)`): real processes, attached and sampled as any job is, with the GPU load
each stage puts on the simulated machine; the real four-stage run is tests/test_case_study.py's."""

from __future__ import annotations

import signal
import time

import pytest

from gputop.commands import case_study
from gputop.sim.gpu_physics import DEFAULT_ACTIVITY
from gputop.tui.app import GputopApp
from tests.harness.tui import wait_for

GIB = 1 << 30


class HeldLoad:
    """One process on `gpus`, each at `util` percent (the fake NVML's load model, `load.JobLoad`)."""

    def __init__(self, pid: int, gpus: tuple[int, ...], util: float) -> None:
        self.pid, self.gpus, self.util = pid, gpus, util
        self.started = time.monotonic()

    def utilization(self, gpu: int, now: float) -> float:
        return self.util if gpu in self.gpus else 0.0

    def power_load(self, gpu: int, now: float) -> float:
        return self.utilization(gpu, now) / 100.0

    def activity_seconds(self, gpu: int, now: float) -> tuple[float, ...]:
        busy = self.utilization(gpu, now) / 100.0 * (now - self.started)
        return tuple(share * busy for share in DEFAULT_ACTIVITY)  # the fake NVML's mix for a plain busy GPU

    def memory_used(self, gpu: int, now: float) -> int | None:
        return 8 * GIB if gpu in self.gpus else None

    def processes(self, gpu: int) -> list[tuple[int, int]]:
        return [(self.pid, 8 * GIB)] if gpu in self.gpus else []


class ScriptedJob:
    """A stage's job: a real process (started by the test's spawner, reaped by it) and the load it puts on the GPUs."""

    def __init__(self, spawn, gpus: tuple[int, ...], util: float) -> None:
        self.proc = spawn.python("import time\nwhile True: time.sleep(0.05)")
        self.launcher_pid = self.proc.pid
        self.load = HeldLoad(self.proc.pid, gpus, util)
        self.started = time.monotonic()

    def wait_until_training(self) -> float:
        return 0.0

    def load_model(self) -> HeldLoad:
        return self.load

    def step_counts(self) -> list[int]:
        return [int((time.monotonic() - self.started) * self.load.util)]

    def failure(self) -> str | None:
        return None

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.mark.acceptance  # the case study's live jobs
@pytest.mark.slow
async def test_the_tui_follows_the_case_study_from_stage_1_to_stage_2(spawn):
    # stage 1: one process holding two GPUs (gputop says: rank placement); stage 2: one GPU, busy
    script = {1: ((0, 1), 30.0), 2: ((0,), 97.0), 3: ((0,), 97.0), 4: ((0,), 97.0)}
    jobs: dict[int, ScriptedJob] = {}

    def start_job(stage: case_study.Stage) -> ScriptedJob:
        jobs[stage.number] = ScriptedJob(spawn, *script[stage.number])
        return jobs[stage.number]

    study = case_study.CaseStudy(case_study.stages(2, 2.0), start_job=start_job, min_stage_s=8.0, max_stage_s=30.0)
    source = case_study.CaseStudySource(study)
    app = GputopApp(source, interval=0.5, subtitle="case study")
    try:
        source.start()
        async with app.run_test(size=(200, 40)) as pilot:
            header = app.main.header

            await wait_for(pilot, lambda: header.subtitle.startswith("case study: stage 1 of 4 — num_workers=0"), "stage 1")
            await wait_for(
                pilot,
                lambda: app.monitor.verdict is not None and "GPUs 0, 1" in app.monitor.verdict.line,
                "the verdict on stage 1's job",
            )
            assert "steps/s" not in header.subtitle  # nothing before stage 1

            def in_stage_2() -> bool:
                return header.subtitle.startswith("case study: stage 2 of 4 — num_workers=12, prefetch 4, pinned, persistent")

            await wait_for(pilot, in_stage_2, "stage 2", timeout=40.0)
            first = study.results[0]
            assert first.finding.id == "misplacement" and first.settled
            # the header keeps stage 1's steps/s and the bottleneck gputop named
            assert f"│ 1: {first.steps_per_s:.2f} steps/s, {first.bottleneck}" in header.subtitle
            # the verdict follows the new job: its history started over, without stage 1's job in it
            await wait_for(
                pilot,
                lambda: in_stage_2() and app.monitor.verdict is not None and "GPUs 0, 1" not in app.monitor.verdict.line,
                "the verdict on stage 2's job",
            )
            roots = {s.job.root_pid for s in app.monitor.history if s.job is not None}
            assert roots == {jobs[2].launcher_pid}
            await wait_for(pilot, lambda: "GPUs 0, 1" not in app.main.verdict.text, "stage 2's verdict on screen")
            await pilot.press("q")
    finally:
        source.close()
    assert study.job is None  # every stage's job stopped with the source


def test_the_narration_is_cut_not_dropped_and_the_versions_give_way_first():
    from gputop.tui.widgets.status import HeaderLine
    from tests.harness.histories import make_machine

    machine = make_machine(gpus=8)
    narration = "case study: stage 3 of 4 — tensors cached in memory │ 1: 0.75 steps/s, CPU data loading · 2: 1.34 steps/s, CPU preprocessing"
    header = HeaderLine(machine)
    header.set_subtitle(narration, before_versions=True)
    [line] = ["".join(segment.text for segment in strip) for strip in header.build(120, 1)]
    assert "case study: stage 3 of 4 — tensors cached in memory │ 1: 0.7" in line and "…" in line
    assert "driver" not in line and "CUDA" not in line  # the versions went first
    assert "8× H100" in line  # the GPUs stay
    wide = "".join(segment.text for segment in header.build(400, 1)[0])
    assert narration in wide and "driver" in wide  # with room, all of it

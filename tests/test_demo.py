"""`gputop demo`: each scenario's simulated utilization, its stacks, and that nothing outlives the demo.

Every test runs the real demo job (torch ranks, gloo, DataLoader workers decoding JPEGs with
Pillow) and reads the simulated GPUs through the real pipeline: pynvml over the fake library,
driven by the job's busy board.  The ranks take a while to import torch on a shared 2-core
box, so startup waits are long; the observations themselves are a few seconds each.  What each
scenario shows on the machine is checked on its recording in tests/test_demo_replays.py (the starved one live too,
in tests/acceptance/test_diagnosis_demo.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from gputop import cli
from gputop.commands import demo as demo_command
from gputop.sim import scenarios
from gputop.sim.cpu_speed import cpu_slowness
from gputop.sim.demo_launcher import DemoJob
from tests.harness.demo import alive, descendants, observe_quietly, rank_pids, stop_and_check_nothing_left, worker_pids
from tests.harness.processes import wait_until

STARTUP_S = 240.0  # ranks import torch (~2 s of CPU each) on 2 cores that other tests share


# ----------------------------------------------------------------------------- the scenario arithmetic


def _job_cores(config: scenarios.DemoConfig) -> float:
    """The cores the whole job burns with every rank at full speed: its loops and its loaders."""
    per_step_ms = config.cpu_slowness * scenarios.RANK_STEP_CPU_MS + config.batch_size * config.sample_cpu_ms
    return config.ranks * per_step_ms / config.step_ms


def test_scenarios_size_the_loader_by_the_arithmetic():
    starved = scenarios.resolve("starved", cpu_count=2, slowness=1.0)
    tuned = scenarios.resolve("tuned", cpu_count=2, slowness=1.0)
    assert starved.num_workers == 0 and starved.ranks == 8
    # the dataset costs PREP_TO_STEP steps per batch: num_workers=0 leaves the GPU busy ~1/3 of the time
    assert starved.prep_ms_per_batch == pytest.approx(scenarios.PREP_TO_STEP * starved.step_ms, rel=0.01)
    assert tuned.num_workers >= tuned.workers_needed * scenarios.WORKER_MARGIN - 0.001
    # the tuned count is the arithmetic's 2 x 1.5 = 3 on every box, fast or slow, whatever the rounding of the
    # storage latency
    shapes = [(g, c, slow) for g in (1, 4, 8) for c in (2, 4, 64) for slow in (0.5, 1.0, 4.4)]
    assert {scenarios.resolve("tuned", gpus=g, cpu_count=c, slowness=slow).num_workers for g, c, slow in shapes} == {3}
    assert (tuned.prefetch_factor, tuned.pin_memory, tuned.persistent_workers) == (4, True, True)
    # the ranks flat out stay within the CPU share, on 2 cores and on 64, on the reference box and on slower ones
    for gpus, cpus, slowness in ((8, 2, 1.0), (8, 64, 1.0), (4, 2, 2.0), (8, 64, 4.4)):
        config = scenarios.resolve("tuned", gpus=gpus, cpu_count=cpus, slowness=slowness)
        assert _job_cores(config) <= scenarios.JOB_CPU_SHARE * cpus, (cpus, slowness, config.describe())
    assert scenarios.loader_shape_for(2, 8)[1] < scenarios.loader_shape_for(64, 8)[1]
    # a slower box gets smaller JPEGs, then smaller batches: the shared 2-core VM on which the unscaled tuned job
    # needed 2.5 cores (4 ranks) gets the smallest dataset, and its job fits in half the cores
    assert scenarios.loader_shape_for(2, 4, 1.0) == (16, 192)
    assert scenarios.loader_shape_for(2, 4, 2.0) == (4, 288)
    assert scenarios.loader_shape_for(2, 4, 4.0) == (2, 96)
    slow = scenarios.resolve("tuned", gpus=4, cpu_count=2, slowness=4.0)
    assert _job_cores(slow) < 0.5 * 2 and slow.prep_ms_per_batch == pytest.approx(2 * slow.step_ms, rel=0.01)
    # overrides win, and workers=0 drops the settings that need workers
    custom = scenarios.resolve("tuned", workers=0, batch_size=8, step_ms=50, gpus=3)
    assert (custom.num_workers, custom.prefetch_factor, custom.persistent_workers) == (0, None, False)
    assert (custom.batch_size, custom.step_ms, custom.ranks) == (8, 50.0, 3)
    assert scenarios.resolve("misfire", gpus=2).hang_rank == 1
    assert scenarios.resolve("single-gpu").ranks_on_gpu0


def test_the_cpu_slowness_is_this_boxs_clock_against_the_reference(monkeypatch):
    """The demo's costs scale by the workload's time on this box's clock: a clock that runs 3x fast (a box
    that takes 3x as long, stolen time included) reads 3x the slowness; the sizing takes it on a ladder of
    powers of two, so runs on one box get one dataset."""
    from gputop.sim import cpu_speed

    # A clock on which each run of the workload takes three times the reference box's: whatever else loads this
    # box, the reading is the clock's (a comparison of two real readings tested the box's load, not this rule)
    ticks = iter(range(10**6))
    monkeypatch.setattr(cpu_speed.time, "perf_counter", lambda: next(ticks) * 3.0 * cpu_speed.REFERENCE_WORKLOAD_S)
    assert cpu_speed.measured_slowness() == pytest.approx(3.0)
    monkeypatch.setattr(cpu_speed, "measured_slowness", lambda: 3.1)
    assert cpu_speed.cpu_slowness() == 4.0
    monkeypatch.setattr(cpu_speed, "measured_slowness", lambda: 1.3)
    assert cpu_speed.cpu_slowness() == 1.0
    monkeypatch.setattr(cpu_speed, "measured_slowness", lambda: 1000.0)
    assert cpu_speed.cpu_slowness() == 16.0
    # the reading travels with the config to the ranks' arithmetic
    assert scenarios.resolve("tuned", gpus=2, slowness=2.0).cpu_slowness == 2.0


def test_config_round_trips_through_the_rank_command_line():
    import argparse

    parser = argparse.ArgumentParser()
    scenarios.DemoConfig.add_arguments(parser)
    for name in scenarios.SCENARIOS:
        config = scenarios.resolve(name, gpus=3, max_steps=7, loss_log="/tmp/l{rank}")
        assert scenarios.DemoConfig.from_namespace(parser.parse_args(config.to_argv())) == config


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--gpus", "9"], "--gpus 9 is out of range: the simulated machine has 1 to 8 GPUs"),
        (["demo", "--workers", "-1"], "--workers -1 is out of range"),
        (["demo", "--batch-size", "0"], "--batch-size 0 is out of range"),
    ],
)
def test_bad_overrides_are_one_line_usage_errors(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_torch_says_how_to_install_it(monkeypatch, capsys):
    real_find_spec = demo_command.importlib.util.find_spec
    monkeypatch.setattr(
        demo_command.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )
    assert cli.main(["demo", "--no-tui", "--seconds", "1"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'gputop[demo]'" in err and err.count("\n") == 1


@pytest.mark.slow
def test_the_monitor_side_never_imports_torch():
    code = (
        "import sys, gputop.commands.demo, gputop.sim.demo_launcher, gputop.sim.scenarios; "
        "print(sorted(m for m in ('torch', 'textual', 'PIL') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


# ----------------------------------------------------------------------------- the scenarios, live


@pytest.mark.alone(unless_prioritized=True)  # utilization against a bar: the ranks' CPU drives it (ci11 read 48% starved)
@pytest.mark.slow
def test_tuned_keeps_the_gpus_busy(demo):
    job, pipeline = demo("tuned", gpus=2)
    summary = observe_quietly(job, pipeline, seconds=8)
    means = summary.mean_util()
    assert all(means[g] > 65 for g in (0, 1)), means
    assert all(rate > 2.5 for rate in summary.steps_per_s), summary.steps_per_s  # ~4.4 at 200 ms steps
    snapshot = pipeline.poll()
    for gpu, pid in zip((0, 1), rank_pids(job)):
        assert [p.pid for p in snapshot.gpus[gpu].processes] == [pid]  # rank r holds memory on GPU r
    assert all(len(worker_pids(pid)) == job.config.num_workers for pid in rank_pids(job))
    stop_and_check_nothing_left(job, pipeline)


@pytest.mark.slow
def test_losses_are_identical_whatever_the_loader_timing(tmp_path):
    """Fixed seed: the same batches and bit-identical losses with 0 workers (serial) or 3 (parallel)."""
    logs = {}
    slowness = cpu_slowness()  # one dataset for both (its size follows the box's speed, on a coarse ladder)
    for workers in (0, 3):
        template = str(tmp_path / f"w{workers}-loss-{{rank}}.txt")
        run = dict(workers=workers, gpus=2, step_ms=5, max_steps=12, loss_log=template, seed=3, slowness=slowness)
        with DemoJob("tuned", **run) as job:
            job.start()
            wait_until(lambda: job.returncode is not None, timeout=STARTUP_S, what="the job to finish 12 steps")
            assert job.returncode == 0, job.log_tail()
        logs[workers] = [open(template.format(rank=r)).read() for r in (0, 1)]
    assert logs[0] == logs[3]
    lines = logs[0][0].splitlines()
    assert len(lines) == 12 and lines[0].startswith("0 1 ")
    assert logs[0][0] != logs[0][1]  # the ranks see different data


# ----------------------------------------------------------------------------- nothing left behind


@pytest.mark.slow
def test_sigkill_of_the_parent_leaves_no_orphans(spawn):
    parent_code = textwrap.dedent(
        """
        import sys, threading
        from gputop.sim.demo_launcher import DemoJob
        job = DemoJob("tuned", gpus=2)
        print(job.start(), job.directory, flush=True)
        threading.Event().wait()
        """
    )
    parent = spawn.python(parent_code, stdout=subprocess.PIPE, text=True)
    launcher_text, directory = parent.stdout.readline().split()
    launcher = int(launcher_text)
    expected = 1 + 2 + 2 * scenarios.resolve("tuned", gpus=2).num_workers
    pids = wait_until(
        lambda: (lambda p: p if len(p) >= expected else None)(descendants(launcher)),
        timeout=STARTUP_S,
        what="the launcher, 2 ranks and their workers",
    )
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        wait_until(lambda: not [p for p in pids if alive(p)], timeout=30, what="every demo process to die")
        wait_until(lambda: not os.path.exists(directory), timeout=10, what="the board directory to go")
    finally:
        for pid in pids:  # only on failure: they are ours (the test started them)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _start_cli(spawn, tmp_path, *args):
    out_path = tmp_path / "out.txt"
    with open(out_path, "w") as out:  # the child keeps its own copy of the descriptor
        proc = spawn([sys.executable, "-m", "gputop", "demo", "--no-tui", "--gpus", "2", *args], stdout=out, stderr=out)
    return proc, out_path


@pytest.mark.alone(unless_prioritized=True)  # utilization against a bar, as above (ci11: 50% starved)
@pytest.mark.slow
def test_cli_headless_runs_for_the_given_seconds(spawn, tmp_path):
    proc, out_path = _start_cli(spawn, tmp_path, "--scenario", "tuned", "--seconds", "3", "--interval", "0.5")
    assert proc.wait(timeout=STARTUP_S + 30) == 0, out_path.read_text()
    text = out_path.read_text()
    launcher = int(re.search(r"launcher PID (\d+)", text).group(1))
    assert "summary over" in text and re.search(r"steps/s +\d+\.\d\d +\d+\.\d\d", text), text
    means = [int(x) for x in re.search(r"mean util % +(.*)", text).group(1).split()]
    assert len(means) == 8 and all(m > 50 for m in means[:2]) and means[2:] == [0] * 6, text
    assert not alive(launcher)


@pytest.mark.slow
def test_cli_headless_stops_everything_on_sigterm(spawn, tmp_path):
    proc, out_path = _start_cli(spawn, tmp_path, "--scenario", "starved", "--interval", "0.5")
    wait_until(lambda: "ranks training" in out_path.read_text(), timeout=STARTUP_S, what="the ranks to train")
    wait_until(lambda: re.search(r"^\s+1\.\ds", out_path.read_text(), re.M), timeout=20, what="two samples")
    launcher = int(re.search(r"launcher PID (\d+)", out_path.read_text()).group(1))
    pids = descendants(launcher)
    assert len(pids) == 3  # launcher + 2 ranks (num_workers=0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert "summary over" in out_path.read_text()
    assert [p for p in pids if alive(p)] == []


@pytest.mark.slow
def test_a_crashed_rank_ends_the_demo_with_one_line(spawn, tmp_path):
    """torchrun's rule: one rank dies, the launcher stops the others; gputop says so in one line, exit 1."""
    proc, out_path = _start_cli(spawn, tmp_path, "--scenario", "starved", "--interval", "0.5")
    wait_until(lambda: "ranks training" in out_path.read_text(), timeout=STARTUP_S, what="the ranks to train")
    launcher = int(re.search(r"launcher PID (\d+)", out_path.read_text()).group(1))
    pids = descendants(launcher)
    rank1 = next(c.pid for c in psutil.Process(launcher).children() if c.environ().get("RANK") == "1")
    os.kill(rank1, signal.SIGKILL)
    assert proc.wait(timeout=30) == 1
    error = out_path.read_text().splitlines()[-1]
    assert error.startswith("gputop: the demo job exited with code 137: demo launcher: rank 1 was killed by signal 9")
    log = re.search(r"\(full log: (\S+)\)$", error).group(1)
    try:
        assert "rank 1 was killed" in open(log).read()
    finally:
        os.unlink(log)
    assert [p for p in pids if alive(p)] == []


def test_the_starved_demo_with_the_advised_workers_shows_the_prediction_beside_what_it_achieved(monkeypatch, tmp_path):
    import io

    from gputop.commands import demo as demo_command
    from gputop.model import Finding

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    predicted = {"change": "num_workers=3", "speedup": 2.8, "speedup_low": 2.4, "speedup_high": 3.1}
    bounds = [{"limit": "the step's compute", "speedup": 2.8, "low": 2.4, "high": 3.1, "why": ""}]
    starved = Finding(
        id="starvation",
        title="starved",
        severity="critical",
        confidence=0.9,
        label="",
        summary="",
        fix="raise num_workers",
        figures={"prediction": {**predicted, "bounds": bounds, "assumes": ""}},
    )
    first = demo_command.DemoSummary(startup_s=1.0, seconds=45.0, steps_per_s=(1.7, 1.7), findings=[starved])
    out = io.StringIO()
    demo_command.check_fix(first, "starved", 2, None, out)
    assert out.getvalue() == ""  # nothing to check yet: the prediction is kept (x2.8 the 1.7 steps/s: 4.76)
    fixed = demo_command.DemoSummary(startup_s=1.0, seconds=45.0, steps_per_s=(4.6, 4.8), findings=[])
    demo_command.check_fix(fixed, "starved", 2, 3, out)
    line = out.getvalue()
    assert line.startswith("fix checked: num_workers=3, predicted by the run before it: ~4.76 steps/s (4.08–5.27")
    assert "achieved 4.70: achieved ÷ predicted 0.99, inside the range" in line
    out = io.StringIO()
    demo_command.check_fix(fixed, "starved", 2, 5, out)  # another count than the one predicted: nothing to compare
    assert out.getvalue() == ""

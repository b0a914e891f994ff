"""Start-up cost (issue 15's first-frame and RSS bars): what the monitor does before its first frame.

- The first poll, prefetched while Textual loads, is drawn by the first frame: it does not wait in the
  message queue behind Textual's own start-up (gputop/commands/tui.py, PollLoop.prefetch).
- The first screen the terminal receives is the monitor's, not a blank one drawn before the widgets had
  built their lines (canvas.LineCanvas.render_line).
- The pipeline is built once the first frame is drawn, not beside it (its Python would share the GIL with
  the first frame's: starting.py).
- The cyclic GC, off during start-up, is back on once the first frame is drawn.
- Starting the monitor loads none of the code behind its keys (dialogs, report, bench, trace, check,
  recording, the exporter) until a key asks for it: each would cost memory and time to every start.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import replace

import pytest

from gputop import pipeline as pipeline_module
from gputop.commands.tui import starting_pipeline
from gputop.errors import GputopError
from gputop.sim import fake_nvml
from gputop.sim.fake_nvml import FakeNvmlLibrary
from gputop.source import PollLoop
from gputop.tui.app import GputopApp
from gputop.tui.starting import StartingPipeline
from gputop.tui.widgets.cpu_heatmap import CpuHeatmap
from gputop.tui.widgets.gpu_grid import GpuGrid
from gputop.tui.widgets.job_panel import JobPanel
from gputop.tui.widgets.status import HeaderLine
from tests.harness.histories import ScriptedSource, fixed_diagnose, make_machine, make_snapshots
from tests.harness.processes import wait_until
from tests.harness.train_jobs import REPO
from tests.harness.tui import wait_for
from tests.tui.test_terminal import TUI_ARGV, _quit, _read_until, _start_in_pty

# Loaded only when their key is pressed (or their command runs): none of them may load at start.
ON_DEMAND = [
    "gputop.tui.screens",  # help, topology, findings, bench dialogs
    "gputop.tui.check_screen",  # c
    "gputop.tui.trace_screen",  # t
    "gputop.tracing",
    "gputop.bench",  # b
    "gputop.report",  # r
    "gputop.recording",
    "gputop.exporter",
    "gputop.analysis.machine_check",
    "gputop.analysis.trace_summary",
    "prometheus_client",
    "json",
]

# The real `gputop tui --simulate` (commands/tui.py: prefetch, gc off until the first frame), headless, until
# its first verdict; then `?` (the help key's action) to show that the probe sees what a key loads.
PROBE = """
import functools, gc, sys
from textual.app import App
App.run = functools.partialmethod(App.run, headless=True, size=(120, 40))
import gputop.tui.app as tui_app
seen = {}
def on_diagnosed(self, message, _orig=tui_app.GputopApp.on_diagnosed):
    _orig(self, message)
    if not seen:
        seen["at_first_verdict"] = sorted(sys.modules)
        seen["snapshots"] = self.monitor.snapshots_seen
        seen["gc_enabled"] = gc.isenabled()
        self.action_help()
        seen["after_help_key"] = sorted(sys.modules)
        self.exit(0)
tui_app.GputopApp.on_diagnosed = on_diagnosed
from gputop.cli import main
rc = main(["tui", "--simulate", "--interval", "0.5"])
import json  # only now: the monitor must not have needed it
with open(sys.argv[1], "w") as out:
    json.dump({"rc": rc, **seen}, out)
"""


def test_starting_the_monitor_loads_no_code_behind_its_keys(spawn, tmp_path):
    out_file = tmp_path / "modules.json"
    proc = spawn([sys.executable, "-c", PROBE, str(out_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    _, err = proc.communicate(timeout=120)
    assert out_file.exists(), f"the monitor did not reach its first verdict: rc={proc.returncode} {err.decode()[-2000:]}"
    result = json.loads(out_file.read_text())
    assert result["rc"] == 0 and result["snapshots"] >= 1
    at_start = set(result["at_first_verdict"])
    assert "gputop.analysis.diagnosis" in at_start  # the probe ran the monitor as far as its verdict
    loaded = [m for m in ON_DEMAND if m in at_start]
    assert not loaded, f"starting the monitor loaded {loaded}: import them where their key is handled"
    assert "gputop.tui.screens" in set(result["after_help_key"])  # and the probe would have seen it
    # start-up turns the cyclic GC off (commands/tui.py); left off, every reference cycle would leak for good
    assert result["gc_enabled"], "the cyclic GC was still off after the first frame"


async def test_the_prefetched_first_poll_is_drawn_by_the_first_frame(close_sources):
    source = ScriptedSource(make_machine(gpus=8), make_snapshots(1, gpus=8))  # then every poll blocks
    close_sources(source)
    loop = PollLoop(source, 0.001)
    loop.prefetch()
    wait_until(
        lambda: source.polls == 1 and not any(t.name == "gputop-first-poll" for t in threading.enumerate()),
        what="the prefetched poll",
    )
    app = GputopApp(source, interval=0.001, diagnose=fixed_diagnose, poll_loop=loop)
    posted = []
    deliver = app.monitor._deliver
    app.monitor._deliver = lambda batch: (posted.append(batch), deliver(batch))  # the collector's way in
    async with app.run_test(size=(120, 40)):
        # on the screen at mount, not delivered later by the collector through the message queue
        assert app.monitor.snapshots_seen == 1 and app.monitor.history.latest is source._snapshots[0]
        assert posted == []
        assert any(line.lstrip().startswith("GPU0") or " GPU0" in line for line in app.query_one("#gpus").lines_text)


def test_an_app_that_never_mounted_waits_for_the_prefetched_poll_before_its_source_closes():
    source = ScriptedSource(make_machine(gpus=8), make_snapshots(0, gpus=8))  # the first poll blocks until closed
    loop = PollLoop(source, 0.001)
    loop.prefetch()
    app = GputopApp(source, interval=0.001, diagnose=fixed_diagnose, poll_loop=loop)  # never run: no collector
    try:
        assert not app.monitor.wait_for_collector(0.05)  # the prefetched poll is still inside the source
    finally:
        source.close()
    assert app.monitor.wait_for_collector(5)


# ------------------------------------------------------------------ a first frame that never waits for NVML
HOLD_DEADLINE_S = 60.0  # how long nvmlInit waits for the test's release before going on (the test has failed)


class _HeldInitNvml(FakeNvmlLibrary):
    """The simulated NVML whose nvmlInit is held until the test sets `release` (a real one takes seconds on a box
    without persistence mode; in C it would release the GIL: so does this).  `entered`: nvmlInit was called."""

    entered = threading.Event()
    release = threading.Event()

    def _bind_symbols(self):
        symbols = super()._bind_symbols()
        init = symbols["nvmlInitWithFlags"]

        def held(flags):
            _HeldInitNvml.entered.set()
            _HeldInitNvml.release.wait(HOLD_DEADLINE_S)
            return init(flags)

        symbols["nvmlInitWithFlags"] = held
        symbols["nvmlInit_v2"] = lambda: held(0)
        return symbols


@pytest.fixture
def held_nvml_init(monkeypatch):
    """`gputop --simulate` on an NVML whose nvmlInit waits for the test: the order of events, not their times."""
    monkeypatch.setattr(_HeldInitNvml, "entered", threading.Event())
    monkeypatch.setattr(_HeldInitNvml, "release", threading.Event())
    monkeypatch.setattr(fake_nvml, "FakeNvmlLibrary", _HeldInitNvml)
    try:
        yield _HeldInitNvml
    finally:
        _HeldInitNvml.release.set()


async def test_the_first_frame_draws_the_cpu_and_jobs_while_nvml_init_is_held(held_nvml_init):
    """Issue 22: the window, the CPU heatmap and the job tree at once; the GPU cards say "reading GPUs…" until
    the first NVML sample lands, then show it.  The pipeline is the command's (`gputop tui --simulate`).
    nvmlInit returns only when the test lets it: the first frame must come without it, the cards after it."""
    source = starting_pipeline(argparse.Namespace(simulate="h100-sxm-8", pid=None, stack_interval=2.0))
    app = GputopApp(source, interval=0.2, diagnose=fixed_diagnose)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            grid, heatmap, jobs = app.query_one(GpuGrid), app.query_one(CpuHeatmap), app.query_one(JobPanel)
            await wait_for(
                pilot,
                lambda: heatmap.host is not None and any("reading GPUs…" in line for line in grid.lines_text),
                "the first frame while nvmlInit is held",
                timeout=HOLD_DEADLINE_S / 2,
            )
            assert source.reading_gpus and app.monitor.reading_gpus  # nvmlInit has not returned
            assert heatmap.lines_text[0].lstrip().startswith(f"CPU {heatmap.host and len(heatmap.host.cpu_percent)} cores")
            assert jobs.title == "GPU PROCESSES"
            assert "reading GPUs…" in app.query_one(HeaderLine).lines_text[0]
            assert app.diagnoses_done == 0  # no verdict on a machine whose GPUs are not read yet
            # the pipeline's build reaches nvmlInit (after the first frame); the cards still wait for it
            await wait_for(pilot, held_nvml_init.entered.is_set, "the build to call nvmlInit", timeout=HOLD_DEADLINE_S / 2)
            assert app.monitor.reading_gpus and not any("GPU0" in line for line in grid.lines_text)
            held_nvml_init.release.set()
            await wait_for(pilot, lambda: any("GPU0" in line for line in grid.lines_text), "the GPU cards", timeout=30)
            assert (
                not app.monitor.reading_gpus and app.monitor.machine.gpu_count == 8 and len(app.monitor.history.latest.gpus) == 8
            )
            assert "8× H100 80GB HBM3" in app.query_one(HeaderLine).lines_text[0]
            await wait_for(pilot, lambda: app.diagnoses_done >= 1, "the first verdict, once the GPUs are read")
    finally:
        held_nvml_init.release.set()
        if app.monitor.wait_for_collector(5):
            source.close()


async def test_a_pipeline_that_fails_to_start_ends_the_monitor_with_its_error():
    """A build that fails after the first frame (the PID exited meanwhile, NVML failed): the app ends, and run_app
    raises the error for the command line's one-line message once the terminal is restored."""
    go = threading.Event()

    def build(host, job):
        go.wait(10)
        raise GputopError("no process with PID 4242")

    source = StartingPipeline(build)
    app = GputopApp(source, interval=0.05, diagnose=fixed_diagnose)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.query_one(CpuHeatmap).host is not None, "the first frame")
            go.set()
            await wait_for(pilot, lambda: app.start_error is not None, "the app to take the error")
        assert str(app.start_error) == "no process with PID 4242" and app.return_code == 1
    finally:
        go.set()
        source.close()


@pytest.mark.slow  # a real process to attach to, and py-spy dumping it
async def test_the_attached_jobs_tree_is_drawn_while_nvml_init_is_held(held_nvml_init, spawn):
    """`gputop --pid PID`: the job tree comes from /proc, so it is on the first frame too, NVML or not."""
    job = spawn([sys.executable, "-c", "import time; time.sleep(120)"])
    source = starting_pipeline(argparse.Namespace(simulate="h100-sxm-8", pid=job.pid, stack_interval=2.0))
    app = GputopApp(source, interval=0.2, diagnose=fixed_diagnose)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            jobs = app.query_one(JobPanel)
            await wait_for(pilot, lambda: jobs.title.startswith("JOB "), "the job tree", timeout=HOLD_DEADLINE_S / 2)
            assert source.reading_gpus  # nvmlInit has not returned: the test holds it
            assert f"{job.pid}" in jobs.title and [row.pid for row in jobs.rows][:1] == [job.pid]
            held_nvml_init.release.set()
            # the machine is adopted (reading_gpus False) with an empty history; the next poll fills it
            await wait_for(
                pilot, lambda: not app.monitor.reading_gpus and app.monitor.history.latest is not None, "the GPUs", timeout=10
            )
            assert jobs.title.startswith("JOB ") and app.monitor.history.latest.job is not None  # the same job, now with GPUs
    finally:
        if app.monitor.wait_for_collector(5):
            source.close()


def test_a_bad_spec_or_a_gone_pid_is_still_one_line_before_any_frame(spawn):
    """The pipeline is built on a thread now; what it refuses is still the command's one line and exit code."""
    gone = 2**22 + 12345
    cases = [
        (["--simulate", "no-such-profile"], 2, "gputop: bad --simulate spec: unknown profile 'no-such-profile'"),
        (["--simulate", "--pid", str(gone)], 1, f"gputop: no process with PID {gone} (it may have exited"),
    ]
    for args, rc, line in cases:
        proc = spawn(
            [sys.executable, "-m", "gputop", "tui", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
        )
        out, err = proc.communicate(timeout=60)
        lines = err.decode().splitlines()
        assert proc.returncode == rc and len(lines) == 1 and lines[0].startswith(line), err.decode()[-2000:]
        assert b"\x1b[" not in out + err  # no screen was drawn


def test_the_first_screen_on_the_terminal_is_the_whole_monitor(spawn):
    """The widgets are handed the first poll at mount, before the layout gives them a size; they used to paint
    blank in the first frame and draw their lines in the next (~20 ms later). The first screen the terminal
    receives (from its first cursor-home to the next) must already be the monitor: header, CPU, jobs, keys."""
    env = dict(os.environ, TERM="xterm-256color", LANG="C.UTF-8")
    env.pop("NO_COLOR", None)
    proc, master = _start_in_pty(spawn, TUI_ARGV, env)
    try:
        out = _read_until(master, b"GPU7", timeout=60)  # well past the first frame: the GPU cards
        _quit(master, proc)
    finally:
        os.close(master)
    home = b"\x1b[1;1H"
    assert out.count(home) >= 2, out[:400]
    first = out.split(home)[1]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", first.decode("utf-8", "replace"))
    for shown in ("gputop", "SIMULATED", " cores", "GPU PROCESSES", "STACKS", "Quit"):
        assert shown in text, f"{shown!r} is not on the first screen: {text[:600]!r}"


async def test_the_monitor_builds_its_pipeline_once_its_first_frame_is_drawn(monkeypatch):
    """The build is ~40 ms of Python before any driver call (pynvml and the collectors load, the pipeline is
    assembled): on a thread beside the first frame it would take that from the frame under the GIL."""
    apps: list[GputopApp] = []
    at_build: list[list[str]] = []  # the CPU heatmap's lines when the build began

    class Recorded(pipeline_module.Pipeline):
        def __init__(self, *args, **kwargs):
            at_build.append(list(apps[0].main.heatmap.lines_text) if apps and apps[0].monitor.snapshots_seen else [])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(pipeline_module, "Pipeline", Recorded)
    source = starting_pipeline(argparse.Namespace(simulate="h100-sxm-8", pid=None, stack_interval=2.0))
    loop = PollLoop(source, 0.2)
    loop.prefetch()  # as the command does: the first frame draws this poll (the host's side)
    wait_until(lambda: not any(t.name == "gputop-first-poll" for t in threading.enumerate()), what="the first poll")
    app = GputopApp(source, interval=0.2, diagnose=fixed_diagnose, poll_loop=loop)
    apps.append(app)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            # the machine is adopted (reading_gpus False) with an empty history; the next poll fills it
            await wait_for(
                pilot, lambda: not app.monitor.reading_gpus and app.monitor.history.latest is not None, "the GPUs", timeout=10
            )
        assert len(at_build) == 1 and at_build[0][:1], f"the build began before the first frame: {at_build}"
        assert " cores" in at_build[0][0]  # the heatmap, drawn from the first poll
    finally:
        if app.monitor.wait_for_collector(5):
            source.close()


def test_a_held_build_that_is_never_released_ends_with_its_source():
    """The monitor ended before its first frame: closing the source lets the held build go, and it builds nothing."""
    built = []
    source = StartingPipeline(lambda host, job: built.append(1), held=True)
    source.close()
    assert source.wait_built(5) and built == [] and source.pipeline is None and source.failure is None


def test_the_gpus_read_as_the_monitor_closes_are_dropped_without_a_traceback():
    """q pressed as the starting pipeline reads the GPUs: its MachineKnown reaches an app whose screens are gone
    (ci27: an IndexError out of `main` when a test ended its app as the build finished)."""
    from gputop.tui.app import MachineKnown

    source = starting_pipeline(argparse.Namespace(simulate="h100-sxm-8", pid=None, stack_interval=2.0))
    try:
        app = GputopApp(source, interval=0.2, diagnose=fixed_diagnose)
        assert not app.screen_stack  # never started, or closed: no screen to draw the machine on
        app.on_machine_known(MachineKnown(replace(app.monitor.machine)))  # the GPUs' machine, not the host-only one
    finally:
        source.close()


async def test_a_terminal_too_small_for_the_monitor_still_releases_the_held_build():
    """The first frame is the too-small screen, not the main one: the build must not wait for HELD_AT_MOST_S."""
    source = starting_pipeline(argparse.Namespace(simulate="h100-sxm-8", pid=None, stack_interval=2.0))
    app = GputopApp(source, interval=0.2, diagnose=fixed_diagnose)
    try:
        async with app.run_test(size=(50, 12)) as pilot:
            # released by the too-small screen's first frame: the fallback (HELD_AT_MOST_S) starts the build without
            # releasing it, and nothing else on this screen would; so a deadline, not a bar
            await wait_for(pilot, lambda: source.released, "the build's release", timeout=30)
            await wait_for(pilot, lambda: source.wait_built(0), "the build", timeout=30)
            assert source.failure is None
    finally:
        if app.monitor.wait_for_collector(5):
            source.close()

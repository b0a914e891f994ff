"""The TUI's machine check (key c, issue 16): a worker runs `gputop check` over the live source, a screen
shows its lines, and a failing check marks the GPU's card."""

from __future__ import annotations

import pytest

from gputop.backend import SimulatedMachine
from gputop.pipeline import Pipeline
from gputop.tui.app import GputopApp
from gputop.tui.check_screen import CheckScreen
from gputop.tui.widgets.gpu_grid import GpuGrid
from tests.harness.tui import (
    TRACE_COMM_FINDING,
    TRACE_RANK,
    build_app,
    run_the_check,
    settle,
    wait_for,
    write_the_report,
)


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
async def test_check_key_runs_the_check_on_the_live_machine():
    """End to end over a real simulated pipeline: the real pynvml wrappers, the fake kernel tree, the app's
    own collector feeding the check's window."""
    source = Pipeline(SimulatedMachine("h100-sxm-8+pcie-replay=3"))
    app = GputopApp(source, interval=0.2)
    app.actions.check_seconds = 1.5
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_for(pilot, lambda: app.monitor.snapshots_seen >= 1, "the first sample")
            await pilot.press("c")
            assert isinstance(app.screen, CheckScreen)
            await wait_for(pilot, lambda: app.monitor.check is not None, "the machine check", timeout=30)
            await pilot.pause()
            report = app.monitor.check
            assert report.exit_code == 3
            (failing,) = [r for r in report.results if r.status == "fail"]
            assert failing.id == "pcie.replay" and failing.gpus == (3,)
            assert app.screen.report is report
            await pilot.press("escape")
            assert not isinstance(app.screen, CheckScreen)
            grid = app.query_one(GpuGrid)
            assert grid.check_marks == {3: ("chk PCIe replay", True)}
            await wait_for(pilot, lambda: any("chk PCIe replay" in line for line in grid.lines_text), "the card's mark")
            marked = [line for line in grid.lines_text if "chk PCIe replay" in line]
            assert len(marked) == 1  # one card: GPU 3's
    finally:
        source.close()


async def test_check_key_without_a_live_machine_says_why_not(close_sources):
    app, source = build_app(10)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press("c")
        await wait_for(
            pilot, lambda: "a replay has no NVML" in (getattr(app.screen, "error", None) or ""), "the reason on the check screen"
        )
        assert app.monitor.check is None and app.query_one(GpuGrid).check_marks == {}


async def test_help_lists_the_check_key(close_sources):
    app, source = build_app(10)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        assert any(b.key == "c" and b.description == "Machine check" for b in app.global_bindings())


async def test_compact_layout_marks_the_gpu_line(close_sources):
    from tests.harness.machine_check import scripted_check

    app, source = build_app(10)
    close_sources(source)
    app.actions.machine_check = scripted_check("h100-sxm-8+retired-page=4")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press("c")
        await wait_for(pilot, lambda: app.monitor.check is not None, "the scripted check")
        await pilot.press("escape")
        grid = app.query_one(GpuGrid)
        assert grid.compact
        await wait_for(pilot, lambda: any("retired" in line for line in grid.lines_text), "the GPU line's mark")
        (marked,) = [line for line in grid.lines_text if "retired" in line]
        assert marked.lstrip().split()[1] == "4"  # GPU 4's line


async def test_report_key_after_the_check_carries_its_infra_section(tmp_path, close_sources):
    from tests.harness.machine_check import scripted_check

    app, source = build_app(10, tmp_path=tmp_path)
    close_sources(source)
    app.actions.machine_check = scripted_check("h100-sxm-8+nvlink-crc=2:7")
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await run_the_check(pilot, app)
        path = await write_the_report(pilot, tmp_path)
    text = path.read_text()
    infra = text[text.index("## For the infra team") :]
    assert "| 2 | NVIDIA H100 80GB HBM3 | 1654922000002 |" in infra
    assert "- **FAIL** NVLink error counters: GPU 2 link 7: CRC (flit) +125 in 5.0 s (now 137)" in infra


async def test_the_screen_the_r_report_and_gputop_report_give_the_same_findings(tmp_path, close_sources):
    """Issue 22: one assembly (`analysis.findings.findings`): the screen's verdict, the file `r` writes and
    `gputop report` on the same history, trace and check list the same findings, trace and check included."""
    import re

    from gputop.analysis.findings import findings
    from gputop.monitor import diagnose_with_findings
    from gputop.tracing import TraceResult
    from tests.harness.machine_check import scripted_check

    app, source = build_app(10, tmp_path=tmp_path, with_job=True)
    close_sources(source)
    app.monitor.diagnose = diagnose_with_findings  # the real diagnosis, as the monitor runs it
    app.actions.machine_check = scripted_check("h100-sxm-8+nvlink-crc=2:7")
    app.actions.trace_runner = lambda pid, *, seconds, progress: TraceResult(
        target=f"PID {pid}", ranks=(TRACE_RANK,), findings=(TRACE_COMM_FINDING,), seconds=seconds
    )
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await run_the_check(pilot, app)
        await pilot.press("t")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.monitor.trace is not None, "the scripted trace")
        await pilot.press("escape")
        await wait_for(
            pilot,
            lambda: (
                app.monitor.verdict is not None
                and app.monitor.verdict.findings is not None
                and any(f.id == TRACE_COMM_FINDING.id for f in app.monitor.verdict.findings)
                and any(f.id.startswith("check.") for f in app.monitor.verdict.findings)
            ),
            "the trace's and the check's findings on screen",
        )
        path = await write_the_report(pilot, tmp_path)
        screen = [f.title for f in app.monitor.verdict.findings]
        command = [f.title for f in findings(app.monitor.history, None, app.monitor.trace, app.monitor.check, window=None)]
    written = re.findall(r"^### \d+\. (.+)$", path.read_text(), flags=re.M)
    assert screen == written == command, (screen, written, command)

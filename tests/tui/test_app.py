"""Behaviour of the TUI with Pilot: keys, collection off the event loop, layouts, job panel, modals."""

from __future__ import annotations

import dataclasses
import sys
import threading
import types

import pytest
from rich.style import Style

from gputop.errors import GputopError
from gputop.model import Snapshot
from gputop.tui import look
from gputop.tui.app import GputopApp, gpu_users
from gputop.tui.canvas import LineBuilder, _changed_span
from gputop.tui.widgets.cpu_heatmap import CpuHeatmap
from gputop.tui.widgets.gpu_grid import GpuGrid, spark_seconds_per_cell, spark_text, utilization_buckets
from gputop.tui.widgets.job_panel import JobPanel
from gputop.tui.widgets.stacks import StacksPanel
from tests.harness.histories import SCREEN_T0, ScriptedSource, make_job, make_machine, make_snapshots
from tests.harness.tui import build_app, settle, wait_for


def screen_text(app: GputopApp) -> str:
    return "\n".join(line for widget in (GpuGrid, CpuHeatmap, JobPanel, StacksPanel) for line in app.query_one(widget).lines_text)


# ------------------------------------------------------------------ keys and lifecycle
@pytest.mark.parametrize("key", ["q", "ctrl+c"])
async def test_quit_keys_exit(key, close_sources):
    app, source = build_app(10)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press(key)
        await wait_for(pilot, lambda: not app.is_running, "the app to exit")
    assert app.return_code == 0


class HungSource:
    """poll() never returns until closed: a hung NVML call."""

    def __init__(self) -> None:
        self.machine = make_machine()
        self.release = threading.Event()
        self.calls = 0

    def poll(self) -> Snapshot:
        self.calls += 1
        self.release.wait()
        raise GputopError("closed")

    def close(self) -> None:
        self.release.set()


async def test_hung_poll_never_freezes_keys_or_quit():
    source = HungSource()
    app = GputopApp(source, interval=0.01, diagnose=lambda h, b, t, c: ([], "ok"))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: source.calls == 1, "the first poll to start")
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "HelpScreen", "help to open")
            await pilot.press("escape")
            await pilot.press("p")
            assert app.monitor.paused
            assert "waiting for the first sample" in app.query_one(GpuGrid).lines_text[0]
            await pilot.press("q")
            await wait_for(pilot, lambda: not app.is_running, "the app to exit")
        assert source.calls == 1  # one poll in flight, none piled up behind it
    finally:
        source.close()


class CountingSource(ScriptedSource):
    """Records how many polls run at once."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def poll(self) -> Snapshot:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            return super().poll()
        finally:
            with self._lock:
                self.active -= 1


async def test_polls_never_overlap(close_sources):
    source = CountingSource(make_machine(), make_snapshots(40))
    close_sources(source)
    app = GputopApp(source, interval=0.0001, diagnose=lambda h, b, t, c: ([], "ok"))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
    assert source.max_active == 1
    assert len(app.monitor.history) == 40


async def test_interval_keys_step_through_the_presets(close_sources):
    app, source = build_app(5)
    close_sources(source)
    app.monitor.interval = 1.0
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press("plus")
        assert app.monitor.interval == 0.5
        await pilot.press("minus", "minus")
        assert app.monitor.interval == 2.0
        assert "⟳ 2s" in app.query_one("#header").lines_text[0]


async def test_pause_freezes_the_screen_and_says_so(close_sources):
    snapshots = make_snapshots(30)
    gate = threading.Event()

    class GatedSource(ScriptedSource):
        def poll(self):
            if self.polls == 20:
                gate.wait()  # the test lets the rest through only once paused
            return super().poll()

    source = GatedSource(make_machine(), snapshots)
    close_sources(source)
    app = GputopApp(source, interval=0.001, diagnose=lambda h, b, t, c: ([], "ok"))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.monitor.snapshots_seen == 20, "20 snapshots")
            await pilot.press("p")
            frozen = app.query_one(GpuGrid).lines_text
            assert "PAUSED" in app.query_one("#header").lines_text[0]
            gate.set()
            await settle(pilot, app, source, diagnosis=False)
            assert app.query_one(GpuGrid).lines_text == frozen  # data kept coming; the screen did not move
            assert len(app.monitor.history) == 30
            await pilot.press("p")
            await pilot.pause()
            assert "PAUSED" not in app.query_one("#header").lines_text[0]
            assert app.query_one(GpuGrid).lines_text != frozen
    finally:
        gate.set()


# ------------------------------------------------------------------ layouts
async def test_eight_cards_and_128_cores_fit_at_120x40(close_sources):
    app, source = build_app(70, with_job=True)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        grid, heat = app.query_one(GpuGrid), app.query_one(CpuHeatmap)
        assert not grid.compact
        text = "\n".join(grid.lines_text)
        for i in range(8):
            assert f"GPU{i} " in text
        assert grid.region.bottom <= 40 and grid.region.height == grid.wanted_height(120)
        assert heat.region.bottom <= 40 - 5  # room is left for the job panel and the key bar
        cells = "".join(heat.lines_text[1:])
        assert sum(cells.count(ch) for ch in look.SPARK_LEVELS[1:] + "_") == 128
        assert "N0" in cells and "N1" in cells
        for strip in grid._lines + heat._lines:
            assert strip.cell_length == 120  # the fast line path assumes one-cell glyphs: check it


@pytest.mark.parametrize("size", [(100, 30), (120, 40), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_256_cores_on_two_numa_nodes_draw_a_block_per_node_several_rows_high(size, close_sources):
    """A 2-socket host with 256 cores: each node is its own block, side by side, every core its own cell."""
    app, source = build_app(5, with_job=True, cores=256)
    close_sources(source)
    width, height = size
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        heat = app.query_one(CpuHeatmap)
        rows = heat.lines_text[1:]
        assert heat.region.height == len(heat.lines_text) and heat.region.bottom <= height - 5, (heat.region, height)
        assert 2 <= len(rows) <= 4, rows  # several rows a node, not one strip, and the job panel keeps its room
        assert rows[0].startswith("N0 ") and " N1 " in rows[0]  # both blocks start on the first row
        node1_at = rows[0].index(" N1 ") + 1
        levels = look.SPARK_LEVELS[1:] + "_"
        node0 = [sum(row[:node1_at].count(ch) for ch in levels) for row in rows]
        node1 = [sum(row[node1_at:].count(ch) for ch in levels) for row in rows]
        assert sum(node0) == sum(node1) == 128, (node0, node1)
        assert len(set(node0[:-1])) == 1 and max(node0) - min(node0) <= max(node0) // 2  # even rows of one block
        assert all(strip.cell_length == width for strip in heat._lines)


async def test_compact_layout_below_100_columns(close_sources):
    app, source = build_app(30)
    close_sources(source)
    async with app.run_test(size=(99, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        grid = app.query_one(GpuGrid)
        assert grid.compact
        assert len(grid.lines_text) == 1 + 8  # a heading and one line per GPU
        assert "BUSY" in grid.lines_text[1] and "IDLE" in grid.lines_text[7]
        await pilot.resize_terminal(130, 40)
        await pilot.pause()
        assert not grid.compact
        await pilot.resize_terminal(130, 29)
        await pilot.pause()
        assert grid.compact


async def test_at_100x30_the_job_tree_shows_five_of_eight_ranks_beside_the_stacks(close_sources):
    app, source = build_app(10, with_job=True, workers=3)  # the tuned demo's tree: 8 ranks x 3 workers
    close_sources(source)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        assert app.query_one(GpuGrid).compact  # 8 cards would take 23 of the 30 rows
        jobs, stacks = app.query_one(JobPanel), app.query_one(StacksPanel)
        assert jobs.display and stacks.display  # side by side, no Enter needed
        assert jobs.size.height >= 30 / 3
        ranks_shown = [line for line in jobs.lines_text if "├ rank " in line or "└ rank " in line]
        assert len(ranks_shown) >= 5, jobs.lines_text
        assert "rank 0 1001 +3w" in ranks_shown[0]  # its workers folded into the rank's row, counted
        assert "waiting for" in ranks_shown[0]
        await pilot.resize_terminal(160, 48)  # room again: cards, and every worker on its own row
        await wait_for(pilot, lambda: not app.query_one(GpuGrid).compact, "the cards")
        await wait_for(pilot, lambda: any("worker 2000" in line for line in jobs.lines_text), "the workers' rows")


async def test_too_small_screen_and_back(close_sources):
    app, source = build_app(20)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.resize_terminal(20, 5)
        await pilot.pause()
        assert type(app.screen).__name__ == "TooSmallScreen"
        assert "need 60×16" in str(app.screen.query_one("#too-small").render())
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert type(app.screen).__name__ == "MainScreen"
        assert "GPU0" in "\n".join(app.query_one(GpuGrid).lines_text)
        await pilot.resize_terminal(40, 10)
        await pilot.pause()
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, "q to quit from the too-small screen")


async def test_states_read_without_colour(close_sources, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app, source = build_app(90, lose_gpu=(3, 80))
    close_sources(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        assert app.no_color
        text = "\n".join(app.query_one(GpuGrid).lines_text)
        for words in ("● GPU0 BUSY", "✖ GPU3 LOST", "✖ GPU5 FAULT", "○ GPU6 IDLE", "✖ GPU7 FAULT"):
            assert words in text
        assert "Gen4 x8!" in text  # the downgraded link is flagged by a mark, not only by colour
        for strip in app.query_one(GpuGrid)._lines:
            assert all(style.color is None and style.bgcolor is None for _, style, _ in strip if style)


async def test_gpu_lost_mid_run_is_shown_as_lost(close_sources):
    app, source = build_app(90, lose_gpu=(3, 80))
    close_sources(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        line = app.query_one(GpuGrid).lines_text[4]
        assert "LOST" in line and "not answering" in line


async def test_xids_show_on_their_cards_and_in_the_verdict():
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Pipeline

    source = Pipeline(SimulatedMachine("h100-sxm-8+xid=2:79+xid=4:31"))
    app = GputopApp(source, interval=0.1)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.monitor.verdict is not None and app.monitor.snapshots_seen >= 2, "a verdict")
            cards = app.query_one(GpuGrid).lines_text
            fault_line = next(line for line in cards if "XID 79" in line)
            assert fault_line.index("XID 79") > 60  # GPU2's card: the third of four columns
            assert any("XID 31" in line for line in cards) and sum("XID" in line for line in cards) == 2
            assert app.monitor.verdict.line.startswith("XID 79 on GPU 2: GPU has fallen off the bus")
            assert "more" not in app.monitor.verdict.line  # the verdict widget says "+N more (f)" itself, once
            assert {f.id for f in app.monitor.verdict.findings} >= {"xid", "xid_code"}
            await pilot.press("q")
    finally:
        app.monitor.wait_for_collector()
        source.close()


# ------------------------------------------------------------------ job panel and stacks
async def test_job_tree_rows_and_stacks_innermost_last(close_sources):
    app, source = build_app(20, with_job=True)
    close_sources(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        panel = app.query_one(JobPanel)
        kinds = [row.kind for row in panel.rows]
        assert kinds[:4] == ["launcher", "rank", "worker", "worker"]
        assert panel.rows[1].gpus == "GPU0" and panel.rows[1].note == "waiting for data"
        job = source._snapshots[-1].job
        assert job.cores and app.query_one(CpuHeatmap).job_cores == frozenset(job.cores)  # the collector's, not recomputed
        stacks = "\n".join(app.query_one(StacksPanel).lines_text)
        assert "rank 6" in stacks and "collective/barrier" in stacks  # launcher: per-rank states
        await pilot.press("j")
        await pilot.pause()
        assert panel.selected_pid == 1001
        lines = app.query_one(StacksPanel).lines_text
        frames = [line.strip() for line in lines if "py:" in line]
        assert frames[0].startswith("<module>") and frames[-1].startswith("→ _pin_memory_loop")
        main_frames = frames[: frames.index(next(f for f in frames if f.startswith("→"))) + 1]
        assert main_frames[-1].startswith("→ select")  # innermost last, marked
        assert any("2/2 workers in" in line for line in lines)


async def test_exited_rank_shows_exited_and_keeps_last_stacks(close_sources):
    machine = make_machine()
    snaps = make_snapshots(10, with_job=True)
    last = snaps[-1]
    exited_job = make_job(10, exited_pids=(1001,))
    snaps.append(Snapshot(timestamp=SCREEN_T0 + 10, host=last.host, gpus=last.gpus, job=exited_job, simulated=True))
    source = ScriptedSource(machine, snaps)
    close_sources(source)
    app = GputopApp(source, interval=0.001, diagnose=lambda h, b, t, c: ([], "ok"))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press("j")
        await pilot.pause()
        lines = app.query_one(StacksPanel).lines_text
        assert "exited" in lines[0] and "last stacks" in lines[0]
        assert any("select" in line for line in lines)
        row = next(line for line in app.query_one(JobPanel).lines_text if "rank 0" in line)
        assert "exited" in row


async def test_enter_attaches_to_the_selected_process(close_sources):
    app, source = build_app(5)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        panel = app.query_one(JobPanel)
        assert panel.rows and panel.rows[0].pid == 1001
        await pilot.press("enter")
        await wait_for(pilot, lambda: source.attached == [1001], "attach(1001)")


async def test_jobs_discovered_by_the_source_are_listed_and_enter_attaches_their_launcher(close_sources):
    # the app discovers nothing itself: the jobs it lists are the ones the snapshot carries
    snaps = [dataclasses.replace(snap, jobs=(make_job(tick),)) for tick, snap in enumerate(make_snapshots(5))]
    source = ScriptedSource(make_machine(), snaps)
    close_sources(source)
    app, _ = build_app(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        panel = app.query_one(JobPanel)
        assert panel.title == "GPU JOBS (1)"
        assert [row.pid for row in panel.rows][:2] == [1000, 1001]  # the launcher, then its ranks
        await pilot.press("j", "enter")  # on rank 0: Enter attaches the whole job, by its launcher
        await wait_for(pilot, lambda: source.attached == [1000], "attach(1000)")


async def test_attach_failure_is_one_line_notification(close_sources):
    app, source = build_app(5)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        app.attach_job(4242)
        await wait_for(pilot, lambda: any("4242" in n.message for n in app._notifications), "the error")
        assert app.is_running


async def test_compact_enter_shows_stacks_and_sets_stacks_wanted(close_sources):
    app, source = build_app(10, with_job=True)
    close_sources(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        stacks = app.query_one(StacksPanel)
        assert not stacks.display and source.stacks_wanted is False
        await pilot.press("j", "enter")
        await pilot.pause()
        assert stacks.display and source.stacks_wanted is True
        await pilot.press("escape")
        await pilot.pause()
        assert not stacks.display and source.stacks_wanted is False


# ------------------------------------------------------------------ actions
async def test_screenshot_key_writes_svg(close_sources, tmp_path):
    app, source = build_app(5, tmp_path=tmp_path)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press("s")
        await wait_for(pilot, lambda: list(tmp_path.glob("*.svg")), "the screenshot file")
    svg = next(tmp_path.glob("*.svg"))
    assert "GPU0" in svg.read_text() and svg.name.startswith("gputop-dgx-test-01-")


async def test_findings_screen_shows_evidence(close_sources):
    app, source = build_app(10)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source)
        assert "Input-bound: rank 0" in app.query_one("#verdict").lines_text[0]
        await pilot.press("f")
        await pilot.pause()
        text = "\n".join(str(w.render()) for w in app.screen.query("Static"))
        assert "GPU utilization mean 41% over 90 s" in text and "num_workers=12" in text


async def test_bench_modal_confirms_tier_and_shows_result(close_sources, monkeypatch):
    calls = []

    class FakeResult:
        def summary_lines(self):
            return ["consumption 12.2 batches/s, waiting for data 49%", "recommendation: num_workers=8"]

    def run_benchmark(pid, *, seconds, allow_inject, progress):
        calls.append((pid, seconds, allow_inject))
        progress(0.5, "sampling the main thread")
        return FakeResult()

    monkeypatch.setitem(sys.modules, "gputop.bench", types.SimpleNamespace(run_benchmark=run_benchmark))
    app, source = build_app(10, with_job=True)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press("b")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "BenchScreen", "the bench dialog")
        assert calls == []  # nothing runs before the user picks a tier
        await pilot.press("a")
        await wait_for(pilot, lambda: app.monitor.bench is not None, "the benchmark result")
        await pilot.pause()
        body = str(app.screen.query_one("#bench-body").render())
        assert "num_workers=8" in body
    assert calls == [(1001, 15.0, True)]  # rank 0 of the attached job, active tier confirmed


async def test_report_key_writes_a_report(close_sources, tmp_path):
    pytest.importorskip("gputop.report.markdown")
    pytest.importorskip("gputop.report.writer")
    app, source = build_app(10, tmp_path=tmp_path)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        await pilot.press("r")
        await wait_for(pilot, lambda: list(tmp_path.glob("gputop-report-*.md")), "the report file", timeout=30)
    text = next(tmp_path.glob("gputop-report-*.md")).read_text()
    assert "GPUs starved by the input pipeline" in text


class FakeControls:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.position = 30.0
        self.duration = 100.0

    def pause(self):
        self.calls.append(("pause",))

    def resume(self):
        self.calls.append(("resume",))

    def seek(self, seconds):
        self.calls.append(("seek", seconds))

    def set_speed(self, speed):
        self.calls.append(("speed", speed))


async def test_replay_keys_drive_the_controls(close_sources):
    controls = FakeControls()
    app, source = build_app(5, controls=controls)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        assert "REPLAY 00:30/01:40" in app.query_one("#header").lines_text[0]
        await pilot.press("space", "right", "left", "greater_than_sign", "space")
        await pilot.pause()
    assert controls.calls == [("pause",), ("seek", 40.0), ("seek", 20.0), ("speed", 2.0), ("resume",)]


async def test_replay_keys_are_off_without_controls(close_sources):
    app, source = build_app(5)
    close_sources(source)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app, source, diagnosis=False)
        assert all(b.id not in ("replay.back", "replay.forward") for b in app.global_bindings())
        await pilot.press("right")
        assert app.replay_speed == 1.0


# ------------------------------------------------------------------ pure parts
def test_sparkline_scale_is_fixed_0_to_100():
    assert spark_text([50.0, 51.0, 50.0]) == "▄▄▄"  # the stock Sparkline would draw these full height
    assert spark_text([0.0, 100.0, None, -1.0]) == " █ ·"


def test_sparkline_spans_at_least_a_minute():
    for cells in (4, 24, 29, 34, 60, 120):
        assert spark_seconds_per_cell(cells, 1.0) * cells >= 60
    assert spark_seconds_per_cell(24, 5.0) == 5.0


def test_buckets_are_aligned_to_time_so_old_cells_never_change():
    snaps = make_snapshots(40, gpus=2, cores=4)
    before = utilization_buckets(snaps[:39], [0, 1], 10, 3.0)
    after = utilization_buckets(snaps, [0, 1], 10, 3.0)
    # SCREEN_T0 + 39 opens no new bucket (39 // 3 == 13 == 38 // 3): only the newest cell may change
    assert before[0][:-1] == after[0][:-1]


def test_buckets_kept_between_frames_are_the_buckets_computed_afresh():
    """The grid keeps closed buckets between frames: frame after frame, a new history and a changed value in a
    bucket the cache holds give what computing every bucket afresh gives."""
    snaps = make_snapshots(60, gpus=2, cores=4, lose_gpu=(1, 40))  # a lost GPU's cells: -1.0, then none
    closed: dict = {}
    for end in range(1, len(snaps) + 1):
        assert utilization_buckets(snaps[:end], [0, 1], 10, 3.0, closed) == utilization_buckets(snaps[:end], [0, 1], 10, 3.0)
    assert closed and all(key[1] < int(snaps[-1].timestamp // 3.0) for key in closed)  # only closed buckets kept
    assert len(closed) <= 9  # those that left the window are dropped
    # a new history over the same seconds (a replay seeking back, the case study's next stage): other values
    other = [dataclasses.replace(s, gpus=tuple(dataclasses.replace(g, utilization_gpu=5.0) for g in s.gpus)) for s in snaps]
    again = utilization_buckets(other[:45], [0, 1], 10, 3.0, closed)
    assert again == utilization_buckets(other[:45], [0, 1], 10, 3.0)


def test_changed_span_covers_only_the_changed_cells():
    bold = Style(bold=True)  # the widgets reuse cached Style objects, and the diff compares them by identity
    a = LineBuilder().add("GPU0 ", bold).add("97%  62/80G").strip(20)
    b = LineBuilder().add("GPU0 ", bold).add("98%  62/80G").strip(20)
    assert _changed_span(a, b) == (6, 7)
    assert _changed_span(a, a) is None
    c = LineBuilder().add("GPU0 ", Style(bold=True, color="red")).add("97%  62/80G").strip(20)
    assert _changed_span(a, c) == (0, 5)  # a style change repaints those cells too


def test_gpu_users_prefers_ranks_over_raw_pids():
    snap = make_snapshots(1, with_job=True)[0]
    users = gpu_users(snap)
    assert users[0] == "r0 1001"
    plain = make_snapshots(1)[0]
    assert gpu_users(plain)[0] == "pid 1001" and 6 not in gpu_users(plain)


def test_changed_spans_skip_long_unchanged_runs():
    from gputop.tui.canvas import _changed_spans

    a = LineBuilder().add("97%" + " " * 30 + "62/80G").strip(40)
    b = LineBuilder().add("98%" + " " * 30 + "63/80G").strip(40)
    assert _changed_spans(a, b) == [(1, 2), (34, 35)]  # two small repaints, not the 34 cells between


async def test_replay_of_a_real_recording_keeps_every_sample_and_restarts_after_seek(tmp_path):
    """The record/replay engineer's ReplaySource, on a recording written by RecordingWriter."""
    from gputop.recording import RecordingWriter, ReplaySource
    from gputop.sim.fake_nvml import ManualClock

    machine = make_machine()
    path = str(tmp_path / "run.gputop")
    writer = RecordingWriter(path, machine)
    for snap in make_snapshots(120, gpus=8, cores=16):
        writer.write(snap)
    writer.close()
    clock = ManualClock(start=0.0)
    source = ReplaySource(path, speed=4.0, clock=clock)
    app = GputopApp(source, interval=0.01, controls=source, diagnose=lambda h, b, t, c: ([], "ok"))
    async with app.run_test(size=(120, 40)) as pilot:
        clock.advance(10.0)  # 40 s of recording at 4x
        await wait_for(pilot, lambda: len(app.monitor.history) == 41, "every sample of the first 40 s")
        assert [s.timestamp for s in app.monitor.history] == [SCREEN_T0 + i for i in range(41)]
        await pilot.press("left")  # back 10 s: the history starts over at 30 s
        await wait_for(
            pilot, lambda: app.monitor.history.latest and app.monitor.history.latest.timestamp == SCREEN_T0 + 30, "the seek"
        )
        assert len(app.monitor.history) == 31
        await wait_for(pilot, lambda: "REPLAY 00:30/01:59 ×4" in app.query_one("#header").lines_text[0], "the header")


async def test_replay_shows_the_interpretation_the_recording_carries(tmp_path):
    """The TUI reads the collector's main-thread states, job cores and placement warnings from the snapshot:
    a replay shows what was decided live, even where working it out again from the stacks would differ."""
    from gputop.recording import RecordingWriter, ReplaySource
    from gputop.sim.fake_nvml import ManualClock

    machine = make_machine(cores=128)
    path = str(tmp_path / "run.gputop")
    snaps = make_snapshots(5, gpus=8, cores=128, with_job=True)
    # every rank's stack is the DataLoader wait (classified "waiting for data"); the collector said otherwise
    warning = "ranks 0 and 1 share GPU 0: set the device from LOCAL_RANK"
    snaps = [
        dataclasses.replace(
            s,
            job=dataclasses.replace(
                s.job,
                cores=(77,),
                warnings=(warning,),
                ranks=tuple(dataclasses.replace(r, main_thread_state="in dataset code") for r in s.job.ranks),
            ),
        )
        for s in snaps
    ]
    with RecordingWriter(path, machine) as writer:
        for snap in snaps:
            writer.write(snap)
    clock = ManualClock(start=0.0)
    source = ReplaySource(path, speed=1.0, clock=clock)
    app = GputopApp(source, interval=0.01, controls=source, diagnose=lambda h, b, t, c: ([], "ok"))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            clock.advance(4.0)
            await wait_for(pilot, lambda: len(app.monitor.history) == 5, "the whole recording")
            await wait_for(pilot, lambda: app.query_one(JobPanel).rows, "the job tree")
            await pilot.pause()
            assert app.query_one(CpuHeatmap).job_cores == frozenset({77})  # not the processes' own cores
            assert list(app.query_one(JobPanel).warnings) == [warning]
            stacks = app.query_one(StacksPanel).lines_text
            per_rank = [line for line in stacks if line.strip().startswith("rank ")]
            assert len(per_rank) == 8 and all("in dataset code" in line for line in per_rank), per_rank
    finally:
        source.close()


def test_machine_picture_draws_numa_nodes_switches_fabric_and_marks_a_degraded_link():
    from gputop.model import MachineInfo, NvLinkLink, PcieLink, Topology
    from gputop.tui.screens import machine_picture

    # 4 GPUs: 0-1 behind one PCIe switch on NUMA 0, 2-3 on NUMA 1; NVLink pairs 0-1 and 2-3 only
    links = {(0, 1): "NV4", (2, 3): "NV4", (0, 2): "SYS", (0, 3): "SYS", (1, 2): "SYS", (1, 3): "SYS"}
    matrix = tuple(tuple("X" if i == j else links.get((min(i, j), max(i, j)), "SYS") for j in range(4)) for i in range(4))
    machine = MachineInfo(
        hostname="box",
        gpu_count=4,
        topology=Topology(matrix=matrix, cpu_affinity=("0-31", "0-31", "32-63", "32-63"), numa_node=(0, 0, 1, 1)),
    )
    pcie_matrix = tuple(tuple("PIX" if {i, j} == {0, 1} else c for j, c in enumerate(row)) for i, row in enumerate(matrix))
    snap = make_snapshots(1, gpus=4)[0]
    direct = tuple(NvLinkLink(k, True, remote_kind="gpu") for k in range(4))  # GPU to GPU, no switch
    gpus = [dataclasses.replace(g, nvlink=direct) for g in snap.gpus]
    gpus[3] = dataclasses.replace(gpus[3], utilization_gpu=90.0, pcie=PcieLink(3, 5, 8, 16))
    snap = dataclasses.replace(snap, gpus=tuple(gpus))
    text = machine_picture(machine, snap).plain
    assert "NUMA 0 · cores 0-31" in text and "NUMA 1 · cores 32-63" in text
    assert "NV4 ×2: 0═1 2═3" in text and "NVSwitch" not in text
    assert "GPU3▼" in text and "GPU3: PCIe Gen3 x8 of Gen5 x16 under load" in text
    switched = dataclasses.replace(machine, topology=dataclasses.replace(machine.topology, matrix=pcie_matrix))
    assert "PCIe switch ┬ GPU0 ┬ GPU1" in machine_picture(switched, snap).plain  # one switch for both


def test_machine_picture_places_each_nic_beside_its_switch_or_its_numa_node():
    from gputop.model import MachineInfo, NicInfo, Topology
    from gputop.tui.screens import machine_picture

    # GPUs 0-1 share a switch with mlx5_0 (PIX/PXB); GPU 2 has its own with mlx5_1; eno1 and mlx5_2 sit on
    # root ports of their own (PHB/NODE), mlx5_2 on a node without GPUs
    pairs = {(0, 1): "PXB"}
    matrix = tuple(tuple("X" if i == j else pairs.get((min(i, j), max(i, j)), "SYS") for j in range(3)) for i in range(3))
    nics = (NicInfo("mlx5_0", 0, rdma=True), NicInfo("mlx5_1", 1, rdma=True), NicInfo("eno1", 0), NicInfo("mlx5_2", 2, rdma=True))
    nic_matrix = (
        ("PIX", "PXB", "SYS", "X", "SYS", "PHB", "SYS"),
        ("SYS", "SYS", "PIX", "SYS", "X", "SYS", "SYS"),
        ("PHB", "PHB", "SYS", "PHB", "SYS", "X", "SYS"),
        ("SYS", "SYS", "SYS", "SYS", "SYS", "SYS", "X"),
    )
    topo = Topology(matrix=matrix, cpu_affinity=("0-7", "0-7", "8-15"), numa_node=(0, 0, 1), nics=nics, nic_matrix=nic_matrix)
    text = machine_picture(MachineInfo(hostname="box", gpu_count=3, topology=topo), None).plain
    node0, node1, node2 = text.split("┌ ")[1:4]
    assert "PCIe switch ┬ GPU0 ┬ GPU1 ┬ mlx5_0" in node0 and "NIC ──────── eno1" in node0
    assert "PCIe switch ┬ GPU2 ┬ mlx5_1" in node1 and "eno1" not in node1
    assert node2.startswith("NUMA 2\n") and "NIC ──────── mlx5_2" in node2  # a node with a NIC and no GPU
    assert "4 NICs (NIC0–NIC2 in topo -m)" in text
    assert "NICs: not read" in machine_picture(MachineInfo(hostname="box", topology=Topology(matrix=matrix)), None).plain


def test_topology_dialog_shows_the_nic_columns_and_legend_where_they_fit():
    from gputop.tui.screens import TopologyScreen, nic_legend, topology_matrix

    machine = make_machine()
    names = [column.header for column in topology_matrix(machine).columns[1:]]
    assert names == [f"GPU{i}" for i in range(8)] + [f"NIC{k}" for k in range(8)]
    assert nic_legend(machine).plain.startswith("NIC Legend:  NIC0: mlx5_0  NIC1: mlx5_1")

    async def shown(size):
        app, source = build_app(3, source=ScriptedSource(machine, make_snapshots(3)))
        try:
            async with app.run_test(size=size) as pilot:
                await settle(pilot, app, source, diagnosis=False)
                await pilot.press("T")
                await wait_for(pilot, lambda: isinstance(app.screen, TopologyScreen), "the topology dialog")
                await pilot.pause()
                return "\n".join(str(w.render()) for w in app.screen.query("Static"))
        finally:
            source.close()

    import asyncio

    wide, narrow = asyncio.run(shown((160, 48))), asyncio.run(shown((80, 24)))
    assert "NIC Legend:" in wide and "need" not in wide
    assert "NIC Legend:" not in narrow, narrow
    assert "NIC0–NIC7 columns need a terminal 90 columns wide" in narrow, narrow  # 80 + 6 = 96% of 90


async def test_the_heap_is_handed_back_once_the_first_verdict_is_on_screen_and_then_on_a_cadence(close_sources, monkeypatch):
    import gputop.tui.app as app_module

    calls: list[int] = []
    app, source = build_app(30)
    close_sources(source)
    monkeypatch.setattr(app_module, "give_back_freed_memory", lambda: calls.append(app.diagnoses_done))
    monkeypatch.setattr(app_module, "HEAP_TRIM_EVERY", 0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: len(calls) >= 3, "the first hand-back and two on the cadence")
    assert calls[0] == 1  # made with the first verdict drawn, not before it (start-up's frames come first)

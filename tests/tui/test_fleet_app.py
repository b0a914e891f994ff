"""`gputop fleet`: the live cross-node screen over the same Prometheus stand-in tests/test_fleet.py feeds from
real Exporters: two nodes of one 8-rank job, global rank 5 (node1) with a slow loader.

Node0's GPU utilization comes as dcgm-exporter exports it (`DCGM_FI_DEV_GPU_UTIL`), node1's from its
`gputop serve --dcgm-fields`.  The unreachable-Prometheus and command-line tests go over a real loopback
socket to the real `PrometheusApi` client (tests/harness/prometheus_api.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gputop.analysis.stack_classes import COLLECTIVE, FORWARD_BACKWARD, WAITING_FOR_DATA
from gputop.cli import main
from gputop.commands.fleet_report import build
from gputop.exporter import Exporter
from gputop.fleet.live import read_round
from gputop.fleet.prometheus import PrometheusApi
from gputop.fleet.view import fleet_view, judge
from gputop.tui.fleet_app import FleetApp, FleetStatusLine, JobsScreen
from gputop.tui.look import level_char
from gputop.tui.screens import HelpScreen
from tests.harness import histories as hb
from tests.harness.processes import free_port
from tests.harness.prometheus_api import PrometheusStandIn
from tests.harness.tui import wait_for
from tests.test_fleet import RANKS_PER_NODE, RUN_ID, NodeSource, PromLike, exposition, node_exporter

URL = "http://prometheus.test:9090"
SLOW_LOADER = hb.cycle([WAITING_FOR_DATA, WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD])
STRAGGLER_GPU_UTIL = 30.0  # node1's GPU 1, whose rank waits for its data


def dcgm_exporter_text(hostname: str, utilization: dict[int, float]) -> str:
    """What dcgm-exporter serves for a node's GPUs' utilization (its metric name and labels)."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for gpu, percent in utilization.items():
        labels = f'gpu="{gpu}",UUID="GPU-{hostname}-{gpu}",device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{hostname}"'
        lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {percent}")
    return "\n".join(lines) + "\n"


def node1_with_dcgm_fields() -> Exporter:
    """Node1's `gputop serve --dcgm-fields`: local rank 1 (global rank 5) starves, its GPU idles at 30%."""
    default = hb.cycle([FORWARD_BACKWARD, COLLECTIVE])
    specs = [
        hb.RankSpec(pid=1000 + i, rank=i, gpus=(i,), state=SLOW_LOADER if i == 1 else default, cpu=lambda t: 30.0)
        for i in range(RANKS_PER_NODE)
    ]
    scenario = hb.Scenario(seconds=60.0, ranks=specs, util=lambda g, t: STRAGGLER_GPU_UTIL if g == 1 else 95.0)
    source = NodeSource(hb.build(scenario), 1)
    exporter = Exporter(source, interval=1.0, hostname="node1", dcgm_fields=True, log=lambda line: None)
    for _ in source.snaps:
        exporter.cycle()
    return exporter


def two_node_prometheus(*more_texts: str) -> PromLike:
    node0 = exposition(node_exporter(0, {}))
    node0_dcgm = dcgm_exporter_text("node0", dict.fromkeys(range(8), 97.0))
    return PromLike([node0, node0_dcgm, exposition(node1_with_dcgm_fields()), *more_texts], at=hb.T0 + 60.0)


def fleet_app(prom, url: str = URL, job=None, interval: float = 3600.0, **kwargs) -> FleetApp:
    first = read_round(prom, job, url)
    assert first.error is None, first.error
    return FleetApp(prom, url, first, auto_picked=job is None, interval=interval, **kwargs)


@pytest.fixture(scope="module")
def prom() -> PromLike:
    return two_node_prometheus()


# ----------------------------------------------------------------- what the screen says


async def test_the_screen_shows_both_nodes_every_rank_with_its_node_and_the_straggler(prom):
    app = fleet_app(prom)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        text = app.screen_text()
    lines = text.splitlines()
    assert "job llama-run-42  2 nodes · 8 ranks" in lines[0], lines[0]
    # the verdict across nodes: the one `gputop report --prometheus` gives, naming the rank and its node
    verdict = judge(fleet_view(prom))
    assert (verdict.kind, verdict.node, verdict.rank) == ("straggler", "node1", 5)
    assert "Verdict: rank 5 on node1 (node 1 of 2) is the straggler" in lines[1], lines[1]
    # nodes × GPUs: node0's utilization from dcgm-exporter, node1's from serve --dcgm-fields (GPU 1 at 30%)
    node_rows = {
        m.group(1): m.group(0)
        for m in re.finditer(r"^ ?(node[01]) .*$", text, re.M)
        if "0/2" in m.group(0) or "1/2" in m.group(0)
    }
    assert set(node_rows) == {"node0", "node1"}, text
    assert re.search(r"node0\s+0/2\s+████████\s+97%\s+ok\s+0–3", node_rows["node0"]), node_rows["node0"]
    gpus = "█" + level_char(STRAGGLER_GPU_UTIL) + "█" * 6
    assert re.search(rf"node1\s+1/2\s+{gpus}\s+87%\s+ok\s+4–7", node_rows["node1"]), node_rows["node1"]
    # every rank with its node and local rank; only rank 5 is marked, as the straggler
    rank_rows = {int(m.group(1)): m.group(0) for m in re.finditer(r"^[ ▲]*(\d+) +node\d.*$", text, re.M)}
    assert sorted(rank_rows) == list(range(8)), text
    for rank, row in rank_rows.items():
        assert re.match(rf"^[ ▲]*{rank} +node{rank // 4} +{rank % 4} ", row), row
        assert ("▲" in row) == (rank == 5), row
    assert re.search(r"data_wait\s+█+░*\s+7\d%", rank_rows[5]), rank_rows[5]
    assert "node1: straggler (warning, code)" in text
    assert "Jobs in Prometheus: llama-run-42 (8 ranks, followed)" in text


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
async def test_a_prometheus_that_goes_away_mid_run_is_a_status_line_and_the_screen_retries(prom):
    server = PrometheusStandIn(prom).start()
    api = PrometheusApi(server.url, timeout=5.0)
    app = fleet_app(api, url=api.url, interval=0.2)
    status = None
    try:
        async with app.run_test(size=(120, 30)) as pilot:
            status = app.query_one(FleetStatusLine)
            await wait_for(pilot, lambda: app.rounds >= 1 and app.error is None, "a refresh over the socket")
            server.stop()
            await wait_for(pilot, lambda: app.error is not None, "the refresh that finds Prometheus gone")
            line = status.lines_text[0]
            assert line.startswith(f" ✖ cannot reach Prometheus at {api.url}: "), line
            assert line.rstrip().endswith("· showing 13:47:40 UTC · retrying every 0.2 s"), line
            assert "STALE" in app.query_one("#header").lines_text[0]
            assert "straggler" in app.query_one("#verdict").lines_text[0]  # the last view stays on screen
            server.start()  # the same port again: Prometheus is back
            await wait_for(pilot, lambda: app.error is None, "the refresh after Prometheus came back")
            assert status.lines_text[0].startswith(f" ● Prometheus {api.url} · as of 13:47:40 UTC"), status.lines_text
            assert "STALE" not in app.query_one("#header").lines_text[0]
    finally:
        server.stop()


async def test_r_writes_the_report_prometheus_gives_and_says_where(prom, tmp_path: Path):
    app = fleet_app(prom, report_dir=str(tmp_path))
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("r")
        await wait_for(pilot, lambda: list(tmp_path.glob("gputop-fleet-report-*.md")), "the report file")
        said = [n.message for n in app._notifications]
    (path,) = tmp_path.glob("gputop-fleet-report-llama-run-42-*.md")
    assert path.read_text() == build(prom, URL, RUN_ID, "md")
    assert f"wrote {path}" in said, said


async def test_without_job_it_follows_the_most_ranks_and_enter_on_j_follows_another():
    other = exposition(node_exporter(0, {})).replace(RUN_ID, "small-run").replace('Hostname="node0"', 'Hostname="node7"')
    prom = two_node_prometheus(other)
    app = fleet_app(prom, interval=0.2)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        jobs_line = next(line for line in app.screen_text().splitlines() if line.startswith("Jobs in Prometheus"))
        assert "llama-run-42 (8 ranks, followed) · small-run (4 ranks) · followed: the most ranks" in jobs_line, jobs_line
        await pilot.press("j")
        await wait_for(pilot, lambda: isinstance(app.screen, JobsScreen), "the job picker")
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.view.job == "small-run", "the picked job on screen")
        text = app.screen_text()
    # its serve says 2 nodes and 8 ranks; Prometheus holds one node's: the header says how much it sees
    assert "job small-run  1 node of 2 · 4 ranks of 8" in text.splitlines()[0], text
    assert re.findall(r"^ *\d+ +(node\d)", text, re.M) == ["node7"] * 4


# ----------------------------------------------------------------- the command line


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_bad_starts_are_one_line_and_the_report_s_exit_codes(capsys):
    nobody = free_port()
    server = PrometheusStandIn(two_node_prometheus()).start()
    try:
        cases = [
            (["fleet", "--prometheus", "ftp://x"], 2, "--prometheus 'ftp://x' is not an HTTP address"),
            (["fleet", "--prometheus", f"127.0.0.1:{nobody}"], 1, f"cannot reach Prometheus at http://127.0.0.1:{nobody}: "),
            (
                ["fleet", "--prometheus", server.url, "--job", "nope"],
                1,
                f"no job 'nope' in Prometheus at {server.url} (jobs there: {RUN_ID})",
            ),
            (["--pid", "1", "fleet", "--prometheus", server.url], 2, "drop --pid"),
        ]
        for argv, code, said in cases:
            assert main(argv) == code, argv
            err = capsys.readouterr().err
            assert err.startswith("gputop: ") and said in err and err.count("\n") == 1, err
    finally:
        server.stop()


# ----------------------------------------------------------------- snapshots


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_fleet_screen(snap_compare, prom, size):
    assert snap_compare(fleet_app(prom), terminal_size=size)


async def test_question_mark_lists_the_fleet_keys(prom):
    app = fleet_app(prom)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        described = {b.description for _title, bindings in app.screen.sections for b in bindings}
    assert {"Quit", "Help", "Report", "Pick a job", "Read now"} <= described, described


# ----------------------------------------------------------------- 256 nodes


async def test_at_256_nodes_the_first_screen_names_every_outlier_and_the_heat_strip_marks_them():
    """The first screen at 120×40 over 256 nodes × 8 GPUs (tests/harness/fleet_scale.py): the hung rank as
    the verdict, the straggler, the node that stopped reporting and the NIC-down node right under it, each
    with its node (and rank); then the outlier nodes' rows and the heat strip of every node."""
    from tests.harness import fleet_scale as fs
    from tests.test_fleet_scale import fleet_prom

    fleet = fs.Fleet.of(256)
    want = fs.expected(fleet)
    app = fleet_app(fleet_prom(256))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        top = [
            line
            for widget in ("#verdict", "#outliers")
            for line in app.query_one(widget).lines_text  # type: ignore[attr-defined]
        ]
        text = app.screen_text()
        heat = app.query_one("#heat")
        assert heat.display and heat.region.y < 40
    hung_node, hung_rank = want["hung"]
    slow_node, slow_rank = want["straggler"]
    assert f"Verdict: rank {hung_rank} on {hung_node}" in top[0], top
    assert any(f"rank {slow_rank} on {slow_node}" in line and "straggler" in line for line in top), top
    assert any(line.startswith(f" ? {want['stopped']} stopped reporting") for line in top), top
    assert any(f"{want['nic_down'][0]} has a degraded part: nic_down on NIC {fs.NIC_DOWN}" in line for line in top), top
    # the outlier nodes' rows come first, then the strip: 256 nodes, each a block of 8 cells
    rows = re.findall(r"^(node\d{3}) +\d+/256", text, re.M)
    assert rows[:4] == [hung_node, slow_node, want["stopped"], want["nic_down"][0]], rows
    strip = [line for line in text.splitlines() if re.match(r"^node\d{3} [^ ]{8}( [^ ]{8})+$", line)]
    blocks = [b for line in strip for b in line.split()[1:]]
    assert len(blocks) == 256, strip
    assert blocks[fleet.stopped] == "?" * 8
    assert blocks[fleet.straggler][fs.STRAGGLER_LOCAL_RANK] == "▲" and blocks[fleet.hung][fs.HUNG_LOCAL_RANK] == "✖"
    assert f"{255 * 8 - 12} more ranks: / filters by node, rank or state" in text
    assert "job llama-256  255 nodes of 256 · 2040 ranks of 2048" in text.splitlines()[0], text.splitlines()[0]


async def test_slash_filters_by_node_rank_or_state_and_escape_clears():
    from tests.harness import fleet_scale as fs
    from tests.test_fleet_scale import fleet_prom

    fleet = fs.Fleet.of(64)
    want = fs.expected(fleet)
    app = fleet_app(fleet_prom(64))

    def rank_rows() -> list[tuple[int, str]]:
        return [(int(r), n) for r, n in re.findall(r"^[ ✖▲?]*(\d+) +(node\d{3}) ", app.screen_text(), re.M)]

    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("slash")
        await pilot.press(*fleet.hostname(fleet.nic_down))
        await wait_for(pilot, lambda: app.filter_text == fleet.hostname(fleet.nic_down), "the node filter")
        assert sorted(rank_rows()) == [(fleet.rank(fleet.nic_down, i), fleet.hostname(fleet.nic_down)) for i in range(8)]
        assert "filter 'node" in app.screen_text() and "1 node, 8 ranks" in app.screen_text()
        await pilot.press("enter")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.filter_text == "", "the filter cleared")
        await pilot.press("slash", *str(want["straggler"][1]))
        await wait_for(pilot, lambda: rank_rows() == [want["straggler"][::-1]], "the rank filter")
        await pilot.press("ctrl+a", "ctrl+k", *"hung q")  # a state, and q typed into the filter does not quit
        await wait_for(pilot, lambda: app.filter_text == "hung q", "the state filter")
        assert rank_rows() == [want["hung"][::-1]], rank_rows()
        assert app.is_running

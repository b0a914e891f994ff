"""Issue 25 items 1-7: the shapes of real machines, each tried on the capture that shows it.

Every machine is a capture of tests/fixtures/captures (sources in its README) served by the fake NVML below
the real pynvml wrappers (`--simulate capture:DIR`); `gputop check` runs as `tests/test_captures.py` runs it.
Each rule that now calls a board's shape normal is also tried on the shape where the same reading is a
fault, so that no test passes by the rule saying nothing.  Quick lane: no processes are started.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gputop.analysis import gpu_health
from gputop.analysis.findings import findings as assemble_findings
from gputop.analysis.machine_check import EXIT_CONFIG, EXIT_HEALTHY, PASS, SKIP, WARN, CheckReport, CheckResult
from gputop.backend import SimulatedMachine
from gputop.collect import gpu as gpu_collector
from gputop.history import History
from gputop.model import MachineInfo, NvLinkLink, Snapshot
from gputop.pipeline import Pipeline
from gputop.tui.screens import affinity_table, machine_picture
from gputop.tui.widgets.gpu_grid import NO_NEAR_CPUS_WORD, GpuGrid
from tests.test_captures import CAPTURES, check_capture, possible_cpus_for


def capture(name: str) -> Path:
    return CAPTURES / name


def poll(name: str, polls: int = 1) -> tuple[MachineInfo, list[Snapshot]]:
    with Pipeline(SimulatedMachine(f"capture:{capture(name)}")) as pipeline:
        snaps = [pipeline.poll() for _ in range(polls)]
        return pipeline.machine, snaps


def line(report: CheckReport, check_id: str) -> CheckResult:
    return next(r for r in report.results if r.id == check_id)


def card_text(snap: Snapshot, no_near_cpus: tuple[int, ...] = ()) -> str:
    """What the real card widget draws for the snapshot's GPUs, as text."""
    grid = GpuGrid()
    grid.snapshots, grid.gpu_count, grid.no_near_cpus = [snap], len(snap.gpus), frozenset(no_near_cpus)
    return "\n".join(strip.text for strip in grid.build(160, 60))


# ------------------------------------------------------------------ item 1: a card without its NVLink bridge


@pytest.mark.parametrize("folder", ["rtx-a6000x3-one-unbridged-siboehm", "rtx-a6000x3-one-unbridged-constructed"])
def test_a_card_without_a_bridge_beside_a_bridged_pair_is_healthy(folder: str) -> None:
    """3x RTX A6000: GPUs 0-1 bridged (NV4), GPU 2 unbridged, its 4 links inactive: exit 0, no NVLink or
    topology finding, and the card does not draw GPU 2's links as a warning.  The real box (siboehm/bench) and
    the folder built before it was found, whose nvlink -s lists GPU 2's links one by one as <inactive>."""
    report = check_capture(capture(folder))
    assert report.exit_code == EXIT_HEALTHY, [r.line() for r in report.results if r.status != PASS]
    nvlink, topology = line(report, "nvlink.state"), line(report, "topology")
    assert nvlink.status == PASS and "4 of 4 up on 2 GPUs; GPU 2: no NVLink bridge (4 links inactive)" in nvlink.value
    assert topology.status == PASS and "GPU 2: NODE×2 (no other GPU of its model and NVLink class)" in topology.value
    _, (snap,) = poll(folder)
    peers = gpu_health.peers_of(snap.gpus)
    assert peers.bridged == {"NVIDIA RTX A6000"}
    assert [gpu_health.nvlink_class(g, peers) for g in snap.gpus] == ["bridged", "bridged", "no bridge"]
    assert all(not h.problems for h in gpu_health.judge_snapshot(snap.gpus).values())
    assert "NVLink" not in card_text(snap) and "WARN" not in card_text(snap)


def test_links_down_on_a_bridged_card_or_an_nvswitch_board_still_warn() -> None:
    """The same reading where it is a fault: half a bridge's links down on GPU 0 of the pair, and every link
    of one GPU down on the NVSwitch board (`hgx-h100-nv18-rail-nics`), whose links end at switches."""
    _, (snap,) = poll("rtx-a6000x3-one-unbridged-constructed")
    gpus = list(snap.gpus)
    half = tuple(dataclasses.replace(link, active=link.link < 2) for link in gpus[0].nvlink or ())
    gpus[0] = dataclasses.replace(gpus[0], nvlink=half)
    health = gpu_health.judge_snapshot(gpus)
    assert [p.word for p in health[0].problems] == ["NVLink 2 down"] and not health[2].problems

    _, (board,) = poll("hgx-h100-nv18-rail-nics")
    down = tuple(NvLinkLink(link.link, False) for link in board.gpus[3].nvlink or ())
    gpus = [dataclasses.replace(g, nvlink=down) if g.index == 3 else g for g in board.gpus]
    assert gpu_health.peers_of(gpus).bridged == frozenset()  # links to switches are no bridge
    health = gpu_health.judge_snapshot(gpus)
    assert [p.word for p in health[3].problems] == ["NVLink 18 down"]
    assert health[3].problems[0].severity == gpu_health.Severity.WARN


# ------------------------------------------------------------------ item 2: a NUMA node that holds one GPU


def test_a_gpu_alone_on_its_numa_node_is_the_boards_layout() -> None:
    """club-3090 #46's 5-GPU box: GPU 0 alone on NUMA node 1 reads SYS to every other GPU. Exit 0 (it was 4)."""
    report = check_capture(capture("consumer-5gpu-gpu0-alone-on-node1"))
    assert report.exit_code == EXIT_HEALTHY
    topology = line(report, "topology")
    assert topology.status == PASS and "GPU 0 alone on NUMA node 1 (the board's layout)" in topology.value


def test_a_gpu_that_differs_from_its_node_peers_still_warns(tmp_path: Path) -> None:
    """Four cards on one node, three behind one PCIe switch (PIX) and the fourth on the host bridge (PHB):
    a layout to look at, in `nvidia-smi topo -m`'s layout (not a capture)."""
    rows = [["X", "PIX", "PIX", "PHB"], ["PIX", "X", "PIX", "PHB"], ["PIX", "PIX", "X", "PHB"], ["PHB", "PHB", "PHB", "X"]]
    text = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\n"
    text += "".join(f"GPU{i}\t" + "\t".join(row) + "\t0-15\t0\n" for i, row in enumerate(rows))
    (tmp_path / "topo.txt").write_text(text)
    report = check_capture(tmp_path)
    topology = line(report, "topology")
    assert report.exit_code == EXIT_CONFIG and topology.status == WARN and topology.gpus == (3,)
    assert topology.value == "GPU 3 reads PHB×3 where the other GPUs read PIX to each other"


# ------------------------------------------------------------------ item 3: an empty affinity said plainly


def test_an_empty_affinity_is_said_on_the_card_the_dialog_and_in_the_placement_finding() -> None:
    """vLLM #19607's Slurm job: NVML's affinity masks empty for both GPUs."""
    machine, snaps = poll("slurm-2gpu-empty-affinity", polls=3)
    topology = machine.topology
    assert topology.gpus_without_near_cpus() == (0, 1)
    assert NO_NEAR_CPUS_WORD in card_text(snaps[-1], topology.gpus_without_near_cpus())
    picture = machine_picture(machine, snaps[-1]).plain
    assert "none of this job's CPUs are near GPUs 0, 1" in picture and "n/a" not in picture.splitlines()[0]
    rows = [" ".join(str(cell) for cell in column.cells) for column in affinity_table(machine, snaps[-1]).columns[1:2]]
    assert rows == ["none of this job's CPUs are near GPU 0 none of this job's CPUs are near GPU 1"]
    history = History(machine)
    for snap in snaps:
        history.append(snap)
    found = [f for f in assemble_findings(history) if f.id == "near_cpus"]
    assert len(found) == 1 and found[0].gpus == (0, 1) and found[0].severity == "warning"
    assert found[0].summary.startswith("None of this job's CPUs are near GPUs 0, 1")


def test_a_machine_with_near_cpus_has_no_placement_finding_and_no_card_word() -> None:
    machine, snaps = poll("rtx5090x2-phb", polls=3)
    assert machine.topology.cpu_affinity[0] and machine.topology.gpus_without_near_cpus() == ()
    history = History(machine)
    for snap in snaps:
        history.append(snap)
    assert not [f for f in assemble_findings(history) if f.id == "near_cpus"]
    assert NO_NEAR_CPUS_WORD not in card_text(snaps[-1], machine.topology.gpus_without_near_cpus())


# ------------------------------------------------------------------ items 4 and 5: the picture from NVML's facts


def test_nvswitch_is_drawn_only_where_the_links_end_at_a_switch() -> None:
    mesh = machine_picture(*_last("h100x4-nv6-strided-affinity")).plain  # 4x H100, direct NV6 between each pair
    assert "NVSwitch" not in mesh and "NVLink, 6 pairs GPU to GPU:\n  NV6 ×6: 0═1 0═2 0═3 1═2 1═3 2═3" in mesh
    pair = machine_picture(*_last("bridged-pair-nv3-partial-bridge")).plain  # a bridged pair
    assert "NVSwitch" not in pair and "NV3 ×1: 0═1" in pair
    switched = machine_picture(*_last("hgx-h100-nv18-rail-nics")).plain  # NVML: every link's remote is a switch
    assert "═══ NVSwitch: all 8 GPUs, NV18 between any two" in switched and "pairs" not in switched


def test_every_nvlink_pair_of_a_dgx1_is_drawn() -> None:
    """DGX-1's hybrid cube mesh: 16 pairs of NV1/NV2 (the picture stopped at 12)."""
    machine, snap = _last("dgx1-v100-hybrid-cube-mesh")
    text = machine_picture(machine, snap).plain
    matrix = machine.topology.matrix
    pairs = {(i, j, matrix[i][j]) for i in range(8) for j in range(i + 1, 8) if matrix[i][j].startswith("NV")}
    drawn = {
        (int(i), int(j), label)
        for label, joined in re.findall(r"(NV\d+) ×\d+: ([\d═ ]+)", text)
        for i, j in re.findall(r"(\d)═(\d)", joined)
    }
    assert len(pairs) == 16 and drawn == pairs and "NVLink, 16 pairs GPU to GPU:" in text


def _last(name: str) -> tuple[MachineInfo, Snapshot]:
    machine, snaps = poll(name)
    return machine, snaps[-1]


# ------------------------------------------------------------------ item 6: NVML refusing the topology call


def test_a_refused_topology_call_skips_with_one_line() -> None:
    """Two RTX A5000 from a -q -x alone: NVML refuses the common-ancestor call (topo -m reads N/A)."""
    topology = line(check_capture(capture("rtx-a5000x2-590")), "topology")
    assert topology.status == SKIP and "\n" not in topology.value
    assert topology.value == "NVML refused the topology call (topo -m reads N/A between the GPUs): not compared"


# ------------------------------------------------------------------ item 7: the mask sized from the possible CPUs


@pytest.mark.parametrize(("text", "count"), [("0-255\n", 256), ("0,2-5,8\n", 9), ("0\n", 1)])
def test_possible_cpus_reads_the_kernels_list(tmp_path: Path, text: str, count: int) -> None:
    (tmp_path / "possible").write_text(text)
    assert gpu_collector.possible_cpus(str(tmp_path / "possible")) == count


def test_possible_cpus_falls_back_to_the_cpu_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_collector.os, "cpu_count", lambda: 6)
    assert gpu_collector.possible_cpus(str(tmp_path / "absent")) == 6
    (tmp_path / "garbled").write_text("not a list\n")
    assert gpu_collector.possible_cpus(str(tmp_path / "garbled")) == 6


def test_cpus_above_the_cpu_count_stay_on_the_affinity_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DGX A100 in Slurm: the job's CPUs 48-63,176-191 where os.cpu_count() says 2 (PYTHON_CPU_COUNT, offline
    CPUs): the mask is sized from the possible-CPU list and keeps CPUs 176-191; sized from the CPU count it
    kept 48-63 only."""
    monkeypatch.setattr(gpu_collector.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(gpu_collector, "POSSIBLE_CPUS_FILE", str(tmp_path / "absent"))
    machine, _ = poll("dgx-a100-slurm-2of8")
    assert machine.topology.cpu_affinity == ("48-63", "48-63")  # what os.cpu_count() alone gives
    possible_cpus_for(capture("dgx-a100-slurm-2of8"), tmp_path, monkeypatch)
    machine, _ = poll("dgx-a100-slurm-2of8")
    assert machine.topology.cpu_affinity == ("48-63,176-191", "48-63,176-191")


@pytest.mark.integration  # Textual's pilot
def test_the_topology_dialog_on_a_dgx1_shows_every_pair() -> None:
    """The real app's T dialog over the DGX-1 capture, at 80x24 (the picture below the matrix) and 160x48."""
    import asyncio

    from rich.console import Console
    from textual.widgets import Static

    from gputop.tui.screens import TopologyScreen
    from tests.harness.histories import ScriptedSource
    from tests.harness.tui import build_app, settle, wait_for

    machine, snaps = poll("dgx1-v100-hybrid-cube-mesh", polls=3)

    async def shown(size: tuple[int, int]) -> str:
        app, source = build_app(source=ScriptedSource(machine, snaps))
        try:
            async with app.run_test(size=size) as pilot:
                await settle(pilot, app, source, diagnosis=False)
                await pilot.press("T")
                await wait_for(pilot, lambda: isinstance(app.screen, TopologyScreen), "the topology dialog")
                await pilot.pause()
                # each part as drawn at the width the dialog gives it (the dialog scrolls; nothing is cut)
                console = Console(record=True, width=app.screen.query_one("#topology").content_region.width)
                for part in app.screen.query(Static):
                    console.print(part.content)
                return console.export_text()
        finally:
            source.close()

    for size in ((80, 24), (160, 48)):
        text = asyncio.run(shown(size))
        assert "NVLink, 16 pairs GPU to GPU:" in text and "NVSwitch" not in text, text
        assert "NV1 ×8: 0═1 0═2 1═3 2═6 3═7 4═5 4═6 5═7" in text and "NV2 ×8: 0═3 0═4 1═2 1═5 2═3 4═7 5═6 6═7" in text

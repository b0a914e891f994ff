"""Real machines' captures (tests/fixtures/captures, sources in its README) replayed through the fake NVML.

For every capture folder the simulated machine (`--simulate capture:DIR`) is polled once through the real
pynvml wrappers, and what gputop reads back is compared with the capture itself, read here by a second,
deliberately small reading of the files (regular expressions over the text, not gputop.sim.capture):
the GPU count, the names, every GPU x GPU cell of `nvidia-smi topo -m`, each GPU's CPU affinity and NUMA node.
Then `gputop check` runs on each capture of a working machine and must exit 0, and the shapes of issue 25
(items 1-7) are each tried on the capture that shows them.
No processes are started: this is the quick lane.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import pytest

from gputop.analysis.machine_check import EXIT_CONFIG, EXIT_HEALTHY, CheckReport
from gputop.backend import SimulatedMachine
from gputop.check_window import Evidence
from gputop.collect import gpu as gpu_collector
from gputop.errors import UsageError
from gputop.pipeline import Pipeline
from gputop.sim.capture import UNKNOWN_CARD
from gputop.sim.spec import parse_spec

CAPTURES = Path(__file__).parent / "fixtures" / "captures"
FOLDERS = sorted(p for p in CAPTURES.iterdir() if p.is_dir())
_CELL = r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|N/A"


def expected_topology(folder: Path) -> Optional[tuple[list[list[str]], list[Optional[str]], list[Optional[int]]]]:
    """(cells, CPU affinity text, NUMA node) per GPU row of topo.txt, or None without one.

    A GPU row is "GPUi" then the cells; the CPU affinity is the first field after them that starts with a digit,
    the NUMA node the next one (when the header has a NUMA Affinity column)."""
    path = folder / "topo.txt"
    if not path.exists():
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", path.read_text())  # (a terminal's underline on the header)
    header = next(line for line in text.splitlines() if re.match(r"\s*GPU0\b", line))
    n = len(re.findall(r"\bGPU\d+\b", header))
    cells, affinity, numa = [], [], []
    for i in range(n):
        row = re.search(rf"^\s*GPU{i}\s+((?:{_CELL})\s.*)$", text, re.M)  # (not the header's "GPU0 GPU1")
        assert row is not None, f"{path}: no GPU{i} row"
        fields = row.group(1).split()
        cells.append(fields[:n])
        numbers = [f for f in fields[n:] if f[0].isdigit()]
        affinity.append(numbers[0] if numbers else None)
        # a NUMA Affinity list ("0-1") reads as its first node, as gputop keeps one node per GPU
        numa.append(int(re.split(r"\D", numbers[1])[0]) if "NUMA Affinity" in header and len(numbers) > 1 else None)
    return cells, affinity, numa


def expected_names(folder: Path, gpus: int) -> list[str]:
    for name in ("smi_q.xml", "smi_q.txt"):
        path = folder / name
        if path.exists():
            text = path.read_text()
            return re.findall(r"<product_name>(.*?)</product_name>", text) or re.findall(
                r"^\s*Product Name\s*:\s*(.*?)\s*$", text, re.M
            )
    if (folder / "nvlink.txt").exists():  # nvlink -s names each GPU: "GPU 0: NVIDIA RTX A6000 (UUID: ...)"
        return re.findall(r"^GPU \d+: (.*?) \(UUID", (folder / "nvlink.txt").read_text(), re.M)
    return [UNKNOWN_CARD.name] * gpus  # topo -m names no cards


def possible_cpus_for(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The captured machine's possible-CPU list, as its kernel would give it: up to its highest affinity id.
    gputop sizes NVML's affinity mask from that file (issue 25 item 7), whatever this host's CPU count."""
    topo = expected_topology(folder)
    highest = max((int(x) for cpus in (topo[1] if topo else []) if cpus for x in re.findall(r"\d+", cpus)), default=0)
    possible = tmp_path / "possible"
    possible.write_text(f"0-{max(highest, 1)}\n")
    monkeypatch.setattr(gpu_collector, "POSSIBLE_CPUS_FILE", str(possible))


def gpu_count(folder: Path) -> int:
    topo = expected_topology(folder)
    if topo is not None:
        return len(topo[0])
    smi = [p for p in folder.iterdir() if p.name.startswith("smi_q")]
    if smi:
        return len(re.findall(r"<gpu id=|^GPU [0-9A-F]{8}:", smi[0].read_text(), re.M))
    return len(re.findall(r"^GPU \d+: ", (folder / "nvlink.txt").read_text(), re.M))  # nvlink -s alone


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_capture_replays(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topo = expected_topology(folder)
    n = gpu_count(folder)
    # NVML fills the affinity mask only as far as the caller asks: the captured machine's possible CPUs
    possible_cpus_for(folder, tmp_path, monkeypatch)
    with Pipeline(SimulatedMachine(f"capture:{folder}")) as pipeline:
        snapshot = pipeline.poll()
        machine = pipeline.machine
    assert len(snapshot.gpus) == n == machine.gpu_count
    assert list(machine.gpu_names) == expected_names(folder, n)
    matrix = [list(row) for row in machine.topology.matrix]
    if topo is None:  # nothing says how the GPUs connect: NVML refuses, gputop shows N/A
        assert matrix == [["X" if a == b else "N/A" for b in range(n)] for a in range(n)]
        assert machine.topology.cpu_affinity == (None,) * n
        assert machine.topology.numa_node == (None,) * n
        return
    cells, affinity, numa = topo
    assert matrix == cells
    # topo -m prints an empty mask as nothing: gputop keeps it as an answer ("", NO_NEAR_CPUS), not None
    assert list(machine.topology.cpu_affinity) == [cpus or "" for cpus in affinity]
    assert list(machine.topology.numa_node) == numa


def test_the_corpus_covers_twenty_machines() -> None:
    assert len(FOLDERS) >= 20
    readme = (CAPTURES / "README.md").read_text()
    missing = [f.name for f in FOLDERS if f"`{f.name}`" not in readme]
    assert not missing, f"captures without a source in tests/fixtures/captures/README.md: {missing}"


def test_an_old_driver_lacks_the_newer_symbols() -> None:
    """Driver 418 (Quadro P400's capture) has no _v2 memory call: the adapter's v1 fallback answers."""
    spec = parse_spec(f"capture:{CAPTURES / 'quadro-p400-418'}")
    assert spec.profile.driver_version == "418.43"
    assert "nvmlDeviceGetMemoryInfo_v2" in spec.profile.capture.missing_symbols  # type: ignore[union-attr]
    with Pipeline(SimulatedMachine(spec.text)) as pipeline:
        gpu = pipeline.poll().gpus[0]
    assert gpu.memory_total == 1998 * 1024**2  # the capture's FB total, read through the v1 call


def test_what_the_capture_reads_n_a_nvml_refuses() -> None:
    """Quadro P400 (418): power draw and limit N/A; A100 with MIG on: utilization N/A. gputop gets NOT_SUPPORTED
    for exactly those, and the numbers the captures do hold."""
    with Pipeline(SimulatedMachine(f"capture:{CAPTURES / 'quadro-p400-418'}")) as pipeline:
        quadro = pipeline.poll().gpus[0]
    with Pipeline(SimulatedMachine(f"capture:{CAPTURES / 'a100-sxm4-80gb-535'}")) as pipeline:
        a100 = pipeline.poll().gpus[0]
    assert (quadro.power, quadro.power_limit) == (None, None)
    assert quadro.unavailable["power"] == quadro.unavailable["power_limit"] == "NotSupported"
    assert quadro.utilization_gpu is not None
    assert a100.utilization_gpu is None and a100.unavailable["utilization_gpu"] == "NotSupported"
    assert a100.power_limit == 500.0  # <gpu_power_readings><current_power_limit>500.00 W
    assert a100.ecc is not None and a100.ecc.volatile_uncorrected == 0  # ECC on, nothing counted
    with Pipeline(SimulatedMachine(f"capture:{CAPTURES / 'a100-sxm4-40gb-mig-510'}")) as pipeline:
        mig = pipeline.poll().gpus[0]
    with Pipeline(SimulatedMachine(f"capture:{CAPTURES / 'tesla-p100-pcie-510'}")) as pipeline:
        p100 = pipeline.poll().gpus[0]
    # MIG on R510: the volatile counters read N/A, the aggregate ones 0
    assert mig.ecc is not None and (mig.ecc.volatile_corrected, mig.ecc.aggregate_corrected) == (None, 0)
    assert mig.unavailable["ecc.volatile_corrected"] == "NotSupported"
    # the P100's real count: <aggregate><single_bit><total>3</total>
    assert p100.ecc is not None and (p100.ecc.aggregate_corrected, p100.ecc.aggregate_uncorrected) == (3, 0)


def test_each_link_ends_where_the_matrix_says() -> None:
    """DGX-1's hybrid cube mesh: GPU 0's six links go to GPUs 1, 2 (one each), 3, 4 (two each), GPU to GPU; on
    an NVSwitch board (NV18 everywhere) every link ends at a switch."""
    with Pipeline(SimulatedMachine(f"capture:{CAPTURES / 'dgx1-v100-hybrid-cube-mesh'}")) as pipeline:
        gpus = pipeline.poll().gpus
    bus = [g.pci_bus_id for g in gpus]
    links = gpus[0].nvlink or ()
    assert sorted(bus.index(link.remote_bus_id or "") for link in links) == [1, 2, 3, 3, 4, 4]
    assert {link.remote_kind for link in links} == {"gpu"} and all(link.active for link in links)
    with Pipeline(SimulatedMachine(f"capture:{CAPTURES / 'hgx-h100-nv18-rail-nics'}")) as pipeline:
        gpu = pipeline.poll().gpus[0]
    assert len(gpu.nvlink or ()) == 18 and {link.remote_kind for link in gpu.nvlink or ()} == {"switch"}


def test_an_affinity_printed_empty_is_an_empty_mask() -> None:
    """vLLM #19607's job: topo -m printed no CPU or NUMA affinity. NVML answered (empty masks), it did not refuse;
    gputop keeps the answer (issue 25 item 3): none of the job's CPUs are near either GPU."""
    board = parse_spec(f"capture:{CAPTURES / 'slurm-2gpu-empty-affinity'}").profile.capture
    assert board is not None
    assert [(g.cpu_affinity, g.numa_affinity) for g in board.gpus] == [((), ())] * 2
    with Pipeline(SimulatedMachine(f"capture:{CAPTURES / 'slurm-2gpu-empty-affinity'}")) as pipeline:
        topology = pipeline.machine.topology
    assert topology.cpu_affinity == ("", "") and topology.numa_node == (None, None)
    assert topology.gpus_without_near_cpus() == (0, 1)
    assert topology.near_cpus_text(1) == "none of this job's CPUs are near GPU 1"
    assert topology.matrix == (("X", "NV12"), ("NV12", "X"))


# captures of machines that were not known to work: a bridge that made contact on only some links; a V100 whose
# nvlink -s shows two of its six links inactive (the fault the Azure issue asks a check for); a GH200 whose -q
# counts an uncorrectable DRAM error in its lifetime, its row remapped: a repaired fault, which gputop warns of
# by design (gpu_health: "a fault that was repaired" is WARN), so not a false alarm
NOT_KNOWN_WORKING = {
    "bridged-pair-nv3-partial-bridge",
    "v100-sxm2-two-links-inactive-excerpt",
    "gh200-480gb-550-c2c",
}
WORKING = [f for f in FOLDERS if f.name not in NOT_KNOWN_WORKING]


def check_capture(folder: Path) -> CheckReport:
    """`gputop check` on the captured machine: its start, two samples and its end (a window of 2 s)."""
    with Pipeline(SimulatedMachine(f"capture:{folder}")) as pipeline:
        evidence = Evidence(pipeline)
        try:
            return evidence.finish([pipeline.poll(), pipeline.poll()], window=2.0)
        finally:
            evidence.close()


@pytest.mark.parametrize("folder", WORKING, ids=[f.name for f in WORKING])
def test_check_passes_every_working_machine(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every capture here but NOT_KNOWN_WORKING is of a machine its owner ran normally: a WARN or FAIL on one
    is a false alarm (issue 25: the rules know the board)."""
    possible_cpus_for(folder, tmp_path, monkeypatch)
    report = check_capture(folder)
    flagged = [r.line() for r in report.results if r.status in ("fail", "warn")]
    assert report.exit_code == EXIT_HEALTHY and not flagged, flagged


def test_a_link_the_capture_shows_inactive_is_down(tmp_path: Path) -> None:
    """nvlink -s's <inactive> links: a bridged pair and a third card whose links lead nowhere (constructed in
    the layout of `nvidia-smi topo -m` / `nvlink -s`, not a capture)."""
    (tmp_path / "topo.txt").write_text(
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tNV4\tNODE\t0-15\t0\nGPU1\tNV4\t X \tNODE\t0-15\t0\nGPU2\tNODE\tNODE\t X \t0-15\t0\n"
    )
    (tmp_path / "nvlink.txt").write_text(
        "".join(
            f"GPU {g}: NVIDIA RTX A6000 (UUID: GPU-{g})\n"
            + "".join(f"\t Link {k}: {'<inactive>' if g == 2 else '14.062 GB/s'}\n" for k in range(4))
            for g in range(3)
        )
    )
    with Pipeline(SimulatedMachine(f"capture:{tmp_path}")) as pipeline:
        pipeline.poll()
        machine = pipeline.machine
        library = pipeline.backend.library
    assert machine.gpu_names == ("NVIDIA RTX A6000",) * 3
    assert [list(r) for r in machine.topology.matrix] == [["X", "NV4", "NODE"], ["NV4", "X", "NODE"], ["NODE", "NODE", "X"]]
    assert library is not None
    assert [library.link_active(2, k) for k in range(4)] == [False] * 4
    assert [library.link_active(0, k) for k in range(4)] == [True] * 4


def test_issue_25_item_1_on_a_real_three_card_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """siboehm/bench's 3x RTX A6000: GPUs 0 and 1 bridged (NV4), GPU 2 without a bridge. The real nvlink -s lists no
    links for GPU 2 but "NVML: Unable to retrieve NVLink information as all links are inActive": NVML answers each of
    the card's links (4, as its bridged peers list) inactive. gputop reads no bridge there, not links down, and
    compares GPU 2's row with no peer (issue 25 item 1, as on the constructed folder)."""
    folder = CAPTURES / "rtx-a6000x3-one-unbridged-siboehm"
    with Pipeline(SimulatedMachine(f"capture:{folder}")) as pipeline:
        gpus = pipeline.poll().gpus
        library = pipeline.backend.library
    assert library is not None
    assert [library.link_active(2, k) for k in range(4)] == [False] * 4
    assert [library.link_active(g, k) for g in (0, 1) for k in range(4)] == [True] * 8
    assert [len(g.nvlink or ()) for g in gpus] == [4, 4, 4]
    possible_cpus_for(folder, tmp_path, monkeypatch)
    report = check_capture(folder)
    lines = {r.id: r.line() for r in report.results}
    assert report.exit_code == EXIT_HEALTHY
    assert "GPU 2: no NVLink bridge (4 links inactive)" in lines["nvlink.state"]
    assert "GPU 2: NODE×2 (no other GPU of its model and NVLink class)" in lines["topology"]


def test_all_links_inactive_counts_its_models_links(tmp_path: Path) -> None:
    """A card nvidia-smi says has all links inactive has as many as the cards of its model list; with no such card
    its links are not known (none)."""
    (tmp_path / "nvlink.txt").write_text(
        "GPU 0: NVIDIA GeForce RTX 3090 (UUID: GPU-a)\n\t Link 0: 14.062 GB/s\n\t Link 1: 14.062 GB/s\n"
        "GPU 1: NVIDIA GeForce RTX 3090 (UUID: GPU-b)\nNVML: Unable to retrieve NVLink information as all links are inActive\n"
        "GPU 2: NVIDIA RTX A6000 (UUID: GPU-c)\nNVML: Unable to retrieve NVLink information as all links are inActive\n"
    )
    board = parse_spec(f"capture:{tmp_path}").profile.capture
    assert board is not None
    assert [g.nvlink_active for g in board.gpus] == [(True, True), (False, False), ()]


def test_a_repaired_memory_fault_warns_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GH200's -q: 1 uncorrectable DRAM error in the card's lifetime, none since the reset, 1 row remapped for
    it (not pending, no failure). gputop serves the captured Remapped Rows and warns of both (a repaired fault);
    the x1 PCIe link (the card's own maximum: its host traffic crosses NVLink-C2C) is not flagged."""
    folder = CAPTURES / "gh200-480gb-550-c2c"
    with Pipeline(SimulatedMachine(f"capture:{folder}")) as pipeline:
        gpu = pipeline.poll().gpus[0]
    assert gpu.name == "NVIDIA GH200 480GB" and gpu.memory_total == 97871 * 1024**2
    assert gpu.remapped_rows is not None
    assert (gpu.remapped_rows.correctable, gpu.remapped_rows.uncorrectable) == (0, 1)
    assert not gpu.remapped_rows.pending and not gpu.remapped_rows.failed
    assert gpu.ecc is not None and (gpu.ecc.volatile_uncorrected, gpu.ecc.aggregate_uncorrected) == (0, 1)
    possible_cpus_for(folder, tmp_path, monkeypatch)
    report = check_capture(folder)
    flagged = {r.id: r.status for r in report.results if r.status in ("fail", "warn")}
    assert flagged == {"memory.ecc": "warn", "memory.remap": "warn"}
    assert report.exit_code == EXIT_CONFIG


def test_links_a_capture_shows_inactive_are_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Azure/azhpc-diagnostics#73's V100-SXM2 (an excerpt: one GPU's block): links 3 and 5 <inactive> on a board
    whose links are all wired. gputop warns of 2 of 6 links down."""
    folder = CAPTURES / "v100-sxm2-two-links-inactive-excerpt"
    report = check_capture(folder)
    lines = {r.id: r for r in report.results}
    assert lines["nvlink.state"].status == "warn"
    assert "2 of 6 NVLink links inactive (links 3, 5)" in lines["nvlink.state"].line()


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "none of topo.txt"),
        ({"topo.txt": "no matrix here\n"}, "topo.txt: no header line starting with GPU0"),
        ({"topo.txt": "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n", "nvlink.txt": "GPU 0: A (UUID: x)\n"}, "disagree"),
        ({"smi_q.xml": "<nvidia_smi_log><gpu"}, "smi_q.xml: not well-formed XML"),
    ],
)
def test_a_bad_capture_is_one_line(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(UsageError) as error:
        parse_spec(f"capture:{tmp_path}")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no such folder"):
        parse_spec(f"capture:{tmp_path / 'absent'}")

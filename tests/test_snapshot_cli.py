"""`gputop snapshot` end to end: a real `python -m gputop` process, its stdout, stderr and exit code."""

from __future__ import annotations

import ctypes.util
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputop.commands.snapshot import snapshot_from_json
from gputop.commands.snapshot import snapshot_json as cli_snapshot_json
from gputop.model import NvLinkLink, NvLinks
from tests.harness.processes import run_gputop

GPU_KEYS = {
    "index",
    "uuid",
    "name",
    "utilization_gpu",
    "memory_used",
    "memory_total",
    "temperature",
    "power",
    "power_limit",
    "pcie",
    "nvlink",
    "throttle_reasons",
    "ecc",
    "processes",
}
PCIE_KEYS = {"gen_current", "gen_max", "width_current", "width_max", "tx_bytes_per_s", "rx_bytes_per_s"}

no_driver_here = pytest.mark.skipif(bool(ctypes.util.find_library("nvidia-ml")), reason="libnvidia-ml is present on this machine")


gputop = functools.partial(run_gputop, timeout=120)


def snapshot_json(spawn, spec: str) -> dict:
    rc, out, err = gputop(spawn, "snapshot", "--simulate", spec, "--json")
    assert rc == 0, err
    assert err == ""
    return json.loads(out)


def test_default_simulation_json(spawn):
    rc, out, err = gputop(spawn, "snapshot", "--simulate", "--json")
    assert (rc, err) == (0, "")
    data = json.loads(out)
    assert {"host", "gpus", "topology", "simulated", "machine"} <= set(data)
    assert data["simulated"] is True and data["machine"]["simulated"] == "h100-sxm-8"
    gpus = data["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    for g in gpus:
        assert GPU_KEYS <= set(g)
        assert all(g[key] is not None for key in GPU_KEYS), g
        assert g["unavailable"] == {}
        assert set(g["pcie"]) == PCIE_KEYS and None not in g["pcie"].values()
        assert len(g["nvlink"]) == 18 and all(link["active"] for link in g["nvlink"])
        assert all(link["tx_bytes_per_s"] > 0 for link in g["nvlink"])  # the snapshot measured a rate
        assert set(g["ecc"]) == {"volatile_corrected", "volatile_uncorrected", "aggregate_corrected", "aggregate_uncorrected"}
        assert isinstance(g["processes"], list) and isinstance(g["throttle_reasons"], list)
        assert 0 <= g["utilization_gpu"] <= 100 and 0 < g["memory_used"] < g["memory_total"]
    matrix = data["topology"]["matrix"]
    assert len(matrix) == 8 and all(len(row) == 8 for row in matrix)
    for a in range(8):
        for b in range(8):
            assert matrix[a][b] == matrix[b][a] == ("X" if a == b else "NV18")
    assert data["topology"]["numa_node"] == [0, 0, 0, 0, 1, 1, 1, 1]
    host = data["host"]
    assert len(host["cpu_percent"]) == os.cpu_count()
    assert host["memory_total"] > host["memory_used"] > 0 and "memory_available" in host


def test_consumer_card_says_not_available(spawn):
    data = snapshot_json(spawn, "rtx-4090-2")
    assert len(data["gpus"]) == 2
    for g in data["gpus"]:
        assert g["ecc"] is None and g["nvlink"] is None and g["remapped_rows"] is None
        assert g["gpm"] is None  # Ada has no GPM: the fields are absent, never zero
        assert g["unavailable"] == {
            "ecc": "NotSupported",
            "nvlink": "NotSupported",
            "remapped_rows": "NotSupported",
            "gpm": "NotSupported",
            "fabric": "NotSupported",
        }
        assert g["name"] == "NVIDIA GeForce RTX 4090" and g["utilization_gpu"] is not None
    assert data["topology"]["matrix"] == [["X", "PHB"], ["PHB", "X"]]


FAULT_CHECKS = {
    "gpu-lost=3@0": lambda g: g["lost"] and g["unavailable"] == {"gpu": "GpuIsLost"} and g["utilization_gpu"] is None,
    "pcie-degraded=3": lambda g: (
        (g["pcie"]["gen_current"], g["pcie"]["width_current"], g["pcie"]["gen_max"], g["pcie"]["width_max"]) == (3, 8, 5, 16)
    ),
    "thermal=3": lambda g: g["temperature"] >= 88 and {"hw_thermal", "sw_thermal"} <= set(g["throttle_reasons"]),
    "ecc=3": lambda g: g["ecc"]["volatile_uncorrected"] > 0 and g["remapped_rows"]["pending"],
    "nvlink-down=3": lambda g: sum(not link["active"] for link in g["nvlink"]) == 4,
    "power=3": lambda g: g["power_limit"] == 385.0 and g["power"] <= 385.0,
    "xid=3:79": lambda g: [x["code"] for x in g["xids"]] == [79],
}


@pytest.mark.parametrize("fault", list(FAULT_CHECKS))
def test_each_fault_hits_its_gpu(spawn, fault):
    data = snapshot_json(spawn, f"h100-sxm-8+{fault}")
    check = FAULT_CHECKS[fault]
    gpus = data["gpus"]
    assert len(gpus) == 8
    assert check(gpus[3])
    assert not any(check(g) for g in gpus if g["index"] != 3)
    assert not any(g["lost"] for g in gpus if g["index"] != 3)
    if fault.startswith("nvlink-down"):
        matrix = data["topology"]["matrix"]
        assert matrix[3][0] == matrix[0][3] == "NV14" and matrix[1][2] == "NV18"


def test_old_driver_still_gives_every_field(spawn):
    data = snapshot_json(spawn, "h100-sxm-8+old-driver")
    assert data["machine"]["cuda_version"] == "12.6"
    for g in data["gpus"]:
        assert g["unavailable"] == {}
        assert all(g[key] is not None for key in GPU_KEYS)


def test_table_output(spawn):
    rc, out, err = gputop(spawn, "snapshot", "--simulate", "h100-sxm-8+thermal=1+xid=2:48")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "SIMULATED machine: h100-sxm-8+thermal=1+xid=2:48"
    assert sum("XID 48" in line for line in lines) == 1
    assert sum("NVIDIA H100 80GB HBM3" in line for line in lines) == 8
    assert any("hw_thermal" in line for line in lines)
    assert any(line.startswith("GPU0 ") and line.count("NV18") == 7 for line in lines)
    assert any(line.startswith("host ") for line in lines)


@no_driver_here
def test_no_driver_json(spawn):
    rc, out, err = gputop(spawn, "snapshot", "--json")
    assert rc == 0
    assert err == "no NVIDIA driver found (libnvidia-ml.so.1 is not loadable)\n"
    data = json.loads(out)
    assert data["gpus"] == [] and data["simulated"] is False
    assert data["machine"]["gpu_error"].startswith("no NVIDIA driver found (")
    assert len(data["host"]["cpu_percent"]) == os.cpu_count() and data["host"]["memory_total"] > 0
    assert data["topology"]["matrix"] == []


@no_driver_here
def test_no_driver_table(spawn):
    rc, out, err = gputop(spawn, "snapshot")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "no NVIDIA driver found (libnvidia-ml.so.1 is not loadable)"
    assert any(line.strip().startswith("CPU ") for line in lines)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("bogus", "unknown profile 'bogus'"),
        ("h100-sxm-8+thermal=99", "thermal=99: h100-sxm-8 has GPUs 0..7"),
        ("h100-sxm-8+gpu-lost=1@soon", "gpu-lost needs IDX@SECONDS"),
        ("rtx-4090-2+ecc=0", "rtx-4090-2 has no ECC"),
        ("h100-sxm-8+old-driver=1", "old-driver takes no value"),
        ("h100-sxm-8+xid=3", "xid needs IDX:CODE[@SECONDS]"),
    ],
)
def test_bad_spec_exits_2_with_one_line(spawn, spec, message):
    rc, out, err = gputop(spawn, "snapshot", "--simulate", spec, "--json")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("gputop: bad --simulate spec: ")
    assert message in err and "h100-sxm-8, rtx-4090-2" in err and "--help-faults" in err


def test_help_faults(spawn):
    rc, out, err = gputop(spawn, "snapshot", "--help-faults")
    assert (rc, err) == (0, "")
    for form in (
        "gpu-lost=IDX@SECONDS",
        "old-driver",
        "pcie-degraded=IDX",
        "thermal=IDX",
        "ecc=IDX",
        "nvlink-down=IDX",
        "power=IDX",
        "h100-sxm-8",
        "rtx-4090-2",
    ):
        assert form in out


def test_snapshot_loads_neither_textual_nor_torch(spawn):
    code = (
        "import sys, io, contextlib\n"
        "from gputop.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['snapshot', '--simulate', '--json'])\n"
        "print(rc, sorted(m for m in ('textual', 'torch') if m in sys.modules))\n"
    )
    proc = spawn.python(code, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.communicate(timeout=120) == ("0 []\n", "") and proc.returncode == 0


def test_json_output_reads_back_into_the_model(spawn):
    data = snapshot_json(spawn, "h100-sxm-8+ecc=1+gpu-lost=2@0")
    machine, snap = snapshot_from_json(data)
    assert snap.simulated and machine.simulated == "h100-sxm-8+ecc=1+gpu-lost=2@0"
    assert snap.gpus[2].lost and snap.gpus[1].ecc.volatile_uncorrected > 0
    assert isinstance(snap.gpus[0].nvlink, NvLinks) and isinstance(snap.host.cpu_percent, tuple)
    assert all(isinstance(link, NvLinkLink) and link.tx_bytes_per_s > 0 for link in snap.gpus[0].nvlink)
    assert json.loads(json.dumps(cli_snapshot_json(machine, snap))) == data


REAL_SNAPSHOTS = sorted((Path(__file__).parent / "fixtures" / "nvml").glob("*.json"))


@pytest.mark.skipif(not REAL_SNAPSHOTS, reason="no `gputop snapshot --json` from a real GPU recorded yet")
@pytest.mark.parametrize("path", REAL_SNAPSHOTS, ids=lambda p: p.name)
def test_recorded_real_snapshot_replays_through_the_model(path):
    data = json.loads(path.read_text())
    machine, snap = snapshot_from_json(data)
    assert not snap.simulated and machine.simulated is None and machine.driver_version
    assert len(snap.gpus) == machine.gpu_count == len(machine.topology.matrix)
    for gpu in snap.gpus:
        assert gpu.name and gpu.uuid.startswith("GPU-") and gpu.memory_total
        assert all(isinstance(reason, str) and reason for reason in gpu.unavailable.values())
    assert json.loads(json.dumps(cli_snapshot_json(machine, snap))) == data


def _nvidia_smi_topo_m(rows: dict[str, list[str]], legend: list[str]) -> str:
    """`nvidia-smi topo -m` as it prints to a terminal: tab-separated, the header underlined, the legends after."""
    names = list(rows)
    out = ["\t\x1b[4m" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"]
    for name in names:
        tail = "\t0-55,112-167\t0\t\tN/A" if name.startswith("GPU") else ""
        out.append(name + "\t" + "\t".join(f" {c} " if c == "X" else c for c in rows[name]) + tail)
    out += [
        "",
        "Legend:",
        "",
        "  X    = Self",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "",
        "NIC Legend:",
        "",
    ] + [f"  {entry}" for entry in legend]
    return "\n".join(out) + "\n"


def test_gpu_check_compares_the_topology_with_nvidia_smi(tmp_path):
    """scripts/gpu_check.sh's topo-m step: the simulated DGX's matrix read back from nvidia-smi's layout."""
    from gputop.backend import SimulatedMachine
    from gputop.model import to_jsonable
    from gputop.pipeline import Pipeline

    with Pipeline(SimulatedMachine("h100-sxm-8")) as pipeline:
        topology = pipeline.machine.topology
    names, rows = topology.full_matrix()
    (tmp_path / "real.json").write_text(json.dumps({"topology": to_jsonable(topology)}))
    verify = [
        sys.executable,
        str(Path(__file__).parent.parent / "scripts" / "gpu_check_verify.py"),
        "topo-m",
        str(tmp_path / "real.json"),
        str(tmp_path / "topo.txt"),
    ]
    same = dict(zip(names, map(list, rows)))
    (tmp_path / "topo.txt").write_text(_nvidia_smi_topo_m(same, list(topology.nic_legend())))
    done = subprocess.run(verify, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "the same 16x16 matrix and NIC Legend" in done.stdout, done.stdout + done.stderr
    same["NIC0"][0] = "PXB"  # nvidia-smi sees a deeper switch than gputop
    (tmp_path / "topo.txt").write_text(_nvidia_smi_topo_m(same, list(topology.nic_legend())))
    done = subprocess.run(verify, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "NIC0-GPU0: gputop PIX, nvidia-smi PXB" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
def test_gpu_check_reports_the_pcie_counters_against_pcie_throughput(tmp_path):
    """scripts/gpu_check.sh's PCIe step, on two simulated machines: one with the byte counters, one without."""
    verify = [sys.executable, str(Path(__file__).parent.parent / "scripts" / "gpu_check_verify.py")]
    for name, spec in (("real", "rtx-4090-2"), ("simulated", "h100-sxm-8")):
        done = subprocess.run(
            verify + ["pcie-measure", str(tmp_path / f"{name}.json"), "--simulate", spec, "--seconds", "0.5"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(
        verify + ["pcie", str(tmp_path / "real.json"), str(tmp_path / "simulated.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum("PCIe byte counters refused: NotSupported" in line for line in lines) == 2  # the RTX 4090s
    assert sum("PCIe byte counters supported, valueType 3" in line for line in lines) == 8  # the H100s
    assert lines[-1] == (
        "differs from the simulated machine: counters ['NotSupported'] (simulated ['supported']), "
        "valueType [] (simulated [3]; 1 = 32-bit, wraps every 4 GiB)"
    )


def test_gpu_check_offline_install_says_what_is_missing(tmp_path):
    """`gpu_check.sh --wheels DIR` (the lent GPU machine reaches no package index): a folder without wheels
    ends the script at once with one line that says how to fill it, not with pip's traceback."""
    script = Path(__file__).parent.parent / "scripts" / "gpu_check.sh"
    empty = tmp_path / "wheels"
    empty.mkdir()
    done = subprocess.run(
        ["bash", str(script), "--no-cuda", "--wheels", str(empty), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == f"gpu_check.sh: no wheels in {empty} (run scripts/gpu_check_wheels.sh where pip can fetch)"

"""`gputop check` (issue 16): the checks, their exit codes, the simulated faults, the kernel's sources.

Every "Done when" line of the issue is a test here:
- `gputop check --simulate` exits 0                      -> test_check_simulate_exits_0
- each new simulated fault exits 3 with one failing line  -> test_each_infra_fault_fails_one_line
- `--json` lists every check with its status             -> test_json_lists_every_check
- the report carries "For the infra team"                 -> tests/test_check_report.py
- no-GPU box: host checks, exit 0, "no NVIDIA driver"     -> test_no_driver_box_runs_host_checks
- unreadable sources are reported, not fatal              -> test_unreadable_kernel_log_*
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from gputop import cli
from gputop.analysis import machine_check as mc
from gputop.backend import SimulatedMachine
from gputop.collect.gpu import use_nvml_library
from gputop.collect.sysfs import HostReader, _xids_from_dmesg
from gputop.model import AllReduceResult, HostReadings, NicInfo, Topology
from gputop.pipeline import Pipeline
from gputop.sim.fake_nvml import ManualClock
from gputop.sim.fake_sysfs import FakeHostTree
from gputop.sim.profiles import INFRA_FAULTS, faults_help
from tests.harness.machine_check import simulated_check_input
from tests.harness.processes import run_gputop

FIXTURES = Path(__file__).parent / "fixtures" / "host"
AS_USER = Path(__file__).parent / "drill_jobs" / "as_user.py"

# each new fault -> (the title of the check that must fail, the GPU it names, a number the line must carry)
INFRA_FAULT_CASES = {
    "pcie-replay=1": ("PCIe replay counter", 1, r"\+\d+ replays"),
    "aer=2": ("PCIe AER errors (sysfs)", 2, r"\+\d+ correctable"),
    "nvlink-crc=3:5": ("NVLink error counters", 3, r"link 5: CRC \(flit\) \+\d+"),
    "retired-page=4": ("Retired pages", 4, r"1 page\(s\) for double-bit"),
    "topology=5": ("Topology (topo -m rows)", 5, r"PHB×7 where the other GPUs read NV18"),
    "kernel-xid=6:79": ("XIDs", 6, r"XID 79 \(GPU has fallen off the bus\) at 20\d\d-"),
}


def check_cli(capsys, *args: str) -> tuple[int, str]:
    rc = cli.main(["check", *args])
    return rc, capsys.readouterr().out


def result(results, check_id):
    return next(r for r in results if r.id == check_id)


# ---------------------------------------------------------------- Done when


def test_check_simulate_exits_0(spawn):
    ran = run_gputop(spawn, "check", "--simulate", "--seconds", "0.3")
    assert ran.rc == 0, ran
    lines = [line for line in ran.out.splitlines() if line.strip()]
    statuses = [line.split()[0] for line in lines[:-1]]
    assert set(statuses) <= {"PASS", "SKIP"} and statuses.count("PASS") >= 15, ran.out
    assert lines[-1].startswith("healthy") and "exit status 0" in lines[-1]


@pytest.mark.parametrize("fault", sorted(INFRA_FAULT_CASES))
def test_each_infra_fault_fails_one_line(capsys, fault):
    title, gpu, number = INFRA_FAULT_CASES[fault]
    rc, out = check_cli(capsys, "--simulate", f"h100-sxm-8+{fault}", "--seconds", "0.3")
    failing = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert rc == mc.EXIT_INFRA, out
    assert len(failing) == 1, out
    assert failing[0].startswith(f"FAIL  {title}: ")
    assert re.search(rf"\bGPU {gpu}\b", failing[0]) and re.search(number, failing[0]), failing[0]
    assert out.rstrip().endswith("exit status 3")


def test_json_names_the_failing_check_and_its_gpu(capsys):
    rc, out = check_cli(capsys, "--simulate", "h100-sxm-8+aer=2", "--seconds", "0.3", "--json")
    data = json.loads(out)
    assert rc == data["exit_code"] == mc.EXIT_INFRA and data["status"] == "fail"
    (failing,) = [c for c in data["checks"] if c["status"] == mc.FAIL]
    assert failing["id"] == "pcie.aer" and failing["gpus"] == [2] and failing["line"].startswith("FAIL  PCIe AER")


def test_every_new_fault_is_listed_in_help_faults(spawn):
    ran = run_gputop(spawn, "snapshot", "--help-faults")
    assert ran.rc == 0
    for form, _ in INFRA_FAULTS.values():
        assert form in ran.out and form in faults_help()


def test_json_lists_every_check(capsys):
    rc, out = check_cli(capsys, "--simulate", "--seconds", "0.3", "--json")
    data = json.loads(out)
    assert rc == 0 and data["exit_code"] == 0 and data["status"] == "pass"
    ids = [c["id"] for c in data["checks"]]
    assert ids == [
        "driver",
        "gpus",
        "vbios",
        "pcie.link",
        "pcie.replay",
        "pcie.aer",
        "nvlink.state",
        "nvlink.errors",
        "fabric",
        "topology",
        "numa.nic",
        "nic.state",
        "nic.rate",
        "nic.errors",
        "memory.ecc",
        "memory.remap",
        "memory.retired_pages",
        "xid",
        "persistence",
        "ecc.mode",
        "clocks.applications",
        "power.limit",
        "clocks.events",
    ]
    for check in data["checks"]:
        assert check["status"] in mc.STATUSES and check["value"] and check["expected"]
        assert check["line"].startswith(check["status"].upper())
    assert [g["serial"] for g in data["gpus"]] == [f"165492200{i:04d}" for i in range(8)]
    assert data["machine"]["kernel"] and data["machine"]["driver_module"] == data["machine"]["driver"]
    assert any("dcgmi diag -r 2" in c["command"] for c in data["next_commands"])


def test_no_driver_box_runs_host_checks(spawn):
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver")
    ran = run_gputop(spawn, "check", "--seconds", "1")
    assert ran.rc == 0, ran
    first = ran.out.splitlines()[0]
    assert first.startswith("SKIP  NVIDIA driver: no NVIDIA driver found")
    # the host's own checks still ran: the kernel log was searched for XIDs, the NICs were looked at
    assert re.search(r"^(PASS|FAIL|WARN)  XIDs: ", ran.out, re.M) or "kernel log (XIDs)" in ran.out
    assert re.search(r"^\w+  GPU/NIC NUMA affinity: ", ran.out, re.M)


def test_unreadable_kernel_log_is_one_line_not_fatal(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(FIXTURES / "two_gpus", root, symlinks=True)
    (root / "dev" / "kmsg").unlink()
    (root / "dev" / "kmsg").mkdir()  # something open() cannot read, even as root
    readings = HostReader(root).read(["00000000:18:00.0"])
    assert readings.kernel_xids is None
    assert len(readings.unreadable) == 1 and "kernel log (XIDs)" in readings.unreadable[0]
    assert "Is a directory" in readings.unreadable[0]
    assert readings.aer["00000000:18:00.0"].correctable == 4  # the other sources were still read
    inp = replace(simulated_check_input(seconds=1.0), host_after=readings)
    results = mc.run_checks(inp)
    sources = result(results, "sources")
    assert sources.status == mc.SKIP and "kernel log (XIDs)" in sources.value
    assert result(results, "xid").value.startswith("none in NVML's events (the kernel log was not readable)")


@pytest.mark.slow
def test_unreadable_kernel_log_under_dmesg_restrict(spawn):
    """The real case: an ordinary user under kernel.dmesg_restrict=1 cannot open /dev/kmsg."""
    if os.geteuid() != 0 or Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        pytest.skip("needs root (to become another user) and kernel.dmesg_restrict = 1")
    ran = run_gputop(spawn, "check", "--seconds", "1", python=sys.executable)  # as root: readable
    assert "kernel log (XIDs)" not in ran.out
    proc = spawn([sys.executable, str(AS_USER), "nobody", "check", "--seconds", "1"], stdout=-1, stderr=-1)
    out, err = proc.communicate(timeout=60)
    out = out.decode()
    assert proc.returncode == 0, (out, err)
    line = next(line for line in out.splitlines() if "Unreadable sources" in line)
    assert "/dev/kmsg" in line and "dmesg_restrict" in line


# ---------------------------------------------------------------- exit codes and usage


def test_configuration_warning_exits_4():
    inp = simulated_check_input()
    low = tuple(replace(d, app_clock_sm=1200) if d.index == 2 else d for d in inp.after)
    results = mc.run_checks(replace(inp, after=low))
    clocks = result(results, "clocks.applications")
    assert clocks.status == mc.WARN and clocks.gpus == (2,) and "SM 1200 of 1980 MHz" in clocks.value
    assert mc.exit_code(results) == mc.EXIT_CONFIG


def test_persistence_and_ecc_mode_must_match():
    inp = simulated_check_input()
    after = tuple(replace(d, persistence_mode=False) if d.index == 7 else d for d in inp.after)
    after = tuple(replace(d, ecc_mode_pending=False) if d.index == 1 else d for d in after)
    results = mc.run_checks(replace(inp, after=after))
    persistence = result(results, "persistence")
    assert persistence.status == mc.WARN and persistence.gpus == (7,) and "7 others are enabled" in persistence.value
    ecc = result(results, "ecc.mode")
    assert ecc.status == mc.WARN and "GPU 1: ECC on now, off after the next reset" in ecc.value


def test_fail_outranks_warn():
    inp = simulated_check_input("h100-sxm-8+pcie-replay=0")
    low = tuple(replace(d, app_clock_sm=1200) for d in inp.after)
    assert mc.exit_code(mc.run_checks(replace(inp, after=low))) == mc.EXIT_INFRA


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seconds", "0"], "must be greater than 0"),
        (["--simulate", "h100-sxm-8+aer=9"], "aer=9: h100-sxm-8 has GPUs 0..7"),
        (["--simulate", "h100-sxm-8+nvlink-crc=1:40"], "nvlink-crc needs IDX[:LINK]"),
        (["--simulate", "rtx-4090-2+topology=0"], "has no NVLink"),
        (["--simulate", "h100-sxm-8+kernel-xid=1"], "kernel-xid needs IDX:CODE"),
    ],
)
def test_bad_usage_exits_2(capsys, args, message):
    assert cli.main(["check", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- the checks' judgement


def test_a_link_trained_down_exits_3_naming_its_gpu(capsys):
    """Issue 35's regression: `gputop check --simulate h100-sxm-8+pcie-degraded=3` is an infra ticket."""
    assert cli.main(["check", "--simulate", "h100-sxm-8+pcie-degraded=3"]) == mc.EXIT_INFRA
    failing = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(failing) == 1 and failing[0].startswith("FAIL  PCIe link: GPU 3: PCIe Gen3 x8 of Gen5 x16")


def test_idle_links_are_not_judged():
    inp = simulated_check_input("h100-sxm-8+pcie-degraded=3")
    idle = tuple(
        replace(
            s, gpus=tuple(replace(g, utilization_gpu=0.0, pcie=replace(g.pcie, gen_current=1, width_current=16)) for g in s.gpus)
        )
        for s in inp.snapshots
    )  # idle as the simulated link idles: Gen1 at full width
    link = result(mc.run_checks(replace(inp, snapshots=idle)), "pcie.link")
    assert link.status == mc.SKIP and "idle links lower their gen" in link.value
    # the same machine under load: a link trained down is a ticket (fail), as on the card and in the diagnosis
    loaded = result(mc.run_checks(inp), "pcie.link")
    assert loaded.status == mc.FAIL and loaded.gpus == (3,)


@pytest.mark.parametrize("utilization, under_load", [(29.9, False), (30.0, True)])
def test_one_under_load_bar_for_the_screen_the_exporter_and_the_check(utilization, under_load):
    """A GPU whose link trained to Gen3 (width intact) is flagged by every sink from the same utilization on."""
    from gputop.analysis.gpu_health import pcie_degraded
    from gputop.tui.widgets.gpu_grid import pcie_flagged

    inp = simulated_check_input("h100-sxm-8")
    gen3 = tuple(
        replace(
            s,
            gpus=tuple(
                replace(g, utilization_gpu=utilization, pcie=replace(g.pcie, gen_current=3))
                if g.index == 2
                else replace(g, utilization_gpu=0.0, pcie=replace(g.pcie, gen_current=1))
                for g in s.gpus
            ),
        )
        for s in inp.snapshots
    )
    gpu = gen3[-1].gpus[2]
    assert pcie_flagged(gpu) is under_load
    assert pcie_degraded(gpu) is (True if under_load else None)
    assert result(mc.run_checks(replace(inp, snapshots=gen3)), "pcie.link").status == (mc.FAIL if under_load else mc.SKIP)
    narrow = replace(gpu, utilization_gpu=0.0, pcie=replace(gpu.pcie, gen_current=5, width_current=8))
    assert pcie_flagged(narrow) and pcie_degraded(narrow)  # lanes missing: never power saving, flagged when idle too
    narrow_idle = tuple(replace(s, gpus=tuple(narrow if g.index == 2 else g for g in s.gpus)) for s in gen3)
    link = result(mc.run_checks(replace(inp, snapshots=narrow_idle)), "pcie.link")
    assert link.status == mc.FAIL and link.gpus == (2,)  # ... and by the check too


def test_counts_since_boot_are_shown_but_only_climbing_counts_fail():
    inp = simulated_check_input("h100-sxm-8+pcie-replay=1")
    steady = tuple(replace(d, pcie_replays=d.pcie_replays) for d in inp.after)
    replay = result(mc.run_checks(replace(inp, before=steady, after=steady)), "pcie.replay")
    assert replay.status == mc.PASS and "GPU 1: 203" in replay.value  # 3 + 40/s x 5 s, standing still


def test_aer_uncorrectable_fails_from_fixture_counters():
    inp = simulated_check_input("h100-sxm-8")
    fixture = HostReader(FIXTURES / "two_gpus").read(["00000000:18:00.0"])
    aer = {**inp.host_after.aer, "00000000:18:00.0": fixture.aer["00000000:18:00.0"]}
    check = result(mc.run_checks(replace(inp, host_after=replace(inp.host_after, aer=aer))), "pcie.aer")
    assert check.status == mc.FAIL and check.gpus == (0,)
    assert "GPU 0: 0 fatal, 1 non-fatal (BadTLP 3, BadDLLP 1, CmpltTO 1)" in check.value


def test_nic_numa_affinity_from_the_machine():
    inp = simulated_check_input()
    assert result(mc.run_checks(inp), "numa.nic").status == mc.PASS
    topology = inp.machine.topology
    assert [n.name for n in topology.nics] == [f"mlx5_{i}" for i in range(8)]  # the machine's NICs, as T shows them

    def with_nics(nics, **more):
        return replace(inp, machine=replace(inp.machine, topology=replace(topology, nics=nics, **more)))

    only_node0 = tuple(n for n in topology.nics if n.numa_node == 0)
    check = result(mc.run_checks(with_nics(only_node0)), "numa.nic")
    assert check.status == mc.WARN and check.gpus == (4, 5, 6, 7) and "no NIC on node 1" in check.value
    assert result(mc.run_checks(with_nics((NicInfo("eth0", None),))), "numa.nic").status == mc.SKIP
    unread = result(mc.run_checks(with_nics(None, nics_unreadable=("NICs /sys/class/net: Permission denied",))), "numa.nic")
    assert unread.status == mc.SKIP and "Permission denied" in unread.value


def test_driver_module_mismatch_fails():
    inp = simulated_check_input()
    check = result(mc.run_checks(replace(inp, host_after=replace(inp.host_after, driver_module="535.129.03"))), "driver")
    assert check.status == mc.FAIL and "kernel module 535.129.03 but library 560.35.03" in check.value


def test_xid_of_the_code_is_a_warning_and_kernel_xids_map_to_gpus():
    inp = simulated_check_input("rtx-4090-2")
    fixture = HostReader(FIXTURES / "two_gpus").read([])
    code_xid = tuple(x for x in fixture.kernel_xids if x.code == 13)  # PCI 0000:2a:00 -> nobody on this profile
    check = result(mc.run_checks(replace(inp, host_after=replace(inp.host_after, kernel_xids=code_xid))), "xid")
    assert check.status == mc.WARN and "a GPU NVML does not list: XID 13" in check.value
    assert check.evidence[0].startswith("2025-12-01 01:00:00 UTC")  # btime 1764547200 + 3600 s


# ---------------------------------------------------------------- --load


def test_load_is_skipped_on_a_simulated_machine(capsys):
    rc, out = check_cli(capsys, "--simulate", "--seconds", "0.3", "--load")
    assert rc == 0
    line = next(line for line in out.splitlines() if "All-reduce" in line)
    assert line.startswith("SKIP") and "needs a real GPU" in line


def test_busbw_arithmetic_follows_nccl_tests():
    r = AllReduceResult(gpus=8, bytes=256 * 2**20, seconds=0.001, iterations=20)
    assert r.algbw == pytest.approx(256 * 2**20 / 0.001)
    assert r.busbw == pytest.approx(r.algbw * 2 * 7 / 8)
    assert AllReduceResult(gpus=1, bytes=1, seconds=1.0, iterations=1).busbw == 0.0
    inp = simulated_check_input()
    rate, how = mc.expected_busbw(inp.machine, inp.gpus)
    assert rate == pytest.approx(18 * 25e9) and how.startswith("NV18")
    pcie = simulated_check_input("rtx-4090-2")
    rate, how = mc.expected_busbw(pcie.machine, pcie.gpus)
    assert rate == pytest.approx(1.969e9 * 16) and "PCIe Gen4 x16" in how


@pytest.mark.parametrize("busbw_gbps, status", [(380.0, mc.PASS), (200.0, mc.WARN), (90.0, mc.FAIL)])
def test_allreduce_compared_with_the_topology(busbw_gbps, status):
    inp = simulated_check_input()
    seconds = 2**28 * 2 * 7 / 8 / (busbw_gbps * 1e9)  # the time that gives this busbw for 256 MiB on 8 GPUs
    load = mc.LoadOutcome(allreduce=AllReduceResult(gpus=8, bytes=2**28, seconds=seconds, iterations=20))
    check = result(mc.run_checks(replace(inp, load=load)), "load.allreduce")
    assert check.status == status and f"busbw {busbw_gbps:.1f} GB/s" in check.value, check.value


def test_load_job_result_parsing():
    from gputop.collect.gpu_load import outcome_from_job

    ok = outcome_from_job(["LOADING", '{"allreduce": {"gpus": 8, "bytes": 1024, "seconds": 0.5, "iterations": 3}}'], 0)
    assert ok.allreduce == AllReduceResult(gpus=8, bytes=1024, seconds=0.5, iterations=3)
    one = outcome_from_job(['{"allreduce_skipped": "one GPU: there is nothing to reduce across"}'], 0)
    assert one.allreduce is None and one.allreduce_skipped.startswith("one GPU")
    crashed = outcome_from_job([], 1, "Traceback ...\nRuntimeError: CUDA error: out of memory\n")
    assert crashed.skipped == "the load job failed: RuntimeError: CUDA error: out of memory"


@pytest.mark.slow
def test_load_job_on_a_cpu_torch_says_why(spawn):
    pytest.importorskip("torch")
    proc = spawn([sys.executable, "-m", "gputop.collect.gpu_load_job", "--seconds", "0.1"], stdout=-1, stderr=-1)
    out, _ = proc.communicate(timeout=120)
    from gputop.collect.gpu_load import outcome_from_job

    outcome = outcome_from_job(out.decode().splitlines(), proc.returncode)
    assert outcome.skipped == "torch sees no CUDA device (a CPU build of torch?)"


# ---------------------------------------------------------------- the kernel's sources (fixture roots)


def test_nic_topology_from_a_pci_tree():
    """Where each NIC sits against each GPU, from the PCI paths in sysfs, labelled as `nvidia-smi topo -m` does."""
    gpus = Topology(matrix=(("X", "PXB", "SYS"), ("PXB", "X", "SYS"), ("SYS", "SYS", "X")), numa_node=(0, 0, 1))
    topo = HostReader(FIXTURES / "pci_tree").nic_topology(gpus, ("00000000:18:00.0", "00000000:1C:00.0", "00000000:9A:00.0"))
    # RDMA devices first, numbered as nvidia-smi numbers them (mlx5_10 after mlx5_2), each with its interface;
    # eno1 has no RDMA device; lo and docker0 have no PCI function
    assert [(n.name, n.rdma, n.netdev, n.numa_node, n.pci_bus_id) for n in topo.nics] == [
        ("mlx5_0", True, "ibp25s0f0", 0, "0000:19:00.0"),
        ("mlx5_1", True, "ibp25s0f1", 0, "0000:19:00.1"),
        ("mlx5_2", True, "ibp56s0", 0, "0000:38:00.0"),
        ("mlx5_10", True, "ibp155s0", 1, "0000:9b:00.0"),
        ("eno1", False, None, 0, "0000:20:00.0"),
    ]
    #              GPU0   GPU1   GPU2    mlx5_0  mlx5_1  mlx5_2  mlx5_10 eno1
    assert topo.nic_matrix == (
        ("PIX", "PXB", "SYS", "X", "PIX", "NODE", "SYS", "PHB"),  # mlx5_0: GPU0's switch; GPU1 one switch further down
        ("PIX", "PXB", "SYS", "PIX", "X", "NODE", "SYS", "PHB"),  # its second port: the same card
        ("NODE", "NODE", "SYS", "NODE", "NODE", "X", "SYS", "NODE"),  # another host bridge on socket 0
        ("SYS", "SYS", "PIX", "SYS", "SYS", "SYS", "X", "SYS"),  # socket 1, beside GPU2
        ("PHB", "PHB", "SYS", "PHB", "PHB", "NODE", "SYS", "X"),  # a root port of GPU0's host bridge
    )
    names, rows = topo.full_matrix()  # as nvidia-smi prints it: the RDMA devices only, NIC0..NIC3
    assert names == ("GPU0", "GPU1", "GPU2", "NIC0", "NIC1", "NIC2", "NIC3")
    assert rows[0] == ("X", "PXB", "SYS", "PIX", "PIX", "NODE", "SYS") and rows[6] == (
        "SYS",
        "SYS",
        "PIX",
        "SYS",
        "SYS",
        "SYS",
        "X",
    )
    assert topo.nic_legend() == ("NIC0: mlx5_0", "NIC1: mlx5_1", "NIC2: mlx5_2", "NIC3: mlx5_10")
    assert topo.nic_switch_gpus(0) == (0, 1) and topo.nic_switch_gpus(3) == (2,) and topo.nic_switch_gpus(4) == ()


def test_a_virtio_nic_is_placed_by_the_pci_function_it_hangs_off(tmp_path):
    function = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:00:03.0"
    (function / "virtio2").mkdir(parents=True)
    (function / "numa_node").write_text("0\n")
    (tmp_path / "sys" / "class" / "net" / "ens3").mkdir(parents=True)
    (tmp_path / "sys" / "class" / "net" / "ens3" / "device").symlink_to("../../../devices/pci0000:00/0000:00:03.0/virtio2")
    topo = HostReader(tmp_path).nic_topology(Topology(), ())
    assert topo.nics == (NicInfo("ens3", 0, "0000:00:03.0"),)


def test_nic_topology_unreadable_is_one_line(tmp_path):
    (tmp_path / "sys" / "class").mkdir(parents=True)
    (tmp_path / "sys" / "class" / "net").write_text("")  # not a directory: unreadable whoever reads it (CI is root)
    topo = HostReader(tmp_path).nic_topology(Topology(), ())
    assert topo.nics is None and len(topo.nics_unreadable) == 1 and "Not a directory" in topo.nics_unreadable[0]


def test_simulated_dgx_has_a_rail_nic_per_gpu_and_its_recording_keeps_them(tmp_path):
    from gputop.recording import RecordingWriter, read_recording

    with Pipeline(SimulatedMachine("h100-sxm-8")) as pipeline:
        machine, snapshot = pipeline.machine, pipeline.poll()
    names, rows = machine.topology.full_matrix()
    assert names[8:] == tuple(f"NIC{k}" for k in range(8))
    for gpu in range(8):  # PIX to its own rail NIC, NODE to its socket's others, SYS across
        assert rows[gpu][8:] == tuple("PIX" if k == gpu else "NODE" if k // 4 == gpu // 4 else "SYS" for k in range(8))
    assert machine.topology.nics[0].netdev == "ibp25s0"
    path = str(tmp_path / "dgx.gputop")
    writer = RecordingWriter(path, machine)
    writer.write(snapshot)
    writer.close()
    replayed, _snapshots, _warning = read_recording(path)
    assert replayed.topology == machine.topology and replayed.topology.nic_legend()[7] == "NIC7: mlx5_7"  # recorded, replayed


def test_host_reader_on_fixture_root():
    r = HostReader(FIXTURES / "two_gpus").read(["00000000:18:00.0", "00000000:2A:00.0"])
    assert r.kernel == "5.15.0-105-generic" and r.driver_module == "550.54.15"
    assert r.aer["00000000:18:00.0"].correctable == 4 and r.aer["00000000:18:00.0"].nonfatal == 1
    assert r.aer["00000000:2A:00.0"] is None  # no aer_dev_* files: not exposed, not an error
    # ib0 and mlx5_0 are one PCI function; eth0 has no NUMA node; lo has no device
    nics = HostReader(FIXTURES / "two_gpus").nic_topology(Topology(), ()).nics
    assert [(n.name, n.numa_node, n.netdev) for n in nics] == [("mlx5_0", 0, "ib0"), ("eth0", None, None)]
    assert [(x.code, x.pci) for x in r.kernel_xids] == [(79, "0000:18:00"), (13, "0000:2a:00")]
    assert r.kernel_xids[0].timestamp == pytest.approx(1764547200 + 12.004)
    assert r.kernel_log_records == 5  # the continuation lines belong to their record
    assert r.unreadable == ()


def test_dmesg_lines_parse_like_kmsg():
    lines = [
        "[   12.004000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[   13.000000] nvidia-modeset: Loading",
    ]
    (xid,) = _xids_from_dmesg(lines, 1000.0)
    assert (xid.code, xid.pci, xid.timestamp) == (79, "0000:18:00", pytest.approx(1012.004))


def test_fake_host_tree_counters_climb_on_the_fake_clock():
    clock = ManualClock()
    pipeline = Pipeline(SimulatedMachine("h100-sxm-8+aer=2", clock=clock))
    tree = FakeHostTree(pipeline.backend.library.spec, pipeline.backend.library.elapsed)
    try:
        bus = pipeline.machine.topology and [d.pci_bus_id for d in pipeline.gpu.details()]
        first = tree.read(bus).aer[bus[2]].correctable
        clock.advance(3)
        assert tree.read(bus).aer[bus[2]].correctable == first + 30
        assert tree.read(bus).aer[bus[0]].correctable == 0
    finally:
        tree.close()
        pipeline.close()
    assert not tree.root.exists()


# ---------------------------------------------------------------- the real pynvml wrappers over the fake


def test_details_through_the_real_pynvml_wrappers():
    clock = ManualClock()
    pipeline = Pipeline(SimulatedMachine("h100-sxm-8+nvlink-crc=3:5+retired-page=4+thermal=6+pcie-replay=1", clock=clock))
    try:
        first = pipeline.gpu.details()
        clock.advance(2)
        d = pipeline.gpu.details()
    finally:
        pipeline.close()
    assert [g.serial for g in d] == [f"165492200{i:04d}" for i in range(8)]
    assert {g.vbios for g in d} == {"96.00.99.00.01"} and {g.board_part_number for g in d} == {"692-2G520-0200-000"}
    assert all(g.persistence_mode and g.ecc_mode and g.ecc_mode_pending for g in d)
    assert (d[0].app_clock_sm, d[0].app_clock_sm_default, d[0].app_clock_memory) == (1980, 1980, 2619)
    assert d[1].pcie_replays - first[1].pcie_replays == 80 and d[0].pcie_replays == 0
    crc = {(g.index, e.link): e.crc_flit for g in d for e in g.nvlink_errors if e.crc_flit}
    assert crc == {(3, 5): 12 + 25 * 2}
    assert len(d[0].nvlink_errors) == 18 and d[0].nvlink_errors[0].recovery == 0
    assert (d[4].retired_pages_double_bit, d[4].retired_pages_single_bit, d[4].retired_pages_pending) == (1, 0, True)
    assert d[6].clock_event_ns["thermal"] == pytest.approx(0.6 * 2e9) and d[0].clock_event_ns["thermal"] == 0
    assert set(d[0].clock_event_ns) >= {"power", "thermal", "reliability", "board_limit"}
    assert all(not g.unavailable for g in d)


def test_refusals_become_not_available_with_the_reason():
    pipeline = Pipeline(SimulatedMachine("rtx-4090-2"))
    try:
        d = pipeline.gpu.details()
    finally:
        pipeline.close()
    g = d[0]
    assert (g.serial, g.ecc_mode, g.app_clock_sm, g.nvlink_errors, g.retired_pages_pending) == (None,) * 5
    assert g.unavailable["serial"] == "NotSupported" and g.unavailable["ecc_mode"] == "NotSupported"
    assert g.unavailable["nvlink_errors"] == "NotSupported"
    assert g.vbios == "95.02.18.80.5F" and g.persistence_mode is True and g.pcie_replays == 0


def test_details_of_a_lost_gpu():
    clock = ManualClock()
    pipeline = Pipeline(SimulatedMachine("h100-sxm-8+gpu-lost=2@1", clock=clock))
    try:
        clock.advance(2)
        d = pipeline.gpu.details()
    finally:
        pipeline.close()
    assert d[2].lost and d[2].unavailable == {"gpu": "GpuIsLost"} and d[2].serial is None
    assert not d[3].lost and d[3].serial


def test_an_old_driver_without_the_new_symbols():
    """A symbol the library lacks is FunctionNotFound at the adapter, never an exception above it."""
    pipeline = Pipeline(SimulatedMachine("h100-sxm-8"))
    lib = pipeline.backend.library
    try:
        for name in ("nvmlDeviceGetViolationStatus", "nvmlDeviceGetPcieReplayCounter"):
            lib._symbols.pop(name)
        use_nvml_library(lib)
        d = pipeline.gpu.details()
    finally:
        pipeline.close()
    assert d[0].pcie_replays is None and d[0].unavailable["pcie_replays"] == "FunctionNotFound"
    assert d[0].clock_event_ns == {}
    inp_results = mc.check_pcie_replay(mc.CheckInput(pipeline.machine, (), d, d, HostReadings(0.0), HostReadings(0.0), 1.0))
    assert inp_results.status == mc.SKIP and "FunctionNotFound" in inp_results.value


def test_a_board_on_other_firmware_is_a_warning():
    inp = simulated_check_input()
    after = tuple(replace(d, vbios="96.00.61.00.01") if d.index == 6 else d for d in inp.after)
    check = result(mc.run_checks(replace(inp, after=after)), "vbios")
    assert check.status == mc.WARN and check.gpus == (6,)
    assert check.value == "GPU 6: 96.00.61.00.01 where the others run 96.00.99.00.01"


def test_no_nvlink_lines_on_a_pcie_machine():
    results = mc.run_checks(simulated_check_input("rtx-4090-2"))
    assert result(results, "nvlink.state").status == mc.SKIP
    assert "nvlink.errors" not in {r.id for r in results}  # the link-state line already says there is none
    assert mc.exit_code(results) == mc.EXIT_HEALTHY


def test_a_killed_simulated_pipelines_trees_are_removed_by_the_next_one(spawn):
    """A simulated pipeline killed before its close (SIGKILL) leaves its /sys trees; the next simulated start
    removes them, and leaves those of live processes alone."""
    child = spawn.python(
        "import sys\n"
        "from gputop.backend import SimulatedMachine\n"
        "from gputop.pipeline import Pipeline\n"
        "pipeline = Pipeline(SimulatedMachine('h100-sxm-8'))\n"
        "pipeline.poll()\n"
        "print(pipeline.backend.library.spec.profile.name, flush=True)\n"
        "sys.stdin.read()\n",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip()  # its trees are written
    pattern = f"gputop-sim-*-{child.pid}-*"
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    left = sorted(base.glob(pattern))
    assert left, f"no {pattern} in {base}"
    child.kill()
    child.wait(timeout=30)
    assert all(path.exists() for path in left)  # SIGKILL: no close, no exit handler ran
    clock = ManualClock()
    pipeline = Pipeline(SimulatedMachine("h100-sxm-8", clock=clock))
    try:
        assert not [path for path in left if path.exists()]
        assert list(base.glob(f"gputop-sim-*-{os.getpid()}-*"))  # this live process's trees stay
    finally:
        pipeline.close()

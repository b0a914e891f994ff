"""NIC health (issue 23): the ports read from /sys by the real `NicReader`, over the simulated machine's /sys
(`gputop.sim.fake_sysfs.FakeNicTree`), judged once (`gpu_health.judge_nics`) and shown by `gputop check`, the
diagnosis, the report's infra section, the exporter and the topology dialog.

Each NIC fault goes through every consumer; the simulated machines run on a ManualClock, so nothing waits.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gputop import cli
from gputop.analysis import machine_check as mc
from gputop.analysis.findings import findings as assemble_findings
from gputop.analysis.gpu_health import NIC_DOWN, NIC_ERRORS, NIC_RATE, Severity, judge_nics
from gputop.backend import SimulatedMachine
from gputop.collect.sysfs import IB_DATA_WORD_BYTES, HeldFiles, NicReader
from gputop.exporter import Exporter
from gputop.history import History
from gputop.model import NicPortSample, Snapshot, from_jsonable, to_jsonable
from gputop.pipeline import Pipeline
from gputop.report.jsonreport import report_data
from gputop.report.markdown import render_markdown
from gputop.sim.fake_nvml import ManualClock
from gputop.sim.fake_sysfs import TRAFFIC_SHARE, TREE_PREFIX, FakeNicTree
from gputop.sim.profiles import NIC_FAULTS, faults_help
from gputop.sim.spec import parse_spec
from tests.harness.machine_check import simulated_check_input

# fault -> (the check that fails, its title, the finding the diagnosis makes, the NIC it names)
NIC_FAULT_CASES = {
    "nic-down=mlx5_1": ("nic.state", "NIC ports up", "nic_down", "mlx5_1"),
    "nic-rate=mlx5_3:200": ("nic.rate", "NIC port rates", "nic_rate", "mlx5_3"),
    "nic-errors=mlx5_2": ("nic.errors", "NIC error counters", "nic_errors", "mlx5_2"),
}
NIC_CHECK_IDS = ("nic.state", "nic.rate", "nic.errors")


def check_cli(capsys, *args: str) -> tuple[int, str]:
    rc = cli.main(["check", *args])
    return rc, capsys.readouterr().out


def polled(spec: str, polls: int = 3, step: float = 3.0) -> tuple[Pipeline, list[Snapshot]]:
    """`polls` snapshots of the simulated machine `step` s apart on a ManualClock (the caller closes it)."""
    clock = ManualClock(1_700_000_000.0)
    pipeline = Pipeline(SimulatedMachine(spec, clock=clock))
    pipeline.backend.library.pcie_latency_s = 0.0  # the fake's PCIe sampling sleep is not under test
    snaps = []
    for _ in range(polls):
        snaps.append(pipeline.poll())
        clock.advance(step)
    return pipeline, snaps


# ---------------------------------------------------------------- the reader over the fake /sys


def test_healthy_dgx_ports_read_by_the_real_reader_with_their_traffic():
    clock = ManualClock(1_700_000_000.0)
    spec = parse_spec("h100-sxm-8")
    tree = FakeNicTree(spec, lambda: clock() - 1_700_000_000.0, clock=clock)
    try:
        first = tree.read()
        clock.advance(2.0)
        second = tree.read()
    finally:
        tree.close()
    assert first is not None and second is not None
    assert [(p.device, p.port, p.rdma, p.netdev) for p in second] == [
        (nic.name, 1, True, nic.netdev) for nic in spec.profile.nics
    ]
    for port in second:
        assert port.up and port.state == "ACTIVE" and port.phys_state == "LinkUp" and port.link_layer == "InfiniBand"
        assert port.rate_gbps == 400.0 and port.rate_text == "400 Gb/sec (4X NDR)"
        # port_rcv_data counts 4-byte words: the reader's bytes are words x 4, the rate their change over 2 s
        assert port.rx_bytes is not None and port.rx_bytes % IB_DATA_WORD_BYTES == 0
        assert port.rx_bytes_per_s == pytest.approx(TRAFFIC_SHARE * 400e9 / 8, rel=1e-6)
        assert port.tx_bytes_per_s == pytest.approx(TRAFFIC_SHARE * 400e9 / 8, rel=1e-6)
        assert set(port.errors) >= {"symbol_error", "link_downed", "local_ack_timeout_err"}
        assert "np_cnp_sent" not in port.errors and "port_xmit_wait" not in port.errors  # congestion, not errors
        assert not any(port.errors.values())
    assert all(p.rx_bytes_per_s is None for p in first)  # one reading gives no rate


def test_error_counters_on_their_slower_cadence_carry_over_between_reads(tmp_path):
    clock = ManualClock(1_700_000_000.0)
    spec = parse_spec("h100-sxm-8+nic-errors=mlx5_2")
    tree = FakeNicTree(spec, lambda: clock() - 1_700_000_000.0, clock=clock)
    try:
        reads = []
        for _ in range(4):
            reads.append({p.device: p for p in tree.read() or ()}["mlx5_2"])
            clock.advance(2.0)
    finally:
        tree.close()
    assert [r.errors_at - reads[0].errors_at for r in reads] == [0.0, 0.0, 0.0, 6.0]  # every 5 s: at 0 and 6
    assert reads[1].errors == reads[0].errors and reads[3].errors["symbol_error"] > reads[0].errors["symbol_error"]


def test_rate_and_link_layer_read_on_their_slower_cadence_and_at_once_when_the_state_changes(monkeypatch):
    """Counts the files read: the state and traffic each poll, the rate only every DETAILS_EVERY_S or on a
    change of state (so a link that goes down and comes back at another rate shows it at once)."""
    clock = ManualClock(1_700_000_000.0)
    tree = FakeNicTree(parse_spec("h100-sxm-8"), lambda: clock() - 1_700_000_000.0, clock=clock)
    opened: list[str] = []  # every read, by path: the reader keeps each file open and reads it from its start
    paths: dict[int, str] = {}
    real_open, real_pread = os.open, os.pread

    def path_keeping_open(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        paths[fd] = str(path)
        return fd

    def counting_pread(fd, size, offset):
        opened.append(paths.get(fd, "?"))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "open", path_keeping_open)  # the reader reads sysfs files through plain descriptors
    monkeypatch.setattr(os, "pread", counting_pread)
    try:
        ports = tree.read() or ()
        folder = Path(tree.root, "sys/class/infiniband", ports[0].device, "ports/1")
        reads = []
        for _ in range(4):  # 4 s on a 1 s poll: within the 5 s cadence
            clock.advance(1.0)
            reads.append({p.device: p for p in tree.read() or ()}[ports[0].device])
        assert sum(name.endswith("/rate") for name in opened) == len(ports)  # the first read's only
        assert sum(name.endswith("/state") and "phys" not in name for name in opened) == 5 * len(ports)
        (folder / "state").write_text("1: DOWN\n")
        clock.advance(1.0)
        down = {p.device: p for p in tree.read() or ()}[ports[0].device]
        (folder / "state").write_text("4: ACTIVE\n")
        (folder / "rate").write_text("200 Gb/sec (4X HDR)\n")
        clock.advance(1.0)
        back = {p.device: p for p in tree.read() or ()}[ports[0].device]
    finally:
        tree.close()
    assert all(r.rate_gbps == 400.0 for r in reads)
    assert (down.up, down.state, down.rate_gbps) == (False, "DOWN", None)
    assert (back.up, back.rate_gbps, back.rate_text) == (True, 200.0, "200 Gb/sec (4X HDR)")


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_held_files_read_each_file_afresh_through_one_descriptor_and_close_them(tmp_path):
    counter = tmp_path / "rx_bytes"
    counter.write_text("100\n")
    before = _open_descriptors()
    files = HeldFiles()
    assert files.first_line(str(counter)) == "100"
    counter.write_text("250\n")  # rewritten in place, as the kernel's counter moves
    assert files.first_line(str(counter)) == "250"
    assert files.first_line(str(tmp_path / "missing")) is None
    assert len(files) == 1 and _open_descriptors() == before + 1  # one descriptor, none for the missing file
    files.close()
    assert len(files) == 0 and _open_descriptors() == before


def test_held_files_read_the_real_sysfs_afresh():
    """pread at offset 0 makes sysfs run the attribute's show() again: the loopback counter moves under one
    descriptor as traffic crosses it."""
    import socket

    path = "/sys/class/net/lo/statistics/tx_bytes"
    if not os.path.exists(path):
        pytest.skip("no /sys/class/net/lo on this machine")
    files = HeldFiles()
    try:
        first = int(files.first_line(path) or 0)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(b"x" * 1000, ("127.0.0.1", 9))  # the discard port: nobody need listen
        assert int(files.first_line(path) or 0) >= first + 1000
        assert len(files) == 1
    finally:
        files.close()


def test_held_files_open_a_file_again_when_its_descriptor_fails_and_stop_holding_past_the_limit(tmp_path, monkeypatch):
    """A device that went away answers ENODEV on its old descriptor: the path is opened anew on that read.
    Past the limit, files are read with an open of their own and nothing more is held."""
    import errno

    paths = [tmp_path / f"counter{i}" for i in range(3)]
    for i, path in enumerate(paths):
        path.write_text(f"{i}\n")
    files = HeldFiles(limit=2)
    before = _open_descriptors()
    assert [files.first_line(str(p)) for p in paths] == ["0", "1", "2"]
    assert len(files) == 2 and _open_descriptors() == before + 2  # the third read through an open of its own
    real_pread, failed = os.pread, []

    def gone_once(fd, size, offset):
        if not failed:
            failed.append(fd)
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", gone_once)
    paths[0].write_text("7\n")
    assert files.first_line(str(paths[0])) == "7"  # opened anew, read once
    assert len(files) == 2 and _open_descriptors() == before + 2  # the failed descriptor closed
    files.close()
    assert _open_descriptors() == before


def _descriptors_into_simulated_trees() -> int:
    """This process's descriptors open on a file of its simulated trees. Counted by target, not in all: in a
    pytest worker another test's leftovers (a subprocess pipe, a socket) may be closed by the garbage collector
    in the middle of this test (ci12 read 19 open after against 20 before)."""
    marker = f"{TREE_PREFIX}nic-{os.getpid()}-"
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += marker in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return count


def test_a_closed_pipeline_leaves_no_nic_descriptor_open():
    assert _descriptors_into_simulated_trees() == 0
    pipeline, _snaps = polled("h100-sxm-8", polls=2)
    assert _descriptors_into_simulated_trees() > 0  # the ports' files are held between polls
    pipeline.close()
    assert _descriptors_into_simulated_trees() == 0


def test_ethernet_interface_and_a_machine_without_nics(tmp_path):
    clock = ManualClock(1_700_000_000.0)
    tree = FakeNicTree(parse_spec("rtx-4090-2"), lambda: clock() - 1_700_000_000.0, clock=clock)
    try:
        (port,) = tree.read() or ()
    finally:
        tree.close()
    assert (port.device, port.rdma, port.link_layer, port.state, port.rate_gbps) == ("enp5s0", False, "Ethernet", "up", 2.5)
    assert port.rx_bytes and "rx_crc_errors" in port.errors and "rx_dropped" not in port.errors
    (tmp_path / "sys/class/net/lo").mkdir(parents=True)  # a virtual interface has no PCI device: not a NIC
    assert NicReader(tmp_path).read() == ()


def test_snapshot_with_nics_survives_a_recording():
    pipeline, snaps = polled("h100-sxm-8+nic-errors=mlx5_2", polls=2)
    pipeline.close()
    snap = snaps[-1]
    assert snap.nics and from_jsonable(Snapshot, json.loads(json.dumps(to_jsonable(snap)))) == snap


# ---------------------------------------------------------------- the rules


def port(device: str, up: bool = True, rate: float = 400.0, rx: int = 10**12, errors: int = 0, at: float = 0.0) -> NicPortSample:
    return NicPortSample(
        device=device,
        port=1,
        rdma=True,
        link_layer="InfiniBand",
        up=up,
        state="ACTIVE" if up else "DOWN",
        phys_state="LinkUp" if up else "Polling",
        rate_gbps=rate if up else None,
        rx_bytes=rx,
        tx_bytes=rx,
        errors={"symbol_error": errors},
        errors_at=at,
    )


def snap_of(*ports: NicPortSample, at: float = 0.0) -> Snapshot:
    from gputop.model import HostSample

    return Snapshot(timestamp=at, host=HostSample(cpu_percent=()), nics=ports)


def rules_of(judged) -> dict[str, tuple[str, ...]]:
    return {h.name: tuple(p.rule for p in h.problems) for h in judged.ports if h.problems}


def test_a_port_never_cabled_whose_peers_are_down_too_is_not_a_fault():
    unused = snap_of(port("mlx5_0", up=False, rx=0), port("mlx5_1", up=False, rx=0))
    assert rules_of(judge_nics([unused])) == {}
    used = snap_of(port("mlx5_0", up=False, rx=5), port("mlx5_1", up=False, rx=0))
    assert rules_of(judge_nics([used])) == {"mlx5_0 port 1": (NIC_DOWN,)}
    beside_a_live_peer = snap_of(port("mlx5_0"), port("mlx5_1", up=False, rx=0))
    assert rules_of(judge_nics([beside_a_live_peer])) == {"mlx5_1 port 1": (NIC_DOWN,)}


def test_rate_below_its_own_highest_in_the_window_and_errors_counted_since_load_only_when_they_climb():
    alone = [snap_of(port("mlx5_0", rate=400.0, errors=9, at=0.0)), snap_of(port("mlx5_0", rate=200.0, errors=9, at=5.0))]
    judged = judge_nics(alone)
    assert rules_of(judged) == {"mlx5_0 port 1": (NIC_RATE,)}
    assert "down from 400 Gb/s while we watched" in judged.ports[0].problems[0].evidence
    climbing = [snap_of(port("mlx5_0", errors=9, at=0.0)), snap_of(port("mlx5_0", errors=12, at=5.0))]
    (problem,) = judge_nics(climbing).ports[0].problems
    assert problem.rule == NIC_ERRORS and problem.severity == Severity.CRITICAL
    assert problem.evidence == "mlx5_0 port 1: symbol_error +3 (now 12) in 5 s"
    assert judge_nics([snap_of(port("mlx5_0", errors=9))]).ports[0].problems == ()  # read once: cannot climb
    assert judge_nics([Snapshot(timestamp=0.0, host=snap_of().host)]) is None  # no NIC readings at all


# ---------------------------------------------------------------- gputop check


def test_done_when_a_half_rate_rail_fails_the_check_with_one_line_naming_it(capsys):
    rc, out = check_cli(capsys, "--simulate", "h100-sxm-8+nic-rate=mlx5_3:200", "--seconds", "0.3")
    failing = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert rc == mc.EXIT_INFRA, out
    assert failing == [
        "FAIL  NIC port rates: mlx5_3 port 1: 200 Gb/sec (4X HDR) where its peers run at 400 Gb/s; "
        "expected each port at its peers' rate and its own highest"
    ], out


@pytest.mark.parametrize("fault", sorted(NIC_FAULT_CASES))
def test_each_nic_fault_fails_one_check_line_naming_the_nic(fault):
    check_id, title, _, nic = NIC_FAULT_CASES[fault]
    results = mc.run_checks(simulated_check_input(f"h100-sxm-8+{fault}", seconds=6.0))
    failing = [r for r in results if r.status == mc.FAIL]
    assert [r.id for r in failing] == [check_id], [r.line() for r in failing]
    assert failing[0].line().startswith(f"FAIL  {title}: {nic} port 1: ")
    assert mc.exit_code(results) == mc.EXIT_INFRA
    assert {r.id: r.status for r in results if r.id in NIC_CHECK_IDS if r.id != check_id} == {
        i: mc.PASS for i in NIC_CHECK_IDS if i != check_id
    }


def test_a_lone_ethernet_interface_that_went_down_warns():
    """A plain interface may be down on purpose (a second port set down): a warning (exit 4), not a fault."""
    results = mc.run_checks(simulated_check_input("rtx-4090-2+nic-down=enp5s0", seconds=6.0))
    (warning,) = [r for r in results if r.status == mc.WARN]
    assert warning.line().startswith("WARN  NIC ports up: enp5s0: port down where it has carried traffic")
    assert mc.exit_code(results) == mc.EXIT_CONFIG


def test_wireless_interfaces_are_not_nics_of_the_job(tmp_path):
    for n, (name, marker) in enumerate((("enp1s0", None), ("wlp2s0", "wireless"), ("wlan1", "phy80211"))):
        folder = tmp_path / "sys/class/net" / name
        device = tmp_path / "sys/devices/pci0000:00" / f"0000:00:0{n + 1}.0"  # a PCI function each
        device.mkdir(parents=True)
        folder.mkdir(parents=True)
        (folder / "device").symlink_to(device)
        (folder / "operstate").write_text("up\n")
        if marker:
            (folder / marker).mkdir()
    assert [p.device for p in NicReader(tmp_path).read() or ()] == ["enp1s0"]


@pytest.mark.parametrize("spec", ["h100-sxm-8", "rtx-4090-2"])
def test_a_healthy_simulated_machine_passes_the_nic_checks(spec):
    results = {r.id: r for r in mc.run_checks(simulated_check_input(spec, seconds=6.0))}
    assert [results[i].status for i in NIC_CHECK_IDS] == [mc.PASS] * 3, [results[i].line() for i in NIC_CHECK_IDS]
    ports = "8 ports" if spec == "h100-sxm-8" else "1 port"
    assert results["nic.state"].value == f"{ports[0]} of {ports} up"
    assert results["nic.errors"].value == f"none climbing on {ports} in 6 s"


def test_a_machine_without_nics_skips_them_with_one_line():
    inp = simulated_check_input("h100-sxm-8", seconds=6.0)
    for nics, why in (((), "none found"), (None, "not read")):
        results = mc.run_checks(replace(inp, snapshots=tuple(replace(s, nics=nics) for s in inp.snapshots)))
        nic_lines = [r for r in results if r.id.startswith("nic")]
        assert [(r.id, r.status) for r in nic_lines] == [("nic", mc.SKIP)], [r.line() for r in nic_lines]
        assert nic_lines[0].value.startswith(why) and mc.exit_code(results) == mc.EXIT_HEALTHY


def test_bad_nic_faults_are_one_line_usage_errors(capsys):
    for spec, message in (
        ("h100-sxm-8+nic-rate=mlx5_9:200", "nic-rate=mlx5_9:200: h100-sxm-8's NICs are mlx5_0, mlx5_1"),
        ("h100-sxm-8+nic-rate=mlx5_3", "nic-rate needs DEV:GBPS"),
        ("h100-sxm-8+nic-down=mlx5_3:1", "nic-down needs a NIC name only"),
    ):
        assert cli.main(["check", "--simulate", spec]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    for form, _ in NIC_FAULTS.values():
        assert form in faults_help()


# ---------------------------------------------------------------- the diagnosis and the report


@pytest.mark.parametrize("fault", sorted(NIC_FAULT_CASES))
def test_each_nic_fault_in_the_diagnosis_and_the_reports_infra_section(fault):
    check_id, title, finding_id, nic = NIC_FAULT_CASES[fault]
    inp = simulated_check_input(f"h100-sxm-8+{fault}", seconds=6.0)
    check = mc.build_report(inp)
    history = History(inp.machine, capacity=10)
    for snap in inp.snapshots:
        history.append(snap)
    found = assemble_findings(history, check=check, window=None)
    nic_findings = [f for f in found if f.id.startswith("nic") or f.id.startswith("check.nic")]
    assert [(f.id, f.severity) for f in nic_findings] == [(finding_id, "critical")]  # one, not the check's twice
    assert nic in nic_findings[0].summary and nic in nic_findings[0].fix
    data = report_data(history, found, infra=check)
    assert [c["id"] for c in data["infra"]["failing"]] == [check_id]
    rows = {row["device"]: row for row in data["infra"]["nics"]}
    assert len(rows) == 8 and rows[nic]["problems"] and not any(r["problems"] for d, r in rows.items() if d != nic)
    text = render_markdown(history, found, infra=check)
    (row,) = [line for line in text.splitlines() if line.startswith(f"| {nic} port 1 |")]
    assert re.search(r"where its peers|down from|\+\d+", row), row


def test_report_from_a_recording_names_the_nic_from_its_snapshots():
    """Without a check (a recording), the infra section lists the diagnosis' NIC finding and the ports."""
    pipeline, snaps = polled("h100-sxm-8+nic-down=mlx5_1")
    pipeline.close()
    history = History(pipeline.machine, capacity=10)
    for snap in snaps:
        history.append(snap)
    found = assemble_findings(history, window=None)
    data = report_data(history, found)
    assert [c["id"] for c in data["infra"]["failing"]] == ["nic_down"]
    assert "mlx5_1 port 1" in data["infra"]["failing"][0]["value"]
    assert {r["device"]: r["state"] for r in data["infra"]["nics"]}["mlx5_1"] == "DOWN"


# ---------------------------------------------------------------- the exporter


def scraped(spec: str) -> tuple[dict[tuple[str, frozenset], float], str]:
    pipeline, snaps = polled(spec, polls=3)  # 6 s: two readings of the error counters (every 5 s), so they climb
    try:
        exporter = Exporter(pipeline, diagnose=lambda history: [], log=lambda line: None)
        for snap in snaps:
            exporter.update(snap)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(exporter)
        text = generate_latest(registry).decode()
    finally:
        pipeline.close()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value for family in text_string_to_metric_families(text) for s in family.samples
    }
    return samples, exporter.hostname


def nic_values(samples, name: str, **match: str) -> dict[str, float]:
    want = set(match.items())
    return {dict(labels)["device"]: v for (n, labels), v in samples.items() if n == name and want <= labels}


@pytest.mark.parametrize("fault", sorted(NIC_FAULT_CASES))
def test_each_nic_fault_in_the_exporter(fault):
    samples, hostname = scraped(f"h100-sxm-8+{fault}")
    nic = NIC_FAULT_CASES[fault][3]
    others = [f"mlx5_{i}" for i in range(8) if f"mlx5_{i}" != nic]
    up = nic_values(samples, "gputop_nic_up", port="1", Hostname=hostname)
    rate = nic_values(samples, "gputop_nic_rate_gbps", port="1", Hostname=hostname)
    symbols = nic_values(samples, "gputop_nic_errors_total", counter="symbol_error")
    received = nic_values(samples, "gputop_nic_receive_bytes_total")
    sent = nic_values(samples, "gputop_nic_transmit_bytes_total")
    assert all(up[o] == 1.0 and rate[o] == 400.0 and symbols[o] == 0 for o in others), (up, rate, symbols)
    assert all(received[o] > 0 and sent[o] > 0 for o in others)
    if fault.startswith("nic-down"):
        assert up[nic] == 0.0 and nic not in rate
    elif fault.startswith("nic-rate"):
        assert up[nic] == 1.0 and rate[nic] == 200.0
    else:
        assert up[nic] == 1.0 and symbols[nic] > 0
    # gputop check's judgement of the exporter's window, one series per port and rule (the fleet view reads it)
    health = nic_values(samples, "gputop_nic_health", port="1", Hostname=hostname)
    problems = [
        (dict(labels)["device"], dict(labels)["rule"], dict(labels)["severity"])
        for (name, labels), value in samples.items()
        if name == "gputop_nic_health_problem" and value == 1.0
    ]
    assert problems == [(nic, NIC_FAULT_CASES[fault][2], "critical")]
    assert health[nic] == 2.0 and all(health[o] == 0.0 for o in others), health


# ---------------------------------------------------------------- the topology dialog


@pytest.mark.integration  # Textual's pilot
def test_topology_dialog_shows_each_nic_ports_state_rate_and_traffic():
    import asyncio
    import io

    from rich.console import Console
    from textual.widgets import Static

    from gputop.tui.screens import TopologyScreen
    from tests.harness.histories import ScriptedSource
    from tests.harness.tui import build_app, settle, wait_for

    pipeline, snaps = polled("h100-sxm-8+nic-rate=mlx5_3:200+nic-down=mlx5_6", polls=3)
    pipeline.close()

    async def shown() -> str:
        app, source = build_app(source=ScriptedSource(pipeline.machine, snaps))
        try:
            async with app.run_test(size=(160, 60)) as pilot:
                await settle(pilot, app, source, diagnosis=False)
                await pilot.press("T")
                await wait_for(pilot, lambda: isinstance(app.screen, TopologyScreen), "the topology dialog")
                await pilot.pause()
                table = app.screen.query_one("#nic-ports", Static).content  # the Rich table the dialog shows
                console = Console(width=160, file=io.StringIO(), record=True, color_system=None)
                console.print(table)
                return console.export_text()
        finally:
            source.close()

    lines = {line.split()[0]: line for line in asyncio.run(shown()).splitlines() if line.strip().startswith("mlx5_")}
    assert len(lines) == 8
    assert re.search(
        r"mlx5_0 port 1\s+InfiniBand\s+ACTIVE\s+400 Gb/sec \(4X NDR\)\s+15\.0 GB/s\s+15\.0 GB/s\s+0", lines["mlx5_0"]
    )
    assert "200 Gb/sec (4X HDR)" in lines["mlx5_3"] and "7.5 GB/s" in lines["mlx5_3"]
    assert "DOWN (Polling)" in lines["mlx5_6"]


def test_the_nic_page_documents_the_nic_metrics():
    page = (Path(__file__).parent.parent / "docs" / "nics.md").read_text()
    for name in (
        "gputop_nic_up",
        "gputop_nic_rate_gbps",
        "gputop_nic_errors_total",
        "gputop_nic_health",
        "gputop_nic_health_problem",
        "nic-rate=DEV:GBPS",
    ):
        assert name in page, name

"""Issue 35: the NVSwitch fabric (Fabric Manager) and the XIDs' actions, through the check, the report, the card
and /metrics; the check's fault drill (a link trained down, an XID 79) exits 3.

The machines are the real pynvml wrappers over the fake NVML library (`tests/test_gpu_health.observe`)."""

from __future__ import annotations

import pytest

from gputop import cli
from gputop.analysis import machine_check as mc
from gputop.analysis.findings import findings as assemble_findings
from gputop.analysis.gpu_health import FABRIC, Severity, fabric_health, judge_window
from gputop.analysis.xids import CATALOGUE, meaning_of
from gputop.backend import SimulatedMachine
from gputop.model import FabricInfo
from gputop.pipeline import Pipeline
from gputop.report.jsonreport import report_data
from tests.test_gpu_health import observe


def exported(spec: str, family: str) -> list[tuple[dict[str, str], float]]:
    from gputop.exporter import Exporter

    with Pipeline(SimulatedMachine(spec)) as pipeline:
        exporter = Exporter(pipeline, diagnose=lambda history: [], log=lambda line: None)
        exporter.update(pipeline.poll())
        return [(s.labels, s.value) for f in exporter.collect() if f.name == family for s in f.samples]


def result(report: mc.CheckReport, check_id: str) -> mc.CheckResult:
    return next(r for r in report.results if r.id == check_id)


@pytest.mark.parametrize(
    "spec, status, word",
    [("h100-sxm-8+fabric-not-started=3", mc.FAIL, "fabric down"), ("h100-sxm-8+fabric-degraded=3", mc.WARN, "fabric degr")],
)
def test_a_fabric_fault_is_one_line_one_mark_one_metric(spec, status, word):
    history, check, health = observe(spec)
    line = result(check, "fabric")
    assert line.status == status and line.gpus == (3,)
    judged = judge_window(list(history))[3].of(FABRIC)
    assert [p.word for p in judged] == [word]  # the card's mark (health_problems words)
    assert health[3] == (2.0 if status == mc.FAIL else 1.0) and all(v == 0.0 for i, v in health.items() if i != 3)
    states = {labels["gpu"]: value for labels, value in exported(spec, "gputop_gpu_fabric_state")}
    assert states == {str(i): (1.0 if i == 3 and status == mc.FAIL else 3.0) for i in range(8)}
    masks = {labels["gpu"]: int(value) for labels, value in exported(spec, "gputop_gpu_fabric_health_mask")}
    assert (masks["3"] & 0x3 == 1) is (status == mc.WARN) and masks["0"] == 0xAA  # every field FALSE
    found = assemble_findings(history, check=check, window=None)
    assert [f.gpus for f in found if f.id == "fabric"] == [(3,)]


def test_no_nvswitch_fabric_is_not_a_fault():
    history, check, health = observe("rtx-4090-2")
    line = result(check, "fabric")
    assert line.status == mc.SKIP and "no NVSwitch fabric" in line.value and "NotSupported" in line.value
    assert all(g.fabric is None for g in list(history)[-1].gpus) and not any(health.values())
    assert exported("rtx-4090-2", "gputop_gpu_fabric_state") == []


def test_a_driver_without_the_v_call_reads_the_fabric_without_a_mask():
    history, check, _ = observe("h100-sxm-8+old-driver")
    fabric = list(history)[-1].gpus[0].fabric
    assert fabric is not None and fabric.state == 3 and fabric.health_mask is None
    assert result(check, "fabric").status == mc.PASS


def test_the_health_mask_fields():
    degraded_route_unhealthy = 1 | 2 << 2 | 1 << 4 | 2 << 6
    assert fabric_health(FabricInfo(3, 0, 1, None, degraded_route_unhealthy)) == [
        ("degraded bandwidth", Severity.WARN),
        ("route unhealthy", Severity.CRITICAL),
    ]
    assert fabric_health(FabricInfo(3, 0, 1, None, None)) == []


def test_a_fabric_fault_on_a_board_without_one_is_a_usage_error(capsys):
    assert cli.main(["check", "--simulate", "rtx-4090-2+fabric-degraded=0"]) == 2
    assert "no NVSwitch fabric" in capsys.readouterr().err


# ---------------------------------------------------------------- XIDs with their actions


def test_every_catalogued_xid_has_an_action_and_nvidias_bucket():
    buckets = {"RESTART_APP", "RESET_GPU", "RESTART_BM", "CONTACT_SUPPORT", "IGNORE"}
    for code, meaning in CATALOGUE.items():
        assert meaning.action and meaning.bucket in buckets, code
    assert meaning_of(79).bucket == "RESTART_BM" and "riser" in meaning_of(79).action
    assert meaning_of(48).bucket == "RESET_GPU" and meaning_of(64).bucket == "CONTACT_SUPPORT"
    assert meaning_of(31).bucket == "RESTART_APP"  # the job's: an illegal address in a kernel
    assert meaning_of(9999).bucket == "CONTACT_SUPPORT"  # unknown: the hardware's until shown otherwise


def test_an_xid_79_carries_its_action_into_the_check_the_report_and_metrics():
    history, check, health = observe("h100-sxm-8+xid=3:79")
    line = result(check, "xid")
    assert line.status == mc.FAIL and line.gpus == (3,) and "action RESTART_BM: drain the node and reboot it" in line.value
    assert any("action RESTART_BM" in e for e in line.evidence) and health[3] == 2.0
    found = assemble_findings(history, check=check, window=None)
    from_recording = report_data(history, found)  # no machine check: the infra section from the snapshots
    assert any("XID 79" in x and "RESTART_BM" in x for x in from_recording["infra"]["xids"])
    info = exported("h100-sxm-8+xid=3:79", "gputop_xid_info")
    assert [(labels["xid"], labels["bucket"], labels["severity"]) for labels, _ in info] == [("79", "RESTART_BM", "critical")]
    assert "riser" in info[0][0]["action"]


@pytest.mark.parametrize("fault", ["pcie-degraded=3", "xid=3:79"])
def test_the_fault_drill_exits_3_naming_gpu_3(capsys, fault):
    assert cli.main(["check", "--simulate", f"h100-sxm-8+{fault}", "--seconds", "1"]) == mc.EXIT_INFRA
    failing = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert failing and all("GPU 3" in line for line in failing)

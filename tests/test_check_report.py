"""The report's "For the infra team" section (issue 16): the ticket text, live and from a recording."""

from __future__ import annotations

import json
import re

from gputop import cli
from gputop.analysis.diagnosis import diagnose
from gputop.backend import SimulatedMachine
from gputop.history import History
from gputop.pipeline import Pipeline
from gputop.report.markdown import render_markdown
from gputop.sim.fake_nvml import ManualClock

COMMANDS = ("sudo nvidia-bug-report.sh", "dcgmi diag -r 2", "nvidia-smi -q")


def section(markdown: str) -> str:
    return markdown[markdown.index("## For the infra team") : markdown.index("## Machine")]


def test_live_report_carries_the_infra_section(capsys):
    rc = cli.main(["report", "--simulate", "h100-sxm-8+kernel-xid=3:79+nvlink-crc=1:2", "--seconds", "0.6", "--interval", "0.2"])
    out = capsys.readouterr().out
    assert rc == 0
    infra = section(out)
    # identity: host, kernel, driver, and every GPU's serial, VBIOS, part number, bus id
    assert "| Kernel | 6.8.0-49-generic |" in infra and "| Driver | 560.35.03 |" in infra
    assert "| 3 | NVIDIA H100 80GB HBM3 | 1654922000003 | 96.00.99.00.01 | 692-2G520-0200-000 | 00000000:5D:00.0 |" in infra
    # the failing checks, with their numbers
    assert re.search(r"- \*\*FAIL\*\* NVLink error counters: GPU 1 link 2: CRC \(flit\) \+\d+ in \d\.\d s", infra)
    assert "- **FAIL** XIDs: GPU 3: XID 79 (GPU has fallen off the bus)" in infra
    # the XIDs with their times, the next commands, the reset advice
    assert re.search(
        r"20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC  GPU 3  XID 79: GPU has fallen off the bus \[kernel log, PCI 0000:5d:00\]", infra
    )
    for command in COMMANDS:
        assert command in infra
    assert "before any reset" in infra and "clears the volatile ECC counters" in infra
    # and the verdict agrees with it
    verdict = next(line for line in out.splitlines() if line.startswith("**Verdict:**"))
    assert "Healthy" not in verdict and ("NVLink error counters" in verdict or "XIDs" in verdict)


def test_json_report_carries_the_same(capsys):
    rc = cli.main(
        ["report", "--simulate", "h100-sxm-8+retired-page=4", "--seconds", "0.6", "--interval", "0.2", "--format", "json"]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    infra = data["infra"]
    assert infra["source"] == "checks" and infra["exit_code"] == 3
    assert [c["id"] for c in infra["failing"]] == ["memory.retired_pages"] and infra["failing"][0]["gpus"] == [4]
    assert infra["gpus"][4]["serial"] == "1654922000004"
    assert [c["command"] for c in infra["next_commands"]] == list(COMMANDS)
    assert "before any reset" in infra["advice"]
    assert any(f["id"] == "check.memory.retired_pages" and f["label"].startswith("infrastructure") for f in data["findings"])


def test_healthy_machine_says_no_check_failed(capsys):
    assert cli.main(["report", "--simulate", "--seconds", "0.6", "--interval", "0.2"]) == 0
    infra = section(capsys.readouterr().out)
    assert "No check failed." in infra and "**XIDs**\n\nNone seen." in infra
    assert "healthy (" in infra


def test_report_from_snapshots_only_says_what_is_missing():
    """A report built from a recording has no NVML details or kernel log: the section says so and still
    gives the XIDs NVML reported, with their times, and the infrastructure findings."""
    clock = ManualClock()
    pipeline = Pipeline(SimulatedMachine("h100-sxm-8+xid=5:79@1+pcie-degraded=2", clock=clock))
    history = History(pipeline.machine)
    try:
        for _ in range(6):
            history.append(pipeline.poll())
            clock.advance(1.0)
    finally:
        pipeline.close()
    markdown = render_markdown(history, diagnose(history, window=None))
    infra = section(markdown)
    assert "_Missing:_ serials, VBIOS, error counters and the kernel log were not read" in infra
    assert "`gputop check` on the machine itself" in infra
    assert re.search(r"UTC  GPU 5  XID 79: GPU has fallen off the bus \[NVML event\]", infra)
    assert "- **FAIL** " in infra and "PCIe" in infra  # the diagnosis' infrastructure finding
    assert "| 5 | NVIDIA H100 80GB HBM3 | — | — | — | 00000000:AB:00.0 |" in infra
    for command in COMMANDS:
        assert command in infra

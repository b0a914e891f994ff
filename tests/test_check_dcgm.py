"""`gputop check --dcgm [1|2]`: DCGM's diagnostics folded into the check's lines and exit status.

A fake `dcgmi` (a real executable on PATH, run as a child process) prints a recorded `dcgmi diag -j` document
(tests/fixtures/dcgm, whose README says where the format comes from) and exits as dcgmi would; the check runs
on the simulated machine through the real CLI.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gputop import cli
from gputop.analysis import machine_check as mc
from gputop.analysis.dcgm_diag import FAIL, PASS, SKIP, WARN, DcgmRun, dcgm_results, parse_diag

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"


def fake_dcgmi(bin_dir: Path, fixture: str, exit_code: int = 0, prefix: str = "") -> Path:
    """An executable `dcgmi` that records its arguments, prints `prefix` then the fixture, and exits `exit_code`."""
    bin_dir.mkdir(exist_ok=True)
    args_file = bin_dir / "args.txt"
    script = bin_dir / "dcgmi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > "{args_file}"\n'
        + (f"printf '%s\\n' '{prefix}'\n" if prefix else "")
        + (f'cat "{FIXTURES / fixture}"\n' if fixture else "")
        + f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return args_file


def run_check(capsys, monkeypatch, bin_dir: Path, *args: str) -> tuple[int, list[str]]:
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    code = cli.main(["check", "--simulate", "h100-sxm-8", "--seconds", "1", *args])
    return code, capsys.readouterr().out.splitlines()


def test_a_failing_pcie_test_fails_the_check_naming_its_gpu(tmp_path, capsys, monkeypatch):
    args = fake_dcgmi(tmp_path / "bin", "diag_r2_pcie_fail.json", exit_code=226)  # dcgmi exits non-zero on a failure
    code, lines = run_check(capsys, monkeypatch, tmp_path / "bin", "--dcgm", "2")
    assert args.read_text().split() == ["diag", "-r", "2", "-j"]
    assert code == mc.EXIT_INFRA
    pcie = [line for line in lines if line.startswith("FAIL  DCGM diag -r 2: PCIe")]
    assert len(pcie) == 1 and "GPU 3: Fail (Bandwidth of GPU 3 in direction h2d of 11.52" in pcie[0]
    assert any(line.startswith("WARN  DCGM diag -r 2: Persistence Mode") for line in lines)
    assert any(line.startswith("PASS  DCGM diag -r 2: GPU Memory (Hardware): Pass on GPUs 0, 1") for line in lines)


def test_json_carries_each_dcgm_test_with_its_gpus(tmp_path, capsys, monkeypatch):
    fake_dcgmi(tmp_path / "bin", "diag_r2_pcie_fail.json", exit_code=226)
    code, lines = run_check(capsys, monkeypatch, tmp_path / "bin", "--dcgm", "2", "--json")
    data = json.loads("\n".join(lines))
    pcie = next(c for c in data["checks"] if c["id"] == "dcgm.pcie")
    assert code == mc.EXIT_INFRA and pcie["status"] == "fail" and pcie["gpus"] == [3]
    assert data["status"] == "fail"


def test_level_1_passing_keeps_a_healthy_machine_healthy(tmp_path, capsys, monkeypatch):
    args = fake_dcgmi(tmp_path / "bin", "diag_r1_pass.json", prefix="WARNING: a deprecation line before the JSON")
    code, lines = run_check(capsys, monkeypatch, tmp_path / "bin", "--dcgm")  # the level defaults to 1
    assert args.read_text().split() == ["diag", "-r", "1", "-j"]
    dcgm = [line for line in lines if "DCGM diag -r 1" in line]
    assert code == mc.EXIT_HEALTHY and len(dcgm) == 9 and all(line.startswith("PASS") for line in dcgm)


def test_without_dcgm_one_line_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None if name == "dcgmi" else "/usr/bin/" + name)
    code, lines = run_check(capsys, monkeypatch, tmp_path, "--dcgm", "1")
    dcgm = [line for line in lines if "DCGM" in line]
    assert code == mc.EXIT_HEALTHY  # a SKIP never changes the exit status
    assert len(dcgm) == 1 and dcgm[0].startswith("SKIP") and "datacenter-gpu-manager" in dcgm[0]


def test_a_dcgmi_that_cannot_reach_its_host_engine_says_so(tmp_path, capsys, monkeypatch):
    fake_dcgmi(
        tmp_path / "bin", "", exit_code=255, prefix="Error: unable to establish a connection to the specified host: localhost"
    )
    code, lines = run_check(capsys, monkeypatch, tmp_path / "bin", "--dcgm", "1")
    dcgm = [line for line in lines if "DCGM" in line]
    assert code == mc.EXIT_HEALTHY and len(dcgm) == 1 and dcgm[0].startswith("SKIP") and "nv-hostengine" in dcgm[0]


def test_no_dcgm_flag_runs_no_dcgmi(tmp_path, capsys, monkeypatch):
    args = fake_dcgmi(tmp_path / "bin", "diag_r1_pass.json")
    code, lines = run_check(capsys, monkeypatch, tmp_path / "bin")
    assert not args.exists() and not any("DCGM diag" in line for line in lines)


@pytest.mark.parametrize("argv", [["--dcgm", "3"], ["--dcgm", "x"]])
def test_a_bad_level_is_one_line(capsys, argv):
    assert cli.main(["check", *argv]) == 2
    err = capsys.readouterr().err
    assert "--dcgm" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- the parser on DCGM's shapes


def test_statuses_in_either_case_and_dcgm_4s_top_level_tests():
    doc = {
        "DCGM Diagnostic": {
            "tests": [
                {
                    "name": "memory",
                    "results": [{"entity_id": 0, "status": "PASS"}, {"entity_id": 1, "status": "FAIL", "warnings": ["ECC"]}],
                },
                {"name": "pcie", "results": [{"entity_id": 0, "status": "SKIPPED"}, None]},
            ]
        }
    }
    tests = parse_diag(json.dumps(doc))
    assert tests is not None and [(t.name, t.status) for t in tests] == [("memory", FAIL), ("pcie", SKIP)]
    lines = dcgm_results(DcgmRun(2, stdout=json.dumps(doc), returncode=226))
    assert [line.status for line in lines] == [FAIL, SKIP] and lines[0].gpus == (1,)


def test_the_recorded_outputs_parse_to_their_tests():
    r2 = parse_diag((FIXTURES / "diag_r2_pcie_fail.json").read_text())
    assert r2 is not None
    assert {t.name: t.status for t in r2}["PCIe"] == FAIL and {t.name: t.status for t in r2}["Persistence Mode"] == WARN
    assert {t.category for t in r2} == {"Deployment", "Integration", "Hardware"}
    r1 = parse_diag((FIXTURES / "diag_r1_pass.json").read_text())
    assert r1 is not None and {t.status for t in r1} == {PASS}
    assert parse_diag("Error: no JSON here") is None

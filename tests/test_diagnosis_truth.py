"""Findings that must stay right under real CUDA semantics (issue 11): the machine view's idle GPUs, hangs
told from slow progress by counters, hangs that began before gputop attached, and advice within its caps."""

from __future__ import annotations

from gputop.analysis.diagnosis import diagnose, severe, verdict_line
from tests.history_builder import Scenario, build


def ids(findings):
    return [f.id for f in findings]


# ---------------------------------------------------------------- machine view: 1 busy GPU, 7 idle


def test_one_busy_gpu_and_seven_idle_without_pid_is_not_healthy_and_names_the_pid():
    sc = Scenario(
        util=lambda g, t: 87.0 if g == 0 else 0.0,
        memory_gib=lambda g, t: 40.0 if g == 0 else 0.0,
        processes=lambda g, t: (4242,) if g == 0 else (),
        attach=False,
    )
    findings = diagnose(build(sc))
    top = findings[0]
    assert "healthy" not in ids(findings)
    assert top.id == "idle_gpus" and top.severity == "warning"
    assert top.summary.startswith("7 of 8 GPUs idle while a job uses 1")
    line = verdict_line(findings)
    assert "4242" in line and "--pid 4242" in line and not line.startswith("Healthy")
    assert any("DDP was not launched" in e for e in top.evidence)


def test_all_gpus_busy_without_pid_stays_healthy():
    sc = Scenario(
        util=lambda g, t: 92.0,
        memory_gib=lambda g, t: 40.0,
        processes=lambda g, t: (5000 + g,),
        attach=False,
    )
    findings = diagnose(build(sc))
    assert findings[0].id == "healthy" and not severe(findings)

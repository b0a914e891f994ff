"""Findings that read GPM (gputop/analysis/checks/kernels.py): a collective spinning told by its SMs, tensor cores
left idle, memory-bandwidth-bound kernels.  Hand-built histories here; the same findings on recordings of the simulated machine
driven by a real torch job are in tests/test_demo_replays.py."""

from __future__ import annotations

import dataclasses

import pytest

from gputop.analysis.checks import hang
from gputop.analysis.checks.kernels import is_collective_spin
from gputop.analysis.diagnosis import diagnose, verdict_line
from gputop.model import GpmMetrics, GpuSample
from tests.harness.histories import Scenario, build
from tests.test_diagnosis_truth import _nccl_hang

SPINNING = GpmMetrics(sm_active=3.0, sm_occupancy=2.0, tensor_active=0.0, dram_bandwidth=0.0, fp32_active=0.0, fp16_active=0.0)
COMPUTING = GpmMetrics(
    sm_active=90.0, sm_occupancy=45.0, tensor_active=55.0, dram_bandwidth=20.0, fp32_active=6.0, fp16_active=3.0
)
FP32_GEMM = GpmMetrics(
    sm_active=88.0, sm_occupancy=45.0, tensor_active=0.0, dram_bandwidth=30.0, fp32_active=70.0, fp16_active=0.0
)
MEMORY_BOUND = GpmMetrics(
    sm_active=35.0, sm_occupancy=30.0, tensor_active=0.0, dram_bandwidth=85.0, fp32_active=12.0, fp16_active=0.0
)


def ids(findings):
    return [f.id for f in findings]


def _with_gpm(scenario: Scenario, gpm: GpmMetrics, capability=(9, 0)) -> Scenario:
    extra = scenario.gpu_extra
    return dataclasses.replace(
        scenario, gpu_extra=lambda g, t: {**extra(g, t), "gpm": None if g == 3 else gpm, "compute_capability": capability}
    )


# ---------------------------------------------------------------- a collective spinning, by its SMs


def test_nccl_hang_is_found_from_sm_activity_alone_with_the_power_heuristic_off(monkeypatch):
    # 650 W of 700 W: the power heuristic calls that compute; and it is switched off on top (no power passes it)
    monkeypatch.setattr(hang, "SPIN_POWER_MAX_SHARE", 0.0)
    findings = diagnose(build(_with_gpm(_nccl_hang(650.0), SPINNING)))
    hangs = [f for f in findings if f.id == "hang"]
    assert len(hangs) == 1 and findings[0] is hangs[0]
    assert hangs[0].summary.startswith("Hang: rank 3 stuck for"), hangs[0].summary
    assert "7 other rank(s) wait for it in a collective (their GPUs spin" in hangs[0].summary
    assert any("3% of its SMs active" in e and "spinning" in e for e in hangs[0].evidence), hangs[0].evidence
    # the same GPUs without GPM and the power heuristic off: nothing tells the spin, so no hang of the waiters
    findings = diagnose(build(_nccl_hang(650.0)))
    assert not any(f.id == "hang" and set(f.pids) - {1003} for f in findings)


def test_sm_activity_overrules_low_power_where_gpm_exists():
    # 140 W looks like a spin to the power heuristic, but 90% of the SMs are active: compute, not a hang
    findings = diagnose(build(_with_gpm(_nccl_hang(140.0), COMPUTING)))
    assert not any(f.id == "hang" and set(f.pids) - {1003} for f in findings)


def test_without_gpm_the_power_heuristic_still_decides():
    sample = GpuSample(index=0, uuid="u", name="n", pci_bus_id="b", utilization_gpu=100.0, power=140.0, power_limit=700.0)
    assert is_collective_spin(sample) is None
    assert hang._is_spin(sample)  # 140 W of 700 W
    assert is_collective_spin(dataclasses.replace(sample, gpm=SPINNING)) is True
    assert is_collective_spin(dataclasses.replace(sample, gpm=COMPUTING)) is False
    assert not hang._is_spin(dataclasses.replace(sample, gpm=COMPUTING))


# ---------------------------------------------------------------- tensor cores idle, memory-bound


def _busy_job(gpm: GpmMetrics, capability=(9, 0), util=95.0) -> Scenario:
    return Scenario(
        seconds=30,
        util=lambda g, t: util,
        processes=lambda g, t: (5000 + g,),
        attach=False,
        gpu_extra=lambda g, t: {"gpm": gpm, "compute_capability": capability},
    )


def test_fp32_gemms_with_idle_tensor_cores_get_the_amp_advice():
    findings = diagnose(build(_busy_job(FP32_GEMM)))
    amp = next(f for f in findings if f.id == "no_tensor_cores")
    assert amp.severity == "info" and findings[0].id == "healthy"  # advice, not a problem: the verdict stays healthy
    assert set(amp.gpus) == set(range(8))
    assert "bf16 autocast" in amp.summary and "torch.autocast('cuda', dtype=torch.bfloat16)" in amp.fix
    assert any("tensor cores 0%" in e and "FP32 pipe 70%" in e for e in amp.evidence)


@pytest.mark.parametrize(
    "gpm, capability, util",
    [
        (COMPUTING, (9, 0), 95.0),  # already on the tensor cores
        (FP32_GEMM, (7, 5), 95.0),  # Turing: no bf16 tensor cores
        (FP32_GEMM, (9, 0), 30.0),  # a starving GPU: its input comes first
        (None, (9, 0), 95.0),  # no GPM: nothing to say
    ],
)
def test_no_amp_advice_where_it_does_not_apply(gpm, capability, util):
    findings = diagnose(build(_busy_job(gpm, capability, util)))
    assert "no_tensor_cores" not in ids(findings)


def test_memory_bound_kernels_are_the_verdict_with_amp_and_compile():
    findings = diagnose(build(_busy_job(MEMORY_BOUND)))
    top = findings[0]
    assert top.id == "memory_bound" and top.severity == "warning"
    assert "85% of peak DRAM bandwidth" in top.summary
    assert "torch.compile" in top.fix and "bfloat16" in top.fix
    assert verdict_line(findings).startswith("Memory-bandwidth-bound")
    assert "no_tensor_cores" not in ids(findings)  # the SMs are not busy: bandwidth is the problem to name


def test_a_few_samples_are_not_enough_for_a_kernel_verdict():
    findings = diagnose(build(dataclasses.replace(_busy_job(MEMORY_BOUND), seconds=3)))
    assert "memory_bound" not in ids(findings)


def test_busy_in_the_verdict_means_sm_activity_where_gpm_knows_it():
    healthy = diagnose(build(_busy_job(COMPUTING)))[0]
    assert healthy.id == "healthy" and "GPUs busy (95%, SMs 90% active)" in healthy.summary
    # GPU-Util 95% but a fifth of the SMs at work: not "busy", and both numbers say why
    idle_sms = GpmMetrics(
        sm_active=20.0, sm_occupancy=10.0, tensor_active=8.0, dram_bandwidth=15.0, fp32_active=5.0, fp16_active=1.0
    )
    top = diagnose(build(_busy_job(idle_sms)))[0]
    assert "GPUs busy" not in top.summary and "GPUs at 95%, SMs 20% active" in top.summary, top.summary
    # without GPM, GPU-Util decides, as before
    assert "GPUs busy (95%)" in diagnose(build(_busy_job(None)))[0].summary

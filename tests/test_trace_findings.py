"""The trace findings (gputop/analysis/checks/trace.py) on real traces and on summaries built to sit just
either side of each rule's threshold."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gputop.analysis import trace_summary
from gputop.analysis.checks.trace import check_trace
from gputop.analysis.findings import with_trace_findings
from gputop.model import LABEL_CODE, Finding

TRACES = Path(__file__).parent / "fixtures" / "traces"


def ids(ranks) -> list[str]:
    return [f.id for f in check_trace({"ranks": ranks})]


def rank(**changes) -> dict:
    base = {
        "rank": 0,
        "pid": 11,
        "phases": {"data": 0.1, "forward": 0.3, "backward": 0.3, "comm": 0.1, "optimizer": 0.1, "sync": 0.0, "other": 0.1},
        "steps_per_s": 4.0,
        "syncs_per_step": 0.0,
        "sync_sites": [],
        "gpu": None,
        "memory_stats": {},
    }
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def gpu(**changes) -> dict:
    base = {
        "busy": 0.9,
        "idle": 0.1,
        "compute": 0.8,
        "comm": 0.1,
        "comm_overlap": 0.9,
        "exposed_comm": 0.01,
        "kernels": 1000,
        "median_kernel_us": 80.0,
        "short_kernel_share": 0.1,
        "gemm_time_s": 1.0,
        "fp32_gemm_time_s": 0.0,
        "compute_capability": 9,
        "device_name": "H100",
    }
    return {**base, **changes}


def test_a_real_a100_trace_with_fp32_gemms_gets_the_amp_finding_and_nothing_else():
    summary = trace_summary.summarize_file(str(TRACES / "hta_alexnet_a100.json.gz"))
    (finding,) = check_trace({"ranks": [summary]})
    assert finding.id == "trace_amp" and finding.label == LABEL_CODE
    assert "torch.bfloat16" in finding.fix and "autocast" in finding.fix  # compute capability 8: bf16
    assert "A100" in finding.evidence[0]


def test_the_real_nccl_traces_hide_most_comm_behind_nothing_but_stay_under_30_percent():
    ranks = [trace_summary.summarize_file(str(TRACES / f"hta_nccl_rank-{r}.json.gz")) for r in (0, 1)]
    assert all(0.2 < r["gpu"]["exposed_comm"] < 0.3 for r in ranks)  # NCCL a third of the time, little overlapped
    assert "trace_communication" not in ids(ranks)


@pytest.mark.parametrize("share, fires", [(0.29, False), (0.31, True)])
def test_communication_rule_at_30_percent_host_side(share, fires):
    assert ("trace_communication" in ids([rank(phases={"comm": share})])) is fires


@pytest.mark.parametrize("exposed, fires", [(0.29, False), (0.31, True)])
def test_communication_rule_on_a_gpu_counts_nccl_time_not_hidden_by_compute(exposed, fires):
    found = check_trace({"ranks": [rank(phases={"comm": 0.01}, gpu=gpu(comm=0.5, exposed_comm=exposed, comm_overlap=0.4))]})
    comm = [f for f in found if f.id == "trace_communication"]
    assert bool(comm) is fires
    if fires:
        assert "bucket_cap_mb" in comm[0].fix and "NCCL_P2P_DISABLE" in comm[0].fix
        assert any("not hidden by compute" in e for e in comm[0].evidence)


@pytest.mark.parametrize("capability, fp32, fires", [(9, 0.6, True), (9, 0.4, False), (6, 0.9, False), (None, 0.9, False)])
def test_amp_rule_needs_tensor_cores_and_mostly_fp32_gemms(capability, fp32, fires):
    found = ids([rank(gpu=gpu(compute_capability=capability, gemm_time_s=1.0, fp32_gemm_time_s=fp32))])
    assert ("trace_amp" in found) is fires


@pytest.mark.parametrize("short, idle, fires", [(0.7, 0.5, True), (0.7, 0.1, False), (0.3, 0.5, False)])
def test_launch_bound_rule(short, idle, fires):
    assert ("trace_launch_bound" in ids([rank(gpu=gpu(short_kernel_share=short, idle=idle, median_kernel_us=4.0))])) is fires


def test_sync_rule_names_the_line_when_the_trace_has_stacks():
    site = {"site": "train.py(57): train_step", "count": 40, "lines": [{"line": 61, "code": "return loss.item()"}]}
    found = check_trace(
        {"ranks": [rank(phases={"sync": 0.08}, steps=40, syncs=39, syncs_per_step=0.98, sync_sites=[site], gpu=gpu())]}
    )
    (sync,) = [f for f in found if f.id == "trace_sync"]
    assert "at train.py:61 `return loss.item()` in train_step" in sync.summary
    assert sync.frames == ("train.py:61 `return loss.item()` in train_step (40 syncs)",)
    # Where the source could not be read, the function the profiler's stack names, by its first line.
    unread = dict(site, lines=[])
    (sync,) = [
        f
        for f in check_trace(
            {"ranks": [rank(phases={"sync": 0.08}, steps=40, syncs=39, syncs_per_step=0.98, sync_sites=[unread], gpu=gpu())]}
        )
        if f.id == "trace_sync"
    ]
    assert "train.py(57)" in sync.summary and sync.frames == ("train.py(57): train_step (40 syncs)",)
    # On CPU there is no device to wait for: no finding; and a sync every other step is not "every step".
    assert "trace_sync" not in ids([rank(phases={"sync": 0.08}, steps=40, syncs=40, syncs_per_step=1.0)])
    assert "trace_sync" not in ids([rank(phases={"sync": 0.08}, steps=40, syncs=20, syncs_per_step=0.5, gpu=gpu())])


@pytest.mark.parametrize("retries, inactive, fires", [(0, 0.1, False), (3, 0.1, True), (0, 0.4, True)])
def test_allocator_rule(retries, inactive, fires):
    stats = {
        "0": {
            "num_alloc_retries": retries,
            "reserved_bytes.all.current": 10 << 30,
            "inactive_split_bytes.all.current": int(inactive * (10 << 30)),
        }
    }
    found = check_trace({"ranks": [rank(memory_stats=stats)]})
    allocator = [f for f in found if f.id == "trace_allocator"]
    assert bool(allocator) is fires
    if fires:
        assert "expandable_segments:True" in allocator[0].fix


def test_trace_findings_replace_healthy_and_sort_by_severity():
    healthy = Finding(id="healthy", title="Healthy", severity="info", confidence=0.9, label="", summary="Healthy")
    critical = Finding(id="hang", title="Hang", severity="critical", confidence=0.9, label=LABEL_CODE, summary="Hang")
    (comm,) = check_trace({"ranks": [rank(phases={"comm": 0.5})]})
    assert [f.id for f in with_trace_findings([healthy], [comm])] == ["trace_communication"]
    assert [f.id for f in with_trace_findings([critical], [comm])] == ["hang", "trace_communication"]
    assert with_trace_findings([healthy], []) == [healthy]

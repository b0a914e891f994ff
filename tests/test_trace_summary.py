"""The trace summariser on real traces: public GPU traces against Holistic Trace Analysis' numbers, and a
gloo trace against the job's own clock (tests/fixtures/traces/README.md has the sources and the numbers)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from gputop.analysis import trace_summary as ts

TRACES = Path(__file__).parent / "fixtures" / "traces"

# HTA 0.5.0's get_temporal_breakdown / get_comm_comp_overlap on the same files (fixture README).
HTA = {
    "hta_nccl_rank-0.json.gz": {
        "kernel_time_us": 600058,
        "idle": 53.56,
        "compute": 17.71,
        "non_compute": 28.74,
        "overlap": 11.81,
    },
    "hta_nccl_rank-1.json.gz": {
        "kernel_time_us": 600674,
        "idle": 54.72,
        "compute": 22.57,
        "non_compute": 22.72,
        "overlap": 20.05,
    },
    "hta_alexnet_a100.json.gz": {
        "kernel_time_us": 12996011,
        "idle": 99.49,
        "compute": 0.08,
        "non_compute": 0.43,
        "overlap": None,
    },
}
# Shares are compared in percentage points: HTA rounds to 0.01 and its span on the AlexNet trace also
# counts the device-side cuda_sync events (0.6% longer); half a point holds both.
HTA_TOLERANCE_PCT = 0.5


@pytest.mark.parametrize("name", sorted(HTA))
def test_gpu_shares_agree_with_hta(name):
    summary = ts.summarize_file(str(TRACES / name))
    gpu, want = summary["gpu"], HTA[name]
    assert gpu is not None
    assert gpu["span_s"] * 1e6 == pytest.approx(want["kernel_time_us"], rel=0.01)
    assert 100 * gpu["idle"] == pytest.approx(want["idle"], abs=HTA_TOLERANCE_PCT)
    assert 100 * gpu["compute"] == pytest.approx(want["compute"], abs=HTA_TOLERANCE_PCT)
    assert 100 * gpu["non_compute"] == pytest.approx(want["non_compute"], abs=HTA_TOLERANCE_PCT)
    if want["overlap"] is None:
        assert gpu["comm_overlap"] is None
    else:
        assert 100 * gpu["comm_overlap"] == pytest.approx(want["overlap"], abs=HTA_TOLERANCE_PCT)
    assert abs(gpu["busy"] + gpu["idle"] - 1.0) < 1e-3


@pytest.mark.slow  # HTA parses in worker processes
def test_gpu_shares_agree_with_hta_run_here(tmp_path):
    hta = pytest.importorskip(
        "hta.trace_analysis", reason="holistictraceanalysis is not installed (its numbers are recorded above)"
    )
    for name in ("hta_nccl_rank-0.json.gz", "hta_nccl_rank-1.json.gz"):
        shutil.copy(TRACES / name, tmp_path / name)
    analysis = hta.TraceAnalysis(trace_dir=str(tmp_path))
    breakdown = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    for rank, name in ((0, "hta_nccl_rank-0.json.gz"), (1, "hta_nccl_rank-1.json.gz")):
        gpu = ts.summarize_file(str(TRACES / name))["gpu"]
        assert 100 * gpu["idle"] == pytest.approx(breakdown.loc[rank, "idle_time_pctg"], abs=HTA_TOLERANCE_PCT)
        assert 100 * gpu["compute"] == pytest.approx(breakdown.loc[rank, "compute_time_pctg"], abs=HTA_TOLERANCE_PCT)
        assert 100 * gpu["comm_overlap"] == pytest.approx(overlap.loc[rank, "comp_comm_overlap_pctg"], abs=HTA_TOLERANCE_PCT)


def test_nccl_trace_has_ranks_steps_and_top_ops():
    summary = ts.summarize_file(str(TRACES / "hta_nccl_rank-1.json.gz"))
    assert summary["rank"] == 1 and summary["backend"] == "nccl" and summary["world_size"] == 128
    assert summary["steps_per_s"] and summary["steps"] >= 2
    assert summary["top_ops"] and summary["top_ops"][0]["total_ms"] >= summary["top_ops"][-1]["total_ms"]
    assert summary["gpu"]["comm"] > 0.2  # NCCL kernels run a third of the span on this rank
    assert sum(summary["phases"].values()) == pytest.approx(1.0, abs=0.01)


def test_gloo_trace_phases_match_the_jobs_own_clock():
    truth = {"data": 0.2091, "forward": 0.1751, "backward": 0.2255, "comm": 0.2348, "optimizer": 0.1549}
    summary = ts.summarize_file(str(TRACES / "gloo_phase_job_rank-0.json.gz"))
    for phase, share in truth.items():
        assert summary["phases"][phase] == pytest.approx(share, abs=0.05), phase
    assert summary["phases"]["other"] < 0.05
    assert summary["gpu"] is None and summary["backend"] == "gloo"
    assert summary["steps_per_s"] == pytest.approx(15 / summary["window_s"], rel=0.01)


def _event(name, ts_us, dur_us, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "ts": ts_us, "dur": dur_us, "pid": 1, "tid": tid, "cat": cat, "args": args}


def test_phase_rule_on_a_hand_built_step():
    # one 100 us step: data 0-20, forward 20-40 (ops, then python), backward 40-70 with a sync inside,
    # a collective 70-80 (main thread), optimizer 80-95, 95-100 other.  A background gloo collective
    # during backward is overlap, not comm.
    events = [
        _event("PyTorch Profiler (0)", 0, 100, cat="Trace"),
        _event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 20, cat="user_annotation"),
        _event("aten::linear", 22, 10),
        _event("autograd::engine::evaluate_function: AddmmBackward0", 40, 25),
        _event("aten::item", 50, 5),
        _event("autograd::engine::evaluate_function: AccumulateGrad", 66, 4),
        _event("gloo:all_reduce", 45, 20, tid=7, cat="user_annotation"),
        _event("c10d::allreduce_", 70, 10),
        _event("Optimizer.step#SGD.step", 80, 15, cat="user_annotation"),
    ]
    summary = ts.summarize_trace({"traceEvents": events})
    assert summary["phases"] == {
        "data": 0.2,
        "forward": 0.2,
        "backward": 0.25,
        "comm": 0.1,
        "optimizer": 0.15,
        "sync": 0.05,
        "other": 0.05,
    }


def test_interval_helpers():
    a = ts.merge([(0, 10), (5, 15), (20, 30)])
    assert a == [(0, 15), (20, 30)]
    assert ts.subtract(a, [(5, 8), (25, 40)]) == [(0, 5), (8, 15), (20, 25)]
    assert ts.intersect(a, [(10, 22)]) == [(10, 15), (20, 22)]


def test_bad_files_are_one_line(tmp_path):
    (tmp_path / "x.json").write_text("not json")
    with pytest.raises(ts.TraceFormatError, match="is not JSON"):
        ts.load_trace(str(tmp_path / "x.json"))
    (tmp_path / "y.json.gz").write_bytes(gzip.compress(json.dumps({"events": []}).encode()))
    with pytest.raises(ts.TraceFormatError, match="no traceEvents"):
        ts.load_trace(str(tmp_path / "y.json.gz"))
    with pytest.raises(ts.TraceFormatError, match="no such file"):
        ts.load_trace(str(tmp_path / "missing.json"))

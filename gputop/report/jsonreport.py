"""The report's content as plain data (`report_data`), and its JSON rendering (`render_json`).

The Markdown report renders this same structure, so the two formats carry the same content by
construction.  Every string goes through the redactor before it leaves.
"""

from __future__ import annotations

import json
import platform
import shlex
import statistics
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence

from gputop import __version__, gpu_fields
from gputop.analysis.counter_health import counter_problems, rule_severities
from gputop.analysis.diagnosis import verdict_line
from gputop.analysis.gpu_health import FINDING_SEVERITY, GpuHealth, Severity, judge_window
from gputop.analysis.numbers import mean, percentile
from gputop.analysis.observations import RankObs, collect_rank_observations
from gputop.analysis.stack_classes import aggregate_worker_leaves, format_frame
from gputop.history import History
from gputop.model import Finding, Frame, GpuSample, MachineInfo, Snapshot, device_label, to_jsonable
from gputop.report.infra import infra_data
from gputop.report.redact import redact_cmdline, redact_jsonable, redact_text

if TYPE_CHECKING:
    from gputop.analysis.machine_check import CheckReport
    from gputop.tracing import TraceResult


class ReportedResult(Protocol):
    """A benchmark's result as the report shows it (`gputop.bench.BenchResult`): its JSON, and its text
    lines when it has a `summary_lines()`."""

    def to_dict(self) -> dict[str, Any]: ...


SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 40
TOP_MAIN_STACKS = 5
MAX_STACK_FRAMES = 14


def sparkline(values: Sequence[Optional[float]], lo: float, hi: float, width: int = SPARK_WIDTH) -> str:
    """Text sparkline on a FIXED lo..hi scale (so 50/51/50 stays flat); gaps show as spaces."""
    if not values:
        return ""
    # average buckets of consecutive samples down to `width` characters
    n = len(values)
    buckets = min(width, n)
    out = []
    span = (hi - lo) or 1.0
    for b in range(buckets):
        chunk = [v for v in values[b * n // buckets : (b + 1) * n // buckets] if v is not None]
        if not chunk:
            out.append(" ")
            continue
        frac = (sum(chunk) / len(chunk) - lo) / span
        out.append(SPARK_BLOCKS[max(0, min(len(SPARK_BLOCKS) - 1, int(frac * len(SPARK_BLOCKS))))])
    return "".join(out)


def _percentile_of(data: Sequence[float], q: float) -> float:
    value = percentile(data, q)
    assert value is not None  # (None only for no data)
    return value


def _stats(values: Sequence[Optional[float]], lo: float, hi: Optional[float]) -> Optional[dict[str, Any]]:
    data = [v for v in values if v is not None]
    if not data:
        return None
    top = hi if hi else max(data) or 1.0
    return {
        "mean": round(statistics.fmean(data), 2),
        "p5": round(_percentile_of(data, 5), 2),
        "p95": round(_percentile_of(data, 95), 2),
        "max": round(max(data), 2),
        "samples": len(data),
        "spark": sparkline(values, lo, top),
    }


def _gpu_series(snaps: Sequence[Snapshot], index: int) -> list[Optional[GpuSample]]:
    out: list[Optional[GpuSample]] = []
    for s in snaps:
        out.append(next((g for g in s.gpus if g.index == index and not g.lost), None))
    return out


def _gpu_stats(snaps: Sequence[Snapshot], index: int) -> dict[str, Any]:
    series = _gpu_series(snaps, index)
    present = [g for g in series if g is not None]
    return {
        "index": index,
        "name": present[-1].name if present else None,
        # the statistics of every report field of the table of GPU fields (utilization, memory, power, traffic)
        **gpu_fields.report_stats(series, _stats),
        "memory_total": next((g.memory_total for g in reversed(present) if g.memory_total), None),
        "power_limit": next((g.power_limit for g in reversed(present) if g.power_limit), None),
    }


def _health(snaps: Sequence[Snapshot], index: int, judged: Optional[GpuHealth], counted: dict[str, Severity]) -> dict[str, Any]:
    """`counted`: the counter watch's lines naming this GPU (check id -> severity), as the exporter has them."""
    samples = [g for s in snaps for g in s.gpus if g.index == index]
    problems = [
        {"rule": p.rule, "severity": FINDING_SEVERITY[p.severity], "word": p.word, "evidence": p.evidence}
        for p in (judged.problems if judged is not None else ())
    ]
    problems += [
        {"rule": rule, "severity": FINDING_SEVERITY[severity], "word": rule, "evidence": "gputop check's line (counter watch)"}
        for rule, severity in counted.items()
    ]
    worst = max(rule_severities(judged, counted).values(), default=Severity.OK)  # as /metrics has it
    alive = [g for g in samples if not g.lost]
    last = alive[-1] if alive else (samples[-1] if samples else None)
    return {
        "index": index,
        "name": last.name if last else None,
        "uuid": last.uuid if last else None,
        "pci_bus_id": last.pci_bus_id if last else None,
        "lost": any(g.lost for g in samples),
        # the health module's judgement over the window (analysis/gpu_health.py): ok / warning / critical
        # and the pipeline's counter watch (Snapshot.counter_health: gputop check's counter lines)
        "state": FINDING_SEVERITY[worst] if worst is not Severity.OK else "ok",
        "problems": problems,
        **gpu_fields.report_health(alive),  # temperature, PCIe, throttling, ECC, remapped rows, NVLink, XIDs
        "samples": len(alive),
        "unavailable": dict(last.unavailable) if last is not None else {},
    }


def _job(snaps: Sequence[Snapshot]) -> Optional[dict[str, Any]]:
    job = next((s.job for s in reversed(snaps) if s.job is not None), None)
    if job is None:
        return None
    obs = collect_rank_observations(snaps)
    ranks = []
    for r in job.ranks:
        o = obs.get(r.proc.pid)
        ranks.append(
            {
                "rank": r.rank,
                "local_rank": r.local_rank,
                "world_size": r.world_size,
                "pid": r.proc.pid,
                "gpus": list(r.gpus),
                "devices": [device_label(*d) for d in r.devices],  # "GPU0", or "GPU0/GI1" on a MIG instance
                "mig_instances": [list(pair) for pair in r.mig_instances],  # [GPU, GPU instance id]
                "gpu_mapping": r.gpu_mapping,  # "nvml" | "nspid" | "inferred" (see model.Rank)
                "cuda_visible_devices": r.cuda_visible_devices,
                "main_thread_state": r.main_thread_state,
                **_rank_shares(o),
                "stack_dumps": len([s for s in o.samples if s.state]) if o else 0,
                "cpu_percent": r.proc.cpu_percent,
                "rss": r.proc.rss,
                "process_state": r.proc.state,
                "exited": r.proc.exited,
                "cmdline": list(redact_cmdline(r.proc.cmdline)),
                "workers": [
                    {"pid": w.pid, "cpu_percent": w.cpu_percent, "state": w.state, "core": w.core, "exited": w.exited}
                    for w in r.workers
                ],
            }
        )
    launcher = job.launcher
    return {
        "root_pid": job.root_pid,
        "launcher": None
        if launcher is None
        else {"pid": launcher.pid, "name": launcher.name, "cmdline": list(redact_cmdline(launcher.cmdline))},
        "ranks": ranks,
        "exited": job.exited,
        "warnings": list(job.warnings),
        "stacks_error": job.stacks_error,
    }


def _rank_shares(o: Optional[RankObs]) -> dict[str, Any]:
    """The rank's shares, each with its interval and sample count, and where the samples came from."""
    if o is None:
        return {"shares": {}, "input_share": None, "samples": 0, "sampling": None, "startup_left_out": 0, "starting_up": False}
    counts = o.counts
    return {
        "shares": {state: o.share(state).to_dict() for state, _n in counts.counts.most_common()},
        "input_share": o.input_share.to_dict() if counts.n else None,  # waiting for data + in dataset code
        "samples": counts.n,
        "sampling": counts.source if counts.n else None,
        "startup_left_out": counts.startup_left_out,
        "starting_up": o.starting_up,
    }


def _stacks(snaps: Sequence[Snapshot]) -> dict[str, Any]:
    """Main threads: distinct dumps over the window grouped by stack; workers: the latest dumps' hottest frames."""
    obs = collect_rank_observations(snaps)
    groups: Counter[tuple[Frame, ...]] = Counter()
    who: dict[tuple[Frame, ...], set[str]] = {}
    state_of: dict[tuple[Frame, ...], Optional[str]] = {}
    frames_of: dict[tuple[Frame, ...], tuple[Frame, ...]] = {}
    total = 0
    for r in obs.values():
        for s in r.samples:
            if not s.frames:
                continue
            key = s.signature
            groups[key] += 1
            total += 1
            who.setdefault(key, set()).add(r.name)
            state_of[key] = s.state
            frames_of[key] = s.frames
    main = [
        {
            "count": n,
            "of": total,
            "state": state_of[key],
            "ranks": sorted(who[key]),
            "frames": [format_frame(f) for f in reversed(frames_of[key][:MAX_STACK_FRAMES])],  # innermost last
        }
        for key, n in groups.most_common(TOP_MAIN_STACKS)
    ]
    job = next((s.job for s in reversed(snaps) if s.job is not None), None)
    workers = []
    if job is not None:
        pids = [w.pid for r in job.ranks for w in r.workers]
        if pids:
            workers = [{"activity": text, "count": n, "total": t} for text, n, t in aggregate_worker_leaves(job.stacks, pids)]
    return {"main_threads": main, "main_thread_dumps": total, "workers": workers}


def _command_text(command: Optional[Sequence[str] | str]) -> Optional[str]:
    """The gputop command line as one shell-quoted string (argv) or as given (str); redacted either way."""
    if not command:
        return None
    if isinstance(command, str):
        return redact_text(command)
    return shlex.join(redact_cmdline(list(command)))


def report_data(
    history: History,
    findings: Sequence[Finding],
    *,
    bench: Optional[ReportedResult | dict[str, Any]] = None,
    command: Optional[Sequence[str] | str] = None,
    generated: Optional[float] = None,
    recording: Optional[dict[str, Any]] = None,
    infra: Optional[CheckReport] = None,
    trace: Optional[TraceResult] = None,
) -> dict[str, Any]:
    """Everything a report says, as JSON-ready data (redacted).

    `trace`: a `gputop.tracing.TraceResult` (report --trace), shown like the benchmark: result and text.

    `infra`: `gputop check`'s CheckReport over the report's window (live reports); the "For the infra
    team" section falls back to the snapshots and the findings without it.

    `recording` (report --from): what the whole recording spans; `observed` is the part reported on."""
    snaps = list(history)
    m = history.machine
    indices = sorted({g.index for s in snaps for g in s.gpus})
    data = {
        "gputop": {"version": __version__, "command": _command_text(command), "python": platform.python_version()},
        "generated": generated if generated is not None else time.time(),
        "verdict": verdict_line(findings),
        "observed": _observed(snaps, m),
        "machine": _machine(snaps, m),
        "topology": to_jsonable(m.topology),
        "health": _gpu_health(snaps, indices),
        "gpus": [_gpu_stats(snaps, i) for i in indices],
        "host": _host(snaps, m),
        "job": _job(snaps),
        "stacks": _stacks(snaps),
        "findings": [to_jsonable(f) for f in findings],
        "benchmark": _benchmark(bench),
        "trace": {"result": trace.to_dict(), "summary": trace.summary_lines()} if trace is not None else None,
        "recording": dict(recording) if recording is not None else None,
        "infra": infra_data(history, findings, infra),
    }
    redacted: dict[str, Any] = redact_jsonable(data)
    return redacted


def _observed(snaps: Sequence[Snapshot], m: MachineInfo) -> dict[str, Any]:
    """The span the report covers."""
    return {
        "start": snaps[0].timestamp if snaps else None,
        "end": snaps[-1].timestamp if snaps else None,
        "seconds": round(snaps[-1].timestamp - snaps[0].timestamp, 1) if snaps else 0.0,
        "snapshots": len(snaps),
        "simulated": m.simulated,
    }


def _machine(snaps: Sequence[Snapshot], m: MachineInfo) -> dict[str, Any]:
    latest = snaps[-1] if snaps else None
    return {
        "hostname": m.hostname,
        "cpu_model": m.cpu_model,
        "cpu_count": m.cpu_count,
        "memory_total": latest.host.memory_total if latest else None,
        "driver_version": m.driver_version,
        "cuda_version": m.cuda_version,
        "nvml_version": m.nvml_version,
        "gpu_count": m.gpu_count,
        "gpu_names": list(m.gpu_names),
        "gpu_error": m.gpu_error,
        "simulated": m.simulated,
    }


def _gpu_health(snaps: Sequence[Snapshot], indices: Sequence[int]) -> list[dict[str, Any]]:
    """Each GPU's health: from the samples (the health module) and the counter watch's last verdict."""
    judged = judge_window(snaps)
    latest_counters = next((s.counter_health for s in reversed(snaps) if s.counter_health is not None), None)
    counted = counter_problems(latest_counters)
    return [_health(snaps, i, judged.get(i), counted.get(i, {})) for i in indices]


def _host(snaps: Sequence[Snapshot], m: MachineInfo) -> dict[str, Any]:
    latest = snaps[-1] if snaps else None
    host_cpu = [statistics.fmean(s.host.cpu_percent) for s in snaps if s.host.cpu_percent]
    return {
        "cpu_percent": _stats(host_cpu, 0.0, 100.0),
        "cores": len(latest.host.cpu_percent) if latest else m.cpu_count,
        "memory_used": latest.host.memory_used if latest else None,
        "memory_total": latest.host.memory_total if latest else None,
        "load_average": list(latest.host.load_average) if latest else None,
        "iowait_percent": mean(s.host.iowait_percent for s in snaps),
    }


def _benchmark(bench: Optional[ReportedResult | dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The benchmark's result and its text (a `ReportedResult`, or a result already as data)."""
    if bench is None:
        return None
    to_dict = getattr(bench, "to_dict", None)
    lines = getattr(bench, "summary_lines", None)
    return {
        "result": to_dict() if callable(to_dict) else (bench if isinstance(bench, dict) else None),
        "summary": list(lines()) if callable(lines) else [],
    }


def render_json(
    history: History,
    findings: Sequence[Finding],
    *,
    bench: Optional[ReportedResult | dict[str, Any]] = None,
    command: Optional[Sequence[str] | str] = None,
    generated: Optional[float] = None,
    recording: Optional[dict[str, Any]] = None,
    infra: Optional[CheckReport] = None,
    trace: Optional[TraceResult] = None,
) -> str:
    data = report_data(
        history, findings, bench=bench, command=command, generated=generated, recording=recording, infra=infra, trace=trace
    )
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

"""Summarise a PyTorch profiler (Kineto) Chrome trace: where one rank's wall time went.

Pure functions of the trace's JSON; no torch, no pandas.  `gputop trace` (live, through the injected
agent) and `gputop trace --from FILE` (a trace someone already has) both end here.

**Phases** are shares of the main thread's wall time over the traced window.  Each instant of that
thread is given to exactly one phase, the first of these that covers it:

1. ``sync``: a host-device sync (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
   ``cudaEventSynchronize``, ``aten::item`` / ``aten::_local_scalar_dense``);
2. ``comm``: a collective op on the main thread (``c10d::*`` collectives, ``record_param_comms``,
   ``nccl:*`` / ``gloo:*``);
3. ``data``: PyTorch's own ``enumerate(DataLoader)#...__next__`` annotation (waiting for a batch);
4. ``optimizer``: ``Optimizer.step#...`` and ``Optimizer.zero_grad#...``;
5. ``backward``: from the first to the last ``autograd::engine::evaluate_function`` event of a step, on any
   thread.  On CPU autograd runs these on the main thread; on a GPU on autograd's device threads while the
   main thread waits in ``backward()``: the envelope covers both;
6. ``comm`` again: time a collective runs on a background thread (gloo's, NCCL's) while the main thread is
   not in any phase above (it is waiting for the collective);
7. ``forward``: the rest of the span between the end of a step's data wait and the start of its backward
   (no user annotation is needed: whatever the main thread does there is the forward pass);
8. ``other``: everything else (logging, checkpointing, the Python between steps).

A *step* runs from one data wait's start to the next; without DataLoader annotations, from one optimizer
step to the next.  steps/s counts optimizer steps (else data waits) over the window.

**GPU**, where the trace has device events (``kernel``, ``gpu_memcpy``, ``gpu_memset``), the same
definitions as Holistic Trace Analysis' temporal breakdown, so the numbers can be compared with HTA's:
the span is first device event's start to last one's end; busy is the union of all device events;
idle = span - busy; compute = the union of kernels that are neither NCCL (``^nccl.*Kernel``) nor memory
(``Memcpy``/``Memset``/``dma``) nor syncs; comm is the union of NCCL kernels, and overlap is the share of
comm time during which a compute kernel also runs (HTA's ``comp_comm_overlap``).  As in HTA, when the
trace has two or more ``ProfilerStep#`` annotations only the device work launched before the last one
counts (`complete_iterations`).
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Optional, Sequence, Union

from gputop.analysis.thresholds import TRACE_SHORT_KERNEL_US

PHASES = ("data", "forward", "backward", "comm", "optimizer", "sync", "other")

DATA_PREFIX = "enumerate(DataLoader)#"
OPTIMIZER_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#")
STEP_PREFIX = "Optimizer.step#"
BACKWARD_PREFIX = "autograd::engine::evaluate_function"
SYNC_NAMES = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "aten::item",
        "aten::_local_scalar_dense",
    }
)
# One per sync: `.item()` runs aten::item -> aten::_local_scalar_dense -> (on CUDA) cudaMemcpyAsync + sync.
SYNC_COUNTED = frozenset(SYNC_NAMES - {"aten::item"})
_COLLECTIVE_RE = re.compile(
    r"^(c10d::(all_?reduce|all_?gather|reduce_scatter|broadcast|reduce|barrier|all_to_all|alltoall|send|recv|"
    r"_allgather|_reduce_scatter|scatter|gather)|record_param_comms$|nccl:|gloo:|ProcessGroupNCCL|ProcessGroupGloo)",
)
NCCL_KERNEL_RE = re.compile(r"^nccl.*Kernel")  # HTA's is_comm_kernel
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")  # HTA's compute test, negated
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
GEMM_RE = re.compile(r"(?<!fb)gemm|cutlass|matmul|cublas|xmma|_mma|hmma|sm\d+_xmma", re.IGNORECASE)
FP32_GEMM_RE = re.compile(r"sgemm|s1688|s16816|fp32|f32f32|tf32|_s_|float", re.IGNORECASE)
HALF_GEMM_RE = re.compile(r"h1688|h16816|hgemm|bf16|fp16|f16|half|bfloat|_h_|i8816|e4m3|e5m2", re.IGNORECASE)
TOP_OPS = 10


class TraceFormatError(ValueError):
    """The file is not a Chrome trace we can read; the message says what is wrong."""


# ------------------------------------------------------------------------------------------- loading


def load_trace(path: str) -> dict[str, Any]:
    """A Chrome trace (``.json`` or ``.json.gz``) as a dict with ``traceEvents``."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            raw = gzip.decompress(f.read()) if head == b"\x1f\x8b" else f.read()
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except (OSError, EOFError) as exc:
        raise TraceFormatError(f"{path}: cannot read it ({exc})") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise TraceFormatError(
            f"{path} is not JSON ({exc}); pass a trace written by torch.profiler "
            "(export_chrome_trace or tensorboard_trace_handler)"
        ) from None
    if isinstance(data, list):  # the bare-array form of the Chrome trace format
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceFormatError(f"{path} has no traceEvents list; it is not a Chrome trace")
    return data


# ------------------------------------------------------------------------------------------ intervals


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of [start, end) intervals, sorted and disjoint."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def total(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def intersect(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """a minus b, both merged."""
    out, j = [], 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def clip(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


# -------------------------------------------------------------------------------------- the summary


def _complete_events(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        e
        for e in data["traceEvents"]
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and isinstance(e.get("ts"), (int, float))
        and isinstance(e.get("dur"), (int, float))
    ]


def _span(e: dict[str, Any]) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


def _is_device(e: dict[str, Any]) -> bool:
    return e.get("cat") in DEVICE_CATS


# a process or thread id as the trace writes it: a number, or a name for a pseudo-process ("Spans")
TraceId = Union[int, str, None]


def _host_pid(events: Sequence[dict[str, Any]]) -> TraceId:
    """The process the host events belong to (the most host events)."""
    counts: Counter[TraceId] = Counter(e.get("pid") for e in events if not _is_device(e) and e.get("cat") != "Trace")
    return counts.most_common(1)[0][0] if counts else None


def main_thread(events: Sequence[dict[str, Any]], pid: TraceId = None) -> TraceId:
    """The training loop's thread: the one with PyTorch's DataLoader / optimizer annotations, else the one
    whose id is the process id (Linux's main thread), else the busiest host thread."""
    host = [e for e in events if not _is_device(e) and e.get("cat") != "Trace" and (pid is None or e.get("pid") == pid)]
    marked: Counter[TraceId] = Counter(
        e.get("tid") for e in host if str(e.get("name", "")).startswith((DATA_PREFIX, STEP_PREFIX))
    )
    if marked:
        return marked.most_common(1)[0][0]
    tids = {e.get("tid") for e in host}
    if pid in tids:
        return pid
    busy: dict[TraceId, float] = {}
    for e in host:
        busy[e.get("tid")] = busy.get(e.get("tid"), 0.0) + float(e["dur"])
    return max(busy, key=busy.__getitem__) if busy else None


def _step_bounds(data_starts: list[float], step_starts: list[float], lo: float, hi: float) -> list[tuple[float, float]]:
    marks = sorted(data_starts) or sorted(step_starts)
    if not marks:
        return [(lo, hi)]
    bounds = [lo] + [m for m in marks if lo < m < hi] + [hi]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


Interval = tuple[float, float]


def _named(pool: Sequence[dict[str, Any]], prefixes: Union[str, tuple[str, ...]], lo: float, hi: float) -> list[Interval]:
    """The merged spans of the events whose names start with `prefixes`, clipped to [lo, hi]."""
    return merge(clip([_span(e) for e in pool if str(e.get("name", "")).startswith(prefixes)], lo, hi))


def _trace_window(events: Sequence[dict[str, Any]], main: Sequence[dict[str, Any]]) -> Interval:
    """The profiler's own window (its longest "Trace" event), else the main thread's events' extent."""
    window = [e for e in events if e.get("cat") == "Trace"]
    if window:
        return _span(max(window, key=lambda e: float(e["dur"])))
    if main:
        return min(float(e["ts"]) for e in main), max(_span(e)[1] for e in main)
    return 0.0, 0.0


def _pass_envelopes(
    steps: Sequence[Interval], backward_events: Sequence[Interval], data_iv: Sequence[Interval]
) -> tuple[list[Interval], list[Interval]]:
    """(backward, forward) per step: backward from its first backward op to its last; forward from the
    end of the step's data fetch to that first backward op."""
    backward_env: list[Interval] = []
    forward_env: list[Interval] = []
    for s_lo, s_hi in steps:
        inside = [(a, b) for a, b in backward_events if s_lo <= a < s_hi]
        data_end = max([b for a, b in data_iv if s_lo <= a < s_hi] or [s_lo])
        if inside:
            b_start, b_end = inside[0][0], max(b for _a, b in inside)
            backward_env.append((b_start, min(b_end, s_hi)))
            forward_env.append((data_end, b_start))
    return merge(backward_env), merge(forward_env)


def _phase_seconds(ordered: Sequence[tuple[str, list[Interval]]], wall: float) -> dict[str, float]:
    """Seconds per phase, each claiming only the time no earlier phase claimed; "other" is the rest."""
    claimed: list[Interval] = []
    seconds: dict[str, float] = {}
    for phase, intervals in ordered:
        own = subtract(intervals, claimed)
        seconds[phase] = total(own) / 1e6
        claimed = merge(claimed + own)
    seconds["comm"] += seconds.pop("comm_bg")
    seconds["other"] = max(0.0, wall / 1e6 - total(claimed) / 1e6)
    return seconds


def _main_thread_phases(
    host: Sequence[dict[str, Any]], main: Sequence[dict[str, Any]], tid: TraceId, lo: float, hi: float
) -> tuple[dict[str, float], int]:
    """(seconds per phase, steps) of the training loop's thread over [lo, hi]."""
    sync = merge(clip([_span(e) for e in main if e.get("name") in SYNC_NAMES], lo, hi))
    comm_main = merge(clip([_span(e) for e in main if _COLLECTIVE_RE.match(str(e.get("name", "")))], lo, hi))
    comm_bg = merge(
        clip([_span(e) for e in host if e.get("tid") != tid and _COLLECTIVE_RE.match(str(e.get("name", "")))], lo, hi)
    )
    data_iv = _named(main, DATA_PREFIX, lo, hi)
    step_marks = _named(main, STEP_PREFIX, lo, hi)
    backward_events = sorted(_span(e) for e in host if str(e.get("name", "")).startswith(BACKWARD_PREFIX))
    steps = _step_bounds([s for s, _ in data_iv], [s for s, _ in step_marks], lo, hi)
    backward_env, forward_env = _pass_envelopes(steps, backward_events, data_iv)
    ordered = [
        ("sync", sync),
        ("comm", comm_main),
        ("data", data_iv),
        ("optimizer", _named(main, OPTIMIZER_PREFIXES, lo, hi)),
        ("backward", backward_env),
        ("comm_bg", comm_bg),
        ("forward", forward_env),
    ]
    return _phase_seconds(ordered, hi - lo), len(step_marks) or len(data_iv)


def summarize_trace(data: dict[str, Any], *, trace_file: Optional[str] = None) -> dict[str, Any]:
    """One rank's summary: phases (fractions of wall time), steps/s, GPU shares, top ops."""
    events = _complete_events(data)
    dist = data.get("distributedInfo") or {}
    pid = _host_pid(events)
    tid = main_thread(events, pid)
    host = [e for e in events if not _is_device(e) and e.get("cat") != "Trace" and e.get("pid") == pid]
    main = [e for e in host if e.get("tid") == tid]
    lo, hi = _trace_window(events, main)
    wall = hi - lo
    seconds, n_steps = _main_thread_phases(host, main, tid, lo, hi)
    phases = {p: (seconds[p] / (wall / 1e6) if wall > 0 else 0.0) for p in PHASES}
    syncs = sum(1 for e in main if e.get("name") in SYNC_COUNTED)
    device = complete_iterations([e for e in events if _is_device(e)], host)
    return {
        "rank": dist.get("rank"),
        "pid": pid if isinstance(pid, int) else None,
        "trace_file": trace_file,
        "window_s": round(wall / 1e6, 4),
        "phases": {p: round(v, 4) for p, v in phases.items()},
        "phase_seconds": {p: round(v, 4) for p, v in seconds.items()},
        "steps": n_steps,
        "steps_per_s": round(n_steps / (wall / 1e6), 3) if wall > 0 and n_steps else None,
        "main_thread_events": len(main),
        "top_ops": top_ops(main),
        "syncs": syncs,
        "syncs_per_step": round(syncs / n_steps, 2) if n_steps else None,
        "sync_sites": sync_sites(main),
        "backend": dist.get("backend"),
        "world_size": dist.get("world_size"),
        "gpu": gpu_summary(device, data) if device else None,
    }


def complete_iterations(device: Sequence[dict[str, Any]], host: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Device events launched before the last ``ProfilerStep#`` began, when the trace has two or more steps
    (HTA's rule: the last step is usually cut off by the end of the window).  Device events are tied to
    their launch by ``args.correlation``."""
    step_starts = [float(e["ts"]) for e in host if str(e.get("name", "")).startswith("ProfilerStep#")]
    if len(step_starts) < 2:
        return list(device)
    last = max(step_starts)
    launched = {(e.get("args") or {}).get("correlation") for e in host if float(e["ts"]) < last}
    launched.discard(None)
    return [e for e in device if (e.get("args") or {}).get("correlation") in launched]


def top_ops(events: Sequence[dict[str, Any]], n: int = TOP_OPS) -> list[dict[str, Any]]:
    """The aten ops with the most self-inclusive time on the main thread (nested ops are counted in their
    parent too, as the profiler's 'CPU total' column does)."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("cat") == "cpu_op":
            entry = by_name[str(e.get("name"))]
            entry[0] += float(e["dur"])
            entry[1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"name": name, "total_ms": round(t / 1e3, 3), "calls": calls} for name, (t, calls) in ranked]


def _user_frame(name: str) -> bool:
    """A python_function event of the user's code: a ``file.py(N): func`` frame outside torch and the stdlib."""
    return (
        ".py(" in name
        and not name.startswith("<")
        and "torch/" not in name
        and "/lib/python" not in name
        and "site-packages/" not in name
    )


_SITE = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")


def parse_site(site: str) -> Optional[tuple[str, int, str]]:
    """``file.py(N): function`` (a ``python_function`` event's name) as (file, N, function)."""
    match = _SITE.match(site)
    return (match["file"], int(match["line"]), match["function"]) if match else None


def sync_sites(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where host-device syncs come from, when the trace has Python stacks (``with_stack=True``, which
    records ``python_function`` events): the innermost user function around each sync, as
    ``file.py(N): function`` (N is where the function starts)."""
    frames = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e.get("name")))
        for e in events
        if e.get("cat") == "python_function" and _user_frame(str(e.get("name", "")))
    )
    starts = [f[0] for f in frames]
    sites: Counter[str] = Counter()
    for e in events:
        if e.get("name") not in SYNC_COUNTED:
            continue
        start, end = _span(e)
        site = "unknown"
        i = bisect.bisect_right(starts, start) - 1
        while i >= 0:  # the latest-starting user frame that still encloses the sync is the innermost
            if frames[i][1] >= end:
                site = frames[i][2]
                break
            i -= 1
        sites[site] += 1
    return [{"site": s, "count": c} for s, c in sites.most_common(5)]


def gpu_summary(device: Sequence[dict[str, Any]], data: dict[str, Any]) -> dict[str, Any]:
    """Kernel-busy, idle, compute, comm and overlap shares, HTA's way (see the module doc)."""
    spans = merge(_span(e) for e in device)
    span = spans[-1][1] - spans[0][0]
    busy = total(spans)
    compute = merge(_span(e) for e in device if not _NOT_COMPUTE_RE.match(str(e.get("name", ""))))
    comm = merge(_span(e) for e in device if NCCL_KERNEL_RE.match(str(e.get("name", ""))))
    kernels = [e for e in device if e.get("cat") == "kernel"]
    durations = sorted(float(e["dur"]) for e in kernels)
    gemms = [e for e in kernels if GEMM_RE.search(str(e.get("name", "")))]
    fp32 = [e for e in gemms if FP32_GEMM_RE.search(str(e.get("name", ""))) and not HALF_GEMM_RE.search(str(e.get("name", "")))]
    props = data.get("deviceProperties") or []
    majors = [int(p["computeMajor"]) for p in props if isinstance(p, dict) and isinstance(p.get("computeMajor"), (int, float))]
    return {
        "span_s": round(span / 1e6, 6),
        "busy": round(busy / span, 4) if span else 0.0,
        "idle": round(1 - busy / span, 4) if span else 0.0,
        "compute": round(total(compute) / span, 4) if span else 0.0,
        "non_compute": round((busy - total(compute)) / span, 4) if span else 0.0,
        "comm": round(total(comm) / span, 4) if span else 0.0,
        "comm_overlap": round(total(intersect(comm, compute)) / total(comm), 4) if comm else None,
        "exposed_comm": round(total(subtract(comm, compute)) / span, 4) if span else 0.0,  # NCCL not hidden by compute
        "memory": round(total(merge(_span(e) for e in device if _MEMORY_RE.match(str(e.get("name", ""))))) / span, 4)
        if span
        else 0.0,
        "kernels": len(kernels),
        "median_kernel_us": durations[len(durations) // 2] if durations else None,
        "short_kernel_share": round(sum(1 for d in durations if d < TRACE_SHORT_KERNEL_US) / len(durations), 4)
        if durations
        else None,
        "gemm_time_s": round(sum(float(e["dur"]) for e in gemms) / 1e6, 6),
        "fp32_gemm_time_s": round(sum(float(e["dur"]) for e in fp32) / 1e6, 6),
        "compute_capability": max(majors) if majors else None,
        "device_name": next((p.get("name") for p in props if isinstance(p, dict) and p.get("name")), None),
    }


def summarize_file(path: str) -> dict[str, Any]:
    return summarize_trace(load_trace(path), trace_file=os.path.abspath(path))

"""Findings from a profiler trace of the job (`gputop trace`, `gputop report --trace`).

Input: the trace result's dict (``ranks``: one `gputop.analysis.trace_summary` summary per rank, each
optionally with ``memory_stats`` read by the agent from ``torch.cuda.memory_stats``).  Each rule is the
article's, with the evidence that triggers it:

- communication > 30% of the step -> gradient accumulation with ``no_sync``, ``bucket_cap_mb``, overlap,
  a topology check (``NCCL_P2P_DISABLE`` experiment);
- fp32 GEMMs on a GPU with tensor cores -> AMP (bf16 autocast);
- many tiny kernels with the GPU idle -> launch-bound: CUDA graphs or ``torch.compile``;
- host-device syncs in every step -> the line that syncs;
- caching-allocator retries or fragmentation -> ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Sequence

from gputop.analysis import trace_summary
from gputop.analysis.prediction import StepRate, predict_trace_amp
from gputop.analysis.thresholds import (
    TRACE_COMM_HEAVY,
    TRACE_FP32_GEMM_SHARE,
    TRACE_FRAGMENTED_SHARE,
    TRACE_LAUNCH_BOUND_IDLE,
    TRACE_SHORT_KERNEL_SHARE,
    TRACE_SHORT_KERNEL_US,
    TRACE_SYNC_SHARE,
)
from gputop.model import LABEL_CODE, Finding
from gputop.units import gib


def _who(rank: dict[str, Any]) -> str:
    return f"rank {rank['rank']}" if rank.get("rank") is not None else f"PID {rank.get('pid')}"


def _pids(ranks: Sequence[dict[str, Any]]) -> tuple[int, ...]:
    return tuple(r["pid"] for r in ranks if isinstance(r.get("pid"), int))


def _code_warning(
    id: str,
    title: str,
    confidence: float,
    summary: str,
    evidence: Iterable[str],
    fix: str,
    ranks: Sequence[dict[str, Any]],
    frames: Iterable[str] = (),
) -> list[Finding]:
    """Every trace rule's finding: a warning about the user's code, on the ranks that broke the rule."""
    return [
        Finding(
            id=id,
            title=title,
            severity="warning",
            confidence=confidence,
            label=LABEL_CODE,
            summary=summary,
            evidence=tuple(evidence),
            frames=tuple(frames),
            fix=fix,
            pids=_pids(ranks),
        )
    ]


def comm_share(rank: dict[str, Any]) -> float:
    """The rank's communication share: the host's time in collectives, or on a GPU the NCCL kernel time
    that no compute kernel hides (collectives are asynchronous there, so the host barely sees them)."""
    gpu = rank.get("gpu") or {}
    return max(float(rank["phases"].get("comm", 0.0)), float(gpu.get("exposed_comm") or 0.0))


def check_communication(ranks: Sequence[dict[str, Any]]) -> list[Finding]:
    heavy = [r for r in ranks if comm_share(r) > TRACE_COMM_HEAVY]
    if not heavy:
        return []
    worst = max(heavy, key=comm_share)
    evidence = [f"{_who(r)}: communication {r['phases']['comm']:.0%} of the main thread's wall time" for r in heavy]
    evidence += [
        f"{_who(r)}: NCCL kernels {r['gpu']['comm']:.0%} of the GPU's time, {r['gpu']['exposed_comm']:.0%} not hidden by compute"
        for r in heavy
        if r.get("gpu") and r["gpu"].get("exposed_comm") is not None
    ]
    gpu_overlap = [(r, r["gpu"]["comm_overlap"]) for r in heavy if r.get("gpu") and r["gpu"].get("comm_overlap") is not None]
    evidence += [f"{_who(r)}: {o:.0%} of NCCL kernel time overlaps compute kernels" for r, o in gpu_overlap]
    return _code_warning(
        id="trace_communication",
        title="Communication-bound (> 30% of the step)",
        confidence=0.8,
        summary=f"Communication takes {comm_share(worst):.0%} of {_who(worst)}'s time (the rule: > 30%)",
        evidence=evidence,
        fix=(
            "communicate less often and overlap it with backward\n"
            "# gradient accumulation: all-reduce once every K micro-batches\n"
            "with model.no_sync():            # DDP: skip the all-reduce on K-1 of K micro-batches\n"
            "    loss.backward()\n"
            "DDP(model, bucket_cap_mb=100)    # bigger buckets, fewer collectives (default 25)\n"
            "# check the topology: nvidia-smi topo -m (gputop: T); try NCCL_P2P_DISABLE=1 as an experiment"
        ),
        ranks=heavy,
    )


def check_amp(ranks: Sequence[dict[str, Any]]) -> list[Finding]:
    hits = []
    for r in ranks:
        gpu = r.get("gpu") or {}
        capability = gpu.get("compute_capability")
        gemm, fp32 = gpu.get("gemm_time_s") or 0.0, gpu.get("fp32_gemm_time_s") or 0.0
        if capability is not None and capability >= 7 and gemm > 0 and fp32 / gemm >= TRACE_FP32_GEMM_SHARE:
            hits.append((r, fp32 / gemm, capability))
    if not hits:
        return []
    r, share, capability = max(hits, key=lambda h: h[1])
    dtype = "torch.bfloat16" if capability >= 8 else "torch.float16"
    gpu = r.get("gpu") or {}
    rate = float(r["steps_per_s"]) if r.get("steps_per_s") else None
    forecast = predict_trace_amp(
        float(gpu.get("fp32_gemm_time_s") or 0.0),
        float(gpu.get("span_s") or 0.0),
        float(gpu.get("busy") or 0.0),
        StepRate(rate, "the trace's steps") if rate else None,
    )
    found = _code_warning(
        id="trace_amp",
        title="fp32 matrix multiplies on a GPU with tensor cores",
        confidence=0.7,
        summary=f"{share:.0%} of {_who(r)}'s GEMM time runs in fp32 on a compute-capability {capability} GPU: use AMP",
        evidence=(
            f"{_who(x)}: {s:.0%} of {x['gpu']['gemm_time_s'] * 1000:.1f} ms of GEMM kernels are fp32 "
            f"({x['gpu'].get('device_name') or 'GPU'}, sm_{c}x)"
            for x, s, c in hits
        ),
        fix=(
            "run the forward pass under autocast (the low-hanging fruit on Ampere and newer)\n"
            f"with torch.autocast('cuda', dtype={dtype}):\n"
            "    loss = model(x)\n"
            "loss.backward()" + ("" if capability >= 8 else "   # fp16 also needs torch.amp.GradScaler")
        ),
        ranks=[h[0] for h in hits],
    )
    return [replace(f, figures={**f.figures, "prediction": forecast.figures()}) for f in found]


def check_launch_bound(ranks: Sequence[dict[str, Any]]) -> list[Finding]:
    hits = [
        r
        for r in ranks
        if (g := r.get("gpu"))
        and g.get("short_kernel_share") is not None
        and g["short_kernel_share"] >= TRACE_SHORT_KERNEL_SHARE
        and g["idle"] >= TRACE_LAUNCH_BOUND_IDLE
    ]
    if not hits:
        return []
    r = max(hits, key=lambda x: x["gpu"]["idle"])
    g = r["gpu"]
    return _code_warning(
        id="trace_launch_bound",
        title="Many tiny kernels: launch-bound",
        confidence=0.6,
        summary=(
            f"{g['short_kernel_share']:.0%} of {_who(r)}'s kernels run under {TRACE_SHORT_KERNEL_US:g} µs and "
            f"the GPU idles {g['idle']:.0%} of the time: the host cannot launch them fast enough"
        ),
        evidence=(
            f"{_who(x)}: {x['gpu']['kernels']} kernels, median {x['gpu']['median_kernel_us']} µs, GPU idle {x['gpu']['idle']:.0%}"
            for x in hits
        ),
        fix=(
            "fuse the small kernels, or replay them as one graph\n"
            "model = torch.compile(model)                       # fuses elementwise ops\n"
            "model = torch.compile(model, mode='reduce-overhead')  # also uses CUDA graphs"
        ),
        ranks=hits,
    )


def _sync_every_step(rank: dict[str, Any]) -> bool:
    """At least one sync per step; the window may cut the last step before its sync, so N-1 of N counts."""
    steps = rank.get("steps") or 0
    syncs = rank.get("syncs")
    if syncs is None:  # a summary without the count
        return (rank.get("syncs_per_step") or 0) >= 1
    return steps > 0 and syncs >= max(1, steps - 1)


def _sync_place(site: dict[str, Any]) -> str:
    """The lines that sync when the source could be read (``train.py:61 `loss.item()` in train_step``),
    else the function the profiler's stack names (``train.py(52): train_step``, the line it starts on)."""
    parsed = trace_summary.parse_site(site["site"])
    lines = site.get("lines") or ()
    if parsed is None or not lines:
        return str(site["site"])
    file, _first, function = parsed
    return ", ".join(f"{file}:{x['line']} `{x['code']}`" for x in lines[:3]) + f" in {function}"


def check_sync(ranks: Sequence[dict[str, Any]]) -> list[Finding]:
    hits = [r for r in ranks if r.get("gpu") and _sync_every_step(r) and r["phases"].get("sync", 0.0) >= TRACE_SYNC_SHARE]
    if not hits:
        return []
    r = max(hits, key=lambda x: x["phases"]["sync"])
    named = [s for s in r.get("sync_sites") or () if s["site"] != "unknown"]
    where = f" at {_sync_place(named[0])}" if named else ""
    return _code_warning(
        id="trace_sync",
        title="Host-device sync in every step",
        confidence=0.7,
        summary=f"{_who(r)} waits on the GPU {r['syncs_per_step']:g} times a step{where} ({r['phases']['sync']:.0%} of its time)",
        evidence=(f"{_who(x)}: {x['syncs_per_step']:g} syncs per step, {x['phases']['sync']:.0%} of wall time" for x in hits),
        frames=(f"{_sync_place(s)} ({s['count']} syncs)" for s in named),
        fix=(
            "remove the sync from the step: keep values on the GPU and read them every N steps\n"
            "running_loss += loss.detach()        # not loss.item() every step\n"
            "if step % 100 == 0: print(running_loss.item() / 100)"
            + ("" if named else "\n# `gputop trace --with-stack` names the function that syncs")
        ),
        ranks=hits,
    )


def check_allocator(ranks: Sequence[dict[str, Any]]) -> list[Finding]:
    hits = []
    for r in ranks:
        for device, stats in (r.get("memory_stats") or {}).items():
            retries = stats.get("num_alloc_retries") or 0
            reserved = stats.get("reserved_bytes.all.current") or 0
            inactive = stats.get("inactive_split_bytes.all.current") or 0
            fragmented = reserved and inactive / reserved >= TRACE_FRAGMENTED_SHARE
            if retries > 0 or fragmented:
                hits.append((r, device, retries, inactive, reserved))
    if not hits:
        return []
    r, device, retries, inactive, reserved = max(hits, key=lambda h: (h[2], h[3]))
    return _code_warning(
        id="trace_allocator",
        title="CUDA caching allocator: retries or fragmentation",
        confidence=0.7,
        summary=(
            f"{_who(r)} cuda:{device}: {retries} allocation retries, {gib(inactive)} of {gib(reserved)} reserved "
            "sits in inactive split blocks (fragmentation)"
        ),
        evidence=(
            f"{_who(x)} cuda:{d}: num_alloc_retries={n}, inactive_split_bytes={gib(i)}, reserved={gib(res)}"
            for x, d, n, i, res in hits
        ),
        fix=(
            "let the allocator grow segments instead of splitting them, and fix input shapes\n"
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True   # or max_split_size_mb:128\n"
            "# pad or bucket variable-length inputs to a few fixed sizes"
        ),
        ranks=[h[0] for h in hits],
    )


TRACE_CHECKS = (check_communication, check_amp, check_launch_bound, check_sync, check_allocator)


def check_trace(trace: dict[str, Any]) -> list[Finding]:
    """Every trace finding for one trace result (``{"ranks": [...]}``)."""
    ranks = [r for r in trace.get("ranks") or () if r.get("phases")]
    return [f for check in TRACE_CHECKS for f in check(ranks)]

"""What the SMs, tensor cores and memory are doing (GPM, Hopper and newer): what GPU-Util cannot say.

GPU-Util is the share of time at least one kernel ran.  NVML's GPU Performance Monitoring (`GpuSample.gpm`) says
what those kernels kept busy, and three judgements read it:

* a collective spinning on a missing peer: ~100% GPU-Util with SM activity near zero (`is_collective_spin`; the
  hang check asks it first and falls back to its power heuristic where a GPU has no GPM);
* no tensor cores: SMs busy, tensor cores idle, the FP32 pipe busy, on a GPU whose tensor cores do bf16
  (compute capability >= 8) -> AMP with bf16 autocast;
* memory-bandwidth-bound: DRAM bandwidth high and busier than the SMs -> AMP halves the bytes, `torch.compile`
  fuses the elementwise kernels that stream memory.

Decision, then words: `kernel_shapes` returns typed results (`KernelShape`), and `_finding` is the one place
their wording is made.  Every number is in `thresholds.py`, with its source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from gputop.analysis.numbers import mean
from gputop.analysis.observations import Context, GpuObs
from gputop.analysis.prediction import Forecast, predict_amp, step_rate
from gputop.analysis.thresholds import (
    EVIDENCE_RANKS,
    GPM_DRAM_BOUND,
    GPM_FP32_BUSY,
    GPM_MIN_SAMPLES,
    GPM_SM_BUSY,
    GPM_SPIN_SM_ACTIVE_MAX,
    GPM_TENSOR_IDLE_MAX,
    LOW_UTILIZATION,
    SPIN_UTILIZATION_MIN,
    TENSOR_CORE_BF16_MIN_CAPABILITY,
)
from gputop.model import LABEL_CODE, Finding, GpuSample

NO_TENSOR_CORES = "no_tensor_cores"
MEMORY_BOUND = "memory_bound"


def is_collective_spin(sample: GpuSample) -> Optional[bool]:
    """Whether the GPU shows a collective spinning on a missing peer, judged by SM activity: ~100% GPU-Util with
    SM activity near zero.  None where GPM does not say (no GPM on this GPU, or the metric refused)."""
    if sample.lost or sample.gpm is None or sample.gpm.sm_active is None or sample.utilization_gpu is None:
        return None
    return sample.utilization_gpu >= SPIN_UTILIZATION_MIN and sample.gpm.sm_active <= GPM_SPIN_SM_ACTIVE_MAX


def spin_evidence(gpu: int, sample: GpuSample, seconds: float) -> Optional[str]:
    """The evidence line of a GPU spinning, in GPM's terms (None: no GPM, say it another way)."""
    if sample.gpm is None or sample.gpm.sm_active is None:
        return None
    return (
        f"GPU {gpu}: {sample.utilization_gpu:.0f}% GPU-Util with {sample.gpm.sm_active:.0f}% of its SMs active for "
        f"{seconds:.0f} s: a collective kernel spinning on a missing peer, not compute"
    )


def mean_sm_active(gpus: Sequence[GpuObs]) -> Optional[float]:
    """The GPUs' mean SM activity over the window where GPM knows it (None: none of them has GPM)."""
    values = [s.gpm.sm_active for o in gpus for s in o.samples if s.gpm is not None and s.gpm.sm_active is not None]
    return mean(values) if values else None


def busy(utilization: float, sm_active: Optional[float]) -> bool:
    """ "Busy" in a verdict: the SMs active where GPM says (GPU-Util counts a spinning collective or a memory-bound
    kernel as 100%), else GPU-Util."""
    return sm_active >= GPM_SM_BUSY if sm_active is not None else utilization >= LOW_UTILIZATION


@dataclass(frozen=True)
class GpmMeans:
    """One GPU's GPM over the window: the means of its samples that carry GPM, in percent."""

    gpu: int
    samples: int
    utilization: float
    sm_active: float
    tensor_active: float
    dram_bandwidth: float
    fp32_active: float
    compute_capability: Optional[tuple[int, int]]


@dataclass(frozen=True)
class KernelShape:
    """A judgement about what a GPU's kernels keep busy: `kind` (NO_TENSOR_CORES or MEMORY_BOUND) and the means
    it rests on."""

    kind: str
    means: GpmMeans


def gpm_means(obs: GpuObs) -> Optional[GpmMeans]:
    """The GPU's GPM means over the window; None with fewer than GPM_MIN_SAMPLES samples carrying every metric."""
    with_gpm = [s for s in obs.samples if s.gpm is not None and not s.lost]
    rows = [
        (s.utilization_gpu, s.gpm.sm_active, s.gpm.tensor_active, s.gpm.dram_bandwidth, s.gpm.fp32_active)
        for s in with_gpm
        if s.gpm is not None
    ]
    known = [row for row in rows if None not in row]
    if len(known) < GPM_MIN_SAMPLES:
        return None
    util, sm, tensor, dram, fp32 = (mean([float(v or 0.0) for v in column]) or 0.0 for column in zip(*known))
    capability = next((s.compute_capability for s in reversed(with_gpm) if s.compute_capability), None)
    return GpmMeans(obs.index, len(known), util, sm, tensor, dram, fp32, compute_capability=capability)


def shapes_of(means: GpmMeans) -> list[KernelShape]:
    """What the GPU's kernels are short of, busy GPUs only (a starving GPU's first problem is its input)."""
    if means.utilization < LOW_UTILIZATION:
        return []
    out = []
    bf16_tensor_cores = means.compute_capability is not None and means.compute_capability[0] >= TENSOR_CORE_BF16_MIN_CAPABILITY
    if (
        bf16_tensor_cores
        and means.sm_active >= GPM_SM_BUSY
        and means.tensor_active <= GPM_TENSOR_IDLE_MAX
        and means.fp32_active >= GPM_FP32_BUSY
    ):
        out.append(KernelShape(NO_TENSOR_CORES, means))
    if means.dram_bandwidth >= GPM_DRAM_BOUND and means.dram_bandwidth > means.sm_active:
        out.append(KernelShape(MEMORY_BOUND, means))
    return out


def kernel_shapes(ctx: Context) -> list[KernelShape]:
    """Every GPU's kernel judgements over the window, GPU by GPU."""
    out: list[KernelShape] = []
    for obs in ctx.gpus.values():
        means = gpm_means(obs)
        if means is not None:
            out += shapes_of(means)
    return out


def check_kernels(ctx: Context) -> list[Finding]:
    """The GPM findings: one per kind, naming every GPU that shows it."""
    shapes = kernel_shapes(ctx)
    found = []
    for kind in (MEMORY_BOUND, NO_TENSOR_CORES):
        means = [s.means for s in shapes if s.kind == kind]
        if means:
            finding = _finding(kind, means)
            if kind == MEMORY_BOUND:  # what AMP buys there: the bytes halve
                forecast = amp_forecast(ctx, [m.gpu for m in means])
                finding = replace(finding, figures={**finding.figures, "prediction": forecast.figures()})
            found.append(finding)
    return found


def amp_forecast(ctx: Context, gpus: Optional[Sequence[int]] = None) -> Forecast:
    """What AMP buys GPUs whose kernels stream memory: the DRAM-busy share (GPM, one reading a GPU a second) halves.
    `gpus`: these GPUs (default: the job's)."""
    chosen = [o for o in ctx.focus_gpus() if gpus is None or o.index in gpus]
    dram = [
        s.gpm.dram_bandwidth / 100.0 for o in chosen for s in o.samples if s.gpm is not None and s.gpm.dram_bandwidth is not None
    ]
    util = mean(o.mean_util for o in chosen if o.mean_util is not None)
    # the step must be the GPUs' work for their kernels' speed to set its pace
    return predict_amp(dram, busy=util is not None and util >= LOW_UTILIZATION).with_rate(step_rate(ctx))


def _gpus_text(means: list[GpmMeans]) -> str:
    return ", ".join(f"GPU {m.gpu}" for m in means[:8]) + (f" (+{len(means) - 8})" if len(means) > 8 else "")


def _evidence(m: GpmMeans) -> str:
    return (
        f"GPU {m.gpu}: GPU-Util {m.utilization:.0f}%, SM active {m.sm_active:.0f}%, tensor cores {m.tensor_active:.0f}%, "
        f"DRAM bandwidth {m.dram_bandwidth:.0f}%, FP32 pipe {m.fp32_active:.0f}% (GPM means of {m.samples} samples)"
    )


def _finding(kind: str, means: list[GpmMeans]) -> Finding:
    """The words of a kernel judgement: the one place they are made."""
    evidence = tuple(_evidence(m) for m in means[:EVIDENCE_RANKS])
    figures = {
        m.gpu: {"sm_active": m.sm_active, "tensor_active": m.tensor_active, "dram_bandwidth": m.dram_bandwidth} for m in means
    }
    gpus = tuple(m.gpu for m in means)
    if kind == MEMORY_BOUND:
        dram = max(m.dram_bandwidth for m in means)
        return Finding(
            id="memory_bound",
            title="Memory-bandwidth-bound: DRAM is the busy unit, not the SMs",
            severity="warning",
            confidence=0.7,
            label=LABEL_CODE,
            summary=f"Memory-bandwidth-bound: {_gpus_text(means)} move data at up to {dram:.0f}% of peak DRAM bandwidth while the SMs wait",
            evidence=evidence,
            fix=(
                "halve the bytes with AMP and fuse the elementwise kernels with torch.compile\n"
                "with torch.autocast('cuda', dtype=torch.bfloat16):   # bf16 activations: half the DRAM traffic\n"
                "    loss = loss_fn(model(x), y)\n"
                "model = torch.compile(model)   # fuses pointwise ops: one pass over memory instead of several"
            ),
            gpus=gpus,
            figures={"gpus": figures},
        )
    return Finding(
        id="no_tensor_cores",
        title="Tensor cores idle: the math runs in FP32 on the CUDA cores",
        severity="info",
        confidence=0.7,
        label=LABEL_CODE,
        summary=f"No tensor cores: {_gpus_text(means)} keep the SMs busy in FP32 with the tensor cores idle; AMP (bf16 autocast) is the low-hanging fruit",
        evidence=evidence,
        fix=(
            "turn on AMP with bf16 autocast (compute capability >= 8: no GradScaler needed)\n"
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "    loss = loss_fn(model(x), y)\n"
            "loss.backward()"
        ),
        gpus=gpus,
        figures={"gpus": figures},
    )

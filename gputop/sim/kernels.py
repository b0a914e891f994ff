"""What a simulated kernel keeps busy while it runs: its share of the SMs, tensor cores, DRAM bandwidth and pipes.

A kernel on the simulated stream (`gputop.sim.cuda`) carries a `KernelMix`; the busy board
(`gputop.sim.busy_board`) integrates it over the kernel's run time, and the fake NVML serves the integrals as GPM
counters (`gputop.sim.fake_nvml`), so `nvmlGpmMetricsGet` over a refresh interval gives the time-weighted mix of
the kernels that ran, as a real Hopper's GPM does.  No torch here: the fake NVML side reads this too.

The shares are the simulation's choices, in the proportions the real kernels show (Nsight Compute / DCGM's
profiling fields on H100): an fp32 GEMM runs on the FP32 pipe with the tensor cores idle; the same GEMM under bf16
autocast runs on the tensor cores and moves half the bytes; an unfused elementwise chain streams memory with the
SMs mostly waiting; a NCCL kernel waiting for a peer occupies a few SMs (NCCL's channels: one block each) and
does no math.
"""

from __future__ import annotations

from typing import NamedTuple


class KernelMix(NamedTuple):
    """Shares 0..1 of a kernel's run time, in the order of `gputop.model.GpmMetrics`' fields."""

    sm_active: float
    sm_occupancy: float
    tensor_active: float
    dram_bandwidth: float
    fp32_active: float
    fp16_active: float


FP32_GEMM = KernelMix(
    sm_active=0.92, sm_occupancy=0.45, tensor_active=0.0, dram_bandwidth=0.30, fp32_active=0.72, fp16_active=0.0
)
# bf16 autocast: the matmuls on the tensor cores, half the bytes of fp32 through DRAM
BF16_GEMM = KernelMix(
    sm_active=0.92, sm_occupancy=0.40, tensor_active=0.62, dram_bandwidth=0.15, fp32_active=0.06, fp16_active=0.03
)
# unfused elementwise ops in fp32 (what torch.compile fuses): DRAM streaming, the SMs mostly waiting on it
FP32_ELEMENTWISE = KernelMix(
    sm_active=0.35, sm_occupancy=0.30, tensor_active=0.0, dram_bandwidth=0.88, fp32_active=0.12, fp16_active=0.0
)
# an fp32 model of many small layers, run eagerly: its GEMMs are small and every activation, norm and residual is a
# kernel of its own that streams memory (the article's case study after caching: "DRAM bandwidth limited")
FP32_UNFUSED = KernelMix(
    sm_active=0.45, sm_occupancy=0.35, tensor_active=0.0, dram_bandwidth=0.80, fp32_active=0.30, fp16_active=0.0
)
# a NCCL collective spinning on a missing peer: ~4 of an H100's 132 SMs (one block per channel), no math, no traffic
NCCL_SPIN = KernelMix(sm_active=0.03, sm_occupancy=0.02, tensor_active=0.0, dram_bandwidth=0.0, fp32_active=0.0, fp16_active=0.0)
IDLE = KernelMix(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

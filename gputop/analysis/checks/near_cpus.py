"""A job whose CPUs are all far from its GPUs: NVML's CPU-affinity mask is empty for them.

NVML answers a GPU's affinity within the CPUs the calling process may use, so inside a Slurm job (or a
container) whose cgroup holds no CPU of the GPU's socket the mask comes back empty.  Every host-to-device
copy and every data-loader worker then crosses the socket interconnect.  The finding is part of the job's
placement finding (`checks/placement.py` calls it)."""

from __future__ import annotations

from gputop.analysis.observations import Context
from gputop.model import LABEL_CODE, Finding


def check_near_cpus(ctx: Context) -> list[Finding]:
    """One finding naming the GPUs (the job's, where it has ranks on GPUs) that none of its CPUs are near."""
    topology = ctx.history.machine.topology
    far = list(topology.gpus_without_near_cpus())
    used = ctx.job_gpus
    if used:
        far = [i for i in far if i in used]
    if not far:
        return []
    which = f"GPU {far[0]}" if len(far) == 1 else f"GPUs {', '.join(map(str, far))}"
    return [
        Finding(
            id="near_cpus",
            title="CPU placement: none of this job's CPUs are near its GPUs",
            severity="warning",
            confidence=0.8,
            label=LABEL_CODE,
            summary=f"None of this job's CPUs are near {which}: its copies and loader workers cross sockets",
            evidence=tuple(topology.near_cpus_text(i) for i in far)
            + ("NVML's CPU-affinity mask is empty: the CPUs this job may use are all on another socket",),
            fix=(
                "ask the scheduler for CPUs on the GPUs' socket\n"
                "#SBATCH --gres-flags=enforce-binding\n"
                "# or outside Slurm: run the job with CPUs of the GPUs' NUMA node (nvidia-smi topo -m, CPU Affinity)"
            ),
            gpus=tuple(far),
        )
    ]

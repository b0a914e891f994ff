"""The identity of a job that spans nodes, from the environment its ranks started with.

Every node's `gputop serve` must put the same `job` label on the same job, so the id comes from what the
launcher hands every rank on every node, never from a local PID where anything better exists:
torchrun's rendezvous id (`TORCHELASTIC_RUN_ID`, "none" when it was not given), Slurm's job (+ step),
the rendezvous address all ranks connect to (`MASTER_ADDR:MASTER_PORT`), and only then this host and
the launcher's PID (a job on one machine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

# Where launchers put the node's place in the job: torchrun GROUP_RANK, Lightning NODE_RANK, srun
# SLURM_NODEID; and the number of nodes: torchrun GROUP_WORLD_SIZE, srun SLURM_NNODES / SLURM_JOB_NUM_NODES.
NODE_RANK_KEYS = ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID")
NNODES_KEYS = ("GROUP_WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")


@dataclass(frozen=True, slots=True)
class NodePlace:
    """What a rank's environment says about the job beyond this machine (None: not said)."""

    job_id: Optional[str] = None  # the cross-node id; None: fall back to HOSTNAME:launcher_pid
    node_rank: Optional[int] = None
    nnodes: Optional[int] = None


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _first_int(env: Mapping[str, str], keys: tuple[str, ...]) -> Optional[int]:
    for key in keys:
        value = _int(env.get(key))
        if value is not None:
            return value
    return None


def cross_node_job_id(env: Mapping[str, str]) -> Optional[str]:
    """The id every node of the job derives alike, or None when the environment names none."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        return run_id
    slurm_job = env.get("SLURM_JOB_ID", "").strip()
    if slurm_job:
        step = env.get("SLURM_STEP_ID", "").strip()
        return f"slurm-{slurm_job}.{step}" if step else f"slurm-{slurm_job}"
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if addr and port:
        return f"{addr}:{port}"
    return None


def nnodes_from_env(env: Mapping[str, str]) -> Optional[int]:
    """The number of nodes: said outright, else the world over the ranks per node when that divides."""
    said = _first_int(env, NNODES_KEYS)
    if said is not None:
        return said
    world, per_node = _int(env.get("WORLD_SIZE")), _int(env.get("LOCAL_WORLD_SIZE"))
    if world and per_node and world % per_node == 0:
        return world // per_node
    return None


def node_place(env: Optional[Mapping[str, str]]) -> NodePlace:
    env = env or {}
    return NodePlace(cross_node_job_id(env), _first_int(env, NODE_RANK_KEYS), nnodes_from_env(env))


def fallback_job_id(hostname: str, launcher_pid: int) -> str:
    """A job on one machine: this host and its launcher, unique across the fleet."""
    return f"{hostname}:{launcher_pid}"

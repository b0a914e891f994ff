"""Which GPU each rank is on, and what is wrong with the placement.

NVML names the processes on each GPU by PID.  On the host those are gputop's PIDs too.  Inside a
container with its own PID namespace the driver still reports host PIDs, which mean nothing there: a
rank is then matched through /proc/PID/status NSpid where that shows the PID NVML used, and otherwise
its GPU is inferred from its CUDA_VISIBLE_DEVICES and LOCAL_RANK (an index or a UUID), and the rank
says so (`Rank.gpu_mapping`).
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

from gputop.collect.procfs import ProcKey, Tracked, int_or_none, read_ns_pids
from gputop.model import GpuSample, Misplacement, Rank

MAPPED_BY_NVML = "nvml"  # NVML's PID is the rank's PID here
MAPPED_BY_NSPID = "nspid"  # NVML's PID is the rank's PID in another namespace its NSpid line shows
MAPPED_BY_ENV = "inferred"  # from CUDA_VISIBLE_DEVICES + LOCAL_RANK: NVML's PIDs are not visible here


def gpus_of_pids(gpus: Iterable[GpuSample]) -> dict[int, tuple[int, ...]]:
    """pid -> NVML indices of the GPUs where NVML lists it (holds a context / memory)."""
    found: dict[int, set[int]] = {}
    for gpu in gpus:
        if gpu.lost or not gpu.processes:
            continue
        for gp in gpu.processes:
            found.setdefault(gp.pid, set()).add(gpu.index)
    return {pid: tuple(sorted(idx)) for pid, idx in found.items()}


def mig_instances_of_pids(gpus: Iterable[GpuSample]) -> dict[int, tuple[tuple[int, int], ...]]:
    """pid -> (GPU index, GPU instance id) of the MIG instances where NVML lists it."""
    found: dict[int, set[tuple[int, int]]] = {}
    for gpu in gpus:
        for instance in gpu.mig or () if not gpu.lost else ():
            for gp in instance.processes or ():
                found.setdefault(gp.pid, set()).add((gpu.index, instance.gpu_instance_id))
    return {pid: tuple(sorted(where)) for pid, where in found.items()}


def mig_instances_of_rank(
    pid: int, env: Optional[dict[str, str]], local_rank: Optional[int], mapping: Optional[str], gpus: Iterable[GpuSample]
) -> tuple[tuple[int, int], ...]:
    """(GPU index, GPU instance id) of the MIG instances a placed rank runs on: where NVML lists its PID, or,
    where its GPU was inferred from CUDA_VISIBLE_DEVICES, the instance whose MIG-<uuid> that names."""
    if mapping == MAPPED_BY_NVML:
        return mig_instances_of_pids(gpus).get(pid, ())
    device = visible_device(env, local_rank) if mapping == MAPPED_BY_ENV else None
    if device is None or not device.startswith("MIG-"):
        return ()
    return tuple((g.index, m.gpu_instance_id) for g in gpus if not g.lost for m in g.mig or () if m.uuid.startswith(device))


def _device_name(device: tuple[int, Optional[int]]) -> str:
    gpu, instance = device
    return f"GPU {gpu}" if instance is None else f"GPU {gpu} MIG instance {instance}"


def _rank_label(rank: Rank) -> str:
    return f"rank {rank.rank} (PID {rank.proc.pid})" if rank.rank is not None else f"PID {rank.proc.pid}"


def _gpu_list(indices: Iterable[int]) -> str:
    return ", ".join(str(i) for i in sorted(indices))


SET_DEVICE_FIX = "call torch.cuda.set_device(local_rank) (or use f'cuda:{local_rank}') before any CUDA work"


def find_misplacements(ranks: tuple[Rank, ...], gpus: tuple[GpuSample, ...]) -> tuple[Misplacement, ...]:
    """Ranks sharing a GPU, one rank on several GPUs, and the "all ranks on GPU 0" bug, each with its
    ranks, GPUs and one line for people."""
    found: list[Misplacement] = []
    placed = [r for r in ranks if r.gpus]
    if not placed:
        return ()
    by_device: dict[tuple[int, Optional[int]], list[Rank]] = {}
    for rank in placed:
        for device in rank.devices:
            by_device.setdefault(device, []).append(rank)
    visible_gpus = len([g for g in gpus if not g.lost])
    shared = {device: rs for device, rs in by_device.items() if len(rs) > 1}
    everyone_on_one = len(placed) > 1 and len(by_device) == 1
    if everyone_on_one:
        ((index, instance),) = by_device
        idle = visible_gpus - 1
        message = (
            f"all {len(placed)} ranks run on {_device_name((index, instance))}"
            + (f" while {idle} other GPU{'s' if idle != 1 else ''} sit idle" if idle > 0 else "")
            + f": {SET_DEVICE_FIX}"
        )
        found.append(Misplacement("all_on_one_gpu", tuple(r.proc.pid for r in placed), (index,), message))
    else:
        for device in sorted(shared, key=lambda d: (d[0], -1 if d[1] is None else d[1])):
            names = ", ".join(_rank_label(r) for r in shared[device])
            message = f"{_device_name(device)} is shared by {len(shared[device])} ranks ({names}): {SET_DEVICE_FIX}"
            found.append(Misplacement("shared_gpu", tuple(r.proc.pid for r in shared[device]), (device[0],), message))
    for rank in placed:
        if len(rank.gpus) > 1:
            message = (
                f"{_rank_label(rank)} holds memory on GPUs {_gpu_list(rank.gpus)}: a stray CUDA context "
                f"(usually cuda:0 touched before set_device); {SET_DEVICE_FIX}"
            )
            found.append(Misplacement("several_gpus", (rank.proc.pid,), tuple(rank.gpus), message))
    return tuple(found)


def _live_here(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def visible_device(env: Optional[dict[str, str]], local_rank: Optional[int]) -> Optional[str]:
    """The CUDA device a rank uses by convention (cuda:LOCAL_RANK, or the only one it sees), as its
    CUDA_VISIBLE_DEVICES entry: an index ("3") or a UUID ("GPU-8f2c...", "MIG-...")."""
    env = env or {}
    local = local_rank if local_rank is not None else int_or_none(env.get("LOCAL_RANK"))
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return str(local) if local is not None else None
    devices = [d.strip() for d in listed.split(",") if d.strip()]
    if len(devices) == 1:
        return devices[0]
    if local is not None and 0 <= local < len(devices):
        return devices[local]
    return None


def _gpu_index_of(device: str, gpus: tuple[GpuSample, ...]) -> Optional[int]:
    """NVML index of a CUDA_VISIBLE_DEVICES entry: by UUID (or a unique prefix of one), else by index.
    (CUDA's index order can differ from NVML's; without CUDA_DEVICE_ORDER=PCI_BUS_ID that is a guess.)"""
    if device.startswith("MIG-"):  # a MIG instance's UUID: the GPU that holds that instance
        matches = [g.index for g in gpus if any(m.uuid.startswith(device) for m in g.mig or ())]
        return matches[0] if len(matches) == 1 else None
    if device.startswith("GPU-"):
        matches = [g.index for g in gpus if g.uuid.startswith(device)]
        return matches[0] if len(matches) == 1 else None
    index = int_or_none(device)
    return index if index is not None and any(g.index == index for g in gpus) else None


def place_ranks(
    ranks: Iterable[tuple[Tracked, Optional[int]]], gpus: tuple[GpuSample, ...]
) -> dict[ProcKey, tuple[tuple[int, ...], Optional[str]]]:
    """(GPU indices, how they were matched) for each (rank, its local rank).

    NVML's PID straight, when a rank has it; else through the rank's NSpid line (its PIDs in the
    namespaces below ours); else, only while some GPU holds processes that match nothing
    here (NVML's PIDs belong to another namespace), the GPU its CUDA_VISIBLE_DEVICES and LOCAL_RANK
    name, if that GPU is one of them."""
    by_pid = gpus_of_pids(gpus)
    foreign = {pid for pid in by_pid if not _live_here(pid)}
    placed: dict[ProcKey, tuple[tuple[int, ...], Optional[str]]] = {}
    pending: list[tuple[Tracked, Optional[int]]] = []
    for tracked, local_rank in ranks:
        pid = tracked.key[0]
        if pid in by_pid:
            placed[tracked.key] = (by_pid[pid], MAPPED_BY_NVML)
            continue
        inner = [p for p in read_ns_pids(pid)[1:] if p in by_pid]
        if inner:
            foreign.discard(inner[-1])
            placed[tracked.key] = (by_pid[inner[-1]], MAPPED_BY_NSPID)
        else:
            pending.append((tracked, local_rank))
    unmatched_gpus = {index for pid in foreign for index in by_pid[pid]}
    for tracked, local_rank in pending:
        device = visible_device(tracked.env, local_rank) if unmatched_gpus else None
        index = _gpu_index_of(device, gpus) if device is not None else None
        if index is not None and index in unmatched_gpus:
            placed[tracked.key] = ((index,), MAPPED_BY_ENV)
        else:
            placed[tracked.key] = ((), None)
    return placed

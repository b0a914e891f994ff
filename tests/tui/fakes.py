"""Deterministic sources for TUI tests: hand-built machines and snapshot scripts with a fixed clock.

`ScriptedSource.poll()` hands out its snapshots in order, then blocks like a hung
driver call until `close()`: once the script is consumed the screen no longer
changes, so snapshot tests see exactly one picture.
"""

from __future__ import annotations

import math
import threading
from typing import Iterable, Optional, Sequence

from gputop.errors import GputopError
from gputop.model import (
    EccCounts,
    Finding,
    Frame,
    GpuProcess,
    GpuSample,
    HostSample,
    JobTree,
    MachineInfo,
    NvLinkLink,
    PcieLink,
    ProcessStacks,
    ProcInfo,
    Rank,
    RemappedRows,
    Snapshot,
    ThreadStack,
    Topology,
)

T0 = 1_700_000_000.0
GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"


def make_machine(gpus: int = 8, cores: int = 128, simulated: Optional[str] = "h100-sxm-8") -> MachineInfo:
    matrix = tuple(tuple("X" if i == j else "NV18" for j in range(gpus)) for i in range(gpus))
    half = cores // 2
    affinity = tuple(f"0-{half - 1}" if i < gpus // 2 else f"{half}-{cores - 1}" for i in range(gpus))
    numa = tuple(0 if i < gpus // 2 else 1 for i in range(gpus))
    return MachineInfo(
        hostname="dgx-test-01",
        cpu_model="AMD EPYC 7742 64-Core Processor",
        cpu_count=cores,
        driver_version="550.54.15",
        cuda_version="12.4",
        nvml_version="12.550.54.15",
        gpu_count=gpus,
        gpu_names=(H100,) * gpus,
        topology=Topology(matrix=matrix, cpu_affinity=affinity, numa_node=numa),
        simulated=simulated,
    )


def utilization(gpu: int, tick: int) -> float:
    """A deterministic pattern: busy saw-tooth ranks, one idle GPU, one starved GPU."""
    if gpu == 6:
        return 0.0
    if gpu == 7:
        return 30.0 + 6.0 * math.sin(tick / 3.0)
    phase = (tick + 3 * gpu) % 12
    return 97.0 if phase < 9 else 35.0 + 5.0 * gpu


def make_gpu(index: int, tick: int, *, lost: bool = False) -> GpuSample:
    name, bus = H100, f"00000000:{0x18 + index * 0x10:02X}:00.0"
    uuid = f"GPU-{index:08d}-0000-0000-0000-000000000000"
    if lost:
        return GpuSample(index=index, uuid=uuid, name=name, pci_bus_id=bus, lost=True)
    util = utilization(index, tick)
    downgraded = index == 7
    throttles = ("HwThermal", "SwThermal") if index == 7 else ("SwPowerCap",) if util > 90 else ()
    return GpuSample(
        index=index,
        uuid=uuid,
        name=name,
        pci_bus_id=bus,
        utilization_gpu=round(util, 1),
        utilization_memory=round(util / 2, 1),
        memory_used=int((62 if index != 6 else 0.5) * GIB),
        memory_total=80 * GIB,
        temperature=88.0 if index == 7 else 55.0 + util / 5,
        power=round(90 + 6 * util, 0),
        power_limit=700.0,
        clock_sm=1980 if index != 7 else 1245,
        clock_memory=2619,
        pcie=PcieLink(
            gen_current=4 if downgraded else 5,
            gen_max=5,
            width_current=8 if downgraded else 16,
            width_max=16,
            tx_bytes_per_s=1.5e9 * util / 100,
            rx_bytes_per_s=3.2e9 * util / 100,
        ),
        nvlink=tuple(
            NvLinkLink(link=k, active=True, remote_kind="switch", tx_bytes_per_s=2.5e9 * util / 100, rx_bytes_per_s=2.5e9 * util / 100)
            for k in range(18)
        ),
        throttle_reasons=throttles,
        ecc=EccCounts(volatile_corrected=0, volatile_uncorrected=2 if index == 5 else 0, aggregate_corrected=0, aggregate_uncorrected=2 if index == 5 else 0),
        remapped_rows=RemappedRows(),
        processes=(GpuProcess(pid=1001 + index, used_memory=int(61 * GIB)),) if index != 6 else (),
    )


def make_host(tick: int, cores: int = 128, job_cores: Iterable[int] = ()) -> HostSample:
    busy = set(job_cores)
    percents = []
    for core in range(cores):
        if core in busy:
            percents.append(100.0 if (core + tick) % 5 else 87.0)
        else:
            percents.append(float((core * 37 + tick * 11) % 23))
    return HostSample(
        cpu_percent=tuple(percents),
        core_numa=tuple(0 if c < cores // 2 else 1 for c in range(cores)),
        iowait_percent=1.2,
        steal_percent=0.0,
        memory_total=1024 * GIB,
        memory_used=412 * GIB,
        memory_available=600 * GIB,
        swap_total=8 * GIB,
        swap_used=0,
        load_average=(33.5, 31.0, 29.8),
    )


def _frames(*items: tuple[str, str, int]) -> tuple[Frame, ...]:
    """Outermost first here for readability; py-spy order (innermost first) is returned."""
    return tuple(Frame(name=n, filename=f, line=l) for n, f, l in reversed(items))


WAITING_STACK = _frames(
    ("<module>", "/job/train.py", 120),
    ("train", "/job/train.py", 88),
    ("_BaseDataLoaderIter.__next__", "/usr/lib/python3/torch/utils/data/dataloader.py", 631),
    ("_MultiProcessingDataLoaderIter._next_data", "/usr/lib/python3/torch/utils/data/dataloader.py", 1329),
    ("_MultiProcessingDataLoaderIter._try_get_data", "/usr/lib/python3/torch/utils/data/dataloader.py", 1133),
    ("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 113),
    ("select", "/usr/lib/python3.11/selectors.py", 415),
)
WORKER_STACK = _frames(
    ("_worker_loop", "/usr/lib/python3/torch/utils/data/_utils/worker.py", 308),
    ("ImageFolder.__getitem__", "/job/data.py", 51),
    ("ImageFile.load", "/usr/lib/python3/PIL/ImageFile.py", 269),
)


def make_job(tick: int, ranks: int = 8, workers: int = 2, exited_pids: Sequence[int] = ()) -> JobTree:
    launcher = ProcInfo(pid=1000, ppid=1, name="torchrun", cmdline=("/usr/bin/python", "-m", "torch.distributed.run", "--nproc-per-node", "8", "train.py"), state="S", cpu_percent=0.3, rss=210 * 1024**2, core=3)
    rank_list = []
    stacks: dict[int, ProcessStacks] = {}
    for r in range(ranks):
        pid = 1001 + r
        worker_procs = tuple(
            ProcInfo(pid=2000 + r * 10 + w, ppid=pid, name="pt_data_worker", state="R", cpu_percent=99.0 - w, rss=900 * 1024**2, core=10 + r * 4 + w, exited=(2000 + r * 10 + w) in exited_pids)
            for w in range(workers)
        )
        proc = ProcInfo(pid=pid, ppid=1000, name="python", cmdline=("python", "train.py"), state="S", cpu_percent=42.0 + r, rss=int(5.5 * GIB), core=8 + r * 4, exited=pid in exited_pids)
        rank_list.append(Rank(proc=proc, rank=r, local_rank=r, world_size=ranks, gpus=(r,) if r != 6 else (), workers=worker_procs, main_thread_state="waiting for data" if r != 6 else "collective/barrier"))
        stacks[pid] = ProcessStacks(pid=pid, timestamp=T0 + tick - 1, threads=(
            ThreadStack(thread_id=1, thread_name="MainThread", os_thread_id=pid, active=False, owns_gil=False, frames=WAITING_STACK),
            ThreadStack(thread_id=2, thread_name="pt_data_pin", os_thread_id=pid + 1, active=False, owns_gil=False, frames=_frames(("_pin_memory_loop", "/usr/lib/python3/torch/utils/data/_utils/pin_memory.py", 53))),
        ))
        for worker in worker_procs:
            stacks[worker.pid] = ProcessStacks(pid=worker.pid, timestamp=T0 + tick - 1, threads=(
                ThreadStack(thread_id=1, thread_name="MainThread", os_thread_id=worker.pid, active=True, owns_gil=True, frames=WORKER_STACK),
            ))
    return JobTree(root_pid=1000, launcher=launcher, ranks=tuple(rank_list), stacks=stacks,
                   warnings=("rank 6 holds no GPU memory (CUDA_VISIBLE_DEVICES='')",))


def job_core_ids(job: JobTree) -> list[int]:
    return [p.core for r in job.ranks for p in (r.proc, *r.workers) if p.core is not None]


def make_snapshots(
    count: int = 90,
    *,
    gpus: int = 8,
    cores: int = 128,
    lose_gpu: Optional[tuple[int, int]] = None,  # (gpu index, from tick)
    with_job: bool = False,
) -> list[Snapshot]:
    snaps = []
    for tick in range(count):
        job = make_job(tick) if with_job else None
        lost = lose_gpu is not None and tick >= lose_gpu[1]
        gpu_samples = tuple(make_gpu(i, tick, lost=lost and i == lose_gpu[0]) for i in range(gpus))
        host = make_host(tick, cores, job_core_ids(job) if job else ())
        snaps.append(Snapshot(timestamp=T0 + tick, host=host, gpus=gpu_samples, job=job, simulated=True))
    return snaps


class ScriptedSource:
    """A source that returns a fixed list of snapshots, then blocks until closed."""

    def __init__(self, machine: MachineInfo, snapshots: Sequence[Snapshot]) -> None:
        self.machine = machine
        self._snapshots = list(snapshots)
        self.polls = 0
        self.closed = threading.Event()
        self.attached: list[int] = []

    def poll(self) -> Snapshot:
        if self.polls < len(self._snapshots):
            snapshot = self._snapshots[self.polls]
            self.polls += 1
            return snapshot
        self.closed.wait()
        raise GputopError("source closed")

    @property
    def exhausted(self) -> bool:
        return self.polls >= len(self._snapshots)

    def attach(self, pid: int) -> None:
        if pid == 4242:
            raise GputopError("no process with PID 4242 (it exited?)")
        self.attached.append(pid)

    def close(self) -> None:
        self.closed.set()


def fixed_diagnose(history, bench):  # noqa: ANN001
    """Stands in for diagnosis in screen tests, so pictures do not change when diagnosis rules do."""
    findings = [
        Finding(
            id="starvation",
            title="GPUs starved by the input pipeline",
            severity="critical",
            confidence=0.9,
            label="your code",
            summary="Input-bound: rank 0 waits for data 62% of the time",
            evidence=("GPU utilization mean 41% over 90 s", "main thread in _BaseDataLoaderIter.__next__ 62% of samples"),
            frames=("ImageFile.load (ImageFile.py:269)",),
            fix="DataLoader(num_workers=12, prefetch_factor=4, pin_memory=True, persistent_workers=True)",
        ),
        Finding(
            id="pcie_downgrade",
            title="PCIe link below max under load",
            severity="warning",
            confidence=0.8,
            label="infrastructure (file a ticket)",
            summary="GPU7 runs at Gen4 x8 (max Gen5 x16) under load",
            evidence=("GPU7 PCIe Gen4 x8 while 30% busy",),
            fix="Reseat the card or check the riser; file a ticket with this report.",
            gpus=(7,),
        ),
    ]
    return findings, "Input-bound: rank 0 waits for data 62% of the time → DataLoader(num_workers=12, …)"

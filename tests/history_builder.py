"""Build `History` objects by hand: GPU series, host CPU, a job tree and py-spy-shaped stacks.

Each profile of the diagnosis (starved, saw-tooth, hang, single-GPU, straggler, CPU-bound, infrastructure
faults, healthy) is a few lambdas over time.  Stacks are "dumped" every `stack_interval` seconds like the
real collector: the snapshots between two dumps share the same `ProcessStacks` object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from gputop.analysis.stack_classes import (
    COLLECTIVE,
    EXPLICIT_SYNC,
    FORWARD_BACKWARD,
    IDLE_OTHER,
    IN_DATASET,
    OPTIMIZER_STEP,
    WAITING_FOR_DATA,
)
from gputop.history import History
from gputop.model import (
    EccCounts,
    Frame,
    GpuProcess,
    GpuSample,
    HostSample,
    JobTree,
    MachineInfo,
    NvLinkLink,
    PcieLink,
    ProcessProgress,
    ProcessStacks,
    ProcInfo,
    Rank,
    RemappedRows,
    Snapshot,
    ThreadProgress,
    ThreadStack,
    Topology,
)

GIB = 1 << 30
T0 = 1_000_000.0

_TRAIN = [Frame("train", "/job/train.py", 42), Frame("<module>", "/job/train.py", 90)]
_DL = "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py"
_WORKER = "/usr/lib/python3/site-packages/torch/utils/data/_utils/worker.py"
_FETCH = "/usr/lib/python3/site-packages/torch/utils/data/_utils/fetch.py"

# main-thread stacks, innermost FIRST (as py-spy gives them)
STATE_FRAMES: dict[str, list[Frame]] = {
    WAITING_FOR_DATA: [
        Frame("select", "/usr/lib/python3.11/selectors.py", 415),
        Frame("wait", "/usr/lib/python3.11/multiprocessing/connection.py", 947),
        Frame("_poll", "/usr/lib/python3.11/multiprocessing/connection.py", 440),
        Frame("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 113),
        Frame("_MultiProcessingDataLoaderIter._try_get_data", _DL, 1133),
        Frame("_MultiProcessingDataLoaderIter._get_data", _DL, 1294),
        Frame("_MultiProcessingDataLoaderIter._next_data", _DL, 1332),
        Frame("_BaseDataLoaderIter.__next__", _DL, 701),
        *_TRAIN,
    ],
    IN_DATASET: [
        Frame("decode", "/job/dataset.py", 20),
        Frame("ImageDataset.__getitem__", "/job/dataset.py", 31),
        Frame("_MapDatasetFetcher.fetch", _FETCH, 52),
        Frame("_SingleProcessDataLoaderIter._next_data", _DL, 757),
        Frame("_BaseDataLoaderIter.__next__", _DL, 701),
        *_TRAIN,
    ],
    FORWARD_BACKWARD: [
        Frame("_engine_run_backward", "/usr/lib/python3/site-packages/torch/autograd/graph.py", 825),
        Frame("backward", "/usr/lib/python3/site-packages/torch/autograd/__init__.py", 347),
        Frame("Tensor.backward", "/usr/lib/python3/site-packages/torch/_tensor.py", 626),
        *_TRAIN,
    ],
    OPTIMIZER_STEP: [
        Frame("SGD.step", "/usr/lib/python3/site-packages/torch/optim/sgd.py", 120),
        *_TRAIN,
    ],
    COLLECTIVE: [
        Frame("all_reduce", "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 2501),
        Frame("wrapper", "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py", 81),
        *_TRAIN,
    ],
    EXPLICIT_SYNC: [
        Frame("synchronize", "/usr/lib/python3/site-packages/torch/cuda/__init__.py", 985),
        *_TRAIN,
    ],
    IDLE_OTHER: [Frame("log_metrics", "/job/train.py", 60), *_TRAIN],
}

EPOCH_START_FRAMES = [
    Frame("BaseProcess.start", "/usr/lib/python3.11/multiprocessing/process.py", 121),
    Frame("_MultiProcessingDataLoaderIter.__init__", _DL, 1085),
    Frame("DataLoader._get_iterator", _DL, 434),
    Frame("DataLoader.__iter__", _DL, 491),
    *_TRAIN,
]

WORKER_IDLE_FRAMES = [
    Frame("select", "/usr/lib/python3.11/selectors.py", 415),
    Frame("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 113),
    Frame("_worker_loop", _WORKER, 309),
]


def worker_busy_frames(line: int = 0) -> list[Frame]:
    """A worker decoding a JPEG; `line` varies like a real sampled stack does."""
    return [
        Frame("ImageFile.load", "/usr/lib/python3/site-packages/PIL/ImageFile.py", 290 + line % 7),
        Frame("decode", "/job/dataset.py", 20),
        Frame("ImageDataset.__getitem__", "/job/dataset.py", 31),
        Frame("_MapDatasetFetcher.fetch", _FETCH, 52),
        Frame("_worker_loop", _WORKER, 349),
    ]


WORKER_STUCK_FRAMES = [
    Frame("ImageDataset.__getitem__", "/job/dataset.py", 44),  # e.g. a read on a stalled mount
    Frame("_MapDatasetFetcher.fetch", _FETCH, 52),
    Frame("_worker_loop", _WORKER, 349),
]


def stacks_of(
    pid: int, frames: Sequence[Frame], timestamp: float, active: bool = True, progress: Optional[ProcessProgress] = None
) -> ProcessStacks:
    return ProcessStacks(
        pid=pid,
        timestamp=timestamp,
        threads=(ThreadStack(pid, "MainThread", pid, active, active, tuple(frames)),),
        progress=progress,
    )


def progress_of(pid: int, t: float, *, switches_per_s: float = 0.0, cpu_share: float = 0.0, io_per_s: float = 0.0) -> ProcessProgress:
    """The counters a process shows at time t when it wakes `switches_per_s` times a second, keeps `cpu_share`
    of a core busy and moves `io_per_s` bytes a second (all 0: blocked)."""
    ticks = int(t * cpu_share * 100)
    return ProcessProgress(
        cpu_seconds=ticks / 100,
        io_read_chars=int(t * io_per_s),
        io_write_chars=0,
        threads=(ThreadProgress(pid, int(t * switches_per_s), 0, ticks),),
    )


def machine(gpus: int = 8, cores: int = 16, gpu_error: Optional[str] = None) -> MachineInfo:
    return MachineInfo(
        hostname="trainbox",
        cpu_model="Test CPU",
        cpu_count=cores,
        driver_version=None if gpu_error else "550.54.15",
        cuda_version=None if gpu_error else "12.4",
        gpu_error=gpu_error,
        gpu_count=0 if gpu_error else gpus,
        gpu_names=() if gpu_error else ("NVIDIA H100 80GB HBM3",) * gpus,
        topology=Topology(
            matrix=tuple(tuple("X" if i == j else "NV18" for j in range(gpus)) for i in range(gpus)) if not gpu_error else (),
        ),
    )


@dataclass
class RankSpec:
    """One rank; every callable takes the time offset t (seconds from the start)."""

    pid: int
    rank: Optional[int]
    gpus: tuple[int, ...] = ()
    state: Callable[[float], str] = lambda t: FORWARD_BACKWARD
    frames: Optional[Callable[[float], Sequence[Frame]]] = None  # overrides STATE_FRAMES[state]
    workers: Callable[[float], Sequence[int]] = lambda t: ()
    worker_frames: Callable[[float, int], Optional[Sequence[Frame]]] = lambda t, w: None
    cpu: Callable[[float], float] = lambda t: 30.0
    worker_cpu: Callable[[float, int], float] = lambda t, w: 50.0
    worker_state: Callable[[float, int], str] = lambda t, w: "S"
    exited: Callable[[float], bool] = lambda t: False
    progress: Optional[Callable[[float], ProcessProgress]] = None  # counters beside each main dump
    worker_progress: Optional[Callable[[float, int], ProcessProgress]] = None  # ... beside each worker dump


@dataclass
class Scenario:
    seconds: float = 59.0
    interval: float = 1.0
    stack_interval: float = 2.0
    gpu_count: int = 8
    cores: int = 16
    gpu_error: Optional[str] = None
    util: Callable[[int, float], Optional[float]] = lambda g, t: 95.0
    memory_gib: Callable[[int, float], Optional[float]] = lambda g, t: 30.0
    gpu_extra: Callable[[int, float], dict] = lambda g, t: {}
    processes: Optional[Callable[[int, float], Sequence[int]]] = None  # pids per GPU; default: from ranks
    host_cpu: Callable[[int, float], float] = lambda c, t: 40.0
    ranks: list[RankSpec] = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    attach: bool = True  # build JobTrees (ranks) at all


def _gpu(index: int, t: float, sc: Scenario, pids: Sequence[int]) -> GpuSample:
    mem = sc.memory_gib(index, t)
    extra = dict(sc.gpu_extra(index, t))
    base = dict(
        index=index,
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        utilization_gpu=sc.util(index, t),
        utilization_memory=None,
        memory_used=None if mem is None else int(mem * GIB),
        memory_total=80 * GIB,
        temperature=55.0,
        power=400.0,
        power_limit=700.0,
        clock_sm=1980,
        pcie=PcieLink(5, 5, 16, 16, 1e9, 2e9),
        nvlink=tuple(NvLinkLink(i, True, f"0000:{0xA0 + i:02X}:00.0", "switch", 1e9, 1e9) for i in range(18)),
        throttle_reasons=(),
        ecc=EccCounts(0, 0, 0, 0),
        remapped_rows=RemappedRows(),
        processes=tuple(GpuProcess(p, int(mem * GIB / max(1, len(pids))) if mem else None) for p in pids),
    )
    base.update(extra)
    if base.get("lost"):
        return GpuSample(index=index, uuid=base["uuid"], name=base["name"], pci_bus_id=base["pci_bus_id"], lost=True)
    return GpuSample(**base)


def build(sc: Scenario) -> History:
    hist = History(machine(sc.gpu_count, sc.cores, sc.gpu_error), capacity=100_000)
    n = int(round(sc.seconds / sc.interval)) + 1
    dumps: dict[tuple[int, float], ProcessStacks] = {}
    for i in range(n):
        t = i * sc.interval
        ts = T0 + t
        dump_t = (t // sc.stack_interval) * sc.stack_interval
        ranks: list[Rank] = []
        stacks: dict[int, ProcessStacks] = {}
        for spec in sc.ranks:
            state = spec.state(dump_t)
            key = (spec.pid, dump_t)
            if key not in dumps:
                frames = spec.frames(dump_t) if spec.frames else STATE_FRAMES[state]
                progress = spec.progress(dump_t) if spec.progress else None
                dumps[key] = stacks_of(spec.pid, frames, T0 + dump_t, active=state not in (WAITING_FOR_DATA, COLLECTIVE), progress=progress)
            stacks[spec.pid] = dumps[key]
            workers = []
            for w in spec.workers(t):
                wstate = spec.worker_state(t, w)
                workers.append(
                    ProcInfo(w, spec.pid, "pt_data_worker", ("python", "train.py"), wstate, spec.worker_cpu(t, w), 200 << 20, w % sc.cores, T0, wstate in ("Z", "X"))
                )
                wkey = (w, dump_t)
                if wkey not in dumps:
                    wf = spec.worker_frames(dump_t, w)
                    wp = spec.worker_progress(dump_t, w) if spec.worker_progress else None
                    dumps[wkey] = stacks_of(w, wf, T0 + dump_t, progress=wp) if wf is not None else None
                if dumps[wkey] is not None:
                    stacks[w] = dumps[wkey]
            ranks.append(
                Rank(
                    proc=ProcInfo(
                        spec.pid, 100, "python", ("python", "train.py", "--lr", "0.1"), "X" if spec.exited(t) else "R",
                        None if spec.exited(t) else spec.cpu(t), 2 << 30, spec.pid % sc.cores, T0, spec.exited(t),
                    ),
                    rank=spec.rank,
                    local_rank=spec.rank,
                    world_size=len(sc.ranks),
                    gpus=spec.gpus,
                    workers=tuple(workers),
                    main_thread_state=state,
                )
            )
        job = (
            JobTree(root_pid=100, launcher=ProcInfo(100, 1, "torchrun", ("torchrun", "--nproc_per_node=8", "train.py")), ranks=tuple(ranks), warnings=sc.warnings, stacks=stacks)
            if sc.attach and sc.ranks
            else None
        )
        gpus: tuple[GpuSample, ...] = ()
        if not sc.gpu_error:
            out = []
            for g in range(sc.gpu_count):
                if sc.processes is not None:
                    pids = list(sc.processes(g, t))
                else:
                    pids = [r.pid for r in sc.ranks if g in r.gpus]
                out.append(_gpu(g, t, sc, pids))
            gpus = tuple(out)
        host = HostSample(
            cpu_percent=tuple(sc.host_cpu(c, t) for c in range(sc.cores)),
            memory_total=64 * GIB,
            memory_used=20 * GIB,
            memory_available=44 * GIB,
        )
        hist.append(Snapshot(timestamp=ts, host=host, gpus=gpus, job=job))
    return hist


def eight_ranks(**kw) -> list[RankSpec]:
    """8 ranks, rank i on GPU i, PIDs 1000+i; keyword callables apply to every rank."""
    return [RankSpec(pid=1000 + i, rank=i, gpus=(i,), **kw) for i in range(8)]


def cycle(pattern: Sequence[str], step: float = 2.0) -> Callable[[float], str]:
    """A state function cycling through `pattern`, one entry per `step` seconds (one per dump)."""
    return lambda t: pattern[int(round(t / step)) % len(pattern)]


def saw_tooth(period: float, busy: float, high: float = 95.0, low: float = 5.0, phase: float = 0.0) -> Callable[[int, float], float]:
    return lambda g, t: high if ((t + phase * g) % period) < busy else low

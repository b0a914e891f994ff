"""Snapshots and histories built by hand: no processes, no GPU.

Two families live here:
- `Scenario` / `build()`: a `History` for the diagnosis, the report and the recorder. Each profile
  (starved, saw-tooth, hang, single-GPU, straggler, CPU-bound, infrastructure faults, healthy) is a few
  lambdas over time. Stacks are "dumped" every `stack_interval` seconds like the real collector: the
  snapshots between two dumps share the same `ProcessStacks` object.
- `make_machine` / `make_snapshots` / `ScriptedSource`: deterministic screens for the TUI tests, with a
  fixed clock. `ScriptedSource.poll()` hands out its snapshots in order, then blocks like a hung driver
  call until `close()`: once the script is consumed the screen no longer changes, so snapshot tests see
  exactly one picture.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

from gputop.analysis.stack_classes import (
    COLLECTIVE,
    EXPLICIT_SYNC,
    FORWARD_BACKWARD,
    IDLE_OTHER,
    IN_DATASET,
    OPTIMIZER_STEP,
    WAITING_FOR_DATA,
)
from gputop.collect.job_tree import job_cores
from gputop.errors import GputopError
from gputop.history import History
from gputop.model import (
    EccCounts,
    Finding,
    Frame,
    GpuProcess,
    GpuSample,
    HostSample,
    JobTree,
    MachineInfo,
    Misplacement,
    NicInfo,
    NvLinkLink,
    PcieLink,
    ProcessProgress,
    ProcessStacks,
    ProcInfo,
    Rank,
    RemappedRows,
    Snapshot,
    StateSamples,
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


def progress_of(
    pid: int, t: float, *, switches_per_s: float = 0.0, cpu_share: float = 0.0, io_per_s: float = 0.0
) -> ProcessProgress:
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
    # dense samples (py-spy record): the runs of the stretch ending at t, one stretch every DENSE_EVERY_S
    dense: Optional[Callable[[float], Sequence[tuple[str, int]]]] = None
    loop_at: Optional[float] = None  # the first training step's t: before it the rank is starting up
    # its /proc state letter and tracer at t ("T", None: stopped by a signal); None: "R", or "X" once exited
    proc_state: Optional[Callable[[float], tuple[str, Optional[str]]]] = None


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
    misplacements: tuple[Misplacement, ...] = ()
    cpu_limit: Optional[float] = None  # the job's cgroup cores (JobTree.cpu_limit)
    memory_limit: Optional[int] = None  # bytes (JobTree.memory_limit)
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


DENSE_EVERY_S = 5.0


def _dense_stretches(sc: Scenario, t: float) -> tuple[StateSamples, ...]:
    if t <= 0 or t % DENSE_EVERY_S:
        return ()
    out = []
    for spec in sc.ranks:
        if spec.dense is None:
            continue
        runs = tuple(spec.dense(t))
        total = sum(n for _, n in runs)
        rate = total / DENSE_EVERY_S
        out.append(StateSamples(spec.pid, T0 + t - DENSE_EVERY_S, T0 + t, rate, runs=runs))
    return tuple(out)


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
                dumps[key] = stacks_of(
                    spec.pid, frames, T0 + dump_t, active=state not in (WAITING_FOR_DATA, COLLECTIVE), progress=progress
                )
            stacks[spec.pid] = dumps[key]
            workers = []
            for w in spec.workers(t):
                wstate = spec.worker_state(t, w)
                workers.append(
                    ProcInfo(
                        w,
                        spec.pid,
                        "pt_data_worker",
                        ("python", "train.py"),
                        wstate,
                        spec.worker_cpu(t, w),
                        200 << 20,
                        w % sc.cores,
                        T0,
                        wstate in ("Z", "X"),
                    )
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
                        spec.pid,
                        100,
                        "python",
                        ("python", "train.py", "--lr", "0.1"),
                        "X" if spec.exited(t) else spec.proc_state(t)[0] if spec.proc_state else "R",
                        None if spec.exited(t) else spec.cpu(t),
                        2 << 30,
                        spec.pid % sc.cores,
                        T0,
                        spec.exited(t),
                        tracer=spec.proc_state(t)[1] if spec.proc_state else None,
                    ),
                    rank=spec.rank,
                    local_rank=spec.rank,
                    world_size=len(sc.ranks),
                    gpus=spec.gpus,
                    workers=tuple(workers),
                    main_thread_state=state,
                    starting_up=spec.loop_at is not None and t < spec.loop_at,
                    loop_started=T0 + spec.loop_at if spec.loop_at is not None and t >= spec.loop_at else None,
                )
            )
        job = (
            JobTree(
                root_pid=100,
                launcher=ProcInfo(100, 1, "torchrun", ("torchrun", "--nproc_per_node=8", "train.py")),
                ranks=tuple(ranks),
                warnings=sc.warnings,
                stacks=stacks,
                misplacements=sc.misplacements,
                cpu_limit=sc.cpu_limit,
                memory_limit=sc.memory_limit,
                state_samples=_dense_stretches(sc, t),
            )
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


def saw_tooth(
    period: float, busy: float, high: float = 95.0, low: float = 5.0, phase: float = 0.0
) -> Callable[[int, float], float]:
    return lambda g, t: high if ((t + phase * g) % period) < busy else low


def record(path, machine_info: MachineInfo, snaps: Sequence[Snapshot]):
    """Write `snaps` as a recording file at `path` (what `gputop record` writes) and return the path."""
    from gputop.recording import RecordingWriter

    with RecordingWriter(str(path), machine_info) as writer:
        for snap in snaps:
            writer.write(snap)
    return path


def simulated_history(spec: str, seconds: int = 60) -> History:
    """Poll a simulated machine once per (fake) second: the real pynvml wrappers over the fake library."""
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Pipeline
    from gputop.sim.fake_nvml import ManualClock

    clock = ManualClock(1_700_000_000.0)
    with Pipeline(SimulatedMachine(spec, clock=clock)) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0  # the fake's 20 ms PCIe sampling sleep is not under test
        hist = History(pipeline.machine, capacity=seconds + 1)
        for _ in range(seconds + 1):
            hist.append(pipeline.poll())
            clock.now += 1.0
    return hist


# ---------------------------------------------------------------- deterministic screens for the TUI tests

SCREEN_T0 = 1_700_000_000.0  # the TUI scripts' clock (T0 above is the diagnosis histories')
H100 = "NVIDIA H100 80GB HBM3"


def make_machine(gpus: int = 8, cores: int = 128, simulated: Optional[str] = "h100-sxm-8") -> MachineInfo:
    matrix = tuple(tuple("X" if i == j else "NV18" for j in range(gpus)) for i in range(gpus))
    half = cores // 2
    affinity = tuple(f"0-{half - 1}" if i < gpus // 2 else f"{half}-{cores - 1}" for i in range(gpus))
    numa = tuple(0 if i < gpus // 2 else 1 for i in range(gpus))
    # a rail NIC per GPU on the GPU's PCIe switch, as on a DGX H100 (and the simulated h100-sxm-8)
    nics = tuple(
        NicInfo(f"mlx5_{i}", numa[i], f"0000:{0x19 + i * 0x10:02x}:00.0", rdma=True, netdev=f"ibp{0x19 + i * 0x10}s0")
        for i in range(gpus)
    )

    def link(a: int, b: int, same: str) -> str:
        return same if a == b else "NODE" if numa[a] == numa[b] else "SYS"

    nic_matrix = tuple(
        tuple(link(k, j, "PIX") for j in range(gpus)) + tuple(link(k, m, "X") for m in range(gpus)) for k in range(gpus)
    )
    return MachineInfo(
        hostname="dgx-test-01",
        cpu_model="AMD EPYC 7742 64-Core Processor",
        cpu_count=cores,
        driver_version="550.54.15",
        cuda_version="12.4",
        nvml_version="12.550.54.15",
        gpu_count=gpus,
        gpu_names=(H100,) * gpus,
        topology=Topology(matrix=matrix, cpu_affinity=affinity, numa_node=numa, nics=nics, nic_matrix=nic_matrix),
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
            NvLinkLink(
                link=k, active=True, remote_kind="switch", tx_bytes_per_s=2.5e9 * util / 100, rx_bytes_per_s=2.5e9 * util / 100
            )
            for k in range(18)
        ),
        throttle_reasons=throttles,
        ecc=EccCounts(
            volatile_corrected=0,
            volatile_uncorrected=2 if index == 5 else 0,
            aggregate_corrected=0,
            aggregate_uncorrected=2 if index == 5 else 0,
        ),
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
    return tuple(Frame(name=name, filename=path, line=line) for name, path, line in reversed(items))


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
    launcher = ProcInfo(
        pid=1000,
        ppid=1,
        name="torchrun",
        cmdline=("/usr/bin/python", "-m", "torch.distributed.run", "--nproc-per-node", "8", "train.py"),
        state="S",
        cpu_percent=0.3,
        rss=210 * 1024**2,
        core=3,
    )
    rank_list = []
    stacks: dict[int, ProcessStacks] = {}
    for r in range(ranks):
        pid = 1001 + r
        worker_procs = tuple(
            ProcInfo(
                pid=2000 + r * 10 + w,
                ppid=pid,
                name="pt_data_worker",
                state="R",
                cpu_percent=99.0 - w,
                rss=900 * 1024**2,
                core=10 + r * 4 + w,
                exited=(2000 + r * 10 + w) in exited_pids,
            )
            for w in range(workers)
        )
        proc = ProcInfo(
            pid=pid,
            ppid=1000,
            name="python",
            cmdline=("python", "train.py"),
            state="S",
            cpu_percent=42.0 + r,
            rss=int(5.5 * GIB),
            core=8 + r * 4,
            exited=pid in exited_pids,
        )
        rank_list.append(
            Rank(
                proc=proc,
                rank=r,
                local_rank=r,
                world_size=ranks,
                gpus=(r,) if r != 6 else (),
                workers=worker_procs,
                main_thread_state="waiting for data" if r != 6 else "collective/barrier",
            )
        )
        stacks[pid] = ProcessStacks(
            pid=pid,
            timestamp=SCREEN_T0 + tick - 1,
            threads=(
                ThreadStack(
                    thread_id=1, thread_name="MainThread", os_thread_id=pid, active=False, owns_gil=False, frames=WAITING_STACK
                ),
                ThreadStack(
                    thread_id=2,
                    thread_name="pt_data_pin",
                    os_thread_id=pid + 1,
                    active=False,
                    owns_gil=False,
                    frames=_frames(("_pin_memory_loop", "/usr/lib/python3/torch/utils/data/_utils/pin_memory.py", 53)),
                ),
            ),
        )
        for worker in worker_procs:
            stacks[worker.pid] = ProcessStacks(
                pid=worker.pid,
                timestamp=SCREEN_T0 + tick - 1,
                threads=(
                    ThreadStack(
                        thread_id=1,
                        thread_name="MainThread",
                        os_thread_id=worker.pid,
                        active=True,
                        owns_gil=True,
                        frames=WORKER_STACK,
                    ),
                ),
            )
    return JobTree(
        root_pid=1000,
        launcher=launcher,
        ranks=tuple(rank_list),
        stacks=stacks,
        cores=job_cores(launcher, rank_list),  # as the collector fills it
        warnings=("rank 6 holds no GPU memory (CUDA_VISIBLE_DEVICES='')",),
    )


def job_core_ids(job: JobTree) -> list[int]:
    return [p.core for r in job.ranks for p in (r.proc, *r.workers) if p.core is not None]


def make_snapshots(
    count: int = 90,
    *,
    gpus: int = 8,
    cores: int = 128,
    lose_gpu: Optional[tuple[int, int]] = None,  # (gpu index, from tick)
    with_job: bool = False,
    workers: int = 2,  # DataLoader workers per rank (the tuned demo runs 3)
) -> list[Snapshot]:
    snaps = []
    for tick in range(count):
        job = make_job(tick, workers=workers) if with_job else None
        lost = lose_gpu is not None and tick >= lose_gpu[1]
        gpu_samples = tuple(make_gpu(i, tick, lost=lost and i == lose_gpu[0]) for i in range(gpus))
        host = make_host(tick, cores, job_core_ids(job) if job else ())
        snaps.append(Snapshot(timestamp=SCREEN_T0 + tick, host=host, gpus=gpu_samples, job=job, simulated=True))
    return snaps


class ScriptedSource:
    """A source (Source and Attachable, see gputop/source.py) that returns a fixed list of snapshots, then
    blocks until closed."""

    def __init__(self, machine: MachineInfo, snapshots: Sequence[Snapshot]) -> None:
        self.machine = machine
        self._snapshots = list(snapshots)
        self.polls = 0
        self.closed = threading.Event()
        self.attached: list[int] = []
        self.stacks_wanted: Optional[bool] = None  # what the app last asked for (want_stacks)

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

    def want_stacks(self, wanted: bool) -> None:
        self.stacks_wanted = wanted

    def close(self) -> None:
        self.closed.set()


def fixed_diagnose(history, bench, trace=None, check=None):
    """Stands in for diagnosis in screen tests, so pictures do not change when diagnosis rules do; the trace's and
    the check's findings join it as they join the real diagnosis in `findings()`."""
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
    if (trace is not None and trace.findings) or check is not None:
        from gputop.analysis.diagnosis import verdict_line
        from gputop.analysis.findings import with_extra_findings

        joined = with_extra_findings(findings, trace, check)
        return joined, verdict_line(joined, count_more=False)
    return findings, "Input-bound: rank 0 waits for data 62% of the time → DataLoader(num_workers=12, …)"

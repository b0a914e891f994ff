"""The demo's scenarios: which DataLoader settings reproduce which idle-GPU profile.

Every scenario runs the same training job over the same dataset (in-memory JPEGs,
decoded and resized with Pillow); only the loader settings and one deliberate bug
differ, so `gputop demo --scenario starved --workers 3` turns the starved job into
the tuned one and the utilization line rises.

The arithmetic that sizes the job (see `resolve`):

* A simulated GPU step takes ``step_ms`` (default 200 ms).  Preparing one batch
  costs ``PREP_TO_STEP`` (2x) the step, so with ``num_workers=0`` the GPU is busy
  about 1/3 of the time: continuous starvation.
* Workers needed = prep time per batch / step time = 2; the tuned scenario takes
  ``WORKER_MARGIN`` (1.5x) on top: 3 workers, prefetch 4, pinned memory, persistent.
* Per-sample preparation is real Pillow work (decode a JPEG, crop, resize) plus,
  where the machine has too few cores for the decoding alone, simulated storage
  latency (the JPEG bytes arrive from a slow network filesystem while Pillow reads
  them).  The whole job (its ranks' own loops and their loaders) may use
  ``JOB_CPU_SHARE`` (30%) of the cores when every rank runs flat out, so 8 ranks
  on a 2-core box stay responsive: the JPEGs are small and storage latency makes
  up the rest of the cost.  On a box with many cores the JPEGs grow (up to 512 px)
  and the latency shrinks toward 0.  Where even the smallest JPEGs would not fit,
  the batch shrinks (16 down to 2 samples; a batch still costs 2 steps to prepare).
* The CPU costs below were measured on one box; `cpu_speed.cpu_slowness` scales
  them to this one, so the tuned job is tuned on a slow shared VM too (there the
  unscaled job needed more than its 2 cores and really was input-bound).

The last three scenarios use the simulated NCCL backend (`gputop.sim.distributed`) and a
`loss.item()` every step: `nccl-hang` (the misfire's stuck worker, but the other GPUs spin
in the all-reduce), `eval-rank0` (rank 0 evaluates every 40 steps while the others wait in
a barrier: healthy) and `sync-bound` (160 ms of host work before each step's launches, and
the sync makes host and GPU take turns: 200 / (160 + 200) = ~55% busy; without the sync the
host's work would overlap the GPU's previous step).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import MISSING, dataclass, fields, replace
from typing import Optional, TypedDict

from gputop.errors import UsageError
from gputop.sim.cpu_speed import cpu_slowness

DEFAULT_RANKS = 8
# The simulated machine the demo's jobs run on. Its 8 GPUs bound --gpus; with fewer ranks the others sit idle.
DEMO_PROFILE = "h100-sxm-8"
MAX_RANKS = 8  # the simulated machine (h100-sxm-8) has 8 GPUs
MAX_WORKERS = 32
DEFAULT_STEP_MS = 200.0  # a ResNet-50-sized step on an H100
DEFAULT_BATCH = 16
BATCH_CHOICES = (16, 8, 4, 2)  # the default batch, then smaller ones where the cores cannot take it
PREP_TO_STEP = 2.0  # preparing a batch costs twice the GPU step: "heavy decoding"
WORKER_MARGIN = 1.5  # tuned workers = needed x margin, so jitter does not starve the GPU
JOB_CPU_SHARE = 0.3  # share of the cores the whole job may burn with every GPU at 100%
MODEL_SIDE = 32  # the network sees 32x32 crops

# CPU in a DataLoader worker, fitted by benchmarks/bench_demo_costs.py from the tuned job (4 ranks) on the 2-core
# dev VM (Pillow 11, libjpeg-turbo, torch 2.13) at 96 and 224-288 px, batches of 4 and 16: a batch's collation
# and hand-over to the rank, then per sample the storage read and tensor conversion, and the decode + crop +
# resize, which grows with the pixels (224 px: 1.5 ms a sample in all; the Pillow decode alone is under half).
BATCH_CPU_MS = 1.0
SAMPLE_CPU_MS = 1.06
SAMPLE_NS_PER_PIXEL = 9.0
RANK_STEP_CPU_MS = 6.7  # a rank's own CPU per step (its loop, the gloo all-reduce, pinning), same box
MIN_IMAGE_SIDE = 96
MAX_IMAGE_SIDE = 512

MEMORY_PER_RANK = int(9.5 * 1024**3)  # ResNet-50 with AMP at batch 256: ~9.5 GiB; 8 of them fit one H100
RANK0_EXTRA_MEMORY = 384 * 1024**2  # rank 0 keeps a little more (logging, eval buffers)

LONG_EPOCH_BATCHES = 10_000  # "no epoch boundary in sight"
EVAL_BATCHES = 10  # rank 0's evaluation: 10 batches of 4x the training batch, ~2.7 s of GPU time at 200 ms steps
EVAL_BATCH_FACTOR = 4


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str  # one line: what the user should see
    num_workers: Optional[int]  # None: the tuned count from the arithmetic
    prefetch_factor: Optional[int]  # None: torch's default (2) with workers
    pin_memory: bool
    persistent_workers: bool
    batches_per_epoch: int
    hang: bool = False  # one rank's worker blocks forever on one sample
    ranks_on_gpu0: bool = False  # the launcher does not bind ranks to GPUs and the script uses `cuda`
    # "gloo": gradients averaged by a blocking gloo all_reduce on the host (the GPU idles while a rank
    # waits for its peers); "nccl": collectives are GPU kernels that spin while a peer is missing
    backend: str = "gloo"
    sync_every_step: bool = False  # `running_loss += loss.item()` in the loop: a host-device sync per step
    host_share: float = 0.0  # the host's own time per step (Python, launches), as a share of the GPU step
    eval_every: Optional[int] = None  # rank 0 evaluates every N steps; the others wait in a barrier
    precision: str = "fp32"  # "bf16": the forward under bf16 autocast (AMP), so the kernels use the tensor cores
    # the ranks run with PyTorch's flight recorder on (TORCH_FR_BUFFER_SIZE), recording their real gloo collectives
    flight_recorder: bool = False


class _LoaderSettings(TypedDict):
    """A `Scenario`'s DataLoader fields, shared by the scenarios that differ elsewhere."""

    num_workers: Optional[int]
    prefetch_factor: Optional[int]
    pin_memory: bool
    persistent_workers: bool
    batches_per_epoch: int


# enough workers (the arithmetic's count), prefetch, pinned memory, persistent workers, no epoch end in sight
_TUNED_LOADER: _LoaderSettings = dict(
    num_workers=None, prefetch_factor=4, pin_memory=True, persistent_workers=True, batches_per_epoch=LONG_EPOCH_BATCHES
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "starved",
            "num_workers=0: each rank decodes its own JPEGs between steps; GPUs ~1/3 busy",
            num_workers=0,
            prefetch_factor=None,
            pin_memory=False,
            persistent_workers=False,
            batches_per_epoch=LONG_EPOCH_BATCHES,
        ),
        Scenario(
            "hiccup",
            "enough workers on average, but short epochs restart them (no persistent_workers): saw-tooth",
            num_workers=None,
            prefetch_factor=None,
            pin_memory=False,
            persistent_workers=False,
            batches_per_epoch=20,
        ),
        Scenario(
            "misfire",
            "a tuned job until one rank's DataLoader worker blocks forever on a storage read: memory held, 0% util",
            **_TUNED_LOADER,
            hang=True,
        ),
        Scenario(
            "single-gpu",
            "every rank lands on GPU 0 (no per-rank device): one card busy, the others idle",
            **_TUNED_LOADER,
            ranks_on_gpu0=True,
        ),
        Scenario(
            "tuned",
            "enough workers, prefetch, pinned memory, persistent workers: GPUs busy",
            **_TUNED_LOADER,
        ),
        Scenario(
            "tuned-amp",
            "the tuned job under bf16 autocast (AMP): GPUs busy on the tensor cores",
            **_TUNED_LOADER,
            precision="bf16",
        ),
        Scenario(
            "nccl-hang",
            "NCCL: one rank's DataLoader worker hangs; the other GPUs spin in the all-reduce at ~100% and low "
            "power while their hosts wait at loss.item()",
            **_TUNED_LOADER,
            hang=True,
            backend="nccl",
            sync_every_step=True,
            flight_recorder=True,
        ),
        Scenario(
            "eval-rank0",
            "NCCL: rank 0 evaluates every 40 steps while the others wait in a barrier (GPUs spinning): healthy",
            **_TUNED_LOADER,
            backend="nccl",
            sync_every_step=True,
            eval_every=40,
        ),
        Scenario(
            "sync-bound",
            "NCCL: loss.item() every step makes host and GPU take turns: GPUs ~55% busy with data to spare",
            **_TUNED_LOADER,
            backend="nccl",
            sync_every_step=True,
            host_share=0.8,
        ),
    )
}
DEFAULT_SCENARIO = "starved"


_FIELD_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "Optional[int]": int, "Optional[str]": str}


@dataclass(frozen=True)
class DemoConfig:
    """Everything a rank needs, fully resolved; it travels to the ranks as command-line flags."""

    scenario: str
    ranks: int
    batch_size: int
    step_ms: float
    num_workers: int
    prefetch_factor: Optional[int]
    pin_memory: bool
    persistent_workers: bool
    batches_per_epoch: int
    image_side: int  # px of the stored JPEGs
    storage_ms: float  # simulated storage latency per (average-sized) sample
    worker_init_ms: float  # a worker opens the shard index when it starts (every epoch without persistence)
    hang_rank: Optional[int]  # the misfire rank
    hang_after_batches: int
    ranks_on_gpu0: bool
    backend: str = "gloo"
    sync_every_step: bool = False
    host_ms: float = 0.0  # the host's own time per step (Python dispatch, kernel launches)
    eval_every: Optional[int] = None
    eval_batches: int = EVAL_BATCHES
    collective_timeout_s: float = 600.0  # the NCCL watchdog: PyTorch's default of 10 minutes
    seed: int = 0
    max_steps: Optional[int] = None
    loss_log: Optional[str] = None
    precision: str = "fp32"  # "bf16": AMP (bf16 autocast) in the forward
    augment_ms: float = 0.0  # CPU per sample after the decode (heavier augmentations; the case study's stage 2)
    cached: bool = False  # the samples preprocessed once and kept in memory as tensors (no storage, no decode)
    kernels: str = "gemm"  # "unfused": many small eager fp32 kernels that stream DRAM (the case study's model)
    cpu_slowness: float = 1.0  # this box's time for the same CPU work against the box the costs were measured on
    flight_recorder: bool = False  # TORCH_FR_BUFFER_SIZE in the ranks' environment

    @property
    def sample_cpu_ms(self) -> float:
        """A worker's CPU per sample on this box, its share of the batch's included."""
        return worker_ms_per_sample(self.image_side, self.batch_size, self.cpu_slowness)

    @property
    def prep_ms_per_batch(self) -> float:
        if self.cached:
            return 0.0  # preprocessed once, kept in memory
        return self.batch_size * (self.sample_cpu_ms + self.storage_ms + self.augment_ms)

    @property
    def workers_needed(self) -> float:
        """The benchmark's rule: workers needed = prep time per batch / step time."""
        return self.prep_ms_per_batch / self.step_ms

    def to_argv(self) -> list[str]:
        """Flags for `python -m gputop.sim.demo_job` (readable in `ps`, like a real train.py's)."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    argv.append(flag)
            elif value is not None:
                argv += [flag, str(value)]
        return argv

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """The flags `to_argv` writes, for the rank's parser."""
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            kind = _FIELD_TYPES[str(f.type)]
            if kind is bool:
                parser.add_argument(flag, action="store_true")
            else:
                optional = "Optional" in str(f.type)
                required = f.default is MISSING and not optional
                default = f.default if f.default is not MISSING else None
                parser.add_argument(flag, type=kind, required=required, default=default)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> "DemoConfig":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def describe(self) -> str:
        loader = f"num_workers={self.num_workers}"
        if self.num_workers:
            loader += f", prefetch_factor={self.prefetch_factor or 2}"
            loader += f", pin_memory={self.pin_memory}, persistent_workers={self.persistent_workers}"
        return (
            f"{self.ranks} ranks ({self.backend}), batch {self.batch_size}, step {self.step_ms:g} ms, {loader}; "
            f"prep {self.prep_ms_per_batch:.0f} ms/batch -> {self.workers_needed:.1f} workers needed per rank"
        )


def worker_ms_per_sample(side: int, batch: int, slowness: float = 1.0) -> float:
    """A worker's CPU per sample for `side` x `side` JPEGs in batches of `batch`, its share of the batch's
    included, on a box `slowness` times slower than the reference (the constants above)."""
    return slowness * (BATCH_CPU_MS / batch + SAMPLE_CPU_MS + SAMPLE_NS_PER_PIXEL * side * side / 1e6)


def loader_shape_for(cpu_count: int, ranks: int, slowness: float = 1.0) -> tuple[int, int]:
    """(batch, JPEG side): the largest batch, then the largest JPEG, that keep the whole job within
    JOB_CPU_SHARE of the cores at full speed, on a box `slowness` times slower than the reference."""
    step_cpu_ms = JOB_CPU_SHARE * cpu_count / ranks * DEFAULT_STEP_MS  # CPU a rank may use per step
    data_ms = step_cpu_ms - slowness * RANK_STEP_CPU_MS  # what its loop leaves to its loader
    # a batch's CPU is at most its whole preparation time (the rest is storage latency)
    data_ms = min(data_ms, PREP_TO_STEP * DEFAULT_STEP_MS)
    for size in BATCH_CHOICES:
        if size * worker_ms_per_sample(MIN_IMAGE_SIDE, size, slowness) <= data_ms or size == BATCH_CHOICES[-1]:
            # what a sample may spend on its pixels, beyond the costs that do not grow with them
            pixel_ms = max(0.0, data_ms / size - worker_ms_per_sample(0, size, slowness))
            side = math.sqrt(pixel_ms / (slowness * SAMPLE_NS_PER_PIXEL / 1e6))
            return size, max(MIN_IMAGE_SIDE, min(MAX_IMAGE_SIDE, int(side // 32 * 32)))
    raise AssertionError("unreachable: the last choice always returns")


def _check_range(flag: str, value: Optional[float], low: float, high: float, what: str) -> None:
    if value is not None and not low <= value <= high:
        raise UsageError(f"{flag} {value:g} is out of range: {what}")


def _check_overrides(
    scenario: str,
    workers: Optional[int],
    batch_size: Optional[int],
    step_ms: Optional[float],
    gpus: Optional[int],
    max_steps: Optional[int],
    collective_timeout_s: float,
) -> None:
    """A UsageError with one line for an unknown scenario or an override out of range."""
    if scenario not in SCENARIOS:
        raise UsageError(f"unknown demo scenario {scenario!r} (choose one of: {', '.join(SCENARIOS)})")
    _check_range("--gpus", gpus, 1, MAX_RANKS, f"the simulated machine has 1 to {MAX_RANKS} GPUs")
    _check_range("--workers", workers, 0, MAX_WORKERS, f"use 0 to {MAX_WORKERS} DataLoader workers per rank")
    _check_range("--batch-size", batch_size, 1, 1024, "use 1 to 1024 samples per batch")
    _check_range("--step-ms", step_ms, 1, 60_000, "use 1 ms to 60 s of simulated GPU time per step")
    _check_range("--nccl-timeout", collective_timeout_s, 1, 86_400, "use 1 s to 1 day for the NCCL watchdog")
    if max_steps is not None and max_steps < 1:
        raise UsageError(f"max steps must be at least 1 (got {max_steps})")


def _num_workers(spec: Scenario, workers: Optional[int], config: DemoConfig) -> int:
    """--workers, else the scenario's own count, else what the loader needs on this machine with a margin."""
    if workers is not None:
        return workers
    if spec.num_workers is not None:
        return spec.num_workers
    # rounded first: storage_ms kept to the microsecond puts the need a hair over 2.0 on some boxes (2 cores,
    # 4 ranks), and 3.00005 would ceil to 4 workers where the arithmetic says 3
    return min(MAX_WORKERS, max(1, math.ceil(round(config.workers_needed * WORKER_MARGIN, 3))))


def _loader_costs(cpus: int, ranks: int, slowness: float) -> tuple[int, int, float]:
    """(batch size, image side, simulated storage ms a sample) for this machine.  The dataset's cost is fixed by
    the defaults; --batch-size and --step-ms change the ratio, as they would."""
    base_batch, side = loader_shape_for(cpus, ranks, slowness)
    sample_ms = PREP_TO_STEP * DEFAULT_STEP_MS / base_batch
    return base_batch, side, max(0.0, sample_ms - worker_ms_per_sample(side, base_batch, slowness))


def resolve(
    scenario: str = DEFAULT_SCENARIO,
    *,
    workers: Optional[int] = None,
    batch_size: Optional[int] = None,
    step_ms: Optional[float] = None,
    gpus: Optional[int] = None,
    cpu_count: Optional[int] = None,
    seed: int = 0,
    max_steps: Optional[int] = None,
    loss_log: Optional[str] = None,
    collective_timeout_s: float = 600.0,
    slowness: Optional[float] = None,
) -> DemoConfig:
    """The scenario's settings with the user's overrides, sized for this machine's cores and their speed
    (`slowness`: against the box the costs were measured on; None: measured here now)."""
    _check_overrides(scenario, workers, batch_size, step_ms, gpus, max_steps, collective_timeout_s)
    spec = SCENARIOS[scenario]
    ranks = gpus or DEFAULT_RANKS
    cpus = cpu_count or os.cpu_count() or 1
    slowness = cpu_slowness() if slowness is None else slowness
    base_batch, side, storage_ms = _loader_costs(cpus, ranks, slowness)
    config = DemoConfig(
        scenario=scenario,
        ranks=ranks,
        batch_size=batch_size or base_batch,
        step_ms=float(step_ms or DEFAULT_STEP_MS),
        num_workers=0,
        prefetch_factor=None,
        pin_memory=spec.pin_memory,
        persistent_workers=spec.persistent_workers,
        batches_per_epoch=spec.batches_per_epoch,
        image_side=side,
        storage_ms=round(storage_ms, 3),
        worker_init_ms=500.0,
        hang_rank=ranks // 2 if spec.hang else None,
        hang_after_batches=25,
        ranks_on_gpu0=spec.ranks_on_gpu0,
        backend=spec.backend,
        sync_every_step=spec.sync_every_step,
        host_ms=round(spec.host_share * float(step_ms or DEFAULT_STEP_MS), 3),
        eval_every=spec.eval_every,
        precision=spec.precision,
        flight_recorder=spec.flight_recorder,
        collective_timeout_s=collective_timeout_s,
        seed=seed,
        max_steps=max_steps,
        loss_log=loss_log,
        cpu_slowness=slowness,
    )
    num_workers = _num_workers(spec, workers, config)
    return replace(
        config,
        num_workers=num_workers,
        prefetch_factor=spec.prefetch_factor if num_workers else None,
        pin_memory=spec.pin_memory,
        persistent_workers=spec.persistent_workers and num_workers > 0,
    )

"""The demo's training job: one rank of a real PyTorch data-parallel training run on simulated GPUs.

`gputop.sim.demo_launcher` starts one of these per rank, the way torchrun does (RANK,
LOCAL_RANK, WORLD_SIZE and CUDA_VISIBLE_DEVICES in the environment).  Everything is real
except the GPU:

* **Data.**  A map-style `Dataset` over JPEGs generated in memory at start (fixed seed).
  `__getitem__` decodes one with Pillow, crops, flips and resizes it to 32x32: real CPU
  work.  The JPEG bytes reach Pillow through a pipe, delivered after a simulated
  network-storage latency (`SimulatedStorage`), so the reader blocks in a C read()
  inside Pillow's `Image.open`, as on a real NFS mount.  On a machine with few cores the
  sample cost is mostly that latency, so 8 ranks stay within the cores (see
  `gputop.sim.scenarios`); with many cores it is mostly decoding.  A real
  `DataLoader` with the scenario's settings feeds the rank; its workers open a "shard
  index" when they start (500 ms), which is what makes non-persistent workers hiccup at
  every epoch.
* **Model.**  A tiny CNN runs its forward and backward on the CPU (about a millisecond), "on the
  GPU" of `gputop.sim.cuda`: `SimulatedKernels`, an autograd function in its middle, *launches* the
  step's simulated GPU time on the rank's stream (1/3 in forward, 2/3 in backward) and returns at
  once; a device thread runs the stream and marks the rank's slot on the busy board busy meanwhile.
  The model's output is a `DeviceTensor`, so `loss.item()` is a sync that waits for the stream, as
  with CUDA.  The fake NVML turns busy time into utilization, so a rank that waits for data shows an
  idle GPU.  Ranks that land on the same GPU take turns (a file lock per GPU), as kernels of several
  processes share one card: each gets a fraction of it.
* **Distributed.**  `gputop.sim.distributed` over torch.distributed's gloo (rendezvous through a file,
  sockets on loopback), in DDP's shape: backward's hooks all-reduce the gradients.  With `--backend
  gloo` that all-reduce blocks on the host inside `loss.backward()`, after the GPU's backward kernels
  (gloo reads host memory): a rank waiting for the others leaves its GPU idle.  Measured on the 2-core
  box with 8 ranks: rendezvous 0.1-0.9 s, an all_reduce of this model's gradients ~20 ms (mostly
  waiting for the other ranks to be scheduled), ~4 ms of CPU per rank and step, so at 5 steps/s the
  collectives of all 8 ranks cost ~15% of one core.  It buys the real coupling of DDP: a rank that
  stalls holds up the others, which wait in `all_reduce` (the misfire scenario's hang spreads exactly
  like a real one).  With `--backend nccl` the all-reduce is a kernel: the host goes on to
  `loss.item()`, and the GPU spins at low power until every rank's kernel arrived.
* **Determinism.**  Given `--seed`, the batches and losses do not depend on timing: images,
  augmentation (seeded per sample index), sampler order (`DistributedSampler` with
  `set_epoch`), model init, and the DataLoader's generator are all seeded, and nothing
  draws from the global RNG after the model is built.  `--loss-log PATH` writes
  `epoch step loss` lines (loss as repr, bit-exact): rank 0 only, or every rank when PATH
  contains `{rank}`.  `--max-steps N` ends the run after N steps.

Run it standalone for one rank: `python -m gputop.sim.demo_job --board B --counters C
--rendezvous R --scenario tuned ...` (see `DemoConfig`); normally `DemoJob` does all this.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import io
import os
import random
import signal
import sys
import threading
import time
import warnings
from typing import Any, BinaryIO, Optional, TextIO, Union

import torch
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from gputop.sim import cuda, distributed
from gputop.sim.busy_board import BusyBoard
from gputop.sim.demo_launcher import StepCounters, die_with_parent, set_parent_death_signal
from gputop.sim.kernels import BF16_GEMM, FP32_GEMM, FP32_UNFUSED, KernelMix
from gputop.sim.scenarios import (
    EVAL_BATCH_FACTOR,
    MEMORY_PER_RANK,
    MODEL_SIDE,
    RANK0_EXTRA_MEMORY,
    DemoConfig,
    resolve,
)

JPEG_COUNT = 64  # distinct images; samples cycle through them with different crops
CLASSES = 10
FORWARD_SHARE = 1.0 / 3.0  # of the step's GPU time; backward takes the rest


# ----------------------------------------------------------------------------- data


def make_jpegs(count: int, side: int, seed: int) -> tuple[list[bytes], list[int]]:
    """`count` deterministic JPEGs (coloured discs over noise; the colour depends on the class)."""
    blobs, labels = [], []
    for i in range(count):
        rng = random.Random(seed * 1_000_003 + i)
        label = i % CLASSES
        image = Image.new("RGB", (side, side), tuple(rng.randrange(256) for _ in range(3)))
        draw = ImageDraw.Draw(image)
        for _ in range(6):
            x, y, r = rng.randrange(side), rng.randrange(side), rng.randrange(side // 8, side // 3)
            colour = ((label * 25 + rng.randrange(40)) % 256, rng.randrange(256), (255 - label * 25) % 256)
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
        noise = Image.frombytes("L", (side, side), rng.randbytes(side * side)).convert("RGB")
        image = Image.blend(image, noise, 0.15)
        out = io.BytesIO()
        image.save(out, "JPEG", quality=90)
        blobs.append(out.getvalue())
        labels.append(label)
    return blobs, labels


def _wait_for_storage(seconds: float) -> None:
    """Metadata on its way from network storage (simulated latency)."""
    time.sleep(seconds)


class SimulatedStorage:
    """Network storage for the dataset: a file's bytes arrive after its latency, through a pipe.

    The reader blocks inside a plain C read(), as on a real NFS or FUSE mount, so in a stack dump
    the waiting frame is the caller's own (Pillow's `Image.open`), not a sleep of ours.  One
    delivery thread per process serves every pending read (a DataLoader worker gets its own after
    the fork).  A read marked `hang` never gets its bytes: the misfire.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # the parent's thread and lock stay behind

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._pending: list[tuple[float, int, bytes]] = []  # heap of (due, write fd, data)
        self._thread: Optional[threading.Thread] = None
        self._never_answered: list[int] = []  # write ends kept open and never written

    def open(self, data: bytes, delay_s: float, hang: bool = False) -> BinaryIO:
        read_fd, write_fd = os.pipe()
        with self._cond:
            if hang:
                self._never_answered.append(write_fd)
            else:
                heapq.heappush(self._pending, (time.monotonic() + delay_s, write_fd, data))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._deliver_forever, name="storage", daemon=True)
                    self._thread.start()
                self._cond.notify()
        return open(read_fd, "rb")

    def _deliver_forever(self) -> None:
        while True:
            with self._cond:
                while not self._pending or self._pending[0][0] > time.monotonic():
                    self._cond.wait(self._pending[0][0] - time.monotonic() if self._pending else None)
                _due, write_fd, data = heapq.heappop(self._pending)
            with open(write_fd, "wb") as pipe:  # closing it is the reader's end of file
                pipe.write(data)


STORAGE = SimulatedStorage()


class JpegDataset(Dataset[tuple[torch.Tensor, int]]):
    """Map-style: sample i = JPEG (i mod count), decoded, randomly cropped and flipped, resized to 32x32."""

    def __init__(
        self,
        blobs: list[bytes],
        labels: list[int],
        length: int,
        storage_ms: float,
        seed: int,
        hang_index: Optional[int] = None,
        augment_ms: float = 0.0,
    ) -> None:
        self.blobs = blobs
        self.augment_s = augment_ms / 1000.0
        self.labels = labels
        self.length = length
        self.seed = seed
        self.hang_index = hang_index
        mean_size = sum(len(b) for b in blobs) / len(blobs)
        self.seconds_per_byte = storage_ms / 1000.0 / mean_size  # bigger files take longer to arrive

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        which = index % len(self.blobs)
        rng = random.Random(self.seed * 1_000_003 + index)  # per sample, so workers and timing do not matter
        blob = self.blobs[which]
        with STORAGE.open(blob, len(blob) * self.seconds_per_byte, hang=index == self.hang_index) as stream:
            image: Image.Image = Image.open(stream)  # a pipe cannot seek, so Pillow reads every byte here: waits for storage
        with image:
            image = image.convert("RGB")  # decodes
            side = image.width
            crop = int(side * rng.uniform(0.6, 1.0))
            left, top = rng.randrange(side - crop + 1), rng.randrange(side - crop + 1)
            image = image.resize((MODEL_SIDE, MODEL_SIDE), Image.Resampling.BILINEAR, box=(left, top, left + crop, top + crop))
            if rng.random() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        tensor = pixels.view(MODEL_SIDE, MODEL_SIDE, 3).permute(2, 0, 1).float().div_(255.0).sub_(0.5)
        _augment(self.augment_s)
        return tensor, self.labels[which]


def _augment(cpu_s: float) -> None:
    """More per-sample CPU work (the augmentations of a heavier pipeline), `cpu_s` of this thread's CPU time: under
    contention it takes longer on the clock, as real work does, so it saturates the cores it is given."""
    if cpu_s <= 0:
        return
    end = time.thread_time() + cpu_s
    value = 0
    while time.thread_time() < end:
        for i in range(200):
            value = (value * 31 + i) & 0xFFFF


class CachedDataset(Dataset[tuple[torch.Tensor, int]]):
    """The same samples preprocessed once and kept in memory as tensors (the article's "cache the preprocessed
    results"): each distinct JPEG decoded and resized at start; a sample is then a flip of one cached tensor."""

    def __init__(self, blobs: list[bytes], labels: list[int], length: int, seed: int) -> None:
        self.length = length
        self.seed = seed
        self.labels = labels
        self.tensors = []
        for blob in blobs:
            with Image.open(io.BytesIO(blob)) as image:
                small = image.convert("RGB").resize((MODEL_SIDE, MODEL_SIDE), Image.Resampling.BILINEAR)
                pixels = torch.frombuffer(bytearray(small.tobytes()), dtype=torch.uint8)
            self.tensors.append(pixels.view(MODEL_SIDE, MODEL_SIDE, 3).permute(2, 0, 1).float().div_(255.0).sub_(0.5))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        which = index % len(self.tensors)
        flip = random.Random(self.seed * 1_000_003 + index).random() < 0.5
        tensor = self.tensors[which]
        return (tensor.flip(2) if flip else tensor.clone()), self.labels[which]


def _open_shard_index(seconds: float, worker_id: int) -> None:
    """worker_init_fn: each worker reads the shard index from storage when it starts (every epoch unless
    persistent_workers) and dies with its rank even if the rank is SIGKILLed."""
    set_parent_death_signal(signal.SIGKILL)
    _wait_for_storage(seconds)


def build_loader(
    config: DemoConfig, rank: int = 0, world: int = 1, *, hang_index: Optional[int] = None
) -> tuple[DataLoader[tuple[torch.Tensor, int]], DistributedSampler[int]]:
    blobs, labels = make_jpegs(JPEG_COUNT, config.image_side, config.seed)
    length = config.batches_per_epoch * config.batch_size * world
    dataset: Dataset[tuple[torch.Tensor, int]]
    if config.cached:
        dataset = CachedDataset(blobs, labels, length=length, seed=config.seed)
    else:
        dataset = JpegDataset(
            blobs,
            labels,
            length=length,
            storage_ms=config.storage_ms,
            seed=config.seed,
            hang_index=hang_index,
            augment_ms=config.augment_ms,
        )
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=config.seed, drop_last=True
    )
    kwargs: dict[str, Any] = {}
    if config.num_workers:
        kwargs = dict(
            prefetch_factor=config.prefetch_factor,
            persistent_workers=config.persistent_workers,
            worker_init_fn=functools.partial(_open_shard_index, config.worker_init_ms / 1000.0),
        )
    loader = DataLoader(
        dataset,
        batch_size=config.batch_size,
        sampler=sampler,
        num_workers=config.num_workers,
        pin_memory=config.pin_memory,
        drop_last=True,
        generator=torch.Generator().manual_seed(config.seed),  # never the global RNG
        **kwargs,
    )
    return loader, sampler


def offline_loader() -> DataLoader[tuple[torch.Tensor, int]]:
    """A factory for `gputop bench --loader gputop.sim.demo_job:offline_loader`: the starved scenario's loader."""
    loader, _sampler = build_loader(resolve("starved", gpus=1))
    return loader


# ----------------------------------------------------------------------------- the model on the simulated GPU


class SimulatedKernels(torch.autograd.Function):
    """Identity on the activations whose forward and backward launch the step's GPU time on the rank's
    stream (`gputop.sim.cuda`): the launches return at once, the GPU runs them asynchronously.  `host_s`
    is the host's own time per step before the first launch (the Python of a large eager model's forward,
    dispatching its many small ops), spent as time, not CPU, so 8 ranks fit 2 cores.  Without a sync in
    the loop it overlaps the GPU's previous step; with one, host and GPU take turns."""

    @staticmethod
    def forward(
        ctx: Any, activations: torch.Tensor, forward_s: float, backward_s: float, host_s: float, unfused: bool = False
    ) -> torch.Tensor:
        ctx.backward_s = backward_s
        ctx.mix = kernel_mix(activations.dtype, unfused)
        _dispatch_ops(host_s)
        cuda.launch(forward_s, ctx.mix)
        return activations.view_as(activations)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        cuda.launch(ctx.backward_s, ctx.mix)
        return grad, None, None, None, None


def kernel_mix(dtype: torch.dtype, unfused: bool = False) -> KernelMix:
    """What the model's kernels keep busy, from the dtype its layers really computed in: under bf16 (or fp16)
    autocast the convolutions and matmuls run on the tensor cores; in fp32 they run on the FP32 pipe, and an
    `unfused` model (many small eager kernels) streams DRAM more than it computes."""
    if dtype in (torch.bfloat16, torch.float16):
        return BF16_GEMM
    return FP32_UNFUSED if unfused else FP32_GEMM


def _dispatch_ops(seconds: float) -> None:
    """The host launching the step's ops one by one (simulated time)."""
    if seconds > 0:
        time.sleep(seconds)


class TinyConvNet(nn.Module):
    """A tiny CNN computed on the CPU (about a millisecond), "on the GPU": the simulated kernels in the middle
    take the step's GPU time, in proportion to the batch, and the output is a DeviceTensor."""

    def __init__(self, step_ms: float, host_ms: float = 0.0, batch_size: int = 1, unfused: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.head = nn.Linear(16, CLASSES)
        self.batch_size = batch_size
        self.forward_s = step_ms / 1000.0 * FORWARD_SHARE
        self.backward_s = step_ms / 1000.0 - self.forward_s
        self.host_s = host_ms / 1000.0
        self.unfused = unfused  # the kernels' mix (see `kernel_mix`): many small eager kernels streaming DRAM

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        if cuda.is_initialized():
            scale = x.shape[0] / self.batch_size
            # (torch leaves Function.apply unannotated, and untyped_calls_exclude misses it through a subclass; the
            # ignore is unused where disallow_untyped_calls is off for this module)
            x = SimulatedKernels.apply(x, self.forward_s * scale, self.backward_s * scale, self.host_s, self.unfused)  # type: ignore[no-untyped-call, unused-ignore]
        x = torch.relu(self.conv2(x))
        out = self.head(x.mean(dim=(2, 3)))
        return cuda.on_device(out) if cuda.is_initialized() else out


# ----------------------------------------------------------------------------- training


def _visible_gpu() -> int:
    """The simulated GPU behind `cuda` (= cuda:0): the first of CUDA_VISIBLE_DEVICES, or GPU 0 if unset."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def _loss_log(config: DemoConfig, rank: int) -> Optional[TextIO]:
    if not config.loss_log:
        return None
    if "{rank}" in config.loss_log:
        return open(config.loss_log.format(rank=rank), "w", buffering=1)
    return open(config.loss_log, "w", buffering=1) if rank == 0 else None


def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Accuracy over the held-out batches (rank 0): forward only, GPU-heavy, a sync per batch."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in batches:
            predictions = model(images).argmax(dim=1)
            correct += (predictions == labels).sum().item()
            total += len(labels)
    model.train()
    return correct / max(1, total)


def held_out_batches(config: DemoConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The evaluation set: decoded once at start and kept in memory (so evaluating costs GPU, not input)."""
    blobs, labels = make_jpegs(JPEG_COUNT, config.image_side, config.seed + 1)
    batch = config.batch_size * EVAL_BATCH_FACTOR
    dataset = JpegDataset(blobs, labels, length=config.eval_batches * batch, storage_ms=0.0, seed=config.seed + 1)
    loader = DataLoader(dataset, batch_size=batch, shuffle=False)
    return list(loader)


def train(config: DemoConfig, board_path: str, counters_path: str, rendezvous: str) -> int:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # no accelerator here: pinning is a no-op
    # torch counts cores; our workers mostly wait on (simulated) storage, so more workers than cores is right
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    board = BusyBoard.open(board_path)
    counters = StepCounters.open(counters_path)
    gpu = _visible_gpu()
    cuda.init(board, slot=rank, gpu=gpu, lock_path=f"{board_path}.gpu{gpu}.lock")  # torch.cuda.set_device

    torch.manual_seed(config.seed)  # the same initial weights on every rank, as DDP's broadcast would give
    model: nn.Module = TinyConvNet(config.step_ms, config.host_ms, config.batch_size, unfused=config.kernels == "unfused")
    optimizer: Union[torch.optim.Optimizer, distributed.StreamOrderedOptimizer]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    memory = MEMORY_PER_RANK + (RANK0_EXTRA_MEMORY if rank == 0 else 0)
    board.claim(rank, gpu, os.getpid(), memory)  # "model.to(device)": the GPU now holds our memory

    group = None
    if world > 1:
        group = distributed.init_process_group(config.backend, rendezvous, rank, world, timeout_s=config.collective_timeout_s)
        model = distributed.DistributedDataParallel(model)
        optimizer = distributed.StreamOrderedOptimizer(optimizer)
    hang_index = None
    loader, sampler = build_loader(config, rank, world)
    if config.hang_rank == rank:
        sampler.set_epoch(0)
        order = list(sampler)
        hang_index = order[min(len(order) - 1, config.hang_after_batches * config.batch_size)]
        dataset = loader.dataset
        assert isinstance(dataset, JpegDataset)  # (build_loader's)
        dataset.hang_index = hang_index
    held_out = held_out_batches(config) if config.eval_every and rank == 0 else []
    print(
        f"rank {rank}/{world} pid {os.getpid()}: simulated GPU {gpu}, {config.describe()}"
        + (f"; sample {hang_index} will hang" if hang_index is not None else ""),
        flush=True,
    )

    log = _loss_log(config, rank)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    running_loss = 0.0
    try:
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            for images, labels in loader:
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.precision == "bf16"):  # AMP
                    loss = loss_fn(model(images), labels)
                loss.backward()  # with several ranks, DDP's hooks all-reduce the gradients from here
                optimizer.step()
                step += 1
                counters.set(rank, step)
                if config.sync_every_step:
                    running_loss += loss.item()  # a host-device sync every step
                if log is not None:
                    log.write(f"{epoch} {step} {loss.item()!r}\n")
                if config.eval_every and step % config.eval_every == 0:
                    if rank == 0:
                        print(f"step {step}: eval accuracy {evaluate(model, held_out):.3f}", flush=True)
                    if group is not None:
                        distributed.barrier()
                if config.max_steps is not None and step >= config.max_steps:
                    cuda.synchronize()  # the GPU finishes what was launched before the process lets go of it
                    return 0
            epoch += 1
    finally:
        if log is not None:
            log.close()
        board.release(rank)  # the process is done with its GPU
        if group is not None:
            group.destroy()


def main(argv: Optional[list[str]] = None) -> int:
    die_with_parent(signal.SIGKILL)  # the launcher died: so do we (and our workers with us)
    parser = argparse.ArgumentParser(prog="python -m gputop.sim.demo_job", description="one rank of the gputop demo")
    parser.add_argument("--board", required=True, help="the busy board file (made by DemoJob)")
    parser.add_argument("--counters", required=True, help="the step-counter file (made by DemoJob)")
    parser.add_argument("--rendezvous", required=True, help="a file for torch.distributed's FileStore")
    DemoConfig.add_arguments(parser)
    args = parser.parse_args(argv)
    return train(DemoConfig.from_namespace(args), args.board, args.counters, args.rendezvous)


if __name__ == "__main__":
    sys.exit(main())

"""The training job scripts/gpu_check.sh watches: a real model on a real device, with a loader to tune.

    python scripts/gpu_check_job.py --device cuda --workers 0 --ready FILE          # starved
    python scripts/gpu_check_job.py --device cuda --workers 8 --pin-memory ...      # tuned
    torchrun --nproc-per-node 2 scripts/gpu_check_job.py --device cuda --distributed --hang-rank 1 ...

Each sample costs `--prep-ms` of CPU (a decode stands in), so with `--workers 0` the GPU waits for the
loader and with enough workers it does not. `--distributed` all-reduces the gradients every step
(NCCL on CUDA, gloo on CPU); `--hang-rank R` makes rank R stop after `--hang-after` seconds in plain
Python, outside any collective, so the other ranks wait in the all-reduce for a peer that never comes.
Every rank writes its PID to `--pid-dir` and, after its first step, touches `--ready`. The job ends
itself after `--max-seconds` whatever state it is in, so nothing outlives the check.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

IMAGE = (3, 64, 64)


class DecodeDataset(Dataset):
    """Samples whose preparation burns `prep_ms` of CPU, as a JPEG decode does."""

    def __init__(self, prep_ms: float) -> None:
        self.prep_s = prep_ms / 1000.0

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        busy_until = time.perf_counter() + self.prep_s
        spins = 0
        while time.perf_counter() < busy_until:
            spins += 1
        return torch.full(IMAGE, float(index % 13) / 13.0), index % 10


def model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        nn.Linear(128 * 16, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, 10),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--prep-ms", type=float, default=1.5, help="CPU per sample")
    p.add_argument("--width", type=int, default=4096, help="the MLP's width: the GPU's work per step")
    p.add_argument("--distributed", action="store_true")
    p.add_argument("--hang-rank", type=int, default=None)
    p.add_argument("--hang-after", type=float, default=20.0)
    p.add_argument("--ready", required=True)
    p.add_argument("--pid-dir", default=None)
    p.add_argument("--max-seconds", type=float, default=300.0)
    args = p.parse_args()

    # the bound: whatever happens (a hang is the point of one run), the process ends
    threading.Timer(args.max_seconds, os._exit, (3,)).start()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.pid_dir:
        Path(args.pid_dir, f"rank-{rank}.pid").write_text(str(os.getpid()))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    if args.distributed:
        import torch.distributed as dist

        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    net = model(args.width).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = DataLoader(
        DecodeDataset(args.prep_ms), batch_size=args.batch_size, num_workers=args.workers,
        pin_memory=args.pin_memory, prefetch_factor=4 if args.workers else None, persistent_workers=args.workers > 0,
    )
    started = time.monotonic()
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        if args.distributed:
            for param in net.parameters():
                dist.all_reduce(param.grad)
        opt.step()
        loss.item()  # one sync a step: the host sees the step end
        if step == 0:
            Path(args.ready + (f".{rank}" if args.distributed else "")).touch()
        if args.hang_rank == rank and time.monotonic() - started > args.hang_after:
            threading.Event().wait()  # hung in plain Python: the peers wait in the all-reduce


if __name__ == "__main__":
    main()

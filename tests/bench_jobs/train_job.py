"""A tiny training job with a known per-batch cost and step time, for the loader benchmark's tests.

- per-batch prep: ``--prep-ms`` split over the samples of a batch, spent sleeping (I/O-like, so it scales
  with workers even on a 2-core machine) or, with ``--cpu-prep``, spinning (CPU-bound);
- step: ``--step-ms`` of sleep (the "GPU"), plus a real forward/backward/SGD step on a tiny model with
  dropout, so every loss depends on the model's and the global RNG's state;
- data: each sample adds ``torch.rand`` noise drawn in whatever process builds it, so the batches
  depend on the loader's seeds too; ``shuffle=True`` by default, so the sampler's RNG matters.

Every step appends ``step loss.hex() wait_s perf_counter`` to ``--losses`` (line-buffered), so tests
can compare runs bit for bit, know the true data wait of any window, and wait on "N steps done"
instead of sleeping.  ``--ready-file`` gets the PID after the first step.
The job runs epochs until ``--steps`` (0 = forever).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset


def _spend(seconds: float, cpu: bool) -> None:
    if not cpu:
        time.sleep(seconds)
        return
    end = time.thread_time() + seconds  # CPU time, so contention slows it like real decoding
    x = 0
    while time.thread_time() < end:
        x += 1


class CostlyDataset(Dataset):
    def __init__(self, length: int, sample_s: float, cpu: bool) -> None:
        self.length, self.sample_s, self.cpu = length, sample_s, cpu

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        _spend(self.sample_s, self.cpu)
        x = torch.full((8,), float(index % 17)) + torch.rand(8)  # RNG of the producing process
        return x, torch.tensor(float(index % 3))


class CostlyStream(IterableDataset):
    def __init__(self, sample_s: float) -> None:
        self.sample_s = sample_s

    def __iter__(self):
        i = 0
        while True:
            _spend(self.sample_s, False)
            yield torch.full((8,), float(i % 17)), torch.tensor(float(i % 3))
            i += 1


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--prep-ms", type=float, default=40.0, help="producer time per batch")
    p.add_argument("--step-ms", type=float, default=20.0, help="simulated GPU time per step")
    p.add_argument("--cpu-prep", action="store_true", help="spin instead of sleeping in __getitem__")
    p.add_argument("--length", type=int, default=400, help="samples per epoch")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--iterable", action="store_true")
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--losses", default=None)
    p.add_argument("--ready-file", default=None)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    sample_s = args.prep_ms / 1000.0 / args.batch_size
    if args.iterable:
        dataset = CostlyStream(sample_s)
        loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    else:
        dataset = CostlyDataset(args.length, sample_s, args.cpu_prep)
        extra = {"persistent_workers": args.persistent} if args.workers > 0 else {}
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=not args.no_shuffle,
                            num_workers=args.workers, **extra)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = open(args.losses, "a", buffering=1) if args.losses else None
    step = 0
    while True:
        iterator = iter(loader)
        while True:
            asked = time.perf_counter()
            try:
                x, y = next(iterator)
            except StopIteration:
                break
            waited = time.perf_counter() - asked
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(args.step_ms / 1000.0)  # the simulated GPU
            step += 1
            if losses:
                losses.write(f"{step} {loss.item().hex()} {waited:.6f} {time.perf_counter():.6f}\n")
            if step == 1 and args.ready_file:
                with open(args.ready_file + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(args.ready_file + ".tmp", args.ready_file)
            if args.steps and step >= args.steps:
                return


if __name__ == "__main__":
    main()

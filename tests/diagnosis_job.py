"""A real PyTorch training loop whose input pipeline misbehaves on demand (for the diagnosis tests).

    python tests/diagnosis_job.py --mode starved|starved0|hang|compute --ready FILE

* starved   2 workers, each sample sleeps 40 ms, 4 samples a batch, a ~2 ms step: the main thread waits
* starved0  num_workers=0 and a CPU-heavy __getitem__: the main thread runs dataset code itself
* hang      2 workers; from the 4th batch on, one sample never returns (a read on a stalled mount)
* compute   2 workers with trivial samples; a ~150 ms forward/backward step: compute-bound
* slow0     num_workers=0, each sample sleeps 10-20 ms (I/O-like): slow but steady, never hung
* slow2     2 workers, each sample sleeps 20 ms: slow but steady, never hung

After the first batch it writes FILE so a test waits on a condition, not a sleep.  Runs until killed.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

HANG_FROM_INDEX = 12  # with batch 4: batches 0-2 arrive, the 4th never does


class JobDataset(Dataset):
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.mode == "starved":
            time.sleep(0.04)  # stands in for a slow decode
        elif self.mode == "starved0":
            busy_until = time.perf_counter() + 0.03
            x = 0
            while time.perf_counter() < busy_until:  # CPU-bound decode on the main thread
                x += 1
        elif self.mode == "slow0":
            time.sleep(random.uniform(0.010, 0.020))  # a read from slow storage: the process sleeps, steadily
        elif self.mode == "slow2":
            time.sleep(0.020)
        elif self.mode == "hang" and index >= HANG_FROM_INDEX:
            time.sleep(1e6)  # the stalled read: never returns
        return torch.full((64,), float(index % 7))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=["starved", "starved0", "hang", "compute", "slow0", "slow2"])
    p.add_argument("--ready", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    workers = 0 if args.mode in ("starved0", "slow0") else 2
    loader = DataLoader(JobDataset(args.mode), batch_size=4, num_workers=workers, shuffle=False)
    width = 1024 if args.mode == "compute" else 64
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ready = False
    for batch in loader:
        inputs = batch.repeat(64 if args.mode == "compute" else 1, 1)
        for _ in range(12 if args.mode == "compute" else 1):
            loss = model(inputs).pow(2).mean()
            opt.zero_grad()
            loss.backward()
        opt.step()
        if not ready:
            with open(args.ready, "w") as f:
                f.write("ready\n")
            ready = True


if __name__ == "__main__":
    main()

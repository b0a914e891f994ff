"""The job issue 26 was measured on: a DataLoader with num_workers=0 and batch_size=64 over a map-style
dataset of small tensors, a Linear model, SGD.  Its main thread is inside torch's C++ (collate, autograd)
and the allocator nearly all the time, so a tool that hijacks it wherever it stands catches it there:
hypno/pyinjector killed or froze it within a few injections.

    python tests/jobs/allocating_job.py COUNTER [--workers N] [--seconds S]

COUNTER gets the number of steps taken, replaced atomically every 20 steps.  With --seconds the job returns
from main after S seconds of training, as a job that reaches its last step does (exit status 0).
"""

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SmallTensors(Dataset):
    def __init__(self, n: int = 4096):
        self.x = [torch.randn(16) for _ in range(n)]
        self.y = [torch.randn(1) for _ in range(n)]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("counter")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=0.0, help="return from main after this long (0: never)")
    args = parser.parse_args()
    end = time.monotonic() + args.seconds if args.seconds else float("inf")
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SmallTensors(), batch_size=64, num_workers=args.workers, shuffle=True)
    step = 0
    while time.monotonic() < end:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 20 == 0:
                with open(args.counter + ".tmp", "w") as f:
                    f.write(str(step))
                os.replace(args.counter + ".tmp", args.counter)
            if time.monotonic() >= end:
                break


if __name__ == "__main__":
    main()

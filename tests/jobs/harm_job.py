"""A torch training job built to meet each of issue 34's harms, for scripts/harm_drill.py and the tests.

    python tests/jobs/harm_job.py COUNTER [--workers N] [--seconds S] [--refork] [--signals LIB] [--step-word FILE]

The main thread trains a Linear model on small tensors drawn from a DataLoader, batches of 64 (num_workers=0 by
default: the main thread is inside torch's C++ and the allocator nearly all the time; issue 26's job, on which
hypno/pyinjector killed or froze jobs within a few injections).  COUNTER gets the number of steps
taken, replaced atomically every 20 steps, and with --signals the number of SIGRTMIN deliveries counted by
the C handler of LIB (tests/jobs/lock_holders.c) as ``STEPS SIGNALS``.
--seconds S: return from main after S seconds (exit status 0), as a job that reaches its last step does.
--refork: 2 workers, not persistent, 8-batch epochs: the main thread forks new workers every few hundred ms.
--step-word FILE: the step count after every step, as one 8-byte word of FILE mapped shared (tests/harness/
injection.py, StepWord): a store to memory, no syscall, so the main thread stays in the allocator, and a test
that waits for "another step" sees it within a step (~1 ms), not within 20.
"""

import argparse
import ctypes
import mmap
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SmallTensors(Dataset):
    def __init__(self, n: int):
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
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--refork", action="store_true")
    parser.add_argument("--signals", default=None, metavar="LIB")
    parser.add_argument("--step-word", default=None, metavar="FILE")
    args = parser.parse_args()
    word = None
    if args.step_word:
        with open(args.step_word, "r+b") as f:  # the test made it, 8 zero bytes: mapped, the file may close
            word = memoryview(mmap.mmap(f.fileno(), 8)).cast("q")  # native: one aligned 8-byte store, never torn
    counted = None
    if args.signals:
        counted = ctypes.CDLL(args.signals)
        counted.count_signal(signal.SIGRTMIN)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.refork:
        loader = DataLoader(SmallTensors(8 * 64), batch_size=64, num_workers=2, persistent_workers=False)
    else:
        loader = DataLoader(SmallTensors(4096), batch_size=64, num_workers=args.workers, shuffle=True)
    end = time.monotonic() + args.seconds if args.seconds else float("inf")
    step = 0
    while time.monotonic() < end:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if word is not None:
                word[0] = step
            if step % 20 == 0 or counted is not None or args.refork:  # a slow loop says every step
                with open(args.counter + ".tmp", "w") as f:
                    f.write(f"{step} {counted.signals_received()}" if counted is not None else str(step))
                os.replace(args.counter + ".tmp", args.counter)
            if time.monotonic() >= end:
                break


if __name__ == "__main__":
    main()

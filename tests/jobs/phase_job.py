"""A training loop whose phases take known times, for the trace tests (runs under torchrun, gloo).

Each step: ``--data-ms`` in the Dataset (num_workers=0, so inside the DataLoader's ``__next__``),
``--forward-ms`` and ``--backward-ms`` spun inside a custom autograd Function (its forward and its
backward), ``--optimizer-ms`` spun inside the optimizer's ``step``, then a gloo ``all_reduce`` of the
gradients (``--comm-floats`` extra floats make it heavy).  Spinning, not sleeping: the time is spent
on the thread the way real compute is.

The job writes its own truth: every step appends one JSON line to ``--step-log`` with ``time.time()`` at the
start and end of each phase, so a test can compute the true share of any window.  It also writes
each step's loss (bit-exact hex).  ``--ready-file`` gets the PID after the first step.
``--profile-self S`` (exploration only) profiles its own main loop.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


SLEEP = False  # --sleep: spend the phase times asleep (I/O-like) instead of spinning


def spin(ms: float) -> None:
    if SLEEP:
        time.sleep(ms / 1000.0)
        return
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


class SlowData(Dataset):
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        spin(self.ms)
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), torch.tensor(float(i % 3))


class Timed(torch.autograd.Function):
    """Identity whose forward and backward take known times."""

    @staticmethod
    def forward(ctx, x, forward_ms, backward_ms):
        ctx.backward_ms = backward_ms
        spin(forward_ms)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        spin(ctx.backward_ms)
        return grad, None, None


class SlowSGD(torch.optim.SGD):
    def __init__(self, params, lr, ms):
        super().__init__(params, lr=lr)
        self.ms = ms

    @torch.no_grad()
    def step(self, closure=None):
        spin(self.ms)
        return super().step(closure)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data-ms", type=float, default=20.0)
    p.add_argument("--forward-ms", type=float, default=15.0)
    p.add_argument("--backward-ms", type=float, default=25.0)
    p.add_argument("--optimizer-ms", type=float, default=10.0)
    p.add_argument("--comm-floats", type=int, default=0)
    p.add_argument("--sleep", action="store_true", help="sleep the phase times instead of spinning (cheap on CPU)")
    p.add_argument("--layers", type=int, default=1, help="hidden 16x16 layers in the model (more ops per step)")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run until killed)")
    p.add_argument("--step-log", default=None)
    p.add_argument("--ready-file", default=None)
    args = p.parse_args()
    global SLEEP
    SLEEP = args.sleep
    torch.manual_seed(1234)
    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    hidden = [m for _ in range(args.layers - 1) for m in (torch.nn.Linear(16, 16), torch.nn.ReLU())]
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), *hidden, torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    optimizer = SlowSGD(model.parameters(), lr=0.01, ms=args.optimizer_ms)
    loader = DataLoader(SlowData(args.data_ms), batch_size=1, num_workers=0)
    extra = torch.ones(args.comm_floats) if args.comm_floats else None
    log = open(f"{args.step_log}.{rank}", "a", buffering=1) if args.step_log else None
    step = 0
    it = iter(loader)
    while True:
        t0 = time.time()
        x, y = next(it)
        t1 = time.time()
        out = Timed.apply(model(x), args.forward_ms, args.backward_ms).squeeze(1)
        loss = torch.nn.functional.mse_loss(out, y)
        t2 = time.time()
        optimizer.zero_grad()
        loss.backward()
        t3 = time.time()
        if distributed:
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= dist.get_world_size()
            if extra is not None:
                dist.all_reduce(extra)
        t4 = time.time()
        optimizer.step()
        t5 = time.time()
        step += 1
        if log:
            log.write(json.dumps({"step": step, "loss": loss.item().hex(), "t": [t0, t1, t2, t3, t4, t5]}) + "\n")
        if step == 1 and args.ready_file:
            with open(f"{args.ready_file}.{rank}.tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(f"{args.ready_file}.{rank}.tmp", f"{args.ready_file}.{rank}")
        if args.steps and step >= args.steps:
            break
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

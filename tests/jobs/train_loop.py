"""A tiny PyTorch training loop for attach tests: a slow Dataset feeding a DataLoader with workers.

The dataset sleeps in ``__getitem__`` so the main thread spends most of its time waiting for data,
which is the state the stack classifier must recognise.  Under torchrun every rank runs this same
loop and adds a gloo all_reduce per step.  After the first batch the script writes ``ready`` (with
its PID) to ``--ready-file.PID`` so tests can wait on a condition instead of sleeping.  With
``--mp-spawn N`` it launches N ranks the ``torch.multiprocessing.spawn`` way instead.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    """Sleeps per sample: stands in for image decoding."""

    def __init__(self, length: int, getitem_ms: float) -> None:
        self.length = length
        self.getitem_s = getitem_ms / 1000.0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.getitem_s)
        return torch.full((4,), float(index))


def start_pin_like_thread() -> int:
    """A thread named the way torch names its pin-memory thread (torch/utils/data/_utils/pin_memory.py).

    pin_memory=True only starts the real thread when an accelerator is present; this stands in for it
    on CPU-only machines so tests can check that /proc/PID/task is searched.  Returns its TID.
    """
    import threading

    started = threading.Event()
    tid = []

    def loop() -> None:
        torch.multiprocessing._set_thread_name("pt_data_pin")  # the same call torch's pin thread makes
        tid.append(threading.get_native_id())
        started.set()
        threading.Event().wait()  # idle forever, like a pin thread with nothing to pin

    threading.Thread(target=loop, name="pin_memory_like", daemon=True).start()
    started.wait()
    return tid[0]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--getitem-ms", type=float, default=50.0)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--samples", type=int, default=64, help="samples per epoch")
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--start-method", default=None, choices=[None, "fork", "spawn", "forkserver"])
    p.add_argument("--ready-file", default=None)
    p.add_argument("--distributed", action="store_true", help="init gloo from torchrun's env and all_reduce per step")
    p.add_argument("--progress-file", default=None, help="keep the number of steps taken so far in this file")
    p.add_argument("--mp-spawn", type=int, default=0, metavar="N", help="run N ranks via torch.multiprocessing.spawn")
    p.add_argument(
        "--mp-start-method", default="spawn", choices=["spawn", "fork", "forkserver"],
        help="how --mp-spawn starts its ranks (fork is cheapest: no second import of torch)",
    )
    p.add_argument(
        "--pin-thread",
        action="store_true",
        help="start a thread named like torch's pin-memory thread (CPU-only torch never starts the real one)",
    )
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.mp_spawn:
        # the torch.multiprocessing.spawn pattern: this process only launches; each child is a rank
        torch.multiprocessing.start_processes(
            train, args=(args,), nprocs=args.mp_spawn, start_method=args.mp_start_method
        )
    else:
        train(0, args)


def train(_index: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # the test machine has 2 cores shared by many
    if args.distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader_kwargs = {}
    if args.workers > 0:
        loader_kwargs["persistent_workers"] = args.persistent
        if args.start_method:
            loader_kwargs["multiprocessing_context"] = args.start_method
    loader = DataLoader(
        SlowDataset(args.samples, args.getitem_ms),
        batch_size=args.batch_size,
        num_workers=args.workers,
        pin_memory=args.pin_memory,
        **loader_kwargs,
    )
    pin_tid = 0
    if args.pin_thread:
        pin_tid = start_pin_like_thread()
    ready_written = False
    progress = open(args.progress_file, "w") if args.progress_file else None
    steps = 0
    while True:  # run until the test kills us
        for batch in loader:
            loss = model(batch).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.distributed:
                dist.all_reduce(loss.detach())
            if args.step_ms:
                time.sleep(args.step_ms / 1000.0)
            steps += 1
            if progress is not None:  # fixed width, rewritten in place: a reader never sees a partial number
                progress.seek(0)
                progress.write(f"{steps:12d}\n")
                progress.flush()
            if not ready_written and args.ready_file:
                tmp = f"{args.ready_file}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    f.write(f"ready {os.getpid()} {pin_tid}\n")
                # torchrun ranks share one ready file name: append the PID so none overwrites another
                os.replace(tmp, f"{args.ready_file}.{os.getpid()}")
                ready_written = True


if __name__ == "__main__":
    main()

"""A small real PyTorch training loop for the failure drills (tests/test_drills.py).

A map-style Dataset that sleeps per sample (standing in for decoding) feeds a DataLoader with
persistent workers; the "step" is a tiny forward/backward.  It runs until killed.

* ``--ready FILE``: after the first step, write this process's PID there (tests wait on it).
* ``--steps FILE``: keep the number of steps taken so far there (tests check the job kept training).
* ``--thread-name NAME``: start an idle thread with this Python name, and give it the same OS name
  (truncated by the kernel to 15 bytes, which may cut a UTF-8 character in half, as real names do).
* ``--survive-worker-death``: when a DataLoader worker dies, start a new DataLoader and go on.
* ``--become USER``: after importing torch, drop to this user (root only) and stay dumpable, so the
  job looks like any process of that user.  Used where that user cannot read the interpreter's
  directory and so could not start Python itself.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

PR_SET_NAME = 15
PR_SET_DUMPABLE = 4


class SleepyDataset(Dataset):
    def __init__(self, getitem_ms: float) -> None:
        self.getitem_s = getitem_ms / 1000.0

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.getitem_s)
        return torch.full((8,), float(index % 97))


def start_named_thread(name: str) -> None:
    started = threading.Event()

    def idle() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode("utf-8")[:15]), 0, 0, 0)
        started.set()
        threading.Event().wait()

    threading.Thread(target=idle, name=name, daemon=True).start()
    started.wait()


# Imported lazily by the DataLoader when it starts its workers; after `become` the interpreter's own
# directory may be unreadable (root's 0700 home), so load them first.
_PRELOAD = (
    "multiprocessing.queues", "multiprocessing.synchronize", "multiprocessing.connection",
    "multiprocessing.popen_fork", "multiprocessing.reduction", "multiprocessing.resource_sharer",
    "multiprocessing.util", "torch.utils.data._utils.worker", "torch.utils.data._utils.signal_handling",
    "torch.utils.data._utils.pin_memory", "queue",
)


def become(user: str) -> None:
    import importlib
    import pwd

    for name in _PRELOAD:
        importlib.import_module(name)

    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
    os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
    # changing uid clears the dumpable flag (which would make /proc/PID root-owned); a process that
    # user started itself would be dumpable, so look like one
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--getitem-ms", type=float, default=20.0)
    p.add_argument("--ready")
    p.add_argument("--steps")
    p.add_argument("--thread-name")
    p.add_argument("--become")
    p.add_argument("--survive-worker-death", action="store_true",
                   help="when a worker dies, log it and start a new DataLoader (as elastic jobs do)")
    args = p.parse_args()

    torch.manual_seed(0)
    if args.thread_name:
        start_named_thread(args.thread_name)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    def new_loader() -> DataLoader:
        return DataLoader(SleepyDataset(args.getitem_ms), batch_size=2, num_workers=args.workers,
                          persistent_workers=args.workers > 0)

    loader = new_loader()
    if args.become:
        become(args.become)
    steps = 0
    while True:
        try:
            for batch in loader:
                loss = model(batch).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
                if args.steps:
                    write_atomically(args.steps, str(steps))
                if steps == 1 and args.ready:
                    write_atomically(args.ready, str(os.getpid()))
        except RuntimeError as exc:  # "DataLoader worker (pid(s) N) exited unexpectedly"
            if not args.survive_worker_death or "DataLoader worker" not in str(exc):
                raise
            print(f"loader_job: {exc}; starting a new DataLoader", flush=True)
            loader = new_loader()


if __name__ == "__main__":
    main()

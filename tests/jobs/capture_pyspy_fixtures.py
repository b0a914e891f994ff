"""Capture tests/fixtures/pyspy/py3XX/*.json: real `py-spy dump --json --nonblocking` of real jobs.

    python tests/jobs/capture_pyspy_fixtures.py [--python INTERPRETER] [--out DIR]

The jobs run under INTERPRETER (default: this one), which needs torch and accelerate; the fixtures go to
tests/fixtures/pyspy/py3XX/ for that interpreter's version.  py-spy prints frames differently per
target version (bare function names for 3.10, ``Class.method`` from 3.11), so the same scenes are
captured on 3.10, 3.11, 3.12 and 3.13 and tests/test_stack_classes.py checks they classify alike.
The jobs are real PyTorch (and Accelerate) code: DataLoader workers, autograd, Adam, gloo collectives
under torchrun, DDP, Accelerate's DataLoaderDispatcher.

Each fixture is a dump taken while the process's main thread was in the state its name says; the
script dumps repeatedly until the main thread shows the frame that proves it (matched by file and
function, as py-spy prints them on every version).  Every process started here runs in its own
session and is killed at the end.  Not run by the test suite: the fixtures are committed, so tests
don't depend on sampling luck or on torch being installed for four Pythons.

(tests/fixtures/pyspy/*.json, one level up, are the first 3.11 captures of scenes 1-5; the tests that
pin their exact frames still read them.  Scenes 1-3 were captured when the training job was
tests/jobs/train_loop.py with a `SlowDataset`; it is now tests/jobs/train_job.py with `Samples`, so a
new capture names those, and the names tests/test_stack_classes.py expects change with it.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from tests.harness.processes import free_port  # noqa: E402
from tests.harness.train_jobs import ATTACH_LOOP, command  # noqa: E402

FIXTURES = HERE.parent / "fixtures" / "pyspy"

ADAM_LOOP = """
import sys, torch
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(256, 1024)
open(sys.argv[1], "w").write("ready")
while True:
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

# Printing a tensor copies it to the host (a sync on CUDA): torch's formatting code is on the stack.
PRINT_LOOP = """
import os, sys, torch
torch.set_num_threads(1)
torch.set_printoptions(threshold=1_000_000)
t = torch.randn(300, 300)
out = open(os.devnull, "w")
open(sys.argv[1], "w").write("ready")
while True:
    print(t, file=out)
"""

# Datasets whose class names say nothing ("Images", "Shards"): recognised by what the fetcher calls.
DATA_JOB = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
torch.set_num_threads(1)

class Images(Dataset):
    def __len__(self):
        return 1_000_000
    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.full((4,), float(i))

class Shards(IterableDataset):
    def __iter__(self):
        i = 0
        while True:
            time.sleep(0.05)
            i += 1
            yield torch.full((4,), float(i))

mode, ready = sys.argv[1], sys.argv[2]
dataset = Images() if mode == "map" else Shards()
loader = DataLoader(dataset, batch_size=2, num_workers=0 if mode == "map" else 1)
for i, batch in enumerate(loader):
    if i == 1:
        open(ready, "w").write("ready")
"""

COLLECTIVES = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
open(f"{sys.argv[1]}.{os.getpid()}", "w").write(str(rank))
t = torch.ones(4)
while True:  # rank 1 arrives late, so rank 0 waits inside all_reduce and barrier
    if rank == 1:
        time.sleep(0.5)
    dist.all_reduce(t)
    if rank == 1:
        time.sleep(0.5)
    dist.barrier()
"""

# DDP: the gradient all-reduce runs on autograd's threads, the main thread shows backward.
DDP_LOOP = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
torch.set_num_threads(1)
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(128, 512)
open(f"{sys.argv[1]}.{os.getpid()}", "w").write(str(dist.get_rank()))
while True:
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

# Accelerate's DataLoaderDispatcher (the default for an IterableDataset): rank 0 reads the data and
# broadcasts it, rank 1 waits in that broadcast.
DISPATCHER = """
import os, sys, time, torch
from torch.utils.data import DataLoader, IterableDataset
from accelerate import Accelerator, DataLoaderConfiguration
torch.set_num_threads(1)

class Shards(IterableDataset):
    def __iter__(self):
        i = 0
        while True:
            time.sleep(0.2)
            i += 1
            yield torch.full((4,), float(i))

acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
loader = acc.prepare(DataLoader(Shards(), batch_size=2))
for i, batch in enumerate(loader):
    if i == 1:
        open(f"{sys.argv[1]}.{os.getpid()}", "w").write(str(acc.process_index))
"""

Frames = list  # py-spy's JSON frames, innermost first
Proof = Callable[[Frames], bool]


def at(path_suffix: str, function: Optional[str] = None) -> Proof:
    """Some frame runs in a file ending with `path_suffix` (and in `function`, as a bare name)."""

    def proves(frames: Frames) -> bool:
        return any(
            f["filename"].endswith(path_suffix) and (function is None or f["name"].rsplit(".", 1)[-1] == function) for f in frames
        )

    return proves


def innermost(path_suffix: str, function: str) -> Proof:
    def proves(frames: Frames) -> bool:
        return bool(frames) and frames[0]["filename"].endswith(path_suffix) and frames[0]["name"].rsplit(".", 1)[-1] == function

    return proves


def all_of(*proofs: Proof) -> Proof:
    return lambda frames: all(p(frames) for p in proofs)


def none_of(*proofs: Proof) -> Proof:
    return lambda frames: not any(p(frames) for p in proofs)


def py_spy() -> str:
    sys.path.insert(0, str(HERE.parent.parent))
    from gputop.collect.stacks import find_py_spy

    found = find_py_spy()
    if not found:
        raise SystemExit("py-spy not found")
    return found


def main_thread_frames(pid: int, threads: list[dict]) -> Frames:
    """MainThread by name, else the OS thread whose id is the PID, else the last listed (py-spy on 3.10)."""
    for t in threads:
        if t.get("thread_name") == "MainThread" or t.get("os_thread_id") == pid:
            return t["frames"]
    return threads[-1]["frames"] if threads else []


def grab(pid: int, proves: Proof, out: Path, what: str, timeout: float = 90.0) -> None:
    """Dump `pid` until its main thread's frames satisfy `proves`; save that dump verbatim."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = subprocess.run([py_spy(), "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True)
        if result.returncode == 0 and proves(main_thread_frames(pid, json.loads(result.stdout))):
            out.write_bytes(result.stdout)
            print(f"{out.name}: {what}")
            return
    raise SystemExit(f"never saw {what} in PID {pid}")


def wait_files(pattern: str, directory: Path, count: int, timeout: float = 240.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(p for p in directory.glob(pattern) if not p.name.endswith(".tmp"))
        if len(files) >= count:
            return files
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {count} x {pattern}")


def first_child(pid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])


def version_of(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print(f'py{sys.version_info[0]}{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter the jobs run under (needs torch, accelerate)")
    ap.add_argument("--out", type=Path, default=None, help="default: tests/fixtures/pyspy/py3XX for --python")
    args = ap.parse_args()
    python = args.python
    out = args.out or FIXTURES / version_of(python)
    out.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen] = []
    sessions: list[int] = []  # torch elastic puts each rank in its own session

    def start(argv: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(
            argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        started.append(proc)
        return proc

    def stop_all() -> None:
        for pgid in [p.pid for p in started] + sessions:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in started:
            proc.wait(timeout=30)
        started.clear()
        sessions.clear()

    def torchrun(script: Path, tag: Path) -> list[Path]:
        start(
            [
                python,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                "2",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(free_port()),
                str(script),
                str(tag),
            ]
        )
        ranks = wait_files(f"{tag.name}.*", tag.parent, 2)
        sessions.extend(int(f.name.split(".")[-1]) for f in ranks)
        return ranks

    def pid_of_rank(ranks: list[Path], rank: int) -> int:
        return next(int(f.name.split(".")[-1]) for f in ranks if f.read_text() == str(rank))

    dataloader_next = at("torch/utils/data/dataloader.py", "__next__")
    with tempfile.TemporaryDirectory(prefix="gputop-capture-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            # 1. main thread waiting on 2 workers that sit in __getitem__
            job = start(
                command(
                    *ATTACH_LOOP, "--workers", "2", "--persistent", "--length", "100000", "--ready", str(tmp / "a"), python=python
                )
            )
            wait_files("a.*", tmp, 1)
            grab(job.pid, dataloader_next, out / "main_waiting_for_data.json", "dataloader __next__")
            grab(first_child(job.pid), at("train_job.py", "__getitem__"), out / "worker_in_getitem.json", "__getitem__")
            # 2. fast data, slow step: idle workers, main thread in its own sleep
            job = start(
                command(
                    *ATTACH_LOOP,
                    "--workers",
                    "2",
                    "--persistent",
                    "--length",
                    "100000",
                    "--sample-ms",
                    "1",
                    "--step-ms",
                    "300",
                    "--ready",
                    str(tmp / "b"),
                    python=python,
                )
            )
            wait_files("b.*", tmp, 1)
            worker_loop = at("torch/utils/data/_utils/worker.py", "_worker_loop")
            grab(
                first_child(job.pid),
                all_of(worker_loop, none_of(at("train_job.py", "__getitem__"))),
                out / "worker_idle.json",
                "_worker_loop waiting for indices",
            )
            grab(job.pid, innermost("train_job.py", "train"), out / "main_idle_sleep.json", "train's sleep")
            # 3. num_workers=0: the main thread runs the Dataset itself
            job = start(
                command(
                    *ATTACH_LOOP,
                    "--workers",
                    "0",
                    "--sample-ms",
                    "100",
                    "--step-ms",
                    "1",
                    "--ready",
                    str(tmp / "c"),
                    python=python,
                )
            )
            wait_files("c.*", tmp, 1)
            grab(job.pid, at("train_job.py", "__getitem__"), out / "main_single_process_getitem.json", "__getitem__")
            stop_all()
            # 4. compute: forward, backward, Adam
            (tmp / "adam.py").write_text(ADAM_LOOP)
            job = start([python, str(tmp / "adam.py"), str(tmp / "d")])
            wait_files("d", tmp, 1)
            grab(job.pid, at("torch/autograd/graph.py", "_engine_run_backward"), out / "main_backward.json", "backward")
            grab(job.pid, at("torch/nn/modules/linear.py", "forward"), out / "main_forward.json", "Linear.forward")
            grab(job.pid, at("torch/optim/adam.py", "step"), out / "main_optimizer_step.json", "Adam.step")
            # 5. printing a tensor
            (tmp / "print.py").write_text(PRINT_LOOP)
            job = start([python, str(tmp / "print.py"), str(tmp / "p")])
            wait_files("p", tmp, 1)
            grab(job.pid, at("torch/_tensor_str.py"), out / "main_print_tensor.json", "torch/_tensor_str.py")
            # 6. datasets with plain names: a map dataset run by the main thread, an iterable one in a worker
            (tmp / "data.py").write_text(DATA_JOB)
            job = start([python, str(tmp / "data.py"), "map", str(tmp / "m")])
            wait_files("m", tmp, 1)
            grab(job.pid, at("data.py", "__getitem__"), out / "main_in_unnamed_dataset.json", "Images.__getitem__")
            job = start([python, str(tmp / "data.py"), "iter", str(tmp / "i")])
            wait_files("i", tmp, 1)
            grab(first_child(job.pid), at("data.py", "__iter__"), out / "worker_in_iterable_dataset.json", "Shards.__iter__")
            stop_all()
            # 7. torchrun, gloo on loopback: collectives and the launcher
            (tmp / "coll.py").write_text(COLLECTIVES)
            ranks = torchrun(tmp / "coll.py", tmp / "e")
            rank0 = pid_of_rank(ranks, 0)
            c10d = "torch/distributed/distributed_c10d.py"
            grab(rank0, at(c10d, "all_reduce"), out / "rank_all_reduce.json", "all_reduce")
            grab(rank0, at(c10d, "barrier"), out / "rank_barrier.json", "barrier")
            grab(
                started[-1].pid,
                at("torch/distributed/elastic/agent/server/api.py", "_invoke_run"),
                out / "launcher_torchrun.json",
                "_invoke_run",
            )
            stop_all()
            # 8. DDP backward
            (tmp / "ddp.py").write_text(DDP_LOOP)
            ranks = torchrun(tmp / "ddp.py", tmp / "f")
            grab(
                pid_of_rank(ranks, 0),
                at("torch/autograd/graph.py", "_engine_run_backward"),
                out / "rank_ddp_backward.json",
                "DDP backward",
            )
            stop_all()
            # 9. Accelerate's DataLoaderDispatcher: rank 1 waits in rank 0's broadcast
            (tmp / "dispatch.py").write_text(DISPATCHER)
            ranks = torchrun(tmp / "dispatch.py", tmp / "g")
            grab(
                pid_of_rank(ranks, 1),
                all_of(at("accelerate/data_loader.py"), at(c10d)),
                out / "rank_dispatcher_broadcast.json",
                "broadcast inside DataLoaderDispatcher",
            )
            grab(
                pid_of_rank(ranks, 0),
                all_of(at("accelerate/data_loader.py"), at("torch/utils/data/_utils/fetch.py")),
                out / "rank0_dispatcher_fetching.json",
                "rank 0 fetching for the dispatcher",
            )
        finally:
            stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Re-capture tests/fixtures/pyspy/*.json: real `py-spy dump --json --nonblocking` of real jobs.

    python tests/jobs/capture_pyspy_fixtures.py [--out DIR]

Each fixture is a dump taken while the process's main thread was in the state its name says; the
script dumps repeatedly until it sees the frame that proves it (a DataLoader __next__, Adam.step,
all_reduce ...).  Every process started here runs in its own session and is killed at the end.
Not run by the test suite: the fixtures are committed, so tests don't depend on sampling luck.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_LOOP = HERE / "train_loop.py"
DEFAULT_OUT = HERE.parent / "fixtures" / "pyspy"

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


def py_spy() -> str:
    sys.path.insert(0, str(HERE.parent.parent))
    from gputop.collect.stacks import find_py_spy

    found = find_py_spy()
    if not found:
        raise SystemExit("py-spy not found")
    return found


def grab(pid: int, needle: str, out: Path, *, innermost: bool = False, timeout: float = 60.0) -> None:
    """Dump `pid` until its MainThread has a frame whose name contains `needle` (with `innermost`: the
    innermost frame is exactly `needle`); save that dump verbatim."""

    def proves(frames: list[dict]) -> bool:
        if innermost:
            return bool(frames) and frames[0]["name"] == needle
        return any(needle in f["name"] for f in frames)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = subprocess.run([py_spy(), "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True)
        if result.returncode == 0:
            threads = json.loads(result.stdout)
            if any(t["thread_name"] == "MainThread" and proves(t["frames"]) for t in threads):
                out.write_bytes(result.stdout)
                print(f"{out.name}: {needle}")
                return
    raise SystemExit(f"never saw {needle} in PID {pid}")


def wait_files(pattern: str, directory: Path, count: int, timeout: float = 180.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(p for p in directory.glob(pattern) if not p.name.endswith(".tmp"))
        if len(files) >= count:
            return files
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {count} x {pattern}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen] = []

    def start(argv: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(proc)
        return proc

    with tempfile.TemporaryDirectory(prefix="gputop-capture-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            # 1. main thread waiting on 2 workers that sit in __getitem__
            job = start([sys.executable, str(TRAIN_LOOP), "--workers", "2", "--persistent", "--samples", "100000",
                         "--ready-file", str(tmp / "a")])
            wait_files("a.*", tmp, 1)
            worker = int(Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()[0])
            grab(job.pid, "_BaseDataLoaderIter.__next__", args.out / "main_waiting_for_data.json")
            grab(worker, "__getitem__", args.out / "worker_in_getitem.json")
            # 2. fast data, slow step: idle workers, main thread in its own sleep
            job = start([sys.executable, str(TRAIN_LOOP), "--workers", "2", "--persistent", "--samples", "100000",
                         "--getitem-ms", "1", "--step-ms", "300", "--ready-file", str(tmp / "b")])
            wait_files("b.*", tmp, 1)
            worker = int(Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()[0])
            grab(worker, "_worker_loop", args.out / "worker_idle.json")
            grab(job.pid, "main", args.out / "main_idle_sleep.json", innermost=True)  # in time.sleep
            # 3. num_workers=0: the main thread runs the Dataset itself
            job = start([sys.executable, str(TRAIN_LOOP), "--workers", "0", "--getitem-ms", "100", "--step-ms", "1",
                         "--ready-file", str(tmp / "c")])
            wait_files("c.*", tmp, 1)
            grab(job.pid, "__getitem__", args.out / "main_single_process_getitem.json")
            # 4. compute: forward, backward, Adam
            (tmp / "adam.py").write_text(ADAM_LOOP)
            job = start([sys.executable, str(tmp / "adam.py"), str(tmp / "d")])
            wait_files("d", tmp, 1)
            grab(job.pid, "_engine_run_backward", args.out / "main_backward.json")
            grab(job.pid, "forward", args.out / "main_forward.json")
            grab(job.pid, "Adam.step", args.out / "main_optimizer_step.json")
            # 5. torchrun, gloo on loopback: collectives and the launcher
            (tmp / "coll.py").write_text(COLLECTIVES)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            launcher = start([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                              "--master-addr", "127.0.0.1", "--master-port", str(port), str(tmp / "coll.py"),
                              str(tmp / "e")])
            ranks = wait_files("e.*", tmp, 2)
            rank0 = next(int(f.name.split(".")[-1]) for f in ranks if f.read_text() == "0")
            grab(rank0, "all_reduce", args.out / "rank_all_reduce.json")
            grab(rank0, "barrier", args.out / "rank_barrier.json")
            grab(launcher.pid, "_invoke_run", args.out / "launcher_torchrun.json")
            for f in ranks:  # torch elastic puts each rank in its own session
                os.killpg(int(f.name.split(".")[-1]), signal.SIGKILL)
        finally:
            for proc in started:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does torch's debug server harm a job that exits during its ``torch_profile``?  (issue 34; docs/trace.md)

    python scripts/debug_server_profile_exit.py [--runs 6] [--handler torch_profile?duration=4]

Each run starts a one-rank gloo job that calls ``torch.distributed.debug.start_debug_server()`` (rank 0's web
frontend needs tabulate/jinja2/aiohttp; without them only the worker server runs, which is all that is called
here), asks its worker server for ``--handler`` over loopback HTTP, and 0.5 s later lets the job run its loop
for 2.5 s more and return from ``main``: the job exits while a 4 s profile is still running.  It prints each
run's exit status and the last line of the job's stderr, then the statuses.  ``--handler ping`` is the control.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

JOB = r"""
import os, sys, time
import torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
import torch.distributed.debug as debug
try:
    debug.start_debug_server(port=int(sys.argv[1]) + 1)
except ImportError:
    pass  # rank 0's frontend lacks its optional dependencies; the worker server already runs
print("port", debug._WORKER_SERVER.port, flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
end = time.monotonic() + 2.5
w = torch.randn(64, 64)
while time.monotonic() < end:
    batch = torch.stack([torch.randn(64) for _ in range(64)])
    loss = (batch @ w).relu().sum()
print("last line", flush=True)
"""


def one_run(index: int, handler: str, workdir: str) -> tuple[int, str, str]:
    go = os.path.join(workdir, f"go{index}")
    job = os.path.join(workdir, "job.py")
    port_base = 29700 + 3 * index + (os.getpid() % 100) * 30
    proc = subprocess.Popen([sys.executable, job, str(port_base), go], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = None
    for line in proc.stdout:
        if line.startswith("port"):
            port = int(line.split()[1])
            break
    answer: list[str] = []

    def ask() -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/handler/{handler}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=15) as r:
                answer.append(f"HTTP {r.status}, {len(r.read())} bytes")
        except Exception as exc:  # the job died under it, most likely
            answer.append(f"{type(exc).__name__}: {exc}"[:100])

    caller = threading.Thread(target=ask)
    caller.start()
    time.sleep(0.5)  # the handler has started
    open(go, "w").close()
    _out, err = proc.communicate(timeout=120)
    caller.join()
    last = next((line for line in reversed(err.splitlines()) if "WorkerServer.cpp" not in line), "")
    return proc.returncode, answer[0] if answer else "", last


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--handler", default="torch_profile?duration=4")
    args = parser.parse_args()
    statuses = []
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "job.py"), "w") as f:
            f.write(JOB)
        for i in range(args.runs):
            status, answer, last = one_run(i, args.handler, workdir)
            statuses.append(status)
            print(f"run {i}: exit status {status}; the call: {answer}; stderr's last line: {last}", flush=True)
    print(f"{args.handler}: exit statuses {statuses}")


if __name__ == "__main__":
    main()

"""A rank stand-in for launcher tests: it starts one child that names itself like a DataLoader worker
(``pt_data_worker``, as torch's worker loop does), then writes ``<ready dir>/<pid>`` with its own PID,
its worker's PID and its rank variables as JSON, and waits to be killed.  It imports no torch, so a
launcher test with several ranks starts in a second or two."""

import json
import multiprocessing
import os
import sys
import time

RANK_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "NODE_RANK",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
)


def worker(named) -> None:
    with open("/proc/self/comm", "w") as f:
        f.write("pt_data_worker")
    named.set()
    while True:
        time.sleep(1)


def main(ready_dir: str) -> None:
    context = multiprocessing.get_context("fork")
    named = context.Event()
    child = context.Process(target=worker, args=(named,), daemon=True)
    child.start()
    named.wait(60)
    record = {"pid": os.getpid(), "worker": child.pid, "env": {k: os.environ[k] for k in RANK_VARIABLES if k in os.environ}}
    path = os.path.join(ready_dir, str(os.getpid()))
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(os.environ.get("GPUTOP_TEST_READY") or sys.argv[1])

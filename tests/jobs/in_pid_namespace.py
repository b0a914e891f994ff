"""Runs inside `unshare --pid --fork --mount-proc` (tests/test_containers.py): a container's view.

It launches two stub ranks the way torchrun does in a container (RANK, LOCAL_RANK, WORLD_SIZE and a
CUDA_VISIBLE_DEVICES list, of UUIDs or indices), writes their PIDs *as seen here* to inner.json, and
waits for the test to write host.json: the same ranks' PIDs in the host's namespace, which is what a
real driver reports to NVML callers inside a container.  The fake NVML then lists those host PIDs on
the ranks' GPUs, and gputop, running here, writes what it made of the job to result.json."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gputop.collect.gpu import GpuCollector, use_nvml_library
from gputop.collect.job_tree import JobCollector, discover_jobs
from gputop.report.job_json import job_json
from gputop.sim.fake_nvml import FakeNvmlLibrary
from gputop.sim.spec import parse_spec
from tests.harness.nvml import ScriptedLoad

STUB = Path(__file__).with_name("rank_stub.py")
RANK_GPUS = (2, 5)  # where the ranks really run (NVML indices)


def wait_for(path: Path, seconds: float = 120) -> dict:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"{path} never came")
        time.sleep(0.05)
    return json.loads(path.read_text())


def main(work: Path, devices_by: str) -> None:
    load = ScriptedLoad(util=90.0)
    library = FakeNvmlLibrary(parse_spec("h100-sxm-8"), load)
    gpu_collector = GpuCollector(library=library)
    uuids = [g.uuid for g in gpu_collector.sample()]
    visible = ",".join(uuids[i] if devices_by == "uuid" else str(i) for i in RANK_GPUS)
    ready = work / "ready"
    ready.mkdir()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(STUB)],
            env=dict(
                os.environ,
                GPUTOP_TEST_READY=str(ready),
                RANK=str(i),
                LOCAL_RANK=str(i),
                WORLD_SIZE="2",
                CUDA_VISIBLE_DEVICES=visible,
            ),
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 120
    while len([p for p in ready.iterdir() if not p.name.endswith(".tmp")]) < 2:
        if time.monotonic() > deadline:
            sys.exit("the ranks never started")
        time.sleep(0.05)
    (work / "inner.json").write_text(json.dumps({"ranks": [r.pid for r in ranks], "me": os.getpid()}))
    host = wait_for(work / "host.json")
    load.procs.update({gpu: [(host[str(rank.pid)], 8 << 30)] for gpu, rank in zip(RANK_GPUS, ranks)})
    gpus = tuple(gpu_collector.sample())
    collector = JobCollector(ranks[1].pid, stacks_enabled=False)
    tree = collector.collect(gpus)
    collector.close()
    jobs = discover_jobs(gpus)
    result = {"attached": job_json(tree), "discovered": [job_json(j) for j in jobs]}
    (work / "result.json").write_text(json.dumps(result))
    wait_for(work / "done.json")  # the test looks at the ranks from the host side meanwhile
    gpu_collector.close()
    use_nvml_library(None)
    for rank in ranks:
        rank.kill()
        rank.wait()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])

"""`gputop check --load`: a short load on idle GPUs, so the PCIe links train up, and a short all-reduce.

The load runs in a child process (`gputop.collect.gpu_load_job`, which imports torch; gputop itself never
does) while the check samples the GPUs, so the link check sees every GPU busy.  The child then times an
all-reduce across all GPUs; `machine_check.check_allreduce` compares its busbw with the topology's links.

It refuses to run where it could disturb someone: on a simulated machine (there is nothing to load), without
a driver, and whenever any process already holds memory on a GPU.  The child is ours, bounded in time, and
killed by its PID if it overstays.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from typing import Optional, Protocol

from gputop.analysis.machine_check import LoadOutcome
from gputop.model import AllReduceResult, MachineInfo, Snapshot

STARTUP_TIMEOUT_S = 90.0  # torch import and a CUDA context on every GPU
ALLREDUCE_TIMEOUT_S = 60.0  # after the load phase
ALLREDUCE_BYTES = 256 * 2**20  # per GPU: large enough for busbw to approach the links' rate (nccl-tests' plateau)
ALLREDUCE_ITERATIONS = 20
STARTED = "LOADING"  # the child prints this when the load begins


def processes_on_gpus(snapshot: Snapshot) -> list[str]:
    """ "GPU 2: PID 1234"-style lines for every process NVML shows on a GPU (ours excepted)."""
    me = os.getpid()
    return [f"GPU {g.index}: PID {p.pid}" for g in snapshot.gpus for p in g.processes or () if p.pid != me]


class LoadRun:
    """The child running the load; `finish()` gives its outcome."""

    def __init__(self, skipped: Optional[str] = None, proc: Optional[subprocess.Popen[str]] = None) -> None:
        self.skipped = skipped
        self.proc = proc
        self._started = threading.Event()
        self._lines: list[str] = []
        if proc is not None:
            threading.Thread(target=self._read, name="gputop-load-out", daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line == STARTED:
                self._started.set()
            elif line:
                self._lines.append(line)
        self._started.set()  # it ended (or failed) before loading: nobody should wait longer

    def wait_started(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        if self.proc is not None:
            self._started.wait(timeout)

    def finish(self) -> LoadOutcome:
        if self.proc is None:
            return LoadOutcome(skipped=self.skipped)
        try:
            self.proc.wait(timeout=ALLREDUCE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own child, by its PID
            self.proc.wait()
            return LoadOutcome(allreduce_skipped=f"the load job did not finish within {ALLREDUCE_TIMEOUT_S:.0f} s")
        stderr = self.proc.stderr.read() if self.proc.stderr is not None else ""
        return outcome_from_job(self._lines, self.proc.returncode, stderr)


def outcome_from_job(lines: list[str], returncode: int, stderr: str = "") -> LoadOutcome:
    """The child's last JSON line -> LoadOutcome (an unexpected end becomes a one-line reason)."""
    for line in reversed(lines):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if data.get("allreduce"):
            a = data["allreduce"]
            return LoadOutcome(
                allreduce=AllReduceResult(
                    gpus=int(a["gpus"]), bytes=int(a["bytes"]), seconds=float(a["seconds"]), iterations=int(a["iterations"])
                )
            )
        return LoadOutcome(skipped=data.get("skipped"), allreduce_skipped=data.get("allreduce_skipped"))
    last = (stderr.strip().splitlines() or [f"exit status {returncode}"])[-1]
    return LoadOutcome(skipped=f"the load job failed: {last}")


class LoadablePipeline(Protocol):
    """What `start_load` asks of the live pipeline (`gputop.pipeline.Pipeline`)."""

    @property
    def simulated(self) -> bool: ...

    @property
    def gpu(self) -> object: ...  # its GPU collector; None without NVML

    @property
    def machine(self) -> MachineInfo: ...

    def poll(self) -> Snapshot: ...


def start_load(pipeline: LoadablePipeline, seconds: float) -> LoadRun:
    """Start the load if this machine may be loaded; else a LoadRun that says why not."""
    if pipeline.simulated:
        return LoadRun("it needs a real GPU, and this is a simulated machine")
    if pipeline.gpu is None:
        return LoadRun(f"no GPU to load ({pipeline.machine.gpu_error})")
    busy = processes_on_gpus(pipeline.poll())
    if busy:
        return LoadRun(f"it only runs on idle GPUs, and {', '.join(busy[:4])}{' …' if len(busy) > 4 else ''} use them")
    if importlib.util.find_spec("torch") is None:
        return LoadRun("torch is not installed (pip install torch): gputop has no other way to load a GPU")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gputop.collect.gpu_load_job",
            "--seconds",
            f"{seconds:g}",
            "--bytes",
            str(ALLREDUCE_BYTES),
            "--iterations",
            str(ALLREDUCE_ITERATIONS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return LoadRun(proc=proc)

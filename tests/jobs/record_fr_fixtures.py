"""Re-record the flight recorder dumps in tests/fixtures/flight_recorder/: one folder per case of
tests/jobs/collective_job.py (3 gloo ranks under torchrun, rank 2 the odd one), each rank's dump as the job
wrote it (``rank_<N>``, the pickle torch's ``fr_trace`` reads), plus ``case.json`` (what was run).

    python tests/jobs/record_fr_fixtures.py [CASE ...]      # default: stuck mismatch size exit

The odd rank holds 10 s before it breaks: a rank's first dump with frames takes seconds (torch symbolizes them
once). Each job runs until its dumps show the case (the others entered the next all-reduce, and the odd rank did
what the case says), then it is killed and reaped.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "jobs" / "collective_job.py"
OUT = REPO / "tests" / "fixtures" / "flight_recorder"
RANKS = 3
ODD = 2
STEPS = 3  # so the collective the hang is in is seq STEPS + 1
DEADLINE_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entries(path: Path) -> list[dict]:
    try:
        return pickle.loads(path.read_bytes())["entries"]
    except (OSError, EOFError, pickle.UnpicklingError, KeyError):
        return []


def _pending(path: Path) -> set[tuple[int, str]]:
    return {(e["collective_seq_id"], e["profiling_name"]) for e in _entries(path) if not e["retired"]}


def _shows_case(folder: Path, case: str, job: subprocess.Popen) -> bool:
    others = all((STEPS + 1, "gloo:all_reduce") in _pending(folder / f"rank_{r}") for r in range(RANKS) if r != ODD)
    odd = folder / f"rank_{ODD}"
    if case == "stuck":
        return others and max((e["collective_seq_id"] for e in _entries(odd)), default=0) == STEPS
    if case == "mismatch":
        return others and (STEPS + 1, "gloo:broadcast") in _pending(odd)
    if case == "size":
        return others and any(e["input_sizes"] != [[1024]] for e in _entries(odd))
    return others and job.poll() is not None  # exit: the odd rank wrote its last dump and left; the job ended


def record(case: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dumps = Path(tmp)
        env = dict(os.environ, TORCH_FR_BUFFER_SIZE="100", TORCH_FR_DUMP_TEMP_FILE=str(dumps / "rank_"))
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS), "--master-addr", "127.0.0.1",
            "--master-port", str(_free_port()), str(JOB), "--case", case, "--odd-rank", str(ODD), "--steps", str(STEPS),
            "--dump-every", "0.5", "--hold-s", "10", "--timeout-s", "600",
        ]  # fmt: skip
        job = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + DEADLINE_S
            while not _shows_case(dumps, case, job):
                ended = job.poll() is not None and not _shows_case(dumps, case, job)  # a crash after its dumps is fine
                if time.monotonic() > deadline or (ended and case != "exit"):
                    raise SystemExit(f"{case}: the dumps never showed the case (job status {job.poll()})")
                time.sleep(0.2)
            folder = OUT / case
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for r in range(RANKS):
                shutil.copyfile(dumps / f"rank_{r}", folder / f"rank_{r}")
            meta = {"case": case, "ranks": RANKS, "odd_rank": ODD, "steps": STEPS, "argv": argv[3:]}
            (folder / "case.json").write_text(json.dumps(meta, indent=1) + "\n")
            print(f"{case}: recorded in {folder}")
        finally:
            # torchrun starts each rank in a session of its own: kill the whole tree while it holds together
            for proc in psutil.Process(job.pid).children(recursive=True) if job.poll() is None else []:
                proc.kill()
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
            job.wait()


if __name__ == "__main__":
    for name in sys.argv[1:] or ["stuck", "mismatch", "size", "exit"]:
        record(name)

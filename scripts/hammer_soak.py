"""1,000 real safe-point injections (refusals do not count) of gputop's real bootstrap into each kind of job
issue 34 names, one process each, checking after every injection that the job took another step:

    allocating  tests/jobs/harm_job.py: num_workers=0, the main thread inside torch's allocator
    refork      tests/jobs/harm_job.py --refork: 2 workers re-forked every 8 batches
    signals     tests/jobs/harm_job.py --signals: queued SIGRTMIN sent all along, each counted in C
    lightning   tests/jobs/train_job.py --framework lightning (2 persistent workers)
    hf          tests/jobs/train_job.py --framework hf (2 persistent workers)

    python scripts/hammer_soak.py                 # 1,000 each (about 15 minutes on 2 cores)
    python scripts/hammer_soak.py --ran 100 --only refork,signals

It exits 1 on any dead or frozen job, a started line that did not run, a lost or doubled signal, or a kind that
reached fewer than --ran real injections within twice as many tries.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness import train_jobs
from tests.harness.injection import hammer, markers, start_allocating_job
from tests.harness.processes import Spawner, wait_until

REPO = Path(__file__).resolve().parents[1]
HARM_JOB = REPO / "tests" / "jobs" / "harm_job.py"
LOCK_HOLDERS = REPO / "tests" / "jobs" / "lock_holders.c"
CHUNK = 100


def first_field(path: Path, index: int = 0) -> int:
    try:
        return int(path.read_text().split()[index])
    except (OSError, ValueError, IndexError):
        return -1


def start(spawn: Spawner, work: Path, kind: str) -> tuple[int, Path]:
    counter = work / f"{kind}.count"
    if kind == "allocating":
        pid, _read = start_allocating_job(spawn, work, kind)
        return pid, counter
    if kind in ("refork", "signals"):
        options = ["--refork"] if kind == "refork" else ["--signals", str(work / "lock_holders.so")]
        if kind == "signals":
            subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", options[1], str(LOCK_HOLDERS), "-lpthread"], check=True)
        proc = spawn([sys.executable, str(HARM_JOB), str(counter), *options], stdout=subprocess.DEVNULL)
        wait_until(lambda: first_field(counter) > 0, timeout=180, what=f"{kind} to step")
        return proc.pid, counter
    _proc, records = train_jobs.start(
        spawn, work, kind, "--framework", kind, "--workers", "2", "--persistent", "--sample-ms", "2", "--progress", str(counter)
    )
    return next(iter(records)), counter


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ran", type=int, default=1000, help="real injections wanted into each kind")
    parser.add_argument("--only", default="", help="comma-separated kinds")
    args = parser.parse_args()
    kinds = [k for k in args.only.split(",") if k] or ["allocating", "refork", "signals", "lightning", "hf"]
    work = Path(tempfile.mkdtemp(prefix="gputop-hammer-"))
    failed = False
    for kind in kinds:
        spawn = Spawner()
        started = time.monotonic()
        ran = refused = tries = 0
        harm = ""
        sent = 0
        stop = threading.Event()
        try:
            pid, counter = start(spawn, work, kind)
            sender = None
            if kind == "signals":

                def send() -> None:
                    nonlocal sent
                    while not stop.is_set():
                        os.kill(pid, signal.SIGRTMIN)
                        sent += 1
                        stop.wait(0.002)

                sender = threading.Thread(target=send)
                sender.start()
            try:
                while ran < args.ran and tries < 2 * args.ran and not harm:
                    tally = hammer(pid, min(CHUNK, args.ran - ran), lambda: first_field(counter), work / kind)
                    ran += tally.ran
                    refused += sum(tally.refused.values())
                    tries += tally.ran + sum(tally.refused.values())
                    if tally.harmed or tally.failed_calls:
                        harm = f"frozen after {tally.frozen_after}, dead after {tally.dead_after}, failed {tally.failed_calls}"
            finally:
                stop.set()
                if sender is not None:
                    sender.join()
            try:
                wait_until(lambda: markers(work / kind) >= ran, timeout=60)
            except AssertionError:
                said = (work / "bootstrap-error.txt").read_text() if (work / "bootstrap-error.txt").exists() else "nothing"
                harm = harm or f"{ran - markers(work / kind)} started lines never ran (the bootstrap raised: {said})"
            if kind == "signals":
                try:
                    wait_until(lambda: first_field(counter, 1) >= sent, timeout=60)
                except AssertionError:
                    pass
                if first_field(counter, 1) != sent:
                    harm = harm or f"signals: {sent} sent, {first_field(counter, 1)} received"
        finally:
            spawn.reap_all()
        bad = bool(harm) or ran < args.ran
        failed |= bad
        extra = f", {sent} signals sent and received once each" if kind == "signals" and not harm else ""
        print(
            f"{'FAIL' if bad else 'ok  '} {kind}: {ran} ran, {refused} refused in {tries} tries{extra}; "
            f"{harm or '0 dead, 0 frozen'} ({time.monotonic() - started:.0f}s)",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

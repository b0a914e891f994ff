"""Does a fix buy what gputop says?  A 12 s report's prediction against what the job achieves once restarted
with the advice (issue 37's held-out check; `tests/harness/fix_outcome.py` does the measuring, and
tests/test_prediction_outcome.py asserts the same on one run of each job).

For each job (`tests/jobs/train_job.py`, a starved loader of known cost): start it, run `gputop report --pid PID
--seconds 12 --format json` while counting its steps (its own `--progress` file), read the starvation finding's
advice and prediction, stop it, start it again with `--workers N` (the advice), let it warm up, and count its
steps for as long again.  One row per job and run:

    job  now(job)  now(gputop)  advice  predicted (range)  limited by  achieved  ach/pred  in range  [box load]

The jobs: an I/O-bound loader (samples spent asleep: more workers help until the step's compute bounds the job)
and a CPU-bound one (samples spent spinning on the CPU: two cores bound it).  The box is shared, so each row is
one measurement as it fell, with the box's load over it.

Usage: python benchmarks/bench_prediction.py [--seconds 12] [--only io|cpu] [--runs 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import kill_group, machine_line  # noqa: E402
from tests.harness.fix_outcome import JOBS, measure  # noqa: E402


def _start(argv: Sequence[str]) -> subprocess.Popen:
    return subprocess.Popen(list(argv), start_new_session=True, stdin=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--only", choices=sorted(JOBS))
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for name in [args.only] if args.only else list(JOBS):
                result = measure(name, args.seconds, Path(tmp) / f"{run}", _start, kill_group)
                print(result.row(), flush=True)
                print("  " + str(result.predicted.get("text") or result.note), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

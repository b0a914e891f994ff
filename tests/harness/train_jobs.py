"""The one place tests and benchmarks build command lines for the training job (tests/jobs/train_job.py):
the option sets each test starts it with, starting it and waiting until it is ready, and reading what it
wrote (its ready records, its step log: the truth a measurement is checked against)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from tests.harness.processes import free_port, wait_until

REPO = str(Path(__file__).resolve().parents[2])
JOB = str(Path(REPO) / "tests" / "jobs" / "train_job.py")
START_TIMEOUT_S = 120.0  # importing torch on two shared cores can be slow

# The diagnosis tests' input pipelines (4 samples a batch, no shuffling):
DIAGNOSIS_MODES = {
    # 2 workers, each sample sleeps 40 ms, a tiny step: the main thread waits for data
    "starved": ("--sample-ms", "40"),
    # num_workers=0 and a CPU-heavy sample: the main thread runs dataset code itself
    "starved0": ("--workers", "0", "--sample-ms", "30", "--spend", "wall"),
    # 2 workers; worker 0's 9th sample never returns (a read on a stalled mount): batches 0-3 arrive
    "hang": ("--hang-after", "8"),
    # trivial samples; a wide model fed each batch 768 times over: compute-bound
    "compute": ("--features", "64", "--width", "1024", "--layers", "2", "--repeat", "768"),
    # num_workers=0, each sample sleeps 10-20 ms (I/O-like): slow but steady, never hung
    "slow0": ("--workers", "0", "--sample-ms", "10", "--sample-ms-max", "20"),
    # 2 workers, each sample sleeps 20 ms: slow but steady, never hung
    "slow2": ("--sample-ms", "20"),
}

# The framework tests' modes (2 persistent workers, 4 samples a batch; hf: a tiny GPT-2 from a config):
FRAMEWORK_MODES = {
    "starved": ("--sample-ms", "40"),
    # ~150 ms of compute a step, so a batch's hand-over (~1.3 ms in __next__) is <1% of it: at 40 ms a
    # step it was 3%, near the 5% "moderately input-bound" line, and read as input-bound about 1 run in 15
    "tuned": ("--features", "64", "--width", "1024", "--layers", "2", "--repeat", "512"),
    "hang": ("--hang-after", "8", "--ready-after", "1"),  # a hung job takes only a couple of steps
    # rank 1 holds rank 0 up.  Rank 0's own wait for data is the batch's hand-over, which must stay under the 5%
    # "fed" line for a straggler to be named: at 40 ms a sample (80 ms a step) it read 4% on a quiet box, and a run
    # on a busy one named rank 1 input-bound and no straggler; at 80 ms rank 0 reads 2%
    "straggler": ("--sample-ms", "80", "--slow-rank", "1"),
}
HF_TUNED = ("--width", "256", "--layers", "4", "--batch-size", "32")  # GPT-2's n_embd, n_layer
FRAMEWORK_WARM_STEPS = 10  # past the warm-up (workers forked, queues filled): observed in its steady state

# The steady jobs of issue 21's bar (numbers that hold still): each clearly input-bound, with a need for
# workers well inside the cap (I/O-bound sleeping samples: 32 a rank), 4 samples a batch, asleep
# (--spend sleep) so three of them and their reports share the 2 cores without slowing each other.
# Each waits near the middle of a band where the advised count, a whole number, can move by at most
# x1.3: num_workers=0 advises ceil(1.25 f / (1 - f)) for an input share f, 2 workers ceil(2.5 / (1 - f)).
STEADY_JOBS = {
    # Lightning, num_workers=0: 100 ms of samples a batch against a 28 ms step (--gpu-ms: the simulated GPU,
    # under which Lightning's ~3 ms of CPU work, more on a busy box, hides): waits ~78%, needs 5 (f in
    # 0.762-0.8 gives 5)
    "lightning": ("--framework", "lightning", "--workers", "0", "--sample-ms", "25", "--batch-size", "4", "--gpu-ms", "28"),
    # the plain loop, 2 workers: 120 ms a batch each, so one batch every 60 ms, against an 18 ms step (--gpu-ms:
    # the simulated GPU, under which the loop's CPU work hides; an 8 ms step asleep after that work read 0.56-0.67
    # beside the benchmark's 0.69 at load 29): waits ~70%, needs ~9 workers (f in 0.64-0.75: 8 to 10)
    "plain": ("--workers", "2", "--sample-ms", "30", "--batch-size", "4", "--gpu-ms", "18"),
    # transformers' Trainer, num_workers=0: 80 ms of samples a batch against a 30 ms step (--gpu-ms: the
    # simulated GPU overlaps the Trainer's work on the CPU, as a real GPU's kernels overlap the host that queues
    # them): waits ~73%, needs 4 (f in 0.706-0.762 gives 4).  A step of the Trainer's CPU work plus 8 ms asleep
    # after it drifted with the box's load (14.7 ms quiet, 30 ms on a busy box), so the reports, run beside
    # two other series' reports, read shares 0.05-0.3 below the benchmark's wait, measured minutes before; under
    # 30 ms of GPU the host's 5-22 ms hides, and on a box at load 17 (2% idle) bench 0.726 and reports 0.72-0.74
    "hf": ("--framework", "hf", "--workers", "0", "--sample-ms", "20", "--batch-size", "4", "--gpu-ms", "30"),
}

# The attach tests' loop: workers sleeping 50 ms a sample (2 a batch), a 5 ms "GPU" step, short epochs.
ATTACH_LOOP = ("--batch-size", "2", "--sample-ms", "50", "--step-ms", "5", "--length", "64")
PIN_THREAD = ("--idle-thread", "pt_data_pin")  # named as torch names its pin-memory thread

# Lightning's subprocess launcher: one persistent worker a rank, 5 ms a sample.
LIGHTNING_RANKS = ("--framework", "lightning", "--workers", "1", "--persistent", "--sample-ms", "5")

# The failure drills' job: persistent workers sleeping 20 ms a sample, 2 a batch.
DRILL = ("--batch-size", "2", "--sample-ms", "20", "--persistent", "--seed", "0")

# The trace tests' jobs: each phase spins a known time (--sample-ms is the data phase: num_workers=0, so
# it is spent inside the DataLoader's __next__), and every step's phase boundaries are logged.
PHASED = ("--workers", "0", "--batch-size", "1", "--spend", "wall")

# The loader benchmark's jobs: a per-batch cost, a simulated GPU step, shuffled, every step logged.
BENCH_DEFAULTS = ("--workers", "0", "--shuffle", "--length", "400")


def command(*options: str, python: str = sys.executable, job: str = JOB) -> list[str]:
    """The job's command line: `python train_job.py OPTIONS` (`job`: a copy of it elsewhere)."""
    return [python, str(job), *options]


def torchrun_command(ranks: int, *options: str) -> list[str]:
    """The job under `torchrun --nproc-per-node RANKS` (gloo on 127.0.0.1, a free port)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        JOB,
        *options,
    ]


def framework_options(framework: str, mode: str) -> list[str]:
    if framework == "torchdata":  # the plain loop over torchdata's StatefulDataLoader
        base = ["--loader", "stateful"]
    else:
        base = ["--framework", framework]
    tuned = HF_TUNED if framework == "hf" and mode == "tuned" else ()
    return [*base, "--workers", "2", "--persistent", "--ready-after", str(FRAMEWORK_WARM_STEPS), *FRAMEWORK_MODES[mode], *tuned]


@dataclass(frozen=True)
class FrameworkCase:
    """One framework job of the framework tests: the live ones (tests/acceptance/test_frameworks.py) and the
    recordings their replays read (scripts/record_framework_fixtures.py, tests/test_framework_replays.py)."""

    framework: str  # lightning, hf, torchdata, deepspeed; "plain": the plain loop, no framework
    mode: str  # FRAMEWORK_MODES (the plain loop's: DIAGNOSIS_MODES)
    options: tuple[str, ...] = ()
    ranks: int = 1
    torchrun: bool = False  # deepspeed.initialize wants a launcher's env; Accelerate's dispatcher two ranks
    attach: str = "rank0"  # the PID gputop is given: a rank's ("rank0", "rank1"), or the launcher's


FRAMEWORK_CASES = {
    **{f"lightning-{mode}": FrameworkCase("lightning", mode) for mode in ("starved", "tuned", "hang")},
    **{
        f"lightning-2-{mode}": FrameworkCase("lightning", mode, ("--devices", "2"), ranks=2)
        for mode in ("starved", "tuned", "straggler")
    },
    # the same starved job, attached from rank 1's PID: a DDP job without a launcher is found whole from either rank
    "lightning-2-starved-rank1": FrameworkCase("lightning", "starved", ("--devices", "2"), ranks=2, attach="rank1"),
    **{f"hf-{mode}": FrameworkCase("hf", mode) for mode in ("starved", "tuned", "hang")},
    # two ranks and an IterableDataset: Accelerate's DataLoaderDispatcher has rank 0 read every batch and broadcast it
    "hf-iterable-starved": FrameworkCase("hf", "starved", ("--iterable",), ranks=2, torchrun=True, attach="launcher"),
    **{f"torchdata-{mode}": FrameworkCase("torchdata", mode) for mode in ("starved", "tuned", "hang")},
    **{f"deepspeed-{mode}": FrameworkCase("deepspeed", mode, torchrun=True) for mode in ("starved", "tuned", "hang")},
    # the plain loop in the diagnosis modes, started as `start_diagnosis_job` starts it (ready at its first step)
    **{f"plain-{mode}": FrameworkCase("plain", mode) for mode in ("starved", "starved0", "hang", "compute")},
}


def case_options(case: FrameworkCase, out_dir: Optional[Path] = None) -> list[str]:
    """The job's options for `case`; a transformers Trainer writes (nothing, here) under `out_dir`."""
    if case.framework == "plain":
        return [*DIAGNOSIS_MODES[case.mode], *case.options]
    output = ["--output-dir", str(out_dir / "hf-out")] if case.framework == "hf" and out_dir is not None else []
    return [*framework_options(case.framework, case.mode), *case.options, *output]


# ----------------------------------------------------------------- ready records


def ready_records(prefix: Path) -> dict[int, dict]:
    """What the job's ranks wrote to PREFIX.PID once ready: {pid: {"pid", "rank", "thread_tid"}}."""
    found = {}
    for path in prefix.parent.glob(prefix.name + ".*"):
        if path.name.endswith(".tmp"):
            continue
        record = json.loads(path.read_text())
        found[record["pid"]] = record
    return found


def wait_ready(
    prefix: Path, count: int = 1, proc=None, timeout: float = START_TIMEOUT_S, log: Optional[Path] = None
) -> dict[int, dict]:
    """Wait until `count` ranks wrote their ready record; fail at once if `proc` (the job or its launcher)
    exits first, with the tail of `log`."""

    def exited() -> bool:
        return proc is not None and proc.poll() is not None

    def ready():
        records = ready_records(prefix)
        return records if len(records) >= count else None

    wait_until(lambda: ready() or exited(), timeout=timeout, what=f"{count} training rank(s) to be ready")
    records = ready()
    if not records:
        tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
        raise AssertionError(f"the training job exited with {proc.returncode} before it was ready\n{tail}")
    return records


def start(
    spawn,
    tmp_path: Path,
    name: str,
    *options: str,
    python: str = sys.executable,
    job: str = JOB,
    ranks: int = 1,
    torchrun: bool = False,
    timeout: float = START_TIMEOUT_S,
    env: Optional[dict] = None,
    state_dir: Optional[Path] = None,
):
    """Start the job (the interpreter itself, or torchrun), its output in NAME.log, and wait until `ranks`
    rank(s) are ready; its ready files go in `state_dir` (default: tmp_path).  Returns (proc, {pid: ready record})."""
    state_dir = state_dir or tmp_path
    prefix, log = state_dir / f"{name}.ready", tmp_path / f"{name}.log"
    argv = torchrun_command(ranks, *options) if torchrun else command(*options, python=python, job=job)
    with open(log, "wb") as out:
        proc = spawn([*argv, "--ready", str(prefix)], stdout=out, stderr=out, env=env)
    return proc, wait_ready(prefix, ranks, proc, timeout, log)


def attach_loop_command(*options: str, python: str = sys.executable) -> list[str]:
    return command(*ATTACH_LOOP, *options, python=python)


def start_attach_loop(spawn, tmp_path: Path, *options: str, ranks: int = 1, name: str = "loop") -> tuple:
    """The attach tests' loop with OPTIONS: (proc, sorted [(pid, idle thread's TID)] of its ranks)."""
    proc, records = start(spawn, tmp_path, name, *ATTACH_LOOP, *options, ranks=ranks)
    return proc, sorted((pid, r["thread_tid"]) for pid, r in records.items())


def start_diagnosis_job(spawn, tmp_path: Path, mode: str, python: str = sys.executable, timeout: float = START_TIMEOUT_S):
    """The job in one of DIAGNOSIS_MODES, once it has taken its first step."""
    proc, _ = start(spawn, tmp_path, mode, *DIAGNOSIS_MODES[mode], python=python, timeout=timeout)
    return proc


# ----------------------------------------------------------------- the step log


@dataclass(frozen=True)
class Step:
    step: int
    loss_hex: str
    wait_s: float  # inside next(): waiting for the batch
    t: float  # time.perf_counter() at the step's end == time.monotonic() here (both CLOCK_MONOTONIC)
    phases: tuple  # time.time() at the start of data, forward, backward, all-reduce, optimizer, and at the end


def read_steps(path: Path) -> list[Step]:
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            step = json.loads(line)
        except ValueError:  # a line being written
            continue
        out.append(Step(step["step"], step["loss"], step["wait_s"], step["mono"], tuple(step["t"])))
    return out


@dataclass
class Job:
    proc: object
    log: Path  # rank 0's step log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def steps(self) -> list[Step]:
        return read_steps(self.log)

    def wait_steps(self, n: int, timeout: float = 60.0) -> list[Step]:
        return wait_until(
            lambda: (s := self.steps()) and len(s) >= n and s, timeout=timeout, what=f"job {self.pid} to finish {n} steps"
        )


def bench_command(log_prefix: Path, *options: str) -> list[str]:
    """The loader benchmark's job, logging every step to LOG_PREFIX.0."""
    return command(*BENCH_DEFAULTS, "--step-log", str(log_prefix), *options)


def start_job(spawn, tmp_path: Path, name: str, *options: str, warm_steps: int = 8) -> Job:
    """Start a loader-benchmark job (python directly, not a shim, so its PID is the interpreter) and wait
    until warm: the first optimizer steps import lazily, and `warm_steps` keeps them out of any measurement."""
    prefix = tmp_path / name
    proc = spawn(
        bench_command(prefix, *options),
        cwd=REPO,
        stdout=open(tmp_path / f"{name}.out", "w"),
        stderr=open(tmp_path / f"{name}.err", "w"),
    )
    job = Job(proc, Path(f"{prefix}.0"))
    wait_until(job.log.exists, timeout=60, what="the job's step log")
    job.wait_steps(warm_steps)
    return job


def truth(steps: Sequence[Step], t0: float, t1: float) -> Optional[dict]:
    """The job's own view of [t0, t1]: batches/s and the fraction of time inside next()."""
    inside = [s for s in steps if t0 <= s.t <= t1]
    if len(inside) < 3:
        return None
    span = inside[-1].t - inside[0].t
    waits = sum(s.wait_s for s in inside[1:])  # the waits that happened inside the span
    return {
        "batches_per_s": (len(inside) - 1) / span,
        "wait_fraction": waits / span,
        "wait_per_batch_s": waits / (len(inside) - 1),
    }

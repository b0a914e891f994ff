"""Dense samples of each rank's main thread: `py-spy record`, for the shares the verdicts rest on.

A stack dump every 2 s gives 6 looks at a rank in a 12 s report, and a share of 6 looks moves by 17
points with each one: the advice built on it jumped between 3 and 25 workers from one report to the
next (issue 21).  Here each rank has a `py-spy record --idle --nonblocking` of its own, run in stretches
of 5-10 s; each stretch's main-thread samples are classified (the same rules as the dumps,
`gputop.analysis.stack_classes`) and handed over in time order as a `StateSamples`.  The dumps go on as
before: they carry the frames shown, the workers' stacks and the hang evidence.

``--nonblocking`` never pauses the job.  ``--idle`` keeps the samples of a main thread blocked on the
workers' queue (without it they are dropped: FACTS.md).  The speedscope format keeps the samples in the
order they were taken, so start-up can be cut at the sample and the intervals can allow for samples that
repeat each other.  A stretch ends with SIGINT, on which py-spy writes what it has: a report flushes the
last stretch at its end instead of waiting for it.

How often: `rate_for` shares a budget of samples a second among the ranks.  The monitor's screen asks
for BACKGROUND (10 Hz a rank, ~0.5% of a core each); a report and the open findings screen for FOCUSED
(up to 500 Hz a rank, ~6% of a core each, 2,000 a second in all): benchmarks/bench_state_sampler.py.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import psutil

from gputop.analysis.stack_classes import (
    FORWARD_BACKWARD,
    IDLE_OTHER,
    INPUT_WAIT_STATES,
    OPTIMIZER_STEP,
    classify_thread,
    read_source_line,
)
from gputop.clock import REAL_CLOCK, Clock
from gputop.collect.stacks import classify_failure, record_errors, usable_cpus
from gputop.model import Frame, StateSamples, ThreadStack


@dataclass(frozen=True)
class SamplingBudget:
    """At most `per_rank_hz` a rank, at most `total_hz` over all ranks, never under MIN_RATE_HZ; stretches
    of `stretch_s` seconds (each costs one py-spy start, ~15 ms of CPU).  And py-spy's CPU over all ranks at
    most `cpu_share` of the cores gputop may use, or `min_cores` on a small box: a sample costs 0.12 ms of
    py-spy's CPU on one machine and 0.7 ms on a VM whose reads of another process's memory are slow, so a
    rate alone would let a report take a third of a core there (`StateSampler.cost_per_sample_s`)."""

    per_rank_hz: int
    total_hz: int
    stretch_s: float
    cpu_share: float
    min_cores: float

    def cores(self, usable_cores: int) -> float:
        """The CPU py-spy may take over all ranks, in cores, on a machine where gputop may use `usable_cores`."""
        return max(self.min_cores, self.cpu_share * usable_cores)


# The screen: enough for a share over the last 60 s (600 samples a rank) at a cost the monitor can keep
# up all day (~0.5% of a core a rank: benchmarks/bench_state_sampler.py).  A report or the findings
# screen: enough that the advice holds still from one 12 s report to the next (issue 21: measured on a
# Lightning job, the advised count moved by x1.3 across reports at 100 Hz and by x1.1 at 500 Hz), within
# 5% of the cores (a tenth of one on a 2-core box: ~140 samples a second where a sample costs 0.7 ms).
BACKGROUND = SamplingBudget(per_rank_hz=10, total_hz=100, stretch_s=10.0, cpu_share=0.005, min_cores=0.03)
FOCUSED = SamplingBudget(per_rank_hz=500, total_hz=2000, stretch_s=5.0, cpu_share=0.05, min_cores=0.1)
MIN_RATE_HZ = 5
# What a sample costs before any stretch was measured: between a fast machine's 0.12 ms and a slow VM's 0.7.
PRIOR_COST_PER_SAMPLE_S = 0.0003
COST_WEIGHT = 0.5  # each measured stretch moves the estimate halfway to what it cost
MIN_COSTED_S = 1.0  # a stretch cut shorter is mostly py-spy's start: it says little of a sample's cost
# A rank whose training loop has not been seen yet is sampled at the FOCUSED rate for up to this long after
# gputop starts following it: a starved rank steps 2% of the time, which 10 samples a second may miss for
# many seconds (its loop's start, and so every share, would wait for it), and the first verdict rests on
# thousands of samples instead of dozens.
EAGER_S = 60.0
FLUSH_TIMEOUT_S = 3.0  # py-spy writes its file within ~50 ms of SIGINT; then it is killed
RETRY_AFTER_S = 5.0  # a stretch that failed (the rank exited, permission): wait before the next try
CLASSIFIED_STACKS = 4096  # distinct stacks whose classification is remembered (a loop has a few dozen)

# A rank has started training once a sample shows it in a step (forward/backward or the optimizer) after it
# was seen fetching a batch.  Waiting for the first batch is not enough (that wait is the workers starting,
# part of start-up), nor is a step before any fetch (a warm-up forward while the model is built).
STEP_STATES = (FORWARD_BACKWARD, OPTIMIZER_STEP)


def rate_for(
    ranks: int, budget: SamplingBudget, cost_per_sample_s: float = PRIOR_COST_PER_SAMPLE_S, usable_cores: int = 1
) -> int:
    """Samples a second for each of `ranks` ranks under `budget`, where a sample costs `cost_per_sample_s` of
    py-spy's CPU and gputop may use `usable_cores`."""
    total = min(budget.total_hz, int(budget.cores(usable_cores) / max(cost_per_sample_s, 1e-6)))
    return max(MIN_RATE_HZ, min(budget.per_rank_hz, total // max(1, ranks)))


def _record_argv(py_spy: str, pid: int, rate: int, out: str) -> list[str]:
    """`py-spy record` of every thread of `pid`, idle ones included, without stopping it, into speedscope JSON."""
    return [
        py_spy,
        "record",
        "--pid",
        str(pid),
        "--idle",
        "--nonblocking",
        "--threads",
        "--format",
        "speedscope",
        "--rate",
        str(rate),
        "--output",
        out,
    ]


def _cpu_seconds(pid: int) -> Optional[float]:
    """A live child's CPU time so far (user + system), or None once it is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


# ----------------------------------------------------------------- parsing py-spy's speedscope output


def main_thread_profile(data: dict[str, Any], pid: int) -> Optional[dict[str, Any]]:
    """The main thread's profile: py-spy names each "Thread TID "NAME"" (--threads); the main thread's TID
    is the PID on Linux, and Pythons that give no thread names still give that."""
    profiles: Sequence[dict[str, Any]] = data.get("profiles") or ()
    for profile in profiles:
        name = str(profile.get("name") or "")
        if '"MainThread"' in name:
            return profile
    for profile in profiles:
        if str(profile.get("name") or "").split(" ")[1:2] == [str(pid)]:
            return profile
    return None


class StateClassifier:
    """Main-thread state of a sampled stack, remembered per distinct stack (a training loop has a few
    dozen; classifying each of 500 samples a second anew would cost more than py-spy does)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._known: OrderedDict[tuple[Frame, ...], str] = OrderedDict()

    def state(self, frames: tuple[Frame, ...]) -> str:
        state = self._known.get(frames)
        if state is None:
            thread = ThreadStack(
                thread_id=self.pid, thread_name="MainThread", os_thread_id=self.pid, active=True, owns_gil=False, frames=frames
            )
            state = classify_thread(thread, lambda f: read_source_line(f.filename, f.line, self.pid))
            self._known[frames] = state
            if len(self._known) > CLASSIFIED_STACKS:
                self._known.popitem(last=False)
        return state


def parse_speedscope(text: str, pid: int, classifier: StateClassifier) -> list[str]:
    """The main thread's states, one per sample in time order, from py-spy's speedscope JSON.

    Each sample lists frame indices outermost first, behind a "thread (TID): NAME" root that --threads
    adds; gputop's frames are innermost first."""
    data = json.loads(text)
    profile = main_thread_profile(data, pid)
    if profile is None:
        return []
    shared = (data.get("shared") or {}).get("frames") or []
    frames = [
        Frame(name=str(f.get("name") or "?"), filename=str(f.get("file") or "?"), line=int(f.get("line") or 0)) for f in shared
    ]
    by_stack: dict[tuple[int, ...], str] = {}
    states: list[str] = []
    for sample in profile.get("samples") or ():
        key = tuple(sample)
        state = by_stack.get(key)
        if state is None:
            stack = tuple(frames[i] for i in reversed(key) if 0 <= i < len(frames))
            stack = tuple(f for f in stack if not f.name.startswith("thread ("))  # --threads' root
            state = by_stack[key] = classifier.state(stack)
        states.append(state)
    return states


def run_lengths(states: list[str]) -> tuple[tuple[str, int], ...]:
    return tuple((state, sum(1 for _ in run)) for state, run in itertools.groupby(states))


# ----------------------------------------------------------------- recording


class _RankRecorder:
    """One rank's stretches, one after the other, on a thread of its own (it mostly waits on py-spy)."""

    def __init__(self, owner: "StateSampler", pid: int) -> None:
        self.owner = owner
        self.pid = pid
        self.classifier = StateClassifier(pid)
        self.cut = threading.Event()  # end the current stretch now (a flush, a new rate, closing)
        self.stopped = False
        self.running = False  # a stretch is being recorded
        self.finished = 0  # stretches ended so far (flush() waits for this to move)
        self.followed_at = owner.clock.elapsed()
        self.thread = threading.Thread(target=self._loop, name=f"gputop-sampler-{pid}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped and not self.owner.closed:
            if not self.owner.wanted:
                self.owner.wake.wait(1.0)
                continue
            self.running = True
            try:
                stretch = self._stretch()
                if stretch is not None:
                    self.owner.deliver(stretch)
            finally:
                self.running = False
                self.owner.stretch_ended(self)
            if stretch is not None and stretch.error is not None:
                self.cut.wait(RETRY_AFTER_S)
                self.cut.clear()

    def _samples(
        self, out: str, err_path: str, started: float, ended: float, rate: int, cut_short: bool
    ) -> Optional[StateSamples]:
        """The stretch py-spy recorded into `out` (its complaints in `err_path`): the runs of main-thread states,
        or why there are none; None when we ended it before it had anything to say (a new rate, a flush)."""
        try:
            with open(err_path, encoding="utf-8", errors="replace") as f:
                stderr = f.read()
            with open(out, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            text = stderr = ""
        if not text.strip():
            if self.stopped or self.owner.closed or cut_short:
                return None  # ended by us before py-spy's first sample (a new rate, a flush): no failure
            return StateSamples(self.pid, started, ended, rate, error=classify_failure(self.pid, stderr))
        try:
            states = parse_speedscope(text, self.pid, self.classifier)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            return StateSamples(self.pid, started, ended, rate, error=f"py-spy output unreadable ({exc})")
        errors = record_errors(stderr)
        if not states and (cut_short or self.stopped or self.owner.closed):
            return None  # ended by us before py-spy caught the main thread (a new rate, a flush): no failure
        if not states:
            return StateSamples(
                self.pid, started, ended, rate, errors=errors, error="py-spy saw no samples of the rank's main thread"
            )
        return StateSamples(
            self.pid, max(started, ended - len(states) / rate), ended, rate, runs=run_lengths(states), errors=errors
        )

    def _stretch(self) -> Optional[StateSamples]:
        budget = self.owner.budget_for(self)
        rate = self.owner.rate(budget)
        try:
            fd, out = tempfile.mkstemp(prefix=f"gputop-states-{self.pid}-", suffix=".json", dir=self.owner.tmpdir)
        except OSError as exc:  # closed meanwhile (its folder gone), or /tmp full
            if self.stopped or self.owner.closed:
                return None
            now = self.owner.clock.wall()
            return StateSamples(self.pid, now, now, rate, error=f"cannot write py-spy's output: {exc.strerror}")
        os.close(fd)
        err_path = out + ".err"
        argv = _record_argv(self.owner.py_spy, self.pid, rate, out)
        # the stretch is stamped on the pipeline's clock; py-spy's cost is measured over the real seconds it ran
        stamp = self.owner.clock.wall
        started, ran_from = stamp(), time.monotonic()
        try:
            with open(err_path, "wb") as err:
                try:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                        env=dict(os.environ, RUST_BACKTRACE="0"),
                    )
                except OSError as exc:
                    return StateSamples(self.pid, started, stamp(), rate, error=f"cannot run py-spy: {exc.strerror}")
                cut_short = self.cut.wait(budget.stretch_s)
                self.cut.clear()
                ended, ran_s = stamp(), time.monotonic() - ran_from
                if proc.poll() is None:
                    cpu = _cpu_seconds(proc.pid)
                    if cpu is not None and ran_s >= MIN_COSTED_S:
                        self.owner.measured_cost(cpu, rate * ran_s)
                    proc.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
                try:
                    proc.wait(FLUSH_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if self.stopped or self.owner.closed:
                return None  # closed meanwhile: its temporary folder, these files with it, may be gone
            return self._samples(out, err_path, started, ended, rate, cut_short)
        finally:
            for path in (out, err_path):
                try:
                    os.unlink(path)
                except OSError:
                    pass


class StateSampler:
    """Densely samples a set of rank PIDs; `take()` hands over the stretches finished since the last call.

    `follow(pids)` sets the ranks (recorders start and stop with them); `wanted` pauses it all (the
    stacks switch); `focus(True)` raises the rate (a report, the findings screen); `flush()` ends the
    running stretches now and waits for them, so a report's last seconds are in it.  `clock` stamps the
    stretches and times each rank's eager start (the pipeline's: gputop/clock.py); py-spy runs in real time."""

    def __init__(self, py_spy: str, clock: Clock = REAL_CLOCK) -> None:
        self.py_spy = py_spy
        self.clock = clock
        self.tmpdir = tempfile.mkdtemp(prefix="gputop-states-")
        self.closed = False
        self.wanted = True
        self.focused = False
        self.starting: frozenset[int] = frozenset()  # ranks still starting up: sampled eagerly (EAGER_S)
        self.wake = threading.Event()
        self._ended = threading.Condition()
        self._lock = threading.Lock()
        self._recorders: dict[int, _RankRecorder] = {}
        self._done: list[StateSamples] = []
        self.cost_per_sample_s = PRIOR_COST_PER_SAMPLE_S  # py-spy's CPU a sample, as measured on this machine
        self.usable_cores = usable_cpus()

    def ranks(self) -> int:
        return len(self._recorders)

    def rate(self, budget: SamplingBudget) -> int:
        """Samples a second for each rank now: `budget` shared among the ranks, within its CPU."""
        return rate_for(self.ranks(), budget, self.cost_per_sample_s, self.usable_cores)

    def measured_cost(self, cpu_s: float, samples: float) -> None:
        """A stretch's py-spy took `cpu_s` of CPU (its start included) for `samples` asked of it."""
        if samples >= 1:
            with self._lock:
                self.cost_per_sample_s += COST_WEIGHT * (cpu_s / samples - self.cost_per_sample_s)

    def budget_for(self, recorder: _RankRecorder) -> SamplingBudget:
        """FOCUSED while someone reads the shares closely, or while this rank's loop is not yet seen (for
        EAGER_S after gputop began to follow it); BACKGROUND otherwise."""
        eager = recorder.pid in self.starting and self.clock.elapsed() - recorder.followed_at < EAGER_S
        return FOCUSED if self.focused or eager else BACKGROUND

    def follow(self, pids: list[int], starting: frozenset[int] = frozenset()) -> None:
        """Sample these ranks from now on; `starting`: those whose training loop has not been seen yet."""
        if self.closed:
            return
        self.starting = starting
        with self._lock:
            wanted = set(pids)
            for pid in [p for p in self._recorders if p not in wanted]:
                recorder = self._recorders.pop(pid)
                recorder.stopped = True
                recorder.cut.set()
            added = [pid for pid in pids if pid not in self._recorders]
            for pid in added:
                self._recorders[pid] = _RankRecorder(self, pid)
        if added and len(self._recorders) > len(added):
            self._restart()  # more ranks share the budget: the running stretches take the new rate

    def focus(self, focused: bool) -> None:
        if focused != self.focused:
            self.focused = focused
            self._restart()

    def set_wanted(self, wanted: bool) -> None:
        if wanted != self.wanted:
            self.wanted = wanted
            if wanted:
                self.wake.set()
            else:
                self._restart()  # the running stretches end now, not at their natural end

    def _restart(self) -> None:
        for recorder in list(self._recorders.values()):
            recorder.cut.set()

    def deliver(self, stretch: StateSamples) -> None:
        with self._lock:
            self._done.append(stretch)

    def stretch_ended(self, recorder: _RankRecorder) -> None:
        with self._ended:
            recorder.finished += 1
            self._ended.notify_all()

    def take(self) -> tuple[StateSamples, ...]:
        with self._lock:
            done, self._done = self._done, []
        return tuple(done)

    def flush(self, timeout: float = FLUSH_TIMEOUT_S + 1.0) -> None:
        """End the running stretches now and wait until each has been handed over (a report's end)."""
        with self._ended:
            running = {r: r.finished for r in self._recorders.values() if r.running}
        for recorder in running:
            recorder.cut.set()
        with self._ended:
            self._ended.wait_for(lambda: all(r.finished > n for r, n in running.items()), timeout)

    def close(self) -> None:
        self.closed = True
        self.wake.set()
        for recorder in list(self._recorders.values()):
            recorder.stopped = True
            recorder.cut.set()
        for recorder in list(self._recorders.values()):
            recorder.thread.join(FLUSH_TIMEOUT_S + 1.0)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


# ----------------------------------------------------------------- start-up


# A rank never seen in a step after this long of sampling is taken as running whatever it runs (a loop
# gputop does not recognise, inference): from then on nothing more is left out as start-up.
STARTUP_GIVE_UP_S = 60.0


class StartupWatch:
    """When each rank's training loop began: its first step seen, in a dense stretch or a dump.

    Before it, the rank is importing, building its model or starting its workers, and its samples are
    start-up: left out of the shares (a 30 s verdict on a job that spent 10 of them importing torch read
    "moderately input-bound, 23%" where the job was 60% input-bound)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()  # the stack thread reports dumps, the poll thread stretches and asks
        self._first_seen: dict[int, float] = {}
        self._first_input: dict[int, float] = {}
        self._first_step: dict[int, float] = {}
        # the first step or fetch since the latest start-up-like sample (idle/other: imports, the model build,
        # the rendezvous): where a loop never recognised is taken to begin when the watch gives up on it
        self._loop_like_since: dict[int, float] = {}
        self._started: dict[int, float] = {}

    def saw_stretch(self, stretch: StateSamples) -> None:
        if stretch.error is not None or not stretch.runs:
            return
        with self._lock:
            self._saw_stretch(stretch)

    def _saw_stretch(self, stretch: StateSamples) -> None:
        self._seen(stretch.pid, stretch.start)
        total = sum(n for _, n in stretch.runs)
        seen = 0
        for state, n in stretch.runs:
            self._saw(stretch.pid, stretch.end - (total - seen) / stretch.rate, state)
            seen += n

    def _saw(self, pid: int, at: float, state: str) -> None:
        """The loop began at the first step taken on a batch: a step after the rank was seen fetching one.
        A step with no fetch before it is set-up (a warm-up forward, a shape check), not the loop."""
        if state == IDLE_OTHER:
            since = self._loop_like_since.get(pid)
            if since is not None and at >= since:
                del self._loop_like_since[pid]
            return
        if state in STEP_STATES or state in INPUT_WAIT_STATES:
            self._loop_like_since.setdefault(pid, at)
        if state in STEP_STATES:
            self._first_step.setdefault(pid, at)
            fetched = self._first_input.get(pid)
            if fetched is not None and fetched <= at:
                # the earliest such step: a dump (every ~2 s) often reports one before the stretch that
                # covers the same seconds ends, and the stretch's earlier steps must still count
                self._started[pid] = min(at, self._started.get(pid, at))
        elif state in INPUT_WAIT_STATES:
            self._first_input[pid] = min(at, self._first_input.get(pid, at))

    def saw_dump(self, pid: int, timestamp: float, state: Optional[str]) -> None:
        if state is None:
            return
        with self._lock:
            self._saw_dump(pid, timestamp, state)

    def _saw_dump(self, pid: int, timestamp: float, state: str) -> None:
        self._seen(pid, timestamp)
        self._saw(pid, timestamp, state)

    def _seen(self, pid: int, timestamp: float) -> None:
        self._first_seen[pid] = min(timestamp, self._first_seen.get(pid, timestamp))

    def status(self, pid: int) -> tuple[bool, Optional[float]]:
        """(starting up, when its loop began): (True, None) until its first step, then (False, time)."""
        with self._lock:
            return self._status(pid)

    def _status(self, pid: int) -> tuple[bool, Optional[float]]:
        started = self._started.get(pid)
        if started is not None:
            return False, started
        first = self._first_seen.get(pid)
        if first is None:
            return True, None
        if self._clock() - first >= STARTUP_GIVE_UP_S:
            # no step on a fetched batch recognised (synthetic data, a loop gputop does not know): count from
            # its first step or wait for data since it last looked like start-up, else from now on.  Not from
            # its first ever: a fetch seen early in a start-up that then spent 50 s importing and waiting in
            # the rendezvous (a busy box) would count all of that as the loop (a misfire read from it)
            since = self._loop_like_since.get(pid)
            self._started[pid] = since if since is not None else self._clock()
            return False, self._started[pid]
        return True, None

    def forget_except(self, pids: set[int]) -> None:
        with self._lock:
            self._forget_except(pids)

    def _forget_except(self, pids: set[int]) -> None:
        for table in (self._first_seen, self._first_input, self._first_step, self._loop_like_since, self._started):
            for pid in [p for p in table if p not in pids]:
                del table[pid]

"""The passive tier of the loader benchmark: sample a rank with ``py-spy record``, inject nothing.

``py-spy record --pid N --idle --nonblocking --format raw --threads --subprocesses --rate 100`` samples the
rank and its DataLoader workers without pausing them.  ``--idle`` matters: a main thread waiting on the
workers' queue is idle, and without it those samples are dropped (FACTS.md: 2 of 249 kept).  The raw
format gives one line per distinct stack, ``process P:"cmd";thread (TID): NAME;outer;...;inner COUNT``.

From the rank's MainThread samples: the fraction waiting for data (a DataLoader ``__next__`` or
``__iter__`` anywhere on the stack) and the fraction in dataset code (``num_workers=0``), classified by
`gputop.analysis.stack_classes` like every other stack in gputop; the fraction restarting epochs
(``DataLoader.__iter__``).  From the workers: their hottest activities and, with psutil, each worker's
CPU busy share.  Host-wide idle cores over the same window feed the worker cap.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import psutil

from gputop.analysis.stack_classes import (
    IN_DATASET,
    WAITING_FOR_DATA,
    classify_thread,
    format_frame,
    is_epoch_start_frame,
    worker_activity,
)
from gputop.collect.stacks import PY_SPY_INSTALL_HINT, classify_failure, find_py_spy, record_errors
from gputop.errors import GputopError
from gputop.model import Frame, ThreadStack

RATE_HZ = 100
_FRAME_RE = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_PROCESS_RE = re.compile(r"^process (\d+):")
_THREAD_RE = re.compile(r"^thread \((\d+|0x[0-9a-fA-F]+)\)(?::\s*(.*))?$")


@dataclass(frozen=True)
class Sample:
    """One distinct stack from py-spy's raw output and how many times it was seen."""

    pid: int
    thread_id: int
    thread_name: Optional[str]
    frames: tuple[Frame, ...]  # innermost FIRST, like py-spy dump and gputop.model
    count: int


@dataclass(frozen=True)
class PassiveResult:
    pid: int
    seconds: float
    main_samples: int = 0
    wait_fraction: Optional[float] = None  # waiting for data, dataset code at num_workers=0 included
    dataset_fraction: Optional[float] = None  # in dataset code on the main thread (num_workers=0)
    epoch_restart_fraction: Optional[float] = None  # inside DataLoader.__iter__ (workers re-forked)
    state_fractions: dict[str, float] = field(default_factory=dict)  # stack_classes label -> fraction
    worker_busy: tuple[tuple[int, float], ...] = ()  # (worker pid, CPU busy share 0..1)
    hottest_worker_frames: tuple[tuple[str, float], ...] = ()  # (activity, share of worker samples)
    hottest_main_frames: tuple[tuple[str, float], ...] = ()  # innermost main-thread frames
    idle_cores: Optional[float] = None  # host-wide, averaged over the window
    cpu_count: Optional[int] = None  # cores the rank may run on
    sample_errors: int = 0
    error: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "seconds": round(self.seconds, 3),
            "main_samples": self.main_samples,
            "wait_fraction": self.wait_fraction,
            "dataset_fraction": self.dataset_fraction,
            "epoch_restart_fraction": self.epoch_restart_fraction,
            "state_fractions": dict(self.state_fractions),
            "worker_busy": [{"pid": pid, "busy": share} for pid, share in self.worker_busy],
            "hottest_worker_frames": [{"frame": f, "share": s} for f, s in self.hottest_worker_frames],
            "hottest_main_frames": [{"frame": f, "share": s} for f, s in self.hottest_main_frames],
            "idle_cores": self.idle_cores,
            "cpu_count": self.cpu_count,
            "sample_errors": self.sample_errors,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PassiveResult":
        return cls(
            pid=int(data.get("pid") or 0),
            seconds=float(data.get("seconds") or 0.0),
            main_samples=int(data.get("main_samples") or 0),
            wait_fraction=data.get("wait_fraction"),
            dataset_fraction=data.get("dataset_fraction"),
            epoch_restart_fraction=data.get("epoch_restart_fraction"),
            state_fractions=dict(data.get("state_fractions") or {}),
            worker_busy=tuple((int(w["pid"]), float(w["busy"])) for w in data.get("worker_busy") or ()),
            hottest_worker_frames=tuple((f["frame"], float(f["share"])) for f in data.get("hottest_worker_frames") or ()),
            hottest_main_frames=tuple((f["frame"], float(f["share"])) for f in data.get("hottest_main_frames") or ()),
            idle_cores=data.get("idle_cores"),
            cpu_count=data.get("cpu_count"),
            sample_errors=int(data.get("sample_errors") or 0),
            error=data.get("error"),
        )


# ------------------------------------------------------------------------------------------ parsing


def _parse_frame(text: str) -> Frame:
    match = _FRAME_RE.match(text)
    if match is None:
        return Frame(name=text, filename="?", line=0)
    return Frame(name=match.group("name"), filename=match.group("file"), line=int(match.group("line") or 0))


def parse_raw(text: str) -> list[Sample]:
    """py-spy ``record --format raw --threads [--subprocesses]`` output -> samples (frames innermost first)."""
    samples = []
    for line in text.splitlines():
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        parts = stack.split(";")
        pid = None
        thread_id = 0
        thread_name = None
        frames_start = len(parts)
        for i, part in enumerate(parts):
            process = _PROCESS_RE.match(part)
            if process:
                pid = int(process.group(1))  # the last "process" entry is the one the thread belongs to
                continue
            thread = _THREAD_RE.match(part)
            if thread:
                thread_id = int(thread.group(1), 0)
                thread_name = (thread.group(2) or "").strip() or None
                frames_start = i + 1
                break
        if pid is None:
            continue
        frames = tuple(_parse_frame(p) for p in reversed(parts[frames_start:]))
        samples.append(Sample(pid=pid, thread_id=thread_id, thread_name=thread_name, frames=frames, count=int(count_text)))
    return samples


def _is_main_thread(sample: Sample) -> bool:
    if sample.thread_name is not None:
        return sample.thread_name == "MainThread"
    # Older Pythons: py-spy gives a pthread id and no name. The main thread's outermost frame is the
    # script's <module>; threads start from threading's _bootstrap.
    return sample.thread_id == sample.pid or bool(sample.frames and sample.frames[-1].name == "<module>")


def _thread(sample: Sample) -> ThreadStack:
    return ThreadStack(
        thread_id=sample.thread_id,
        thread_name=sample.thread_name,
        os_thread_id=sample.thread_id,
        active=True,
        owns_gil=False,
        frames=sample.frames,
    )


def _top(counter: Counter[str], total: int, n: int = 5) -> tuple[tuple[str, float], ...]:
    if not total:
        return ()
    return tuple((text, count / total) for text, count in counter.most_common(n))


def analyze(samples: Iterable[Sample], rank_pid: int, worker_pids: Iterable[int]) -> dict[str, Any]:
    """Fractions from parsed samples: the rank's main thread and the given workers only."""
    workers = set(worker_pids)
    states: Counter[str] = Counter()
    main_leaves: Counter[str] = Counter()
    worker_leaves: Counter[str] = Counter()
    main_total = 0
    restart = 0
    worker_total = 0
    for sample in samples:
        if sample.pid == rank_pid and _is_main_thread(sample):
            main_total += sample.count
            states[classify_thread(_thread(sample))] += sample.count
            if any(is_epoch_start_frame(f) for f in sample.frames):
                restart += sample.count
            if sample.frames:
                main_leaves[format_frame(sample.frames[0])] += sample.count
        elif sample.pid in workers and _is_main_thread(sample):
            worker_total += sample.count
            worker_leaves[worker_activity(_thread(sample))] += sample.count
    out: dict[str, Any] = {"main_samples": main_total}
    if main_total:
        out["state_fractions"] = {label: count / main_total for label, count in states.most_common()}
        out["wait_fraction"] = (states[WAITING_FOR_DATA] + states[IN_DATASET]) / main_total
        out["dataset_fraction"] = states[IN_DATASET] / main_total
        out["epoch_restart_fraction"] = restart / main_total
        out["hottest_main_frames"] = _top(main_leaves, main_total)
    out["hottest_worker_frames"] = _top(worker_leaves, worker_total)
    return out


# ------------------------------------------------------------------------------------------ sampling


def _cpu_seconds(pid: int) -> Optional[float]:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    seconds: float = times.user + times.system
    return seconds


def _idle_seconds() -> float:
    times = psutil.cpu_times()
    seconds: float = times.idle + getattr(times, "iowait", 0.0)
    return seconds


class PassiveSampler:
    """``start()`` launches py-spy for `seconds`; ``result()`` waits for it and returns the fractions."""

    def __init__(self, rank_pid: int, worker_pids: Iterable[int] = (), seconds: float = 5.0, rate: int = RATE_HZ) -> None:
        self.rank_pid = rank_pid
        self.worker_pids = tuple(worker_pids)
        self.duration = max(1, int(math.ceil(seconds - 1e-9)))  # py-spy takes whole seconds
        self.rate = rate
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._output: Optional[str] = None
        self._started = 0.0

    def start(self) -> None:
        py_spy = find_py_spy()
        if py_spy is None:
            raise GputopError(f"py-spy not found; {PY_SPY_INSTALL_HINT}")
        fd, self._output = tempfile.mkstemp(prefix="gputop-sample-", suffix=".raw")
        os.close(fd)
        argv = [
            py_spy,
            "record",
            "--pid",
            str(self.rank_pid),
            "--idle",  # the main thread waiting on the workers' queue is idle: keep those samples
            "--nonblocking",  # never pause the job
            "--format",
            "raw",
            "--threads",
            "--subprocesses",
            "--rate",
            str(self.rate),
            "--duration",
            str(self.duration),
            "--output",
            self._output,
        ]
        self._cpu_before = {pid: _cpu_seconds(pid) for pid in self.worker_pids}
        self._idle_before = _idle_seconds()
        self._started = time.monotonic()
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dict(os.environ, RUST_BACKTRACE="0"),
        )

    def wait(self, timeout: float) -> bool:
        """True once py-spy has finished sampling (within `timeout` seconds), False if still running."""
        assert self._proc is not None, "start() first"
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        """Kill py-spy early (the run was abandoned) and remove its file."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._output:
            try:
                os.unlink(self._output)
            except OSError:
                pass

    def result(self, timeout: Optional[float] = None) -> PassiveResult:
        assert self._proc is not None and self._output is not None, "start() first"
        try:
            _out, err = self._proc.communicate(timeout=timeout if timeout is not None else self.duration + 10)
        except subprocess.TimeoutExpired:
            self.stop()
            return PassiveResult(pid=self.rank_pid, seconds=0.0, error="py-spy did not finish sampling in time")
        wall = max(1e-6, time.monotonic() - self._started)
        idle = max(0.0, _idle_seconds() - self._idle_before) / wall
        busy = []
        for pid, before in self._cpu_before.items():
            after = _cpu_seconds(pid)
            if before is not None and after is not None:
                busy.append((pid, min(1.0, (after - before) / wall)))
        cpu_count: Optional[int]
        try:
            cpu_count = len(os.sched_getaffinity(self.rank_pid))
        except OSError:
            cpu_count = os.cpu_count()
        stderr = err.decode("utf-8", errors="replace")
        try:
            with open(self._output, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        finally:
            self._cleanup()
        error: Optional[str] = None
        if self._proc.returncode != 0 and not text:
            if "No python processes found" in stderr:  # record --subprocesses words it its own way
                error = f"not a Python process (py-spy found no Python in PID {self.rank_pid} or its children)"
            else:
                error = classify_failure(self.rank_pid, stderr)
            return PassiveResult(pid=self.rank_pid, seconds=wall, error=error, idle_cores=idle, cpu_count=cpu_count)
        found = analyze(parse_raw(text), self.rank_pid, self.worker_pids)
        if not found["main_samples"]:
            error = "py-spy saw no samples of the rank's main thread"
        return PassiveResult(
            pid=self.rank_pid,
            seconds=wall,
            main_samples=found["main_samples"],
            wait_fraction=found.get("wait_fraction"),
            dataset_fraction=found.get("dataset_fraction"),
            epoch_restart_fraction=found.get("epoch_restart_fraction"),
            state_fractions=found.get("state_fractions", {}),
            worker_busy=tuple(busy),
            hottest_worker_frames=found.get("hottest_worker_frames", ()),
            hottest_main_frames=found.get("hottest_main_frames", ()),
            idle_cores=idle,
            cpu_count=cpu_count,
            sample_errors=record_errors(stderr),
            error=error,
        )


def sample_passive(rank_pid: int, worker_pids: Iterable[int] = (), seconds: float = 5.0) -> PassiveResult:
    """Blocking: sample for `seconds` and return the result."""
    sampler = PassiveSampler(rank_pid, worker_pids, seconds)
    sampler.start()
    return sampler.result()

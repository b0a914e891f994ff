"""The loader benchmark: can this DataLoader feed the GPUs, and what settings would?

Two tiers, one result:
- passive (always): py-spy samples the rank (`gputop.collect.sampler`): data-wait fraction, dataset
  time at num_workers=0, worker CPU shares, hottest worker frames, idle cores;
- active (``allow_inject=True``): the agent (`gputop.inject.agent`) runs inside the rank, times the
  training's ``DataLoader.__next__`` (consumption), reads the loader's settings and sweeps a new loader
  over the same dataset in a forked copy.

Timeline of an active run bounded by S seconds (default 15)::

    0 ─ py-spy record (P s) ──────────┐
    0 ─ inject; agent times __next__ (P + ½ s) ┐ plan.json (idle cores → worker cap, time left)
                                       └─ sweep in a forked child ── result.json ─ S

`gputop.analysis.loader_math` turns the numbers into DataLoader kwargs with the arithmetic shown.
The TUI (key ``b``), ``gputop bench`` and the report call `run_benchmark` / `run_offline_benchmark`
and show `BenchResult.summary_lines()`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import psutil

from gputop.analysis import loader_math
from gputop.analysis.prediction import Prediction, config_forecast
from gputop.collect import cgroup
from gputop.collect.procfs import process_alive, read_stat
from gputop.collect.sampler import PassiveResult, PassiveSampler
from gputop.errors import GputopError, UsageError
from gputop.inject import injector

if TYPE_CHECKING:
    from gputop.model import JobTree, ThreadProgress

Progress = Callable[[float, str], None]

PASSIVE_SHARE = 0.3  # of the time bound, for py-spy and the consumption window (when active)
PASSIVE_MIN_S, PASSIVE_MAX_S = 1.0, 5.0
PASSIVE_ONLY_MAX_S = 6.0
AGENT_START_GRACE_S = 0.5  # the agent's window outlasts py-spy's, so the sweep starts after sampling
PLAN_WAIT_MAX_S = 10.0  # the agent's wait for gputop's plan, at most: then gputop has gone away
RESERVE_S = 1.5  # injection, fork, reading results: kept out of the sweep's share
ANSWER_GRACE_S = 3.0  # past the bound before we stop waiting for the agent
SLOWDOWN_NOTE = 0.9  # the bar: the job keeps >= 90% of its steps/s during the sweep


@dataclass(frozen=True)
class BenchResult:
    """Everything one benchmark found. `to_dict()` is the JSON of `gputop bench --json` and the report."""

    target: str  # "PID 123", "PID 456 (rank 0 of 4, launcher 123)", "loader mod:func"
    mode: str  # "passive" | "active" | "offline"
    pid: Optional[int] = None  # the rank that was measured
    seconds: float = 0.0  # wall time of the run
    passive: Optional[dict[str, Any]] = None
    consumption: Optional[dict[str, Any]] = None
    during_sweep: Optional[dict[str, Any]] = None
    settings: Optional[dict[str, Any]] = None  # the live loader's
    configs: tuple[dict[str, Any], ...] = ()
    recommendation: dict[str, Any] = field(default_factory=dict)  # DataLoader kwargs
    advice: dict[str, Any] = field(default_factory=dict)  # verdict, bottleneck, lines, workers_needed, cap
    notes: tuple[str, ...] = ()
    contention: bool = False
    free_cores: Optional[float] = None
    ranks_on_host: int = 1
    uses_cuda: Optional[bool] = None

    # ------------------------------------------------------------------ derived

    @property
    def producer_consumer_ratio(self) -> Optional[float]:
        """Best loader-only rate ÷ the rate the training would consume without waiting (1 / step)."""
        step = (self.consumption or {}).get("step_s")
        rates = [c["batches_per_s"] for c in self.configs if c.get("batches_per_s")]
        current = (self.settings or {}).get("num_workers")
        mine = [c["batches_per_s"] for c in self.configs if c.get("num_workers") == current and c.get("batches_per_s")]
        if not step or not rates:
            return None
        ratio: float = (max(mine) if mine else max(rates)) * step
        return ratio

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mode": self.mode,
            "pid": self.pid,
            "seconds": round(self.seconds, 2),
            "consumption": dict(self.consumption or {}),
            "during_sweep": dict(self.during_sweep) if self.during_sweep else None,
            "passive": dict(self.passive or {}),
            "settings": dict(self.settings) if self.settings else None,
            "configs": [dict(c) for c in self.configs],
            "producer_consumer_ratio": self.producer_consumer_ratio,
            "recommendation": dict(self.recommendation),
            "advice": dict(self.advice),
            "notes": list(self.notes),
            "contention": self.contention,
            "free_cores": self.free_cores,
            "ranks_on_host": self.ranks_on_host,
            "uses_cuda": self.uses_cuda,
            "predictions": [config_forecast(c, self.consumption).figures() for c in self.configs],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BenchResult":
        return cls(
            target=str(data.get("target", "")),
            mode=str(data.get("mode", "passive")),
            pid=data.get("pid"),
            seconds=float(data.get("seconds") or 0.0),
            passive=data.get("passive") or None,
            consumption=data.get("consumption") or None,
            during_sweep=data.get("during_sweep") or None,
            settings=data.get("settings") or None,
            configs=tuple(data.get("configs") or ()),
            recommendation=dict(data.get("recommendation") or {}),
            advice=dict(data.get("advice") or {}),
            notes=tuple(data.get("notes") or ()),
            contention=bool(data.get("contention")),
            free_cores=data.get("free_cores"),
            ranks_on_host=int(data.get("ranks_on_host") or 1),
            uses_cuda=data.get("uses_cuda"),
        )

    # ------------------------------------------------------------------ text

    def summary_lines(self) -> list[str]:
        """Human text for the TUI modal, the CLI and the report (no markup)."""
        lines = [f"Loader benchmark — {self.target} ({self.mode}, {self.seconds:.1f}s)"]
        if self.advice.get("verdict"):
            lines.append(f"Verdict: {self.advice['verdict']}")
        c = self.consumption or {}
        if c.get("batches_per_s"):
            lines.append(
                f"Training: {c['batches_per_s']:.2f} batches/s, data wait {c.get('wait_fraction', 0):.0%} "
                f"({c.get('wait_per_batch_s', 0) * 1000:.1f} ms per batch), step {c.get('step_s', 0) * 1000:.1f} ms"
            )
        p = self.passive or {}
        if p.get("wait_fraction") is not None:
            text = f"py-spy: main thread waits for data {p['wait_fraction']:.0%} of {p.get('main_samples', 0)} samples"
            if p.get("dataset_fraction"):
                text += f" (in dataset code {p['dataset_fraction']:.0%}: num_workers=0 builds batches on this thread)"
            lines.append(text)
        elif p.get("error"):
            lines.append(f"py-spy: {p['error']}")
        busy = p.get("worker_busy") or []
        if busy:
            shares = ", ".join(f"{w['busy']:.0%}" for w in busy[:8])
            lines.append(f"Workers' CPU busy: {shares}" + (" …" if len(busy) > 8 else ""))
        for frame in (p.get("hottest_worker_frames") or [])[:3]:
            lines.append(f"  worker hot frame: {frame['frame']} ({frame['share']:.0%} of worker samples)")
        if self.settings:
            s = self.settings
            lines.append(
                f"Live loader: num_workers={s.get('num_workers')}, batch_size={s.get('batch_size')}, "
                f"prefetch_factor={s.get('prefetch_factor')}, pin_memory={s.get('pin_memory')}, "
                f"persistent_workers={s.get('persistent_workers')}, sampler={str(s.get('sampler', '')).rsplit('.', 1)[-1]}"
                + (f", start method {s['start_method']}" if s.get("start_method") else "")
            )
        if self.configs:
            rate = (self.consumption or {}).get("batches_per_s")
            lines.append(
                "Loader alone (new DataLoader, same dataset)"
                + (f", and what each would give the training (now {rate:.2f} steps/s):" if rate else ":")
            )
            for cfg in self.configs:
                pf = cfg.get("prefetch_factor")
                forecast = config_forecast(cfg, self.consumption)
                buys = f"  → training {forecast.brief()}" if isinstance(forecast, Prediction) else ""
                lines.append(
                    f"  num_workers={cfg['num_workers']:<3} prefetch_factor={pf if pf is not None else '-':<4} "
                    f"pin_memory={str(bool(cfg.get('pin_memory'))):<5} {cfg.get('batches_per_s', 0):8.1f} batches/s{buys}"
                )
        ratio = self.producer_consumer_ratio
        if ratio is not None:
            lines.append(f"Producer/consumer ratio (current settings): {ratio:.2f} (≥ 1 keeps up)")
        if self.advice.get("lines"):
            lines.append("Arithmetic:")
            lines.extend(f"  {line}" for line in self.advice["lines"])
        if self.recommendation:
            lines.append(f"Recommendation: {loader_math.format_kwargs(self.recommendation)}")
        lines.extend(f"Note: {note}" for note in self.notes)
        return lines


# ---------------------------------------------------------------------------------------- helpers


def _report(progress: Optional[Progress], fraction: float, message: str) -> None:
    if progress is not None:
        try:
            progress(max(0.0, min(1.0, fraction)), message)
        except Exception:  # a broken progress display must not break the measurement
            pass


def training_job(pid: int) -> JobTree:
    """The job tree (no stacks) of the job `pid` belongs to; GputopError when it has no training process."""
    from gputop.collect.job_tree import JobCollector

    collector = JobCollector(pid, stacks_enabled=False)
    try:
        tree = collector.collect(())
    finally:
        collector.close()
    if not tree.ranks:
        raise GputopError(f"PID {pid} has no training process under it; pass a rank's or the launcher's PID")
    return tree


def resolve_rank(pid: int) -> tuple[int, tuple[int, ...], int, str]:
    """(rank pid, its worker pids, ranks on this host, target text) from any PID of the job."""
    tree = training_job(pid)
    rank = tree.ranks[0]
    rank_pid = rank.proc.pid
    workers = tuple(w.pid for w in rank.workers)
    target = f"PID {rank_pid}"
    if rank_pid != pid or len(tree.ranks) > 1:
        label = f"rank {rank.rank}" if rank.rank is not None else "first process"
        target += f" ({label} of {len(tree.ranks)}" + (f", launcher {tree.launcher.pid}" if tree.launcher else "") + ")"
    return rank_pid, workers, len(tree.ranks), target


def _hard_max_workers(cpu_count: Optional[float]) -> int:
    """Even workers that mostly wait on storage stop paying off at some point: 4 per core, at most 32."""
    return min(loader_math.HARD_MAX_WORKERS, 4 * max(1, int(cpu_count or os.cpu_count() or 1)))


def job_memory_room(rank_pid: int, limits: Optional[cgroup.Limits] = None) -> Optional[tuple[int, int]]:
    """(bytes the job may still take, its largest process's RSS): the host's available memory, or what the job's
    cgroup (memory.max) leaves over the rank and its children when that is less.  None when unreadable."""
    limits = limits if limits is not None else cgroup.read_limits(rank_pid)
    try:
        rank = psutil.Process(rank_pid)
        sizes = [rank.memory_info().rss] + [c.memory_info().rss for c in rank.children()]
        free = psutil.virtual_memory().available
    except (psutil.Error, OSError):
        return None
    if limits.memory:
        free = min(free, max(0, limits.memory - sum(sizes)))
    return int(free), max(sizes)


def _passive_worker_limit(rank_pid: int, passive: PassiveResult) -> tuple[int, str]:
    """The most workers per rank the passive advice may name, and why: the stated maximum (4 per core the
    rank may use, at most 32), and the job's free memory (its cgroup's memory.max when lower) over one
    process's RSS (a new worker is forked from the rank: it may grow to the rank's size)."""
    limits = cgroup.read_limits(rank_pid)
    cores: Optional[float] = passive.cpu_count
    if limits.cpu:
        cores = min(cores or limits.cpu, max(1, int(limits.cpu)))
    hard = _hard_max_workers(cores)
    why = f"cap: {hard} workers (4 per core of the {cores or os.cpu_count()} the job may use, at most {loader_math.HARD_MAX_WORKERS})"
    room = job_memory_room(rank_pid, limits)
    if room is None:
        return hard, why
    free, rss = room
    by_memory = max(1, int(free * 0.5 // max(rss, 1)))
    if by_memory < hard:
        return (
            by_memory,
            f"cap: {by_memory} workers (half of {free / (1 << 30):.1f} GiB free ÷ {rss / (1 << 30):.2f} GiB per process)",
        )
    return hard, why


def _contention_notes(
    free_cores: Optional[float],
    configs: Sequence[dict[str, Any]],
    consumption: Optional[dict[str, Any]],
    during: Optional[dict[str, Any]],
) -> tuple[bool, list[str]]:
    notes = []
    contention = False
    busiest = max((c.get("cores_used") or 0.0 for c in configs), default=0.0)
    kept = None
    if consumption and during and consumption.get("batches_per_s") and during.get("batches_per_s"):
        kept = during["batches_per_s"] / consumption["batches_per_s"]
    if configs and free_cores is not None and (busiest > free_cores + 0.25 or free_cores < 0.5):
        contention = True
        notes.append(
            f"measured under contention: {free_cores:.1f} cores were idle and the sweep used up to {busiest:.1f}; "
            "the job and the sweep competed, so loader-only rates read low"
        )
    elif kept is not None and kept < SLOWDOWN_NOTE:
        contention = True
        notes.append("measured under contention: the sweep slowed the job, so loader-only rates read low")
    if kept is not None:
        notes.append(f"the job kept {kept:.0%} of its speed during the sweep")
    return contention, notes


def _pin_memory_note(uses_cuda: Optional[bool]) -> str:
    if uses_cuda:
        return "pin_memory not measured: a forked copy cannot use CUDA; advised by rule (batches go to the GPU)"
    return "pin_memory not measured: the target has no CUDA context, so pinning has no effect here"


# ---------------------------------------------------------------------------------------- live


def run_benchmark(
    pid: int,
    *,
    seconds: float = 15.0,
    allow_inject: bool = False,
    progress: Optional[Progress] = None,
    results_root: Optional[tuple[str, str]] = None,
) -> BenchResult:
    """Benchmark the DataLoader of a running job within `seconds`. Raises GputopError with one line.

    results_root: (host path, target path) of the private base directory; defaults to the target's
    ``/tmp/gputop-bench-<uid>``.  Tests point it elsewhere.
    """
    if seconds <= 0:
        raise UsageError(f"--seconds must be greater than 0 (got {seconds:g})")
    with contextlib.ExitStack() as held:  # the injection lock, from before the agent starts until it has answered
        return _run_benchmark(pid, seconds, allow_inject, progress, results_root, held)


def _active_target(rank_pid: int, seconds: float, notes: list[str]) -> Optional[injector.Target]:
    """The rank to inject the agent into, or None (and a note why) when the active tier cannot run there; a
    bound too short for it, or a process that is no Python rank of this user's, is a one-line error instead."""
    min_active = PASSIVE_MIN_S + AGENT_START_GRACE_S + RESERVE_S + 1.0
    if seconds < min_active:
        raise UsageError(f"--seconds {seconds:g} is too short for the active benchmark; give it at least {min_active:g}")
    try:
        return injector.inspect_target(rank_pid)
    except GputopError as exc:
        if "no process" in str(exc) or "not a Python process" in str(exc) or "belongs to" in str(exc):
            raise
        notes.append(f"active tier not run: {exc}")
        return None


def _agent_config(seconds: float, passive_s: float) -> dict[str, float]:
    """How long the agent measures the loader's consumption, waits for the plan, sweeps and runs each config."""
    sweep_s = max(1.0, seconds - passive_s - AGENT_START_GRACE_S - RESERVE_S)
    return {
        "consumption_seconds": passive_s + AGENT_START_GRACE_S,
        # gputop writes the plan once it has read its own sampling, which on a busy box ends seconds after the
        # agent's window: a 2 s wait gave up and skipped the sweep (a CI run at a fifth of 2 cores).  The wait costs
        # the job nothing (a thread looking for a file), and a late plan shortens the sweep by as much (its
        # sweep_seconds count to gputop's deadline): so the agent waits as long as the sweep would have run
        "plan_wait_seconds": min(PLAN_WAIT_MAX_S, sweep_s),
        "sweep_seconds": sweep_s,
        "config_seconds": 3.0,
    }


def _sweep_plan(
    rank_pid: int, free_cores: Optional[float], ranks_on_host: int, deadline: float, passive: PassiveResult
) -> dict[str, Any]:
    """What the agent's sweep may use: the job's memory room, the idle cores, the time left before `deadline`."""
    sweep_seconds = max(0.5, deadline - time.monotonic() - RESERVE_S + 0.5)
    room = job_memory_room(rank_pid)
    return {
        # the sweep sizes itself from this, not from the host's MemAvailable: a job in a cgroup may have less
        "memory_free": room[0] if room is not None else None,
        "free_cores": free_cores or 0.0,
        "ranks_on_host": ranks_on_host,
        "sweep_seconds": sweep_seconds,
        "hard_max_workers": _hard_max_workers(passive.cpu_count),
    }


def _passive_seconds(seconds: float, active: bool) -> float:
    """py-spy's share of the bound: most of it without the agent, a part before the agent's sweep with it."""
    if active:
        return min(PASSIVE_MAX_S, max(PASSIVE_MIN_S, seconds * PASSIVE_SHARE))
    return min(PASSIVE_ONLY_MAX_S, max(PASSIVE_MIN_S, seconds - 1.0))


def _inject(
    target: injector.Target, run: injector.RunDir, rank_pid: int, notes: list[str], progress: Optional[Progress]
) -> tuple[Optional[injector.RunDir], Optional[ThreadProgress]]:
    """The agent into the rank: its run directory and the main thread's progress then, or (None, None) and a note
    why the active tier did not run (its directory removed)."""
    try:
        injector.inject_agent(target, run)
        at_injection = injector.main_thread_progress(rank_pid)
        _report(progress, 0.05, "agent started; timing the training's DataLoader")
        return run, at_injection
    except GputopError as exc:
        notes.append(f"active tier not run: {exc}")
        injector.remove_run_dir(run)
        return None, None


def _usable_idle_cores(passive: PassiveResult, rank_pid: int) -> Optional[float]:
    """The host's idle cores over the window, no more than the job's cgroup lets it use."""
    free_cores = passive.idle_cores
    cpu_limit = cgroup.read_limits(rank_pid).cpu
    if free_cores is not None and cpu_limit:
        free_cores = min(free_cores, cpu_limit)  # idle cores of the host the job's cgroup may not use
    return free_cores


def _raise_if_silent(run: injector.RunDir, rank_pid: int, at_injection: Optional[ThreadProgress]) -> None:
    """No answer from the agent: a job that stopped moving is the finding, not a failed benchmark (an answer stands:
    a main thread may rightly sit still, e.g. in a long sleep or a join, while the agent measures)."""
    failed = injector.bootstrap_error(run)
    if failed:
        raise GputopError(f"the agent's thread could not start in PID {rank_pid}: {failed}; the job was left as it was")
    frozen = injector.frozen_evidence(rank_pid, since=at_injection)
    if frozen:
        raise GputopError(frozen)


def _run_benchmark(
    pid: int,
    seconds: float,
    allow_inject: bool,
    progress: Optional[Progress],
    results_root: Optional[tuple[str, str]],
    held: contextlib.ExitStack,
) -> BenchResult:
    started = time.monotonic()
    deadline = started + seconds
    _report(progress, 0.0, f"finding the training process of PID {pid}")
    rank_pid, workers, ranks_on_host, target_text = resolve_rank(pid)
    injector.refuse_stopped(rank_pid)  # a frozen stack would read as a loader that never delivers
    if allow_inject:
        held.enter_context(injector.InjectionLock(rank_pid, "gputop bench"))
    job = _JobIdentity.of(rank_pid)
    notes: list[str] = []
    target = _active_target(rank_pid, seconds, notes) if allow_inject else None
    run = None
    at_injection = None
    passive_s = _passive_seconds(seconds, active=target is not None)
    if target is not None:
        config = _agent_config(seconds, passive_s)
        run = injector.prepare_run_dir(target, config, results_root)  # refuses a foreign-owned directory

    sampler = PassiveSampler(rank_pid, workers, passive_s)
    _report(progress, 0.02, f"sampling PID {rank_pid} with py-spy for {sampler.duration}s")
    sampler.start()
    try:
        if run is not None and target is not None:  # (a run directory is made for a target only)
            run, at_injection = _inject(target, run, rank_pid, notes, progress)
        passive_share = 0.3 if run is not None else 0.95
        while not sampler.wait(0.2):
            elapsed = time.monotonic() - started
            _report(progress, passive_share * min(1.0, elapsed / max(sampler.duration, 1e-6)), "sampling with py-spy")
        passive = sampler.result()
    except BaseException:
        sampler.stop()
        if run is not None:
            _abandon(run)
            injector.remove_run_dir(run)
        raise
    free_cores = _usable_idle_cores(passive, rank_pid)
    if run is None:
        return _finish_passive(started, target_text, rank_pid, passive, len(workers), notes, ranks_on_host, free_cores, progress)

    # ---- active: tell the agent how many workers the idle cores allow and how long it has
    plan = _sweep_plan(rank_pid, free_cores, ranks_on_host, deadline, passive)
    try:
        injector.write_run_file(run, "plan.json", plan)
        agent = _wait_for_agent(run, deadline + ANSWER_GRACE_S, progress, job)
        if agent is None:
            _raise_if_silent(run, rank_pid, at_injection)
        result = _combine(started, target_text, rank_pid, passive, agent, notes, ranks_on_host, free_cores)
    finally:
        injector.remove_run_dir(run)
    _report(progress, 1.0, "done")
    return result


def _finish_passive(
    started: float,
    target_text: str,
    rank_pid: int,
    passive: PassiveResult,
    n_workers: int,
    notes: list[str],
    ranks_on_host: int,
    free_cores: Optional[float],
    progress: Optional[Progress],
) -> BenchResult:
    if passive.error and not passive.main_samples:
        raise GputopError(f"cannot sample PID {rank_pid}: {passive.error}")
    max_workers, why = _passive_worker_limit(rank_pid, passive)
    advice = loader_math.recommend(
        current={"num_workers": n_workers},
        passive={
            "wait_fraction": passive.wait_fraction,
            "dataset_fraction": passive.dataset_fraction,
            "epoch_restart_fraction": passive.epoch_restart_fraction,
            "worker_busy": [{"pid": pid, "busy": share} for pid, share in passive.worker_busy],
        },
        free_cores=free_cores,
        ranks_on_host=ranks_on_host,
        max_workers=max_workers,
    )
    if advice.get("bottleneck"):
        advice["lines"].append(why)
    if not any(n.startswith("active tier not run") for n in notes):
        notes.append("passive only: run with --yes (or confirm in the TUI) for consumption, settings and the sweep")
    _report(progress, 1.0, "done")
    return BenchResult(
        target=target_text,
        mode="passive",
        pid=rank_pid,
        seconds=time.monotonic() - started,
        passive=passive.to_dict(),
        recommendation=advice["kwargs"] if advice.get("bottleneck") else {},
        advice=advice,
        notes=tuple(notes),
        free_cores=free_cores,
        ranks_on_host=ranks_on_host,
    )


@dataclass(frozen=True)
class _JobIdentity:
    """The measured rank as (PID, start time): a new process reusing the PID is not the job."""

    pid: int
    start_ticks: Optional[int]

    @classmethod
    def of(cls, pid: int) -> "_JobIdentity":
        stat = read_stat(pid)
        return cls(pid, stat.start_ticks if stat is not None else None)

    def alive(self) -> bool:
        stat = read_stat(self.pid)
        return stat is not None and stat.start_ticks == self.start_ticks and process_alive(self.pid)


def _wait_for_agent(
    run: injector.RunDir, hard_deadline: float, progress: Optional[Progress], job: Optional[_JobIdentity] = None
) -> Optional[dict[str, Any]]:
    """Poll the run directory for result.json, relaying the agent's progress; None at the deadline.
    Raises GputopError at once when the job dies (its agent died with it: nothing will answer)."""
    while True:
        result = injector.read_private_json(run.host_path, "result.json")
        if result is not None:
            return result
        state = injector.read_private_json(run.host_path, "progress.json") or {}
        if job is not None and not job.alive():
            _abandon(run, state)  # a sweep copy in its own process group outlives the job: end it
            raise GputopError(f"the job exited during the benchmark (PID {job.pid} is gone); nothing more to measure")
        if time.monotonic() >= hard_deadline:
            _abandon(run, state)
            return None
        _report(progress, 0.3 + 0.65 * float(state.get("fraction") or 0.0), state.get("message") or "agent running")
        time.sleep(0.1)


def _abandon(run: injector.RunDir, state: Optional[dict[str, Any]] = None) -> None:
    """Stop an agent that overran: tell it not to sweep, and kill a sweep child it left running."""
    try:
        injector.write_run_file(run, "plan.json", {"sweep": False, "sweep_off_reason": "gputop gave up waiting"})
    except (OSError, FileExistsError):
        pass
    pgid = (state or {}).get("sweep_pgid")
    if pgid:
        try:
            if psutil.Process(int(pgid)).ppid() and os.getpgid(int(pgid)) == int(pgid):
                os.killpg(int(pgid), signal.SIGKILL)
        except (psutil.Error, OSError, ValueError):
            pass


def _agent_notes(agent: dict[str, Any]) -> list[str]:
    """What the agent said beside its numbers: its error, a patch it could not undo, its and its sweep's notes."""
    notes = [agent["error"]] if agent.get("error") else []
    if agent.get("restored") is False:
        notes.append("WARNING: DataLoader.__next__ could not be restored in the job")
    notes.extend(agent.get("notes") or ())
    notes.extend((agent.get("sweep") or {}).get("notes") or ())
    return notes


def _combine(
    started: float,
    target_text: str,
    rank_pid: int,
    passive: PassiveResult,
    agent: Optional[dict[str, Any]],
    notes: list[str],
    ranks_on_host: int,
    free_cores: Optional[float],
) -> BenchResult:
    notes = list(notes)
    if agent is None:
        notes.append("the agent did not answer within the time bound; showing the passive numbers")
        return BenchResult(
            target=target_text,
            mode="passive",
            pid=rank_pid,
            seconds=time.monotonic() - started,
            passive=passive.to_dict(),
            notes=tuple(notes),
            free_cores=free_cores,
            ranks_on_host=ranks_on_host,
        )
    notes.extend(_agent_notes(agent))
    configs = tuple((agent.get("sweep") or {}).get("configs") or ())
    consumption = agent.get("consumption")
    during = agent.get("during_sweep")
    uses_cuda = agent.get("uses_cuda")
    contention, extra = _contention_notes(free_cores, configs, consumption, during)
    notes.extend(extra)
    if configs:
        notes.append(_pin_memory_note(uses_cuda))
    settings = agent.get("settings")
    advice = loader_math.recommend(
        current=settings or {},
        consumption=consumption,
        configs=configs,
        free_cores=free_cores,
        ranks_on_host=ranks_on_host,
        uses_cuda=uses_cuda,
        passive={"wait_fraction": passive.wait_fraction, "epoch_restart_fraction": passive.epoch_restart_fraction},
    )
    return BenchResult(
        target=target_text,
        mode="active",
        pid=rank_pid,
        seconds=time.monotonic() - started,
        passive=passive.to_dict(),
        consumption=consumption,
        during_sweep=during,
        settings=settings,
        configs=configs,
        recommendation=advice["kwargs"],
        advice=advice,
        notes=tuple(notes),
        contention=contention,
        free_cores=free_cores,
        ranks_on_host=ranks_on_host,
        uses_cuda=uses_cuda,
    )


# ---------------------------------------------------------------------------------------- offline


def _run_offline_helper(factory_spec: str, host_path: str, until: float, progress: Optional[Progress]) -> str:
    """The offline sweep's helper process, in a session of its own, until it ends or `until` (then killed with
    any DataLoader workers it left); what it wrote to stderr."""
    _report(progress, 0.0, f"starting a helper process for {factory_spec}")
    proc = subprocess.Popen(
        [sys.executable, os.path.join(host_path, "agent.py"), "--offline", factory_spec, host_path],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        cwd=os.getcwd(),
    )
    try:
        while proc.poll() is None and time.monotonic() < until:
            state = injector.read_private_json(host_path, "progress.json") or {}
            _report(progress, float(state.get("fraction") or 0.0), state.get("message") or "starting")
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # DataLoader workers the helper may have left
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()
        stderr = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
    return stderr


def run_offline_benchmark(
    factory_spec: str, *, seconds: float = 15.0, progress: Optional[Progress] = None, results_root: Optional[str] = None
) -> BenchResult:
    """``--loader MODULE:FUNCTION``: sweep the factory's DataLoader in a helper process (the monitor
    itself never imports torch).  The helper runs in its own session and is killed at the bound."""
    module, sep, func = factory_spec.partition(":")
    if not sep or not module or not func.isidentifier():
        raise UsageError(f"--loader wants MODULE:FUNCTION (e.g. train:make_loader), got {factory_spec!r}")
    if seconds <= 0:
        raise UsageError(f"--seconds must be greater than 0 (got {seconds:g})")
    started = time.monotonic()
    cpu_count = len(os.sched_getaffinity(0))
    free_cores = cpu_count * (1.0 - psutil.cpu_percent(interval=0.25) / 100.0)
    # The helper imports torch and the user's module first (seconds on a small machine); the bound
    # covers that too, so the agent gets an absolute CLOCK_MONOTONIC deadline.
    config = {
        "free_cores": free_cores,
        "hard_max_workers": _hard_max_workers(cpu_count),
        "deadline": started + seconds - RESERVE_S,
        "config_seconds": 3.0,
    }
    run = injector.prepare_local_run_dir(config, results_root)
    host_path = run.host_path
    try:
        stderr = _run_offline_helper(factory_spec, host_path, started + seconds + ANSWER_GRACE_S, progress)
        agent = injector.read_private_json(host_path, "result.json")
        partial = injector.read_private_json(host_path, "sweep.json")
    finally:
        injector.remove_run_dir(run)
    wall = max(1e-6, time.monotonic() - started)
    if agent is None:
        if partial and partial.get("configs"):
            agent = {"settings": None, "sweep": partial, "notes": ["the sweep hit the time bound and was stopped"]}
        else:
            last = (stderr.strip().splitlines() or ["no output"])[-1]
            raise GputopError(f"the offline benchmark of {factory_spec} gave no result within {seconds:g}s ({last})")
    if agent.get("error"):
        raise GputopError(agent["error"])
    sweep = agent.get("sweep") or {}
    configs = tuple(sweep.get("configs") or ())
    notes = list(agent.get("notes") or ()) + list(sweep.get("notes") or ())
    settings = agent.get("settings") or {}
    advice = loader_math.recommend_offline(
        current=settings, configs=configs, cap=sweep.get("worker_cap"), reason=notes[0] if notes and not configs else None
    )
    if configs:
        notes.append("pin_memory not measured: it only pays off when batches go to a GPU; set it True when they do")
    _report(progress, 1.0, "done")
    return BenchResult(
        target=f"loader {factory_spec}",
        mode="offline",
        seconds=wall,
        settings=settings or None,
        configs=configs,
        recommendation=advice["kwargs"],
        advice=advice,
        notes=tuple(notes),
        free_cores=free_cores,
    )

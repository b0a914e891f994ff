"""``gputop trace``: a bounded torch.profiler window inside every rank of a live job, and its summary.

    gputop ── finds the ranks (any PID of the job) ── injects the trace agent into each, in parallel
                      │                                   (gputop/inject/trace_agent.py: profiler on for
                      │                                    <= 10 s or N steps, then off: started and
                      │                                    stopped by the job's main thread between two steps)
                      └── waits for each result.json ── copies each rank's Chrome trace to -o DIR (gzip)
                                                      ── summarises it (gputop/analysis/trace_summary.py)
                                                      ── findings (gputop/analysis/checks/trace.py)

`run_trace` (live) and `trace_from_files` (traces someone already has) return the same `TraceResult`, whose
``to_dict()`` is the JSON of ``gputop trace --json`` and of the report's trace section.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from gputop.analysis import stack_classes, trace_summary
from gputop.analysis.checks.trace import check_trace
from gputop.collect import debug_server
from gputop.errors import GputopError, UsageError
from gputop.inject import injector
from gputop.model import Finding, ThreadProgress

Progress = Callable[[float, str], None]

MAX_SECONDS = 10.0  # the window's bound (the agent enforces it too)
DEFAULT_SECONDS = 5.0
EXPORT_GRACE_S = 30.0  # writing a busy 10 s trace can take a while on a loaded box
# How long each agent waits for the loop's next batch to open the window: a large model's step, an epoch's start
# that forks its workers.  Past the window it waits up to 8 s more for the stop (trace_agent's STOP_GRACE_S and
# PENDING_STOP_S), inside EXPORT_GRACE_S.
START_BOUND_S = 20.0
TRACE_SUFFIX = ".pt.trace.json.gz"  # what TensorBoard's profiler plugin and HTA look for
# Why a job's own debug server does not trace it (docs/trace.md has the measurement)
DEBUG_SERVER_NOTE = (
    "torch's debug server runs in {pids}; its torch_profile is not used: it runs the profiler from the server's"
    " thread (profile_all_threads), and a job that returned from main during it died with SIGABRT 6 times in 6;"
    " gputop injects its agent, which starts and stops the profiler on the training thread"
)


@dataclass(frozen=True)
class TraceResult:
    target: str
    ranks: tuple[dict[str, Any], ...] = ()
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    out_dir: Optional[str] = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "target": self.target,
            "out_dir": self.out_dir,
            "seconds": round(self.seconds, 2),
            "ranks": [dict(r) for r in self.ranks],
            "findings": [asdict(f) for f in self.findings],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TraceResult":
        return cls(
            target=str(data.get("target", "")),
            ranks=tuple(data.get("ranks") or ()),
            findings=tuple(Finding(**f) if isinstance(f, dict) else f for f in data.get("findings") or ()),
            notes=tuple(data.get("notes") or ()),
            out_dir=data.get("out_dir"),
            seconds=float(data.get("seconds") or 0.0),
        )

    def summary_lines(self) -> list[str]:
        """Text for the CLI, the TUI screen and the report (no markup)."""
        lines = [f"Trace — {self.target} ({self.seconds:.1f}s)"]
        if self.out_dir:
            lines.append(f"Chrome traces in {self.out_dir} (open in ui.perfetto.dev, TensorBoard or HTA)")
        header = f"{'rank':>5} {'pid':>8} " + " ".join(f"{p:>10}" for p in trace_summary.PHASES) + f" {'steps/s':>8}"
        lines.append(header)
        for r in self.ranks:
            phases = r.get("phases") or {}
            rate = r.get("steps_per_s")
            rank = "-" if r.get("rank") is None else str(r["rank"])
            lines.append(
                f"{rank:>5} {str(r.get('pid') or '-'):>8} "
                + " ".join(f"{phases.get(p, 0.0):>10.0%}" for p in trace_summary.PHASES)
                + f" {(f'{rate:.2f}' if rate else '-'):>8}"
            )
        for r in self.ranks:
            gpu = r.get("gpu")
            if gpu:
                overlap = gpu.get("comm_overlap")
                lines.append(
                    f"rank {r.get('rank')}: GPU kernels busy {gpu['busy']:.0%}, idle {gpu['idle']:.0%} "
                    f"(compute {gpu['compute']:.0%}, NCCL {gpu['comm']:.0%}"
                    + (f", {overlap:.0%} of it overlapped" if overlap is not None else "")
                    + ")"
                )
        if self.ranks and self.ranks[0].get("top_ops"):
            first = self.ranks[0]
            lines.append(f"Top ops on rank {first.get('rank')}'s main thread (inclusive time):")
            lines.extend(f"  {o['total_ms']:9.1f} ms {o['calls']:6d}×  {o['name']}" for o in first["top_ops"][:5])
        for f in self.findings:
            lines.append(f"Finding [{f.label}]: {f.summary}")
            lines.extend(f"  {e}" for e in f.evidence)
            lines.append(f"  Fix: {f.fix.splitlines()[0]}" if f.fix else "")
        lines.extend(f"Note: {n}" for n in self.notes)
        return [line for line in lines if line != ""]


def _report(progress: Optional[Progress], fraction: float, message: str) -> None:
    if progress is not None:
        try:
            progress(max(0.0, min(1.0, fraction)), message)
        except Exception:  # a broken display must not break the trace
            pass


def job_ranks(pid: int) -> tuple[list[tuple[int, Optional[int]]], str]:
    """[(pid, rank)] of every training process of the job that `pid` belongs to, and a label."""
    from gputop.bench import training_job

    ranks = [(r.proc.pid, r.rank) for r in training_job(pid).ranks]
    label = f"PID {pid}" + (f" ({len(ranks)} ranks)" if len(ranks) > 1 else "")
    return ranks, label


def _file_name(rank: Optional[int], pid: int) -> str:
    return f"rank{rank if rank is not None else 0}.pid{pid}{TRACE_SUFFIX}"


def _gzip_copy(src: str, dst: str) -> None:
    with open(src, "rb") as fin, gzip.open(dst, "wb", compresslevel=6) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def _window(seconds: Optional[float], steps: Optional[int]) -> float:
    """The profiled window's bound in seconds (UsageError, one line, for a bad --seconds or --steps)."""
    if seconds is not None and not 0 < seconds <= MAX_SECONDS:
        raise UsageError(f"--seconds must be between 0 and {MAX_SECONDS:g} (got {seconds:g}): the window is bounded")
    if steps is not None and steps <= 0:
        raise UsageError(f"--steps must be a positive number of steps (batches the training loop draws; got {steps})")
    return seconds if seconds is not None else (MAX_SECONDS if steps else DEFAULT_SECONDS)


def _output_dir(out_dir: Optional[str]) -> str:
    """The folder the per-rank traces go to, made now (GputopError, one line, if it cannot be)."""
    out_dir = os.path.abspath(out_dir or f"gputop-trace-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise GputopError(f"cannot create the output directory {out_dir}: {exc.strerror}") from None
    return out_dir


def _inject_all(
    runs: dict[int, tuple[injector.Target, injector.RunDir]],
) -> tuple[dict[int, str], dict[int, Optional[ThreadProgress]]]:
    """The trace agent into every rank at once, each on a thread of its own: why it failed, by rank PID, and each
    injected rank's main-thread progress at injection (to tell a frozen rank from a silent agent later)."""
    errors: dict[int, str] = {}
    at_injection: dict[int, Optional[ThreadProgress]] = {}

    def inject(rank_pid: int) -> None:
        target, run = runs[rank_pid]
        try:
            injector.inject_agent(target, run, agent_file="trace_agent.py", thread_name="gputop-trace-agent")
            at_injection[rank_pid] = injector.main_thread_progress(rank_pid)
        except GputopError as exc:
            errors[rank_pid] = str(exc)

    threads = [threading.Thread(target=inject, args=(p,), daemon=True) for p in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(injector.INJECT_TIMEOUT + 5)
    return errors, at_injection


def _rank_summary(
    rank_pid: int, rank: Optional[int], answer: dict[str, Any], run: injector.RunDir, out_dir: str
) -> dict[str, Any]:
    """One rank's trace copied (gzipped) into `out_dir` and summarised, with what its agent said of it."""
    src = os.path.join(run.host_path, answer.get("trace") or "trace.json")
    dst = os.path.join(out_dir, _file_name(answer.get("rank", rank), rank_pid))
    _gzip_copy(src, dst)
    summary = trace_summary.summarize_trace(trace_summary.load_trace(dst), trace_file=dst)
    name_sync_lines(summary, rank_pid)
    summary.update(
        rank=summary["rank"] if summary["rank"] is not None else answer.get("rank", rank),
        pid=rank_pid,
        memory_stats=answer.get("memory_stats") or {},
        window_steps=(answer.get("window") or {}).get("steps"),
        main_thread_recorded=summary["main_thread_events"] > 0,
    )
    return summary


def _rank_result(
    rank_pid: int,
    rank: Optional[int],
    answer: Optional[dict[str, Any]],
    run: injector.RunDir,
    since: Optional[ThreadProgress],
    window: float,
    out_dir: str,
) -> tuple[Optional[dict[str, Any]], list[str]]:
    """One rank's summary (None: no trace from it) and the notes on it, from its agent's answer (None: none came;
    `since`: its main thread's progress at injection, to tell a frozen rank from a silent agent)."""
    if answer is None:  # a job that stopped moving is the finding, not a silent agent
        failed = injector.bootstrap_error(run)
        return None, [
            (f"PID {rank_pid}: the agent's thread could not start: {failed}" if failed else None)
            or injector.frozen_evidence(rank_pid, since=since)
            or f"PID {rank_pid}: the agent did not answer within {START_BOUND_S + window + EXPORT_GRACE_S:g}s"
        ]
    if answer.get("error"):
        return None, [f"PID {rank_pid}: {answer['error']}"]
    notes = [f"PID {rank_pid}: {n}" for n in answer.get("notes") or ()]
    notes.extend(_leftover_notes(rank_pid, answer))
    summary = _rank_summary(rank_pid, rank, answer, run, out_dir)
    if not summary["main_thread_recorded"]:
        notes.append(f"PID {rank_pid}: the trace holds no op of the main thread")
    return summary, notes


def run_trace(
    pid: int,
    *,
    seconds: Optional[float] = None,
    steps: Optional[int] = None,
    out_dir: Optional[str] = None,
    with_stack: bool = False,
    progress: Optional[Progress] = None,
    results_root: Optional[tuple[str, str]] = None,
) -> TraceResult:
    """Trace every rank of the job for a bounded window; raises GputopError/UsageError with one line."""
    window = _window(seconds, steps)
    started = time.monotonic()
    _report(progress, 0.0, f"finding the ranks of PID {pid}")
    ranks, label = job_ranks(pid)
    out_dir = _output_dir(out_dir)
    config = {"seconds": window, "steps": steps or 0, "with_stack": with_stack, "start_bound_s": START_BOUND_S}
    runs: dict[int, tuple[injector.Target, injector.RunDir]] = {}
    notes = _debug_server_notes(ranks)
    held = contextlib.ExitStack()  # each rank's injection lock, until its agent has answered
    try:
        for rank_pid, _rank in ranks:
            target = injector.inspect_target(rank_pid)
            held.enter_context(injector.InjectionLock(rank_pid, "gputop trace"))
            runs[rank_pid] = (target, injector.prepare_run_dir(target, config, results_root, files=injector.TRACE_AGENT_FILES))
        _report(progress, 0.05, f"injecting the trace agent into {len(ranks)} rank(s)")
        errors, at_injection = _inject_all(runs)
        if len(errors) == len(ranks):
            raise GputopError(next(iter(errors.values())))
        notes.extend(f"PID {p}: {e}" for p, e in errors.items())
        answers = _wait_for_agents(
            {p: runs[p][1] for p, _r in ranks if p not in errors},
            time.monotonic() + START_BOUND_S + window + EXPORT_GRACE_S,
            progress,
        )
        summaries = []
        for rank_pid, rank in ranks:
            if rank_pid in errors:
                continue
            answer, since = answers.get(rank_pid), at_injection.get(rank_pid)
            summary, said = _rank_result(rank_pid, rank, answer, runs[rank_pid][1], since, window, out_dir)
            notes.extend(said)
            summaries += [summary] if summary is not None else []
    finally:
        for _target, run in runs.values():
            injector.remove_run_dir(run)
        held.close()
    if not summaries:
        raise GputopError("no rank answered with a trace: " + "; ".join(notes[:3]))
    summaries.sort(key=lambda s: (s["rank"] is None, s["rank"] or 0, s["pid"]))
    return TraceResult(
        target=label,
        ranks=tuple(summaries),
        findings=tuple(check_trace({"ranks": summaries})),
        notes=tuple(notes),
        out_dir=out_dir,
        seconds=time.monotonic() - started,
    )


def _debug_server_notes(ranks: Sequence[tuple[int, Optional[int]]]) -> list[str]:
    """One line when ranks run torch's debug server: why its profiler is not used (the trace injects anyway)."""
    served = [p for p, _rank in ranks if debug_server.find(p) is not None]
    if not served:
        return []
    pids = f"PID {served[0]}" if len(served) == 1 else "PIDs " + ", ".join(str(p) for p in served)
    return [DEBUG_SERVER_NOTE.format(pids=pids)]


def name_sync_lines(summary: dict[str, Any], pid: Optional[int]) -> dict[str, Any]:
    """Add to each sync site (a function, from ``--with-stack``) the lines in it that sync, read from the
    source as the traced process sees it (`pid`; None for a trace file: the paths as they are here)."""
    for site in summary.get("sync_sites") or ():
        parsed = trace_summary.parse_site(site["site"])
        if parsed is not None:
            site["lines"] = [
                {"line": line, "code": code} for line, code in stack_classes.sync_lines_in_function(*parsed, pid=pid)
            ]
    return summary


def _leftover_notes(pid: int, answer: dict[str, Any]) -> list[str]:
    notes = []
    if answer.get("profiler_left_on"):
        notes.append(f"PID {pid}: a profiler is still enabled after the window (not ours to stop)")
    if answer.get("threads_left"):
        notes.append(f"PID {pid}: threads started during the window still run: {', '.join(answer['threads_left'])}")
    return notes


def _wait_for_agents(
    runs: dict[int, injector.RunDir], deadline: float, progress: Optional[Progress]
) -> dict[int, dict[str, Any]]:
    answers: dict[int, dict[str, Any]] = {}
    while len(answers) < len(runs) and time.monotonic() < deadline:
        fractions = []
        for pid, run in runs.items():
            if pid in answers:
                fractions.append(1.0)
                continue
            result = injector.read_private_json(run.host_path, "result.json")
            if result is not None:
                answers[pid] = result
                fractions.append(1.0)
                continue
            if not os.path.exists(f"/proc/{pid}"):
                answers[pid] = {"error": "the process exited during the trace"}
                continue
            state = injector.read_private_json(run.host_path, "progress.json") or {}
            fractions.append(float(state.get("fraction") or 0.0))
        done = sum(fractions) / max(1, len(runs))
        _report(progress, 0.1 + 0.8 * done, f"profiling {len(runs)} rank(s): {len(answers)} done")
        time.sleep(0.1)
    return answers


def trace_from_files(paths: Sequence[str]) -> TraceResult:
    """Summarise traces that already exist (a file, several, or a directory of them)."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files.extend(
                sorted(
                    os.path.join(path, n) for n in os.listdir(path) if n.endswith((".json", ".json.gz")) and not n.startswith(".")
                )
            )
        else:
            files.append(path)
    if not files:
        raise UsageError(f"no trace files (*.json, *.json.gz) in {', '.join(paths)}")
    started = time.monotonic()
    summaries = []
    for path in files:
        try:
            summaries.append(name_sync_lines(trace_summary.summarize_file(path), None))
        except trace_summary.TraceFormatError as exc:
            raise UsageError(str(exc)) from None
    summaries.sort(key=lambda s: (s["rank"] is None, s["rank"] or 0, s["trace_file"]))
    label = files[0] if len(files) == 1 else f"{len(files)} trace files"
    return TraceResult(
        target=label,
        ranks=tuple(summaries),
        findings=tuple(check_trace({"ranks": summaries})),
        seconds=time.monotonic() - started,
    )

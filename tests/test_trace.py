"""`gputop trace` end to end on real training jobs (tests/jobs/train_job.py with phase times), and the agent in this process.

The job spins known times in its data, forward, backward and optimizer phases and logs `time.time()` at
every phase boundary, so the true share of each phase over the profiled window is known exactly.
"""

from __future__ import annotations

import gzip
import inspect
import json
import os
import threading
import time
from pathlib import Path

import pytest

from gputop.analysis import trace_summary
from gputop.inject import trace_agent
from gputop.tracing import name_sync_lines
from tests.harness.processes import run_gputop, wait_until
from tests.harness.train_jobs import PHASED, start

PHASE_TOLERANCE = 0.05  # the bar


def job_truth(log_path: str, lo: float, hi: float) -> dict[str, float]:
    """The job's own share of each phase over [lo, hi] (unix seconds), from its step log."""
    spent = dict.fromkeys(("data", "forward", "backward", "comm", "optimizer"), 0.0)
    with open(log_path) as f:
        for line in f:
            t = json.loads(line)["t"]
            for phase, a, b in zip(spent, t, t[1:]):
                spent[phase] += max(0.0, min(b, hi) - max(a, lo))
    return {p: s / (hi - lo) for p, s in spent.items()}


def trace_window(path: str) -> tuple[float, float]:
    """The profiled window in unix seconds: the profiler's Trace event plus baseTimeNanoseconds."""
    data = trace_summary.load_trace(path)
    window = max((e for e in data["traceEvents"] if e.get("cat") == "Trace"), key=lambda e: e["dur"])
    base = data["baseTimeNanoseconds"] / 1e9
    return base + window["ts"] / 1e6, base + (window["ts"] + window["dur"]) / 1e6


def thread_ids(pid: int) -> set[int]:
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


def start_torchrun(spawn, tmp_path, *job_args):
    log = tmp_path / "steps"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc, _ = start(
        spawn, tmp_path, "job", *PHASED, "--step-log", str(log), *job_args, ranks=2, torchrun=True, timeout=120, env=env
    )
    return proc, str(log)


def run_trace_json(spawn, pid: int, out: Path, *extra: str) -> dict:
    ran = run_gputop(spawn, "trace", "--pid", str(pid), "-o", str(out), "--json", *extra, timeout=120)
    assert ran.rc == 0, ran.err
    return json.loads(ran.out)


@pytest.mark.alone(unless_prioritized=True)  # phase shares against the truth
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_rank_gloo_job_phases_match_the_truth(spawn, tmp_path):
    job, log = start_torchrun(
        spawn, tmp_path, "--sample-ms", "20", "--forward-ms", "15", "--backward-ms", "25", "--optimizer-ms", "10"
    )
    result = run_trace_json(spawn, job.pid, tmp_path / "out", "--seconds", "3")
    assert [r["rank"] for r in result["ranks"]] == [0, 1], result["notes"]
    for rank in result["ranks"]:
        # The main thread's ops are in the trace although the profiler ran on the agent's thread.
        assert rank["main_thread_recorded"] and rank["main_thread_events"] > 100, (rank["main_thread_events"], result["notes"])
        # One Chrome trace per rank, readable as such (gzip JSON with traceEvents).
        with gzip.open(rank["trace_file"], "rt") as f:
            chrome = json.load(f)
        assert isinstance(chrome["traceEvents"], list) and chrome["distributedInfo"]["rank"] == rank["rank"]
        lo, hi = trace_window(rank["trace_file"])
        truth = job_truth(f"{log}.{rank['rank']}", lo, hi)
        for phase, share in truth.items():
            assert rank["phases"][phase] == pytest.approx(share, abs=PHASE_TOLERANCE), (
                rank["rank"],
                phase,
                truth,
                rank["phases"],
            )
        assert rank["steps_per_s"] > 0
    assert not [f for f in result["findings"] if f["id"] == "trace_communication"]
    try:  # the traces open in Holistic Trace Analysis too, one rank each (when it is installed: not in CI)
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return
    assert sorted(TraceAnalysis(trace_dir=str(tmp_path / "out")).t.traces) == [0, 1]


@pytest.mark.alone(unless_prioritized=True)  # phase shares decide the finding
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_communication_heavy_job_gets_the_communication_finding(spawn, tmp_path):
    job, log = start_torchrun(
        spawn,
        tmp_path,
        "--sample-ms",
        "5",
        "--forward-ms",
        "5",
        "--backward-ms",
        "5",
        "--optimizer-ms",
        "2",
        "--comm-floats",
        "4000000",
    )
    result = run_trace_json(spawn, job.pid, tmp_path / "out", "--seconds", "3")
    rank = result["ranks"][0]
    lo, hi = trace_window(rank["trace_file"])
    assert job_truth(f"{log}.0", lo, hi)["comm"] > 0.3  # the job really is communication-bound
    found = [f for f in result["findings"] if f["id"] == "trace_communication"]
    assert found, result["findings"]
    assert found[0]["label"] == "your code" and "no_sync" in found[0]["fix"] and found[0]["evidence"]

    # The same finding in the report, with the trace's table (report --trace).
    ran = run_gputop(
        spawn,
        "report",
        "--pid",
        str(job.pid),
        "--seconds",
        "2",
        "--trace",
        "--trace-dir",
        str(tmp_path / "report-traces"),
        "--format",
        "json",
        timeout=180,
    )
    assert ran.rc == 0, ran.err
    report = json.loads(ran.out)
    assert "trace_communication" in [f["id"] for f in report["findings"]]
    assert [r["rank"] for r in report["trace"]["result"]["ranks"]] == [0, 1]
    assert any("comm" in line for line in report["trace"]["summary"])


def start_single(spawn, tmp_path, name, *args):
    log = tmp_path / name
    proc, _ = start(spawn, tmp_path, name, *PHASED, "--step-log", str(log), *args)
    return proc, f"{log}.0"


def losses(path: str) -> list[str]:
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_losses_are_bit_identical_with_a_trace_in_the_middle(spawn, tmp_path):
    args = ("--sample-ms", "5", "--forward-ms", "5", "--backward-ms", "5", "--optimizer-ms", "2")
    reference, ref_log = start_single(spawn, tmp_path, "reference", *args)
    traced, traced_log = start_single(spawn, tmp_path, "traced", *args)
    threads_before = thread_ids(traced.pid)
    before = len(losses(traced_log))
    result = run_trace_json(spawn, traced.pid, tmp_path / "out", "--seconds", "2")
    assert result["ranks"][0]["steps"] > 5  # the window covered training steps
    assert not [n for n in result["notes"] if "still" in n], result["notes"]
    # Nothing left behind in the job: our thread ends (torch's own threads from profiler start may stay:
    # none that we started), and training goes on.
    wait_until(
        lambda: not any(name == "gputop-trace-agent" for name in _thread_names(traced.pid)),
        timeout=20,
        what="the agent thread to end",
    )
    # torch's Kineto starts one C++ thread of its own at its first use in a process
    # (libkineto::ConfigLoader::updateConfigThread, a timed wait) and keeps it for the life of the process;
    # torch has no call to stop it.  So: at most that one new thread, and a second trace adds none.
    after_first = thread_ids(traced.pid)
    assert len(after_first - threads_before) <= 1
    run_trace_json(spawn, traced.pid, tmp_path / "out2", "--seconds", "1")
    wait_until(
        lambda: not any(name == "gputop-trace-agent" for name in _thread_names(traced.pid)),
        timeout=20,
        what="the second agent thread to end",
    )
    assert thread_ids(traced.pid) <= after_first
    n = len(losses(traced_log)) + 30
    wait_until(lambda: len(losses(traced_log)) >= n and len(losses(ref_log)) >= n, timeout=120, what="30 more steps")
    assert before < n - 30
    assert losses(traced_log)[:n] == losses(ref_log)[:n]


def _thread_names(pid: int) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
        except OSError:
            pass
    return names


# ------------------------------------------------------------------------- the agent, in this process


@pytest.mark.slow  # imports torch and trains under the profiler for a second: ~3.5 s
@pytest.mark.timeout(120)
def test_agent_records_the_main_threads_training_loop_and_leaves_nothing_behind(tmp_path, capfd):
    """The agent arms the window and this (main) thread, drawing its next batch, starts the profiler; the trace
    must hold the main thread's ops, and afterwards no profiler, hook, wrapper or thread of ours remains, and
    nothing was written to the job's stderr (Kineto's own start and stop lines included)."""
    import torch

    (tmp_path / "config.json").write_text(json.dumps({"seconds": 1.0, "steps": 0}))
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=4)
    from torch.optim.optimizer import _global_optimizer_post_hooks

    hooks_before = dict(_global_optimizer_post_hooks)
    next_before = _next_method()
    threads_before = set(threading.enumerate())
    started = threading.Event()
    agent = threading.Thread(target=trace_agent.live_main, args=(str(tmp_path), started), name="gputop-trace-agent")
    agent.start()
    started.set()
    deadline = time.monotonic() + 60
    while not (tmp_path / "result.json").exists() and time.monotonic() < deadline:
        for (x,) in loader:  # the training loop runs on the main thread, as in a job
            loss = model(x).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        time.sleep(0.005)
    agent.join(30)
    result = json.loads((tmp_path / "result.json").read_text())
    assert "error" not in result, result
    assert result["window"]["steps"] > 0
    trace = trace_summary.load_trace(str(tmp_path / "trace.json"))
    main_tid = threading.main_thread().native_id
    main_ops = [e for e in trace["traceEvents"] if e.get("tid") == main_tid and e.get("cat") == "cpu_op"]
    assert any(e["name"] == "aten::addmm" for e in main_ops), "the main thread's ops are missing from the trace"
    assert any(
        e.get("tid") == main_tid and str(e.get("name")).startswith("Optimizer.step#SGD.step") for e in trace["traceEvents"]
    )
    assert result["profiler_left_on"] is False and not torch._C._autograd._profiler_enabled()
    assert dict(_global_optimizer_post_hooks) == hooks_before
    assert result["threads_left"] == [] and set(threading.enumerate()) <= threads_before
    assert result["next_restored"] is True and _next_method() is next_before
    assert capfd.readouterr().err == ""


@pytest.mark.timeout(60)
def test_agent_refuses_when_a_profiler_already_runs(tmp_path):
    import torch

    (tmp_path / "config.json").write_text(json.dumps({"seconds": 0.5}))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        trace_agent.live_main(str(tmp_path))
    result = json.loads((tmp_path / "result.json").read_text())
    assert "already running" in result["error"]
    assert not (tmp_path / "trace.json").exists()


def _agent_thread(tmp_path, config: dict) -> threading.Thread:
    """The trace agent on a thread of this process, as the injected bootstrap starts it."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    started = threading.Event()
    agent = threading.Thread(target=trace_agent.live_main, args=(str(tmp_path), started), name="gputop-trace-agent")
    agent.start()
    started.set()
    return agent


def _batches(n: int = 64, features: int = 2):
    import torch

    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(n, features)), batch_size=1)


@pytest.mark.timeout(60)
def test_step_bound_stops_the_window_early(tmp_path):
    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    agent = _agent_thread(tmp_path, {"seconds": 10.0, "steps": 3})
    t0 = time.monotonic()
    while agent.is_alive() and time.monotonic() - t0 < 30:
        for (x,) in _batches():
            model(x).sum().backward()
            optimizer.step()
            time.sleep(0.02)
            if not agent.is_alive():
                break
    agent.join(30)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["window"]["steps"] == 3 and result["window"]["stopped"] == "the window ended"
    assert result["window"]["end"] - result["window"]["start"] < 8  # well under the 10 s bound


def _next_method():
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return _BaseDataLoaderIter.__dict__["__next__"]


@pytest.mark.timeout(60)
def test_no_batch_on_the_main_thread_means_one_line_and_no_trace(tmp_path, monkeypatch, capfd):
    """A job whose main thread draws no batch (not in its loop, or a loop on another thread) gets no profiler
    at all: the start belongs to the main thread, between two steps, and none came."""
    monkeypatch.setattr(trace_agent, "START_BOUND_S", 0.5)
    original = _next_method()
    trainer = threading.Thread(target=lambda: [b for _ in range(20) for b in _batches()])  # batches, off the main thread
    agent = _agent_thread(tmp_path, {"seconds": 1.0})
    trainer.start()
    agent.join(30)
    trainer.join(30)
    result = json.loads((tmp_path / "result.json").read_text())
    assert "drew no batch from a DataLoader within 0.5s" in result["error"] and "\n" not in result["error"]
    assert not (tmp_path / "trace.json").exists()
    assert _next_method() is original and result["profiler_left_on"] is False
    assert capfd.readouterr().err == ""


@pytest.mark.timeout(60)
def test_a_loop_that_stops_drawing_batches_is_stopped_on_its_main_thread_between_bytecodes(tmp_path, monkeypatch):
    """Past the window the main thread draws no further batch (an evaluation, a checkpoint) but runs Python:
    the stop is asked of it as a pending call, so the profiler still starts and stops on the same thread."""
    import torch

    monkeypatch.setattr(trace_agent, "STOP_GRACE_S", 0.2)
    agent = _agent_thread(tmp_path, {"seconds": 0.3})
    loader = iter(_batches())
    deadline = time.monotonic() + 20
    while not torch._C._autograd._profiler_enabled() and time.monotonic() < deadline:
        next(loader)  # draws until the window opens at a batch
        time.sleep(0.01)
    stopped_on = []
    while agent.is_alive() and time.monotonic() < deadline:  # Python without batches: the eval breaker runs
        if not torch._C._autograd._profiler_enabled() and not stopped_on:
            stopped_on.append(threading.get_ident())
        sum(range(1000))
    agent.join(30)
    result = json.loads((tmp_path / "result.json").read_text())
    assert "error" not in result, result
    assert result["window"]["stopped"] == "the loop drew no batch after the window"
    assert stopped_on == [threading.main_thread().ident]
    assert (tmp_path / "trace.json").stat().st_size > 0


@pytest.mark.timeout(60)
def test_the_exit_handler_stops_a_recording_window_first(tmp_path):
    """What the interpreter runs at exit (atexit): the profiler is stopped on the main thread before anything is
    torn down, __next__ is put back, and the result says the job exited during the window."""
    import torch

    window = trace_agent.StepBoundaryWindow(
        torch.utils.data.dataloader._BaseDataLoaderIter,
        lambda: torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]),
        seconds=30.0,
        steps=0,
    )
    exits = []
    window.on_exit = lambda: exits.append(True)
    original = _next_method()
    window.install()
    loader = iter(_batches())
    next(loader)
    assert window.state == trace_agent.RECORDING and torch._C._autograd._profiler_enabled()
    window.at_exit()
    assert not torch._C._autograd._profiler_enabled() and window.state == trace_agent.EXITING
    assert window.stop_reason == "the job began to exit" and exits == [True]
    assert _next_method() is original
    next(loader)  # the loop's next batch finds nothing of ours
    assert not torch._C._autograd._profiler_enabled()


def _train_step_that_syncs(model, optimizer, x):
    loss = model(x).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()  # the host-device sync the finding must point at


@pytest.mark.timeout(120)
def test_with_stack_names_the_line_that_syncs(tmp_path):
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    agent = _agent_thread(tmp_path, {"seconds": 10.0, "steps": 6, "with_stack": True})
    t0 = time.monotonic()
    while agent.is_alive() and time.monotonic() - t0 < 60:
        for (x,) in _batches(features=4):
            _train_step_that_syncs(model, optimizer, x)
            time.sleep(0.01)
            if not agent.is_alive():
                break
    agent.join(30)
    summary = trace_summary.summarize_file(str(tmp_path / "trace.json"))
    # The window opens as the loop draws a batch and closes as it draws the 7th: 6 whole steps, each with its sync.
    assert summary["steps"] >= 5 and summary["syncs"] >= summary["steps"] - 1, summary
    top = summary["sync_sites"][0]
    assert "test_trace.py(" in top["site"] and top["site"].endswith(": _train_step_that_syncs"), summary["sync_sites"]
    # ...and, read from the source as this process sees it, the line in that function that syncs
    name_sync_lines(summary, os.getpid())
    lines, first = inspect.getsourcelines(_train_step_that_syncs)
    item_line = first + next(i for i, text in enumerate(lines) if ".item()" in text)
    assert summary["sync_sites"][0]["lines"] == [{"line": item_line, "code": "return loss.item()"}]

"""The simulated machine's CUDA and NCCL semantics (`gputop.sim.cuda`, `gputop.sim.distributed`).

In-process: a launch returns at once, the GPU's busy time runs after it on the board, and `.item()` waits
for it.  Live (slow; real ranks): the watchdog takes a hung job down, and the headless demo ends with its
verdict.  What the nccl-hang, eval-rank0 and sync-bound scenarios show on the machine is checked on their
recordings in tests/test_demo_replays.py.
"""

from __future__ import annotations

import fcntl
import inspect
import os
import re
import threading
import time

import psutil
import pytest

from gputop.sim.busy_board import BusyBoard
from tests.harness.processes import wait_until

STARTUP_S = 240.0


# ----------------------------------------------------------------------------- the stream, in-process


@pytest.fixture
def stream(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from gputop.sim import cuda

    board = BusyBoard.create(str(tmp_path / "board"), 1)
    board.claim(0, 0, 1234, 1)
    monkeypatch.setattr(cuda, "_current", None)  # whatever another test set up stays out of this one
    cuda.init(board, slot=0, gpu=0, lock_path=str(tmp_path / "gpu0.lock"))
    yield cuda, board, torch
    cuda.synchronize()
    board.close()


def test_a_launch_returns_at_once_and_item_waits_for_the_gpu(stream, tmp_path):
    cuda, board, torch = stream
    loss = cuda.on_device(torch.tensor(2.5)) * 2
    # the GPU is held by another process (its lock, taken here): the kernel cannot start until the test lets
    # it, so a launch that waited for its kernel would never return (an order of events, not a time)
    gpu_lock = os.open(tmp_path / "gpu0.lock", os.O_RDWR)
    try:
        fcntl.flock(gpu_lock, fcntl.LOCK_EX)
        started = time.monotonic()
        launcher = threading.Thread(target=cuda.launch, args=(0.4,), daemon=True)
        launcher.start()
        launcher.join(30)
        assert not launcher.is_alive(), "the launch waited for its kernel"
        assert board.busy_seconds(0)[0] == 0.0  # the host went on while the kernel waits for the GPU
    finally:
        fcntl.flock(gpu_lock, fcntl.LOCK_UN)
        os.close(gpu_lock)
    assert wait_until(lambda: board.busy_seconds(0)[0] > 0, timeout=5, what="the GPU to start the kernel")
    value = loss.item()  # the sync
    waited = time.monotonic() - started
    assert value == 5.0 and isinstance(value, float)
    assert waited >= 0.38  # .item() returned only once the kernel had run
    busy, spin = board.busy_seconds(0)
    assert 0.38 <= busy < waited + 0.05 and spin == 0.0  # compute, not a spinning collective


def test_cpu_and_tolist_are_syncs_too(stream):
    cuda, board, torch = stream
    values = cuda.on_device(torch.arange(3.0))
    cuda.launch(0.3)
    started = time.monotonic()
    assert values.tolist() == [0.0, 1.0, 2.0]
    assert time.monotonic() - started >= 0.25
    cuda.launch(0.3)
    started = time.monotonic()
    host = values.cpu()
    assert time.monotonic() - started >= 0.25
    assert type(host) is torch.Tensor and host.tolist() == [0.0, 1.0, 2.0]


def test_a_collective_is_busy_time_marked_as_spinning(stream):
    cuda, board, _torch = stream
    started = time.monotonic()
    cuda.current_stream().launch_collective(lambda: time.sleep(0.3))  # "the peers arrive after 0.3 s"
    cuda.synchronize()
    waited = time.monotonic() - started
    busy, spin = board.busy_seconds(0)
    # all of it spinning, and no more busy time than passed (bounded by the time measured around it, not a fixed
    # 0.5 s: a run at a fifth of the box read 0.54)
    assert 0.28 <= spin <= busy <= waited, (spin, busy, waited)


def test_the_demo_loop_syncs_at_its_own_loss_item_line():
    """What the scenarios below rely on: the training loop has a `loss.item()` line of its own."""
    from gputop.sim import demo_job

    assert "running_loss += loss.item()" in inspect.getsource(demo_job.train)


# ----------------------------------------------------------------------------- live scenarios


@pytest.mark.slow
def test_the_nccl_watchdog_takes_a_hung_job_down(demo):
    job, _pipeline = demo("nccl-hang", gpus=2, collective_timeout_s=3)
    job.wait_until_training(timeout=STARTUP_S)
    code = wait_until(lambda: job.returncode, timeout=90, what="the watchdog to abort the hung collective")
    assert code == 128 + 6, job.log_tail()  # a rank died of SIGABRT; the launcher stopped the job
    log = "\n".join(job.log_tail(20))
    assert re.search(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=ALLREDUCE", log), log
    assert re.search(r"rank \d was killed by signal 6", log), log


@pytest.mark.slow
def test_the_nccl_hang_names_the_collective_from_the_ranks_flight_recorders(demo):
    """The ranks run with the flight recorder on and write no dump: gputop reads it from inside them once a rank
    stands still, and the hang names the all-reduce the others wait in and the stuck rank as missing."""
    from tests.harness.attach import Observer

    job, pipeline = demo("nccl-hang", gpus=3)
    job.wait_until_training(timeout=STARTUP_S)
    obs = Observer(job.launcher_pid, pipeline=pipeline)
    culprit = job.config.hang_rank

    def named():
        top = obs.step()[0]
        c = top.figures.get("collective") or {}
        # every rank accounted for: each rank's recorder is read on its own thread, and until a read lands the
        # rank is `unknown` ("no recorder read"), neither entered nor missing (ci41 stopped at one such frame)
        read = c.get("source") == "flight recorder" and not c.get("unknown")
        return top.id == "hang" and read and c.get("missing") == [culprit] and c

    c = wait_until(named, timeout=240, interval=1.0, what="the hang's collective from every rank's recorder",
                   state=lambda: [(f.id, f.summary, (f.figures.get("collective") or {}).get("unknown"))
                                  for f in obs.findings[:1]])  # fmt: skip
    assert c["op"] == "gloo:all_reduce" and c["seq"] > 0 and c["entered"] == [r for r in range(3) if r != culprit], c
    assert c["timeout_ms"] == job.config.collective_timeout_s * 1000  # the simulated watchdog's, as NCCL's is
    assert "flight recorder: gloo:all_reduce #" in "\n".join(obs.findings[0].evidence)


# ----------------------------------------------------------------------------- the headless verdict


# a live job judged by its verdict (the tuned demo reads healthy while its ranks get the CPU they ask for): the
# measured turn, with shared tests beside at a lower priority (at a fifth of the box it read input-bound, ci21)
@pytest.mark.acceptance
@pytest.mark.slow
def test_headless_demo_ends_with_the_verdict_and_the_findings(spawn, tmp_path):
    """`gputop demo --no-tui --seconds N` ends with the verdict line, one line per finding, then one line per
    prediction (a finding's fix and what it buys), for scripts."""
    import sys

    out_path = tmp_path / "out.txt"
    with open(out_path, "w") as out:
        proc = spawn(
            [
                sys.executable,
                "-m",
                "gputop",
                "demo",
                "--no-tui",
                "--gpus",
                "2",
                "--scenario",
                "tuned",
                "--seconds",
                "20",
                "--interval",
                "1",
            ],
            stdout=out,
            stderr=out,
        )
    assert proc.wait(timeout=STARTUP_S + 60) == 0, out_path.read_text()
    lines = out_path.read_text().splitlines()
    verdicts = [i for i, line in enumerate(lines) if line.startswith("verdict: ")]
    assert len(verdicts) == 1, lines
    tail = lines[verdicts[0] + 1 :]
    findings = [line for line in tail if re.match(r"finding: (critical|warning|info) +\S+ +\S", line)]
    predictions = [line for line in tail if re.match(r"prediction: \S+ +\S", line)]
    assert findings and tail == findings + predictions, tail  # the findings first, then the predictions
    assert {line.split()[1] for line in predictions} <= {line.split()[2] for line in findings}, tail
    assert lines[verdicts[0]].startswith("verdict: Healthy"), lines[verdicts[0]]
    assert re.match(r"finding: info +healthy +Healthy", tail[0]), tail
    launcher = int(re.search(r"launcher PID (\d+)", "\n".join(lines)).group(1))
    assert not psutil.pid_exists(launcher) or psutil.Process(launcher).status() == psutil.STATUS_ZOMBIE

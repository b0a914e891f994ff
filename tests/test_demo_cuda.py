"""The simulated machine's CUDA and NCCL semantics (`gputop.sim.cuda`, `gputop.sim.distributed`).

In-process: a launch returns at once, the GPU's busy time runs after it on the board, and `.item()` waits
for it.  Live (slow; real ranks, real py-spy, the real pipeline over the fake NVML): a NCCL hang shows
spinning GPUs at low power with hosts parked at the `loss.item()` line, rank 0's evaluation shows the
others in a barrier, a sync every step halves the GPUs, and the watchdog takes a hung job down.
"""

from __future__ import annotations

import inspect
import re
import time

import psutil
import pytest

from gputop.analysis.stack_classes import COLLECTIVE, WAITING_FOR_DATA, classify_main_thread, main_thread
from gputop.collect.stacks import dump_stacks
from gputop.commands.demo import observe
from gputop.sim.busy_board import BusyBoard
from tests.harness.demo import rank_pids
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


def test_a_launch_returns_at_once_and_item_waits_for_the_gpu(stream):
    cuda, board, torch = stream
    loss = cuda.on_device(torch.tensor(2.5)) * 2
    started = time.monotonic()
    cuda.launch(0.4)
    launched = time.monotonic() - started
    assert launched < 0.1  # the host went on while the GPU works
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
    cuda.current_stream().launch_collective(lambda: time.sleep(0.3))  # "the peers arrive after 0.3 s"
    cuda.synchronize()
    busy, spin = board.busy_seconds(0)
    assert 0.28 <= spin <= busy < 0.5


def test_the_demo_loop_syncs_at_its_own_loss_item_line():
    """What the scenarios below rely on: the training loop has a `loss.item()` line of its own."""
    from gputop.sim import demo_job

    assert "running_loss += loss.item()" in inspect.getsource(demo_job.train)


# ----------------------------------------------------------------------------- live scenarios


def item_line() -> int:
    """The line of `running_loss += loss.item()` in demo_job.py: where py-spy must show a parked host."""
    from gputop.sim import demo_job

    lines, first = inspect.getsourcelines(demo_job.train)
    return first + next(i for i, text in enumerate(lines) if "running_loss += loss.item()" in text)


def innermost(pid: int):
    """(state, innermost frame) of the rank's main thread, from a real py-spy dump."""
    stacks = dump_stacks([pid])[pid]
    thread = main_thread(stacks)
    return classify_main_thread(stacks), (thread.frames[0] if thread and thread.frames else None)


@pytest.mark.slow
def test_nccl_hang_spins_the_other_gpus_at_low_power_with_hosts_parked_at_item(demo):
    job, pipeline = demo("nccl-hang", gpus=3)
    job.wait_until_training(timeout=STARTUP_S)
    stuck = job.config.hang_rank
    assert stuck == 1
    healthy = [g for g in range(3) if g != stuck]

    def spinning():
        gpus = pipeline.poll().gpus
        return all(gpus[g].utilization_gpu >= 95 for g in healthy) and gpus[stuck].utilization_gpu == 0

    wait_until(spinning, timeout=90, interval=0.5, what="the healthy GPUs spinning and the stuck rank's GPU idle")
    gpus = pipeline.poll().gpus
    for g in healthy:
        assert gpus[g].power < 0.3 * gpus[g].power_limit, (gpus[g].power, gpus[g].power_limit)  # a spin, not compute
        assert gpus[g].memory_used > 9 * 1024**3
    pids = rank_pids(job)
    line = item_line()
    for rank in healthy:
        state, frame = wait_until(
            lambda: (lambda r: r if r[1] is not None and r[1].line == line else None)(innermost(pids[rank])),
            timeout=30,
            what=f"rank {rank}'s host parked at demo_job.py:{line}",
        )
        assert frame.name == "train" and frame.filename.endswith("gputop/sim/demo_job.py")
    wait_until(lambda: innermost(pids[stuck])[0] == WAITING_FOR_DATA, timeout=30, what="the stuck rank waiting for data")
    summary = observe(job, pipeline, interval=0.5, seconds=2, out=open("/dev/null", "w"))
    assert summary.steps_per_s == (0.0, 0.0, 0.0)


@pytest.mark.slow
def test_eval_on_rank0_keeps_the_others_in_a_barrier_with_their_gpus_spinning(demo):
    job, pipeline = demo("eval-rank0", gpus=3)
    job.wait_until_training(timeout=STARTUP_S)
    pids = rank_pids(job)

    def others_in_barrier():
        states = [innermost(p) for p in pids[1:]]
        return all(s == COLLECTIVE and f is not None and f.name.rsplit(".", 1)[-1] == "barrier" for s, f in states)

    wait_until(others_in_barrier, timeout=60, interval=0.3, what="ranks 1 and 2 waiting in barrier during an eval")

    def rank0_computes_while_the_others_spin():
        gpus = pipeline.poll().gpus
        return gpus[0].power > 0.6 * gpus[0].power_limit and all(
            gpus[g].utilization_gpu >= 90 and gpus[g].power < 0.35 * gpus[g].power_limit for g in (1, 2)
        )

    # the 1 s utilization window covers a part of an evaluation: GPUs 1-2 spin in the barrier at low power
    # while rank 0's GPU runs the evaluation at high power
    wait_until(rank0_computes_while_the_others_spin, timeout=60, interval=0.25, what="GPUs 1-2 spinning beside rank 0's eval")
    wait_until(lambda: any("eval accuracy" in line for line in job.log_tail(40)), timeout=30, what="rank 0 to report its eval")


@pytest.mark.slow
def test_a_sync_every_step_makes_host_and_gpu_take_turns(demo):
    job, pipeline = demo("sync-bound", gpus=2)
    summary = observe(job, pipeline, interval=0.5, seconds=8, out=open("/dev/null", "w"))
    means = summary.mean_util()
    assert all(40 <= means[g] <= 70 for g in (0, 1)), means  # ~55%: 200 ms of GPU after 160 ms of host, in turn
    line = item_line()
    pid = rank_pids(job)[0]
    wait_until(lambda: (lambda f: f is not None and f.line == line)(innermost(pid)[1]), timeout=30, what="rank 0 at .item()")


@pytest.mark.slow
def test_the_nccl_watchdog_takes_a_hung_job_down(demo):
    job, _pipeline = demo("nccl-hang", gpus=2, collective_timeout_s=3)
    job.wait_until_training(timeout=STARTUP_S)
    code = wait_until(lambda: job.returncode, timeout=90, what="the watchdog to abort the hung collective")
    assert code == 128 + 6, job.log_tail()  # a rank died of SIGABRT; the launcher stopped the job
    log = "\n".join(job.log_tail(20))
    assert re.search(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=ALLREDUCE", log), log
    assert re.search(r"rank \d was killed by signal 6", log), log


# ----------------------------------------------------------------------------- the headless verdict


@pytest.mark.slow
def test_headless_demo_ends_with_the_verdict_and_the_findings(spawn, tmp_path):
    """`gputop demo --no-tui --seconds N` ends with the verdict line and one line per finding, for scripts."""
    import sys

    out_path = tmp_path / "out.txt"
    with open(out_path, "w") as out:
        proc = spawn(
            [sys.executable, "-m", "gputop", "demo", "--no-tui", "--gpus", "2", "--scenario", "tuned",
             "--seconds", "20", "--interval", "1"],
            stdout=out,
            stderr=out,
        )
    assert proc.wait(timeout=STARTUP_S + 60) == 0, out_path.read_text()
    lines = out_path.read_text().splitlines()
    verdicts = [i for i, line in enumerate(lines) if line.startswith("verdict: ")]
    assert len(verdicts) == 1, lines
    tail = lines[verdicts[0] + 1 :]
    assert tail and all(re.match(r"finding: (critical|warning|info) +\S+ +\S", line) for line in tail), tail
    assert lines[verdicts[0]].startswith("verdict: Healthy"), lines[verdicts[0]]
    assert re.match(r"finding: info +healthy +Healthy", tail[0]), tail
    launcher = int(re.search(r"launcher PID (\d+)", "\n".join(lines)).group(1))
    assert not psutil.pid_exists(launcher) or psutil.Process(launcher).status() == psutil.STATUS_ZOMBIE

"""Failure drills (issue 8): in each, gputop keeps running or exits with one clear line, and the job is
never harmed.

Real parts throughout: real PyTorch jobs with DataLoader workers (tests/jobs/train_job.py), the
real py-spy (or a fake one standing in for a hung or killed py-spy), the real pynvml wrappers over the
fake library, real file systems (/dev/full, tiny tmpfs mounts), and the Textual app under Pilot.
Every process is started through the `spawn` fixture (own process group, killed and reaped at
teardown); every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import psutil
import pytest

from gputop.collect import stacks as stacks_mod
from gputop.collect.job_tree import JobCollector
from gputop.errors import GputopError
from gputop.recording import ReplaySource, read_recording
from tests.harness import train_jobs
from tests.harness.box_load import BoxLoad
from tests.harness.processes import Ran, Spawner, wait_until
from tests.harness.processes import run_gputop as gputop

REPO = Path(__file__).resolve().parent.parent
DRILL_JOBS = Path(__file__).resolve().parent / "drill_jobs"
IS_ROOT = os.geteuid() == 0
NOBODY = "nobody"

needs_root = pytest.mark.skipif(not IS_ROOT, reason="this drill switches users / mounts file systems: run as root")


# ----------------------------------------------------------------------------- helpers


@dataclass
class Job:
    proc: subprocess.Popen
    steps_path: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def steps(self) -> int:
        try:
            return int(self.steps_path.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def assert_trains(self, more: int = 3) -> None:
        """The job is alive and takes more steps: whatever gputop did, it did not harm it."""
        start = self.steps()
        wait_until(
            lambda: self.proc.poll() is None and self.steps() >= start + more, timeout=30, what=f"job {self.pid} to keep training"
        )
        assert self.proc.poll() is None, self.log()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def start_job(
    spawn,
    tmp_path: Path,
    *args: str,
    name: str = "job",
    script: str = train_jobs.JOB,
    env: Optional[dict] = None,
    state_dir: Optional[Path] = None,
) -> Job:
    """Start a drill job and wait until it has taken its first step."""
    steps = (state_dir or tmp_path) / f"{name}.steps"
    proc, _ = train_jobs.start(
        spawn,
        tmp_path,
        name,
        *train_jobs.DRILL,
        "--progress",
        str(steps),
        *args,
        job=script,
        env=env,
        state_dir=state_dir,
        timeout=90,
    )
    return Job(proc, steps, tmp_path / f"{name}.log")


@pytest.fixture(scope="module")
def module_spawn():
    """`spawn` for the jobs a module's tests share: every process is killed and reaped when the module ends."""
    spawner = Spawner()
    try:
        yield spawner
    finally:
        spawner.reap_all()


@pytest.fixture(scope="module")
def target_job(module_spawn, tmp_path_factory) -> Job:
    """A root drill job with 1 worker, shared by the drills that only read it or are refused before they touch it
    (one torch start instead of eight).  Each still ends with `assert_trains`: a drill that harmed it fails there,
    and so would every later one."""
    return start_job(module_spawn, tmp_path_factory.mktemp("target"), "--workers", "1")


def start_gputop(spawn, *args: str, env: Optional[dict] = None) -> subprocess.Popen:
    return spawn([sys.executable, "-m", "gputop", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def assert_one_line_error(ran: Ran, rc: int, line: str) -> None:
    """gputop failed the way the rules ask: this exit code and exactly this one line on stderr."""
    assert "Traceback" not in ran.err, ran.err
    assert (ran.rc, ran.err) == (rc, line + "\n")


def snapshots(path: Path) -> list:
    try:
        return read_recording(str(path))[1]
    except GputopError:  # not written yet
        return []


def no_group_left(pgid: int) -> bool:
    """No live process is left in the process group `pgid` (zombies waiting for their reaper don't count)."""
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.Error):
            continue
    return True


def live_children(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    alive = []
    for kid in kids:
        try:
            if kid.status() != psutil.STATUS_ZOMBIE:
                alive.append(kid)
        except psutil.Error:
            continue
    return alive


def all_dead(pids) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            continue
    return True


def install_fake_py_spy(directory: Path, kind: str) -> Path:
    """A fake py-spy (tests/drill_jobs/py_spy_KIND.sh) as an executable named py-spy in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / "py-spy"
    shutil.copyfile(DRILL_JOBS / f"py_spy_{kind}.sh", fake)
    fake.chmod(0o755)
    return fake


def interpreter_beside(directory: Path) -> str:
    """A link to this Python in `directory`: gputop looks for py-spy next to sys.executable first."""
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / "python"
    link.symlink_to(os.path.realpath(sys.executable))
    return str(link)


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size_kib: int, readonly: bool = False):
    path.mkdir()
    opts = f"size={size_kib}k,mode=0755" + (",ro" if readonly else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "gputop-drill", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the disk drills need CAP_SYS_ADMIN")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> None:
    """Write into `directory` until its file system is full."""
    chunk = b"\0" * 4096
    try:
        with open(directory / "filler", "wb") as f:
            while True:
                f.write(chunk)
                f.flush()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    with pytest.raises(OSError):
        (directory / "probe").write_bytes(chunk)
    (directory / "probe").unlink()


def snapshot_stacks(data: dict, pid: int) -> dict:
    """The stacks of `pid` in `gputop snapshot --json` output (snapshot waits for the first py-spy round)."""
    stacks = data["job"]["stacks"].get(str(pid))
    assert stacks is not None, f"no stacks for {pid} in the snapshot: {sorted(data['job']['stacks'])}"
    return stacks


def recorded_stacks(path: Path, pid: int):
    """The latest stacks (or stack error) of `pid` in a recording."""
    for snap in reversed(snapshots(path)):
        stacks = snap.job.stacks.get(pid) if snap.job else None
        if stacks is not None:
            return stacks
    raise AssertionError(f"no stacks of PID {pid} in {path}")


def has_nvidia_driver() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


# ----------------------------------------------------------------------------- SIGKILL while attached


@pytest.mark.slow
def test_job_sigkilled_while_recording_is_shown_exited_and_nothing_is_left(spawn, tmp_path):
    job = start_job(spawn, tmp_path, "--workers", "2")
    rec_path = tmp_path / "attach.gputop"
    rec = start_gputop(spawn, "record", "--pid", str(job.pid), "--interval", "0.3", "-o", str(rec_path))
    # attached for real: snapshots with the job's main-thread stacks in them
    wait_until(
        lambda: any(s.job and s.job.stacks.get(job.pid) and s.job.stacks[job.pid].threads for s in snapshots(rec_path)),
        timeout=60,
        what="a recorded snapshot with the job's stacks",
    )
    workers = [w.pid for w in snapshots(rec_path)[-1].job.ranks[0].workers]
    assert len(workers) == 2

    os.killpg(job.pid, signal.SIGKILL)
    job.proc.wait(timeout=10)
    wait_until(
        lambda: (snaps := snapshots(rec_path)) and snaps[-1].job.exited, timeout=20, what="the recording to show the job exited"
    )
    assert rec.poll() is None, "gputop record must keep running after the job dies"
    last = snapshots(rec_path)[-1]
    assert last.job.ranks[0].proc.exited and all(w.exited for w in last.job.ranks[0].workers)
    kept = last.job.stacks.get(job.pid)
    assert kept is not None and kept.error is None and kept.threads, "the last stacks are kept after the exit"
    # nothing left behind: the job's group (workers) is gone and gputop runs no py-spy any more
    wait_until(lambda: no_group_left(job.pid), timeout=20, what="the job's workers to be gone")
    assert all_dead(workers)
    wait_until(lambda: not live_children(rec.pid), timeout=10, what="gputop's py-spy children to end")

    rec.send_signal(signal.SIGINT)
    out, err = rec.communicate(timeout=30)
    assert rec.returncode == 0 and b"Traceback" not in err, err
    assert re.search(rb"gputop: recorded \d+ snapshots", err), err

    # a later attach to the dead PID: one line, exit 1
    ran = gputop(spawn, "snapshot", "--pid", str(job.pid))
    assert_one_line_error(ran, 1, f"gputop: no process with PID {job.pid} (it may have exited; check with `ps -p {job.pid}`)")


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["kill", "ssh-hangup"])
def test_record_ended_by_kill_or_a_hangup_keeps_every_snapshot_and_says_so(spawn, tmp_path, stop):
    """`kill PID` and a closed SSH session end `gputop record` the way Ctrl-C does: the closing line, exit 0,
    and a recording that replays with every snapshot it counted (not a process dead mid-write)."""
    rec_path = tmp_path / "stopped.gputop"
    rec = start_gputop(spawn, "record", "--simulate", "rtx-4090-2", "--interval", "0.2", "-o", str(rec_path))
    wait_until(lambda: len(snapshots(rec_path)) >= 3, timeout=60, what="three recorded snapshots")
    rec.send_signal(stop)
    out, err = rec.communicate(timeout=30)
    assert rec.returncode == 0 and b"Traceback" not in err, err
    counted = re.search(rb"gputop: recorded (\d+) snapshots", err)
    assert counted, err
    assert len(snapshots(rec_path)) == int(counted[1]) >= 3


@pytest.mark.slow
def test_job_sigkilled_during_a_stack_refresh_keeps_last_stacks(spawn, tmp_path):
    job = start_job(spawn, tmp_path, "--workers", "2")
    armed = threading.Event()
    killed = threading.Event()
    refresh_after_kill_done = threading.Event()
    after_kill = {}

    def dump_then_maybe_kill(pids):
        # The refresh has chosen its PIDs; when armed, the job dies now, before and while py-spy reads it.
        kills = armed.is_set() and not killed.is_set()
        if kills:
            os.killpg(job.pid, signal.SIGKILL)
            killed.set()
        result = stacks_mod.dump_stacks(pids, timeout=2.0)
        if kills:
            after_kill.update(result)
            refresh_after_kill_done.set()
        return result

    collector = JobCollector(job.pid, stack_interval=0.2, dump=dump_then_maybe_kill)
    try:
        wait_until(
            lambda: (s := collector.collect().stacks.get(job.pid)) and s.error is None and s.threads,
            timeout=30,
            what="the first stacks",
        )
        armed.set()
        wait_until(refresh_after_kill_done.is_set, timeout=15, what="the refresh during the kill to end")
        assert after_kill.get(job.pid) is not None and after_kill[job.pid].error, after_kill  # py-spy met a dead job
        tree = wait_until(lambda: (t := collector.collect()).exited and t, timeout=10, what="the job shown exited")
        kept = tree.stacks.get(job.pid)
        assert kept is not None
        started = time.monotonic()
        for _ in range(5):
            collector.collect()
        assert time.monotonic() - started < 1.0, "collect() stays cheap after the exit"
    finally:
        started = time.monotonic()
        collector.close()
        assert time.monotonic() - started < 2.5, "close() does not hang on a dead job"
    assert not [p for p in live_children(os.getpid()) if p.name() == "py-spy"], "no py-spy left running"
    job.proc.wait(timeout=10)
    wait_until(lambda: no_group_left(job.pid), timeout=20, what="the job's workers to be gone")
    assert kept.error is None, f"the last good stacks were replaced by {kept.error!r}"
    assert kept.threads, "stacks from before the kill are kept"


@pytest.mark.alone(unless_prioritized=True)  # a deadline from the kill
@pytest.mark.slow
def test_job_sigkilled_during_an_active_benchmark(spawn, tmp_path):
    job = start_job(spawn, tmp_path, "--workers", "2", "--sample-ms", "30")
    bench = start_gputop(spawn, "bench", "--pid", str(job.pid), "--yes", "--seconds", "12", "--json")

    def sweep_child() -> Optional[psutil.Process]:
        # the agent forks a copy of the job for the loader-only sweep, in its own process group
        for kid in live_children(job.pid):
            try:
                if os.getpgid(kid.pid) == kid.pid:
                    return kid
            except ProcessLookupError:
                continue
        return None

    sweeper = wait_until(
        lambda: sweep_child() or bench.poll() is not None, timeout=40, what="the benchmark's sweep to start inside the job"
    )
    assert bench.poll() is None, bench.communicate()[1].decode()
    run_dir = Path(os.readlink(f"/proc/{sweeper.pid}/fd/1")).parent  # the sweep logs into the run directory
    job_side = [job.pid] + [p.pid for p in live_children(job.pid)]
    box, kill_at = BoxLoad(), time.monotonic()
    os.killpg(job.pid, signal.SIGKILL)  # the job only (an OOM kill): the sweep's own group is not signalled
    job.proc.wait(timeout=10)

    out, err = bench.communicate(timeout=40)
    took = time.monotonic() - kill_at
    err_text = err.decode()
    assert "Traceback" not in err_text, err_text
    assert took < 12 + 3 + 5, f"gputop bench took {took:.0f} s after the job died; {box.since()}"
    if bench.returncode == 0:
        result = json.loads(out)
        assert any("exit" in n or "did not answer" in n for n in result["notes"]), result["notes"]
    else:
        assert bench.returncode == 1 and err_text.count("\n") == 1 and err_text.startswith("gputop: "), err_text
    # nothing left behind: not the sweep copy, not its loader workers, not the run directory
    wait_until(lambda: all_dead(job_side), timeout=10, what="every process of the job and of the sweep to end")
    assert not live_children(bench.pid)
    leftover = sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else None
    if leftover is not None:
        shutil.rmtree(run_dir)  # ours: don't leave it for the next run
    assert leftover is None, f"{run_dir} ({leftover}) left behind after the job died"


def _live_workers(snap) -> list[int]:
    return [w.pid for w in snap.job.ranks[0].workers if not w.exited]


@pytest.mark.slow
@pytest.mark.parametrize("job_survives", [True, False], ids=["job-restarts-loader", "job-fails"])
def test_dataloader_worker_dies_while_recording(spawn, tmp_path, job_survives):
    job = start_job(spawn, tmp_path, "--workers", "2", *(["--survive-worker-death"] if job_survives else []))
    rec_path = tmp_path / "worker.gputop"
    rec = start_gputop(spawn, "record", "--pid", str(job.pid), "--interval", "0.3", "-o", str(rec_path))
    snaps = wait_until(
        lambda: (s := snapshots(rec_path)) and len(_live_workers(s[-1])) == 2 and s,
        timeout=60,
        what="both workers in the recording",
    )
    victim = _live_workers(snaps[-1])[0]
    os.kill(victim, signal.SIGKILL)
    if job_survives:
        # gputop follows the job to its new DataLoader: two live workers again, none of them the dead one
        wait_until(lambda: "starting a new DataLoader" in job.log(), timeout=60, what="the job to notice", state=job.log)
        last = wait_until(
            lambda: (
                (s := snapshots(rec_path))
                and not s[-1].job.exited
                and len(_live_workers(s[-1])) == 2
                and victim not in _live_workers(s[-1])
                and s[-1]
            ),
            timeout=30,
            what="the new workers in the recording",
        )
        assert all_dead([victim]) and last.job.ranks[0].proc.pid == job.pid
        job.assert_trains()
    else:
        # torch fails the job on a dead worker (torch's doing, not gputop's); gputop shows the job exited
        job.proc.wait(timeout=60)
        assert "DataLoader worker" in job.log(), job.log()
        last = wait_until(
            lambda: (s := snapshots(rec_path)) and s[-1].job.exited and s[-1], timeout=20, what="the job shown exited"
        )
        assert last.job.ranks[0].proc.exited and _live_workers(last) == []
    assert rec.poll() is None, "gputop record keeps running"
    rec.send_signal(signal.SIGINT)
    _, err = rec.communicate(timeout=30)
    assert rec.returncode == 0 and b"Traceback" not in err, err


# ----------------------------------------------------------------------------- disk full / unwritable


@pytest.mark.slow
def test_record_to_dev_full_one_line(spawn, tmp_path):
    ran = gputop(spawn, "record", "--simulate", "-o", "/dev/full", "--seconds", "2")
    assert_one_line_error(
        ran,
        1,
        "gputop: cannot write recording /dev/full: No space left on device (free some disk space or record to another disk)",
    )


@pytest.mark.slow
@needs_root
def test_disk_fills_while_recording_partial_recording_replays(spawn, tmp_path):
    with mounted_tmpfs(tmp_path / "small", 48) as small:
        rec = small / "filling.gputop"
        ran = gputop(spawn, "record", "--simulate", "-o", str(rec), "--seconds", "120", "--interval", "0.05")
        assert_one_line_error(
            ran,
            1,
            f"gputop: cannot write recording {rec}: No space left on device (free some disk space or record to another disk)",
        )
        machine, snaps, warning = read_recording(str(rec))
        assert machine.gpu_count == 8 and len(snaps) >= 3
        replay = ReplaySource(str(rec))
        assert replay.poll().timestamp == snaps[0].timestamp and replay.duration > 0
        report = gputop(spawn, "report", "--from", str(rec), "--format", "json", "-o", str(tmp_path / "r.json"))
        assert report.rc == 0, report.err
        assert len(json.loads((tmp_path / "r.json").read_text())["gpus"]) == 8
        if warning:  # a member cut at the full disk: one warning line, before the "wrote" line
            assert report.err.splitlines()[0] == f"gputop: warning: {warning}"


@pytest.mark.slow
@needs_root
def test_unwritable_directory_record_and_report_refuse_in_one_line(spawn, tmp_path):
    with mounted_tmpfs(tmp_path / "ro", 64, readonly=True) as ro:
        ran = gputop(spawn, "record", "--simulate", "-o", str(ro / "x.gputop"), "--seconds", "1")
        assert_one_line_error(
            ran,
            1,
            f"gputop: cannot create recording {ro / 'x.gputop'}: Read-only file system "
            "(the file system is read-only; record to another directory)",
        )
        ran = gputop(spawn, "report", "--simulate", "--seconds", "1", "-o", str(ro / "r.md"))
        assert_one_line_error(
            ran,
            1,
            f"gputop: cannot write report to {ro / 'r.md'}: Read-only file system "
            "(the file system is read-only; write elsewhere with -o)",
        )
        assert os.listdir(ro) == []


@pytest.mark.slow
@needs_root
def test_report_on_a_full_disk_leaves_the_old_report_and_no_temp_file(spawn, tmp_path):
    with mounted_tmpfs(tmp_path / "full", 256) as full:
        (full / "r.md").write_text("the previous report\n")
        fill(full)
        ran = gputop(spawn, "report", "--simulate", "--seconds", "1", "-o", str(full / "r.md"))
        assert_one_line_error(
            ran,
            1,
            f"gputop: cannot write report to {full / 'r.md'}: No space left on device "
            "(the disk is full; free some space or write elsewhere with -o)",
        )
        assert (full / "r.md").read_text() == "the previous report\n"
        assert set(os.listdir(full)) <= {"filler", "r.md"}, "no temp file left behind"


@pytest.mark.slow
@needs_root
def test_report_onto_a_full_device_node_keeps_the_device(spawn, tmp_path):
    device = tmp_path / "full"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # the same device as /dev/full
    ran = gputop(spawn, "report", "--simulate", "--seconds", "1", "-o", str(device))
    try:
        assert stat.S_ISCHR(os.stat(device).st_mode), "the device node was replaced by a regular file"
        assert_one_line_error(
            ran,
            1,
            f"gputop: cannot write report to {device}: No space left on device "
            "(the disk is full; free some space or write elsewhere with -o)",
        )
    finally:
        device.unlink()


# ----------------------------------------------------------------------------- terminal resize


def test_tui_resized_to_20x5_and_back(tmp_path):
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Pipeline
    from gputop.tui.app import GputopApp
    from gputop.tui.screens import TooSmallScreen
    from gputop.tui.widgets.gpu_grid import GpuGrid
    from tests.harness.tui import wait_for

    pipeline = Pipeline(SimulatedMachine("h100-sxm-8"))
    app = GputopApp(pipeline, interval=0.1)

    async def drill() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.monitor.snapshots_seen >= 2, "the first snapshots")
            await pilot.resize_terminal(20, 5)
            await wait_for(pilot, lambda: isinstance(app.screen, TooSmallScreen), "the too-small screen")
            text = str(app.screen.query_one("#too-small").render())
            assert "terminal too small" in text and "20×5" in text
            seen = app.monitor.snapshots_seen
            await pilot.resize_terminal(120, 40)
            await wait_for(pilot, lambda: not isinstance(app.screen, TooSmallScreen), "the main screen back")
            await wait_for(pilot, lambda: app.monitor.snapshots_seen > seen + 2, "snapshots after the resize")
            grid = app.query_one(GpuGrid)
            assert grid.region.width > 0 and grid.region.height > 0
            await pilot.resize_terminal(20, 5)
            await wait_for(pilot, lambda: isinstance(app.screen, TooSmallScreen), "the too-small screen again")
            await pilot.press("q")  # q quits from the too-small screen too
        assert app.return_code in (0, None)

    try:
        asyncio.run(asyncio.wait_for(drill(), timeout=60))
    finally:
        pipeline.close()


# ----------------------------------------------------------------------------- GPUs and NVML


def test_gpu_lost_mid_run_pipeline_keeps_polling_and_diagnosis_names_it():
    from gputop.analysis.diagnosis import diagnose
    from gputop.backend import SimulatedMachine
    from gputop.history import History
    from gputop.pipeline import Pipeline
    from gputop.sim.fake_nvml import ManualClock

    clock = ManualClock()
    with Pipeline(SimulatedMachine("h100-sxm-8+gpu-lost=3@5", clock=clock)) as pipeline:
        history = History(pipeline.machine)
        for _ in range(4):
            clock.advance(1.0)
            snap = pipeline.poll()
            history.append(snap)
            assert not any(g.lost for g in snap.gpus)
        for _ in range(5):
            clock.advance(1.0)
            snap = pipeline.poll()
            history.append(snap)
        gpu3 = snap.gpus[3]
        assert gpu3.lost and gpu3.unavailable.get("gpu") == "GpuIsLost" and gpu3.utilization_gpu is None
        others = [g for g in snap.gpus if g.index != 3]
        assert len(others) == 7 and all(not g.lost and g.utilization_gpu is not None for g in others)
    lost = [f for f in diagnose(history, window=None) if f.id == "gpu_lost"]
    assert lost and lost[0].gpus == (3,) and "infrastructure" in lost[0].label.lower()


@pytest.mark.slow
def test_gpu_lost_mid_run_report_command(spawn, tmp_path):
    out = tmp_path / "lost.json"
    ran = gputop(
        spawn,
        "report",
        "--simulate",
        "h100-sxm-8+gpu-lost=3@1",
        "--seconds",
        "3",
        "--interval",
        "0.5",
        "--format",
        "json",
        "-o",
        str(out),
    )
    assert ran.rc == 0 and "Traceback" not in ran.err, ran.err
    report = json.loads(out.read_text())
    assert [f["gpus"] for f in report["findings"] if f["id"] == "gpu_lost"] == [[3]]


class _NvmlError:
    NO_PERMISSION = 4
    DRIVER_NOT_LOADED = 9


def _library_failing_init(code: int):
    """The simulated library, except that NVML's init returns `code` (as a broken driver install does)."""
    from gputop.sim.fake_nvml import FakeNvmlLibrary

    class FailingInit(FakeNvmlLibrary):
        def _bind_symbols(self):
            symbols = super()._bind_symbols()

            def nvmlInitWithFlags(flags):
                return code

            def nvmlInit_v2():
                return code

            symbols.update(nvmlInitWithFlags=nvmlInitWithFlags, nvmlInit_v2=nvmlInit_v2)
            return symbols

    return FailingInit


def test_nvml_init_fails_collector_raises_one_line():
    from gputop.collect.gpu import GpuCollector, GpuUnavailableError, NoDriverError
    from gputop.sim.spec import parse_spec
    from gputop.sim.synthetic import SyntheticLoad

    spec = parse_spec("h100-sxm-8")
    load = SyntheticLoad(8, spec.profile.gpu.memory_total)
    with pytest.raises(GpuUnavailableError) as failed:
        GpuCollector(library=_library_failing_init(_NvmlError.NO_PERMISSION)(spec, load))
    assert str(failed.value) == "NVML failed to start (NoPermission: Insufficient Permissions)"
    with pytest.raises(NoDriverError) as failed:
        GpuCollector(library=_library_failing_init(_NvmlError.DRIVER_NOT_LOADED)(spec, load))
    assert str(failed.value) == "no NVIDIA driver found (the NVIDIA kernel driver is not loaded)"


@pytest.mark.slow
def test_nvml_init_fails_pipeline_still_samples_host_and_job(target_job, monkeypatch):
    import gputop.sim.fake_nvml as fake_nvml
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Following, Pipeline

    job = target_job
    monkeypatch.setattr(fake_nvml, "FakeNvmlLibrary", _library_failing_init(_NvmlError.NO_PERMISSION))
    with Pipeline(SimulatedMachine("h100-sxm-8"), follow=Following(pid=job.pid)) as pipeline:
        assert pipeline.machine.gpu_error == "NVML failed to start (NoPermission: Insufficient Permissions)"
        snap = pipeline.poll()
        assert snap.gpus == () and snap.host.cpu_percent and snap.job.ranks[0].proc.pid == job.pid
    job.assert_trains()


@pytest.mark.slow
@pytest.mark.skipif(has_nvidia_driver(), reason="this machine has an NVIDIA driver: the no-driver path cannot run")
def test_no_driver_snapshot_and_record_work_without_gpus(spawn, tmp_path):
    ran = gputop(spawn, "snapshot", "--json")
    assert ran.rc == 0 and ran.err == "no NVIDIA driver found (libnvidia-ml.so.1 is not loadable)\n", ran.err
    data = json.loads(ran.out)
    assert data["gpus"] == [] and data["machine"]["gpu_error"].startswith("no NVIDIA driver found")
    assert data["host"]["cpu_percent"]
    table = gputop(spawn, "snapshot")
    assert table.rc == 0 and table.err == "" and "no NVIDIA driver found" in table.out
    rec = tmp_path / "nodriver.gputop"
    ran = gputop(spawn, "record", "-o", str(rec), "--seconds", "1", "--interval", "0.5")
    assert ran.rc == 0 and len(snapshots(rec)) >= 2, ran.err


# ----------------------------------------------------------------------------- py-spy hangs or dies


@pytest.mark.slow
def test_py_spy_hangs_collect_stays_fast_and_hung_py_spy_is_killed(spawn, tmp_path, monkeypatch):
    job = start_job(spawn, tmp_path, "--workers", "2")
    fake = install_fake_py_spy(tmp_path / "fakebin", "hang")
    started_log = tmp_path / "py-spy-pids"
    monkeypatch.setenv("FAKE_PY_SPY_LOG", str(started_log))
    dump = functools.partial(stacks_mod.dump_stacks, py_spy=str(fake), timeout=1.0)
    collector = JobCollector(job.pid, stack_interval=0.2, dump=dump)
    try:
        worst = 0.0
        deadline = time.monotonic() + 30
        while True:
            t0 = time.monotonic()
            tree = collector.collect()
            worst = max(worst, time.monotonic() - t0)
            stacks = tree.stacks.get(job.pid)
            if stacks is not None and stacks.error:
                break
            assert time.monotonic() < deadline, "no timeout reported for the hung py-spy"
            time.sleep(0.05)  # the collect() cadence under test (the app polls; this is not synchronisation)
        assert stacks.error == f"py-spy took longer than 1s on PID {job.pid}; will retry"
        assert worst < 0.5, f"collect() took {worst:.2f} s while py-spy hung"
        assert len(tree.ranks[0].workers) == 2  # the /proc side keeps working
    finally:
        t0 = time.monotonic()
        collector.close()
        assert time.monotonic() - t0 < 2.5
    hung = [int(p) for p in started_log.read_text().split()]
    assert hung
    wait_until(lambda: all_dead(hung), timeout=10, what="every hung py-spy to be killed at its timeout")
    job.assert_trains()


@pytest.mark.alone(unless_prioritized=True)  # bounded time from the hang
@pytest.mark.slow
def test_py_spy_hangs_record_and_snapshot_commands_end_in_bounded_time(spawn, tmp_path, target_job):
    job = target_job
    bindir = tmp_path / "venv" / "bin"
    install_fake_py_spy(bindir, "hang")
    python = interpreter_beside(bindir)  # so gputop finds the fake first, next to its interpreter
    log = tmp_path / "py-spy-pids"
    env = dict(os.environ, FAKE_PY_SPY_LOG=str(log))
    rec = tmp_path / "hung.gputop"
    box, t0 = BoxLoad(), time.monotonic()
    ran = gputop(
        spawn,
        "record",
        "--pid",
        str(job.pid),
        "-o",
        str(rec),
        "--seconds",
        "5",
        "--interval",
        "0.5",
        python=python,
        env=env,
        timeout=60,
    )
    took = time.monotonic() - t0
    assert ran.rc == 0 and "Traceback" not in ran.err, ran.err
    assert took < 5 + 8, f"record --seconds 5 took {took:.1f} s with a hung py-spy; {box.since()}"
    assert recorded_stacks(rec, job.pid).error == f"py-spy took longer than 3s on PID {job.pid}; will retry"
    assert len(snapshots(rec)) >= 8, "the 0.5 s snapshots kept coming while py-spy hung"
    hung = [int(p) for p in log.read_text().split()]
    # gputop has exited: a py-spy it was still waiting on must not stay behind
    wait_until(lambda: all_dead(hung), timeout=10, what="the hung py-spy processes to be gone after gputop exited")

    box, t0 = BoxLoad(), time.monotonic()
    ran = gputop(spawn, "snapshot", "--pid", str(job.pid), "--json", python=python, env=env, timeout=60)
    took = time.monotonic() - t0
    assert ran.rc == 0 and "Traceback" not in ran.err, ran.err
    assert took < 12, f"snapshot took {took:.1f} s with a hung py-spy; {box.since()}"
    hung = [int(p) for p in log.read_text().split()]
    wait_until(lambda: all_dead(hung), timeout=10, what="the hung py-spy processes to be gone")
    job.assert_trains()
    stacks = snapshot_stacks(json.loads(ran.out), job.pid)
    assert stacks["error"] == f"py-spy took longer than 3s on PID {job.pid}; will retry"


@pytest.mark.slow
def test_py_spy_killed_gives_one_line_error(tmp_path, target_job):
    job = target_job  # the fake py-spy only needs a live PID to be asked about
    fake = install_fake_py_spy(tmp_path / "fakebin", "killed")
    t0 = time.monotonic()
    result = stacks_mod.dump_stacks([job.pid], py_spy=str(fake), timeout=3.0)[job.pid]
    assert time.monotonic() - t0 < 3.5
    assert result.threads == () and result.error and "\n" not in result.error
    assert result.error.startswith("py-spy"), result.error
    job.assert_trains()
    assert result.error == "py-spy was killed by signal 9 (SIGKILL)", result.error


@pytest.mark.slow
def test_py_spy_hangs_tui_keeps_drawing_and_answering_keys(tmp_path, target_job):
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Following, Pipeline
    from gputop.tui.app import GputopApp
    from gputop.tui.screens import HelpScreen
    from tests.harness.tui import wait_for

    job = target_job
    fake = install_fake_py_spy(tmp_path / "fakebin", "hang")
    dump = functools.partial(stacks_mod.dump_stacks, py_spy=str(fake), timeout=30.0)  # hangs for the whole test
    collector = JobCollector(job.pid, stack_interval=0.2, dump=dump)
    pipeline = Pipeline(SimulatedMachine("h100-sxm-8"), follow=Following(attached=collector))
    app = GputopApp(pipeline, interval=0.1)

    async def drill() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.monitor.snapshots_seen >= 3, "snapshots while py-spy hangs")
            seen = app.monitor.snapshots_seen
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), "help to close")
            await wait_for(pilot, lambda: app.monitor.snapshots_seen > seen + 2, "more snapshots")
            t0 = time.monotonic()
            await pilot.press("q")
        assert time.monotonic() - t0 < 5

    try:
        asyncio.run(drill())
    finally:
        pipeline.close()
    job.assert_trains()


# ----------------------------------------------------------------------------- other users


AS_USER = DRILL_JOBS / "as_user.py"


@pytest.fixture
def world_dir():
    """A directory every user can reach and write (outside pytest's base temp dir, which pytest keeps 0700)."""
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="gputop-drill-", dir="/tmp"))
    shared.chmod(0o1777)
    try:
        yield shared
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def py_spy_for_everyone(directory: Path) -> Path:
    """py-spy in a directory any user can run from (the interpreter's own bin is under root's 0700 home here)."""
    directory.mkdir(exist_ok=True)
    target = directory / "py-spy"
    shutil.copyfile(stacks_mod.find_py_spy() or shutil.which("py-spy"), target)
    target.chmod(0o755)
    directory.chmod(0o755)
    return target


@pytest.mark.slow
@needs_root
def test_root_gputop_reads_another_users_job(spawn, tmp_path, world_dir):
    job = start_job(spawn, tmp_path, "--workers", "1", "--become", NOBODY, state_dir=world_dir)
    assert psutil.Process(job.pid).uids().effective == pwd.getpwnam(NOBODY).pw_uid
    rec = tmp_path / "other.gputop"
    ran = gputop(spawn, "record", "--pid", str(job.pid), "-o", str(rec), "--seconds", "2", "--interval", "0.5")
    assert ran.rc == 0 and "Traceback" not in ran.err, ran.err
    stacks = recorded_stacks(rec, job.pid)
    assert stacks.error is None and stacks.threads, "root (CAP_SYS_PTRACE) reads any user's stacks"
    rank = snapshots(rec)[-1].job.ranks[0]
    assert len(rank.workers) == 1 and rank.proc.pid == job.pid
    job.assert_trains()


@pytest.mark.slow
@needs_root
def test_gputop_as_another_user_is_refused_with_the_reason(spawn, world_dir, target_job):
    job = target_job  # a root job
    bindir = world_dir / "bin"
    py_spy_for_everyone(bindir)
    python = interpreter_beside(bindir)  # gputop "installed" where nobody can read it: py-spy is found beside it
    env = dict(os.environ, HOME=str(world_dir))

    def as_nobody(*args: str) -> Ran:
        proc = spawn(
            [sys.executable, str(AS_USER), NOBODY, "--executable", python, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=str(world_dir),
        )
        out, err = proc.communicate(timeout=90)
        return Ran(proc.returncode, out.decode(), err.decode())

    denied = (
        f"permission denied reading PID {job.pid}'s stacks: it belongs to root and gputop runs as {NOBODY}; "
        "run gputop as root, or with sudo"
    )
    rec = world_dir / "as-nobody.gputop"
    ran = as_nobody("record", "--pid", str(job.pid), "-o", str(rec), "--seconds", "2", "--interval", "0.5")
    assert ran.rc == 0 and "Traceback" not in ran.err, ran.err
    assert recorded_stacks(rec, job.pid).error == denied
    assert snapshots(rec)[-1].job.ranks[0].proc.pid == job.pid  # the /proc side still works

    ran = as_nobody("bench", "--pid", str(job.pid), "--yes", "--seconds", "8")
    assert_one_line_error(
        ran,
        1,
        f"gputop: PID {job.pid} belongs to root but gputop runs as {NOBODY}; run "
        "`gputop bench` as root (the agent must answer into that user's private directory)",
    )
    job.assert_trains()

    ran = as_nobody("snapshot", "--pid", str(job.pid), "--json")
    assert ran.rc == 0 and "Traceback" not in ran.err, ran.err
    assert snapshot_stacks(json.loads(ran.out), job.pid)["error"] == denied


@pytest.mark.slow
@needs_root
@pytest.mark.parametrize("plant", ["directory", "file", "open-mode"])
def test_results_directory_owned_by_someone_else_is_refused(tmp_path, plant, target_job):
    from gputop.bench import run_benchmark

    job = target_job
    base = tmp_path / "gputop-bench-0"
    base.mkdir(mode=0o700)
    nobody = pwd.getpwnam(NOBODY)
    if plant == "directory":
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        expected = (
            f"results directory {base} is owned by {NOBODY}, not you (root): someone else could plant "
            "results or code there; remove it (as root) and run again"
        )
    elif plant == "file":
        planted = base / "run-planted"
        planted.mkdir()
        os.chown(planted, nobody.pw_uid, nobody.pw_gid)
        expected = (
            f"file {planted} is owned by {NOBODY}, not you (root): someone else could plant results or "
            "code there; remove it (as root) and run again"
        )
    else:
        base.chmod(0o777)
        expected = f"results directory {base} is open to other users (mode 777); `chmod 700 {base}` or remove it, then run again"
    t0 = time.monotonic()
    with pytest.raises(GputopError) as refused:
        run_benchmark(job.pid, seconds=8, allow_inject=True, results_root=(str(base), str(base)))
    assert str(refused.value) == expected
    assert time.monotonic() - t0 < 5, "refused before sampling or injecting anything"
    assert sorted(p.name for p in base.iterdir()) == (["run-planted"] if plant == "file" else [])
    job.assert_trains()


# ----------------------------------------------------------------------------- locale and non-ASCII


THREAD_NAME = "загрузчик"


def c_locale_env(strict_ascii: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "PYTHONUTF8") and not k.startswith("LC_")}
    env.update(LANG="C", LC_ALL="C")
    if strict_ascii:  # no PEP 538 coercion to C.UTF-8, no UTF-8 mode: stdout really is ASCII
        env.update(PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    return env


@pytest.fixture(scope="module")
def non_ascii_job(module_spawn, tmp_path_factory):
    """Shared by both locales (one torch start, not two); each test ends with `assert_trains`."""
    directory = tmp_path_factory.mktemp("non-ascii")
    home = directory / "данные обучения"
    home.mkdir()
    script = home / "обучение.py"
    shutil.copyfile(train_jobs.JOB, script)
    return start_job(module_spawn, directory, "--workers", "1", "--idle-thread", THREAD_NAME, script=script, state_dir=home)


@pytest.mark.slow
@pytest.mark.parametrize("strict_ascii", [False, True], ids=["LANG=C", "LANG=C-no-coercion"])
def test_non_utf8_locale_non_ascii_paths_and_thread_names(spawn, tmp_path, non_ascii_job, strict_ascii):
    job = non_ascii_job
    env = c_locale_env(strict_ascii)
    rec = tmp_path / "запись.gputop"
    ran = gputop(spawn, "record", "--pid", str(job.pid), "-o", str(rec), "--seconds", "3", "--interval", "0.5", env=env)
    assert ran.rc == 0 and "Traceback" not in ran.err, ran.err
    stacks = recorded_stacks(rec, job.pid)
    assert stacks.error is None and THREAD_NAME in [t.thread_name for t in stacks.threads]
    assert any("данные обучения/обучение.py" in f.filename for t in stacks.threads for f in t.frames)

    table = gputop(spawn, "snapshot", "--pid", str(job.pid), env=env)
    assert table.rc == 0 and "Traceback" not in table.err and f"job {job.pid}" in table.out, table.err

    ran = gputop(spawn, "snapshot", "--pid", str(job.pid), "--json", env=env)
    assert ran.rc == 0 and "Traceback" not in ran.err, ran.err
    data = json.loads(ran.out)
    cmdline = " ".join(data["job"]["ranks"][0]["proc"]["cmdline"])
    assert "данные обучения/обучение.py" in cmdline, cmdline
    threads = snapshot_stacks(data, job.pid)["threads"]
    assert THREAD_NAME in [t["thread_name"] for t in threads]

    report = gputop(spawn, "report", "--pid", str(job.pid), "--seconds", "2", "--interval", "0.5", env=env)
    assert "Traceback" not in report.err, report.err
    # the report is UTF-8 whatever the locale ('·', sparklines), with the job's non-ASCII path as typed
    assert report.rc == 0 and report.out.startswith("#") and f"{job.pid}" in report.out, report.err
    assert "·" in report.out and "данные обучения/обучение.py" in report.out, report.out[-3000:]
    job.assert_trains()

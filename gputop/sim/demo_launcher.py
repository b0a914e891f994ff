"""Start, watch and stop the demo training job; also the job's own launcher (the torchrun role).

Two sides, both free of torch (gputop itself never imports it):

* `DemoJob`, used by `gputop demo` and the tests, runs in gputop's process.  It makes a
  private directory (mode 0700, under /dev/shm when there is one), creates the busy board
  and the step counters there, and starts the launcher as a new session and process group::

      with DemoJob("tuned", gpus=4) as job:
          launcher_pid = job.start()
          pipeline = demo_pipeline(launcher_pid, job.load_model())

  `stop()` signals the whole group (SIGTERM, then SIGKILL after a deadline), waits until no
  process of it is left and removes the directory.  It is safe to call twice.

* `python -m gputop.sim.demo_launcher ...` is the launcher.  Like torchrun it starts one
  process per rank (`python -m gputop.sim.demo_job`) with RANK, LOCAL_RANK, WORLD_SIZE,
  LOCAL_WORLD_SIZE and CUDA_VISIBLE_DEVICES in its environment, where gputop's job
  discovery reads them, and if one rank fails it stops the others and exits with that code.

Nothing is orphaned even when gputop dies by SIGKILL: the launcher asks the kernel for
SIGTERM when gputop dies (prctl PR_SET_PDEATHSIG), stops its ranks and exits; ranks and
their DataLoader workers get SIGKILL when their parent dies; and the launcher is a child
subreaper, so workers of a killed rank are reparented to it and reaped.  The parent-death
signal is tied to the *thread* that started the child, so call `DemoJob.start()` from a
thread that lives as long as the job (the main thread).
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

from gputop.errors import GputopError
from gputop.sim.busy_board import BusyBoard, create_shared_file, open_shared_file
from gputop.sim.load import BusyBoardLoad
from gputop.sim.scenarios import DemoConfig, resolve

PARENT_PID_ENV = "GPUTOP_DEMO_PARENT_PID"  # lets a child notice its parent died before prctl took effect
# What a launcher hands its ranks; removed from the launcher's own environment so job discovery sees the
# launcher as the parent of the ranks, not as a rank itself.
RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_VISIBLE_DEVICES")
STOP_GRACE_S = 5.0
STARTUP_TIMEOUT_S = 180.0  # 8 ranks importing torch on 2 busy cores take ~20 s; leave room

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """Linux prctl(2); False where it does not exist (other systems fall back on the process group)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result: int = libc.prctl(option, value, 0, 0, 0)  # (an int: ctypes' default restype)
        return result == 0
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel for `sig` when our parent dies (Linux); False where that is not possible."""
    return _prctl(_PR_SET_PDEATHSIG, int(sig))


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """`set_parent_death_signal`, and take `sig` now if the parent died before it took effect.

    The parent's PID comes from GPUTOP_DEMO_PARENT_PID, which whoever started us set.
    """
    set_parent_death_signal(sig)
    expected = os.environ.get(PARENT_PID_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        os.kill(os.getpid(), sig)


# ----------------------------------------------------------------------------- step counters


class StepCounters:
    """Per-rank step counts in a small shared file, so gputop can report each rank's steps/s.

    Layout: magic, slot count, then per rank: steps (i64) and the monotonic time of the last step (f64).
    One writer per slot; each field is one aligned store.
    """

    MAGIC = b"GPUTOPS1"
    _HEADER = struct.Struct("<8sI4x")
    _SLOT = struct.Struct("<qd")

    def __init__(self, path: str, mm: mmap.mmap, slots: int) -> None:
        self.path = path
        self._mm = mm
        self.slots = slots

    @classmethod
    def create(cls, path: str, slots: int) -> "StepCounters":
        mm = create_shared_file(path, cls._HEADER.size + slots * cls._SLOT.size)
        cls._HEADER.pack_into(mm, 0, cls.MAGIC, slots)
        return cls(path, mm, slots)

    @classmethod
    def open(cls, path: str) -> "StepCounters":
        mm = open_shared_file(path)
        magic, slots = cls._HEADER.unpack_from(mm, 0)
        if magic != cls.MAGIC:
            mm.close()
            raise ValueError(f"{path} is not a gputop step-counter file")
        return cls(path, mm, slots)

    def set(self, rank: int, steps: int, now: Optional[float] = None) -> None:
        offset = self._HEADER.size + rank * self._SLOT.size
        self._SLOT.pack_into(self._mm, offset, steps, time.monotonic() if now is None else now)

    def read(self) -> list[int]:
        """Steps taken by each rank so far."""
        return [self._SLOT.unpack_from(self._mm, self._HEADER.size + r * self._SLOT.size)[0] for r in range(self.slots)]

    def close(self) -> None:
        self._mm.close()


# ----------------------------------------------------------------------------- gputop's side


def _private_base() -> str:
    """Shared memory when the system has it (the board is an mmap), else the user's runtime dir, else tmp."""
    for candidate in ("/dev/shm", os.environ.get("XDG_RUNTIME_DIR")):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return tempfile.gettempdir()


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`."""
    import psutil

    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


class DemoJob:
    """The demo training job as one unit: start it, read its board and counters, stop all of it."""

    def __init__(
        self,
        scenario: str = "starved",
        workers: Optional[int] = None,
        batch_size: Optional[int] = None,
        step_ms: Optional[float] = None,
        gpus: Optional[int] = None,
        *,
        seed: int = 0,
        max_steps: Optional[int] = None,
        loss_log: Optional[str] = None,
        cpu_count: Optional[int] = None,
        collective_timeout_s: float = 600.0,
        slowness: Optional[float] = None,
        config: Optional[DemoConfig] = None,
    ) -> None:
        # bad overrides fail here, before anything is started; `config`: a resolved one as it is (the case study's stages)
        self.config: DemoConfig = config or resolve(
            scenario,
            workers=workers,
            batch_size=batch_size,
            step_ms=step_ms,
            gpus=gpus,
            cpu_count=cpu_count,
            seed=seed,
            max_steps=max_steps,
            loss_log=loss_log,
            collective_timeout_s=collective_timeout_s,
            slowness=slowness,
        )
        self.directory: Optional[str] = None
        self.board_path: Optional[str] = None
        self.log_path: Optional[str] = None
        self.launcher_pid: Optional[int] = None
        self._board: Optional[BusyBoard] = None
        self._counters: Optional[StepCounters] = None
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._stop_lock = threading.Lock()
        self._stopped = False

    # ------------------------------------------------------------------ life

    def start(self) -> int:
        """Start the launcher (and through it every rank); returns the launcher's PID."""
        if self._proc is not None or self._stopped:
            raise GputopError("this demo job was already started; make a new DemoJob")
        try:
            self.directory = tempfile.mkdtemp(prefix="gputop-demo-", dir=_private_base())  # mode 0700
            self.board_path = os.path.join(self.directory, "busy-board")
            self.log_path = os.path.join(self.directory, "job.log")
            counters_path = os.path.join(self.directory, "steps")
            self._board = BusyBoard.create(self.board_path, self.config.ranks)
            self._counters = StepCounters.create(counters_path, self.config.ranks)
            argv = [
                sys.executable,
                "-m",
                "gputop.sim.demo_launcher",
                "--board",
                self.board_path,
                "--counters",
                counters_path,
                "--rendezvous",
                os.path.join(self.directory, "rendezvous"),
                "--cleanup-dir",
                self.directory,
                *self.config.to_argv(),
            ]
            env = {k: v for k, v in os.environ.items() if k not in RANK_ENV and not k.startswith("MASTER_")}
            env[PARENT_PID_ENV] = str(os.getpid())
            env["PYTHONUNBUFFERED"] = "1"
            package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # its own process group: one signal reaches every process
                    close_fds=True,
                )
        except OSError as exc:
            self.stop()
            raise GputopError(f"could not start the demo job: {exc}") from None
        except BaseException:
            self.stop()
            raise
        self.launcher_pid = self._proc.pid
        return self._proc.pid

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every process of the job (SIGTERM, then SIGKILL after `grace_s`) and remove its files."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            if self._proc is not None:
                pgid = self._proc.pid
                if not self._signal_and_wait(pgid, signal.SIGTERM, grace_s):
                    self._signal_and_wait(pgid, signal.SIGKILL, grace_s)
        finally:
            for part in (self._board, self._counters):
                if part is not None:
                    part.close()  # the board's owner copy also unlinks its file
            if self.directory:
                shutil.rmtree(self.directory, ignore_errors=True)

    def _signal_and_wait(self, pgid: int, sig: int, timeout: float) -> bool:
        """Signal the group; True once the launcher is reaped and no live member is left."""
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while True:
            launcher_done = self._proc is None or self._proc.poll() is not None
            if launcher_done and not _group_members(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def __enter__(self) -> "DemoJob":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ reading

    def load_model(self) -> BusyBoardLoad:
        """The load model that drives the simulated GPUs from this job's busy board."""
        if self._board is None:
            raise GputopError("start the demo job before asking for its load model")
        return BusyBoardLoad(self._board)

    def step_counts(self) -> list[int]:
        """Steps each rank has taken so far."""
        return self._counters.read() if self._counters is not None else []

    @property
    def returncode(self) -> Optional[int]:
        """The launcher's exit code (negative: killed by that signal); None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    def failure(self) -> Optional[str]:
        """None while the job runs; else one line saying how it ended (a failed job's log is kept)."""
        if self._proc is None or self._proc.poll() is None:
            return None
        code = self._proc.returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        last = self.log_tail(1)
        message = f"the demo job {how}" + (f": {last[0]}" if last else "")
        kept = self._keep_log() if code else None
        return message + (f" (full log: {kept})" if kept else "")

    def _keep_log(self) -> Optional[str]:
        """Copy the job's log out of the private directory, which stop() removes."""
        if not self.log_path or self.launcher_pid is None:
            return None
        kept = os.path.join(tempfile.gettempdir(), f"gputop-demo-{self.launcher_pid}.log")
        try:
            if not os.path.exists(kept):
                shutil.copyfile(self.log_path, kept)
        except OSError:
            return None
        return kept

    def log_tail(self, lines: int = 20) -> list[str]:
        if not self.log_path:
            return []
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def wait_until_training(self, timeout: float = STARTUP_TIMEOUT_S) -> float:
        """Block until every rank has finished a step; returns the seconds it took. GputopError on failure."""
        started = time.monotonic()
        while True:
            failure = self.failure()
            if failure:
                raise GputopError(failure)
            counts = self.step_counts()
            if counts and min(counts) > 0:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                waiting = [str(r) for r, c in enumerate(counts) if c == 0]
                raise GputopError(
                    f"demo ranks {', '.join(waiting)} took no step within {timeout:.0f} s "
                    f"(is the machine overloaded? job log: {self._keep_log()})"
                )
            time.sleep(0.1)


# ----------------------------------------------------------------------------- the launcher


class _Shutdown(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


_SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _raise_shutdown(signum: int, _frame: object) -> None:
    raise _Shutdown(signum)


def _ignore_shutdown_signals() -> None:
    for sig in _SHUTDOWN_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _rank_env(config: DemoConfig, rank: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        GROUP_RANK="0",
        WORLD_SIZE=str(config.ranks),
        LOCAL_WORLD_SIZE=str(config.ranks),
        OMP_NUM_THREADS="1",  # torchrun's default too
        GLOO_SOCKET_IFNAME="lo",  # the collectives stay on loopback
    )
    env[PARENT_PID_ENV] = str(os.getpid())
    if config.flight_recorder:  # kept in memory only: gputop reads it from inside the ranks when they stand still
        env["TORCH_FR_BUFFER_SIZE"] = "2000"
    if config.ranks_on_gpu0:
        # the bug: nothing binds a rank to its GPU, and the script uses `cuda` (= cuda:0) instead of cuda:LOCAL_RANK
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(rank)
    return env


def _reap(children: dict[int, int], deadline: float) -> list[tuple[int, int]]:
    """Reap processes (ranks, and workers reparented to us) until none is left or the deadline passes.

    Returns (rank, exit status) for ranks that ended."""
    ended = []
    while time.monotonic() < deadline:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.02)
            continue
        if pid in children:
            ended.append((children.pop(pid), os.waitstatus_to_exitcode(status)))
    return ended


def _stop_ranks(children: dict[int, int], grace_s: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(children):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        _reap(children, time.monotonic() + grace_s)
        if not children:
            return


def launcher_main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gputop.sim.demo_launcher", description=__doc__.split("\n")[0])
    parser.add_argument("--board", required=True)
    parser.add_argument("--counters", required=True)
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--cleanup-dir", help="a directory made for this job alone: removed when the launcher exits")
    DemoConfig.add_arguments(parser)
    args = parser.parse_args(argv)
    config = DemoConfig.from_namespace(args)

    for sig in _SHUTDOWN_SIGNALS:
        signal.signal(sig, _raise_shutdown)
    die_with_parent(signal.SIGTERM)  # gputop gone: stop the ranks and leave
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphaned DataLoader workers come to us to be reaped

    rank_argv = [
        sys.executable,
        "-m",
        "gputop.sim.demo_job",
        "--board",
        args.board,
        "--counters",
        args.counters,
        "--rendezvous",
        args.rendezvous,
        *config.to_argv(),
    ]
    children: dict[int, int] = {}
    # keep the Popen objects: a dropped one is polled (and reaped) behind our back by the next Popen()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(config.ranks):
            procs.append(subprocess.Popen(rank_argv, env=_rank_env(config, rank), stdin=subprocess.DEVNULL))
            children[procs[-1].pid] = rank
        while children:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            ended_rank = children.pop(pid, None)
            code = os.waitstatus_to_exitcode(status)
            if ended_rank is not None and code != 0:
                _ignore_shutdown_signals()
                # torchrun's rule: one rank failed, so the job failed; stop the rest
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                print(f"demo launcher: rank {ended_rank} {how}; stopping the other ranks", file=sys.stderr)
                _stop_ranks(children)
                return code if code > 0 else 128 - code
        return 0
    except _Shutdown as stop:
        _ignore_shutdown_signals()  # a second SIGTERM must not cut the cleanup short
        _stop_ranks(children)
        _reap({}, time.monotonic() + 1.0)  # workers reparented to us
        if args.cleanup_dir:
            # DemoJob.stop() removes it too; this covers gputop having been killed outright. When the job
            # ends by itself the directory stays, so DemoJob can still show the log.
            shutil.rmtree(args.cleanup_dir, ignore_errors=True)
        return 128 + stop.signum
    finally:
        _reap({}, time.monotonic() + 1.0)  # leftovers reparented to us


if __name__ == "__main__":
    sys.exit(launcher_main())

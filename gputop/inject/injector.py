"""Start the benchmark agent inside a live Python process, and the private directory it answers in.

What gets injected is one expression that only starts a daemon thread and returns (injected code blocks
the thread it runs on while it runs).  It binds no names, because it runs with ``PyRun_SimpleString`` in
the job's ``__main__`` namespace.  The thread executes the agent file from the run directory.

- Python 3.14+: ``sys.remote_exec(pid, path)`` (PEP 768), run by the target's own interpreter
  (``/proc/PID/exe``) because the caller must be the same major.minor version; the interpreter runs it at
  its own safe point.
- Python 3.10-3.13: `gputop.inject.safepoint`, in a helper process with a deadline: it borrows a thread
  of the job only while that thread is parked in a blocking syscall that holds no lock the call needs,
  and refuses with one line when no thread gets there within a few seconds.  The expression travels in
  the target's memory, so nothing but the agent files is written into the target's filesystem (a
  container's run directory lives under its root, ``/proc/PID/root/tmp/...``).

The run directory sits in ``/tmp/gputop-bench-<uid>/`` as the target sees it: mode 0700, owned by us.
When the target shares our root it is addressed as plain ``/tmp/...``; only a container's is reached
through ``/proc/PID/root``, a path that vanishes with the process, so for those we hold the base
directory open and remove the run directory through that descriptor (a job killed mid-run leaves
nothing behind either way).
Anything there owned by someone else (or a group/world-writable directory) is refused, since that
person could feed us results or swap the agent file.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from gputop.errors import GputopError

if TYPE_CHECKING:
    from gputop.model import ThreadProgress

AGENT_FILES = ("inject/agent.py", "analysis/loader_math.py")  # relative to the gputop package
TRACE_AGENT_FILES = ("inject/trace_agent.py", "inject/agent.py")
MIN_PYTHON = (3, 10)
REMOTE_EXEC_PYTHON = (3, 14)
BOOTSTRAP_ERROR = "bootstrap-error.txt"  # beside the agent file: what the injected line raised, if anything
VERSION_TIMEOUT = 5.0
INJECT_TIMEOUT = 10.0
MAX_RESULT_BYTES = 256 << 20  # an agent's JSON answer (a sweep, a trace's result) is far smaller
# The safe-point helper's deadlines, counted in two parts.  Its start (an interpreter, pyelftools) takes a fraction
# of a second on a quiet box and several on a loaded one; until it says it started it has touched no thread, so
# a kill then costs the job nothing.  From then on: its own bounds (3 s to find a thread, 5 s for the call) and
# room for its ELF reads and its exit.  One bound over both (12 s) let a slow start eat the call's time: a helper
# started on a starved box was killed while the call it had begun ran on (a CI run, stop 45).
HELPER_START_TIMEOUT = 30.0
HELPER_TIMEOUT = 12.0

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_VERSION_RE = re.compile(r"^Python v(\d+)\.(\d+)(?:\.(\d+))?", re.MULTILINE)


@dataclass(frozen=True)
class Target:
    pid: int
    uid: int
    python: tuple[int, int, int]
    root: str  # the target's filesystem root as we see it: /proc/PID/root
    foreign_root: bool  # True when the target sees another filesystem (a container)


@dataclass(frozen=True)
class RunDir:
    host_path: str  # where gputop reads and writes it
    target_path: str  # the same directory as the target sees it
    base_fd: Optional[int] = None  # the open base directory, when host_path dies with the target (a container)


# --------------------------------------------------------------------------------------- the target


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def python_version(pid: int) -> tuple[int, int, int]:
    """The target's Python version, read by py-spy (works for static and shared builds alike)."""
    from gputop.collect.stacks import PY_SPY_INSTALL_HINT, classify_failure, find_py_spy

    py_spy = find_py_spy()
    if py_spy is None:
        raise GputopError(f"py-spy not found; {PY_SPY_INSTALL_HINT}")
    try:
        proc = subprocess.run(
            [py_spy, "dump", "--pid", str(pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, RUST_BACKTRACE="0"),
        )
    except subprocess.TimeoutExpired:
        raise GputopError(f"py-spy took over {VERSION_TIMEOUT:g}s to read PID {pid}; try again") from None
    match = _VERSION_RE.search(proc.stdout)
    if match is None:
        raise GputopError(f"cannot inject into PID {pid}: {classify_failure(pid, proc.stderr or proc.stdout)}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def refuse_stopped(pid: int) -> None:
    """One line, when `pid` is stopped (`safepoint.stopped_refusal`)."""
    from gputop.inject.safepoint import stopped_refusal

    refusal = stopped_refusal(pid)
    if refusal is not None:
        raise GputopError(refusal)


def inspect_target(pid: int) -> Target:
    """Checks before anything is injected: alive, not stopped, same user, a supported Python. One-line refusals."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        raise GputopError(f"no process with PID {pid}; check the PID with `ps` or run `gputop` to find the job") from None
    refuse_stopped(pid)
    our_uid = os.geteuid()
    if uid != our_uid:
        raise GputopError(
            f"PID {pid} belongs to {_user(uid)} but gputop runs as {_user(our_uid)}; run `gputop bench` as "
            f"{_user(uid)} (the agent must answer into that user's private directory)"
        )
    version = python_version(pid)
    if version[:2] < MIN_PYTHON:
        raise GputopError(
            f"PID {pid} runs Python {'.'.join(map(str, version))}; the active benchmark needs Python 3.10 or newer "
            "(the passive numbers above still apply)"
        )
    root = f"/proc/{pid}/root"
    try:
        ours, theirs = os.stat("/"), os.stat(root)
        foreign = (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino) or _own_mounts(pid)
    except PermissionError:
        raise GputopError(f"cannot read {root} (permission denied); run gputop as the job's user or with sudo") from None
    return Target(pid=pid, uid=uid, python=version, root=root, foreign_root=foreign)


def _own_mounts(pid: int) -> bool:
    """True when the target lives in a mount namespace of its own: under the same root its /tmp may be another
    directory (Slurm's job_container/tmpfs, systemd's PrivateTmp), reached only through /proc/PID/root."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    except OSError:
        return False


# ---------------------------------------------------------------------------- the private directory


def _refuse_foreign(path: str, st: os.stat_result, what: str) -> None:
    uid = os.geteuid()
    if st.st_uid != uid:
        raise GputopError(
            f"{what} {path} is owned by {_user(st.st_uid)}, not you ({_user(uid)}): someone else could plant "
            "results or code there; remove it (as root) and run again"
        )


def secure_directory(path: str) -> None:
    """Create `path` 0700 if missing; refuse a symlink, another owner, or group/world access."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise GputopError(f"cannot create {path}: its parent does not exist in the target's filesystem") from None
    except PermissionError:
        raise GputopError(f"cannot create {path}: permission denied") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise GputopError(f"{path} is not a plain directory (a symlink or file is in its place); remove it and run again")
    _refuse_foreign(path, st, "results directory")
    if st.st_mode & 0o077:
        raise GputopError(
            f"results directory {path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"`chmod 700 {path}` or remove it, then run again"
        )
    check_owned_entries(path)


def check_owned_entries(path: str) -> None:
    """Refuse when anything directly inside `path` belongs to another user."""
    with os.scandir(path) as entries:
        for entry in entries:
            _refuse_foreign(entry.path, entry.stat(follow_symlinks=False), "file")


def read_private_bytes(run_dir: str, name: str, limit: int) -> Optional[bytes]:
    """A file the agent wrote, after checking it is ours and a plain file; at most `limit` + 1 bytes (the
    caller tells a file over `limit` by its length).  None when absent."""
    path = os.path.join(run_dir, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GputopError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        _refuse_foreign(path, st, "result file")
        if not stat.S_ISREG(st.st_mode):
            raise GputopError(f"{path} is not a plain file; remove it and run again")
        return f.read(limit + 1)


def read_private_json(run_dir: str, name: str) -> Optional[dict[str, Any]]:
    """A JSON file the agent wrote, after checking it is ours and a plain file. None when absent."""
    data = read_private_bytes(run_dir, name, MAX_RESULT_BYTES)
    if data is None:
        return None
    try:
        answer = json.loads(data)
    except ValueError:
        return None  # being written (the agent writes atomically, so only a stray file gets here)
    return answer if isinstance(answer, dict) else None  # the agent writes JSON objects only


def default_results_root(target: Target) -> tuple[str, str]:
    """(host path, target path) of the per-user base directory in the target's /tmp: the same plain
    path when the target shares our root, else reached through /proc/PID/root."""
    target_root = f"/tmp/gputop-bench-{os.geteuid()}"
    if not target.foreign_root:
        return target_root, target_root
    return os.path.join(target.root, target_root.lstrip("/")), target_root


def prepare_run_dir(
    target: Target, config: dict[str, Any], results_root: Optional[tuple[str, str]] = None, files: tuple[str, ...] = AGENT_FILES
) -> RunDir:
    """A fresh 0700 run directory holding the agent's `files` (the benchmark's by default) and the config."""
    host_root, target_root = results_root or default_results_root(target)
    secure_directory(host_root)
    remove_stale_runs(host_root)
    base_fd = None
    if target.foreign_root:  # /proc/PID/root/... vanishes with the job; the descriptor does not
        base_fd = os.open(host_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    host_path = tempfile.mkdtemp(prefix="run-", dir=host_root)  # mkdtemp creates it 0700
    run = RunDir(host_path=host_path, target_path=os.path.join(target_root, os.path.basename(host_path)), base_fd=base_fd)
    try:
        _populate(run, config, files)
    except BaseException:
        remove_run_dir(run)
        raise
    return run


def prepare_local_run_dir(config: dict[str, Any], base: Optional[str] = None) -> RunDir:
    """The same, in this machine's /tmp, for the offline benchmark's helper process."""
    base = base or os.path.join(tempfile.gettempdir(), f"gputop-bench-{os.geteuid()}")
    secure_directory(base)
    remove_stale_runs(base)
    host_path = tempfile.mkdtemp(prefix="offline-", dir=base)
    run = RunDir(host_path=host_path, target_path=host_path)
    _populate(run, config)
    return run


def _populate(run: RunDir, config: dict[str, Any], files: tuple[str, ...] = AGENT_FILES) -> None:
    for rel in files:
        _write_private(os.path.join(run.host_path, os.path.basename(rel)), (_PACKAGE_DIR / rel).read_bytes())
    _write_private(os.path.join(run.host_path, "config.json"), json.dumps(config).encode())


def write_run_file(run: RunDir, name: str, data: dict[str, Any]) -> None:
    """A new JSON file for the agent (plan.json); never overwrites, never follows a symlink."""
    _write_private(os.path.join(run.host_path, name), json.dumps(data).encode())


def _write_private(path: str, data: bytes, mode: int = 0o600) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def remove_run_dir(run: RunDir) -> None:
    """Remove the run directory, also once the target (and its /proc/PID/root) is gone."""
    if run.base_fd is None:
        shutil.rmtree(run.host_path, ignore_errors=True)
        return
    try:
        if sys.version_info >= (3, 11):
            shutil.rmtree(os.path.basename(run.host_path), dir_fd=run.base_fd, ignore_errors=True)
        else:  # (rmtree has no dir_fd before 3.11: reach the directory through the descriptor's /proc link)
            shutil.rmtree(f"/proc/self/fd/{run.base_fd}/{os.path.basename(run.host_path)}", ignore_errors=True)
    finally:
        try:
            os.close(run.base_fd)
        except OSError:  # closed by an earlier call
            pass


STALE_RUN_S = 600.0  # every run is bounded far below this; older run directories were abandoned


def remove_stale_runs(base: str) -> None:
    """Remove run directories an interrupted gputop left behind (ours only: `secure_directory` checked)."""
    now = time.time()
    with os.scandir(base) as entries:
        for entry in entries:
            if entry.name.startswith(("run-", "offline-")) and entry.is_dir(follow_symlinks=False):
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_RUN_S:
                    shutil.rmtree(entry.path, ignore_errors=True)


# ------------------------------------------------------------------------- one injection at a time


class InjectionLock:
    """One bench or trace at a time per process: an exclusive ``flock`` on a file keyed by the target's PID and
    start time (a new process that reuses the PID is another process), in this user's private directory.

    Two benchmarks at once would stack their ``__next__`` wrappers (one could restore the other's, leaving a
    wrapper in the job for good), size two sweeps from the same free memory, and race two trace agents past
    the "a profiler is already running" check.  The second is refused in one line.  The kernel drops the lock
    when its holder dies, however it dies.
    """

    def __init__(self, pid: int, what: str, base: Optional[str] = None) -> None:
        from gputop.collect.procfs import read_stat

        stat_now = read_stat(pid)
        self.pid = pid
        self.what = what
        self.base = base or os.path.join(tempfile.gettempdir(), f"gputop-bench-{os.geteuid()}")
        self.path = os.path.join(self.base, f"lock-{pid}-{stat_now.start_ticks if stat_now is not None else 0}")
        self.fd: Optional[int] = None

    def __enter__(self) -> "InjectionLock":
        import fcntl

        secure_directory(self.base)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another gputop"
                os.close(fd)
                raise GputopError(
                    f"PID {self.pid} already has a gputop injection running ({holder}); one at a time: run this "
                    "again when that one has finished"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same:  # (else its holder removed it as we opened it: take the new file instead)
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"gputop PID {os.getpid()}: {self.what}".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            os.close(self.fd)  # closing drops the flock
            self.fd = None


# ------------------------------------------------------------------------------------- injecting


def bootstrap_code(agent_target_path: str, thread_name: str = "gputop-bench-agent") -> str:
    """A statement that starts a daemon thread executing the agent file, and binds no names in __main__.

    The agent's namespace gets ``__gputop_started__``, an Event set once ``start()`` has returned, i.e.
    once the job's main thread is about to leave the injected code.  The trace agent waits for it before
    it arms its window.  Every exception is caught where it is raised (``PyRun_SimpleString`` turns a
    ``SystemExit`` that escapes it into the job's own exit, and prints anything else into the job's stderr)
    and written to ``BOOTSTRAP_ERROR`` beside the agent file instead (`bootstrap_error` reads it): a thread
    the job could not start (a pids limit reached) is then said, not mistaken for a silent agent.
    """
    path = json.dumps(agent_target_path)
    error_path = json.dumps(os.path.join(os.path.dirname(agent_target_path), BOOTSTRAP_ERROR))
    start = (
        "(lambda th: (lambda e: (lambda t: (t.start(), e.set()))(th.Thread(target=lambda p: exec(compile(open(p).read(), "
        "p, 'exec'), {'__name__': '__gputop_agent__', '__file__': p, '__gputop_started__': e}), "
        f"args=({path},), name={json.dumps(thread_name)}, daemon=True)))(th.Event()))(__import__('threading'))"
    )
    record = f"__import__('builtins').open({error_path}, 'w').write(repr(__import__('sys').exc_info()[1]))"
    return f"try:\n    {start}\nexcept BaseException:\n    try:\n        {record}\n    except BaseException:\n        pass\n"


def bootstrap_error(run: RunDir) -> Optional[str]:
    """What the bootstrap raised in the job instead of starting the agent's thread; None when it did not."""
    try:
        with open(os.path.join(run.host_path, BOOTSTRAP_ERROR), errors="replace") as f:
            return f.read(300).strip() or None
    except OSError:
        return None


def inject_agent(target: Target, run: RunDir, agent_file: str = "agent.py", thread_name: str = "gputop-bench-agent") -> None:
    """Start the agent thread in the target; raises GputopError with one line when it cannot."""
    agent_path = os.path.join(run.target_path, agent_file)
    code = bootstrap_code(agent_path, thread_name)
    if target.python[:2] >= REMOTE_EXEC_PYTHON:
        _remote_exec(target, run, code)
    else:
        _safepoint_inject(target, code)


def _remote_exec(target: Target, run: RunDir, code: str) -> None:
    _write_private(os.path.join(run.host_path, "bootstrap.py"), (code + "\n").encode())
    script = os.path.join(run.target_path, "bootstrap.py")
    interpreter = f"/proc/{target.pid}/exe"  # same major.minor as the target, as PEP 768 requires
    try:
        proc = subprocess.run(
            [interpreter, "-I", "-c", f"import sys; sys.remote_exec({target.pid}, {script!r})"],
            capture_output=True,
            text=True,
            timeout=INJECT_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GputopError(f"could not run the target's Python for sys.remote_exec: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        hint = ""
        if "disable" in last.lower() or "remote debug" in last.lower():
            hint = " (the job runs with PYTHON_DISABLE_REMOTE_DEBUG or -X disable_remote_debug)"
        elif "ermission" in last or "not permitted" in last:
            from gputop.collect.stacks import diagnose_permission

            hint = f" ({diagnose_permission(target.pid)})"
        raise GputopError(f"sys.remote_exec into PID {target.pid} failed: {last}{hint}")


def _safepoint_inject(target: Target, code: str) -> None:
    """Run `code` in the target through the safe-point injector, in a helper process with a deadline:
    gputop never sits inside ptrace itself, and killing the helper at any moment leaves the job running."""
    from gputop.inject import safepoint

    # The helper holds ptrace rights over the job: it runs isolated (-I: no PYTHON* variables, no user site, no
    # script directory on its path) from "/", so no json.py or elftools/ in the user's directory can stand in
    # for the real ones; gputop's own directory goes last on its path, after the standard library and
    # site-packages.  In a session of its own it hears no Ctrl-Z or Ctrl-C from gputop's terminal: a stopped
    # or interrupted gputop never leaves the job held half-way through an injection.
    launcher = (
        f"import sys; sys.path.append({str(_PACKAGE_DIR.parent)!r}); "
        "from gputop.inject.safepoint import main; sys.exit(main(sys.argv[1:]))"
    )
    argv = [
        sys.executable,
        "-I",
        "-c",
        launcher,
        str(target.pid),
        "--code",
        code,
        "--find-seconds",
        f"{safepoint.FIND_BOUND_S:g}",
        "--call-seconds",
        f"{safepoint.CALL_BOUND_S:g}",
    ]
    said, returncode, stderr = _run_helper(argv)
    if returncode is None:  # past a deadline, killed: the job goes on (see safepoint's docstring)
        switched = next((line["switched"] for line in said if "switched" in line), None)
        if switched:
            raise GputopError(safepoint.SWITCHED_TIMEOUT.format(tid=switched, pid=target.pid)) from None
        if not any(line.get("started") for line in said):
            raise GputopError(
                f"the injection helper for PID {target.pid} did not start within {HELPER_START_TIMEOUT:g}s (a busy "
                "box?); it was stopped before it touched a thread, and the job left running; nothing was injected"
            )
        raise GputopError(
            f"the injection into PID {target.pid} did not finish within {HELPER_TIMEOUT:g}s; the helper was stopped "
            "before it touched a thread, and the job left running; nothing was injected"
        )
    answer = said[-1] if said else None
    if answer is None or "ran" not in answer and "refused" not in answer:
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        raise GputopError(f"the injection helper for PID {target.pid} failed: {last[:200]}")
    if answer.get("refused"):
        text = answer["refused"]
        if "not permitted" in text:
            from gputop.collect.stacks import diagnose_permission

            text = diagnose_permission(target.pid).replace("reading PID", "injecting into PID")
        raise GputopError(text)
    if answer.get("reason") or not answer.get("ran"):  # no thread started, or the call outlived its bound
        raise GputopError(f"PID {target.pid}: {answer.get('reason') or 'nothing was injected'}")


def _run_helper(argv: list[str]) -> tuple[list[dict[str, Any]], Optional[int], str]:
    """Run the safe-point helper under its two deadlines: the JSON lines it printed, its exit status (None when
    it was killed past a deadline) and its standard error."""
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd="/",
            start_new_session=True,
        )
        lines: "queue.Queue[Optional[str]]" = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read, name="gputop-helper-output", daemon=True)
        reader.start()
        said: list[dict[str, Any]] = []
        deadline = time.monotonic() + HELPER_START_TIMEOUT
        killed = False
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                proc.kill()  # our own child, by its handle
                killed = True
                break
            if line is None:
                break
            said += _json_lines(line)
            if said and said[-1].get("started"):
                deadline = time.monotonic() + HELPER_TIMEOUT
        returncode = proc.wait()
        reader.join()
        while killed and (rest := lines.get()) is not None:  # said between the deadline and the kill ("switched")
            said += _json_lines(rest)
        stderr.seek(0)
        return said, None if killed else returncode, stderr.read()


def _json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects the helper printed, one a line, in order."""
    found = []
    for line in text.splitlines():
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        if isinstance(answer, dict):
            found.append(answer)
    return found


# ------------------------------------------------------------------------------- a job that stopped

FROZEN_WATCH_S = 1.5  # a training loop's main thread moves its counters many times a second


def main_thread_progress(pid: int) -> Optional[ThreadProgress]:
    """The main thread's counters now (CPU time, context switches): `frozen_evidence`'s `since`."""
    from gputop.collect import procfs

    return procfs.read_thread_progress(pid, pid)


def frozen_evidence(pid: int, since: Optional[ThreadProgress] = None, watch_s: float = FROZEN_WATCH_S) -> Optional[str]:
    """One line saying that `pid` is frozen, with its main thread's native stack, when the main thread's
    CPU time and context switches stood still: since `since` (`main_thread_progress` when the agent was
    started), else over a watch of `watch_s`; None while it moves (or once it is gone).

    Asked when an injected agent never answered: whatever froze the job (a lock, a hang in the loader, the
    injection itself), the user is told the job stopped rather than that the benchmark failed."""
    before = since if since is not None else main_thread_progress(pid)
    deadline = time.monotonic() + (0.0 if since is not None else watch_s)
    while before is not None:
        now = main_thread_progress(pid)
        if now != before:
            return None
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)  # sampling the counters over the watch window
    if before is None:
        return None
    how_long = "since the agent was started" if since is not None else f"for {watch_s:g}s"
    return (
        f"PID {pid} is frozen: its main thread's CPU time and context switches stood still {how_long}; "
        f"its main thread is in {_native_top(pid)}"
    )


def _native_top(pid: int, frames: int = 4) -> str:
    from gputop.collect.stacks import dump_native

    stacks = dump_native(pid)
    if stacks.error:
        return f"an unknown place (no native stack: {stacks.error})"
    main = next((t for t in stacks.threads if t.os_thread_id == pid), stacks.threads[0] if stacks.threads else None)
    if main is None or not main.frames:
        return "an unknown place (py-spy saw no thread)"
    named = [f.name for f in main.frames if not f.name.startswith("0x")]  # stripped libc frames are bare addresses
    return " <- ".join(named[:frames]) or "code without symbols"

"""Python stacks of live processes, read with py-spy without pausing them (but for one native dump of a
process frozen for 10 s, see `dump_native`).

One ``py-spy dump --pid N --json --nonblocking`` per PID, all PIDs at once: py-spy cannot give JSON
for a process tree (``--subprocesses`` with ``--json`` prints only the parent, py-spy issue 601), and
its text mode stops at the first non-Python child.  Nor would one py-spy for the tree be much cheaper:
it reads each child's maps and libpython symbols anew, one child after another on one core (5-19% less
CPU than a py-spy per process, 1.1-1.6x the wall time on 2 cores), and one torn read ends it.  ``--nonblocking`` reads the
target's memory while it runs, so a read now and then tears ("Failed to copy PyFrameObject ... Bad
address"); those are retried.  Every failure ends as one line in `ProcessStacks.error` that says what to do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Optional

from gputop.collect.procfs import process_alive, read_progress, read_status_field
from gputop.model import Frame, ProcessStacks, ThreadStack

DEFAULT_TIMEOUT = 3.0  # seconds for all attempts on one PID; a healthy dump takes ~12 ms
DEFAULT_ATTEMPTS = 3

# Torn reads of a running interpreter's memory: the next read usually succeeds.
_TRANSIENT_MARKERS = (
    "Failed to copy PyFrameObject",
    "Failed to copy PyCodeObject",
    "Failed to copy PyThreadState",
    "Failed to copy filename",
    "Failed to copy function name",
    "Failed to get line number",
    "Bad address (os error 14)",
    "Max frame recursion depth reached",
    "Max thread recursion depth reached",
)
_NOT_PYTHON_MARKERS = (
    "Failed to find python version",
    "Failed to find a python interpreter",
    "failed to find _PyRuntime symbol",
)
_PERMISSION_MARKERS = ("Permission Denied", "Permission denied", "os error 13", "Operation not permitted", "os error 1)")

CAP_SYS_PTRACE = 19  # bit in /proc/PID/status CapEff
PY_SPY_INSTALL_HINT = "install it with `pip install py-spy` (into the same environment as gputop)"


# ----------------------------------------------------------------- locating py-spy


def find_py_spy() -> Optional[str]:
    """py-spy next to this interpreter first (the venv gputop was installed into), then PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    try:
        if beside.is_file() and os.access(beside, os.X_OK):
            return str(beside)
    except OSError:  # the interpreter's directory may not be searchable by us (PermissionError): use PATH
        pass
    return shutil.which("py-spy")


def _py_spy_missing() -> str:
    return f"py-spy not found (looked next to {sys.executable} and on PATH); {PY_SPY_INSTALL_HINT}"


# ----------------------------------------------------------------- parsing


def parse_dump(pid: int, text: str | bytes, timestamp: float) -> ProcessStacks:
    """py-spy's ``dump --json`` output -> ProcessStacks (frames stay innermost first, as py-spy gives them)."""
    threads = []
    for raw in json.loads(text):
        frames = tuple(
            Frame(
                name=str(f.get("name") or "?"),
                filename=str(f.get("filename") or f.get("short_filename") or "?"),
                line=int(f.get("line") or 0),
                module=f.get("module"),
            )
            for f in raw.get("frames") or ()
        )
        threads.append(
            ThreadStack(
                thread_id=int(raw.get("thread_id") or 0),
                thread_name=raw.get("thread_name"),
                os_thread_id=raw.get("os_thread_id"),
                active=bool(raw.get("active")),
                owns_gil=bool(raw.get("owns_gil")),
                frames=frames,
            )
        )
    return ProcessStacks(pid=pid, timestamp=timestamp, threads=tuple(threads))


# ----------------------------------------------------------------- errors


def _py_spy_error_line(stderr: str) -> str:
    """The first meaningful line of py-spy's stderr (it may append a backtrace)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("Error:"):
            return ln[len("Error:") :].strip()
    return lines[0] if lines else "no output"


def has_cap_sys_ptrace(pid: int | str = "self") -> bool:
    cap = read_status_field(pid, "CapEff")
    try:
        return bool(int(cap or "0", 16) >> CAP_SYS_PTRACE & 1)
    except ValueError:
        return False


PTRACE_SCOPE_PATH = "/proc/sys/kernel/yama/ptrace_scope"


def read_ptrace_scope(path: str = PTRACE_SCOPE_PATH) -> Optional[int]:
    """kernel.yama.ptrace_scope, or None where Yama is not built in."""
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def in_container() -> bool:
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    try:
        cgroup = Path("/proc/1/cgroup").read_text(errors="replace")
    except OSError:
        return False
    return any(word in cgroup for word in ("docker", "kubepods", "containerd", "libpod", "lxc"))


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


@dataclass(frozen=True)
class PtraceFacts:
    """What decides whether we may read another process's memory, as found on this machine."""

    our_uid: int
    target_uid: Optional[int]
    has_cap_sys_ptrace: bool
    ptrace_scope: Optional[int]  # None: no Yama
    in_container: bool

    @classmethod
    def read(cls, pid: int) -> "PtraceFacts":
        try:
            target_uid: Optional[int] = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            target_uid = None
        return cls(os.geteuid(), target_uid, has_cap_sys_ptrace(), read_ptrace_scope(), in_container())


def permission_advice(pid: int, facts: PtraceFacts) -> str:
    """Which rule denies ptrace on `pid` (same user / root / CAP_SYS_PTRACE / Yama / container) and the fix."""
    prefix = f"permission denied reading PID {pid}'s stacks"
    if facts.our_uid == 0 and not facts.has_cap_sys_ptrace:
        where = "this container" if facts.in_container else "this environment"
        return (
            f"{prefix}: gputop runs as root but {where} dropped CAP_SYS_PTRACE; start the container with "
            "`--cap-add SYS_PTRACE` (Kubernetes: securityContext.capabilities.add: [SYS_PTRACE])"
        )
    if facts.target_uid is not None and facts.target_uid != facts.our_uid and not facts.has_cap_sys_ptrace:
        owner, us = _user_name(facts.target_uid), _user_name(facts.our_uid)
        return f"{prefix}: it belongs to {owner} and gputop runs as {us}; run gputop as {owner}, or with sudo"
    scope = facts.ptrace_scope
    if scope == 3:
        return f"{prefix}: kernel.yama.ptrace_scope=3 forbids attaching to any process until reboot"
    if scope == 2 and not facts.has_cap_sys_ptrace:
        return f"{prefix}: kernel.yama.ptrace_scope=2 allows only root/CAP_SYS_PTRACE; run gputop with sudo"
    if scope == 1 and not facts.has_cap_sys_ptrace:
        return (
            f"{prefix}: kernel.yama.ptrace_scope=1 lets only a parent read its child; run gputop with sudo, "
            "or `sudo sysctl kernel.yama.ptrace_scope=0`"
        )
    if facts.our_uid == 0 or facts.has_cap_sys_ptrace:
        # Every ptrace rule above is satisfied, so a security policy refuses the call itself.
        where = (
            "this container's seccomp/AppArmor profile blocks ptrace; start it with `--cap-add SYS_PTRACE` "
            "(and `--security-opt seccomp=unconfined` on old Docker), or run gputop on the host"
            if facts.in_container
            else "a seccomp/AppArmor/SELinux policy blocks ptrace here; ask the admin, or run gputop outside it"
        )
        return f"{prefix}: gputop has root/CAP_SYS_PTRACE, so {where}"
    if facts.in_container:
        return f"{prefix}: run gputop as root in the container, started with `--cap-add SYS_PTRACE`"
    return f"{prefix}: run gputop as the job's user, or with sudo"


def diagnose_permission(pid: int) -> str:
    return permission_advice(pid, PtraceFacts.read(pid))


def _has_executable(pid: int) -> bool:
    """False for kernel threads, which have no /proc/PID/exe (and so nothing py-spy could read)."""
    try:
        os.readlink(f"/proc/{pid}/exe")
        return True
    except FileNotFoundError:
        return False
    except OSError:  # EACCES and the like: unknown, assume it has one
        return True


def classify_failure(pid: int, stderr: str) -> str:
    """py-spy's stderr -> one line saying what happened and what to do.  Call it after py-spy failed: a
    process that died meanwhile is reported as exited whatever py-spy made of its disappearing memory."""
    detail = _py_spy_error_line(stderr)
    if not process_alive(pid):
        return f"process {pid} has exited"
    if any(m in stderr for m in _PERMISSION_MARKERS):
        return diagnose_permission(pid)
    if any(m in stderr for m in _NOT_PYTHON_MARKERS) or not _has_executable(pid):
        return f"not a Python process (py-spy: {detail}); GPU and CPU views still work"
    if "Unsupported version of Python" in stderr:
        return f"py-spy cannot read this Python ({detail}); upgrade it: `pip install -U py-spy`"
    return f"py-spy failed: {detail}"


# ProcessStacks.error -> a short, bounded reason (a metric label), matched on the beginnings of the
# messages this module writes; keep the two in step.
_ERROR_REASONS = (
    ("permission denied", "permission"),
    ("process ", "exited"),  # "process N has exited"
    ("not a python process", "not_python"),
    ("py-spy cannot read this python", "unsupported_python"),
    ("py-spy took longer", "timeout"),
    ("py-spy not found", "py_spy_missing"),
    ("cannot run py-spy", "py_spy_missing"),
    ("py-spy kept failing", "torn_read"),
    ("py-spy output unreadable", "torn_read"),
    ("py-spy was killed", "killed"),
)


def error_reason(error: str) -> str:
    """The kind of a dump failure, one of a few fixed words: "permission", "exited", "not_python",
    "unsupported_python", "timeout", "py_spy_missing", "torn_read", "killed" or "other"."""
    text = error.lower()
    for prefix, reason in _ERROR_REASONS:
        if text.startswith(prefix):
            return reason
    return "other"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def record_errors(stderr: str) -> int:
    """The samples `py-spy record` could not read (torn reads), from its closing "Errors: N" line."""
    found = re.search(r"Errors: (\d+)", stderr)
    return int(found.group(1)) if found else 0


def _is_transient(stderr: str) -> bool:
    return any(m in stderr for m in _TRANSIENT_MARKERS)


# ----------------------------------------------------------------- dumping


def dump_one(
    pid: int,
    *,
    py_spy: str,
    timeout: float = DEFAULT_TIMEOUT,
    attempts: int = DEFAULT_ATTEMPTS,
    native: bool = False,
    clock: Callable[[], float] = time.time,
) -> ProcessStacks:
    """Dump one PID, retrying torn reads, within `timeout` seconds in all (real seconds: py-spy takes them);
    the process's progress counters are read right after a dump that worked.  The dump is stamped `clock()`
    as it starts (the pipeline's clock: gputop/clock.py).

    `native`: ``py-spy dump --native`` (C/C++ frames too), which pauses the target while it unwinds (it
    cannot be combined with ``--nonblocking``): one attempt only, for a process that is not moving anyway."""
    deadline = time.monotonic() + timeout
    env = dict(os.environ, RUST_BACKTRACE="0")  # one error line, not a Rust backtrace
    # --nonblocking: never stop the target, not even for a moment (except the one native dump asked for).
    argv = [py_spy, "dump", "--pid", str(pid), "--json", "--native" if native else "--nonblocking"]
    last_error = "py-spy gave no output"
    for _attempt in range(1 if native else max(1, attempts)):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        started = clock()
        try:
            result = subprocess.run(argv, capture_output=True, timeout=remaining, env=env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return ProcessStacks(
                pid=pid, timestamp=started, native=native, error=f"py-spy took longer than {timeout:g}s on PID {pid}; will retry"
            )
        except OSError as exc:
            return ProcessStacks(
                pid=pid,
                timestamp=started,
                native=native,
                error=f"cannot run py-spy ({py_spy}): {exc.strerror}; {PY_SPY_INSTALL_HINT}",
            )
        stderr = result.stderr.decode("utf-8", errors="replace")
        if result.returncode == 0:
            try:
                stacks = parse_dump(pid, result.stdout, started)
            except (ValueError, TypeError, AttributeError) as exc:  # truncated/garbled JSON: treat as torn
                last_error = f"py-spy output unreadable ({exc})"
                continue
            return replace(stacks, progress=read_progress(pid), native=native)
        if not process_alive(pid):  # the target died under py-spy: no retry can help
            return ProcessStacks(pid=pid, timestamp=started, native=native, error=f"process {pid} has exited")
        if result.returncode < 0:  # py-spy itself was killed (OOM killer, an admin): try again
            last_error = f"py-spy was killed by signal {-result.returncode} ({_signal_name(-result.returncode)})"
            continue
        if _is_transient(stderr):
            last_error = f"py-spy kept failing: {_py_spy_error_line(stderr)}"
            continue
        return ProcessStacks(pid=pid, timestamp=started, native=native, error=classify_failure(pid, stderr))
    return ProcessStacks(pid=pid, timestamp=clock(), native=native, error=last_error)


def dump_native(
    pid: int, *, py_spy: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT, clock: Callable[[], float] = time.time
) -> ProcessStacks:
    """One ``py-spy dump --native`` of `pid` (pauses it for the unwind, typically well under a second)."""
    py_spy = py_spy or find_py_spy()
    if py_spy is None:
        return ProcessStacks(pid=pid, timestamp=clock(), native=True, error=_py_spy_missing())
    return dump_one(pid, py_spy=py_spy, timeout=timeout, native=True, clock=clock)


def usable_cpus() -> int:
    """The CPUs this process may run on: a container's cpuset, not the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def background_parallelism() -> int:
    """py-spy processes a background refresh runs at once: a quarter of the usable CPUs, so that on a big
    machine the job keeps most cores, but at least two, so that one py-spy stuck until its timeout does not
    hold up every other process's stacks (a round of N dumps would take N timeouts)."""
    return max(2, usable_cpus() // 4)


def dump_stacks(
    pids: Iterable[int],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    py_spy: Optional[str] = None,
    attempts: int = DEFAULT_ATTEMPTS,
    parallel: bool = True,
    max_parallel: Optional[int] = None,
    clock: Callable[[], float] = time.time,
) -> dict[int, ProcessStacks]:
    """Stacks of every PID, dumped concurrently (one py-spy per PID); never raises for a PID's failure.

    At most `max_parallel` py-spy processes run at once (default: one per CPU).  Each dump is CPU
    work, 6-14 ms, most of it py-spy reading the target's libpython symbol tables (an unstripped
    libpython with a full .symtab costs about twice a distribution's stripped one), so more at once
    would not finish sooner (3, 4 or 17 at once on 2 cores: the same); it would only crowd out the job.  `parallel=False` runs the same dumps one after
    another (the benchmark's baseline).  `clock` stamps the dumps (see `dump_one`).
    """
    pids = list(dict.fromkeys(int(p) for p in pids))
    if not pids:
        return {}
    py_spy = py_spy or find_py_spy()
    if py_spy is None:
        now = clock()
        return {pid: ProcessStacks(pid=pid, timestamp=now, error=_py_spy_missing()) for pid in pids}

    def one(pid: int) -> ProcessStacks:
        return dump_one(pid, py_spy=py_spy, timeout=timeout, attempts=attempts, clock=clock)

    if not parallel or len(pids) == 1:
        return {pid: one(pid) for pid in pids}
    # The threads only wait on py-spy child processes; py-spy does the work.
    workers = min(len(pids), max_parallel or max(2, usable_cpus()))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gputop-pyspy") as pool:
        return dict(zip(pids, pool.map(one, pids)))

"""py-spy dumps of real child processes: parsing, parallel dumps, retries and one-line errors."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop.analysis.stack_classes import main_thread
from gputop.collect import procfs
from gputop.collect import stacks as st
from tests.harness.processes import wait_until

PY_SPY = st.find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed")

# A Python child that sits in a known function until killed; it writes `ready` once the function runs.
SPIN = """
import sys, threading, time
def {func}():
    open(sys.argv[1], "w").write("ready")
    while True:
        time.sleep(0.05)
def helper():
    threading.Event().wait()
threading.Thread(target=helper, name={thread!r}, daemon=True).start()
{func}()
"""


def start_spinner(
    spawn, tmp_path: Path, *, func: str = "spin_here", thread: str = "helper-thread", script_dir: Path | None = None
):
    script_dir = script_dir or tmp_path
    script_dir.mkdir(parents=True, exist_ok=True)
    script = script_dir / f"{func}.py"
    script.write_text(SPIN.format(func=func, thread=thread), encoding="utf-8")
    ready = tmp_path / f"{func}.ready"
    proc = spawn.python([str(script), str(ready)])
    wait_until(ready.exists, timeout=30, what=f"{script.name} to start")
    return proc, script


def fake_py_spy(tmp_path: Path, body: str) -> str:
    """An executable standing in for py-spy: runs `body` (bash) and may exec the real py-spy."""
    path = tmp_path / "fake-py-spy"
    path.write_text(f"#!/bin/bash\nREAL={PY_SPY}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.slow
@needs_py_spy
def test_dump_of_a_live_python_process(spawn, tmp_path):
    proc, script = start_spinner(spawn, tmp_path)
    stacks = st.dump_stacks([proc.pid])[proc.pid]
    assert stacks.error is None
    assert stacks.pid == proc.pid
    assert {t.thread_name for t in stacks.threads} == {"MainThread", "helper-thread"}
    main = main_thread(stacks)
    assert main.os_thread_id == proc.pid
    # innermost first: the spinning function, then the module that called it
    assert [f.name for f in main.frames] == ["spin_here", "<module>"]
    assert main.frames[0].filename == str(script)
    assert main.frames[0].line == 6


@pytest.mark.slow
@needs_py_spy
def test_non_ascii_paths_and_thread_names_survive(spawn, tmp_path):
    proc, script = start_spinner(spawn, tmp_path, func="attendre_ü", thread="lecteur-é 数据", script_dir=tmp_path / "données ü")
    stacks = st.dump_stacks([proc.pid])[proc.pid]
    assert stacks.error is None
    assert "lecteur-é 数据" in {t.thread_name for t in stacks.threads}
    frame = main_thread(stacks).frames[0]
    assert frame.name == "attendre_ü"
    assert frame.filename == str(script)


@pytest.mark.slow
@needs_py_spy
def test_many_pids_in_one_call_each_get_their_own_result(spawn, tmp_path):
    procs = [start_spinner(spawn, tmp_path / str(i), func=f"spin_{i}")[0] for i in range(3)]
    sleeper = spawn(["sleep", "60"])
    pids = [p.pid for p in procs] + [sleeper.pid]
    result = st.dump_stacks(pids)
    assert sorted(result) == sorted(pids)
    for i, proc in enumerate(procs):
        assert main_thread(result[proc.pid]).frames[0].name == f"spin_{i}"
    assert result[sleeper.pid].error.startswith("not a Python process")


@pytest.mark.slow
def test_parallel_dumps_are_bounded(tmp_path):
    log = tmp_path / "log"
    # each fake dump logs its start and end around a short pause: the log shows how many overlapped
    fake = fake_py_spy(tmp_path, f'echo "+ $(date +%s.%N)" >> {log}; sleep 0.5; echo "- $(date +%s.%N)" >> {log}; echo "[]"')
    pids = list(range(1_000_001, 1_000_007))  # never dumped for real: the fake answers
    result = st.dump_stacks(pids, py_spy=fake, max_parallel=2)
    assert all(result[p].error is None and result[p].threads == () for p in pids)
    events = sorted((float(t), 1 if sign == "+" else -1) for sign, t in (ln.split() for ln in log.read_text().splitlines()))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2


@pytest.mark.slow
@needs_py_spy
def test_not_python_gives_one_line_saying_so(spawn):
    sleeper = spawn(["sleep", "60"])
    wait_until(lambda: Path(f"/proc/{sleeper.pid}/exe").resolve().name == "sleep", what="sleep to exec")
    error = st.dump_stacks([sleeper.pid])[sleeper.pid].error
    assert error.startswith("not a Python process")
    assert "GPU and CPU views still work" in error
    assert "\n" not in error


@pytest.mark.slow
@needs_py_spy
def test_kernel_thread_is_not_python():
    kthreadd = 2  # Linux's kernel thread parent: no executable at all
    comm = Path(f"/proc/{kthreadd}/comm")
    if not comm.exists() or comm.read_text().strip() != "kthreadd":
        pytest.skip("PID 2 is not kthreadd here (PID namespace)")
    assert st.dump_stacks([kthreadd])[kthreadd].error.startswith("not a Python process")


@pytest.mark.slow
@needs_py_spy
def test_gone_process_is_reported_as_exited():
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    error = st.dump_stacks([pid_max + 1])[pid_max + 1].error  # a PID the kernel never hands out
    assert error == f"process {pid_max + 1} has exited"


@pytest.mark.slow
def test_py_spy_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr(st, "find_py_spy", lambda: None)
    error = st.dump_stacks([os.getpid()])[os.getpid()].error
    assert error.startswith("py-spy not found")
    assert "pip install py-spy" in error


@pytest.mark.slow
def test_py_spy_path_that_cannot_run(tmp_path):
    error = st.dump_stacks([os.getpid()], py_spy=str(tmp_path / "nope"))[os.getpid()].error
    assert error.startswith("cannot run py-spy")
    assert "pip install py-spy" in error


@pytest.mark.slow
def test_find_py_spy_prefers_the_one_next_to_the_interpreter(monkeypatch, tmp_path):
    beside = tmp_path / "bin"
    beside.mkdir()
    (beside / "py-spy").write_text("#!/bin/sh\n")
    (beside / "py-spy").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(beside / "python"))
    assert st.find_py_spy() == str(beside / "py-spy")
    (beside / "py-spy").unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert st.find_py_spy() is None


@pytest.mark.slow
@needs_py_spy
def test_transient_torn_read_is_retried(spawn, tmp_path):
    proc, _ = start_spinner(spawn, tmp_path)
    count = tmp_path / "calls"
    # fails like a torn --nonblocking read on the first call, then behaves like py-spy
    fake = fake_py_spy(
        tmp_path,
        f"""echo x >> {count}
if [ $(wc -l < {count}) -lt 2 ]; then
  echo "Error: Failed to copy PyFrameObject" >&2
  echo "Caused by: Bad address (os error 14)" >&2
  exit 1
fi
exec "$REAL" "$@\"""",
    )
    stacks = st.dump_stacks([proc.pid], py_spy=fake)[proc.pid]
    assert stacks.error is None
    assert main_thread(stacks).frames[0].name == "spin_here"
    assert len(count.read_text().split()) == 2


@pytest.mark.slow
def test_persistent_torn_reads_end_in_one_line(tmp_path):
    fake = fake_py_spy(tmp_path, 'echo "Error: Failed to copy PyFrameObject" >&2; exit 1')
    error = st.dump_stacks([os.getpid()], py_spy=fake, attempts=3)[os.getpid()].error
    assert error == "py-spy kept failing: Failed to copy PyFrameObject"


@pytest.mark.slow
@needs_py_spy
def test_target_is_never_paused(spawn, tmp_path):
    proc, _ = start_spinner(spawn, tmp_path)
    argv_log = tmp_path / "argv"
    fake = fake_py_spy(tmp_path, f'echo "$@" > {argv_log}\nexec "$REAL" "$@"')
    assert st.dump_stacks([proc.pid], py_spy=fake)[proc.pid].error is None
    assert argv_log.read_text().split() == ["dump", "--pid", str(proc.pid), "--json", "--nonblocking"]


@pytest.mark.slow
def test_hung_py_spy_is_bounded_by_the_timeout(tmp_path):
    fake = fake_py_spy(tmp_path, "exec sleep 30")
    started = time.monotonic()
    error = st.dump_stacks([os.getpid()], py_spy=fake, timeout=0.5)[os.getpid()].error
    assert time.monotonic() - started < 5
    assert error.startswith("py-spy took longer than 0.5s")


@pytest.mark.slow
def test_py_spy_that_closes_its_output_but_goes_on_is_bounded_and_killed(tmp_path):
    """After py-spy's output ends, gputop still waits for its exit: that wait keeps to the timeout too."""
    pid_file = tmp_path / "pid"
    fake = fake_py_spy(tmp_path, f'echo $$ > {pid_file}; echo "[]"; exec sleep 30 >&- 2>&-')
    started = time.monotonic()
    error = st.dump_stacks([os.getpid()], py_spy=fake, timeout=0.5)[os.getpid()].error
    assert time.monotonic() - started < 5
    assert error.startswith("py-spy took longer than 0.5s")
    assert not procfs.process_alive(int(pid_file.read_text())), "the fake py-spy was left running"


@pytest.mark.slow
def test_unsupported_python_version(tmp_path):
    fake = fake_py_spy(tmp_path, 'echo "Error: Unsupported version of Python: 3.99.0" >&2; exit 1')
    error = st.dump_stacks([os.getpid()], py_spy=fake)[os.getpid()].error
    assert error.startswith("py-spy cannot read this Python (Unsupported version of Python: 3.99.0)")
    assert "pip install -U py-spy" in error


@pytest.mark.slow
def test_garbled_output_is_not_a_crash(tmp_path):
    fake = fake_py_spy(tmp_path, 'echo \'[{"pid": 1, "frames": [\'')
    error = st.dump_stacks([os.getpid()], py_spy=fake, attempts=2)[os.getpid()].error
    assert error.startswith("py-spy output unreadable")


# ----------------------------------------------------------------- permissions


def facts(**kw) -> st.PtraceFacts:
    base = dict(our_uid=1000, target_uid=1000, has_cap_sys_ptrace=False, ptrace_scope=0, in_container=False)
    base.update(kw)
    return st.PtraceFacts(**base)


@pytest.mark.parametrize(
    "kw, expected",
    [
        (
            dict(our_uid=0, in_container=True),
            "root but this container dropped CAP_SYS_PTRACE; start the container with `--cap-add SYS_PTRACE`",
        ),
        (dict(target_uid=0), "it belongs to root and gputop runs as uid 1000; run gputop as root, or with sudo"),
        (dict(ptrace_scope=1), "kernel.yama.ptrace_scope=1 lets only a parent read its child"),
        (dict(ptrace_scope=2), "kernel.yama.ptrace_scope=2 allows only root/CAP_SYS_PTRACE"),
        (dict(ptrace_scope=3, has_cap_sys_ptrace=True), "kernel.yama.ptrace_scope=3 forbids attaching"),
        (dict(our_uid=0, has_cap_sys_ptrace=True, in_container=True), "this container's seccomp/AppArmor profile blocks ptrace"),
        (dict(), "run gputop as the job's user, or with sudo"),
    ],
)
def test_permission_advice_names_the_rule_that_applies(kw, expected, monkeypatch):
    monkeypatch.setattr(st, "_user_name", lambda uid: "root" if uid == 0 else f"uid {uid}")
    line = st.permission_advice(42, facts(**kw))
    assert line.startswith("permission denied reading PID 42's stacks: ")
    assert expected in line
    assert "\n" not in line


def test_capability_and_ptrace_scope_readers(tmp_path):
    scope = tmp_path / "ptrace_scope"
    scope.write_text("1\n")
    assert st.read_ptrace_scope(str(scope)) == 1
    assert st.read_ptrace_scope(str(tmp_path / "missing")) is None
    cap_eff = int(procfs.read_status_field("self", "CapEff"), 16)
    assert st.has_cap_sys_ptrace() == bool(cap_eff & (1 << 19))


@pytest.mark.slow
@needs_py_spy
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to drop a capability")
def test_real_permission_denied_without_cap_sys_ptrace(spawn, tmp_path):
    """gputop as root in a 'container' that dropped CAP_SYS_PTRACE: py-spy is refused, and we say why."""
    proc, _ = start_spinner(spawn, tmp_path)
    code = f"from gputop.collect.stacks import dump_stacks; print(dump_stacks([{proc.pid}])[{proc.pid}].error)"
    out = subprocess.run(
        ["setpriv", "--inh-caps", "-sys_ptrace", "--bounding-set", "-sys_ptrace", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert out.startswith(f"permission denied reading PID {proc.pid}'s stacks: gputop runs as root but")
    assert "dropped CAP_SYS_PTRACE" in out and "--cap-add SYS_PTRACE" in out


# ----------------------------------------------------------------- py-spy killed, the job dying under it


@pytest.mark.slow
@needs_py_spy
def test_py_spy_killed_by_a_signal_is_retried(spawn, tmp_path):
    proc, _ = start_spinner(spawn, tmp_path)
    count = tmp_path / "calls"
    # killed like the OOM killer would on its first run, then a real py-spy
    fake = fake_py_spy(tmp_path, f'echo x >> {count}\nif [ $(wc -l < {count}) -lt 2 ]; then kill -9 $$; fi\nexec "$REAL" "$@"')
    stacks = st.dump_stacks([proc.pid], py_spy=fake)[proc.pid]
    assert stacks.error is None and main_thread(stacks).frames[0].name == "spin_here"
    assert len(count.read_text().split()) == 2


@pytest.mark.slow
def test_py_spy_killed_every_time_says_by_which_signal(tmp_path):
    count = tmp_path / "calls"
    fake = fake_py_spy(tmp_path, f"echo x >> {count}; kill -9 $$")
    error = st.dump_stacks([os.getpid()], py_spy=fake, attempts=3)[os.getpid()].error
    assert error == "py-spy was killed by signal 9 (SIGKILL)"
    assert len(count.read_text().split()) == 3


def test_a_process_the_kernel_is_tearing_down_counts_as_exited(monkeypatch):
    """SIGKILLed: its memory and /proc/PID/exe go a moment before /proc shows a zombie, and py-spy fails in
    that moment.  The kernel's PF_EXITING flag (set first) makes it 'exited', not 'not a Python process'."""
    from gputop.collect import procfs

    me = procfs.read_stat(os.getpid())
    assert me is not None and not me.flags & procfs.PF_EXITING and me.cpu_ticks >= 0
    assert st.process_alive(os.getpid())
    exiting = procfs.ProcStat(comm="python", state="R", ppid=1, start_ticks=me.start_ticks, flags=me.flags | procfs.PF_EXITING)
    monkeypatch.setattr(procfs, "read_stat", lambda pid: exiting)
    assert not st.process_alive(12345)
    for stderr in (
        "Error: Failed to get process executable name. Check that the process is running.\n",
        "Error: No such process (os error 3)\n",
    ):
        assert st.classify_failure(12345, stderr) == "process 12345 has exited"


@pytest.mark.slow
def test_zombie_counts_as_exited(spawn):
    proc = spawn(["true"])
    wait_until(lambda: open(f"/proc/{proc.pid}/stat").read().split(") ")[1][0] == "Z", what="an unreaped zombie")
    assert not st.process_alive(proc.pid)
    assert st.classify_failure(proc.pid, "Error: Failed to get process executable name\n") == f"process {proc.pid} has exited"


@pytest.mark.slow
def test_find_py_spy_when_the_interpreter_directory_cannot_be_read(tmp_path):
    """gputop run as a user who cannot search the interpreter's directory (root's 0700 home): fall back to PATH."""
    private = tmp_path / "private"
    (private / "bin").mkdir(parents=True)
    private.chmod(0o700)
    code = (
        "import os, sys, pwd\n"
        "from gputop.collect import stacks\n"
        "if os.geteuid() == 0:\n"
        "    nobody = pwd.getpwnam('nobody')\n"
        "    os.setgid(nobody.pw_gid); os.setuid(nobody.pw_uid)\n"
        f"sys.executable = {str(private / 'bin' / 'python')!r}\n"
        "os.environ['PATH'] = '/nonexistent'\n"
        "print(stacks.find_py_spy())\n"
    )
    if os.geteuid() != 0:
        private.chmod(0o000)  # we cannot search it either
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(st.__file__).resolve().parent.parent.parent,
        )
    finally:
        private.chmod(0o700)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip() == "None"

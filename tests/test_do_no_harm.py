"""Issue 34's harms, each on a job built to reach it: a job that ends while it is traced or benchmarked exits as
it would have (status 0, nothing in its stderr), a stopped job is refused in one line, a second injection into a
process that has one running is refused in one line.

The jobs are tests/jobs/harm_job.py (num_workers=0, 64 small tensors collated a batch: the main thread is
inside torch's C++ and the allocator nearly all the time), run with ``--seconds`` so they return from main while
gputop's window is still open, as a job that reaches its last step does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from gputop.errors import GputopError
from gputop.inject import injector, safepoint
from tests.harness.injection import hammer, markers, start_allocating_job
from tests.harness.processes import finish, run_gputop, start_gputop, wait_until

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="the safe-point injector is x86-64 only")

JOB_SECONDS = 6.0  # the job's loop; gputop's window (8 s) outlasts it


def _ending_job(spawn, tmp_path, name: str):
    pid, _read = start_allocating_job(spawn, tmp_path, name, seconds=JOB_SECONDS)
    return next(p for p in spawn.procs if p.pid == pid)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("run", range(2))
def test_a_job_that_ends_while_traced_exits_as_it_would_have(spawn, tmp_path, run):
    job = _ending_job(spawn, tmp_path, f"traced{run}")
    ran = run_gputop(spawn, "trace", "--pid", str(job.pid), "--seconds", "8", "-o", str(tmp_path / "out"), timeout=120)
    assert job.wait(timeout=60) == 0, (job.returncode, (tmp_path / f"traced{run}.err").read_text()[-2000:])
    assert (tmp_path / f"traced{run}.err").read_text() == ""  # no line of ours, nor Kineto's, in its stderr
    # gputop says what happened in one line: the job exited during the window (the profiler was stopped first)
    assert ran.rc == 1 and "exit" in ran.err and len(ran.err.strip().splitlines()) == 1, ran.err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_job_that_ends_while_benchmarked_exits_as_it_would_have(spawn, tmp_path):
    job = _ending_job(spawn, tmp_path, "benched")
    ran = run_gputop(spawn, "bench", "--pid", str(job.pid), "--yes", "--seconds", "10", timeout=120)
    assert job.wait(timeout=60) == 0, (job.returncode, (tmp_path / "benched.err").read_text()[-2000:])
    assert (tmp_path / "benched.err").read_text() == ""
    assert "Traceback" not in ran.err, ran.err


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["bench", "trace"])
def test_a_stopped_job_is_refused_in_one_line_and_left_stopped(spawn, tmp_path, command):
    pid, read = start_allocating_job(spawn, tmp_path, f"stopped-{command}")
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T", timeout=10, what="the stop")
        extra = ["--yes", "--seconds", "8"] if command == "bench" else ["--seconds", "2", "-o", str(tmp_path / "out")]
        ran = run_gputop(spawn, command, "--pid", str(pid), *extra, timeout=60)
        line = f"gputop: PID {pid} is stopped (SIGSTOP); nothing was injected; `kill -CONT {pid}` resumes it"
        assert ran.rc != 0 and ran.err.strip() == line, ran.err
        assert not ran.out.strip()  # no advice from its frozen stack
        assert open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T"  # still as the user left it
    finally:
        os.kill(pid, signal.SIGCONT)
    before = read()
    wait_until(lambda: read() > before, timeout=20, what="the job to step again after SIGCONT")


# ------------------------------------------------------------------ threads that hold a lock the call needs

LOCK_HOLDERS = Path(__file__).resolve().parent / "jobs" / "lock_holders.c"
# The park's cap: the test ends it sooner, once it has seen the refusal ($LOCK_HOLDERS_RELEASE), so a loaded box
# that is slow to start the job cannot end the park before the injector has looked
PARK_MS = 60000

FORK_JOB = """
import ctypes, os, sys, time
ctypes.CDLL(sys.argv[1]).park_in_fork_for({park_ms})
open(sys.argv[2], "w").close()
child = os.fork()  # the prepare handler parks this thread inside glibc's fork()
if child == 0:
    os._exit(0)
os.waitpid(child, 0)
open(sys.argv[2] + ".after", "w").close()
time.sleep(120)
"""

DLOPEN_JOB = """
import ctypes, sys, time
open(sys.argv[2], "w").close()
ctypes.CDLL(sys.argv[1])  # its constructor parks this thread inside dlopen(), under ld.so's load lock
open(sys.argv[2] + ".after", "w").close()
time.sleep(120)
"""


def _build(tmp_path, name: str, *defines: str) -> Path:
    library = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", *defines, "-o", str(library), str(LOCK_HOLDERS), "-lpthread"], check=True)
    return library


def _parked_in_futex(pid: int) -> bool:
    return Path(f"/proc/{pid}/task/{pid}/syscall").read_text().split()[0] == "202"


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler to build tests/jobs/lock_holders.c")
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "where, source, defines, why",
    [
        ("fork", FORK_JOB, (), "inside fork"),
        ("dlopen", DLOPEN_JOB, (f"-DPARK_IN_CONSTRUCTOR_MS={PARK_MS}",), "inside the dynamic loader"),
    ],
)
def test_a_thread_parked_inside_fork_or_dlopen_is_never_borrowed(spawn, tmp_path, where, source, defines, why):
    """The thread waits on a futex word of a library of its own, which the syscall rule alone would take for a
    safe point; its stack says it is inside fork's at-fork handlers or ld.so's constructors, where it holds the
    locks that malloc and pthread_create take.  The injector refuses, and the job goes on when the park ends."""
    library = _build(tmp_path, where, *defines)
    ready, release = tmp_path / "ready", tmp_path / "release"
    env = dict(os.environ, LOCK_HOLDERS_RELEASE=str(release))
    job = spawn([sys.executable, "-c", source.format(park_ms=PARK_MS), str(library), str(ready)], env=env)
    wait_until(lambda: ready.exists() and _parked_in_futex(job.pid), timeout=30, what=f"the job to park inside {where}")
    with pytest.raises(safepoint.Refused) as refused:
        safepoint.inject(job.pid, "pass", find_bound=1.0)
    assert why in str(refused.value), str(refused.value)
    assert not Path(f"{ready}.after").exists()  # still parked: the refusal was of the parked thread
    release.touch()
    wait_until(lambda: Path(f"{ready}.after").exists(), timeout=30, what=f"the job to leave {where} and go on")
    assert job.poll() is None


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler to build tests/jobs/lock_holders.c")
@pytest.mark.timeout(120)
def test_a_replacement_allocator_is_read_as_one_and_a_sleeping_thread_still_borrowed(spawn, tmp_path):
    library = _build(tmp_path, "allocator", "-DREPLACE_MALLOC")
    ready = tmp_path / "ready"
    job = spawn(
        [sys.executable, "-c", "import sys, time\nopen(sys.argv[1], 'w').close()\ntime.sleep(120)", str(ready)],
        env=dict(os.environ, LD_PRELOAD=str(library)),
    )
    wait_until(ready.exists, timeout=30, what="the job to start")
    api = safepoint.find_api(job.pid, safepoint.read_maps(job.pid))
    assert str(library) in api.lock_owners  # its futex words are locks the call takes
    assert any(why == f"inside the allocator {library.name}" for _s, _e, why in api.danger)
    assert safepoint.inject(job.pid, "pass").ran  # asleep in time.sleep, it is inside none of them


SIGNAL_JOB = """
import ctypes, os, signal, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.count_signal(signal.SIGRTMIN)
open(sys.argv[2], "w").close()
while True:
    time.sleep(0.002)  # a safe point, most of the time
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(str(lib.signals_received()))
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
"""


@pytest.mark.alone(unless_prioritized=True)  # injections within their bound while signals arrive
@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler to build tests/jobs/lock_holders.c")
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_queued_signals_sent_during_injections_each_arrive_exactly_once(spawn, tmp_path):
    """Real-time signals queue: each sent is delivered once.  Sent while the injector stops and borrows the job's
    thread (50 injections), every one still arrives, once: none held back, none lost, none doubled."""
    library = _build(tmp_path, "signals")
    count = tmp_path / "count"
    job = spawn([sys.executable, "-c", SIGNAL_JOB, str(library), str(count)])
    wait_until(count.exists, timeout=30, what="the job to count signals")
    sent = 0
    stop = threading.Event()

    def send() -> None:
        nonlocal sent
        while not stop.is_set():
            os.kill(job.pid, signal.SIGRTMIN)
            sent += 1
            stop.wait(0.001)

    sender = threading.Thread(target=send)
    sender.start()
    ran = 0
    try:
        for _ in range(50):
            try:
                ran += safepoint.inject(job.pid, "pass").ran
            except safepoint.Refused:
                pass
    finally:
        stop.set()
        sender.join()

    def received() -> int:
        return int(count.read_text() or 0)

    wait_until(lambda: received() >= sent, timeout=30, what=f"all {sent} signals to arrive", state=received)
    assert received() == sent and ran >= 25, (received(), sent, ran)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_stopped_gputop_never_holds_the_job(spawn, tmp_path):
    """Ctrl-Z on gputop's terminal stops gputop's process group; the injection helper lives in a session of its
    own, so the job keeps stepping while gputop is stopped, and the trace finishes once it goes on.  (SIGSTOP
    stands in for the terminal's SIGTSTP: the kernel discards SIGTSTP sent to an orphaned process group, which
    is what a test's child in a session of its own is.)"""
    pid, read = start_allocating_job(spawn, tmp_path, "ctrl-z")
    gputop = start_gputop(spawn, "trace", "--pid", str(pid), "--seconds", "2", "-o", str(tmp_path / "out"))
    for _ in range(3):
        os.killpg(gputop.pid, signal.SIGSTOP)
        wait_until(lambda: open(f"/proc/{gputop.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T", timeout=10)
        before = read()
        wait_until(lambda: read() > before, timeout=20, what="the job to step while gputop is stopped")
        os.killpg(gputop.pid, signal.SIGCONT)
    ran = finish(gputop, timeout=120)
    assert ran.rc == 0, ran.err
    before = read()
    wait_until(lambda: read() > before, timeout=20, what="the job to go on stepping")


@pytest.mark.timeout(30)
def test_one_injection_at_a_time_per_process(tmp_path):
    """The lock is keyed by PID and start time: a second holder is refused in one line that names the first; it is
    free again once released (or once its holder dies: the kernel drops a flock with its process)."""
    base = str(tmp_path / "locks")
    with injector.InjectionLock(os.getpid(), "gputop bench", base=base):
        with pytest.raises(GputopError) as second:
            with injector.InjectionLock(os.getpid(), "gputop trace", base=base):
                pass
        assert f"({'gputop PID'} {os.getpid()}: gputop bench)" in str(second.value)
        assert "\n" not in str(second.value)
        with injector.InjectionLock(os.getppid(), "gputop trace", base=base):  # another process: its own lock
            pass
    with injector.InjectionLock(os.getpid(), "gputop trace", base=base):
        pass
    assert os.listdir(base) == []  # nothing left behind


# ------------------------------------------------------------------------------------------ the helper

SLEEPER = "import sys, time\nopen(sys.argv[1], 'w').close()\nwhile True:\n    time.sleep(0.05)\n"


def _sleeper(spawn, tmp_path, *wrapper: str):
    ready = tmp_path / "sleeper.ready"
    proc = spawn([*wrapper, sys.executable, "-c", SLEEPER, str(ready)])
    wait_until(ready.exists, timeout=30, what="the sleeper to start")
    return proc


@pytest.mark.timeout(60)
def test_the_helper_runs_isolated_from_the_users_directory(spawn, tmp_path, monkeypatch):
    """The helper holds ptrace rights over the job: a json.py or an elftools/ in the directory gputop runs in must
    never be imported by it."""
    planted = tmp_path / "planted"
    planted.mkdir()
    for module in ("json.py", "elftools/__init__.py", "gputop/__init__.py"):
        (planted / module).parent.mkdir(exist_ok=True)
        (planted / module).write_text(f"open({str(tmp_path / 'imported')!r}, 'a').write({module!r} + '\\n')\n")
    job = _sleeper(spawn, tmp_path)
    target = injector.inspect_target(job.pid)
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    injector._safepoint_inject(target, "pass")  # raises unless the helper ran and the line ran
    assert not (tmp_path / "imported").exists(), (tmp_path / "imported").read_text()


@pytest.mark.slow  # waits out the helper's deadline twice
@pytest.mark.timeout(120)
def test_a_helper_stopped_after_the_switch_says_the_call_still_runs(spawn, tmp_path, monkeypatch):
    """Past gputop's deadline the helper is killed; if it had already pointed a thread at the trampoline, that
    thread finishes the call by itself, and the line says so instead of "nothing was injected"."""
    job = _sleeper(spawn, tmp_path)
    target = injector.inspect_target(job.pid)
    monkeypatch.setenv("GPUTOP_SAFEPOINT_PAUSE_AT", "switched")  # the helper waits there to be killed
    with pytest.raises(GputopError) as said:
        injector._safepoint_inject(target, "pass")
    assert "was running the injected call when gputop let go" in str(said.value), str(said.value)
    assert "nothing was injected" not in str(said.value)
    monkeypatch.setenv("GPUTOP_SAFEPOINT_PAUSE_AT", "stopped")  # killed before it touched a thread
    with pytest.raises(GputopError) as said:
        injector._safepoint_inject(target, "pass")
    assert "nothing was injected" in str(said.value), str(said.value)
    assert job.poll() is None


@pytest.mark.timeout(60)
def test_a_helper_that_does_not_start_is_stopped_on_its_own_deadline(spawn, tmp_path, monkeypatch):
    """The helper's start and the injection have deadlines of their own: a start slowed by a busy box no longer
    eats the call's time, and a helper that never starts is stopped before it touches a thread."""
    job = _sleeper(spawn, tmp_path)
    target = injector.inspect_target(job.pid)
    monkeypatch.setattr(injector, "HELPER_START_TIMEOUT", 2.0)
    monkeypatch.setenv("GPUTOP_SAFEPOINT_PAUSE_AT", "starting")  # the helper waits there to be killed
    with pytest.raises(GputopError) as said:
        injector._safepoint_inject(target, "pass")
    assert str(said.value) == (
        f"the injection helper for PID {job.pid} did not start within 2s (a busy box?); it was stopped before it "
        "touched a thread, and the job left running; nothing was injected"
    )
    assert job.poll() is None
    monkeypatch.delenv("GPUTOP_SAFEPOINT_PAUSE_AT")
    injector._safepoint_inject(target, "pass")  # and the next one runs: nothing was left half-done


@pytest.mark.skipif(not shutil.which("unshare") or os.geteuid() != 0, reason="needs unshare and root for a private /tmp")
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_job_with_a_private_tmp_is_traced_through_its_own_root(spawn, tmp_path, request):
    """Slurm's job_container/tmpfs and systemd's PrivateTmp give the job a /tmp of its own under the same root:
    the agent's files must be written where the job sees them (/proc/PID/root/tmp/...)."""
    outside = Path(tempfile.mkdtemp(dir="/dev/shm"))  # the test's /tmp is not the job's (nor a clone under /tmp)
    started = []

    def remove_outside() -> None:  # the job first: removed under a live job, its next counter write raised
        for proc in started:
            spawn.reap(proc)
        shutil.rmtree(outside, ignore_errors=True)

    request.addfinalizer(remove_outside)
    ready = outside / "count"
    job_file = outside / "harm_job.py"
    shutil.copy(Path(__file__).resolve().parent / "jobs" / "harm_job.py", job_file)
    job = spawn(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount -t tmpfs tmpfs /tmp && exec "$0" "$@"',
            sys.executable,
            str(job_file),
            str(ready),
        ]
    )
    started.append(job)
    wait_until(lambda: ready.exists() and int(ready.read_text()) > 0, timeout=120, what="the job to step")
    assert injector.inspect_target(job.pid).foreign_root
    ran = run_gputop(spawn, "trace", "--pid", str(job.pid), "--seconds", "1", "-o", str(tmp_path / "out"), "--json")
    assert ran.rc == 0, ran.err
    assert job.poll() is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_50_injections_into_a_job_that_reforks_its_workers_harm_none(spawn, tmp_path):
    """A DataLoader without persistent workers forks new ones every epoch (here every 8 batches): the main
    thread is in and out of fork all the time, with its at-fork handlers and the allocator's fork locks."""
    counter = tmp_path / "refork.count"
    job = spawn([sys.executable, str(Path(__file__).resolve().parent / "jobs" / "harm_job.py"), str(counter), "--refork"])

    def steps() -> int:
        try:
            return int(counter.read_text())
        except (OSError, ValueError):
            return -1

    wait_until(lambda: steps() > 0, timeout=120, what="the job to step")
    tally = hammer(job.pid, 50, steps, tmp_path / "markers")
    assert not tally.harmed and tally.failed_calls == 0, tally
    assert tally.ran >= 25, tally.refused  # at least half really ran
    wait_until(lambda: markers(tmp_path / "markers") == tally.ran, timeout=30, what="every started line to run")


def test_what_the_bootstrap_raises_is_written_beside_the_agent_never_raised_in_the_job(tmp_path):
    """The injected line runs in the job's __main__ through PyRun_SimpleString: a SystemExit escaping it would end
    the job, anything else would print into its stderr.  Both stay inside, and the reason lands beside the agent."""
    import builtins
    import types

    def no_threads(name, *args):
        if name == "threading":
            return types.SimpleNamespace(Event=object, Thread=lambda **_kw: (_ for _ in ()).throw(SystemExit(3)))
        return builtins.__import__(name, *args)

    run = injector.RunDir(host_path=str(tmp_path), target_path=str(tmp_path))
    code = injector.bootstrap_code(str(tmp_path / "agent.py"))
    exec(code, {"__builtins__": dict(vars(builtins), __import__=no_threads)})  # no SystemExit gets out
    assert injector.bootstrap_error(run) == "SystemExit(3)"

"""The safe-point injector (gputop/inject/safepoint.py) against real processes: it runs only where a thread
is parked safely, refuses within its bound otherwise, never harms the job (1,000 injections into a torch
job whose main thread lives in the allocator), and a helper killed at any moment leaves the job running."""

from __future__ import annotations

import concurrent.futures
import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gputop.inject import safepoint
from tests.harness import train_jobs
from tests.harness.box_load import BoxLoad
from tests.harness.injection import ALLOCATING, hammer, markers, size_counter, start_allocating_job, step_counter
from tests.harness.processes import wait_until

pytestmark = [
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="the safe-point injector is x86-64 only"),
    pytest.mark.timeout(120),  # every test here attaches: a deadline of its own under the suite's
]

# A plain Python target: its main thread sleeps 10 ms a round (a safe point) and counts rounds in a file.
SLEEPER = """
import sys, time
n = 0
while True:
    time.sleep(0.01)
    n += 1
    with open(sys.argv[1] + '.tmp', 'w') as f:
        f.write(str(n))
    __import__('os').replace(sys.argv[1] + '.tmp', sys.argv[1])
"""

# No safe point ever: the main thread computes in pure Python (no syscall), a second thread waits forever
# for stdio's lock, which the main thread holds (a futex word in libc's own data).
NO_SAFE_POINT = """
import ctypes, sys, threading
libc = ctypes.CDLL(None)
stdout = ctypes.c_void_p.in_dll(libc, 'stdout')
libc.flockfile(stdout)
threading.Thread(target=libc.flockfile, args=(stdout,), daemon=True).start()
n = 0
while True:
    n += 1
    if n % 200000 == 0:
        with open(sys.argv[1] + '.tmp', 'w') as f:
            f.write(str(n))
        __import__('os').replace(sys.argv[1] + '.tmp', sys.argv[1])
"""


def _start_script(spawn, tmp_path: Path, source: str, name: str):
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    counter = tmp_path / f"{name}.count"
    proc = spawn([sys.executable, str(script), str(counter)])
    read = step_counter(counter)
    wait_until(lambda: read() > 0, timeout=20, what=f"{name} to count")
    return proc, read


def _moves(read, timeout: float = 10.0) -> bool:
    before = read()
    wait_until(lambda: read() > before, timeout=timeout, what="the target to go on counting")
    return True


# ----------------------------------------------------------------------------------- the pieces


@pytest.mark.skipif(not shutil.which("as") or not shutil.which("objcopy"), reason="GNU as/objcopy not installed")
def test_trampoline_bytes_are_their_assembly(tmp_path):
    (tmp_path / "t.S").write_text(safepoint.TRAMPOLINE_SOURCE)
    subprocess.run(["as", "--64", "-o", str(tmp_path / "t.o"), str(tmp_path / "t.S")], check=True)
    subprocess.run(["objcopy", "-O", "binary", "-j", ".text", str(tmp_path / "t.o"), str(tmp_path / "t.bin")], check=True)
    assert (tmp_path / "t.bin").read_bytes() == safepoint.TRAMPOLINE


@pytest.mark.parametrize(
    "error, resumed_rax, back",
    [
        (-512, 230, 2),  # -ERESTARTSYS: the syscall is issued again
        (-514, 230, 2),  # -ERESTARTNOHAND
        (-516, safepoint.NR_RESTART_SYSCALL, 2),  # -ERESTART_RESTARTBLOCK: restart_syscall(2)
        (-4, -4, 0),  # -EINTR: returned to the caller, as a signal would
        (0, 0, 0),  # the syscall had just finished: its result stands
    ],
)
def test_resume_registers_restart_the_syscall_as_the_kernel_would(error, resumed_rax, back):
    regs = safepoint._Regs()
    regs.orig_rax, regs.rax, regs.rip = 230, error & (2**64 - 1), 0x1000
    out = safepoint.resume_registers(regs)
    assert safepoint._signed(out.rax) == resumed_rax
    assert out.rip == 0x1000 - back
    assert safepoint._signed(out.orig_rax) == -1  # the kernel must not restart it a second time


def test_what_counts_as_a_safe_point():
    maps = safepoint.read_maps(os.getpid())
    libc = ctypes.CDLL(None)
    in_libc = ctypes.addressof(ctypes.c_void_p.in_dll(libc, "stdout"))
    heap_word = ctypes.addressof(ctypes.c_int(0))
    read_end, write_end = os.pipe()
    try:
        with open(__file__) as regular:
            assert safepoint.unsafe_reason(os.getpid(), 230, (1, 1, 0, 0, 0, 0), maps) is None
            assert safepoint.unsafe_reason(os.getpid(), 7, (0, 0, 0, 0, 0, 0), maps) is None
            assert safepoint.unsafe_reason(os.getpid(), 202, (heap_word, 0x80, 2, 0, 0, 0), maps) is None
            assert "libc" in safepoint.unsafe_reason(os.getpid(), 202, (in_libc, 0x80, 2, 0, 0, 0), maps)
            assert "futex operation" in safepoint.unsafe_reason(os.getpid(), 202, (heap_word, 6, 0, 0, 0, 0), maps)
            assert safepoint.unsafe_reason(os.getpid(), 0, (read_end, 0, 0, 0, 0, 0), maps) is None
            # a replacement allocator's futex words are locks the call takes too (here: _ctypes' data stands in)
            data = next(m for m in maps if "_ctypes" in m.path and m.perms.startswith("rw"))
            assert safepoint.unsafe_reason(os.getpid(), 202, (data.start, 0x80, 2, 0, 0, 0), maps) is None
            assert "waiting on a lock of _ctypes" in safepoint.unsafe_reason(
                os.getpid(), 202, (data.start, 0x80, 2, 0, 0, 0), maps, frozenset({data.path})
            )
            # calls that answer a ptrace interrupt with EINTR are never borrowed: epoll_wait, a socket read
            assert safepoint.unsafe_reason(os.getpid(), 232, (0,) * 6, maps) == "in syscall 232"
            a, b = socket.socketpair()
            with a, b:
                assert "read on socket:" in safepoint.unsafe_reason(os.getpid(), 0, (a.fileno(), 0, 0, 0, 0, 0), maps)
            assert "read on" in safepoint.unsafe_reason(os.getpid(), 0, (regular.fileno(), 0, 0, 0, 0, 0), maps)
            assert safepoint.unsafe_reason(os.getpid(), 9, (0,) * 6, maps) == "in syscall 9"  # mmap: inside malloc
    finally:
        os.close(read_end)
        os.close(write_end)


# ----------------------------------------------------------------------------------- live targets


def test_runs_at_a_sleep_and_the_target_goes_on(spawn, tmp_path):
    proc, read = _start_script(spawn, tmp_path, SLEEPER, "sleeper")
    marker = tmp_path / "ran"
    code = "import threading; open({!r}, 'w').write(str(threading.main_thread() is threading.current_thread()))"
    outcome = safepoint.inject(proc.pid, code.format(str(marker)))
    assert outcome.ran and outcome.result == 0 and outcome.syscall == "clock_nanosleep"
    on_main = wait_until(lambda: marker.exists() and marker.read_text(), timeout=10, what="the line to run")
    assert on_main == "False"  # on a thread of its own: the sleeping main thread only started it
    assert _moves(read)


def _interpreters() -> list:
    """pyenv's 3.10, 3.12 and 3.13 (libpython3.X.so), and Debian's python3.11 (the C API in the executable)."""
    found = [
        pytest.param(str(p), id=p.name)
        for minor in ("3.10", "3.12", "3.13")
        for p in sorted(Path("/root/.pyenv/versions").glob(f"{minor}.*/bin/python{minor}"))[:1]
    ]
    if Path("/usr/bin/python3.11").exists():
        found.append(pytest.param("/usr/bin/python3.11", id="debian-python3.11"))
    return found or [pytest.param(None, marks=pytest.mark.skip(reason="no other Python here"))]


@pytest.mark.parametrize("python", _interpreters())
def test_other_pythons_and_a_static_interpreter(spawn, tmp_path, python):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    counter = tmp_path / "count"
    proc = spawn([python, str(script), str(counter)])
    read = step_counter(counter)
    wait_until(lambda: read() > 0, timeout=20, what="the sleeper to count")
    marker = tmp_path / "ran"
    for _ in range(3):  # a second and third injection find the trampoline in place
        assert safepoint.inject(proc.pid, f"import sys; open({str(marker)!r}, 'w').write(sys.version)").ran
    version = wait_until(lambda: marker.exists() and marker.read_text(), timeout=10, what="the line to run")
    assert version.startswith(Path(python).name.removeprefix("python") + ".")  # it ran in that interpreter
    assert _moves(read)


def test_no_safe_point_is_refused_within_the_bound_and_the_target_goes_on(spawn, tmp_path):
    proc, read = _start_script(spawn, tmp_path, NO_SAFE_POINT, "locked")
    box, started = BoxLoad(), time.monotonic()
    with pytest.raises(safepoint.Refused) as refused:
        safepoint.inject(proc.pid, "raise SystemExit('must never run')", find_bound=1.0)
    assert time.monotonic() - started < 3.0, box.since()
    assert "no thread of PID" in str(refused.value) and "lock of libc" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert _moves(read)


def test_a_line_that_raises_leaves_the_target_running(spawn, tmp_path):
    proc, read = _start_script(spawn, tmp_path, SLEEPER, "sleeper")
    outcome = safepoint.inject(proc.pid, "1/0")
    assert outcome.ran and outcome.result == 0  # the thread started; its traceback went to the job's stderr
    assert _moves(read)
    assert safepoint.inject(proc.pid, "pass").ran


# the C loop on the main thread, the process's only thread: every borrowing is of that parked syscall
LIVE_REGISTERS = """
import ctypes, os, sys
lib = ctypes.CDLL(sys.argv[1])
lib.park_and_check(os.open(sys.argv[2], os.O_RDWR | os.O_CREAT), 10**9)
"""


@pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler to build tests/jobs/live_registers.c")
@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_sse_registers_and_mxcsr_live_across_the_parked_syscall_survive(spawn, tmp_path):
    library = tmp_path / "live_registers.so"
    subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(Path(train_jobs.REPO) / "tests" / "jobs" / "live_registers.c")],
        check=True,
    )
    (tmp_path / "target.py").write_text(LIVE_REGISTERS)
    rounds = tmp_path / "rounds"
    proc = spawn([sys.executable, str(tmp_path / "target.py"), str(library), str(rounds)])

    def read() -> int:
        text = rounds.read_text() if rounds.exists() else ""
        assert "CORRUPT" not in text, text
        return int(text or 0)

    wait_until(lambda: read() > 0, timeout=20, what="the C thread to park")
    borrowed = Counter()
    for _ in range(30):
        outcome = safepoint.inject(proc.pid, "pass")
        borrowed[outcome.syscall] += outcome.ran
        _moves(read)  # and every round still finds its registers intact
    assert borrowed == {"nanosleep": 30}, borrowed  # the raw nanosleep, resumed through restart_syscall


def _helper(pid: int, code: str, pause_at: str = "") -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=train_jobs.REPO, GPUTOP_SAFEPOINT_PAUSE_AT=pause_at)
    return subprocess.Popen(
        [sys.executable, "-m", "gputop.inject.safepoint", str(pid), "--code", code], stdout=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.parametrize("phase, runs", [("stopped", False), ("switched", True), ("calling", True)])
def test_killing_the_helper_at_any_phase_leaves_the_target_running(spawn, tmp_path, phase, runs):
    proc, read = _start_script(spawn, tmp_path, SLEEPER, "sleeper")
    marker = tmp_path / "ran"
    # the line makes syscalls while it runs (the "calling" pause waits for one with the call under way)
    helper = _helper(proc.pid, f"__import__('time').sleep(0.2); open({str(marker)!r}, 'w').close()", phase)
    try:
        assert json.loads(helper.stdout.readline()) == {"started": True}  # gputop's deadline counts from here
        said = [json.loads(helper.stdout.readline())]
        while "switched" in said[-1]:  # said as the registers switch, so that a killer knows the call runs
            said.append(json.loads(helper.stdout.readline()))
        assert said[-1] == {"paused": phase}
        assert (len(said) == 2) == runs  # the switch was announced exactly when the call will run
        helper.kill()
    finally:
        helper.kill()
        helper.wait(10)
    assert _moves(read)  # the thread is back in its loop: released untouched, or it restored itself
    if runs:
        wait_until(marker.exists, timeout=10, what="the line to finish without the tracer")
    else:
        assert not marker.exists()
    again = _helper(proc.pid, "pass")
    try:
        out, _ = again.communicate(timeout=30)
    finally:
        again.kill()
    assert json.loads(out.splitlines()[-1])["ran"] is True  # nothing left behind trips a second injection
    assert _moves(read)


@pytest.mark.acceptance  # a soak
@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_100_injections_into_a_torch_job_living_in_the_allocator(spawn, tmp_path):
    pid, progress = start_allocating_job(spawn, tmp_path, "alloc")
    tally = hammer(pid, 100, progress, tmp_path / "markers")
    assert not tally.harmed, tally
    assert tally.ran + sum(tally.refused.values()) == 100
    wait_until(lambda: markers(tmp_path / "markers") == tally.ran, timeout=20, what="every started line to run")
    assert tally.failed_calls == 0
    assert tally.ran >= 90, tally.refused  # an idle torch thread is nearly always parked safely
    assert tally.slowest_s < safepoint.FIND_BOUND_S + safepoint.CALL_BOUND_S


def _start_soak_job(spawn, tmp_path: Path, name: str, options, ranks: int):
    """One job of the soak, once it steps: (its process, {pid: its step counter} of each rank)."""
    if options is None:
        pid, progress = start_allocating_job(spawn, tmp_path, name)
        return next(p for p in spawn.procs if p.pid == pid), {pid: progress}
    if isinstance(options, str):  # a framework's own loop: it counts steps, it logs no losses
        proc, records = train_jobs.start(
            spawn,
            tmp_path,
            name,
            *("--framework", options, "--workers", "2", "--persistent", "--sample-ms", "2"),
            *("--progress", str(tmp_path / f"{name}.count")),
        )
        return proc, {pid: step_counter(tmp_path / f"{name}.count") for pid in records}
    prefix = tmp_path / f"{name}.steps"
    proc, records = train_jobs.start(spawn, tmp_path, name, *options, "--step-log", str(prefix), ranks=ranks, torchrun=ranks > 1)
    return proc, {pid: size_counter(Path(f"{prefix}.{r['rank']}")) for pid, r in records.items()}


def _soak(spawn, tmp_path: Path, jobs) -> None:
    """Each job in turn: started, hammered, its lines counted, and stopped (so it burns no CPU beside the next)."""
    for name, options, ranks, each in jobs:
        proc, started = _start_soak_job(spawn, tmp_path, name, options, ranks)
        for pid, progress in started.items():
            tally = hammer(pid, each, progress, tmp_path / name)
            assert not tally.harmed, (name, tally)
            assert tally.ran + sum(tally.refused.values()) == each, (name, tally)
            assert tally.failed_calls == 0, (name, tally)
            assert tally.slowest_s < safepoint.FIND_BOUND_S + safepoint.CALL_BOUND_S, (name, tally)
            print(f"{name} PID {pid}: {tally.ran} of {each} ran, the slowest injection {tally.slowest_s:.3f} s")
        wait_until(lambda: markers(tmp_path / name) >= 0.9 * each * ranks, timeout=30, what=f"{name}'s lines to run")
        assert proc.poll() is None, f"{name} exited"
        spawn.reap(proc)


@pytest.mark.acceptance  # the injection soak
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_1000_injections_and_200_into_each_kind_of_job_harm_none(spawn, tmp_path):
    """The issue's bar: 1,000 into its allocating job (a DataLoader with num_workers=0), all into one process,
    and 200 each into a job with 2 workers and a 2-rank torchrun job; and 50 each into a
    Lightning Trainer and an HF Trainer (2 persistent workers each), as users run them.  Two lanes side by side,
    the allocating job's 1,000 beside the other four in turn: the injections wait on the job (a stop, a step), so
    two lanes use both cores.  The bound on each injection is seconds; one takes tens of ms on a loaded box."""
    lanes = [
        [("alloc", None, 1, 1000)],  # issue 26's own job (tests/jobs/harm_job.py), all into one process
        [
            ("workers2", ("--workers", "2", "--batch-size", "64"), 1, 200),
            ("torchrun2", ALLOCATING, 2, 100),  # 100 into each rank
            ("lightning", "lightning", 1, 50),
            ("hf", "hf", 1, 50),
        ],
    ]
    with concurrent.futures.ThreadPoolExecutor(len(lanes)) as pool:
        for done in [pool.submit(_soak, spawn, tmp_path, lane) for lane in lanes]:
            done.result()  # a lane's failed assertion fails the test


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_a_refusal_reaches_the_user_as_one_line_from_the_helper(spawn, tmp_path):
    from gputop.errors import GputopError
    from gputop.inject import injector

    proc, read = _start_script(spawn, tmp_path, NO_SAFE_POINT, "locked")
    target = injector.inspect_target(proc.pid)
    run = injector.prepare_run_dir(target, {}, (str(tmp_path / "runs"), str(tmp_path / "runs")))
    box, started = BoxLoad(), time.monotonic()
    try:
        with pytest.raises(GputopError) as refused:
            injector.inject_agent(target, run)
    finally:
        injector.remove_run_dir(run)
    assert time.monotonic() - started < injector.HELPER_TIMEOUT, box.since()
    assert str(refused.value).startswith(f"no thread of PID {proc.pid} reached a safe point within 3s")
    assert "\n" not in str(refused.value)
    assert _moves(read)


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_a_frozen_job_is_said_so_with_its_native_stack(spawn, tmp_path):
    from gputop.inject import injector

    moving, _read = _start_script(spawn, tmp_path, SLEEPER, "sleeper")
    assert injector.frozen_evidence(moving.pid) is None
    ready = tmp_path / "parked"
    frozen = spawn([sys.executable, "-c", f"import threading; open({str(ready)!r}, 'w').close(); threading.Event().wait()"])
    wait_until(ready.exists, timeout=20, what="the frozen job to park")
    evidence = injector.frozen_evidence(frozen.pid)
    assert evidence and evidence.startswith(f"PID {frozen.pid} is frozen") and "\n" not in evidence
    since = injector.main_thread_progress(frozen.pid)  # after the native dump, whose pause counts as a switch
    assert "since the agent was started" in injector.frozen_evidence(frozen.pid, since=since)
    moving_since = injector.main_thread_progress(moving.pid)
    assert _moves(_read)
    assert injector.frozen_evidence(moving.pid, since=moving_since) is None
    assert "PyThread_acquire_lock" in evidence, evidence  # where Event().wait() parks, named natively

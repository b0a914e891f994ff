"""The test harness itself: what it promises other tests (every process a test starts is reaped)."""

from __future__ import annotations

import subprocess

import psutil

from tests.harness.processes import Spawner, wait_until

# A launcher that starts its child in a session of its own, as torchrun does with every rank.
LAUNCHER = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_reap_all_takes_descendants_that_left_the_process_group():
    spawner = Spawner()
    try:
        launcher = spawner.python(LAUNCHER, stdout=subprocess.PIPE)
        child = int(launcher.stdout.readline())
        assert psutil.Process(child).pid != launcher.pid and not _gone(child)
    finally:
        spawner.reap_all()
    wait_until(lambda: _gone(child), timeout=10, what=f"PID {child} (own session) to be reaped")
    assert _gone(launcher.pid)

"""The test harness itself: what it promises other tests (every process a test starts is reaped)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest

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


# A job with a spawn-context queue, as torch.multiprocessing.spawn makes: its semaphores have names in /dev/shm
# until its multiprocessing resource tracker unlinks them, which it does once the job is gone.
SPAWN_CONTEXT_JOB = (
    "import multiprocessing as mp, sys, time\n"
    "if __name__ == '__main__':\n"
    "    queue = mp.get_context('spawn').SimpleQueue()\n"
    "    print(queue._rlock._semlock.name, queue._wlock._semlock.name, flush=True)  # the names in /dev/shm\n"
    "    time.sleep(600)\n"
)


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_reap_all_leaves_no_named_semaphore_behind(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(SPAWN_CONTEXT_JOB)
    spawner = Spawner()
    try:
        proc = spawner.python([str(job)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        names = proc.stdout.readline().split()
        paths = [Path("/dev/shm") / ("sem." + name.decode().lstrip("/")) for name in names]
        assert len(paths) == 2 and all(path.exists() for path in paths), paths
    finally:
        spawner.reap_all()
    assert not [path for path in paths if path.exists()]

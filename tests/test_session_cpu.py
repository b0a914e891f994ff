"""The host's CPU by session (gputop/collect/host.py `SessionCpu`): what autogroup shares the cores by."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gputop.collect.host import SessionCpu
from tests.harness.processes import wait_until


@pytest.mark.integration  # a real spinning process, read over real seconds
def test_a_spinning_process_in_a_session_of_its_own_is_counted_under_that_session(tmp_path):
    reader = SessionCpu()
    ready = tmp_path / "ready"
    code = f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\nwhile True: pass"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        wait_until(ready.exists, 60, what="the spinner to start")
        reader.sample()
        # its session has the spinner alone: it used a good part of a core between two readings
        wait_until(lambda: _cores_of(reader, proc.pid) > 0.1, 30, interval=0.5, what="the spinner's CPU")
    finally:
        proc.kill()
        proc.wait()


def _cores_of(reader: SessionCpu, session: int) -> float:
    sessions, cores = reader.sample()
    return dict(zip(sessions, cores)).get(session, 0.0)


def test_the_sessions_are_read_at_most_every_few_seconds_and_the_last_reading_stands_between(tmp_path):
    """Each reading opens every process's stat: on a box of thousands of processes that is costly, so a monitor
    polling every second reads them every SESSION_EVERY_S."""
    from gputop.collect.host import SESSION_EVERY_S
    from gputop.sim.fake_nvml import ManualClock

    ticks = os.sysconf("SC_CLK_TCK")

    def write_stat(pid: int, session: int, cpu_ticks: int) -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        fields = ["S", "1", "1", str(session)] + ["0"] * 7 + [str(cpu_ticks), "0"] + ["0"] * 30
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (job) " + " ".join(fields))

    clock = ManualClock()
    write_stat(100, 100, 0)
    reader = SessionCpu(str(tmp_path), clock)
    clock.advance(SESSION_EVERY_S)
    write_stat(100, 100, int(ticks * SESSION_EVERY_S / 2))  # half a core over the interval
    assert reader.sample() == ((100,), (0.5,))
    write_stat(100, 100, int(ticks * SESSION_EVERY_S * 2))  # the process's CPU goes on climbing...
    clock.advance(1.0)
    assert reader.sample() == ((100,), (0.5,))  # ...unread within the interval: the last reading stands
    clock.advance(SESSION_EVERY_S - 1.0)
    assert reader.sample() == ((100,), (1.5,))  # read again: 1.5 cores over the interval since the last reading

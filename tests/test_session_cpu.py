"""The host's CPU by session (gputop/collect/host.py `SessionCpu`): what autogroup shares the cores by."""

from __future__ import annotations

import subprocess
import sys

from gputop.collect.host import SessionCpu
from tests.harness.processes import wait_until


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

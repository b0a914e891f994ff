"""The CLI's dispatch and its one-line errors (exit codes 0 / 1 / 2)."""

import subprocess
import sys

import gputop.commands.tui
from gputop.cli import main


def test_options_without_a_subcommand_run_the_tui(monkeypatch):
    seen = []
    monkeypatch.setattr(gputop.commands.tui, "run", lambda args: seen.append((args.simulate, args.interval)) or 0)
    assert main(["--simulate", "--interval", "2"]) == 0
    assert seen == [("h100-sxm-8", 2.0)]


def test_usage_errors_are_one_line_with_exit_2():
    out = subprocess.run([sys.executable, "-m", "gputop", "--pid", "abc"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "gputop: argument --pid: 'abc' is not a process id (a whole number such as 12345) (see `gputop --help`)"
    ]
    out = subprocess.run([sys.executable, "-m", "gputop", "frobnicate"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "invalid choice" in out.stderr


def test_a_missing_pid_is_one_line_with_exit_1():
    out = subprocess.run(
        [sys.executable, "-m", "gputop", "snapshot", "--pid", str(2**22 + 12345)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"gputop: no process with PID {2**22 + 12345} (it may have exited; check with `ps -p {2**22 + 12345}`)"
    ]

"""Import hygiene: headless commands never load Textual, the monitor never loads torch, the core loads alone.

Each command runs to its end in a fresh interpreter; what `sys.modules` holds after `main()` returns
(background threads included) is what the command imported. A new headless command must get a row in
HEADLESS, or `test_every_command_is_covered` fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional

import pytest

from gputop.cli import COMMAND_MODULES
from tests.harness.processes import free_port
from tests.harness.train_jobs import REPO

# After main() returns: the exit code and every top-level package that was imported, as JSON in argv[1].
# A command that runs until a signal (serve) is sent SIGTERM once it listens on STOP_WHEN_LISTENING (host:port):
# a timer of 3 s from the start killed a serve a busy box had not yet brought that far (ci11, rc -15).
PROBE = """
import json, os, signal, socket, sys, threading, time
from gputop.cli import main
def stop_once_listening(host, port):
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGTERM)
if os.environ.get("STOP_WHEN_LISTENING"):
    threading.Thread(target=stop_once_listening, args=os.environ["STOP_WHEN_LISTENING"].rsplit(":", 1), daemon=True).start()
rc = main(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    json.dump({"rc": rc, "modules": sorted({m.split(".")[0] for m in sys.modules})}, out)
"""
# What importing a module loads, in a fresh interpreter.
IMPORT_PROBE = "import importlib, json, sys; importlib.import_module(sys.argv[1]); print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"

BUSY_PYTHON = "import time\nwhile True: sum(range(1000))"

# command -> argv after the command name, and the exit codes that mean "it ran its course".
# {tmp} is the test's tmp_path, {pid} a busy Python process.
HEADLESS = {
    "snapshot": (["--simulate", "--json"], {0}),
    "report": (["--simulate", "--seconds", "2", "--interval", "0.5", "-o", "{tmp}/report.md"], {0}),
    "record": (["--simulate", "--seconds", "2", "--interval", "0.5", "-o", "{tmp}/run.gtr"], {0}),
    # a busy loop is no training job: bench samples it with py-spy, then says why it cannot advise (1)
    "bench": (["--pid", "{pid}", "--seconds", "3", "--json"], {0, 1}),
    # the simulated machine without faults: every check passes (3 or 4 would be a fault or a warning found)
    "check": (["--simulate", "--seconds", "1"], {0}),
    "serve": (["--simulate", "--interval", "0.5", "--listen", "127.0.0.1:{port}"], {0}),
    # summarising a trace file needs no torch (the agent, inside the job, is the only part that does)
    "trace": (["--from", "{repo}/tests/fixtures/traces/hta_alexnet_a100.json.gz", "--json"], {0}),
}
STOPPED_ONCE_LISTENING = {"serve"}
# Commands that are the UI itself, or run a torch job as a child (the monitor side still never imports torch).
INTERACTIVE = {"tui", "demo", "replay", "fleet"}


def probe(spawn, tmp_path, argv: list[str], timeout: float = 120, stop_when_listening: Optional[str] = None) -> dict:
    out_file = tmp_path / "probe.json"
    env = {**os.environ, **({"STOP_WHEN_LISTENING": stop_when_listening} if stop_when_listening else {})}
    proc = spawn(
        [sys.executable, "-c", PROBE, str(out_file), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env
    )
    _, err = proc.communicate(timeout=timeout)
    stderr = err.decode("utf-8", "replace")
    assert out_file.exists(), f"gputop {' '.join(argv)} did not return from main(): rc={proc.returncode} {stderr[-2000:]}"
    return {**json.loads(out_file.read_text()), "stderr": stderr}


def imported_by(spawn, module: str) -> set[str]:
    proc = spawn([sys.executable, "-c", IMPORT_PROBE, module], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    return set(json.loads(out))


def test_every_command_is_covered():
    missing = set(COMMAND_MODULES) - set(HEADLESS) - INTERACTIVE
    assert not missing, f"add {sorted(missing)} to HEADLESS (or INTERACTIVE) in this test"


# bench samples a process with py-spy for seconds; report, record and serve watch the simulated machine
# for 2 s or more each: the slow lane (snapshot, check and trace stay in the quick one)
SLOW_COMMANDS = {"bench", "record", "report", "serve"}


@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_COMMANDS else c for c in sorted(HEADLESS)]
)
def test_headless_command_loads_neither_textual_nor_torch(command, spawn, tmp_path):
    args, ok_codes = HEADLESS[command]
    pid = spawn.python(BUSY_PYTHON).pid if any("{pid}" in a for a in args) else 0
    argv = [command, *(a.format(tmp=tmp_path, pid=pid, port=free_port(), repo=REPO) for a in args)]
    listen = argv[argv.index("--listen") + 1] if command in STOPPED_ONCE_LISTENING else None
    result = probe(spawn, tmp_path, argv, stop_when_listening=listen)
    assert result["rc"] in ok_codes, f"gputop {' '.join(argv)} exited {result['rc']}: {result['stderr'][-2000:]}"
    assert "internal error" not in result["stderr"]
    loaded = set(result["modules"])
    assert "gputop" in loaded  # the probe saw the command's own imports
    assert not loaded & {"textual", "torch"}, f"gputop {command} imported {sorted(loaded & {'textual', 'torch'})}"


@pytest.mark.parametrize(
    "module",
    [
        "gputop.model",
        "gputop.pipeline",
        "gputop.analysis.diagnosis",
        "gputop.report.markdown",
        "gputop.report.jsonreport",
        "gputop.recording",
        "gputop.monitor",  # the live monitor's state and work; its screen is gputop.tui.app
    ],
)
def test_the_core_imports_without_textual_or_torch(module, spawn):
    loaded = imported_by(spawn, module)
    assert "gputop" in loaded
    assert not loaded & {"textual", "torch"}, f"{module} imported {sorted(loaded & {'textual', 'torch'})}"


def test_the_monitor_never_imports_torch(spawn):
    loaded = imported_by(spawn, "gputop.tui.app")
    assert "textual" in loaded  # the probe really loaded the UI
    assert "torch" not in loaded

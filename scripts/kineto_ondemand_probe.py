"""Can gputop stand in for Dynolog as Kineto's on-demand endpoint?  The experiment behind docs/trace.md.

    python scripts/kineto_ondemand_probe.py [--runs 5] [--config iterations|duration] [--run-s 20]

Each run binds the abstract Unix datagram socket ``\\0dynolog\\0`` (libkineto's IPC fabric; nothing else on
the machine may hold it), starts a small CPU training loop with ``KINETO_USE_DAEMON=1 KINETO_LOG_LEVEL=0``
that returns from ``main`` after ``--run-s`` seconds, answers the job's first two polls with nothing (its loop
is stepping by then) and the third with a trace config: ``iterations`` (``PROFILE_START_ITERATION=0``,
``ACTIVITIES_ITERATIONS=N``, what ``dyno gputrace --iterations`` sends; ``--iterations 2000`` is still
recording when the job returns from ``main``) or ``duration`` (an 8 s window).  It prints the job's exit
status, what libkineto logged of the request, which thread started the trace, and the trace's op count.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

JOB = r"""
import os, time, torch
m = torch.nn.Linear(256, 256); opt = torch.optim.SGD(m.parameters(), lr=0.1)
end = time.monotonic() + float(os.environ["RUN_S"])
steps = 0
while time.monotonic() < end:
    m(torch.randn(64, 256)).sum().backward(); opt.step(); opt.zero_grad(); steps += 1
    time.sleep(0.02)
print("steps", steps, flush=True)
"""
CONFIGS = {
    "iterations": "PROFILE_START_ITERATION=0\nPROFILE_START_ITERATION_ROUNDUP=1\nACTIVITIES_ITERATIONS={iterations}",
    "duration": "PROFILE_START_TIME=0\nACTIVITIES_DURATION_MSECS=8000",
}
LOG_MARKS = ("duration-based", "Ignored profile", "Tracing started", "Tracing complete", "CPU trace is empty")


def serve(sock: socket.socket, config: bytes, until: float) -> int:
    """Answer the job's polls (metadata: size_t size, char type[32]; then the payload) until `until`."""
    polls = 0
    sock.settimeout(0.5)
    while time.monotonic() < until:
        try:
            data, sender = sock.recvfrom(65536)
        except socket.timeout:
            continue
        if data[8:40].split(b"\0")[0] != b"req":
            continue
        polls += 1
        payload = config if polls == 3 else b""
        sock.sendto(struct.pack("Q32s", len(payload), b"req") + payload, sender)
    return polls


def _started_on(err_text: str, pid: int) -> str:
    """Which thread logged "Tracing started" (libkineto's lines read `… PID:TID file:line] …`)."""
    for line in err_text.splitlines():
        if "Tracing started" in line:
            tid = line.split()[2].split(":")[1] if len(line.split()) > 2 and ":" in line.split()[2] else "?"
            return "the main thread" if tid == str(pid) else f"thread {tid}, not the main thread"
    return "no thread"


def one_run(config_name: str, run_s: float, iterations: int, workdir: str) -> str:
    log_file = os.path.join(tempfile.gettempdir(), f"gputop_kineto_probe_{os.getpid()}.json")
    config = f"ACTIVITIES_LOG_FILE={log_file}\n{CONFIGS[config_name].format(iterations=iterations)}".encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0dynolog\0")
    env = dict(os.environ, KINETO_USE_DAEMON="1", KINETO_LOG_LEVEL="0", RUN_S=str(run_s))
    err_path = os.path.join(workdir, "job.err")
    with open(err_path, "w") as err:
        job = subprocess.Popen(
            [sys.executable, os.path.join(workdir, "job.py")], stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
        try:
            serve(sock, config, time.monotonic() + run_s + 10)
            status = f"exit status {job.wait(timeout=60)}"
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
            status = "still running 60 s after its loop's end: killed"
        finally:
            sock.close()
    with open(err_path) as f:
        err_text = f.read()
    logged = [m for m in LOG_MARKS if m in err_text]
    ops = 0
    for path in glob.glob(log_file.replace(".json", "*.json")):
        with open(path) as f:
            ops += sum(1 for e in json.load(f).get("traceEvents", []) if e.get("cat") == "cpu_op")
        os.unlink(path)
    started = _started_on(err_text, job.pid)
    return f"{status}; libkineto logged: {', '.join(logged) or 'nothing of the request'}; started on {started}; cpu ops: {ops}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="iterations")
    parser.add_argument("--run-s", type=float, default=20.0)
    parser.add_argument("--iterations", type=int, default=20, help="iterations: how many; 2000 outlasts the job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "job.py"), "w") as f:
            f.write(JOB)
        for i in range(args.runs):
            print(f"run {i}: {one_run(args.config, args.run_s, args.iterations, workdir)}", flush=True)


if __name__ == "__main__":
    main()

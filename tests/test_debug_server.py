"""A rank's PyTorch debug server: found from its listening sockets, asked for the flight recorder, and the
hang named through it with nothing injected (issues 34 and 36's cooperative channel).

The first tests serve a stand-in on this process's own sockets (what discovery reads is /proc and a loopback
ping, the same for any server); the live ones run 3 gloo ranks under torchrun that call
``torch.distributed.debug.start_debug_server()``."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gputop.analysis.stack_classes import main_thread
from gputop.collect import debug_server
from gputop.collect.job_tree import JobCollector
from gputop.inject import fr_read, injector
from gputop.model import CHANNEL_DEBUG_SERVER, CHANNEL_IN_PROCESS, ProcessStacks
from tests.harness.processes import free_port, run_gputop
from tests.harness.train_jobs import START_TIMEOUT_S, wait_ready

JOB = str(Path(__file__).parent / "jobs" / "collective_job.py")


class _Pong(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = b"pong" if self.path == "/handler/ping" else b"{}"
        self.send_response(200 if self.path.startswith("/handler/") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@pytest.fixture
def stand_in():
    """A server answering like torch's worker server, bound to ``::`` on an ephemeral port, in this process."""
    server = _V6Server(("::", 0), _Pong)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.integration
def test_discovery_finds_the_server_on_the_process_own_sockets_and_never_touches_others(stand_in):
    # a listener bound to one address (as gloo's are) and one on :: that is not HTTP: neither is the server
    with socket.socket() as gloo_like, socket.socket(socket.AF_INET6) as silent:
        gloo_like.bind(("127.0.0.1", 0))
        gloo_like.listen()
        silent.bind(("::", 0))
        silent.listen()
        ports = debug_server.listening_ports(os.getpid())
        assert stand_in in ports and silent.getsockname()[1] in ports and gloo_like.getsockname()[1] not in ports
        found = debug_server.probe(os.getpid())
        assert found is not None and found.port == stand_in and found.host in ("::1", "127.0.0.1"), found
        gloo_like.setblocking(False)
        with pytest.raises(BlockingIOError):
            gloo_like.accept()  # nobody connected to the single-address listener
    assert debug_server.call(found, "ping") == b"pong"
    cache = debug_server.DebugServers()
    assert cache.find(os.getpid()) == found and cache.find(os.getpid()) == found


@pytest.mark.integration
def test_a_process_without_a_server_is_found_without_one_and_the_answer_is_cached():
    cache = debug_server.DebugServers(recheck_s=3600)
    assert cache.find(os.getpid()) is None
    with socket.socket(socket.AF_INET6) as late:  # a server started after the look is seen at the recheck
        late.bind(("::", 0))
        late.listen()
        assert cache.find(os.getpid()) is None  # cached: not probed again before recheck_s


def test_faulthandler_text_parses_into_stacks_without_the_server_thread():
    text = (
        "Current thread 0x00007f8d80b0d6c0 (most recent call first):\n  <no Python frame>\n\n"
        "Thread 0x00007f8d90000700 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n\n'
        "Thread 0x00007f8da6643b80 (most recent call first):\n"
        '  File "/job/train.py", line 65 in load_next_shard\n  File "/job/train.py", line 90 in main\n'
    )
    parsed = debug_server.parse_traceback(7, text, 1.0)
    assert parsed.error is None and [t.thread_id for t in parsed.threads] == [0x7F8D90000700, 0x7F8DA6643B80]
    main = main_thread(parsed)
    assert main is not None and [(f.name, f.line) for f in main.frames] == [("load_next_shard", 65), ("main", 90)]
    assert debug_server.parse_traceback(7, "garbage", 1.0).error is not None


def _stacks_through_the_server_where_py_spy_fails(launcher: int, stuck_rank: int) -> None:
    """A collector whose py-spy is refused on every process (as under ptrace_scope=3, which root here cannot be
    shown): the ranks' stacks come from their servers, rank 2's main thread in its own code."""

    def refused(pids: list[int]) -> dict[int, ProcessStacks]:
        return {
            pid: ProcessStacks(pid=pid, timestamp=time.time(), error="py-spy: Permission denied (os error 13)") for pid in pids
        }

    collector = JobCollector(launcher, stacks_enabled=False, dump=refused, native_dump=None, recorder_read=None)
    try:
        collector.refresh_stacks(full=True)
        stacks = collector.collect().stacks
    finally:
        collector.close()
    assert stacks[stuck_rank].error is None, stacks[stuck_rank]
    main = main_thread(stacks[stuck_rank])
    assert main is not None and "load_next_shard" in [f.name for f in main.frames[:3]], main  # under Event.wait


def _job(spawn, tmp_path: Path, *, server: bool) -> tuple:
    """3 gloo ranks with the recorder on and no dump file; rank 2 stops in its own code before the 4th
    all-reduce; `server`: every rank runs torch's debug server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    env.update(TORCH_FR_BUFFER_SIZE="100", TORCH_FR_DUMP_TEMP_FILE=str(tmp_path / "no_dump_"))
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), JOB, "--case", "stuck", "--odd-rank", "2", "--dump-every", "0",
        "--ready", str(tmp_path / "ready"), "--frontend-port", str(free_port()),
        *(("--debug-server",) if server else ()),
    ]  # fmt: skip
    with open(tmp_path / "job.log", "wb") as log:
        proc = spawn(argv, stdout=log, stderr=log, env=env)
    records = wait_ready(tmp_path / "ready", 3, proc, START_TIMEOUT_S, tmp_path / "job.log")
    return proc, {r["rank"]: (pid, r.get("worker_port")) for pid, r in records.items()}


@pytest.mark.slow
def test_a_hang_is_named_through_the_debug_servers_with_nothing_injected(spawn, tmp_path, monkeypatch):
    proc, ranks = _job(spawn, tmp_path, server=True)
    for rank, (pid, port) in ranks.items():  # discovery: each rank's worker port, from /proc and a ping
        found = debug_server.probe(pid)
        assert found is not None and found.port == port, (rank, found, port)

    def no_injection(*args: object, **kwargs: object) -> None:
        raise AssertionError("the read injected into a rank that runs a debug server")

    monkeypatch.setattr(injector, "inject_agent", no_injection)
    _stacks_through_the_server_where_py_spy_fails(proc.pid, ranks[2][0])
    record = fr_read.read_live(ranks[0][0], 0)
    assert record.error is None and record.channel == CHANNEL_DEBUG_SERVER, record
    assert any(e.seq == 4 and not e.done and e.op == "gloo:all_reduce" for e in record.entries), record.entries

    # the report in its own process: every rank's injection lock is held here, so an injection could not run;
    # the collective still comes from the recorders, all read through the servers
    with injector.InjectionLock(ranks[0][0], "test"), injector.InjectionLock(ranks[1][0], "test"):
        with injector.InjectionLock(ranks[2][0], "test"):
            ran = run_gputop(spawn, "report", "--pid", str(proc.pid), "--seconds", "12", "--format", "json", timeout=120)
    assert ran.rc == 0, ran.err[-2000:]
    hang = [f for f in json.loads(ran.out)["findings"] if f["id"] == "hang"]
    assert hang, ran.out[-3000:]
    c = hang[0]["figures"]["collective"]
    assert (c["source"], c["op"], c["seq"], c["process_group"]) == ("flight recorder", "gloo:all_reduce", 4, "0"), c
    assert c["entered"] == [0, 1] and c["missing"] == [2] and c["read_through"] == [CHANNEL_DEBUG_SERVER], c
    assert c["where"]["2"].startswith("load_next_shard (collective_job.py:"), c["where"]
    assert any(line.startswith("flight recorder: gloo:all_reduce #4") and "debug server" in line for line in hang[0]["evidence"])


@pytest.mark.slow
def test_a_job_without_the_server_is_read_in_process_as_before(spawn, tmp_path):
    proc, ranks = _job(spawn, tmp_path, server=False)
    for pid, _port in ranks.values():
        assert debug_server.probe(pid) is None
    record = fr_read.read_live(ranks[2][0], 2)
    assert record.error is None and record.channel == CHANNEL_IN_PROCESS, record
    assert max(e.seq for e in record.entries) == 3, record.entries  # rank 2 stopped before the 4th


@pytest.mark.integration
def test_a_trace_says_in_one_line_why_the_debug_server_does_not_profile(stand_in):
    from gputop.tracing import _debug_server_notes

    (note,) = _debug_server_notes([(os.getpid(), 0)])
    assert note.startswith(f"torch's debug server runs in PID {os.getpid()}; its torch_profile is not used"), note
    assert "SIGABRT" in note and "\n" not in note
    assert _debug_server_notes([(os.getppid(), None)]) == []  # pytest's parent runs none


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gputop_trace_of_a_job_with_the_server_injects_and_says_why_in_one_note(spawn, tmp_path):
    from tests.test_trace import run_trace_json, start_torchrun

    job, _log = start_torchrun(spawn, tmp_path, "--debug-server")
    result = run_trace_json(spawn, job.pid, tmp_path / "out", "--seconds", "2")
    assert [r["rank"] for r in result["ranks"]] == [0, 1], result["notes"]  # traced, by the injected agent
    said = [n for n in result["notes"] if n.startswith("torch's debug server runs in PIDs ")]
    assert len(said) == 1 and "torch_profile is not used" in said[0] and "SIGABRT" in said[0], result["notes"]

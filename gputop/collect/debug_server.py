"""A rank's PyTorch debug server, found without asking the user, and called over loopback HTTP.

``torch.distributed.debug.start_debug_server()`` (PyTorch 2.13) starts on every rank a C++ worker server
(``_WorkerServer("::", worker_port)``, an ephemeral port by default) whose handlers answer
``POST /handler/<name>``: ``ping`` ("pong"), ``dump_traceback`` (every thread's Python stack, faulthandler's
text), ``fr_trace_json`` (the flight recorder, the same JSON as ``_dump_fr_trace_json()``),
``wait_counter_values``, ``pyspy_dump`` and ``torch_profile``.  The job writes each worker's URL into its
TCPStore; gputop reads no store.  It finds the server from outside instead:

- the rank's listening TCP sockets: the socket inodes among ``/proc/PID/fd`` matched to the rows of
  ``/proc/PID/net/tcp6`` (the rank's own network namespace) in state LISTEN;
- only those shaped like the worker server: bound to the IPv6 wildcard ``::`` (gloo's listeners bind one
  address, so no gloo socket is ever sent a byte), on a port in the kernel's ephemeral range
  (``worker_port=0``, the default), and never the job's TCPStore (``MASTER_PORT``; the store, which also
  listens on ``::``, would read an HTTP request as a malformed command);
- each probed with ``ping`` on ``::1``, then ``127.0.0.1``, with a short timeout.  gputop connects to no
  other host.  A rank in another network namespace (a container) is not probed: its loopback is not ours.

What was found is cached per (PID, start time): a server for as long as it answers, its absence for
`RECHECK_S` (a job may start its server after gputop looked).  ``torch_profile`` is never called: it runs the
profiler from the server's thread with ``profile_all_threads``, and a job that returned from ``main`` during
it died with SIGABRT 6 times in 6 (docs/trace.md).  This module imports no torch.
"""

from __future__ import annotations

import http.client
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Optional

from gputop.collect.procfs import read_environ, read_stat
from gputop.errors import GputopError
from gputop.model import Frame, ProcessStacks, ThreadStack

PING_TIMEOUT_S = 0.5  # a C++ handler answers in microseconds; a port that is not HTTP holds the connection
CALL_TIMEOUT_S = 5.0
RECHECK_S = 30.0  # a rank found without a server is looked at again this often
MAX_PORTS = 16  # a rank listening on more candidate ports than this is probed on the first 16 (sorted)
MAX_ANSWER_BYTES = 64 << 20
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp6's st column
_V6_ANY = "0" * 32  # :: as /proc/net/tcp6 writes it: what `_WorkerServer("::", port)` binds
_EPHEMERAL_DEFAULT = (32768, 60999)


_THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


class DebugServerError(GputopError):
    """A call to a rank's debug server failed; the message says why in one line."""


@dataclass(frozen=True)
class DebugServer:
    pid: int
    host: str  # the loopback address that answered ("127.0.0.1" or "::1")
    port: int

    def describe(self) -> str:
        return f"the debug server of PID {self.pid} (port {self.port})"


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for port 0 (``/proc/sys/net/ipv4/ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(n) for n in f.read().split())
        return low, high
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def listening_ports(pid: int) -> list[int]:
    """The ports the process listens on with a socket bound to ``::`` (IPv6 wildcard, loopback reaches it)."""
    inodes = _socket_inodes(pid)
    found: set[int] = set()
    try:
        with open(f"/proc/{pid}/net/tcp6") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return []
    for row in rows:
        fields = row.split()
        if len(fields) < 10 or fields[3] != _LISTEN or not fields[9].isdigit() or int(fields[9]) not in inodes:
            continue
        address, _, port = fields[1].partition(":")
        if address == _V6_ANY:
            found.add(int(port, 16))
    return sorted(found)


def candidate_ports(pid: int) -> list[int]:
    """The rank's ports that may be its worker server's: `listening_ports` in the ephemeral range, less the
    job's TCPStore (``MASTER_PORT`` in its environment)."""
    low, high = ephemeral_ports()
    store_port = (read_environ(pid) or {}).get("MASTER_PORT", "")
    return [p for p in listening_ports(pid) if low <= p <= high and str(p) != store_port][:MAX_PORTS]


def same_network_namespace(pid: int) -> bool:
    """The process's loopback is ours (a container's network namespace has its own)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False


def call(server: DebugServer, handler: str, query: str = "", timeout: float = CALL_TIMEOUT_S) -> bytes:
    """POST /handler/<handler>?<query> to the server; its body, or `DebugServerError` saying why not."""
    path = f"/handler/{handler}" + (f"?{query}" if query else "")
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        conn.request("POST", path, headers={"Content-Length": "0"})
        answer = conn.getresponse()
        body = answer.read(MAX_ANSWER_BYTES + 1)
    except (OSError, http.client.HTTPException) as exc:
        raise DebugServerError(f"{server.describe()} did not answer {handler}: {exc or type(exc).__name__}") from None
    finally:
        conn.close()
    if answer.status != 200:
        raise DebugServerError(f"{server.describe()} answered {handler} with HTTP {answer.status}: {body[:120]!r}")
    if len(body) > MAX_ANSWER_BYTES:
        raise DebugServerError(f"{server.describe()} answered {handler} with over {MAX_ANSWER_BYTES >> 20} MiB: not read")
    return body


def _answers_ping(pid: int, port: int) -> Optional[DebugServer]:
    for host in ("::1", "127.0.0.1"):
        server = DebugServer(pid, host, port)
        try:
            if call(server, "ping", timeout=PING_TIMEOUT_S).strip() == b"pong":
                return server
        except DebugServerError:
            continue
    return None


def probe(pid: int) -> Optional[DebugServer]:
    """The rank's debug server, looked for now (no cache): None when it runs none that loopback reaches."""
    if not same_network_namespace(pid):
        return None
    for port in candidate_ports(pid):
        found = _answers_ping(pid, port)
        if found is not None:
            return found
    return None


class DebugServers:
    """`probe` cached per (PID, start time): a server while it answers, its absence for `recheck_s`."""

    def __init__(self, recheck_s: float = RECHECK_S) -> None:
        self._recheck_s = recheck_s
        self._lock = threading.Lock()
        self._found: dict[tuple[int, int], tuple[Optional[DebugServer], float]] = {}

    def find(self, pid: int) -> Optional[DebugServer]:
        stat = read_stat(pid)
        if stat is None:
            return None
        key = (pid, stat.start_ticks)
        now = time.monotonic()
        with self._lock:
            cached = self._found.get(key)
        if cached is not None and (cached[0] is not None or now - cached[1] < self._recheck_s):
            return cached[0]
        server = probe(pid)
        with self._lock:
            for old in [k for k in self._found if k[0] == pid and k != key]:
                del self._found[old]  # the PID names another process now
            self._found[key] = (server, now)
        return server

    def forget(self, server: DebugServer) -> None:
        """It stopped answering: look again at the next `find`."""
        with self._lock:
            for key in [k for k, v in self._found.items() if v[0] == server]:
                del self._found[key]


SERVERS = DebugServers()  # one cache for the process: every collector and command shares what was found


def find(pid: int) -> Optional[DebugServer]:
    return SERVERS.find(pid)


def call_rank(pid: int, handler: str, query: str = "", timeout: float = CALL_TIMEOUT_S) -> Optional[bytes]:
    """`handler`'s answer from the rank's debug server; None when it runs none.  A server that stopped
    answering is forgotten (looked for again next time) and the error raised."""
    server = find(pid)
    if server is None:
        return None
    try:
        return call(server, handler, query, timeout)
    except DebugServerError:
        SERVERS.forget(server)
        raise


def parse_traceback(pid: int, text: str, timestamp: float) -> ProcessStacks:
    """``dump_traceback``'s answer (faulthandler's text: each thread newest first, its frames innermost first)
    as py-spy's stacks.  The "Current thread" is the server's own handler thread: left out.  faulthandler
    names no thread and says nothing of idleness; the main thread is the last listed, as with py-spy's text."""
    threads: list[ThreadStack] = []
    frames: list[Frame] = []
    header: Optional[tuple[bool, int]] = None

    def close() -> None:
        if header is not None and not header[0]:
            threads.append(ThreadStack(header[1], None, None, bool(frames), False, tuple(frames)))

    for line in text.splitlines():
        head = _THREAD_HEADER.match(line)
        frame = _FRAME.match(line) if head is None else None
        if head is not None:
            close()
            header, frames = (head.group(1) == "Current thread", int(head.group(2), 16)), []
        elif frame is not None and header is not None:
            frames.append(Frame(name=frame.group(3), filename=frame.group(1), line=int(frame.group(2))))
    close()
    if not threads:
        return ProcessStacks(pid=pid, timestamp=timestamp, error=f"the debug server of PID {pid} gave no thread's stack")
    return ProcessStacks(pid=pid, timestamp=timestamp, threads=tuple(threads))


def stacks(pid: int) -> Optional[ProcessStacks]:
    """The rank's Python stacks from its debug server (``dump_traceback``); None when it runs none or the call
    failed.  Only where py-spy cannot read the rank: the handler takes the GIL and runs faulthandler inside
    the job, where py-spy reads its memory from outside; and py-spy gives thread names and idleness."""
    asked = time.time()
    try:
        answer = call_rank(pid, "dump_traceback")
    except DebugServerError:
        return None
    return None if answer is None else parse_traceback(pid, answer.decode(errors="replace"), asked)

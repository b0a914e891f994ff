"""`gputop serve [--listen 127.0.0.1:9401] [--pid PID ...] [--simulate [SPEC]] [--interval S]`: an
OpenMetrics endpoint for Prometheus, next to dcgm-exporter.  Headless: it never imports Textual.

It binds to loopback unless another address is asked for.  Collection is the one pipeline
(`gputop.pipeline.following_pipeline`, the same `gputop record` builds from the same options: the jobs
of --pid, or every job on the GPUs, each with its stacks) polled by the one poll loop
(`gputop.source.PollLoop`) in a background thread, feeding `gputop.exporter.Exporter`; a scrape gets
the last cycle's values.

GPU health (`gputop_gpu_health`, `gputop_gpu_health_problem{rule,severity}`) is the health module's
judgement of the samples, joined by the pipeline's counter watch: every 60 s (`WATCH_COUNTERS_S`) the poll
that falls due also reads what `gputop check` reads at the ends of its window (PCIe replay and NVLink error
counters, retired pages, sysfs AER, the kernel log's XIDs, the topology) and judges the minute since the
previous reading with the check's lines (`Snapshot.counter_health`).  A climbing counter shows within two
minutes; a kernel-log XID or a pending page retirement at the first poll.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

    from gputop.exporter import Exporter
    from gputop.pipeline import Pipeline
    from gputop.source import PollLoop

from gputop.errors import GputopError, UsageError

DEFAULT_LISTEN = "127.0.0.1:9401"
STOP_POLL_S = 30.0  # how long a stop waits for the poll in progress (a py-spy round on a busy box) to end


def parse_listen(text: str) -> tuple[str, int]:
    """ "HOST:PORT" (IPv6 as "[::1]:PORT") -> (host, port); UsageError saying what is wrong otherwise."""
    host, sep, port_text = text.rpartition(":")
    example = f"e.g. --listen {DEFAULT_LISTEN}"
    if not sep or not host:
        raise UsageError(f"--listen {text!r} is not HOST:PORT ({example})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise UsageError(f"--listen {text!r}: write an IPv6 address in brackets, e.g. [::1]:9401")
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"--listen {text!r}: port {port_text!r} is not a number ({example})") from None
    if not 1 <= port <= 65535:
        raise UsageError(f"--listen {text!r}: port {port} is outside 1-65535 ({example})")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_server(host: str, port: int, registry: "CollectorRegistry") -> "WSGIServer":
    """prometheus_client's HTTP server on host:port; GputopError (one line) when it cannot bind."""
    from prometheus_client import start_http_server

    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise GputopError(
                f"{where} is already in use (another gputop serve?); choose another port with --listen HOST:PORT"
            ) from None
        if exc.errno == errno.EACCES:
            raise GputopError(
                f"not allowed to listen on {where} (ports below 1024 need root); choose a port above 1024"
            ) from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise GputopError(f"cannot listen on {where}: no interface of this machine has that address") from None
        # socket.gaierror (an OSError) for a host name that does not resolve
        raise GputopError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    return server


def start_exporting(exporter: "Exporter", host: str, port: int) -> "WSGIServer":
    """The exporter's first cycle (so the first scrape has values, and a broken machine fails here, not
    later), then the HTTP server that serves it on host:port."""
    from prometheus_client import CollectorRegistry

    exporter.cycle()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return start_server(host, port, registry)


def stop_serving(
    loop: "Optional[PollLoop]",
    server: "Optional[WSGIServer]",
    pipeline: "Optional[Pipeline]",
    collecting: Optional[threading.Thread] = None,
) -> None:
    """Take down what serving started, in order (whatever got started: None is skipped): the poll loop and the
    thread running it, the HTTP server, the pipeline (with the followed jobs' stack samplers)."""
    if loop is not None:
        loop.stop()
    if collecting is not None:
        # the poll in progress ends before the pipeline under it is closed: a poll that found a new job adds its
        # collector while close() walks them (a CI run's "dictionary changed size during iteration")
        collecting.join(timeout=STOP_POLL_S)
    if server is not None:
        server.shutdown()
        server.server_close()
    if pipeline is not None:
        pipeline.close()


def run(args: argparse.Namespace) -> int:
    from gputop.exporter import Exporter
    from gputop.pipeline import following_pipeline
    from gputop.source import PollLoop

    host, port = parse_listen(args.listen)
    log = _log
    pipeline = following_pipeline(args)
    server = None
    loop: Optional[PollLoop] = None
    thread: Optional[threading.Thread] = None
    try:
        exporter = Exporter(
            pipeline, interval=args.interval, dcgm_fields=args.dcgm_fields, hostname=getattr(args, "hostname", None), log=log
        )
        # just before it listens (Ctrl-C still interrupts the start): a SIGTERM as soon as the port answers
        # (systemd's stop, a test) ends serve through its clean stop, not the default action (ci50: rc -15)
        stop = _stop_on_signals()
        server = start_exporting(exporter, host, port)
        if pipeline.machine.gpu_error:
            log(f"no GPU readings: {pipeline.machine.gpu_error}; job metrics are still served")
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        what = f"the job(s) of PID {', '.join(map(str, args.pid))}" if args.pid else "every job on the GPUs"
        log(f"serving metrics for {what} on http://{shown}/metrics (Ctrl-C stops)")
        if pipeline.counters is not None:
            log(
                f"reading gputop check's counters (PCIe replays, NVLink errors, AER, kernel-log XIDs) every {pipeline.counters.cadence:g} s"
            )
        if not is_loopback(host):
            log(f"listening beyond loopback: anyone who can reach {shown} can read these metrics")
        loop = PollLoop(pipeline, args.interval, on_error=exporter.failed)
        thread = threading.Thread(target=loop.run, args=(exporter.deliver,), name="gputop-serve-collect", daemon=True)
        thread.start()
        _wait_for_signal(loop, stop)
    finally:
        stop_serving(loop, server, pipeline, thread)
    return 0


def _log(line: str) -> None:
    print(f"gputop serve: {line}", file=sys.stderr, flush=True)


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM (systemd's stop) or SIGINT (Ctrl-C) sets from now on."""
    stop = threading.Event()

    def handle(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def _wait_for_signal(loop: "PollLoop", stop: threading.Event) -> None:
    """Until a stop signal (`_stop_on_signals`) or the poll loop ends."""
    while not (stop.wait(1.0) or loop.stop_event.is_set()):
        pass  # the caller's `stop_serving` stops the loop

"""Prometheus's HTTP query API on loopback, answered by a stand-in (tests/test_fleet.py's `PromLike`), so the
real `PrometheusApi` client reads it over a real socket; `stop()` and `start()` again make it go away and come
back on the same port, as a Prometheus that restarts does."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

from gputop.fleet.prometheus import Series


class PrometheusStandIn:
    def __init__(self, answer: Callable[[str], list[Series]]) -> None:
        self.answer = answer
        self.port = 0
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "PrometheusStandIn":
        answer = self.answer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parsed = urllib.parse.urlsplit(self.path)
                expr = urllib.parse.parse_qs(parsed.query).get("query", [""])[0]
                if parsed.path != "/api/v1/query":
                    self._reply(404, {"status": "error", "error": "not found"})
                    return
                try:
                    series = answer(expr)
                except AssertionError as exc:  # the stand-in cannot evaluate it: Prometheus's 400
                    self._reply(400, {"status": "error", "errorType": "bad_data", "error": str(exc)})
                    return
                result = [{"metric": s.labels, "value": [s.at, repr(s.value)]} for s in series]
                self._reply(200, {"status": "success", "data": {"resultType": "vector", "result": result}})

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="prometheus-stand-in", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

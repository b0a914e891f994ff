"""Prometheus's HTTP API, read with urllib: instant queries over what every node's `gputop serve` exports.

One function asks (`PrometheusApi.query`), so the cross-node view (`gputop.fleet.view`) runs the same over
a live Prometheus and over recorded answers (tests)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from gputop.errors import GputopError, UsageError

QUERY_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Series:
    """One series of an instant query's answer: its labels and its value at the query's time."""

    labels: dict[str, str]
    value: float
    at: float  # the evaluation time (Unix seconds)


class Query(Protocol):
    def __call__(self, expr: str) -> list[Series]: ...


def normalize_url(url: str) -> str:
    """'127.0.0.1:9090' or 'http://host:9090/' -> 'http://host:9090'; anything else is a usage error."""
    text = url.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"--prometheus {url!r} is not an HTTP address (give one such as http://127.0.0.1:9090)")
    return text


def parse_answer(url: str, answer: Any) -> list[Series]:
    """The `data.result` of an instant vector query, as Series; an error answer is one line."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error", "no status") if isinstance(answer, dict) else "not a JSON object"
        raise GputopError(f"Prometheus at {url} refused the query: {error}")
    data = answer.get("data") or {}
    if data.get("resultType") != "vector":
        raise GputopError(f"Prometheus at {url} answered a {data.get('resultType')!r}, not a vector")
    series = []
    for item in data.get("result") or ():
        at, value = item["value"]
        series.append(Series(item.get("metric") or {}, float(value), float(at)))  # json's own dict: no copy
    return series


class PrometheusApi:
    """`query(expr)` against `url`'s /api/v1/query; an unreachable server is one line saying so."""

    def __init__(self, url: str, timeout: float = QUERY_TIMEOUT_S) -> None:
        self.url = normalize_url(url)
        self.timeout = timeout

    def __call__(self, expr: str) -> list[Series]:
        return self.query(expr)

    def query(self, expr: str) -> list[Series]:
        address = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(address, timeout=self.timeout) as reply:
                body = reply.read()
        except urllib.error.HTTPError as exc:  # Prometheus answers a bad query with 400 and a JSON error
            body = exc.read()
            if not body:
                raise GputopError(f"Prometheus at {self.url} answered HTTP {exc.code} to {expr!r}") from None
        except (urllib.error.URLError, socket.timeout, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise GputopError(
                f"cannot reach Prometheus at {self.url}: {reason} (is it running? give its address, e.g. --prometheus http://HOST:9090)"
            ) from None
        try:
            answer = json.loads(body)
        except ValueError:
            raise GputopError(f"{self.url} answered something other than Prometheus's JSON: is it Prometheus?") from None
        return parse_answer(self.url, answer)


def first(series: list[Series]) -> Optional[Series]:
    return series[0] if series else None

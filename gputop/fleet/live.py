"""The live cross-node view: `fleet_view` + `judge` asked again every interval, on a thread of its own.

`gputop fleet`'s screen (gputop.tui.fleet_app) draws what `FleetPoller` hands over; a round that fails
(Prometheus gone, the job gone) hands over its one-line reason instead, and the next round retries.
No Textual here: the loop is the same for any screen, and tests drive it alone."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from gputop.errors import GputopError
from gputop.fleet.prometheus import Query
from gputop.fleet.view import FleetVerdict, FleetView, fleet_view, judge


@dataclass(frozen=True, slots=True)
class FleetRound:
    """One refresh: the view and its verdict, or why there is none this time (`error`, one line)."""

    view: Optional[FleetView] = None
    verdict: Optional[FleetVerdict] = None
    error: Optional[str] = None


def read_round(query: Query, job: Optional[str], where: str, expected_hosts: Sequence[str] = ()) -> FleetRound:
    """One refresh; any failure is one line (a bug in a round must not take the screen down either)."""
    try:
        view = fleet_view(query, job, where=where, expected_hosts=expected_hosts)
        return FleetRound(view, judge(view))
    except GputopError as exc:
        return FleetRound(error=str(exc))
    except Exception as exc:  # a malformed answer, a bug: said on screen, retried next round
        return FleetRound(error=f"reading Prometheus failed: {type(exc).__name__}: {exc}")


class FleetPoller:
    """Every `interval` seconds until `stop()`: one `read_round` for the followed job, handed to `deliver`
    (on this poller's thread).  `follow(job)` switches jobs and reads at once; rounds never overlap."""

    def __init__(
        self,
        query: Query,
        where: str,
        job: Optional[str],
        interval: float,
        deliver: Callable[[FleetRound], None],
        expected_hosts: Sequence[str] = (),
    ) -> None:
        self.query = query
        self.where = where
        self.job = job
        self.expected_hosts = tuple(expected_hosts)  # the scheduler's nodes of `job` (--slurm-job)
        self.interval = interval
        self.deliver = deliver
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self, first_wait: Optional[float] = None) -> None:
        """Start the loop; its first round after `first_wait` seconds (default: one interval)."""
        if self._thread is None:
            wait = self.interval if first_wait is None else first_wait
            self._thread = threading.Thread(target=self._run, args=(wait,), name="gputop-fleet", daemon=True)
            self._thread.start()

    def follow(self, job: str) -> None:
        if job != self.job:
            self.expected_hosts = ()  # the scheduler's nodes were the first job's
        self.job = job
        self._wake.set()

    def refresh_now(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Ends the loop after the round in flight; never waits for it (a query can hang up to its timeout)."""
        self._stop.set()
        self._wake.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _run(self, wait: float) -> None:
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            result = read_round(self.query, self.job, self.where, self.expected_hosts)
            if not self._stop.is_set():
                self.deliver(result)
            wait = self.interval

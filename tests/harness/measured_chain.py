"""The order a side-by-side run hands out its tests: the unit files first, then the measured chain on one worker,
the other files longest first.

The measured tests (acceptance and ``alone``, tests/harness/turns.py) take the measured turn, one at a time: they
form a chain as long as their sum (~16 minutes on the 2-core box), and the run cannot end before it does.  Spread
over whole files as pytest-xdist's ``loadfile`` hands them out, the chain stalled whenever no worker had a measured
test next (all three in files of shared tests) and grew by the unit and shared tests of its files.  Here the
measured tests of every file form one work unit, handed to one worker (the ``alone`` ones at its head, ending with
those that lower their own turn part-way, ``alone(then_acceptance=True)``); every other
test goes by file, as ``loadfile``, in this order.  The chain's acceptance tests end with those marked
``load_tolerant``, which take one slot and let two shared tests in: an acceptance test after one waits for
one of them to end (ci33: 13 s and 7 s), a shared test after the chain does not:

1. where the shared tests run at a lower CPU priority (tests/harness/cpu_priority.py), the files of unit tests
   only (~1 CPU-minute in all), on every worker at once, before the first measured test starts: beside a measured
   test the shared tests get a fifth of the box, and a unit test's 2 s budget (tests/conftest.py) would then
   measure the starved box (elsewhere they go by their cost, with the rest: after the chain has started);
2. the measured chain, to the first worker that asks after them;
3. the other files, the longest first (`FILE_COSTS`: their shared tests' seconds in a recent run, written by
   ``scripts/test_costs.py --file-costs``; a file not in it is guessed from its count of tests).  xdist's own order
   (the most tests first) handed out a 9-test file of 163 s near the end, and the run waited ~3 minutes for it
   after everything else was done.

The controller does not collect tests; each worker writes which of its collected tests are measured and which
are unit tests (`write_plan`, at the end of its collection) to a file the controller's scheduler reads once every
worker has collected.  Without that file (one process, another ``--dist``) nothing changes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from xdist.scheduler import LoadFileScheduling

MEASURED_UNIT = "measured tests"
FILE_COSTS = Path(__file__).with_name("file_costs.json")  # {test file: its shared tests' wall seconds}
GUESS_S = {"unit": 0.1, "shared": 3.0}  # a file not in FILE_COSTS: seconds a test, by whether it is a unit test


def plan_path(controller_pid: int) -> Path:
    """Where the workers of the run whose controller is `controller_pid` leave their plan."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"gputop-test-plan-{os.geteuid()}-{controller_pid}.json"


def write_plan(
    path: Path,
    measured: dict[str, bool],
    unit: Optional[list[str]] = None,
    units_first: bool = True,
    head_last: Optional[list[str]] = None,
    chain_last: Optional[list[str]] = None,
) -> None:
    """{nodeid: alone} for each measured test, the unit tests' nodeids, whether their files go first (where the
    shared tests run at a lower CPU priority), the alone tests that end the chain's head (`head_last`: those that
    lower their own turn once their measured part is done) and the acceptance tests that end the chain
    (`chain_last`: those that take fewer slots than the others), written whole (every worker writes the same)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    plan = {
        "measured": measured,
        "unit": unit or [],
        "units_first": units_first,
        "head_last": head_last or [],
        "chain_last": chain_last or [],
    }
    partial.write_text(json.dumps(plan))
    os.replace(partial, path)


def remove_plan(controller_pid: int) -> None:
    """The plan gone, at the controller's end (the scheduler reads it once)."""
    plan_path(controller_pid).unlink(missing_ok=True)


def read_file_costs(path: Path = FILE_COSTS) -> dict[str, float]:
    try:
        costs = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(name): float(seconds) for name, seconds in costs.items()} if isinstance(costs, dict) else {}


def hand_out_order(
    units: dict[str, dict[str, bool]], unit_tests: set[str], costs: dict[str, float], units_first: bool = True
) -> list[str]:
    """The work units (test files, and `MEASURED_UNIT`) in the order they are handed out (the module docstring):
    with `units_first`, the unit-only files as collected; the measured chain; the rest by their cost, the longest
    first (ties as collected)."""

    def cost(scope: str) -> float:
        if scope in costs:
            return costs[scope]
        return sum(GUESS_S["unit" if nodeid in unit_tests else "shared"] for nodeid in units[scope])

    names = [scope for scope in units if scope != MEASURED_UNIT]
    unit_only = [scope for scope in names if units_first and all(nodeid in unit_tests for nodeid in units[scope])]
    rest = sorted((scope for scope in names if scope not in unit_only), key=lambda scope: -cost(scope))
    return [*unit_only, *([MEASURED_UNIT] if MEASURED_UNIT in units else []), *rest]


class MeasuredChainScheduling(LoadFileScheduling):
    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.plan: dict[str, bool] = {}  # {nodeid: alone} of the measured tests
        self.unit_tests: set[str] = set()
        self.units_first = True
        self.head_last: set[str] = set()  # alone tests that lower their turn part-way: the last of the chain's head
        self.chain_last: set[str] = set()  # acceptance tests with fewer slots than the others: the chain's end
        self._plan_path = plan_path(os.getpid())
        self._ordered = False

    def schedule(self) -> None:
        if self.collection is None:  # the first call, once every worker has collected
            try:
                plan = json.loads(self._plan_path.read_text())
                self.plan, self.unit_tests = dict(plan["measured"]), set(plan["unit"])
                self.units_first = bool(plan.get("units_first", True))
                self.head_last = set(plan.get("head_last", ()))
                self.chain_last = set(plan.get("chain_last", ()))
            except (OSError, ValueError, KeyError, TypeError):
                self.plan, self.unit_tests, self.head_last, self.chain_last = {}, set(), set(), set()
        super().schedule()

    def _chain_place(self, item: tuple[str, Any]) -> tuple[bool, bool, bool]:
        """The alone tests first, ending with those that lower their own turn part-way (`head_last`): the chain's next
        test is then an acceptance one, which needs no more slots than the lowered test held and finds them free at
        once, where an alone test would wait for the shared test let in beside it to end.  Likewise the acceptance
        tests end with those that take fewer slots (`chain_last`): no acceptance test waits after one."""
        nodeid = item[0]
        return not self.plan.get(nodeid, False), nodeid in self.head_last, nodeid in self.chain_last

    def _split_scope(self, nodeid: str) -> str:
        return MEASURED_UNIT if nodeid in self.plan else super()._split_scope(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered and self.plan:  # the first call: xdist has just built the queue
            self._ordered = True
            chain = self.workqueue.get(MEASURED_UNIT)
            if chain is not None:  # the alone tests at its head (a stable sort: each file's tests stay in their order)
                self.workqueue[MEASURED_UNIT] = dict(sorted(chain.items(), key=self._chain_place))
            for scope in hand_out_order(dict(self.workqueue), self.unit_tests, read_file_costs(), self.units_first):
                self.workqueue.move_to_end(scope)
        super()._assign_work_unit(node)

"""One worker runs the measured tests one after another; the others run the shared ones beside them.

The measured tests (acceptance and ``alone``, tests/harness/turns.py) take the measured turn, one at a time: they
form a chain as long as their sum (~16 minutes on the 2-core box), and the run cannot end before it does.  Spread
over whole files as pytest-xdist's ``loadfile`` hands them out, the chain stalled whenever no worker had a measured
test next (all three in files of shared tests) and grew by the unit and shared tests of its files.  Here the
measured tests of every file form one work unit, handed first to one worker (the ``alone`` ones at its head, while
the others start on files of quick unit tests, so the box drains quickly for them); every other test goes by
file, as ``loadfile``.

The controller does not collect tests; each worker writes which of its collected tests are measured (`write_plan`,
at the end of its collection) to a file the controller's scheduler reads once every worker has collected.
Without that file (one process, another ``--dist``) nothing changes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from xdist.scheduler import LoadFileScheduling

MEASURED_UNIT = "measured tests"


def plan_path(controller_pid: int) -> Path:
    """Where the workers of the run whose controller is `controller_pid` leave their plan."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"gputop-test-plan-{os.geteuid()}-{controller_pid}.json"


def write_plan(path: Path, measured: dict[str, bool]) -> None:
    """{nodeid: alone} for each measured test, written whole (every worker writes the same)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(measured))
    os.replace(partial, path)


def remove_plan(controller_pid: int) -> None:
    """The plan gone, at the controller's end (the scheduler reads it once)."""
    plan_path(controller_pid).unlink(missing_ok=True)


class MeasuredChainScheduling(LoadFileScheduling):
    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.plan: dict[str, bool] = {}
        self._plan_path = plan_path(os.getpid())

    def schedule(self) -> None:
        if self.collection is None:  # the first call, once every worker has collected
            try:
                self.plan = json.loads(self._plan_path.read_text())
            except (OSError, ValueError):
                self.plan = {}
        super().schedule()

    def _split_scope(self, nodeid: str) -> str:
        return MEASURED_UNIT if nodeid in self.plan else super()._split_scope(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        chain: Optional[dict[str, bool]] = self.workqueue.get(MEASURED_UNIT)
        if chain is not None:
            # first out, the alone tests at its head (a stable sort: each file's tests stay in their order)
            ordered = sorted(chain.items(), key=lambda item: not self.plan.get(item[0], False))
            self.workqueue[MEASURED_UNIT] = dict(ordered)
            self.workqueue.move_to_end(MEASURED_UNIT, last=False)
        super()._assign_work_unit(node)

"""tests/harness/measured_chain.py: side by side, the measured tests go to one worker as one chain, alone ones first."""

from __future__ import annotations

import os
from types import SimpleNamespace

from tests.harness.measured_chain import MEASURED_UNIT, MeasuredChainScheduling, plan_path, remove_plan, write_plan

COLLECTION = [
    "tests/acceptance/test_frameworks.py::test_a",
    "tests/acceptance/test_frameworks.py::test_b",
    "tests/test_bench.py::test_accuracy",
    "tests/test_bench.py::test_unit_1",
    "tests/test_bench.py::test_unit_2",
    "tests/test_case_study.py::test_rule",
    "tests/test_case_study.py::test_live",
    "tests/test_model.py::test_1",
    "tests/test_model.py::test_2",
    "tests/test_model.py::test_3",
]
MEASURED = {  # nodeid: alone
    "tests/acceptance/test_frameworks.py::test_a": False,
    "tests/acceptance/test_frameworks.py::test_b": False,
    "tests/test_bench.py::test_accuracy": True,
    "tests/test_case_study.py::test_live": True,
}


class _Worker:
    """What the scheduler asks of a worker: take these tests, stop when there is no more."""

    def __init__(self, name: str) -> None:
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = SimpleNamespace(id=name)  # named in the scheduler's check that all collected the same

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append([COLLECTION[i] for i in indexes])

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduler(plan: dict) -> tuple[MeasuredChainScheduling, list[_Worker]]:
    config = SimpleNamespace(getvalue=lambda name: {"tx": ["3*popen"]}[name], option=SimpleNamespace(loadscopereorder=True))
    scheduler = MeasuredChainScheduling(config)
    write_plan(plan_path(os.getpid()), plan)  # as the workers do once they have collected
    workers = [_Worker(f"gw{i}") for i in range(3)]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, COLLECTION)
    return scheduler, workers


def test_the_measured_tests_go_first_to_one_worker_alone_ones_at_their_head_the_rest_by_file():
    scheduler, workers = _scheduler(MEASURED)
    try:
        scheduler.schedule()
        first = workers[0].sent[0]
        assert first == [
            "tests/test_bench.py::test_accuracy",  # the alone ones first, each file's tests in their order
            "tests/test_case_study.py::test_live",
            "tests/acceptance/test_frameworks.py::test_a",
            "tests/acceptance/test_frameworks.py::test_b",
        ]
        others = [tests for worker in workers[1:] for tests in worker.sent]
        assert sorted(test for tests in others for test in tests) == sorted(set(COLLECTION) - set(MEASURED))
        for tests in others:  # every other unit is one file's tests
            assert len({test.split("::")[0] for test in tests}) == 1, tests
    finally:
        remove_plan(os.getpid())
    assert not plan_path(os.getpid()).exists()


def test_without_a_plan_it_hands_out_whole_files():
    scheduler, workers = _scheduler({})
    plan_path(os.getpid()).unlink()
    scheduler.schedule()
    units = [tests for worker in workers for tests in worker.sent]
    assert MEASURED_UNIT not in scheduler.workqueue
    assert sorted(test for tests in units for test in tests) == sorted(COLLECTION)
    assert all(len({test.split("::")[0] for test in tests}) == 1 for tests in units)

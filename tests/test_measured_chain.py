"""tests/harness/measured_chain.py: side by side, the unit files first, then the measured tests to one worker as one
chain (alone ones first), then the other files, the longest first."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.harness.measured_chain import (
    MEASURED_UNIT,
    MeasuredChainScheduling,
    hand_out_order,
    plan_path,
    read_file_costs,
    remove_plan,
    write_plan,
)

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


SENT: list[list[str]] = []  # what every worker was sent, in order


class _Worker:
    """What the scheduler asks of a worker: take these tests, stop when there is no more."""

    def __init__(self, name: str) -> None:
        self.name, self.sent, self.shutting_down = name, [], False
        self.gateway = SimpleNamespace(id=name)  # named in the scheduler's check that all collected the same

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append([COLLECTION[i] for i in indexes])
        SENT.append(self.sent[-1])

    def shutdown(self) -> None:
        self.shutting_down = True


UNIT = ["tests/test_bench.py::test_unit_1", "tests/test_bench.py::test_unit_2", "tests/test_case_study.py::test_rule"]
UNIT += [f"tests/test_model.py::test_{i}" for i in (1, 2, 3)]


def _scheduler(
    plan: dict, unit: tuple = (), head_last: tuple = (), chain_last: tuple = ()
) -> tuple[MeasuredChainScheduling, list[_Worker]]:
    config = SimpleNamespace(getvalue=lambda name: {"tx": ["3*popen"]}[name], option=SimpleNamespace(loadscopereorder=True))
    scheduler = MeasuredChainScheduling(config)
    SENT.clear()
    # as the workers do once collected
    write_plan(plan_path(os.getpid()), plan, list(unit), head_last=list(head_last), chain_last=list(chain_last))
    workers = [_Worker(f"gw{i}") for i in range(3)]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, COLLECTION)
    return scheduler, workers


def test_the_measured_tests_go_to_one_worker_after_the_unit_files_alone_ones_at_their_head_the_rest_by_file():
    scheduler, workers = _scheduler(MEASURED, tuple(UNIT))
    try:
        scheduler.schedule()
        sent = [tests for tests in SENT if tests]  # every unit handed out, in the order it was
        chain = [
            "tests/test_bench.py::test_accuracy",  # the alone ones first, each file's tests in their order
            "tests/test_case_study.py::test_live",
            "tests/acceptance/test_frameworks.py::test_a",
            "tests/acceptance/test_frameworks.py::test_b",
        ]
        assert chain in sent, sent
        # every file left with unit tests only (test_bench's and test_case_study's measured tests are in the chain)
        # before it, each whole
        assert sorted(test for tests in sent[: sent.index(chain)] for test in tests) == sorted(UNIT), sent
        assert sorted(test for tests in sent for test in tests) == sorted(COLLECTION)
        for tests in sent:  # every other unit is one file's tests
            assert tests == chain or len({test.split("::")[0] for test in tests}) == 1, tests
    finally:
        remove_plan(os.getpid())
    assert not plan_path(os.getpid()).exists()


def test_an_alone_test_that_lowers_its_turn_ends_the_head_of_the_chain():
    """An ``alone(then_acceptance=True)`` test (the case study) goes after the other alone tests: lowered, it hands
    over to the acceptance tests, which need no more slots than it then held."""
    live, accuracy = "tests/test_case_study.py::test_live", "tests/test_bench.py::test_accuracy"
    scheduler, _workers = _scheduler(MEASURED, tuple(UNIT), head_last=(accuracy,))
    try:
        scheduler.schedule()
        chain = next(tests for tests in SENT if accuracy in tests)
        assert chain == [
            live,
            accuracy,
            "tests/acceptance/test_frameworks.py::test_a",
            "tests/acceptance/test_frameworks.py::test_b",
        ]
    finally:
        remove_plan(os.getpid())


def test_the_acceptance_tests_that_take_fewer_slots_end_the_chain():
    """A ``load_tolerant`` test takes one slot and lets two shared tests in: an acceptance test after it would wait for
    one of them to end, so those go last (each file's tests in their order)."""
    tolerant = "tests/acceptance/test_frameworks.py::test_a"
    scheduler, _workers = _scheduler(MEASURED, tuple(UNIT), chain_last=(tolerant,))
    try:
        scheduler.schedule()
        chain = next(tests for tests in SENT if tolerant in tests)
        assert chain == [
            "tests/test_bench.py::test_accuracy",
            "tests/test_case_study.py::test_live",
            "tests/acceptance/test_frameworks.py::test_b",
            tolerant,
        ]
    finally:
        remove_plan(os.getpid())


def test_without_a_plan_it_hands_out_whole_files():
    scheduler, workers = _scheduler({})
    plan_path(os.getpid()).unlink()
    scheduler.schedule()
    units = [tests for worker in workers for tests in worker.sent]
    assert MEASURED_UNIT not in scheduler.workqueue
    assert sorted(test for tests in units for test in tests) == sorted(COLLECTION)
    assert all(len({test.split("::")[0] for test in tests}) == 1 for tests in units)


def test_after_the_chain_the_longest_file_goes_first_and_a_file_without_a_cost_is_guessed_by_its_tests():
    units = {
        "tests/test_model.py": {"tests/test_model.py::test_1": False},
        MEASURED_UNIT: {"tests/test_case_study.py::test_live": False},
        "tests/test_short.py": {"tests/test_short.py::test_1": False},
        "tests/test_long.py": {"tests/test_long.py::test_1": False},
        "tests/test_new.py": {f"tests/test_new.py::test_{i}": False for i in range(2)},  # 2 shared tests: 6 s guessed
        "tests/test_new_units.py": {"tests/test_new_units.py::test_1": False, "tests/test_new_units.py::test_2": False},
    }
    unit = {"tests/test_model.py::test_1", "tests/test_new_units.py::test_1"}
    costs = {"tests/test_short.py": 2.0, "tests/test_long.py": 90.0, "tests/test_model.py": 0.5}
    assert hand_out_order(units, unit, costs, units_first=False) == [
        MEASURED_UNIT,
        "tests/test_long.py",
        "tests/test_new.py",
        "tests/test_new_units.py",
        "tests/test_short.py",
        "tests/test_model.py",  # without the CPU priority a unit file goes by its cost too
    ]
    assert hand_out_order(units, unit, costs) == [
        "tests/test_model.py",
        MEASURED_UNIT,
        "tests/test_long.py",
        "tests/test_new.py",
        "tests/test_new_units.py",  # one unit test (0.1 s) and one shared (3 s)
        "tests/test_short.py",
    ]


def test_the_committed_costs_name_test_files_that_exist(tmp_path):
    costs = read_file_costs()
    assert costs and all(seconds >= 0 for seconds in costs.values())
    root = Path(__file__).resolve().parent.parent
    missing = [name for name in costs if not (root / name).is_file()]
    assert not missing, f"tests/harness/file_costs.json names files that are gone: {missing} (scripts/test_costs.py --file-costs)"
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert read_file_costs(tmp_path / "bad.json") == read_file_costs(tmp_path / "absent.json") == {}


def test_file_costs_sum_each_files_shared_tests_and_leave_the_chain_out():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    try:
        import test_costs
    finally:
        sys.path.pop(0)
    rows = [
        {"test": "tests/test_a.py::test_1", "lane": "integration", "wall_s": 2.0, "measured": False},
        {"test": "tests/test_a.py::test_2", "lane": "integration", "wall_s": 30.0, "measured": True},  # in the chain
        {"test": "tests/test_b.py::test_1", "lane": "unit", "wall_s": 0.25, "measured": False},
        {"test": "tests/test_b.py::test_2", "lane": "unit", "wall_s": 0.25, "measured": False},
        {"test": "tests/test_c.py::test_1", "lane": "acceptance", "wall_s": 9.0},  # an older line: by its lane
        {"test": "tests/test_c.py::test_2", "lane": "integration", "wall_s": 5.0},
    ]
    costs = test_costs.file_costs(rows)
    assert costs == {"tests/test_c.py": 5.0, "tests/test_a.py": 2.0, "tests/test_b.py": 0.5}
    assert list(costs) == ["tests/test_c.py", "tests/test_a.py", "tests/test_b.py"]  # the longest first

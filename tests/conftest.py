"""Fixtures shared by every test, and the suite's three lanes.

Every test runs in exactly one lane, named by its marker (docs/development.md, Lanes):

- ``unit`` (the default): pure code over the simulated machine, a ManualClock and recorded histories.  A unit
  test whose call takes over `UNIT_BUDGET_S` fails (`pytest_runtest_makereport` below).
- ``integration``: real processes, py-spy, ptrace, ptys, Prometheus, mpirun, Textual's pilot.  They assert
  structure and counts, never rates or durations.
- ``acceptance``: live training jobs and the statistical series, in tests/acceptance/.

A test says its lane with the marker; without one, `lane_of` decides it from what the test depends on, so a
new file lands in a sane lane: tests/acceptance/ is acceptance; tests/tui/ (Textual's pilot), a test that asks
for a fixture starting real processes (`INTEGRATION_FIXTURES`), one marked ``slow`` or in
`INTEGRATION_MODULES` is integration; the rest is unit.  ``slow`` keeps its meaning (the quick lane is
``-m "not slow"``): every acceptance test is also ``slow``.
"""

import functools
import json
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.harness.attach import Observer
from tests.harness.cpu_priority import CpuPriority
from tests.harness.measured_chain import plan_path, remove_plan, write_plan
from tests.harness.processes import Spawner
from tests.harness.turns import Turns, turns_directory

LANES = ("unit", "integration", "acceptance")
UNIT_BUDGET_S = 2.0  # on the reference box of gputop.sim.cpu_speed; scaled by this box's slowness (`unit_budget_s`)
COLLECTED = pytest.StashKey[list]()  # every test collected, before -m and -k deselect
_LANE = pytest.StashKey[str]()
_WAITED = pytest.StashKey[float]()  # the call's wait for a CPU (see pytest_runtest_call)
TESTS = Path(__file__).resolve().parent
# fixtures that start real processes, attach py-spy or ptrace, or serve on a socket (a fixture that uses one
# of these counts too: pytest lists the whole closure in item.fixturenames)
INTEGRATION_FIXTURES = frozenset({"spawn", "observe", "demo", "prom"})
# modules whose tests drive real processes, servers, terminals, torch or tools without one of those fixtures
# (subprocess, HTTP on loopback, ruff and mypy, the installed interpreters); a single test elsewhere that
# does (Textual's pilot in a module of pure rules) carries the integration marker itself
INTEGRATION_MODULES = frozenset(
    {
        "test_check.py",
        "test_cli.py",
        "test_demo_cuda.py",
        "test_drills.py",
        "test_fleet.py",
        "test_fleet_scale.py",  # a 64- and 256-node fleet's series, built once for the module: ~3 s in its first test
        "test_function_length.py",  # parses the whole package, as ruff and mypy read it: 1.3 s of CPU, 2.02 s in a CI run
        "test_harness.py",
        "test_heap.py",
        "test_mig.py",
        "test_preinstalled_nvml.py",
        "test_python_versions.py",
        "test_report.py",
        "test_safepoint.py",
        "test_serve.py",
        "test_snapshot_cli.py",
        "test_static_checks.py",
        "test_trace.py",
    }
)


def lane_of(item: pytest.Item) -> str:
    """The lane a test runs in: its own marker, else what it depends on (see the module docstring)."""
    named = [lane for lane in LANES if item.get_closest_marker(lane) is not None]
    if len(named) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(named)}: a test runs in one lane; keep one marker")
    if named:
        return named[0]
    path = Path(str(item.path)).resolve()
    folders = path.relative_to(TESTS).parts[:-1] if path.is_relative_to(TESTS) else ()
    if folders[:1] == ("acceptance",):
        return "acceptance"
    if (
        folders[:1] == ("tui",)
        or path.name in INTEGRATION_MODULES
        or item.get_closest_marker("slow") is not None
        or INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    ):
        return "integration"
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before -m deselects: `-m unit` must see the markers added here
def pytest_collection_modifyitems(config, items):
    config.stash[COLLECTED] = list(items)  # every test collected, before -m and -k deselect (tests/test_lanes.py)
    for item in items:
        lane = lane_of(item)
        item.add_marker(lane)
        if lane == "acceptance":
            item.add_marker("slow")
        item.stash[_LANE] = lane


def _cpu_wait_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (schedstat's 2nd field; 0 where the kernel
    keeps no schedstats)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    # The budget is the test's, not the box's: the time the test's thread was kept off a CPU by other load (a
    # shared 2-core box) is not counted.  Only that thread's: a pool thread's wait may not be on the test's path.
    before = _cpu_wait_s()
    try:
        return (yield)
    finally:
        item.stash[_WAITED] = _cpu_wait_s() - before


_BUDGET: list[float] = []


def unit_budget_s() -> float:
    """The unit lane's budget on this box: 2 s on the reference box, more on a slower one (a CI VM ran the same
    Python 4.4 times slower than a developer's box on one day): measured once a session with the demo's own
    fixed workload, never less than 2 s.  A test that needs more is slow code, not a slow box."""
    if not _BUDGET:
        from gputop.sim.cpu_speed import measured_slowness

        _BUDGET.append(UNIT_BUDGET_S * max(1.0, measured_slowness()))
    return _BUDGET[0]


def slowness_now() -> float:
    """The box's slowness at this moment, on the same workload as `unit_budget_s`, counting only the time this
    thread ran (its waits for a CPU left out, as a test's are): a box whose other load thrashes the caches and
    the memory bus runs the same code slower while it runs.  The median of five, as measured_slowness."""
    from gputop.sim.cpu_speed import measured_slowness, workload_s

    if os.environ.get("GPUTOP_LANE_SLOWNESS_NOW"):  # tests/test_lanes.py: a box read as slow, on purpose
        return float(os.environ["GPUTOP_LANE_SLOWNESS_NOW"])

    def ran_s() -> float:
        waited = _cpu_wait_s()
        took = workload_s()
        return took - (_cpu_wait_s() - waited)

    return measured_slowness(ran_s)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when != "call" or item.stash.get(_LANE, None) != "unit" or not report.passed:
        return report
    waited = item.stash.get(_WAITED, 0.0)
    took = call.duration - waited
    budget = unit_budget_s()
    if took <= budget:
        return report
    # Over the budget measured at the session's start: measure the box now, once, before failing it.  Not a
    # retry: the test is not run again; the yardstick is read again, and the failure says both readings.
    now = slowness_now()
    budget_now = UNIT_BUDGET_S * max(1.0, now)
    if took <= budget_now:
        return report
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid}: a unit-lane test took {took:.2f} s ({call.duration:.2f} s wall, less {waited:.2f} s waiting "
        f"for a CPU the box's other load held), over the unit lane's {budget:.1f} s ({UNIT_BUDGET_S:.0f} s on the reference box, scaled to this one's speed; "
        f"{budget_now:.1f} s at its speed now, {now:.1f}x the reference): make it cheaper "
        f"(a ManualClock, a recorded history) or mark it integration (tests/conftest.py, lane_of)"
    )
    return report


_TURNS: list[Turns] = []
_PRIORITY: list[Optional[CpuPriority]] = []  # this worker's, once it knows whether the kernel offers one
# Most integration tests wait (a job's start, a report's window): three overlap on 2 cores.  A fourth worker (a third
# shared test beside the chain) made the run slower, not faster (ci22: 20:44 against 19:52, 9% more CPU): with the
# CPU priority on the shared tests are bound by the shared group's CPU, not by their waits
SIDE_BY_SIDE_WORKERS = 3


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): the whole suite, or a folder of it, runs side by side; a run that names
    test files or tests runs in this process (three workers' start-up would cost more than they save).
    PYTEST_XDIST_AUTO_NUM_WORKERS still decides where it is set (``=0``: one process)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    named = [arg.split("::")[0] for arg in config.args]
    return 0 if any(not Path(arg).is_dir() for arg in named) else SIDE_BY_SIDE_WORKERS


def turn_of(item: pytest.Item, prioritized: bool) -> tuple[int, bool]:
    """(slots, measured): how many of the run's side-by-side slots a test takes while it runs, and whether it takes
    the measured turn (one acceptance or alone test at a time; tests/harness/turns.py).

    - ``alone`` (its bar is the CPU it gets, or a deadline): all the slots, nothing beside it.  One marked
      ``alone(unless_prioritized=True)`` (its bar needs the CPU it asks for, not the box's other readings) takes
      the measured turn and one slot where the shared tests run at a lower priority, as an acceptance test;
    - acceptance (live jobs judged by shares and verdicts): one slot where the shared tests beside it run at a lower
      CPU priority (`prioritized`, tests/harness/cpu_priority.py), else all but one (one shared test beside it).
      One marked ``load_tolerant`` (a verdict more load can only confirm: a hang, a starved loader) takes one slot
      either way;
    - the rest: one slot, at the lower priority where there is one.

    One marked ``alone(then_acceptance=True)`` starts alone and lowers its own turn to an acceptance test's once
    its measured part is done (the `lower_turn` fixture); it ends the chain's head (tests/harness/measured_chain.py)."""
    alone = item.get_closest_marker("alone")
    if alone is not None:
        return (1, True) if prioritized and alone.kwargs.get("unless_prioritized") else (SIDE_BY_SIDE_WORKERS, True)
    if item.stash.get(_LANE, None) == "acceptance":
        return (1 if item.get_closest_marker("load_tolerant") else acceptance_slots(prioritized)), True
    return 1, False


def acceptance_slots(prioritized: bool) -> int:
    """An acceptance test's slots: one where the shared tests beside it run at a lower CPU priority, else all but
    one (one shared test beside it)."""
    return 1 if prioritized else SIDE_BY_SIDE_WORKERS - 1


def lowers_its_turn(item: pytest.Item) -> bool:
    alone = item.get_closest_marker("alone")
    return alone is not None and bool(alone.kwargs.get("then_acceptance"))


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        # a side-by-side worker has no terminal, yet runs with COLUMNS=80 LINES=24 in its environment; every TUI
        # a test starts in a pty of its own would take them over the pty's size (rich reads them first)
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)


def pytest_addoption(parser):
    parser.addoption(
        "--test-costs",
        metavar="FILE",
        help="append one JSON line a test to FILE: its lane, its wall seconds (setup, call and teardown), the "
        "seconds it waited for its side-by-side turn, its CPU seconds (this process's and its reaped "
        "children's), when it ended and on which worker; scripts/test_costs.py sums them per lane",
    )


def keeps_turn(item: pytest.Item, nextitem: Optional[pytest.Item], prioritized: bool) -> bool:
    """Whether a worker keeps its slots from `item` to `nextitem`: both ``alone`` (tests/harness/turns.py)."""
    alone = (SIDE_BY_SIDE_WORKERS, True)
    return nextitem is not None and turn_of(item, prioritized) == turn_of(nextitem, prioritized) == alone


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # setup, call and teardown inside one turn: a module fixture's jobs start in its first test's setup
    workerinput = getattr(item.config, "workerinput", None)
    asked = item.config.getoption("--test-costs", None)
    before, asked_at = os.times(), time.monotonic()
    if workerinput is not None:
        _join_run(workerinput["testrunuid"])
    turns = _TURNS[0] if workerinput is not None else None  # one process: nobody to share the CPUs with, no turn
    priority = _PRIORITY[0] if _PRIORITY else None
    measured = False
    if turns is not None:
        slots, measured = turn_of(item, priority is not None)
        turns.hold(slots, measured)
        if priority is not None:
            # what the test starts from here on inherits the group: an alone test's jobs among the box's sessions
            # (nothing beside them), a measured test's in its group, a shared test's in the group beside it
            if slots == turns.slots:
                priority.restore()
            elif measured or item.stash.get(_LANE, None) == "unit":
                # a unit test beside a measured one (a file that mixes lanes; the unit-only files run before the
                # chain, tests/harness/measured_chain.py): seconds of pure code whose budget the starved group's
                # fifth of the box would break; as much weight as the measured test, for those seconds
                priority.measure()
            else:
                priority.lower()
    started = time.monotonic()
    try:
        return (yield)
    finally:
        if turns is not None and not keeps_turn(item, nextitem, priority is not None):
            turns.release()
        if asked:
            _write_costs(asked, item, before, asked_at, started, measured)


def _join_run(run_id: str) -> None:
    """A worker's turns and CPU priority, once."""
    if not _TURNS:
        _TURNS.append(Turns(turns_directory(run_id), slots=SIDE_BY_SIDE_WORKERS))
        _PRIORITY.append(CpuPriority.for_run(run_id))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist tells the controller this worker has collected
def pytest_collection_finish(session):
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None:
        return
    _join_run(workerinput["testrunuid"])
    prioritized = _PRIORITY[0] is not None
    turns = {item.nodeid: turn_of(item, prioritized) for item in session.items}
    write_plan(
        plan_path(os.getppid()),  # the controller started the workers
        {nodeid: slots == SIDE_BY_SIDE_WORKERS for nodeid, (slots, measured) in turns.items() if measured},
        [item.nodeid for item in session.items if item.stash.get(_LANE, None) == "unit"],
        units_first=prioritized,
        head_last=[item.nodeid for item in session.items if lowers_its_turn(item)],
        chain_last=[nodeid for nodeid, (slots, measured) in turns.items() if measured and slots < acceptance_slots(prioritized)],
    )


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """Side by side, one worker runs the measured tests one after another (tests/harness/measured_chain.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.harness.measured_chain import MeasuredChainScheduling

    return MeasuredChainScheduling(config, log)


def pytest_unconfigure(config):
    if _PRIORITY and _PRIORITY[0] is not None:
        _PRIORITY[0].remove()  # the last worker out removes the groups
    if not hasattr(config, "workerinput"):
        remove_plan(os.getpid())


@pytest.fixture(scope="session")
def box_to_itself():
    """`with box_to_itself():` a block of a measured test that needs every slot (no test beside it, at any
    priority): a benchmark whose cap counts the box's idle cores.  A no-op outside xdist, or where the test
    holds every slot already."""

    @contextmanager
    def block() -> Iterator[None]:
        turns = _TURNS[0] if _TURNS else None
        if turns is None or turns.held == turns.slots:
            yield
            return
        held, measured = turns.held, turns.measuring
        turns.hold(turns.slots, measured)
        try:
            yield
        finally:
            turns.hold(held, measured)

    return block


@pytest.fixture
def lower_turn(request):
    """`lower_turn()`: from here to its end, an ``alone(then_acceptance=True)`` test runs as an acceptance test
    (the measured turn, one shared test beside it): its measured part is done, and
    what is left (live jobs that barely use the CPU, whose verdicts an acceptance test's turn keeps) need not hold
    the box idle.  A no-op outside xdist, or for a test not so marked."""

    return functools.partial(lower_to_acceptance, request.node)


def lower_to_acceptance(item: pytest.Item) -> None:
    """`lower_turn`'s work: this worker's turn for `item` lowered, if it is so marked, to an acceptance test's where
    there is no CPU priority: one shared test beside it.  Where there is, the same: the test's processes run among
    the box's sessions (it began alone), not in the measured group, and two shared tests beside the case study's
    stage 3 at the lower priority still made it read "CPU preprocessing" (ci31, load 10.6)."""
    turns = _TURNS[0] if _TURNS else None
    if turns is None or not turns.measuring or not lowers_its_turn(item):
        return
    turns.hold(acceptance_slots(prioritized=False), measured=True)


def _write_costs(path: str, item: pytest.Item, before: os.times_result, asked_at: float, started: float, measured: bool) -> None:
    after = os.times()
    line = {
        "test": item.nodeid,
        "lane": item.stash.get(_LANE, None),
        "wall_s": round(time.monotonic() - started, 3),
        "turn_wait_s": round(started - asked_at, 3),
        "cpu_s": round(after.user - before.user + after.system - before.system, 3),
        "children_cpu_s": round(after.children_user - before.children_user + after.children_system - before.children_system, 3),
        "ended_at": round(time.time(), 3),  # a timeline of the run: which tests ran beside which
        "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
        "measured": measured,  # in the measured chain (scripts/test_costs.py --file-costs leaves those out)
    }
    with open(path, "a") as f:  # one short append a test: the side-by-side workers' lines do not interleave
        f.write(json.dumps(line) + "\n")


# A shell starts a background job (`pytest &`, a CI step run in the background) with SIGINT ignored, and
# an ignored signal is inherited: every `gputop record` the tests start would then ignore the Ctrl-C they
# send it.  A Python handler is not inherited across exec, so with one installed here the children get
# SIGINT's default, as they do when pytest runs in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _hang_up_ignored(signum, frame) -> None:
    """SIGHUP, ignored as `nohup` asked, in this process only (see below)."""


# `nohup python -m pytest` (or `nohup .ci/run`) ignores SIGHUP, and every process the tests start would inherit
# that: the TUI's stop-signal test then sends a SIGHUP that nothing hears, and the monitor exits only when the
# test closes its terminal (code 1, not 129).  A Python handler that does nothing keeps this run up on a hang-up,
# as nohup asked, while the children get SIGHUP's default, as they do when started from a terminal.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, _hang_up_ignored)


@pytest.fixture(scope="session", autouse=True)
def advice_memory_of_this_run(tmp_path_factory):
    """gputop keeps the workers it advised per job under $XDG_STATE_HOME (gputop/advice_memory.py): the tests
    and every gputop they start keep theirs in this run's temporary directory, not the box's home."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield


@pytest.fixture
def spawn():
    """Start processes (own session); every one, and its process group, is killed and reaped at teardown."""
    spawner = Spawner()
    try:
        yield spawner
    finally:
        spawner.reap_all()


@pytest.fixture
def observe():
    """observe(pid) attaches a real pipeline to `pid` (an Observer); every one is closed at teardown."""
    observers = []

    def make(pid):
        obs = Observer(pid)
        observers.append(obs)
        return obs

    yield make
    for obs in observers:
        obs.close()


@pytest.fixture
def demo():
    """`demo(scenario, **DemoJob kwargs) -> (job, pipeline)`; every job started is stopped at teardown."""
    from tests.harness.demo import DemoJobs  # imports the pipeline: only for the tests that start a demo

    jobs = DemoJobs()
    try:
        yield jobs.start
    finally:
        jobs.stop_all()

"""The suite's three lanes (tests/conftest.py): every test runs in exactly one, and a unit test over its budget fails."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import COLLECTED, INTEGRATION_FIXTURES, LANES, TESTS, UNIT_BUDGET_S, unit_budget_s

# The two sample tests below run only inside test_a_unit_test_over_its_budget_fails_and_an_integration_one_does_not.
SAMPLES = os.environ.get("GPUTOP_LANE_SAMPLES") == "1"
samples_only = pytest.mark.skipif(not SAMPLES, reason="a sample for the lane hook's own test")


def test_every_collected_test_runs_in_exactly_one_lane_and_by_what_it_depends_on(request):
    items = request.config.stash[COLLECTED]  # all collected, not only what -m or -k selected
    assert request.node in items
    for item in items:
        lanes = [lane for lane in LANES if item.get_closest_marker(lane) is not None]
        assert len(lanes) == 1, f"{item.nodeid}: lanes {lanes}"
        folder = Path(str(item.path)).resolve().relative_to(TESTS).parts[:-1]
        if folder[:1] == ("acceptance",):
            assert lanes == ["acceptance"] and item.get_closest_marker("slow") is not None, item.nodeid
        if lanes == ["acceptance"]:
            assert item.get_closest_marker("slow") is not None, f"{item.nodeid}: acceptance, but `-m 'not slow'` runs it"
        if lanes == ["unit"]:
            assert not INTEGRATION_FIXTURES.intersection(item.fixturenames), f"{item.nodeid} starts processes"
            assert folder[:1] != ("tui",) and item.get_closest_marker("slow") is None, item.nodeid


@samples_only
def test_sample_unit_test_that_takes_longer_than_the_budget():
    threading.Event().wait(unit_budget_s() + 0.5)  # the work being timed, not synchronisation


@samples_only
@pytest.mark.integration
def test_sample_integration_test_that_takes_as_long():
    threading.Event().wait(unit_budget_s() + 0.5)


def test_a_unit_test_over_its_budget_fails_and_an_integration_one_does_not(spawn):
    proc = spawn(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", "-k", "sample", __file__],
        env={
            **{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
            "GPUTOP_LANE_SAMPLES": "1",
            "GPUTOP_LANE_SLOWNESS_NOW": "1",
        },  # the box read as the reference now: the second reading cannot excuse the sample
        cwd=str(TESTS.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = proc.communicate(timeout=120)
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "FAILED tests/test_lanes.py::test_sample_unit_test_that_takes_longer_than_the_budget" in out, out[-3000:]
    assert f"({UNIT_BUDGET_S:.0f} s on the reference box, scaled to this one's speed; " in out, out[-3000:]
    assert "x the reference): make it cheaper" in out, out[-3000:]  # the box read again before failing it


def test_a_unit_test_over_its_budget_on_a_box_slower_now_than_at_the_start_passes_and_only_then(spawn):
    """The budget is read again before a test fails it: where the box runs the same workload 8 times slower now
    than the reference (other load thrashing its caches), the sample's wait of its start budget + 0.5 s is inside
    16 s; the integration sample is not judged.  Without the second reading it fails (the test above)."""
    proc = spawn(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "sample", __file__],
        env={
            **{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
            "GPUTOP_LANE_SAMPLES": "1",
            "GPUTOP_LANE_SLOWNESS_NOW": "8",
        },
        cwd=str(TESTS.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = proc.communicate(timeout=120)
    assert "2 passed" in out and "failed" not in out, out[-3000:]

"""The dense sampler measures what py-spy costs on this machine and keeps a report's sampling within its CPU
budget: real py-spy on a real child process (`gputop.collect.state_sampler`)."""

from __future__ import annotations

import sys

import pytest

from gputop.collect.stacks import find_py_spy
from gputop.collect.state_sampler import FOCUSED, MIN_RATE_HZ, PRIOR_COST_PER_SAMPLE_S, StateSampler
from tests.harness.processes import wait_until

LOOP = "import time\nwhile True:\n    sum(range(2000))\n    time.sleep(0.001)\n"


@pytest.mark.slow
def test_a_stretch_measures_py_spys_cost_and_the_next_rate_keeps_within_the_budget(spawn):
    py_spy = find_py_spy()
    assert py_spy, "py-spy is in the package's dependencies"
    child = spawn([sys.executable, "-c", LOOP])
    sampler = StateSampler(py_spy)
    try:
        sampler.focus(True)
        sampler.follow([child.pid])
        delivered: list = []

        def a_costed_stretch():
            delivered.extend(sampler.take())
            return sampler.cost_per_sample_s != PRIOR_COST_PER_SAMPLE_S and delivered

        wait_until(a_costed_stretch, timeout=30, interval=0.2, what="a finished stretch whose cost was measured")
    finally:
        sampler.close()
    cost = sampler.cost_per_sample_s
    # halfway from the prior to the measured cost: 15 µs to 10 ms a sample covers any machine py-spy runs on
    assert 15e-6 < cost < 0.01, cost
    assert delivered[0].error is None and sum(n for _, n in delivered[0].runs) >= 100, delivered[0]
    rate = sampler.rate(FOCUSED)
    assert rate == MIN_RATE_HZ or rate * cost <= FOCUSED.cores(sampler.usable_cores) * 1.001, (rate, cost)
    assert rate == min(FOCUSED.per_rank_hz, int(FOCUSED.cores(sampler.usable_cores) / cost)) or rate == MIN_RATE_HZ

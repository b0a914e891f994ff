import pytest

from tests.harness.attach import Observer
from tests.harness.processes import Spawner


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

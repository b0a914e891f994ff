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

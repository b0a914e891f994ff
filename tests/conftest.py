import pytest

from tests.harness.processes import Spawner


@pytest.fixture
def spawn():
    """Start processes (own session); every one, and its process group, is killed and reaped at teardown."""
    spawner = Spawner()
    try:
        yield spawner
    finally:
        spawner.reap_all()

import os
import signal

import pytest

from tests.harness.attach import Observer
from tests.harness.processes import Spawner

# A shell starts a background job (`pytest &`, a CI step run in the background) with SIGINT ignored, and
# an ignored signal is inherited: every `gputop record` the tests start would then ignore the Ctrl-C they
# send it.  A Python handler is not inherited across exec, so with one installed here the children get
# SIGINT's default, as they do when pytest runs in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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

"""The quiet input thread (gputop/tui/input_thread.py): keys and a lone Escape still arrive, stopping is
prompt, and between keys the thread sleeps instead of waking ten times a second."""

from __future__ import annotations

import os
import selectors
import threading
import time
import tty

import pytest
from textual import events
from textual.drivers.headless_driver import HeadlessDriver
from textual.drivers.linux_driver import LinuxDriver

from gputop.tui.input_thread import quiet_driver
from tests.harness.tui import build_app


def _switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as fh:
        for line in fh:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def _wait_until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class _Recording:
    """The quiet driver's input thread on a pseudo-terminal we type into; events are kept, not posted."""

    def __init__(self, driver_class: type) -> None:
        recorded: list = []
        self.events = recorded

        class Recording(driver_class):  # type: ignore[misc, valid-type]
            def process_message(self, message) -> None:
                recorded.append(message)

        self.master, slave = os.openpty()
        tty.setraw(slave)  # as the driver's start_application_mode leaves the terminal
        self.driver = Recording(build_app(1)[0])
        self.driver.fileno = slave
        self._slave = slave
        self.thread = threading.Thread(target=self.driver.run_input_thread, daemon=True)
        self.thread.start()

    def keys(self) -> list[str]:
        return [e.key for e in self.events if isinstance(e, events.Key)]

    def close(self) -> None:
        self.driver.exit_event.set()
        self.thread.join(5)
        self.driver.close()
        os.close(self.master)
        os.close(self._slave)


def test_the_quiet_driver_replaces_only_textuals_linux_driver():
    quiet = quiet_driver(LinuxDriver)
    assert issubclass(quiet, LinuxDriver) and quiet is not LinuxDriver
    assert quiet_driver(HeadlessDriver) is HeadlessDriver  # run_test, and any other driver, stay Textual's


@pytest.mark.parametrize("driver_class", [quiet_driver(LinuxDriver)], ids=["quiet"])
@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
async def test_keys_arrive_stopping_is_prompt_and_the_thread_sleeps_between_keys(driver_class, monkeypatch):
    # (async: a Textual driver is made inside a running event loop; the input thread itself needs none)
    selects: list = []  # the timeout of each select() the input thread makes (nothing else here uses this selector)
    real_select = selectors.SelectSelector.select

    def recorded(self, timeout=None):
        selects.append(timeout)
        return real_select(self, timeout)

    monkeypatch.setattr(selectors.SelectSelector, "select", recorded)
    recording = _Recording(driver_class)
    try:
        os.write(recording.master, b"q")
        _wait_until(lambda: recording.keys() == ["q"], "the key q")

        # idle: Textual's own loop wakes every 0.1 s (about 20 switches in 2 s); this one sleeps
        before = _switches(recording.thread.native_id)
        time.sleep(2.0)
        idle_switches = _switches(recording.thread.native_id) - before
        assert idle_switches <= 2, f"the input thread woke {idle_switches} times in 2 s with no input"

        # a lone ESC is the Escape key once the parser's short wait for the rest of a sequence is over
        os.write(recording.master, b"\x1b")
        _wait_until(lambda: recording.keys() == ["q", "escape"], "the Escape key", timeout=2.0)

        # stopping is prompt: the thread waits in a select() without a timeout, so no tick notices exit_event; the
        # stop pipe wakes it at once (5 s is a deadline, not a bar)
        _wait_until(lambda: selects[-1:] == [None], "the thread to wait for input or the stop pipe alone")
        recording.driver.exit_event.set()
        recording.thread.join(5)
        assert not recording.thread.is_alive()
    finally:
        recording.close()

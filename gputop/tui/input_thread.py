"""Textual's terminal input thread without its ten wake-ups a second.

Textual 8's `LinuxDriver` reads the terminal in a thread that wakes every 0.1 s (a `select` with a
timeout) to see whether it should stop, and whether a lone ESC has waited long enough to be the
Escape key.  A monitor sits for hours at one frame a second, and those wake-ups were a tenth of its
CPU (0.10% of a core out of 1.0%, measured per thread at 1 Hz with 8 simulated GPUs).

`quiet_driver(LinuxDriver)` is a subclass whose input thread blocks until there is input, until the
parser's own ESC deadline is due, or until the driver is asked to stop (its stop event also writes
to a pipe the thread watches).  Otherwise it is Textual's loop line for line.  It is used only where
Textual's driver is the one it was written for (`_fits`), else Textual's own driver runs unchanged.
"""

from __future__ import annotations

import os
import selectors
import threading
from codecs import getincrementaldecoder
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from textual.driver import Driver
    from textual.drivers.linux_driver import LinuxDriver


class _WakingEvent(threading.Event):
    """A threading.Event whose set() also makes a pipe readable, so a thread in select() sees it."""

    def __init__(self, wake_fd: int) -> None:
        super().__init__()
        self._wake_fd = wake_fd

    def set(self) -> None:
        super().set()
        try:
            os.write(self._wake_fd, b"\0")
        except OSError:  # the pipe is full (the thread is awake anyway) or already closed
            pass


def _fits(driver_class: type) -> bool:
    """Textual's LinuxDriver as this was written for: an input thread, an exit event and the
    parser's ESC deadline where `_run_quietly` reads them."""
    try:
        from textual._time import get_time  # noqa: F401
        from textual._xterm_parser import XTermParser
        from textual.drivers.linux_driver import LinuxDriver
    except ImportError:  # pragma: no cover - Textual moved them
        return False
    return (
        driver_class is LinuxDriver
        and callable(getattr(LinuxDriver, "run_input_thread", None))
        and callable(getattr(LinuxDriver, "process_message", None))
        and hasattr(XTermParser(False), "_timeout_time")
    )


def quiet_driver(driver_class: type[Driver]) -> type[Driver]:
    """A subclass of Textual's LinuxDriver with the quiet input thread, or `driver_class` itself when it
    is another driver (Windows, headless, one set with TEXTUAL_DRIVER) or a Textual this does not fit."""
    if not _fits(driver_class):
        return driver_class

    from textual.drivers.linux_driver import LinuxDriver

    class QuietLinuxDriver(LinuxDriver):  # `driver_class` is LinuxDriver (`_fits`)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self.exit_event = _WakingEvent(self._wake_write)

        def close(self) -> None:
            super().close()
            for fd in (self._wake_read, self._wake_write):
                try:
                    os.close(fd)
                except OSError:
                    pass

        def run_input_thread(self) -> None:
            """Textual's LinuxDriver.run_input_thread, waiting on input, the ESC deadline or the stop pipe
            instead of waking every 0.1 s."""
            _run_quietly(self, self._wake_read)

    QuietLinuxDriver.__name__ = QuietLinuxDriver.__qualname__ = "QuietLinuxDriver"
    return QuietLinuxDriver


def _drain(fd: int) -> None:
    """Read a non-blocking pipe empty (the wake-ups written to it)."""
    try:
        while os.read(fd, 64):
            pass
    except OSError:  # drained (EAGAIN)
        pass


def _run_quietly(driver: LinuxDriver, wake_read: int) -> None:
    """The body of LinuxDriver.run_input_thread for `driver`, line for line but for the wait: until input, the
    parser's ESC deadline, or a byte on `wake_read` (the driver's exit event was set)."""
    from textual._loop import loop_last
    from textual._parser import ParseError
    from textual._time import get_time
    from textual._xterm_parser import XTermParser

    selector = selectors.SelectSelector()
    selector.register(driver.fileno, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    fileno = driver.fileno
    EVENT_READ = selectors.EVENT_READ

    parser = XTermParser(driver._debug)
    feed = parser.feed
    tick = parser.tick

    decode = getincrementaldecoder("utf-8")().decode
    read = os.read

    def next_wait() -> Optional[float]:
        due = parser._timeout_time  # a lone ESC waits this long for the rest of a sequence
        return None if due is None else max(0.0, due - get_time())

    def process_selector_events(selector_events: list[tuple[selectors.SelectorKey, int]], final: bool = False) -> None:
        events = []
        for key, mask in selector_events:
            if key.fd == wake_read:
                _drain(wake_read)
            else:
                events.append((key, mask))
        for last, (_selector_key, mask) in loop_last(events):
            if mask & EVENT_READ:
                unicode_data = decode(read(fileno, 1024 * 4), final=final and last)
                if not unicode_data:
                    # This can occur if the stdin is piped
                    break
                for event in feed(unicode_data):
                    driver.process_message(event)
        for event in tick():
            driver.process_message(event)

    try:
        while not driver.exit_event.is_set():
            process_selector_events(selector.select(next_wait()))
        selector.unregister(driver.fileno)
        process_selector_events(selector.select(0.1), final=True)
    finally:
        selector.close()
        try:
            for _event in feed(""):
                pass
        except (EOFError, ParseError):
            pass

"""The signals that end gputop the way Ctrl-C or q does, for the headless commands and the monitor alike."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Callable, Optional, Union

# what signal.signal() returns and takes: a handler, SIG_DFL / SIG_IGN, or None (one not set from Python)
SignalHandler = Union[Callable[[int, Optional[FrameType]], Any], int, None]

# `kill PID` (SIGTERM) and a closed SSH session (SIGHUP) end a watch the way Ctrl-C does: what was
# collected is kept (the recording's last line, the report), instead of the process dying mid-write.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """While active, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as Ctrl-C does.
    SIGINT is left as it is: a shell starts a background job (`gputop record ... &`) with it ignored, on
    purpose, and that choice is the user's."""

    def __enter__(self) -> "StopSignals":
        self._previous: dict[int, SignalHandler] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._interrupt)
        return self

    @staticmethod
    def _interrupt(signum: int, _frame: Optional[FrameType]) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

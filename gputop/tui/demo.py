"""The TUI over a demo's source (`gputop demo`, its case study), until q or --seconds.  Textual is loaded only
when it runs: a headless demo never loads it."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from gputop.errors import GputopError

if TYPE_CHECKING:
    from gputop.source import Source


def run_tui(source: "Source", args: Any, *, subtitle: str, failure: Callable[[], Optional[str]]) -> int:
    """The TUI on a demo's `source` until q (or --seconds); then the job's `failure()`, if any, as the one line."""
    from gputop.tui.app import run_app  # the core never loads Textual unless the TUI is wanted

    if args.seconds is not None:
        # ends the TUI the way SIGTERM does (see StopSignals), from outside its event loop
        timer = threading.Timer(args.seconds, signal.raise_signal, (signal.SIGTERM,))
        timer.daemon = True
        timer.start()
    try:
        code = run_app(source, interval=args.interval, subtitle=subtitle)
    except KeyboardInterrupt:
        code = 0
    failed = failure()
    if failed:
        raise GputopError(failed)
    return code

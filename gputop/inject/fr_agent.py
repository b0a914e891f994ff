"""The flight recorder agent: runs INSIDE a rank of a torch job and reads its flight recorder once, read-only.

For a job that turned PyTorch's flight recorder on (``TORCH_FR_BUFFER_SIZE``) but writes no dump file, the
recorder lives only in the rank's memory.  gputop copies this file (and ``agent.py``, for its private run
directory's atomic writes) into a private run directory in the rank's filesystem view and injects a one-liner
that starts a daemon thread executing it (`gputop.inject.injector.bootstrap_code`).  The thread calls
``torch._C._distributed_c10d._dump_fr_trace_json()`` once (a copy of the recorder's ring buffer under its own
lock: nothing in the job changes) and answers with ``recorder.json`` (the JSON as torch wrote it) and
``result.json``.  It imports nothing the job has not imported, and prints nothing into the job's output.

The thread is a new one, so it runs whatever the job's main thread is doing: waiting in a collective (a C
call that released the GIL), sleeping in its own code, or blocked in a read.
"""

from __future__ import annotations

import os
import sys
import threading
import time

# For the type checker only: the agent imports nothing at run time that the job has not.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Json = dict[str, Any]

RECORDER_FILE = "recorder.json"
MAX_BYTES = 64 << 20  # gputop reads no more than this (gputop.collect.flight_recorder.MAX_DUMP_BYTES)


def _base(run_path: str) -> dict[str, Any]:
    """The benchmark agent shipped beside this file, executed into a fresh namespace: its `RunDir` and `_one_line`."""
    path = os.path.join(run_path, "agent.py")
    namespace: dict[str, Any] = {"__name__": "gputop_agent_agent", "__file__": path}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), namespace)
    return namespace


def read_recorder(result: Json, run_dir: Any) -> None:
    """One read of the recorder into `RECORDER_FILE`; what went wrong goes into result["error"]."""
    if "torch.distributed" not in sys.modules:
        result["error"] = "the rank has not imported torch.distributed: no flight recorder to read"
        return
    from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]  # (private; absent from the stubs)

    started = time.monotonic()
    data = _dump_fr_trace_json()
    result["read_s"] = round(time.monotonic() - started, 4)
    if len(data) > MAX_BYTES:
        result["error"] = f"the recorder's JSON is {len(data) >> 20} MiB: too large to hand back"
        return
    final = os.path.join(run_dir.path, RECORDER_FILE)
    tmp = f"{final}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, final)
    result["file"] = RECORDER_FILE
    result["bytes"] = len(data)


def live_main(run_path: str) -> None:
    result: Json = {"pid": os.getpid(), "thread": threading.current_thread().name, "started": time.time()}
    run_dir = None
    try:
        base = _base(run_path)
        run_dir = base["RunDir"](run_path)
        try:
            read_recorder(result, run_dir)
        except BaseException as exc:
            result["error"] = f"reading the flight recorder failed: {base['_one_line'](exc)}"
    except BaseException as exc:
        result["error"] = f"the agent could not start: {type(exc).__name__}: {exc}"[:300]
    result["finished"] = time.time()
    if run_dir is not None:
        try:
            run_dir.write_json("result.json", result)
        except OSError:
            pass  # gputop gave up and removed the directory: nobody waits for this


if __name__ == "__gputop_agent__":
    try:
        live_main(os.path.dirname(os.path.abspath(__file__)))
    except BaseException:
        pass

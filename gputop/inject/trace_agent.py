"""The trace agent: runs INSIDE a training process and records one bounded torch.profiler (Kineto) window.

Self-contained on purpose (the target may not have gputop installed): it imports only the standard library,
the torch the job already imported, and the benchmark agent (``agent.py``) that gputop copies next to it.  gputop copies it into a private run directory in the target's
filesystem view, writes ``config.json`` there and injects a one-liner that starts a daemon thread
executing this file (`gputop.inject.injector.bootstrap_code`).  It answers with ``trace.json`` (the Chrome
trace) and ``result.json``; ``progress.json`` while it runs.

The profiler is started and stopped **by the job's own training thread, between two steps**, never by the
agent's thread: Kineto registers the thread that starts it, and a profiler started from a foreign thread
(``profile_all_threads``) crashed a job with SIGSEGV in ``logInvariantViolation`` when the job exited while
it recorded, 5 times in 5.  The step boundary is the entry of ``_BaseDataLoaderIter.__next__`` on the main
thread (the training loop drawing its next batch): the agent replaces that method at class level with a
wrapper (an atomic attribute swap, undone the same way) that, on the main thread only,

1. starts the profiler at the first batch drawn once the agent is ready;
2. counts the batches drawn, and stops the profiler at the first batch past the window (``seconds``, at most
   10, or ``steps`` batches).

The agent's own thread only waits, then exports the stopped profiler's trace.  When the job starts to exit
while the window is open, an ``atexit`` handler (on the main thread, before the interpreter tears anything
down) stops the profiler first and waits for an export in progress, so the job exits as it would have.  When
the window has ended but the loop draws no further batch, the stop is asked of the main thread between two
bytecodes (``Py_AddPendingCall``).  A job that draws no batch on its main thread within the start bound gets
one line saying so, and no trace.  Nothing is printed into the job's stdout or stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

# For the type checker only: the agent imports nothing at run time that the job has not (mypy takes any name
# `TYPE_CHECKING` as true, so `typing` itself need not be imported here).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    Json = dict[str, Any]  # what the agent reads (config.json) and writes (result.json)

MAX_SECONDS = 10.0  # the bound on the window, whatever the config says
START_WAIT_S = 5.0  # the injected one-liner returns in milliseconds; this only guards a stuck start
MEMORY_KEYS = (
    "num_alloc_retries",
    "num_ooms",
    "reserved_bytes.all.current",
    "allocated_bytes.all.current",
    "inactive_split_bytes.all.current",
    "inactive_split.all.current",
    "active_bytes.all.peak",
)


def _sibling(name: str) -> dict[str, Any]:
    """Execute a module shipped next to this file (the benchmark agent) into a fresh namespace."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    namespace: dict[str, Any] = {"__name__": "gputop_agent_" + name.split(".")[0], "__file__": path}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), namespace)
    return namespace


if TYPE_CHECKING:
    from gputop.inject.agent import RunDir, _one_line
else:
    _base = _sibling("agent.py")  # the private run directory's atomic writes and one-line errors, shared
    RunDir = _base["RunDir"]
    _one_line = _base["_one_line"]


START_BOUND_S = 20.0  # how long the agent waits for the loop's next batch to open the window (config: start_bound_s)
STOP_GRACE_S = 3.0  # past the window: how long for the loop's next batch before the stop is asked between bytecodes
PENDING_STOP_S = 5.0  # ... and how long for that: a main thread stuck in C runs no bytecode
PENDING_ASKS = 5  # asks in a row that found the wrapper holding the lock, before giving up
EXPORT_AT_EXIT_S = 30.0  # an exit that meets an export in progress waits this long for it


def memory_stats(torch_mod: ModuleType) -> dict[str, dict[str, object]]:
    """The caching allocator's counters per CUDA device the job initialised ({} without CUDA)."""
    cuda = getattr(torch_mod, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return {}
        out: dict[str, dict[str, object]] = {}
        for device in range(cuda.device_count()):
            stats = cuda.memory_stats(device)
            if stats.get("reserved_bytes.all.current"):
                out[str(device)] = {k: stats.get(k) for k in MEMORY_KEYS}
        return out
    except Exception:
        return {}


def _profiler_enabled(torch_mod: ModuleType) -> bool:
    try:
        return bool(torch_mod._C._autograd._profiler_enabled())
    except Exception:
        return False


KINETO_LEVEL_SYMBOL = "_ZN9libkineto6Logger14severityLevel_E"  # libkineto::Logger::severityLevel_
KINETO_SILENT = 6  # above every level Kineto writes (its USDT lines, 5, print at its default level)


class KinetoQuiet:
    """Kineto writes "USDT: ... profiler_start/stop" into the job's stderr at every start and stop, whatever
    KINETO_LOG_LEVEL says; its minimum level is a plain global in libtorch_cpu.so, raised for our window and
    put back after it (Kineto sets it once, at its first start in a process: it is set again after that)."""

    def __init__(self) -> None:
        self.level: Any = None
        self.before = 0
        try:
            import ctypes

            with open("/proc/self/maps") as f:
                path = next(line.split()[-1] for line in f if line.rstrip().endswith("/libtorch_cpu.so"))
            self.level = ctypes.c_int.in_dll(ctypes.CDLL(path), KINETO_LEVEL_SYMBOL)
        except Exception:  # another build or layout: the lines may show, nothing else changes
            self.level = None

    def hush(self, first: bool) -> None:
        if self.level is not None:
            if first:
                self.before = self.level.value
            self.level.value = KINETO_SILENT

    def after_init(self) -> None:
        """Kineto's first start in a process sets its level: that is the level the job would have."""
        if self.level is not None and self.before == 0 and self.level.value != KINETO_SILENT:
            self.before = self.level.value
        self.hush(False)

    def restore(self) -> None:
        if self.level is not None:
            self.level.value = self.before


ARMED, RECORDING, STOPPED, CANCELLED, EXITING = "armed", "recording", "stopped", "cancelled", "exiting"


class StepBoundaryWindow:
    """A profiler window opened and closed by the job's main thread as it draws a batch.

    ``install`` swaps ``_BaseDataLoaderIter.__next__`` for a wrapper at class level (one attribute store, as
    atomic as its undo in ``restore``).  Every state change happens under ``lock``: by the main thread in the
    wrapper (start, stop), by the agent (cancel), by the exit handler, or by a pending call on the main thread.
    The lock is never held across anything that can block on the job.
    """

    def __init__(self, base_cls: type, make_profiler: Callable[[], Any], seconds: float, steps: int) -> None:
        self.base_cls = base_cls
        self.make_profiler = make_profiler
        self.seconds = seconds
        self.steps = steps
        self.lock = threading.Lock()
        self.state = ARMED
        self.prof: Any = None
        self.error: str | None = None
        self.batches = 0
        self.started_at = 0.0  # time.time() at the start and the stop, for the result
        self.stopped_at = 0.0
        self.end = 0.0  # time.monotonic() when the window's seconds run out
        self.stop_reason = ""
        self.recording = threading.Event()
        self.done = threading.Event()  # the profiler is off again (or never started)
        self.exporting = False
        self.export_done = threading.Event()
        self.pending_runs = 0  # how often a pending call ran on the main thread
        self.on_exit: Callable[[], None] | None = None
        self.main_ident = threading.main_thread().ident
        self.original: Callable[[object], object] | None = None
        self.wrapper: Callable[[object], object] | None = None
        self._pending_callback: Any = None  # the ctypes callback must outlive every call queued with it
        self.quiet = KinetoQuiet()

    # ------------------------------------------------------------------ on the main thread

    def install(self) -> None:
        original = self.base_cls.__dict__["__next__"]
        window = self

        def gputop_trace_next(it: object) -> object:
            if window.state in (ARMED, RECORDING) and threading.get_ident() == window.main_ident:
                window._boundary()
            return original(it)

        self.original = original
        self.wrapper = gputop_trace_next
        setattr(self.base_cls, "__next__", gputop_trace_next)

    def restore(self) -> bool:
        """Put the job's ``__next__`` back; False when other code replaced ours meanwhile (left as it is)."""
        if self.original is None:
            return True
        if self.base_cls.__dict__.get("__next__") is self.wrapper:
            setattr(self.base_cls, "__next__", self.original)
            self.original = None
            return True
        return False

    def _boundary(self) -> None:
        with self.lock:
            if self.state == ARMED:
                self._start_locked()
            elif self.state == RECORDING:
                if (self.steps and self.batches >= self.steps) or time.monotonic() >= self.end:
                    self._stop_locked("the window ended")
                else:
                    self.batches += 1

    def _start_locked(self) -> None:
        try:
            prof = self.make_profiler()
            self.quiet.hush(True)
            prof.prepare_trace()
            self.quiet.after_init()
            prof.start_trace()
        except BaseException as exc:
            self.quiet.restore()
            self.error = f"the profiler did not start: {_one_line(exc)}"
            self.state = STOPPED
            self.done.set()
            return
        self.prof = prof
        self.started_at = time.time()
        self.end = time.monotonic() + self.seconds
        self.batches = 1
        self.state = RECORDING
        self.recording.set()

    def _stop_locked(self, reason: str) -> None:
        self.state = STOPPED
        self.stop_reason = reason
        self.stopped_at = time.time()
        try:
            self.prof.stop_trace()
        except BaseException as exc:
            self.error = f"the profiler did not stop cleanly: {_one_line(exc)}"
        finally:
            self.quiet.restore()
        self.done.set()

    def at_exit(self) -> None:
        """``atexit``: the interpreter is about to tear down; the profiler goes first, then the exit goes on."""
        try:
            with self.lock:
                was, self.state = self.state, EXITING
                if was == RECORDING:
                    self._stop_locked("the job began to exit")
                    self.state = EXITING
            self.restore()
            if self.exporting:
                self.export_done.wait(EXPORT_AT_EXIT_S)
            if was in (ARMED, RECORDING) and self.on_exit is not None:
                self.on_exit()
        except BaseException:
            pass  # the job's exit must not change because of us

    def _pending_stop(self, _arg: object) -> int:
        """Run by the main thread between two bytecodes (Py_AddPendingCall)."""
        self.pending_runs += 1
        try:
            if self.lock.acquire(blocking=False):  # held: the main thread is in the wrapper, which stops it
                try:
                    if self.state == RECORDING:
                        self._stop_locked("the loop drew no batch after the window")
                finally:
                    self.lock.release()
        except BaseException:
            pass
        return 0

    # ------------------------------------------------------------------ on the agent's thread

    def cancel(self) -> bool:
        """Close an armed window that never opened; False when it opened meanwhile."""
        with self.lock:
            if self.state != ARMED:
                return False
            self.state = CANCELLED
            self.done.set()
            return True

    def ask_main_thread_to_stop(self) -> bool:
        """Queue `_pending_stop` for the main thread; False where ctypes cannot reach the C API."""
        try:
            import ctypes

            if self._pending_callback is None:
                self._pending_callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(self._pending_stop)
            add = ctypes.pythonapi.Py_AddPendingCall
            add.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
            return bool(add(ctypes.cast(self._pending_callback, ctypes.c_void_p), None) == 0)
        except Exception:
            return False

    def begin_export(self) -> bool:
        """Claim the stopped profiler for the export; False when the job began to exit first."""
        with self.lock:
            if self.state != STOPPED or self.prof is None or self.error:
                return False
            self.exporting = True
            return True


def _poll(ready: Callable[[], bool], pause: threading.Event, seconds: float = PENDING_STOP_S) -> bool:
    end = time.monotonic() + seconds
    while not ready():
        if time.monotonic() >= end:
            return False
        pause.wait(0.05)
    return True


def _wait_for(event: threading.Event, seconds: float, tick: Callable[[], None]) -> bool:
    end = time.monotonic() + seconds
    while not event.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return False
        event.wait(min(0.25, left))
        tick()
    return True


def trace_window(torch_mod: ModuleType, run_dir: RunDir, config: Json, result: Json) -> StepBoundaryWindow | None:
    """Record one window into ``trace.json``; fills `result`.  Returns the window when it is still armed or
    recording in the job (it could not be closed from here), so the caller leaves its wrapper and exit hook."""
    import atexit

    from torch.profiler import ProfilerActivity, profile

    seconds = min(MAX_SECONDS, max(0.1, float(config.get("seconds", 5.0))))
    steps = int(config.get("steps") or 0)
    start_bound = float(config.get("start_bound_s") or START_BOUND_S)
    if _profiler_enabled(torch_mod):
        result["error"] = (
            "a profiler is already running in this process (the job's own, or another tool's); not starting a second one"
        )
        return None
    dl_mod = sys.modules.get("torch.utils.data.dataloader")
    if dl_mod is None:
        result["error"] = "the job has not imported torch's DataLoader, whose next batch opens the window; no trace"
        return None
    activities = [ProfilerActivity.CPU]
    cuda = getattr(torch_mod, "cuda", None)
    uses_cuda = bool(cuda is not None and cuda.is_initialized())
    if uses_cuda:
        activities.append(ProfilerActivity.CUDA)
    result["uses_cuda"] = uses_cuda
    kwargs: dict[str, Any] = {"activities": activities, "with_stack": bool(config.get("with_stack")), "record_shapes": False}
    result["memory_before"] = memory_stats(torch_mod)
    window = StepBoundaryWindow(dl_mod._BaseDataLoaderIter, lambda: profile(**kwargs), seconds, steps)

    def exited_meanwhile() -> None:
        result["error"] = "the job began to exit during the window; the profiler was stopped before it did, no trace"
        result["finished"] = time.time()
        run_dir.write_json("result.json", result)

    window.on_exit = exited_meanwhile
    atexit.register(window.at_exit)
    window.install()
    left_open = False
    try:
        run_dir.progress(0.02, "waiting for the training loop's next batch")
        if not _wait_for(window.recording, start_bound, lambda: None) and window.cancel():
            result["error"] = (
                f"the job's main thread drew no batch from a DataLoader within {start_bound:g}s, so no step boundary "
                "came to start the profiler at; no trace (is the job in its training loop?)"
            )
            return None

        def tick() -> None:
            done = (window.batches / steps) if steps else (1 - max(0.0, window.end - time.monotonic()) / seconds)
            run_dir.progress(0.05 + 0.75 * min(1.0, done), f"profiling: {window.batches} steps")

        asks = 0
        if not _wait_for(window.done, seconds + STOP_GRACE_S, tick):
            # Ask the main thread between two bytecodes; again only if it ran the last ask (and found the wrapper
            # holding the lock): a main thread that runs no Python at all would not run a second ask either.
            while not window.done.is_set() and window.pending_runs == asks and asks < PENDING_ASKS:
                if not window.ask_main_thread_to_stop():
                    break
                asks += 1
                _wait_for(window.done, PENDING_STOP_S, lambda: None)
        # A queued call holds our callback: until each has run, the window (and so the callback) must stay alive.
        pause = threading.Event()  # never set: a wait that sleeps without a sleep call
        if not window.done.is_set() or (window.pending_runs < asks and not _poll(lambda: window.pending_runs >= asks, pause)):
            left_open = True
            result["error"] = (
                "the window ended but the job's main thread ran no Python since (stuck in C?); the profiler stops at "
                "its next batch or when the job exits; no trace"
            )
            return window
        if window.state == EXITING or window.error or not window.begin_export():
            result["error"] = window.error or "the job began to exit during the window; no trace"
            return None
        try:
            result["window"] = {
                "start": window.started_at,
                "end": window.stopped_at,
                "steps": window.batches,
                "seconds_bound": seconds,
                "steps_bound": steps or None,
                "stopped": window.stop_reason,
            }
            run_dir.progress(0.85, "writing the trace")
            window.prof.export_chrome_trace(os.path.join(run_dir.path, "trace.json"))
            result["trace"] = "trace.json"
            result["memory_after"] = memory_stats(torch_mod)
            result["memory_stats"] = result["memory_after"]
        finally:
            window.export_done.set()
        return None
    finally:
        if not left_open and window.state != EXITING:
            result["next_restored"] = window.restore()
            atexit.unregister(window.at_exit)
            window.prof = None  # the profiler's results: the job should not keep them


def live_main(run_path: str, started_event: threading.Event | None = None) -> None:
    run_dir = RunDir(run_path)
    with open(os.path.join(run_path, "config.json")) as f:
        config = json.load(f)
    result: Json = {
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "notes": [],
        "rank": _env_int("RANK"),
        "local_rank": _env_int("LOCAL_RANK"),
        "main_thread_id": threading.main_thread().native_id,
        "started": time.time(),
    }
    own = threading.current_thread()
    threads_before = {t.ident for t in threading.enumerate()}
    torch_mod = None
    left_open = None
    try:
        if started_event is not None and not started_event.wait(START_WAIT_S):
            result["error"] = "the injected start did not return; not profiling"
            return
        torch_mod = sys.modules.get("torch")
        if torch_mod is None:
            result["error"] = "the target has not imported torch; nothing to trace"
            return
        result["torch"] = getattr(torch_mod, "__version__", "?")
        left_open = trace_window(torch_mod, run_dir, config, result)
    except BaseException as exc:
        result["error"] = f"trace agent failed: {_one_line(exc)}"
    finally:
        if torch_mod is not None:
            result["profiler_left_on"] = _profiler_enabled(torch_mod)
        if result.get("next_restored") is False:
            result["notes"].append("DataLoader.__next__ was replaced by other code during the window; left it as it is")
        if left_open is not None:
            result["notes"].append("the window's wrapper and exit hook stay in the job until its next batch or its exit")
        result["threads_left"] = sorted(
            t.name for t in threading.enumerate() if t.ident not in threads_before and t is not own and t.is_alive()
        )
        result["finished"] = time.time()
        try:
            run_dir.write_json("result.json", result)
        except OSError:
            pass  # gputop gave up and removed the directory: nobody is waiting for this
        run_dir.progress(1.0, "done")


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


if __name__ == "__gputop_agent__":
    try:
        live_main(os.path.dirname(os.path.abspath(__file__)), globals().get("__gputop_started__"))
    except BaseException:
        pass

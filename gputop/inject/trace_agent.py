"""The trace agent: runs INSIDE a training process and records one bounded torch.profiler (Kineto) window.

Self-contained on purpose (the target may not have gputop installed): it imports only the standard library,
the torch the job already imported, and the benchmark agent (``agent.py``) that gputop copies next to it.  gputop copies it into a private run directory in the target's
filesystem view, writes ``config.json`` there and injects a one-liner that starts a daemon thread
executing this file (`gputop.inject.injector.bootstrap_code`).  It answers with ``trace.json`` (the Chrome
trace) and ``result.json``; ``progress.json`` while it runs.

What it does, in its own thread:
1. waits until the injected one-liner has returned (``__gputop_started__``), so the job's main thread is
   back in its own code before the profiler is enabled;
2. refuses when a profiler is already running in the job (its own, or another tool's): two would fight;
3. starts ``torch.profiler.profile`` with ``_ExperimentalConfig(profile_all_threads=True)``, so the ops of
   the main thread (and of autograd's and the collectives' threads) are recorded although the profiler
   is started from this thread; CPU activities always, CUDA ones when the job has a CUDA context;
4. waits at most ``seconds`` (never more than 10 s), or until ``steps`` optimizer steps have run, counted
   with a global optimizer step hook that is removed afterwards;
5. stops the profiler (always, in ``finally``), writes the trace, reads ``torch.cuda.memory_stats`` of each
   device the job uses, and checks that it left nothing behind: profiler off, the hook removed, no thread
   of its own still running besides itself.
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
    from types import ModuleType
    from typing import Any

    from torch.utils.hooks import RemovableHandle

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


def optimizer_module(torch_mod: ModuleType) -> ModuleType | None:
    """torch.optim.optimizer (not an attribute of torch.optim: reach it through the Optimizer class)."""
    optimizer_cls = getattr(getattr(torch_mod, "optim", None), "Optimizer", None)
    return sys.modules.get(getattr(optimizer_cls, "__module__", ""), None)


def global_step_hooks(torch_mod: ModuleType) -> dict[int, object] | None:
    """The registered global post-step hooks (a dict), or None when this torch has none."""
    return getattr(optimizer_module(torch_mod), "_global_optimizer_post_hooks", None)


class StepCounter:
    """Counts optimizer steps with a global post-step hook (removed by `remove`)."""

    def __init__(self, torch_mod: ModuleType) -> None:
        self.count = 0
        self.handle: RemovableHandle | None = None
        self.reached = threading.Event()
        self.target = 0
        register = getattr(optimizer_module(torch_mod), "register_optimizer_step_post_hook", None)
        if register is not None:
            self.handle = register(self._hook)

    def _hook(self, *_args: object, **_kwargs: object) -> None:
        self.count += 1
        if self.target and self.count >= self.target:
            self.reached.set()

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


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


def trace_window(torch_mod: ModuleType, run_dir: RunDir, config: Json, result: Json) -> None:
    """Record one window into ``trace.json``; fills `result`.  The profiler is stopped whatever happens."""
    from torch.profiler import ProfilerActivity, profile

    seconds = min(MAX_SECONDS, max(0.1, float(config.get("seconds", 5.0))))
    steps = int(config.get("steps") or 0)
    if _profiler_enabled(torch_mod):
        result["error"] = (
            "a profiler is already running in this process (the job's own, or another tool's); not starting a second one"
        )
        return
    activities = [ProfilerActivity.CPU]
    cuda = getattr(torch_mod, "cuda", None)
    uses_cuda = bool(cuda is not None and cuda.is_initialized())
    if uses_cuda:
        activities.append(ProfilerActivity.CUDA)
    result["uses_cuda"] = uses_cuda
    kwargs: dict[str, Any] = {"activities": activities, "with_stack": bool(config.get("with_stack")), "record_shapes": False}
    try:
        from torch._C._profiler import _ExperimentalConfig

        kwargs["experimental_config"] = _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):
        result["notes"].append("this torch has no profile_all_threads; only the agent's own thread may be recorded")
    result["memory_before"] = memory_stats(torch_mod)
    counter = StepCounter(torch_mod)
    counter.target = steps
    prof = profile(**kwargs)
    started = time.time()
    prof.start()
    try:
        run_dir.progress(0.05, "profiling")
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0 or (steps and counter.reached.is_set()):
                break
            counter.reached.wait(min(0.25, left))
            done = (counter.count / steps) if steps else (1 - left / seconds)
            run_dir.progress(0.05 + 0.75 * min(1.0, done), f"profiling: {counter.count} steps")
    finally:
        try:
            prof.stop()
        finally:
            counter.remove()
    result["window"] = {
        "start": started,
        "end": time.time(),
        "steps": counter.count,
        "seconds_bound": seconds,
        "steps_bound": steps or None,
    }
    run_dir.progress(0.85, "writing the trace")
    prof.export_chrome_trace(os.path.join(run_dir.path, "trace.json"))
    result["trace"] = "trace.json"
    result["memory_after"] = memory_stats(torch_mod)
    result["memory_stats"] = result["memory_after"]


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
    try:
        if started_event is not None and not started_event.wait(START_WAIT_S):
            result["error"] = "the injected start did not return; not profiling"
            return
        torch_mod = sys.modules.get("torch")
        if torch_mod is None:
            result["error"] = "the target has not imported torch; nothing to trace"
            return
        result["torch"] = getattr(torch_mod, "__version__", "?")
        hooks = global_step_hooks(torch_mod)
        result["global_step_hooks_before"] = len(hooks) if hooks is not None else None
        trace_window(torch_mod, run_dir, config, result)
    except BaseException as exc:
        result["error"] = f"trace agent failed: {_one_line(exc)}"
    finally:
        if torch_mod is not None:
            result["profiler_left_on"] = _profiler_enabled(torch_mod)
            hooks = global_step_hooks(torch_mod)
            result["global_step_hooks_after"] = len(hooks) if hooks is not None else None
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

"""Classify a rank's main-thread stack and aggregate worker stacks.

The state labels are a contract: the TUI, diagnosis and report all use them.
Stacks are py-spy's (`gputop.collect.stacks`): frames innermost FIRST.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Mapping, Optional

from gputop.model import Frame, ProcessStacks, ThreadStack

WAITING_FOR_DATA = "waiting for data"
IN_DATASET = "in dataset code"
FORWARD_BACKWARD = "forward/backward"
OPTIMIZER_STEP = "optimizer step"
COLLECTIVE = "collective/barrier"
EXPLICIT_SYNC = "explicit sync"
IDLE_OTHER = "idle/other"

MAIN_THREAD_STATES = (
    WAITING_FOR_DATA,
    IN_DATASET,
    FORWARD_BACKWARD,
    OPTIMIZER_STEP,
    COLLECTIVE,
    EXPLICIT_SYNC,
    IDLE_OTHER,
)


# ----------------------------------------------------------------- helpers over py-spy stacks
# Frames are innermost FIRST (as py-spy gives them).  Matching uses py-spy's qualified frame names
# ("Class.method") and path fragments, because py-spy leaves `module` empty for most frames.

_LIB_ROOT = re.compile(r".*/(?:site-packages|dist-packages|lib/python\d+\.\d+)/")


def short_path(filename: str) -> str:
    """Library files relative to site-packages (``torch/optim/adam.py``), other files by base name."""
    match = _LIB_ROOT.match(filename)
    if match:
        return filename[match.end() :]
    if filename.startswith("<"):  # "<frozen runpy>", "<string>"
        return filename
    return filename.rsplit("/", 1)[-1]


def format_frame(frame: Frame) -> str:
    """``Adam.step (torch/optim/adam.py:248)``: what the TUI, report and findings show."""
    return f"{frame.name} ({short_path(frame.filename)}:{frame.line})"


def main_thread(stacks: Optional[ProcessStacks]) -> Optional[ThreadStack]:
    """The thread Python calls MainThread; failing that the one whose OS id is the PID (Linux main thread)."""
    if stacks is None or not stacks.threads:
        return None
    for thread in stacks.threads:
        if thread.thread_name == "MainThread":
            return thread
    for thread in stacks.threads:
        if thread.os_thread_id == stacks.pid:
            return thread
    return stacks.threads[-1]  # py-spy lists the main thread last


def _path(frame: Frame) -> str:
    return frame.filename.replace("\\", "/")


def _last_name(frame: Frame) -> str:
    return frame.name.rsplit(".", 1)[-1]


def _is_single_process_fetch(frame: Frame) -> bool:
    return frame.name.startswith("_SingleProcessDataLoaderIter.")


def _is_user_dataset(frame: Frame) -> bool:
    # `SlowDataset.__getitem__`, `ImageFolderDataset.__iter__`: Dataset code called straight from a loop.
    cls, _, method = frame.name.rpartition(".")
    return method in ("__getitem__", "__getitems__") and "Dataset" in cls and "DataLoader" not in cls


def _is_waiting_for_data(frame: Frame) -> bool:
    # `__next__` blocks on the workers' result queue; `DataLoader.__iter__` blocks while an epoch's
    # workers start (non-persistent workers): both are the training loop waiting on its input pipeline.
    return frame.name in ("_BaseDataLoaderIter.__next__", "DataLoader.__iter__")


def _is_sync(frame: Frame) -> bool:
    # torch.cuda.synchronize(), Event.synchronize(), Stream.synchronize(); `.item()` and `.cpu()` sync
    # inside C++ and never show in a Python stack.
    return _last_name(frame) == "synchronize"


def _is_collective(frame: Frame) -> bool:
    path = _path(frame)
    return (
        path.endswith("torch/distributed/distributed_c10d.py")
        or "torch/distributed/_functional_collectives" in path
        or _last_name(frame) in ("barrier", "monitored_barrier")
    )


def _is_optimizer(frame: Frame) -> bool:
    path = _path(frame)
    return "torch/optim/" in path or frame.name.startswith("Optimizer.") or "_use_grad" in frame.name


def _is_forward_backward(frame: Frame) -> bool:
    # Calls into modules and autograd only: Module.state_dict() or .to() (torch/nn/modules too) are not
    # forward/backward.
    return (
        "torch/autograd/" in _path(frame)
        or frame.name in ("Tensor.backward", "Module._call_impl", "Module._wrapped_call_impl")
        or _last_name(frame) in ("forward", "backward")
    )


# innermost match wins: a synchronize inside forward is "explicit sync", an all_gather inside an
# FSDP forward is "collective", a backward inside an optimizer closure is "forward/backward".
_FRAME_CLASSES = (
    (EXPLICIT_SYNC, _is_sync),
    (COLLECTIVE, _is_collective),
    (OPTIMIZER_STEP, _is_optimizer),
    (FORWARD_BACKWARD, _is_forward_backward),
)


def own_frames(thread: ThreadStack) -> tuple[Frame, ...]:
    """The frames this process ran itself: a forked child's stack still shows the parent's frames below
    ``BaseProcess._bootstrap`` (a worker "inside" ``DataLoader.__iter__``); those are cut off."""
    for i, frame in enumerate(thread.frames):
        if frame.name == "BaseProcess._bootstrap" and "multiprocessing/" in _path(frame):
            return thread.frames[: i + 1]
    return thread.frames


def classify_thread(thread: Optional[ThreadStack]) -> str:
    if thread is None or not thread.frames:
        return IDLE_OTHER
    frames = own_frames(thread)
    # The input pipeline is decided on the whole stack, not the innermost frame: the innermost frames
    # of a waiting main thread are queue/selector plumbing.
    if any(_is_single_process_fetch(f) for f in frames):
        return IN_DATASET  # num_workers=0: the main thread itself runs Dataset.__getitem__
    if any(_is_waiting_for_data(f) for f in frames):
        return WAITING_FOR_DATA
    if any(_is_user_dataset(f) for f in frames):
        return IN_DATASET
    for frame in frames:
        for label, matches in _FRAME_CLASSES:
            if matches(frame):
                return label
    return IDLE_OTHER


def classify_main_thread(stacks: Optional[ProcessStacks]) -> str:
    """One of MAIN_THREAD_STATES for a rank's main thread (IDLE_OTHER when there is no stack)."""
    return classify_thread(main_thread(stacks))


# ----------------------------------------------------------------- worker aggregation

WORKER_IDLE = "idle (waiting for indices)"
WORKER_SENDING = "sending a batch to the main process"
WORKER_NO_STACK = "stack not available"

# Worker frames that only move data between processes: skipped to reach the frame doing the work.
_PLUMBING_PATHS = (
    "multiprocessing/",
    "/queue.py",
    "/selectors.py",
    "/threading.py",
    "/socket.py",
    "/connection.py",
)


def _is_plumbing(frame: Frame) -> bool:
    path = _path(frame)
    return path.startswith("<") or any(p in path for p in _PLUMBING_PATHS)


def _is_worker_loop(frame: Frame) -> bool:
    return frame.name == "_worker_loop" and "torch/utils/data/_utils/worker.py" in _path(frame)


def worker_activity(thread: Optional[ThreadStack]) -> str:
    """What one DataLoader worker's main thread is doing, as a line-free key (counts aggregate by function)."""
    if thread is None or not thread.frames:
        return WORKER_NO_STACK
    for i, frame in enumerate(thread.frames):
        if _is_plumbing(frame):
            continue
        if _is_worker_loop(frame):
            # Only queue plumbing above the loop itself: blocked on index_queue.get(), or handing a
            # finished batch to data_queue.put().
            if any(_last_name(f) == "put" for f in thread.frames[:i]):
                return WORKER_SENDING
            return WORKER_IDLE
        return f"{frame.name} ({short_path(frame.filename)})"
    return f"{thread.frames[0].name} ({short_path(thread.frames[0].filename)})"


def aggregate_worker_leaves(
    stacks_by_pid: Mapping[int, ProcessStacks], worker_pids: Iterable[int]
) -> list[tuple[str, int, int]]:
    """The hottest worker activities: [(frame text, workers in it, total workers)], most common first.

    "6/8 workers in `ImageFile.load (PIL/ImageFile.py)`" is ``("ImageFile.load (PIL/ImageFile.py)", 6, 8)``.
    A worker without stacks counts as WORKER_NO_STACK so the counts add up to the total.
    """
    pids = list(dict.fromkeys(worker_pids))
    counts: Counter[str] = Counter()
    for pid in pids:
        stacks = stacks_by_pid.get(pid)
        thread = main_thread(stacks) if stacks is not None and stacks.error is None else None
        counts[worker_activity(thread)] += 1
    total = len(pids)
    return [(text, n, total) for text, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]

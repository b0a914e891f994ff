"""Classify a rank's main-thread stack and aggregate worker stacks.

The state labels are a contract: the TUI, diagnosis and report all use them.
Stacks are py-spy's (`gputop.collect.stacks`): frames innermost FIRST.

Frames are matched by file path plus function, never by py-spy's qualified name alone: py-spy 0.4.3
prints ``_BaseDataLoaderIter.__next__`` for a Python 3.11+ target but a bare ``__next__`` for 3.10, and
dataset classes are called anything (torchvision's ``CIFAR10``, ``ImageFolder``).  Dataset code is
what the DataLoader's fetcher (``torch/utils/data/_utils/fetch.py``) calls, whatever its name.
"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
from collections import Counter
from typing import Callable, Iterable, Mapping, NamedTuple, Optional, Sequence

from gputop.model import Frame, ProcessStacks, ThreadStack

WAITING_FOR_DATA = "waiting for data"
IN_DATASET = "in dataset code"
FORWARD_BACKWARD = "forward/backward"
OPTIMIZER_STEP = "optimizer step"
COLLECTIVE = "collective/barrier"
EXPLICIT_SYNC = "explicit sync"  # parked at a host-device sync: .item(), .cpu(), torch.cuda.synchronize() ...
# Accelerate's DataLoaderDispatcher (the default for an IterableDataset): rank 0 iterates the DataLoader
# and broadcasts each batch, the other ranks wait in that broadcast.  Those ranks wait on rank 0's
# *input pipeline*: the job is input-bound, no rank straggles.
WAITING_FOR_RANK0_DATA = "waiting for data from rank 0"
IDLE_OTHER = "idle/other"

MAIN_THREAD_STATES = (
    WAITING_FOR_DATA,
    IN_DATASET,
    FORWARD_BACKWARD,
    OPTIMIZER_STEP,
    COLLECTIVE,
    EXPLICIT_SYNC,
    WAITING_FOR_RANK0_DATA,
    IDLE_OTHER,
)
# The states in which a rank's time goes to the input pipeline: its own loader's, or rank 0's.
INPUT_WAIT_STATES = (WAITING_FOR_DATA, IN_DATASET, WAITING_FOR_RANK0_DATA)


# ----------------------------------------------------------------- helpers over py-spy stacks

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
    """The process's main thread.

    By name (MainThread) where py-spy gives one; else the thread whose OS id is the PID (the Linux main
    thread); else the last one listed.  For a Python 3.10 target py-spy 0.4.3 gives no native id (its
    JSON still names threads; its text output does not), and it lists threads newest first, so the main
    thread comes last.
    """
    if stacks is None or not stacks.threads:
        return None
    for thread in stacks.threads:
        if thread.thread_name == "MainThread":
            return thread
    for thread in stacks.threads:
        if thread.os_thread_id == stacks.pid:
            return thread
    return stacks.threads[-1]


def _path(frame: Frame) -> str:
    return frame.filename.replace("\\", "/")


def function_name(frame: Frame) -> str:
    """The bare function name: ``__next__`` whether py-spy printed ``_BaseDataLoaderIter.__next__`` (3.11+)
    or ``__next__`` (3.10)."""
    return frame.name.rsplit(".", 1)[-1]


def _at(frame: Frame, path_suffixes: Sequence[str], functions: Optional[Sequence[str]] = None) -> bool:
    """The frame runs in a file ending with one of `path_suffixes` (and, if given, one of `functions`)."""
    return _path(frame).endswith(tuple(path_suffixes)) and (functions is None or function_name(frame) in functions)


def is_library(frame: Frame) -> bool:
    """Installed code (site-packages, the standard library) or a frozen/generated module, not the user's."""
    path = _path(frame)
    return path.startswith("<") or _LIB_ROOT.match(path) is not None


_DATALOADER_FILES = (
    "torch/utils/data/dataloader.py",
    "torchdata/stateful_dataloader/stateful_dataloader.py",  # StatefulDataLoader's iterators wrap torch's
)
_FETCH_FILE = ("torch/utils/data/_utils/fetch.py",)
_WORKER_FILES = ("torch/utils/data/_utils/worker.py", "torchdata/stateful_dataloader/worker.py")
_COLLATE_FILE = ("torch/utils/data/_utils/collate.py",)
# Datasets in libraries, called straight from a loop without a DataLoader (files, not class names).
_LIBRARY_DATASET_DIRS = ("torchvision/datasets/", "datasets/arrow_dataset.py", "torch/utils/data/dataset.py")


def is_waiting_for_data_frame(frame: Frame) -> bool:
    """The training loop waiting on its input pipeline: a DataLoader iterator's ``__next__`` (blocked on
    the workers' result queue), or ``DataLoader.__iter__`` while an epoch's workers start
    (non-persistent workers)."""
    return _at(frame, _DATALOADER_FILES, ("__next__", "__iter__"))


def is_epoch_start_frame(frame: Frame) -> bool:
    """``DataLoader.__iter__``: a new epoch's iterator is built (non-persistent workers are re-forked)."""
    # (the iterator's own __iter__ in the same file only returns self: never seen on a stack)
    return _at(frame, _DATALOADER_FILES, ("__iter__",))


def is_fetch_frame(frame: Frame) -> bool:
    """The DataLoader's fetcher: it calls the dataset (and collate) for one batch."""
    return _at(frame, _FETCH_FILE)


def is_worker_loop_frame(frame: Frame) -> bool:
    """A DataLoader worker's loop (torch's, or torchdata's StatefulDataLoader's)."""
    return _at(frame, _WORKER_FILES, ("_worker_loop",))


def runs_worker_loop(stacks: Optional[ProcessStacks]) -> bool:
    """The process is a DataLoader worker, by its role: its main thread runs the worker loop.

    For discovery when the process name is not ``pt_data_worker`` (torchdata's StatefulDataLoader, a
    worker that renamed itself, a platform without prctl names)."""
    thread = main_thread(stacks)
    return thread is not None and any(is_worker_loop_frame(f) for f in thread.frames)


def dataset_frame(frames: Sequence[Frame]) -> Optional[Frame]:
    """The dataset's own frame on this stack (innermost first): what the fetcher called
    (``__getitem__``, ``__getitems__``, an IterableDataset's ``__iter__``/``__next__``), whatever the class
    is called; else a library dataset or a user-file ``__getitem__`` called without a DataLoader.
    None while the fetcher is collating, or when no dataset code is running."""
    for i, frame in enumerate(frames):
        if is_fetch_frame(frame):
            # frames[i - 1] is what the fetcher called; on 3.10/3.11 a list comprehension in fetch.py
            # sits between (3.12 inlines it), so take the innermost fetch.py frame's callee.
            callee = frames[i - 1] if i > 0 else None
            if callee is None or _at(callee, _COLLATE_FILE):
                return None
            return callee
    for frame in frames:
        if function_name(frame) in ("__getitem__", "__getitems__") and (
            not is_library(frame) or any(d in _path(frame) for d in _LIBRARY_DATASET_DIRS)
        ):
            return frame
    return None


def in_dataset_code(frames: Sequence[Frame]) -> bool:
    """The stack runs the input pipeline's own work: the fetcher (dataset and collate) or a dataset."""
    return any(is_fetch_frame(f) for f in frames) or dataset_frame(frames) is not None


# ----------------------------------------------------------------- host-device syncs

# CUDA is asynchronous: the host blocks at a sync.  `.item()`, `.cpu()`, `.tolist()` are C calls, so the
# innermost Python frame is the user's line that made them; these patterns are read off that line.
_SYNC_CALL = re.compile(r"\.(?P<method>item|cpu|tolist|numpy)\(\s*\)|(?P<sync>\bsynchronize)\(")
_SYNC_FUNCTIONS = ("synchronize", "item", "tolist")  # torch.cuda.synchronize, Event/Stream.synchronize, a Python-level .item()
_TENSOR_TO_TEXT = ("torch/_tensor_str.py",)  # printing a tensor copies it to the host


def read_source_line(filename: str, line: int, pid: Optional[int] = None) -> Optional[str]:
    """The text of `filename`:`line`, or None where it cannot be read.

    With `pid`, the file is looked up first as the target sees it (`_source_candidates`): through
    ``/proc/PID/root`` (it may run in another mount namespace: a container), a relative name from its
    working directory."""
    if line <= 0 or filename.startswith("<"):
        return None
    for path in _source_candidates(filename, pid):
        text = _line_of(path, line)
        if text is not None:
            return text
    return None


def _kernel_path(path: str) -> bytes:
    """`path` as the bytes the kernel takes.  py-spy names files as it decoded them (UTF-8); under a C locale
    without UTF-8 mode Python's file-system encoding is ASCII, and opening such a name as a str raises
    UnicodeEncodeError (a job under `/data/данные/`): its UTF-8 bytes are what the file is called."""
    try:
        return os.fsencode(path)
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape")


@functools.lru_cache(maxsize=256)
def _line_of(path: str, line: int) -> Optional[str]:
    try:
        with open(_kernel_path(path), "rb") as f:
            for number, raw in enumerate(f, start=1):
                if number == line:
                    return raw.decode("utf-8", "replace").strip()
                if number > 100_000:
                    break
    except OSError:
        return None
    return None


def sync_lines_in_function(filename: str, first_line: int, function: str, pid: Optional[int] = None) -> list[tuple[int, str]]:
    """The lines of one function that call a host-device sync (``.item()``, ``.cpu()``, ``.tolist()``,
    ``.numpy()``, ``synchronize(``), as ``(line, text)``, read from the function's source.

    The profiler's Python stacks name a function by the line it starts on (``train.py(52): train_step``:
    its code object's first line, a decorator's if it has one), never by the line running inside it; the
    function's own lines, read here, say which line syncs.  Lines of functions nested inside it are left
    out (they are their own frames).  With `pid`, the file is read as the target sees it, as
    `read_source_line` reads it (`_source_candidates`).  [] where the source cannot be read or parsed."""
    tree = None
    for path in _source_candidates(filename, pid):
        try:
            changed = os.stat(_kernel_path(path)).st_mtime_ns
        except OSError:
            continue
        tree = _parsed_source(path, changed)  # re-read when the file changes (the user edits and restarts)
        break
    if tree is None:
        return []
    source_lines, module = tree
    for node in ast.walk(module):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == function
            and first_line in (node.lineno, *(d.lineno for d in node.decorator_list))
        ):
            nested = [
                (n.lineno, n.end_lineno or n.lineno)
                for n in ast.walk(node)
                if n is not node and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
            ]
            body_first = node.body[0].lineno
            own_lines = [
                (line, _without_comment(source_lines[line - 1]))
                for line in range(body_first, (node.end_lineno or body_first) + 1)
                if not any(lo <= line <= hi for lo, hi in nested)
            ]
            return [(line, code) for line, code in own_lines if _SYNC_CALL.search(code)]
    return []


def _without_comment(line: str) -> str:
    """The code of one source line, its trailing ``# comment`` dropped (a ``#`` inside a string stays)."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[: token.start[1]].strip()
    except (tokenize.TokenError, SyntaxError):
        pass  # a line of a longer statement (an open bracket): keep it whole
    return line.strip()


def _source_candidates(filename: str, pid: Optional[int]) -> tuple[str, ...]:
    """Where `filename` (a frame's, as the process `pid` named it) may be read, in order: through the
    process's root (a container) or, for a relative name, its working directory; then the name as it is."""
    if filename.startswith("<"):
        return ()
    if pid is None:
        return (filename,)
    if filename.startswith("/"):
        return (f"/proc/{pid}/root{filename}", filename)
    return (f"/proc/{pid}/cwd/{filename}", filename)  # relative to the target's working directory first


@functools.lru_cache(maxsize=32)
def _parsed_source(path: str, _changed: int) -> "Optional[tuple[list[str], ast.Module]]":
    try:
        with open(_kernel_path(path), "rb") as f:
            text = f.read(4 << 20).decode("utf-8", "replace")
        return text.splitlines(), ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None


SourceReader = Callable[[Frame], Optional[str]]


class SyncPoint(NamedTuple):
    frame: Frame  # the user's frame (innermost user frame) that made the sync
    call: str  # what syncs: ".item()", ".cpu()", ".tolist()", ".numpy()", "synchronize()", "print(tensor)"


def sync_point(frames: Sequence[Frame], read_line: Optional[SourceReader] = None) -> Optional[SyncPoint]:
    """Where this stack is parked at a host-device sync, if it is.

    * a frame of torch.cuda.synchronize / Event.synchronize / Stream.synchronize, or a Python-level
      ``item``/``tolist`` (a simulated tensor's), or torch formatting a tensor as text;
    * or, when the innermost frame is user code, its source line calling ``.item()``, ``.cpu()``,
      ``.tolist()``, ``.numpy()`` or ``synchronize`` (real torch runs those in C, so no frame of theirs shows).
    The returned frame is the user's frame that made the call (the line to fix)."""
    for i, frame in enumerate(frames):
        synced = function_name(frame) in _SYNC_FUNCTIONS and not _at(frame, _DATALOADER_FILES)
        if synced or _at(frame, _TENSOR_TO_TEXT):
            caller = next((f for f in frames[i + 1 :] if not is_library(f)), frame)
            return SyncPoint(caller, f".{function_name(frame)}()" if synced else "print(tensor)")
    if read_line is not None and frames and not is_library(frames[0]):
        match = _SYNC_CALL.search(read_line(frames[0]) or "")
        if match:
            return SyncPoint(frames[0], f".{match['method']}()" if match["method"] else "synchronize()")
    return None


# ----------------------------------------------------------------- frame classes


def _is_collective(frame: Frame) -> bool:
    path = _path(frame)
    return (
        path.endswith("torch/distributed/distributed_c10d.py")
        or "torch/distributed/_functional_collectives" in path
        or function_name(frame) in ("barrier", "monitored_barrier")
    )


def _is_optimizer(frame: Frame) -> bool:
    return "torch/optim/" in _path(frame)


def _is_forward_backward(frame: Frame) -> bool:
    # Calls into modules and autograd only: Module.state_dict() or .to() (torch/nn/modules too) are not
    # forward/backward.
    return (
        "torch/autograd/" in _path(frame)
        or _at(frame, ("torch/nn/modules/module.py",), ("_call_impl", "_wrapped_call_impl"))
        or _at(frame, ("torch/_tensor.py",), ("backward",))
        or function_name(frame) in ("forward", "backward")
    )


def _is_dispatcher(frame: Frame) -> bool:
    return _at(frame, ("accelerate/data_loader.py",))


# innermost match wins: a collective inside an FSDP forward is "collective", a backward inside an
# optimizer closure is "forward/backward".
_FRAME_CLASSES = (
    (COLLECTIVE, _is_collective),
    (OPTIMIZER_STEP, _is_optimizer),
    (FORWARD_BACKWARD, _is_forward_backward),
)


def own_frames(thread: ThreadStack) -> tuple[Frame, ...]:
    """The frames this process ran itself: a forked child's stack still shows the parent's frames below
    ``BaseProcess._bootstrap`` (a worker "inside" ``DataLoader.__iter__``); those are cut off."""
    for i, frame in enumerate(thread.frames):
        if _at(frame, ("multiprocessing/process.py",), ("_bootstrap",)):
            return thread.frames[: i + 1]
    return thread.frames


def classify_thread(thread: Optional[ThreadStack], read_line: Optional[SourceReader] = None) -> str:
    """One of MAIN_THREAD_STATES for this thread's stack.

    `read_line(frame)` gives a frame's source text; with it, a user line calling ``.item()`` (and the
    like) at the top of the stack reads as a host-device sync."""
    if thread is None or not thread.frames:
        return IDLE_OTHER
    frames = own_frames(thread)
    # The input pipeline is decided on the whole stack, not the innermost frame: the innermost frames
    # of a waiting main thread are queue/selector plumbing.
    if any(is_fetch_frame(f) for f in frames):
        return IN_DATASET  # num_workers=0: the main thread itself runs the dataset and collate
    if any(is_waiting_for_data_frame(f) for f in frames):
        return WAITING_FOR_DATA
    if any(_is_dispatcher(f) for f in frames) and any(_is_collective(f) for f in frames):
        return WAITING_FOR_RANK0_DATA
    if dataset_frame(frames) is not None:
        return IN_DATASET
    if sync_point(frames, read_line) is not None:
        return EXPLICIT_SYNC
    for frame in frames:
        for label, matches in _FRAME_CLASSES:
            if matches(frame):
                return label
    return IDLE_OTHER


def classify_main_thread(stacks: Optional[ProcessStacks], *, read_source: bool = True) -> str:
    """One of MAIN_THREAD_STATES for a rank's main thread (IDLE_OTHER when there is no stack).

    With `read_source`, the innermost user line is read from the process's files (through
    /proc/PID/root) to see a host-device sync; without, only frames decide."""
    reader: Optional[SourceReader] = None
    if read_source and stacks is not None:
        pid = stacks.pid
        reader = lambda frame: read_source_line(frame.filename, frame.line, pid)  # noqa: E731
    return classify_thread(main_thread(stacks), reader)


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


def worker_activity(thread: Optional[ThreadStack]) -> str:
    """What one DataLoader worker's main thread is doing, as a line-free key (counts aggregate by function)."""
    if thread is None or not thread.frames:
        return WORKER_NO_STACK
    for i, frame in enumerate(thread.frames):
        if _is_plumbing(frame):
            continue
        if is_worker_loop_frame(frame):
            # Only queue plumbing above the loop itself: blocked on index_queue.get(), or handing a
            # finished batch to data_queue.put().
            if any(function_name(f) == "put" for f in thread.frames[:i]):
                return WORKER_SENDING
            return WORKER_IDLE
        return f"{frame.name} ({short_path(frame.filename)})"
    return f"{thread.frames[0].name} ({short_path(thread.frames[0].filename)})"


def aggregate_worker_leaves(stacks_by_pid: Mapping[int, ProcessStacks], worker_pids: Iterable[int]) -> list[tuple[str, int, int]]:
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

"""Simulated CUDA for the demo job: one stream per rank, a device that drains it, and syncs that wait for it.

Real CUDA is asynchronous: a kernel launch queues work on a stream and returns at once; the host
blocks later, at a sync (`loss.item()`, `.cpu()`, `.tolist()`, `torch.cuda.synchronize()`), until
the stream has drained.  This module gives the demo job the same semantics, with the same shape of
code::

    cuda.init(board, slot=rank, gpu=0, lock_path=...)  # once per rank, like torch.cuda.set_device
    cuda.launch(0.2)                 # queue 200 ms of GPU time; returns at once
    out = cuda.on_device(tensor)     # a DeviceTensor: reading its value back is a sync
    loss.item()                      # blocks until every launch before it has run
    cuda.synchronize()

* **The device.**  A thread per rank (named `DEVICE_THREAD_NAME`) takes the stream's work in
  order.  A kernel marks the rank's slot on the busy board busy for its device time (ranks that share
  one GPU take turns through a file lock, as kernels of several processes share a card); a collective
  (`gputop.sim.distributed`) marks it *spinning* until every rank's kernel has arrived.  The fake NVML turns
  the board into utilization and power, so what the GPUs show is the stream's own busy time, running
  asynchronously from the host.
* **The math is real and runs on the host, at once.**  The tensors are CPU tensors; only the time the
  GPU would take is simulated.  So values are exact and deterministic (the losses do not depend on
  timing), and the device thread never touches a tensor.
* **How a sync blocks, and what py-spy sees.**  `.item()`, `.cpu()` and `.tolist()` are properties:
  they compute the value on the host, queue a marker behind the launched work, and return the marker's
  `queue.SimpleQueue.get`, a C function.  The user's own line then calls it and waits inside C, so
  py-spy's innermost Python frame is the user's line (`running_loss += loss.item()`), exactly as with
  torch, where `.item()` is C++.  `synchronize()` is a Python function named like torch's (which is
  Python too) and waits the same way, so its frame reads `synchronize` innermost.  One difference:
  real CUDA spin-waits at a sync by default and burns a core; here the host sleeps, so 8 ranks stay
  within 2 cores.
* **Bounded run-ahead.**  A launch blocks when `MAX_QUEUED` operations are waiting, as a real launch
  queue does when full (real CUDA's holds ~1024; ours is small, so the host's step counters stay close
  to the device's progress in loops that never sync).
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
import time
from typing import Any, Callable, Optional, Union

import torch

from gputop.sim.busy_board import BusyBoard
from gputop.sim.kernels import FP32_GEMM, NCCL_SPIN, KernelMix

DEVICE_THREAD_NAME = "gputop-sim-gpu"  # the simulator's stand-in for the GPU: not a thread of real training code
MAX_QUEUED = 16


class _Kernel:
    __slots__ = ("seconds", "mix")

    def __init__(self, seconds: float, mix: KernelMix) -> None:
        self.seconds = seconds
        self.mix = mix  # what it keeps busy: the SMs, tensor cores, DRAM (GPM shows it)

    def run(self, stream: "Stream") -> None:
        fcntl.flock(stream.gpu_lock, fcntl.LOCK_EX)  # the GPU runs one process's kernels at a time
        try:
            stream.board.begin_busy(stream.slot, mix=self.mix)
            try:
                time.sleep(self.seconds)
            finally:
                stream.board.end_busy(stream.slot)
        finally:
            fcntl.flock(stream.gpu_lock, fcntl.LOCK_UN)


class _Collective:
    """A collective kernel: the GPU spins until `wait_for_peers` returns (every rank's kernel arrived)."""

    __slots__ = ("wait_for_peers",)

    def __init__(self, wait_for_peers: Callable[[], None]) -> None:
        self.wait_for_peers = wait_for_peers

    def run(self, stream: "Stream") -> None:
        # no GPU lock: a spinning collective leaves room for other processes' kernels; it holds a few SMs
        stream.board.begin_busy(stream.slot, spin=True, mix=NCCL_SPIN)
        try:
            self.wait_for_peers()
        finally:
            stream.board.end_busy(stream.slot)


class _Marker:
    """Hands `value` to the waiting host once everything queued before it has run."""

    __slots__ = ("done", "value")

    def __init__(self, value: Any) -> None:
        self.done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.value = value

    def run(self, stream: "Stream") -> None:
        self.done.put(self.value)


class Stream:
    """A rank's CUDA stream and the simulated GPU that drains it (a daemon thread)."""

    def __init__(self, board: BusyBoard, slot: int, gpu: int, lock_path: str, max_queued: int = MAX_QUEUED) -> None:
        self.board = board
        self.slot = slot
        self.gpu = gpu
        self.gpu_lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._ops: queue.Queue[Union[_Kernel, _Collective, _Marker]] = queue.Queue(maxsize=max_queued)
        self._device = threading.Thread(target=self._drain_forever, name=DEVICE_THREAD_NAME, daemon=True)
        self._device.start()

    def launch(self, seconds: float, mix: KernelMix = FP32_GEMM) -> None:
        """Queue a kernel of `seconds` GPU time keeping `mix` busy; returns at once (unless the queue is full)."""
        self._ops.put(_Kernel(seconds, mix))

    def launch_collective(self, wait_for_peers: Callable[[], None]) -> None:
        """Queue a collective: when the GPU reaches it, it spins until `wait_for_peers` returns."""
        self._ops.put(_Collective(wait_for_peers))

    def value_when_drained(self, value: Any) -> Callable[[], Any]:
        """A C callable that blocks until the work queued so far has run, then returns `value`."""
        marker = _Marker(value)
        self._ops.put(marker)
        return marker.done.get

    def _drain_forever(self) -> None:
        while True:
            self._ops.get().run(self)


_current: Optional[Stream] = None


def init(board: BusyBoard, slot: int, gpu: int, lock_path: str) -> Stream:
    """This process's GPU and stream (once per rank, like `torch.cuda.set_device`)."""
    global _current
    _current = Stream(board, slot, gpu, lock_path)
    return _current


def current_stream() -> Stream:
    if _current is None:
        raise RuntimeError("simulated CUDA is not initialised: call gputop.sim.cuda.init() first")
    return _current


def is_initialized() -> bool:
    return _current is not None


def launch(seconds: float, mix: KernelMix = FP32_GEMM) -> None:
    current_stream().launch(seconds, mix)


def synchronize() -> None:
    """`torch.cuda.synchronize()`: wait until every launch so far has run."""
    current_stream().value_when_drained(None)()


class DeviceTensor(torch.Tensor):
    """A tensor "on the GPU".  Its math runs on the host at once (exact values); reading a value back to
    the host (`.item()`, `.cpu()`, `.tolist()`) waits for the stream, as CUDA's do.  Ops on it give
    DeviceTensors (torch's default `__torch_function__` keeps the subclass), so a loss computed from a
    model's output is one too."""

    # Each is a property returning the C callable that waits: see the module docstring for why.
    @property
    def item(self) -> Callable[[], Any]:
        return current_stream().value_when_drained(torch.Tensor.item(self))

    @property
    def tolist(self) -> Callable[[], Any]:
        return current_stream().value_when_drained(torch.Tensor.tolist(self))

    @property
    def cpu(self) -> Callable[[], torch.Tensor]:  # type: ignore[override]  # (a property in the method's place, as above)
        return current_stream().value_when_drained(self.as_subclass(torch.Tensor))


def on_device(tensor: torch.Tensor) -> DeviceTensor:
    """The same tensor (and autograd history), now "on the GPU"."""
    return tensor.as_subclass(DeviceTensor)

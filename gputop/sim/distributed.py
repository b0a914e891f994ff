"""torch.distributed for the demo job on the simulated GPUs: NCCL's collectives as GPU kernels, or gloo's.

**NCCL** (`NcclGroup`).  With NCCL a collective is a kernel on the rank's stream: `all_reduce` returns
to the host at once, and while a peer is missing the kernel spins, the GPU at ~100% utilization and low
power, until every rank's kernel has arrived.  The host notices only at its next sync (`loss.item()`).
PyTorch's watchdog aborts a collective that has not finished within the process group's timeout (10
minutes by default) and takes the process down.  Two planes carry this over gloo (the real CPU coupling
between the rank processes):

* **The device plane** is what the GPUs show.  A collective queues a `cuda` collective kernel; when a
  rank's simulated GPU reaches it, that device thread joins a one-number all-reduce on a gloo group of
  its own, which completes only when every rank's GPU has reached the same kernel.  Until then the
  busy board marks the GPU spinning.  The watchdog bounds that wait.
* **The data plane** moves the numbers.  The math runs on the host (see `gputop.sim.cuda`), so the
  gradients are exchanged by an asynchronous gloo all-reduce started at launch, on the default group.
  What needs the exchanged values (writing averaged gradients back, the optimizer's update) runs on the
  host at its next use of the parameters (`fence()`: the next forward or `zero_grad`), where real CUDA
  would have queued it on the stream behind the collective.  With a sync in the loop, that fence never
  waits; without one, the host still runs ahead of the GPU as with real CUDA.

**gloo** (`GlooGroup`).  gloo all-reduces host memory, so the gradients must be off the GPU first: the
host waits for the stream, then in gloo's blocking all-reduce, and meanwhile its GPU idles.  As with DDP
on gloo, that happens inside `loss.backward()` (the last gradient's hook), so a waiting rank's stack
shows backward, then `all_reduce`.

The API reads like torch's::

    group = distributed.init_process_group("nccl", rendezvous, rank, world, timeout_s=600)
    model = distributed.DistributedDataParallel(model)   # gradients all-reduced from backward's hooks
    optimizer = distributed.StreamOrderedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    distributed.barrier()                                 # NCCL: the host waits in `barrier`, the GPU spins
"""

from __future__ import annotations

import datetime
import os
import resource
import sys
import time
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from gputop.sim import cuda

DEFAULT_TIMEOUT_S = 600.0  # PyTorch's default NCCL timeout: 10 minutes
GLOO_TIMEOUT = datetime.timedelta(days=1)  # the rendezvous's: ranks that start seconds apart still meet


def _set_collective_timeout(timeout_s: float, group: Optional[dist.ProcessGroup] = None) -> None:
    """The group's collectives time out after `timeout_s`, as NCCL's do under its watchdog: the flight recorder
    (TORCH_FR_BUFFER_SIZE) then carries the timeout the watchdog enforces.  Set after the rendezvous, which
    keeps `GLOO_TIMEOUT`; a torch without this private setter keeps that too (the watchdog still decides)."""
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is not None:
        setter(datetime.timedelta(seconds=timeout_s), group)


class NcclGroup:
    """Collectives as spinning kernels on the stream, the data exchanged beside them (see the module docstring)."""

    def __init__(self, rendezvous: str, rank: int, world: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.rank = rank
        self.world = world
        self.timeout_s = timeout_s
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=GLOO_TIMEOUT)
        self._device_group = dist.new_group(backend="gloo", timeout=GLOO_TIMEOUT)
        _set_collective_timeout(timeout_s)
        _set_collective_timeout(timeout_s, self._device_group)
        self._device_token = torch.zeros(1)  # used by the device thread alone
        self._sequence = 0  # collectives launched, as NCCL's SeqNum
        self._pending: list[tuple[Optional[dist.Work], Callable[[], None]]] = []  # host work behind the exchange

    # ---------------------------------------------------------------- device plane
    def launch_collective(self, op: str) -> None:
        self._sequence += 1
        sequence = self._sequence
        cuda.current_stream().launch_collective(lambda: self._wait_for_peers(sequence, op))

    def _wait_for_peers(self, sequence: int, op: str) -> None:
        """On the device thread: spin until every rank's GPU reached this collective, or the watchdog fires."""
        started = time.monotonic()
        work = dist.all_reduce(self._device_token, group=self._device_group, async_op=True)
        try:
            work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError:
            self._watchdog_timeout(sequence, op, time.monotonic() - started)

    def _watchdog_timeout(self, sequence: int, op: str, waited_s: float) -> None:
        """What PyTorch's NCCL watchdog does: say which collective timed out, then take the process down."""
        print(
            f"[rank{self.rank}]:[E ProcessGroupNCCL.cpp] [Rank {self.rank}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={sequence}, OpType={op}, Timeout(ms)={self.timeout_s * 1000:.0f}) ran for "
            f"{waited_s * 1000:.0f} milliseconds before timing out.\n"
            f"[rank{self.rank}]:[E ProcessGroupNCCL.cpp] [Rank {self.rank}] To avoid data inconsistency, we are "
            "taking the entire process down.",
            file=sys.stderr,
            flush=True,
        )
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort, without a core file
        os.abort()

    # ---------------------------------------------------------------- data plane
    def all_reduce(self, tensor: torch.Tensor, then: Optional[Callable[[], None]] = None) -> None:
        """Sum `tensor` over the ranks; returns at once.  `then` runs on the host once the sum is in (at the
        next fence)."""
        work = dist.all_reduce(tensor, async_op=True)
        self._pending.append((work, then or (lambda: None)))
        self.launch_collective("ALLREDUCE")

    def after_pending(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the host after the exchanges launched so far (at the next `fence`)."""
        self._pending.append((None, fn))

    def fence(self) -> None:
        """Before the host touches the parameters again: finish what waits on exchanged values, in order."""
        while self._pending:
            work, then = self._pending.pop(0)
            if work is not None:
                started = time.monotonic()
                try:
                    work.wait()
                except RuntimeError:  # the exchange timed out (`timeout_s`): what the watchdog does then
                    self._watchdog_timeout(self._sequence, "ALLREDUCE", time.monotonic() - started)
            then()

    def barrier(self) -> None:
        """On NCCL a one-number all-reduce on the GPU (as ProcessGroupNCCL does it), and the host waits for it."""
        self.launch_collective("ALLREDUCE")
        cuda.current_stream().value_when_drained(None)()  # waits in C: this frame, `barrier`, is innermost

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class GlooGroup:
    """gloo's blocking collectives on host memory: each first waits for the stream (see the module docstring)."""

    def __init__(self, rendezvous: str, rank: int, world: int) -> None:
        self.rank = rank
        self.world = world
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=GLOO_TIMEOUT)

    def all_reduce(self, tensor: torch.Tensor, then: Optional[Callable[[], None]] = None) -> None:
        cuda.current_stream().value_when_drained(None)()  # gloo reads host memory: the GPU's results first
        dist.all_reduce(tensor)  # sum over ranks; the ring order is fixed, so the result is deterministic
        if then is not None:
            then()

    def after_pending(self, fn: Callable[[], None]) -> None:
        fn()  # nothing is pending: every collective has completed on the host already

    def fence(self) -> None:
        pass

    def barrier(self) -> None:
        cuda.current_stream().value_when_drained(None)()
        dist.barrier()

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


ProcessGroup = Union[NcclGroup, GlooGroup]
_group: Optional[ProcessGroup] = None


def init_process_group(
    backend: str, rendezvous: str, rank: int, world: int, timeout_s: float = DEFAULT_TIMEOUT_S
) -> ProcessGroup:
    """`dist.init_process_group` for "nccl" (simulated, with its watchdog's `timeout_s`) or "gloo"."""
    global _group
    if backend == "nccl":
        _group = NcclGroup(rendezvous, rank, world, timeout_s)
    elif backend == "gloo":
        _group = GlooGroup(rendezvous, rank, world)
    else:
        raise ValueError(f"unknown backend {backend!r}: use nccl or gloo")
    return _group


def default_group() -> ProcessGroup:
    if _group is None:
        raise RuntimeError("call gputop.sim.distributed.init_process_group() first")
    return _group


def all_reduce(tensor: torch.Tensor) -> None:
    """`dist.all_reduce` on NCCL: returns at once; the sum is in `tensor` after the next sync or fence."""
    default_group().all_reduce(tensor)


def barrier() -> None:
    """`dist.barrier()`: see the group's `barrier`."""
    default_group().barrier()


class DistributedDataParallel(nn.Module):
    """DDP's shape: backward's hooks start one all-reduce of every gradient (from autograd, not from the
    training loop's own line), and the averaged gradients are in place by the next forward (NCCL) or at
    the end of backward (gloo)."""

    def __init__(self, module: nn.Module, group: Optional[ProcessGroup] = None) -> None:
        super().__init__()
        self.module = module
        self.group = group or default_group()
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._ready = 0
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, _param: torch.Tensor) -> None:
        self._ready += 1
        if self._ready < len(self._params):
            return
        self._ready = 0
        params = self._params
        flat = torch.cat([_grad(p).reshape(-1) for p in params])

        def write_back() -> None:
            flat.div_(self.group.world)
            offset = 0
            for p in params:
                n = p.numel()
                _grad(p).copy_(flat[offset : offset + n].view_as(p))
                offset += n

        self.group.all_reduce(flat, then=write_back)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.group.fence()
        return self.module(*args, **kwargs)


def _grad(param: torch.Tensor) -> torch.Tensor:
    """The gradient of a parameter that has one (every parameter once its gradient hook has run)."""
    grad = param.grad
    assert grad is not None
    return grad


class StreamOrderedOptimizer:
    """An optimizer whose `step()` returns at once, as a CUDA optimizer's launches do: on NCCL the update
    needs the exchanged gradients, so it runs on the host at the next fence (the next forward or
    `zero_grad`); on gloo they are in, and it runs at once."""

    def __init__(self, optimizer: torch.optim.Optimizer, group: Optional[ProcessGroup] = None) -> None:
        self.optimizer = optimizer
        self.group = group or default_group()

    def step(self) -> None:
        self.group.after_pending(self.optimizer.step)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.group.fence()
        self.optimizer.zero_grad(set_to_none=set_to_none)

"""Simulated NCCL for the demo job: collectives that are GPU kernels, and PyTorch's watchdog.

With NCCL a collective is a kernel on the rank's stream: `all_reduce` returns to the host at once,
and while a peer is missing the kernel spins, the GPU at ~100% utilization and low power, until every
rank's kernel has arrived.  The host notices only at its next sync (`loss.item()`).  PyTorch's
watchdog aborts a collective that has not finished within the process group's timeout (10 minutes by
default) and takes the process down.

Two planes carry this over gloo (the real CPU coupling between the rank processes):

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

The API reads like torch's::

    group = nccl.init_process_group(rendezvous, rank, world, timeout_s=600)
    model = nccl.DistributedDataParallel(model)       # gradients all-reduced from backward's hooks
    optimizer = nccl.StreamOrderedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    nccl.barrier()                                     # the host waits in `barrier`, the GPU spins
"""

from __future__ import annotations

import datetime
import os
import resource
import sys
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from gputop.sim import cuda

DEFAULT_TIMEOUT_S = 600.0  # PyTorch's default NCCL timeout: 10 minutes
GLOO_TIMEOUT = datetime.timedelta(days=1)  # gloo's own timeout stays out of the way: the watchdog decides


class ProcessGroup:
    def __init__(self, rendezvous: str, rank: int, world: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.rank = rank
        self.world = world
        self.timeout_s = timeout_s
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=GLOO_TIMEOUT)
        self._device_group = dist.new_group(backend="gloo", timeout=GLOO_TIMEOUT)
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
        """Sum `tensor` over the ranks; returns at once.  `then` runs on the host once the sum is in."""
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
                work.wait()
            then()

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


_group: Optional[ProcessGroup] = None


def init_process_group(rendezvous: str, rank: int, world: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> ProcessGroup:
    global _group
    _group = ProcessGroup(rendezvous, rank, world, timeout_s)
    return _group


def default_group() -> ProcessGroup:
    if _group is None:
        raise RuntimeError("call gputop.sim.nccl.init_process_group() first")
    return _group


def all_reduce(tensor: torch.Tensor) -> None:
    """`dist.all_reduce` on NCCL: returns at once; the sum is in `tensor` after the next sync or fence."""
    default_group().all_reduce(tensor)


def barrier() -> None:
    """`dist.barrier()` on NCCL: a one-number all-reduce on the GPU, and the host waits for it."""
    group = default_group()
    group.launch_collective("ALLREDUCE")  # barrier is an all-reduce of one value in ProcessGroupNCCL
    cuda.current_stream().value_when_drained(None)()  # waits in C: this frame, `barrier`, is innermost


class DistributedDataParallel(nn.Module):
    """DDP's shape: backward's hooks launch one all-reduce of every gradient (from autograd, not from the
    training loop's own line), and the averaged gradients are in place by the next forward."""

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
        flat = torch.cat([p.grad.reshape(-1) for p in params])

        def write_back() -> None:
            flat.div_(self.group.world)
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p))
                offset += n

        self.group.all_reduce(flat, then=write_back)

    def forward(self, *args, **kwargs):
        self.group.fence()
        return self.module(*args, **kwargs)


class StreamOrderedOptimizer:
    """An optimizer whose `step()` returns at once, as a CUDA optimizer's launches do: the update needs
    the exchanged gradients, so it runs on the host at the next fence (the next forward or `zero_grad`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, group: Optional[ProcessGroup] = None) -> None:
        self.optimizer = optimizer
        self.group = group or default_group()

    def step(self) -> None:
        self.group.after_pending(self.optimizer.step)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.group.fence()
        self.optimizer.zero_grad(set_to_none=set_to_none)

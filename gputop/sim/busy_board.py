"""A shared-memory board where simulated training ranks say when "their GPU" is busy.

The demo job has no GPU: each rank's simulated stream (`gputop.sim.cuda`) marks the
rank's slot busy while it runs a kernel.  The fake NVML library reads the board and
turns busy time into utilization, memory and power, so a rank that starves for data
shows a starving GPU.  A collective that waits for its peers is busy too, but marked
as a *spin*: NVML shows it at ~100% utilization and low power, as a NCCL kernel
waiting for a missing rank draws far less than a compute kernel.  One slot per rank
(not per GPU) so ranks never write the same bytes; several ranks may point at one
GPU (the "all ranks on cuda:0" bug).

Layout: a header (magic, slot count) then fixed-size slots of
  gpu (i32, -1 = free), pid (i32), memory bytes (i64),
  busy_total seconds (f64, closed busy periods), busy_since (f64, 0 = idle),
  spin_total seconds (f64, closed spin periods, a part of busy), spin_since (f64, 0 = not spinning),
  activity totals (6 x f64: the closed periods' `KernelMix` shares x seconds, GPM's counters),
  the running kernel's mix (6 x f64).
Each field is written with one aligned store, so a reader sees old or new
values, never torn ones; a reader may briefly miss a period that is closing,
which costs at most one sample's accuracy.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from typing import Optional

from gputop.sim.kernels import FP32_GEMM, IDLE, KernelMix

MAGIC = b"GPUTOPB3"
_HEADER = struct.Struct("<8sI4x")
# gpu, pid, memory, busy_total, busy_since, spin_total, spin_since, activity totals (6), running mix (6)
_SLOT = struct.Struct("<iiqdddd6d6d")
_NO_ACTIVITY = tuple(IDLE) * 2


def create_shared_file(path: str, size: int) -> mmap.mmap:
    """A new file of `size` zero bytes, private to this user (0600), mapped shared for other processes."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def open_shared_file(path: str) -> mmap.mmap:
    """Map an existing shared file (made by `create_shared_file` in another process) whole."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


class BusyBoard:
    def __init__(self, path: str, mm: mmap.mmap, slots: int, owner: bool) -> None:
        self.path = path
        self._mm = mm
        self.slots = slots
        self._owner = owner

    # ---------------------------------------------------------------- life
    @classmethod
    def create(cls, path: str, slots: int) -> "BusyBoard":
        mm = create_shared_file(path, _HEADER.size + slots * _SLOT.size)
        _HEADER.pack_into(mm, 0, MAGIC, slots)
        for slot in range(slots):
            _SLOT.pack_into(mm, _HEADER.size + slot * _SLOT.size, -1, 0, 0, 0.0, 0.0, 0.0, 0.0, *_NO_ACTIVITY)
        return cls(path, mm, slots, owner=True)

    @classmethod
    def open(cls, path: str) -> "BusyBoard":
        mm = open_shared_file(path)
        magic, slots = _HEADER.unpack_from(mm, 0)
        if magic != MAGIC:
            mm.close()
            raise ValueError(f"{path} is not a gputop busy board")
        return cls(path, mm, slots, owner=False)

    def close(self) -> None:
        self._mm.close()
        if self._owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    # ---------------------------------------------------------------- writer side (a rank)
    def _offset(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside 0..{self.slots - 1}")
        return _HEADER.size + slot * _SLOT.size

    def _read(self, slot: int) -> tuple[int, int, int, float, float, float, float]:
        return _SLOT.unpack_from(self._mm, self._offset(slot))[:7]

    def _read_activity(self, slot: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The slot's activity totals and its running kernel's mix (see the layout)."""
        values = _SLOT.unpack_from(self._mm, self._offset(slot))
        return values[7:13], values[13:19]

    def _write(self, slot: int, *fields: float, activity: tuple[float, ...] = _NO_ACTIVITY) -> None:
        _SLOT.pack_into(self._mm, self._offset(slot), *fields, *activity)

    def claim(self, slot: int, gpu: int, pid: int, memory_bytes: int) -> None:
        """A rank takes `slot`, bound to simulated GPU `gpu`, holding `memory_bytes` there."""
        self._write(slot, gpu, pid, memory_bytes, 0.0, 0.0, 0.0, 0.0)

    def release(self, slot: int) -> None:
        self._write(slot, -1, 0, 0, 0.0, 0.0, 0.0, 0.0)

    def begin_busy(self, slot: int, now: Optional[float] = None, *, spin: bool = False, mix: KernelMix = FP32_GEMM) -> None:
        """The slot's GPU starts running a kernel that keeps `mix` busy; `spin`: a collective waiting for its peers
        (low power)."""
        gpu, pid, memory, total, since, spin_total, spin_since = self._read(slot)
        if since == 0.0:
            now = time.monotonic() if now is None else now
            totals, _running = self._read_activity(slot)
            self._write(slot, gpu, pid, memory, total, now, spin_total, now if spin else 0.0, activity=totals + tuple(mix))

    def end_busy(self, slot: int, now: Optional[float] = None) -> None:
        gpu, pid, memory, total, since, spin_total, spin_since = self._read(slot)
        if since != 0.0:
            now = time.monotonic() if now is None else now
            ran = max(0.0, now - since)
            total += ran
            spin_total += max(0.0, now - spin_since) if spin_since else 0.0
            totals, running = self._read_activity(slot)
            totals = tuple(t + share * ran for t, share in zip(totals, running))
            # totals first, then the open marks: a reader between the two stores counts the period twice
            # for one sample at worst; the load model clips utilization to 100%.
            self._write(slot, gpu, pid, memory, total, since, spin_total, spin_since, activity=totals + running)
            self._write(slot, gpu, pid, memory, total, 0.0, spin_total, 0.0, activity=totals + tuple(IDLE))

    # ---------------------------------------------------------------- reader side (fake NVML)
    def busy_seconds(self, gpu: int, now: Optional[float] = None) -> tuple[float, float]:
        """Cumulative (busy, spinning) seconds of every slot bound to `gpu`, open periods included."""
        now = time.monotonic() if now is None else now
        busy = spin = 0.0
        for slot in range(self.slots):
            slot_gpu, _pid, _mem, busy_total, since, spin_total, spin_since = self._read(slot)
            if slot_gpu == gpu:
                busy += busy_total + (max(0.0, now - since) if since else 0.0)
                spin += spin_total + (max(0.0, now - spin_since) if spin_since else 0.0)
        return busy, spin

    def activity_seconds(self, gpu: int, now: Optional[float] = None) -> tuple[float, ...]:
        """Cumulative `KernelMix` shares x seconds of every slot bound to `gpu`, open periods included: the GPM
        counters the fake NVML serves (per metric, in `KernelMix` order)."""
        now = time.monotonic() if now is None else now
        out = [0.0] * len(IDLE)
        for slot in range(self.slots):
            slot_gpu, _pid, _mem, _busy, since = self._read(slot)[:5]
            if slot_gpu != gpu:
                continue
            totals, running = self._read_activity(slot)
            ran = max(0.0, now - since) if since else 0.0
            for metric, (total, share) in enumerate(zip(totals, running)):
                out[metric] += total + share * ran
        return tuple(out)

    def processes(self, gpu: int) -> list[tuple[int, int]]:
        """(pid, memory bytes) of every rank bound to `gpu`."""
        out = []
        for slot in range(self.slots):
            slot_gpu, pid, memory = self._read(slot)[:3]
            if slot_gpu == gpu and pid > 0:
                out.append((pid, memory))
        return out

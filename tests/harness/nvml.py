"""Fake-NVML helpers for the collector and pipeline tests."""

from __future__ import annotations


class ScriptedLoad:
    """A LoadModel whose answers the test sets directly."""

    def __init__(self, util=50.0, memory=None, processes=None):
        self.util = util  # float, or dict gpu -> float
        self.memory = memory
        self.procs = processes or {}

    def utilization(self, gpu, now):
        return self.util[gpu] if isinstance(self.util, dict) else self.util

    def memory_used(self, gpu, now):
        return self.memory

    def processes(self, gpu):
        return list(self.procs.get(gpu, []))

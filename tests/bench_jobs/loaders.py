"""DataLoader factories for `gputop bench --loader MODULE:FUNCTION` tests (known per-batch cost)."""

from __future__ import annotations

import os

from torch.utils.data import DataLoader

from tests.bench_jobs.train_job import CostlyDataset, CostlyStream

PREP_MS = float(os.environ.get("BENCH_PREP_MS", "60"))  # producer time per batch of 4
BATCH = 4


def make_loader() -> DataLoader:
    return DataLoader(CostlyDataset(400, PREP_MS / 1000 / BATCH, cpu=False), batch_size=BATCH, shuffle=True)


def make_stream() -> DataLoader:
    return DataLoader(CostlyStream(PREP_MS / 1000 / BATCH), batch_size=BATCH)


def not_a_loader() -> list:
    return [1, 2, 3]

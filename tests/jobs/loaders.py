"""DataLoader factories for `gputop bench --loader MODULE:FUNCTION` tests: the training job's samples,
at a known per-batch cost."""

from __future__ import annotations

import os

from torch.utils.data import DataLoader

from tests.jobs.train_job import Samples, Stream, parse_args

PREP_MS = os.environ.get("BENCH_PREP_MS", "60")  # producer time per batch of 4
BATCH = 4


def samples() -> Samples:
    return Samples(parse_args(["--batch-ms", PREP_MS, "--batch-size", str(BATCH), "--length", "400"]), rank=0)


def make_loader() -> DataLoader:
    return DataLoader(samples(), batch_size=BATCH, shuffle=True)


def make_stream() -> DataLoader:
    return DataLoader(Stream(samples()), batch_size=BATCH)


def not_a_loader() -> list:
    return [1, 2, 3]

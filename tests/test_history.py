"""The TUI's history (`History(dense=...)`): the newest snapshots at full rate, the older part thinned."""

from __future__ import annotations

from gputop.history import History
from tests.harness.histories import make_machine, make_snapshots


def _history(dense, count, capacity=60):
    snaps = make_snapshots(count, gpus=2, cores=4)
    history = History(make_machine(gpus=2, cores=4), capacity=capacity, dense=dense, sparse_every_s=5.0)
    for snap in snaps:
        history.append(snap)
    return history, snaps


def test_a_thinned_history_keeps_the_newest_at_full_rate_and_one_a_step_before_within_the_span():
    history, snaps = _history(dense=20, count=200)
    kept = list(history)
    assert kept[-20:] == snaps[-20:]  # the full-rate part
    older = kept[:-20]
    assert older and all(b.timestamp - a.timestamp >= 5.0 for a, b in zip(older, older[1:]))
    assert older[-1].timestamp < snaps[-20].timestamp
    # the span is what 60 snapshots at full rate cover, give or take one step
    assert snaps[-1].timestamp - kept[0].timestamp <= 60 + 5.0
    assert len(history) == len(kept) == 20 + 8  # (60 - 20) / 5
    assert history.latest is snaps[-1]
    assert history.window(10.0) == snaps[-11:]
    assert history.window(30.0) == [s for s in kept if s.timestamp >= snaps[-1].timestamp - 30.0]


def test_without_dense_every_snapshot_is_kept_and_a_copy_is_its_own():
    full, snaps = _history(dense=None, count=100)
    assert list(full) == snaps[-60:] and len(full) == 60
    thinned, _ = _history(dense=20, count=100)
    copy = thinned.copy()
    assert list(copy) == list(thinned) and copy.dense == 20
    copy.append(make_snapshots(101, gpus=2, cores=4)[-1])
    assert len(list(copy)) >= len(list(thinned)) and list(copy) != list(thinned)

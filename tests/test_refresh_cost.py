"""The TUI's steady cost must not grow with its history (issue 22's CPU bar: at most nvitop's).

The diagnosis judges the GPUs' health over a sliding window every few seconds; it judged every snapshot of
the window anew each time (120 snapshots x 8 GPUs), and every NVLink rule built the 18 `NvLinkLink`s of a
GPU on each read.  These tests count the work (calls, objects built), not time: a window that moved by a
few snapshots judges only those, the judgement equals a fresh one, and neither the window's judgement nor
the card's NVLink texts build `NvLinkLink`s.  The machine is the real pynvml wrappers over the fake library.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gputop.analysis import gpu_health
from gputop.analysis.gpu_health import NO_PEERS, GpuHealth, Peers, judge_gpu_window, judge_sample, judge_window, peers_of
from gputop.backend import SimulatedMachine
from gputop.gpu_fields import card_text
from gputop.model import GpuSample, NvLinkLink, NvLinks, Snapshot
from gputop.pipeline import Pipeline
from gputop.sim.fake_nvml import ManualClock
from gputop.tui.widgets.gpu_grid import GpuGrid

GPUS = 8
# faults whose rules read the NVLinks, the flickering PCIe link and the clock slowdowns, so the window's
# judgement has something in it to get wrong
SPEC = "h100-sxm-8+nvlink-down=1+pcie-degraded=2+thermal=5"


@pytest.fixture(scope="module")
def snapshots() -> list[Snapshot]:
    clock = ManualClock(1_700_000_000.0)
    with Pipeline(SimulatedMachine(SPEC, clock=clock)) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0  # the fake's 20 ms PCIe sampling sleep is not under test
        out = []
        for _ in range(40):
            clock.advance(1.0)
            out.append(pipeline.poll())
    return out


def fresh_judgement(window: list[Snapshot]) -> dict[int, GpuHealth]:
    """judge_window's answer worked out from the per-sample rules alone, with nothing reused."""
    series: dict[int, list[tuple[GpuSample, GpuHealth]]] = {}
    for snap in window:
        peers = peers_of(snap.gpus)
        for g in snap.gpus:
            series.setdefault(g.index, []).append((g, judge_sample(g, peers)))
    return {i: judge_gpu_window(i, judged) for i, judged in sorted(series.items())}


def count_judged(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the GPU samples judge_window judges (the module's judge_sample, wrapped)."""
    calls = [0]
    real = gpu_health.judge_sample

    def counting(gpu: GpuSample, peers: Peers = NO_PEERS) -> GpuHealth:
        calls[0] += 1
        return real(gpu, peers)

    monkeypatch.setattr(gpu_health, "judge_sample", counting)
    return calls


def test_a_window_moved_by_three_snapshots_judges_only_those(snapshots, monkeypatch):
    first, moved = snapshots[:30], snapshots[3:33]
    expected = fresh_judgement(moved)
    assert any(h.problems for h in expected.values())  # the faults show: there is a judgement to get wrong
    judged = count_judged(monkeypatch)
    judge_window(first)
    assert judged[0] == 30 * GPUS
    judged[0] = 0
    assert judge_window(moved) == expected
    assert judged[0] == 3 * GPUS  # the 27 snapshots both windows hold were judged once


def test_another_window_between_is_no_reason_to_judge_again(snapshots, monkeypatch):
    """The counter watch (`gputop check`'s rules on its own snapshots) judges between two diagnoses: the next
    diagnosis still reuses its last window's judgements."""
    window = snapshots[5:35]
    judge_window(window)
    judge_window(snapshots[38:40])
    judged = count_judged(monkeypatch)
    assert judge_window(window) == fresh_judgement(window)
    assert judged[0] == 0


def test_what_is_no_longer_kept_is_judged_again_and_right(snapshots, monkeypatch):
    """Only the last two calls' judgements are kept: after two other windows, the first is judged anew."""
    window = snapshots[5:35]
    judge_window(window)
    judge_window(snapshots[38:40])
    judge_window(snapshots[36:38])
    judged = count_judged(monkeypatch)
    assert judge_window(window) == fresh_judgement(window)
    assert judged[0] == 30 * GPUS


def test_an_equal_snapshot_that_is_another_object_is_judged_anew(snapshots, monkeypatch):
    """Reuse is by identity: a snapshot decoded again (a replay) is not mistaken for one judged before."""
    window = snapshots[:10]
    judge_window(window)
    copies = [Snapshot(**{f: getattr(s, f) for f in Snapshot.__dataclass_fields__}) for s in window]
    judged = count_judged(monkeypatch)
    assert judge_window(copies) == fresh_judgement(window)
    assert judged[0] == 10 * GPUS


def test_the_window_and_the_card_build_no_nvlink_objects(snapshots, monkeypatch):
    built = [0]
    real = NvLinks._link

    def counting(self: NvLinks, i: int) -> NvLinkLink:
        built[0] += 1
        return real(self, i)

    monkeypatch.setattr(NvLinks, "_link", counting)
    judge_window(snapshots[:20])
    latest = snapshots[-1]
    grid = GpuGrid()
    grid.snapshots, grid.gpu_count = [latest], len(latest.gpus)
    text = "\n".join(strip.text for strip in grid.build(160, 60))
    texts = [card_text(key, g) for g in latest.gpus for key in ("nvlink", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")]
    assert built[0] == 0
    # ...and what they read is what the links say, built the slow way
    for g in latest.gpus:
        assert g.nvlink is not None
        links = list(g.nvlink)
        assert g.nvlink.active_count() == sum(link.active for link in links)
        tx = [link.tx_bytes_per_s for link in links if link.tx_bytes_per_s is not None]
        assert g.nvlink.total("tx_bytes_per_s") == (sum(tx) if tx else None)
    assert "14/18" in texts[3 * 1]  # GPU 1: 4 of its 18 links down
    assert "GPU1 WARN" in text


def test_long_window_hiccup_search_runs_once_per_stride_over_fresh_copies_of_a_full_history(monkeypatch):
    """The TUI diagnoses a fresh copy of its history each time, and a full history drops its first sample each
    poll: the 600 s window's observations must still be built once per LONG_WINDOW_STRIDE_S, not each time.
    Counts collect_gpu_observations' calls (one per window built).  Two GPUs, not eight: the count does not depend
    on them, and eight made it a unit test near its 2 s budget (2.31 s in a CI run beside the measured tests)."""
    from gputop.analysis import diagnosis
    from gputop.analysis.thresholds import HICCUP_MAX_PERIOD_S, LONG_WINDOW_STRIDE_S
    from gputop.history import History

    clock = ManualClock(1_700_000_000.0)
    with Pipeline(SimulatedMachine("rtx-4090-2", clock=clock)) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0
        live = History(pipeline.machine, capacity=int(3 * HICCUP_MAX_PERIOD_S) + 20)
        for _ in range(live.capacity):
            clock.advance(1.0)
            live.append(pipeline.poll())
        calls = [0]
        real = diagnosis.collect_gpu_observations

        def counting(snaps, util_from=None):
            calls[0] += 1
            return real(snaps, util_from=util_from)

        monkeypatch.setattr(diagnosis, "collect_gpu_observations", counting)
        diagnoses = 20
        for _ in range(diagnoses):
            clock.advance(1.0)
            live.append(pipeline.poll())
            copy = live.copy()  # as the TUI hands its diagnosis thread
            diagnosis.diagnose(copy)
    # the copy is the TUI's history as it stood, however the live one moves on (a full ring drops its first)
    assert [s.timestamp for s in copy] == [s.timestamp for s in live]
    live.append(replace(live.latest, timestamp=live.latest.timestamp + 1.0))
    assert copy.latest.timestamp == live.latest.timestamp - 1.0 and len(copy) == len(live) == live.capacity
    long_windows = calls[0] - diagnoses  # one short window per diagnosis
    assert 1 <= long_windows <= diagnoses / LONG_WINDOW_STRIDE_S + 1

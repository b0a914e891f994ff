"""The agent's pieces in this process: the timing probe on a real DataLoader, the rate estimator,
the refusal reasons and the fork-safety helpers (the end-to-end runs are in test_bench.py)."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from gputop.inject import agent


class Squares(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.tensor(float(i * i))


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(5)


def test_probe_times_the_live_iterator_and_restores_the_original():
    original = _BaseDataLoaderIter.__dict__["__next__"]
    loader = DataLoader(Squares(), batch_size=4, shuffle=False)
    probe = agent.ConsumptionProbe(_BaseDataLoaderIter)
    probe.install()
    try:
        assert _BaseDataLoaderIter.__dict__["__next__"] is probe.wrapper
        batches = [b.tolist() for b in loader]  # StopIteration passes through: the loop ends normally
    finally:
        probe.restore()
    assert _BaseDataLoaderIter.__dict__["__next__"] is original
    assert batches == [[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0], [64.0, 81.0, 100.0, 121.0]]
    key = probe.dominant_loader()
    assert [ok for _s, _e, k, ok in probe.records if k == key] == [True, True, True, False]
    settings = probe.loaders[key]["settings"]
    assert settings["batch_size"] == 4 and settings["num_workers"] == 0 and settings["shuffle"] is False
    assert settings["sampler"].endswith("SequentialSampler") and settings["dataset"].endswith("Squares")
    assert probe.loaders[key]["refs"]["dataset"] is loader.dataset
    probe.release()
    assert probe.loaders[key]["refs"] == {}


def test_probe_restores_after_an_exception_and_leaves_a_foreign_patch_alone():
    original = _BaseDataLoaderIter.__dict__["__next__"]
    probe = agent.ConsumptionProbe(_BaseDataLoaderIter)
    with pytest.raises(RuntimeError):
        probe.install()
        try:
            raise RuntimeError("the agent failed mid-window")
        finally:
            probe.restore()
    assert _BaseDataLoaderIter.__dict__["__next__"] is original

    probe = agent.ConsumptionProbe(_BaseDataLoaderIter)
    probe.install()

    def someone_elses(it):  # e.g. a profiler patched it after us
        return original(it)

    try:
        _BaseDataLoaderIter.__next__ = someone_elses
        probe.restore()
        assert _BaseDataLoaderIter.__dict__["__next__"] is someone_elses
        assert "replaced by other code" in probe.restore_note
    finally:
        _BaseDataLoaderIter.__next__ = original


def test_summarize_gives_rate_wait_and_step():
    probe = agent.ConsumptionProbe(_BaseDataLoaderIter)
    # a batch every 100 ms, 60 ms of it waiting
    for i in range(11):
        probe.records.append((i * 0.1, i * 0.1 + 0.06, 1, True))
    got = probe.summarize(1, 0.0, 2.0)
    assert got["batches_per_s"] == pytest.approx(10.0)
    assert got["wait_per_batch_s"] == pytest.approx(0.06)
    assert got["wait_fraction"] == pytest.approx(0.6)
    assert got["step_s"] == pytest.approx(0.04)


def test_steady_rate_skips_the_start_burst_and_resists_a_late_arrival():
    # 4 workers, staggered 10 ms, 200 ms a batch each: 20 batches/s in steady state.
    arrivals = sorted(w * 0.01 + r * 0.2 for w in range(4) for r in range(1, 11))
    batches, seconds = agent._steady_rate([arrivals], 4)
    assert batches / seconds == pytest.approx(20.0, rel=0.02)
    skewed = list(arrivals)
    skewed[3] += 0.15  # the slowest worker's first batch was late (page faults after fork)
    batches, seconds = agent._steady_rate([sorted(skewed)], 4)
    assert batches / seconds == pytest.approx(20.0, rel=0.06)
    assert agent._steady_rate([[0.0, 0.1]], 4) == (0, 0.0)  # too short to say anything


def test_refuse_reason():
    loader = DataLoader(Stream(), batch_size=2)
    settings, refs = agent._describe_loader(loader)
    assert "IterableDataset" in agent.refuse_reason(settings, refs)
    settings, refs = agent._describe_loader(DataLoader(Squares(), batch_size=3, shuffle=True))
    assert agent.refuse_reason(settings, refs) is None
    assert settings["shuffle"] is True


def test_new_loader_draws_nothing_from_the_global_rng():
    loader = DataLoader(Squares(), batch_size=4, shuffle=True)
    settings, refs = agent._describe_loader(loader)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    notes: list = []
    fresh = agent.make_loader(torch, settings, refs, 0, None, notes)
    assert sorted(v for b in fresh for v in b.tolist()) == sorted(float(i * i) for i in range(12))
    assert torch.equal(torch.get_rng_state(), before)
    assert fresh is not loader and fresh.dataset is loader.dataset


@pytest.mark.integration  # a forked child
def test_privatize_read_only_files_gives_this_process_its_own_offset(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(100)))
    fd = os.open(path, os.O_RDONLY)
    try:
        shared = os.dup(fd)  # shares the open file description, as a forked child would
        os.lseek(fd, 10, os.SEEK_SET)
        pid = os.fork()
        if pid == 0:  # the child privatises, then moves its own offset far away
            code = 1
            try:
                agent._privatize_read_only_files()
                ok = os.lseek(fd, 0, os.SEEK_CUR) == 10  # same position as before
                os.lseek(fd, 90, os.SEEK_SET)
                code = 0 if ok else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.lseek(shared, 0, os.SEEK_CUR) == 10  # the parent's offset did not move
    finally:
        os.close(fd)
        os.close(shared)


@pytest.mark.integration  # a forked child
def test_detach_shared_channels_lets_the_parent_see_eof_while_the_child_lives():
    # The job holds both ends of a pipe and reads until EOF (the demo's "storage" does this); a forked
    # copy of the write end would keep that read blocked for as long as the sweep child lives.
    import select

    read_end, write_end = os.pipe()
    hold_r, hold_w = os.pipe()  # keeps the child alive until we are done
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            agent._detach_shared_channels(keep=(0, 1, 2, hold_r))
            os.read(hold_r, 1)  # blocks until the parent closes hold_w (or the test dies)
            code = 0
        finally:
            os._exit(code)
    try:
        os.close(hold_r)
        os.close(write_end)  # the job's writer finishes
        ready, _, _ = select.select([read_end], [], [], 5.0)
        assert ready, "the read stayed blocked: the child still held the write end"
        assert os.read(read_end, 10) == b""  # EOF while the child is still alive
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)
    finally:
        os.close(hold_w)
        os.waitpid(pid, 0)
        os.close(read_end)


def test_the_sweep_sizes_itself_from_the_memory_gputop_read_for_the_job():
    """The host's MemAvailable is not the job's: in a cgroup the job may have far less.  gputop reads the cgroup's
    room (memory.max over the job's processes) and hands it over in plan.json; the worker cap follows the smaller."""
    host = agent._memory_worker_cap()
    assert host is not None and host > 2  # this box has far more than three times this process free
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert agent._memory_worker_cap(memory_free=4 * rss) == 1  # half of four processes' worth, less the sweep's own
    assert agent._memory_worker_cap(memory_free=10**15) == host  # more room than the host has: the host's figure


def test_the_agent_waits_for_a_late_plan_as_long_as_its_sweep_would_have_run():
    """gputop's plan comes once it has read its own sampling; on a busy box that ended seconds after the agent's
    window, and a 2 s wait skipped the sweep ("gputop sent no plan").  The agent now waits as long as the sweep had
    (a late plan shortens the sweep by as much), at most PLAN_WAIT_MAX_S when gputop has gone away."""
    from gputop import bench

    for seconds in (12.0, 15.0, 60.0):
        passive = bench._passive_seconds(seconds, active=True)
        config = bench._agent_config(seconds, passive)
        assert config["plan_wait_seconds"] == min(bench.PLAN_WAIT_MAX_S, config["sweep_seconds"])
        # the whole bound still holds: window, wait and sweep within the seconds asked for
        assert config["consumption_seconds"] + config["sweep_seconds"] <= seconds
    assert bench._agent_config(12.0, bench._passive_seconds(12.0, active=True))["plan_wait_seconds"] > 2.0

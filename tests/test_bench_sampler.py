"""The passive tier: py-spy record's raw output parsed and classified, and a real job sampled."""

from __future__ import annotations

import time

import pytest

from gputop.analysis.stack_classes import IN_DATASET, WAITING_FOR_DATA
from gputop.collect.sampler import PassiveSampler, analyze, parse_raw
from tests.harness.train_jobs import start_job, truth

CMD = 'process 100:"python train.py"'
WORKER = 'process 100:"python train.py";process 200:"python train.py"'
WAIT = (
    "<module> (train.py:9);_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725);"
    "_MultiProcessingDataLoaderIter._next_data (torch/utils/data/dataloader.py:1505);"
    "_MultiProcessingDataLoaderIter._try_get_data (torch/utils/data/dataloader.py:1300);"
    "Queue.get (multiprocessing/queues.py:113);wait (multiprocessing/connection.py:1136)"
)
COMPUTE = "<module> (train.py:10);Module._wrapped_call_impl (torch/nn/modules/module.py:1775)"
RESTART = (
    "<module> (train.py:8);DataLoader.__iter__ (torch/utils/data/dataloader.py:505);"
    "_MultiProcessingDataLoaderIter.__init__ (torch/utils/data/dataloader.py:1176)"
)
WORKER_WORK = (
    "<module> (train.py:8);BaseProcess._bootstrap (multiprocessing/process.py:314);"
    "_worker_loop (torch/utils/data/_utils/worker.py:349);"
    "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:52);SlowDataset.__getitem__ (train.py:20)"
)
RAW = "\n".join(
    [
        f"{CMD};thread (100): MainThread;{WAIT} 60",
        f"{CMD};thread (100): MainThread;{COMPUTE} 30",
        f"{CMD};thread (100): MainThread;{RESTART} 10",
        f"{CMD};thread (101): QueueFeederThread;Thread._bootstrap (threading.py:1002) 99",
        f"{WORKER};thread (200): MainThread;{WORKER_WORK} 80",
        f"{WORKER};thread (200): MainThread;<module> (train.py:8);_worker_loop (torch/utils/data/_utils/worker.py:330);"
        "Queue.get (multiprocessing/queues.py:103) 20",
        "garbage line without a count",
    ]
)


def test_parse_raw_reads_pid_thread_frames_innermost_first_and_counts():
    samples = parse_raw(RAW)
    assert len(samples) == 6
    first = samples[0]
    assert (first.pid, first.thread_id, first.thread_name, first.count) == (100, 100, "MainThread", 60)
    assert first.frames[0].name == "wait" and first.frames[-1].name == "<module>"
    assert first.frames[1].filename == "multiprocessing/queues.py" and first.frames[1].line == 113
    worker = samples[4]
    assert worker.pid == 200  # the innermost "process" entry owns the thread
    assert worker.frames[0].name == "SlowDataset.__getitem__"


def test_analyze_counts_main_thread_states_and_worker_activity():
    found = analyze(parse_raw(RAW), rank_pid=100, worker_pids=[200])
    assert found["main_samples"] == 100  # the feeder thread is not the main thread
    assert found["wait_fraction"] == pytest.approx(0.70)  # 60 in __next__ + 10 in DataLoader.__iter__
    assert found["state_fractions"][WAITING_FOR_DATA] == pytest.approx(0.70)
    assert found["epoch_restart_fraction"] == pytest.approx(0.10)
    assert found["dataset_fraction"] == 0.0
    top_frame, share = found["hottest_worker_frames"][0]
    assert top_frame.startswith("SlowDataset.__getitem__") and share == pytest.approx(0.8)


def test_unnamed_threads_of_old_pythons_find_the_main_thread_by_its_module_frame():
    raw = (
        f"{CMD};thread (0x7F1CCAE2AB80);<module> (<string>:1) 70\n"
        f"{CMD};thread (0x7F1CCAE2AC00);_bootstrap (threading.py:930);run (threading.py:870) 30"
    )
    assert analyze(parse_raw(raw), rank_pid=100, worker_pids=[])["main_samples"] == 70


def test_analyze_num_workers_zero_counts_dataset_time_as_wait():
    single = (
        "<module> (t.py:9);_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725);"
        "_SingleProcessDataLoaderIter._next_data (torch/utils/data/dataloader.py:790);"
        "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:52);D.__getitem__ (t.py:5)"
    )
    raw = f"{CMD};thread (100): MainThread;{single} 40\n{CMD};thread (100): MainThread;{COMPUTE} 60"
    found = analyze(parse_raw(raw), rank_pid=100, worker_pids=[])
    assert found["state_fractions"][IN_DATASET] == pytest.approx(0.4)
    assert found["dataset_fraction"] == pytest.approx(0.4)
    assert found["wait_fraction"] == pytest.approx(0.4)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_job_wait_fraction_and_worker_cpu(spawn, tmp_path):
    # 2 workers, 80 ms of sleep per batch each -> 25 batches/s supply; 20 ms step -> ~50% waiting.
    job = start_job(spawn, tmp_path, "passive", "--workers", "2", "--batch-ms", "80", "--step-ms", "20", "--persistent")
    from gputop.collect.procfs import children_pids

    workers = children_pids(job.pid)
    assert len(workers) == 2
    sampler = PassiveSampler(job.pid, workers, seconds=3)
    t0 = time.monotonic()
    sampler.start()
    result = sampler.result()
    t1 = time.monotonic()
    real = truth(job.steps(), t0, t1)
    assert result.error is None
    assert result.main_samples > 150
    assert result.wait_fraction == pytest.approx(real["wait_fraction"], abs=0.08)
    assert result.dataset_fraction == 0.0
    assert {pid for pid, _ in result.worker_busy} == set(workers)
    assert all(0.0 <= share < 0.6 for _, share in result.worker_busy)  # they mostly sleep
    assert any("Samples.__getitem__" in frame for frame, _ in result.hottest_worker_frames)
    assert result.idle_cores is not None and result.cpu_count >= 1


@pytest.mark.slow
def test_sampler_reports_a_non_python_process(spawn):
    proc = spawn(["sleep", "30"])
    sampler = PassiveSampler(proc.pid, (), seconds=1)
    sampler.start()
    result = sampler.result()
    assert result.main_samples == 0
    assert "not a Python process" in result.error

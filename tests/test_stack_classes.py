"""Main-thread classification and worker aggregation on stacks captured from real jobs with py-spy.

The JSON under tests/fixtures/pyspy/ is verbatim `py-spy dump --json --nonblocking` output of
tests/jobs/train_loop.py, a torchrun gloo job and a small Adam loop (see the fixture names).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gputop.analysis import stack_classes as sc
from gputop.collect.stacks import parse_dump
from gputop.model import Frame, ProcessStacks, ThreadStack

FIXTURES = Path(__file__).parent / "fixtures" / "pyspy"
SITE = "/usr/lib/python3.11/site-packages"


def load(name: str, pid: int = 100) -> ProcessStacks:
    return parse_dump(pid, (FIXTURES / name).read_text(), timestamp=0.0)


@pytest.mark.parametrize(
    "fixture, label",
    [
        ("main_waiting_for_data.json", sc.WAITING_FOR_DATA),
        ("main_single_process_getitem.json", sc.IN_DATASET),
        ("main_forward.json", sc.FORWARD_BACKWARD),
        ("main_backward.json", sc.FORWARD_BACKWARD),
        ("main_optimizer_step.json", sc.OPTIMIZER_STEP),
        ("rank_all_reduce.json", sc.COLLECTIVE),
        ("rank_barrier.json", sc.COLLECTIVE),
        ("main_idle_sleep.json", sc.IDLE_OTHER),
        ("launcher_torchrun.json", sc.IDLE_OTHER),
    ],
)
def test_classify_real_main_threads(fixture, label):
    assert sc.classify_main_thread(load(fixture)) == label


def test_waiting_for_data_is_found_below_the_innermost_frame():
    main = sc.main_thread(load("main_waiting_for_data.json"))
    # the innermost frame is selector plumbing; __next__ sits eight frames further out
    assert main.frames[0].name == "_PollLikeSelector.select"
    assert "_BaseDataLoaderIter.__next__" in [f.name for f in main.frames[1:]]
    assert sc.classify_thread(main) == sc.WAITING_FOR_DATA


def test_main_thread_is_picked_among_helper_threads():
    stacks = load("main_waiting_for_data.json", pid=7251)
    assert [t.thread_name for t in stacks.threads] == ["QueueFeederThread", "QueueFeederThread", "MainThread"]
    assert sc.main_thread(stacks).thread_name == "MainThread"


def test_main_thread_falls_back_to_os_thread_id_equal_to_pid():
    stacks = load("main_waiting_for_data.json", pid=7251)
    unnamed = tuple(dataclasses.replace(t, thread_name=None) for t in stacks.threads)
    picked = sc.main_thread(dataclasses.replace(stacks, threads=unnamed))
    assert picked.os_thread_id == 7251


def test_main_thread_of_nothing_is_none_and_idle():
    empty = ProcessStacks(pid=1, timestamp=0.0, error="not a Python process")
    assert sc.main_thread(empty) is None
    assert sc.main_thread(None) is None
    assert sc.classify_main_thread(empty) == sc.IDLE_OTHER


def test_forked_worker_is_not_classified_by_its_parents_frames():
    # A fork()ed worker's stack still shows the rank's DataLoader.__iter__ below BaseProcess._bootstrap.
    worker = sc.main_thread(load("worker_in_getitem.json"))
    assert "DataLoader.__iter__" in [f.name for f in worker.frames]
    assert sc.classify_thread(worker) == sc.IN_DATASET
    assert sc.classify_main_thread(load("worker_idle.json")) == sc.IDLE_OTHER


def _with_inner(stacks: ProcessStacks, *frames: Frame) -> ThreadStack:
    main = sc.main_thread(stacks)
    return dataclasses.replace(main, frames=tuple(frames) + main.frames)


def test_synchronize_inside_forward_is_explicit_sync():
    # No CUDA here, so this one is built by hand: torch.cuda.synchronize() called from Linear.forward.
    sync = Frame("synchronize", f"{SITE}/torch/cuda/__init__.py", 1083)
    assert sc.classify_thread(_with_inner(load("main_forward.json"), sync)) == sc.EXPLICIT_SYNC
    event_sync = Frame("Event.synchronize", f"{SITE}/torch/cuda/streams.py", 225)
    assert sc.classify_thread(_with_inner(load("main_idle_sleep.json"), event_sync)) == sc.EXPLICIT_SYNC


def test_module_bookkeeping_outside_forward_is_not_forward_backward():
    # checkpointing: Module.state_dict lives in torch/nn/modules/module.py but is no forward pass
    frames = (
        Frame("Module._save_to_state_dict", f"{SITE}/torch/nn/modules/module.py", 2100),
        Frame("Module.state_dict", f"{SITE}/torch/nn/modules/module.py", 2200),
        Frame("save_checkpoint", "/home/u/train.py", 88),
    )
    assert sc.classify_thread(ThreadStack(1, "MainThread", 1, True, True, frames)) == sc.IDLE_OTHER


def test_backward_inside_optimizer_closure_is_forward_backward():
    backward = sc.main_thread(load("main_backward.json")).frames[:3]  # _engine_run_backward, backward, Tensor.backward
    closure_step = _with_inner(load("main_optimizer_step.json"), *backward)
    assert sc.classify_thread(closure_step) == sc.FORWARD_BACKWARD


def test_epoch_start_spawning_workers_counts_as_waiting_for_data():
    frames = (
        Frame("BaseProcess.start", "/usr/lib/python3.11/multiprocessing/process.py", 121),
        Frame("_MultiProcessingDataLoaderIter.__init__", f"{SITE}/torch/utils/data/dataloader.py", 1176),
        Frame("DataLoader._get_iterator", f"{SITE}/torch/utils/data/dataloader.py", 438),
        Frame("DataLoader.__iter__", f"{SITE}/torch/utils/data/dataloader.py", 505),
        Frame("main", "/home/u/train.py", 72),
    )
    thread = ThreadStack(1, "MainThread", 1, True, True, frames)
    assert sc.classify_thread(thread) == sc.WAITING_FOR_DATA


def test_dataset_called_without_dataloader_is_in_dataset():
    frames = (
        Frame("decode", "/home/u/data.py", 10),
        Frame("ImageNetDataset.__getitem__", "/home/u/data.py", 40),
        Frame("main", "/home/u/train.py", 12),
    )
    assert sc.classify_thread(ThreadStack(1, "MainThread", 1, True, True, frames)) == sc.IN_DATASET


def test_labels_are_the_contract_strings():
    assert sc.MAIN_THREAD_STATES == (
        "waiting for data",
        "in dataset code",
        "forward/backward",
        "optimizer step",
        "collective/barrier",
        "explicit sync",
        "idle/other",
    )


# ----------------------------------------------------------------- worker aggregation


def _pil_worker(pid: int, line: int) -> ProcessStacks:
    """A worker decoding a JPEG: the real in-__getitem__ worker stack with PIL frames on top."""
    real = load("worker_in_getitem.json", pid=pid)
    main = sc.main_thread(real)
    pil = (
        Frame("ImageFile.load", f"{SITE}/PIL/ImageFile.py", line),
        Frame("Image.convert", f"{SITE}/PIL/Image.py", 900),
    )
    threads = tuple(dataclasses.replace(t, frames=pil + t.frames) if t is main else t for t in real.threads)
    return dataclasses.replace(real, threads=threads)


def test_aggregate_six_of_eight_workers_in_pil():
    stacks = {pid: _pil_worker(pid, line=250 + pid) for pid in range(1, 7)}  # different lines, same function
    stacks[7] = load("worker_idle.json", pid=7)
    stacks[8] = load("worker_idle.json", pid=8)
    rows = sc.aggregate_worker_leaves(stacks, range(1, 9))
    assert rows == [("ImageFile.load (PIL/ImageFile.py)", 6, 8), (sc.WORKER_IDLE, 2, 8)]


def test_aggregate_skips_queue_plumbing_to_name_idle_workers():
    idle = sc.main_thread(load("worker_idle.json"))
    assert idle.frames[0].name == "_PollLikeSelector.select"  # plumbing on top
    assert sc.worker_activity(idle) == sc.WORKER_IDLE
    busy = sc.main_thread(load("worker_in_getitem.json"))
    assert sc.worker_activity(busy) == "SlowDataset.__getitem__ (train_loop.py)"


def test_worker_handing_over_a_batch_is_not_idle():
    idle = sc.main_thread(load("worker_idle.json"))
    loop_at = [f.name for f in idle.frames].index("_worker_loop")
    put = (
        Frame("Queue.put", "/usr/lib/python3.11/multiprocessing/queues.py", 94),
        Frame("_worker_loop", idle.frames[loop_at].filename, 378),
    )
    sending = dataclasses.replace(idle, frames=put + idle.frames[loop_at + 1 :])
    assert sc.worker_activity(sending) == sc.WORKER_SENDING


def test_aggregate_counts_workers_without_stacks():
    stacks = {
        1: load("worker_in_getitem.json", pid=1),
        2: ProcessStacks(pid=2, timestamp=0.0, error="process 2 has exited"),
    }
    rows = sc.aggregate_worker_leaves(stacks, [1, 2, 3])  # 3: never dumped
    assert rows == [(sc.WORKER_NO_STACK, 2, 3), ("SlowDataset.__getitem__ (train_loop.py)", 1, 3)]
    assert sc.aggregate_worker_leaves(stacks, []) == []


# ----------------------------------------------------------------- formatting


def test_format_frame_shortens_library_paths_and_keeps_user_file_names():
    adam = sc.main_thread(load("main_optimizer_step.json")).frames[3]
    assert sc.format_frame(adam) == "Adam.step (torch/optim/adam.py:248)"
    assert sc.format_frame(Frame("select", "/usr/lib/python3.11/selectors.py", 415)) == "select (selectors.py:415)"
    assert sc.format_frame(Frame("main", "/home/ünï/ß/train.py", 7)) == "main (train.py:7)"
    assert sc.format_frame(Frame("_run_code", "<frozen runpy>", 88)) == "_run_code (<frozen runpy>:88)"

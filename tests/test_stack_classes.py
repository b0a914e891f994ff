"""Main-thread classification and worker aggregation on stacks captured from real jobs with py-spy.

The JSON under tests/fixtures/pyspy/ is verbatim `py-spy dump --json --nonblocking` output of
tests/jobs/train_loop.py (now tests/jobs/train_job.py), a torchrun gloo job and a small Adam loop (see the fixture names).
tests/fixtures/pyspy/py310 ... py313/ hold the same scenes and more (DDP, Accelerate's dispatcher, a
printed tensor, datasets with plain class names), captured by tests/jobs/capture_pyspy_fixtures.py
with real torch 2.13 on each Python version.
"""

from __future__ import annotations

import dataclasses
import os
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


def test_epoch_start_is_dataloader_iter_on_any_version():
    for name in ("DataLoader.__iter__", "__iter__"):
        assert sc.is_epoch_start_frame(Frame(name, f"{SITE}/torch/utils/data/dataloader.py", 505))
    assert not sc.is_epoch_start_frame(Frame("Shards.__iter__", "/home/u/shards.py", 31))
    assert not sc.is_epoch_start_frame(Frame("_BaseDataLoaderIter.__next__", f"{SITE}/torch/utils/data/dataloader.py", 725))


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
        "waiting for data from rank 0",
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


# ----------------------------------------------------------------- version- and name-independent matching


def _bare(thread: ThreadStack) -> ThreadStack:
    """The same stack as py-spy prints it for a Python 3.10 target: bare function names, no thread name."""
    frames = tuple(dataclasses.replace(f, name=f.name.rsplit(".", 1)[-1]) for f in thread.frames)
    return dataclasses.replace(thread, frames=frames, thread_name=None, os_thread_id=None)


@pytest.mark.parametrize(
    "fixture",
    [
        "main_waiting_for_data.json",
        "main_single_process_getitem.json",
        "main_forward.json",
        "main_backward.json",
        "main_optimizer_step.json",
        "rank_all_reduce.json",
        "rank_barrier.json",
        "main_idle_sleep.json",
    ],
)
def test_bare_function_names_classify_like_qualified_ones(fixture):
    main = sc.main_thread(load(fixture))
    assert sc.classify_thread(_bare(main)) == sc.classify_thread(main)


def _thread(*frames: Frame) -> ThreadStack:
    return ThreadStack(1, "MainThread", 1, True, True, frames)


def test_dataset_is_what_the_fetcher_calls_whatever_its_class_name():
    # torchvision's CIFAR10 has no "Dataset" in its name; on 3.10 py-spy prints no class at all
    for name in ("CIFAR10.__getitem__", "__getitem__", "ImageFolder.__getitems__"):
        frames = (
            Frame("open", f"{SITE}/PIL/Image.py", 3300),
            Frame(name, f"{SITE}/torchvision/datasets/cifar.py", 118),
            Frame("<listcomp>", f"{SITE}/torch/utils/data/_utils/fetch.py", 52),
            Frame("_MapDatasetFetcher.fetch", f"{SITE}/torch/utils/data/_utils/fetch.py", 52),
            Frame("_SingleProcessDataLoaderIter._next_data", f"{SITE}/torch/utils/data/dataloader.py", 675),
            Frame("_BaseDataLoaderIter.__next__", f"{SITE}/torch/utils/data/dataloader.py", 631),
            Frame("main", "/home/u/train.py", 30),
        )
        assert sc.dataset_frame(frames).name == name
        assert sc.classify_thread(_thread(*frames)) == sc.IN_DATASET


def test_iterable_dataset_generator_is_dataset_code():
    frames = (
        Frame("read", "/home/u/shards.py", 20),
        Frame("Shards.__iter__", "/home/u/shards.py", 31),  # a generator: next() resumes __iter__
        Frame("_IterableDatasetFetcher.fetch", f"{SITE}/torch/utils/data/_utils/fetch.py", 33),
        Frame("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 349),
    )
    assert sc.dataset_frame(frames).name == "Shards.__iter__"
    assert sc.in_dataset_code(frames)


def test_collating_is_not_dataset_frame_but_is_input_pipeline():
    frames = (
        Frame("default_collate", f"{SITE}/torch/utils/data/_utils/collate.py", 398),
        Frame("_MapDatasetFetcher.fetch", f"{SITE}/torch/utils/data/_utils/fetch.py", 55),
        Frame("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 349),
    )
    assert sc.dataset_frame(frames) is None
    assert sc.in_dataset_code(frames)


def test_a_getitem_in_a_library_that_is_no_dataset_is_not_dataset_code():
    frames = (
        Frame("ParameterDict.__getitem__", f"{SITE}/torch/nn/modules/container.py", 800),
        Frame("main", "/home/u/train.py", 3),
    )
    assert sc.dataset_frame(frames) is None
    assert sc.classify_thread(_thread(*frames)) == sc.IDLE_OTHER


def test_worker_is_recognised_by_role_not_by_name():
    worker = load("worker_idle.json")
    assert sc.runs_worker_loop(worker)
    bare = dataclasses.replace(worker, threads=tuple(_bare(t) for t in worker.threads))
    assert sc.runs_worker_loop(bare)
    # torchdata's StatefulDataLoader runs its own copy of the loop
    stateful = _thread(Frame("_worker_loop", f"{SITE}/torchdata/stateful_dataloader/worker.py", 250))
    assert sc.runs_worker_loop(ProcessStacks(pid=1, timestamp=0.0, threads=(stateful,)))
    assert not sc.runs_worker_loop(load("main_waiting_for_data.json"))
    assert not sc.runs_worker_loop(None)


def test_torchdata_stateful_worker_is_a_worker_in_dataset_code():
    # a real StatefulDataLoader worker (captured from tests/jobs/framework_job.py torchdata, now train_job.py --loader stateful): /proc/PID/comm is
    # "python", not pt_data_worker, so only its role gives it away
    stacks = load("worker_torchdata_stateful.json")
    worker = sc.main_thread(stacks)
    assert sc.runs_worker_loop(stacks)
    assert sc.dataset_frame(sc.own_frames(worker)).name == "Samples.__getitem__"
    assert sc.worker_activity(worker) == "slow_sample (framework_job.py)"


def test_main_thread_without_name_or_native_id_is_the_last_listed():
    # py-spy on a 3.10 target may give neither thread name nor native id; it lists the newest thread first
    stacks = load("main_waiting_for_data.json", pid=7251)
    anonymous = tuple(dataclasses.replace(t, thread_name=None, os_thread_id=None) for t in stacks.threads)
    picked = sc.main_thread(dataclasses.replace(stacks, threads=anonymous))
    assert picked.frames == sc.main_thread(stacks).frames


# ----------------------------------------------------------------- host-device syncs


@pytest.fixture
def train_py(tmp_path):
    """A user training script whose lines the classifier reads (py-spy gives file and line)."""
    path = tmp_path / "train.py"
    path.write_text(
        "for step, (x, y) in enumerate(loader):\n"  # 1
        "    loss = model(x, y)\n"  # 2
        "    loss.backward()\n"  # 3
        "    total += loss.item()\n"  # 4
        "    preds.extend(out.argmax(-1).cpu())\n"  # 5
        "    ids = out.tolist()\n"  # 6
        "    torch.cuda.synchronize()\n"  # 7
        "    arr = out.detach().numpy()\n"  # 8
        "    log(step)\n"  # 9
    )
    return path


def _reader(frame: Frame):
    return sc.read_source_line(frame.filename, frame.line)


@pytest.mark.parametrize("line, call", [(4, ".item()"), (5, ".cpu()"), (6, ".tolist()"), (7, "synchronize()"), (8, ".numpy()")])
def test_user_line_calling_a_sync_is_explicit_sync(train_py, line, call):
    # real torch runs .item() in C: the innermost Python frame is the user's line
    top = Frame("train", str(train_py), line)
    thread = _thread(top, Frame("<module>", str(train_py), 20))
    assert sc.classify_thread(thread, _reader) == sc.EXPLICIT_SYNC
    point = sc.sync_point(thread.frames, _reader)
    assert point.frame == top and point.call == call
    # without the source the same stack says nothing
    assert sc.classify_thread(thread) == sc.IDLE_OTHER


def test_user_line_without_a_sync_is_not_one(train_py):
    thread = _thread(Frame("train", str(train_py), 9))
    assert sc.classify_thread(thread, _reader) == sc.IDLE_OTHER
    assert sc.sync_point(thread.frames, _reader) is None


def test_sync_is_read_only_off_the_innermost_frame(train_py):
    # the user's line calls .item(), but the stack is inside forward under it: compute, not a sync wait
    thread = _thread(
        Frame("Linear.forward", f"{SITE}/torch/nn/modules/linear.py", 125),
        Frame("Module._call_impl", f"{SITE}/torch/nn/modules/module.py", 1750),
        Frame("train", str(train_py), 4),
    )
    assert sc.classify_thread(thread, _reader) == sc.FORWARD_BACKWARD


def test_unreadable_source_is_no_sync(tmp_path):
    thread = _thread(Frame("train", str(tmp_path / "gone.py"), 4))
    assert sc.classify_thread(thread, _reader) == sc.IDLE_OTHER
    assert sc.read_source_line("<frozen runpy>", 3) is None


def test_main_thread_state_reads_the_source_through_the_process_root(train_py):
    import os

    top = Frame("train", str(train_py), 4)
    stacks = ProcessStacks(pid=os.getpid(), timestamp=0.0, threads=(_thread(top),))
    assert sc.classify_main_thread(stacks) == sc.EXPLICIT_SYNC
    assert sc.classify_main_thread(stacks, read_source=False) == sc.IDLE_OTHER


def test_printing_a_tensor_is_a_sync(train_py):
    thread = _thread(
        Frame("_tensor_str", f"{SITE}/torch/_tensor_str.py", 700),
        Frame("Tensor.__repr__", f"{SITE}/torch/_tensor.py", 590),
        Frame("train", str(train_py), 9),
    )
    assert sc.classify_thread(thread) == sc.EXPLICIT_SYNC
    assert sc.sync_point(thread.frames) == (thread.frames[2], "print(tensor)")  # the user's line to fix


def test_python_level_item_is_a_sync():
    # a simulated tensor's .item() waits in Python: the frame itself names the sync
    thread = _thread(
        Frame("wait", "/usr/lib/python3.11/threading.py", 320),
        Frame("SimTensor.item", "/work/gputop/sim/cuda.py", 80),
        Frame("train_step", "/work/gputop/sim/demo_job.py", 57),
    )
    assert sc.classify_thread(thread) == sc.EXPLICIT_SYNC
    assert sc.sync_point(thread.frames) == (thread.frames[2], ".item()")


def test_collective_is_a_collective_on_any_version():
    for name in ("all_reduce", "broadcast"):
        thread = _thread(
            Frame(name, f"{SITE}/torch/distributed/distributed_c10d.py", 2500),
            Frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
            Frame("train", "/home/u/train.py", 40),
        )
        assert sc.classify_thread(thread) == sc.COLLECTIVE


def test_ddp_backward_is_forward_backward_not_a_collective():
    # DDP's all-reduce runs on autograd's C++ threads: the main thread shows backward only
    for names in (("_engine_run_backward", "backward", "backward"), ("_engine_run_backward", "backward", "Tensor.backward")):
        thread = _thread(
            Frame(names[0], f"{SITE}/torch/autograd/graph.py", 829),
            Frame(names[1], f"{SITE}/torch/autograd/__init__.py", 364),
            Frame(names[2], f"{SITE}/torch/_tensor.py", 630),
            Frame("train", "/home/u/train.py", 41),
        )
        assert sc.classify_thread(thread) == sc.FORWARD_BACKWARD


def _dispatcher_rank(*inner: Frame) -> ThreadStack:
    return _thread(
        *inner,
        Frame("DataLoaderDispatcher._fetch_batches", f"{SITE}/accelerate/data_loader.py", 859),
        Frame("DataLoaderDispatcher.__iter__", f"{SITE}/accelerate/data_loader.py", 886),
        Frame("Trainer._inner_training_loop", f"{SITE}/transformers/trainer.py", 2400),
    )


def test_accelerate_dispatcher_broadcast_is_waiting_for_rank0_data():
    broadcast = (
        Frame("broadcast", f"{SITE}/torch/distributed/distributed_c10d.py", 2800),
        Frame("broadcast_object_list", f"{SITE}/torch/distributed/distributed_c10d.py", 3400),
        Frame("broadcast_object_list", f"{SITE}/accelerate/utils/operations.py", 695),
    )
    assert sc.classify_thread(_dispatcher_rank(*broadcast)) == sc.WAITING_FOR_RANK0_DATA
    assert sc.WAITING_FOR_RANK0_DATA in sc.INPUT_WAIT_STATES


def test_accelerate_dispatcher_rank0_fetching_is_waiting_for_data():
    fetching = (Frame("_BaseDataLoaderIter.__next__", f"{SITE}/torch/utils/data/dataloader.py", 631),)
    assert sc.classify_thread(_dispatcher_rank(*fetching)) == sc.WAITING_FOR_DATA


def test_a_collective_outside_the_dispatcher_stays_a_collective():
    # DDP-style all_reduce in the user's loop, no accelerate data loader on the stack
    thread = _thread(
        Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2500),
        Frame("reduce", f"{SITE}/accelerate/utils/operations.py", 800),
        Frame("train", "/home/u/train.py", 41),
    )
    assert sc.classify_thread(thread) == sc.COLLECTIVE


# ----------------------------------------------------------------- the same scenes on Python 3.10-3.13

VERSIONS = ("py310", "py311", "py312", "py313")
# scene -> (main-thread state, a DataLoader worker by role?, the dataset frame's function or None)
SCENES = {
    "main_waiting_for_data": (sc.WAITING_FOR_DATA, False, None),
    "worker_in_getitem": (sc.IN_DATASET, True, "__getitem__"),
    "worker_idle": (sc.IDLE_OTHER, True, None),
    "main_idle_sleep": (sc.IDLE_OTHER, False, None),
    "main_single_process_getitem": (sc.IN_DATASET, False, "__getitem__"),
    "main_backward": (sc.FORWARD_BACKWARD, False, None),
    "main_forward": (sc.FORWARD_BACKWARD, False, None),
    "main_optimizer_step": (sc.OPTIMIZER_STEP, False, None),
    "main_print_tensor": (sc.EXPLICIT_SYNC, False, None),
    "main_in_unnamed_dataset": (sc.IN_DATASET, False, "__getitem__"),  # class Images(Dataset)
    "worker_in_iterable_dataset": (sc.IN_DATASET, True, "__iter__"),  # class Shards(IterableDataset)
    "rank_all_reduce": (sc.COLLECTIVE, False, None),
    "rank_barrier": (sc.COLLECTIVE, False, None),
    "launcher_torchrun": (sc.IDLE_OTHER, False, None),
    "rank_ddp_backward": (sc.FORWARD_BACKWARD, False, None),
    "rank_dispatcher_broadcast": (sc.WAITING_FOR_RANK0_DATA, False, None),
    "rank0_dispatcher_fetching": (sc.IN_DATASET, False, "__iter__"),
}


def _reading(version: str, scene: str) -> tuple:
    """What gputop reads from one captured dump: state, worker role, dataset frame, worker activity kind."""
    stacks = load(f"{version}/{scene}.json")
    main = sc.main_thread(stacks)
    dataset = sc.dataset_frame(sc.own_frames(main))
    activity = sc.worker_activity(main) if sc.runs_worker_loop(stacks) else None
    return (
        sc.classify_main_thread(stacks, read_source=False),
        sc.runs_worker_loop(stacks),
        sc.function_name(dataset) if dataset is not None else None,
        activity if activity in (None, sc.WORKER_IDLE, sc.WORKER_SENDING) else "in " + sc.function_name(dataset),
    )


def test_every_version_has_every_scene():
    for version in VERSIONS:
        assert sorted(p.stem for p in (FIXTURES / version).glob("*.json")) == sorted(SCENES), version


@pytest.mark.parametrize("scene", sorted(SCENES))
def test_python_310_to_313_classify_identically(scene):
    readings = {version: _reading(version, scene) for version in VERSIONS}
    state, is_worker, dataset = SCENES[scene]
    assert readings["py311"][:3] == (state, is_worker, dataset)
    assert readings == {version: readings["py311"] for version in VERSIONS}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_main_thread_is_found_on_every_version(version):
    # the main thread runs the script's <module>; helper threads (queue feeders, gloo, autograd) never do
    for scene in SCENES:
        stacks = load(f"{version}/{scene}.json")
        main = sc.main_thread(stacks)
        assert any(sc.function_name(f) == "<module>" for f in main.frames), (version, scene)


def test_py310_dumps_have_bare_names_and_311_qualified():
    # the reason matching goes by file + function: the same frame as py-spy prints it per version
    def next_frame(version):
        main = sc.main_thread(load(f"{version}/main_waiting_for_data.json"))
        return next(f.name for f in main.frames if sc.is_waiting_for_data_frame(f))

    assert next_frame("py310") == "__next__"
    assert [next_frame(v) for v in VERSIONS[1:]] == ["_BaseDataLoaderIter.__next__"] * 3


SYNCING_SOURCE = """\
import functools


@functools.lru_cache()
def train_step(model, x):
    loss = model(x).sum()

    def log(value):
        print(value.item())  # a nested function: its own frame, not train_step's line

    loss.backward()
    return loss.item()  # the sync


def evaluate(model, batches):
    seen = [model(b).argmax().cpu() for b in batches]
    torch.cuda.synchronize()
    print("# seen", seen[0].item())  # a "#" in a string stays; a comment goes: x.item()
    return seen  # not a sync: a comment that says .cpu()
"""


def test_sync_lines_are_read_from_the_function_the_profiler_names(tmp_path, monkeypatch):
    """The profiler names a function by its first line (a decorator's, if any); the lines inside it that
    sync are read from the source, nested functions left out; a relative path is the target's cwd's."""
    (tmp_path / "train.py").write_text(SYNCING_SOURCE)
    path = str(tmp_path / "train.py")
    assert sc.sync_lines_in_function(path, 4, "train_step") == [(12, "return loss.item()")]
    assert sc.sync_lines_in_function(path, 15, "evaluate") == [
        (16, "seen = [model(b).argmax().cpu() for b in batches]"),
        (17, "torch.cuda.synchronize()"),
        (18, 'print("# seen", seen[0].item())'),
    ]
    # the wrong first line (another function of the same name), a missing file, unparsable source: nothing
    assert sc.sync_lines_in_function(path, 9, "train_step") == []
    assert sc.sync_lines_in_function(str(tmp_path / "gone.py"), 4, "train_step") == []
    (tmp_path / "broken.py").write_text("def train_step(:\n    x.item()\n")
    assert sc.sync_lines_in_function(str(tmp_path / "broken.py"), 1, "train_step") == []
    monkeypatch.chdir(tmp_path)  # a relative path is looked up in the target's working directory
    assert sc.sync_lines_in_function("train.py", 4, "train_step", pid=os.getpid()) == [(12, "return loss.item()")]


@pytest.mark.integration  # a Python under a C locale
def test_a_source_under_a_non_ascii_path_is_read_under_a_c_locale(tmp_path):
    """py-spy names a frame's file as it decoded it (UTF-8). Under LANG=C without PEP 538 coercion or UTF-8 mode
    Python's file-system encoding is ASCII, and opening that name as a str raised UnicodeEncodeError, which ended
    `gputop record` of a job under a Cyrillic folder whenever its main thread was sampled in the job's own code."""
    import subprocess
    import sys

    folder = tmp_path / "данные"
    folder.mkdir()
    (folder / "обучение.py").write_text("def step(x):\n    return x.item()  # the sync\n", encoding="utf-8")
    probe = (
        "import sys\n"
        "from gputop.analysis.stack_classes import read_source_line, sync_lines_in_function\n"
        "name = sys.argv[1].encode('ascii').decode('unicode_escape')  # the name as py-spy gives it: real characters\n"
        "print(sys.getfilesystemencoding(), ascii(read_source_line(name, 2)), sync_lines_in_function(name, 1, 'step'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "PYTHONUTF8") and not k.startswith("LC_")}
    env.update(LANG="C", LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    name = str(folder / "обучение.py").encode("unicode_escape").decode("ascii")
    ran = subprocess.run([sys.executable, "-c", probe, name], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split(" ", 1) == ["ascii", "'return x.item()  # the sync' [(2, 'return x.item()')]\n"]

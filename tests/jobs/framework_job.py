"""Tiny training jobs on the frameworks people train with, for tests/test_frameworks.py.

    python tests/jobs/framework_job.py FRAMEWORK --mode MODE --ready PREFIX [--devices N] [--iterable]

FRAMEWORK: lightning (Trainer.fit), hf (transformers Trainer, through Accelerate), torchdata (a loop
over a StatefulDataLoader), deepspeed (an engine from deepspeed.initialize, its DeepSpeedDataLoader;
run it under torchrun).  CPU only; the models are built from configs, nothing is downloaded.

MODE, the input pipeline's behaviour (2 DataLoader workers, 4 samples a batch):
* starved    each sample sleeps 40 ms, the step is tiny: the main thread waits for data
* tuned      samples are trivial, the step is tens of ms of compute: the loader keeps up
* hang       worker 0's 9th sample never returns (a read on a stalled mount)
* straggler  (2 ranks) rank 1's samples sleep 40 ms, rank 0's are trivial: rank 1 holds rank 0 up

With hf --iterable under 2 ranks, Accelerate's DataLoaderDispatcher has rank 0 alone read (and
broadcast every batch), so "starved" starves rank 0 and the other rank waits in the broadcast.

After WARM_STEPS optimizer steps (the first, in hang mode) each rank writes PREFIX.PID (its rank
inside), so a test waits on a condition.  Runs until killed.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

SAMPLE_S = 0.04
HANG_AFTER_SAMPLES = 8  # worker 0's 9th sample never returns: its 3rd batch (4 samples a batch) never comes
FEATURES = 64
WARM_STEPS = 10
_samples_here = 0  # samples this process has produced


def rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def slow_sample(mode: str) -> None:
    global _samples_here
    _samples_here += 1
    if mode == "starved" or (mode == "straggler" and rank() == 1):
        time.sleep(SAMPLE_S)  # stands in for a slow decode or read
    elif mode == "hang" and _samples_here > HANG_AFTER_SAMPLES:
        # counted per worker, not by index: the Trainer samples indices at random
        worker = torch.utils.data.get_worker_info()
        if worker is not None and worker.id == 0:
            time.sleep(1e6)  # the stalled read: never returns


class Samples(Dataset):
    """A map-style dataset (no "Dataset" in its name, like torchvision's CIFAR10)."""

    def __init__(self, mode: str, as_dict: bool = False) -> None:
        self.mode = mode
        self.as_dict = as_dict

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int):
        slow_sample(self.mode)
        return make_sample(index, self.as_dict)


class Stream(IterableDataset):
    """An iterable dataset: Accelerate dispatches it from rank 0 to the other ranks."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __iter__(self):
        index = 0
        while True:
            slow_sample(self.mode)
            yield make_sample(index, as_dict=True)
            index += 1


def make_sample(index: int, as_dict: bool):
    if as_dict:
        ids = torch.arange(16) % 64
        return {"input_ids": ids, "labels": ids}
    return torch.full((FEATURES,), float(index % 7))


class ReadyFile:
    """Writes PREFIX.PID once, after `steps` steps (atomically: a reader never sees it half-written).

    Past the warm-up (workers forked, prefetch queues filled), so the job is observed in its steady state."""

    def __init__(self, prefix: str, steps: int) -> None:
        self.prefix = prefix
        self.steps_left = steps
        self.done = False

    def __call__(self) -> None:
        self.steps_left -= 1
        if self.done or self.steps_left > 0:
            return
        tmp = f"{self.prefix}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(str(rank()))
        os.replace(tmp, f"{self.prefix}.{os.getpid()}")
        self.done = True


def mlp(mode: str) -> nn.Module:
    width = 1024 if mode == "tuned" else 32
    return nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))


def step_input(mode: str, batch: torch.Tensor) -> torch.Tensor:
    # tuned: ~150 ms of compute per batch, so two workers of trivial samples keep well ahead even when
    # the machine's cores are shared.  Receiving a batch still costs the main thread ~1.3 ms inside
    # `__next__` (IPC and unpickling); at 128 repeats (~40 ms a step) that was 3% of the step, close
    # enough to the 5% "moderately input-bound" line that 2 of the first 12 dumps landing there (about
    # 1 run in 15, more while py-spy takes CPU from the workers) read as input-bound.  Now it is <1%.
    return batch.repeat(512, 1) if mode == "tuned" else batch


def run_lightning(args: argparse.Namespace, ready: ReadyFile) -> None:
    import lightning as L
    from torch.utils.data import DataLoader

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(args.mode)

        def training_step(self, batch, batch_idx):
            return self.net(step_input(args.mode, batch)).pow(2).mean()

        def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
            ready()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )
    loader = DataLoader(Samples(args.mode), batch_size=4, num_workers=2, persistent_workers=True)
    trainer.fit(Model(), loader)


def run_hf(args: argparse.Namespace, ready: ReadyFile) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    class Ready(TrainerCallback):
        def on_step_end(self, *_args, **_kwargs):
            ready()

    tuned = args.mode == "tuned"
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=256 if tuned else 16, n_layer=4 if tuned else 1, n_head=2)
    training = TrainingArguments(
        output_dir=args.output_dir, use_cpu=True, per_device_train_batch_size=4 if not tuned else 32,
        dataloader_num_workers=2, dataloader_persistent_workers=True, max_steps=10**9,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
    )
    dataset = Stream(args.mode) if args.iterable else Samples(args.mode, as_dict=True)
    Trainer(model=GPT2LMHeadModel(config), args=training, train_dataset=dataset, callbacks=[Ready()]).train()


def run_torchdata(args: argparse.Namespace, ready: ReadyFile) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    model = mlp(args.mode)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = StatefulDataLoader(Samples(args.mode), batch_size=4, num_workers=2, persistent_workers=True)
    while True:
        for batch in loader:
            loss = model(step_input(args.mode, batch)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ready()


def run_deepspeed(args: argparse.Namespace, ready: ReadyFile) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no CUDA here: DeepSpeed's CPU accelerator, gloo/shm comms
    import deepspeed

    model = mlp(args.mode)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
        "data_sampling": {"num_workers": 2},  # DeepSpeedDataLoader's workers
    }
    engine, _opt, loader, _sched = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=Samples(args.mode), config=config
    )
    while True:
        for batch in loader:
            loss = engine(step_input(args.mode, batch)).pow(2).mean()
            engine.backward(loss)
            engine.step()
            ready()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=["lightning", "hf", "torchdata", "deepspeed"])
    p.add_argument("--mode", required=True, choices=["starved", "tuned", "hang", "straggler"])
    p.add_argument("--ready", required=True, help="each rank writes READY.PID after its first step")
    p.add_argument("--devices", type=int, default=1, help="lightning: ranks (DDP on gloo when >1)")
    p.add_argument("--iterable", action="store_true", help="hf: an IterableDataset (Accelerate dispatches it)")
    p.add_argument("--output-dir", default=None, help="hf: the Trainer's output directory (nothing is saved)")
    args = p.parse_args()
    torch.set_num_threads(1)  # 2 cores shared by many
    runs = {"lightning": run_lightning, "hf": run_hf, "torchdata": run_torchdata, "deepspeed": run_deepspeed}
    # a hung job makes only a couple of steps: it is ready after its first
    runs[args.framework](args, ReadyFile(args.ready, steps=1 if args.mode == "hang" else WARM_STEPS))


if __name__ == "__main__":
    main()

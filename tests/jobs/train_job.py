"""The one real PyTorch training job that tests and benchmarks start: a Dataset of known cost feeding a
DataLoader, a small MLP, SGD, and outputs a test can wait on and compare.  Every behaviour is an option;
tests/harness/train_jobs.py is the one place that builds its command lines.

    python tests/jobs/train_job.py [options]                       # one process
    torchrun --nproc-per-node 2 tests/jobs/train_job.py [options]   # gloo ranks (NCCL on CUDA), gradients all-reduced
    python tests/jobs/train_job.py --mp-spawn 2 [options]           # torch.multiprocessing ranks
    python tests/jobs/train_job.py --framework lightning|hf|deepspeed [options]

It imports nothing but torch (and the framework asked for), so it runs on any Python with torch and
still works when copied elsewhere (the drills copy it to a non-ASCII path).

The data.  Each sample costs ``--sample-ms`` (or ``--batch-ms`` split over a batch's samples; uniform up
to ``--sample-ms-max`` when given), spent asleep (``--spend sleep``: a read, so it scales with workers
even on two cores), spinning on the thread's CPU clock (``cpu``: slowed by contention, like decoding) or
spinning on the wall clock (``wall``).  ``--slow-rank R``: only rank R pays it (a straggler).
``--hang-after N``: the first worker (or the main process with ``--workers 0``) never returns its
(N+1)th sample, a read on a stalled mount.  Samples carry ``torch.rand`` noise drawn in the producing
process, so losses depend on the loader's seeds too; with ``--seed`` they are bit-identical run to run.

The step.  ``--forward-ms``/``--backward-ms`` are spent inside a custom autograd Function,
``--optimizer-ms`` inside the optimizer's ``step`` (so a profiler sees each phase where it belongs),
``--step-ms`` asleep after it (the simulated GPU); ``--gpu-ms`` instead makes each step (plain, lightning, hf)
last at least that long from its batch on, as a GPU overlapping the host's queued work does.
``--repeat K`` feeds the batch K times over (real compute: a compute-bound job), ``--width``/``--layers``
size the model: an MLP, or with ``--model conv`` a small CNN over 3x64x64 images of 10 classes.
``--device cuda`` trains on the rank's GPU (scripts/gpu_check.sh); ``--sync-every-step`` reads the loss back
each step, as most loops do (on CUDA: a host-device sync).
``--hang-rank R --hang-rank-after-s S``: rank R stops in plain Python after S seconds, outside any
collective, so its peers wait in the all-reduce.  ``--max-seconds S``: the process ends itself after S.

The outputs.  ``--ready PREFIX``: each rank writes ``PREFIX.PID`` (JSON: pid, rank, idle thread's TID)
once it has taken ``--ready-after`` steps.  ``--progress FILE``: the number of steps so far.
``--step-log PREFIX``: each rank appends a JSON line per step to ``PREFIX.RANK``: the loss (bit-exact
hex), the time spent waiting for the batch, ``time.time()`` at each phase boundary and the
``perf_counter`` at its end.  Every file is replaced atomically: a reader never sees half of one.
The job runs until killed, or for ``--steps``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

PR_SET_NAME = 15
PR_SET_DUMPABLE = 4
HANG_S = 1e6
IMAGE = (3, 64, 64)  # --model conv's samples
CLASSES = 10
_produced = 0  # samples this process (a worker, or the main process) has produced


# ----------------------------------------------------------------- where the time goes


def spin(seconds: float, clock) -> None:
    end = clock() + seconds
    while clock() < end:
        pass


def spend(seconds: float, how: str) -> None:
    if seconds <= 0:
        return
    if how == "sleep":
        time.sleep(seconds)
    else:
        spin(seconds, time.thread_time if how == "cpu" else time.perf_counter)


def simulated_gpu(began: float, args: argparse.Namespace) -> None:
    """--gpu-ms: a GPU that runs the step's kernels while the host queues them, so the step takes max(the host's
    work, the GPU's) from `began` (perf_counter when the batch was in hand): the host's Python, slowed by a busy
    box, hides under it."""
    spend(began + args.gpu_ms / 1000.0 - time.perf_counter(), "sleep")


def rank_from_env() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def in_first_worker() -> bool:
    worker = torch.utils.data.get_worker_info()
    return worker is None or worker.id == 0


# ----------------------------------------------------------------- the data


class Samples(Dataset):
    """A map-style dataset of known cost (no "Dataset" in its name, like torchvision's CIFAR10)."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.length = args.length
        self.shape = IMAGE if args.model == "conv" else (args.features,)
        self.as_dict = args.framework == "hf"
        self.how = args.spend
        self.sample_s = (args.batch_ms / args.batch_size if args.batch_ms is not None else args.sample_ms) / 1000.0
        self.sample_max_s = args.sample_ms_max / 1000.0 if args.sample_ms_max is not None else None
        self.hang_after = args.hang_after
        self.pays = args.slow_rank is None or args.slow_rank == rank

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        global _produced
        _produced += 1
        # counted per process, not by index: a shuffling sampler hands indices out at random
        if self.hang_after is not None and _produced > self.hang_after and in_first_worker():
            time.sleep(HANG_S)  # the stalled read: never returns
        if self.pays:
            seconds = random.uniform(self.sample_s, self.sample_max_s) if self.sample_max_s else self.sample_s
            if self.how == "sleep":
                time.sleep(seconds)  # here, not in spend(): the worker is seen waiting in __getitem__ itself
            else:
                spend(seconds, self.how)
        if self.as_dict:
            ids = torch.arange(16) % 64
            return {"input_ids": ids, "labels": ids}
        x = torch.full(self.shape, float(index % 17)) + torch.rand(self.shape)  # the producer's RNG
        if len(self.shape) > 1:
            return x, torch.tensor(index % CLASSES)
        return x, torch.tensor(float(index % 3))


class Stream(IterableDataset):
    """The same samples as an endless stream (Accelerate dispatches such a dataset from rank 0)."""

    def __init__(self, samples: Samples) -> None:
        self.samples = samples

    def __iter__(self):
        index = 0
        while True:
            yield self.samples[index]
            index += 1


def make_loader(args: argparse.Namespace, rank: int):
    samples = Samples(args, rank)
    dataset = Stream(samples) if args.iterable else samples
    options = {}
    if args.workers > 0:
        options["persistent_workers"] = args.persistent
        options["prefetch_factor"] = args.prefetch_factor
        if args.start_method:
            options["multiprocessing_context"] = args.start_method
    if args.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader as loader_class
    else:
        loader_class = DataLoader
    return loader_class(
        dataset,
        batch_size=args.batch_size,
        shuffle=args.shuffle and not args.iterable,
        num_workers=args.workers,
        pin_memory=args.pin_memory,
        **options,
    )


# ----------------------------------------------------------------- the model and the step


class Timed(torch.autograd.Function):
    """Identity whose forward and backward take known times."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s, how):
        ctx.backward_s, ctx.how = backward_s, how
        spend(forward_s, how)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        spend(ctx.backward_s, ctx.how)
        return grad, None, None, None


class TimedSGD(torch.optim.SGD):
    """SGD whose step takes a known time more."""

    def __init__(self, params, lr: float, step_s: float, how: str) -> None:
        super().__init__(params, lr=lr)
        self.step_s, self.how = step_s, how

    @torch.no_grad()
    def step(self, closure=None):
        spend(self.step_s, self.how)
        return super().step(closure)


def build_model(args: argparse.Namespace) -> nn.Module:
    if args.model == "conv":
        trunk = [
            nn.Conv2d(3, 64, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
        ]
        inputs, outputs = 128 * 16, CLASSES
    else:
        trunk, inputs, outputs = [], args.features, 1
    hidden = [m for _ in range(args.layers - 1) for m in (nn.Linear(args.width, args.width), nn.ReLU())]
    # dropout draws from the global RNG each step, so every loss depends on the seed
    return nn.Sequential(
        *trunk, nn.Linear(inputs, args.width), nn.ReLU(), *hidden, nn.Dropout(0.3), nn.Linear(args.width, outputs)
    )


def batch_loss(model, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace) -> torch.Tensor:
    if args.repeat > 1:  # the same batch many times over: real compute per step
        x, y = x.repeat(args.repeat, *[1] * (x.dim() - 1)), y.repeat(args.repeat)
    out = model(x)
    if args.forward_ms or args.backward_ms:
        out = Timed.apply(out, args.forward_ms / 1000.0, args.backward_ms / 1000.0, args.spend)
    if args.model == "conv":
        return nn.functional.cross_entropy(out, y)
    return nn.functional.mse_loss(out.squeeze(1), y)


# ----------------------------------------------------------------- what the job tells its tests


def write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def start_idle_thread(name: str) -> int:
    """An idle thread with this Python name and the same OS name (cut by the kernel to 15 bytes, which
    may halve a UTF-8 character, as real names are).  Torch's pin-memory thread is ``pt_data_pin``; CPU-only
    torch never starts it, so this stands in for it.  Returns its TID."""
    started = threading.Event()
    tid = []

    def idle() -> None:
        ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name.encode("utf-8")[:15]), 0, 0, 0)
        tid.append(threading.get_native_id())
        started.set()
        threading.Event().wait()

    threading.Thread(target=idle, name=name, daemon=True).start()
    started.wait()
    return tid[0]


class Outputs:
    """The ready file, the progress file and the step log of one rank; `done()` after each step."""

    def __init__(self, args: argparse.Namespace, rank: int, thread_tid: int) -> None:
        self.args, self.rank, self.thread_tid = args, rank, thread_tid
        self.steps = 0
        self.log = open(f"{args.step_log}.{rank}", "a", buffering=1) if args.step_log else None

    def done(self, loss=None, wait_s: float = 0.0, times: tuple = ()) -> bool:
        """Record a finished step; True when the job has taken all the steps it was asked to."""
        self.steps += 1
        if self.log is not None and loss is not None:
            self.log.write(
                json.dumps(
                    {
                        "step": self.steps,
                        "loss": loss.item().hex(),
                        "wait_s": wait_s,
                        "t": list(times),
                        "mono": time.perf_counter(),
                    }
                )
                + "\n"
            )
        if self.args.progress:
            write_atomically(self.args.progress, str(self.steps))
        if self.args.ready and self.steps == self.args.ready_after:
            # ranks share one prefix: the PID keeps any from overwriting another
            write_atomically(
                f"{self.args.ready}.{os.getpid()}",
                json.dumps({"pid": os.getpid(), "rank": self.rank, "thread_tid": self.thread_tid}),
            )
        return bool(self.args.steps) and self.steps >= self.args.steps


# ----------------------------------------------------------------- running as another user


# Imported lazily by the DataLoader when it starts its workers; after `become` the interpreter's own
# directory may be unreadable (root's 0700 home), so load them first.
_PRELOAD = (
    "multiprocessing.queues",
    "multiprocessing.synchronize",
    "multiprocessing.connection",
    "multiprocessing.popen_fork",
    "multiprocessing.reduction",
    "multiprocessing.resource_sharer",
    "multiprocessing.util",
    "torch.utils.data._utils.worker",
    "torch.utils.data._utils.signal_handling",
    "torch.utils.data._utils.pin_memory",
    "queue",
)


def become(user: str) -> None:
    import importlib
    import pwd

    for name in _PRELOAD:
        importlib.import_module(name)
    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
    os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
    # changing uid clears the dumpable flag (which would make /proc/PID root-owned); a process that
    # user started itself would be dumpable, so look like one
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


# ----------------------------------------------------------------- the loops


def start_debug_server() -> None:
    """torch.distributed.debug's servers (a worker server on this rank).  Rank 0's web frontend needs
    tabulate, jinja2 and aiohttp, which torch does not install: without them only the worker servers run."""
    import torch.distributed.debug as debug

    try:
        debug.start_debug_server(port=0)
    except ImportError:
        pass  # raised after the worker server started


def train(rank: int, args: argparse.Namespace) -> None:
    """The plain loop: one rank (under torchrun, a gloo group that all-reduces the gradients)."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("nccl" if cuda else "gloo")
        rank = dist.get_rank()
        if args.debug_server:
            start_debug_server()
    thread_tid = start_idle_thread(args.idle_thread) if args.idle_thread else 0
    model = build_model(args).to(device) if cuda else build_model(args)
    optimizer = TimedSGD(model.parameters(), lr=0.01, step_s=args.optimizer_ms / 1000.0, how=args.spend)
    loader = make_loader(args, rank)
    if args.become:
        become(args.become)
    extra = torch.ones(args.comm_floats) if args.comm_floats else None
    outputs = Outputs(args, rank, thread_tid)
    started = time.monotonic()
    while True:
        batches = iter(loader)
        # torch's SIGCHLD handler raises a dead worker's error wherever the main thread is (in the step too, not
        # only in next()): the whole epoch is inside the try, so where it lands does not decide the job's fate
        try:
            while True:
                t0, asked = time.time(), time.perf_counter()
                try:
                    x, y = next(batches)
                except StopIteration:
                    break  # the next epoch
                wait_s = time.perf_counter() - asked
                if cuda:
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                t1 = time.time()
                loss = batch_loss(model, x, y, args)
                t2 = time.time()
                optimizer.zero_grad()
                loss.backward()
                t3 = time.time()
                if distributed:
                    for param in model.parameters():
                        dist.all_reduce(param.grad)
                        param.grad /= dist.get_world_size()
                    if extra is not None:
                        dist.all_reduce(extra)
                t4 = time.time()
                optimizer.step()
                t5 = time.time()
                if args.step_ms:
                    time.sleep(args.step_ms / 1000.0)  # the simulated GPU
                simulated_gpu(asked + wait_s, args)
                if args.sync_every_step:
                    loss.item()  # the host waits for the step's end
                if rank == args.hang_rank and time.monotonic() - started > args.hang_rank_after_s:
                    threading.Event().wait()  # hung in plain Python: the peers wait in the all-reduce
                if outputs.done(loss, wait_s, (t0, t1, t2, t3, t4, t5)):
                    if distributed:
                        dist.destroy_process_group()
                    return
        except RuntimeError as exc:  # "DataLoader worker (pid(s) N) exited unexpectedly" / "is killed by signal"
            if not args.survive_worker_death or "DataLoader worker" not in str(exc):
                raise
            print(f"train_job: {exc}; starting a new DataLoader", flush=True)
            loader = make_loader(args, rank)


def run_lightning(args: argparse.Namespace) -> None:
    import lightning as L

    outputs = Outputs(args, rank_from_env(), 0)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = build_model(args)

        def setup(self, stage: str) -> None:
            outputs.rank = self.global_rank  # Lightning's own numbering, once its launcher has made the ranks

        def training_step(self, batch, batch_idx):
            return batch_loss(self.net, *batch, args)

        def on_train_batch_start(self, batch, batch_idx) -> None:
            self.began = time.perf_counter()  # the batch is in hand: the step (and the simulated GPU) starts

        def on_train_batch_end(self, out, batch, batch_idx) -> None:
            simulated_gpu(self.began, args)
            outputs.done()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    # Lightning's launcher starts ranks 1.. as this same command with LOCAL_RANK set
    trainer.fit(Module(), make_loader(args, rank_from_env()))


def run_hf(args: argparse.Namespace) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    outputs = Outputs(args, rank_from_env(), 0)

    class Done(TrainerCallback):
        began = 0.0

        def on_step_begin(self, *_args, **_kwargs):
            self.began = time.perf_counter()  # the batch is in hand: the step (and the simulated GPU) starts

        def on_step_end(self, *_args, **_kwargs):
            spend(args.step_ms / 1000.0, "sleep")  # --step-ms: the simulated GPU, as in the plain loop
            simulated_gpu(self.began, args)
            outputs.done()

    # built from a config: nothing is downloaded
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=args.width, n_layer=args.layers, n_head=2)
    training = TrainingArguments(
        output_dir=args.output_dir,
        use_cpu=True,
        per_device_train_batch_size=args.batch_size,
        dataloader_num_workers=args.workers,
        dataloader_persistent_workers=args.persistent,
        max_steps=10**9,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    samples = Samples(args, rank_from_env())
    dataset = Stream(samples) if args.iterable else samples
    Trainer(model=GPT2LMHeadModel(config), args=training, train_dataset=dataset, callbacks=[Done()]).train()


def run_deepspeed(args: argparse.Namespace) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no CUDA here: DeepSpeed's CPU accelerator, gloo/shm comms
    import deepspeed
    import deepspeed.ops

    # DeepSpeed's CPU accelerator JIT-compiles its shared-memory all-reduce (g++, ~85 s on 2 cores) on the first
    # run on a machine; a job on GPUs never builds it, and one rank has nothing to reduce, so the job says the op
    # is unavailable and TorchBackend keeps gloo, as it does wherever the op cannot be built.  Set before the
    # first read of the table, which would otherwise probe every op with the compiler.
    deepspeed.ops.__dict__.setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False

    outputs = Outputs(args, rank_from_env(), 0)
    model = build_model(args)
    config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
        "data_sampling": {"num_workers": args.workers},  # DeepSpeedDataLoader's workers
    }
    engine, _opt, loader, _sched = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=Samples(args, rank_from_env()), config=config
    )
    while True:
        for x, y in loader:
            loss = batch_loss(engine, x, y, args)
            engine.backward(loss)
            engine.step()
            outputs.done()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data = p.add_argument_group("data")
    data.add_argument("--sample-ms", type=float, default=0.0, help="cost of one sample")
    data.add_argument("--sample-ms-max", type=float, default=None, help="draw each sample's cost uniformly up to this")
    data.add_argument("--batch-ms", type=float, default=None, help="cost of one batch, split over its samples")
    data.add_argument(
        "--spend",
        choices=["sleep", "cpu", "wall"],
        default="sleep",
        help="how every cost is spent: asleep, spinning on thread CPU time, or on wall time",
    )
    data.add_argument("--slow-rank", type=int, default=None, help="only this rank's samples cost anything")
    data.add_argument(
        "--hang-after", type=int, default=None, metavar="N", help="the first worker never returns its (N+1)th sample"
    )
    data.add_argument("--length", type=int, default=1_000_000, help="samples per epoch")
    data.add_argument("--features", type=int, default=8)
    data.add_argument("--iterable", action="store_true", help="an IterableDataset instead of a map-style one")
    data.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=False)
    loader = p.add_argument_group("loader")
    loader.add_argument(
        "--loader", choices=["torch", "stateful"], default="torch", help="torch's DataLoader, or torchdata's StatefulDataLoader"
    )
    loader.add_argument("--workers", type=int, default=2)
    loader.add_argument("--batch-size", type=int, default=4)
    loader.add_argument("--pin-memory", action="store_true")
    loader.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    loader.add_argument("--prefetch-factor", type=int, default=2, help="batches each worker keeps ready")
    loader.add_argument(
        "--start-method", default=None, choices=["fork", "spawn", "forkserver"], help="the workers' multiprocessing context"
    )
    loader.add_argument(
        "--survive-worker-death",
        action="store_true",
        help="when a worker dies, log it and start a new DataLoader (as elastic jobs do)",
    )
    step = p.add_argument_group("step")
    step.add_argument("--model", choices=["mlp", "conv"], default="mlp", help="conv: a CNN over 3x64x64 images")
    step.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    step.add_argument("--sync-every-step", action="store_true", help="read the loss back every step")
    step.add_argument("--width", type=int, default=16, help="hidden width (hf: n_embd)")
    step.add_argument("--layers", type=int, default=1, help="hidden layers (hf: n_layer)")
    step.add_argument("--repeat", type=int, default=1, help="feed each batch this many times over")
    step.add_argument("--forward-ms", type=float, default=0.0)
    step.add_argument("--backward-ms", type=float, default=0.0)
    step.add_argument("--optimizer-ms", type=float, default=0.0)
    step.add_argument("--step-ms", type=float, default=0.0, help="asleep after each step (the simulated GPU)")
    step.add_argument(
        "--gpu-ms", type=float, default=0.0, help="a step lasts at least this long (a GPU overlapping the host's work)"
    )
    step.add_argument("--comm-floats", type=int, default=0, help="all-reduce this many more floats a step")
    step.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run until killed)")
    step.add_argument("--seed", type=int, default=1234)
    launch = p.add_argument_group("launch")
    launch.add_argument("--framework", choices=["plain", "lightning", "hf", "deepspeed"], default="plain")
    launch.add_argument("--devices", type=int, default=1, help="lightning: ranks (DDP on gloo when >1)")
    launch.add_argument("--output-dir", default=None, help="hf: the Trainer's output directory (nothing is saved)")
    launch.add_argument(
        "--mp-spawn", type=int, default=0, metavar="N", help="run N ranks via torch.multiprocessing.start_processes"
    )
    launch.add_argument(
        "--mp-start-method",
        default="spawn",
        choices=["spawn", "fork", "forkserver"],
        help="how --mp-spawn starts its ranks (fork is cheapest: no second import of torch)",
    )
    launch.add_argument("--hang-rank", type=int, default=None, metavar="R", help="this rank stops training ...")
    launch.add_argument("--hang-rank-after-s", type=float, default=20.0, metavar="S", help="... after S seconds")
    launch.add_argument("--max-seconds", type=float, default=None, help="the process ends itself after this")
    launch.add_argument("--debug-server", action="store_true", help="under torchrun: torch.distributed.debug's server")
    launch.add_argument("--idle-thread", default=None, metavar="NAME", help="start an idle thread of this name")
    launch.add_argument("--become", default=None, metavar="USER", help="after importing torch, drop to this user (root only)")
    out = p.add_argument_group("outputs")
    out.add_argument("--ready", default=None, metavar="PREFIX", help="each rank writes PREFIX.PID when ready")
    out.add_argument("--ready-after", type=int, default=1, metavar="STEPS")
    out.add_argument("--progress", default=None, metavar="FILE", help="the number of steps taken so far")
    out.add_argument("--step-log", default=None, metavar="PREFIX", help="one JSON line a step to PREFIX.RANK")
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.max_seconds:  # the bound: whatever state the job is in (a hang may be the point), it ends
        timer = threading.Timer(args.max_seconds, os._exit, (3,))
        timer.daemon = True
        timer.start()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(1)  # the test machine's few cores are shared by many
    if args.framework != "plain":
        {"lightning": run_lightning, "hf": run_hf, "deepspeed": run_deepspeed}[args.framework](args)
    elif args.mp_spawn:
        # the torch.multiprocessing.spawn pattern: this process only launches; each child is a rank
        torch.multiprocessing.start_processes(train, args=(args,), nprocs=args.mp_spawn, start_method=args.mp_start_method)
    else:
        train(rank_from_env(), args)


if __name__ == "__main__":
    main()

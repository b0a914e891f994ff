"""The benchmark agent: runs INSIDE the training process (live mode) or in a helper process (offline).

It is self-contained on purpose: the target may not have gputop installed, so this file imports only the
standard library, the torch the job already imported, and ``loader_math.py`` that gputop copies next to
it.  gputop copies both into a private run directory in the target's filesystem view, writes
``config.json`` there and injects a one-liner that starts a daemon thread executing this file.  Every
result goes back as JSON files in that directory (``progress.json``, ``result.json``, ``sweep.json``).

Live mode, in the agent thread:
  (a) consumption: ``_BaseDataLoaderIter.__next__`` is replaced at class level by a timing wrapper for a
      bounded window and ALWAYS restored (``finally``), which also hands us the live iterator;
  (b) the live loader's settings are read off that iterator (never ``iter()`` on the live loader: with
      persistent workers that resets the job's epoch);
  (c) the loader-only sweep runs in a forked child in its own process group: a NEW DataLoader over the same
      dataset, sampler kind, batch size and collate_fn, with an explicit ``torch.Generator`` (never the
      global RNG), so nothing in the job's Python state changes.  The child always ends with ``os._exit``;
      the agent kills its process group at the deadline and reaps it, so nothing is left behind.
The job's steps are timed during the sweep too, so the result says how much the sweep slowed the job.

Offline mode (``python agent.py --offline MODULE:FUNCTION RUN_DIR``): calls the factory for a DataLoader
and runs the same sweep in this (throwaway) process.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import stat
import sys
import threading
import time
import weakref

# For the type checker only: the agent imports nothing at run time that the job has not (mypy takes any name
# `TYPE_CHECKING` as true, so `typing` itself need not be imported here).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from torch.utils.data import DataLoader

    # What the agent writes and reads back: JSON objects (config.json, plan.json, result.json, sweep.json)
    Json = dict[str, Any]
    # loader_math.py executed into a namespace (`RunDir.load_sibling`): its functions by name
    Namespace = dict[str, Any]
    # (t_start, t_end, loader_key, ok) of one timed __next__ call
    Record = tuple[float, float, int, bool]

MAX_RECORDS = 200_000  # timing records kept (24 bytes-ish each): bounded memory whatever the step rate
MAX_TRACKED_ITERATORS = 16
MIN_CONFIG_SECONDS = 0.6  # a configuration measured for less than this says little
CHILD_EXIT_GRACE = 1.0  # seconds the sweep child gets past its own deadline before its group is killed
MEMORY_SHARE = 0.5  # new processes may use at most half of MemAvailable, counted at the job's RSS each


def _now() -> float:
    return time.monotonic()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


# ------------------------------------------------------------------------------------------- output


class RunDir:
    """The private run directory: atomic JSON writes, files created 0600."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write_json(self, name: str, data: Json) -> None:
        final = os.path.join(self.path, name)
        tmp = f"{final}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, final)

    def progress(self, fraction: float, message: str, **extra: object) -> None:
        try:
            self.write_json("progress.json", dict(extra, fraction=round(fraction, 3), message=message, time=time.time()))
        except OSError:
            pass  # progress is a courtesy; the result file is what counts

    def load_sibling(self, name: str) -> Namespace:
        """Execute a module shipped next to the agent (loader_math.py) into a fresh namespace."""
        path = os.path.join(self.path, name)
        with open(path) as f:
            code = compile(f.read(), path, "exec")
        namespace: Namespace = {"__name__": "gputop_agent_" + name.split(".")[0], "__file__": path}
        exec(code, namespace)
        return namespace


# ----------------------------------------------------------------------------------- (a) consumption


class ConsumptionProbe:
    """Times every call of ``_BaseDataLoaderIter.__next__`` by replacing it at class level.

    The wrapper only reads the clock and appends to a bounded deque; it passes every result and every
    exception (StopIteration included) through unchanged.  The first call from each iterator records
    that iterator's settings (and strong references to its dataset, sampler and collate_fn, which the
    sweep needs and which the iterator may drop at the end of an epoch).
    """

    def __init__(self, base_cls: type) -> None:
        self.base_cls = base_cls
        self.original: Callable[[object], object] | None = None
        self.wrapper: Callable[[object], object] | None = None
        self.records: collections.deque[Record] = collections.deque(maxlen=MAX_RECORDS)
        self.loaders: dict[int, dict[str, Any]] = {}  # loader_key -> {"settings": ..., "refs": ..., "iterators": set(ids)}
        self.restored = True
        self.restore_note: str | None = None

    def install(self) -> None:
        original = self.base_cls.__dict__["__next__"]
        records = self.records
        loaders = self.loaders
        describe = _describe_iterator

        def gputop_timed_next(it: object) -> object:
            started = time.perf_counter()
            ok = False
            try:
                value = original(it)
                ok = True
                return value
            finally:
                ended = time.perf_counter()
                key = id(getattr(it, "_index_sampler", it))
                entry = loaders.get(key)
                if entry is None and len(loaders) < MAX_TRACKED_ITERATORS:
                    try:
                        entry = loaders[key] = describe(it)
                    except Exception as exc:  # never let our bookkeeping break the job's step
                        entry = loaders[key] = {"error": _one_line(exc), "iterators": set(), "refs": {}}
                if entry is not None:
                    entry["iterators"].add(id(it))
                records.append((started, ended, key, ok))

        self.original = original
        self.wrapper = gputop_timed_next
        self.restored = False
        setattr(self.base_cls, "__next__", gputop_timed_next)

    def restore(self) -> None:
        if self.restored or self.original is None:
            return
        current = self.base_cls.__dict__.get("__next__")
        if current is self.wrapper:
            setattr(self.base_cls, "__next__", self.original)
        else:
            # Someone else (a profiler?) replaced it after us: putting ours back would undo theirs.
            self.restore_note = "DataLoader.__next__ was replaced by other code while measuring; left it as it is"
        self.restored = True

    def release(self) -> None:
        """Drop the references to the job's objects (datasets, samplers) once the sweep is done."""
        for entry in self.loaders.values():
            entry["refs"] = {}

    def dominant_loader(self) -> int | None:
        counts = collections.Counter(key for _s, _e, key, ok in list(self.records) if ok)
        if not counts:
            return None
        key, _ = counts.most_common(1)[0]
        return key

    def summarize(self, key: int, since: float, until: float) -> Json:
        """Batches/s and wait per batch for one loader between two perf_counter times."""
        calls = [(s, e) for s, e, k, ok in list(self.records) if k == key and ok and since <= s < until]
        stops = sum(1 for s, _e, k, ok in list(self.records) if k == key and not ok and since <= s < until)
        out: Json = {"batches": len(calls), "epoch_ends": stops, "window_s": round(until - since, 3)}
        if len(calls) < 2:
            return out
        span = calls[-1][0] - calls[0][0]
        waits = [e - s for s, e in calls[:-1]]  # calls inside the span
        if span <= 0:
            return out
        out["batches_per_s"] = (len(calls) - 1) / span
        out["wait_per_batch_s"] = sum(waits) / len(waits)
        out["wait_fraction"] = min(1.0, sum(waits) / span)
        out["step_s"] = max(0.0, span / (len(calls) - 1) - out["wait_per_batch_s"])
        return out


def _describe_iterator(it: object) -> dict[str, Any]:
    """Settings of a live DataLoader iterator (read-only attribute access) and refs the sweep needs."""
    index_sampler = getattr(it, "_index_sampler", None)
    workers = getattr(it, "_workers", None) or []
    start_method = None
    if workers:
        start_method = {"ForkProcess": "fork", "SpawnProcess": "spawn", "ForkServerProcess": "forkserver"}.get(
            type(workers[0]).__name__, type(workers[0]).__name__
        )
    settings = _common_settings(
        dataset=getattr(it, "_dataset", None),
        index_sampler=index_sampler,
        auto_collation=getattr(it, "_auto_collation", True),
        num_workers=getattr(it, "_num_workers", 0),
        prefetch_factor=getattr(it, "_prefetch_factor", None),
        pin_memory=getattr(it, "_pin_memory", False),
        persistent_workers=getattr(it, "_persistent_workers", False),
        drop_last=getattr(it, "_drop_last", False),
        timeout=getattr(it, "_timeout", 0),
        collate_fn=getattr(it, "_collate_fn", None),
        dataset_kind=getattr(it, "_dataset_kind", None),
    )
    settings["start_method"] = start_method
    refs = {
        "dataset": getattr(it, "_dataset", None),
        "index_sampler": index_sampler,
        "collate_fn": getattr(it, "_collate_fn", None),
        "worker_init_fn": getattr(it, "_worker_init_fn", None),
    }
    return {"settings": settings, "refs": refs, "iterators": set(), "iterator_ref": weakref.ref(it)}


def _describe_loader(loader: DataLoader[Any]) -> tuple[Json, dict[str, object]]:
    """Settings of a DataLoader object (offline mode) in the same shape as `_describe_iterator`."""
    settings = _common_settings(
        dataset=loader.dataset,
        index_sampler=loader._index_sampler,
        auto_collation=loader._auto_collation,
        num_workers=loader.num_workers,
        prefetch_factor=loader.prefetch_factor,
        pin_memory=loader.pin_memory,
        persistent_workers=loader.persistent_workers,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        collate_fn=loader.collate_fn,
        dataset_kind=loader._dataset_kind,
    )
    ctx = loader.multiprocessing_context
    settings["start_method"] = ctx.get_start_method() if ctx is not None else None
    refs = {
        "dataset": loader.dataset,
        "index_sampler": loader._index_sampler,
        "collate_fn": loader.collate_fn,
        "worker_init_fn": loader.worker_init_fn,
    }
    return settings, refs


def _name_of(obj: object) -> str:
    if obj is None:
        return "None"
    target = obj if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(obj).__name__)}"


def _common_settings(
    *,
    dataset: Any,
    index_sampler: object,
    auto_collation: object,
    num_workers: int | None,
    prefetch_factor: int | None,
    pin_memory: object,
    persistent_workers: object,
    drop_last: object,
    timeout: float,
    collate_fn: object,
    dataset_kind: int | None,
) -> Json:
    sampler = getattr(index_sampler, "sampler", index_sampler) if auto_collation else index_sampler
    batch_size = getattr(index_sampler, "batch_size", None) if auto_collation else None
    try:
        length = len(dataset)
    except Exception:
        length = None
    return {
        "dataset": _name_of(dataset),
        "dataset_len": length,
        "dataset_kind": "iterable" if dataset_kind == 1 else "map",  # torch's _DatasetKind.Iterable == 1
        "batch_size": batch_size,
        "auto_collation": bool(auto_collation),
        "batch_sampler": _name_of(index_sampler) if auto_collation else None,
        "sampler": _name_of(sampler),
        "shuffle": _sampler_kind(sampler) == "random",
        "collate_fn": _name_of(collate_fn),
        "num_workers": int(num_workers or 0),
        "prefetch_factor": prefetch_factor if num_workers else None,
        "pin_memory": bool(pin_memory),
        "persistent_workers": bool(persistent_workers),
        "drop_last": bool(drop_last),
        "timeout": timeout,
    }


def _sampler_kind(sampler: object) -> str:
    names = [c.__name__ for c in type(sampler).__mro__]
    if "RandomSampler" in names:
        return "random"
    if "SequentialSampler" in names:
        return "sequential"
    if "DistributedSampler" in names:
        return "distributed-shuffled" if getattr(sampler, "shuffle", False) else "distributed-sequential"
    return "custom"


# ----------------------------------------------------------------------------------- (c) the sweep


def refuse_reason(settings: Json, refs: dict[str, object]) -> str | None:
    """Why a new DataLoader over this dataset would not be safe or meaningful; None when it is."""
    if settings.get("dataset_kind") == "iterable":
        return "IterableDataset: re-iterating it may consume or disturb the job's stream; loader-only sweep not tried"
    if refs.get("dataset") is None:
        return "the live iterator no longer holds its dataset; loader-only sweep not tried"
    if settings.get("auto_collation") and settings.get("batch_size") is None:
        return (
            f"custom batch_sampler ({settings.get('batch_sampler')}) without a batch_size: its state "
            "cannot be copied safely; loader-only sweep not tried"
        )
    return None


def make_loader(
    torch_mod: ModuleType, settings: Json, refs: dict[str, Any], num_workers: int, prefetch_factor: int | None, notes: list[str]
) -> DataLoader[Any]:
    """A NEW DataLoader like the live one. The explicit Generator keeps the global RNG untouched."""
    from torch.utils.data import DataLoader

    kind = _sampler_kind(getattr(refs["index_sampler"], "sampler", refs["index_sampler"]))
    shuffle = kind in ("random", "distributed-shuffled")
    if kind == "custom" and "custom sampler" not in " ".join(notes):
        notes.append(f"custom sampler {settings.get('sampler')} replaced by a sequential one for the sweep")
    generator = torch_mod.Generator()
    generator.manual_seed(0)
    kwargs: dict[str, Any] = dict(
        batch_size=settings.get("batch_size") if settings.get("auto_collation") else None,
        shuffle=shuffle,
        drop_last=bool(settings.get("drop_last")),
        collate_fn=refs.get("collate_fn"),
        num_workers=num_workers,
        pin_memory=False,  # a forked copy cannot use CUDA; pin_memory is advised, not measured
        worker_init_fn=refs.get("worker_init_fn"),
        generator=generator,
    )
    if num_workers > 0:
        kwargs["prefetch_factor"] = prefetch_factor or 2
        kwargs["multiprocessing_context"] = "fork"
    return DataLoader(refs["dataset"], **kwargs)


def _steady_rate(segments: list[list[float]], first_round: int) -> tuple[float, float]:
    """(batches, seconds) of steady state from arrival times, skipping each segment's first round.

    All n workers start together, so the first n batches arrive in a burst: the fit starts at the n-th
    arrival and ends on a whole number of rounds.  The rate is a least-squares slope of batch index
    over time, so one late or early arrival at either end does not swing it the way a two-point
    difference would.  Returned as (batches, seconds) with batches / seconds == the fitted rate.
    """
    batches = 0.0
    seconds = 0.0
    for arrivals in segments:
        k0 = max(1, first_round)
        if len(arrivals) < 2 * k0 + 1:
            continue
        k = k0 + ((len(arrivals) - k0) // k0) * k0
        times = arrivals[k0 - 1 : k]
        count = len(times)
        mean_t = sum(times) / count
        mean_i = (count - 1) / 2.0
        var_t = sum((t - mean_t) ** 2 for t in times)
        if var_t <= 0:
            continue
        slope = sum((t - mean_t) * (i - mean_i) for i, t in enumerate(times)) / var_t  # batches per second
        span = times[-1] - times[0]
        batches += slope * span
        seconds += span
    return batches, seconds


def measure_config(
    torch_mod: ModuleType,
    settings: Json,
    refs: dict[str, Any],
    num_workers: int,
    prefetch_factor: int | None,
    seconds: float,
    notes: list[str],
) -> Json:
    """Draw batches from a new loader for `seconds` (plus start-up) and return its steady rate."""
    loader = make_loader(torch_mod, settings, refs, num_workers, prefetch_factor, notes)
    result: Json = {"num_workers": num_workers, "prefetch_factor": prefetch_factor if num_workers else None, "pin_memory": False}
    started = _now()
    cpu_before = _cpu_seconds()
    segments: list[list[float]] = []
    arrivals: list[float] = []
    iterator = iter(loader)
    first_at: float | None = None
    end = float("inf")  # set at the first batch
    try:
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                if not arrivals:
                    notes.append("the dataset yields no batches; nothing to measure")
                    break
                # One epoch caps the batches; a new epoch is a new segment (its start-up is not counted).
                segments.append(arrivals)
                arrivals = []
                _shutdown(iterator)
                iterator = iter(loader)
                continue
            t = _now()
            del batch
            arrivals.append(t)
            if first_at is None:
                first_at = t
                end = t + seconds
            if t >= end:
                break
    finally:
        segments.append(arrivals)
        _shutdown(iterator)
    batches, span = _steady_rate(segments, num_workers)
    wall = max(1e-9, _now() - started)
    cpu = _cpu_seconds() - cpu_before  # workers were joined by _shutdown, so their CPU time is counted
    result["startup_s"] = round((first_at or _now()) - started, 4)
    result["batches"] = sum(len(s) for s in segments)
    if result["batches"]:
        result["cpu_s_per_batch"] = cpu / result["batches"]
    result["cores_used"] = round(cpu / wall, 3)
    if batches and span > 0:
        result["batches_per_s"] = batches / span
    else:
        total = result["batches"]
        result["batches_per_s"] = total / max(1e-9, _now() - started) if total else 0.0
        result["note"] = "too few batches for a steady-state rate; start-up included"
    return result


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the sweep's DataLoader workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _shutdown(iterator: object) -> None:
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def run_sweep(
    torch_mod: ModuleType,
    settings: Json,
    refs: dict[str, Any],
    plan: Json,
    run_dir: RunDir,
    loader_math: Namespace,
    deadline: float,
    progress: Callable[[str], None] | None = None,
) -> Json:
    """Baseline (current settings), then more workers, then a larger prefetch: within `deadline`."""
    notes: list[str] = []
    configs: list[Json] = []
    out: Json = {"configs": configs, "notes": notes}
    n_now = int(settings.get("num_workers") or 0)
    p_now = settings.get("prefetch_factor") or 2
    step_s = plan.get("step_s")

    def remaining() -> float:
        return deadline - _now()

    overhead = [0.3]  # start-up + shutdown of the last configuration: kept out of its measuring time

    def measure(n: int, p: int, share: float) -> Json | None:
        budget = remaining() - overhead[0]
        seconds = max(MIN_CONFIG_SECONDS, min(budget * share, plan.get("config_seconds") or 3.0))
        if budget < MIN_CONFIG_SECONDS:
            notes.append(f"num_workers={n}, prefetch_factor={p}: not tried, the time bound was reached")
            return None
        if progress:
            progress(f"loader alone: num_workers={n}" + (f", prefetch_factor={p}" if n else ""))
        began = _now()
        cfg = measure_config(torch_mod, settings, refs, n, p, seconds, notes)
        overhead[0] = max(overhead[0], _now() - began - seconds)
        configs.append(cfg)
        run_dir.write_json("sweep.json", out)  # partial results survive a kill at the deadline
        return cfg

    base = measure(n_now, p_now, 0.3)
    if base is None or not base.get("batches_per_s"):
        return out
    # The training's own figure when it is input-bound (measured before this sweep competed with it),
    # else what the loader alone did with the current settings.
    prep_s = loader_math["live_prep_time"](n_now, plan.get("consumption")) or loader_math["prep_time_from_rate"](
        n_now, base["batches_per_s"]
    )
    # How many workers the idle cores can keep busy depends on how much of a core each one burns.
    core_share = loader_math["core_share_per_worker"](base)
    cap = loader_math["worker_cap"](
        n_now,
        float(plan.get("free_cores") or 0.0),
        int(plan.get("ranks_on_host") or 1),
        core_share,
        int(plan.get("hard_max_workers") or loader_math["HARD_MAX_WORKERS"]),
    )
    mem_cap = _memory_worker_cap(plan.get("memory_free"))
    if mem_cap is not None and mem_cap < cap:
        notes.append(f"workers capped at {mem_cap} by free memory (each new process may grow to the job's size)")
        cap = max(0, mem_cap)
    out["worker_cap"] = cap
    needed = loader_math["workers_needed"](prep_s, step_s) if step_s else None
    counts = loader_math["plan_worker_counts"](n_now, needed, cap, limit=3)
    # The count the arithmetic points at goes first: if the bound cuts the sweep short, it was measured.
    counts.sort(key=lambda n: (n != min(needed or n, cap), n))
    if not counts:
        notes.append(f"no larger num_workers tried: the cap is {cap} (idle cores / memory)")
    for i, n in enumerate(counts):
        measure(n, p_now, 1.0 / (len(counts) - i + 1))
    best = max((c for c in configs if c["num_workers"] > 0), key=lambda c: c["batches_per_s"], default=None)
    if best is not None:
        if measure(best["num_workers"], max(4, p_now * 2), 1.0) is None:
            pass
    else:
        notes.append("prefetch_factor not swept: it only applies with num_workers > 0")
    return out


def _memory_worker_cap(memory_free: int | None = None) -> int | None:
    """How many job-sized processes fit in half of the memory free to the job: MemAvailable, or what gputop
    read from the job's cgroup (`memory_free`) when less (fork shares pages, so this is cautious)."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, StopIteration, ValueError):
        return None
    if rss <= 0:
        return None
    if memory_free is not None:
        available = min(available, int(memory_free))
    return max(0, int(available * MEMORY_SHARE // rss) - 1)  # minus the sweep's own main process


# ------------------------------------------------------------------------------- forked sweep child


def _privatize_read_only_files() -> None:
    """Give this forked child its own offsets for the job's read-only files.

    After fork, parent and child share each open file *description*, offsets included: a dataset that
    seeks and reads a file opened in the job would move the job's offset under its feet.  Re-opening
    each read-only regular file and dup2-ing it over the same fd number breaks that sharing.
    """
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            flags = int(open(f"/proc/self/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8)
            if flags & os.O_ACCMODE != os.O_RDONLY:
                continue
            path = os.readlink(f"/proc/self/fd/{fd}")
            new = os.open(path, os.O_RDONLY | os.O_CLOEXEC if flags & os.O_CLOEXEC else os.O_RDONLY)
            os.lseek(new, os.lseek(fd, 0, os.SEEK_CUR), os.SEEK_SET)
            os.dup2(new, fd, inheritable=not flags & os.O_CLOEXEC)
            os.close(new)
        except (OSError, ValueError, IndexError):
            continue


def _detach_shared_channels(keep: tuple[int, ...] = ()) -> None:
    """Put /dev/null over every inherited pipe, socket and anonymous-inode fd of this forked child.

    A copy of the job's descriptors is not harmless: the job may hold both ends of a pipe and wait for
    EOF (a copy of the write end here would block that read until this child exits), and a dataset
    client would otherwise talk on the job's own connection (a shared socket: interleaved requests).
    /dev/null, not close(): the fd numbers stay taken, so nothing new lands under an old object, and a
    dataset that uses one fails (ENOTSOCK, EOF) instead of disturbing the job.
    """
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in fds:
            if fd in keep or fd == null:
                continue
            try:
                mode = os.fstat(fd).st_mode
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or target.startswith("anon_inode:"):
                inheritable = os.get_inheritable(fd)
                os.dup2(null, fd, inheritable=inheritable)
    finally:
        os.close(null)


def sweep_in_forked_child(
    torch_mod: ModuleType,
    settings: Json,
    refs: dict[str, Any],
    plan: Json,
    run_dir: RunDir,
    loader_math: Namespace,
    seconds: float,
    probe: ConsumptionProbe,
    progress: Callable[..., None],
) -> Json:
    """Fork, sweep in the child (own process group, output to a log), kill the group at the deadline."""
    deadline = _now() + seconds
    pid = os.fork()
    if pid == 0:  # ------------------------------------------------------------------ the child
        code = 1
        try:
            os.setpgid(0, 0)
            log = os.open(os.path.join(run_dir.path, "sweep.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            # The class-level wrapper came along in the copy: take it off so it cannot skew the sweep.
            if probe.original is not None:
                setattr(probe.base_cls, "__next__", probe.original)
            _privatize_read_only_files()
            _detach_shared_channels(keep=(0, 1, 2))
            result = run_sweep(torch_mod, settings, refs, plan, run_dir, loader_math, deadline)
            result["done"] = True
            run_dir.write_json("sweep.json", result)
            code = 0
        except BaseException as exc:
            try:
                message = _one_line(exc)
                if "CUDA" in message and "fork" in message:
                    message = f"the dataset uses CUDA, which a forked copy cannot; loader-only sweep not tried ({message})"
                run_dir.write_json("sweep_error.json", {"error": message})
            except BaseException:
                pass
        finally:
            os._exit(code)
    # ------------------------------------------------------------------------------------ the parent
    progress(0.0, "loader-only sweep in a forked copy", sweep_pgid=pid)
    status = None
    hard_deadline = deadline + CHILD_EXIT_GRACE
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None  # the job ignores SIGCHLD (auto-reap): fall back on /proc
            if not os.path.exists(f"/proc/{pid}"):
                break
        if info is not None:
            status = info.si_status
            break
        if _now() >= hard_deadline:
            break
        time.sleep(0.05)
        done = _read_json(run_dir, "sweep.json")
        if done:
            progress(min(1.0, len(done.get("configs", ())) / 5.0), "loader-only sweep", sweep_pgid=pid)
    # The child's group holds its DataLoader workers; kill it while the zombie still reserves the id.
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    result = _read_json(run_dir, "sweep.json") or {"configs": [], "notes": []}
    error = _read_json(run_dir, "sweep_error.json")
    if error:
        result.setdefault("notes", []).append(error["error"])
    elif not result.get("done"):
        result.setdefault("notes", []).append(
            f"the sweep hit its {seconds:.1f}s bound and was stopped" + ("" if status is None else f" (exit {status})")
        )
    return result


def _read_json(run_dir: RunDir, name: str) -> Any:
    try:
        with open(os.path.join(run_dir.path, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------- live


def _cuda_in_use(torch_mod: ModuleType) -> bool:
    cuda = getattr(torch_mod, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:
        return False


def live_main(run_path: str) -> None:
    run_dir = RunDir(run_path)
    with open(os.path.join(run_path, "config.json")) as f:
        config = json.load(f)
    result: Json = {
        "mode": "live",
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "notes": [],
        "started": time.time(),
    }
    probe: ConsumptionProbe | None = None
    threads_before = threading.active_count()
    try:
        torch_mod = sys.modules.get("torch")
        dl_mod = sys.modules.get("torch.utils.data.dataloader")
        if torch_mod is None or dl_mod is None:
            result["error"] = "the target has not imported torch's DataLoader; nothing to measure"
            return
        result["torch"] = getattr(torch_mod, "__version__", "?")
        loader_math = run_dir.load_sibling("loader_math.py")
        window = float(config.get("consumption_seconds", 3.0))
        sweep_seconds = float(config.get("sweep_seconds", 8.0))
        run_dir.progress(0.0, "timing the training's DataLoader.__next__")
        probe = ConsumptionProbe(dl_mod._BaseDataLoaderIter)
        probe.install()
        try:
            t0 = time.perf_counter()
            _wait(window, lambda frac: run_dir.progress(frac * 0.3, "timing the training's DataLoader.__next__"))
            t1 = time.perf_counter()
            key = probe.dominant_loader()
            if key is None:
                result["error"] = (
                    f"the training drew no batch in {window:.1f}s; is it in its training loop? "
                    "(the benchmark needs a running DataLoader)"
                )
                return
            entry = probe.loaders[key]
            result["consumption"] = probe.summarize(key, t0, t1)
            result["consumption"]["epoch_restarts"] = len(entry["iterators"]) > 1 or result["consumption"]["epoch_ends"] > 0
            # gputop writes plan.json once its passive window ends: the idle cores it measured set the
            # worker cap, and it says how much of the time bound is left for the sweep.
            plan_update = _wait_for_json(run_dir, "plan.json", float(config.get("plan_wait_seconds", 0.0)))
            if plan_update:
                config.update(plan_update)
                sweep_seconds = float(config.get("sweep_seconds", sweep_seconds))
            elif config.get("plan_wait_seconds"):
                # gputop went away (or stalled): nobody would read a sweep, so do not spend the job's CPU on one
                config.update(sweep=False, sweep_off_reason="gputop sent no plan; loader-only sweep not tried")
            result["settings"] = settings = dict(entry.get("settings") or {})
            result["uses_cuda"] = _cuda_in_use(torch_mod)
            if "error" in entry:
                result["error"] = f"could not read the live loader's settings: {entry['error']}"
                return
            refs = entry["refs"]
            reason = refuse_reason(settings, refs)
            if reason is None and not config.get("sweep", True):
                reason = config.get("sweep_off_reason") or "loader-only sweep switched off"
            if reason is None and not hasattr(os, "fork"):
                reason = "this platform has no fork(); loader-only sweep not tried"
            if reason is not None:
                result["notes"].append(reason)
                result["sweep"] = {"configs": [], "notes": []}
                return
            plan = dict(config, step_s=result["consumption"].get("step_s"), consumption=result["consumption"])

            def sweep_progress(_frac: float, message: str, **extra: object) -> None:
                done = _read_json(run_dir, "sweep.json") or {}
                run_dir.progress(0.3 + 0.65 * min(1.0, len(done.get("configs", ())) / 5.0), message, **extra)

            t2 = time.perf_counter()
            result["sweep"] = sweep_in_forked_child(
                torch_mod, settings, refs, plan, run_dir, loader_math, sweep_seconds, probe, sweep_progress
            )
            t3 = time.perf_counter()
            result["during_sweep"] = probe.summarize(key, t2, t3)
        finally:
            probe.restore()
            probe.release()
    except BaseException as exc:
        result["error"] = f"agent failed: {_one_line(exc)}"
    finally:
        if probe is not None:
            result["restored"] = probe.restored and probe.base_cls.__dict__.get("__next__") is not probe.wrapper
            if probe.restore_note:
                result["notes"].append(probe.restore_note)
        result["threads_before"] = threads_before
        result["finished"] = time.time()
        for entry in probe.loaders.values() if probe else ():
            entry.pop("iterator_ref", None)
        try:
            run_dir.write_json("result.json", result)
        except OSError:
            pass  # gputop gave up and removed the directory: nobody is waiting for this
        run_dir.progress(1.0, "done")


def _wait_for_json(run_dir: RunDir, name: str, seconds: float) -> Any:
    end = _now() + seconds
    while True:
        data = _read_json(run_dir, name)
        if data is not None or _now() >= end:
            return data
        time.sleep(0.05)


def _wait(seconds: float, tick: Callable[[float], None]) -> None:
    """Sleep `seconds` in slices, reporting progress; this is the agent's own thread, not the job's."""
    end = _now() + seconds
    while True:
        left = end - _now()
        if left <= 0:
            return
        time.sleep(min(0.25, left))
        tick(1.0 - max(0.0, end - _now()) / seconds)


# ------------------------------------------------------------------------------------------ offline


def offline_main(spec: str, run_path: str) -> int:
    run_dir = RunDir(run_path)
    with open(os.path.join(run_path, "config.json")) as f:
        config = json.load(f)
    result: Json = {
        "mode": "offline",
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "notes": [],
        "started": time.time(),
    }
    try:
        import importlib

        import torch as torch_mod

        module_name, _, func_name = spec.partition(":")
        sys.path.insert(0, os.getcwd())
        run_dir.progress(0.02, f"importing {module_name}")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            result["error"] = f"cannot import {module_name!r}: {_one_line(exc)}; check the module path (run from its directory)"
            return 1
        factory = getattr(module, func_name, None)
        if not callable(factory):
            result["error"] = f"{module_name} has no function {func_name!r}; pass MODULE:FUNCTION returning a DataLoader"
            return 1
        loader = factory()
        if not isinstance(loader, torch_mod.utils.data.DataLoader):
            result["error"] = f"{spec} returned {type(loader).__name__}, not a torch DataLoader"
            return 1
        settings, refs = _describe_loader(loader)
        result["settings"] = settings
        reason = refuse_reason(settings, refs)
        if reason is not None:
            result["notes"].append(reason)
            return 0
        loader_math = run_dir.load_sibling("loader_math.py")
        plan = dict(config, step_s=None)
        # gputop's bound covers this process's start-up (importing torch and the user's module) too:
        # it passes an absolute CLOCK_MONOTONIC deadline, which every process on the machine shares.
        deadline = float(config["deadline"]) if config.get("deadline") else _now() + float(config.get("sweep_seconds", 10.0))

        def progress(message: str) -> None:
            done = _read_json(run_dir, "sweep.json") or {}
            run_dir.progress(0.1 + 0.85 * min(1.0, len(done.get("configs", ())) / 5.0), message)

        result["sweep"] = run_sweep(torch_mod, settings, refs, plan, run_dir, loader_math, deadline, progress)
        return 0
    except BaseException as exc:
        result["error"] = f"offline benchmark failed: {_one_line(exc)}"
        return 1
    finally:
        result["finished"] = time.time()
        run_dir.write_json("result.json", result)
        run_dir.progress(1.0, "done")


if __name__ == "__gputop_agent__":
    try:
        live_main(os.path.dirname(os.path.abspath(__file__)))
    except BaseException:
        pass
elif __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--offline":
    sys.exit(offline_main(sys.argv[2], sys.argv[3]))

"""A small gloo job whose ranks all-reduce in a loop until one rank breaks the pattern: the hangs of issue 36.

    torchrun --nproc-per-node 3 tests/jobs/collective_job.py --case stuck --odd-rank 2 [--dump-every 1]

Every rank all-reduces a tensor of ``--numel`` floats once a step (``--step-ms`` apart).  After
``--steps`` steps, rank ``--odd-rank`` breaks the pattern; the others go on into the next all-reduce:

- ``stuck``: it waits in its own code (``load_next_shard``), outside any collective: forever, or
  (``--stuck-in sleep|read --release PATH``) in a sleep loop or a blocking read until released, then
  enters the collective;
- ``mismatch``: it enters a broadcast instead of the all-reduce;
- ``size``: it enters the all-reduce with a tensor of another size;
- ``exit``: it exits with status 3 (``--exit-status``);
- ``none``: nothing breaks (a healthy job).

``--debug-server``: every rank starts PyTorch's debug server (``torch.distributed.debug.start_debug_server``,
its worker server on an ephemeral port; rank 0's web frontend on ``--frontend-port``, where its optional
dependencies are installed) and writes its worker port into its ``--ready`` record.

``--finish-steps N``: after the break every rank all-reduces N more times and exits 0 (else until killed).

``--dump-every S``: a thread of each rank writes its flight recorder (``_dump_fr_trace``, a pickle, the
format torch's own ``fr_trace`` reads) to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` every S seconds, replaced
atomically: what a job does to let gputop (or anyone) read its recorder while it hangs.  The recorder is on
only when the environment sets ``TORCH_FR_BUFFER_SIZE``.  ``--ready PREFIX``: each rank writes
``PREFIX.PID`` (JSON: pid, rank) once it has taken its steps and is about to break or wait.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist


def write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def dump_recorder(path: str) -> None:
    from torch._C._distributed_c10d import _dump_fr_trace

    write_atomically(path, _dump_fr_trace())


def dump_recorder_forever(path: str, every_s: float) -> None:
    """The job's side of a live read: the recorder's contents on disk every `every_s` seconds."""
    while True:
        dump_recorder(path)
        time.sleep(every_s)


def load_next_shard(how: str = "event", release: str | None = None) -> None:
    """The rank's own code that does not return (a read on a stalled mount, a lock never released): `how` it
    waits, until `release` (a file that appears, for "sleep"; a FIFO a byte is written into, for "read")."""
    if how == "sleep":  # a polling loop: the main thread wakes ten times a second
        while release is None or not os.path.exists(release):
            time.sleep(0.1)
    elif how == "read" and release is not None:  # blocked in read(2) on a pipe
        fd = os.open(release, os.O_RDWR)
        os.read(fd, 1)
        os.close(fd)
    else:
        threading.Event().wait()


def start_debug_server(frontend_port: int) -> int:
    """The debug server on this rank; its worker server's port.  Rank 0's web frontend needs tabulate, jinja2
    and aiohttp, which torch does not install: without them only the worker servers run (gputop needs no more)."""
    import torch.distributed.debug as debug

    try:
        debug.start_debug_server(port=frontend_port)
    except ImportError:
        pass  # raised after the worker server started, before the frontend did
    return int(debug._WORKER_SERVER.port)  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=("stuck", "mismatch", "size", "exit", "none"), default="stuck")
    parser.add_argument("--odd-rank", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--numel", type=int, default=1024)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="the process group's collective timeout")
    parser.add_argument("--dump-every", type=float, default=0.0)
    parser.add_argument("--exit-status", type=int, default=3)
    parser.add_argument("--ready", default=None)
    parser.add_argument("--hold-s", type=float, default=0.0, help="the odd rank waits this long before it breaks")
    parser.add_argument("--stuck-in", choices=("event", "sleep", "read"), default="event", help="how the stuck rank waits")
    parser.add_argument("--release", default=None, help="stuck: what lets it go (a file for sleep, a FIFO for read)")
    parser.add_argument("--finish-steps", type=int, default=0, help="after the break, all-reduce this often and exit 0")
    parser.add_argument("--debug-server", action="store_true", help="start torch.distributed.debug's server on every rank")
    parser.add_argument("--frontend-port", type=int, default=25999)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    worker_port = start_debug_server(args.frontend_port) if args.debug_server else None
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    dump_path = f"{prefix}{rank}" if args.dump_every and prefix else None
    if dump_path:
        threading.Thread(target=dump_recorder_forever, args=(dump_path, args.dump_every), daemon=True).start()
    grads = torch.ones(args.numel)
    for _ in range(args.steps):
        dist.all_reduce(grads)
        time.sleep(args.step_ms / 1000.0)
    if args.ready:
        write_atomically(
            f"{args.ready}.{os.getpid()}", json.dumps({"pid": os.getpid(), "rank": rank, "worker_port": worker_port}).encode()
        )
    odd = rank == args.odd_rank
    if odd and args.case != "none":
        time.sleep(args.hold_s)  # the others are in the next all-reduce by now, and their dumps say so
    if odd and args.case == "stuck":
        load_next_shard(args.stuck_in, args.release)
        dist.all_reduce(grads)  # released: the collective the others wait in
    elif odd and args.case == "mismatch":
        dist.broadcast(grads, src=0)
    elif odd and args.case == "size":
        # gloo aborts a rank once the sizes disagree: record the entry before the data moves
        work = dist.all_reduce(torch.ones(args.numel * 2), async_op=True)
        if dump_path:
            dump_recorder(dump_path)
        work.wait()
    elif odd and args.case == "exit":
        if dump_path:
            dump_recorder(dump_path)  # its recorder as it left
        sys.stdout.flush()
        os._exit(args.exit_status)
    else:
        dist.all_reduce(grads)
    steps = range(args.finish_steps) if args.finish_steps else itertools.count()
    for _ in steps:  # everyone who got through goes on until killed (or for --finish-steps steps)
        dist.all_reduce(grads)
        time.sleep(args.step_ms / 1000.0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

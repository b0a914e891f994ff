"""The child `gputop check --load` starts: load every GPU for a while, then time an all-reduce across them.

    python -m gputop.collect.gpu_load_job --seconds S [--bytes N] [--iterations K]

Prints "LOADING" when the load begins, then one JSON line: {"allreduce": {gpus, bytes, seconds,
iterations}} or {"allreduce_skipped": why}.  The load is a bf16 matmul and a pinned host-to-device copy
per GPU, so both the SMs and the PCIe link are busy and the link trains up to its maximum.  The all-reduce
is NCCL's, single process over every GPU (`torch.cuda.nccl.all_reduce`), timed as nccl-tests times it:
warm-up iterations, then the mean over the timed ones, the GPUs synchronised before and after.
This is the only gputop module besides the demo job and the injected agent that imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

MATMUL_SIDE = 8192
COPY_BYTES = 64 * 2**20
WARMUP = 5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--bytes", type=int, default=256 * 2**20)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch sees no CUDA device (a CPU build of torch?)"}), flush=True)
        return 0
    devices = list(range(torch.cuda.device_count()))
    weights = [torch.randn(MATMUL_SIDE, MATMUL_SIDE, device=f"cuda:{i}", dtype=torch.bfloat16) for i in devices]
    host = torch.empty(COPY_BYTES, dtype=torch.uint8).pin_memory()
    targets = [torch.empty(COPY_BYTES, dtype=torch.uint8, device=f"cuda:{i}") for i in devices]
    print("LOADING", flush=True)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        for i in devices:
            with torch.cuda.device(i):
                torch.matmul(weights[i], weights[i])
                targets[i].copy_(host, non_blocking=True)
        for i in devices:
            torch.cuda.synchronize(i)
    del weights, targets
    if len(devices) < 2:
        print(json.dumps({"allreduce_skipped": "one GPU: there is nothing to reduce across"}), flush=True)
        return 0
    from torch.cuda import nccl

    buffers = [torch.ones(args.bytes // 4, dtype=torch.float32, device=f"cuda:{i}") for i in devices]

    def sync() -> None:
        for i in devices:
            torch.cuda.synchronize(i)

    for _ in range(WARMUP):
        nccl.all_reduce(buffers)
    sync()
    start = time.perf_counter()
    for _ in range(args.iterations):
        nccl.all_reduce(buffers)
    sync()
    elapsed = time.perf_counter() - start
    result = {"gpus": len(devices), "bytes": args.bytes, "seconds": elapsed / args.iterations, "iterations": args.iterations}
    print(json.dumps({"allreduce": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

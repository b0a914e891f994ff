"""`gputop snapshot`: one sample of the machine, as a readable table or as JSON.

JSON keys: ``simulated`` (bool), ``machine`` (static info; ``machine.simulated``
names the profile), ``host``, ``gpus``, ``topology`` and, with --pid, ``job``.
Values NVML refused are null and each GPU's ``unavailable`` says why.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import threading
from typing import Any, TextIO

from gputop import gpu_fields, units
from gputop.model import GpuSample, HostSample, JobTree, MachineInfo, Snapshot, from_jsonable, to_jsonable
from gputop.pipeline import pipeline_from_args

# CPU % is a difference of two readings; this is the span it covers (long enough for real numbers,
# short enough for a one-shot command).
CPU_SAMPLE_INTERVAL_S = 0.3
STACKS_WAIT_S = 5.0  # bound on waiting for the first py-spy round with --pid


def run(args: argparse.Namespace) -> int:
    if getattr(args, "help_faults", False):
        from gputop.sim.profiles import faults_help

        print(faults_help())
        return 0
    pipeline = pipeline_from_args(args)
    try:
        # A measurement window, not synchronisation: CPU %, NVLink rates are deltas over it.
        threading.Event().wait(CPU_SAMPLE_INTERVAL_S)
        if pipeline.job_collector is not None:
            # stacks come from a background py-spy round; one snapshot should carry them
            pipeline.job_collector.wait_for_stacks(STACKS_WAIT_S)
        snap = pipeline.poll()
        machine = pipeline.machine
    finally:
        pipeline.close()
    if getattr(args, "json", False):
        if machine.gpu_error:
            print(machine.gpu_error, file=sys.stderr)  # stdout stays valid JSON
        json.dump(snapshot_json(machine, snap), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from gputop.report.writer import write_stdout

        table = io.StringIO()
        write_table(machine, snap, table)
        write_stdout(table.getvalue())  # UTF-8 bytes: thread names, GPU names, paths under an ASCII locale
    return 0


def snapshot_json(machine: MachineInfo, snap: Snapshot) -> dict[str, Any]:
    out: dict[str, Any] = {
        "simulated": snap.simulated,
        "timestamp": snap.timestamp,
        "machine": to_jsonable(machine),
        "host": to_jsonable(snap.host),
        "gpus": [to_jsonable(g) for g in snap.gpus],
        "topology": to_jsonable(machine.topology),
    }
    if snap.job is not None:
        from gputop.report.job_json import job_json

        out["job"] = job_json(snap.job)
    return out


def _job_from_json(data: dict[str, Any]) -> JobTree:
    from gputop.report.job_json import job_from_json

    return job_from_json(data)


def snapshot_from_json(data: dict[str, Any]) -> tuple[MachineInfo, Snapshot]:
    """The inverse of `snapshot_json` (used to replay recorded `gputop snapshot --json` output)."""
    machine = from_jsonable(MachineInfo, data["machine"])
    snap = Snapshot(
        timestamp=float(data["timestamp"]),
        host=from_jsonable(HostSample, data["host"]),
        gpus=tuple(from_jsonable(GpuSample, g) for g in data["gpus"]),
        job=_job_from_json(data["job"]) if data.get("job") is not None else None,
        simulated=bool(data["simulated"]),
    )
    return machine, snap


# ---------------------------------------------------------------- table


def _gpu_lines(gpu: GpuSample) -> list[str]:
    if gpu.lost:
        return [f"{gpu.index:>3}  {gpu.name:<24} LOST ({gpu.unavailable.get('gpu', 'GpuIsLost')}) bus {gpu.pci_bus_id}"]
    head, *rest = gpu_fields.snapshot_lines(gpu)  # the fields' cells, as the table of GPU fields places them
    lines = [f"{gpu.index:>3}  {gpu.name[:24]:<24}{head}"] + [f"     {line}" for line in rest]
    if "stale" in gpu.unavailable:
        lines.append(f"     stale: {gpu.unavailable['stale']}")
    return lines


def write_table(machine: MachineInfo, snap: Snapshot, out: TextIO) -> None:
    w = out.write
    if machine.simulated:
        w(f"SIMULATED machine: {machine.simulated}\n")
    if machine.gpu_error:
        w(f"{machine.gpu_error}\n")
    else:
        w(
            f"driver {units.na(machine.driver_version)}  CUDA {units.na(machine.cuda_version)}  NVML {units.na(machine.nvml_version)}"
            f"  {machine.gpu_count} GPU(s)\n\n"
        )
        w(f"{'GPU':>3}  {'name':<24} {'util':>5} {'memory':>14} {'temp':>4} power       SM clock\n")
        for gpu in snap.gpus:
            for line in _gpu_lines(gpu):
                w(line + "\n")
        w("\n")
    host = snap.host
    w(f"host {machine.hostname}: {machine.cpu_model} ({machine.cpu_count} cores)\n")
    cores = " ".join(f"{p:.0f}" for p in host.cpu_percent)
    avg = sum(host.cpu_percent) / len(host.cpu_percent) if host.cpu_percent else 0.0
    w(f"  CPU {avg:.0f}% avg; per core: {cores}\n")
    w(
        f"  iowait {units.na(host.iowait_percent, '{:.1f}%')}  steal {units.na(host.steal_percent, '{:.1f}%')}  "
        f"load {' '.join(f'{x:.2f}' for x in host.load_average)}\n"
    )
    w(
        f"  memory {host.memory_used / units.GIB:.1f}/{host.memory_total / units.GIB:.1f} GiB (available "
        f"{host.memory_available / units.GIB:.1f})  swap {host.swap_used / units.GIB:.1f}/{host.swap_total / units.GIB:.1f} GiB\n"
    )
    topo = machine.topology
    if topo.matrix:
        w("\ntopology\n")
        names, rows = topo.full_matrix()  # GPUs, then the RDMA NICs as nvidia-smi numbers them
        w("      " + "".join(f"{name:>6}" for name in names) + "  CPU affinity     NUMA\n")
        for i, (name, row) in enumerate(zip(names, rows)):
            line = f"{name:<6}" + "".join(f"{cell:>6}" for cell in row)
            if i < len(topo.matrix):
                numa = topo.numa_node[i] if i < len(topo.numa_node) else None
                line += f"  {topo.near_cpus_text(i):<16} {units.na(numa)}"
            w(line + "\n")
        if topo.nic_legend():
            w("\nNIC Legend:\n\n" + "".join(f"  {entry}\n" for entry in topo.nic_legend()))
    if snap.job is not None:
        ranks = len(snap.job.ranks)
        w(f"\njob {snap.job.root_pid}: {ranks} rank(s)" + (" (exited)" if snap.job.exited else "") + "\n")
        for warning in snap.job.warnings:
            w(f"  ! {warning}\n")

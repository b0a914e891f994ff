"""Snapshot test of a MIG GPU's card (issue 25 item 8): its instances with memory and processes, and the state
"MIG" where NVML measures no utilization (never IDLE).  Regenerate with --snapshot-update after an intended change."""

from __future__ import annotations

import dataclasses

import pytest

from gputop.model import GpuProcess, GpuSample, MigInstance, Snapshot
from tests.harness.histories import ScriptedSource, make_machine, make_snapshots
from tests.harness.tui import build_app, settle

GIB = 1024**3
SIZES = [(80, 24), (160, 48)]

# GPU 0 split as the simulated a100-sxm-4-mig splits it, two instances busy; GPU 1 in two halves, one empty
MIG_LAYOUTS = {
    0: (
        MigInstance(
            1, 0, "MIG-00000000-0000-5a1e-8c00-000000000001", "3g.40gb", 3, 42, 31 * GIB, 39 * GIB, (GpuProcess(4242, 30 * GIB),)
        ),
        MigInstance(
            3, 0, "MIG-00000000-0000-5a1e-8c01-000000000002", "2g.20gb", 2, 28, 12 * GIB, 19 * GIB, (GpuProcess(4243, 12 * GIB),)
        ),
        MigInstance(7, 0, "MIG-00000000-0000-5a1e-8c02-000000000003", "1g.10gb", 1, 14, 19 << 20, 9 * GIB, ()),
        MigInstance(8, 0, "MIG-00000000-0000-5a1e-8c03-000000000004", "1g.10gb", 1, 14, 19 << 20, 9 * GIB, ()),
    ),
    1: (
        MigInstance(
            1, 0, "MIG-00000001-0000-5a1e-8c00-000000000005", "4g.40gb", 4, 56, 20 * GIB, 39 * GIB, (GpuProcess(4244, 20 * GIB),)
        ),
        MigInstance(2, 0, "MIG-00000001-0000-5a1e-8c01-000000000006", "3g.40gb", 3, 42, 19 << 20, 39 * GIB, ()),
    ),
}


def _as_mig(gpu: GpuSample) -> GpuSample:
    instances = MIG_LAYOUTS.get(gpu.index)
    if instances is None:
        return gpu
    return dataclasses.replace(
        gpu,
        utilization_gpu=None,
        utilization_memory=None,
        unavailable={**gpu.unavailable, "utilization_gpu": "NotSupported", "utilization_memory": "NotSupported"},
        processes=tuple(p for m in instances for p in m.processes or ()),
        mig=instances,
    )


def _mig_snapshots() -> list[Snapshot]:
    return [dataclasses.replace(s, gpus=tuple(map(_as_mig, s.gpus))) for s in make_snapshots(90, gpus=4, cores=64)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_mig_cards_list_instances(snap_compare, size):
    source = ScriptedSource(make_machine(gpus=4, cores=64), _mig_snapshots())
    app, source = build_app(source=source)

    async def run_before(pilot):
        await settle(pilot, app, source)
        await pilot.pause()

    try:
        assert snap_compare(app, terminal_size=size, run_before=run_before)
    finally:
        source.close()


def test_mig_card_lines_say_profile_memory_and_pids():
    from gputop.tui.widgets.gpu_grid import STATE_MIG, gpu_state, mig_instance_text

    gpu = _as_mig(make_snapshots(1, gpus=4, cores=64)[0].gpus[0])
    assert [mig_instance_text(m) for m in gpu.mig or ()] == [
        "GI1 3g.40gb  31/39G  4242",
        "GI3 2g.20gb  12/19G  4243",
        "GI7 1g.10gb  0.0/9.0G  -",
        "GI8 1g.10gb  0.0/9.0G  -",
    ]
    assert gpu_state(gpu)[1] == STATE_MIG[1]  # not IDLE: NVML does not measure a MIG GPU's utilization


def test_the_process_list_names_the_mig_instance_a_process_runs_on():
    from gputop.tui.widgets.job_panel import gpu_process_rows

    snapshot = _mig_snapshots()[-1]
    rows = {row.pid: row.gpus for row in gpu_process_rows(dataclasses.replace(snapshot, job=None, jobs=()))}
    assert rows == {4242: "GPU0/GI1", 4243: "GPU0/GI3", 4244: "GPU1/GI1", 1003: "GPU2", 1004: "GPU3"}


def test_the_process_list_says_what_the_snapshot_holds_not_what_this_machines_proc_holds():
    # the list shows only when no NVML PID is in a job here (a container's other namespace, a replay): a local
    # process under the same number is another process (ci42: the snapshot above read "python -m pytest" for
    # its scripted PIDs, an xdist worker that happened to hold 4242)
    import os

    from gputop.tui.widgets.job_panel import gpu_process_rows

    (snapshot,) = make_snapshots(1, gpus=1, cores=8)
    gpu = dataclasses.replace(snapshot.gpus[0], processes=(GpuProcess(os.getpid(), GIB),))
    snapshot = dataclasses.replace(snapshot, gpus=(gpu,), job=None, jobs=())
    (row,) = gpu_process_rows(snapshot)
    assert (row.pid, row.gpus, row.extra, row.note) == (os.getpid(), "GPU0", "1.0G", ""), row

"""MIG (issue 25 item 8): the fake NVML's MIG answers through the real pynvml wrappers, the collector's
instances, the snapshot JSON, the placement of ranks on instances, and no "idle GPU" for a GPU whose
utilization NVML does not measure."""

from __future__ import annotations

import pynvml
import pytest

from gputop.collect.gpu import use_nvml_library
from gputop.sim.fake_nvml import FakeNvmlLibrary, ManualClock
from gputop.sim.profiles import MIB
from gputop.sim.spec import parse_spec

GIB = 1024**3


class MigLoad:
    """A load model that also says what runs on each MIG device: (gpu, MIG device index) -> [(pid, bytes)]."""

    def __init__(self, util: float = 50.0, instances: dict[tuple[int, int], list[tuple[int, int]]] | None = None) -> None:
        self.util = util
        self.instances = instances or {}

    def utilization(self, gpu, now):
        return self.util

    def memory_used(self, gpu, now):
        return None

    def processes(self, gpu):
        return []

    def mig_processes(self, gpu, index):
        return list(self.instances.get((gpu, index), []))


@pytest.fixture
def nvml():
    """Install a fake below pynvml and nvmlInit it; always shut down and uninstall."""
    installed = []

    def start(spec="a100-sxm-4-mig", load=None):
        lib = FakeNvmlLibrary(parse_spec(spec), load or MigLoad(), clock=ManualClock(), pcie_latency_s=0)
        use_nvml_library(lib)
        pynvml.nvmlInit()
        installed.append(lib)
        return lib

    yield start
    if installed:
        pynvml.nvmlShutdown()
    use_nvml_library(None)


def test_fake_nvml_answers_mig_as_nvml_does(nvml):
    nvml(load=MigLoad(instances={(0, 0): [(4242, 3 * GIB)], (0, 2): [(4343, GIB)]}))
    gpu0, gpu2 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetMigMode(gpu0) == [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]
    assert pynvml.nvmlDeviceGetMigMode(gpu2) == [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu0) == 7
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu2) == 0
    migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, i) for i in range(4)]
    with pytest.raises(pynvml.NVMLError_NotFound):  # an index no instance holds
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 4)
    # (pynvml hands back the c_uint itself here, not its value)
    assert [pynvml.nvmlDeviceIsMigDeviceHandle(h).value for h in (gpu0, *migs)] == [0, 1, 1, 1, 1]
    assert [pynvml.nvmlDeviceGetGpuInstanceId(h) for h in migs] == [1, 3, 7, 8]  # A100 placements
    assert {pynvml.nvmlDeviceGetComputeInstanceId(h) for h in migs} == {0}
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(gpu0)
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migs[1])
    assert pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(gpu0)
    assert pynvml.nvmlDeviceGetName(migs[0]) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert all(pynvml.nvmlDeviceGetUUID(h).startswith("MIG-") for h in migs)
    assert len({pynvml.nvmlDeviceGetUUID(h) for h in migs}) == 4
    attrs = pynvml.nvmlDeviceGetAttributes_v2(migs[0])
    assert (attrs.gpuInstanceSliceCount, attrs.multiprocessorCount, attrs.memorySizeMB) == (3, 42, 40192)

    # utilization: not measured on a MIG-enabled GPU nor on its instances; measured on a whole GPU
    for handle in (gpu0, migs[0]):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetUtilizationRates(handle)
    assert pynvml.nvmlDeviceGetUtilizationRates(gpu2).gpu == 50

    # memory: the instance's own; the GPU's is its instances' together
    mem = pynvml.nvmlDeviceGetMemoryInfo(migs[0], version=pynvml.nvmlMemory_v2)
    assert (mem.total, mem.used) == (40192 * MIB, 19 * MIB + 3 * GIB)
    instance_used = [pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used for h in migs]
    whole = pynvml.nvmlDeviceGetMemoryInfo(gpu0, version=pynvml.nvmlMemory_v2)
    assert whole.used == sum(instance_used) and whole.total == 81920 * MIB

    # processes: the instance's own on its handle; every instance's, with their ids, on the GPU's
    on_first = pynvml.nvmlDeviceGetComputeRunningProcesses(migs[0])
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in on_first] == [(4242, 3 * GIB, 1)]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(migs[1]) == []
    on_gpu = pynvml.nvmlDeviceGetComputeRunningProcesses(gpu0)
    assert sorted((p.pid, p.gpuInstanceId, p.computeInstanceId) for p in on_gpu) == [(4242, 1, 0), (4343, 7, 0)]


def test_mig_switch_splits_any_mig_capable_gpu_and_a_card_without_mig_refuses(nvml):
    nvml("h100-sxm-8+mig=2:3g.40gb,4g.40gb")
    gpu2 = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetMigMode(gpu2)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu2, i)) for i in range(2)]
    assert names == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb", "NVIDIA H100 80GB HBM3 MIG 4g.40gb"]
    assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0))[0] == pynvml.NVML_DEVICE_MIG_DISABLE
    pynvml.nvmlShutdown()
    use_nvml_library(None)
    lib = FakeNvmlLibrary(parse_spec("rtx-4090-2"), MigLoad(), clock=ManualClock(), pcie_latency_s=0)
    use_nvml_library(lib)
    pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0))


# ---------------------------------------------------------------- the collector and the snapshot


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_collector_reads_the_instances_and_snapshot_json_lists_them(tmp_path):
    import json
    import subprocess
    import sys

    from gputop.collect.gpu import GpuCollector
    from gputop.model import GpuSample, from_jsonable, to_jsonable

    load = MigLoad(instances={(1, 0): [(5151, 2 * GIB)]})
    lib = FakeNvmlLibrary(parse_spec("a100-sxm-4-mig"), load, clock=ManualClock(), pcie_latency_s=0)
    collector = GpuCollector(library=lib)
    try:
        gpus = collector.sample()
    finally:
        collector.close()
    assert [g.mig is not None for g in gpus] == [True, True, False, False]
    assert [(m.profile, m.gpu_instance_id, m.slices) for m in gpus[0].mig or ()] == [
        ("3g.40gb", 1, 3),
        ("2g.20gb", 3, 2),
        ("1g.10gb", 7, 1),
        ("1g.10gb", 8, 1),
    ]
    assert [(m.profile, m.gpu_instance_id) for m in gpus[1].mig or ()] == [("4g.40gb", 1), ("3g.40gb", 2)]
    first = (gpus[1].mig or ())[0]
    assert [p.pid for p in first.processes or ()] == [5151] and first.memory_total == 40192 * MIB
    assert [p.pid for p in gpus[1].processes or ()] == [5151]  # the GPU's list holds its instances' processes
    # NVML does not measure a MIG GPU's utilization: unknown (None, with the reason), never 0
    assert gpus[0].utilization_gpu is None and gpus[0].unavailable["utilization_gpu"] == "NotSupported"
    assert gpus[2].utilization_gpu == 50.0
    assert from_jsonable(GpuSample, json.loads(json.dumps(to_jsonable(gpus[1])))) == gpus[1]  # recordings keep it

    out = subprocess.run(
        [sys.executable, "-m", "gputop", "snapshot", "--simulate", "a100-sxm-4-mig", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)["gpus"]
    assert [[m["profile"] for m in g["mig"]] if g["mig"] is not None else None for g in listed] == [
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        ["4g.40gb", "3g.40gb"],
        None,
        None,
    ]
    assert all(m["uuid"].startswith("MIG-") and m["memory_total"] > 0 for g in listed[:2] for m in g["mig"])
    table = subprocess.run(
        [sys.executable, "-m", "gputop", "snapshot", "--simulate", "a100-sxm-4-mig"], capture_output=True, text=True, timeout=120
    )
    assert table.returncode == 0, table.stderr
    assert [line.split()[:4] for line in table.stdout.splitlines() if line.strip().startswith("MIG ")] == [
        ["MIG", "GI", "1", "3g.40gb"],
        ["MIG", "GI", "3", "2g.20gb"],
        ["MIG", "GI", "7", "1g.10gb"],
        ["MIG", "GI", "8", "1g.10gb"],
        ["MIG", "GI", "1", "4g.40gb"],
        ["MIG", "GI", "2", "3g.40gb"],
    ]


# ---------------------------------------------------------------- jobs: ranks on instances


LAUNCHER = """
import os, subprocess, sys, time
children = []
for rank, device in enumerate(sys.argv[1:]):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", CUDA_VISIBLE_DEVICES=device)
    child = "import time\\nprint('up', flush=True)\\nwhile True: time.sleep(1)"
    children.append(subprocess.Popen([sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, text=True))
for c in children:  # exec'd with its own environment (between fork and exec /proc shows the launcher's)
    c.stdout.readline()
print(" ".join(str(c.pid) for c in children), flush=True)
while True:
    time.sleep(1)
"""


def test_ranks_on_mig_instances_are_placed_on_their_instance_and_share_nothing(spawn):
    import subprocess

    from gputop.collect.gpu import GpuCollector
    from gputop.collect.job_tree import discover_jobs

    load = MigLoad()
    lib = FakeNvmlLibrary(parse_spec("a100-sxm-4-mig"), load, clock=ManualClock(), pcie_latency_s=0)
    collector = GpuCollector(library=lib)
    try:
        uuids = [m.uuid for m in collector.sample()[0].mig or ()]
        # two ranks, each seeing one instance of GPU 0 as its only device
        launcher = spawn.python(["-c", LAUNCHER, uuids[0], uuids[1]], stdout=subprocess.PIPE, text=True)
        pids = [int(p) for p in launcher.stdout.readline().split()]
        load.instances = {(0, 0): [(pids[0], 2 * GIB)], (0, 1): [(pids[1], GIB)]}
        gpus = collector.sample()
    finally:
        collector.close()
    [job] = discover_jobs(gpus)
    assert job.launcher is not None and job.launcher.pid == launcher.pid
    assert [(r.rank, r.proc.pid, r.gpus, r.mig_instances) for r in job.ranks] == [
        (0, pids[0], (0,), ((0, 1),)),
        (1, pids[1], (0,), ((0, 3),)),
    ]
    assert [r.cuda_visible_devices for r in job.ranks] == uuids[:2]
    assert job.misplacements == () and job.warnings == ()  # two instances of one GPU are two devices


def test_two_ranks_on_one_mig_instance_are_told_as_sharing_it():
    from gputop.collect.placement import find_misplacements
    from gputop.model import ProcInfo, Rank

    def rank(pid, number, instance):
        return Rank(proc=ProcInfo(pid=pid, ppid=1, name="python"), rank=number, gpus=(0,), mig_instances=((0, instance),))

    both = find_misplacements((rank(10, 0, 1), rank(11, 1, 1), rank(12, 2, 3)), ())
    assert [(m.kind, m.pids) for m in both] == [("shared_gpu", (10, 11))]
    assert both[0].message.startswith("GPU 0 MIG instance 1 is shared by 2 ranks")


def test_a_mig_gpu_is_never_idle_in_the_machine_view():
    """One busy whole GPU beside seven MIG GPUs whose utilization NVML does not measure: without MIG the
    same machine reads "7 of 8 GPUs idle" (tests/test_diagnosis_truth.py); with MIG it must not."""
    from gputop.analysis.diagnosis import diagnose
    from gputop.model import MigInstance
    from tests.harness.histories import Scenario, build

    empty = (MigInstance(1, 0, "MIG-x", "3g.40gb", 3, 42, 19 * MIB, 40192 * MIB, ()),)
    sc = Scenario(
        util=lambda g, t: 87.0 if g == 0 else None,
        memory_gib=lambda g, t: 40.0 if g == 0 else 0.0,
        processes=lambda g, t: (4242,) if g == 0 else (),
        attach=False,
        gpu_extra=lambda g, t: {} if g == 0 else {"mig": empty},
    )
    findings = diagnose(build(sc))
    assert "idle_gpus" not in [f.id for f in findings]
    assert not any("idle" in f.summary and "GPU" in f.summary for f in findings), [f.summary for f in findings]


# ---------------------------------------------------------------- real captures of MIG-enabled A100s

CAPTURES = __import__("pathlib").Path(__file__).parent / "fixtures" / "captures"


@pytest.mark.parametrize(
    ("capture", "instances"),
    [
        # telegraf's testdata: an A100-SXM4-80GB, driver 535, four 1g.20gb instances (GPU instances 3-6, 14 SMs each)
        ("a100-sxm4-80gb-535", [(3, "1g.20gb", 19968), (4, "1g.20gb", 19968), (5, "1g.20gb", 19968), (6, "1g.20gb", 19968)]),
        # netdata's testdata: an A100-SXM4-40GB, driver 510, two 3g.20gb instances (GPU instances 1 and 2, 42 SMs each)
        ("a100-sxm4-40gb-mig-510", [(1, "3g.20gb", 19968), (2, "3g.20gb", 19968)]),
    ],
)
def test_a_captured_mig_gpu_serves_its_instances_and_is_never_idle(capture, instances):
    from gputop.analysis.diagnosis import diagnose
    from tests.harness.histories import simulated_history

    history = simulated_history(f"capture:{CAPTURES / capture}", seconds=20)
    latest = history.latest
    assert latest is not None
    gpu = latest.gpus[0]
    assert [(m.gpu_instance_id, m.profile, (m.memory_total or 0) // MIB) for m in gpu.mig or ()] == instances
    assert gpu.utilization_gpu is None and gpu.unavailable["utilization_gpu"] == "NotSupported"
    # a working machine whose utilization NVML does not measure: healthy, not idle nor starved
    assert [(f.id, f.summary) for f in diagnose(history)] == [("healthy", "Healthy: nothing wrong found")]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("h100-sxm-8+mig=1", "mig needs IDX:PROFILE[,PROFILE...] with profiles of 1g.10gb,"),
        ("h100-sxm-8+mig=1:5g.50gb", "got '1:5g.50gb'"),
        ("h100-sxm-8+mig=1:4g.40gb,4g.40gb", "more than 7 compute slices on one GPU"),
        ("h100-sxm-8+mig=8:1g.10gb", "mig=8: h100-sxm-8 has GPUs 0..7"),
        ("rtx-4090-2+mig=0:1g.10gb", "NVIDIA GeForce RTX 4090 has no MIG, so mig does not apply"),
    ],
)
def test_a_wrong_mig_switch_is_one_line_saying_what_is_wrong(spec, says):
    from gputop.errors import UsageError

    with pytest.raises(UsageError) as caught:
        parse_spec(spec)
    message = str(caught.value)
    assert says in message and "\n" not in message and "--help-faults" in message


def _history_on_mig_instances():
    """Two ranks on GPU 0, each on a MIG instance of its own (GPU instances 1 and 3), a third on whole GPU 1."""
    import dataclasses

    from gputop.history import History
    from tests.harness import histories as hb

    built = hb.build(
        hb.Scenario(
            seconds=6.0, gpu_count=2, ranks=[hb.RankSpec(100, 0, (0,)), hb.RankSpec(101, 1, (0,)), hb.RankSpec(102, 2, (1,))]
        )
    )
    instances = {100: ((0, 1),), 101: ((0, 3),)}
    history = History(built.machine)
    for snap in built:
        assert snap.job is not None
        ranks = tuple(dataclasses.replace(r, mig_instances=instances.get(r.proc.pid, ())) for r in snap.job.ranks)
        history.append(dataclasses.replace(snap, job=dataclasses.replace(snap.job, ranks=ranks)))
    return history


def test_a_rank_on_a_mig_instance_is_named_by_it_in_the_job_tree_the_report_and_the_exporter():
    import json

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gputop.exporter import Exporter
    from gputop.report.jsonreport import render_json
    from gputop.report.markdown import render_markdown
    from gputop.tui.widgets.job_panel import JobPanel, job_rows

    history = _history_on_mig_instances()
    job = history.latest.job
    # the job tree: "GPU0/GI1", and the column wide enough to show it whole
    rows = {row.pid: row.gpus for row in job_rows(job) if row.kind == "rank"}
    assert rows == {100: "GPU0/GI1", 101: "GPU0/GI3", 102: "GPU1"}
    panel = JobPanel()
    panel.rows = job_rows(job)
    drawn = ["".join(segment.text for segment in strip) for strip in panel.build(100, 12)]
    assert any("rank 0 100" in line and "GPU0/GI1 " in line for line in drawn), drawn

    # the report's rank table
    data = json.loads(render_json(history, []))
    assert [(r["pid"], r["devices"], r["mig_instances"]) for r in data["job"]["ranks"]] == [
        (100, ["GPU0/GI1"], [[0, 1]]),
        (101, ["GPU0/GI3"], [[0, 3]]),
        (102, ["GPU1"], []),
    ]
    table = render_markdown(history, [])
    assert "| 0/GI1 |" in table and "| 0/GI3 |" in table and "| 1 |" in table

    # the exporter's rank labels
    snaps = list(history)

    class Replay:
        machine = history.machine

        def poll(self):
            return snaps.pop(0)

        def close(self) -> None:
            pass

    exporter = Exporter(Replay(), interval=1.0, diagnose=lambda h: [], log=lambda line: None)
    exporter.cycle()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    info = [
        s.labels
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == "gputop_rank_info"
    ]
    assert sorted((i["pid"], i["gpu"], i["mig_instance"]) for i in info) == [
        ("100", "0", "1"),
        ("101", "0", "3"),
        ("102", "1", ""),
    ]


@pytest.mark.parametrize("dcgm_fields", [False, True], ids=["default", "dcgm-fields"])
def test_the_exporter_lists_each_instance_with_its_processes_and_memory(dcgm_fields):
    """`gputop serve` on a MIG box: one `gputop_mig_instance_info` per instance (its profile, MIG UUID, slices) and
    its process count; its memory with the DCGM fields, as the whole GPUs' (NVML gives no utilization to show)."""
    import dataclasses

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gputop.backend import SimulatedMachine
    from gputop.exporter import Exporter
    from gputop.model import GpuProcess
    from gputop.pipeline import Pipeline

    with Pipeline(SimulatedMachine("a100-sxm-4-mig")) as pipeline:
        snap = pipeline.poll()
        machine = pipeline.machine
    gpu0 = snap.gpus[0]
    assert gpu0.mig is not None
    busy = dataclasses.replace(gpu0.mig[0], processes=(GpuProcess(4242, 1 << 30), GpuProcess(4243, 2 << 30)))
    gpus = (dataclasses.replace(gpu0, mig=(busy, *gpu0.mig[1:])), *snap.gpus[1:])
    snaps = [dataclasses.replace(snap, gpus=gpus)]

    class Replay:
        def __init__(self) -> None:
            self.machine = machine

        def poll(self):
            return snaps[0]

        def close(self) -> None:
            pass

    exporter = Exporter(Replay(), interval=1.0, diagnose=lambda h: [], log=lambda line: None, dcgm_fields=dcgm_fields)
    exporter.cycle()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    samples = [s for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples]

    def by(name):
        return {(s.labels["gpu"], s.labels["gpu_instance"]): s for s in samples if s.name == name}

    info = by("gputop_mig_instance_info")
    expected = {(str(g.index), str(i.gpu_instance_id)): i for g in gpus for i in g.mig or ()}
    assert set(info) == set(expected) and len(info) >= 2
    first = info[("0", str(busy.gpu_instance_id))].labels
    assert (first["profile"], first["mig_uuid"], first["slices"]) == (busy.profile, busy.uuid, str(busy.slices))
    assert first["UUID"] == gpu0.uuid and first["compute_instance"] == str(busy.compute_instance_id)
    processes = {key: s.value for key, s in by("gputop_mig_processes").items()}
    assert processes[("0", str(busy.gpu_instance_id))] == 2 and sum(processes.values()) == 2
    used = by("gputop_mig_memory_used_bytes")
    if dcgm_fields:
        assert {key: s.value for key, s in used.items()} == {key: i.memory_used for key, i in expected.items()}
        assert by("gputop_mig_memory_total_bytes")[("0", str(busy.gpu_instance_id))].value == busy.memory_total
    else:
        assert used == {}  # memory comes with the DCGM fields, as the whole GPUs' does

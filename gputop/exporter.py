"""`gputop serve`'s metrics: the job-level signals (what each rank does, DataLoader wait, the verdict) and
the GPU facts dcgm-exporter lacks (PCIe link state, clock-event reasons, XIDs), as Prometheus metrics.

The one poll loop (`gputop.source.PollLoop`) runs in a background thread and hands each snapshot of the
pipeline to `Exporter.deliver()`, which runs the diagnosis of each job the snapshot carries
(`gputop.source.jobs_of`: the pipeline follows them, see `gputop.pipeline`) and builds every metric
family once.  The exporter reads snapshots only, so a recording of the same pipeline (`gputop record`)
holds everything it exported.
A scrape (`Exporter.collect()`, called by prometheus_client's HTTP handler) only hands over the
families of the last cycle, so it costs the formatting and nothing else, however slow NVML, /proc or
py-spy are.

Label rules (bounded cardinality, nothing private):
- dcgm-exporter's names, so PromQL joins work: ``gpu`` (the NVML index), ``UUID``, ``Hostname``;
  every gputop metric carries ``Hostname``.
- ``job`` is the id every node of a job derives alike (`gputop.fleet.identity`: torchrun's rendezvous id,
  Slurm's job and step, the rendezvous address), else ``HOSTNAME:launcher_pid`` for a job on one machine;
  ``rank`` is the process's global RANK (``gputop_rank_info`` adds ``local_rank`` and ``node``, the node's
  rank in the job).  Those ids are the only environment values that become labels: no stack, command
  line or other environment value, and no worker PID, is ever a label.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from gputop import __version__, gpu_fields
from gputop.analysis.collectives import last_collectives
from gputop.analysis.counter_health import counter_problems, rule_severities
from gputop.analysis.freeze import freeze_start, main_thread_sample
from gputop.analysis.gpu_health import (
    FINDING_SEVERITY,
    HEALTH_WINDOW_S,
    NicJudgement,
    Severity,
    judge_nics,
    judge_window,
    pcie_degraded,
    xid_severity,
)
from gputop.analysis.observations import RankObs, StackSample, collect_rank_observations
from gputop.analysis.stack_classes import (
    COLLECTIVE,
    EXPLICIT_SYNC,
    FORWARD_BACKWARD,
    IDLE_OTHER,
    IN_DATASET,
    OPTIMIZER_STEP,
    WAITING_FOR_DATA,
    WAITING_FOR_RANK0_DATA,
)
from gputop.analysis.thresholds import DIAGNOSIS_WINDOW_S
from gputop.analysis.xids import meaning_of
from gputop.collect.stacks import error_reason
from gputop.fleet.identity import fallback_job_id
from gputop.history import History
from gputop.model import (
    LABEL_CODE,
    LABEL_INFRA,
    THROTTLE_REASONS,
    CounterHealth,
    Finding,
    GpuSample,
    JobTree,
    NicPortSample,
    ProcessStacks,
    Rank,
    Snapshot,
    XidEvent,
)
from gputop.source import Batch, Source, for_job, jobs_of

# gputop_rank_state's states, and the stack classes they come from ("hung" comes from the hang finding)
RANK_STATES = ("compute", "data_wait", "in_dataset", "collective", "sync", "optimizer", "idle", "hung")
STATE_OF_CLASS = {
    FORWARD_BACKWARD: "compute",
    WAITING_FOR_DATA: "data_wait",
    WAITING_FOR_RANK0_DATA: "data_wait",  # Accelerate's dispatcher: rank 0 loads, the others wait for its batch
    IN_DATASET: "in_dataset",
    COLLECTIVE: "collective",
    EXPLICIT_SYNC: "sync",
    OPTIMIZER_STEP: "optimizer",
    IDLE_OTHER: "idle",
}
VERDICTS = ("healthy", "code", "infrastructure", "unknown")
FINDING_LABELS = {LABEL_CODE: "code", LABEL_INFRA: "infrastructure"}

DATA_WAIT_WINDOW_S = 60.0  # gputop_rank_data_wait_ratio: the share of the main-thread dumps of the last minute
# The findings and verdict when no job runs on the GPUs: the GPUs as a whole (a job's label carries a
# host and PID or a launcher's id, so it cannot collide).
MACHINE_JOB = "machine"


# ----------------------------------------------------------------- per-rank bookkeeping


@dataclass
class _RankTrack:
    """What one rank's successive stack dumps say over time."""

    last_dump_at: Optional[float] = None  # the timestamp of the rank's newest dump taken in
    moved_at: Optional[StackSample] = None  # the main thread in the dump it was last seen to move at
    last_progress: Optional[float] = None


def job_label(tree: JobTree, hostname: str) -> str:
    """The job's id across nodes (from its ranks' environment), else this host and its launcher's PID."""
    said = next((r.job_id for r in tree.ranks if r.job_id), None)
    return said if said is not None else fallback_job_id(hostname, tree.anchor)


def _first_said(values: Iterable[Optional[int]]) -> str:
    return next((str(v) for v in values if v is not None), "")


def rank_label(rank: Rank, position: int) -> str:
    """RANK from the environment; a process without one is numbered by its place in the job."""
    return str(rank.rank if rank.rank is not None else position)


def hung_pids(findings: Sequence[Finding], tree: JobTree) -> set[int]:
    """The ranks a hang finding names as stuck: those stuck outside a collective (the others wait for them
    in theirs, and show "collective", so the rank holding a job back stands out across nodes), else all
    of them (a hang in the collective itself)."""
    in_collective = {r.proc.pid for r in tree.ranks if r.main_thread_state == COLLECTIVE}
    out: set[int] = set()
    for f in findings:
        if f.id == "hang":
            out |= {pid for pid in f.pids if pid not in in_collective} or set(f.pids)
    return out


def verdict_of(findings: Sequence[Finding]) -> str:
    """healthy / code / infrastructure / unknown, from the diagnosis' top finding."""
    if not findings:
        return "unknown"
    top = findings[0]
    if top.severity in ("critical", "warning"):
        return FINDING_LABELS.get(top.label, "unknown")
    return "healthy" if top.id == "healthy" else "unknown"


# ----------------------------------------------------------------- the exporter


@dataclass
class _GpuMetrics:
    """The GPU families one scrape fills, declared empty."""

    xids: CounterMetricFamily
    xid_info: GaugeMetricFamily
    fabric_state: GaugeMetricFamily
    fabric_health: GaugeMetricFamily
    degraded: GaugeMetricFamily
    generation: GaugeMetricFamily
    width: GaugeMetricFamily
    clock_events: GaugeMetricFamily
    health: GaugeMetricFamily
    problem: GaugeMetricFamily
    readings: list[tuple[gpu_fields.GpuField, GaugeMetricFamily]]  # the gauges the table of GPU fields declares

    @classmethod
    def declared(cls) -> _GpuMetrics:
        gpu_labels = ["gpu", "UUID", "Hostname"]
        return cls(
            xids=CounterMetricFamily(
                "gputop_xid_events", "XID errors the driver reported since gputop started", labels=gpu_labels + ["xid"]
            ),
            xid_info=GaugeMetricFamily(
                "gputop_xid_info",
                "1 per XID code counted in gputop_xid_events: its meaning, severity and action from NVIDIA's XID"
                " catalogue (bucket: the catalogue's immediate-action word)",
                labels=["xid", "meaning", "severity", "bucket", "action", "Hostname"],
            ),
            fabric_state=GaugeMetricFamily(
                "gputop_gpu_fabric_state",
                "The GPU's NVSwitch fabric as the Fabric Manager trained it: 1 not started, 2 in progress, 3 completed"
                " (no series: no NVSwitch fabric)",
                labels=gpu_labels + ["clique", "status"],
            ),
            fabric_health=GaugeMetricFamily(
                "gputop_gpu_fabric_health_mask",
                "NVML's fabric health mask (2-bit fields, 1 = TRUE: degraded bandwidth bits 0-1, route recovery 2-3,"
                " route unhealthy 4-5, access timeout recovery 6-7)",
                labels=gpu_labels,
            ),
            degraded=GaugeMetricFamily(
                "gputop_gpu_pcie_link_degraded", "1 when the PCIe link runs below its maximum under load", labels=gpu_labels
            ),
            generation=GaugeMetricFamily("gputop_gpu_pcie_link_generation", "PCIe link generation", labels=gpu_labels + ["kind"]),
            width=GaugeMetricFamily("gputop_gpu_pcie_link_width", "PCIe link width (lanes)", labels=gpu_labels + ["kind"]),
            clock_events=GaugeMetricFamily(
                "gputop_gpu_clock_event_active",
                "1 while this clock-event (throttle) reason is active",
                labels=gpu_labels + ["reason"],
            ),
            health=GaugeMetricFamily(
                "gputop_gpu_health",
                "The GPU's health as the card, the diagnosis and gputop check judge it: 0 ok, 1 warning, 2 critical",
                labels=gpu_labels,
            ),
            problem=GaugeMetricFamily(
                "gputop_gpu_health_problem",
                "1 per health rule the GPU breaks now (lost, ecc, remap, xid, slowdown, power_limit, pcie, nvlink, fabric; and"
                " the counter checks: pcie.replay, pcie.aer, nvlink.errors, topology, memory.retired_pages), with its severity",
                labels=gpu_labels + ["rule", "severity"],
            ),
            readings=[
                (f, GaugeMetricFamily(*f.metric, labels=gpu_labels)) for f in gpu_fields.shown_in(gpu_fields.METRICS) if f.metric
            ],
        )

    def families(self) -> list[Metric]:
        """In the exporter's order (the DCGM readings, when exported, follow)."""
        return [
            self.xids, self.xid_info, self.degraded, self.generation, self.width, self.clock_events, self.health,
            self.problem, self.fabric_state, self.fabric_health,
        ]  # fmt: skip


def _rank_gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["job", "rank", "Hostname"])


@dataclass
class _JobMetrics:
    """The job and rank families one scrape fills, declared empty."""

    job_info: InfoMetricFamily
    rank_info: InfoMetricFamily
    state: GaugeMetricFamily
    wait_ratio: GaugeMetricFamily
    wait_lower: GaugeMetricFamily
    wait_upper: GaugeMetricFamily
    wait_samples: GaugeMetricFamily
    workers: GaugeMetricFamily
    progress: GaugeMetricFamily
    collective: GaugeMetricFamily
    finding: GaugeMetricFamily
    verdict: GaugeMetricFamily

    @classmethod
    def declared(cls) -> _JobMetrics:
        window = f"{DATA_WAIT_WINDOW_S:.0f} s"
        return cls(
            job_info=InfoMetricFamily("gputop_job", "one training job (a launcher and its ranks)"),
            rank_info=InfoMetricFamily("gputop_rank", "one rank process and its GPU"),
            state=GaugeMetricFamily(
                "gputop_rank_state",
                "1 for what the rank's main thread does now, 0 for the other states",
                labels=["job", "rank", "state", "Hostname"],
            ),
            wait_ratio=_rank_gauge(
                "gputop_rank_data_wait_ratio",
                f"share of the rank's main-thread samples of the last {window} that waited for data or loaded it",
            ),
            wait_lower=_rank_gauge("gputop_rank_data_wait_ratio_lower", "lower end of the data wait share's 95% interval"),
            wait_upper=_rank_gauge("gputop_rank_data_wait_ratio_upper", "upper end of the data wait share's 95% interval"),
            wait_samples=_rank_gauge(
                "gputop_rank_state_samples",
                f"main-thread samples the rank's shares of the last {window} rest on (start-up left out)",
            ),
            workers=_rank_gauge("gputop_dataloader_workers", "live DataLoader worker processes of the rank"),
            progress=_rank_gauge(
                "gputop_rank_last_progress_timestamp_seconds", "when the rank's main thread was last seen to move (Unix time)"
            ),
            collective=GaugeMetricFamily(
                "gputop_rank_collective_seq",
                "from the rank's flight recorder, per process group: the last collective it completed (state=completed) "
                "and the first it waits in (state=pending), by collective_seq_id",
                labels=["job", "rank", "process_group", "state", "op", "Hostname"],
            ),
            finding=GaugeMetricFamily(
                "gputop_finding",
                "1 while the diagnosis reports this finding, 0 after it cleared",
                labels=["job", "kind", "severity", "label", "Hostname"],
            ),
            verdict=GaugeMetricFamily("gputop_verdict", "1 for the job's verdict now", labels=["job", "verdict", "Hostname"]),
        )

    def families(self) -> list[Metric]:
        return [
            self.job_info, self.rank_info, self.state, self.wait_ratio, self.wait_lower, self.wait_upper,
            self.wait_samples, self.workers, self.progress, self.collective, self.finding, self.verdict,
        ]  # fmt: skip


@dataclass(frozen=True)
class _RankInJob:
    """A rank as a scrape exports it: its job's label and its own, its job's tree, whether the diagnosis finds it hung."""

    job: str
    label: str
    tree: JobTree
    rank: Rank
    hung: bool


class Exporter:
    """Collects in `cycle()` (a background thread), serves the last cycle's metrics in `collect()`.

    `source` is polled by `cycle()` only (the first cycle, and tests); its `machine` names the host.
    `diagnose` is `gputop.analysis.findings.findings` (the assembly every sink uses) unless a test gives another.  `dcgm_fields`
    also exports utilization, memory, power, temperature and SM clock (off by default: dcgm-exporter
    has them).
    """

    def __init__(
        self,
        source: Source,
        *,
        interval: float = 1.0,
        hostname: Optional[str] = None,
        dcgm_fields: bool = False,
        diagnose: Optional[Callable[[History], list[Finding]]] = None,
        log: Callable[[str], None] = lambda line: print(f"gputop serve: {line}", file=sys.stderr, flush=True),
    ) -> None:
        if diagnose is None:
            from gputop.advice_memory import AdviceMemory
            from gputop.analysis.findings import findings  # the one assembly every sink uses

            memory = AdviceMemory()  # the advice holds still from one cycle (and one `gputop report`) to the next
            diagnose = functools.partial(findings, memory=memory)
        self.source = source
        self.interval = interval
        self.dcgm_fields = dcgm_fields
        self._diagnose = diagnose
        self._log = log
        self.hostname = hostname or source.machine.hostname  # `serve --hostname` overrides the machine's name
        self._capacity = int(math.ceil(max(DIAGNOSIS_WINDOW_S, DATA_WAIT_WINDOW_S) / interval)) + 2
        self._histories: dict[str, History] = {}
        self._ranks: dict[tuple[str, int], _RankTrack] = {}
        self._findings_seen: dict[str, set[tuple[str, str, str]]] = {}
        self._pcie_degraded: dict[int, bool] = {}
        # the NIC readings of the last diagnosis window, for the health module's NIC judgement (a counter
        # that climbs while we watch needs the window's first reading); each a snapshot of its NICs only
        self._nic_window: deque[Snapshot] = deque()
        # the snapshots of the live health window (HEALTH_WINDOW_S), judged as the card and the diagnosis judge them
        self._gpu_window: deque[Snapshot] = deque()
        self._xids_seen: dict[int, frozenset[XidEvent]] = {}
        self._xid_counts: Counter[tuple[str, str, str]] = Counter()
        self._dump_seen: dict[int, float] = {}  # pid -> timestamp of the last dump counted (ok or failed)
        self._pyspy_errors: Counter[str] = Counter()
        self._said: set[tuple[str, str]] = set()  # (job, reason) already logged
        self._said_exited: set[int] = set()  # jobs (by the PID followed) whose exit was logged
        self._families: list[Metric] = self._static_families()
        self._said_failure: Optional[str] = None
        self.cycles = 0
        self.last_cycle_seconds: Optional[float] = None  # the last update's wall time (the poll not included)

    # ---- the prometheus_client collector protocol

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)  # one reference read: the collector thread swaps in a new list whole

    def describe(self) -> list[Metric]:
        return []  # registering must not run a scrape

    # ---- the collector thread: `source.PollLoop(pipeline, interval, on_error=exporter.failed)`
    # runs `exporter.deliver` with each snapshot; a scrape meanwhile reads the last families

    def deliver(self, batch: Batch) -> None:
        for snap in batch.snapshots:
            try:
                self.update(snap)
            except Exception as exc:  # a job or the diagnosis failed: keep serving the last values
                self.failed(exc)
            else:
                self._said_failure = None

    def failed(self, exc: Exception) -> None:
        """A poll or an update raised: say so once per kind of failure; the loop goes on."""
        text = f"{type(exc).__name__}: {exc}"
        if text != self._said_failure:
            self._log(f"collection failed: {text} (serving the last values; retrying)")
            self._said_failure = text

    def cycle(self) -> None:
        """One poll and update, synchronously (the first one, and tests)."""
        self.update(self.source.poll())

    def update(self, snap: Snapshot) -> None:
        """Diagnose the jobs this snapshot carries and build every metric family anew."""
        started = time.perf_counter()
        trees = self._live_jobs(snap)
        families = self._static_families()
        families += self._gpu_families(snap, snap.counter_health)
        families += self._job_families(snap, trees)
        families += nic_families(snap.nics, self.hostname, self._judge_nics(snap))
        families.append(self._pyspy_family())
        self._families = families
        self.cycles += 1
        self.last_cycle_seconds = time.perf_counter() - started

    def _judge_nics(self, snap: Snapshot) -> Optional[NicJudgement]:
        """`judge_nics` (gputop check's NIC rules) over the NIC readings of the last diagnosis window."""
        if snap.nics is not None:
            self._nic_window.append(Snapshot(snap.timestamp, snap.host, nics=snap.nics))
        while self._nic_window and self._nic_window[0].timestamp < snap.timestamp - DIAGNOSIS_WINDOW_S:
            self._nic_window.popleft()
        return judge_nics(self._nic_window) if snap.nics is not None else None

    def _live_jobs(self, snap: Snapshot) -> list[JobTree]:
        """The snapshot's jobs that still run; a job seen exited is logged once and exported no more."""
        trees = []
        for tree in jobs_of(snap):
            if not tree.exited:
                trees.append(tree)
            elif tree.root_pid not in self._said_exited:
                self._said_exited.add(tree.root_pid)
                self._log(f"job of PID {tree.root_pid} has exited; its metrics are no longer exported")
        return trees

    # ---- families

    def _static_families(self) -> list[Metric]:
        build = InfoMetricFamily("gputop_build", "gputop's version")
        build.add_metric([], {"version": __version__, "Hostname": self.hostname})
        return [build]

    def _gpu_families(self, snap: Snapshot, counter_health: Optional[CounterHealth] = None) -> list[Metric]:
        """The GPUs' gauges; their health from the samples (the health module, over the live window the card
        and the diagnosis judge: `HEALTH_WINDOW_S`) and from the pipeline's counter watch
        (`Snapshot.counter_health`: `gputop check`'s counter lines, rule = the check's id)."""
        metrics = _GpuMetrics.declared()
        # the snapshot itself, not a copy: the diagnosis' window holds the same objects, so the health module
        # judges each sample once for both (gpu_health._LAST_WINDOWS keys on identity)
        self._gpu_window.append(snap)
        while self._gpu_window[0].timestamp < snap.timestamp - HEALTH_WINDOW_S:
            self._gpu_window.popleft()
        judged = judge_window(self._gpu_window)  # the one health judgement (analysis/gpu_health.py)
        counted = counter_problems(counter_health)  # gputop check's counter lines (analysis/counter_health.py)
        for gpu in snap.gpus:
            labels = [str(gpu.index), gpu.uuid, self.hostname]
            self._count_xids(gpu)
            rules = rule_severities(judged.get(gpu.index), counted.get(gpu.index, {}))
            metrics.health.add_metric(labels, float(max(rules.values(), default=Severity.OK)))
            for rule, severity in rules.items():
                metrics.problem.add_metric(labels + [rule, FINDING_SEVERITY[severity]], 1.0)
            if not gpu.lost:
                self._add_gpu_readings(metrics, gpu, labels)
        self._add_xids(metrics)
        families = metrics.families()
        if self.dcgm_fields:
            families += [family for _, family in metrics.readings]
        return families + self._mig_families(snap.gpus)

    def _count_xids(self, gpu: GpuSample) -> None:
        """Count each XID the GPU reports once (the collector keeps the newest few, poll after poll)."""
        seen = self._xids_seen.get(gpu.index, frozenset())
        now_held = frozenset(gpu.xids or ())
        for event in now_held - seen:
            self._xid_counts[(str(gpu.index), gpu.uuid, str(event.code))] += 1
        if gpu.xids is not None:
            self._xids_seen[gpu.index] = now_held

    def _add_xids(self, metrics: _GpuMetrics) -> None:
        """The XIDs counted so far, and what each code means."""
        for (gpu_index, uuid, code), count in sorted(self._xid_counts.items()):
            metrics.xids.add_metric([gpu_index, uuid, self.hostname, code], count)
        for xid in sorted({int(code) for _, _, code in self._xid_counts}):
            m = meaning_of(xid)
            metrics.xid_info.add_metric(
                [str(xid), m.meaning, FINDING_SEVERITY[xid_severity(xid)], m.bucket, m.action, self.hostname], 1.0
            )

    def _add_gpu_readings(self, metrics: _GpuMetrics, gpu: GpuSample, labels: list[str]) -> None:
        """A GPU that answers: its fabric, its PCIe link, its clock events, and (with the DCGM fields) its readings."""
        if gpu.fabric is not None:
            status = "success" if not gpu.fabric.status else f"error {gpu.fabric.status}"
            metrics.fabric_state.add_metric(labels + [str(gpu.fabric.clique_id), status], float(gpu.fabric.state))
            if gpu.fabric.health_mask is not None:
                metrics.fabric_health.add_metric(labels, float(gpu.fabric.health_mask))
        verdict = pcie_degraded(gpu)
        if verdict is not None:
            self._pcie_degraded[gpu.index] = verdict
        if gpu.pcie.width_current is not None:
            metrics.degraded.add_metric(labels, 1.0 if self._pcie_degraded.get(gpu.index, False) else 0.0)
        for kind, gen, lanes in (
            ("current", gpu.pcie.gen_current, gpu.pcie.width_current),
            ("max", gpu.pcie.gen_max, gpu.pcie.width_max),
        ):
            if gen is not None:
                metrics.generation.add_metric(labels + [kind], gen)
            if lanes is not None:
                metrics.width.add_metric(labels + [kind], lanes)
        if gpu.throttle_reasons is not None:
            active = set(gpu.throttle_reasons)
            for reason in THROTTLE_REASONS:
                metrics.clock_events.add_metric(labels + [reason], 1.0 if reason in active else 0.0)
        if self.dcgm_fields:
            for reading, family in metrics.readings:
                value = reading.read(gpu)
                if value is not None:
                    family.add_metric(labels, value)

    def _mig_families(self, gpus: Sequence[GpuSample]) -> list[Metric]:
        """Each MIG instance of a MIG-enabled GPU: what it is, its processes and (with the DCGM fields) its memory.
        NVML gives no utilization for an instance, so these are what says whether one is in use."""
        mig_gpus = [g for g in gpus if g.mig and not g.lost]
        if not mig_gpus:
            return []
        labels = ["gpu", "UUID", "Hostname", "gpu_instance"]
        info = InfoMetricFamily("gputop_mig_instance", "one MIG instance (a GPU instance's compute instance)", labels=labels)
        processes = GaugeMetricFamily("gputop_mig_processes", "processes on the MIG instance", labels=labels)
        used = GaugeMetricFamily("gputop_mig_memory_used_bytes", "memory used on the MIG instance", labels=labels)
        total = GaugeMetricFamily("gputop_mig_memory_total_bytes", "memory of the MIG instance", labels=labels)
        for gpu in mig_gpus:
            for instance in gpu.mig or ():
                values = [str(gpu.index), gpu.uuid, self.hostname, str(instance.gpu_instance_id)]
                described = {
                    "compute_instance": str(instance.compute_instance_id),
                    "profile": instance.profile,
                    "mig_uuid": instance.uuid,
                    "slices": "" if instance.slices is None else str(instance.slices),
                }
                info.add_metric(values, described)
                if instance.processes is not None:
                    processes.add_metric(values, len(instance.processes))
                if instance.memory_used is not None:
                    used.add_metric(values, instance.memory_used)
                if instance.memory_total is not None:
                    total.add_metric(values, instance.memory_total)
        # memory as the other GPU readings: with the DCGM fields (dcgm-exporter has it per instance otherwise)
        return [info, processes] + ([used, total] if self.dcgm_fields else [])

    def _job_families(self, snap: Snapshot, trees: list[JobTree]) -> list[Metric]:
        metrics = _JobMetrics.declared()
        gpu_by_index = {g.index: g for g in snap.gpus}
        live_jobs: set[str] = set()
        live_ranks: set[tuple[str, int]] = set()
        live_pids: set[int] = set()
        for tree in trees:
            job = job_label(tree, self.hostname)
            live_jobs.add(job)
            history = self._history(job)
            history.append(for_job(snap, tree))
            findings = self._diagnose(history)
            # the shares as the diagnosis takes them: dense samples (or dumps), start-up left out, last minute
            observed = collect_rank_observations(history.window(DATA_WAIT_WINDOW_S), snap.timestamp - DATA_WAIT_WINDOW_S)
            hung = hung_pids(findings, tree)
            metrics.job_info.add_metric([], self._job_described(job, tree))
            self._count_pyspy_errors(job, tree)
            live_pids.update(tree.stacks)
            for position, rank in enumerate(tree.ranks):
                pid = rank.proc.pid
                live_ranks.add((job, pid))
                rank_in_job = _RankInJob(job, rank_label(rank, position), tree, rank, pid in hung)
                self._add_rank(metrics, rank_in_job, gpu_by_index, observed.get(pid))
            self._add_findings(metrics.finding, metrics.verdict, job, findings)
        if not trees:
            job = MACHINE_JOB
            live_jobs.add(job)
            history = self._history(job)
            history.append(for_job(snap, None))
            self._add_findings(metrics.finding, metrics.verdict, job, self._diagnose(history))
        self._forget(live_jobs, live_ranks, live_pids)
        return metrics.families()

    def _job_described(self, job: str, tree: JobTree) -> dict[str, str]:
        """gputop_job's labels: the job, its launcher, its size."""
        world = max((r.world_size for r in tree.ranks if r.world_size), default=len(tree.ranks))
        return {
            "job": job,
            "launcher_pid": str(tree.launcher.pid) if tree.launcher else "",
            "world_size": str(world),
            "nnodes": _first_said(r.nnodes for r in tree.ranks),
            "node_rank": _first_said(r.node_rank for r in tree.ranks),
            "Hostname": self.hostname,
        }

    def _add_rank(
        self,
        metrics: _JobMetrics,
        one: _RankInJob,
        gpu_by_index: dict[int, GpuSample],
        obs: Optional[RankObs],
    ) -> None:
        """One rank's series: what it is and its GPUs, its state, its data wait share, its progress, its workers
        and its last collectives."""
        job, label, rank, h = one.job, one.label, one.rank, self.hostname
        pid = rank.proc.pid
        devices: Sequence[tuple[Optional[int], Optional[int]]] = rank.devices or ((None, None),)
        for index, instance in devices:
            gpu = gpu_by_index.get(index) if index is not None else None
            metrics.rank_info.add_metric(
                [],
                {
                    "job": job,
                    "rank": label,
                    "local_rank": "" if rank.local_rank is None else str(rank.local_rank),
                    "node": "" if rank.node_rank is None else str(rank.node_rank),
                    "pid": str(pid),
                    "gpu": "" if index is None else str(index),
                    "mig_instance": "" if instance is None else str(instance),  # its GPU instance id (MIG)
                    "UUID": gpu.uuid if gpu is not None else "",
                    "Hostname": h,
                },
            )
        track = self._track(job, rank, one.tree.stacks.get(pid), one.hung)
        current = "hung" if one.hung else STATE_OF_CLASS.get(rank.main_thread_state or "")
        for name in RANK_STATES:
            metrics.state.add_metric([job, label, name, h], 1.0 if name == current else 0.0)
        if obs is not None and obs.n:
            share = obs.input_share
            for family, value in (
                (metrics.wait_ratio, share.point),
                (metrics.wait_lower, share.low),
                (metrics.wait_upper, share.high),
                (metrics.wait_samples, float(share.n)),
            ):
                family.add_metric([job, label, h], value)
        if track.last_progress is not None:
            metrics.progress.add_metric([job, label, h], track.last_progress)
        metrics.workers.add_metric([job, label, h], sum(1 for w in rank.workers if not w.exited))
        record = next((r for r in one.tree.flight_records if r.pid == pid and r.error is None), None)
        for group, state_name, entry in last_collectives(record) if record is not None else ():
            metrics.collective.add_metric([job, label, group, state_name, entry.op, h], float(entry.seq))

    def _history(self, job: str) -> History:
        history = self._histories.get(job)
        if history is None:
            history = self._histories[job] = History(self.source.machine, capacity=self._capacity)
        return history

    def _track(self, job: str, rank: Rank, stacks: Optional[ProcessStacks], hung: bool) -> _RankTrack:
        """Fold the rank's newest dump (and the collector's class of it) into its window and its last progress."""
        key = (job, rank.proc.pid)
        track = self._ranks.get(key)
        if track is None:
            track = self._ranks[key] = _RankTrack()
        fresh = (
            stacks is not None
            and stacks.error is None
            and stacks.threads
            and rank.main_thread_state is not None
            and (track.last_dump_at is None or stacks.timestamp > track.last_dump_at)
        )
        sample = main_thread_sample(stacks) if fresh and stacks is not None else None
        if sample is not None:
            # the one freeze detector, from the dump it was last seen to move at: the stack, else the counters
            # (CPU time is no progress where they are: CUDA spin-waits), else, without counters, the CPU use
            start = freeze_start(rank.proc.pid, track.moved_at, sample, cpu_counts=False, cpu_percent=rank.proc.cpu_percent)
            if start is sample and (track.moved_at is None or not hung):
                track.moved_at = sample
                track.last_progress = sample.timestamp
            track.last_dump_at = sample.timestamp
        return track

    def _add_findings(self, finding: GaugeMetricFamily, verdict: GaugeMetricFamily, job: str, findings: list[Finding]) -> None:
        active = {(f.id, f.severity, FINDING_LABELS[f.label]) for f in findings if f.label in FINDING_LABELS}
        seen = self._findings_seen.setdefault(job, set())
        seen |= active
        for kind, severity, label in sorted(seen):
            finding.add_metric([job, kind, severity, label, self.hostname], 1.0 if (kind, severity, label) in active else 0.0)
        now = verdict_of(findings)
        for name in VERDICTS:
            verdict.add_metric([job, name, self.hostname], 1.0 if name == now else 0.0)

    def _count_pyspy_errors(self, job: str, tree: JobTree) -> None:
        for pid, stacks in tree.stacks.items():
            if self._dump_seen.get(pid, -math.inf) >= stacks.timestamp:
                continue
            self._dump_seen[pid] = stacks.timestamp
            if stacks.error is None:
                continue
            reason = error_reason(stacks.error)
            self._pyspy_errors[reason] += 1
            if (job, reason) not in self._said and reason != "exited":
                self._said.add((job, reason))  # once per job and kind; the counter carries the rest
                self._log(f"job {job}: cannot read stacks: {stacks.error} (counted in gputop_pyspy_errors_total)")

    def _pyspy_family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "gputop_pyspy_errors", "py-spy stack dumps that failed, by reason", labels=["reason", "Hostname"]
        )
        for reason, count in sorted(self._pyspy_errors.items()):
            family.add_metric([reason, self.hostname], count)
        return family

    def _forget(self, jobs: set[str], ranks: set[tuple[str, int]], pids: set[int]) -> None:
        """Drop what belongs to jobs, ranks and processes that are gone: memory stays flat."""
        for job in [j for j in self._histories if j not in jobs]:
            del self._histories[job]
            self._findings_seen.pop(job, None)
        for key in [k for k in self._ranks if k not in ranks]:
            del self._ranks[key]
        for pid in [p for p in self._dump_seen if p not in pids]:
            del self._dump_seen[pid]


def nic_families(nics: Optional[Sequence[NicPortSample]], hostname: str, judged: Optional[NicJudgement] = None) -> list[Metric]:
    """The NIC ports as sysfs counts them (collect/sysfs.NicReader), labelled device, port, Hostname; the
    counters are the kernel's own cumulative ones (since the driver loaded), for PromQL's rate().  Whether a
    port is down, slow or erring is `gputop check`'s judgement (analysis/gpu_health.judge_nics, over the
    exporter's window: `judged`), exported as gputop_nic_health_problem, one series per port and rule."""
    labels = ["device", "port", "Hostname"]
    up = GaugeMetricFamily("gputop_nic_up", "1 while the NIC port is ACTIVE (RDMA) / up (Ethernet)", labels=labels)
    rate = GaugeMetricFamily("gputop_nic_rate_gbps", "the rate the NIC port trained to, Gb/s (absent while down)", labels=labels)
    errors = CounterMetricFamily(
        "gputop_nic_errors",
        "the NIC port's error counters (sysfs counters/, hw_counters/, statistics/)",
        labels=labels + ["counter"],
    )
    received = CounterMetricFamily("gputop_nic_receive_bytes", "bytes the NIC port received", labels=labels)
    sent = CounterMetricFamily("gputop_nic_transmit_bytes", "bytes the NIC port sent", labels=labels)
    health_gauge = GaugeMetricFamily(
        "gputop_nic_health",
        "The NIC port's health as gputop check judges it: 0 ok, 1 warning, 2 critical",
        labels=labels,
    )
    problem = GaugeMetricFamily(
        "gputop_nic_health_problem",
        "1 per NIC health rule the port breaks now, as gputop check judges it (nic_down, nic_rate: below its"
        " peers' or its own best rate, nic_errors: error counters that climbed in the window), with its severity",
        labels=labels + ["rule", "severity"],
    )
    for port in nics or ():
        values = [port.device, str(port.port), hostname]
        up.add_metric(values, 1.0 if port.up else 0.0)
        if port.rate_gbps is not None:
            rate.add_metric(values, port.rate_gbps)
        for counter, count in sorted(port.errors.items()):
            errors.add_metric(values + [counter], count)
        if port.rx_bytes is not None:
            received.add_metric(values, port.rx_bytes)
        if port.tx_bytes is not None:
            sent.add_metric(values, port.tx_bytes)
    for health in judged.ports if judged is not None else ():
        rules: dict[str, Severity] = {}
        for p in health.problems:
            rules[p.rule] = max(rules.get(p.rule, Severity.OK), p.severity)
        values = [health.device, str(health.port), hostname]
        health_gauge.add_metric(values, float(health.severity))
        for rule, severity in rules.items():
            problem.add_metric(values + [rule, FINDING_SEVERITY[severity]], 1.0)
    return [up, rate, errors, received, sent, health_gauge, problem]

"""`gputop serve`: the metrics it exports, how it listens, and that it stays small and fast.

Most tests feed the real `Exporter` (the real diagnosis, the real prometheus_client formatting) from
hand-built histories (tests/harness/histories.py) or from the simulated machine (the real pynvml wrappers
over the fake library), and read the metrics back over a real HTTP server.  The end-to-end tests
(marked slow) run `gputop serve` next to a real training job and a real Prometheus.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Optional

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gputop.analysis.gpu_health import forget_judged_windows, judged_snapshots_kept
from gputop.analysis.stack_classes import COLLECTIVE, FORWARD_BACKWARD, IN_DATASET, OPTIMIZER_STEP, WAITING_FOR_DATA
from gputop.cli import build_parser, main
from gputop.collect.stacks import PtraceFacts, error_reason, find_py_spy, permission_advice
from gputop.commands.serve import DEFAULT_LISTEN, is_loopback, parse_listen, start_server
from gputop.errors import UsageError
from gputop.exporter import DATA_WAIT_WINDOW_S, RANK_STATES, Exporter
from gputop.model import LABEL_CODE, LABEL_INFRA, Finding, ProcessStacks, XidEvent
from tests.harness import histories as hb
from tests.harness.memory import heap_growth_per_block
from tests.harness.processes import free_port, wait_until
from tests.harness.train_jobs import start_attach_loop

REPO = Path(__file__).resolve().parent.parent

# The table: every metric and exactly its labels (each also carries dcgm-exporter's Hostname).
METRIC_LABELS = {
    "gputop_build_info": {"version"},
    "gputop_job_info": {"job", "launcher_pid", "world_size", "nnodes", "node_rank"},
    "gputop_rank_info": {"job", "rank", "local_rank", "node", "pid", "gpu", "mig_instance", "UUID"},
    "gputop_rank_state": {"job", "rank", "state"},
    "gputop_rank_data_wait_ratio": {"job", "rank"},
    "gputop_dataloader_workers": {"job", "rank"},
    "gputop_rank_last_progress_timestamp_seconds": {"job", "rank"},
    "gputop_finding": {"job", "kind", "severity", "label"},
    "gputop_verdict": {"job", "verdict"},
    "gputop_xid_events_total": {"gpu", "UUID", "xid"},
    "gputop_gpu_pcie_link_degraded": {"gpu", "UUID"},
    "gputop_gpu_pcie_link_generation": {"gpu", "UUID", "kind"},
    "gputop_gpu_pcie_link_width": {"gpu", "UUID", "kind"},
    "gputop_gpu_clock_event_active": {"gpu", "UUID", "reason"},
    "gputop_pyspy_errors_total": {"reason"},
}


# ----------------------------------------------------------------- feeding the exporter recorded data


class HistorySource:
    """A pipeline stand-in that hands out a built history's snapshots one per poll."""

    def __init__(self, history) -> None:
        self.machine = history.machine
        self.snaps = list(history)
        self.i = 0

    def poll(self):
        snap = self.snaps[self.i]
        self.i += 1
        return snap

    def close(self) -> None:
        pass


def exporter_over(scenario: hb.Scenario, **kwargs) -> tuple[Exporter, HistorySource]:
    source = HistorySource(hb.build(scenario))
    kwargs.setdefault("interval", scenario.interval)
    kwargs.setdefault("log", lambda line: None)
    return Exporter(source, **kwargs), source


def run_cycles(exporter: Exporter, source: HistorySource, n: Optional[int] = None) -> None:
    for _ in range(len(source.snaps) - source.i if n is None else n):
        exporter.cycle()


Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value for family in text_string_to_metric_families(text) for s in family.samples
    }


def scrape_text(exporter: Exporter) -> str:
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return generate_latest(registry).decode()


def values(samples: Samples, name: str, **match: str) -> dict[frozenset, float]:
    """The samples of `name` whose labels include `match`."""
    want = set(match.items())
    return {labels: v for (n, labels), v in samples.items() if n == name and want <= labels}


def one(samples: Samples, name: str, **match: str) -> float:
    found = values(samples, name, **match)
    assert len(found) == 1, f"{name}{match}: {len(found)} samples: {found}"
    return next(iter(found.values()))


@contextlib.contextmanager
def served(exporter: Exporter):
    """The exporter behind the real prometheus_client HTTP server on a free loopback port; yields the URL."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    server = start_server("127.0.0.1", 0, registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def get(url: str, accept: Optional[str] = None) -> str:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def simulated_exporter(spec: str) -> Exporter:
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Pipeline

    pipeline = Pipeline(SimulatedMachine(spec))
    pipeline.backend.library.pcie_latency_s = 0.0  # the fake's 20 ms per PCIe read only slows the test
    return Exporter(pipeline, interval=1.0, log=lambda line: None)


# ----------------------------------------------------------------- GPU metrics


def test_simulated_degraded_link_is_one_for_that_gpu_and_zero_for_the_others():
    exporter = simulated_exporter("h100-sxm-8+pcie-degraded=3")
    try:
        exporter.cycle()
        with served(exporter) as url:
            samples = parse(get(url))
        degraded = {dict(labels)["gpu"]: v for labels, v in values(samples, "gputop_gpu_pcie_link_degraded").items()}
        assert degraded == {str(g): (1.0 if g == 3 else 0.0) for g in range(8)}
        assert one(samples, "gputop_gpu_pcie_link_generation", gpu="3", kind="current") == 3
        assert one(samples, "gputop_gpu_pcie_link_generation", gpu="3", kind="max") == 5
        assert one(samples, "gputop_gpu_pcie_link_width", gpu="3", kind="current") == 8
        assert one(samples, "gputop_gpu_pcie_link_width", gpu="2", kind="current") == 16
        # the GPU labels are dcgm-exporter's, with the simulated board's UUID
        uuid = exporter.source.poll().gpus[3].uuid
        assert one(samples, "gputop_gpu_pcie_link_degraded", gpu="3", UUID=uuid, Hostname=exporter.hostname) == 1
        # without a job on the GPUs the verdict is the machine's: the link is the infrastructure's problem
        assert one(samples, "gputop_finding", job="machine", kind="pcie_downgrade", label="infrastructure") == 1
        assert one(samples, "gputop_verdict", job="machine", verdict="infrastructure") == 1
    finally:
        exporter.source.close()


def test_an_idle_link_at_a_low_generation_is_not_degraded():
    """Idle GPUs drop the link generation to save power: only a link under load counts."""
    idle_then_busy = hb.Scenario(
        seconds=10,
        util=lambda g, t: 0.0 if t < 5 else 95.0,
        gpu_extra=lambda g, t: {"pcie": hb.PcieLink(1 if t < 5 else 5, 5, 16, 16)},
    )
    exporter, source = exporter_over(idle_then_busy)
    run_cycles(exporter, source, 3)
    assert set(values(parse(scrape_text(exporter)), "gputop_gpu_pcie_link_degraded").values()) == {0.0}
    gen_down_under_load = replace(idle_then_busy, gpu_extra=lambda g, t: {"pcie": hb.PcieLink(4 if g == 1 else 5, 5, 16, 16)})
    exporter, source = exporter_over(gen_down_under_load)
    run_cycles(exporter, source)
    degraded = values(parse(scrape_text(exporter)), "gputop_gpu_pcie_link_degraded")
    assert {dict(k)["gpu"] for k, v in degraded.items() if v == 1.0} == {"1"}


def test_clock_event_reasons_are_one_while_active():
    exporter = simulated_exporter("h100-sxm-8+thermal=2")
    try:
        exporter.cycle()
        samples = parse(scrape_text(exporter))
        assert one(samples, "gputop_gpu_clock_event_active", gpu="2", reason="hw_thermal") == 1
        assert one(samples, "gputop_gpu_clock_event_active", gpu="1", reason="hw_thermal") == 0
        assert len(values(samples, "gputop_gpu_clock_event_active", gpu="1")) == 9  # every reason, 0 or 1
    finally:
        exporter.source.close()


def test_xid_counter_counts_each_event_once_although_every_sample_repeats_them():
    e1, e2, e3 = XidEvent(hb.T0 + 1, 79), XidEvent(hb.T0 + 2, 79), XidEvent(hb.T0 + 3, 48)
    # the collector keeps only the newest few: e1 falls out of the ring while e2 and e3 stay
    held = [(), (e1,), (e1,), (e1, e2), (e2, e3), (e2, e3)]
    scenario = hb.Scenario(seconds=5, gpu_extra=lambda g, t: {"xids": held[int(t)] if g == 4 else ()})
    exporter, source = exporter_over(scenario)
    run_cycles(exporter, source)
    samples = parse(scrape_text(exporter))
    assert one(samples, "gputop_xid_events_total", gpu="4", xid="79") == 2
    assert one(samples, "gputop_xid_events_total", gpu="4", xid="48") == 1
    assert values(samples, "gputop_xid_events_total", gpu="3") == {}


def test_dcgm_fields_only_when_asked_for():
    scenario = hb.Scenario(seconds=1)
    plain, source = exporter_over(scenario)
    run_cycles(plain, source)
    assert not [name for name, _ in parse(scrape_text(plain)) if name.startswith(("gputop_gpu_utilization", "gputop_gpu_power"))]
    opted, source = exporter_over(scenario, dcgm_fields=True)
    run_cycles(opted, source)
    samples = parse(scrape_text(opted))
    assert one(samples, "gputop_gpu_utilization_percent", gpu="0") == 95.0
    assert one(samples, "gputop_gpu_power_watts", gpu="0") == 400.0


# ----------------------------------------------------------------- job metrics


def input_bound(seconds: float = 60.0, ranks: int = 8, **kwargs) -> hb.Scenario:
    """Ranks waiting for data in 3 of every 4 dumps, 4 workers each, replaced every 20 s (no persistent_workers)."""
    return hb.Scenario(
        seconds=seconds,
        util=lambda g, t: 30.0,
        ranks=hb.eight_ranks(
            state=hb.cycle([WAITING_FOR_DATA, WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD]),
            workers=lambda t: [5000 + int(t // 20) * 10 + i for i in range(4)],
        )[:ranks],
        **kwargs,
    )


def test_every_stack_class_is_one_of_the_rank_states():
    from gputop.analysis.stack_classes import MAIN_THREAD_STATES
    from gputop.exporter import STATE_OF_CLASS

    assert set(STATE_OF_CLASS) == set(MAIN_THREAD_STATES)  # a new class must get a state, not all zeros
    assert set(STATE_OF_CLASS.values()) | {"hung"} == set(RANK_STATES)


def test_input_bound_job_exports_its_ranks_wait_and_the_code_verdict():
    exporter, source = exporter_over(input_bound())
    run_cycles(exporter, source)
    samples = parse(scrape_text(exporter))
    job = "trainbox:100"  # a job on one machine (no rendezvous id in its environment): the host and launcher's PID
    assert one(samples, "gputop_job_info", job=job) == 1
    assert dict(next(iter(values(samples, "gputop_job_info"))))["world_size"] == "8"
    for rank in range(8):
        assert one(samples, "gputop_rank_data_wait_ratio", job=job, rank=str(rank)) == pytest.approx(0.75, abs=0.05)
        assert one(samples, "gputop_dataloader_workers", job=job, rank=str(rank)) == 4
        info = dict(next(iter(values(samples, "gputop_rank_info", job=job, rank=str(rank)))))
        assert (info["pid"], info["gpu"], info["UUID"], info["local_rank"]) == (
            str(1000 + rank),
            str(rank),
            f"GPU-{rank:08d}-0000-0000-0000-000000000000",
            str(rank),
        )
        states = {dict(k)["state"]: v for k, v in values(samples, "gputop_rank_state", job=job, rank=str(rank)).items()}
        assert sorted(states) == sorted(RANK_STATES)
        last_state = source.snaps[-1].job.ranks[rank].main_thread_state
        assert states == {
            s: (1.0 if s == {WAITING_FOR_DATA: "data_wait", FORWARD_BACKWARD: "compute"}[last_state] else 0.0)
            for s in RANK_STATES
        }
        # the loop moves (CPU in use): progress is the newest dump
        assert (
            one(samples, "gputop_rank_last_progress_timestamp_seconds", job=job, rank=str(rank))
            == source.snaps[-1].job.stacks[1000 + rank].timestamp
        )
    assert one(samples, "gputop_finding", job=job, kind="starvation", severity="critical", label="code") == 1
    assert one(samples, "gputop_verdict", job=job, verdict="code") == 1
    assert sum(values(samples, "gputop_verdict", job=job).values()) == 1


def test_every_metric_has_exactly_the_labels_of_the_table_and_nothing_private():
    exporter, source = exporter_over(input_bound(), dcgm_fields=False)
    run_cycles(exporter, source, len(source.snaps) - 1)
    exporter._pyspy_errors["permission"] += 1  # so the error counter has a sample to check too
    exporter._xid_counts[("0", "GPU-0", "79")] += 1
    exporter.cycle()
    samples = parse(scrape_text(exporter))
    seen = {name for name, _ in samples}
    assert set(METRIC_LABELS) <= seen, set(METRIC_LABELS) - seen
    worker_pids = {str(w.pid) for snap in source.snaps for r in snap.job.ranks for w in r.workers}
    for name, labels in samples:
        if name not in METRIC_LABELS:
            continue
        assert {k for k, _ in labels} == METRIC_LABELS[name] | {"Hostname"}, name
        for key, value in labels:
            assert "train.py" not in value and "--" not in value and "/" not in value, (name, key, value)
            assert value not in worker_pids, f"{name} has a worker PID in label {key}"


def test_data_wait_ratio_covers_the_last_window_only():
    waiting_then_computing = hb.Scenario(
        seconds=150,
        ranks=[hb.RankSpec(pid=1000, rank=0, gpus=(0,), state=lambda t: WAITING_FOR_DATA if t < 60 else FORWARD_BACKWARD)],
    )
    exporter, source = exporter_over(waiting_then_computing)
    run_cycles(exporter, source, 60)
    assert one(parse(scrape_text(exporter)), "gputop_rank_data_wait_ratio", rank="0") == 1.0
    run_cycles(exporter, source, 30)  # half the window computing
    assert one(parse(scrape_text(exporter)), "gputop_rank_data_wait_ratio", rank="0") == pytest.approx(0.5, abs=0.05)
    run_cycles(exporter, source)  # a whole window since the last wait
    assert DATA_WAIT_WINDOW_S < 150 - 60
    assert one(parse(scrape_text(exporter)), "gputop_rank_data_wait_ratio", rank="0") == 0.0


def test_loading_data_in_the_main_thread_counts_as_waiting_for_it():
    in_dataset = hb.Scenario(
        seconds=20, ranks=[hb.RankSpec(pid=1000, rank=0, gpus=(0,), state=hb.cycle([IN_DATASET, OPTIMIZER_STEP]))]
    )
    exporter, source = exporter_over(in_dataset)
    run_cycles(exporter, source)
    samples = parse(scrape_text(exporter))
    assert one(samples, "gputop_rank_data_wait_ratio", rank="0") == pytest.approx(0.5, abs=0.1)


def test_each_ranks_last_collective_is_exported_from_its_flight_recorder():
    """The recorded dumps of a gloo job whose rank 2 never entered all-reduce #4: ranks 0 and 1 wait in it."""
    from tests.test_collectives import records

    frozen = hb.Scenario(seconds=10, util=lambda g, t: 0.0, ranks=hb.eight_ranks(state=lambda t: COLLECTIVE))
    exporter, source = exporter_over(frozen)
    recs = records("stuck")
    source.snaps = [
        replace(
            s,
            job=replace(s.job, flight_records=tuple(replace(r, pid=s.job.ranks[r.rank].proc.pid) for r in recs)),
        )
        for s in source.snaps
    ]
    run_cycles(exporter, source)
    samples = parse(scrape_text(exporter))
    seqs = values(samples, "gputop_rank_collective_seq", process_group="0", op="gloo:all_reduce")
    assert {k for labels in seqs for k, _ in labels} == {"job", "rank", "process_group", "state", "op", "Hostname"}
    by_rank = {(dict(labels)["rank"], dict(labels)["state"]): v for labels, v in seqs.items()}
    assert by_rank == {
        ("0", "completed"): 3,
        ("0", "pending"): 4,
        ("1", "completed"): 3,
        ("1", "pending"): 4,
        ("2", "completed"): 3,
    }


def test_a_hung_job_shows_hung_ranks_and_progress_that_stopped():
    """Every rank parked in one collective with the same frames, the GPUs at 0% holding memory."""
    frozen = hb.Scenario(
        seconds=60,
        util=lambda g, t: 95.0 if t < 20 else 0.0,
        ranks=hb.eight_ranks(state=lambda t: FORWARD_BACKWARD if t < 20 else COLLECTIVE, cpu=lambda t: 30.0 if t < 20 else 0.0),
    )
    exporter, source = exporter_over(frozen)
    run_cycles(exporter, source)
    samples = parse(scrape_text(exporter))
    assert one(samples, "gputop_finding", job="trainbox:100", kind="hang", severity="critical", label="code") == 1
    for rank in range(8):
        assert one(samples, "gputop_rank_state", rank=str(rank), state="hung") == 1
        assert sum(values(samples, "gputop_rank_state", rank=str(rank)).values()) == 1
        # the last dump that moved is the first one in the collective (t=20); nothing moved after it
        assert one(samples, "gputop_rank_last_progress_timestamp_seconds", rank=str(rank)) == hb.T0 + 20
    assert one(samples, "gputop_verdict", job="trainbox:100", verdict="code") == 1


def test_a_finding_reads_zero_once_it_cleared_and_the_verdict_follows():
    pcie = Finding(id="pcie_downgrade", title="", severity="warning", confidence=0.9, label=LABEL_INFRA, summary="")
    healthy = Finding(id="healthy", title="", severity="info", confidence=0.9, label="", summary="")
    hang = Finding(id="hang", title="", severity="critical", confidence=0.9, label=LABEL_CODE, summary="", pids=(1000,))
    answers = iter([[pcie], [healthy], [hang, pcie], []])
    scenario = hb.Scenario(seconds=3, ranks=[hb.RankSpec(pid=1000, rank=0, gpus=(0,))])
    exporter, source = exporter_over(scenario, diagnose=lambda history: next(answers))
    seen = []
    for _ in range(4):
        exporter.cycle()
        samples = parse(scrape_text(exporter))
        verdict = [dict(k)["verdict"] for k, v in values(samples, "gputop_verdict").items() if v == 1]
        findings = {(dict(k)["kind"], dict(k)["label"]): v for k, v in values(samples, "gputop_finding").items()}
        seen.append((verdict, findings, one(samples, "gputop_rank_state", state="hung")))
    assert seen == [
        (["infrastructure"], {("pcie_downgrade", "infrastructure"): 1.0}, 0.0),
        (["healthy"], {("pcie_downgrade", "infrastructure"): 0.0}, 0.0),
        (["code"], {("pcie_downgrade", "infrastructure"): 1.0, ("hang", "code"): 1.0}, 1.0),
        (["unknown"], {("pcie_downgrade", "infrastructure"): 0.0, ("hang", "code"): 0.0}, 0.0),
    ]


def test_progress_follows_the_main_threads_counters_when_its_stack_stays_the_same():
    """Identical stacks: a loop woken by each batch (voluntary switches) moves; a thread parked at a CUDA
    sync spinning a core does not (CPU time is not progress when the counters are there)."""
    from gputop.model import ProcessProgress, ThreadProgress

    def dump(t: float, switches: int, cpu_ticks: int) -> ProcessStacks:
        stacks = hb.stacks_of(1000, hb.STATE_FRAMES[WAITING_FOR_DATA], hb.T0 + t)
        return replace(
            stacks,
            progress=ProcessProgress(
                cpu_seconds=cpu_ticks / 100,
                io_read_chars=0,
                io_write_chars=0,
                threads=(ThreadProgress(1000, switches, 0, cpu_ticks),),
            ),
        )

    def last_progress(dumps: list[ProcessStacks], cpu: float) -> float:
        scenario = hb.Scenario(
            seconds=len(dumps) - 1,
            ranks=[hb.RankSpec(pid=1000, rank=0, gpus=(0,), state=lambda t: WAITING_FOR_DATA, cpu=lambda t: cpu)],
        )
        history = hb.build(scenario)
        source = HistorySource(history)
        source.snaps = [replace(s, job=replace(s.job, stacks={1000: d})) for s, d in zip(history, dumps)]
        exporter = Exporter(source, interval=1.0, diagnose=lambda h: [], log=lambda line: None)
        run_cycles(exporter, source)
        return one(parse(scrape_text(exporter)), "gputop_rank_last_progress_timestamp_seconds", rank="0") - hb.T0

    assert last_progress([dump(t, 10 * t, 5 * t) for t in range(6)], cpu=5.0) == 5  # woken each batch
    assert last_progress([dump(t, 10 if t < 3 else 30, 100 * t) for t in range(6)], cpu=100.0) == 3  # spinning since t=3


def test_refused_stacks_become_a_counter_and_one_log_line():
    refused = "permission denied reading PID 1000's stacks: run gputop as the job's user, or with sudo"

    def refused_dumps(history):
        for snap in history:
            stacks = {pid: ProcessStacks(pid=pid, timestamp=s.timestamp, error=refused) for pid, s in snap.job.stacks.items()}
            yield replace(
                snap,
                job=replace(snap.job, stacks=stacks, ranks=tuple(replace(r, main_thread_state=None) for r in snap.job.ranks)),
            )

    history = hb.build(hb.Scenario(seconds=20, ranks=[hb.RankSpec(pid=1000, rank=0, gpus=(0,))]))
    source = HistorySource(history)
    source.snaps = list(refused_dumps(history))
    logged: list[str] = []
    exporter = Exporter(source, interval=1.0, log=logged.append)
    run_cycles(exporter, source)
    samples = parse(scrape_text(exporter))
    dumps = len({s.job.stacks[1000].timestamp for s in source.snaps})
    assert one(samples, "gputop_pyspy_errors_total", reason="permission") == dumps == 11
    assert logged == [f"job trainbox:100: cannot read stacks: {refused} (counted in gputop_pyspy_errors_total)"]
    # no stacks: the state is unknown (every state 0) and there is no wait ratio to report
    assert sum(values(samples, "gputop_rank_state").values()) == 0
    assert values(samples, "gputop_rank_data_wait_ratio") == {}


def test_a_failed_poll_is_logged_once_and_the_poll_loop_goes_on():
    """serve's loop: the one PollLoop feeding the exporter, which logs a failure once and keeps serving."""
    from gputop.source import PollLoop

    class FlakySource(HistorySource):
        failures = 0

        def poll(self):
            if self.i == 2 and self.failures < 3:  # the driver fails three polls in a row
                self.failures += 1
                raise OSError("NVML went away")
            if self.i == len(self.snaps) - 1:
                loop.stop()  # the last snapshot: the loop ends after this tick
            return super().poll()

    source = FlakySource(hb.build(input_bound(seconds=6, ranks=1)))
    logged: list[str] = []
    exporter = Exporter(source, interval=1.0, log=logged.append)
    loop = PollLoop(source, 0.001, on_error=exporter.failed)
    loop.run(exporter.deliver)
    assert source.failures == 3
    assert logged == ["collection failed: OSError: NVML went away (serving the last values; retrying)"]
    assert exporter.cycles == len(source.snaps) == 7
    assert one(parse(scrape_text(exporter)), "gputop_rank_data_wait_ratio", rank="0") > 0


def test_error_reasons_match_the_messages_the_stack_reader_writes():
    advice = permission_advice(
        1234, PtraceFacts(our_uid=1000, target_uid=0, has_cap_sys_ptrace=False, ptrace_scope=1, in_container=False)
    )
    assert error_reason(advice) == "permission"
    assert error_reason("process 1234 has exited") == "exited"
    assert (
        error_reason("not a Python process (py-spy: Failed to find python version); GPU and CPU views still work") == "not_python"
    )
    assert error_reason("py-spy took longer than 3s on PID 5; will retry") == "timeout"
    assert error_reason("py-spy not found (looked next to /x and on PATH); install it") == "py_spy_missing"
    assert error_reason("py-spy kept failing: Failed to copy PyFrameObject") == "torn_read"
    assert error_reason("something new") == "other"


# ----------------------------------------------------------------- the files in contrib/

CONTRIB = REPO / "contrib"
PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (it comes with Debian's prometheus package, which .ci/run installs)"
)
def test_alert_rules_pass_their_promtool_unit_tests():
    """Hang (no progress 10 min while the GPU holds memory), gputop's hang finding, a straggler, input-bound
    10 min, degraded link: each fires for the series it should and stays quiet for the others; the job alerts
    once per job, naming the rank and node, for a job on 4 nodes too (contrib/prometheus/gputop-alerts.test.yml)."""
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(CONTRIB / "prometheus" / "gputop-alerts.test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    check = subprocess.run(
        [PROMTOOL, "check", "config", str(CONTRIB / "prometheus" / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def dashboard_queries() -> list[str]:
    dashboard = json.loads((CONTRIB / "grafana" / "gputop.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]  # a row has none


def test_the_dashboard_reads_only_metrics_gputop_or_dcgm_exporter_export():
    import re

    exported = set(METRIC_LABELS) | {"gputop_xid_events_total", "gputop_pyspy_errors_total", "gputop_gpu_health"}
    queries = dashboard_queries()
    names = {name for expr in queries for name in re.findall(r"\b((?:gputop|DCGM_FI)_[A-Za-z_]+)", expr)}
    assert {n for n in names if n.startswith("gputop_")} <= exported
    assert {"gputop_rank_data_wait_ratio", "gputop_rank_state", "gputop_verdict", "gputop_finding"} <= names
    assert any(n.startswith("DCGM_FI_") for n in names)  # beside dcgm-exporter's
    for expr in queries:  # joins go through dcgm-exporter's labels
        if "DCGM_FI_" in expr and "gputop_" in expr:
            assert "on (Hostname, gpu)" in expr, expr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_verifies(tmp_path):
    unit = tmp_path / "gputop-serve.service"
    gputop = shutil.which("gputop") or sys.executable
    unit.write_text((CONTRIB / "systemd" / "gputop-serve.service").read_text().replace("/usr/local/bin/gputop", gputop))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "gputop-serve.service" not in result.stderr, result.stderr


# ----------------------------------------------------------------- listening


def test_default_listen_is_loopback_port_9401():
    args = build_parser().parse_args(["serve"])
    assert args.listen == DEFAULT_LISTEN == "127.0.0.1:9401"
    assert parse_listen(args.listen) == ("127.0.0.1", 9401) and is_loopback("127.0.0.1")
    assert not is_loopback("0.0.0.0") and parse_listen("0.0.0.0:9500") == ("0.0.0.0", 9500)
    assert parse_listen("[::1]:9401") == ("::1", 9401) and is_loopback("::1")
    assert build_parser().parse_args(["serve", "--pid", "5", "6", "--pid", "7"]).pid == [5, 6, 7]


@pytest.mark.parametrize("listen", ["9401", ":9401", "localhost:http", "127.0.0.1:70000", "::1:9401", "127.0.0.1:0"])
def test_a_bad_listen_address_is_one_line_and_exit_2(listen, capsys):
    with pytest.raises(UsageError):
        parse_listen(listen)
    assert main(["serve", "--listen", listen]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gputop: --listen") and "Traceback" not in err


def test_a_port_in_use_is_one_line_and_exit_1(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--simulate", "--listen", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert (
        err
        == f"gputop: 127.0.0.1:{port} is already in use (another gputop serve?); choose another port with --listen HOST:PORT\n"
    )


def test_no_such_pid_is_one_line_and_exit_1(capsys):
    assert main(["serve", "--simulate", "--pid", "4194303"]) == 1  # above any default pid_max: never a process
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no process with PID 4194303" in err


def _serve_in_a_child(spawn, patch: str) -> tuple[int, str, str]:
    """`gputop serve --simulate` on a free loopback port in a child whose `gputop.commands.serve` was patched by
    `patch` (Python source); (exit code, what it printed after main() returned it, stderr)."""
    code = (
        "import os, signal, socket, sys\n"
        "from gputop.commands import serve\n"
        f"{patch}\n"
        "from gputop.cli import main\n"
        "with socket.socket() as s:\n"
        "    s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]\n"
        "rc = main(['serve', '--simulate', '--listen', f'127.0.0.1:{port}'])\n"
        "print(rc, sorted(m for m in ('textual', 'torch') if m in sys.modules))\n"
    )
    proc = spawn.python(code, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@pytest.mark.slow  # the quick lane's tests/test_import_hygiene.py runs serve the same way
def test_serve_never_imports_textual_or_torch(spawn):
    """The whole command (collect, bind, serve, stop) with its wait for a signal cut short."""
    rc, out, err = _serve_in_a_child(spawn, "serve._wait_for_signal = lambda *args: None  # return at once, no SIGTERM")
    assert out == "0 []\n" and rc == 0, err
    assert "serving metrics for every job on the GPUs on http://127.0.0.1:" in err


def test_a_sigterm_the_moment_serve_listens_ends_it_cleanly(spawn):
    """systemd's stop (or a test's) may come as soon as the port answers: serve's handlers are in place before it
    listens, so it stops through its clean stop and exits 0 (ci50: killed by the default action, rc -15)."""
    patch = (
        "listen = serve.start_exporting\n"
        "def listen_then_stopped(*args, **kwargs):\n"
        "    server = listen(*args, **kwargs)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)  # at once: before serve has logged or polled\n"
        "    return server\n"
        "serve.start_exporting = listen_then_stopped"
    )
    rc, out, err = _serve_in_a_child(spawn, patch)
    assert (rc, out) == (0, "0 []\n"), err[-2000:]


# ----------------------------------------------------------------- speed and memory


def test_a_scrape_formats_the_last_cycles_families_and_does_no_other_work():
    """A scrape formats the last cycle's families and nothing else (8 GPUs, 8 ranks, findings): no poll, no
    update, no diagnosis, no family rebuilt, however many scrapes.  Counted, not timed: a scrape's time beside
    a collection cycle's is benchmarks/bench_serve.py's."""
    exporter, source = exporter_over(input_bound(seconds=20))
    run_cycles(exporter, source)
    work: collections.Counter = collections.Counter()

    def counted(name, fn):
        def call(*args, **kwargs):
            work[name] += 1
            return fn(*args, **kwargs)

        return call

    for name in ("cycle", "update", "_diagnose", "_static_families", "_gpu_families", "_job_families"):
        setattr(exporter, name, counted(name, getattr(exporter, name)))
    source.poll = counted("poll", source.poll)
    families, cycles = exporter._families, exporter.cycles
    with served(exporter) as url:
        bodies = {get(url, accept="application/openmetrics-text; version=1.0.0") for _ in range(30)}
    assert len(bodies) == 1  # thirty scrapes, one text: the last cycle's
    body = bodies.pop()
    assert body.rstrip().endswith("# EOF") and "gputop_rank_data_wait_ratio" in body
    assert not work, f"a scrape did collection work: {dict(work)}"
    assert exporter._families is families and exporter.cycles == cycles


@pytest.mark.slow  # a memory soak, like the pipeline's and the replay's
def test_memory_stays_flat_over_many_cycles_in_compressed_time():
    """Hundreds of collection cycles of a job whose DataLoader workers are replaced every 20 s (5 cycles).

    Time is compressed twice: the cycles follow each other at once, and each stands for 4 s (so the
    histories fill their diagnosis window in 32 cycles).  Two ranks keep the diagnosis cheap on 2 cores."""
    exporter, source = exporter_over(input_bound(seconds=4 * 360, ranks=2, interval=4.0))
    kept: list[int] = []

    def settle() -> None:
        # The health judgements of the last two windows (gpu_health.judge_window's reuse) are bounded by
        # construction, checked here, but their size follows each window's content: one block read 14 KB, the
        # next 5,264 bytes, in a fresh interpreter (with them dropped: 0.6-0.9 KB, three runs in a row).
        kept.append(judged_snapshots_kept())
        forget_judged_windows()

    # Warm up until the histories hold a full window (they then replace, not grow), then compare three
    # blocks of 100 cycles: a leak grows every block, noise does not.
    growths = heap_growth_per_block(exporter.cycle, warmup=exporter._capacity + 5, settle=settle)
    # Measured: 0.6-0.9 KB a block here; a history that never dropped a snapshot (~100 bytes a cycle)
    # grew ~9 KB a block (tried).
    assert min(growths) < 5 * 1024, f"grew in every block of 100 cycles: {growths} bytes"
    assert max(kept) <= 2 * exporter._capacity, f"judged snapshots kept: {kept} (two windows: {2 * exporter._capacity})"
    assert len(exporter._ranks) == 2 and len(exporter._dump_seen) <= 2 + 2 * 4 * 2


# ----------------------------------------------------------------- end to end (slow)


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.slow
def test_without_pid_every_gpu_process_is_a_job_followed_with_its_stacks(spawn):
    """serve's pipeline (`following_pipeline` without --pid): every job on the (simulated) GPUs, each
    followed with its stacks in the snapshot the exporter reads; a job that leaves the GPUs is dropped."""
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Following, Pipeline
    from tests.harness.nvml import ScriptedLoad

    first = spawn.python("import time\nwhile True: time.sleep(0.05)")
    second = spawn.python("import threading\nthreading.Event().wait()")
    load = ScriptedLoad(processes={0: [(first.pid, 1 << 30)], 1: [(second.pid, 1 << 30)]})
    pipeline = Pipeline(SimulatedMachine("h100-sxm-8", load=load), follow=Following(every_job=True, stack_interval=0.5))
    pipeline.backend.library.pcie_latency_s = 0.0  # the fake's 20 ms per PCIe read only slows the test
    exporter = Exporter(pipeline, interval=1.0, log=lambda line: None)
    try:

        def states() -> dict[str, str]:
            exporter.cycle()
            samples = parse(scrape_text(exporter))
            return {dict(k)["job"]: dict(k)["state"] for k, v in values(samples, "gputop_rank_state").items() if v == 1}

        # a job on one machine (no rendezvous id in its environment) is named by the host and its PID
        first_job, second_job = f"{exporter.hostname}:{first.pid}", f"{exporter.hostname}:{second.pid}"

        # both processes' stacks have been read: each job has a current state (a sleeping loop: idle)
        assert wait_until(lambda: len(states()) == 2 and states(), timeout=60, what="both jobs' stacks") == {
            first_job: "idle",
            second_job: "idle",
        }
        samples = parse(scrape_text(exporter))
        gpu_of = {dict(k)["job"]: dict(k)["gpu"] for k in values(samples, "gputop_rank_info")}
        assert gpu_of == {first_job: "0", second_job: "1"}

        second.kill()
        second.wait(timeout=10)
        load.procs.pop(1)  # the driver drops a dead process from the GPU
        exporter.cycle()
        samples = parse(scrape_text(exporter))
        assert {dict(k)["job"] for k in values(samples, "gputop_job_info")} == {first_job}
        assert pipeline.followed is not None and pipeline.followed.followed == [first.pid]
        assert set(exporter._histories) == {first_job}
    finally:
        pipeline.close()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="switches to another user: run as root")
def test_serve_as_another_user_counts_and_says_the_refusal(spawn, tmp_path):
    """gputop serve run by `nobody` next to root's job: the /proc side is exported, the stacks are refused,
    and the refusal is a counter plus one log line with the fix, never a crash."""
    import tempfile

    job, _ = start_attach_loop(spawn, tmp_path, "--workers", "1", "--length", "100000")
    world = Path(tempfile.mkdtemp(prefix="gputop-serve-", dir="/tmp"))  # pytest's tmp_path is root's 0700
    try:
        world.chmod(0o755)
        bindir = world / "bin"
        bindir.mkdir(mode=0o755)
        py_spy = bindir / "py-spy"  # beside the interpreter gputop believes it runs from, readable by nobody
        # the binary gputop itself would run (beside this interpreter), not a PATH entry: that may be a version
        # manager's shim, a script that finds the binary through its owner's home
        shutil.copyfile(find_py_spy() or str(Path(sys.executable).parent / "py-spy"), py_spy)
        py_spy.chmod(0o755)
        (bindir / "python").symlink_to(os.path.realpath(sys.executable))
        port = free_port()
        serve = spawn(
            [
                sys.executable,
                str(REPO / "tests" / "drill_jobs" / "as_user.py"),
                "nobody",
                "--executable",
                str(bindir / "python"),
                "serve",
                "--pid",
                str(job.pid),
                "--listen",
                f"127.0.0.1:{port}",
                "--stack-interval",
                "0.5",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(world),
            env=dict(os.environ, HOME=str(world)),
        )
        url = f"http://127.0.0.1:{port}/metrics"

        def refusals() -> float:
            if serve.poll() is not None:
                raise AssertionError(f"gputop serve exited {serve.returncode}: {serve.stderr.read()}")
            return one(parse(get(url)), "gputop_pyspy_errors_total", reason="permission")

        assert wait_until(lambda: refusals() >= 3, timeout=60, what="refused dumps counted")
        samples = parse(get(url))
        assert (
            one(samples, "gputop_dataloader_workers", job=f"{socket.gethostname()}:{job.pid}", rank="0") == 1
        )  # /proc still works
        assert sum(values(samples, "gputop_rank_state").values()) == 0  # no stacks, no state
        serve.send_signal(signal.SIGTERM)
        _out, err = serve.communicate(timeout=30)
    finally:
        shutil.rmtree(world, ignore_errors=True)
    assert serve.returncode == 0 and "Traceback" not in err, err
    denied = (
        f"permission denied reading PID {job.pid}'s stacks: it belongs to root and gputop runs as nobody; "
        "run gputop as root, or with sudo"
    )
    assert err.count("cannot read stacks") == 1, err
    assert (
        f"gputop serve: job {socket.gethostname()}:{job.pid}: cannot read stacks: {denied} (counted in gputop_pyspy_errors_total)\n"
        in err
    )


@pytest.mark.slow
@pytest.mark.skipif(
    PROMETHEUS is None, reason="the prometheus binary is not installed (.ci/run installs Debian's prometheus package)"
)
def test_prometheus_scrapes_serve_next_to_an_input_bound_job(spawn, tmp_path):
    # One DataLoader worker, 100 ms a sample, 2 samples a batch: the loop waits ~0.2 s per batch for a
    # step of a few ms, so its main thread waits for data far more than 60% of the time.
    job, _ = start_attach_loop(spawn, tmp_path, "--workers", "1", "--sample-ms", "100", "--step-ms", "0", "--length", "100000")

    serve_port = free_port()
    serve = spawn(
        [
            sys.executable,
            "-m",
            "gputop",
            "serve",
            "--pid",
            str(job.pid),
            "--simulate",
            "h100-sxm-8+pcie-degraded=3",
            "--hostname",
            "node-a",
            "--listen",
            f"127.0.0.1:{serve_port}",
            "--interval",
            "1",
            "--stack-interval",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: get(f"http://127.0.0.1:{serve_port}/metrics"), timeout=60, what="gputop serve to answer")

    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: gputop\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{serve_port}']\n"
    )
    prometheus = spawn(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def query(expr: str) -> list[dict]:
        url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        answer = json.loads(get(url))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    job_label = f"node-a:{job.pid}"  # --hostname names the host in the job's label and in Hostname
    ratio = wait_until(
        lambda: [r for r in query(f'gputop_rank_data_wait_ratio{{job="{job_label}"}}') if float(r["value"][1]) > 0.6],
        timeout=120,
        interval=1.0,
        what="Prometheus to hold a data-wait ratio above 0.6",
    )
    assert ratio[0]["metric"]["rank"] == "0" and float(ratio[0]["value"][1]) <= 1.0
    assert ratio[0]["metric"]["Hostname"] == "node-a"
    states = query(f'gputop_rank_state{{job="{job_label}"}}')
    assert {r["metric"]["state"] for r in states} == set(RANK_STATES)
    assert sum(float(r["value"][1]) for r in states) == 1.0  # exactly one current state
    degraded = {r["metric"]["gpu"]: float(r["value"][1]) for r in query("gputop_gpu_pcie_link_degraded")}
    assert degraded == {str(g): (1.0 if g == 3 else 0.0) for g in range(8)}
    # the rule file's input-bound expression finds this job
    assert query("max by (Hostname, job, rank) (gputop_rank_data_wait_ratio) > 0.6")
    # every dashboard query runs (there is no dcgm-exporter here: those return nothing, but parse)
    for expr in dashboard_queries():
        query(expr.replace("$Hostname", ".*").replace("$job", ".*"))

    serve.send_signal(signal.SIGTERM)  # systemd's stop: a clean exit, no traceback
    _out, err = serve.communicate(timeout=30)
    assert serve.returncode == 0 and "Traceback" not in err, err
    assert prometheus.poll() is None, prometheus.stderr.read().decode()[-2000:]


def test_a_stop_closes_the_pipeline_only_once_the_poll_in_progress_has_ended():
    """A CI run's `serve` stopped while a poll that had found a new job added its collector, and close() walked the
    collectors meanwhile: "dictionary changed size during iteration".  The stop waits for the poll thread first."""
    import threading

    from gputop.commands.serve import stop_serving

    events: list[str] = []
    polling, release = threading.Event(), threading.Event()

    class Loop:
        def stop(self) -> None:
            events.append("loop stopped")

    class Pipeline:
        def close(self) -> None:
            events.append("pipeline closed")

    def poll() -> None:
        polling.set()
        release.wait(30)
        events.append("poll ended")

    collecting = threading.Thread(target=poll)
    collecting.start()
    polling.wait(30)
    stopping = threading.Thread(target=stop_serving, args=(Loop(), None, Pipeline(), collecting))
    stopping.start()
    wait_until(lambda: events == ["loop stopped"], timeout=30, what="the stop to begin")
    stopping.join(0.2)  # a stop that does not wait would have closed the pipeline by now
    assert events == ["loop stopped"] and stopping.is_alive()
    release.set()
    stopping.join(30)
    collecting.join(30)
    assert events == ["loop stopped", "poll ended", "pipeline closed"]

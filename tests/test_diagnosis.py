"""Diagnosis over hand-built histories: each idle profile, each infrastructure fault, healthy, and the
stack/CPU findings again with no GPU data at all."""

from __future__ import annotations

import random

import pytest

from gputop.analysis.diagnosis import (
    HANG_MIN_SECONDS,
    detect_period,
    diagnose,
    percentile,
    severe,
    verdict_line,
)
from gputop.analysis.stack_classes import (
    COLLECTIVE,
    FORWARD_BACKWARD,
    IN_DATASET,
    OPTIMIZER_STEP,
    WAITING_FOR_DATA,
)
from gputop.history import History
from gputop.model import LABEL_CODE, LABEL_INFRA, EccCounts, GpmMetrics, NvLinkLink, PcieLink, RemappedRows, XidEvent
from tests.harness.histories import (
    WORKER_IDLE_FRAMES,
    WORKER_STUCK_FRAMES,
    RankSpec,
    Scenario,
    build,
    cycle,
    eight_ranks,
    machine,
    saw_tooth,
    simulated_history,
    worker_busy_frames,
)

NO_DRIVER = "no NVIDIA driver found (libnvidia-ml.so.1 not loadable)"


def ids(findings):
    return [f.id for f in findings]


def by_id(findings, id_):
    matches = [f for f in findings if f.id == id_]
    assert matches, f"no {id_!r} finding in {ids(findings)}"
    return matches[0]


def noisy(base, spread=3.0, seed=1):
    rng = random.Random(seed)
    return lambda g, t: max(0.0, min(100.0, base + rng.uniform(-spread, spread)))


# ---------------------------------------------------------------- helpers


def test_percentile_interpolates_and_ignores_none():
    assert percentile([0, 10, None, 20, 30, 40], 50) == 20
    assert percentile([0, 100], 5) == pytest.approx(5.0)
    assert percentile([None], 50) is None


def test_detect_period_finds_known_period_and_not_noise():
    series = [95.0 if (t % 6) < 4 else 5.0 for t in range(60)]
    lag, acf = detect_period([series])
    assert lag == 6 and acf > 0.8
    rng = random.Random(7)
    assert detect_period([[rng.uniform(40, 60) for _ in range(60)]]) is None
    assert detect_period([[90.0] * 60]) is None  # flat: no period


# ---------------------------------------------------------------- empty / healthy


def test_empty_history_still_gives_one_finding():
    findings = diagnose(History(machine()))
    assert ids(findings) == ["no_data"]
    assert verdict_line(findings).startswith("No data yet")


def compute_bound(**kw) -> Scenario:
    workers = lambda t, base: (base + 10, base + 11)  # noqa: E731
    ranks = [
        RankSpec(
            pid=1000 + i,
            rank=i,
            gpus=(i,),
            state=cycle([FORWARD_BACKWARD, FORWARD_BACKWARD, OPTIMIZER_STEP, FORWARD_BACKWARD, COLLECTIVE]),
            workers=lambda t, b=2000 + 10 * i: (b, b + 1),
            worker_frames=lambda t, w: WORKER_IDLE_FRAMES,
            worker_cpu=lambda t, w: 20.0,
        )
        for i in range(8)
    ]
    del workers
    return Scenario(util=noisy(96), ranks=ranks, **kw)


def test_compute_bound_job_is_healthy_and_not_input_bound():
    findings = diagnose(build(compute_bound()))
    assert findings[0].id == "healthy"
    assert not [f for f in findings if f.severity in ("critical", "warning")], ids(findings)
    line = verdict_line(findings)
    assert line.startswith("Healthy") and "not input-bound" in line and "96%" in line


def test_idle_machine_without_job_is_healthy_not_a_problem():
    hist = build(Scenario(util=lambda g, t: 0.0, memory_gib=lambda g, t: 0.0, attach=False))
    findings = diagnose(hist)
    assert findings[0].id == "healthy" and "idle" in findings[0].summary
    assert not severe(findings)


def test_noisy_busy_gpus_without_job_do_not_invent_a_hiccup():
    hist = build(Scenario(util=noisy(80, spread=15, seed=3), attach=False))
    findings = diagnose(hist)
    assert "hiccup" not in ids(findings)
    assert findings[0].id == "healthy"


# ---------------------------------------------------------------- continuous starvation


def starved(num_workers: int = 0, wait_pattern=None, gpu_error=None, util_base=15) -> Scenario:
    if num_workers == 0:
        ranks = eight_ranks(
            state=cycle(wait_pattern or [IN_DATASET, IN_DATASET, IN_DATASET, IN_DATASET, FORWARD_BACKWARD]), cpu=lambda t: 99.0
        )
    else:
        ranks = [
            RankSpec(
                pid=1000 + i,
                rank=i,
                gpus=(i,),
                state=cycle(
                    wait_pattern or [WAITING_FOR_DATA, WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD, WAITING_FOR_DATA]
                ),
                workers=lambda t, b=2000 + 10 * i: tuple(range(b, b + num_workers)),
                worker_frames=lambda t, w: worker_busy_frames(int(t) + w),
                worker_cpu=lambda t, w: 70.0,
            )
            for i in range(8)
        ]
    return Scenario(util=noisy(util_base, seed=2), ranks=ranks, gpu_error=gpu_error, cores=64)


def test_starved_num_workers_zero_is_highly_input_bound_in_dataset_code():
    findings = diagnose(build(starved(0)))
    top = findings[0]
    assert top.id == "starvation" and top.severity == "critical" and top.label == LABEL_CODE
    assert "highly" in top.summary and "dataset code" in top.summary and "80%" in top.summary
    assert "ImageDataset.__getitem__ (dataset.py:31)" in top.frames
    assert "num_workers=" in top.fix and "DataLoader(" in top.fix
    assert [f.id for f in severe(findings)] == ["starvation"]


def test_starved_with_workers_names_the_wait_and_the_hot_worker_frame():
    findings = diagnose(build(starved(2)))
    top = findings[0]
    assert top.id == "starvation" and top.severity == "critical"
    assert "waits for data 80%" in top.summary
    assert "2/2 workers of rank 0 in ImageFile.load (PIL/ImageFile.py)" in top.evidence
    assert top.frames[1:3] == ("train (train.py:42)", "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:701)")
    assert "mean 15%" in " ".join(top.evidence)


def test_moderately_input_bound_is_a_warning():
    pattern = [WAITING_FOR_DATA] + [FORWARD_BACKWARD] * 9  # 10%
    findings = diagnose(build(starved(2, wait_pattern=pattern, util_base=80)))
    f = by_id(findings, "starvation")
    assert f.severity == "warning" and "moderately" in f.summary and "10%" in f.summary
    assert not severe(findings)


def test_below_five_percent_is_not_input_bound():
    pattern = [WAITING_FOR_DATA] + [FORWARD_BACKWARD] * 29  # ~3%
    findings = diagnose(build(starved(2, wait_pattern=pattern, util_base=93)))
    assert "starvation" not in ids(findings)
    assert findings[0].id == "healthy"


def test_wait_that_overlaps_busy_gpus_is_only_info():
    findings = diagnose(build(starved(2, util_base=95)))
    f = by_id(findings, "starvation")
    assert f.severity == "info"
    assert findings[0].id == "healthy"


def test_each_distinct_dump_counts_once():
    # 1 s snapshots share each 2 s dump: 60 snapshots -> 30 dumps per rank
    findings = diagnose(build(starved(2)))
    assert "of 30 stack dumps" in findings[0].evidence[0]


def test_starvation_works_without_gpu_data():
    findings = diagnose(build(starved(2, gpu_error=NO_DRIVER)))
    top = findings[0]
    assert top.id == "starvation" and top.severity == "critical" and "80%" in top.summary
    assert not any("GPU utilization" in e for e in top.evidence)


def test_benchmark_wait_fraction_and_recommendation_are_used():
    class FakeBench:
        def to_dict(self):
            return {
                "pid": 1000,
                "consumption": {"batches_per_s": 12.2, "wait_fraction": 0.62},
                "passive": {"wait_fraction": 0.6},
                "configs": [],
                "recommendation": {"num_workers": 6, "prefetch_factor": 4, "pin_memory": True},
                "notes": [],
            }

    findings = diagnose(build(starved(2)), FakeBench())
    top = findings[0]
    assert top.id == "starvation" and "62%" in " ".join(top.evidence)
    assert "num_workers=6" in top.fix and "benchmark" in top.fix.splitlines()[0]


def test_low_utilization_without_stacks_does_not_guess_a_cause():
    hist = build(Scenario(util=noisy(20, seed=4), attach=False, processes=lambda g, t: (5000 + g,)))
    findings = diagnose(hist)
    f = by_id(findings, "low_utilization")
    assert "--pid" in f.fix and f.confidence <= 0.5
    assert "starvation" not in ids(findings)


# ---------------------------------------------------------------- periodic hiccup


def hiccup(cause: str, gpu_error=None) -> Scenario:
    period = 6.0
    if cause == "restart":
        # workers replaced every 6 s (no persistent_workers); main thread mostly computing
        def workers(t, b):
            epoch = int(t // period)
            return (b + 100 * epoch, b + 100 * epoch + 1)

        ranks = [
            RankSpec(
                pid=1000 + i,
                rank=i,
                gpus=(i,),
                state=cycle([FORWARD_BACKWARD, FORWARD_BACKWARD, WAITING_FOR_DATA]),
                workers=lambda t, b=3000 + 10 * i: workers(t, b),
                worker_frames=lambda t, w: worker_busy_frames(int(t)),
                worker_cpu=lambda t, w: 60.0,
            )
            for i in range(8)
        ]
    elif cause == "loader":
        ranks = eight_ranks(
            state=cycle([FORWARD_BACKWARD, FORWARD_BACKWARD, WAITING_FOR_DATA]),
            workers=lambda t: (5000, 5001),
            worker_frames=lambda t, w: worker_busy_frames(int(t)),
        )
    else:  # collective
        ranks = eight_ranks(state=cycle([FORWARD_BACKWARD, FORWARD_BACKWARD, COLLECTIVE]))
    return Scenario(seconds=60, util=saw_tooth(period, 4.0), ranks=ranks, gpu_error=gpu_error, cores=64)


@pytest.mark.parametrize(
    "cause,expected",
    [("restart", "epoch-boundary worker restarts"), ("loader", "loader stalls"), ("collective", "collective waits")],
)
def test_saw_tooth_is_a_hiccup_with_its_period_and_cause(cause, expected):
    findings = diagnose(build(hiccup(cause)))
    top = findings[0]
    assert top.id == "hiccup", ids(findings)
    assert "every 6 s" in top.summary and expected in top.summary
    assert "period 6.0 s" in " ".join(top.evidence)
    assert len(severe(findings)) <= 1 and "starvation" not in ids(findings)
    if cause == "restart":
        assert "persistent_workers=True" in top.fix
        assert "workers restart every 6.0 s" in " ".join(top.evidence)
    if cause == "collective":
        assert "no_sync" in top.fix


def test_phase_shifted_ranks_still_share_the_period():
    sc = hiccup("loader")
    sc.util = saw_tooth(6.0, 4.0, phase=1.0)  # rank g is shifted by g seconds
    top = diagnose(build(sc))[0]
    assert top.id == "hiccup" and "every 6 s" in top.summary


def test_worker_restarts_without_gpu_data_are_a_periodic_stall():
    findings = diagnose(build(hiccup("restart", gpu_error=NO_DRIVER)))
    f = by_id(findings, "hiccup")
    assert "every ~6 s" in f.summary and "persistent_workers=True" in f.fix


# ---------------------------------------------------------------- hang / silent misfire


def misfire(gpu_error=None, hang_from=20.0) -> Scenario:
    """Rank 3's worker 3001 hangs in __getitem__ at t=hang_from; rank 3's GPU holds memory at 0%."""

    def rank3_state(t):
        return WAITING_FOR_DATA if t >= hang_from else cycle([FORWARD_BACKWARD, WAITING_FOR_DATA])(t)

    def w_frames(t, w):
        if w == 3001 and t >= hang_from:
            return WORKER_STUCK_FRAMES
        return WORKER_IDLE_FRAMES if t >= hang_from else worker_busy_frames(int(t))

    ranks = [
        RankSpec(
            pid=1000 + i,
            rank=i,
            gpus=(i,),
            state=cycle([FORWARD_BACKWARD, FORWARD_BACKWARD, OPTIMIZER_STEP]),
            workers=lambda t, b=2000 + 10 * i: (b, b + 1),
            worker_frames=lambda t, w: worker_busy_frames(int(t)),
        )
        for i in range(8)
        if i != 3
    ]
    ranks.insert(
        3,
        RankSpec(
            pid=1003,
            rank=3,
            gpus=(3,),
            state=rank3_state,
            workers=lambda t: (3000, 3001),
            worker_frames=w_frames,
            cpu=lambda t: 1.0 if t >= hang_from else 40.0,
            worker_cpu=lambda t, w: 0.0 if t >= hang_from else 60.0,
        ),
    )
    util = lambda g, t: 0.0 if (g == 3 and t >= hang_from) else 92.0  # noqa: E731
    return Scenario(seconds=45, util=util, memory_gib=lambda g, t: 20.0, ranks=ranks, gpu_error=gpu_error, cores=64)


def test_hang_names_rank_gpu_and_the_stuck_dataset_frame():
    findings = diagnose(build(misfire()))
    top = findings[0]
    assert top.id == "hang" and top.severity == "critical"
    assert "rank 3" in top.summary and "GPU 3 holds memory at 0%" in top.summary
    assert top.frames[-1] == "ImageDataset.__getitem__ (dataset.py:44)"
    assert any("worker PID 3001" in e and "dataset code" in e for e in top.evidence)
    assert top.gpus == (3,) and top.pids == (1003,)
    assert "timeout=" in top.fix
    assert ids(severe(findings)) == ["hang"]


def test_hang_needs_a_sustained_window():
    # stuck for only 6 s (< HANG_MIN_SECONDS): not a hang yet
    sc = misfire(hang_from=39.0)
    assert 45 - 39 < HANG_MIN_SECONDS
    assert "hang" not in ids(diagnose(build(sc)))


def test_hang_without_gpu_data_still_names_the_frame():
    findings = diagnose(build(misfire(gpu_error=NO_DRIVER)))
    top = findings[0]
    assert top.id == "hang" and "rank 3" in top.summary
    assert any("dataset.py:44" in f for f in top.frames)


def test_dead_worker_is_named():
    sc = misfire()
    r3 = sc.ranks[3]
    r3.worker_state = lambda t, w: "Z" if (w == 3001 and t >= 20) else "S"
    r3.worker_frames = lambda t, w: None if (w == 3001 and t >= 20) else WORKER_IDLE_FRAMES
    # the main thread waits in the same frame; the dead worker is the reason
    top = diagnose(build(sc))[0]
    assert top.id == "hang" and "a DataLoader worker died" in top.summary
    assert any("3001" in e and "dead" in e for e in top.evidence)


def test_collective_hang_points_at_nccl_settings():
    ranks = eight_ranks(state=lambda t: COLLECTIVE if t >= 10 else FORWARD_BACKWARD, cpu=lambda t: 2.0)
    sc = Scenario(seconds=40, util=lambda g, t: 0.0 if t >= 10 else 90.0, ranks=ranks)
    top = diagnose(build(sc))[0]
    assert top.id == "hang" and "collective" in top.summary
    assert "NCCL" in top.fix and "timeout=" in top.fix
    assert any("all_reduce" in f for f in top.frames)


def test_gpu_only_misfire_memory_held_after_being_busy():
    hist = build(
        Scenario(
            seconds=40, util=lambda g, t: 0.0 if (g == 5 and t > 15) else 90.0, attach=False, processes=lambda g, t: (7000 + g,)
        )
    )
    findings = diagnose(hist)
    f = by_id(findings, "hang")
    assert f.severity == "critical" and f.gpus == (5,) and "GPU 5" in f.summary and "py-spy dump" in f.fix
    assert any("after being busy" in e and "7005" in e for e in f.evidence)


def test_starving_rank_that_still_progresses_is_not_a_hang():
    # waiting for data in every dump for 60 s, but its workers keep decoding (stacks change)
    sc = starved(2, wait_pattern=[WAITING_FOR_DATA])
    assert "hang" not in ids(diagnose(build(sc)))


# ---------------------------------------------------------------- misplacement


def test_all_ranks_on_gpu0_is_misplacement():
    ranks = [
        RankSpec(
            pid=1000 + i,
            rank=i,
            gpus=(0,),
            state=cycle([FORWARD_BACKWARD, WAITING_FOR_DATA, FORWARD_BACKWARD, FORWARD_BACKWARD, FORWARD_BACKWARD]),
        )
        for i in range(8)
    ]
    sc = Scenario(
        util=lambda g, t: 97.0 if g == 0 else 0.0,
        memory_gib=lambda g, t: 60.0 if g == 0 else 0.0,
        ranks=ranks,
        warnings=("8 ranks share GPU 0",),
    )
    findings = diagnose(build(sc))
    top = findings[0]
    assert top.id == "misplacement" and top.severity == "critical"
    assert top.summary == "8 ranks share GPU 0; 7 of 8 GPUs idle"
    assert "torch.cuda.set_device(local_rank)" in top.fix
    assert "collector: 8 ranks share GPU 0" in top.evidence
    assert ids(severe(findings)) == ["misplacement"]


def test_several_processes_on_one_busy_gpu_without_pid():
    sc = Scenario(
        util=lambda g, t: 95.0 if g == 0 else 0.0,
        memory_gib=lambda g, t: 60.0 if g == 0 else 0.0,
        processes=lambda g, t: (4000, 4001, 4002, 4003) if g == 0 else (),
        attach=False,
    )
    top = diagnose(build(sc))[0]
    assert top.id == "misplacement" and top.summary.startswith("7 of 8 GPUs idle while a job uses 1")
    assert any("4 processes share GPU 0" in e for e in top.evidence)


def test_single_gpu_single_process_job_is_not_misplacement():
    sc = Scenario(
        util=lambda g, t: 95.0 if g == 0 else 0.0,
        memory_gib=lambda g, t: 60.0 if g == 0 else 0.0,
        ranks=[RankSpec(pid=1000, rank=0, gpus=(0,), state=cycle([FORWARD_BACKWARD, OPTIMIZER_STEP]))],
    )
    findings = diagnose(build(sc))
    assert "misplacement" not in ids(findings) and findings[0].id == "healthy"


# ---------------------------------------------------------------- straggler


def straggler(gpu_error=None) -> Scenario:
    ranks = eight_ranks(state=cycle([COLLECTIVE, FORWARD_BACKWARD, COLLECTIVE, OPTIMIZER_STEP]))
    ranks[2] = RankSpec(
        pid=1002,
        rank=2,
        gpus=(2,),
        state=cycle([WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD, WAITING_FOR_DATA, FORWARD_BACKWARD]),
        workers=lambda t: (2000, 2001),
        worker_frames=lambda t, w: worker_busy_frames(int(t)),
        worker_cpu=lambda t, w: 95.0,
    )
    return Scenario(util=noisy(60, seed=5), ranks=ranks, gpu_error=gpu_error, cores=64)


@pytest.mark.parametrize("gpu_error", [None, NO_DRIVER])
def test_straggler_rank_is_named(gpu_error):
    findings = diagnose(build(straggler(gpu_error)))
    f = by_id(findings, "straggler")
    assert "rank 2 waits for data 60%" in f.summary and "7 other ranks" in f.summary
    assert f.pids == (1002,)
    assert any("_BaseDataLoaderIter.__next__" in x for x in f.frames) and any("all_reduce" in x for x in f.frames)
    assert "starvation" not in ids(findings)  # the straggler is not the whole job's problem


# ---------------------------------------------------------------- CPU-bound


def cpu_bound(cores=16, workers_per_rank=2, host=98.0, gpu_error=None) -> Scenario:
    ranks = [
        RankSpec(
            pid=1000 + i,
            rank=i,
            gpus=(i,),
            state=cycle([WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD]),
            workers=lambda t, b=2000 + 10 * i: tuple(range(b, b + workers_per_rank)),
            worker_frames=lambda t, w: worker_busy_frames(int(t) + w),
            worker_cpu=lambda t, w: 99.0,
        )
        for i in range(8)
    ]
    return Scenario(util=noisy(30, seed=6), ranks=ranks, cores=cores, host_cpu=lambda c, t: host, gpu_error=gpu_error)


@pytest.mark.parametrize("gpu_error", [None, NO_DRIVER])
def test_saturated_cores_and_pinned_workers_are_cpu_bound(gpu_error):
    findings = diagnose(build(cpu_bound(gpu_error=gpu_error)))
    f = by_id(findings, "cpu_bound")
    assert "cores 98% busy" in f.summary and "16 loader process(es) pinned" in f.summary
    assert "WebDataset" in f.fix or "DALI" in f.fix
    s = by_id(findings, "starvation")
    # raising num_workers cannot help when every core is busy: the starvation fix says so
    assert "saturated" in s.fix.splitlines()[0]


def test_more_workers_than_cores_is_oversubscription():
    findings = diagnose(build(cpu_bound(cores=8, workers_per_rank=4, host=60.0)))
    f = by_id(findings, "cpu_bound")
    assert "32 DataLoader workers on 8 cores" in f.summary


def test_workers_that_take_the_cores_from_idle_gpus_are_a_warning_though_no_rank_waits_for_data():
    """24 workers on 2 cores: every core busy, the queue full, the ranks computing, yet the GPUs at ~20%: the
    training processes wait for a core (the case study's stage 2 on a slow box)."""
    sc = cpu_bound(cores=2, workers_per_rank=3, host=99.0)
    for rank in sc.ranks:
        rank.state = lambda t: FORWARD_BACKWARD
        rank.worker_cpu = lambda t, w: 8.0  # each gets its share of two cores
    sc.util = noisy(20, seed=6)
    f = by_id(diagnose(build(sc)), "cpu_bound")
    assert f.severity == "warning" and "24 DataLoader workers on 2 cores" in f.summary
    assert any("the training processes wait for a core" in line for line in f.evidence), f.evidence
    assert f.fix.startswith("make each sample cheaper, and keep num_workers ≤ 1 per rank"), f.fix

    for rank in sc.ranks:  # ... and when the ranks wait for data too, more workers cannot help either
        rank.state = cycle([WAITING_FOR_DATA, FORWARD_BACKWARD, FORWARD_BACKWARD])
    starved = by_id(diagnose(build(sc)), "starvation")
    assert starved.fix.startswith("make preprocessing cheaper (the cores are already saturated)"), starved.fix

    for rank in sc.ranks:
        rank.state = lambda t: FORWARD_BACKWARD
    sc.util = noisy(90, seed=6)  # the same cores feeding busy GPUs: noted, costs nothing now
    f = by_id(diagnose(build(sc)), "cpu_bound")
    assert f.severity == "info" and "costs nothing now" in f.evidence[-1]


def test_busy_cores_without_pinned_loader_is_not_cpu_bound():
    sc = compute_bound()
    sc.host_cpu = lambda c, t: 97.0
    assert "cpu_bound" not in ids(diagnose(build(sc)))


# ---------------------------------------------------------------- memory pressure


def test_memory_nearly_full_suggests_allocator_settings():
    sc = compute_bound()
    sc.memory_gib = lambda g, t: 79.0 if g == 1 else 30.0
    f = by_id(diagnose(build(sc)), "memory_pressure")
    assert f.gpus == (1,) and "expandable_segments" in f.fix


# ---------------------------------------------------------------- infrastructure


def infra(extra) -> list:
    sc = compute_bound()
    sc.gpu_extra = extra
    return diagnose(build(sc))


def test_pcie_downgrade_under_load_is_infrastructure():
    findings = infra(lambda g, t: {"pcie": PcieLink(3, 5, 16, 16)} if g == 2 else {})
    f = by_id(findings, "pcie_downgrade")
    assert f.label == LABEL_INFRA and f.gpus == (2,) and "Gen3 x16 of Gen5 x16" in f.evidence[0]
    assert "healthy" not in ids(findings)


def test_idle_gpu_with_lower_pcie_generation_is_not_flagged():
    sc = Scenario(
        util=lambda g, t: 0.0, memory_gib=lambda g, t: 0.0, attach=False, gpu_extra=lambda g, t: {"pcie": PcieLink(1, 5, 16, 16)}
    )
    assert "pcie_downgrade" not in ids(diagnose(build(sc)))


def test_pcie_width_downgrade_counts_even_when_idle():
    sc = Scenario(
        util=lambda g, t: 0.0,
        memory_gib=lambda g, t: 0.0,
        attach=False,
        gpu_extra=lambda g, t: {"pcie": PcieLink(5, 5, 8, 16)} if g == 0 else {},
    )
    assert by_id(diagnose(build(sc)), "pcie_downgrade").gpus == (0,)


@pytest.mark.parametrize(
    "reason,severity,word",
    [
        ("HwThermalSlowdown", "critical", "Thermal"),
        ("SwThermalSlowdown", "warning", "Thermal"),
        ("HwSlowdown", "critical", "slowdown"),
        ("HwPowerBrakeSlowdown", "critical", "power brake"),
    ],
)
def test_throttling_is_infrastructure(reason, severity, word):
    findings = infra(lambda g, t: {"throttle_reasons": (reason,), "temperature": 91.0} if g == 4 else {})
    f = by_id(findings, "throttle")
    assert f.label == LABEL_INFRA and f.severity == severity and f.gpus == (4,)
    assert word.lower() in f.summary.lower()


def test_power_cap_at_full_load_is_only_info():
    findings = infra(lambda g, t: {"throttle_reasons": ("sw_power_cap",)})
    assert by_id(findings, "power_cap").severity == "info"
    assert findings[0].id == "healthy"


def test_power_limit_below_its_peers_is_infrastructure():
    findings = infra(lambda g, t: {"throttle_reasons": ("sw_power_cap",), "power_limit": 385.0, "power": 385.0} if g == 2 else {})
    f = by_id(findings, "power_cap")
    assert f.severity == "warning" and f.label == LABEL_INFRA and f.gpus == (2,) and "GPU 2 at 385 W" in f.summary


def test_thermal_fault_with_several_reasons_is_one_finding():
    findings = infra(
        lambda g, t: {"throttle_reasons": ("hw_slowdown", "sw_thermal", "hw_thermal"), "clock_sm": 890} if g == 2 else {}
    )
    throttles = [f for f in findings if f.id == "throttle"]
    assert len(throttles) == 1 and throttles[0].severity == "critical" and "Thermal throttling on GPU 2" == throttles[0].summary
    assert "SM clock median 890 MHz (others 1980 MHz)" in throttles[0].evidence[0]


def test_idle_reason_is_not_throttling():
    findings = infra(lambda g, t: {"throttle_reasons": ("GpuIdle", "ApplicationsClocksSetting")})
    assert "throttle" not in ids(findings)


def test_uncorrectable_ecc_and_remapped_rows():
    findings = infra(
        lambda g, t: {"ecc": EccCounts(0, 2, 5, 2), "remapped_rows": RemappedRows(1, 1, False, False)} if g == 6 else {}
    )
    f = by_id(findings, "ecc")
    assert f.severity == "critical" and f.label == LABEL_INFRA and f.gpus == (6,)
    assert "2 uncorrectable" in f.evidence[0]


def test_pending_remap_is_a_warning_and_corrected_ecc_is_no_problem():
    """Corrected errors were corrected (a high rate is XID 92): rising alone is no finding (gpu_health.py)."""
    findings = infra(
        lambda g, t: {"ecc": EccCounts(int(t), 0, int(t), 0), "remapped_rows": RemappedRows(0, 0, True, False)} if g == 1 else {}
    )
    f = by_id(findings, "ecc")
    assert f.severity == "warning" and f.gpus == (1,) and any("pending" in e for e in f.evidence)
    assert "ecc" not in ids(infra(lambda g, t: {"ecc": EccCounts(int(t), 0, int(t), 0)} if g == 1 else {}))


def test_past_uncorrectable_errors_already_remapped_are_a_warning():
    """Uncorrectable errors only in the lifetime count, their rows remapped (not pending): repaired, a warning."""
    findings = infra(
        lambda g, t: {"ecc": EccCounts(0, 0, 5, 2), "remapped_rows": RemappedRows(0, 2, False, False)} if g == 3 else {}
    )
    f = by_id(findings, "ecc")
    assert f.severity == "warning" and f.gpus == (3,) and any("none since the last reset" in e for e in f.evidence)


def test_inactive_nvlink_links():
    links = tuple(NvLinkLink(i, i not in (3, 7)) for i in range(18))
    f = by_id(infra(lambda g, t: {"nvlink": links} if g == 0 else {}), "nvlink_down")
    assert "2 of 18" in f.evidence[0] and f.label == LABEL_INFRA


def test_xids_split_into_the_hardwares_and_the_codes():
    hardware, kernel = XidEvent(1_800_000_000.0, 79), XidEvent(1_800_000_030.0, 31)
    # every sample carries the XIDs seen so far: one event each, however many samples repeat it
    findings = infra(lambda g, t: {"xids": (hardware,)} if g == 3 else ({"xids": (kernel,)} if g == 1 and t >= 30 else {}))
    infra_xid, code_xid = by_id(findings, "xid"), by_id(findings, "xid_code")
    assert infra_xid.label == LABEL_INFRA and infra_xid.severity == "critical" and infra_xid.gpus == (3,)
    assert infra_xid.summary == "XID 79 on GPU 3: GPU has fallen off the bus"
    assert infra_xid.evidence[0] == "GPU 3: XID 79 at 08:00:00 UTC: GPU has fallen off the bus"
    assert len(infra_xid.evidence) == 2 and "dmesg" in infra_xid.evidence[1]
    assert code_xid.label == LABEL_CODE and code_xid.gpus == (1,) and "illegal address" in code_xid.summary
    assert "compute-sanitizer" in code_xid.fix


def test_an_unknown_xid_is_the_hardwares_with_its_code_in_the_ticket():
    f = by_id(infra(lambda g, t: {"xids": (XidEvent(100.0, 999),)} if g == 0 else {}), "xid")
    assert f.label == LABEL_INFRA and f.severity == "warning" and "XID 999" in f.summary and "catalogue" in f.fix


def test_lost_gpu_is_critical_infrastructure():
    findings = infra(lambda g, t: {"lost": True} if (g == 3 and t > 30) else {})
    top = findings[0]
    assert top.id == "gpu_lost" and top.severity == "critical" and top.gpus == (3,)
    assert "fell off the bus" in top.summary and "Xid" in top.fix
    assert "hang" not in ids(findings)


def test_verdict_line_has_action_and_count():
    findings = diagnose(build(starved(0)))
    line = verdict_line(findings)
    assert line.startswith("Input-bound (highly): rank ") and "→ raise num_workers" in line
    two = infra(lambda g, t: {"pcie": PcieLink(3, 5, 16, 16), "throttle_reasons": ("HwSlowdown",)} if g == 2 else {})
    assert "(+1 more)" in verdict_line(two)


@pytest.mark.parametrize("waiting,severity", [(4, "critical"), (2, "warning")])
def test_a_fifth_of_the_time_waiting_is_where_input_bound_turns_critical(waiting, severity):
    # TF Profiler's scale: waiting for data 20% of the time or more is "highly" input-bound (critical):
    # 4 of every 15 dumps (27%) is above the line, 2 of 15 (13%) below it stays a warning; the waits are
    # spread through the cycle (bunched together they would be one pause, a phase) and the 60 s the
    # shares cover hold two cycles
    pattern = [
        WAITING_FOR_DATA if i % (15 // waiting) == 0 and i // (15 // waiting) < waiting else FORWARD_BACKWARD for i in range(15)
    ]
    hist = build(Scenario(seconds=239, gpu_error=NO_DRIVER, ranks=eight_ranks(state=cycle(pattern))))
    f = by_id(diagnose(hist), "starvation")
    assert f.severity == severity, (f.severity, f.summary)


# ---------------------------------------------------------------- the simulated machine (real adapter over the fake NVML)


def test_simulated_healthy_machine_has_no_problem():
    findings = diagnose(simulated_history("h100-sxm-8"))
    assert findings[0].id == "healthy", [(f.id, f.summary) for f in findings]
    assert not [f for f in findings if f.severity in ("critical", "warning")]


@pytest.mark.parametrize(
    "fault,finding_id,gpu",
    [
        ("pcie-degraded=1", "pcie_downgrade", 1),
        ("thermal=2", "throttle", 2),
        ("nvlink-down=3", "nvlink_down", 3),
        ("power=4", "power_cap", 4),
        ("ecc=5", "ecc", 5),
        ("gpu-lost=6@20", "gpu_lost", 6),
        ("xid=7:48@10", "xid", 7),
    ],
)
def test_each_simulated_fault_gets_its_infrastructure_finding(fault, finding_id, gpu):
    findings = diagnose(simulated_history(f"h100-sxm-8+{fault}", seconds=40))
    f = by_id(findings, finding_id)
    assert f.label == LABEL_INFRA and f.severity in ("critical", "warning") and f.gpus == (gpu,)
    others = [x for x in findings if x.severity in ("critical", "warning") and x.id != finding_id]
    assert not others, [(x.id, x.summary) for x in others]


# ---------------------------------------------------------------- one hang, one finding (DDP)


def test_ddp_misfire_folds_the_waiting_ranks_into_one_hang():
    sc = misfire()
    for i, r in enumerate(sc.ranks):
        if i != 3:
            r.state = lambda t: COLLECTIVE if t >= 22 else FORWARD_BACKWARD
            r.cpu = lambda t: 0.0 if t >= 22 else 40.0
    sc.util = lambda g, t: 0.0 if t >= 21 else 92.0
    findings = diagnose(build(sc))
    hangs = [f for f in findings if f.id == "hang"]
    assert len(hangs) == 1 and findings[0] is hangs[0]
    top = hangs[0]
    assert top.summary.startswith("Hang: rank 3 stuck for") and "7 other rank(s) wait for it in a collective" in top.summary
    assert top.pids[0] == 1003 and set(top.pids) == {1000 + i for i in range(8)}
    assert top.frames[-1] == "ImageDataset.__getitem__ (dataset.py:44)"
    assert ids(severe(findings)) == ["hang"]
    assert "cpu_bound" not in ids(findings) and "low_utilization" not in ids(findings)


def test_a_hang_on_busy_cores_is_not_read_as_ranks_waiting_for_a_core():
    """The 8-rank nccl-hang demo on 2 cores: rank 3 stuck in its dataset code, the other ranks' GPUs spinning in
    their all-reduce (GPU-Util 90%, the SMs idle) while 16 workers keep both cores busy.  The spinning GPUs are
    the hang's, not GPUs starved of a core: the workers are noted, never a warning beside the hang."""
    sc = misfire()
    sc.cores = 2
    sc.host_cpu = lambda c, t: 99.0
    for i, r in enumerate(sc.ranks):
        if i != 3:
            r.state = lambda t: COLLECTIVE if t >= 22 else FORWARD_BACKWARD
            r.cpu = lambda t: 0.0 if t >= 22 else 40.0
    sc.util = lambda g, t: 0.0 if g == 3 and t >= 21 else 90.0
    sc.gpu_extra = lambda g, t: {"gpm": GpmMetrics(sm_active=2.0 if t >= 21 else 70.0), "compute_capability": (9, 0)}
    findings = diagnose(build(sc))
    assert findings[0].id == "hang" and ids(severe(findings)) == ["hang"], [(f.id, f.severity, f.summary) for f in findings]
    noted = [f for f in findings if f.id == "cpu_bound"]
    assert noted and noted[0].severity == "info", noted
    assert not any("wait for a core" in line for line in noted[0].evidence)


def test_all_ranks_in_a_collective_name_the_rank_that_exited():
    ranks = eight_ranks(state=lambda t: COLLECTIVE if t >= 10 else FORWARD_BACKWARD, cpu=lambda t: 0.0)
    ranks[5].exited = lambda t: t >= 10
    sc = Scenario(seconds=40, util=lambda g, t: 0.0 if t >= 10 else 90.0, ranks=ranks)
    findings = diagnose(build(sc))
    top = findings[0]
    assert [f.id for f in findings if f.id == "hang"] == ["hang"]
    assert top.summary.startswith("Hang: 7 rank(s) stuck in a collective for") and top.summary.endswith("rank 5 exited")
    assert "rank 5 (PID 1005) exited: the others wait for it" in top.evidence


def test_oversubscribed_workers_that_keep_up_are_only_noted():
    sc = compute_bound(cores=4)  # 16 idle-waiting workers on 4 cores, GPUs busy, no data wait
    findings = diagnose(build(sc))
    f = by_id(findings, "cpu_bound")
    assert f.severity == "info" and "16 DataLoader workers on 4 cores" in f.summary
    assert findings[0].id == "healthy"


def test_first_seconds_say_collecting_not_healthy():
    sc = starved(2)
    sc.seconds = 5  # 3 dumps so far
    findings = diagnose(build(sc))
    assert findings[0].id == "collecting" and findings[0].summary.startswith("Collecting stacks: 3/5 dumps per rank so far")
    assert "not input-bound" not in verdict_line(findings)


def test_worker_advice_follows_the_loader_arithmetic():
    # no GPU data: 80% (74–85%) of 240 dumps in dataset code with num_workers=0 → prep/step = 0.8/0.2 = 4,
    # ×1.25 → 5; at the interval's ends 0.74/0.26 × 1.25 → 4 and 0.85/0.15 × 1.25 → 7
    top = diagnose(build(starved(0, gpu_error=NO_DRIVER)))[0]
    assert top.fix.startswith("raise num_workers ≈ 5 (4–7)") and "num_workers=5" in top.fix
    assert "f ÷ (1 − f) × 1.25 → 5 (4–7), f = the 80% (74–85%) input share of 240 stack dumps" in top.fix
    assert top.figures["workers"] == {
        "num_workers": 5,
        "estimate": 5,
        "low": 4,
        "high": 7,
        "one_sided": False,
        "cap": 8,
        "capped": False,
        "bound": "cpu",
        "source": "estimate from the shares",
        "point_estimate": 5,
        "advised_before": False,  # no memory given: this window's count alone
    }
    # with GPU data the GPUs' idle share (85%, surely above the samples' 74–85%) bounds the input share:
    # 0.85/0.15 × 1.25 → 8
    top = diagnose(build(starved(0)))[0]
    assert "raise num_workers ≈ 8" in top.fix and "→ 8 (7–8), f = the GPUs' 85% idle share" in top.fix
    # 2 workers keep the rank waiting: each needs 2 cycles a batch against a 0.15 step → 2/0.15 × 1.25 → 17,
    # but CPU-bound workers (70% of a core) of 8 ranks share 64 cores: the cap is 8
    top = diagnose(build(starved(2)))[0]
    assert "raise num_workers to 8, the cap (the arithmetic asks ≈ 17)" in top.fix and "num_workers=8" in top.fix
    assert "2 ÷ (1 − f) × 1.25 → 17, more than the cap, so 8" in top.fix
    assert "64 cores (the host) ÷ 8 rank(s) → at most 8 per rank" in top.fix

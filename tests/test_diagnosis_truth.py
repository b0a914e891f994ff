"""Findings that must stay right under real CUDA semantics (issue 11): the machine view's idle GPUs, hangs
told from slow progress by counters, hangs that began before gputop attached, and advice within its caps."""

from __future__ import annotations

from gputop.analysis.diagnosis import diagnose, severe, verdict_line
from tests.harness.histories import Scenario, build


def ids(findings):
    return [f.id for f in findings]


# ---------------------------------------------------------------- machine view: 1 busy GPU, 7 idle


def test_one_busy_gpu_and_seven_idle_without_pid_is_not_healthy_and_names_the_pid():
    sc = Scenario(
        util=lambda g, t: 87.0 if g == 0 else 0.0,
        memory_gib=lambda g, t: 40.0 if g == 0 else 0.0,
        processes=lambda g, t: (4242,) if g == 0 else (),
        attach=False,
    )
    findings = diagnose(build(sc))
    top = findings[0]
    assert "healthy" not in ids(findings)
    assert top.id == "idle_gpus" and top.severity == "warning"
    assert top.summary.startswith("7 of 8 GPUs idle while a job uses 1")
    line = verdict_line(findings)
    assert "4242" in line and "--pid 4242" in line and not line.startswith("Healthy")
    assert any("DDP was not launched" in e for e in top.evidence)


def test_all_gpus_busy_without_pid_stays_healthy():
    sc = Scenario(
        util=lambda g, t: 92.0,
        memory_gib=lambda g, t: 40.0,
        processes=lambda g, t: (5000 + g,),
        attach=False,
    )
    findings = diagnose(build(sc))
    assert findings[0].id == "healthy" and not severe(findings)


# ---------------------------------------------------------------- hang = no progress, told by counters

from gputop.analysis.stack_classes import EXPLICIT_SYNC, IN_DATASET, WAITING_FOR_DATA  # noqa: E402
from tests.harness.histories import (  # noqa: E402
    STATE_FRAMES,
    WORKER_IDLE_FRAMES,
    WORKER_STUCK_FRAMES,
    RankSpec,
    progress_of,
    worker_busy_frames,
)

SLEEPING_WORKER_FRAMES = [f for f in worker_busy_frames(0) if "PIL" not in f.filename]  # `time.sleep` is C: no frame


def _no_raise_num_workers(findings):
    return not any("raise num_workers" in f.fix or "num_workers=" in f.fix.splitlines()[0] for f in findings)


def test_num_workers_0_sleeping_in_getitem_with_moving_counters_is_input_bound_not_hung():
    # every dump shows the same stack in dataset code (10 ms sleeps), but the thread wakes ~100 times a second
    sc = Scenario(
        seconds=40,
        util=lambda g, t: 30.0 if g == 0 else 0.0,
        ranks=[
            RankSpec(
                pid=1000,
                rank=0,
                gpus=(0,),
                state=lambda t: IN_DATASET,
                cpu=lambda t: 3.0,
                progress=lambda t: progress_of(1000, t, switches_per_s=95, cpu_share=0.03),
            )
        ],
        gpu_count=1,
    )
    findings = diagnose(build(sc))
    assert "hang" not in ids(findings)
    assert findings[0].id == "starvation" and findings[0].severity == "critical"


def test_two_workers_sleeping_in_getitem_with_moving_counters_are_input_bound_not_hung():
    sc = Scenario(
        seconds=40,
        util=lambda g, t: 25.0 if g == 0 else 0.0,
        gpu_count=1,
        ranks=[
            RankSpec(
                pid=1000,
                rank=0,
                gpus=(0,),
                state=lambda t: WAITING_FOR_DATA,
                workers=lambda t: (2000, 2001),
                worker_frames=lambda t, w: SLEEPING_WORKER_FRAMES,
                worker_cpu=lambda t, w: 2.0,
                progress=lambda t: progress_of(1000, t, switches_per_s=0.2, io_per_s=20_000),
                worker_progress=lambda t, w: progress_of(w, t, switches_per_s=50, cpu_share=0.02, io_per_s=10_000),
            )
        ],
    )
    findings = diagnose(build(sc))
    assert "hang" not in ids(findings)
    assert findings[0].id == "starvation" and findings[0].severity == "critical"


def _stuck_worker_job(seconds: float, *, with_counters: bool = True) -> Scenario:
    """One rank waiting on worker 2001, frozen in dataset code from before gputop attached."""
    return Scenario(
        seconds=seconds,
        util=lambda g, t: 0.0,
        memory_gib=lambda g, t: 12.0 if g == 0 else 0.0,
        gpu_count=1,
        ranks=[
            RankSpec(
                pid=1000,
                rank=0,
                gpus=(0,),
                state=lambda t: WAITING_FOR_DATA,
                workers=lambda t: (2000, 2001),
                worker_frames=lambda t, w: WORKER_STUCK_FRAMES if w == 2001 else WORKER_IDLE_FRAMES,
                cpu=lambda t: 0.0,
                worker_cpu=lambda t, w: 0.0,
                progress=(lambda t: progress_of(1000, t, switches_per_s=0.2)) if with_counters else None,
                worker_progress=(lambda t, w: progress_of(w, t)) if with_counters else None,
            )
        ],
    )


def test_frozen_worker_with_still_counters_is_a_hang_naming_its_frame():
    findings = diagnose(build(_stuck_worker_job(30)))
    top = findings[0]
    assert top.id == "hang" and top.severity == "critical"
    assert top.frames[-1] == "ImageDataset.__getitem__ (dataset.py:44)"
    assert any("counters still: 0 voluntary context switches" in e for e in top.evidence)
    assert "timeout=" in top.fix
    assert not [f for f in findings if f.id == "starvation" and f.severity in ("critical", "warning")]
    assert _no_raise_num_workers(findings)


def test_hang_that_began_before_attaching_shows_in_a_12_s_report():
    # a 12 s report: the worker's stack never changes and its counters never move, from the first dump on
    for window in (None, 120.0):
        findings = diagnose(build(_stuck_worker_job(12)), window=window)
        hang = next(f for f in findings if f.id == "hang")
        assert hang.frames[-1] == "ImageDataset.__getitem__ (dataset.py:44)"
        assert not [f for f in findings if f.id == "starvation" and f.severity in ("critical", "warning")]
        assert _no_raise_num_workers(findings)


def test_without_counters_12_s_of_equal_stacks_is_not_yet_called_a_hang():
    # stacks alone need HANG_MIN_SECONDS: with a 10 s span (12 s, dumps every 2 s) it is borderline; 8 s is not
    assert "hang" not in ids(diagnose(build(_stuck_worker_job(8, with_counters=False))))
    assert "hang" in ids(diagnose(build(_stuck_worker_job(8))))  # the counters settle it


def _nccl_hang(power_w: float, *, with_counters: bool = True) -> Scenario:
    """Rank 3's worker hangs; the other 7 ranks' hosts park at a sync while their GPUs run the all-reduce."""
    ranks = []
    for i in range(8):
        if i == 3:
            ranks.append(
                RankSpec(
                    pid=1003,
                    rank=3,
                    gpus=(3,),
                    state=lambda t: WAITING_FOR_DATA,
                    workers=lambda t: (3000, 3001),
                    worker_frames=lambda t, w: WORKER_STUCK_FRAMES if w == 3001 else WORKER_IDLE_FRAMES,
                    cpu=lambda t: 0.0,
                    worker_cpu=lambda t, w: 0.0,
                    progress=(lambda t: progress_of(1003, t, switches_per_s=0.2)) if with_counters else None,
                    worker_progress=(lambda t, w: progress_of(w, t)) if with_counters else None,
                )
            )
        else:
            ranks.append(
                RankSpec(
                    pid=1000 + i,
                    rank=i,
                    gpus=(i,),
                    state=lambda t: EXPLICIT_SYNC,
                    cpu=lambda t: 100.0,
                    # CUDA spin-waits at the sync: CPU burns, the thread never sleeps
                    progress=(lambda t, p=1000 + i: progress_of(p, t, cpu_share=1.0)) if with_counters else None,
                )
            )
    return Scenario(
        seconds=30,
        util=lambda g, t: 0.0 if g == 3 else 100.0,
        memory_gib=lambda g, t: 30.0,
        gpu_extra=lambda g, t: {"power": 80.0 if g == 3 else power_w, "power_limit": 700.0},
        ranks=ranks,
    )


def test_nccl_hang_with_spinning_gpus_names_the_culprit_rank_and_its_worker_frame():
    for with_counters in (True, False):
        findings = diagnose(build(_nccl_hang(140.0, with_counters=with_counters)))
        hangs = [f for f in findings if f.id == "hang"]
        assert len(hangs) == 1 and findings[0] is hangs[0], with_counters
        top = hangs[0]
        assert top.summary.startswith("Hang: rank 3 stuck for"), top.summary
        assert "7 other rank(s) wait for it in a collective (their GPUs spin" in top.summary
        assert top.frames[-1] == "ImageDataset.__getitem__ (dataset.py:44)"
        for advice in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_TRACE_BUFFER_SIZE", "NCCL_DEBUG=INFO", "timeout=120"):
            assert advice in top.fix
        assert any("140 W of 700 W" in e and "spinning" in e for e in top.evidence)
        assert "healthy" not in ids(findings) and _no_raise_num_workers(findings)


def test_gpus_computing_at_full_power_behind_a_parked_host_are_not_a_hang():
    # same stacks, but 100% at 650 W is compute: the device makes progress while the host waits at .item()
    findings = diagnose(build(_nccl_hang(650.0)))
    assert not any(f.id == "hang" and set(f.pids) - {1003} for f in findings)


def test_spinning_gpus_without_pid_are_a_silent_misfire():
    sc = Scenario(
        seconds=30,
        util=lambda g, t: 100.0,
        memory_gib=lambda g, t: 30.0,
        gpu_extra=lambda g, t: {"power": 130.0, "power_limit": 700.0},
        processes=lambda g, t: (5000 + g,),
        attach=False,
    )
    findings = diagnose(build(sc))
    assert findings[0].id == "hang" and "spin" in findings[0].summary


# ---------------------------------------------------------------- advice never above its cap

import re  # noqa: E402

import pytest  # noqa: E402

from tests.harness.histories import GIB  # noqa: E402


def _printed_worker_counts(findings) -> list[int]:
    out = []
    for f in findings:
        for text in (f.summary, f.fix, *f.evidence):
            for line in text.splitlines():
                for m in re.finditer(r"num_workers(?:=| to | ≤ )(\d+)|at most (\d+) per rank|→ (\d+) \(prep", line):
                    out.append(int(next(g for g in m.groups() if g)))
    return out


@pytest.mark.parametrize("n_ranks", [1, 4])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("worker_cpu", [8.0, 97.0])  # sleeping in __getitem__ (I/O), or computing
@pytest.mark.parametrize("cpu_limit,memory_limit", [(None, None), (2.0, None), (None, 3 * GIB)])
def test_no_advice_in_any_finding_exceeds_its_cap(n_ranks, workers, worker_cpu, cpu_limit, memory_limit):
    """Starved jobs of every shape: each worker count any finding prints stays within the cap: CPU-bound
    producers share the job's cores among the ranks; I/O-bound ones are bounded by memory and 32."""
    ranks = [
        RankSpec(
            pid=1000 + i,
            rank=i,
            gpus=(i,),
            state=lambda t: WAITING_FOR_DATA if workers else IN_DATASET,
            workers=(lambda t, b=2000 + 10 * i: tuple(range(b, b + workers))),
            worker_frames=lambda t, w: worker_busy_frames(int(t) + w),
            cpu=lambda t: worker_cpu if not workers else 5.0,
            worker_cpu=lambda t, w: worker_cpu,
        )
        for i in range(n_ranks)
    ]
    sc = Scenario(
        seconds=40,
        cores=16,
        util=lambda g, t: 3.0 if g < n_ranks else 0.0,
        ranks=ranks,
        cpu_limit=cpu_limit,
        memory_limit=memory_limit,
        host_cpu=lambda c, t: 60.0,
    )
    findings = diagnose(build(sc))
    assert any(f.id == "starvation" and f.severity == "critical" for f in findings)
    cores = min(cpu_limit or 16, 16)
    if worker_cpu >= 50:
        cap = max(1, int(cores // n_ranks))
    else:
        rss = (200 << 20) if workers else (2 << 30)  # a fork starts as big as its rank
        used = n_ranks * ((2 << 30) + workers * (200 << 20))
        free = min(44 * GIB, (memory_limit - used) if memory_limit else 44 * GIB)
        cap = min(32, max(1, int(free * 0.5 / rss / n_ranks)))
    printed = _printed_worker_counts(findings)
    assert printed, [f.fix for f in findings]
    assert max(printed) <= cap, (printed, cap)


# ---------------------------------------------------------------- sync in the loop; one rank evaluating

from gputop.analysis.stack_classes import COLLECTIVE, FORWARD_BACKWARD, IDLE_OTHER  # noqa: E402
from gputop.model import Frame  # noqa: E402


def test_sync_every_step_is_your_code_naming_the_line(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("\n" * 56 + "        running_loss += loss.item()  # every step\n" + "\n" * 40)
    frames = [Frame("train", str(train), 57), Frame("<module>", str(train), 90)]
    ranks = [
        RankSpec(
            pid=1000 + i,
            rank=i,
            gpus=(i,),
            state=lambda t: EXPLICIT_SYNC if int(t) % 4 else FORWARD_BACKWARD,
            frames=lambda t: frames if int(t) % 4 else STATE_FRAMES[FORWARD_BACKWARD],
            progress=lambda t, p=1000 + i: progress_of(p, t, switches_per_s=40, cpu_share=0.5),
        )
        for i in range(2)
    ]
    sc = Scenario(
        seconds=40,
        gpu_count=2,
        util=lambda g, t: 50.0 + (8 if int(t) % 2 else -8),
        ranks=ranks,
        gpu_extra=lambda g, t: {"power": 380.0, "power_limit": 700.0},
    )
    findings = diagnose(build(sc))
    top = findings[0]
    assert top.id == "sync_bound" and top.title == "Your code: a sync in the loop"
    assert "`loss.item()` at train.py:57 is a host-device sync" in top.summary
    assert "hang" not in ids(findings) and "healthy" not in ids(findings)


def _eval_rank0(seconds: float) -> Scenario:
    def rank0_frames(t):
        return [
            Frame("evaluate", "/job/train.py", 300 + int(t) % 7),
            Frame("train", "/job/train.py", 120),
            *STATE_FRAMES[IDLE_OTHER][-1:],
        ]

    ranks = [
        RankSpec(
            pid=1000,
            rank=0,
            gpus=(0,),
            state=lambda t: FORWARD_BACKWARD,
            frames=rank0_frames,
            progress=lambda t: progress_of(1000, t, switches_per_s=30, cpu_share=0.6),
        )
    ]
    ranks += [
        RankSpec(pid=1000 + i, rank=i, gpus=(i,), state=lambda t: COLLECTIVE, progress=lambda t, p=1000 + i: progress_of(p, t))
        for i in range(1, 8)
    ]
    return Scenario(
        seconds=seconds,
        util=lambda g, t: 100.0 if g else 97.0,
        ranks=ranks,
        gpu_extra=lambda g, t: {"power": 140.0 if g else 600.0, "power_limit": 700.0},
    )


def test_rank0_evaluating_while_the_others_wait_in_a_barrier_is_healthy_not_a_straggler_or_hang():
    findings = diagnose(build(_eval_rank0(30)))
    assert findings[0].id == "healthy", [(f.id, f.summary) for f in findings]
    assert not {"hang", "straggler"} & set(ids(findings))
    assert next(f for f in findings if f.id == "rank_wait").severity == "info"


def test_others_waiting_over_90_s_for_a_moving_rank_is_said():
    findings = diagnose(build(_eval_rank0(110)))
    wait = findings[0]
    assert wait.id == "rank_wait" and wait.severity == "warning" and "skipped a collective" in wait.fix


# ---------------------------------------------------------------- phases and epoch-level hiccups

from gputop.analysis.stack_classes import OPTIMIZER_STEP  # noqa: E402
from tests.harness.histories import cycle, eight_ranks, saw_tooth  # noqa: E402


def _one_pause(start: float, seconds: float, total: float) -> Scenario:
    """A fed job (GPUs 95%) that waits for data once, from `start` for `seconds` (an epoch start, an eval)."""
    paused = lambda t: start <= t < start + seconds  # noqa: E731
    fed = cycle([FORWARD_BACKWARD, FORWARD_BACKWARD, OPTIMIZER_STEP])
    return Scenario(
        seconds=total,
        util=lambda g, t: 2.0 if paused(t) else 95.0,
        ranks=eight_ranks(state=lambda t: WAITING_FOR_DATA if paused(t) else fed(t)),
    )


def test_one_pause_for_data_inside_the_window_is_not_critical_starvation():
    findings = diagnose(build(_one_pause(40.0, 24.0, 110.0)))
    assert not [f for f in findings if f.severity in ("critical", "warning")], [(f.id, f.summary) for f in findings]
    assert findings[0].id == "healthy"
    phase = next(f for f in findings if f.id == "starvation")
    assert phase.severity == "info" and phase.summary.startswith("One pause for data of 24 s")


def test_a_pause_still_going_after_10_s_is_starvation():
    findings = diagnose(build(_one_pause(80.0, 100.0, 110.0)))
    assert findings[0].id in ("starvation", "hiccup") and findings[0].severity == "critical"


def test_epoch_hiccups_with_a_period_of_minutes_are_found():
    # utilization collapses for 25 s every 150 s: no period shows in 2 minutes, three in the 10 kept
    sc = Scenario(seconds=599, util=saw_tooth(150.0, 125.0), ranks=eight_ranks(state=cycle([FORWARD_BACKWARD, OPTIMIZER_STEP])))
    history = build(sc)
    hiccup = next(f for f in diagnose(history) if f.id == "hiccup")
    assert "every 150 s" in hiccup.summary
    two_minutes = build(Scenario(seconds=119, util=saw_tooth(150.0, 125.0), ranks=sc.ranks))
    assert "hiccup" not in ids(diagnose(two_minutes))


# ---------------------------------------------------------------- placement decided once, by the collector

from gputop.model import Misplacement  # noqa: E402


def test_structured_misplacement_is_read_not_string_matched():
    shared = Misplacement("shared_gpu", (1002, 1003), (2,), "GPU 2 is shared by 2 ranks (rank 2, rank 3): call set_device")
    ranks = [RankSpec(pid=1000 + i, rank=i, gpus=(i,), state=cycle([FORWARD_BACKWARD, OPTIMIZER_STEP])) for i in range(4)]
    sc = Scenario(
        seconds=30,
        gpu_count=4,
        util=lambda g, t: 92.0,
        ranks=ranks,
        misplacements=(shared,),
        warnings=("words the analysis must not parse",),
    )
    f = next(f for f in diagnose(build(sc)) if f.id == "misplacement")
    assert f.summary.startswith("GPU 2 is shared by 2 ranks") and f.pids == (1002, 1003) and f.gpus == (2,)
    assert "collector: words the analysis must not parse" not in f.evidence


def test_ranks_spinning_for_a_rank_whose_worker_was_seen_once_in_dataset_code_name_that_frame():
    # idle workers are dumped rarely: one dump of the stuck worker so far, not yet proof it is stuck
    sc = _nccl_hang(140.0)
    sc.ranks[3].worker_frames = lambda t, w: (WORKER_STUCK_FRAMES if t == 20.0 else None) if w == 3001 else WORKER_IDLE_FRAMES
    findings = diagnose(build(sc))
    top = findings[0]
    assert top.id == "hang" and "waiting for rank 3, which waits for a DataLoader worker stuck in dataset code" in top.summary
    assert top.frames[-1] == "ImageDataset.__getitem__ (dataset.py:44)"
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in top.fix and "timeout=120" in top.fix

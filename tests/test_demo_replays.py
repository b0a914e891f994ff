"""Each `gputop demo` scenario's verdict, its figures and its words, checked by replaying a recording of the real
demo job through the diagnosis (issue 38: verdicts by replay).

The recordings (tests/fixtures/recordings/demo-*.gputop) are what `gputop demo` sees: the demo's PyTorch job, 4
ranks, on the simulated 8-GPU machine, attached from the job's start and polled once a second by the real pipeline
(py-spy dumps and dense samples), written by `scripts/record_demo_fixtures.py`.  Replaying one is the pipeline's
output fed to `diagnose()` a snapshot at a time, as the monitor does: the verdict is checked at each second of
the 30 s after every rank began its loop (the live tests' deadline), then at the recording's end (it holds),
with the same words and severities the live tests asked for.  What the simulated machine showed (idle or
spinning GPUs, held memory, parked hosts, a stuck worker's frame) is checked on the same recording.

One live run of the attach path stays in tests/acceptance/test_diagnosis_demo.py; the recordings say which
source of the demo job they were made with, and `test_the_recordings_are_of_the_demo_job_this_code_runs` fails
(naming the script that re-records them) when that source or the recording format has changed.
"""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path
from typing import Callable, Optional, Sequence

import pytest

from gputop.analysis.diagnosis import diagnose, severe, verdict_line
from gputop.analysis.stack_classes import COLLECTIVE, IN_DATASET, WAITING_FOR_DATA, classify_main_thread, main_thread
from gputop.analysis.thresholds import SHARE_WINDOW_S
from gputop.history import History
from gputop.model import LABEL_CODE, Finding
from gputop.recording import VERSION
from gputop.sim import scenarios
from tests.harness.attach import VERDICT_DEADLINE_S
from tests.harness.demo import dips
from tests.harness.replay import FIXTURES, Replay, load_script

REPO = Path(__file__).resolve().parent.parent
RERECORD = "python scripts/record_demo_fixtures.py"


def _recorder():
    """scripts/record_demo_fixtures.py as a module (its digests are the fixtures' keys)."""
    return load_script("record_demo_fixtures")


class DemoReplay(Replay):
    @functools.cached_property
    def in_loop(self) -> int:
        """The index of the first snapshot in which every rank is in its training loop (the live tests attach then)."""
        ranks = self.meta["ranks"]
        for i, snap in enumerate(self.snaps):
            found = snap.job.ranks if snap.job is not None else ()
            if len(found) == ranks and all(r.loop_started is not None for r in found):
                return i
        raise AssertionError(f"{self.name}: no snapshot with all {ranks} ranks in their loop")

    @property
    def pids(self) -> list[int]:
        """Rank pids in rank order."""
        job = self.snaps[-1].job
        assert job is not None
        return [r.proc.pid for r in sorted(job.ranks, key=lambda r: r.rank if r.rank is not None else -1)]

    def first(self, wanted: Callable[[list[Finding]], bool], deadline_s: float = VERDICT_DEADLINE_S) -> tuple[int, list[Finding]]:
        """The first snapshot (from the one every rank is in its loop, for `deadline_s` of them) whose
        findings are `wanted`, and those findings; fails naming each verdict seen on the way."""
        i, findings, _history = self.first_from(self.in_loop, lambda fs, _h: wanted(fs), deadline_s)
        return i, findings

    def util(self, gpu: int, last: Optional[int] = None) -> list[float]:
        """The GPU's utilization in each snapshot: the last `last`, or all in the loop."""
        snaps = self.snaps[-last:] if last else self.snaps[self.in_loop :]
        return [g.utilization_gpu or 0.0 for s in snaps for g in s.gpus if g.index == gpu]

    def main_threads(self, pid: int) -> list[tuple[str, list[str], Optional[int]]]:
        """(state, function names innermost first, innermost line) of each distinct main-thread dump of `pid`
        while in the loop."""
        out, seen = [], set()
        for snap in self.snaps[self.in_loop :]:
            stacks = snap.job.stacks.get(pid) if snap.job is not None else None
            if stacks is None or stacks.error or stacks.timestamp in seen:
                continue
            seen.add(stacks.timestamp)
            thread = main_thread(stacks)
            if thread is not None and thread.frames:
                out.append((classify_main_thread(stacks), [f.name for f in thread.frames], thread.frames[0].line))
        return out


@functools.lru_cache(maxsize=None)
def replay(scenario: str) -> DemoReplay:
    return DemoReplay.read(f"demo-{scenario}")


@pytest.fixture(scope="module", params=sorted(scenarios.SCENARIOS))
def any_replay(request) -> DemoReplay:
    return replay(request.param)


def _text(finding: Finding) -> str:
    return "\n".join((finding.summary, *finding.evidence, *finding.frames, finding.fix))


def _top(finding_id: str, words: str, severities: Sequence[str]) -> Callable[[list[Finding]], bool]:
    return lambda fs: fs[0].id == finding_id and words in fs[0].summary and fs[0].severity in severities


def _nothing_else_severe(findings: list[Finding]) -> None:
    others = [(f.id, f.summary) for f in severe(findings) if f is not findings[0]]
    assert not others, others


# ----------------------------------------------------------------- the recordings themselves


def test_the_recordings_are_of_the_demo_job_this_code_runs():
    """Every scenario has a recording, in this gputop's recording format, of the demo job's current source:
    else the replays test a job the code no longer runs."""
    recorder = _recorder()
    digest, item = recorder.source_digest(), recorder.item_line()
    for scenario in scenarios.SCENARIOS:
        path = FIXTURES / f"demo-{scenario}.gputop"
        assert path.exists(), f"no recording of {scenario}: run `{RERECORD} {scenario}`"
        meta = json.loads(path.with_suffix(".json").read_text())
        stale = {
            "recording format": (meta["recording_version"], VERSION),
            "demo job source": (meta["source_digest"], digest),
            "loss.item() line": (meta["item_line"], item),
        }
        changed = {what: pair for what, pair in stale.items() if pair[0] != pair[1]}
        assert not changed, f"the {scenario} recording is stale ({changed}): run `{RERECORD} {scenario}`"


def test_no_misfire_or_other_verdict_while_the_ranks_start_up(any_replay):
    """Attached from the job's start, as `gputop demo` is: while no rank has begun its loop (imports, the
    rendezvous, memory already taken at model.to(device), 0% utilization) the verdict is "starting up", never a
    misfire (a 29 s start-up read "Silent misfire: GPUs hold memory at 0% utilization") nor a CPU, input or sync
    verdict.  Only where the ranks put their memory is already true: every rank on GPU 0 (single-gpu)."""
    r = any_replay
    history = History(r.machine, capacity=len(r.snaps) + 1)
    for snap in r.snaps:
        ranks = snap.job.ranks if snap.job is not None else ()
        if any(x.loop_started is not None for x in ranks):
            break
        history.append(snap)
    if not len(history):
        pytest.skip("the recording begins with a rank already in its loop")
    findings = diagnose(history)
    placed = [f for f in findings if f.id == "misplacement"]
    assert bool(placed) == (r.name == "demo-single-gpu"), verdict_line(findings)
    others = [f for f in findings if f not in placed]
    assert not severe(others) and (not others or others[0].id == "collecting"), verdict_line(findings)


# ----------------------------------------------------------------- the verdicts


def test_starved_is_input_bound_highly_in_dataset_code():
    r = replay("starved")
    _i, findings = r.first(_top("starvation", "Input-bound (highly)", ("critical",)))
    _nothing_else_severe(findings)
    assert "(num_workers=0)" in findings[0].summary
    final = r.diagnosed(len(r.snaps) - 1)
    assert final[0].id == "starvation" and "Input-bound (highly)" in final[0].summary, verdict_line(final)


def test_the_starved_demos_first_share_is_the_one_a_whole_window_later():
    """Issue 21: attached from the job's start, the first starvation verdict says "highly" with a share within
    10 points of the one a whole share window later, when the two rest on no sample in common."""
    r = replay("starved")
    i, findings = r.first(lambda fs: any(f.id == "starvation" for f in fs))
    first = next(f for f in findings if f.id == "starvation")
    assert "Input-bound (highly)" in first.summary, first.summary
    later_at = r.snaps[i].timestamp + SHARE_WINDOW_S + 1.0
    j = next((k for k, s in enumerate(r.snaps) if s.timestamp >= later_at), None)
    assert j is not None, f"the recording ends {r.snaps[-1].timestamp - r.snaps[i].timestamp:.0f} s after the first verdict"
    later = next(f for f in r.diagnosed(j) if f.id == "starvation")
    assert "Input-bound (highly)" in later.summary, later.summary
    first_share, later_share = first.figures["input_share"]["share"], later.figures["input_share"]["share"]
    assert abs(first_share - later_share) <= 0.10, (first.summary, later.summary)


def test_starved_gpus_mostly_idle_while_the_ranks_decode():
    r = replay("starved")
    means = [statistics.fmean(r.util(g, last=8)) for g in range(8)]
    assert all(5 < means[g] < 50 for g in range(r.meta["ranks"])), means
    assert all(means[g] == 0 for g in range(r.meta["ranks"], 8)), means  # GPUs without a rank stay idle
    # num_workers=0: the rank's main thread runs the dataset itself
    dumps = r.main_threads(r.pids[0])
    assert any(state == IN_DATASET and "JpegDataset.__getitem__" in names for state, names, _line in dumps), dumps[:3]


def test_hiccup_is_epoch_boundary_worker_restarts():
    # the demo's saw-tooth loses ~20% of the GPUs' time on a 2-core box: right at the line between a warning
    # and a critical finding, so either is a right verdict; what it is and why must be right
    r = replay("hiccup")
    _i, findings = r.first(_top("hiccup", "epoch-boundary worker restarts", ("critical", "warning")))
    _nothing_else_severe(findings)


def test_hiccup_saw_tooth_with_workers_restarting_each_epoch():
    r = replay("hiccup")
    util = r.util(0)
    assert max(util) >= 75 and min(util) <= 30, util
    assert dips(util) >= 2, util  # an epoch is ~20 steps plus a ~1 s restart
    job0 = [snap.job for snap in r.snaps[r.in_loop :] if snap.job is not None]
    sets = [frozenset(w.pid for w in next(x for x in job.ranks if x.rank == 0).workers) for job in job0]
    sets = [s for s in sets if s]
    assert sets and any(s.isdisjoint(sets[0]) for s in sets[1:]), "rank 0's workers were never replaced"


def test_misfire_is_a_hang_on_a_worker_stuck_in_dataset_code():
    r = replay("misfire")
    _i, findings = r.first(_top("hang", "a DataLoader worker is stuck in dataset code", ("critical",)), deadline_s=90.0)
    _nothing_else_severe(findings)


def test_misfire_memory_held_at_zero_util_and_the_stuck_rank_waits_while_the_others_reduce():
    r = replay("misfire")
    ranks, stuck = r.meta["ranks"], r.meta["hang_rank"]
    assert stuck == ranks // 2
    assert all(u == 0 for g in range(ranks) for u in r.util(g, last=3))
    last = r.snaps[-1]
    assert all(last.gpus[g].memory_used > 9 * 1024**3 for g in range(ranks))  # held: the processes are alive
    assert r.meta["live"]["steps_per_s_last_3s"] == [0.0] * ranks
    assert r.main_threads(r.pids[stuck])[-1][0] == WAITING_FOR_DATA
    for rank, pid in enumerate(r.pids):
        if rank != stuck:
            assert r.main_threads(pid)[-1][0] == COLLECTIVE, (rank, r.main_threads(pid)[-1])


def test_misfire_one_worker_of_the_stuck_rank_stays_inside_image_open():
    """One sample hangs: one worker of the stuck rank waits inside Pillow's Image.open (reading the JPEG's
    bytes), the same worker in every dump from the first that shows it; the other workers idle."""
    r = replay("misfire")
    stuck = r.pids[r.meta["hang_rank"]]
    # the recording's last 10 s, well into the hang (the live test looked once every rank's GPU sat at 0% and
    # the other workers had finished their prefetch)
    in_open: list[set[int]] = []
    for snap in r.snaps[-10:]:
        job = snap.job
        rank = next((x for x in job.ranks if x.proc.pid == stuck), None) if job is not None else None
        if rank is None:
            continue
        found = set()
        for worker in rank.workers:
            thread = main_thread(job.stacks[worker.pid]) if worker.pid in job.stacks else None
            frames = thread.frames if thread is not None else ()
            if frames and frames[0].name == "open" and frames[0].filename.endswith("PIL/Image.py"):
                assert "JpegDataset.__getitem__" in [f.name for f in frames]
                found.add(worker.pid)
        in_open.append(found)
    assert len(in_open[0]) == 1 and all(found == in_open[0] for found in in_open), in_open  # the same worker throughout


def test_single_gpu_is_every_rank_on_gpu0():
    r = replay("single-gpu")
    ranks = r.meta["ranks"]
    _i, findings = r.first(_top("misplacement", f"{ranks} ranks share GPU 0; 7 of 8 GPUs idle", ("critical",)))
    _nothing_else_severe(findings)
    assert statistics.fmean(r.util(0, last=8)) > 80
    assert max(max(r.util(g)) for g in range(1, 8)) == 0
    gpu0 = r.snaps[-1].gpus[0]
    assert sorted(p.pid for p in gpu0.processes) == sorted(r.pids)
    assert gpu0.memory_used >= ranks * scenarios.MEMORY_PER_RANK
    # the ranks share one GPU's time: each gets about 1/ranks of a tuned rank's steps (~4.4 a second)
    assert all(rate < 2.5 for rate in r.meta["live"]["steps_per_s_last_3s"]), r.meta["live"]
    assert set(r.meta["live"]["cuda_visible_devices"].values()) == {None}


def test_tuned_is_healthy_not_input_bound():
    r = replay("tuned")
    # healthy needs enough samples to say "not input-bound" (collecting until then)
    i, findings = r.first(lambda fs: fs[0].id == "healthy")
    assert "not input-bound" in findings[0].summary, verdict_line(findings)
    for k in (i, len(r.snaps) - 1):
        fs = r.diagnosed(k)
        assert fs[0].id == "healthy" and not [f for f in fs if f.severity in ("critical", "warning")], verdict_line(fs)


def test_nccl_hang_names_the_rank_and_its_stuck_worker():
    """One rank's worker hangs; the others' GPUs spin in the all-reduce and their hosts park at loss.item():
    busy GPUs, yet a hang, blamed on the rank whose stack differs."""
    r = replay("nccl-hang")
    culprit = r.meta["hang_rank"]
    assert culprit == r.meta["ranks"] // 2

    def verdict(fs: list[Finding]) -> bool:
        top = fs[0]
        return (
            top.id == "hang"
            and top.severity == "critical"
            and f"rank {culprit}" in top.summary
            and "JpegDataset.__getitem__" in _text(top)
            and "timeout=" in top.fix
            and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in top.fix
        )

    _i, findings = r.first(verdict, deadline_s=90.0)
    _nothing_else_severe(findings)


def test_nccl_hang_read_from_the_recorder_does_not_ask_to_turn_the_recorder_on():
    """The demo runs with the flight recorder on and gputop reads it: the fix asks only for its dump at the
    timeout, not for TORCH_NCCL_TRACE_BUFFER_SIZE again."""
    r = replay("nccl-hang")

    def from_recorder(fs: list[Finding]) -> bool:
        return fs[0].id == "hang" and (fs[0].figures.get("collective") or {}).get("source") == "flight recorder"

    _i, findings = r.first(from_recorder, deadline_s=90.0)
    fix = findings[0].fix
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in fix and "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in fix, fix
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in fix


def test_nccl_hang_other_gpus_spin_at_low_power_with_hosts_parked_at_item():
    r = replay("nccl-hang")
    stuck = r.meta["hang_rank"]
    healthy = [g for g in range(r.meta["ranks"]) if g != stuck]
    gpus = r.snaps[-1].gpus
    assert all(gpus[g].utilization_gpu >= 95 for g in healthy) and gpus[stuck].utilization_gpu == 0
    for g in healthy:
        assert gpus[g].power < 0.3 * gpus[g].power_limit, (gpus[g].power, gpus[g].power_limit)  # a spin, not compute
        assert gpus[g].memory_used > 9 * 1024**3
    for rank in healthy:
        _state, names, line = r.main_threads(r.pids[rank])[-1]
        assert names[0] == "train" and line == r.meta["item_line"], (rank, names[:3], line)
    assert r.main_threads(r.pids[stuck])[-1][0] == WAITING_FOR_DATA
    assert r.meta["live"]["steps_per_s_last_3s"] == [0.0] * r.meta["ranks"]


def test_eval_on_rank0_is_healthy_not_a_straggler_and_stays_so():
    """Rank 0 evaluates every 40 steps while the others wait in a barrier: by design, not a problem."""
    r = replay("eval-rank0")
    i, _findings = r.first(lambda fs: fs[0].id == "healthy")
    for k in range(i, len(r.snaps), 5):  # over the following evaluations (one every ~10 s, ~2.7 s long)
        flagged = [
            (f.id, f.severity, f.summary) for f in r.diagnosed(k) if f.severity in ("critical", "warning") or f.id == "straggler"
        ]
        assert not flagged, (k, flagged)


def test_eval_on_rank0_the_others_wait_in_a_barrier():
    r = replay("eval-rank0")
    assert all(
        any(state == COLLECTIVE and names[0].rsplit(".", 1)[-1] == "barrier" for state, names, _line in r.main_threads(pid))
        for pid in r.pids[1:]
    ), [r.main_threads(pid)[-3:] for pid in r.pids[1:]]
    # rank 0's GPU runs the evaluation at high power while the others spin in the barrier at low power
    assert any(
        s.gpus[0].power > 0.6 * s.gpus[0].power_limit
        and all(
            (s.gpus[g].utilization_gpu or 0) >= 90 and s.gpus[g].power < 0.35 * s.gpus[g].power_limit
            for g in range(1, r.meta["ranks"])
        )
        for s in r.snaps[r.in_loop :]
    )
    assert r.meta["live"]["eval_lines"] >= 1  # rank 0 printed its evaluation


def test_sync_bound_names_the_item_line():
    """loss.item() every step: host and GPU take turns (GPUs ~55%).  The verdict is the user's code, a sync in
    the loop, naming the line."""
    r = replay("sync-bound")
    where = f"demo_job.py:{r.meta['item_line']}"
    _i, findings = r.first(
        lambda fs: fs[0].severity in ("critical", "warning") and where in _text(fs[0]) and "sync" in fs[0].summary.lower()
    )
    top = findings[0]
    assert top.label == LABEL_CODE, top
    assert "loss.item()" in _text(top), _text(top)
    assert top.id not in ("starvation", "hang", "straggler"), top


def test_sync_bound_host_and_gpu_take_turns():
    r = replay("sync-bound")
    means = [statistics.fmean(r.util(g, last=8)) for g in range(r.meta["ranks"])]
    assert all(40 <= m <= 70 for m in means), means  # ~55%: 200 ms of GPU after 160 ms of host, in turn
    assert any(line == r.meta["item_line"] for _s, _n, line in r.main_threads(r.pids[0]))


def test_a_fp32_job_gets_the_amp_finding_and_the_same_job_under_bf16_does_not():
    fp32, bf16 = replay("tuned"), replay("tuned-amp")
    ranks = range(fp32.meta["ranks"])
    amp = next(f for f in fp32.diagnosed(len(fp32.snaps) - 1) if f.id == "no_tensor_cores")
    assert set(amp.gpus) == set(ranks) and "bf16 autocast" in amp.summary
    busy = [g for s in fp32.snaps[-5:] for g in s.gpus if g.index in ranks and (g.utilization_gpu or 0) >= 50 and g.gpm]
    assert busy and all(g.gpm.tensor_active == 0.0 and g.gpm.fp32_active > 20.0 for g in busy)
    assert "no_tensor_cores" not in [f.id for f in bf16.diagnosed(len(bf16.snaps) - 1)]
    busy = [g for s in bf16.snaps[-5:] for g in s.gpus if g.index in ranks and (g.utilization_gpu or 0) >= 50 and g.gpm]
    assert busy and all(g.gpm.tensor_active > 30.0 for g in busy)


def test_nccl_hang_is_found_from_sm_activity_alone(monkeypatch):
    """With the power heuristic off (no power passes it), GPM's SM activity alone says the GPUs spin."""
    from gputop.analysis.checks import hang

    monkeypatch.setattr(hang, "SPIN_POWER_MAX_SHARE", 0.0)
    r = replay("nccl-hang")
    _i, findings = r.first(lambda fs: any(f.id == "hang" and "spin" in f.summary for f in fs), deadline_s=120.0)
    found = next(f for f in findings if f.id == "hang" and "spin" in f.summary)
    assert any("of its SMs active" in line and "spinning" in line for line in found.evidence), found.evidence

"""gputop on the frameworks people train with, by replay (issue 38: verdicts by replay): each framework job's verdict
checked on a recording of gputop's real attach pipeline watching the live job.

The recordings (tests/fixtures/recordings/framework-*.gputop, `scripts/record_framework_fixtures.py`) are real
Lightning, transformers + Accelerate, torchdata and DeepSpeed jobs (CPU only, tiny models, 2 DataLoader workers a
rank: tests/jobs/train_job.py), in each mode of tests/harness/train_jobs.py FRAMEWORK_CASES, watched from the moment
they are ready for 36 s: /proc discovery, py-spy dumps every 0.5 s, progress counters.  Replayed a poll at a time
through the diagnosis, each must read as the live tests asked, within 30 s of attaching: starved input-bound and no
straggler, tuned healthy with nothing severe once 12 dumps are in, a hung worker a hang in `__getitem__`, and a
straggler named only when there is one.  The plain loop (no framework, no GPU data at all) in the diagnosis modes
too: starved and starved0 input-bound (highly) in their own words, a hung worker a hang on its rank, compute-bound
healthy.  One live attach per framework stays in tests/acceptance/test_frameworks.py; `test_the_recordings_are_of_the_jobs_this_code_starts` fails (naming the script
that re-records them) when the job's source, a case's options or the recording format changed.
"""

from __future__ import annotations

import functools
import json

import pytest

from gputop.analysis.diagnosis import severe, verdict_line
from gputop.analysis.stack_classes import WAITING_FOR_RANK0_DATA
from gputop.history import History
from gputop.model import Finding
from gputop.recording import VERSION
from tests.harness.attach import HEALTHY_DUMPS, dumps_of, ranks_with_workers
from tests.harness.replay import FIXTURES, Replay, load_script
from tests.harness.train_jobs import FRAMEWORK_CASES

RERECORD = "python scripts/record_framework_fixtures.py"
SEVERE = ("critical", "warning")
PACKAGE = {"hf": "transformers"}  # a framework's package, where the two names differ


def _recorder():
    """scripts/record_framework_fixtures.py as a module (its digests are the fixtures' keys)."""
    return load_script("record_framework_fixtures")


@functools.lru_cache(maxsize=None)
def replay(case: str) -> Replay:
    r = Replay.read(f"framework-{case}")
    assert r.meta["snapshots"] == len(r.snaps), f"framework-{case}: the recording lost snapshots ({r.meta['snapshots']} written)"
    return r


def rank_pid(r: Replay, rank: int) -> int:
    return int(r.meta["ranks"][str(rank)])


def _ids(findings: list[Finding]) -> list[str]:
    return [f.id for f in findings]


def input_bound(r: Replay) -> tuple[list[Finding], History]:
    _i, findings, history = r.first_from(0, lambda fs, _h: fs[0].id == "starvation")
    assert "Input-bound" in findings[0].summary, findings[0].summary
    assert "straggler" not in _ids(findings), verdict_line(findings)
    return findings, history


def healthy(r: Replay) -> list[Finding]:
    pid = rank_pid(r, 0)
    _i, findings, _h = r.first_from(0, lambda fs, h: dumps_of(h, pid) >= HEALTHY_DUMPS and fs[0].id != "collecting")
    assert findings[0].id == "healthy", verdict_line(findings)
    assert not [f.id for f in findings if f.severity in SEVERE], verdict_line(findings)
    return findings


def hang(r: Replay) -> list[Finding]:
    _i, findings, _h = r.first_from(0, lambda fs, _h: fs[0].id == "hang")
    assert any("__getitem__" in frame for frame in findings[0].frames), findings[0].frames
    assert not [f for f in findings if f.id == "starvation" and f.severity == "critical"], verdict_line(findings)
    return findings


ONE_RANK = [name for name, case in FRAMEWORK_CASES.items() if case.ranks == 1 and case.framework != "plain"]
PLAIN = [name for name, case in FRAMEWORK_CASES.items() if case.framework == "plain"]


def test_the_recordings_are_of_the_jobs_this_code_starts():
    """Every case has a recording, in this gputop's recording format, of the job's current source started with the
    case's current options: else the replays test a job the code no longer runs."""
    recorder = _recorder()
    for name, case in FRAMEWORK_CASES.items():
        framework = case.framework
        path = FIXTURES / f"framework-{name}.gputop"
        assert path.exists(), f"no recording of {name}: run `{RERECORD} {name}`"
        meta = json.loads(path.with_suffix(".json").read_text())  # the JSON alone: each replay reads its recording
        stale = {
            "recording format": (meta["recording_version"], VERSION),
            "job source and options": (meta["source_digest"], recorder.source_digest(name)),
        }
        changed = {what: pair for what, pair in stale.items() if pair[0] != pair[1]}
        assert not changed, f"the {name} recording is stale ({changed}): run `{RERECORD} {name}`"
        assert meta["versions"][PACKAGE.get(framework, "torch" if framework == "plain" else framework)], meta


@pytest.mark.parametrize("name", ONE_RANK)
def test_a_one_rank_job_reads_as_its_mode_within_30_s_of_attaching(name):
    r = replay(name)
    mode = FRAMEWORK_CASES[name].mode
    if mode == "starved":
        input_bound(r)
    elif mode == "hang":
        hang(r)
    else:
        healthy(r)


@pytest.mark.parametrize("name, attached_rank", [("lightning-2-starved", 0), ("lightning-2-starved-rank1", 1)])
def test_lightning_two_devices_shows_both_ranks_with_their_workers_and_reads_input_bound(name, attached_rank):
    """From either rank's PID (a DDP job without a launcher): both ranks with their two workers, input-bound."""
    r = replay(name)
    assert r.meta["attached"] == rank_pid(r, attached_rank)
    expected = {rank_pid(r, 0): 2, rank_pid(r, 1): 2}
    r.first_from(0, lambda _fs, h: ranks_with_workers(h) == expected)
    input_bound(r)


def test_lightning_two_devices_straggler_named_when_there_is_one():
    r = replay("lightning-2-straggler")
    _i, findings, history = r.first_from(0, lambda fs, _h: "straggler" in _ids(fs))
    straggler = next(f for f in findings if f.id == "straggler")
    assert rank_pid(r, 1) in straggler.pids, (straggler.pids, r.meta["ranks"])


def test_lightning_two_devices_tuned_is_healthy_and_no_straggler():
    findings = healthy(replay("lightning-2-tuned"))
    assert "straggler" not in _ids(findings), verdict_line(findings)


def test_hf_iterable_dataset_dispatcher_is_input_bound_not_a_straggler():
    """Accelerate's DataLoaderDispatcher has rank 0 read every batch and broadcast it; rank 1 waits in that
    broadcast: rank 0's input pipeline starving both, seen from the torchrun launcher's PID."""
    r = replay("hf-iterable-starved")
    assert r.meta["attached"] == r.meta["launcher"]
    _findings, history = input_bound(r)
    rank1 = rank_pid(r, 1)
    states = {rank.main_thread_state for s in history if s.job for rank in s.job.ranks if rank.proc.pid == rank1}
    assert WAITING_FOR_RANK0_DATA in states, states


# ----------------------------------------------------------------- the plain loop (no framework, no GPU)
# What the live diagnosis-job tests (tests/acceptance/test_diagnosis_jobs.py, until these replays) asked of the plain
# loop: the stack and CPU findings on their own, with no GPU data at all, each verdict within 30 s of attaching.  The
# live attach path stays in tests/acceptance/test_frameworks.py.


@pytest.mark.parametrize("name", PLAIN)
def test_the_plain_loop_was_recorded_with_no_gpu_data_at_all(name):
    """The premise of the plain loop's verdicts: the box showed no GPU (no driver), so they rest on stacks and CPU."""
    r = replay(name)
    assert r.meta["gpu_error"], r.meta
    assert r.snaps and not any(snap.gpus for snap in r.snaps)


@pytest.mark.parametrize("name, words", [("plain-starved", "waits for data"), ("plain-starved0", "in dataset code")])
def test_a_starved_plain_loop_is_input_bound_highly(name, words):
    r = replay(name)
    _i, findings, _h = r.first_from(0, lambda fs, _h: fs[0].id == "starvation" and fs[0].severity == "critical")
    top = findings[0]
    assert "Input-bound (highly)" in top.summary and words in top.summary, top.summary
    assert "num_workers" in top.fix
    assert any("Samples.__getitem__" in f or "__next__" in f for f in top.frames), top.frames
    assert _ids(severe(findings)) == ["starvation"], verdict_line(findings)


def test_a_hung_worker_of_the_plain_loop_is_a_hang_with_its_frame():
    r = replay("plain-hang")
    _i, findings, _h = r.first_from(0, lambda fs, _h: fs[0].id == "hang")
    top = findings[0]
    assert top.severity == "critical" and "a DataLoader worker is stuck in dataset code" in top.summary, top.summary
    assert any(f.startswith("Samples.__getitem__ (train_job.py:") for f in top.frames), top.frames
    assert top.pids == (rank_pid(r, 0),)
    assert _ids(severe(findings)) == ["hang"], verdict_line(findings)


def test_a_compute_bound_plain_loop_is_healthy_not_input_bound():
    findings = healthy(replay("plain-compute"))
    assert "not input-bound" in findings[0].summary, findings[0].summary

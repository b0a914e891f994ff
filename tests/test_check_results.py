"""The checks decide into typed results and word them in one place (issue 22): the numbers a finding rests
on can be read without parsing its text, and the wording follows the decision alone."""

from __future__ import annotations

import dataclasses

import pytest

from gputop.analysis.checks.hiccup import HICCUP_CAUSES, Hiccup, check_hiccup, hiccup, hiccup_finding
from gputop.analysis.checks.input import check_starvation, starvation, starvation_finding
from gputop.analysis.checks.placement import CrowdedRanks, check_misplacement, misplacement
from gputop.analysis.diagnosis import build_context
from gputop.analysis.stack_classes import COLLECTIVE, FORWARD_BACKWARD, OPTIMIZER_STEP, WAITING_FOR_DATA
from gputop.analysis.thresholds import EVIDENCE_RANKS
from tests.harness.histories import RankSpec, Scenario, build, cycle, eight_ranks, saw_tooth


def _context(sc: Scenario):
    ctx = build_context(build(sc))
    assert ctx is not None
    return ctx


def test_starvation_is_decided_with_its_numbers_and_worded_from_them_alone():
    # every rank waits for data in 2 dumps of 3, the GPUs at 30%
    ctx = _context(
        Scenario(util=lambda g, t: 30.0, ranks=eight_ranks(state=cycle([WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD])))
    )
    decided = starvation(ctx)
    assert decided is not None
    assert decided.job_share.point == pytest.approx(2 / 3, abs=0.05)
    assert decided.highly and decided.severity == "critical" and not decided.overlapped
    assert decided.gpu_mean == pytest.approx(30.0)
    assert decided.advice is not None and decided.advice.workers >= 1  # no benchmark: the estimate from the shares
    finding = starvation_finding(decided)
    assert check_starvation(ctx) == [finding]
    assert (
        finding.summary.startswith("Input-bound (highly): rank ")
        and finding.figures["input_share"] == decided.job_share.to_dict()
    )

    # the same wait behind GPUs that stay busy is overlapped: only the decision changed, and with it the words
    busy = starvation_finding(dataclasses.replace(decided, gpu_mean=97.0))
    assert busy.severity == "info" and busy.summary.startswith("Host waits for data")
    saturated = starvation_finding(dataclasses.replace(decided, cpu_bound=True))
    assert saturated.fix.splitlines()[0] == "make preprocessing cheaper (the cores are already saturated)"
    assert saturated.summary == finding.summary and saturated.evidence == finding.evidence


def test_a_fed_job_decides_no_starvation():
    ctx = _context(Scenario(ranks=eight_ranks(state=cycle([FORWARD_BACKWARD, OPTIMIZER_STEP]))))
    assert starvation(ctx) is None and check_starvation(ctx) == []


def test_a_hiccup_carries_its_period_swings_and_cause():
    # utilization collapses for 4 s of every 12 while the ranks wait in a collective then
    ctx = _context(
        Scenario(
            seconds=119,
            util=saw_tooth(12.0, 8.0),
            ranks=eight_ranks(state=lambda t: COLLECTIVE if (t % 12.0) >= 8.0 else FORWARD_BACKWARD),
        )
    )
    decided = hiccup(ctx)
    assert isinstance(decided, Hiccup)
    assert decided.period.seconds == pytest.approx(12.0, abs=1.0)
    assert {s.index for s in decided.swings} == set(range(8))
    assert all(s.p10 <= 5.0 and s.p90 >= 95.0 for s in decided.swings)
    assert decided.cause == "collective" and decided.coll_share is not None
    assert decided.coll_share.point == pytest.approx(1 / 3, abs=0.05)
    finding = hiccup_finding(decided)
    assert check_hiccup(ctx) == [finding]
    assert finding.title == f"Periodic hiccup ({HICCUP_CAUSES[decided.cause]})"
    # the cause's words come from the decision: another cause, another title and fix, the same numbers
    other = "loader"
    reworded = hiccup_finding(dataclasses.replace(decided, cause=other))
    assert reworded.title == f"Periodic hiccup ({HICCUP_CAUSES[other]})" and reworded.fix != finding.fix
    shown = len(decided.swings[:EVIDENCE_RANKS]) + 1  # the GPUs' swings and the period: the same numbers
    assert reworded.evidence[:shown] == finding.evidence[:shown]


def test_ranks_crowded_on_one_gpu_are_decided_with_the_idle_ones():
    ranks = [RankSpec(pid=1000 + i, rank=i, gpus=(0,)) for i in range(4)]
    ctx = _context(Scenario(util=lambda g, t: 90.0 if g == 0 else 0.0, ranks=ranks))
    decided = misplacement(ctx)
    assert isinstance(decided, CrowdedRanks)
    assert decided.used == (0,) and decided.idle == tuple(range(1, 8)) and decided.n_gpus == 8
    assert [r.pid for r in decided.ranks] == [1000, 1001, 1002, 1003]
    (finding,) = check_misplacement(ctx)
    assert finding.summary == "4 ranks share GPU 0; 7 of 8 GPUs idle" and finding.severity == "critical"

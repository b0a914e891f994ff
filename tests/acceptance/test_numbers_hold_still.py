"""Numbers that hold still (issue 21's bar): real jobs with known producer and consumer rates, each watched
by 10 `gputop report --seconds 12` in a row while nothing about it changes.

For a Lightning Trainer, the plain loop and a transformers Trainer (tests/harness/train_jobs.py
STEADY_JOBS) the active benchmark (`gputop bench --yes`) first measures what the job needs: its prep and
step times per batch give the workers that would feed it.  Then over the 10 reports:

(a) the verdict is the same every time: the top finding's id and, for starvation, its level word;
(b) the advised num_workers moves by at most x1.3 (max / min).  gputop keeps the count it advised for a job
    while a later window's interval still holds it or misses it by one count (gputop/advice_memory.py,
    analysis/advice.py), as a user who asks twice expects;
    the table also shows each report's own point estimate, so a failure shows the noise beneath;
(c) the range the report states (low-high, or "at least low") holds the benchmark's need in 9 of 10.

The five jobs (these three and issue 11's two below) run side by side, one thread each running its benchmark and
then its reports one after another: the series share the wall clock, not a job or a report.  The jobs sleep for
their data and steps (the steady ones through a simulated GPU, --gpu-ms, so their steps do not slow with the
box).  The benchmarks run one at a time once all five jobs are ready, with no other test beside them (each
benchmark's cap counts the box's idle cores: a job importing Lightning, or another test, left "0.0 idle cores"
and cut one need to its cap), and the reports once all three are done.  The reports run beside shared tests only
where those run at a lower CPU priority (tests/harness/cpu_priority.py); elsewhere nothing runs beside the module.

Issue 11's bar: two slow but steady loaders (num_workers 0 and 2, tests/harness/train_jobs.py DIAGNOSIS_MODES
slow0 and slow2), each watched by its own 10 reports in a row beside the others', are input-bound in every one
and never called hung.  They have no benchmark: the bar is about the verdict only.  (They used to start once the
three series were done, when the steady jobs' steps computed on the CPU and slowed during five reports at once;
through the simulated GPU they do not, and the series take ~2 minutes less.)
"""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

import pytest

from tests.harness.box_load import BoxLoad
from tests.harness.processes import Spawner, run_gputop
from tests.harness.train_jobs import DIAGNOSIS_MODES, FRAMEWORK_WARM_STEPS, REPO, STEADY_JOBS, start

# The bar, fixed (not taken from the environment: a lower count would let the test pass without showing it).
REPORTS = 10
REPORT_SECONDS = 12
MAX_SPREAD = 1.3  # advised num_workers: max / min over the 10 reports
MIN_CONTAINED = 9  # reports whose stated range holds the benchmark's need
START_DEADLINE_S = 180.0  # importing lightning/transformers on 2 shared cores is slow; not part of the bar
GPUTOP_TIMEOUT_S = 120.0  # one report (12 s) or benchmark (15 s) run, with room for a loaded box
JOBS = tuple(STEADY_JOBS)  # lightning, plain, hf
SLOW_LOADERS = ("slow0", "slow2")  # issue 11: slow but steady, never hung; verdicts only, no benchmark


@dataclass
class Series:
    """One job's benchmark and reports; `error` says why the series stopped short."""

    name: str
    options: tuple = ()
    pid: Optional[int] = None
    bench: Optional[dict] = None
    reports: list = field(default_factory=list)
    error: Optional[str] = None
    started_s: float = 0.0  # the job ready, after this long
    wall_s: float = 0.0  # the whole series: start, benchmark, reports
    box: str = ""  # how busy the box was meanwhile (tests/harness/box_load.py): a failure says so, never retries

    # ------------------------------------------------------------- what the reports say

    @staticmethod
    def verdict(report: dict) -> tuple:
        """(the top finding's id, its level word for starvation: "highly" / "moderately")."""
        top = report["findings"][0] if report["findings"] else {"id": None, "summary": ""}
        level = re.search(r"\b(highly|moderately)\b", top["summary"]) if top["id"] == "starvation" else None
        return top["id"], level.group(1) if level else None

    @staticmethod
    def starvation(report: dict) -> Optional[dict]:
        return next((f for f in report["findings"] if f["id"] == "starvation"), None)

    def rows(self) -> list[tuple]:
        """Per report: (verdict, advised, low, high, "share (low-high)" [", point alone N" when the advice stood])."""
        out = []
        for report in self.reports:
            finding = self.starvation(report)
            figures = (finding or {}).get("figures") or {}
            workers, share = figures.get("workers") or {}, figures.get("input_share") or {}
            share_text = (
                f"{share['share']:.3f} ({share['low']:.3f}-{share['high']:.3f})" if share.get("share") is not None else None
            )
            point = workers.get("point_estimate")
            share_text = f"{share_text}, point alone {point}" if workers.get("advised_before") else share_text
            out.append((self.verdict(report), workers.get("num_workers"), workers.get("low"), workers.get("high"), share_text))
        return out

    def contained(self) -> int:
        """Reports whose stated range holds the benchmark's need: low <= need <= high (high None: need >= low)."""
        need = self.need
        if need is None:
            return 0
        return sum(1 for _, _, low, high, _ in self.rows() if low is not None and low <= need and (high is None or need <= high))

    @property
    def need(self) -> Optional[int]:
        return ((self.bench or {}).get("advice") or {}).get("workers_needed")

    def table(self) -> str:
        """Everything a failure needs: the benchmark's measurement and the 10 (advised, low, high, share)."""
        bench = self.bench or {}
        consumption, advice = bench.get("consumption") or {}, bench.get("advice") or {}
        lines = [
            f"{self.name} job (PID {self.pid}): {' '.join(self.options)}",
            f"  bench ({bench.get('mode')}): need {self.need} (cap {advice.get('worker_cap')}), "
            + (
                f"{consumption['batches_per_s']:.2f} batches/s, waiting {consumption['wait_fraction']:.1%}"
                if consumption.get("batches_per_s")
                else "no consumption measured"
            ),
            *(f"    {line}" for line in advice.get("lines") or ()),
            "  report  verdict                   advised  low  high  input share",
        ]
        for i, (verdict, advised, low, high, share) in enumerate(self.rows()):
            lines.append(
                f"  {i:>6}  {'/'.join(str(v) for v in verdict if v):<24}  {advised!s:>7}  {low!s:>3}  "
                f"{'∞' if high is None and low is not None else high!s:>4}  {share}"
            )
        advised = [row[1] for row in self.rows() if row[1]]
        if advised:
            lines.append(
                f"  advised max/min {max(advised)}/{min(advised)} = {max(advised) / min(advised):.2f}; "
                f"the need inside {self.contained()}/{len(self.reports)} stated ranges"
            )
        if self.box:
            lines.append(f"  {self.box}")
        if self.error:
            lines.append(f"  stopped: {self.error}")
        return "\n".join(lines)


def _json(ran, what: str) -> dict:
    if ran.rc != 0:
        raise AssertionError(f"{what} exited with {ran.rc}:\n{ran.err[-2000:]}")
    return json.loads(ran.out)


@dataclass
class Stages:
    """Where the series stand, so that each stage runs on a box the others leave as it expects: every job ready
    (its framework imported) before the first benchmark, one benchmark at a time with no other test beside them,
    every benchmark done before the first report.  A series that fails sets its events too, and holds nobody up."""

    ready: dict[str, threading.Event]
    benched: dict[str, threading.Event]
    bench_lock: threading.Lock = field(default_factory=threading.Lock)
    box_to_itself: threading.Event = field(default_factory=threading.Event)  # the benchmarks' window: no test beside

    @classmethod
    def of(cls, names, benchmarked) -> "Stages":
        return cls({name: threading.Event() for name in names}, {name: threading.Event() for name in benchmarked})

    @staticmethod
    def wait_all(events: dict[str, threading.Event], timeout: float) -> None:
        for event in events.values():
            event.wait(timeout)

    def end(self, name: str) -> None:
        for events in (self.ready, self.benched):
            if name in events:
                events[name].set()


def _run_series(spawn: Spawner, tmp_path, name: str, stages: Stages) -> Series:
    benchmarked = name in STEADY_JOBS
    options = STEADY_JOBS[name] if benchmarked else DIAGNOSIS_MODES[name]
    if name == "hf":
        options = (*options, "--output-dir", str(tmp_path / "hf-out"))  # nothing is saved; keep it out of the repo
    series = Series(name, options)
    box = BoxLoad()
    t0 = time.monotonic()
    try:
        proc, _ = start(spawn, tmp_path, name, *options, "--ready-after", str(FRAMEWORK_WARM_STEPS), timeout=START_DEADLINE_S)
        series.pid, series.started_s = proc.pid, time.monotonic() - t0
        stages.ready[name].set()
        if benchmarked:
            stages.wait_all(stages.ready, START_DEADLINE_S)  # no benchmark beside a job importing its framework
            stages.box_to_itself.wait(START_DEADLINE_S + GPUTOP_TIMEOUT_S)  # nor beside another test
            with stages.bench_lock:
                series.bench = _json(
                    run_gputop(spawn, "bench", "--pid", str(proc.pid), "--yes", "--json", timeout=GPUTOP_TIMEOUT_S, cwd=REPO),
                    "gputop bench",
                )
            stages.benched[name].set()
        stages.wait_all(stages.benched, START_DEADLINE_S + (len(JOBS) + 1) * GPUTOP_TIMEOUT_S)
        for i in range(REPORTS):
            args = ("report", "--pid", str(proc.pid), "--seconds", str(REPORT_SECONDS), "--format", "json")
            series.reports.append(_json(run_gputop(spawn, *args, timeout=GPUTOP_TIMEOUT_S, cwd=REPO), f"report {i}"))
            if proc.poll() is not None:
                raise AssertionError(f"the job exited with {proc.returncode} during report {i}")
    except Exception as exc:  # the other series go on; each test says what stopped this one
        series.error = f"{type(exc).__name__}: {exc}"
    finally:
        series.wall_s = time.monotonic() - t0
        series.box = box.since()
        stages.end(name)
    return series


@pytest.fixture(scope="module")
def series(tmp_path_factory, box_to_itself) -> dict[str, Series]:
    """The five series side by side (three benchmarked, two slow loaders); every job and gputop process is reaped
    before the tests look.  The jobs' start and the benchmarks run with no other test beside them (`box_to_itself`); the reports beside
    the shared tests where those run at a lower CPU priority (tests/harness/cpu_priority.py), else alone too."""
    for module in ("lightning", "transformers"):
        pytest.importorskip(module, reason=f"{module} is in the test extra (pip install -e '.[test]')")
    tmp = tmp_path_factory.mktemp("steady")
    spawn = Spawner()
    try:
        t0 = time.monotonic()
        names = (*JOBS, *SLOW_LOADERS)
        with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="series") as pool:
            stages = Stages.of(names, JOBS)
            # the jobs' start too: five framework imports at once left the shared tests beside them a fifth of the
            # box for ~15 s, and three of them ran out of their time (ci11)
            with box_to_itself():
                futures = {name: pool.submit(_run_series, spawn, tmp, name, stages) for name in names}
                stages.wait_all(stages.ready, START_DEADLINE_S)
                stages.box_to_itself.set()
                stages.wait_all(stages.benched, len(JOBS) * GPUTOP_TIMEOUT_S)
            finished = {name: future.result() for name, future in futures.items()}
        wall = time.monotonic() - t0
    finally:
        spawn.reap_all()
    for s in finished.values():  # the raw JSON, for a failure's post-mortem
        (tmp / f"{s.name}.json").write_text(json.dumps({"bench": s.bench, "reports": s.reports}))
    print(f"\nnumbers that hold still: five series side by side in {wall:.0f} s (JSON in {tmp})")
    for s in finished.values():
        print(f"{s.table()}\n  ready after {s.started_s:.0f} s, series {s.wall_s:.0f} s")
    return finished


def _complete(s: Series) -> None:
    assert s.error is None and len(s.reports) == REPORTS, s.table()


# A test's time includes the module fixture's 4 minutes when it is the first to run.
TIMEOUT = pytest.mark.timeout(900)
# Side by side (tests/harness/turns.py): each benchmark's cap counts the box's idle cores (a test beside it left
# 0.0 idle and cut plain's need of ~9 to the cap), so the benchmarks have the box to themselves (`box_to_itself`).
# The reports' shares follow the CPU the jobs get: with a shared test beside the five series at the same priority
# (the box 7% idle, load 13.8) plain's reports read inputs 0.57-0.68 against the benchmark's 0.70, and its need of
# 9 fell outside 2 of 10 stated ranges.  So the reports run beside shared tests only where those run at a lower
# CPU priority (tests/harness/cpu_priority.py); elsewhere the whole module runs alone.
pytestmark = [pytest.mark.slow, pytest.mark.alone(unless_prioritized=True), TIMEOUT]  # every test reads one series


@pytest.mark.parametrize("name", JOBS)
def test_the_job_is_input_bound_with_a_need_inside_the_cap(series, name):
    """The bar's premise: the benchmark measured a job that waits 50-90% of the time and needs 2-20
    workers, not cut by the cap.  The cap counts the cores idle while the benchmark runs, beside the other two
    jobs of the series: on a busy 2-core box it came to the need itself (8 of 8), which still cuts nothing."""
    s = series[name]
    assert s.bench is not None, s.table()
    consumption, advice = s.bench.get("consumption") or {}, s.bench["advice"]
    assert s.bench["mode"] == "active" and consumption.get("batches_per_s"), s.table()
    assert 0.5 <= consumption["wait_fraction"] <= 0.9, s.table()
    assert s.need is not None and 2 <= s.need <= 20 and s.need <= advice["worker_cap"], s.table()
    # a need at the cap may be one the cap cut ("more than the cap, so N"): then it is the box's idle cores, not
    # the job's need, and the ranges below are judged against the wrong number; say so here (the table ends
    # with how busy the box was)
    cut = [line for line in advice.get("lines") or () if "more than the cap" in line]
    assert not cut, f"the benchmark's need was cut by its cap (the box's idle cores): {cut}\n{s.table()}"


@pytest.mark.parametrize("name", JOBS)
def test_the_verdict_is_the_same_in_10_of_10_reports(series, name):
    s = series[name]
    _complete(s)
    verdicts = {Series.verdict(r) for r in s.reports}
    assert len(verdicts) == 1 and verdicts == {("starvation", "highly")}, s.table()


@pytest.mark.parametrize("name", JOBS)
def test_the_advised_workers_move_by_at_most_1_3x(series, name):
    s = series[name]
    _complete(s)
    advised = [row[1] for row in s.rows()]
    assert None not in advised, s.table()
    assert max(advised) / min(advised) <= MAX_SPREAD, f"max/min {max(advised)}/{min(advised)}\n{s.table()}"


@pytest.mark.parametrize("name", JOBS)
def test_the_stated_range_holds_the_measured_need_in_9_of_10(series, name):
    s = series[name]
    _complete(s)
    assert s.need is not None, s.table()
    assert s.contained() >= MIN_CONTAINED, f"need {s.need} inside {s.contained()}/{REPORTS} stated ranges\n{s.table()}"


@pytest.mark.parametrize("name", JOBS)
def test_every_report_rests_on_200_samples_a_rank_and_states_each_shares_interval(series, name):
    """Issue 21: a 12 s window holds at least 200 samples per rank, and every share in the report JSON carries
    its interval and its sample count."""
    s = series[name]
    _complete(s)
    for i, report in enumerate(s.reports):
        for rank in report["job"]["ranks"]:
            assert rank["samples"] >= 200 and rank["sampling"].startswith("py-spy record at"), (i, rank["samples"], s.table())
            for state, share in rank["shares"].items():
                assert share["low"] <= share["share"] <= share["high"] and share["of"] == rank["samples"], (i, state, share)
        figures = Series.starvation(report)["figures"]
        assert figures["input_share"]["of"] >= 200 and figures["workers"]["low"] is not None, (i, figures)


@pytest.mark.parametrize("name", SLOW_LOADERS)
def test_slow_but_steady_loaders_are_input_bound_never_hung_in_10_of_10_reports(series, name):
    """Issue 11's bar: starvation (critical or warning) is the top finding of every report, never a hang."""
    s = series[name]
    _complete(s)
    for i, report in enumerate(s.reports):
        findings = {f["id"]: f for f in report["findings"]}
        assert "hang" not in findings, (name, i, report["verdict"])
        assert "starvation" in findings and findings["starvation"]["severity"] in ("critical", "warning"), (
            name,
            i,
            report["verdict"],
        )
        assert report["findings"][0]["id"] == "starvation", (name, i, report["verdict"])

"""DataLoader arithmetic: how many workers feed this step time, and the advice with its working shown.

Pure functions over plain numbers and dicts.  This module imports nothing but the standard library on
purpose: the benchmark agent (``gputop/inject/agent.py``) runs inside the training process, where gputop
may not be installed, and loads this same file next to itself to plan its sweep, so the monitor and the
agent cannot disagree about the arithmetic.

Vocabulary (all per batch, seconds):
- *step time*: what the training does with a batch once it has it (forward/backward/optimizer), i.e. the
  wall time per batch spent outside ``DataLoader.__next__``;
- *prep time*: what one producer (a worker, or the main process at ``num_workers=0``) needs to build one
  batch;
- *demand*: the batch rate the training would consume if it never waited, ``1 / step time``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence

MARGIN = 1.25  # workers are not perfectly parallel, batches vary: ask for 25% more producing power
NOT_BOTTLENECK_WAIT = 0.05  # TF input-pipeline analyzer: under 5% of the step waiting is "not input-bound"
DEFAULT_PREFETCH = 2  # torch's default prefetch_factor
PREFETCH_GAIN = 1.05  # a larger prefetch_factor must beat the default by 5% to be worth its memory
EPOCH_RESTART_FRACTION = 0.01  # main thread >1% of its time in DataLoader.__iter__: restarts cost


def step_time(batches_per_s: float, wait_per_batch_s: float) -> Optional[float]:
    """Wall time per batch outside the loader: period minus wait. None when it cannot be known."""
    if not batches_per_s or batches_per_s <= 0:
        return None
    return max(0.0, 1.0 / batches_per_s - max(0.0, wait_per_batch_s))


def prep_time_from_rate(num_workers: int, batches_per_s: float) -> Optional[float]:
    """Seconds one producer needs per batch, from a loader-only rate: n producers share the load."""
    if not batches_per_s or batches_per_s <= 0:
        return None
    return max(1, num_workers) / batches_per_s


def live_prep_time(num_workers: int, consumption: Optional[dict[str, Any]]) -> Optional[float]:
    """Prep time per batch read off the training while it is input-bound, else None.

    num_workers=0: the main process builds each batch inside ``__next__``, so the wait is the prep.
    num_workers=n: a job that waits is consuming exactly what n workers make: prep = n / rate.
    """
    if not consumption or not consumption.get("batches_per_s"):
        return None
    if float(consumption.get("wait_fraction") or 0.0) < NOT_BOTTLENECK_WAIT:
        return None  # the loader keeps up: the rate says nothing about what it could do
    if num_workers == 0:
        wait = consumption.get("wait_per_batch_s")
        return float(wait) if wait else None
    return num_workers / float(consumption["batches_per_s"])


def workers_needed(prep_s: float, step_s: float, margin: float = MARGIN) -> int:
    """Producers needed so batches are ready as fast as the step uses them: ceil(prep / step * margin)."""
    if prep_s <= 0:
        return 0
    if step_s <= 0:
        step_s = 1e-6
    return max(1, math.ceil(prep_s / step_s * margin - 1e-9))


MIN_CORE_SHARE = 0.02  # a worker that mostly waits on I/O still costs something: never divide by ~0
MIN_CORE_BUDGET = 0.25  # on a saturated host, workers that barely use a CPU may still share a quarter core
HARD_MAX_WORKERS = 32


def core_share_per_worker(config: Optional[dict[str, Any]]) -> float:
    """Fraction of a core one producer keeps busy, from a sweep configuration's CPU time per batch.

    1.0 for CPU-bound decoding; near 0 for a dataset that waits on storage.  Unknown -> 1.0 (cautious).
    """
    if not config or not config.get("cpu_s_per_batch") or not config.get("batches_per_s"):
        return 1.0
    producers = max(1, int(config.get("num_workers") or 0))
    share = float(config["cpu_s_per_batch"]) * float(config["batches_per_s"]) / producers
    return min(1.0, max(MIN_CORE_SHARE, share))


def worker_cap(
    current_workers: int, free_cores: float, ranks_on_host: int = 1, core_share: float = 1.0, hard_max: int = HARD_MAX_WORKERS
) -> int:
    """The most workers a rank should get: what it has plus as many as its share of the idle cores
    can keep busy (each worker needs `core_share` of a core), at least 1, at most `hard_max`.

    Workers that mostly wait on storage cost little CPU, so even a saturated host gets a quarter core's
    worth of them; CPU-bound ones (share 1.0) get none there.  At ``num_workers=0`` the main process
    produces the batches itself; that work moves to the workers, so its core counts as free too.
    """
    core_share = max(MIN_CORE_SHARE, core_share)
    share = max(MIN_CORE_BUDGET, max(0.0, free_cores) / max(1, ranks_on_host))
    if current_workers == 0:
        share += core_share  # the main process stops decoding once workers do it
    extra = int(math.floor(share / core_share + 1e-9))
    return max(1, min(max(hard_max, current_workers), current_workers + extra))


def plan_worker_counts(current: int, needed: Optional[int], cap: int, limit: int = 3) -> list[int]:
    """Worker counts to try after the current one, ascending, at most `limit`, each different from `current`.

    With a known need: the needed count (capped), the cap when the need exceeds it, a midpoint and one
    above the need (is the margin enough?).  Without one (offline: no step time): doublings up to the cap.
    """
    cap = max(cap, 1)
    if not needed:
        ladder = [n for n in (1, 2, 4, 8, 16, 32) if current < n < cap] + [cap]
        ladder = sorted(set(n for n in ladder if n != current))
        if len(ladder) > limit:  # keep the first rung, the cap, and evenly spaced rungs between
            step = (len(ladder) - 1) / (limit - 1)
            ladder = sorted({ladder[round(i * step)] for i in range(limit)})
        return ladder
    picks: list[int] = []
    target = min(needed, cap)
    picks.append(target)
    if needed > cap:
        picks.append(cap)
    if target > 2:
        picks.append(max(1, (target + max(current, 0)) // 2))  # a midpoint shows where the curve bends
    if target < cap:
        picks.append(min(cap, target + max(1, target // 2)))  # one above: is the margin enough?
    chosen = sorted({p for p in picks if p != current and 0 <= p <= cap})
    if len(chosen) > limit:
        chosen = sorted({target, *chosen[-(limit - 1) :]} if target in chosen else chosen[-limit:])[:limit]
    return chosen


def _fmt_s(seconds: Optional[float]) -> str:
    # '12.3 ms' below a second, '1.25 s' above (this file runs inside the job without gputop: see above)
    if seconds is None:
        return "unknown"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


Config = dict[str, Any]  # one loader measurement: {num_workers, prefetch_factor, pin_memory, batches_per_s, cpu_s_per_batch}


def _best_rate(configs: Sequence[Config], num_workers: int, pin_memory: Optional[bool] = None) -> Optional[Config]:
    matching = [
        c
        for c in configs
        if c.get("num_workers") == num_workers
        and c.get("batches_per_s")
        and (pin_memory is None or bool(c.get("pin_memory")) == pin_memory)
    ]
    return max(matching, key=lambda c: float(c["batches_per_s"])) if matching else None


def _rate(config: Config) -> float:
    return float(config["batches_per_s"])


def recommend(
    *,
    current: dict[str, Any],
    consumption: Optional[dict[str, Any]] = None,
    configs: Sequence[Config] = (),
    free_cores: Optional[float] = None,
    ranks_on_host: int = 1,
    uses_cuda: Optional[bool] = None,
    passive: Optional[dict[str, Any]] = None,
    margin: float = MARGIN,
    max_workers: Optional[int] = None,
) -> dict[str, Any]:
    """The advice: DataLoader kwargs, whether the loader is the bottleneck, and the arithmetic as lines.

    current: the live loader's settings (num_workers, prefetch_factor, pin_memory, persistent_workers).
    consumption: the training's measured rate: batches_per_s, wait_per_batch_s, wait_fraction.
    configs: loader-only measurements [{num_workers, prefetch_factor, pin_memory, batches_per_s}].
    passive: py-spy fractions (wait_fraction, dataset_fraction, epoch_restart_fraction) and the workers' CPU
    shares (worker_busy: [{pid, busy}]) when consumption is missing: the advice is then sized from shares.
    max_workers: a cap from outside the cores (free memory, the stated maximum); no count above it is advised.
    Returns {"kwargs", "bottleneck", "verdict", "lines", "workers_needed", "worker_cap"}.
    """
    lines: list[str] = []
    n_now = int(current.get("num_workers") or 0)
    kwargs = _current_kwargs(current, n_now)
    wait_fraction, step_s = _training_wait(consumption, passive, lines)
    baseline = _best_rate(configs, n_now, bool(current.get("pin_memory"))) or _best_rate(configs, n_now)
    core_share = _core_share(baseline, passive)
    cap = worker_cap(n_now, free_cores, ranks_on_host, core_share) if free_cores is not None else None
    cap = max(0, min(cap if cap is not None else max_workers, max(max_workers, 0))) if max_workers is not None else cap
    result: dict[str, Any] = {
        "kwargs": kwargs,
        "bottleneck": None,
        "verdict": "",
        "lines": lines,
        "workers_needed": None,
        "worker_cap": cap,
    }
    if wait_fraction is None:
        result["verdict"] = "not enough data to advise: no batches were seen during the measurement"
        return result
    if wait_fraction < NOT_BOTTLENECK_WAIT:
        _keep_settings(result, wait_fraction, uses_cuda=bool(uses_cuda), pin_now=bool(current.get("pin_memory")))
        return result
    result["bottleneck"] = True
    prep_s = _prep_time(n_now, consumption, baseline, lines)
    if (prep_s is None or step_s is None) and consumption is None and passive:
        _passive_estimate(result, n_now, wait_fraction, passive, cap, core_share, margin)
    elif prep_s is None or step_s is None:
        _unsized(result, n_now, wait_fraction, cap)
    else:
        cap_text = _cap_text(n_now, free_cores, ranks_on_host, core_share, cap) if cap is not None else None
        plan = _sized_workers(lines, prep_s, step_s, margin, cap, cap_text, configs)
        result["workers_needed"] = plan.needed if cap is None else min(plan.needed, cap)
        _tune_kwargs(kwargs, lines, plan, current, configs, passive, consumption, uses_cuda=bool(uses_cuda))
        result["verdict"] = _sized_verdict(plan, prep_s, n_now, wait_fraction)
    return result


def _unsized(result: dict[str, Any], n_now: int, wait_fraction: float, cap: Optional[int]) -> None:
    """Input-bound, but neither prep nor step time is known: say so, and move the work off the training thread."""
    result["verdict"] = (
        f"input-bound: the training waits for data {wait_fraction:.0%} of the time; "
        "run the active benchmark (--yes) for the worker count that fixes it"
    )
    if n_now == 0:
        result["kwargs"].update(num_workers=max(2, min(cap or 2, 4)), prefetch_factor=DEFAULT_PREFETCH, persistent_workers=True)
        result["lines"].append("num_workers=0 builds every batch on the training thread: move it to workers")


def _current_kwargs(current: dict[str, Any], n_now: int) -> dict[str, Any]:
    """The live loader's settings as DataLoader kwargs (the advice starts from them)."""
    kwargs: dict[str, Any] = {"num_workers": n_now}
    if n_now > 0:
        kwargs["prefetch_factor"] = current.get("prefetch_factor") or DEFAULT_PREFETCH
        kwargs["persistent_workers"] = bool(current.get("persistent_workers"))
    kwargs["pin_memory"] = bool(current.get("pin_memory"))
    return kwargs


def _training_wait(
    consumption: Optional[dict[str, Any]], passive: Optional[dict[str, Any]], lines: list[str]
) -> tuple[Optional[float], Optional[float]]:
    """(the training's data-wait fraction, its step time) from timed batches, else py-spy's shares."""
    if consumption and consumption.get("batches_per_s"):
        rate = float(consumption["batches_per_s"])
        wait_b = float(consumption.get("wait_per_batch_s") or 0.0)
        wait_fraction = float(consumption.get("wait_fraction") or 0.0)
        step_s = step_time(rate, wait_b)
        lines.append(f"training: {rate:.2f} batches/s, waiting {_fmt_s(wait_b)} per batch ({wait_fraction:.0%} of the time)")
        lines.append(f"step time outside the loader = 1/{rate:.2f} − {_fmt_s(wait_b)} = {_fmt_s(step_s)}")
        return wait_fraction, step_s
    if passive and passive.get("wait_fraction") is not None:
        wait_fraction = float(passive["wait_fraction"])
        lines.append(f"training waits for data {wait_fraction:.0%} of the time (py-spy samples)")
        return wait_fraction, None
    return None, None


def _core_share(baseline: Optional[Config], passive: Optional[dict[str, Any]]) -> float:
    """A core per worker: the sweep's CPU time per batch, else the workers' measured CPU share (no sweep)."""
    busy = [float(w["busy"]) for w in (passive or {}).get("worker_busy") or () if w.get("busy") is not None]
    if baseline is None and busy:
        # no sweep: the workers' measured CPU share says whether they compute or wait on I/O
        return min(1.0, max(MIN_CORE_SHARE, sum(busy) / len(busy)))
    return core_share_per_worker(baseline)


def _keep_settings(result: dict[str, Any], wait_fraction: float, *, uses_cuda: bool, pin_now: bool) -> None:
    """The loader keeps up: keep its settings (pinning memory for a GPU job costs nothing)."""
    result["bottleneck"] = False
    result["verdict"] = (
        f"your loader is not the bottleneck: the training waits for data {wait_fraction:.1%} of the time "
        f"(under {NOT_BOTTLENECK_WAIT:.0%}); keep these settings"
    )
    if uses_cuda and not pin_now:
        result["kwargs"]["pin_memory"] = True
        result["lines"].append("pin_memory=True: batches go to the GPU, pinned pages copy faster and asynchronously")


def _prep_time(
    n_now: int, consumption: Optional[dict[str, Any]], baseline: Optional[Config], lines: list[str]
) -> Optional[float]:
    """Prep time per batch for one producer.  The training itself is the best witness while it waits
    for data: at num_workers=0 its wait *is* the prep, and with workers that cannot keep up its rate
    *is* theirs.  That was measured before the sweep, so the sweep's own CPU use cannot skew it; the
    loader-alone run of the same settings is shown next to it as a cross-check (and stands in for it
    when the training was not timed)."""
    prep_s = live_prep_time(n_now, consumption)
    if prep_s is not None and consumption is not None:
        how = (
            "the wait at num_workers=0"
            if n_now == 0
            else f"{n_now} workers ÷ {float(consumption['batches_per_s']):.2f} batches/s (the workers are the limit)"
        )
        lines.append(f"prep time per batch = {how} = {_fmt_s(prep_s)}")
        if baseline:
            lines.append(
                f"  cross-check, loader alone with these settings: {_rate(baseline):.2f} batches/s → "
                f"{_fmt_s(prep_time_from_rate(n_now, _rate(baseline)))} per batch"
            )
        return prep_s
    if baseline:
        prep_s = prep_time_from_rate(n_now, _rate(baseline))
        lines.append(
            f"prep time per batch = max(1, {n_now} workers) ÷ {_rate(baseline):.2f} batches/s "
            f"(loader alone, current settings) = {_fmt_s(prep_s)}"
        )
    return prep_s


def _cap_text(n_now: int, free_cores: Optional[float], ranks_on_host: int, core_share: float, cap: int) -> str:
    if free_cores is None:
        return f"cap: at most {cap} workers (the stated maximum)"
    return (
        f"cap: {n_now} current + {max(0.0, free_cores):.1f} idle cores"
        + (f" ÷ {ranks_on_host} ranks" if ranks_on_host > 1 else "")
        + (" + the main process's decoding share (num_workers=0)" if n_now == 0 else "")
        + (f" ÷ {core_share:.2f} core per worker (measured CPU time)" if core_share < 1.0 else "")
        + f" → at most {cap} workers"
    )


class _Plan(NamedTuple):
    needed: int  # the estimate
    chosen: int  # what to set: the estimate, capped, or the smallest measured count that meets demand
    demand: float  # batches/s the training would use if it never waited (1 / step time)
    measured: Optional[Config]  # the loader-alone measurement of the chosen count


def _sized_workers(
    lines: list[str],
    prep_s: float,
    step_s: float,
    margin: float,
    cap: Optional[int],
    cap_text: Optional[str],
    configs: Sequence[Config],
) -> _Plan:
    """Workers from prep ÷ step × margin, capped; measurements overrule the estimate."""
    needed = workers_needed(prep_s, step_s, margin)
    lines.append(
        f"workers needed ≈ {_fmt_s(prep_s)} ÷ {_fmt_s(step_s)} × {margin:g} margin → "
        + (f"{needed}" if cap is None or needed <= cap else f"more than the cap of {cap}")
    )
    chosen = needed
    if cap is not None and cap_text is not None:
        lines.append(cap_text)
        chosen = min(chosen, cap)
    # Let measurements overrule the estimate: the smallest measured count that meets demand wins.
    demand = 1.0 / step_s if step_s > 0 else float("inf")
    meeting = sorted({int(c["num_workers"]) for c in configs if c.get("batches_per_s") and _rate(c) >= demand * 1.05})
    if meeting and meeting[0] <= chosen and (cap is None or meeting[0] <= cap):
        fastest = _best_rate(configs, meeting[0])
        if meeting[0] < chosen and fastest is not None:
            lines.append(
                f"measured: num_workers={meeting[0]} already gives {_rate(fastest):.1f} batches/s ≥ {demand:.1f} needed (1/step)"
            )
        chosen = meeting[0]
    measured = _best_rate(configs, chosen)
    if measured:
        ok = _rate(measured) >= demand
        lines.append(
            f"measured: num_workers={chosen} gives {_rate(measured):.1f} batches/s {'≥' if ok else '<'} {demand:.1f} needed"
        )
    return _Plan(needed, chosen, demand, measured)


def _tune_kwargs(
    kwargs: dict[str, Any],
    lines: list[str],
    plan: _Plan,
    current: dict[str, Any],
    configs: Sequence[Config],
    passive: Optional[dict[str, Any]],
    consumption: Optional[dict[str, Any]],
    *,
    uses_cuda: bool,
) -> None:
    """The chosen worker count with the prefetch depth, persistence and pinning that go with it."""
    n_now = int(current.get("num_workers") or 0)
    persistent_now = bool(current.get("persistent_workers"))
    chosen, measured = plan.chosen, plan.measured
    kwargs["num_workers"] = chosen
    if chosen > 0:
        prefetch_now = current.get("prefetch_factor") or (DEFAULT_PREFETCH if n_now > 0 else None)
        kwargs["prefetch_factor"] = max(prefetch_now or DEFAULT_PREFETCH, DEFAULT_PREFETCH)
        better = [
            c
            for c in configs
            if c.get("num_workers") == chosen
            and (c.get("prefetch_factor") or 0) > kwargs["prefetch_factor"]
            and measured
            and c.get("batches_per_s", 0) > _rate(measured) * PREFETCH_GAIN
        ]
        if better:
            kwargs["prefetch_factor"] = max(c["prefetch_factor"] for c in better)
            lines.append(f"prefetch_factor={kwargs['prefetch_factor']} measured >{PREFETCH_GAIN - 1:.0%} faster than the default")
        restarts = (passive or {}).get("epoch_restart_fraction") or 0.0
        restarts_seen = bool((consumption or {}).get("epoch_restarts")) or restarts > EPOCH_RESTART_FRACTION
        kwargs["persistent_workers"] = persistent_now or n_now == 0 or restarts_seen
        if restarts_seen and not persistent_now:
            lines.append(
                f"persistent_workers=True: epoch restarts re-fork the workers "
                f"({restarts:.0%} of the main thread's time in DataLoader.__iter__)"
            )
    if uses_cuda:
        kwargs["pin_memory"] = True
        if not current.get("pin_memory"):
            lines.append("pin_memory=True: batches go to the GPU; pinned pages copy faster and asynchronously")


def _sized_verdict(plan: _Plan, prep_s: float, n_now: int, wait_fraction: float) -> str:
    chosen = plan.chosen
    if chosen < plan.needed:
        expected = chosen / prep_s
        return (
            f"input-bound: needs more workers than the {chosen} that fit the idle cores and memory; expect "
            f"~{expected:.1f} of {plan.demand:.1f} batches/s — make each batch cheaper (cache decoded data, "
            "smaller images) or give the job more cores"
        )
    if chosen == n_now:
        return (
            f"the training waits for data {wait_fraction:.0%} of the time although num_workers={n_now} "
            "should keep up; look at the hottest worker frames and at CPU contention"
        )
    return f"input-bound: the training waits for data {wait_fraction:.0%} of the time; set num_workers={chosen} (now {n_now})"


def _passive_estimate(
    result: dict[str, Any],
    n_now: int,
    wait_fraction: float,
    passive: dict[str, Any],
    cap: Optional[int],
    core_share: float,
    margin: float,
) -> None:
    """Advice from py-spy shares alone (no timed batches): the rank waits `w` of the time.

    With n workers keeping it waiting, each needs n batch cycles per batch against a step of (1 - w) of
    a cycle; at num_workers=0 the rank's own dataset share is the prep.  Workers that sleep in
    `__getitem__` (little CPU: I/O-bound) may outnumber the cores, which the cap allows through
    `core_share`; CPU-bound ones are held to the idle cores."""
    lines = result["lines"]
    kwargs = result["kwargs"]
    step = max(1.0 - wait_fraction, 0.05)
    if n_now > 0:
        prep = float(n_now)
        how = f"{n_now} worker(s) ÷ a {step:.2f} step share"
    else:
        prep = float(passive.get("dataset_fraction") or wait_fraction)
        how = f"the rank's {prep:.0%} in dataset code ÷ a {step:.2f} step share"
    needed = max(n_now + 1, workers_needed(prep, step, margin))
    limit = cap if cap is not None else HARD_MAX_WORKERS
    chosen = min(needed, limit)
    result["workers_needed"] = chosen
    kind = "I/O-bound (they sleep in the dataset)" if core_share < 0.5 else "CPU-bound"
    lines.append(f"workers use {core_share:.0%} of a core each: {kind}")
    lines.append(
        f"passive estimate: workers needed ≈ {how} × {margin:g} → "
        + (f"{needed}" if needed <= limit else f"more than the cap of {limit}")
    )
    if chosen <= n_now:
        result["verdict"] = (
            f"input-bound: the training waits for data {wait_fraction:.0%} of the time and no more workers fit "
            f"(cap {limit}); make each batch cheaper, or run the active benchmark (--yes)"
        )
        return
    kwargs.update(num_workers=chosen, prefetch_factor=DEFAULT_PREFETCH, persistent_workers=True)
    result["verdict"] = (
        f"input-bound: the training waits for data {wait_fraction:.0%} of the time; set num_workers={chosen} "
        f"(now {n_now}); the active benchmark (--yes) measures it"
    )


def recommend_offline(
    *,
    current: dict[str, Any],
    configs: Sequence[dict[str, Any]],
    cap: Optional[int] = None,
    within: float = 0.9,
    reason: Optional[str] = None,
) -> dict[str, Any]:
    """Advice without a training job (``--loader``): the fewest workers within 10% of the best rate seen.

    There is no step time to compare with, so the loader cannot be called a bottleneck or not; the
    lines say what each producer costs so the user can divide by their own step time.
    """
    n_now = int(current.get("num_workers") or 0)
    kwargs: dict[str, Any] = {"num_workers": n_now, "pin_memory": bool(current.get("pin_memory"))}
    lines: list[str] = []
    rated = [c for c in configs if c.get("batches_per_s")]
    result: dict[str, Any] = {
        "kwargs": kwargs,
        "bottleneck": None,
        "lines": lines,
        "workers_needed": None,
        "worker_cap": cap,
        "verdict": reason or "no configuration produced a batch; nothing to advise",
    }
    if not rated:
        return result
    best = max(rated, key=lambda c: c["batches_per_s"])
    enough = min(
        (c for c in rated if c["batches_per_s"] >= best["batches_per_s"] * within),
        key=lambda c: (c["num_workers"], c.get("prefetch_factor") or 0),
    )
    base = _best_rate(rated, n_now)
    if base:
        prep_s = prep_time_from_rate(n_now, base["batches_per_s"])
        lines.append(
            f"prep time per batch = max(1, {n_now}) ÷ {base['batches_per_s']:.2f} batches/s = {_fmt_s(prep_s)}; "
            f"workers needed ≈ {_fmt_s(prep_s)} ÷ your step time × {MARGIN:g}"
        )
    lines.append(f"best: num_workers={best['num_workers']} at {best['batches_per_s']:.1f} batches/s")
    kwargs["num_workers"] = enough["num_workers"]
    if enough["num_workers"] > 0:
        kwargs["prefetch_factor"] = enough.get("prefetch_factor") or DEFAULT_PREFETCH
        kwargs["persistent_workers"] = True
    result["verdict"] = (
        f"the loader alone makes {enough['batches_per_s']:.1f} batches/s with num_workers={enough['num_workers']} "
        f"(within {1 - within:.0%} of the best, {best['batches_per_s']:.1f}); compare with 1 ÷ your step time"
    )
    return result


def format_kwargs(kwargs: dict[str, Any]) -> str:
    """``DataLoader(..., num_workers=6, prefetch_factor=2, persistent_workers=True, pin_memory=True)``."""
    inner = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
    return f"DataLoader(..., {inner})"

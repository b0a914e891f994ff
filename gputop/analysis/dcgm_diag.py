"""DCGM's own diagnostics (`dcgmi diag -r 1|2 -j`) as lines of `gputop check`: run on request, never reimplemented.

`gputop check --dcgm [1|2]` runs NVIDIA's qualification tests where DCGM is installed (`collect/dcgm.py` runs
`dcgmi`; the host engine running, or dcgmi's embedded one) and folds each test's result into the check: one line
per test, its worst per-GPU status as the line's (FAIL fails the check, WARN warns, SKIP says why), naming the
GPUs that did not pass.  Where dcgmi is not on PATH, one SKIP line says how to get it.

The JSON read here is the one `dcgmi diag -j` prints in DCGM 2.x/3.x (DCGM's nvvs `JsonOutput.cpp`, the format
its comment documents):

    {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment|Hardware|Integration|Performance|...",
        "tests": [{"name": "PCIe", "results": [{"gpu_ids": "3", "status": "Fail",
                                                "warnings": [{"warning": "...", "error_id": 25}], "info": ["..."]}]}]}],
        "version": "3.3.5"}}

Statuses are "Pass"/"Fail"/"Warn"/"Skip" (newer builds print them upper case); a deployment test has one result
whose gpu_ids is a comma-separated list; a warning is a string or an object with "warning".  DCGM 4 moved
`tests` to the top of the document; a document with `tests` beside or instead of `test_categories` is read the
same way.  dcgmi may print a line of text before the JSON (a deprecation warning): only the braces are parsed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from gputop.model import CheckResult

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
LEVELS = (1, 2)
# How long each level may run: -r 1 takes seconds, -r 2 about two minutes (PCIe bandwidth, GPU memory).
TIMEOUT_S = {1: 300.0, 2: 900.0}
ABOUT = {1: "seconds", 2: "about 2 minutes"}
GET_DCGM = (
    "install NVIDIA DCGM (the datacenter-gpu-manager package from NVIDIA's CUDA repository, "
    "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/getting-started.html), then "
    "`gputop check --dcgm` runs its diagnostics"
)
_STATUS = {"pass": PASS, "fail": FAIL, "warn": WARN, "warning": WARN, "skip": SKIP, "skipped": SKIP}
_ORDER = {FAIL: 3, WARN: 2, PASS: 1, SKIP: 0}


@dataclass(frozen=True)
class DcgmRun:
    """What running `dcgmi diag` gave: its output, or why it did not run (`missing`)."""

    level: int
    missing: Optional[str] = None  # why dcgmi did not run (not on PATH, timed out, could not start)
    stdout: str = ""
    stderr: str = ""
    returncode: Optional[int] = None


@dataclass(frozen=True)
class DiagResult:
    gpus: tuple[int, ...]  # the GPUs this result is for (a deployment test: all of them)
    status: str  # PASS / WARN / FAIL / SKIP
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiagTest:
    category: str
    name: str
    results: tuple[DiagResult, ...]

    @property
    def status(self) -> str:
        return max((r.status for r in self.results), key=_ORDER.__getitem__, default=SKIP)


def _json_of(text: str) -> Optional[dict[str, Any]]:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        data = json.loads(text[start : end + 1])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _gpu_ids(value: object) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(value if value is not None else "")))


def _warnings(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value] if value else []
    out = []
    for item in items:
        text = item.get("warning") or item.get("message") if isinstance(item, dict) else item
        if text:
            out.append(str(text).strip())
    return tuple(out)


def _result(raw: object) -> Optional[DiagResult]:
    if not isinstance(raw, dict):
        return None  # (DCGM's arrays hold null where a GPU was not part of the run)
    status = _STATUS.get(str(raw.get("status", "")).strip().lower())
    if status is None:
        return None
    gpus = _gpu_ids(raw.get("gpu_ids", raw.get("gpu_id", raw.get("entity_id"))))
    return DiagResult(gpus, status, _warnings(raw.get("warnings")))


def _test(category: str, raw: object) -> Optional[DiagTest]:
    if not isinstance(raw, dict) or not raw.get("name"):
        return None
    results = tuple(r for r in map(_result, raw.get("results") or ()) if r is not None)
    return DiagTest(str(raw.get("category", category)), str(raw["name"]), results) if results else None


def parse_diag(text: str) -> Optional[list[DiagTest]]:
    """The tests of a `dcgmi diag -j` document, in its order; None where the text holds no such document."""
    data = _json_of(text)
    if data is None:
        return None
    root = next((data[k] for k in ("DCGM GPU Diagnostic", "DCGM Diagnostic") if isinstance(data.get(k), dict)), data)
    found: list[DiagTest] = []
    for category in root.get("test_categories") or ():
        if isinstance(category, dict):
            found += [t for raw in category.get("tests") or () if (t := _test(str(category.get("category", "")), raw))]
    found += [t for raw in root.get("tests") or () if (t := _test("", raw))]
    return found if found or "test_categories" in root or "tests" in root else None


def _gpu_text(gpus: tuple[int, ...]) -> str:
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(map(str, gpus))


def _line(level: int, test: DiagTest) -> CheckResult:
    status = test.status
    title = f"DCGM diag -r {level}: {test.name}" + (f" ({test.category})" if test.category else "")
    expected = "Pass on every GPU (NVIDIA's diagnostic)"
    off = [r for r in test.results if r.status != PASS]
    every = sorted({g for r in test.results for g in r.gpus})
    if status == PASS or not off:
        return CheckResult(f"dcgm.{_slug(test.name)}", title, status, f"Pass on {_gpu_text(tuple(every))}", expected)
    parts = []
    for r in sorted(off, key=lambda r: -_ORDER[r.status]):
        said = "; ".join(r.warnings[:3]) if r.warnings else ""
        parts.append(f"{_gpu_text(r.gpus)}: {r.status.capitalize()}" + (f" ({said})" if said else ""))
    gpus = tuple(sorted({g for r in off if r.status in (FAIL, WARN) for g in r.gpus}))
    evidence = tuple(w for r in off for w in r.warnings)
    return CheckResult(f"dcgm.{_slug(test.name)}", title, status, "; ".join(parts), expected, gpus=gpus, evidence=evidence)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def dcgm_results(run: DcgmRun) -> list[CheckResult]:
    """One line per test of the run (each its own status); one SKIP line where DCGM did not run or said nothing
    readable: how to get it, or what dcgmi said."""
    title = f"DCGM diagnostics (dcgmi diag -r {run.level})"
    expected = "NVIDIA's diagnostic passes on every GPU"
    if run.missing is not None:
        advice = GET_DCGM if "not on PATH" in run.missing else "run `dcgmi diag -r N` by hand to see why"
        return [CheckResult("dcgm", title, SKIP, f"not run: {run.missing}; {advice}", expected)]
    tests = parse_diag(run.stdout)
    if not tests:
        said = " ".join((run.stderr or run.stdout).split())[:300] or f"exit status {run.returncode}, no output"
        hint = (
            " (is the host engine running? `sudo systemctl start nvidia-dcgm`, or `nv-hostengine`)"
            if "connect" in said.lower() or "host engine" in said.lower()
            else ""
        )
        return [CheckResult("dcgm", title, SKIP, f"no diagnostic results from dcgmi: {said}{hint}", expected)]
    return [_line(run.level, test) for test in tests]

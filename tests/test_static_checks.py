"""The lint every change passes (issue 22): `ruff check` over the package, the tests, the benchmarks and the
scripts, with the rules in pyproject.toml.  A failure prints ruff's own report: fix it, or `ruff check --fix`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def ruff() -> list[str]:
    beside = Path(sys.executable).parent / "ruff"  # installed with the test extra, next to this Python
    if beside.exists():
        return [str(beside)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: `pip install -e '.[test]'` installs it")
    return [found]


def test_ruff_check_passes():
    result = subprocess.run(
        [*ruff(), "check", "--no-cache", "gputop", "tests", "benchmarks", "scripts"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied():
    result = subprocess.run(
        [*ruff(), "format", "--check", "--no-cache", "gputop", "tests", "benchmarks", "scripts"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, "run `ruff format gputop tests benchmarks scripts`:\n" + result.stdout + result.stderr

"""The static checks every change passes (issue 22): `ruff check` and `ruff format` over the package, the tests,
the benchmarks and the scripts, and `mypy --strict` over the whole package, with the settings in pyproject.toml
(which say strict too, so a plain `mypy` run is the same check).  A failure prints the tool's own report: fix what it names
(`ruff check --fix` and `ruff format` fix most lint and layout by themselves)."""

from __future__ import annotations

import importlib.util
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


def test_mypy_passes():
    """Zero `mypy --strict` errors in the package (issue 39).  mypy runs on this Python (it is in the test extra), so it sees the
    libraries installed here.  Its cache is the repository's `.mypy_cache` (git-ignored), as a plain `mypy`
    run's: mypy checks a cached module again whenever it or what it imports changed, so a warm run (~2 s
    instead of ~13 s cold on the 2-core box) gives the same answer; a clean clone starts cold."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: `pip install -e '.[test]'` installs it")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--strict"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, "run `mypy --strict` from the repository root:\n" + result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found"), result.stdout + result.stderr

"""Running DCGM's diagnostics for `gputop check --dcgm` (what their output means: `analysis/dcgm_diag.py`)."""

from __future__ import annotations

import shutil
import subprocess

from gputop.analysis.dcgm_diag import TIMEOUT_S, DcgmRun


def collect_dcgm(level: int) -> DcgmRun:
    """Run `dcgmi diag -r LEVEL -j` (a child of this process, waited for; killed at its timeout)."""
    exe = shutil.which("dcgmi")
    if exe is None:
        return DcgmRun(level, missing="dcgmi is not on PATH")
    try:
        proc = subprocess.run(
            [exe, "diag", "-r", str(level), "-j"], capture_output=True, text=True, timeout=TIMEOUT_S[level], check=False
        )
    except subprocess.TimeoutExpired:
        return DcgmRun(level, missing=f"dcgmi diag -r {level} ran past {TIMEOUT_S[level]:.0f} s and was stopped")
    except OSError as exc:
        return DcgmRun(level, missing=f"dcgmi could not start ({exc.strerror or exc})")
    return DcgmRun(level, stdout=proc.stdout, stderr=proc.stderr, returncode=proc.returncode)

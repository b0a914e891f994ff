"""A pynvml library someone else set up before gputop (a shim, another tool's test double, a site hook)
is used as it is; only a fake gputop itself installed is ever taken out again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from gputop.collect.gpu import GpuCollector, use_nvml_library
from gputop.sim.fake_nvml import FakeNvmlLibrary
from gputop.sim.spec import parse_spec
from gputop.sim.synthetic import SyntheticLoad

REPO = Path(__file__).resolve().parent.parent

# What a site hook of another tool does: put its own library below pynvml before anything else runs.
SITE_HOOK = """
import pynvml
from gputop.sim.fake_nvml import FakeNvmlLibrary
from gputop.sim.spec import parse_spec
from gputop.sim.synthetic import SyntheticLoad
spec = parse_spec("rtx-4090-2")
pynvml.nvmlLib = FakeNvmlLibrary(spec, SyntheticLoad(spec.profile.gpu_count, spec.profile.gpu.memory_total))
"""


def _foreign_library(spec: str = "rtx-4090-2") -> FakeNvmlLibrary:
    parsed = parse_spec(spec)
    return FakeNvmlLibrary(parsed, SyntheticLoad(parsed.profile.gpu_count, parsed.profile.gpu.memory_total))


def test_a_library_someone_else_installed_is_read_not_unloaded():
    foreign = _foreign_library()
    with pynvml.libLoadLock:  # as a shim would: straight into pynvml, not through gputop
        pynvml.nvmlLib = foreign
        pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        collector = GpuCollector()
        try:
            samples = collector.sample()
            assert [s.name for s in samples] == ["NVIDIA GeForce RTX 4090"] * 2
            assert pynvml.nvmlLib is foreign
        finally:
            collector.close()
        assert pynvml.nvmlLib is foreign  # still theirs after gputop closed
    finally:
        use_nvml_library(None)


def test_a_fake_gputop_left_behind_is_taken_out():
    use_nvml_library(_foreign_library())  # a simulation in this process, through gputop
    try:
        with pytest.raises(Exception):  # no driver here: the real library is tried, and fails
            GpuCollector()
        assert pynvml.nvmlLib is None
    finally:
        use_nvml_library(None)


@pytest.mark.slow
def test_snapshot_json_reads_the_gpus_through_a_preinstalled_shim(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITE_HOOK)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    done = subprocess.run(
        [sys.executable, "-m", "gputop", "snapshot", "--json"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    snapshot = json.loads(done.stdout)
    assert [g["name"] for g in snapshot["gpus"]] == ["NVIDIA GeForce RTX 4090"] * 2, snapshot.get("machine")

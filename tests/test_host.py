"""Host collector: real psutil readings on this machine, sysfs parsing on hand-made trees."""

from __future__ import annotations

import os

import psutil
import pytest

from gputop.collect.host import (
    HostCollector,
    numa_layout_from_affinity,
    parse_cpu_list,
    read_core_numa,
    read_cpu_model,
)
from tests.harness.processes import wait_until


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]
    assert parse_cpu_list("") == []


def test_core_numa_from_sysfs(tmp_path):
    for node, cpus in ((0, "0-1,4"), (1, "2-3,5")):
        d = tmp_path / f"node{node}"
        d.mkdir()
        (d / "cpulist").write_text(cpus + "\n")
    assert read_core_numa(6, str(tmp_path / "node*" / "cpulist")) == (0, 0, 1, 1, 0, 1)
    # no sysfs (containers, non-NUMA kernels): everything on node 0
    assert read_core_numa(3, str(tmp_path / "missing*" / "cpulist")) == (0, 0, 0)


def test_cpu_model(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
    assert read_cpu_model(str(info)) == "Intel(R) Xeon(R) Platinum 8480+"
    assert read_cpu_model(str(tmp_path / "absent")) != ""


def test_numa_layout_from_gpu_affinity():
    assert numa_layout_from_affinity(4, ("0-1", "0-1", "2-3"), (0, 0, 1)) == (0, 0, 1, 1)
    assert numa_layout_from_affinity(2, (None,), (None,)) == (0, 0)


def test_sample_matches_psutil():
    host = HostCollector()
    sample = host.sample()
    assert len(sample.cpu_percent) == psutil.cpu_count() == host.cpu_count
    assert all(0.0 <= p <= 100.0 for p in sample.cpu_percent)
    assert len(sample.core_numa) == len(sample.cpu_percent)
    assert sample.memory_total == psutil.virtual_memory().total
    assert 0 < sample.memory_used < sample.memory_total
    assert 0 < sample.memory_available <= sample.memory_total
    assert sample.swap_total == psutil.swap_memory().total
    assert sample.load_average == pytest.approx(os.getloadavg(), abs=1.0)
    assert sample.iowait_percent is not None and 0.0 <= sample.iowait_percent <= 100.0
    assert sample.steal_percent is not None and 0.0 <= sample.steal_percent <= 100.0
    assert host.cpu_model


def test_a_busy_core_shows_busy(spawn):
    """A child spinning on core 0 must drive core 0's reading up (the collector's deltas are real)."""
    busy = spawn.python("import os\nos.sched_setaffinity(0, {0})\nwhile True: pass\n")
    host = HostCollector()

    def core0_busy():
        assert busy.poll() is None, "busy child died"
        return host.sample().cpu_percent[0] > 80.0

    wait_until(core0_busy, timeout=20, interval=0.5, what="core 0 above 80%")


def _times(**fields: float):
    """A psutil-shaped per-core reading (Linux's fields)."""
    from collections import namedtuple

    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
    return namedtuple("scputimes", names)(**{name: fields.get(name, 0.0) for name in names})


def test_iowait_and_steal_are_the_cores_deltas_summed(monkeypatch):
    """One read of /proc/stat a poll: the machine's iowait and steal come from the per-core lines, whose sum is
    the file's first line."""
    readings = iter(
        [
            [_times(user=10, idle=90), _times(user=10, idle=90)],
            # core 0: 30 s of 100 in iowait; core 1: 10 s stolen, 40 s busy
            [_times(user=20, idle=150, iowait=30), _times(user=50, idle=140, steal=10)],
        ]
    )
    monkeypatch.setattr(psutil, "cpu_times", lambda percpu=False: next(readings))
    host = HostCollector()
    sample = host.sample()
    # as psutil counts: iowait is idle, steal is busy (the core was taken from the guest)
    assert sample.cpu_percent == pytest.approx((10.0, 50.0))
    assert sample.iowait_percent == pytest.approx(30 / 200 * 100)
    assert sample.steal_percent == pytest.approx(10 / 200 * 100)


def test_swap_is_read_once_per_cadence(monkeypatch):
    from gputop.collect.host import SWAP_EVERY_S
    from gputop.sim.fake_nvml import ManualClock

    clock = ManualClock(100.0)
    reads = []
    real_swap = psutil.swap_memory

    def counting_swap():
        reads.append(clock())
        return real_swap()

    monkeypatch.setattr(psutil, "swap_memory", counting_swap)
    host = HostCollector(clock=clock)
    for _ in range(int(SWAP_EVERY_S) * 2 + 1):  # a poll a second
        sample = host.sample()
        clock.advance(1.0)
    assert reads == [100.0, 100.0 + SWAP_EVERY_S, 100.0 + 2 * SWAP_EVERY_S]
    assert sample.swap_total == real_swap().total

"""The simulated machine's /sys, /proc and kernel log: a small tree of files the real readers read.

`FakeHostTree` writes what `gputop.collect.sysfs.HostReader` looks for under a private temporary
root: each GPU's PCI device with its AER counters, one NIC per GPU on the GPU's NUMA node (as a DGX
wires them), the nvidia module's version, the kernel release, the boot time and a kernel log.  The
INFRA_FAULTS change it: `aer=IDX` makes GPU IDX's correctable AER counter climb, `kernel-xid=IDX:CODE`
puts an `NVRM: Xid` line in the log.

`read()` rewrites the counters for the time now (on the fake NVML library's clock, so the AER counter
and the NVML counters share one timeline) and then reads the tree with the real reader.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from gputop.collect.sysfs import HostReader, sysfs_bus_id, xid_bus_id
from gputop.model import HostReadings
from gputop.sim.profiles import SimSpec

KERNEL_RELEASE = "6.8.0-49-generic"
UPTIME_S = 86400.0  # the simulated machine booted a day before the check
_XID_TEXTS = {79: "GPU has fallen off the bus.", 48: "An uncorrectable double bit error (DBE) has been detected on GPU."}


class FakeHostTree:
    def __init__(self, spec: SimSpec, elapsed: Callable[[], float]) -> None:
        self.spec = spec
        self.elapsed = elapsed
        self.root = Path(tempfile.mkdtemp(prefix="gputop-sim-host-"))
        self.boot = time.time() - UPTIME_S
        self._reader = HostReader(self.root, use_dmesg=False)
        self._write_static()

    def _write(self, relative: str, text: str) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def _write_static(self) -> None:
        profile = self.spec.profile
        self._write("proc/sys/kernel/osrelease", KERNEL_RELEASE + "\n")
        self._write("proc/sys/kernel/dmesg_restrict", "0\n")
        self._write("proc/stat", f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {int(self.boot)}\n")
        self._write("sys/module/nvidia/version", profile.driver_version + "\n")
        for gpu, bus in enumerate(profile.bus_ids):
            self._write(f"sys/bus/pci/devices/{sysfs_bus_id(bus)}/numa_node", f"{profile.numa_nodes[gpu]}\n")
            # one NIC per GPU on the GPU's NUMA node (a data-centre card's RDMA NIC; a desktop's one NIC)
            if profile.gpu.ecc or gpu == 0:
                name = f"ib{gpu}" if profile.gpu.ecc else "eth0"
                self._write(f"sys/class/net/{name}/device/numa_node", f"{profile.numa_nodes[gpu]}\n")
        self._write_counters()
        since_boot_us = int((time.time() - self.boot) * 1e6)  # the XIDs happened just now
        records = [f"6,1,0,-;Linux version {KERNEL_RELEASE} (simulated by gputop)"]
        for seq, (gpu, code) in enumerate(self.spec.faults.infra.kernel_xids, start=2):
            text = _XID_TEXTS.get(code, "simulated error.")
            records.append(
                f"3,{seq},{since_boot_us},-;NVRM: Xid (PCI:{xid_bus_id(profile.bus_ids[gpu])}): {code}, "
                f"pid='<unknown>', name=<unknown>, {text}"
            )
        self._write("dev/kmsg", "\n".join(records) + "\n")

    def _write_counters(self) -> None:
        aer = self.spec.faults.infra.aer
        corrected = int(5 + 10 * max(0.0, self.elapsed()))  # climbing: a link retrying on a marginal signal
        for gpu, bus in enumerate(self.spec.profile.bus_ids):
            device = f"sys/bus/pci/devices/{sysfs_bus_id(bus)}"
            bad = corrected if gpu in aer else 0
            self._write(f"{device}/aer_dev_correctable", _aer_text(
                ("RxErr", bad - bad // 4), ("BadTLP", bad // 4), ("BadDLLP", 0), ("Rollover", 0), ("Timeout", 0),
                ("NonFatalErr", 0), ("CorrIntErr", 0), ("HeaderOF", 0), ("TOTAL_ERR_COR", bad)))
            self._write(f"{device}/aer_dev_nonfatal", _aer_text(
                ("Undefined", 0), ("DLP", 0), ("SDES", 0), ("TLP", 0), ("FCP", 0), ("CmpltTO", 0), ("CmpltAbrt", 0),
                ("UnxCmplt", 0), ("RxOF", 0), ("MalfTLP", 0), ("ECRC", 0), ("UnsupReq", 0), ("ACSViol", 0),
                ("TOTAL_ERR_NONFATAL", 0)))
            self._write(f"{device}/aer_dev_fatal", _aer_text(
                ("Undefined", 0), ("DLP", 0), ("SDES", 0), ("TLP", 0), ("FCP", 0), ("CmpltTO", 0), ("CmpltAbrt", 0),
                ("UnxCmplt", 0), ("RxOF", 0), ("MalfTLP", 0), ("ECRC", 0), ("UnsupReq", 0), ("ACSViol", 0),
                ("TOTAL_ERR_FATAL", 0)))

    def read(self, gpu_bus_ids: Iterable[str]) -> HostReadings:
        self._write_counters()
        return self._reader.read(gpu_bus_ids)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _aer_text(*counters: tuple[str, int]) -> str:
    return "".join(f"{name} {value}\n" for name, value in counters)

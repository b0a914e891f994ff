"""The simulated machine's /sys, /proc and kernel log: a small tree of files the real readers read.

The PCI tree holds each GPU and the profile's NICs where a DGX or a desktop has them (`Profile.nics`: on
the GPU's own PCIe switch, or on a root port).  `nic_topology` writes it once per profile and process and
reads the NICs' place with the real reader, for the pipeline's `MachineInfo.topology`.

`FakeHostTree` (`gputop check`) writes what `gputop.collect.sysfs.HostReader` reads under a private
temporary root: the PCI tree with each GPU's AER counters, the nvidia module's version, the kernel
release, the boot time and a kernel log.  The INFRA_FAULTS change it: `aer=IDX` makes GPU IDX's
correctable AER counter climb, `kernel-xid=IDX:CODE` puts an `NVRM: Xid` line in the log.

`read()` rewrites the counters for the time now (on the fake NVML library's clock, so the AER counter
and the NVML counters share one timeline) and then reads the tree with the real reader.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from gputop.collect.sysfs import HostReader, sysfs_bus_id, xid_bus_id
from gputop.model import HostReadings, Topology
from gputop.sim.profiles import Profile, SimNic, SimSpec, bus_number

KERNEL_RELEASE = "6.8.0-49-generic"
UPTIME_S = 86400.0  # the simulated machine booted a day before the check
_XID_TEXTS = {79: "GPU has fallen off the bus.", 48: "An uncorrectable double bit error (DBE) has been detected on GPU."}


def _memory_backed_tmp() -> Optional[str]:
    """/dev/shm where it can be written (tmpfs, in memory as the real /sys is), else the usual temp folder.

    Folders and files cost far more on a disk-backed /tmp: the PCI tree written and removed by every
    simulated start (nic_topology) took 130-140 ms of CPU there on the development box, before the TUI's
    first frame, and 5 ms on tmpfs."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class _PciTree:
    """The GPUs and NICs on the PCI tree a profile describes, written under `root` as the kernel lays it out.

    `same_node_ancestor` NODE (a DGX): each GPU behind a PCIe switch of its own on a host bridge of its own,
    its rail NIC on the same switch; PHB (a desktop): the GPUs on root ports of one host bridge.  A NIC beside
    no GPU takes a root port of its own."""

    def __init__(self, root: Path, profile: Profile) -> None:
        self.root = root
        beside = {nic.beside_gpu: nic for nic in profile.nics if nic.beside_gpu is not None}
        desktop_bridge = "pci0000:00"
        for gpu, bus_id in enumerate(profile.bus_ids):
            bus, node, nic = bus_number(bus_id), profile.numa_nodes[gpu], beside.get(gpu)
            if profile.same_node_ancestor == "NODE":
                bridge, port, up = f"pci0000:{bus - 3:02x}", f"0000:{bus - 3:02x}:01.0", f"0000:{bus - 2:02x}:00.0"
                self._device(bridge, (port, up, f"0000:{bus - 1:02x}:00.0", sysfs_bus_id(bus_id)), node)
                if nic is not None:
                    self._nic(nic, self._device(bridge, (port, up, f"0000:{bus - 1:02x}:01.0", nic.bus_id), node))
            else:
                self._device(desktop_bridge, (f"0000:00:{1 + 2 * gpu:02x}.1", sysfs_bus_id(bus_id)), node)
        for n, nic in enumerate(nic for nic in profile.nics if nic.beside_gpu is None):
            self._nic(nic, self._device(desktop_bridge, (f"0000:00:1c.{n}", nic.bus_id), nic.numa_node))

    def _device(self, bridge: str, chain: tuple[str, ...], numa_node: int) -> str:
        """A PCI function at the end of `chain` (root port, switch ports, function) under host bridge `bridge`:
        the device under /sys/devices, a link to it under /sys/bus/pci/devices."""
        relative = "/".join(("sys/devices", bridge, *chain))
        _write(self.root, f"{relative}/numa_node", f"{numa_node}\n")  # the bridges' own are not read
        link = self.root / "sys/bus/pci/devices" / chain[-1]
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../../..", *relative.split("/")[1:]))
        return relative

    def _class_link(self, cls: str, name: str, device: str) -> None:
        """/sys/class/CLS/NAME/device -> the PCI function (what readers resolve with realpath)."""
        folder = self.root / "sys/class" / cls / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "device").symlink_to(Path("../../..", *device.split("/")[1:]))

    def _nic(self, nic: SimNic, device: str) -> None:
        if nic.rdma:
            self._class_link("infiniband", nic.name, device)
            if nic.netdev:
                self._class_link("net", nic.netdev, device)
        else:
            self._class_link("net", nic.name, device)


@functools.lru_cache(maxsize=8)
def nic_topology(profile: Profile, topology: Topology, gpu_bus_ids: tuple[Optional[str], ...]) -> Topology:
    """`topology` with the simulated machine's NICs, read by the real reader from the profile's PCI tree.

    Once per profile and process: the tree is the same every time, and writing and removing its ~80
    folders costs tens of milliseconds, which every simulated start (the TUI's first frame, each test's
    pipeline) would pay."""
    root = Path(tempfile.mkdtemp(prefix="gputop-sim-pci-", dir=_memory_backed_tmp()))
    try:
        _PciTree(root, profile)
        return HostReader(root, use_dmesg=False).nic_topology(topology, gpu_bus_ids)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class FakeHostTree:
    def __init__(self, spec: SimSpec, elapsed: Callable[[], float]) -> None:
        self.spec = spec
        self.elapsed = elapsed
        self.root = Path(tempfile.mkdtemp(prefix="gputop-sim-host-", dir=_memory_backed_tmp()))
        self.boot = time.time() - UPTIME_S
        self._reader = HostReader(self.root, use_dmesg=False)
        _PciTree(self.root, spec.profile)
        self._write_static()

    def _write(self, relative: str, text: str) -> None:
        _write(self.root, relative, text)

    def _write_static(self) -> None:
        profile = self.spec.profile
        self._write("proc/sys/kernel/osrelease", KERNEL_RELEASE + "\n")
        self._write("proc/sys/kernel/dmesg_restrict", "0\n")
        self._write("proc/stat", f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {int(self.boot)}\n")
        self._write("sys/module/nvidia/version", profile.driver_version + "\n")
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
            self._write(
                f"{device}/aer_dev_correctable",
                _aer_text(
                    ("RxErr", bad - bad // 4),
                    ("BadTLP", bad // 4),
                    ("BadDLLP", 0),
                    ("Rollover", 0),
                    ("Timeout", 0),
                    ("NonFatalErr", 0),
                    ("CorrIntErr", 0),
                    ("HeaderOF", 0),
                    ("TOTAL_ERR_COR", bad),
                ),
            )
            self._write(
                f"{device}/aer_dev_nonfatal",
                _aer_text(
                    ("Undefined", 0),
                    ("DLP", 0),
                    ("SDES", 0),
                    ("TLP", 0),
                    ("FCP", 0),
                    ("CmpltTO", 0),
                    ("CmpltAbrt", 0),
                    ("UnxCmplt", 0),
                    ("RxOF", 0),
                    ("MalfTLP", 0),
                    ("ECRC", 0),
                    ("UnsupReq", 0),
                    ("ACSViol", 0),
                    ("TOTAL_ERR_NONFATAL", 0),
                ),
            )
            self._write(
                f"{device}/aer_dev_fatal",
                _aer_text(
                    ("Undefined", 0),
                    ("DLP", 0),
                    ("SDES", 0),
                    ("TLP", 0),
                    ("FCP", 0),
                    ("CmpltTO", 0),
                    ("CmpltAbrt", 0),
                    ("UnxCmplt", 0),
                    ("RxOF", 0),
                    ("MalfTLP", 0),
                    ("ECRC", 0),
                    ("UnsupReq", 0),
                    ("ACSViol", 0),
                    ("TOTAL_ERR_FATAL", 0),
                ),
            )

    def read(self, gpu_bus_ids: Iterable[str]) -> HostReadings:
        self._write_counters()
        return self._reader.read(gpu_bus_ids)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _aer_text(*counters: tuple[str, int]) -> str:
    return "".join(f"{name} {value}\n" for name, value in counters)

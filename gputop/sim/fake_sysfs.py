"""The simulated machine's /sys, /proc and kernel log: a small tree of files the real readers read.

The PCI tree holds each GPU and the profile's NICs where a DGX or a desktop has them (`Profile.nics`: on
the GPU's own PCIe switch, or on a root port).  `nic_topology` writes it once per profile and process and
reads the NICs' place with the real reader, for the pipeline's `MachineInfo.topology`.

`FakeHostTree` (`gputop check`) writes what `gputop.collect.sysfs.HostReader` reads under a private
temporary root: the PCI tree with each GPU's AER counters, the nvidia module's version, the kernel
release, the boot time and a kernel log.  The INFRA_FAULTS change it: `aer=IDX` makes GPU IDX's
correctable AER counter climb, `kernel-xid=IDX:CODE` puts an `NVRM: Xid` line in the log.

`FakeNicTree` (the pipeline's NIC samples) writes the same PCI tree and each NIC's port as
/sys/class/infiniband/DEV/ports/1 (an RDMA NIC) or /sys/class/net/DEV (Ethernet), healthy and carrying
traffic, or as the NIC faults say: `nic-down=DEV`, `nic-rate=DEV:GBPS`, `nic-errors=DEV`.

`read()` rewrites the counters for the time now (on the fake NVML library's clock, so the AER counter
and the NVML counters share one timeline) and then reads the tree with the real reader.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Callable, Iterable, Optional

import psutil

from gputop.analysis.xids import xid_bus_id
from gputop.collect.sysfs import IB_DATA_WORD_BYTES, IB_ERROR_COUNTERS, HostReader, NicReader
from gputop.model import HostReadings, NicPortSample, Topology, sysfs_bus_id
from gputop.sim.profiles import InfraFaults, Profile, SimNic, SimSpec, bus_number

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


TREE_PREFIX = "gputop-sim-"


def _private_tree(kind: str) -> Path:
    """A fresh folder for one simulated tree, named with this process's PID.

    A simulated pipeline killed before its close (SIGKILL, a test's timeout) cannot remove its tree, so each
    new one first removes this user's trees whose process is gone: none pile up in /dev/shm's memory."""
    base = _memory_backed_tmp() or tempfile.gettempdir()
    _remove_orphaned_trees(base)
    return Path(tempfile.mkdtemp(prefix=f"{TREE_PREFIX}{kind}-{os.getpid()}-", dir=base))


def _remove_orphaned_trees(base: str) -> None:
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(TREE_PREFIX):
            continue
        parts = entry.name[len(TREE_PREFIX) :].split("-")
        if len(parts) < 3 or not parts[1].isdigit():
            continue  # named before trees carried their PID
        try:
            if entry.stat(follow_symlinks=False).st_uid == os.getuid() and not psutil.pid_exists(int(parts[1])):
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue  # removed meanwhile by another process's sweep


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


# A simulated port carries this share of its rate each way (a training job's all-reduce between steps), and
# its counters start at an hour of it: counts since the driver loaded, as a machine in use shows them.
TRAFFIC_SHARE = 0.3
COUNTED_BEFORE_S = 3600.0
_IB_TRAFFIC = ("port_rcv_data", "port_xmit_data", "port_rcv_packets", "port_xmit_packets")
_IB_OTHER = ("port_xmit_wait", "unicast_rcv_packets", "unicast_xmit_packets", "multicast_rcv_packets", "multicast_xmit_packets")
# an mlx5 device's hw_counters (a subset of what mlx5_ib exposes: its error counters and some congestion ones)
_MLX5_HW = (
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_remote_access_errors",
    "resp_cqe_error",
    "resp_local_length_error",
    "rnr_nak_retry_err",
    "rp_cnp_handled",
    "rx_icrc_encapsulated",
)
_NET_STATS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_dropped", "tx_dropped", "multicast", "collisions")
_NET_ERRORS = ("rx_errors", "tx_errors", "rx_crc_errors", "rx_frame_errors", "rx_missed_errors", "tx_carrier_errors")
# the IBA's lane rates in Gb/s by generation: the rate file names the generation the port trained to
_IB_LANES = ((100.0, "NDR"), (50.0, "HDR"), (25.0, "EDR"), (14.0625, "FDR"), (10.0, "QDR"), (5.0, "DDR"), (2.5, "SDR"))


def _ib_rate_text(gbps: float) -> str:
    """400 -> "400 Gb/sec (4X NDR)", as the kernel writes ports/N/rate for a 4-lane port."""
    generation = next((name for lane, name in _IB_LANES if abs(4 * lane - gbps) < 0.01), None)
    return f"{gbps:g} Gb/sec" + (f" (4X {generation})" if generation else "")


class _SimPort:
    """One simulated NIC port's files: the state written once, the counters for a time."""

    def __init__(self, root: Path, nic: SimNic, faults: InfraFaults) -> None:
        self.root = root
        self.nic = nic
        self.down = nic.name in faults.nic_down
        self.errors = nic.name in faults.nic_errors
        self.gbps = dict(faults.nic_rate).get(nic.name, nic.rate_gbps)
        self.folder = f"sys/class/infiniband/{nic.name}/ports/1" if nic.rdma else f"sys/class/net/{nic.name}"
        self._fds: dict[str, int] = {}  # counter file -> a descriptor open for writing (write_counters)

    def write_state(self) -> None:
        if self.nic.rdma:
            state, phys = ("1: DOWN", "2: Polling") if self.down else ("4: ACTIVE", "5: LinkUp")
            files = {"state": state, "phys_state": phys, "rate": _ib_rate_text(self.gbps), "link_layer": "InfiniBand"}
            files.update({f"counters/{name}": "0" for name in (*IB_ERROR_COUNTERS, *_IB_TRAFFIC, *_IB_OTHER)})
            files.update({f"hw_counters/{name}": "0" for name in _MLX5_HW})
        else:
            files = {"operstate": "down" if self.down else "up", "speed": "-1" if self.down else str(int(self.gbps * 1000))}
            files.update({f"statistics/{name}": "0" for name in (*_NET_STATS, *_NET_ERRORS)})
        for name, text in files.items():
            _write(self.root, f"{self.folder}/{name}", text + "\n")

    def write_counters(self, elapsed: float) -> None:
        """The traffic counters `elapsed` seconds into the run (frozen at the start on a port that is down)
        and, with nic-errors, the error counters climbing.

        Only the counters `NicReader` reads each poll (the data counts) and the climbing error counters are
        rewritten: the packet counts stay as written at the start, since nothing reads them, and four files a
        port every second were a tenth of the simulated TUI's collector thread."""
        seconds = COUNTED_BEFORE_S + (0.0 if self.down else max(0.0, elapsed))
        nbytes = int(TRAFFIC_SHARE * self.gbps * 1e9 / 8 * seconds)
        values: dict[str, int]
        if self.nic.rdma:
            words = nbytes // IB_DATA_WORD_BYTES
            values = {"port_rcv_data": words, "port_xmit_data": words}
            if self.errors:
                values.update(
                    symbol_error=int(3 + 20 * elapsed), link_error_recovery=1 + int(elapsed / 2), port_rcv_errors=int(7 * elapsed)
                )
            folder = f"{self.folder}/counters"
        else:
            values = {"rx_bytes": nbytes, "tx_bytes": nbytes}
            if self.errors:
                values.update(rx_errors=int(7 * elapsed), rx_crc_errors=int(7 * elapsed))
            folder = f"{self.folder}/statistics"
        for name, value in values.items():
            fd = self._fds.get(name)
            if fd is None:  # held open: rewriting the same inode in place costs a tenth of an open() a file
                fd = self._fds[name] = os.open(f"{self.root}/{folder}/{name}", os.O_WRONLY)
            data = b"%d\n" % value
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class FakeNicTree:
    """The simulated machine's NIC ports under a private root (tmpfs), read each poll by the real
    `NicReader`: the pipeline's NIC samples.  The counters follow `elapsed` (the fake NVML library's clock)."""

    def __init__(self, spec: SimSpec, elapsed: Callable[[], float], clock: Callable[[], float] = time.time) -> None:
        self.elapsed = elapsed
        self.root = _private_tree("nic")
        # a pipeline dropped without its close (a process that just exits) still removes the tree at exit
        self._remove_tree = weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)
        self._ports: list[_SimPort] = []
        self._reader = NicReader(self.root, clock=clock)  # lists the ports on its first read, once they are written
        try:
            _PciTree(self.root, spec.profile)
            self._ports += [_SimPort(self.root, nic, spec.faults.infra) for nic in spec.profile.nics]
            for port in self._ports:
                port.write_state()
        except BaseException:
            self.close()
            raise

    @property
    def errors_every_s(self) -> float:
        return self._reader.errors_every_s

    @errors_every_s.setter
    def errors_every_s(self, seconds: float) -> None:
        self._reader.errors_every_s = seconds

    def read(self) -> Optional[tuple[NicPortSample, ...]]:
        elapsed = self.elapsed()
        for port in self._ports:
            port.write_counters(elapsed)
        return self._reader.read()

    def close(self) -> None:
        for port in self._ports:
            port.close()
        self._reader.close()  # its held descriptors, before the tree goes
        self._remove_tree()


@functools.lru_cache(maxsize=8)
def nic_topology(profile: Profile, topology: Topology, gpu_bus_ids: tuple[Optional[str], ...]) -> Topology:
    """`topology` with the simulated machine's NICs, read by the real reader from the profile's PCI tree.

    Once per profile and process: the tree is the same every time, and writing and removing its ~80
    folders costs tens of milliseconds, which every simulated start (the TUI's first frame, each test's
    pipeline) would pay."""
    root = _private_tree("pci")
    try:
        _PciTree(root, profile)
        return HostReader(root, use_dmesg=False).nic_topology(topology, gpu_bus_ids)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class FakeHostTree:
    def __init__(self, spec: SimSpec, elapsed: Callable[[], float], clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.elapsed = elapsed
        self.clock = clock  # the pipeline's wall clock: the kernel log's times and the readings' stamps
        self.root = _private_tree("host")
        self._remove_tree = weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)
        self.boot = clock() - UPTIME_S
        self._reader = HostReader(self.root, use_dmesg=False, clock=clock)
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
        since_boot_us = int((self.clock() - self.boot) * 1e6)  # the XIDs happened just now
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
                    *((name, 0) for name in _AER_UNCORRECTABLE),
                    ("TOTAL_ERR_NONFATAL", 0),
                ),
            )
            self._write(
                f"{device}/aer_dev_fatal",
                _aer_text(
                    *((name, 0) for name in _AER_UNCORRECTABLE),
                    ("TOTAL_ERR_FATAL", 0),
                ),
            )

    def read(self, gpu_bus_ids: Iterable[str]) -> HostReadings:
        self._write_counters()
        return self._reader.read(gpu_bus_ids)

    def close(self) -> None:
        self._remove_tree()


# the uncorrectable error kinds the kernel lists in aer_dev_nonfatal and aer_dev_fatal (the same in both)
_AER_UNCORRECTABLE = (
    "Undefined",
    "DLP",
    "SDES",
    "TLP",
    "FCP",
    "CmpltTO",
    "CmpltAbrt",
    "UnxCmplt",
    "RxOF",
    "MalfTLP",
    "ECRC",
    "UnsupReq",
    "ACSViol",
)


def _aer_text(*counters: tuple[str, int]) -> str:
    return "".join(f"{name} {value}\n" for name, value in counters)

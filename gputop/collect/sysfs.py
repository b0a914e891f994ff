"""What the kernel knows about the GPUs that NVML does not say: sysfs and the kernel log.

- AER counters (`aer_dev_correctable`, `aer_dev_fatal`, `aer_dev_nonfatal`) under each GPU's PCI
  device in /sys/bus/pci/devices/<bdf>/;
- every NIC backed by a PCI function (/sys/class/infiniband/*, /sys/class/net/*): its NUMA node and where
  its PCI path meets each GPU's, i.e. the NIC rows of `nvidia-smi topo -m` (read once, into the machine's
  `Topology`, by the pipeline);
- `NVRM: Xid` lines in the kernel log (/dev/kmsg, else `dmesg`): NVML's event path misses some codes
  (79, 119 and 120 are reported missing from DCGM's tracker) and keeps no history;
- the kernel release and the loaded nvidia module's version.

Every path hangs off one `root` ("/" on a real machine), so tests and the simulated machine point it at
a tree of fixture files.  Nothing here raises for a source it cannot read: the source is left None and
`HostReadings.unreadable` gets one line saying what and why (e.g. the kernel log under
`kernel.dmesg_restrict`).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence

from gputop.model import AerCounts, HostReadings, KernelXid, NicInfo, Topology

# The kernel log is read up to this much (a /dev/kmsg ring holds 128 KiB-16 MiB) and for at most this long.
KERNEL_LOG_MAX_BYTES = 32 * 1024 * 1024
KERNEL_LOG_MAX_S = 2.0
DMESG_TIMEOUT_S = 3.0

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\):\s*(\d+)")
_DMESG_TIME = re.compile(r"^\s*(?:<\d+>)?\[\s*(\d+(?:\.\d+)?)\]\s?(.*)$")
_AER_FILES = (
    ("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
    ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"),
)


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" -> sysfs's "0000:18:00.0"."""
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return nvml_bus_id.strip().lower()


def xid_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:5D:00.0" -> "0000:5d:00", the form `NVRM: Xid (PCI:...)` lines use."""
    return sysfs_bus_id(nvml_bus_id).rsplit(".", 1)[0]


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


class HostReader:
    """Reads `HostReadings` under `root`; `read()` may be called again (a check reads at start and end)."""

    def __init__(self, root: str | os.PathLike[str] = "/", *, use_dmesg: Optional[bool] = None) -> None:
        self.root = Path(root)
        # `dmesg` reads the running kernel's log whatever `root` says: only on the real root
        self.use_dmesg = (self.root == Path("/")) if use_dmesg is None else use_dmesg

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def read(self, gpu_bus_ids: Iterable[str]) -> HostReadings:
        unreadable: list[str] = []
        aer = self.read_aer(gpu_bus_ids, unreadable)
        xids, records = self.read_kernel_xids(unreadable)
        return HostReadings(
            timestamp=time.time(),
            kernel=self._first_line(self.path("proc", "sys", "kernel", "osrelease")),
            driver_module=self._first_line(self.path("sys", "module", "nvidia", "version")),
            aer=aer,
            kernel_xids=xids,
            kernel_log_records=records,
            unreadable=tuple(unreadable),
        )

    @staticmethod
    def _first_line(path: Path) -> Optional[str]:
        try:
            return path.read_text().strip().splitlines()[0].strip() or None
        except (OSError, IndexError, UnicodeDecodeError):
            return None

    # ------------------------------------------------------------ AER
    def read_aer(self, gpu_bus_ids: Iterable[str], unreadable: list[str]) -> dict[str, Optional[AerCounts]]:
        """GPU bus id -> its AER counters; None where the device exposes none (no AER support)."""
        out: dict[str, Optional[AerCounts]] = {}
        for bus_id in gpu_bus_ids:
            device = self.path("sys", "bus", "pci", "devices", sysfs_bus_id(bus_id))
            totals: dict[str, Optional[int]] = {}
            nonzero: dict[str, int] = {}
            for key, name, total_name in _AER_FILES:
                try:
                    text = (device / name).read_text()
                except FileNotFoundError:
                    totals[key] = None
                    continue
                except OSError as exc:
                    unreadable.append(f"AER counters {device / name}: {_reason(exc)}")
                    totals[key] = None
                    continue
                counters = _parse_counters(text)
                totals[key] = counters.pop(total_name, None)
                if totals[key] is None and counters:
                    totals[key] = sum(counters.values())  # kernels before 5.x print no TOTAL_ line
                nonzero.update({k: v for k, v in counters.items() if v})
            out[bus_id] = None if all(v is None for v in totals.values()) else AerCounts(**totals, nonzero=nonzero)
        return out

    # ------------------------------------------------------------ NICs
    def _nics(self, unreadable: list[str]) -> list[tuple[NicInfo, Optional[PciPath]]]:
        """Every NIC backed by a PCI function (virtual ones have no `device`), once per function: the RDMA
        device (/sys/class/infiniband, named as `nvidia-smi topo -m` names it) with its network interface, then
        the network interfaces that have no RDMA device; each with where it sits on the PCI tree."""
        found: dict[str, tuple[str, bool, Optional[str]]] = {}  # PCI function -> (name, rdma, netdev)
        for cls in ("infiniband", "net"):
            base = self.path("sys", "class", cls)
            try:
                names = sorted(os.listdir(base), key=_natural)
            except FileNotFoundError:
                continue
            except OSError as exc:
                unreadable.append(f"NICs {base}: {_reason(exc)}")
                continue
            for name in names:
                device = base / name / "device"
                if not device.exists():
                    continue  # lo, bridges, veth, ifb: no PCI function behind them
                function = _pci_function(os.path.realpath(device))
                if function not in found:
                    found[function] = (name, cls == "infiniband", None)
                elif cls == "net" and found[function][2] is None:
                    found[function] = (*found[function][:2], name)  # mlx5_0's netdev ibp25s0: one card
        out = []
        for function, (name, rdma, netdev) in found.items():
            node = _numa(self._first_line(Path(function) / "numa_node"))
            bus = os.path.basename(function)
            out.append(
                (
                    NicInfo(name=name, numa_node=node, pci_bus_id=bus if _BDF.fullmatch(bus) else None, rdma=rdma, netdev=netdev),
                    pci_path(function),
                )
            )
        return out

    def nic_topology(self, topology: Topology, gpu_bus_ids: Sequence[Optional[str]]) -> Topology:
        """`topology` with the NICs and their row of `nvidia-smi topo -m` (to each GPU, then to each NIC).

        Labels follow the PCI paths in sysfs as nvidia-smi's do: PIX when the two functions meet below one
        PCIe switch (at most one bridge under the deepest shared one), PXB deeper, PHB under one host bridge,
        else NODE on one NUMA node and SYS across nodes.  GPUs are found by their NVML bus ids."""
        unreadable: list[str] = []
        nics = self._nics(unreadable)
        if unreadable and not nics:
            return dataclasses.replace(topology, nics=None, nics_unreadable=tuple(unreadable))
        gpus = [
            (
                pci_path(self.path("sys", "bus", "pci", "devices", sysfs_bus_id(bus))) if bus else None,
                topology.numa_node[i] if i < len(topology.numa_node) else None,
            )
            for i, bus in enumerate(gpu_bus_ids)
        ]
        one_node = (
            len({node for _path, node in gpus if node is not None} | {n.numa_node for n, _ in nics if n.numa_node is not None})
            <= 1
        )
        ends = [(path, nic.numa_node) for nic, path in nics]
        matrix = tuple(tuple(link_label(a, node_a, b, node_b, one_node) for b, node_b in (*gpus, *ends)) for a, node_a in ends)
        return dataclasses.replace(
            topology, nics=tuple(nic for nic, _ in nics), nic_matrix=matrix, nics_unreadable=tuple(unreadable)
        )

    # ------------------------------------------------------------ kernel log
    def read_kernel_xids(self, unreadable: list[str]) -> tuple[Optional[tuple[KernelXid, ...]], int]:
        """(the XID lines in the kernel log, records read); (None, 0) with a line in `unreadable` if unreadable."""
        kmsg = self.path("dev", "kmsg")
        try:
            lines = self._read_kmsg(kmsg)
        except OSError as exc:
            why = f"{kmsg}: {_reason(exc)}"
            if exc.errno in (errno.EPERM, errno.EACCES):
                why += self._restrict_note()
            if exc.errno == errno.ENOENT and self.use_dmesg:
                dmesg = self._read_dmesg()
                if isinstance(dmesg, list):
                    return _xids_from_dmesg(dmesg, self._boot_time()), len(dmesg)
                why += f"; dmesg: {dmesg}"
            unreadable.append(f"kernel log (XIDs): {why}")
            return None, 0
        boot = self._boot_time()
        xids = []
        for line in lines:
            head, sep, message = line.partition(";")
            if not sep or "NVRM" not in message:
                continue
            fields = head.split(",")
            when = None
            if boot is not None and len(fields) >= 3 and fields[2].isdigit():
                when = boot + int(fields[2]) / 1e6
            xid = _xid(message, when)
            if xid is not None:
                xids.append(xid)
        return tuple(xids), len(lines)

    def _restrict_note(self) -> str:
        restrict = self._first_line(self.path("proc", "sys", "kernel", "dmesg_restrict"))
        if restrict == "1":
            return (
                " (kernel.dmesg_restrict = 1: reading it needs root or CAP_SYSLOG; "
                "ask an admin for `sudo dmesg -T | grep -i xid`)"
            )
        return ""

    @staticmethod
    def _read_kmsg(path: Path) -> list[str]:
        """Every record in the log without waiting for new ones.  /dev/kmsg hands out one record per read
        and says EAGAIN at the end; a fixture file is read to EOF."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + KERNEL_LOG_MAX_S
        try:
            while size < KERNEL_LOG_MAX_BYTES and time.monotonic() < deadline:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break  # no more records
                except OSError as exc:
                    if exc.errno == errno.EPIPE:
                        continue  # the record we were at was overwritten; the next read goes on
                    raise
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        text = b"".join(chunks).decode("utf-8", "replace")
        # continuation lines (" KEY=value" dictionaries) belong to the record above
        return [line for line in text.splitlines() if line and not line.startswith(" ")]

    def _read_dmesg(self) -> list[str] | str:
        exe = shutil.which("dmesg")
        if exe is None:
            return "not installed"
        try:
            done = subprocess.run([exe, "--kernel"], capture_output=True, text=True, timeout=DMESG_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{type(exc).__name__}: {exc}"
        if done.returncode != 0:
            return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return done.stdout.splitlines()

    def _boot_time(self) -> Optional[float]:
        try:
            for line in self.path("proc", "stat").read_text().splitlines():
                if line.startswith("btime "):
                    return float(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
        return None


def _parse_counters(text: str) -> dict[str, int]:
    """ "RxErr 0\\nBadTLP 2\\nTOTAL_ERR_COR 2" -> {"RxErr": 0, "BadTLP": 2, "TOTAL_ERR_COR": 2}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _xid(message: str, when: Optional[float]) -> Optional[KernelXid]:
    match = _XID.search(message)
    if match is None:
        return None
    pci = match.group(1).lower()
    domain, _, rest = pci.partition(":")
    pci = f"{int(domain, 16):04x}:{rest}"
    text = message[message.index("NVRM: ") + len("NVRM: ") :].strip()
    return KernelXid(code=int(match.group(2)), pci=pci, timestamp=when, text=text)


def _xids_from_dmesg(lines: list[str], boot: Optional[float]) -> tuple[KernelXid, ...]:
    out = []
    for line in lines:
        if "NVRM" not in line:
            continue
        match = _DMESG_TIME.match(line)
        when = boot + float(match.group(1)) if match and boot is not None else None
        xid = _xid(match.group(2) if match else line, when)
        if xid is not None:
            out.append(xid)
    return tuple(out)


PciPath = tuple[str, tuple[str, ...]]  # (the host bridge "pci0000:15", the functions from its root port down)
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_HOST_BRIDGE = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def pci_path(device: str | os.PathLike[str]) -> Optional[PciPath]:
    """Where a PCI function sits: its sysfs path resolved (/sys/devices/pci0000:15/0000:15:01.0/.../0000:19:00.0)
    as (host bridge, bridges and function under it); None for a device that is not PCI or not there."""
    parts = Path(os.path.realpath(device)).parts
    for i, part in enumerate(parts):
        if _HOST_BRIDGE.fullmatch(part):
            chain = tuple(p for p in parts[i + 1 :] if _BDF.fullmatch(p))
            return (part, chain) if chain else None
    return None


def _pci_function(device: str) -> str:
    """The PCI function a device hangs off: itself, or the nearest one above it (virtio-net's `device` is
    .../0000:00:03.0/virtio2, whose NUMA node and bus id are the PCI function's)."""
    path = Path(device)
    for candidate in (path, *path.parents):
        if _BDF.fullmatch(candidate.name):
            return str(candidate)
    return device


def link_label(a: Optional[PciPath], node_a: Optional[int], b: Optional[PciPath], node_b: Optional[int], one_node: bool) -> str:
    """`nvidia-smi topo -m`'s label for the way between two PCI functions (see HostReader.nic_topology)."""
    if a is not None and b is not None and a[0] == b[0]:
        if a[1] == b[1]:
            return "X"
        common = 0
        for x, y in zip(a[1], b[1]):
            if x != y:
                break
            common += 1
        if not common:
            return "PHB"  # the ways part at the host bridge (different root ports)
        below = max(len(a[1]), len(b[1])) - common  # a switch's downstream port and the function: 2
        return "PIX" if below <= 2 else "PXB"
    if node_a is not None and node_b is not None:
        return "NODE" if node_a == node_b else "SYS"
    return "NODE" if one_node else "SYS"


def _numa(text: Optional[str]) -> Optional[int]:
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def _natural(name: str) -> list[int | str]:
    """mlx5_2 before mlx5_10, as nvidia-smi numbers them."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

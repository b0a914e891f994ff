"""What the kernel knows about the GPUs that NVML does not say: sysfs and the kernel log.

- AER counters (`aer_dev_correctable`, `aer_dev_fatal`, `aer_dev_nonfatal`) under each GPU's PCI
  device in /sys/bus/pci/devices/<bdf>/;
- every NIC backed by a PCI function (/sys/class/infiniband/*, /sys/class/net/*): its NUMA node and where
  its PCI path meets each GPU's, i.e. the NIC rows of `nvidia-smi topo -m` (read once, into the machine's
  `Topology`, by the pipeline);
- each NIC port's state, rate, traffic and error counters, every poll (`NicReader`: the snapshot's `nics`);
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
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, Protocol, Sequence

from gputop.model import AerCounts, HostReadings, KernelXid, NicInfo, NicPortSample, Topology, sysfs_bus_id

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


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


class HostReader:
    """Reads `HostReadings` under `root`; `read()` may be called again (a check reads at start and end)."""

    def __init__(
        self, root: str | os.PathLike[str] = "/", *, use_dmesg: Optional[bool] = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.root = Path(root)
        self.clock = clock  # stamps the readings (the pipeline's clock: gputop/clock.py)
        # `dmesg` reads the running kernel's log whatever `root` says: only on the real root
        self.use_dmesg = (self.root == Path("/")) if use_dmesg is None else use_dmesg

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def read(self, gpu_bus_ids: Iterable[str]) -> HostReadings:
        unreadable: list[str] = []
        aer = self.read_aer(gpu_bus_ids, unreadable)
        xids, records = self.read_kernel_xids(unreadable)
        return HostReadings(
            timestamp=self.clock(),
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


# ------------------------------------------------------------ NIC ports, per poll

# The error counters read every ERRORS_EVERY_S rather than every poll: a port has 12 of them under counters/
# and 20-40 under an mlx5 device's hw_counters/, against 6 files for its state and traffic.  Errors that
# climb are judged over a window of seconds, so a 5 s cadence loses nothing (see the README's figures).
ERRORS_EVERY_S = 5.0
DETAILS_EVERY_S = 5.0  # a port's rate, link layer and physical state, between changes of its state
# ports/N/counters/port_{xmit,rcv}_data count 4-byte words (the IBA's PortXmitData is "octets divided by 4")
IB_DATA_WORD_BYTES = 4
# The IBA PortCounters under counters/ that count faults; the rest is traffic (data, packets) or congestion
# (port_xmit_wait), which are not faults of the port.
IB_ERROR_COUNTERS = frozenset(
    {
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
    }
)
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def _hw_error(name: str) -> bool:
    """mlx5's hw_counters/ that count errors (local_ack_timeout_err, packet_seq_err, req_cqe_error, ...);
    the others count congestion (np_cnp_sent) or traffic."""
    return name.endswith(("_err", "_error", "_errors"))


def _net_error(name: str) -> bool:
    """/sys/class/net/DEV/statistics/ error counters (rx_crc_errors, tx_carrier_errors, ...); the drop
    counters are left out: rx_dropped climbs on any frame of a protocol nobody listens to."""
    return name.endswith("_errors")


@dataclasses.dataclass(frozen=True)
class _Port:
    """Where one port's files are: found once (ports do not come and go while gputop runs)."""

    device: str
    port: int
    folder: Path  # ports/N for an RDMA port, the interface's folder for Ethernet
    rdma: bool
    netdev: Optional[str]


class NicSource(Protocol):
    """What the pipeline reads NIC ports from: a `NicReader`, or the simulated machine's tree."""

    errors_every_s: float

    def read(self) -> Optional[tuple[NicPortSample, ...]]: ...

    def close(self) -> None: ...


class NicReader:
    """The NIC ports under `root`'s /sys, read each poll into `NicPortSample`s with their traffic rates.

    State, rate and traffic every `read()`; the error counters every `errors_every_s` (carried over between).
    `read()` returns () on a machine without NICs, None where /sys could not be listed."""

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        *,
        clock: Callable[[], float] = time.time,
        errors_every_s: float = ERRORS_EVERY_S,
    ) -> None:
        self.root = Path(root)
        self.clock = clock
        self.errors_every_s = errors_every_s
        self._ports: Optional[list[_Port]] = None
        self.unreadable: tuple[str, ...] = ()
        self._traffic: dict[tuple[str, int], tuple[float, Optional[int], Optional[int]]] = {}
        self._errors: dict[tuple[str, int], tuple[float, dict[str, int]]] = {}
        # per port: (read at, the state then, rate, rate text, link layer, physical state)
        self._details: dict[tuple[str, int], tuple[float, str, Optional[float], Optional[str], str, Optional[str]]] = {}
        self._files = HeldFiles()  # the files read again and again, kept open (see HeldFiles)

    def ports(self) -> Optional[list[_Port]]:
        if self._ports is None:
            unreadable: list[str] = []
            nics = [nic for nic, _ in HostReader(self.root, use_dmesg=False)._nics(unreadable)]
            self.unreadable = tuple(unreadable)
            if unreadable and not nics:
                return None
            found = []
            for nic in nics:
                if not nic.rdma:
                    folder = self.root / "sys/class/net" / nic.name
                    if not ((folder / "wireless").exists() or (folder / "phy80211").exists()):  # Wi-Fi carries no job
                        found.append(_Port(nic.name, 1, folder, False, None))
                    continue
                base = self.root / "sys/class/infiniband" / nic.name / "ports"
                try:
                    numbers = sorted(int(n) for n in os.listdir(base) if n.isdigit())
                except OSError:
                    continue
                found += [_Port(nic.name, n, base / str(n), True, nic.netdev) for n in numbers]
            self._ports = found
        return self._ports

    def close(self) -> None:
        self._files.close()

    def read(self) -> Optional[tuple[NicPortSample, ...]]:
        ports = self.ports()
        if ports is None:
            return None
        now = self.clock()
        return tuple(self._read_port(port, now) for port in ports)

    def _read_port(self, port: _Port, now: float) -> NicPortSample:
        folder = str(port.folder)  # strings: files of every port every poll, and pathlib's joins cost more than the reads
        key = (port.device, port.port)
        # the state and the traffic every poll; the rate, the link layer and the physical state only when the
        # state changed or every `DETAILS_EVERY_S` (a link renegotiates its rate by going down and up)
        files = self._files
        if port.rdma:
            state = _after_colon(files.first_line(f"{folder}/state")) or "unknown"
            up = state == "ACTIVE"
            rx = _number(files.first_line(f"{folder}/counters/port_rcv_data"), IB_DATA_WORD_BYTES)
            tx = _number(files.first_line(f"{folder}/counters/port_xmit_data"), IB_DATA_WORD_BYTES)
        else:
            state = files.first_line(f"{folder}/operstate") or "unknown"
            up = state == "up"
            rx = _number(files.first_line(f"{folder}/statistics/rx_bytes"))
            tx = _number(files.first_line(f"{folder}/statistics/tx_bytes"))
        details = self._details.get(key)
        if details is None or details[1] != state or now - details[0] >= DETAILS_EVERY_S or now < details[0]:
            details = (now, state, *self._read_details(port, folder, up, files))
            self._details[key] = details
        rate, rate_text, layer, phys = details[2:]
        previous = self._traffic.get(key)
        self._traffic[key] = (now, rx, tx)
        rx_rate = tx_rate = None
        if previous is not None and now > previous[0]:
            rx_rate, tx_rate = _rate(previous[1], rx, now - previous[0]), _rate(previous[2], tx, now - previous[0])
        errors_at, errors = self._errors.get(key, (0.0, {}))
        if key not in self._errors or now - errors_at >= self.errors_every_s:
            errors_at, errors = now, self._read_errors(port, self._files)
            self._errors[key] = (errors_at, errors)
        # the texts repeat poll after poll: one object each, not one per sample a history keeps
        return NicPortSample(
            device=port.device,
            port=port.port,
            rdma=port.rdma,
            link_layer=sys.intern(layer),
            up=up,
            state=sys.intern(state),
            phys_state=sys.intern(phys) if phys is not None else None,
            rate_gbps=rate,
            rate_text=sys.intern(rate_text) if rate_text is not None else None,
            netdev=port.netdev,
            rx_bytes=rx,
            tx_bytes=tx,
            rx_bytes_per_s=rx_rate,
            tx_bytes_per_s=tx_rate,
            errors=errors,
            errors_at=errors_at,
        )

    @staticmethod
    def _read_details(
        port: _Port, folder: str, up: bool, files: HeldFiles
    ) -> tuple[Optional[float], Optional[str], str, Optional[str]]:
        """The port's rate (Gb/s, None while down), the rate as the kernel words it, its link layer and physical state."""
        if port.rdma:
            rate_text = files.first_line(f"{folder}/rate")
            match = _RATE.match(rate_text or "")
            rate = float(match.group(1)) if match and up else None
            layer = files.first_line(f"{folder}/link_layer") or "InfiniBand"
            return rate, rate_text, layer, _after_colon(files.first_line(f"{folder}/phys_state"))
        speed = _number(files.first_line(f"{folder}/speed"))  # Mb/s; -1 or EINVAL without a link
        rate = speed / 1000 if up and speed is not None and speed > 0 else None
        return rate, f"{speed} Mb/s" if rate is not None else None, "Ethernet", None

    @staticmethod
    def _read_errors(port: _Port, files: HeldFiles) -> dict[str, int]:
        if not port.rdma:
            return _counters_in(port.folder / "statistics", _net_error, files)
        found = _counters_in(port.folder / "counters", IB_ERROR_COUNTERS.__contains__, files)
        found.update(_counters_in(port.folder / "hw_counters", _hw_error, files))
        return found


def _first_line(path: str | Path) -> Optional[str]:
    try:  # a plain descriptor: sysfs files are short, and a file object (even unbuffered) costs twice the read
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _line_of(os.read(fd, 4096))
    except OSError:
        return None
    finally:
        os.close(fd)


def _after_colon(text: Optional[str]) -> Optional[str]:
    """ "4: ACTIVE" -> "ACTIVE" (the IB state files give the number and the name)."""
    return text.partition(":")[2].strip() or text if text is not None else None


def _number(text: Optional[str], scale: int = 1) -> Optional[int]:
    try:
        return int(text) * scale if text is not None else None
    except ValueError:
        return None


def _line_of(data: bytes) -> Optional[str]:
    try:
        return data.split(b"\n", 1)[0].decode().strip() or None
    except UnicodeDecodeError:
        return None


class HeldFiles:
    """Files read again and again (a NIC port's state and counters, every poll or every few seconds), each kept
    open and read from its start: `pread` at offset 0 makes sysfs run the attribute's show() anew, as a fresh
    open does.  One system call a read instead of three (open, read, close): 1.5-1.7 us against 7-13 us a file
    on this box, for ~30 files a second and ~280 every 5 s on a machine with eight InfiniBand ports.

    A file whose device went away answers ENODEV on its old descriptor: it is closed and the path opened
    afresh on that read.  Past `limit` descriptors a file is opened for each read, as before, so a machine with
    hundreds of ports never runs a monitor out of descriptors."""

    def __init__(self, limit: int = 512) -> None:
        self.limit = limit
        self._fds: dict[str, int] = {}

    def first_line(self, path: str) -> Optional[str]:
        fd = self._fds.get(path)
        if fd is not None:
            try:
                return _line_of(os.pread(fd, 4096, 0))
            except OSError:  # the device went away (ENODEV), or the file can no longer be read: open it anew
                del self._fds[path]
                os.close(fd)
        if len(self._fds) >= self.limit:
            return _first_line(path)
        try:
            fd = os.open(path, os.O_RDONLY)  # not inherited: Python opens descriptors close-on-exec
        except OSError:
            return None
        self._fds[path] = fd
        try:
            return _line_of(os.pread(fd, 4096, 0))
        except OSError:
            return None

    def __len__(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _rate(before: Optional[int], after: Optional[int], seconds: float) -> Optional[float]:
    if before is None or after is None or after < before:  # a counter reset (driver reload): no rate this time
        return None
    return (after - before) / seconds


def _counters_in(folder: Path, wanted: Callable[[str], bool], files: HeldFiles) -> dict[str, int]:
    try:
        names = sorted(n for n in os.listdir(folder) if wanted(n))
    except OSError:
        return {}
    out = {}
    for name in names:
        path = f"{folder}/{name}"
        value = _number(files.first_line(path))
        if value is not None:
            out[name] = value
    return out


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

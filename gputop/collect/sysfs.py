"""What the kernel knows about the GPUs that NVML does not say: sysfs and the kernel log.

- AER counters (`aer_dev_correctable`, `aer_dev_fatal`, `aer_dev_nonfatal`) under each GPU's PCI
  device in /sys/bus/pci/devices/<bdf>/;
- the NUMA node of every NIC backed by a PCI function (/sys/class/net/*/device/numa_node and
  /sys/class/infiniband/*/device/numa_node), for GPU/NIC affinity;
- `NVRM: Xid` lines in the kernel log (/dev/kmsg, else `dmesg`): NVML's event path misses some codes
  (79, 119 and 120 are reported missing from DCGM's tracker) and keeps no history;
- the kernel release and the loaded nvidia module's version.

Every path hangs off one `root` ("/" on a real machine), so tests and the simulated machine point it at
a tree of fixture files.  Nothing here raises for a source it cannot read: the source is left None and
`HostReadings.unreadable` gets one line saying what and why (e.g. the kernel log under
`kernel.dmesg_restrict`).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterable, Optional

from gputop.model import AerCounts, HostReadings, KernelXid, NicInfo

# The kernel log is read up to this much (a /dev/kmsg ring holds 128 KiB-16 MiB) and for at most this long.
KERNEL_LOG_MAX_BYTES = 32 * 1024 * 1024
KERNEL_LOG_MAX_S = 2.0
DMESG_TIMEOUT_S = 3.0

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\):\s*(\d+)")
_DMESG_TIME = re.compile(r"^\s*(?:<\d+>)?\[\s*(\d+(?:\.\d+)?)\]\s?(.*)$")
_AER_FILES = (("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
              ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
              ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"))


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

    def __init__(self, root: str | os.PathLike = "/", *, use_dmesg: Optional[bool] = None) -> None:
        self.root = Path(root)
        # `dmesg` reads the running kernel's log whatever `root` says: only on the real root
        self.use_dmesg = (self.root == Path("/")) if use_dmesg is None else use_dmesg

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def read(self, gpu_bus_ids: Iterable[str]) -> HostReadings:
        unreadable: list[str] = []
        aer = self.read_aer(gpu_bus_ids, unreadable)
        nics = self.read_nics(unreadable)
        xids, records = self.read_kernel_xids(unreadable)
        return HostReadings(
            timestamp=time.time(),
            kernel=self._first_line(self.path("proc", "sys", "kernel", "osrelease")),
            driver_module=self._first_line(self.path("sys", "module", "nvidia", "version")),
            aer=aer,
            nics=nics,
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
    def read_nics(self, unreadable: list[str]) -> Optional[tuple[NicInfo, ...]]:
        """Every NIC backed by a PCI function (virtual ones have no `device`), once per function."""
        nics: list[NicInfo] = []
        seen: set[str] = set()
        for cls in ("infiniband", "net"):
            base = self.path("sys", "class", cls)
            try:
                names = sorted(os.listdir(base))
            except FileNotFoundError:
                continue
            except OSError as exc:
                unreadable.append(f"NICs {base}: {_reason(exc)}")
                continue
            for name in names:
                device = base / name / "device"
                if not device.exists():
                    continue  # lo, bridges, veth, ifb: no PCI function behind them
                function = os.path.realpath(device)
                if function in seen:
                    continue  # mlx5_0 and its netdev ib0 are one card
                seen.add(function)
                node_text = self._first_line(device / "numa_node")
                try:
                    node = int(node_text) if node_text is not None else None
                except ValueError:
                    node = None
                bus = os.path.basename(function)
                nics.append(NicInfo(name=name, numa_node=node if node is not None and node >= 0 else None,
                                    pci_bus_id=bus if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d", bus) else None))
        return tuple(nics)

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
            return (" (kernel.dmesg_restrict = 1: reading it needs root or CAP_SYSLOG; "
                    "ask an admin for `sudo dmesg -T | grep -i xid`)")
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
    text = message[message.index("NVRM: ") + len("NVRM: "):].strip()
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

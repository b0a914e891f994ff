"""A bug report's captures as a simulated machine: `--simulate capture:DIR`.

DIR holds what a user ran on the machine, any subset of:

    topo.txt     `nvidia-smi topo -m`: the GPU x GPU levels and NV# link counts, CPU affinity, NUMA ids
    smi_q.txt    `nvidia-smi -q`, or `nvidia-smi -q -x` (XML; smi_q.xml is read too): names, bus ids,
                 memory, power limits, PCIe generation and width, ECC mode and counts, driver version, and
                 every field the driver answered N/A
    nvlink.txt   `nvidia-smi nvlink -s`: each GPU's links and which of them are inactive (or that all are)

`load_capture` parses them into the `Profile` the fake NVML library (`gputop.sim.fake_nvml`) already
serves, with a `CapturedBoard` holding what a hand-written profile does not have: the level of every GPU
pair, each link's far end, each GPU's affinity lists, the calls the capture shows as refused.  Nothing here
imports pynvml or the fake library; parsing is pure.

What a capture lacks falls back: no topo.txt -> NVML refuses the topology, affinity and NUMA calls (as it
does where it cannot tell); no smi_q -> the card's numbers are `UNKNOWN_CARD`'s and ECC is refused; no
nvlink.txt -> the links topo.txt counts are all active.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Mapping, Optional, Union

from gputop.errors import UsageError
from gputop.sim.profiles import MIB, MIG_MAX_DEVICES, CapturedBoard, CapturedGpu, GpuModel, MigProfile, Profile, RemappedRows

TOPO_FILE = "topo.txt"
SMI_Q_FILES = ("smi_q.txt", "smi_q.xml")
NVLINK_FILE = "nvlink.txt"

# an NVLink-connected GPU has at most this many links (H100: 18); more NV# per GPU than this can only be
# counted through NVSwitches, which is how `nvidia-smi topo -m` counts them there
MAX_DIRECT_LINKS = 18

# What a capture without `nvidia-smi -q` does not say about the card: a mid-range card's numbers, so that the
# simulated readings stay plausible; ECC and row remapping refused rather than invented.
UNKNOWN_CARD = GpuModel(
    name="NVIDIA GPU (name not captured)",
    memory_total=24564 * MIB,
    memory_reserved=0,
    memory_idle_used=250 * MIB,
    power_limit_w=300.0,
    power_idle_w=25.0,
    temp_idle_c=33.0,
    temp_load_c=65.0,
    sm_clock_idle_mhz=210,
    sm_clock_max_mhz=1800,
    mem_clock_mhz=5000,
    pcie_gen_max=4,
    pcie_width_max=16,
    pcie_rx_peak_kbps=2_000_000,
    pcie_tx_peak_kbps=300_000,
    nvlink_links=0,
    nvlink_peak_kibps=0,
    ecc=False,
    row_remap=False,
)
NVLINK_PEAK_KIBPS = 9_000_000  # per link under full load: the rate the simulated NVLink counters count at

# Symbols a driver older than the listed branch does not export (nvml.h's history); the adapter then
# falls back to the older call, as on the real machine.
SYMBOL_SINCE_DRIVER = {
    "nvmlDeviceGetMemoryInfo_v2": 510,
    "nvmlDeviceGetComputeRunningProcesses_v3": 510,
    "nvmlDeviceGetCurrentClocksEventReasons": 535,
    "nvmlDeviceGetSupportedClocksEventReasons": 535,
    "nvmlDeviceGetTemperatureV": 550,
}


# ---------------------------------------------------------------- small readers


_COMMANDS = {
    TOPO_FILE: "nvidia-smi topo -m",
    "smi_q.txt": "nvidia-smi -q",
    "smi_q.xml": "nvidia-smi -q -x",
    NVLINK_FILE: "nvidia-smi nvlink -s",
}


def _bad(path: Path, what: str) -> UsageError:
    command = _COMMANDS.get(path.name, "nvidia-smi")
    return UsageError(f"--simulate capture: {path}: {what} (save it again with `{command} > {path.name}` on that machine)")


def parse_cpu_ids(text: str) -> Optional[tuple[int, ...]]:
    """ "0-3,8,10-11" -> (0, 1, 2, 3, 8, 10, 11); "N/A" -> (); not a list -> None."""
    text = text.strip()
    if text in ("N/A", ""):
        return ()
    cpus: list[int] = []
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return None
        cpus.extend(range(int(first), int(last if dash else first) + 1))
    return tuple(cpus)


def _number(text: Optional[str]) -> Optional[float]:
    """ "24564 MiB" / "230.00 W" / "16x" / "4" -> the number; "N/A", "[N/A]", None -> None."""
    if text is None:
        return None
    match = re.match(r"\s*(-?\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


# ---------------------------------------------------------------- nvidia-smi topo -m


@dataclass(frozen=True)
class TopoTable:
    levels: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[Optional[tuple[int, ...]], ...]  # None: no such column
    numa_affinity: tuple[Optional[tuple[int, ...]], ...]
    numa_id: tuple[Optional[int], ...]


_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|N/A)$")
_NIC_CELLS = re.compile(r"^(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS)+$")  # (+: cells a paste ran together, "NODENODE")


def parse_topo(text: str, path: Path) -> TopoTable:
    """`nvidia-smi topo -m` -> the GPU rows: cells under the GPU columns, and the last columns (CPU Affinity,
    NUMA Affinity, GPU NUMA ID, as the header names them) read from the end of the row, so that a NIC
    column lost in a copy and paste does not shift them.  A value nvidia-smi printed empty (an empty affinity
    mask) leaves no word in the row: the words after the NIC cells fill the last columns from the right."""
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"]), None)
    if header_at is None:
        raise _bad(path, "no header line starting with GPU0")
    header = lines[header_at]
    gpus = [t for t in header.split() if re.fullmatch(r"GPU\d+", t)]
    if gpus != [f"GPU{i}" for i in range(len(gpus))]:
        raise _bad(path, f"the header's GPU columns are not GPU0..GPU{len(gpus) - 1}")
    tail = [name for name in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID") if name in header]
    rows: dict[int, list[str]] = {}
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens or not re.fullmatch(r"GPU\d+", tokens[0]):
            if rows:
                break  # the GPU rows end where NIC rows or the legend begin
            continue
        rows[int(tokens[0][3:])] = tokens[1:]
    n = len(gpus)
    if sorted(rows) != list(range(n)):
        raise _bad(path, f"the header names {n} GPUs but the rows are GPU{sorted(rows)}")
    levels, cpus, numas, ids = [], [], [], []
    for gpu in range(n):
        tokens = rows[gpu]
        cells, rest = tokens[:n], tokens[n:]
        while rest and _NIC_CELLS.match(rest[0]):
            rest = rest[1:]
        if len(cells) < n or not all(_CELL.match(c) for c in cells) or cells[gpu] != "X" or len(rest) > len(tail):
            raise _bad(path, f"GPU{gpu}'s row does not read as {n} topology cells then {', '.join(tail) or 'nothing'}")
        values = dict(zip(tail, [""] * (len(tail) - len(rest)) + rest))
        cpu = parse_cpu_ids(values["CPU Affinity"]) if "CPU Affinity" in values else None
        if "CPU Affinity" in values and cpu is None:
            raise _bad(path, f"GPU{gpu}'s CPU Affinity {values['CPU Affinity']!r} is not a CPU list")
        numa = parse_cpu_ids(values["NUMA Affinity"]) if "NUMA Affinity" in values else None
        if "NUMA Affinity" in values and numa is None:
            raise _bad(path, f"GPU{gpu}'s NUMA Affinity {values['NUMA Affinity']!r} is not a node list")
        gpu_numa = values.get("GPU NUMA ID") or "N/A"
        levels.append(tuple(cells))
        cpus.append(cpu)
        numas.append(numa)
        ids.append(int(gpu_numa) if gpu_numa.isdigit() else None)
    return TopoTable(tuple(levels), tuple(cpus), tuple(numas), tuple(ids))


# ---------------------------------------------------------------- nvidia-smi nvlink -s


# What nvidia-smi prints under a GPU in place of its links when NVML answers every link's state as inactive
# (a PCIe card with no bridge on its NVLink connector: siboehm/bench's RTX A6000), rather than a
# "Link N: <inactive>" line each; a card without NVLink prints "Device does not have or support Nvlink"
ALL_LINKS_INACTIVE = re.compile(r"all links are inactive", re.I)


@dataclass(frozen=True)
class NvlinkStatus:
    """One GPU's block of `nvidia-smi nvlink -s`."""

    name: str
    links: tuple[bool, ...]  # each listed link: active or not
    all_inactive: bool = False  # "NVML: Unable to retrieve NVLink information as all links are inActive"


def parse_nvlink(text: str, path: Path) -> tuple[NvlinkStatus, ...]:
    """`nvidia-smi nvlink -s` -> per GPU its name and links (`NvlinkStatus`)."""
    names: list[str] = []
    links: list[list[bool]] = []
    all_inactive: set[int] = set()
    for line in text.splitlines():
        head = re.match(r"\s*GPU (\d+): (.*?)(?: \(UUID: .*\))?\s*$", line)
        if head:
            names.append(head.group(2))
            links.append([])
            continue
        link = re.match(r"\s*Link (\d+): (.*)$", line)
        if link and names:
            links[-1].append("inactive" not in link.group(2))
        elif names and ALL_LINKS_INACTIVE.search(line):
            all_inactive.add(len(names) - 1)
    if not names:
        raise _bad(path, "no 'GPU N: ...' lines")
    return tuple(NvlinkStatus(name, tuple(links[i]), i in all_inactive) for i, name in enumerate(names))


def _inactive_link_counts(nvlink: tuple[NvlinkStatus, ...]) -> tuple[int, ...]:
    """How many links each GPU that nvidia-smi says has all links inactive has: nvlink -s lists none of them, NVML
    answers a state for each of the card's links, and a card has as many as the other cards of its model list
    (none where no card of its model lists any: then its links are not known)."""
    listed: dict[str, int] = {}
    for gpu in nvlink:
        listed[gpu.name] = max(listed.get(gpu.name, 0), len(gpu.links))
    return tuple(listed[gpu.name] if gpu.all_inactive and not gpu.links else 0 for gpu in nvlink)


# ---------------------------------------------------------------- nvidia-smi -q and -q -x

Tree = Mapping[str, "TreeValue"]
TreeValue = Union[str, "Tree"]


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_")


def _text_tree(text: str, path: Path) -> tuple[dict[str, str], list[dict[str, TreeValue]]]:
    """`nvidia-smi -q` -> (the header's "Key : Value" pairs, one nested dict per "GPU 0000..." block); keys
    normalised as the XML's tags are ("FB Memory Usage" -> "fb_memory_usage")."""
    header: dict[str, str] = {}
    gpus: list[dict[str, TreeValue]] = []
    stack: list[tuple[int, dict[str, TreeValue]]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip())
        gpu = re.match(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line)
        if gpu:
            block: dict[str, TreeValue] = {"id": gpu.group(1)}
            gpus.append(block)
            stack = [(indent, block)]
            continue
        key, colon, value = line.partition(":")
        if not stack:
            if colon:
                header[_key(key)] = value.strip()
            continue
        while len(stack) > 1 and indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        if colon and value.strip():
            parent.setdefault(_key(key), value.strip())
        else:
            child: dict[str, TreeValue] = {}
            parent.setdefault(_key(key), child)
            stack.append((indent, child))
    if not gpus:
        raise _bad(path, "no 'GPU 00000000:xx:00.0' blocks")
    return header, gpus


def _xml_tree(text: str, path: Path) -> tuple[dict[str, str], list[dict[str, TreeValue]]]:
    try:
        root = ElementTree.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", text))
    except ElementTree.ParseError as exc:
        raise _bad(path, f"not well-formed XML ({exc})") from None

    def tree(element: ElementTree.Element) -> TreeValue:
        children = list(element)
        if not children:
            return (element.text or "").strip()
        out: dict[str, TreeValue] = {}
        for child in children:
            out.setdefault(child.tag, tree(child))
        return out

    header = {child.tag: (child.text or "").strip() for child in root if not list(child)}
    gpus = []
    for element in root.findall("gpu"):
        block = tree(element)
        if isinstance(block, dict):
            gpus.append({"id": element.get("id", ""), **block})
    if root.tag != "nvidia_smi_log" or not gpus:
        raise _bad(path, "no <gpu> elements under <nvidia_smi_log>")
    return header, gpus


def _get(tree: Tree, *paths: str) -> Optional[str]:
    """The first of `paths` ("pci/pci_bus_id") that leads to a value in `tree`."""
    for path in paths:
        node: TreeValue = tree
        for part in path.split("/"):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            if isinstance(node, str):
                return node
    return None


def _na(value: Optional[str]) -> bool:
    return value is not None and value.strip("[] ").upper() in ("N/A", "NOT SUPPORTED", "UNKNOWN ERROR")


# NVML symbols, and the -q fields (XML path | text path) whose N/A says that the driver refused them
_REFUSALS: dict[str, tuple[str, ...]] = {
    "nvmlDeviceGetPowerUsage": ("power_readings/power_draw", "gpu_power_readings/power_draw"),
    "nvmlDeviceGetEnforcedPowerLimit": (
        "power_readings/enforced_power_limit",
        "gpu_power_readings/current_power_limit",
    ),
    "nvmlDeviceGetTemperature": ("temperature/gpu_temp", "temperature/gpu_current_temp"),
    "nvmlDeviceGetTemperatureV": ("temperature/gpu_temp", "temperature/gpu_current_temp"),
    "nvmlDeviceGetUtilizationRates": ("utilization/gpu_util", "utilization/gpu"),
    "nvmlDeviceGetClockInfo": ("clocks/sm_clock", "clocks/sm"),
    "nvmlDeviceGetPcieThroughput": ("pci/tx_util", "pci/tx_throughput"),
    "nvmlDeviceGetPcieReplayCounter": ("pci/replay_counter", "pci/replay_number"),
    "nvmlDeviceGetEccMode": ("ecc_mode/current_ecc", "ecc_mode/current"),
    "nvmlDeviceGetTotalEccErrors": ("ecc_mode/current_ecc", "ecc_mode/current"),
    "nvmlDeviceGetRetiredPages": ("retired_pages/pending_blacklist", "retired_pages/pending_page_blacklist"),
    "nvmlDeviceGetRetiredPagesPendingStatus": (
        "retired_pages/pending_blacklist",
        "retired_pages/pending_page_blacklist",
    ),
    "nvmlDeviceGetRemappedRows": ("remapped_rows/remapped_row_corr", "remapped_rows/correctable_error"),
    "nvmlDeviceGetSerial": ("serial", "serial_number"),
    "nvmlDeviceGetBoardPartNumber": ("board_part_number",),
    "nvmlDeviceGetPersistenceMode": ("persistence_mode",),
    "nvmlDeviceGetApplicationsClock": ("applications_clocks/graphics_clock", "applications_clocks/graphics"),
    "nvmlDeviceGetDefaultApplicationsClock": (
        "default_applications_clocks/graphics_clock",
        "default_applications_clocks/graphics",
    ),
}


@dataclass(frozen=True)
class SmiGpu:
    model: GpuModel
    bus_id: str
    refused: frozenset[str]
    ecc_volatile: Optional[tuple[int, int]]
    ecc_aggregate: Optional[tuple[int, int]]
    mig_instances: Optional[tuple[tuple[int, MigProfile], ...]] = None  # see CapturedGpu
    remapped_rows: Optional[RemappedRows] = None  # see CapturedGpu


def _mig_profile(card: str, multiprocessors: int, memory_mib: float) -> MigProfile:
    """A captured MIG device's profile: -q -x gives its SMs and memory, not the profile's name, which says them
    ("3g.20gb": 3 compute slices of 14 SMs on an A100/A30, 16 on a Hopper; memory rounded to NVIDIA's 5 GB steps)."""
    per_slice = 16 if re.search(r"\b(GH|H)\d", card) else 14
    slices = max(1, min(MIG_MAX_DEVICES, multiprocessors // per_slice))
    gb = max(5, 5 * round(memory_mib / 1024 / 5))
    return MigProfile(f"{slices}g.{gb}gb", slices, multiprocessors, int(memory_mib))


def _xml_mig_instances(text: str) -> list[Optional[tuple[tuple[int, MigProfile], ...]]]:
    """Per <gpu> of a -q -x capture, its MIG devices (see CapturedGpu.mig_instances).  Read from the XML itself:
    the tree `_xml_tree` builds keeps one child per tag, and a MIG GPU lists several <mig_device>."""
    root = ElementTree.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", text))
    out: list[Optional[tuple[tuple[int, MigProfile], ...]]] = []
    for gpu in root.findall("gpu"):
        if (gpu.findtext("mig_mode/current_mig") or "").strip().lower() != "enabled":
            out.append(None)
            continue
        devices = []
        for device in gpu.findall("mig_devices/mig_device"):
            gi = _number(device.findtext("gpu_instance_id"))
            sms = _number(device.findtext("device_attributes/shared/multiprocessor_count"))
            memory = _number(device.findtext("fb_memory_usage/total"))
            if gi is not None and sms and memory:
                devices.append((int(gi), _mig_profile(gpu.findtext("product_name") or "", int(sms), memory)))
        out.append(tuple(devices))
    return out


# the counters NVML's total ECC count adds up, per schema: -q -x tags, and -q's keys as `_key` spells them
_ECC_CORRECTED = ("sram_correctable", "dram_correctable", "single_bit/total")
_ECC_UNCORRECTED = (
    "sram_uncorrectable",  # (R535-R580; later split in two)
    "sram_uncorrectable_parity",
    "sram_uncorrectable_secded",
    "sram_uncorrectable_sec_ded",
    "dram_uncorrectable",
    "double_bit/total",  # (Pascal/Volta-era drivers)
)


def _ecc(tree: Tree, scope: str) -> Optional[tuple[int, int]]:
    """(corrected, uncorrected) of one ECC scope ("volatile"/"aggregate"); None where every counter reads N/A."""
    totals = []
    for names in (_ECC_CORRECTED, _ECC_UNCORRECTED):
        values = [_number(_get(tree, f"ecc_errors/{scope}/{name}")) for name in names]
        totals.append([int(v) for v in values if v is not None])
    if not totals[0] and not totals[1]:
        return None
    return sum(totals[0]), sum(totals[1])


def _remapped_rows(tree: Tree) -> Optional[RemappedRows]:
    """The Remapped Rows block's counts and flags (-q -x tags | -q keys); None where it reads N/A or is absent (a
    card or driver without row remapping)."""
    corrected = _number(_get(tree, "remapped_rows/remapped_row_corr", "remapped_rows/correctable_error"))
    uncorrected = _number(_get(tree, "remapped_rows/remapped_row_unc", "remapped_rows/uncorrectable_error"))
    if corrected is None or uncorrected is None:
        return None
    pending = _get(tree, "remapped_rows/remapped_row_pending", "remapped_rows/pending") or ""
    failed = _get(tree, "remapped_rows/remapped_row_failure", "remapped_rows/remapping_failure_occurred") or ""
    return RemappedRows(int(corrected), int(uncorrected), pending.strip().lower() == "yes", failed.strip().lower() == "yes")


def parse_smi_q(text: str, path: Path) -> tuple[dict[str, str], tuple[SmiGpu, ...]]:
    """`nvidia-smi -q` or `-q -x` -> (header: driver_version, cuda_version, ...; each GPU's facts)."""
    xml = text.lstrip().startswith("<")
    header, trees = _xml_tree(text, path) if xml else _text_tree(text, path)
    # MIG devices from -q -x; -q's text gives the mode only (its instances are not read: none listed)
    migs = _xml_mig_instances(text) if xml else [() if _get(t, "mig_mode/current") == "Enabled" else None for t in trees]
    out = []
    for tree, mig in zip(trees, migs):
        name = _get(tree, "product_name") or UNKNOWN_CARD.name
        bus = _get(tree, "pci/pci_bus_id", "pci/bus_id") or str(tree.get("id", ""))
        memory_mib = _number(_get(tree, "fb_memory_usage/total"))
        reserved_mib = _number(_get(tree, "fb_memory_usage/reserved"))
        limit = _number(
            _get(tree, "power_readings/enforced_power_limit", "gpu_power_readings/current_power_limit")
            or _get(tree, "power_readings/power_limit", "gpu_power_readings/enforced_power_limit")
        )
        gen = _number(_get(tree, "pci/pci_gpu_link_info/pcie_gen/max_link_gen", "pci/gpu_link_info/pcie_generation/max"))
        width = _number(_get(tree, "pci/pci_gpu_link_info/link_widths/max_link_width", "pci/gpu_link_info/link_width/max"))
        ecc_mode = _get(tree, "ecc_mode/current_ecc", "ecc_mode/current")
        remapped = _get(tree, "remapped_rows/remapped_row_corr", "remapped_rows/correctable_error")
        refused = frozenset(symbol for symbol, paths in _REFUSALS.items() if _na(_get(tree, *paths)))
        ecc_on = ecc_mode is not None and ecc_mode.strip().lower() == "enabled"
        model = replace(
            UNKNOWN_CARD,
            name=name,
            memory_total=int(memory_mib * MIB) if memory_mib else UNKNOWN_CARD.memory_total,
            memory_reserved=int(reserved_mib * MIB) if reserved_mib else 0,
            power_limit_w=limit if limit else UNKNOWN_CARD.power_limit_w,
            pcie_gen_max=int(gen) if gen else UNKNOWN_CARD.pcie_gen_max,
            pcie_width_max=int(width) if width else UNKNOWN_CARD.pcie_width_max,
            ecc=ecc_on,
            row_remap=remapped is not None and not _na(remapped),
        )
        if not ecc_on:
            refused |= {"nvmlDeviceGetTotalEccErrors"}  # with ECC off NVML refuses the counts
        volatile, aggregate = _ecc(tree, "volatile"), _ecc(tree, "aggregate")
        out.append(SmiGpu(model, _nvml_bus_id(bus, path), refused, volatile, aggregate, mig, _remapped_rows(tree)))
    return header, tuple(out)


def _nvml_bus_id(text: str, path: Path) -> str:
    """ "00000000:81:00.0" or "0000:81:00.0" -> NVML's 8-hex-digit-domain form, upper case."""
    match = re.fullmatch(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.(\d)", text.strip())
    if not match:
        raise _bad(path, f"GPU bus id {text!r} is not DOMAIN:BUS:DEVICE.FUNCTION")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.{function}"


def _driver_branch(version: Optional[str]) -> Optional[int]:
    number = _number(version)
    return int(number) if number is not None else None


# ---------------------------------------------------------------- the machine


def _wiring(levels: tuple[tuple[str, ...], ...]) -> tuple[tuple[tuple[Optional[int], ...], ...], int]:
    """Each GPU's links from the topo -m cells: (per GPU, the far end of each link; NVSwitch link count).

    Where one GPU's NV# counts add up to more than a GPU has links (`MAX_DIRECT_LINKS`), the links go
    through NVSwitches and every cell reads the number of switch links (NV12 on an A100 board, NV18 on H100):
    then each GPU has that many links ending at a switch.  Otherwise each NV# is that many direct links."""
    counts = [[int(cell[2:]) if cell.startswith("NV") else 0 for cell in row] for row in levels]
    if any(sum(row) > MAX_DIRECT_LINKS for row in counts):
        per_gpu = max(max(row) for row in counts)
        return tuple(tuple([None] * max(row)) for row in counts), per_gpu
    return tuple(tuple(peer for peer, k in enumerate(row) for _ in range(k)) for row in counts), 0


def _read(folder: Path, name: str) -> Optional[tuple[Path, str]]:
    path = folder / name
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"--simulate capture: cannot read {path}: {exc.strerror}") from None
    # nvidia-smi underlines `topo -m`'s header on a terminal (ESC[4m ... ESC[0m), and a copy from the terminal
    # keeps the codes: they are not part of the table (siboehm/bench's capture has them)
    return path, _TERMINAL_CODES.sub("", text)


_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _agree(counts: Iterable[tuple[str, int]]) -> int:
    seen = list(counts)
    if len({n for _, n in seen}) > 1:
        described = ", ".join(f"{where} has {n}" for where, n in seen)
        raise UsageError(f"--simulate capture: the files disagree on the GPU count ({described}); capture them on one machine")
    return seen[0][1]


def _captured_gpus(
    n: int,
    topo: Optional[TopoTable],
    smi: tuple[SmiGpu, ...],
    nvlink: tuple[NvlinkStatus, ...],
    remotes: tuple[tuple[Optional[int], ...], ...],
) -> tuple[list[GpuModel], list[CapturedGpu]]:
    """Each GPU's model and what its captures say of it, from whichever of the three captures there are."""
    models: list[GpuModel] = []
    gpus: list[CapturedGpu] = []
    unlisted = _inactive_link_counts(nvlink)
    for gpu in range(n):
        facts = smi[gpu] if smi else None
        model = facts.model if facts else UNKNOWN_CARD
        if nvlink and not smi:
            model = replace(model, name=nvlink[gpu].name)
        active = (nvlink[gpu].links or (False,) * unlisted[gpu]) if nvlink else ()
        links = remotes[gpu]
        if len(active) > len(links):  # nvlink -s lists links topo -m cannot place (inactive, or no topo)
            links = links + (None,) * (len(active) - len(links))
        active = active + (True,) * (len(links) - len(active))
        models.append(replace(model, nvlink_links=len(links), nvlink_peak_kibps=NVLINK_PEAK_KIBPS if links else 0))
        gpus.append(
            CapturedGpu(
                cpu_affinity=topo.cpu_affinity[gpu] if topo else None,
                numa_affinity=topo.numa_affinity[gpu] if topo else None,
                numa_id=topo.numa_id[gpu] if topo else None,
                nvlink_remote=links,
                nvlink_active=active,
                refused=facts.refused if facts else frozenset(),
                ecc_volatile=facts.ecc_volatile if facts else None,
                ecc_aggregate=facts.ecc_aggregate if facts else None,
                mig_instances=facts.mig_instances if facts else None,
                remapped_rows=facts.remapped_rows if facts else None,
            )
        )
    return models, gpus


def load_capture(folder_text: str) -> Profile:
    """`capture:DIR`'s DIR -> the Profile the fake NVML library serves (UsageError, one line, if it cannot)."""
    folder = Path(folder_text).expanduser()
    if not folder.is_dir():
        raise UsageError(
            f"--simulate capture:{folder_text}: no such folder (put {TOPO_FILE}, smi_q.txt or smi_q.xml, "
            f"{NVLINK_FILE} from the machine in one folder)"
        )
    topo_file = _read(folder, TOPO_FILE)
    smi_file = next((f for f in (_read(folder, name) for name in SMI_Q_FILES) if f is not None), None)
    nvlink_file = _read(folder, NVLINK_FILE)
    if topo_file is None and smi_file is None and nvlink_file is None:
        raise UsageError(
            f"--simulate capture:{folder_text}: none of {TOPO_FILE}, {' or '.join(SMI_Q_FILES)}, {NVLINK_FILE} there "
            f"(save `nvidia-smi topo -m`, `nvidia-smi -q -x` and `nvidia-smi nvlink -s` under those names)"
        )
    topo = parse_topo(topo_file[1], topo_file[0]) if topo_file else None
    header, smi = parse_smi_q(smi_file[1], smi_file[0]) if smi_file else ({}, ())
    nvlink = parse_nvlink(nvlink_file[1], nvlink_file[0]) if nvlink_file else ()
    counts = [(TOPO_FILE, len(topo.levels))] if topo else []
    counts += [(smi_file[0].name, len(smi))] if smi_file else []
    counts += [(NVLINK_FILE, len(nvlink))] if nvlink_file else []
    n = _agree(counts)

    if topo is not None:
        remotes, switch_links = _wiring(topo.levels)
    else:  # links known only from nvlink -s: their far ends are not captured
        remotes, switch_links = tuple(tuple([None] * len(g.links)) for g in nvlink) or ((),) * n, 0
    models, gpus = _captured_gpus(n, topo, smi, nvlink, remotes)
    driver = header.get("driver_version") or ""
    branch = _driver_branch(driver)
    missing = tuple(sorted(s for s, since in SYMBOL_SINCE_DRIVER.items() if branch is not None and branch < since))
    cuda = re.match(r"\s*(\d+)\.(\d+)", header.get("cuda_version") or "")
    bus_ids = tuple(f.bus_id for f in smi) if smi else tuple(f"00000000:{8 * (i + 1):02X}:00.0" for i in range(n))
    numa = [next(iter(g.numa_affinity or ()), -1) for g in gpus]
    widest = max(models, key=lambda m: m.nvlink_links)
    board = CapturedBoard(source=str(folder), gpus=tuple(gpus), levels=topo.levels if topo else None, missing_symbols=missing)
    return Profile(
        name=f"capture:{folder_text}",
        description=f"the machine captured in {folder}",
        gpu=widest,
        bus_ids=bus_ids,
        numa_nodes=tuple(numa),
        # NVSwitch boards: link L of every GPU ends at switch L % 4 (the fake's usual wiring); the ids are made up
        switch_bus_ids=tuple(f"00000000:{0xF0 + s:02X}:00.0" for s in range(4)) if switch_links else (),
        same_node_ancestor="PHB",  # (only the simulated PCI tree under /sys reads it: one host bridge)
        driver_version=driver or "unknown",
        cuda_version=1000 * int(cuda.group(1)) + 10 * int(cuda.group(2)) if cuda else 0,
        nvml_version=f"{cuda.group(1)}.{driver}" if cuda and driver else "unknown",
        gpu_models=tuple(models),
        capture=board,
    )

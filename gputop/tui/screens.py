"""Screens over the main view: help, topology, findings, the loader benchmark, and "too small"."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

from rich.console import RenderableType
from rich.measure import Measurement
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import ProgressBar, Static

from gputop import units
from gputop.analysis.gpu_health import NIC_RATE, NO_PEERS, NVLINK, Peers, Severity, judge_nics, judge_sample, peers_of
from gputop.analysis.prediction import prediction_line
from gputop.analysis.thresholds import PCIE_LOAD_UTILIZATION
from gputop.model import NO_NEAR_CPUS, Finding, GpuSample, MachineInfo, Snapshot, Topology
from gputop.tui import look
from gputop.tui.look import key_display
from gputop.tui.modal import TOPOLOGY_MAX_WIDTH, _Modal
from gputop.tui.widgets.gpu_grid import pcie_flagged


class HelpScreen(_Modal):
    """Generated from the bindings (every binding has an id and a description)."""

    BINDINGS = [
        Binding("escape,q,question_mark,h,f1", "app.pop_screen", "Close", id="help.close"),
    ]

    def __init__(self, sections: Sequence[tuple[str, Iterable[BindingType]]], footer: Optional[Text] = None) -> None:
        """`footer`: what the screen's marks mean (default: the monitor's cards and CPU cells)."""
        super().__init__()
        self.sections = sections
        self.footer = footer

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for title, bindings in self.sections:
            rows = [(key_display(b.key), b.description) for b in bindings if isinstance(b, Binding) and b.description]
            if not rows:
                continue
            table.add_row(Text(title, style="bold underline"), "")
            seen = set()
            for key, description in rows:
                if (key, description) in seen:
                    continue
                seen.add((key, description))
                table.add_row(key, description)
        footer = self.footer or Text(
            "Cards: ● BUSY ≥50%  ◐ LOW  ○ IDLE <5%  ▲ WARN (throttle, PCIe below max, NVLink down)  ✖ FAULT/LOST. "
            "Sparklines are fixed 0–100%. CPU cells ▁..█ = load; underlined = cores running the job.",
            style="dim",
        )
        with VerticalScroll(classes="dialog", id="help"):
            yield Static(Text("gputop keys", style="bold"))
            yield Static(table)
            yield Static(footer)


# link class -> style (the label itself says the class, so NO_COLOR loses nothing)
def link_style(label: str) -> Style:
    if label == "X":
        return look.DIM
    if label.startswith("NV"):
        return look.GOOD_BOLD
    if label in ("PIX", "PXB"):
        return look.ACCENT
    if label in ("PHB", "NODE"):
        return look.WARN
    if label == "SYS":
        return look.BAD
    return look.PLAIN


TOPOLOGY_LEGEND = "NV#: NVLink ×#  PIX/PXB: PCIe switch  PHB: host bridge  NODE: same NUMA node  SYS: across NUMA (slowest)"


def topology_matrix(machine: MachineInfo, with_nics: bool = True) -> Table:
    """`nvidia-smi topo -m` between GPUs and the RDMA NICs (NIC0..), each cell coloured by its link class."""
    names, rows = machine.topology.full_matrix(with_nics)
    table = Table(box=None, padding=(0, 1, 0, 0), show_edge=False, header_style="bold")
    table.add_column("", no_wrap=True)
    for name in names:
        table.add_column(name, justify="center", no_wrap=True)
    for name, row in zip(names, rows):
        table.add_row(Text(name, style="bold"), *(Text(label, style=link_style(label)) for label in row))
    return table


def nic_legend(machine: MachineInfo) -> Text:
    """ "NIC Legend:" as `nvidia-smi topo -m` prints it, on one wrapped line."""
    text = Text("NIC Legend:", style="bold")
    for entry in machine.topology.nic_legend():
        number, _, name = entry.partition(": ")
        text.append("  ").append(number, style="bold").append(f": {name}")
    return text


def _gpu_mark(gpu: Optional[GpuSample], peers: Peers = NO_PEERS) -> tuple[str, Style]:
    """A GPU's tag on the picture: '✖' lost or NVLink down (the health module's rule: a card without an
    NVLink bridge has its links inactive, as it should), '▼' PCIe below max under load."""
    if gpu is None:
        return "", look.BOLD
    if gpu.lost or judge_sample(gpu, peers).of(NVLINK):
        return "✖", look.BAD_BOLD
    if pcie_flagged(gpu):
        return "▼", look.WARN_BOLD
    return "", look.BOLD


def _pcie_why(gpu: GpuSample) -> str:
    """Why a flagged link counts: slow while busy, or lanes missing (a width drop is never power saving)."""
    return "under load" if (gpu.utilization_gpu or 0) >= PCIE_LOAD_UTILIZATION else "lanes missing"


def _pcie_switches(matrix: Sequence[Sequence[str]], members: Sequence[int]) -> list[list[int]]:
    """GPUs of one NUMA node grouped by PCIe switch (PIX/PXB between them), in order."""
    groups: list[list[int]] = []
    for i in members:
        for group in groups:
            if all(matrix[i][j] in ("PIX", "PXB") for j in group):
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


def _node_cores(topo: Topology, members: Sequence[int]) -> str:
    """ " · cores 0-31" for a NUMA node's line: its GPUs' affinity, or that none of the job's CPUs are near them
    (NVML's empty mask), or n/a."""
    lists = [topo.cpu_affinity[i] for i in members if i < len(topo.cpu_affinity)]
    cores = " / ".join(dict.fromkeys(cpus for cpus in lists if cpus))  # (GPUs of no known node may differ)
    if not cores and NO_NEAR_CPUS in lists:
        return f" · none of this job's CPUs are near {'GPU' if len(members) == 1 else 'GPUs'} {', '.join(map(str, members))}"
    return f" · cores {cores or 'n/a'}"


def nvlink_fabric(matrix: Sequence[Sequence[str]], gpus: Mapping[int, GpuSample]) -> Text:
    """The GPU-to-GPU links from NVML's facts: "═══ NVSwitch" for the GPUs whose links end at a switch (NVML's
    remote device type), every other NVLink pair drawn, grouped by its link count; never cut short."""
    count = len(matrix)
    pairs = [(i, j, matrix[i][j]) for i in range(count) for j in range(i + 1, count) if matrix[i][j].startswith("NV")]
    text = Text()
    if not pairs:
        return text.append("no NVLink: GPU to GPU over PCIe only\n", style=look.WARN)
    switched = sorted(g.index for g in gpus.values() if any(link.remote_kind == "switch" for link in g.nvlink or ()))
    via_switch = [(i, j, label) for i, j, label in pairs if i in switched and j in switched]
    if via_switch:
        widths = "/".join(sorted({label for _i, _j, label in via_switch}))
        who = f"all {count} GPUs" if len(switched) == count else f"GPUs {', '.join(map(str, switched))}"
        text.append("═══ NVSwitch", style=look.GOOD_BOLD).append(f": {who}, {widths} between any two\n")
    direct = [pair for pair in pairs if pair not in via_switch]
    if direct:
        text.append(f"NVLink, {len(direct)} pair{'s' if len(direct) > 1 else ''} GPU to GPU:\n", style=look.GOOD_BOLD)
        for label in sorted({label for _i, _j, label in direct}, key=lambda x: int(x[2:]) if x[2:].isdigit() else 0):
            joined = [f"{i}═{j}" for i, j, width in direct if width == label]
            text.append(f"  {label} ×{len(joined)}: ", style=look.GOOD).append(" ".join(joined) + "\n")
    return text


def _picture_notes(topo: Topology, gpus: Mapping[int, GpuSample]) -> Text:
    """Under the machine's picture: why each marked GPU is marked, and what became of the NICs."""
    text = Text()
    nics = topo.nics or ()
    peers = peers_of(list(gpus.values()))
    marked = [(i, _gpu_mark(g, peers)[0]) for i, g in sorted(gpus.items()) if _gpu_mark(g, peers)[0]]
    for i, mark in marked:
        gpu = gpus[i]
        why = (
            ("lost" if gpu.lost else "NVLink link(s) down")
            if mark == "✖"
            else (
                f"PCIe Gen{gpu.pcie.gen_current} x{gpu.pcie.width_current} of Gen{gpu.pcie.gen_max} x{gpu.pcie.width_max}"
                + (" under load" if _pcie_why(gpu) == "under load" else f": {_pcie_why(gpu)}")
            )
        )
        text.append(f"{mark} GPU{i}: {why}\n", style=look.BAD_BOLD if mark == "✖" else look.WARN_BOLD)
    if topo.nics is None:
        text.append("NICs: not read" + (f" ({'; '.join(topo.nics_unreadable)})" if topo.nics_unreadable else ""), style="dim")
    elif not topo.nics:
        text.append("NICs: none with a PCI function", style="dim")
    else:
        rdma = len(topo.matrix_nics())
        shown = f"NIC0–NIC{rdma - 1} in topo -m" if rdma else "none RDMA, so none in topo -m"
        text.append(
            f"{len(nics)} NIC{'s' if len(nics) > 1 else ''} ({'all RDMA: ' if rdma == len(nics) else ''}{shown})", style="dim"
        )
    return text


def machine_picture(machine: MachineInfo, snapshot: Optional[Snapshot]) -> Text:
    """The machine as a picture: each NUMA node with its cores, its GPUs bracketed by PCIe switch and the
    NICs beside them (a NIC on a GPU's switch joins that switch's line; others get a line of their own),
    then the GPU-to-GPU fabric (NVSwitch, or the NVLink pairs). A degraded link is marked on its GPU."""
    topo = machine.topology
    matrix, count = topo.matrix, len(topo.matrix)
    gpus = {g.index: g for g in snapshot.gpus} if snapshot else {}
    nics = topo.nics or ()
    nodes: dict[Optional[int], list[int]] = {}
    for i in range(count):
        nodes.setdefault(topo.numa_node[i] if i < len(topo.numa_node) else None, []).append(i)
    on_switch: dict[int, list[int]] = {}  # GPU -> the NICs on its PCIe switch
    apart: dict[Optional[int], list[int]] = {}  # NUMA node -> NICs on no GPU's switch
    for k, nic in enumerate(nics):
        mates = topo.nic_switch_gpus(k)
        if mates:
            on_switch.setdefault(mates[0], []).append(k)
        else:
            apart.setdefault(nic.numa_node, []).append(k)
            nodes.setdefault(nic.numa_node, [])
    text = Text()
    peers = peers_of(list(gpus.values()))
    for node, members in nodes.items():
        title = "host" if node is None else f"NUMA {node}"
        text.append(f"┌ {title}", style="bold").append(_node_cores(topo, members) + "\n" if members else "\n", style="dim")
        for group in _pcie_switches(matrix, members):
            group_nics = [k for i in group for k in on_switch.get(i, ())]
            shared = len(group) + len(group_nics) > 1
            text.append("│ " + ("PCIe switch ┬ " if shared else "PCIe ─────── "), style="dim")
            for n, i in enumerate(group):
                mark, style = _gpu_mark(gpus.get(i), peers)
                text.append(("┬ " if n and shared else "") + f"GPU{i}{mark}", style=style)
                text.append(" ")
            for k in group_nics:
                text.append("┬ ", style="dim").append(nics[k].name, style=look.ACCENT).append(" ")
            text.append("\n")
        if apart.get(node):
            text.append("│ NIC ──────── ", style="dim")
            text.append("  ".join(nics[k].name for k in apart[node]) + "\n", style=look.ACCENT)
        text.append("└\n", style="dim")
    text.append_text(nvlink_fabric(matrix, gpus))
    text.append_text(_picture_notes(topo, gpus))
    return text


def affinity_table(machine: MachineInfo, snapshot: Optional[Snapshot]) -> Table:
    """Per GPU: the CPUs and NUMA node close to it, and its PCIe link now against its maximum."""
    topo = machine.topology
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    table.add_column("", no_wrap=True, min_width=5)
    for name in ("CPU affinity", "NUMA", "PCIe now / max"):
        table.add_column(name, no_wrap=True)
    gpus = {g.index: g for g in snapshot.gpus} if snapshot else {}
    for i in range(len(topo.matrix)):
        affinity = topo.near_cpus_text(i)
        numa = topo.numa_node[i] if i < len(topo.numa_node) else None
        gpu = gpus.get(i)
        pcie = Text("n/a", style="dim")
        if gpu is not None and gpu.lost:
            pcie = Text("LOST", style=look.BAD_BOLD)
        elif gpu is not None and gpu.pcie.gen_current is not None:
            link = gpu.pcie
            text = f"Gen{link.gen_current} x{link.width_current} / Gen{link.gen_max} x{link.width_max}"
            if link.downgraded:
                text += f" ▼ {_pcie_why(gpu)}!" if pcie_flagged(gpu) else " (idle: normal)"
            pcie = Text(text, style=look.WARN_BOLD if pcie_flagged(gpu) else "")
        near = Text(affinity, style=look.WARN_BOLD) if i in topo.gpus_without_near_cpus() else affinity
        table.add_row(Text(f"GPU{i}", style="bold"), near, "n/a" if numa is None else str(numa), pcie)
    return table


def nic_ports_table(snapshot: Optional[Snapshot]) -> Optional[Table]:
    """Per NIC port: its state, trained rate, traffic now and error counters (since the driver loaded), marked
    as the health module judges it from this snapshot (down, below its peers' rate; a climbing error count
    needs a window: `gputop check`).  None where the snapshot carries no NIC readings."""
    judged = judge_nics([snapshot]) if snapshot is not None else None
    if judged is None or not judged.ports:
        return None
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold", title="NIC ports", title_justify="left")
    for name in ("Port", "Link", "State", "Rate", "rx/s", "tx/s", "Errors"):
        table.add_column(name, no_wrap=True)
    for health, port in zip(judged.ports, judged.latest):
        style = look.BAD_BOLD if health.severity >= Severity.CRITICAL else ""
        errors = sum(port.errors.values())
        table.add_row(
            Text(health.name, style="bold"),
            port.link_layer,
            Text(
                port.state + (f" ({port.phys_state})" if port.phys_state and not port.up else ""),
                style=style if not port.up else "",
            ),
            Text(port.rate_text or "n/a", style=style if health.of(NIC_RATE) else ""),
            units.rate(port.rx_bytes_per_s) or "",
            units.rate(port.tx_bytes_per_s) or "",
            Text(str(errors), style=look.WARN if errors else "dim"),
        )
    return table


class TopologyScreen(_Modal):
    BINDINGS = [Binding("escape,q,T", "app.pop_screen", "Close", id="topology.close")]

    def __init__(self, machine: MachineInfo, snapshot: Optional[Snapshot]) -> None:
        super().__init__()
        self.machine = machine
        self.snapshot = snapshot

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="topology"):
            yield Static(Text("Topology (nvidia-smi topo -m)", style="bold"))
            topo = self.machine.topology
            if not topo.matrix:
                reason = self.machine.gpu_error or "NVML gave no topology for these GPUs"
                yield Static(Text(reason, style=look.WARN))
                yield from self._nic_ports()
                return
            # the room inside the dialog (96% of the screen up to its widest, less border, padding and scroll bar)
            room = min(self.app.size.width * 96 // 100, TOPOLOGY_MAX_WIDTH) - 6  # as `need` below
            matrix, picture = topology_matrix(self.machine), machine_picture(self.machine, self.snapshot)
            full_width = self._width(matrix)
            with_nics = bool(topo.matrix_nics()) and full_width <= room
            if topo.matrix_nics() and not with_nics:
                matrix = topology_matrix(self.machine, with_nics=False)  # the GPUs' rows; the picture places the NICs
            if self._width(matrix) + 3 + self._width(picture) <= room:
                beside = Table.grid(padding=(0, 3))
                beside.add_row(matrix, picture)
                yield Static(beside)
            else:
                yield Static(matrix)
                yield Static(picture, classes="picture")
            yield Static(Text(TOPOLOGY_LEGEND, style="dim"))
            if with_nics:
                yield Static(nic_legend(self.machine))
            elif topo.matrix_nics():
                need = next(w for w in range(self.app.size.width, 10 * full_width) if w * 96 // 100 - 6 >= full_width)
                yield Static(
                    Text(
                        f"NIC0–NIC{len(topo.matrix_nics()) - 1} columns need a terminal {need} columns wide: "
                        "the picture shows where each NIC sits",
                        style="dim",
                    )
                )
            yield Static(affinity_table(self.machine, self.snapshot), id="affinity")
            yield from self._nic_ports()

    def _nic_ports(self) -> Iterator[Static]:
        table = nic_ports_table(self.snapshot)
        if table is not None:
            yield Static(table, id="nic-ports")

    def _width(self, renderable: RenderableType) -> int:
        return Measurement.get(self.app.console, self.app.console.options, renderable).maximum


class FindingsScreen(_Modal):
    BINDINGS = [Binding("escape,q,f", "app.pop_screen", "Close", id="findings.close")]

    def __init__(self, findings: Optional[Sequence[Finding]], note: str = "") -> None:
        super().__init__()
        self.findings = findings
        self.note = note

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="findings"):
            yield Static(Text("Findings: is it your code or the machine?", style="bold"))
            yield from self._finding_widgets()

    def _finding_widgets(self) -> list[Static]:
        if not self.findings:
            return [Static(Text(self.note or "No diagnosis yet: it runs every few seconds.", style="dim"), classes="finding")]
        return [Static(finding_text(finding), classes="finding") for finding in self.findings]

    def show(self, findings: Sequence[Finding], note: str = "") -> None:
        """The latest diagnosis, in place of the one shown (the screen follows it while open)."""
        self.findings, self.note = findings, note
        scroll = self.query_one("#findings", VerticalScroll)
        for widget in scroll.query(".finding"):
            widget.remove()
        scroll.mount(*self._finding_widgets())


def finding_text(finding: Finding) -> Text:
    symbol, style = {
        "critical": ("✖", look.BAD_BOLD),
        "warning": ("▲", look.WARN_BOLD),
    }.get(finding.severity, ("●", look.GOOD_BOLD))
    if finding.id == "healthy":
        symbol, style = "●", look.GOOD_BOLD
    text = Text()
    text.append(f"\n{symbol} {finding.title}", style=style)
    text.append(f"  [{finding.severity}, {finding.confidence:.0%} sure", style="dim")
    text.append(f"; {finding.label}]" if finding.label else "]", style="dim")
    text.append(f"\n  {finding.summary}")
    for line in finding.evidence:
        text.append(f"\n   • {line}")
    for frame in finding.frames:
        text.append(f"\n   ↳ {frame}", style=look.ACCENT)
    if finding.fix:
        text.append("\n  Fix: ", style="bold")
        text.append(finding.fix)
    buys = prediction_line(finding.figures)
    if buys:
        text.append("\n  Buys: ", style="bold")
        text.append(buys)
    return text


class BenchScreen(_Modal):
    """Confirm the tier, show progress, then the result (the run lives in an app worker)."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Close", id="bench.close"),
        Binding("enter", "start(False)", "Passive benchmark (nothing injected)", id="bench.passive"),
        Binding("a", "start(True)", "Passive + active (injects an agent)", id="bench.active"),
    ]

    DEFAULT_CSS = """
    BenchScreen ProgressBar { margin: 1 0; }
    """

    def __init__(self, pid: int, label: str, start: Callable[[int, bool], None]) -> None:
        super().__init__()
        self.pid = pid
        self.label = label
        self._start = start
        self.started = False

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="bench"):
            yield Static(Text(f"Loader benchmark: {self.label}", style="bold"))
            yield Static(
                Text.assemble(
                    ("Enter", "bold"),
                    "  passive: samples the rank's main thread with py-spy (nothing injected, never paused)\n",
                    ("a", "bold"),
                    "      passive + active: injects a small agent that times the live loader and sweeps\n"
                    "         num_workers / prefetch / pin_memory on a NEW loader (bounded to 15 s)\n",
                    ("Esc", "bold"),
                    "    cancel",
                ),
                id="bench-body",
            )
            yield ProgressBar(total=1.0, show_eta=False, id="bench-progress")
            yield Static("", id="bench-status")

    def on_mount(self) -> None:
        self.query_one(ProgressBar).display = False

    def action_start(self, allow_inject: bool) -> None:
        if self.started:
            return
        self.started = True
        self.query_one("#bench-body", Static).update(
            Text("running: " + ("passive + active (agent injected)" if allow_inject else "passive only"), style="bold")
        )
        self.query_one(ProgressBar).display = True
        self._start(self.pid, allow_inject)

    def show_progress(self, fraction: float, message: str) -> None:
        self.query_one(ProgressBar).update(progress=max(0.0, min(1.0, fraction)))
        self.query_one("#bench-status", Static).update(Text(message, style="dim"))

    def show_result(self, lines: Sequence[str], error: Optional[str] = None) -> None:
        self.query_one(ProgressBar).display = False
        body = self.query_one("#bench-body", Static)
        if error:
            body.update(Text(error, style=look.BAD_BOLD))
        else:
            body.update(Text("\n".join(lines)))
        self.query_one("#bench-status", Static).update(Text("Esc closes · r writes a report with this result", style="dim"))


class TooSmallScreen(Screen[None]):
    """btop-style: say what size is needed instead of drawing a broken layout."""

    BINDINGS = [Binding("q", "app.quit", "Quit", id="toosmall.quit")]

    DEFAULT_CSS = """
    TooSmallScreen { align: center middle; background: $background; }
    TooSmallScreen Static { width: auto; height: auto; color: $foreground; background: $background; }
    """

    def __init__(self, need: tuple[int, int]) -> None:
        super().__init__()
        self.need = need
        # held, not queried: the GPUs' arrival can resize it after the screen mounts and before its child does
        self.message = Static(id="too-small")

    def compose(self) -> ComposeResult:
        yield self.message

    def on_mount(self) -> None:
        self.show(self.app.size.width, self.app.size.height)

    def show(self, width: int, height: int) -> None:
        need_w, need_h = self.need
        text = Text(justify="center")
        text.append("terminal too small\n", style="bold")
        text.append(f"{width}×{height}, need {need_w}×{need_h}\n")
        text.append("q quits", style="dim")
        self.message.update(text)

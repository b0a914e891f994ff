"""One-line widgets: the header (host, driver, GPUs, interval, SIMULATED, PAUSED) and the verdict line."""

from __future__ import annotations

from collections import Counter
from typing import Optional

from textual.strip import Strip

from gputop.model import Finding, MachineInfo
from gputop.tui import look
from gputop.tui.canvas import LineBuilder, LineCanvas
from gputop.tui.widgets.gpu_grid import READING_GPUS, short_name


def gpu_summary(machine: MachineInfo) -> str:
    """'8× H100 80GB HBM3' (or '2× A, 1× B' on mixed boxes)."""
    if not machine.gpu_names:
        return "no GPUs" if machine.gpu_error is None else "no GPU data"
    counts = Counter(short_name(n) for n in machine.gpu_names)
    return ", ".join(f"{count}× {name}" for name, count in counts.items())


SUBTITLE_CUT_TO = 24  # the shortest a long subtitle is cut to before it goes
SUBTITLE_BEFORE_VERSIONS = 2.5  # a narration's drop order: after the CUDA (1) and driver (2) versions


class HeaderLine(LineCanvas):
    DEFAULT_CSS = """
    HeaderLine { height: 1; background: $panel; }
    """

    def __init__(self, machine: MachineInfo, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.machine = machine
        self.interval = 1.0
        self.paused = False
        self.simulated = bool(machine.simulated)
        self.replay: Optional[str] = None  # "replay 00:12/01:40 ×2"
        self.subtitle = ""  # e.g. "demo: starved"
        self.subtitle_drop: float = 0  # its place in the order parts are dropped in (see build)
        self.reading_gpus = False  # NVML has not answered yet: the GPUs are not known

    def set_machine(self, machine: MachineInfo, reading_gpus: bool = False) -> None:
        self.machine = machine
        self.simulated = bool(machine.simulated)
        self.reading_gpus = reading_gpus
        self.redraw()

    def set_state(self, *, interval: float, paused: bool, replay: Optional[str] = None) -> None:
        self.interval = interval
        self.paused = paused
        self.replay = replay
        self.redraw()

    def set_subtitle(self, subtitle: str, *, before_versions: bool = False) -> None:
        """`before_versions`: the driver and CUDA versions give way to it on a narrow terminal (a source's narration)."""
        drop = SUBTITLE_BEFORE_VERSIONS if before_versions else 0
        if (subtitle, drop) != (self.subtitle, self.subtitle_drop):
            self.subtitle, self.subtitle_drop = subtitle, drop
            self.redraw()

    def wanted_height(self, width: int) -> int:
        return 1

    def build(self, width: int, height: int) -> list[Strip]:
        m = self.machine
        tags = []
        if self.replay:
            tags.append((f" {self.replay} ", look.ACCENT_BOLD))
        if self.simulated:
            tags.append((" SIMULATED ", look.WARN_BOLD))
        if self.paused:
            tags.append((" ‖ PAUSED ", look.BAD_BOLD))
        # (label, value, drop order): the least useful parts go first when the terminal is narrow
        candidates: list[tuple[str, Optional[str], float]] = [
            ("", m.hostname, 99),
            ("driver ", m.driver_version, 2),
            ("CUDA ", m.cuda_version, 1),
            ("", READING_GPUS if self.reading_gpus else gpu_summary(m), 3),
            ("⟳ ", f"{self.interval:g}s", 99),
            ("", self.subtitle, self.subtitle_drop),
        ]
        parts = [(label, value, drop) for label, value, drop in candidates if value]
        room = width - sum(len(t) for t, _ in tags) - len(" gputop ")
        while (excess := sum(len(label) + len(value) + 2 for label, value, _ in parts) - room) > 0 and any(
            p[2] < 99 for p in parts
        ):
            least = min(parts, key=lambda p: p[2])
            if least[1] == self.subtitle and len(self.subtitle) - excess >= SUBTITLE_CUT_TO:
                # a long subtitle (the case study's stages) is cut, not dropped: its start says the most
                parts[parts.index(least)] = ("", look.ellipsize(self.subtitle, len(self.subtitle) - excess), least[2])
                break
            parts.remove(least)
        line = LineBuilder().add(" gputop ", look.ACCENT_BOLD)
        for i, (label, value, _) in enumerate(parts):
            if i:
                line.add("  ")
            line.add(label, look.LABEL).add(value, look.BOLD if i == 0 else look.PLAIN)
        tail = sum(len(t) for t, _ in tags)
        if line.length + tail > width:
            return [line.strip(width)]
        line.pad(width - tail)
        for text, style in tags:
            line.add(text, style)
        return [line.strip(width)]


class VerdictLine(LineCanvas):
    """The diagnosis in one line, always on screen (the most severe finding first)."""

    DEFAULT_CSS = """
    VerdictLine { height: 1; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.text = "Verdict: collecting…"
        self.severity: Optional[str] = None
        self.extra = 0

    def set_verdict(self, text: str, severity: Optional[str], extra: int) -> None:
        self.text, self.severity, self.extra = text, severity, extra
        self.redraw()

    def wanted_height(self, width: int) -> int:
        return 1

    def build(self, width: int, height: int) -> list[Strip]:
        symbol, style = {
            "critical": ("✖", look.BAD_BOLD),
            "warning": ("▲", look.WARN_BOLD),
            "info": ("●", look.GOOD_BOLD),
        }.get(self.severity or "", ("…", look.DIM))
        line = LineBuilder().add(f" {symbol} ", style)
        more = f"  +{self.extra} more (f)" if self.extra else "  (f: findings)"
        line.add(look.ellipsize(self.text, max(1, width - 3 - len(more))), style if self.severity else look.DIM)
        line.add(more, look.DIM)
        return [line.strip(width)]


def verdict_severity(findings: list[Finding]) -> Optional[str]:
    if not findings:
        return None
    top = findings[0]
    if top.id == "healthy":
        return "info"
    return top.severity


class KeyBar(LineCanvas):
    """The bottom line of key hints, from the bindings marked `show` (one line widget, not a widget per key)."""

    DEFAULT_CSS = """
    KeyBar { height: 1; background: $panel; }
    """

    def __init__(self, keys: list[tuple[str, str]], *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.keys = keys

    def wanted_height(self, width: int) -> int:
        return 1

    def build(self, width: int, height: int) -> list[Strip]:
        line = LineBuilder()
        for key, description in self.keys:
            item_length = len(key) + len(description) + 3
            if line.length + item_length > width:
                break
            line.add(f" {key} ", look.KEY).add(description + " ", look.PLAIN)
        return [line.strip(width)]

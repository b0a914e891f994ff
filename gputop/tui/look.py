"""Colours, glyphs and number formats shared by the TUI widgets.

Every state is told by a symbol or a word as well as by colour, so the screen
reads the same under NO_COLOR (Textual turns colour off there) and on a
monochrome terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from rich.style import Style

if TYPE_CHECKING:
    from gputop.analysis.machine_check import CheckReport

# ------------------------------------------------------------------ styles (cached objects: LineBuilder merges by identity)
PLAIN = Style()
DIM = Style(color="grey50")
BOLD = Style(bold=True)
LABEL = Style(color="grey62")
ACCENT = Style(color="#5fafd7")
ACCENT_BOLD = Style(color="#5fafd7", bold=True)
GOOD = Style(color="#5fd75f")
GOOD_BOLD = Style(color="#5fd75f", bold=True)
WARN = Style(color="#d7af00")
WARN_BOLD = Style(color="#d7af00", bold=True)
BAD = Style(color="#ff5f5f")
BAD_BOLD = Style(color="#ff5f5f", bold=True)
SELECTED = Style(reverse=True)
JOB_CORE = Style(underline=True, bold=True)
BAR_EMPTY = Style(color="grey30")
SPARK = Style(color="#5fafd7")
KEY = Style(color="#ffaf00", bold=True)
SECTION = Style(bgcolor="#303a44")  # section title bars (the base under their text)

# ------------------------------------------------------------------ glyphs
SPARK_LEVELS = " ▁▂▃▄▅▆▇█"
BAR_FULL = "█"
BAR_EMPTY_CH = "░"

# state -> (symbol, word, style)
STATE_BUSY = ("●", "BUSY", GOOD_BOLD)
STATE_LOW = ("◐", "LOW", ACCENT_BOLD)
STATE_IDLE = ("○", "IDLE", DIM)
STATE_WARN = ("▲", "WARN", WARN_BOLD)
STATE_FAULT = ("✖", "FAULT", BAD_BOLD)
STATE_LOST = ("✖", "LOST", BAD_BOLD)

BUSY_AT = 50.0  # utilization % at or above which a GPU counts as busy
IDLE_BELOW = 5.0  # and below which it counts as idle


def load_style(percent: Optional[float]) -> Style:
    """Green → yellow → red as a core or GPU fills up; grey when idle."""
    if percent is None:
        return DIM
    if percent < IDLE_BELOW:
        return DIM
    if percent < 60:
        return GOOD
    if percent < 85:
        return WARN
    return BAD


def _level_index(percent: float) -> int:
    if percent <= 0:
        return 0
    return min(8, max(1, int(percent / 12.5 + 0.5)))  # nearest level; any load above 0 shows


# per whole percent: the level glyph (a lookup, since a 128-core heatmap asks 128 times a second)
_LEVEL_BY_PERCENT = tuple(SPARK_LEVELS[_level_index(p)] for p in range(101))


def level_char(percent: Optional[float]) -> str:
    """One of ' ▁▂▃▄▅▆▇█' on a fixed 0..100 scale (any load above 0 shows at least ▁); '·' when unknown."""
    if percent is None or percent < 0:
        return "·"
    if percent <= 0:
        return SPARK_LEVELS[0]
    if percent < 1:
        return SPARK_LEVELS[1]
    return _LEVEL_BY_PERCENT[min(100, int(percent + 0.5))]


# ------------------------------------------------------------------ numbers: see gputop/units.py
def bar(fraction: Optional[float], width: int) -> tuple[str, str]:
    """(filled, empty) text of a horizontal bar `width` cells wide."""
    if width <= 0:
        return "", ""
    if fraction is None:
        return "", "·" * width
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return BAR_FULL * filled, BAR_EMPTY_CH * (width - filled)


def ellipsize(text: str, width: int) -> str:
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    if width == 1:
        return "…"
    return text[: width - 1] + "…"


# ------------------------------------------------------------------ key names for help and the key bar
_KEY_NAMES = {
    "question_mark": "?",
    "slash": "/",
    "plus": "+",
    "equals_sign": "=",
    "minus": "-",
    "underscore": "_",
    "less_than_sign": "<",
    "greater_than_sign": ">",
    "escape": "Esc",
    "enter": "Enter",
    "tab": "Tab",
    "shift+tab": "Shift+Tab",
    "space": "Space",
    "left": "←",
    "right": "→",
    "up": "↑",
    "down": "↓",
    "pageup": "PgUp",
    "pagedown": "PgDn",
    "f1": "F1",
    "ctrl+c": "Ctrl+C",
}


def key_display(keys: str) -> str:
    return " ".join(_KEY_NAMES.get(k.strip(), k.strip()) for k in keys.split(","))


# ------------------------------------------------------------------ the machine check's marks on the GPU cards
# check id -> the few words a GPU card has room for
_CARD_WORDS = {
    "pcie.link": "PCIe link",
    "pcie.replay": "PCIe replay",
    "pcie.aer": "AER",
    "nvlink.state": "NVLink",
    "nvlink.errors": "NVL err",
    "fabric": "fabric",
    "topology": "topology",
    "numa.nic": "NIC NUMA",
    "memory.ecc": "ECC",
    "memory.remap": "remap",
    "memory.retired_pages": "retired pg",
    "xid": "XID",
    "persistence": "persist",
    "ecc.mode": "ECC mode",
    "clocks.applications": "app clock",
    "clocks.events": "slowdown",
    "vbios": "VBIOS",
    "driver": "driver",
    "gpus": "lost",
}


def card_marks(report: CheckReport) -> dict[int, tuple[str, bool]]:
    """GPU index -> (the words its card shows, whether it is a failure) for each GPU a check names."""
    from gputop.analysis.machine_check import FAIL, failing_gpus  # the check's code: only once a check ran

    marks = {}
    for index, results in failing_gpus(report.results).items():
        words = ",".join(dict.fromkeys(_CARD_WORDS.get(r.id, r.id) for r in results))
        marks[index] = (f"chk {words}", any(r.status == FAIL for r in results))
    return marks

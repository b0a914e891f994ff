"""Line-drawn widgets that repaint only the cells that changed.

A terminal monitor redraws every second for hours, often over SSH, so what it
writes to the terminal is the cost that matters.  Textual repaints a whole
widget region when a widget refreshes; `LineCanvas.set_lines` instead compares
the new lines with the ones on screen and refreshes only the changed span of
each changed line (Textual then writes just those cells).  Lines are built with
`LineBuilder`, which merges equal-style runs, so a line costs one colour code per
run, not one per cell.
"""

from __future__ import annotations

from typing import Any, Optional

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from gputop.tui.look import SECTION

# A line's runs (texts and styles) as a hashable value: two lines with equal keys draw the same cells.
RunsKey = tuple[tuple[str, ...], tuple[Optional[Style], ...]]

# Segments always carry a style: Textual's NO_COLOR filter reads `style.color` of every segment.
PLAIN = Style()


class LineBuilder:
    """Accumulates (text, style) runs for one line; adjacent runs of one style are merged."""

    __slots__ = ("_texts", "_styles", "length")

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._styles: list[Optional[Style]] = []
        self.length = 0  # in characters; the glyphs we use are one cell wide

    def add(self, text: str, style: Optional[Style] = None) -> "LineBuilder":
        if not text:
            return self
        if style is None:
            style = PLAIN
        if self._styles and self._styles[-1] is style:
            self._texts[-1] += text
        else:
            self._texts.append(text)
            self._styles.append(style)
        self.length += len(text)
        return self

    def pad(self, width: int, style: Optional[Style] = None) -> "LineBuilder":
        if self.length < width:
            self.add(" " * (width - self.length), style)
        return self

    def right(self, text: str, width: int, style: Optional[Style] = None) -> "LineBuilder":
        """Pad so that `text` ends at column `width` (it is dropped when there is no room)."""
        room = width - self.length
        if room >= len(text) + 1:
            self.pad(width - len(text))
            self.add(text, style)
        return self

    def key(self) -> RunsKey:
        """The runs as a hashable value: two builders with equal keys draw the same cells."""
        return (tuple(self._texts), tuple(self._styles))

    def extend(self, other: "LineBuilder") -> "LineBuilder":
        for text, style in zip(other._texts, other._styles):
            self.add(text, style)
        return self

    def section(self, width: int) -> Strip:
        """A full-width section title bar (the section style under the text's own styles)."""
        return self.strip(width).apply_style(SECTION)

    def segments(self, width: int) -> list[Segment]:
        """Exactly `width` characters of segments, cropped or padded (fast path: no cell measuring;
        callers use it for text made of one-cell characters, as the tests check)."""
        texts, styles = self._texts, self._styles
        if self.length > width:
            out, room = [], width
            for text, style in zip(texts, styles):
                if room <= 0:
                    break
                out.append(Segment(text[:room], style))
                room -= len(text)
            return out
        out = [Segment(t, s) for t, s in zip(texts, styles)]
        if self.length < width:
            out.append(Segment(" " * (width - self.length), PLAIN))
        return out

    def strip(self, width: int) -> Strip:
        """Exactly `width` cells: cropped or padded with spaces."""
        segments = [Segment(t, s) for t, s in zip(self._texts, self._styles)]
        strip = Strip(segments)
        if strip.cell_length != width:
            strip = strip.crop_extend(0, width, PLAIN)
        return strip


MERGE_GAP = 6  # unchanged runs shorter than this are repainted rather than skipped (a cursor move costs ~8 bytes)


def _same_style_runs(old: Strip, new: Strip) -> bool:
    """Same run lengths with the very same Style objects (the builders reuse cached styles)."""
    old_segments, new_segments = list(old), list(new)
    if len(old_segments) != len(new_segments):
        return False
    for (old_text, old_style, _), (new_text, new_style, _) in zip(old_segments, new_segments):
        if old_style is not new_style or len(old_text) != len(new_text):
            return False
    return True


def _changed_spans(old: Strip, new: Strip) -> list[tuple[int, int]]:
    """(start, end) cell ranges that differ between two lines; near ranges are merged.

    Runs every second for every line on screen, so the common case (same styles, a few
    characters changed) compares plain strings and never expands the line into cells."""
    if old == new:
        return []
    old_text, new_text = old.text, new.text
    length = len(new_text)
    if len(old_text) != length or old.cell_length != length or new.cell_length != length:
        return [(0, max(old.cell_length, new.cell_length))]  # wide characters or a new length: the whole line
    if _same_style_runs(old, new):
        differ = [x for x in range(length) if old_text[x] != new_text[x]]
    else:
        old_styles = [style for text, style, _ in old for _ in text]
        new_styles = [style for text, style, _ in new for _ in text]
        # identity, not equality: the builders reuse cached Style objects, and an equal-but-distinct
        # style only costs a repaint of an unchanged cell
        differ = [x for x in range(length) if old_text[x] != new_text[x] or old_styles[x] is not new_styles[x]]
    spans: list[tuple[int, int]] = []
    for x in differ:
        if spans and x - spans[-1][1] < MERGE_GAP:
            spans[-1] = (spans[-1][0], x + 1)
        else:
            spans.append((x, x + 1))
    return spans


def _changed_span(old: Strip, new: Strip) -> Optional[tuple[int, int]]:
    """First and one-past-last cell that differ, or None when the lines are equal."""
    spans = _changed_spans(old, new)
    if not spans:
        return None
    return (spans[0][0], spans[-1][1])


_MONO_CACHE: dict[Optional[Style], Optional[Style]] = {}


def without_colour(strip: Strip) -> Strip:
    """The strip with colours removed and attributes (bold, underline, reverse, dim) kept.

    Textual filters colour out of what it writes under NO_COLOR, but not out of screenshots;
    dropping it here too makes a NO_COLOR screenshot show what such a user sees."""
    segments = []
    for text, style, control in strip:
        mono = _MONO_CACHE.get(style, _MISSING)
        if mono is _MISSING:
            mono = _MONO_CACHE[style] = (
                PLAIN
                if style is None
                else Style(bold=style.bold, dim=style.dim, italic=style.italic, underline=style.underline, reverse=style.reverse)
            )
        segments.append(Segment(text, mono, control))
    return Strip(segments, strip.cell_length)


_MISSING: Any = object()


class LineCanvas(Widget):
    """A widget drawn from a list of strips, one per row, rebuilt by `build()`.

    Subclasses implement `build(width, height) -> list[Strip]` from their data and
    call `redraw()` when the data changed.  Only changed cells are repainted.
    """

    DEFAULT_CSS = """
    LineCanvas { height: auto; }
    """

    def __init__(self, *, id: Optional[str] = None, classes: Optional[str] = None) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: list[Strip] = []
        self._drawn_width = -1
        self._built_for = (-1, -1)  # the (width, height) the lines were last built for

    # ------------------------------------------------------------------ subclass API
    def build(self, width: int, height: int) -> list[Strip]:  # pragma: no cover - abstract
        raise NotImplementedError

    def wanted_height(self, width: int) -> int:
        """Rows this widget wants for `height: auto`; default: as many as it builds."""
        return len(self._lines)

    # ------------------------------------------------------------------ drawing
    def redraw(self) -> None:
        """Rebuild the lines from the current data and repaint what changed."""
        if not self.is_mounted:
            return
        width, height = self.size.width, self.size.height
        if width <= 0:
            return
        new_lines = self._built_lines(width, height)
        old_lines = self._lines
        self._lines = new_lines
        if width != self._drawn_width or len(old_lines) != len(new_lines):
            self._drawn_width = width
            self.refresh(layout=self.styles.height is not None and self.styles.height.is_auto)
            return
        regions = []
        for y, (old, new) in enumerate(zip(old_lines, new_lines)):
            if old is new:  # builders that reuse an unchanged line's strip (the GPU cards) skip the diff
                continue
            spans = _changed_spans(old, new)
            if not spans:
                continue
            for start, end in spans:
                regions.append(Region(start, y, end - start, 1))
        if regions:
            self.refresh(*regions)

    def _built_lines(self, width: int, height: int) -> list[Strip]:
        self._built_for = (width, height)
        lines = self.build(width, height)
        if self.app.no_color:
            lines = [without_colour(line) for line in lines]
        return lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.wanted_height(width)

    def on_resize(self) -> None:
        if self._built_for == (self.size.width, self.size.height):
            return  # built at this size by the frame that gave it (render_line): nothing to redraw
        self._drawn_width = -1
        self.redraw()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if width != self._drawn_width and width > 0:
            # The widget's first frame at this width: its data came before the layout gave it a size (the app
            # hands the first snapshot over at mount), so build the lines now rather than paint it blank and
            # draw them a frame later.
            self._lines = self._built_lines(width, self.size.height)
            self._drawn_width = width
        if 0 <= y < len(self._lines):
            strip = self._lines[y]
            if strip.cell_length != width:
                strip = strip.crop_extend(0, width, PLAIN)
            return strip
        return Strip.blank(width, PLAIN)

    @property
    def lines_text(self) -> list[str]:
        """The plain text on screen (for tests)."""
        return [strip.text for strip in self._lines]

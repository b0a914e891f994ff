"""gputop's faster ChopsUpdate.render_segments draws the same cells as Textual's own."""

from __future__ import annotations

import random
import re

from rich.console import Console
from rich.segment import Segment
from textual._compositor import ChopsUpdate
from textual.strip import Strip

from gputop.tui.partial_updates import _render_segments

WIDTH = 60


def screen_after(updates: str, rows: int) -> list[str]:
    """Apply cursor moves + plain text to a blank screen of `rows` lines."""
    cells = [[" "] * WIDTH for _ in range(rows)]
    for match in re.finditer(r"\x1b\[(\d+);(\d+)H([^\x1b\n]*)", updates):
        row, col = int(match[1]) - 1, int(match[2]) - 1
        for ch in match[3]:
            cells[row][col] = ch
            col += 1
    return ["".join(line) for line in cells]


def both(chops: list[dict], spans: list[tuple[int, int, int]]) -> tuple[list[str], list[str]]:
    # as in Textual's compositor: each strip of a line ends where the next begins, the last at the width
    ends = [[*list(line)[1:], WIDTH] for line in chops]
    console = Console(color_system=None, width=WIDTH)
    theirs = ChopsUpdate(chops, spans, ends).render_segments(console)
    ours = _render_segments(ChopsUpdate(chops, spans, ends), console)
    return screen_after(theirs, len(chops)), screen_after(ours, len(chops))


def test_one_strip_object_at_several_x_draws_each_place():
    """Strip.blank is cached, so two widgets' equal blank lines are one object at different x: each place's
    span must be drawn from that place's own offsets."""
    shared = Strip([Segment("abcde"), Segment("fghij")])
    chops = [{0: shared, 10: Strip([Segment("x" * 20)]), 30: shared}, {20: shared, 30: Strip([Segment("y" * 30)])}]
    spans = [(0, 2, 8), (0, 31, 38), (1, 22, 29)]
    theirs, ours = both(chops, spans)
    changed = [(y, x) for y, x1, x2 in spans for x in range(x1, x2)]
    assert [ours[y][x] for y, x in changed] == [theirs[y][x] for y, x in changed]
    assert (ours[0][2:8], ours[0][31:38], ours[1][22:29]) == ("cdefgh", "bcdefgh", "cdefghi")


def test_random_chops_with_shared_strips_draw_what_textual_draws():
    rng = random.Random(15)
    for _ in range(500):
        pool = [
            Strip([Segment("".join(rng.choice("abcdef") for _ in range(rng.randint(1, 6)))) for _ in range(rng.randint(1, 4))])
            for _ in range(3)
        ]
        chops, spans = [], []
        for y in range(3):
            line, x = {}, 0
            while x < WIDTH:
                strip = rng.choice(pool)
                if x + strip.cell_length > WIDTH:
                    strip = strip.crop(0, WIDTH - x)
                line[x] = strip
                x += strip.cell_length
            chops.append(line)
            x1 = rng.randrange(WIDTH - 1)
            spans.append((y, x1, rng.randint(x1 + 1, WIDTH)))
        theirs, ours = both(chops, spans)
        for y, x1, x2 in spans:
            assert ours[y][x1:x2] == theirs[y][x1:x2], (chops[y], (x1, x2))

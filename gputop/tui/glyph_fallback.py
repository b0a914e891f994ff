"""ASCII stand-ins for the screen's glyphs when the terminal's encoding cannot show them.

Python has coerced the C locale to UTF-8 since 3.7, so this is for the rest: a legacy 8-bit locale
(`LANG=en_US.ISO-8859-1`, KOI8-R …) or `PYTHONUTF8=0` with a C locale.  There Python's stderr, which
Textual writes the screen to, turns every sparkline block and box-drawing line into a six-character
`\\u2583` escape: the layout falls apart.  Instead we hook the stream's encoding errors and answer
each glyph the encoding lacks with ASCII of the same cell width, so every column stays where it was
and every state still reads (states are told by a word as well as a symbol; see `look`).
"""

from __future__ import annotations

import codecs
import io
import unicodedata
from typing import Optional, TextIO

ERRORS_NAME = "gputop-ascii-glyphs"

# The sparkline/heatmap levels ' ▁▂▃▄▅▆▇█' keep their order as an ASCII ramp.
_LEVELS = dict(zip(" ▁▂▃▄▅▆▇█", " .:-=+*#@"))
_EXACT = {
    "░": ".",
    "▒": ":",
    "▓": "#",
    "·": ".",
    "…": "~",
    "°": "o",
    "×": "x",
    "–": "-",
    "—": "-",
    "≥": ">",
    "≤": "<",
    "±": "+",
    "└": "`",
    "╰": "`",  # the last branch of a tree
    "✓": "+",
    "✔": "+",
    "✖": "x",
    "✗": "x",
    "◐": "c",
    "◑": "c",
    "●": "*",
    "○": "o",
    "■": "#",
    "□": "o",
}
# (words in the Unicode name, stand-in): the first match wins.
_BY_NAME = (
    (("LEFTWARDS",), "<"),
    (("RIGHTWARDS",), ">"),
    (("UPWARDS",), "^"),
    (("DOWNWARDS",), "v"),
    (("UP-POINTING",), "^"),
    (("DOWN-POINTING",), "v"),
    (("LEFT-POINTING",), "<"),
    (("RIGHT-POINTING",), ">"),
    (("BOX DRAWINGS", "HORIZONTAL", "VERTICAL"), "+"),
    (("BOX DRAWINGS", "HORIZONTAL"), "-"),
    (("BOX DRAWINGS", "VERTICAL"), "|"),
    (("BOX DRAWINGS",), "+"),
    (("LEFT", "BLOCK"), "|"),
    (("RIGHT", "BLOCK"), "|"),
    (("UPPER", "BLOCK"), "-"),
    (("BLOCK",), "#"),
    (("CIRCLE",), "o"),
    (("TRIANGLE",), "^"),
    (("SQUARE",), "#"),
)


def stand_in(char: str) -> str:
    """ASCII for one character, as many cells wide as the character is on screen."""
    if char in _LEVELS:
        return _LEVELS[char]
    if char in _EXACT:
        return _EXACT[char]
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return ""  # zero width: it only modifies the character before it
    name = unicodedata.name(char, "")
    for words, ascii_char in _BY_NAME:
        if all(word in name for word in words):
            return ascii_char
    return "??" if unicodedata.east_asian_width(char) in ("W", "F") else "?"


def _replace_unencodable(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start : error.end]
    return "".join(stand_in(char) for char in text), error.end


codecs.register_error(ERRORS_NAME, _replace_unencodable)


def fit_glyphs_to(stream: Optional[TextIO]) -> bool:
    """If `stream` (a text stream on the terminal) cannot encode the screen's glyphs, have it write
    ASCII stand-ins for whatever it cannot encode.  Returns True when it did."""
    if not isinstance(stream, io.TextIOWrapper) or not stream.encoding:
        return False  # (only a TextIOWrapper can be told how to handle what it cannot encode)
    encoding = stream.encoding
    try:
        " ▁█│─●".encode(encoding)
        return False
    except (UnicodeEncodeError, LookupError):
        pass
    try:
        stream.reconfigure(errors=ERRORS_NAME)
    except (ValueError, OSError):  # closed or detached: nothing will be drawn on it anyway
        return False
    return True

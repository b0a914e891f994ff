"""The dialog every screen over the main view is drawn in (help, topology, findings, the bench, the check, the
fleet's jobs): centred, bordered, closed with Esc."""

from __future__ import annotations

from textual.binding import Binding
from textual.screen import ModalScreen

TOPOLOGY_MAX_WIDTH = 150  # the dialog's widest: the matrix with 8 NICs (85 columns) and the picture beside it


class _Modal(ModalScreen[None]):
    BINDINGS = [Binding("escape", "app.pop_screen", "Close", id="modal.close")]

    DEFAULT_CSS = f"""
    _Modal {{ align: center middle; }}
    _Modal > .dialog {{
        width: 96%; max-width: 120; height: auto; max-height: 94%;
        border: round $accent; background: $surface; padding: 0 1;
    }}
    _Modal > VerticalScroll.dialog {{ height: 94%; }}
    #affinity {{ margin-top: 1; }}
    .picture {{ margin-top: 1; }}
    _Modal > #topology, _Modal > #findings {{ height: auto; }}
    _Modal > #topology {{ max-width: {TOPOLOGY_MAX_WIDTH}; }}
    """

"""Handing the heap's freed pages back to the kernel (glibc's `malloc_trim`).

CPython frees objects, but glibc's malloc keeps the pages of freed blocks mapped for its own reuse, and only
returns memory at the very top of a heap on its own.  A process that starts up (imports, the first frames, the
first diagnosis) and then keeps a rolling history leaves freed pages scattered between live blocks; they stay
in its resident set for good.  Measured in the TUI (8 simulated GPUs, a pty): a trim after start-up took RSS at
5 s from 48.3 to 45.9 MiB, and one a minute kept it 4.4 MiB lower at 60 s; each trim took under 1 ms.

Without glibc (musl, macOS) there is no such call and nothing is done.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Optional


def _find_malloc_trim() -> Optional[Callable[[int], int]]:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # no C library to load, or one without the call
        return None


_MALLOC_TRIM = _find_malloc_trim()


def give_back_freed_memory() -> bool:
    """Return the heap's free pages to the kernel; False where the C library has no `malloc_trim`."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True

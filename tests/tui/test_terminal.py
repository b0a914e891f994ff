"""End to end in a real pseudo-terminal: `gputop tui --simulate` draws the grid and quits on q."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
from rich.cells import cell_len
from rich.text import Text

from gputop.model import MachineInfo, Topology
from gputop.tui import look
from gputop.tui.glyph_fallback import ERRORS_NAME, stand_in
from gputop.tui.screens import link_style, topology_matrix

# a real terminal read against a deadline: the first frame includes the monitor's start, which a box busy with
# other tests' jobs delays past it (tests/harness/turns.py)
pytestmark = pytest.mark.alone(unless_prioritized=True)


def _read_until(master: int, needle: bytes, timeout: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out waiting for {needle!r}; got {buf[-400:]!r}"
        ready, _, _ = select.select([master], [], [], min(remaining, 0.5))
        if ready:
            try:
                buf += os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
    return buf


TUI_ARGV = [sys.executable, "-m", "gputop", "tui", "--simulate", "h100-sxm-8"]


def _start_in_pty(spawn, argv: list[str], env: dict) -> tuple[subprocess.Popen, int]:
    """`argv` on a fresh 120x40 pseudo-terminal: (the process, the terminal's master side)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = spawn(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    return proc, master


def _quit(master: int, proc: subprocess.Popen, timeout: float = 20) -> bytes:
    """Press q and read the terminal until the process ends (an unread terminal would block its writes)."""
    os.write(master, b"q")
    out = b""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        select.select([master], [], [], 0.2)
        try:
            out += os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            pass
    return out


def test_simulated_tui_in_a_pty_draws_and_quits(spawn):
    env = dict(os.environ, TERM="xterm-256color", LANG="C.UTF-8")
    env.pop("NO_COLOR", None)
    proc, master = _start_in_pty(spawn, TUI_ARGV, env)
    try:
        screen = _read_until(master, b"GPU7", timeout=60)
        assert b"SIMULATED" in screen
        _quit(master, proc)
        assert proc.returncode == 0
    finally:
        os.close(master)


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_gputop_exits_when_its_terminal_goes_away_with_sighup_ignored(spawn):
    # Started from its own session it gets no SIGHUP when the terminal closes (as under `nohup`): before the
    # fix it stayed up with Textual's input thread spinning on end-of-file.
    env = dict(os.environ, TERM="xterm-256color", LANG="C.UTF-8")
    ignore_hup_then_run = (
        "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
        "os.execv(sys.executable, [sys.executable, '-m', 'gputop', 'tui', '--simulate', 'h100-sxm-8'])"
    )
    proc, master = _start_in_pty(spawn, [sys.executable, "-c", ignore_hup_then_run], env)
    try:
        _read_until(master, b"GPU7", timeout=60)
    finally:
        os.close(master)  # the terminal goes away
    assert proc.wait(timeout=20) == 1


def _simulated_trees(pid: int) -> set[str]:
    """The simulated machine's folders (under /dev/shm or the temp folder) the process holds files open in."""
    trees = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        parts = target.split(os.sep)
        for i, part in enumerate(parts):
            if part.startswith("gputop-sim-"):
                trees.add(os.sep.join(parts[: i + 1]))
    return trees


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_stop_signal_ends_the_monitor_as_q_does(spawn, sig):
    """`kill PID` and a closed terminal end it cleanly: the terminal restored (the alternate screen left) and the
    simulated machine's trees removed; the default action killed it mid-frame and left both behind."""
    env = dict(os.environ, TERM="xterm-256color", LANG="C.UTF-8")
    proc, master = _start_in_pty(spawn, TUI_ARGV, env)
    try:
        _read_until(master, b"GPU7", timeout=60)
        trees = _simulated_trees(proc.pid)
        assert trees and all(os.path.isdir(tree) for tree in trees)  # the NIC ports' files, held between polls
        proc.send_signal(getattr(signal, sig))
        out = b""
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            select.select([master], [], [], 0.2)
            try:
                out += os.read(master, 65536)
            except OSError:
                pass
    finally:
        os.close(master)
    code = proc.wait(timeout=20)
    assert code == 128 + getattr(signal, sig), f"exit {code}; the terminal's last output: {out[-1500:]!r}"
    assert b"\x1b[?1049l" in out  # Textual left the alternate screen: the user's terminal is back
    assert not any(os.path.exists(tree) for tree in trees)


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_an_ascii_terminal_gets_ascii_glyphs_in_every_column(spawn):
    # LANG=C without PEP 538 coercion or UTF-8 mode: stderr, which Textual draws on, really is ASCII.
    env = dict(os.environ, TERM="xterm-256color", LANG="C", LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    proc, master = _start_in_pty(spawn, TUI_ARGV, env)
    try:
        screen = _read_until(master, b"GPU7", timeout=60)
        if b"avg" not in screen:  # the CPU heatmap, drawn with level glyphs: often in the frame before the cards
            # (its label is drawn once; later frames repaint only the cells that changed)
            screen += _read_until(master, b"avg", timeout=30)
        screen += _quit(master, proc)
        assert proc.returncode == 0
    finally:
        os.close(master)
    assert screen.isascii() and b"\\u2" not in screen, screen[-400:]  # no "\u2583" escapes shifting columns
    assert b"SIMULATED" in screen


def test_glyph_stand_ins_are_ascii_and_as_wide_as_the_glyph():
    glyphs = set(look.SPARK_LEVELS + look.BAR_FULL + look.BAR_EMPTY_CH + "·…°←→↑↓├└│─┌┐╭╮╰╯━┃▔▏▕≥–")
    glyphs |= {state[0] for state in (look.STATE_BUSY, look.STATE_LOW, look.STATE_IDLE, look.STATE_WARN, look.STATE_FAULT)}
    glyphs |= set("данные数据é\u0301")  # a job's own path: Cyrillic, CJK (two cells), a combining accent
    for glyph in glyphs:
        ascii_text = stand_in(glyph)
        assert ascii_text.isascii() and cell_len(ascii_text) == cell_len(glyph), (glyph, ascii_text)
    assert "".join(stand_in(c) for c in look.SPARK_LEVELS) == " .:-=+*#@"  # the ramp keeps its order
    assert "├ rank 0 │ 数\n└ rank 1".encode("ascii", errors=ERRORS_NAME) == b"| rank 0 | ??\n` rank 1"


def test_topology_cells_are_coloured_by_link_class():
    labels = ["X", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS"]
    styles = {label: link_style(label) for label in labels}
    assert styles["NV4"] is look.GOOD_BOLD and styles["SYS"] is look.BAD and styles["X"] is look.DIM
    assert styles["PIX"] is styles["PXB"] is look.ACCENT and styles["PHB"] is styles["NODE"] is look.WARN
    matrix = (("X", "NV4", "SYS"), ("NV4", "X", "PHB"), ("SYS", "PHB", "X"))
    machine = MachineInfo(hostname="h", topology=Topology(matrix=matrix, cpu_affinity=("0-7",) * 3, numa_node=(0, 0, 1)))
    table = topology_matrix(machine)
    cells = [cell for column in table.columns[1:] for cell in column._cells]
    assert all(isinstance(cell, Text) and cell.style is link_style(cell.plain) for cell in cells)

"""TUI overhead: gputop --simulate against nvitop on the same simulated NVML, in real pseudo-terminals.

Both monitors run at the same time (so machine noise hits both), each in its own
pty of 120x40 with a 1 s refresh and 8 simulated H100s.  For each we measure:

- first frame: seconds from spawn until the terminal has received the first screen (gputop: the CPU
  heatmap's title, drawn while NVML may still be starting; nvitop: its first screen, which has GPU data),
  and the CPU the process had used by then (less sensitive than wall time to the load on a busy box);
- first GPU readings: seconds from spawn until the GPU cards are on the terminal ("GPU0");
- CPU: % of one core over the steady-state window (utime + stime of the process, all threads);
- bytes/s written to the terminal over the same window;
- RSS at start (the end of the warm-up), at the end of the window (and the peak, VmHWM), and the growth
  between the two: `--seconds 600` gives issue 22's "RSS after 10 minutes" figure.

nvitop reads pynvml, so a small wrapper installs the project's fake library below
pynvml before nvitop starts (the same fake `gputop --simulate` uses).

    python benchmarks/bench_tui.py [--seconds 30] [--warmup 5] [--no-nvitop] [--json]

Bars (issue 3): CPU <= 1.5 %, <= 5 KB/s, first frame <= 0.6 s, RSS <= 80 MiB.
Bars (issue 15): CPU <= nvitop's, <= 3 KB/s, first frame <= 0.25 s, RSS <= 40 MiB; the table shows both.
Bars (issue 22), side by side in the same run: CPU <= nvitop's; first frame <= the one-widget Textual app's
+ 0.15 s (that app imports pynvml and psutil, as any GPU monitor must); RSS at start <= that app's + 10 MiB;
RSS growth since start <= 15 MiB over 10 minutes (`--seconds 600`; a shorter window is reported, not judged).

Three things keep the comparison fair and say what is out of gputop's hands:

- bytecode: both tools start with their modules' bytecode cached, as after `pip install` (which compiles
  it).  A box with PYTHONDONTWRITEBYTECODE=1 would otherwise recompile gputop's ~70 modules at every
  start (~0.1 s) while nvitop's site-packages already hold theirs; the bench points PYTHONPYCACHEPREFIX
  at a temporary folder and starts each tool once, uncounted, to fill it.
- the simulated NVML is Python, the real library is C: in the steady window every fake NVML call is
  timed (thread CPU) inside each tool, and the CPU row is also shown without it ("less fake NVML").
- Textual's own floor: a one-widget Textual app that imports pynvml and psutil is started the same way,
  so first frame and RSS can be read against what Textual and the two libraries cost on this box.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from dataclasses import asdict, dataclass
from typing import Optional

COLUMNS, ROWS = 120, 40
# Per tool, text that its first frame prints ("frame") and text it prints only once GPU readings are on screen
# ("gpus"): gputop's first frame has the CPU heatmap's title ("CPU 8 cores") and no GPU cards while NVML starts;
# nvitop draws nothing before it has read the GPUs (its memory column); the floor's one line stands for both.
# Each marker is in the tool's first whole screen: Textual writes a frame in one piece, and gputop's first
# frame is its whole monitor (header, verdict, cards or "reading GPUs…", CPU, jobs, keys; tests/tui/test_startup
# checks it), so the heatmap's title times that screen.  It needs the first poll's CPU readings: a first
# frame drawn without them ("waiting for the first sample…") does not count, the next one does.
FRAME_MARKERS = {
    "gputop": {"frame": b" cores", "gpus": b"GPU0"},
    "nvitop": {"frame": b"GiB / ", "gpus": b"GiB / "},
    "textual floor": {"frame": b"GPU0", "gpus": b"GPU0"},
    "collector only": {},
}
FRAME_MARKERS["gputop timed"] = FRAME_MARKERS["gputop"]
FRAME_MARKERS["nvitop timed"] = FRAME_MARKERS["nvitop"]
BARS = {"cpu_percent": 1.5, "bytes_per_s": 5 * 1024, "first_frame_s": 0.6, "rss_mib": 80.0}
# issue 15's bars; CPU's is nvitop's own figure in the same run (None: compared in the ratio column)
BARS_ISSUE_15 = {"cpu_percent": None, "bytes_per_s": 3 * 1024, "first_frame_s": 0.25, "rss_mib": 40.0}
# issue 22's bars, each against a figure of the same run: the floor's first frame + 0.15 s, its RSS at start
# + 10 MiB, nvitop's CPU; and gputop's own RSS at start + 15 MiB after 10 minutes
FIRST_FRAME_OVER_FLOOR_S = 0.15
RSS_OVER_FLOOR_MIB = 10.0
RSS_GROWTH_MIB = 15.0
RSS_GROWTH_OVER_S = 600.0

# The smallest Textual app of a GPU monitor: one line of text, with pynvml and psutil imported (every GPU
# monitor needs both).  What Textual and the two libraries cost to start and to hold in memory.
TEXTUAL_FLOOR = r"""
import psutil
import pynvml
from textual.app import App
from textual.widgets import Static


class Floor(App):
    def compose(self):
        yield Static("GPU0 (a one-widget Textual app)")


Floor().run()
"""

# Run inside a twin of each tool, beside the plain one: times every fake NVML call in thread CPU seconds
# and writes the running total to $BENCH_FAKE_NVML_FILE, so the bench can take the simulation's own cost
# out of the plain tool's CPU.  The twins' own CPU is not reported (the timing adds to it).
FAKE_NVML_TIMER = r"""
import os, threading, time
from gputop.sim import fake_nvml as _fake_nvml

_fake_cpu = [0.0]
_inside = threading.local()
_build_symbols = _fake_nvml.FakeNvmlLibrary._build_symbols


def _timed(fn):
    def timed(*args):
        if getattr(_inside, "depth", 0):
            return fn(*args)
        _inside.depth = 1
        start = time.thread_time()
        try:
            return fn(*args)
        finally:
            _fake_cpu[0] += time.thread_time() - start
            _inside.depth = 0
    timed.__name__ = fn.__name__
    return timed


def _timed_symbols(self):
    return {name: _timed(fn) for name, fn in _build_symbols(self).items()}


_fake_nvml.FakeNvmlLibrary._build_symbols = _timed_symbols


def _report_fake_cpu(path=os.environ["BENCH_FAKE_NVML_FILE"]):
    while True:
        with open(path + ".tmp", "w") as fh:
            fh.write(repr(_fake_cpu[0]))
        os.replace(path + ".tmp", path)
        time.sleep(1.0)


threading.Thread(target=_report_fake_cpu, daemon=True).start()
"""

# gputop's own command line, behind the timer above
GPUTOP_TIMED = (
    FAKE_NVML_TIMER
    + r"""
import sys
from gputop.cli import main
sys.exit(main(sys.argv[1:]))
"""
)

# The collection alone, as gputop's TUI does it (one poll a second), to show what the screen itself costs.
COLLECTOR_ONLY = r"""
import sys, time
from gputop.backend import SimulatedMachine
from gputop.pipeline import Pipeline
pipeline = Pipeline(SimulatedMachine(sys.argv[1]))
next_at = time.monotonic()
while True:
    pipeline.poll()
    next_at += 1.0
    time.sleep(max(0.0, next_at - time.monotonic()))
"""

NVITOP_WRAPPER = r"""
import sys, time
from gputop.collect.gpu import use_nvml_library
from gputop.sim.fake_nvml import FakeNvmlLibrary
from gputop.sim.spec import parse_spec
from gputop.sim.synthetic import SyntheticLoad

# nvitop asks for symbols our fake does not serve (encoder/decoder utilization, ...): answer them as
# a driver without the feature does, NVML_ERROR_NOT_SUPPORTED, instead of FunctionNotFound log spam.
class NotSupportedElsewhere:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        try:
            return getattr(self._inner, name)
        except AttributeError:
            def not_supported(*args):
                return 3  # NVML_ERROR_NOT_SUPPORTED
            return not_supported


spec = parse_spec(sys.argv[1])
load = SyntheticLoad(spec.profile.gpu_count, spec.profile.gpu.memory_total)
use_nvml_library(NotSupportedElsewhere(FakeNvmlLibrary(spec, load, clock=time.monotonic)))
from nvitop.cli import main
sys.argv = ["nvitop", *sys.argv[2:]]
sys.exit(main())
"""


@dataclass
class Result:
    name: str
    first_frame_s: Optional[float] = None
    first_gpus_s: Optional[float] = None  # until the GPU readings are on screen (gputop: the cards)
    rss_start_mib: Optional[float] = None  # at the end of the warm-up
    rss_growth_mib: Optional[float] = None  # from the end of the warm-up to the end of the window
    window_s: Optional[float] = None
    cpu_percent: Optional[float] = None
    bytes_per_s: Optional[float] = None
    rss_mib: Optional[float] = None
    peak_rss_mib: Optional[float] = None
    first_frame_all: Optional[list[float]] = None  # every start, for the spread
    first_frame_cpu_s: Optional[float] = None  # CPU seconds the process had used when its first frame arrived
    fake_nvml_cpu_percent: Optional[float] = None  # of cpu_percent, spent inside the simulated NVML
    error: Optional[str] = None


class PtyProcess:
    """A command on the slave side of a fresh pty of a fixed size; we read everything it writes."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.fake_nvml_file = env.get("BENCH_FAKE_NVML_FILE")
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.master = master
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, close_fds=True
        )
        os.close(slave)
        os.set_blocking(master, False)
        self.total_bytes = 0
        self.seen: dict[str, float] = {}  # marker name -> seconds from spawn until it was on the terminal
        self.cpu_at: dict[str, float] = {}  # marker name -> CPU seconds the process had used by then
        self._tail = b""
        self.output_head = b""
        self.markers = FRAME_MARKERS[name]
        self._longest = max((len(m) for m in self.markers.values()), default=1)

    @property
    def first_frame(self) -> Optional[float]:
        return self.seen.get("frame")

    @property
    def all_seen(self) -> bool:
        return len(self.seen) == len(self.markers)

    def pump(self) -> None:
        """Read what is waiting (non-blocking)."""
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except BlockingIOError:
                return
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            self.total_bytes += len(chunk)
            if len(self.output_head) < 4096:
                self.output_head += chunk[:4096]
            if not self.all_seen:
                window = self._tail + chunk
                for key, marker in self.markers.items():
                    if key not in self.seen and marker in window:
                        self.seen[key] = time.monotonic() - self.started
                        try:
                            self.cpu_at[key] = self.cpu_seconds()
                        except (OSError, IndexError, ValueError):  # it has exited meanwhile
                            pass
                self._tail = window[-self._longest :]

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)

    def fake_nvml_seconds(self) -> Optional[float]:
        """Thread CPU seconds the tool has spent inside the simulated NVML so far (FAKE_NVML_TIMER)."""
        if not self.fake_nvml_file:
            return None
        try:
            with open(self.fake_nvml_file) as fh:
                return float(fh.read())
        except (OSError, ValueError):
            return None

    def rss_mib(self) -> tuple[float, float]:
        values = {}
        with open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0]) / 1024
        return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.write(self.master, b"q")
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        os.close(self.master)


def pump_until(procs: list[PtyProcess], deadline: float) -> None:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        fds = [p.master for p in procs]
        select.select(fds, [], [], min(remaining, 0.5))
        for p in procs:
            p.pump()


def _commands(profile: str, with_nvitop: bool) -> list[tuple[str, list[str]]]:
    """The tools as a user starts them, and the one-widget Textual app."""
    commands = [("gputop", [sys.executable, "-m", "gputop", "tui", "--simulate", profile, "--interval", "1"])]
    if with_nvitop:
        commands.append(("nvitop", [sys.executable, "-c", NVITOP_WRAPPER, profile, "--interval", "1"]))
    commands.append(("textual floor", [sys.executable, "-c", TEXTUAL_FLOOR]))
    return commands


def _timed_twins(profile: str, with_nvitop: bool) -> list[tuple[str, list[str]]]:
    """Each tool again behind FAKE_NVML_TIMER, to learn how much of its CPU the simulated NVML takes."""
    twins = [("gputop timed", [sys.executable, "-c", GPUTOP_TIMED, "tui", "--simulate", profile, "--interval", "1"])]
    if with_nvitop:
        twins.append(("nvitop timed", [sys.executable, "-c", FAKE_NVML_TIMER + NVITOP_WRAPPER, profile, "--interval", "1"]))
    return twins


_PYCACHE = tempfile.mkdtemp(prefix="bench_tui_pycache_")


def _env(fake_nvml_file: Optional[str] = None) -> dict[str, str]:
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(ROWS), LANG="C.UTF-8")
    for name in ("NO_COLOR", "TEXTUAL", "COLORTERM", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    env["PYTHONPYCACHEPREFIX"] = _PYCACHE  # bytecode cached as after an install, without writing into the tree
    if fake_nvml_file:
        env["BENCH_FAKE_NVML_FILE"] = fake_nvml_file
    return env


def measure_first_frames(commands: list[tuple[str, list[str]]], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Start each tool alone (alternating, `repeats` times) and time its first frame and its first GPU readings;
    "frame_cpu": the CPU the process had used by its first frame."""
    times: dict[str, dict[str, list[float]]] = {name: {"frame": [], "gpus": [], "frame_cpu": []} for name, _ in commands}
    for repeat in range(repeats + 1):  # the first round, uncounted, fills the bytecode cache
        for name, argv in commands:
            proc = PtyProcess(name, argv, _env())
            try:
                deadline = time.monotonic() + 10
                while not proc.all_seen and time.monotonic() < deadline and proc.proc.poll() is None:
                    pump_until([proc], min(deadline, time.monotonic() + 0.02))
                if repeat > 0:
                    for key, seconds in proc.seen.items():
                        times[name][key].append(seconds)
                    if "frame" in proc.cpu_at:
                        times[name]["frame_cpu"].append(proc.cpu_at["frame"])
            finally:
                proc.stop()
    return times


def run(seconds: float, warmup: float, with_nvitop: bool, profile: str, repeats: int = 3) -> list[Result]:
    commands = _commands(profile, with_nvitop)
    first = measure_first_frames(commands, repeats)
    # steady state: every tool at once, so load from anything else on the machine hits all of them
    steady = commands + [("collector only", [sys.executable, "-c", COLLECTOR_ONLY, profile])]
    timed = _timed_twins(profile, with_nvitop)
    procs = [PtyProcess(name, argv, _env()) for name, argv in steady]
    procs += [PtyProcess(name, argv, _env(os.path.join(_PYCACHE, name.replace(" ", "_")))) for name, argv in timed]
    results = {p.name: Result(p.name) for p in procs}
    try:
        pump_until(procs, time.monotonic() + warmup)
        for p in procs:
            if p.proc.poll() is not None:
                results[p.name].error = f"exited early ({p.proc.returncode}): {p.output_head[-300:]!r}"
        live = [p for p in procs if p.proc.poll() is None]
        rss0 = {p.name: p.rss_mib()[0] for p in live}
        cpu0 = {p.name: p.cpu_seconds() for p in live}
        bytes0 = {p.name: p.total_bytes for p in live}
        fake0 = {p.name: p.fake_nvml_seconds() for p in live}
        t0 = time.monotonic()
        pump_until(live, t0 + seconds)
        elapsed = time.monotonic() - t0
        for p in live:
            r = results[p.name]
            r.cpu_percent = 100.0 * (p.cpu_seconds() - cpu0[p.name]) / elapsed
            r.bytes_per_s = (p.total_bytes - bytes0[p.name]) / elapsed
            r.rss_mib, r.peak_rss_mib = p.rss_mib()
            r.rss_start_mib, r.rss_growth_mib, r.window_s = rss0[p.name], r.rss_mib - rss0[p.name], elapsed
            fake = p.fake_nvml_seconds()
            if fake is not None and fake0[p.name] is not None:
                r.fake_nvml_cpu_percent = 100.0 * (fake - fake0[p.name]) / elapsed
    finally:
        for p in procs:
            p.stop()
    for name, _argv in timed:  # the twin's fake NVML share, charged to the plain tool
        results[name.removesuffix(" timed")].fake_nvml_cpu_percent = results[name].fake_nvml_cpu_percent
    for name, by_marker in first.items():
        if by_marker["frame"]:
            results[name].first_frame_s = statistics.median(by_marker["frame"])
            results[name].first_frame_all = [round(v, 3) for v in by_marker["frame"]]
        if by_marker["gpus"]:
            results[name].first_gpus_s = statistics.median(by_marker["gpus"])
        if by_marker["frame_cpu"]:
            results[name].first_frame_cpu_s = statistics.median(by_marker["frame_cpu"])
    return list(results.values())


def _fmt(value: Optional[float], spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_table(results: list[Result]) -> None:
    by_name = {r.name: r for r in results}
    g, n, floor = by_name.get("gputop"), by_name.get("nvitop"), by_name.get("textual floor")
    rows = [
        ("CPU, % of one core", "cpu_percent", ".2f"),
        ("to the terminal, B/s", "bytes_per_s", ".0f"),
        ("first frame, s", "first_frame_s", ".2f"),
        ("RSS, MiB", "rss_mib", ".1f"),
    ]
    print(
        f"{'metric':24} {'gputop':>8} {'nvitop':>8} {'ratio':>6} {'bar 3':>6} {'ok':>3} {'bar 15':>7} {'ok':>3}"
        f" {'textual floor':>14}"
    )
    for label, key, spec in rows:
        gv = getattr(g, key) if g else None
        nv = getattr(n, key) if n else None
        ratio = f"{gv / nv:.2f}" if gv is not None and nv else "n/a"
        bar15 = BARS_ISSUE_15[key] if BARS_ISSUE_15[key] is not None else nv
        ok3 = "yes" if gv is not None and gv <= BARS[key] else "NO"
        ok15 = "yes" if gv is not None and bar15 is not None and gv <= bar15 else "NO"
        fv = getattr(floor, key) if floor and key != "cpu_percent" else None
        print(
            f"{label:24} {_fmt(gv, spec):>8} {_fmt(nv, spec):>8} {ratio:>6} {BARS[key]:>6g} {ok3:>3}"
            f" {_fmt(bar15, spec):>7} {ok15:>3} {_fmt(fv, spec):>14}"
        )
    if g and n and g.cpu_percent is not None and n.cpu_percent is not None:
        if g.fake_nvml_cpu_percent is not None and n.fake_nvml_cpu_percent is not None:
            g_net, n_net = g.cpu_percent - g.fake_nvml_cpu_percent, n.cpu_percent - n.fake_nvml_cpu_percent
            ratio = f"{g_net / n_net:.2f}" if n_net > 0 else "n/a"
            ok = "yes" if g_net <= n_net else "NO"
            print(
                f"{'CPU less fake NVML':24} {g_net:>8.2f} {n_net:>8.2f} {ratio:>6} {'':>6} {'':>3} {n_net:>7.2f} {ok:>3}"
                f"   (fake NVML itself: gputop {g.fake_nvml_cpu_percent:.2f}%, nvitop {n.fake_nvml_cpu_percent:.2f}%)"
            )
    c = by_name.get("collector only")
    if c is not None and c.cpu_percent is not None and g is not None and g.cpu_percent is not None:
        print(
            f"of gputop's CPU, collection alone (simulated NVML + psutil, 1 poll/s) is {c.cpu_percent:.2f}%; "
            f"the screen is the other {g.cpu_percent - c.cpu_percent:.2f}%"
        )
    print_issue_22(results)
    for r in results:
        if r.first_frame_all:
            print(f"{r.name} first frames (s): {r.first_frame_all}  (median shown)")
        if r.error:
            print(f"{r.name}: {r.error}")


@dataclass
class Bar:
    """One of issue 22's bars: gputop's figure against one measured in the same run."""

    metric: str
    gputop: Optional[float]
    against: str  # what the bar is made of, e.g. "floor 0.41 + 0.15"
    bar: Optional[float]
    judged: bool = True  # False: reported only (a window shorter than the bar's)

    @property
    def met(self) -> Optional[bool]:
        if not self.judged or self.gputop is None or self.bar is None:
            return None
        return self.gputop <= self.bar


def issue_22_bars(results: list[Result]) -> list[Bar]:
    by_name = {r.name: r for r in results}
    g, n, floor = by_name.get("gputop", Result("gputop")), by_name.get("nvitop"), by_name.get("textual floor", Result(""))
    bars = [
        Bar(
            "CPU, % of one core",
            g.cpu_percent,
            f"nvitop {_fmt(n.cpu_percent, '.2f')}" if n else "no nvitop",
            n.cpu_percent if n else None,
        ),
        Bar(
            "first frame, s",
            g.first_frame_s,
            f"floor {_fmt(floor.first_frame_s, '.2f')} + {FIRST_FRAME_OVER_FLOOR_S:g}",
            None if floor.first_frame_s is None else floor.first_frame_s + FIRST_FRAME_OVER_FLOOR_S,
        ),
        Bar(
            "RSS at start, MiB",
            g.rss_start_mib,
            f"floor {_fmt(floor.rss_start_mib, '.1f')} + {RSS_OVER_FLOOR_MIB:g}",
            None if floor.rss_start_mib is None else floor.rss_start_mib + RSS_OVER_FLOOR_MIB,
        ),
        Bar(
            "RSS growth since start, MiB",
            g.rss_growth_mib,
            f"own start + {RSS_GROWTH_MIB:g} over {RSS_GROWTH_OVER_S / 60:g} min",
            RSS_GROWTH_MIB,
            judged=(g.window_s or 0.0) >= RSS_GROWTH_OVER_S - 1,
        ),
    ]
    return bars


def print_issue_22(results: list[Result]) -> None:
    by_name = {r.name: r for r in results}
    g = by_name.get("gputop")
    window = g.window_s if g is not None and g.window_s is not None else 0.0
    print(f"\nissue 22, side by side in this run ({window:.0f} s window after the warm-up):")
    print(f"  {'metric':30} {'gputop':>8}  {'bar':>10}  {'made of':36} {'met':>4}")
    for bar in issue_22_bars(results):
        met = {True: "yes", False: "NO", None: "n/a"}[bar.met]
        if not bar.judged:
            met = f"not judged: {window:.0f} s < {RSS_GROWTH_OVER_S:.0f} s (run --seconds {RSS_GROWTH_OVER_S:.0f})"
        print(f"  {bar.metric:30} {_fmt(bar.gputop, '.2f'):>8}  {_fmt(bar.bar, '.2f'):>10}  {bar.against:36} {met:>4}")
    floor = by_name.get("textual floor")
    if g is not None and g.first_frame_cpu_s is not None and floor is not None and floor.first_frame_cpu_s is not None:
        print(
            f"  CPU used by the first frame: gputop {g.first_frame_cpu_s:.2f} s, floor {floor.first_frame_cpu_s:.2f} s"
            f" (+{g.first_frame_cpu_s - floor.first_frame_cpu_s:.2f}; medians, less sensitive to load than wall time)"
        )
    if g is not None and g.first_gpus_s is not None:
        n = by_name.get("nvitop")
        nvitop = f" (nvitop's first screen, with its GPUs: {_fmt(n.first_gpus_s, '.2f')} s)" if n else ""
        print(f"  gputop's GPU cards on screen after {g.first_gpus_s:.2f} s{nvitop}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="steady-state window (default 30)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the window starts (default 5)")
    parser.add_argument("--profile", default="h100-sxm-8")
    parser.add_argument("--no-nvitop", action="store_true", help="measure gputop only")
    parser.add_argument("--repeats", type=int, default=3, help="first-frame starts per tool (default 3)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with_nvitop = not args.no_nvitop
    if with_nvitop:
        try:
            import nvitop  # noqa: F401
        except ImportError:
            print("nvitop is not installed (pip install nvitop); measuring gputop alone", file=sys.stderr)
            with_nvitop = False
    try:
        results = run(args.seconds, args.warmup, with_nvitop, args.profile, args.repeats)
    finally:
        shutil.rmtree(_PYCACHE, ignore_errors=True)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(f"{COLUMNS}x{ROWS} pty, 1 s refresh, --simulate {args.profile}, {args.seconds:g} s window after {args.warmup:g} s")
        print_table(results)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    gputop = next(r for r in results if r.name == "gputop")
    ok = all(getattr(gputop, k) is not None and getattr(gputop, k) <= v for k, v in BARS.items())
    ok = ok and all(bar.met is not False for bar in issue_22_bars(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

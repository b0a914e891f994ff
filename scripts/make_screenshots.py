"""Write screenshots/*.svg (and *.png where rsvg-convert or cairosvg is installed) from the app itself.

The app runs headless on the simulated machine (`--simulate h100-sxm-8`: 8 H100s on NVSwitch) with a
clock that only moves one second per poll, so every run draws the same pictures.  The host side
is simulated as well, as the 128-core, two-NUMA-node box such GPUs sit in: with this machine's own
CPUs the pictures would change from one machine to the next.

    python scripts/make_screenshots.py [--out screenshots] [--seconds 90] [--no-demo | --only-demo [--demo S]]

The demo pictures (`demo-starved`, `demo-tuned`) come from `gputop demo`'s real PyTorch job on this
machine, so they differ a little from run to run: they are taken once the verdict has settled.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional

from rich.cells import cell_len

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HOST_CORES = 128
MACHINE_CORES = os.cpu_count() or 1  # before build_source() pretends to have HOST_CORES: the demo job runs here
GIB = 1024**3


class SimulatedHost:
    """A deterministic stand-in for the psutil host collector: 128 cores on two NUMA nodes."""

    hostname = "dgx-sim-01"
    cpu_model = "AMD EPYC 7742 64-Core Processor"
    cpu_count = HOST_CORES

    def __init__(self) -> None:
        self.tick = 0

    def sample(self):
        from gputop.model import HostSample

        self.tick += 1
        percents = []
        for core in range(HOST_CORES):
            # eight busy input-pipeline cores per NUMA node, the rest lightly loaded
            busy = core % 64 < 8
            wobble = ((core * 37 + self.tick * 11) % 17) - 8
            percents.append(float(max(0, min(100, (92 if busy else 9) + wobble))))
        return HostSample(
            cpu_percent=tuple(percents),
            core_numa=tuple(0 if c < HOST_CORES // 2 else 1 for c in range(HOST_CORES)),
            iowait_percent=0.8,
            steal_percent=0.0,
            memory_total=1024 * GIB,
            memory_used=318 * GIB,
            memory_available=690 * GIB,
            swap_total=8 * GIB,
            swap_used=0,
            load_average=(17.2, 16.8, 15.9),
        )

    def close(self) -> None:
        pass


class SteppedSource:
    """The pipeline, with its clock advanced one second per poll; blocks after `count` polls."""

    def __init__(self, pipeline, clock, count: int) -> None:
        self.pipeline = pipeline
        self.machine = pipeline.machine
        self.clock = clock
        self.count = count
        self.polls = 0
        self._closed = threading.Event()

    def poll(self):
        if self.polls >= self.count:
            self._closed.wait()
            from gputop.errors import GputopError

            raise GputopError("closed")
        self.clock.advance(1.0)
        self.polls += 1
        return self.pipeline.poll()

    def close(self) -> None:
        self._closed.set()
        self.pipeline.close()

    # the machine check (key c) reads the live pipeline's NVML and its simulated kernel tree
    @property
    def live_pipeline(self):
        return self.pipeline


def build_source(seconds: int, profile: str) -> SteppedSource:
    # The simulated GPUs' CPU affinity is laid out over the host's CPUs: make it the simulated host's.
    os.cpu_count = lambda: HOST_CORES  # type: ignore[assignment]  # this script's process only
    import gputop.collect.gpu as gpu_collector

    gpu_collector.possible_cpus = lambda path=None: HOST_CORES  # the affinity mask's size: the simulated host's CPUs
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Pipeline
    from gputop.sim.fake_nvml import ManualClock

    clock = ManualClock(start=1_700_000_000.0)
    pipeline = Pipeline(SimulatedMachine(profile, clock=clock, host=SimulatedHost()))
    return SteppedSource(pipeline, clock, seconds)


async def shoot(out: Path, name: str, size: tuple[int, int], keys: list[str], seconds: int, profile: str) -> Path:
    from gputop.tui.app import GputopApp

    source = build_source(seconds, profile)
    app = GputopApp(source, interval=0.001)
    try:
        async with app.run_test(size=size) as pilot:
            while not (source.polls >= source.count and app.monitor.snapshots_seen >= source.count and app.diagnoses_done >= 1):
                await pilot.pause(0.05)
            # the header shows the interval the user would run with, not the script's fast-forward
            app.monitor.interval = 1.0
            app.query_one("#header").set_state(interval=1.0, paused=False)
            app.actions.check_seconds = 0.5  # the stepped source stands still after its last poll: nothing to wait for
            for key in keys:
                await pilot.press(key)
            while "c" in keys and app.monitor.check is None:
                await pilot.pause(0.05)
            await pilot.pause()
            return _save_svg(app, out, name)
    finally:
        source.close()


async def shoot_trace(out: Path, seconds: int, profile: str) -> Path:
    """The trace dialog (key t) showing `gputop trace`'s result for two ranks of a real NCCL job on GPUs
    (HTA's public traces in tests/fixtures/traces, summarised as `gputop trace --from` does)."""
    from gputop.tracing import trace_from_files
    from gputop.tui.app import GputopApp
    from gputop.tui.trace_screen import TraceScreen

    traces = ROOT / "tests" / "fixtures" / "traces"
    result = trace_from_files([str(traces / "hta_nccl_rank-0.json.gz"), str(traces / "hta_nccl_rank-1.json.gz")])
    source = build_source(seconds, profile)
    app = GputopApp(source, interval=0.001)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            while not (source.polls >= source.count and app.monitor.snapshots_seen >= source.count and app.diagnoses_done >= 1):
                await pilot.pause(0.05)
            app.monitor.interval = 1.0
            app.query_one("#header").set_state(interval=1.0, paused=False)
            screen = TraceScreen(4037, "launcher 4030, 2 rank(s)", lambda _pid: None)
            await app.push_screen(screen)
            await pilot.pause()
            screen.show_result(result.summary_lines())
            await pilot.pause()
            return _save_svg(app, out, "trace")
    finally:
        source.close()


async def shoot_fleet(out: Path) -> Path:
    """`gputop fleet` over two nodes of one 8-rank job with a straggler on node1: the Prometheus stand-in the
    tests answer from real Exporters (tests/tui/test_fleet_app.py), so the picture is the tested screen."""
    from tests.tui.test_fleet_app import fleet_app, two_node_prometheus

    app = fleet_app(two_node_prometheus(), url="http://prometheus:9090", interval=5.0)
    async with app.run_test(size=(120, 32)) as pilot:
        await pilot.pause()
        return _save_svg(app, out, "fleet")


async def shoot_fleet_256(out: Path) -> Path:
    """`gputop fleet` over 256 nodes × 8 GPUs at 120×40: the synthetic fleet the scale tests answer from
    (tests/harness/fleet_scale.py: real serve pages per node, a straggler, a hung rank, a NIC down, a node
    that stopped reporting)."""
    from tests.test_fleet_scale import fleet_prom
    from tests.tui.test_fleet_app import fleet_app

    app = fleet_app(fleet_prom(256), url="http://prometheus:9090", interval=5.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        return _save_svg(app, out, "fleet-256")


def _save_svg(app, out: Path, name: str) -> Path:
    svg = app.export_screenshot(title=f"gputop — {name}")
    # rsvg drops leading no-break spaces of a text run unless whitespace is preserved
    svg = svg.replace("<svg ", '<svg xml:space="preserve" ', 1)
    path = out / f"{name}.svg"
    path.write_text(svg, encoding="utf-8")
    return path


DEMO_SETTLE_S = 40.0  # seconds of training the diagnosis watches before the picture (it needs ~5 dumps)
DEMO_DEADLINE_S = 600.0
PANEL_CATCH_UP_S = 0.3  # the stacks panel redraws on the snapshot that carried the wanted state  # starting 8 ranks of torch on a loaded 2-core box can take minutes


async def shoot_demo(out: Path, scenario: str, expected_finding: str, rank_state: Optional[str]) -> Path:
    """The real demo job at 160×48 once the verdict names `expected_finding`.

    With `rank_state`, rank 0 is selected and the picture waits until its stack shows that state (the
    stack that proves the verdict); without, the launcher stays selected: every rank's state and the
    aggregate of the workers' stacks."""
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Following, Pipeline
    from gputop.sim.demo_launcher import DemoJob

    with DemoJob(scenario, cpu_count=MACHINE_CORES) as job:
        launcher_pid = job.start()  # first: the load model is the started job's
        pipeline = Pipeline(SimulatedMachine("h100-sxm-8", load=job.load_model()), follow=Following(pid=launcher_pid))
        try:
            job.wait_until_training()
            return await _shoot_running_demo(out, pipeline, scenario, expected_finding, rank_state)
        finally:
            pipeline.close()


async def _shoot_running_demo(out: Path, pipeline, scenario: str, expected_finding: str, rank_state: Optional[str]) -> Path:
    import time

    from gputop.tui.app import GputopApp

    name = f"demo-{scenario}"
    trained_from = time.monotonic()
    app = GputopApp(pipeline, interval=1.0, subtitle=f"demo: {scenario}")
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = trained_from + DEMO_DEADLINE_S
        while True:
            findings = app.monitor.verdict.findings if app.monitor.verdict is not None else None
            settled = time.monotonic() - trained_from >= DEMO_SETTLE_S
            if settled and findings and findings[0].id == expected_finding and _names_collective(findings[0], scenario):
                break
            if time.monotonic() > deadline:
                got = findings[0].id if findings else None
                raise SystemExit(f"{name}: the verdict never became {expected_finding!r} (last: {got!r})")
            await pilot.pause(0.5)
        if rank_state is not None:
            await pilot.press("j")  # from the launcher to rank 0 (the tree is filled by now): its stack shows
            while _rank0_state(app) != rank_state and time.monotonic() < deadline:
                await pilot.pause(0.2)
            await pilot.pause(PANEL_CATCH_UP_S)
        path = _save_svg(app, out, name)
        if scenario in FINDINGS_SHOTS:  # the findings screen (f): the hang's collective line in full
            await pilot.press("f")
            await pilot.pause(PANEL_CATCH_UP_S)
            _save_svg(app, out, f"{name}-findings")
        return path


# Scenarios whose ranks run with the flight recorder on: their hang's picture waits for the collective the
# in-process read names, and a second picture shows the findings screen with it.
FINDINGS_SHOTS = ("nccl-hang",)


def _names_collective(finding, scenario: str) -> bool:
    if scenario not in FINDINGS_SHOTS:
        return True
    return (finding.figures.get("collective") or {}).get("source") == "flight recorder"


def _rank0_state(app) -> Optional[str]:
    latest = app.monitor.history.latest
    ranks = latest.job.ranks if latest is not None and latest.job is not None else ()
    return ranks[0].main_thread_state if ranks else None


# nccl-hang: busy GPUs (spinning at low power) and yet a hang, with the launcher selected: every rank's state
DEMO_SHOTS = [("starved", "starvation", "in dataset code"), ("tuned", "healthy", None), ("nccl-hang", "hang", None)]


_TEXT_RUN = re.compile(r'<text ([^>]*?)x="([\d.]+)"([^>]*?)textLength="([\d.]+)"([^>]*)>([^<]*)</text>')


def one_cell_per_glyph(svg: str) -> str:
    """Each character of a text run at its own cell's x.

    librsvg ignores `textLength`, so a run of glyphs whose advance is not exactly one cell (the box
    rules ─, the sparkline blocks) drifts: the dialog's top rule ran past its right corner and looked
    cut off. Positioned one by one, every glyph sits in its cell whatever the font's advance."""

    def split(match: "re.Match[str]") -> str:
        before, x, middle, length, after, text = match.groups()
        chars = html.unescape(text)
        cells = sum(cell_len(c) for c in chars)
        if cells <= 1:
            return match.group(0)
        cell = float(length) / cells
        out, at = [], float(x)
        for char in chars:
            width = cell_len(char) * cell
            if not char.isspace():
                out.append(
                    f'<text {before}x="{at:.1f}"{middle}textLength="{width:.1f}"{after}>{html.escape(char, quote=False)}</text>'
                )
            at += width
        return "".join(out)

    return _TEXT_RUN.sub(split, svg)


def to_png(svg: Path) -> Optional[Path]:
    png = svg.with_suffix(".png")
    if shutil.which("rsvg-convert"):
        with tempfile.NamedTemporaryFile("w", suffix=".svg", encoding="utf-8") as fixed:
            fixed.write(one_cell_per_glyph(svg.read_text(encoding="utf-8")))
            fixed.flush()
            subprocess.run(["rsvg-convert", fixed.name, "-o", str(png)], check=True)
        return png
    try:
        import cairosvg  # type: ignore[import-not-found]
    except ImportError:
        return None
    cairosvg.svg2png(url=str(svg), write_to=str(png))
    return png


SHOTS = [  # (name, size, keys, faults added to --profile)
    ("main-160x48", (160, 48), [], ""),
    ("main-80x24", (80, 24), [], ""),
    ("main-100x30", (100, 30), [], ""),  # a common SSH window: one line per GPU, the job tree keeps a third
    # a degraded link on the machine's picture (GPU 5's PCIe trained down, GPU 3 with an NVLink down) and the rail NICs
    ("topology", (160, 48), ["T"], "+pcie-degraded=5+nvlink-down=3"),  # wide enough for the NIC columns beside the picture
    ("help", (120, 40), ["question_mark"], ""),
    # the infrastructure side: a GPU that throttles on heat, a link trained down, an XID, ECC errors
    ("infra-faults", (160, 48), [], "+thermal=2+pcie-degraded=5+xid=3:79@30+ecc=6"),
    # the machine check (key c): a GPU out of the NVLink fabric, a pending page retirement, an XID only the kernel log has
    ("check", (160, 48), ["c"], "+topology=5+retired-page=4+kernel-xid=6:79"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "screenshots"), help="output directory (default screenshots/)")
    parser.add_argument("--seconds", type=int, default=90, help="simulated seconds before each picture (default 90)")
    parser.add_argument("--profile", default="h100-sxm-8", help="simulated machine (default h100-sxm-8)")
    parser.add_argument("--no-demo", action="store_true", help="skip the pictures of the real demo job")
    parser.add_argument("--only-demo", action="store_true", help="only the pictures of the real demo job")
    parser.add_argument("--demo", choices=[s for s, _f, _r in DEMO_SHOTS], help="only this demo scenario's pictures")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shots = (
        []
        if args.only_demo
        else [
            lambda n=name, sz=size, k=keys, f=faults: shoot(out, n, sz, k, args.seconds, args.profile + f)
            for name, size, keys, faults in SHOTS
        ]
    )
    if not args.only_demo:
        shots.append(lambda: shoot_trace(out, args.seconds, args.profile))
        shots.append(lambda: shoot_fleet(out))
        shots.append(lambda: shoot_fleet_256(out))
    if not args.no_demo:
        demos = [(s, f, r) for s, f, r in DEMO_SHOTS if args.demo in (None, s)]
        shots += [lambda s=scenario, f=finding, r=state: shoot_demo(out, s, f, r) for scenario, finding, state in demos]
    for make in shots:
        first = asyncio.run(make())
        for svg in [first] + sorted(out.glob(f"{first.stem}-findings.svg")):
            png = to_png(svg)
            print(f"wrote {svg}" + (f" and {png.name}" if png else " (no PNG converter: install librsvg2-bin or cairosvg)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GPU grid: one card per GPU, or one line per GPU on small terminals.

One widget draws every card (no widget per GPU), and `LineCanvas` repaints only
the cells that changed, so a second's update is a few sparkline cells and
numbers, not the whole grid.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from gputop.analysis.gpu_health import (
    NO_PEERS,
    GpuHealth,
    Peers,
    Severity,
    judge_recent,
    judge_sample,
    nvlink_unused,
    pcie_degraded,
    peers_of,
    slowdowns,
)
from gputop.gpu_fields import active_throttles, card_text, gpm_card_line
from gputop.model import CounterHealth, GpuSample, MigInstance, Snapshot
from gputop.tui import look
from gputop.tui.canvas import PLAIN, LineBuilder, LineCanvas, RunsKey
from gputop.units import gib_pair

READING_GPUS = "reading GPUs…"  # the placeholder until the first NVML sample lands (a starting pipeline)

_GAP = Segment(" ", PLAIN)
MIN_CARD_WIDTH = 30
CARD_LINES = 7
GPM_COMPACT_MIN_WIDTH = 90  # the one-line-per-GPU grid shows GPM's SM activity from this width
GPM_MIN_SPARK_CELLS = 8  # the card's GPM line takes the sparkline's oldest cells only while this many stay
MIN_SPARK_SECONDS = 60  # the sparkline always spans at least this much history
# the card's word for an empty CPU-affinity mask: none of this job's CPUs are near the GPU (the T dialog says it whole)
NO_NEAR_CPUS_WORD = "no job CPU near"
# a MIG-enabled GPU's state: NVML measures no utilization there, so it is neither busy nor idle
STATE_MIG = ("◇", "MIG", look.ACCENT_BOLD)


def mig_lines(gpu: GpuSample) -> int:
    """Lines a GPU's card adds below the usual ones: one per MIG instance."""
    return len(gpu.mig or ()) if not gpu.lost else 0


def mig_instance_text(instance: MigInstance) -> str:
    """One instance on the card: "GI1 3g.40gb  30/39G  4242,4343"."""
    pids = ",".join(str(p.pid) for p in instance.processes or ())
    memory = gib_pair(instance.memory_used, instance.memory_total)
    return f"GI{instance.gpu_instance_id} {instance.profile}  {memory}  {pids or '-'}"


def _is_slowdown(gpu: GpuSample) -> bool:
    return bool(slowdowns(gpu))


def health_words(health: GpuHealth) -> tuple[list[str], list[str]]:
    """(faults, warnings) as the card's short words, of a judgement (`judge_recent`: the live window)."""
    problems = health.problems
    return [p.word for p in problems if p.severity == Severity.CRITICAL], [
        p.word for p in problems if p.severity == Severity.WARN
    ]


def health_problems(gpu: GpuSample, peers: Peers = NO_PEERS) -> tuple[list[str], list[str]]:
    """(faults, warnings) as the card's short words, from the one health module (`analysis.gpu_health`) on one
    sample (a window of one): faults are its CRITICAL problems, warnings its WARN ones.  `peers`: `peers_of`
    the GPU's snapshot."""
    return health_words(judge_sample(gpu, peers))


def pcie_flagged(gpu: GpuSample) -> bool:
    """Link narrower than its maximum, or slower while the GPU works (idle GPUs drop the speed on purpose):
    the health module's PCIe rule, so the screen marks what the exporter, the check and the report say."""
    return pcie_degraded(gpu) is True


def gpu_state(gpu: GpuSample, problems: Optional[tuple[list[str], list[str]]] = None) -> tuple[str, str, Style]:
    """(symbol, word, style): LOST, FAULT, WARN, BUSY, LOW or IDLE.  `problems`: health_problems(gpu),
    when the caller has it already."""
    if gpu.lost:
        return look.STATE_LOST
    faults, warnings = problems if problems is not None else health_problems(gpu)
    if faults:
        return look.STATE_FAULT
    if warnings:
        return look.STATE_WARN
    util = gpu.utilization_gpu
    if util is None and gpu.mig is not None:
        return STATE_MIG
    if util is None:
        return look.STATE_IDLE if not gpu.processes else look.STATE_LOW
    if util >= look.BUSY_AT:
        return look.STATE_BUSY
    if util >= look.IDLE_BELOW:
        return look.STATE_LOW
    return look.STATE_IDLE


def util_style(util: Optional[float]) -> Style:
    """For a training GPU busy is good: green when busy, plain when partly used, dim when idle."""
    if util is None or util < look.IDLE_BELOW:
        return look.DIM
    return look.GOOD if util >= look.BUSY_AT else look.PLAIN


def short_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100 80GB HBM3'."""
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def spark_seconds_per_cell(cells: int, interval: float) -> float:
    """Seconds each sparkline cell covers so that the line spans at least a minute."""
    if cells <= 0:
        return 1.0
    return max(float(math.ceil(MIN_SPARK_SECONDS / cells)), interval)


# A closed sparkline bucket, by (seconds per cell, bucket): its last snapshot (the very object) and how many it
# had, with the value per GPU: see utilization_buckets' `closed` argument
ClosedBuckets = dict[tuple[float, int], tuple[Snapshot, int, dict[int, Optional[float]]]]


def _bucket_means(snapshots: Sequence[Snapshot]) -> dict[int, Optional[float]]:
    """Per GPU in these snapshots: its mean utilization, -1.0 when seen but never measured."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for snap in snapshots:
        for gpu in snap.gpus:
            if gpu.utilization_gpu is not None and not gpu.lost:
                sums[gpu.index] = sums.get(gpu.index, 0.0) + gpu.utilization_gpu
                counts[gpu.index] = counts.get(gpu.index, 0) + 1
            else:
                counts.setdefault(gpu.index, 0)
    return {i: (sums[i] / n if n else -1.0) for i, n in counts.items()}


def utilization_buckets(
    snapshots: Sequence[Snapshot],
    gpu_indices: Iterable[int],
    cells: int,
    seconds_per_cell: float,
    closed: Optional[ClosedBuckets] = None,
) -> dict[int, list[Optional[float]]]:
    """Per GPU, the mean utilization in each of the last `cells` time buckets, oldest first.

    Buckets are aligned to absolute time (timestamp // seconds_per_cell), so older cells
    never change as new samples arrive: only the newest cell is repainted.
    ``None``: no sample in that bucket; ``-1.0``: samples, but the value was not available.

    `closed`: a cache the caller keeps between frames.  Every bucket but the newest is closed (snapshots come in
    time order), so its values are kept there and the next frame reads only the newest bucket's GPUs; a
    bucket is found again only with the very same last snapshot and sample count (a new history, a replay's
    seek, computes it afresh).  Buckets that left the window are dropped from it.
    """
    indices = list(gpu_indices)
    out: dict[int, list[Optional[float]]] = {i: [None] * cells for i in indices}
    if not snapshots or cells <= 0:
        return out
    last_bucket = int(snapshots[-1].timestamp // seconds_per_cell)
    first_bucket = last_bucket - cells + 1
    # the snapshots of each bucket in the window, newest bucket first (timestamps only: cheap)
    groups: list[tuple[int, int, int]] = []  # (bucket, start, end) into snapshots
    end = len(snapshots)
    position = end - 1
    while position >= 0:
        bucket = int(snapshots[position].timestamp // seconds_per_cell)
        if bucket < first_bucket:
            break
        start = position
        while start > 0 and int(snapshots[start - 1].timestamp // seconds_per_cell) == bucket:
            start -= 1
        groups.append((bucket, start, position + 1))
        position = start - 1
    kept: ClosedBuckets = {}
    for bucket, start, stop in groups:
        last, count = snapshots[stop - 1], stop - start
        entry = closed.get((seconds_per_cell, bucket)) if closed is not None and bucket != last_bucket else None
        if entry is not None and entry[0] is last and entry[1] == count:
            means = entry[2]
        else:
            means = _bucket_means(snapshots[start:stop])
        if bucket != last_bucket:
            kept[(seconds_per_cell, bucket)] = (last, count, means)
        slot = bucket - first_bucket
        for i in indices:
            if i in means:
                out[i][slot] = means[i]
    if closed is not None:
        closed.clear()
        closed.update(kept)
    return out


def lost_since(snapshots: Sequence[Snapshot], gpu_index: int) -> Optional[float]:
    """Seconds since the GPU was last seen answering (None when it was never seen working)."""
    if not snapshots:
        return None
    for snap in reversed(snapshots):
        for gpu in snap.gpus:
            if gpu.index == gpu_index and not gpu.lost:
                return snapshots[-1].timestamp - snap.timestamp
    return None


def spark_text(values: Sequence[Optional[float]]) -> str:
    chars = []
    for value in values:
        if value is None:
            chars.append(" ")
        elif value < 0:
            chars.append("·")
        else:
            chars.append(look.level_char(value))
    return "".join(chars)


def _compact_pcie(line: LineBuilder, gpu: GpuSample) -> None:
    """A compact row's PCIe cell: the link's generation and width, "!" when it trained down."""
    link = gpu.pcie
    text = "n/a" if link.gen_current is None else f"G{link.gen_current}x{link.width_current}"
    if pcie_flagged(gpu):
        line.add((text + "!").rjust(7), look.WARN_BOLD)
    else:
        line.add(text.rjust(7))


class GpuGrid(LineCanvas):
    """Cards (wide terminals) or one line per GPU (compact)."""

    DEFAULT_CSS = """
    GpuGrid { height: auto; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.snapshots: Sequence[Snapshot] = ()
        self.interval = 1.0
        self.gpu_users: dict[int, str] = {}  # GPU index -> "r0 1234"
        self.compact = False
        self.gpu_count = 0
        self.message: Optional[str] = None  # e.g. no driver
        self.reading = False  # NVML has not answered yet (a starting pipeline): the placeholder says so
        # GPU index -> (words, is a failure): what the latest machine check (key c) found on that GPU
        self.check_marks: dict[int, tuple[str, bool]] = {}
        # What the last frame drew, reused where nothing changed (see _card_segments): per (GPU index, card
        # line) its runs and segments; per (first GPU of the row, line) the card pieces and their strip.
        self._cache_width = -1
        self._card_lines: dict[tuple[int, int], tuple[RunsKey, list[Segment]]] = {}
        self._closed_buckets: ClosedBuckets = {}  # the sparklines' closed buckets (utilization_buckets)
        self._row_strips: dict[tuple[int, int], tuple[tuple[list[Segment], ...], Strip]] = {}
        self._peers: Peers = NO_PEERS  # what the GPUs drawn are judged against (peers_of)
        self.no_near_cpus: frozenset[int] = frozenset()  # GPUs NVML gave an empty CPU-affinity mask for
        # the health module's judgement over the live window (judge_recent), made once per newest snapshot
        self._health: tuple[Optional[Snapshot], dict[int, GpuHealth]] = (None, {})
        # the pipeline's counter watch on the newest snapshot, and the marks made of it (made once per window)
        self._counter_marks: tuple[Optional[CounterHealth], dict[int, tuple[str, bool]]] = (None, {})

    # ------------------------------------------------------------------ data
    def update_data(
        self,
        snapshots: Sequence[Snapshot],
        interval: float,
        gpu_users: dict[int, str],
        message: Optional[str] = None,
        no_near_cpus: Sequence[int] = (),
        *,
        reading: bool = False,
    ) -> None:
        """`no_near_cpus`: the GPUs none of this job's CPUs are near (`Topology.gpus_without_near_cpus`)."""
        self.no_near_cpus = frozenset(no_near_cpus)
        count = len(snapshots[-1].gpus) if snapshots else 0
        relayout = count != self.gpu_count or (message is None) != (self.message is None)
        self.snapshots = snapshots
        self.interval = interval
        self.gpu_users = gpu_users
        self.message = message
        self.reading = reading
        self.gpu_count = count
        if relayout:
            self.refresh(layout=True)
        self.redraw()

    def set_compact(self, compact: bool) -> None:
        if compact != self.compact:
            self.compact = compact
            self._drawn_width = -1
            self.refresh(layout=True)
            self.redraw()

    def _marks(self) -> dict[int, tuple[str, bool]]:
        """The card marks: the counter watch's lines on the newest snapshot (`Snapshot.counter_health`, the same
        marks a machine check makes), under those of the latest machine check (key c)."""
        health = self.snapshots[-1].counter_health if self.snapshots else None
        if health is None:
            return self.check_marks
        if self._counter_marks[0] != health:  # a replay decodes an equal window per snapshot
            from gputop.analysis.counter_health import as_check_report

            self._counter_marks = (health, look.card_marks(as_check_report(health)))
        return {**self._counter_marks[1], **self.check_marks} if self.check_marks else self._counter_marks[1]

    def _problems(self, gpu: GpuSample) -> tuple[list[str], list[str]]:
        """The GPU's (faults, warnings) over the live window; a GPU the window has not judged, on its sample."""
        health = self._health[1].get(gpu.index)
        return health_words(health) if health is not None else health_problems(gpu, self._peers)

    # ------------------------------------------------------------------ geometry
    def _state(self, gpu: GpuSample, problems: Optional[tuple[list[str], list[str]]] = None) -> tuple[str, str, Style]:
        """The card's state, FAULT or WARN too where the latest machine check failed or warned on this GPU."""
        state = gpu_state(gpu, problems)
        mark = self._marks().get(gpu.index)
        if mark is None or gpu.lost or state[1] == look.STATE_FAULT[1]:
            return state
        return look.STATE_FAULT if mark[1] else look.STATE_WARN

    def _columns(self, width: int, gpu_count: Optional[int] = None) -> int:
        n = max(1, self.gpu_count if gpu_count is None else gpu_count)
        cols = max(1, min(n, width // MIN_CARD_WIDTH))
        rows = math.ceil(n / cols)
        return math.ceil(n / rows)  # balance: 8 GPUs in 5 columns -> 4+4

    def wanted_height(self, width: int) -> int:
        if self.gpu_count == 0:
            return 1
        if self.compact:
            return self.gpu_count + 1
        return self.cards_height(width)

    def cards_height(self, width: int, gpu_count: Optional[int] = None) -> int:
        """Rows the cards of `gpu_count` GPUs (default: those shown) take at `width`."""
        count = max(1, gpu_count if gpu_count is not None else self.gpu_count)
        cols = self._columns(width, count)
        rows = math.ceil(count / cols)
        gpus = self.snapshots[-1].gpus if self.snapshots else ()
        return sum(self._row_lines(gpus[r * cols : (r + 1) * cols]) for r in range(rows)) + (rows - 1)

    @staticmethod
    def _row_lines(row: Sequence[GpuSample]) -> int:
        """A row of cards is as tall as its tallest card (a MIG GPU's lists its instances)."""
        return CARD_LINES + max((mig_lines(g) for g in row), default=0)

    # ------------------------------------------------------------------ drawing
    def build(self, width: int, height: int) -> list[Strip]:
        if not self.snapshots or not self.snapshots[-1].gpus:
            text = self.message or (READING_GPUS if self.reading else "waiting for the first sample…")
            return [LineBuilder().add(" " + text, look.WARN if self.message else look.DIM).strip(width)]
        gpus = self.snapshots[-1].gpus
        self._peers = peers_of(gpus)
        if self._health[0] is not self.snapshots[-1]:  # the exporter's and the live diagnosis' window
            self._health = (self.snapshots[-1], judge_recent(self.snapshots))
        if self.compact:
            return self._build_compact(gpus, width)
        return self._build_cards(gpus, width)

    def _build_cards(self, gpus: Sequence[GpuSample], width: int) -> list[Strip]:
        cols = self._columns(width)
        card_width = width // cols
        inner = card_width - 1  # one column of gap between cards
        spark_cells = max(1, inner - 5)
        per_cell = spark_seconds_per_cell(spark_cells, self.interval)
        buckets = utilization_buckets(self.snapshots, [g.index for g in gpus], spark_cells, per_cell, self._closed_buckets)
        if width != self._cache_width:  # the cached pieces are for one card width
            self._cache_width = width
            self._card_lines.clear()
            self._row_strips.clear()
        lines: list[Strip] = []
        for row_start in range(0, len(gpus), cols):
            row = gpus[row_start : row_start + cols]
            height = self._row_lines(row)
            cards = [self._card_segments(gpu, inner, buckets[gpu.index], per_cell, height) for gpu in row]
            tail = width - card_width * len(row)
            for y in range(height):
                parts = tuple(card[y] for card in cards)
                kept = self._row_strips.get((row_start, y))
                if kept is not None and kept[0] == parts:  # the same cached pieces (compared by identity first)
                    lines.append(kept[1])
                    continue
                segments: list[Segment] = []
                for part in parts:
                    segments.extend(part)
                    segments.append(_GAP)
                if tail > 0:
                    segments.append(Segment(" " * tail, PLAIN))
                strip = Strip(segments, width)
                self._row_strips[(row_start, y)] = (parts, strip)
                lines.append(strip)
            if row_start + cols < len(gpus):
                lines.append(Strip.blank(width, PLAIN))
        return lines

    def _card_segments(
        self, gpu: GpuSample, w: int, spark: list[Optional[float]], per_cell: float, height: int = CARD_LINES
    ) -> list[list[Segment]]:
        """The card's lines as segments (`height` of them: blank below a shorter card than its row's); a line
        whose runs (text and style) are what they were last time keeps its segments, so the row's strip and the
        screen's diff see the very same objects."""
        out = []
        card = self._card(gpu, w, spark, per_cell)
        card += [LineBuilder().pad(w) for _ in range(height - len(card))]
        for y, line in enumerate(card):
            key = line.key()
            kept = self._card_lines.get((gpu.index, y))
            if kept is None or kept[0] != key:
                kept = self._card_lines[(gpu.index, y)] = (key, line.segments(w))
            out.append(kept[1])
        return out

    def _utilization_line(self, gpu: GpuSample, line: LineBuilder, spark: list[Optional[float]], w: int) -> None:
        """The card's second line: the utilization sparkline and figure (GPM's beside it where there is room)."""
        util = gpu.utilization_gpu
        if gpu.mig is not None and util is None and not gpu.lost:  # no sparkline of nothing: say why
            count = len(gpu.mig)
            words = f"MIG, {count} instance{'s' if count != 1 else ''}, util not measured"
            line.add(look.ellipsize(words, w), look.DIM)
        else:
            text = spark_text(spark)
            # GPM beside GPU-Util (Hopper and newer): the sparkline's oldest cells give it room, if enough are left
            gpm_text = None if gpu.lost else gpm_card_line(gpu)
            if gpm_text is not None and len(text) - len(gpm_text) - 2 >= GPM_MIN_SPARK_CELLS:
                text = text[len(gpm_text) + 2 :]
            else:
                gpm_text = None
            line.add(text, look.DIM if gpu.lost else look.SPARK)
            line.add(
                " " + ("LOST" if gpu.lost else card_text("utilization", gpu)), look.BAD_BOLD if gpu.lost else util_style(util)
            )
            if gpm_text is not None:
                line.add("  " + gpm_text, look.PLAIN)

    def _lost_lines(self, gpu: GpuSample, lines: list[LineBuilder], w: int) -> None:
        """A lost GPU's card below its sparkline: what happened, for how long, what to check."""
        lines[2].add(look.ellipsize("not answering: fell off the bus", w), look.BAD)
        lines[3].add(look.ellipsize("or was reset; check dmesg (Xid 79)", w), look.BAD)
        since = lost_since(self.snapshots, gpu.index)
        if since is not None:
            lines[5].add(look.ellipsize(f"lost for {since:.0f} s", w), look.BAD_BOLD)
        lines[6].add(look.ellipsize("last utilization kept above", w), look.DIM)

    def _health_line(self, gpu: GpuSample, line: LineBuilder, problems: Optional[tuple[list[str], list[str]]], w: int) -> None:
        """The card's last line: the throttle reasons, then its faults and warnings (or ECC's state) on the right."""
        faults, warnings = problems if problems is not None else ([], [])  # None only for a lost GPU, drawn above
        line.add("thr ", look.LABEL)
        line.add(
            card_text("throttle_reasons", gpu),
            look.WARN if _is_slowdown(gpu) else look.PLAIN if active_throttles(gpu) else look.DIM,
        )
        health = [p for p in faults + warnings if p not in ("throttled", "PCIe down")]
        if gpu.index in self.no_near_cpus:
            health.append(NO_NEAR_CPUS_WORD)
        mark = self._marks().get(gpu.index)
        if mark is not None:
            health.append(mark[0])
            faults = faults + [mark[0]] if mark[1] else faults
            if len(",".join(health)) + 2 > w - line.length:
                health = [mark[0]]  # no room for all: the machine check's word is the one to keep
        if health:
            line.right(" " + ",".join(health), w, look.BAD_BOLD if faults else look.WARN)
        elif gpu.ecc is None and gpu.remapped_rows is None:
            line.right("ECC n/a", w, look.DIM)
        else:
            line.right("ECC ok", w, look.GOOD)

    def _card(self, gpu: GpuSample, w: int, spark: list[Optional[float]], per_cell: float) -> list[LineBuilder]:
        problems = None if gpu.lost else self._problems(gpu)
        symbol, word, state_style = self._state(gpu, problems)
        lines = [LineBuilder() for _ in range(CARD_LINES)]
        head = lines[0]
        head.add(f"{symbol} GPU{gpu.index} {word:<5}", state_style)
        user = self.gpu_users.get(gpu.index, "")
        name_room = w - head.length - 1 - (len(user) + 1 if user else 0)
        head.add(" " + look.ellipsize(short_name(gpu.name), max(0, name_room)), look.LABEL)
        if user:
            head.right(user, w, look.ACCENT)
        head.pad(w)

        self._utilization_line(gpu, lines[1], spark, w)

        if gpu.lost:
            self._lost_lines(gpu, lines, w)
            for line in lines:
                line.pad(w)
            return lines

        # the texts come from the table of GPU fields (gpu_fields); the card says where and in which colour
        mem_text = " " + card_text("memory_used", gpu)
        filled, empty = look.bar(gpu.memory_fraction, max(1, w - 4 - len(mem_text)))
        lines[2].add("MEM ", look.LABEL).add(filled, look.ACCENT).add(empty, look.BAR_EMPTY).add(mem_text)

        l3 = lines[3]
        temp = gpu.temperature
        temp_style = look.PLAIN if temp is None or temp < 75 else look.WARN if temp < 85 else look.BAD
        l3.add(card_text("temperature", gpu), temp_style)
        near_cap = gpu.power is not None and gpu.power_limit and gpu.power >= 0.97 * gpu.power_limit
        l3.add("  " + card_text("power", gpu), look.DIM if gpu.power is None else look.WARN if near_cap else look.PLAIN)
        if gpu.clock_sm is not None and l3.length + 10 <= w:
            l3.add("  " + card_text("clock_sm", gpu), look.PLAIN)

        l4 = lines[4]
        l4.add("PCIe ", look.LABEL)
        if pcie_flagged(gpu):
            l4.add(card_text("pcie_link", gpu) + "!", look.WARN_BOLD)
        else:
            l4.add(card_text("pcie_link", gpu))
        l4.add(f" ↑{card_text('pcie_tx_bytes_per_s', gpu)} ↓{card_text('pcie_rx_bytes_per_s', gpu)}", look.PLAIN)

        l5 = lines[5]
        l5.add("NVL  ", look.LABEL)
        if gpu.nvlink:
            all_up = gpu.nvlink.active_count() == len(gpu.nvlink)
            # links a card reports inactive without a bridge are its normal state (the health module's rule)
            unused = not all_up and nvlink_unused(gpu, self._peers)
            l5.add(card_text("nvlink", gpu), look.PLAIN if all_up else look.DIM if unused else look.WARN_BOLD)
            l5.add(f" ↑{card_text('nvlink_tx_bytes_per_s', gpu)} ↓{card_text('nvlink_rx_bytes_per_s', gpu)}")
        else:
            l5.add("n/a", look.DIM)

        self._health_line(gpu, lines[6], problems, w)
        lines += self._mig_card_lines(gpu, w)
        for line in lines:
            line.pad(w)
        return lines

    @staticmethod
    def _mig_card_lines(gpu: GpuSample, w: int) -> list[LineBuilder]:
        """A MIG GPU's instances, one a line: GPU instance id, profile, memory, the PIDs on it."""
        lines = []
        for instance in gpu.mig or ():
            line = LineBuilder().add("MIG ", look.LABEL)
            busy = bool(instance.processes)
            line.add(look.ellipsize(mig_instance_text(instance), max(0, w - 4)), look.PLAIN if busy else look.DIM)
            lines.append(line)
        return lines

    def _compact_health(self, line: LineBuilder, gpu: GpuSample, problems: tuple[list[str], list[str]], show_pcie: bool) -> None:
        """A compact row's health cell: its worst problem in one word (the machine check's, unless a worse fault
        shows), or ok."""
        faults, warnings = problems
        throttles = active_throttles(gpu) if _is_slowdown(gpu) else []
        # the slowdown's own reasons stand for the word "throttled", whatever its severity; a link trained down
        # is the PCIe column's "!" where that column shows
        elsewhere = ("throttled", "PCIe down") if show_pcie else ("throttled",)
        problem = [f for f in faults if f not in elsewhere] + throttles + [w for w in warnings if w not in elsewhere]
        mark = self._marks().get(gpu.index)
        if mark is not None and (mark[1] or not faults):  # the machine check's word, unless a worse fault shows
            problem = [mark[0].removeprefix("chk ")] + problem
            faults = faults + [mark[0]] if mark[1] else faults
        if problem:
            line.add(" " + look.ellipsize(problem[0], 8).ljust(8), look.BAD_BOLD if faults else look.WARN_BOLD)
        else:
            line.add(" ok      ", look.GOOD)

    def _build_compact(self, gpus: Sequence[GpuSample], width: int) -> list[Strip]:
        # fixed columns: state(10) util(5) mem(8) temp(5) power(6) pcie(7) health(8) user(rest)
        show_power = width >= 70
        show_pcie = width >= 78
        show_user = width >= 64 and bool(self.gpu_users)
        show_sm = width >= GPM_COMPACT_MIN_WIDTH and any(g.gpm is not None for g in gpus)  # GPM's SM activity
        user_width = min(12, max((len(u) for u in self.gpu_users.values()), default=0)) + 1
        fixed = 10 + 5 + 8 + 5 + (5 if show_sm else 0) + (6 if show_power else 0) + (7 if show_pcie else 0) + 9
        fixed += user_width if show_user else 0
        spark_cells = max(4, width - fixed - 1)
        per_cell = spark_seconds_per_cell(spark_cells, self.interval)
        buckets = utilization_buckets(self.snapshots, [g.index for g in gpus], spark_cells, per_cell, self._closed_buckets)
        head = LineBuilder()
        head.add(" GPU state ", look.LABEL).add(f"util, last {per_cell * spark_cells:.0f}s".ljust(spark_cells), look.LABEL)
        head.add("    %     mem temp", look.LABEL)
        if show_sm:
            head.add("   SM", look.LABEL)
        if show_power:
            head.add(" power", look.LABEL)
        if show_pcie:
            head.add("  PCIe ", look.LABEL)
        head.add(" health  ", look.LABEL)
        if show_user:
            head.add(" user", look.LABEL)
        lines = [head.strip(width)]
        for gpu in gpus:
            problems = self._problems(gpu)
            symbol, word, state_style = self._state(gpu, problems)
            line = LineBuilder()
            line.add(f"{symbol}{gpu.index:>2} {word:<5} ", state_style)
            if gpu.mig is not None and gpu.utilization_gpu is None and not gpu.lost:  # its instances, not a blank line
                slices = " ".join(m.profile.split(".")[0] for m in gpu.mig) or "no instances"  # "3g 2g 1g 1g"
                line.add(look.ellipsize(slices, spark_cells).ljust(spark_cells), look.DIM)
            else:
                line.add(spark_text(buckets[gpu.index]), look.DIM if gpu.lost else look.SPARK)
            if gpu.lost:
                line.add("  GPU not answering (fell off the bus?)", look.BAD_BOLD)
                lines.append(line.strip(width))
                continue
            line.add(" " + card_text("utilization", gpu), util_style(gpu.utilization_gpu))
            line.add(card_text("memory_used", gpu).rjust(8))
            temp = gpu.temperature
            line.add(
                card_text("temperature", gpu).rjust(5),
                look.PLAIN if temp is None or temp < 75 else look.WARN if temp < 85 else look.BAD,
            )
            if show_sm:
                line.add(("" if gpu.gpm is None else card_text("sm_active", gpu)).rjust(5))
            if show_power:
                line.add(("n/a" if gpu.power is None else f"{gpu.power:.0f}W").rjust(6))
            if show_pcie:
                _compact_pcie(line, gpu)
            self._compact_health(line, gpu, problems, show_pcie)
            if show_user:
                line.add(" " + look.ellipsize(self.gpu_users.get(gpu.index, ""), user_width - 1), look.ACCENT)
            lines.append(line.strip(width))
        return lines

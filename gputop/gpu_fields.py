"""Every GPU field gputop shows, declared once: what it is, its unit, how it reads and where it shows.

A GPU sample is rendered three ways: the TUI's card (`tui/widgets/gpu_grid.py`), the `gputop snapshot`
text (`commands/snapshot.py`) and the report (`report/jsonreport.py` computes the numbers,
`report/markdown.py` lays them out); `gputop serve` exports some as gauges (`exporter.py`). All of them
read `FIELDS`, so a new NVML field is one row here plus its reader in `collect/gpu.py`:

- `card`: the card draws `short(gpu)` where its layout puts the field's key (the card is 7 fixed lines,
  so a new card field also needs a place there);
- `snapshot`: `long(gpu)` fills the field's `snapshot_cell` template on line `snapshot_line` of the
  GPU's lines, in table order; a `long` of None leaves the cell out (nothing worth saying);
- `report`: a field with `stat` gets statistics over the window (`read` of each sample; mean, p5, p95
  formatted by `stat`) in the table `report_table`; a field with `health_header` gets a column in the
  Health table, whose cell `health_cell` formats the report's health record of that GPU;
- `metrics`: `gputop serve --dcgm-fields` exports `read(gpu)` as the gauge `metric` (name, help).

Formatting itself is `gputop.units`; this module only says which format each field uses. No Textual here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from gputop import units
from gputop.analysis.gpu_health import reason_key
from gputop.analysis.thresholds import PCIE_LOAD_UTILIZATION
from gputop.analysis.xids import distinct_xids, meaning_of
from gputop.model import GpuSample, to_jsonable

CARD = "card"
SNAPSHOT = "snapshot"
REPORT = "report"
METRICS = "metrics"  # `gputop serve`'s Prometheus gauges (with --dcgm-fields)

# The report's two statistics tables.
STATS = "stats"  # "GPU statistics": mean, p5, p95 (+ an extra column)
IO = "io"  # the PCIe / NVLink traffic table: "mean (p5 …, p95 …)" in one cell
GPM = "gpm"  # the GPM table (SM, tensor-core, DRAM activity), laid out as IO's; left out where no GPU has GPM
GPM_CARD_KEYS = ("sm_active", "tensor_active", "dram_bandwidth")  # the card's compact GPM line, in order


@dataclass(frozen=True)
class GpuField:
    key: str  # stable id; for report statistics also the key in the JSON report's "gpus" records
    label: str  # what people read: the card's/snapshot's heading, the report's column
    unit: str  # of `read`'s value: "%", "bytes", "W", "C", "MHz", "bytes/s", "" (a count or words)
    places: frozenset[str]
    read: Callable[[GpuSample], Any]  # the value in one sample (None: NVML could not give it)
    short: Optional[Callable[[GpuSample], str]] = None  # the card's text
    long: Optional[Callable[[GpuSample], Optional[str]]] = None  # the snapshot's text (None: leave the cell out)
    snapshot_line: int = 0  # which of the GPU's snapshot lines (0: the line with its name)
    snapshot_cell: str = " {}"  # template, with the separator that goes before it
    stat: Optional[Callable[[Optional[float]], Optional[str]]] = None  # one statistic, in the report
    stat_label: Optional[str] = None  # the statistics table's heading ("Util mean"), when not `label`
    stat_top: Optional[Callable[[Sequence[GpuSample]], Optional[float]]] = None  # sparkline scale over the window
    report_table: str = STATS
    # an extra column after p95 in the statistics table: (heading, cell from the JSON report's GPU record,
    # whether the cell is shown as code: a sparkline)
    stat_extra: Optional[tuple[str, Callable[[dict[str, Any]], Any], bool]] = None
    # the Health table: the key of the JSON report's health record, the value there (from the GPU's live
    # samples in the window, oldest first), the column's heading and its cell (from that health record)
    health_key: Optional[str] = None
    health_value: Optional[Callable[[Sequence[GpuSample]], Any]] = None
    health_header: Optional[str] = None
    health_cell: Optional[Callable[[dict[str, Any]], Optional[str]]] = None
    metric: Optional[tuple[str, str]] = None  # the Prometheus gauge: name (with its unit, as Prometheus wants), help


def _why(gpu: GpuSample, key: str) -> str:
    return f"n/a ({gpu.unavailable.get(key, 'unavailable')})"


def _link_total(gpu: GpuSample, attr: str) -> Optional[float]:
    """Traffic summed over the GPU's NVLinks (None: no NVLink, or no rate read yet)."""
    return None if gpu.nvlink is None else gpu.nvlink.total(attr)


def _latest(samples: Sequence[GpuSample], attr: str) -> Optional[float]:
    return next((getattr(g, attr) for g in reversed(samples) if getattr(g, attr)), None)


# ---------------------------------------------------------------- clock-event reasons, in short

_SHORT_REASON = {  # by reason_key
    "swpowercap": "PwrCap",
    "hwslowdown": "HwSlow",
    "swthermal": "SwTherm",
    "hwthermal": "HwTherm",
    "hwpowerbrake": "PwrBrake",
    "syncboost": "SyncBoost",
    "applicationsclocks": "AppClk",
    "appclocks": "AppClk",
}
_HARMLESS_REASONS = ("gpuidle", "idle")


def active_throttles(gpu: GpuSample) -> list[str]:
    """Short names of the clock-event reasons worth showing (GPU-idle is not a problem)."""
    out = []
    for name in gpu.throttle_reasons or ():
        key = reason_key(name)
        if key in _HARMLESS_REASONS:
            continue
        out.append(_SHORT_REASON.get(key, name))
    return out


def _throttle_short(gpu: GpuSample) -> str:
    if gpu.throttle_reasons is None:
        return units.NA
    return ",".join(active_throttles(gpu)) or "none"


# ---------------------------------------------------------------- one sample's text


def _memory_long(gpu: GpuSample) -> str:
    if gpu.memory_used is None or not gpu.memory_total:
        return units.NA
    return f"{gpu.memory_used / units.GIB:5.1f}/{gpu.memory_total / units.GIB:.0f}GiB"


def _power_short(gpu: GpuSample) -> str:
    if gpu.power is None:
        return "n/a W"
    return f"{gpu.power:.0f}" + (f"/{gpu.power_limit:.0f}W" if gpu.power_limit else "W")


def _pcie_short(gpu: GpuSample) -> str:
    link = gpu.pcie
    if link.gen_current is None or link.width_current is None:
        return units.NA
    return f"Gen{link.gen_current} x{link.width_current}"


def _pcie_long(gpu: GpuSample) -> str:
    p = gpu.pcie
    return f"Gen{units.na(p.gen_current)}x{units.na(p.width_current)}/Gen{units.na(p.gen_max)}x{units.na(p.width_max)}"


def _nvlink_active(gpu: GpuSample) -> Optional[tuple[int, int]]:
    if gpu.nvlink is None:
        return None
    return gpu.nvlink.active_count(), len(gpu.nvlink)


def _nvlink_short(gpu: GpuSample) -> str:
    counts = _nvlink_active(gpu)
    return units.NA if not counts or not counts[1] else f"{counts[0]}/{counts[1]}"


def _nvlink_long(gpu: GpuSample) -> str:
    counts = _nvlink_active(gpu)
    return _why(gpu, "nvlink") if counts is None else f"{counts[0]}/{counts[1]} up"


def _nvlink_rate(attr: str) -> Callable[[GpuSample], Optional[str]]:
    def text(gpu: GpuSample) -> Optional[str]:
        return None if gpu.nvlink is None else units.rate(_link_total(gpu, attr) or 0.0, sep="")

    return text


def _throttle_long(gpu: GpuSample) -> str:
    return units.NA if gpu.throttle_reasons is None else (",".join(gpu.throttle_reasons) or "none")


def _ecc_long(gpu: GpuSample) -> str:
    ecc = gpu.ecc
    if ecc is None:
        return _why(gpu, "ecc")
    return f"vol {units.na(ecc.volatile_corrected)}c/{units.na(ecc.volatile_uncorrected)}u"


def _remap_long(gpu: GpuSample) -> Optional[str]:
    rows = gpu.remapped_rows
    if rows is None:
        return _why(gpu, "remapped_rows")
    if not (rows.uncorrectable or rows.pending or rows.failed):
        return None  # nothing worth a word
    state = "FAILED" if rows.failed else ("pending" if rows.pending else "done")
    return f"{rows.uncorrectable} rows {state}"


def _xids_long(gpu: GpuSample) -> Optional[str]:
    if gpu.xids is None:
        return _why(gpu, "xids")
    return ",".join(str(code) for code in dict.fromkeys(e.code for e in gpu.xids)) or None


# ---------------------------------------------------------------- the report's health record and cells


def _last_jsonable(attr: str) -> Callable[[Sequence[GpuSample]], Any]:
    def value(alive: Sequence[GpuSample]) -> Any:
        found = getattr(alive[-1], attr) if alive else None
        return None if found is None else to_jsonable(found)

    return value


def _temperature_max(alive: Sequence[GpuSample]) -> Optional[float]:
    temps = [g.temperature for g in alive if g.temperature is not None]
    return max(temps) if temps else None


def _pcie_under_load(alive: Sequence[GpuSample]) -> Optional[dict[str, Any]]:
    under_load = [g for g in alive if (g.utilization_gpu or 0) >= PCIE_LOAD_UTILIZATION]  # idle GPUs slow the link on purpose
    shown = under_load or alive
    if not shown:
        return None
    found: dict[str, Any] = to_jsonable(shown[-1].pcie)
    return found


def _throttle_counts(alive: Sequence[GpuSample]) -> dict[str, int]:
    return dict(Counter(r for g in alive for r in (g.throttle_reasons or ())).most_common())


def _nvlink_counts(alive: Sequence[GpuSample]) -> Optional[dict[str, int]]:
    counts = _nvlink_active(alive[-1]) if alive else None
    return None if counts is None else {"active": counts[0], "total": counts[1]}


def _xid_events(alive: Sequence[GpuSample]) -> Optional[list[dict[str, Any]]]:
    """Every XID the samples carry, oldest first, with what it means; None when NVML could not report them."""
    if alive and all(g.xids is None for g in alive):
        return None
    out = []
    for event in distinct_xids(alive):
        meaning = meaning_of(event.code)
        out.append({"code": event.code, "timestamp": event.timestamp, "meaning": meaning.meaning, "label": meaning.label})
    return out


def _health_pcie(h: dict[str, Any]) -> Optional[str]:
    p = h["pcie"] or {}
    if p.get("gen_current") is None:
        return None
    return f"Gen{p['gen_current']} x{p['width_current']} / Gen{p['gen_max']} x{p['width_max']}"


def _health_throttle(h: dict[str, Any]) -> str:
    return ", ".join(f"{r} ({n}/{h['samples']})" for r, n in h["throttle_reasons"].items() if r not in ("gpu_idle",)) or "none"


def _health_ecc(h: dict[str, Any]) -> Optional[str]:
    ecc = h["ecc"]
    if ecc is None:
        return None
    return f"unc {ecc['volatile_uncorrected']}/{ecc['aggregate_uncorrected']}, corr {ecc['volatile_corrected']}/{ecc['aggregate_corrected']}"


def _health_remap(h: dict[str, Any]) -> Optional[str]:
    rr = h["remapped_rows"]
    if rr is None:
        return None
    return (
        f"corr {rr['correctable']}, unc {rr['uncorrectable']}"
        + (", PENDING" if rr["pending"] else "")
        + (", FAILED" if rr["failed"] else "")
    )


def _health_xids(h: dict[str, Any]) -> Optional[str]:
    xids = h.get("xids")
    return None if xids is None else (", ".join(f"{x['code']} ({x['meaning']})" for x in xids) or "none")


def _health_nvlink(h: dict[str, Any]) -> Optional[str]:
    nv = h["nvlink"]
    return None if nv is None else f"{nv['active']}/{nv['total']} active"


def _watts(value: Optional[float]) -> Optional[str]:
    return None if value is None else f"{value:.0f} W"


def _rate_stat(value: Optional[float]) -> Optional[str]:
    return units.rate(value, None)


# ---------------------------------------------------------------- GPM: what the SMs, tensor cores and memory did


def _gpm_value(name: str) -> Callable[[GpuSample], Optional[float]]:
    """One GPM metric of a sample (None: the GPU has no GPM, or NVML refused that metric)."""

    def read(gpu: GpuSample) -> Optional[float]:
        return None if gpu.gpm is None else getattr(gpu.gpm, name)

    return read


def gpm_card_line(gpu: GpuSample) -> Optional[str]:
    """The card's compact GPM line, "SM 34%  TC 0%  DRAM 62%" (None: the GPU has no GPM, so no line)."""
    if gpu.gpm is None:
        return None
    return "  ".join(f"{BY_KEY[key].label} {units.percent(BY_KEY[key].read(gpu))}" for key in GPM_CARD_KEYS)


def _gpm_field(key: str, label: str, what: str, snapshot_cell: str, metric: str) -> GpuField:
    """A GPM metric's row: in percent, on the snapshot's GPM line (left out where the GPU has none), in the report's
    GPM statistics, and exported as a gauge."""
    read = _gpm_value(key)
    return GpuField(
        key,
        label,
        "%",
        frozenset((CARD, SNAPSHOT, REPORT, METRICS) if key in GPM_CARD_KEYS else (SNAPSHOT, REPORT, METRICS)),
        read=read,
        short=(lambda g: units.percent(read(g)) or units.NA) if key in GPM_CARD_KEYS else None,
        long=lambda g: None if g.gpm is None else units.percent(read(g)),
        snapshot_line=3,
        snapshot_cell=snapshot_cell,
        stat=lambda v: units.percent(v, None),
        stat_label=label,
        stat_top=lambda samples: 100.0,
        report_table=GPM,
        metric=(f"gputop_gpu_{metric}_percent", f"{what} (NVML GPM, Hopper and newer)"),
    )


# ---------------------------------------------------------------- the table

_ALL = frozenset((CARD, SNAPSHOT, REPORT))
_ALL_AND_METRICS = _ALL | {METRICS}

FIELDS: tuple[GpuField, ...] = (
    GpuField(
        "utilization",
        "util",
        "%",
        _ALL_AND_METRICS,
        read=lambda g: g.utilization_gpu,
        short=lambda g: units.percent_cell(g.utilization_gpu),
        long=lambda g: units.na(g.utilization_gpu, "{:3.0f}%"),
        snapshot_cell=" {:>5}",
        stat=lambda v: units.percent(v, None),
        stat_label="Util",
        stat_top=lambda samples: 100.0,
        metric=("gputop_gpu_utilization_percent", "GPU utilization"),
        stat_extra=("Utilization over time", lambda rec: rec["utilization"]["spark"] if rec["utilization"] else None, True),
    ),
    GpuField(
        "memory_used",
        "memory",
        "bytes",
        _ALL_AND_METRICS,
        read=lambda g: g.memory_used,
        short=lambda g: units.gib_pair(g.memory_used, g.memory_total),
        long=_memory_long,
        snapshot_cell=" {:>14}",
        stat=lambda v: units.gib(v, None),
        stat_label="Mem",
        stat_top=lambda samples: _latest(samples, "memory_total"),
        stat_extra=("Mem total", lambda rec: units.gib(rec["memory_total"], None), False),
        metric=("gputop_gpu_memory_used_bytes", "GPU memory used"),
    ),
    GpuField(  # the card, the snapshot and the report show it beside memory_used
        "memory_total",
        "memory total",
        "bytes",
        frozenset((METRICS,)),
        read=lambda g: g.memory_total,
        metric=("gputop_gpu_memory_total_bytes", "GPU memory in all"),
    ),
    GpuField(
        "temperature",
        "temp",
        "C",
        _ALL_AND_METRICS,
        read=lambda g: g.temperature,
        short=lambda g: units.na(g.temperature, "{:.0f}°C"),
        long=lambda g: units.na(g.temperature, "{:.0f}C"),
        snapshot_cell=" {:>4}",
        health_key="temperature_max",
        health_value=_temperature_max,
        health_header="Temp max",
        health_cell=lambda h: None if h["temperature_max"] is None else f"{h['temperature_max']:.0f} °C",
        metric=("gputop_gpu_temperature_celsius", "GPU temperature"),
    ),
    GpuField(
        "power",
        "power",
        "W",
        _ALL_AND_METRICS,
        read=lambda g: g.power,
        short=_power_short,
        long=lambda g: f"{units.na(g.power, '{:.0f}')}/{units.na(g.power_limit, '{:.0f}W')}",
        stat=_watts,
        stat_label="Power",
        stat_top=lambda samples: _latest(samples, "power_limit"),
        stat_extra=("Limit", lambda rec: _watts(rec["power_limit"]), False),
        metric=("gputop_gpu_power_watts", "GPU power draw"),
    ),
    GpuField(
        "clock_sm",
        "SM clock",
        "MHz",
        frozenset((CARD, SNAPSHOT, METRICS)),
        read=lambda g: g.clock_sm,
        short=lambda g: units.na(g.clock_sm, "{}MHz"),
        long=lambda g: units.na(g.clock_sm, "{}MHz"),
        metric=("gputop_gpu_sm_clock_megahertz", "GPU SM clock"),
    ),
    GpuField(
        "processes",
        "procs",
        "",
        frozenset((SNAPSHOT,)),
        read=lambda g: None if g.processes is None else len(g.processes),
        long=lambda g: units.na(None if g.processes is None else len(g.processes)),
        snapshot_cell=" procs {}",
    ),
    GpuField(
        "pcie_link",
        "PCIe",
        "",
        _ALL,
        read=lambda g: g.pcie.gen_current,
        short=_pcie_short,
        long=_pcie_long,
        snapshot_line=1,
        snapshot_cell="PCIe {}",
        health_key="pcie",
        health_value=_pcie_under_load,
        health_header="PCIe (under load) / max",
        health_cell=_health_pcie,
    ),
    GpuField(
        "pcie_rx_bytes_per_s",
        "PCIe RX (to GPU)",
        "bytes/s",
        _ALL,
        read=lambda g: g.pcie.rx_bytes_per_s,
        short=lambda g: units.short_rate(g.pcie.rx_bytes_per_s),
        long=lambda g: units.rate(g.pcie.rx_bytes_per_s, sep=""),
        snapshot_line=1,
        snapshot_cell=" rx {}",
        stat=_rate_stat,
        report_table=IO,
    ),
    GpuField(
        "pcie_tx_bytes_per_s",
        "PCIe TX",
        "bytes/s",
        _ALL,
        read=lambda g: g.pcie.tx_bytes_per_s,
        short=lambda g: units.short_rate(g.pcie.tx_bytes_per_s),
        long=lambda g: units.rate(g.pcie.tx_bytes_per_s, sep=""),
        snapshot_line=1,
        snapshot_cell=" tx {}",
        stat=_rate_stat,
        report_table=IO,
    ),
    GpuField(
        "nvlink",
        "NVLink",
        "",
        _ALL,
        read=lambda g: None if (counts := _nvlink_active(g)) is None else counts[0],
        short=_nvlink_short,
        long=_nvlink_long,
        snapshot_line=1,
        snapshot_cell="  NVLink {}",
        health_key="nvlink",
        health_value=_nvlink_counts,
        health_header="NVLink",
        health_cell=_health_nvlink,
    ),
    GpuField(
        "nvlink_rx_bytes_per_s",
        "NVLink RX",
        "bytes/s",
        _ALL,
        read=lambda g: _link_total(g, "rx_bytes_per_s"),
        short=lambda g: units.short_rate(_link_total(g, "rx_bytes_per_s") or 0.0),
        long=_nvlink_rate("rx_bytes_per_s"),
        snapshot_line=1,
        snapshot_cell=" rx {}",
        stat=_rate_stat,
        report_table=IO,
    ),
    GpuField(
        "nvlink_tx_bytes_per_s",
        "NVLink TX",
        "bytes/s",
        _ALL,
        read=lambda g: _link_total(g, "tx_bytes_per_s"),
        short=lambda g: units.short_rate(_link_total(g, "tx_bytes_per_s") or 0.0),
        long=_nvlink_rate("tx_bytes_per_s"),
        snapshot_line=1,
        snapshot_cell=" tx {}",
        stat=_rate_stat,
        report_table=IO,
    ),
    GpuField(
        "throttle_reasons",
        "throttle",
        "",
        _ALL,
        read=lambda g: g.throttle_reasons,
        short=_throttle_short,
        long=_throttle_long,
        snapshot_line=2,
        snapshot_cell="throttle {}",
        health_key="throttle_reasons",
        health_value=_throttle_counts,
        health_header="Throttle reasons (samples)",
        health_cell=_health_throttle,
    ),
    GpuField(
        "ecc",
        "ECC",
        "",
        frozenset((SNAPSHOT, REPORT)),
        read=lambda g: g.ecc,
        long=_ecc_long,
        snapshot_line=2,
        snapshot_cell="; ECC {}",
        health_key="ecc",
        health_value=_last_jsonable("ecc"),
        health_header="ECC vol/agg",
        health_cell=_health_ecc,
    ),
    GpuField(
        "remapped_rows",
        "remap",
        "",
        frozenset((SNAPSHOT, REPORT)),
        read=lambda g: g.remapped_rows,
        long=_remap_long,
        snapshot_line=2,
        snapshot_cell=", remap {}",
        health_key="remapped_rows",
        health_value=_last_jsonable("remapped_rows"),
        health_header="Remapped rows",
        health_cell=_health_remap,
    ),
    GpuField(
        "xids",
        "XID",
        "",
        frozenset((SNAPSHOT, REPORT)),
        read=lambda g: g.xids,
        long=_xids_long,
        snapshot_line=2,
        snapshot_cell=", XID {}",
        health_key="xids",
        health_value=_xid_events,
        health_header="XIDs",
        health_cell=_health_xids,
    ),
    _gpm_field("sm_active", "SM", "Share of SMs busy", "GPM SM {}", "sm_active"),
    _gpm_field("sm_occupancy", "occupancy", "Resident warps against the SMs' maximum", " occupancy {}", "sm_occupancy"),
    _gpm_field("tensor_active", "TC", "Tensor-core activity", " TC {}", "tensor_active"),
    _gpm_field("dram_bandwidth", "DRAM", "DRAM bandwidth used against the peak", " DRAM {}", "dram_bandwidth"),
    _gpm_field("fp32_active", "FP32", "FP32 pipe activity", " FP32 {}", "fp32_pipe_active"),
    _gpm_field("fp16_active", "FP16", "FP16 pipe activity", " FP16 {}", "fp16_pipe_active"),
)

BY_KEY: dict[str, GpuField] = {f.key: f for f in FIELDS}


def shown_in(place: str) -> tuple[GpuField, ...]:
    """The fields that show in `place` (CARD, SNAPSHOT or REPORT), in table order."""
    return tuple(f for f in FIELDS if place in f.places)


def card_text(key: str, gpu: GpuSample) -> str:
    """The card's text of field `key` for one sample."""
    short = BY_KEY[key].short
    assert short is not None, f"{key} has no card text"
    return short(gpu)


def snapshot_lines(gpu: GpuSample) -> list[str]:
    """The snapshot's cells of one live GPU, one string per line (no indentation)."""
    lines: dict[int, str] = {}
    for f in shown_in(SNAPSHOT):
        text = f.long(gpu) if f.long is not None else None
        if text is not None:
            lines[f.snapshot_line] = lines.get(f.snapshot_line, "") + f.snapshot_cell.format(text)
    return [lines[i] for i in sorted(lines)]


def report_health(alive: Sequence[GpuSample]) -> dict[str, Any]:
    """The JSON report's health values of every REPORT field with a Health column: key -> value, from one
    GPU's live samples in the window (oldest first)."""
    return {f.health_key: f.health_value(alive) for f in shown_in(REPORT) if f.health_key and f.health_value is not None}


def report_stats(series: Sequence[Optional[GpuSample]], stats: Callable[..., Any]) -> dict[str, Any]:
    """The JSON report's statistics of every REPORT field with `stat`: key -> stats(values, 0, top).

    `series` holds one entry per snapshot (None where the GPU was lost); `stats(values, lo, top)` is the
    report's summariser (mean, percentiles, sparkline)."""
    present = [g for g in series if g is not None]
    return {
        f.key: stats([f.read(g) if g is not None else None for g in series], 0.0, f.stat_top(present) if f.stat_top else None)
        for f in shown_in(REPORT)
        if f.stat is not None
    }

"""The ticket-ready Markdown report: GitHub/Jira tables and fenced code blocks that paste cleanly.

It renders `report_data` (the same structure the JSON report prints), so both formats say the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from gputop import gpu_fields, units
from gputop.analysis.numbers import Share
from gputop.analysis.prediction import prediction_line
from gputop.history import History
from gputop.model import Finding, Topology, from_jsonable
from gputop.report.jsonreport import ReportedResult, report_data
from gputop.report.redact import redact_text
from gputop.units import utc_time

if TYPE_CHECKING:
    from gputop.analysis.machine_check import CheckReport
    from gputop.tracing import TraceResult


def _cell(value: object) -> str:
    """A table cell: no newlines, pipes escaped, None as a dash."""
    if value is None or value == "":
        return "—"
    return str(value).replace("\n", " ").replace("|", "\\|")


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


def _fence(text: str, lang: str = "text") -> list[str]:
    fence = "~~~" if "```" in text else "```"
    return [f"{fence}{lang}", text.rstrip("\n"), fence, ""]


def _code(value: object) -> str:
    text = str(value)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _when(ts: Optional[float]) -> str:
    return utc_time(ts, missing="—")


def _stat_cells(st: Optional[dict[str, Any]], fmt: Callable[[Optional[float]], Optional[str]]) -> list[Optional[str]]:
    if not st:
        return [None, None, None]
    return [fmt(st["mean"]), fmt(st["p5"]), fmt(st["p95"])]


def _findings(data: dict[str, Any]) -> list[str]:
    out = ["## Findings", ""]
    for i, f in enumerate(data["findings"], 1):
        label = f" · {f['label']}" if f["label"] else ""
        out.append(f"### {i}. {f['title']}")
        out.append("")
        out.append(f"**{f['severity'].upper()}**{label} · confidence {100 * f['confidence']:.0f}%")
        out.append("")
        out.append(f"> {f['summary']}")
        out.append("")
        if f["evidence"]:
            out.append("**Evidence**")
            out.append("")
            out += [f"- {e}" for e in f["evidence"]]
            out.append("")
        if f["frames"]:
            out.append("**Stack frames** (innermost last)")
            out.append("")
            out += _fence("\n".join(f["frames"]))
        if f["fix"]:
            first, *rest = f["fix"].splitlines()
            out.append(f"**{'Fix' if f['severity'] != 'info' else 'Next step'}:** {first}")
            out.append("")
            if rest:
                out += _fence("\n".join(rest), "python" if any("(" in r for r in rest) else "text")
        buys = prediction_line(f.get("figures"))
        if buys:
            out.append(f"**What it buys:** {buys}")
            out.append("")
    return out


def _infra_team(data: dict[str, Any]) -> list[str]:
    """The ticket text (see `report.infra`): identity, failing checks, XIDs, next commands, the reset advice."""
    infra = data["infra"]
    m = infra["machine"]
    out = ["## For the infra team", ""]
    versions = [
        ("Host", m["hostname"]),
        ("Kernel", m["kernel"]),
        (
            "Driver",
            m["driver"]
            if not m["driver_module"] or m["driver_module"] == m["driver"]
            else f"{m['driver']} (kernel module {m['driver_module']})",
        ),
        ("CUDA", m["cuda"]),
        ("NVML", m["nvml"]),
    ]
    if m["gpu_error"]:
        versions.append(("GPUs", m["gpu_error"]))
    out += _table(["", ""], versions)
    if infra["gpus"]:
        out += _table(
            ["GPU", "Name", "Serial", "VBIOS", "Board part", "PCI bus", "UUID"],
            [
                [
                    g["index"],
                    g["name"],
                    g["serial"],
                    g["vbios"],
                    g["board_part_number"],
                    g["pci_bus_id"],
                    "LOST" if g["lost"] else g["uuid"],
                ]
                for g in infra["gpus"]
            ],
        )
    if infra["summary"]:
        out += [f"`gputop check` over this report's window: **{infra['summary']}**.", ""]
    if infra["failing"]:
        out += ["**Failing checks**", ""]
        out += [
            f"- **{c['status'].upper()}** {c['title']}: {c['value']}" + (f" (expected {c['expected']})" if c["expected"] else "")
            for c in infra["failing"]
        ]
        out.append("")
    elif infra["source"] == "checks":
        out += ["No check failed.", ""]
    out += _nic_ports(infra.get("nics"))
    unreadable: list[str] = next((c["evidence"] for c in infra["checks"] if c["id"] == "sources"), [])
    if unreadable:
        out += ["**Not readable here**", ""] + [f"- {line}" for line in unreadable] + [""]
    out += ["**XIDs**", ""]
    out += _fence("\n".join(infra["xids"])) if infra["xids"] else ["None seen.", ""]
    if infra["missing"]:
        out += [f"_Missing:_ {infra['missing']}.", ""]
    out += ["**What the infra team will ask for next**", ""]
    out += _fence("\n".join(f"{c['command']:<28} # {c['why']}" for c in infra["next_commands"]), "sh")
    out += [f"> {infra['advice']}", ""]
    return out


def _nic_ports(nics: Optional[list[dict[str, Any]]]) -> list[str]:
    """The NIC ports table of the infra section (report.infra.nic_rows)."""
    if not nics:
        return []
    rows = [
        [
            n["name"],
            n["link_layer"],
            n["state"],
            f"{n['rate_gbps']:g} Gb/s" if n["rate_gbps"] is not None else None,
            " / ".join(units.rate(n[k]) or "" for k in ("rx_bytes_per_s", "tx_bytes_per_s")),
            ", ".join(f"{k} {v}" for k, v in n["errors"].items()) or "0",
            "; ".join(n["problems"]) or "ok",
        ]
        for n in nics
    ]
    return ["**NIC ports**", ""] + _table(
        ["Port", "Link", "State", "Rate", "Traffic rx / tx", "Errors (since load)", "Health"], rows
    )


def _machine(data: dict[str, Any]) -> list[str]:
    m = data["machine"]
    gpus = m["gpu_names"]
    if gpus:
        names = sorted(set(gpus))
        gpu_text = ", ".join(f"{gpus.count(n)} × {n}" for n in names)
    else:
        gpu_text = m["gpu_error"] or "none"
    rows = [
        ("Host", m["hostname"]),
        ("CPU", f"{m['cpu_model'] or 'unknown'} ({m['cpu_count']} logical cores)"),
        ("Memory", units.gib(m["memory_total"], None)),
        ("Driver", m["driver_version"]),
        ("CUDA", m["cuda_version"]),
        ("NVML", m["nvml_version"]),
        ("GPUs", gpu_text),
    ]
    if m["simulated"]:
        rows.append(("Simulated", f"yes: {m['simulated']} (no real GPU was read)"))
    return ["## Machine", ""] + _table(["", ""], rows)


def _topology(data: dict[str, Any]) -> list[str]:
    topo = from_jsonable(Topology, data["topology"])
    names, rows = topo.full_matrix()  # GPUs, then the RDMA NICs as nvidia-smi numbers them
    if not rows:
        return []
    header = ["     "] + [f"{name:<6}" for name in names] + ["CPU affinity", "NUMA"]
    lines = ["  ".join(header)]
    for i, (name, row) in enumerate(zip(names, rows)):
        cells = [f"{name:<5}"] + [f"{c:<6}" for c in row]
        if i < len(topo.matrix):
            cells.append(topo.near_cpus_text(i))
            cells.append(str(topo.numa_node[i]) if i < len(topo.numa_node) and topo.numa_node[i] is not None else "n/a")
        lines.append("  ".join(cells).rstrip())
    legend = (
        "X = self, NV# = # NVLinks, PIX/PXB = PCIe switch(es), PHB = host bridge, NODE = same NUMA node, SYS = across sockets"
    )
    if topo.nic_legend():
        legend += "\n\nNIC Legend:\n\n" + "\n".join(f"  {entry}" for entry in topo.nic_legend())
    out = ["## Topology", ""] + _fence("\n".join(lines) + "\n\n" + legend)
    others = [nic for nic in topo.nics or () if not nic.rdma]
    if others:  # not in nvidia-smi's matrix (no RDMA device), but where they sit matters for the data path
        out += ["", "Other NICs: " + ", ".join(f"{nic.name} (NUMA {units.na(nic.numa_node)})" for nic in others)]
    if topo.nics is None and topo.nics_unreadable:
        out += ["", "NICs not read: " + "; ".join(topo.nics_unreadable)]
    return out


def _state(h: dict[str, Any]) -> str:
    """The Health table's State cell: the health module's state and the card's words (older reports: lost or ok)."""
    if "state" not in h:
        return "LOST" if h["lost"] else "ok"
    words = ", ".join(str(p["word"]) for p in h["problems"])
    return str(h["state"]) + (f": {words}" if words else "")


def _health(data: dict[str, Any]) -> list[str]:
    columns = [
        (f.health_header or f.label, f.health_cell) for f in gpu_fields.shown_in(gpu_fields.REPORT) if f.health_cell is not None
    ]
    rows = []
    for h in data["health"]:
        na = ", ".join(f"{k}: {v}" for k, v in h["unavailable"].items())
        rows.append([h["index"], h["pci_bus_id"], _state(h), *(cell(h) for _, cell in columns), na or None])
    if not rows:
        return []
    headers = ["GPU", "Bus", "State", *(header for header, _ in columns), "Not available"]
    return ["## Health", ""] + _table(headers, rows)


def _gpu_stats(data: dict[str, Any]) -> list[str]:
    if not data["gpus"]:
        return []
    fields = [(f, f.stat) for f in gpu_fields.shown_in(gpu_fields.REPORT) if f.stat is not None]
    stats = [(f, stat) for f, stat in fields if f.report_table == gpu_fields.STATS]
    rows = []
    for g in data["gpus"]:
        cells: list[Any] = [g["index"]]
        for f, stat in stats:
            cells += _stat_cells(g[f.key], stat)
            if f.stat_extra is not None:
                _, extra, as_code = f.stat_extra
                value = extra(g)
                cells.append(_code(value) if as_code and value is not None else value)
        rows.append(cells)
    headers = ["GPU"]
    for f, _ in stats:
        headers += [f"{f.stat_label or f.label} mean", "p5", "p95"]
        if f.stat_extra is not None:
            headers.append(f.stat_extra[0])
    out = [
        "## GPU statistics",
        "",
        f"Over {data['observed']['seconds']:.0f} s ({data['observed']['snapshots']} samples); sparklines on a fixed 0–100% / 0–total scale.",
        "",
    ]
    out += _table(headers, rows)
    for table in (gpu_fields.IO, gpu_fields.GPM):
        out += _compact_stats(data, [(f, stat) for f, stat in fields if f.report_table == table], table == gpu_fields.GPM)
    return out


def _compact_stats(
    data: dict[str, Any], fields: list[tuple[gpu_fields.GpuField, Callable[[Optional[float]], Optional[str]]]], only_known: bool
) -> list[str]:
    """A table of "mean (p5 …, p95 …)" cells, a GPU a row; `only_known`: rows (and the table) only for GPUs that
    have any value (GPM: a GPU before Hopper has none, and a table of empty cells says nothing)."""
    rows = []
    for g in data["gpus"]:
        cells: list[Any] = [g["index"]]
        for f, stat in fields:
            st = g.get(f.key)  # a report written before a field existed lacks it
            cells.append(None if not st else f"{stat(st['mean'])} (p5 {stat(st['p5'])}, p95 {stat(st['p95'])})")
        if not only_known or any(cell is not None for cell in cells[1:]):
            rows.append(cells)
    if not rows:
        return []
    return _table(["GPU", *(f"{f.stat_label or f.label} mean" for f, _ in fields)], rows)


def _host(data: dict[str, Any]) -> list[str]:
    h = data["host"]
    cpu = h["cpu_percent"]
    rows = [
        (
            "CPU (all cores)",
            None if not cpu else f"mean {cpu['mean']:.0f}%, p95 {cpu['p95']:.0f}% over {h['cores']} cores  {_code(cpu['spark'])}",
        ),
        (
            "Memory",
            None if h["memory_total"] is None else f"{units.gib(h['memory_used'], None)} of {units.gib(h['memory_total'], None)}",
        ),
        ("Load average", None if not h["load_average"] else " / ".join(f"{x:.2f}" for x in h["load_average"])),
        ("I/O wait", units.percent(h["iowait_percent"], None)),
    ]
    return ["## Host", ""] + _table(["", ""], rows)


def _share_cell(share: dict[str, Any], samples: int) -> str:
    """ "62% (58–66%) of 6,000": a share from the report JSON with its interval and sample count."""
    return f"{Share.from_dict(share).text()} of {samples:,}"


def _job(data: dict[str, Any]) -> list[str]:
    job = data["job"]
    out = ["## Job", ""]
    if job is None:
        return out + ["No job attached (run `gputop report --pid PID` for ranks, workers and stacks).", ""]
    if job["launcher"]:
        out += [f"Launcher PID {job['launcher']['pid']} ({job['launcher']['name']}):", ""]
        out += _fence(" ".join(job["launcher"]["cmdline"]) or job["launcher"]["name"], "sh")
    rows = []
    for r in job["ranks"]:
        wait = r["input_share"]
        rows.append(
            [
                r["rank"],
                r["local_rank"],
                r["pid"],
                # "0", or "0/GI1" on a MIG instance (a report written before MIG was known has no devices)
                ", ".join(d.removeprefix("GPU") for d in r.get("devices") or map(str, r["gpus"])) or None,
                r["cuda_visible_devices"],
                r["main_thread_state"],
                _share_cell(wait, r["samples"]) if wait else ("starting up" if r["starting_up"] else None),
                units.percent(r["cpu_percent"], None),
                units.gib(r["rss"], None),
                len(r["workers"]),
                "exited" if r["exited"] else r["process_state"],
            ]
        )
    out += _table(
        [
            "Rank",
            "Local",
            "PID",
            "GPUs",
            "CUDA_VISIBLE_DEVICES",
            "Main thread (latest)",
            "Input wait (95% interval) of samples",
            "CPU",
            "RSS",
            "Workers",
            "State",
        ],
        rows,
    )
    if job["ranks"]:
        out += ["Rank command line:", ""] + _fence(" ".join(job["ranks"][0]["cmdline"]), "sh")
    if job["warnings"]:
        out += ["**Collector warnings**", ""] + [f"- {w}" for w in job["warnings"]] + [""]
    if job["stacks_error"]:
        out += [f"Stacks unavailable: {job['stacks_error']}", ""]
    return out


def _stacks(data: dict[str, Any]) -> list[str]:
    st = data["stacks"]
    if not st["main_threads"] and not st["workers"]:
        return []
    out = ["## Top stacks", ""]
    if st["main_threads"]:
        out += [f"Rank main threads, {st['main_thread_dumps']} distinct stack dumps, grouped (innermost frame last):", ""]
        for i, g in enumerate(st["main_threads"], 1):
            ranks = ", ".join(g["ranks"][:8]) + (" …" if len(g["ranks"]) > 8 else "")
            out += [
                f"{i}. **{g['count']}/{g['of']}** dumps ({100 * g['count'] / max(1, g['of']):.0f}%), {g['state'] or 'unclassified'}: {ranks}",
                "",
            ]
            out += _fence("\n".join(g["frames"]))
    if st["workers"]:
        out += ["DataLoader workers (latest dump):", ""]
        out += _table(["Activity", "Workers"], [[_code(w["activity"]), f"{w['count']}/{w['total']}"] for w in st["workers"]])
    return out


def _recording(data: dict[str, Any]) -> list[str]:
    rec = data.get("recording")
    if not rec:
        return []
    whole = f"{rec['seconds']:.0f} s ({rec['snapshots']} samples) from {_when(rec['start'])} to {_when(rec['end'])}"
    if rec["whole"]:
        return [f"Read from the recording {_code(rec['file'])}: all of it.", ""]
    return [
        f"Read from the recording {_code(rec['file'])}, which spans {whole}. This report covers its last "
        f"{data['observed']['snapshots']} samples only (at most {rec['window_limit']}, to bound memory): the statistics, "
        "stacks and findings below rest on that span.",
        "",
    ]


def _trace(data: dict[str, Any]) -> list[str]:
    t = data.get("trace")
    if not t:
        return []
    out = ["## Trace (torch.profiler, every rank)", ""]
    ranks = t["result"].get("ranks") or []
    if ranks:
        phases = ("data", "forward", "backward", "comm", "optimizer", "sync", "other")
        out += _table(
            ["rank", "pid", *phases, "steps/s", "trace file"],
            [
                [
                    r.get("rank"),
                    r.get("pid"),
                    *(f"{100 * (r.get('phases') or {}).get(p, 0.0):.0f}%" for p in phases),
                    r.get("steps_per_s"),
                    _code(r["trace_file"]) if r.get("trace_file") else None,
                ]
                for r in ranks
            ],
        )
    out += _fence("\n".join(t["summary"]))
    return out


def _bench(data: dict[str, Any]) -> list[str]:
    b = data["benchmark"]
    if not b:
        return []
    out = ["## Loader benchmark", ""]
    if b["summary"]:
        out += _fence("\n".join(b["summary"]))
    res = b["result"] or {}
    configs = res.get("configs") or []
    if configs:
        out += _table(
            ["num_workers", "prefetch_factor", "pin_memory", "batches/s"],
            [[c.get("num_workers"), c.get("prefetch_factor"), c.get("pin_memory"), c.get("batches_per_s")] for c in configs],
        )
    if res.get("recommendation"):
        out += ["Recommended:", ""] + _fence(
            "DataLoader(dataset, ..., " + ", ".join(f"{k}={v!r}" for k, v in res["recommendation"].items()) + ")", "python"
        )
    return out


def render_markdown(
    history: History,
    findings: Sequence[Finding],
    *,
    bench: Optional[ReportedResult | dict[str, Any]] = None,
    command: Optional[Sequence[str] | str] = None,
    generated: Optional[float] = None,
    recording: Optional[dict[str, Any]] = None,
    infra: Optional[CheckReport] = None,
    trace: Optional[TraceResult] = None,
) -> str:
    data = report_data(
        history, findings, bench=bench, command=command, generated=generated, recording=recording, infra=infra, trace=trace
    )
    obs = data["observed"]
    m = data["machine"]
    out = [
        f"# gputop report: {m['hostname']}",
        "",
        f"**Verdict:** {data['verdict']}",
        "",
        f"Observed {obs['seconds']:.0f} s ({obs['snapshots']} samples) from {_when(obs['start'])} to {_when(obs['end'])}"
        + (f" on a **simulated** machine ({m['simulated']})." if m["simulated"] else "."),
        "",
    ]
    out += _recording(data)
    out += _findings(data)
    out += _infra_team(data)
    out += _machine(data)
    out += _topology(data)
    out += _health(data)
    out += _gpu_stats(data)
    out += _host(data)
    out += _job(data)
    out += _stacks(data)
    out += _bench(data)
    out += _trace(data)
    cmd = data["gputop"]["command"]
    out += ["## About this report", ""]
    out += _table(
        ["", ""],
        [
            ("gputop", data["gputop"]["version"]),
            ("Command", _code(cmd) if cmd else None),
            ("Python", data["gputop"]["python"]),
            ("Generated", _when(data["generated"])),
        ],
    )
    out.append("Secrets in command lines and environments are redacted.")
    return redact_text("\n".join(out).rstrip("\n") + "\n")

"""The judgements scripts/gpu_check.sh makes, over files gputop wrote (no GPU needed to run these).

    python scripts/gpu_check_verify.py differences REAL.json SIMULATED.json   # snapshot --json, field by field
    python scripts/gpu_check_verify.py topo-m REAL.json TOPO.txt              # gputop's matrix (NICs too) vs nvidia-smi topo -m
    python scripts/gpu_check_verify.py verdict REPORT.json --expect starved|tuned
    python scripts/gpu_check_verify.py hang REPORT.json --pid PID --rank R     # the hang finding names it
    python scripts/gpu_check_verify.py figures OUT_DIR                          # summary.json from the reports
    python scripts/gpu_check_verify.py pcie-measure OUT.json [--simulate SPEC] [--seconds S]  # reads NVML (below)
    python scripts/gpu_check_verify.py pcie REAL.json SIMULATED.json            # the PCIe sources compared
    python scripts/gpu_check_verify.py gpm-measure OUT.json [--simulate SPEC] [--seconds S]   # reads NVML's GPM
    python scripts/gpu_check_verify.py gpm REAL.json SIMULATED.json             # GPM support and metrics, side by side

Each prints what it found; a check that fails exits 1 with one line saying what was expected.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterable

INPUT_FINDINGS = {"starvation"}  # the input-bound verdict (analysis/checks/input.py)
HANG_FINDINGS = {"hang", "rank_wait", "straggler"}


def _load(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def _shape(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return f"list[{len(value)}]"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _walk(prefix: str, real: Any, sim: Any) -> Iterable[str]:
    """Where the real machine's JSON differs in kind from the simulated one (not in value: the
    simulated numbers are made up; what matters is what the real driver leaves out or adds)."""
    if isinstance(real, dict) and isinstance(sim, dict):
        for key in sorted(set(real) | set(sim)):
            if key not in real:
                yield f"{prefix}{key}: only in the simulation"
            elif key not in sim:
                yield f"{prefix}{key}: only on the real machine ({_shape(real[key])})"
            else:
                yield from _walk(f"{prefix}{key}.", real[key], sim[key])
    elif (real is None) != (sim is None) or (isinstance(real, list) != isinstance(sim, list)):
        yield f"{prefix[:-1]}: real {_shape(real)}, simulated {_shape(sim)}"


def differences(real_path: str, sim_path: str) -> int:
    real, sim = _load(real_path), _load(sim_path)
    lines = []
    rm, sm = real["machine"], sim["machine"]
    for key in ("gpu_count", "driver_version", "cuda_version", "nvml_version", "cpu_count"):
        lines.append(f"machine.{key}: real {rm.get(key)!r}, simulated {sm.get(key)!r}")
    lines.append(f"GPU names: real {sorted(set(rm.get('gpu_names') or []))}, simulated {sorted(set(sm.get('gpu_names') or []))}")
    real_links = sorted({c for row in (real["topology"].get("matrix") or []) for c in row})
    sim_links = sorted({c for row in (sim["topology"].get("matrix") or []) for c in row})
    lines.append(f"topology link kinds: real {real_links}, simulated {sim_links}")
    for index, gpu in enumerate(real["gpus"]):
        if gpu.get("unavailable"):
            lines.append(
                f"GPU {index} says unavailable: " + "; ".join(f"{k}: {v}" for k, v in sorted(gpu["unavailable"].items()))
            )
    if real["gpus"] and sim["gpus"]:
        shape = sorted(set(_walk("gpu.", real["gpus"][0], sim["gpus"][0])))
        lines += shape or ["gpu fields: the same kinds of values as the simulation"]
    lines += sorted(set(_walk("host.", real["host"], sim["host"])))
    print("\n".join("  " + line for line in lines))
    return 0


def parse_topo_m(text: str) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """`nvidia-smi topo -m` printed: (the GPU and NIC names of its header, each such row's cells, the NIC
    Legend's entries as "NIC0=mlx5_0")."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # bold/underline when printed to a terminal
    names: list[str] = []
    rows: dict[str, list[str]] = {}
    legend: list[str] = []
    for line in text.splitlines():
        cells = line.split("\t")
        head = cells[0].strip()
        if not names and re.fullmatch(r"GPU0", cells[1].strip() if len(cells) > 1 else ""):
            names = [c.strip() for c in cells[1:] if re.fullmatch(r"(GPU|NIC)\d+", c.strip())]
        elif names and re.fullmatch(r"(GPU|NIC)\d+", head):
            rows[head] = [c.strip() for c in cells[1 : 1 + len(names)]]
        elif re.fullmatch(r"\s*NIC\d+: \S+\s*", line):
            number, _, name = line.strip().partition(": ")
            legend.append(f"{number}={name}")
    return names, rows, legend


def topo_m(real_path: str, topo_path: str) -> int:
    """Does gputop's `topo -m` matrix (GPUs and NICs, from NVML and sysfs) read as nvidia-smi's?"""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from gputop.model import Topology, from_jsonable

    topology = from_jsonable(Topology, _load(real_path)["topology"])
    ours_names, ours_rows = topology.full_matrix()
    names, rows, their_legend = parse_topo_m(Path(topo_path).read_text())
    ours = dict(zip(ours_names, ours_rows))
    problems = []
    if list(ours_names) != names:
        problems.append(f"rows and columns: gputop {list(ours_names)}, nvidia-smi {names}")
    for a in names:
        for j, b in enumerate(names):
            theirs = rows.get(a, [""] * len(names))[j] if j < len(rows.get(a, [])) else ""
            mine = ours[a][ours_names.index(b)] if a in ours and b in ours_names else "(none)"
            if mine != theirs:
                problems.append(f"{a}-{b}: gputop {mine}, nvidia-smi {theirs}")
    legend = [entry.replace(": ", "=") for entry in topology.nic_legend()]
    if legend != their_legend:
        problems.append(f"NIC Legend: gputop {legend}, nvidia-smi {their_legend}")
    print("\n".join("  " + line for line in problems) or f"  the same {len(names)}x{len(names)} matrix and NIC Legend")
    return 1 if problems else 0


def _findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report.get("findings", []) if f.get("severity") in ("critical", "warning", "info")]


def verdict(path: str, expect: str) -> int:
    report = _load(path)
    ids = [f["id"] for f in _findings(report)]
    print(f"  {Path(path).name}: {report.get('verdict')}  (findings: {', '.join(ids) or 'none'})")
    starved = bool(INPUT_FINDINGS & set(ids))
    if expect == "starved" and not starved:
        print(f"FAIL: the starved job got no input-bound finding ({ids})", file=sys.stderr)
        return 1
    if expect == "tuned" and starved:
        print(f"FAIL: the tuned job is still called input-bound ({ids})", file=sys.stderr)
        return 1
    return 0


def hang(path: str, pid: int, rank: int) -> int:
    report = _load(path)
    named = []
    for f in _findings(report):
        if f["id"] not in HANG_FINDINGS:
            continue
        # named as the culprit in the verdict's words (the evidence and the pids also list the ranks left waiting)
        text = f.get("summary", "")
        if re.search(rf"\brank {rank}\b", text) or re.search(rf"\b(PID|pid) {pid}\b", text):
            named.append(f)
    print(f"  {Path(path).name}: {report.get('verdict')}")
    for f in named:
        print(f"  {f['id']} ({f['severity']}): {f['summary']}")
    if not named:
        ids = [f["id"] for f in _findings(report)]
        print(f"FAIL: no hang finding names rank {rank} (PID {pid}); findings: {ids}", file=sys.stderr)
        return 1
    return 0


def _mean_util(report: dict[str, Any]) -> float | None:
    values = [
        g["utilization"]["mean"]
        for g in report.get("gpus", [])
        if g.get("utilization") and g["utilization"].get("mean") is not None
    ]
    return round(sum(values) / len(values), 1) if values else None


def figures(out_dir: str) -> int:
    out = Path(out_dir)
    summary: dict[str, Any] = {}
    for name in ("starved", "tuned", "hang"):
        path = out / f"{name}.json"
        if path.exists():
            report = _load(str(path))
            summary[name] = {
                "verdict": report.get("verdict"),
                "findings": [f["id"] for f in _findings(report)],
                "mean_gpu_utilization_percent": _mean_util(report),
            }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


def pcie_measure(out_path: str, simulate: str | None, seconds: float) -> int:
    """Per GPU: are the PCIe byte counters answered, and their rate against GetPcieThroughput's over `seconds`
    (GpuCollector.compare_pcie_sources), into OUT.json.  The one step here that reads NVML."""
    from gputop.collect.gpu import GpuCollector

    library = None
    if simulate is not None:
        from gputop.sim.fake_nvml import FakeNvmlLibrary
        from gputop.sim.spec import parse_spec
        from gputop.sim.synthetic import SyntheticLoad

        spec = parse_spec(simulate)
        library = FakeNvmlLibrary(spec, SyntheticLoad(spec.profile.gpu_count, spec.profile.gpu.memory_total))
    collector = GpuCollector(library=library)
    try:
        rows = collector.compare_pcie_sources(seconds)
        machine = {"driver_version": collector.driver_version, "simulated": simulate}
    finally:
        collector.close()
    Path(out_path).write_text(json.dumps({"machine": machine, "gpus": rows}, indent=2) + "\n")
    return 0


def _mb(value: Any) -> str:
    return "n/a" if value is None else f"{value / 1e6:.1f} MB/s"


def _relative(a: Any, b: Any) -> str:
    if a is None or b is None:
        return "n/a"
    if max(a, b) < 1e6:  # under 1 MB/s both: idle, a ratio says nothing
        return "idle"
    if not b:
        return "GetPcieThroughput read 0"
    return f"{(a - b) / b:+.0%}"


def pcie(real_path: str, sim_path: str) -> int:
    """Print, per GPU of each machine, the counters' support and their rate against GetPcieThroughput's, then how
    the real machine differs from the simulated one.  Informational: exits 0 (no bar is set on real GPUs yet)."""
    machines = {"real": _load(real_path), "simulated": _load(sim_path)}
    for label, data in machines.items():
        print(f"{label} (driver {data['machine'].get('driver_version')}):")
        for g in data["gpus"]:
            kind = f"supported, valueType {g['value_type']}" if g["counters"] == "supported" else f"refused: {g['counters']}"
            print(
                f"  GPU {g['index']} {g['name']}: PCIe byte counters {kind}; "
                f"TX counters {_mb(g['counter_tx_bytes_per_s'])} vs GetPcieThroughput {_mb(g['throughput_tx_bytes_per_s'])} "
                f"({_relative(g['counter_tx_bytes_per_s'], g['throughput_tx_bytes_per_s'])}); "
                f"RX counters {_mb(g['counter_rx_bytes_per_s'])} vs {_mb(g['throughput_rx_bytes_per_s'])} "
                f"({_relative(g['counter_rx_bytes_per_s'], g['throughput_rx_bytes_per_s'])}), "
                f"{g['throughput_glimpses']} glimpses"
            )
    real = {g["counters"] for g in machines["real"]["gpus"]}
    sim = {g["counters"] for g in machines["simulated"]["gpus"]}
    real_types = {g["value_type"] for g in machines["real"]["gpus"]} - {None}
    sim_types = {g["value_type"] for g in machines["simulated"]["gpus"]} - {None}
    print(
        f"differs from the simulated machine: counters {sorted(real)} (simulated {sorted(sim)}), "
        f"valueType {sorted(real_types)} (simulated {sorted(sim_types)}; 1 = 32-bit, wraps every 4 GiB)"
    )
    return 0


GPM_METRICS = ("sm_active", "sm_occupancy", "tensor_active", "dram_bandwidth", "fp32_active", "fp16_active")


def gpm_measure(out_path: str, simulate: str | None, seconds: float) -> int:
    """Per GPU: does it answer GPM (and if not, why), the GPM metrics' means over `seconds` of 1 s refreshes, and
    the wall and CPU time of one whole GPU sample (GPM included) into OUT.json.  Reads NVML."""
    import time

    from gputop.collect.gpu import GpuCollector

    library = None
    if simulate is not None:
        from gputop.sim.fake_nvml import FakeNvmlLibrary
        from gputop.sim.spec import parse_spec
        from gputop.sim.synthetic import SyntheticLoad

        spec = parse_spec(simulate)
        library = FakeNvmlLibrary(spec, SyntheticLoad(spec.profile.gpu_count, spec.profile.gpu.memory_total))
    collector = GpuCollector(library=library)
    samples, walls, cpus = [], [], []
    try:
        for _ in range(max(1, int(seconds))):
            time.sleep(1.0)  # the refresh interval GPM averages over (a measurement window, not synchronisation)
            wall, cpu = time.perf_counter(), time.process_time()
            samples.append(collector.sample())
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        machine = {"driver_version": collector.driver_version, "simulated": simulate}
    finally:
        collector.close()
    gpus = []
    for index, first in enumerate(samples[0]):
        series = [row[index] for row in samples if row[index].gpm is not None]
        means = {
            name: (
                sum(values) / len(values) if (values := [v for g in series if (v := getattr(g.gpm, name)) is not None]) else None
            )
            for name in GPM_METRICS
        }
        gpus.append(
            {
                "index": index,
                "name": first.name,
                "compute_capability": first.compute_capability,
                "gpm": "supported" if series else samples[-1][index].unavailable.get("gpm", "no reading"),
                "means": means,
            }
        )
    cost = {"sample_wall_ms": 1000 * sorted(walls)[len(walls) // 2], "sample_cpu_ms": 1000 * sorted(cpus)[len(cpus) // 2]}
    Path(out_path).write_text(json.dumps({"machine": machine, "gpus": gpus, "cost": cost}, indent=2) + "\n")
    return 0


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def gpm(real_path: str, sim_path: str) -> int:
    """Print, per GPU of each machine, GPM support and the metrics' means, and a sample's cost.  Informational:
    exits 0 (no bar is set on real GPUs yet)."""
    for label, data in {"real": _load(real_path), "simulated": _load(sim_path)}.items():
        cost = data["cost"]
        print(
            f"{label} (driver {data['machine'].get('driver_version')}): one GPU sample with GPM "
            f"{cost['sample_wall_ms']:.1f} ms wall, {cost['sample_cpu_ms']:.1f} ms CPU (median)"
        )
        for g in data["gpus"]:
            if g["gpm"] != "supported":
                print(f"  GPU {g['index']} {g['name']} (cc {g['compute_capability']}): GPM {g['gpm']}")
                continue
            metrics = ", ".join(f"{name} {_pct(g['means'][name])}" for name in GPM_METRICS)
            print(f"  GPU {g['index']} {g['name']} (cc {g['compute_capability']}): {metrics}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("differences")
    p.add_argument("real")
    p.add_argument("simulated")
    p = sub.add_parser("topo-m")
    p.add_argument("real")
    p.add_argument("topo")
    p = sub.add_parser("verdict")
    p.add_argument("report")
    p.add_argument("--expect", required=True, choices=["starved", "tuned"])
    p = sub.add_parser("hang")
    p.add_argument("report")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p = sub.add_parser("figures")
    p.add_argument("out_dir")
    p = sub.add_parser("pcie-measure")
    p.add_argument("out")
    p.add_argument("--simulate", default=None, metavar="SPEC")
    p.add_argument("--seconds", type=float, default=5.0)
    p = sub.add_parser("pcie")
    p.add_argument("real")
    p.add_argument("simulated")
    p = sub.add_parser("gpm-measure")
    p.add_argument("out")
    p.add_argument("--simulate", default=None, metavar="SPEC")
    p.add_argument("--seconds", type=float, default=5.0)
    p = sub.add_parser("gpm")
    p.add_argument("real")
    p.add_argument("simulated")
    args = parser.parse_args()
    if args.what == "gpm-measure":
        return gpm_measure(args.out, args.simulate, args.seconds)
    if args.what == "gpm":
        return gpm(args.real, args.simulated)
    if args.what == "pcie-measure":
        return pcie_measure(args.out, args.simulate, args.seconds)
    if args.what == "pcie":
        return pcie(args.real, args.simulated)
    if args.what == "differences":
        return differences(args.real, args.simulated)
    if args.what == "topo-m":
        return topo_m(args.real, args.topo)
    if args.what == "verdict":
        return verdict(args.report, args.expect)
    if args.what == "hang":
        return hang(args.report, args.pid, args.rank)
    return figures(args.out_dir)


if __name__ == "__main__":
    sys.exit(main())

"""The fleet at scale: a synthetic fleet of N nodes × 8 GPUs built from real `gputop serve` pages
(tests/harness/fleet_scale.py) with a straggler, a hung rank, a node whose NIC is down and a node that
stopped being scraped.  The quick tests answer the view's queries from the fleet's samples (`PromLike`);
the slow one backfills 256 nodes into a real Prometheus with promtool and asks it over HTTP."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from gputop.cli import main
from gputop.commands.fleet_report import build
from gputop.fleet.prometheus import PrometheusApi
from gputop.fleet.view import fleet_view, judge, outliers
from tests.harness import fleet_scale as fs
from tests.harness.processes import free_port, wait_until
from tests.test_fleet import PromLike


def fleet_prom(nodes: int) -> PromLike:
    """The fleet now, and the stopped node's last samples 8 minutes ago (only a range query sees them)."""
    fleet = fs.Fleet.of(nodes)
    before = fs.PAGE_AT - fs.STOPPED_BEFORE_S
    earlier = [(*sample, before) for sample in fleet.samples(fleet.stopped, before)]
    return PromLike([], fs.PAGE_AT, samples=fs.fleet_pages(fleet), earlier=earlier)


@pytest.mark.integration  # builds and evaluates two synthetic fleets (8 and 64 nodes) in Python: seconds, not a unit
def test_the_queries_per_refresh_do_not_grow_with_the_nodes():
    """One query per metric family, whatever the number of nodes: 8 and 64 nodes ask the very same queries,
    none of them for one node."""
    asked = {}
    for nodes in (8, 64):
        prom = fleet_prom(nodes)
        view = fleet_view(prom)
        assert len({n.hostname for n in view.nodes}) == nodes
        asked[nodes] = sorted(prom.asked)  # asked together, on threads: in any order
    assert asked[8] == asked[64], (asked[8], asked[64])
    assert not [q for q in asked[64] if 'Hostname="' in q or "Hostname=~" in q], asked[64]
    assert len(asked[64]) < 25, asked[64]


def test_every_outlier_is_named_with_its_node_and_rank():
    fleet = fs.Fleet.of(64)
    view = fleet_view(fleet_prom(64))
    found = {(o.kind, o.node, o.rank) for o in outliers(view)}
    want = fs.expected(fleet)
    assert ("straggler", *want["straggler"]) in found, found
    assert ("hung", *want["hung"]) in found, found
    assert ("stopped_reporting", want["stopped"], None) in found, found
    assert ("infrastructure", want["nic_down"][0], None) in found, found
    assert len(found) == 4, found
    # the hung rank stops the job: it is the verdict, its 7 peers waiting in their collective are not named
    assert (judge(view).kind, judge(view).node, judge(view).rank) == ("hung", *want["hung"])
    stopped = next(n for n in view.nodes if not n.reporting)
    assert stopped.hostname == want["stopped"] and stopped.last_seen == fs.PAGE_AT - fs.STOPPED_BEFORE_S
    assert view.nnodes == 64 and len([n for n in view.nodes if n.reporting]) == 63


def test_the_markdown_is_a_summary_and_the_json_has_every_rank():
    fleet = fs.Fleet.of(64)
    prom = fleet_prom(64)
    data = json.loads(build(prom, "http://prometheus.test", None, "json"))
    assert len(data["ranks"]) == 63 * 8 and len(data["nodes"]) == 64
    kinds = {o["kind"]: o for o in data["outliers"]}
    want = fs.expected(fleet)
    assert (kinds["straggler"]["node"], kinds["straggler"]["rank"]) == want["straggler"]
    assert (kinds["hung"]["node"], kinds["hung"]["rank"]) == want["hung"]
    assert kinds["stopped_reporting"]["node"] == want["stopped"]
    assert kinds["infrastructure"]["node"] == want["nic_down"][0]
    assert {"node": want["nic_down"][0], "kind": "nic_down", "device": fs.NIC_DOWN}.items() <= next(
        f for f in data["findings"] if f["kind"] == "nic_down"
    ).items()
    assert next(n for n in data["nodes"] if n["node"] == want["stopped"])["reporting"] is False
    text = build(prom, "http://prometheus.test", None, "md")
    assert len(text.splitlines()) < 80, text  # 504 ranks: a summary, not a phone book
    outliers_section = text[text.index("## Outliers") : text.index("## Nodes")]
    for name in (want["straggler"][0], want["hung"][0], want["stopped"], want["nic_down"][0]):
        assert name in outliers_section, (name, outliers_section)
    assert f"| {want['straggler'][1]} | {want['straggler'][0]} |" in text
    assert f"| {want['hung'][1]} | {want['hung'][0]} |" in text


# ----------------------------------------------------------------- 256 nodes in a real Prometheus

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")


@pytest.mark.slow
@pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None, reason="prometheus/promtool not installed (.ci/run installs Debian's prometheus)"
)
def test_256_nodes_backfilled_into_a_real_prometheus_name_every_outlier(spawn, tmp_path, capsys):
    fleet = fs.Fleet.of(256)
    end = float(int(time.time()))
    tsdb, written = fs.build_fleet_tsdb(fleet, tmp_path, end)
    assert written > 256 * 400
    port = free_port()
    spawn(fs.prometheus_argv(tsdb, tmp_path / "prometheus.yml", port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "report.json"

    def reported():
        if main(["report", "--prometheus", url, "--format", "json", "-o", str(out)]) != 0:
            capsys.readouterr()  # not up yet
            return None
        return json.loads(out.read_text())

    data = wait_until(reported, timeout=120, interval=0.5, what="Prometheus up over the backfilled fleet")
    want = fs.expected(fleet)
    assert len(data["nodes"]) == 256 and len(data["ranks"]) == 255 * 8
    kinds = {o["kind"]: o for o in data["outliers"]}
    assert (kinds["straggler"]["node"], kinds["straggler"]["rank"]) == want["straggler"], data["outliers"]
    assert (kinds["hung"]["node"], kinds["hung"]["rank"]) == want["hung"], data["outliers"]
    assert kinds["stopped_reporting"]["node"] == want["stopped"], data["outliers"]
    assert kinds["infrastructure"]["node"] == want["nic_down"][0], data["outliers"]
    assert (data["verdict"]["node"], data["verdict"]["rank"]) == want["hung"]
    stopped = next(n for n in data["nodes"] if n["node"] == want["stopped"])
    assert stopped["reporting"] is False and stopped["last_seen"] == end - fs.STOPPED_BEFORE_S, stopped
    api = PrometheusApi(url)
    assert len(api.query("gputop_job_info")) == 255

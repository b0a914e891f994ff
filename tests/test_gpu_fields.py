"""The table of GPU fields (gputop/gpu_fields.py): every field shows in each place the table names,
and a new row alone is enough to reach the snapshot lines and the report."""

from __future__ import annotations

import io
import json

import pytest

from gputop import gpu_fields, units
from gputop.commands.snapshot import write_table
from gputop.gpu_fields import CARD, METRICS, REPORT, SNAPSHOT, GpuField
from gputop.report.jsonreport import render_json
from gputop.report.markdown import render_markdown
from tests.harness.histories import simulated_history

# faults that give every field something to say: ECC errors and a pending remap, an XID, thermal throttling
SPEC = "h100-sxm-8+ecc=1+xid=1:48+thermal=1"
GPU = 1


@pytest.fixture(scope="module")
def history():
    return simulated_history(SPEC, seconds=5)


def _latest_gpu(history):
    return next(g for g in history.latest.gpus if g.index == GPU)


def _card_text(history) -> str:
    from gputop.tui.widgets.gpu_grid import GpuGrid

    grid = GpuGrid()  # not mounted: set what update_data sets (it also repaints, which needs an app), then draw
    grid.snapshots, grid.gpu_count = list(history), len(history.latest.gpus)
    return "\n".join(strip.text for strip in grid.build(160, 40))


def _snapshot_text(history) -> str:
    out = io.StringIO()
    write_table(history.machine, history.latest, out)
    return out.getvalue()


def _field_ids(place):
    return [f.key for f in gpu_fields.shown_in(place)]


@pytest.mark.parametrize("key", _field_ids(CARD))
def test_card_fields_show_on_the_card(history, key):
    field = gpu_fields.BY_KEY[key]
    text = field.short(_latest_gpu(history))
    assert text and text != units.NA, f"{key}: the simulated GPU should give a value"
    # GPU 1's card: the cards sit side by side, so take GPU 1's column of the first row of cards
    lines = _card_text(history).splitlines()
    start = lines[0].index(f"GPU{GPU} ") - 2  # the state symbol and its space
    width = lines[0].index(f"GPU{GPU + 1} ") - 2 - start
    card = "\n".join(line[start : start + width] for line in lines[:7])
    assert text in card, f"{key}: GPU {GPU}'s card does not show {text!r}:\n{card}"


@pytest.mark.parametrize("key", _field_ids(SNAPSHOT))
def test_snapshot_fields_show_in_the_snapshot_lines(history, key):
    field = gpu_fields.BY_KEY[key]
    text = field.long(_latest_gpu(history))
    assert text is not None, f"{key}: the faults in {SPEC} should give it something to say"
    gpu_lines = [line for line in _snapshot_text(history).splitlines() if line.startswith(f"{GPU:>3}  ")]
    assert gpu_lines, "GPU 1's lines are missing"
    assert field.snapshot_cell.format(text) in _snapshot_text(history)


@pytest.mark.parametrize("key", _field_ids(REPORT))
def test_report_fields_show_in_the_report(history, key):
    field = gpu_fields.BY_KEY[key]
    markdown = render_markdown(history, [], generated=1.0)
    data = json.loads(render_json(history, [], generated=1.0))
    assert field.stat is not None or field.health_cell is not None, f"{key} is a report field with no report column"
    if field.stat is not None:
        record = next(g for g in data["gpus"] if g["index"] == GPU)
        assert record[key] is not None and record[key]["samples"] > 0, f"{key}: no statistics in the JSON report"
        assert field.stat(record[key]["mean"]) in markdown
    if field.health_cell is not None:
        health = next(h for h in data["health"] if h["index"] == GPU)
        assert health[field.health_key] is not None, f"{key}: no health value in the JSON report"
        assert f"| {field.health_header} |" in markdown
        cell = field.health_cell(health)
        assert cell is not None and f"| {cell} |" in markdown


def _gauges(history) -> dict[tuple[str, str], float]:
    """`gputop serve --dcgm-fields`'s gauges over the latest sample: (name, gpu) -> value."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gputop.exporter import Exporter

    class LatestOnly:  # the pipeline's part the exporter uses
        machine = history.machine

        def poll(self):
            return history.latest

        def close(self):
            pass

    exporter = Exporter(LatestOnly(), dcgm_fields=True, log=lambda line: None)
    exporter.update(history.latest)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return {
        (sample.name, sample.labels.get("gpu")): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


@pytest.mark.parametrize("key", _field_ids(METRICS))
def test_metric_fields_are_exported_as_gauges(history, key):
    field = gpu_fields.BY_KEY[key]
    value = field.read(_latest_gpu(history))
    assert value is not None, f"{key}: the simulated GPU should give a value"
    assert _gauges(history)[(field.metric[0], str(GPU))] == pytest.approx(value)


def test_a_new_row_reaches_the_snapshot_and_the_report(history, monkeypatch):
    """The promise of the table: a new NVML field is one row (plus its reader in collect/gpu.py)."""
    memory_clock = GpuField(
        "clock_memory",
        "Mem clock",
        "MHz",
        frozenset((SNAPSHOT, REPORT)),
        read=lambda g: g.clock_memory,
        long=lambda g: units.na(g.clock_memory, "{}MHz"),
        snapshot_cell=" mem {}",
        stat=lambda v: units.na(v, "{:.0f} MHz"),
        health_key="clock_memory_min",
        health_value=lambda alive: min(g.clock_memory for g in alive),
        health_header="Mem clock min",
        health_cell=lambda h: f"{h['clock_memory_min']} MHz",
    )
    monkeypatch.setattr(gpu_fields, "FIELDS", gpu_fields.FIELDS + (memory_clock,))
    gpu = _latest_gpu(history)
    assert gpu.clock_memory, "the simulated GPU reports a memory clock"
    assert f" mem {gpu.clock_memory}MHz" in _snapshot_text(history)
    markdown = render_markdown(history, [], generated=1.0)
    assert "| Mem clock mean |" in markdown and f"{gpu.clock_memory} MHz" in markdown
    assert "| Mem clock min |" in markdown
    data = json.loads(render_json(history, [], generated=1.0))
    assert next(g for g in data["gpus"] if g["index"] == GPU)["clock_memory"]["mean"] == pytest.approx(gpu.clock_memory)
    assert next(h for h in data["health"] if h["index"] == GPU)["clock_memory_min"] == gpu.clock_memory


def test_every_field_says_how_it_shows_in_each_of_its_places():
    for field in gpu_fields.FIELDS:
        assert field.places <= {CARD, SNAPSHOT, REPORT, METRICS}, field.key
        assert (METRICS in field.places) == (field.metric is not None), f"{field.key}: metrics place and gauge disagree"
        assert (CARD in field.places) == (field.short is not None), f"{field.key}: card place and card text disagree"
        assert (SNAPSHOT in field.places) == (field.long is not None), f"{field.key}: snapshot place and text disagree"
        health = (field.health_key, field.health_value, field.health_header, field.health_cell)
        assert all(part is None for part in health) or all(part is not None for part in health), (
            f"{field.key}: half a Health column"
        )
        has_report_column = field.stat is not None or field.health_cell is not None
        assert (REPORT in field.places) == has_report_column, f"{field.key}: report place and report column disagree"

"""Every dataclass in gputop.model round-trips through JSON text, nested values and Nones included."""

from __future__ import annotations

import dataclasses
import json
import pickle
import sys
import types
import typing

import pytest

import gputop.model as model
from gputop.model import (
    EccCounts,
    GpuSample,
    HostSample,
    MachineInfo,
    NvLinkLink,
    NvLinks,
    PcieLink,
    Snapshot,
    from_jsonable,
    to_jsonable,
)

MODEL_CLASSES = [
    obj
    for obj in vars(model).values()
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == model.__name__
]


def _example(tp, depth=0, none=False):
    """A non-default value of type `tp` (Optional -> the inner type, or None when `none`)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if none else _example(args[0], depth, none)
    if tp is model.NvLinks:
        return model.NvLinks.of([build(model.NvLinkLink, depth + 1, none), build(model.NvLinkLink, depth + 1, none)])
    if dataclasses.is_dataclass(tp):
        return build(tp, depth + 1, none)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return (_example(args[0], depth, none), _example(args[0], depth, none))
        return tuple(_example(a, depth, none) for a in args)
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        return {(3 if key_t is int else "key"): _example(val_t, depth, none)}
    return {int: 7, float: 2.5, str: "text", bool: True, typing.Any: "any"}[tp]


def build(cls, depth=0, none=False):
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _example(hints[f.name], depth, none) for f in dataclasses.fields(cls)})


def roundtrip(cls, value):
    text = json.dumps(to_jsonable(value))
    return from_jsonable(cls, json.loads(text))


def test_the_model_has_the_contract_classes():
    names = {cls.__name__ for cls in MODEL_CLASSES}
    assert {
        "Snapshot",
        "GpuSample",
        "PcieLink",
        "NvLinkLink",
        "EccCounts",
        "RemappedRows",
        "GpuProcess",
        "Topology",
        "MachineInfo",
        "HostSample",
        "ProcInfo",
        "Frame",
        "ThreadStack",
        "ProcessStacks",
        "Rank",
        "JobTree",
        "Finding",
    } <= names


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_every_field_filled_roundtrips(cls):
    value = build(cls)
    back = roundtrip(cls, value)
    assert back == value
    assert type(back) is cls


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_optional_fields_as_none_roundtrip(cls):
    value = build(cls, none=True)
    assert roundtrip(cls, value) == value


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_defaults_roundtrip(cls):
    required = {
        f.name: _example(typing.get_type_hints(cls)[f.name])
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    value = cls(**required)
    assert roundtrip(cls, value) == value


def test_nested_snapshot_keeps_types():
    """Tuples stay tuples, int dict keys stay ints, floats stay floats (JSON writes 3.0 as 3.0, 3 as 3)."""
    snap = build(Snapshot)
    back = roundtrip(Snapshot, snap)
    assert isinstance(back.gpus, tuple) and isinstance(back.gpus[0].pcie, PcieLink)
    assert isinstance(back.gpus[0].nvlink[0], NvLinkLink)
    assert list(back.job.stacks) == [3] and isinstance(back.job.stacks[3].threads, tuple)
    assert isinstance(back.host.load_average, tuple)


def test_int_written_for_a_float_field_comes_back_a_float():
    host = from_jsonable(HostSample, {"cpu_percent": [1, 2.5], "load_average": [1, 2, 3]})
    assert host.cpu_percent == (1.0, 2.5) and all(isinstance(x, float) for x in host.cpu_percent)


def test_unknown_keys_from_newer_writers_are_ignored():
    data = to_jsonable(GpuSample(index=0, uuid="GPU-1", name="n", pci_bus_id="b"))
    data["added_in_a_later_version"] = 1
    assert from_jsonable(GpuSample, data) == GpuSample(index=0, uuid="GPU-1", name="n", pci_bus_id="b")


def test_realistic_simulated_snapshot_roundtrips():
    from gputop.backend import SimulatedMachine
    from gputop.pipeline import Pipeline

    with Pipeline(SimulatedMachine("h100-sxm-8+ecc=1+gpu-lost=2@0")) as pipeline:
        snap = pipeline.poll()
        machine = pipeline.machine
    assert roundtrip(Snapshot, snap) == snap
    assert roundtrip(MachineInfo, machine) == machine
    assert snap.gpus[2].lost and isinstance(snap.gpus[1].ecc, EccCounts)


# --------------------------------------------------------------------- NVLink: compact, read as NvLinkLinks


def _links(rate):
    return tuple(
        NvLinkLink(k, k != 2, f"0000:{0xA0 + k:02X}:00.0", "switch", rate * (k + 1) if k != 2 else None, rate)
        for k in range(18)  # an H100's
    )


def test_nvlinks_read_back_as_the_links_they_were_built_from():
    links = _links(1e9)
    gpu = GpuSample(index=0, uuid="GPU-1", name="n", pci_bus_id="b", nvlink=links)
    assert isinstance(gpu.nvlink, NvLinks) and len(gpu.nvlink) == 18
    assert tuple(gpu.nvlink) == links and gpu.nvlink == links
    assert gpu.nvlink[2] == links[2] and gpu.nvlink[-1] == links[-1] and gpu.nvlink[1:3] == links[1:3]
    assert gpu.nvlink[2].tx_bytes_per_s is None and gpu.nvlink[2].rx_bytes_per_s == 1e9  # None stays None
    assert [link.link for link in gpu.nvlink if not link.active] == [2]
    with pytest.raises(IndexError):
        gpu.nvlink[18]
    with pytest.raises(AttributeError):
        gpu.nvlink.rates = None  # immutable, as the dataclasses around it


def test_nvlinks_share_their_wiring_and_keep_rates_in_one_array():
    a = GpuSample(index=0, uuid="GPU-1", name="n", pci_bus_id="b", nvlink=_links(1e9))
    b = GpuSample(index=0, uuid="GPU-1", name="n", pci_bus_id="b", nvlink=_links(2e9))
    assert a.nvlink.wiring is b.nvlink.wiring  # equal wiring: one object, whatever built it
    assert a.nvlink != b.nvlink and a != b
    assert a.nvlink.rates.typecode == "d" and len(a.nvlink.rates) == 36
    # what a sample holds of its own is the array and the object around it, under half of one NvLinkLink a link
    own = sys.getsizeof(a.nvlink) + sys.getsizeof(a.nvlink.rates)
    assert own < len(a.nvlink) * sys.getsizeof(a.nvlink[0]) / 2, own


def test_nvlinks_json_keeps_the_list_of_links_shape():
    links = _links(1.5e9)
    data = to_jsonable(GpuSample(index=0, uuid="GPU-1", name="n", pci_bus_id="b", nvlink=links))
    assert data["nvlink"] == [dataclasses.asdict(link) for link in links]  # as before the layout changed
    back = from_jsonable(GpuSample, json.loads(json.dumps(data)))
    assert back.nvlink == links and isinstance(back.nvlink, NvLinks)
    assert back.nvlink.wiring is GpuSample(index=0, uuid="u", name="n", pci_bus_id="b", nvlink=links).nvlink.wiring


def test_nvlinks_pickle_and_hash():
    links = NvLinks.of(_links(1e9))
    assert pickle.loads(pickle.dumps(links)) == links
    assert hash(NvLinks.of(_links(1e9))) == hash(links) and NvLinks.of(_links(-0.0)) == NvLinks.of(_links(0.0))
    with pytest.raises(ValueError, match="18 links need 36 rates"):
        NvLinks(links.wiring, [1.0])

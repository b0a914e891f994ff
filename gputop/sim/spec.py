"""`--simulate`'s spec string -> `SimSpec`: a profile (`gputop.sim.profiles`) or a capture folder
(`gputop.sim.capture`), with the faults layered on it.  Apart from both, because a capture is turned into a
profile: the capture's parser imports the profiles, and the spec reads either."""

from __future__ import annotations

from dataclasses import replace

from gputop.errors import UsageError
from gputop.sim import DEFAULT_PROFILE
from gputop.sim.profiles import (
    FAULTS,
    INFRA_FAULTS,
    MIG_MAX_DEVICES,
    MIG_SWITCH,
    NIC_FAULTS,
    PROFILES,
    Faults,
    InfraFaults,
    Profile,
    SimSpec,
)


def _valid_forms() -> str:
    return f"profiles: {', '.join(PROFILES)}; {MIG_SWITCH[0]}; faults: {', '.join(f[0] for f in (*FAULTS.values(), *NIC_FAULTS.values()))}"


def _bad(message: str) -> UsageError:
    return UsageError(f"bad --simulate spec: {message} ({_valid_forms()}; see `gputop snapshot --help-faults`)")


def _gpu_index(value: str, fault: str, profile: Profile) -> int:
    try:
        index = int(value)
    except ValueError:
        raise _bad(f"{fault} needs a GPU index, got {value!r}") from None
    if not 0 <= index < profile.gpu_count:
        raise _bad(f"{fault}={index}: {profile.name} has GPUs 0..{profile.gpu_count - 1}")
    return index


def _xid(value: str, profile: Profile) -> tuple[int, int, float]:
    """`IDX:CODE[@SECONDS]` -> (gpu, code, seconds)."""
    where, at, seconds_text = value.partition("@")
    index_text, colon, code_text = where.partition(":")
    index = _gpu_index(index_text, "xid", profile)
    try:
        code = int(code_text) if colon else -1
        seconds = float(seconds_text) if at else 0.0
    except ValueError:
        code, seconds = -1, float("nan")
    if code <= 0 or not seconds >= 0:
        raise _bad(f"xid needs IDX:CODE[@SECONDS] (e.g. xid=3:79@10), got {value!r}")
    return index, code, seconds


def _parse_nic_fault(faults: InfraFaults, key: str, value: str, profile: Profile) -> InfraFaults:
    """One of the nic-* switches added to `faults`."""
    name, colon, gbps_text = value.partition(":")
    names = [nic.name for nic in profile.nics]
    if not names:
        raise _bad(f"{profile.name} has no NICs, so {key} does not apply")
    if name not in names:
        raise _bad(f"{key}={value}: {profile.name}'s NICs are {', '.join(names)}")
    if key == "nic-rate":
        try:
            gbps = float(gbps_text) if colon else 0.0
        except ValueError:
            gbps = 0.0
        if not gbps > 0:
            raise _bad(f"nic-rate needs DEV:GBPS (e.g. nic-rate=mlx5_3:200), got {value!r}")
        return replace(faults, nic_rate=(*faults.nic_rate, (name, gbps)))
    if colon:
        raise _bad(f"{key} needs a NIC name only (e.g. {key}={names[0]}), got {value!r}")
    field_name = key.replace("-", "_")
    return replace(faults, **{field_name: getattr(faults, field_name) | {name}})


def _with_mig(profile: Profile, value: str) -> Profile:
    """`IDX:PROFILE,...` -> `profile` with GPU IDX split into those MIG instances (at most 7 compute slices)."""
    index_text, colon, names_text = value.partition(":")
    index = _gpu_index(index_text, "mig", profile)
    model = profile.model(index)
    if not model.mig_profiles:
        raise _bad(f"{model.name} has no MIG, so mig does not apply")
    names = tuple(n.strip() for n in names_text.split(",") if n.strip()) if colon else ()
    offered = ", ".join(p.name for p in model.mig_profiles)
    chosen = [model.mig_profile(n) for n in names]
    if not names or None in chosen:
        raise _bad(f"mig needs IDX:PROFILE[,PROFILE...] with profiles of {offered}, got {value!r}")
    if sum(p.slices for p in chosen if p is not None) > MIG_MAX_DEVICES:
        raise _bad(f"mig={value}: more than {MIG_MAX_DEVICES} compute slices on one GPU")
    return replace(profile, mig=(*((gpu, n) for gpu, n in profile.mig if gpu != index), (index, names)))


def _parse_infra_fault(faults: InfraFaults, key: str, value: str, profile: Profile) -> InfraFaults:
    """One INFRA_FAULTS switch added to `faults`."""
    if key == "nvlink-crc":
        index_text, colon, link_text = value.partition(":")
        index = _gpu_index(index_text, key, profile)
        if not profile.gpu.nvlink_links:
            raise _bad(f"{profile.name} has no NVLink, so nvlink-crc does not apply")
        try:
            link = int(link_text) if colon else 0
        except ValueError:
            link = -1
        if not 0 <= link < profile.gpu.nvlink_links:
            raise _bad(f"nvlink-crc needs IDX[:LINK] with LINK 0..{profile.gpu.nvlink_links - 1}, got {value!r}")
        return replace(faults, nvlink_crc=faults.nvlink_crc | {(index, link)})
    if key == "kernel-xid":
        index_text, colon, code_text = value.partition(":")
        index = _gpu_index(index_text, key, profile)
        code = int(code_text) if colon and code_text.isdigit() else 0
        if code <= 0:
            raise _bad(f"kernel-xid needs IDX:CODE (e.g. kernel-xid=3:79), got {value!r}")
        return replace(faults, kernel_xids=(*faults.kernel_xids, (index, code)))
    index = _gpu_index(value, key, profile)
    if key == "topology" and not profile.gpu.nvlink_links:
        raise _bad(f"{profile.name} has no NVLink, so topology does not apply")
    if key == "retired-page" and not profile.gpu.ecc:
        raise _bad(f"{profile.name} has no ECC, so retired-page does not apply")
    name = key.replace("-", "_")
    return replace(faults, **{name: getattr(faults, name) | {index}})


def _gpu_lost(value: str, profile: Profile) -> tuple[int, float]:
    """gpu-lost=IDX@SECONDS -> (IDX, SECONDS)."""
    index_text, at, seconds_text = value.partition("@")
    index = _gpu_index(index_text, "gpu-lost", profile)
    try:
        seconds = float(seconds_text) if at else float("nan")
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0:  # also rejects NaN
        raise _bad(f"gpu-lost needs IDX@SECONDS (e.g. gpu-lost=3@10), got {value!r}")
    return index, seconds


def _faulty_gpu(key: str, value: str, profile: Profile) -> int:
    """The GPU a one-GPU fault (thermal=IDX, ecc=IDX, ...) names, where the profile has what the fault breaks."""
    index = _gpu_index(value, key, profile)
    if key == "nvlink-down" and not profile.gpu.nvlink_links:
        raise _bad(f"{profile.name} has no NVLink, so nvlink-down does not apply")
    if key == "ecc" and not profile.gpu.ecc:
        raise _bad(f"{profile.name} has no ECC, so ecc does not apply")
    if key.startswith("fabric-") and not (profile.switch_bus_ids and profile.model(index).fabric_info):
        raise _bad(f"{profile.name} has no NVSwitch fabric NVML reports, so {key} does not apply")
    return index


def parse_spec(spec: str | None) -> SimSpec:
    """`PROFILE[+FAULT...]` or `capture:DIR` -> SimSpec; anything wrong raises UsageError with one line."""
    text = (spec or DEFAULT_PROFILE).strip()
    if text.startswith("capture:"):  # a folder's name may hold "+": no faults on a capture
        from gputop.sim.capture import load_capture

        return SimSpec(text=text, profile=load_capture(text[len("capture:") :]), faults=Faults())
    name, *fault_texts = text.split("+")
    name = name.strip() or DEFAULT_PROFILE
    profile = PROFILES.get(name)
    if profile is None:
        raise _bad(f"unknown profile {name!r}")
    lost: dict[int, float] = {}
    sets: dict[str, set[int]] = {
        k: set() for k in ("pcie-degraded", "thermal", "ecc", "nvlink-down", "power", "fabric-not-started", "fabric-degraded")
    }
    old_driver = False
    xids: list[tuple[int, int, float]] = []
    infra = InfraFaults()
    for fault_text in fault_texts:
        fault_text = fault_text.strip()
        key, _, value = fault_text.partition("=")
        if key == "mig":
            profile = _with_mig(profile, value)
            continue
        if key not in FAULTS and key not in NIC_FAULTS:
            raise _bad(f"unknown fault {fault_text!r}")
        if key in NIC_FAULTS:
            infra = _parse_nic_fault(infra, key, value, profile)
        elif key in INFRA_FAULTS:
            infra = _parse_infra_fault(infra, key, value, profile)
        elif key == "old-driver":
            if value:
                raise _bad("old-driver takes no value")
            old_driver = True
        elif key == "gpu-lost":
            index, seconds = _gpu_lost(value, profile)
            lost[index] = seconds
        elif key == "xid":
            xids.append(_xid(value, profile))
        else:
            sets[key].add(_faulty_gpu(key, value, profile))
    faults = Faults(
        lost_after=lost,
        old_driver=old_driver,
        pcie_degraded=frozenset(sets["pcie-degraded"]),
        thermal=frozenset(sets["thermal"]),
        ecc=frozenset(sets["ecc"]),
        nvlink_down=frozenset(sets["nvlink-down"]),
        power_cap=frozenset(sets["power"]),
        xids=tuple(xids),
        fabric_not_started=frozenset(sets["fabric-not-started"]),
        fabric_degraded=frozenset(sets["fabric-degraded"]),
        infra=infra,
    )
    normalised = "+".join([name, *(f.strip() for f in fault_texts)])
    return SimSpec(text=normalised, profile=profile, faults=faults)

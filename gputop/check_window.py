"""The machine check's window over a live pipeline (`gputop check`, `gputop report`, the TUI's `c` key): the
GPUs' details and the kernel's side read at its start and again at its end, judged with the snapshots polled
in between (`gputop.analysis.machine_check`), so nothing is polled twice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional

from gputop.analysis.dcgm_diag import DcgmRun
from gputop.analysis.machine_check import CheckInput, CheckReport, LoadOutcome, build_report
from gputop.model import Snapshot

if TYPE_CHECKING:
    from gputop.pipeline import Pipeline


class Evidence:
    """The start and the end of a check's window around any poll loop (`gputop check`, `gputop report`):
    GPU details and the kernel's side read at `start`, again at `finish`, checked with the snapshots between."""

    def __init__(self, pipeline: Pipeline, host_root: Optional[str] = None) -> None:
        self.pipeline = pipeline
        pipeline.watch_nic_errors()  # the window is seconds long: the NICs' error counters every poll
        self.host = pipeline.host_source(host_root)  # the kernel's side, read here and by the counter watch
        self.before = pipeline.gpu_details()
        self.bus_ids = [d.pci_bus_id for d in self.before if d.pci_bus_id]
        self.host_before = self.host.read(self.bus_ids)

    def finish(
        self,
        snapshots: Iterable[Snapshot],
        load: Optional[LoadOutcome] = None,
        window: float = 0.0,
        dcgm: Optional[DcgmRun] = None,
    ) -> CheckReport:
        after = self.pipeline.gpu_details()
        host_after = self.host.read(self.bus_ids)
        snaps = tuple(snapshots)
        seconds = snaps[-1].timestamp - snaps[0].timestamp if len(snaps) > 1 else 0.0
        return build_report(
            CheckInput(
                machine=self.pipeline.machine,
                snapshots=snaps,
                before=self.before,
                after=after,
                host_before=self.host_before,
                host_after=host_after,
                seconds=max(seconds, window),
                load=load,
                dcgm=dcgm,
            )
        )

    def close(self) -> None:
        self.host.close()

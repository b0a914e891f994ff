"""Textual's strips carry no reference cycles once `strip_cycles` is installed (gputop.tui.app installs it), so
the lines of each frame are freed by refcounting, not left for the cyclic garbage collector."""

from __future__ import annotations

import gc

from rich.segment import Segment
from textual.strip import Strip

from gputop.tui import strip_cycles
from tests.harness.tui import build_app, settle


def test_a_strip_divided_or_cropped_whole_is_freed_by_refcounting():
    assert strip_cycles.install()
    gc.collect()
    gc.disable()
    # what the collector would free is kept in gc.garbage, to be looked at: only strips count (a thread of an
    # earlier test, still winding down, may leave garbage of its own meanwhile)
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        strip = Strip([Segment("ab"), Segment("cd")])
        assert strip.divide([4])[0] is strip and strip.divide([2, 4, 9]) == strip.divide([2, 4])  # as Textual cuts
        assert strip.crop_extend(0, 4, None) is strip
        assert [s.text for s in strip.divide([1, 4])] == ["a", "bcd"]  # a real division, as Textual makes it
        assert strip.crop_extend(1, 6, None).text == "bcd  "
        del strip
        gc.collect()
        # nothing left for the cyclic collector: the strip went with its last reference
        assert not [o for o in gc.garbage if isinstance(o, (Strip, Segment))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


async def test_the_frames_the_app_draws_leave_no_strip_in_a_cycle(close_sources):
    assert strip_cycles._installed  # by gputop.tui.app's import (the harness imports the app)
    app, source = build_app(40)
    close_sources(source)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector would free is kept in gc.garbage, to be counted
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app, source, diagnosis=False)
            gc.collect()
            strips = sum(isinstance(o, Strip) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert app.monitor.snapshots_seen == 40
    assert strips == 0

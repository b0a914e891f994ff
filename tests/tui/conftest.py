"""Fixtures for the TUI tests (shared code lives in tests/harness/tui.py)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from tests.harness.histories import ScriptedSource


@pytest.fixture
def close_sources():
    """Sources block in poll() once their script is used up; release them at the end of the test."""
    sources: list[ScriptedSource] = []
    yield sources.append
    for source in sources:
        source.close()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` tests in this folder on a fresh event loop (pytest-asyncio is not a dependency)."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None

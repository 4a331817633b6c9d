"""Fixtures the `specrt serve` tests share (helpers and the server process: tests/support/servers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def demo_gen():
    """The demo bundle loaded in the test process: what a server's answers are compared with."""
    import specrt

    return specrt.load(threads=1)

"""Compatibility tests: the seed commit's own code, run in a worker process per test module."""

from pathlib import Path

import pytest
from seedref import SeedProcess

#: the modules the seed worker calls into (they import the seed commit's ``megatron``)
SEEDSIDE = Path(__file__).parent / "seedside"


@pytest.fixture(scope="module")
def seed():
    """A worker running Megatron-LM at the seed commit, with ``seedside/`` on its path."""
    with SeedProcess(paths=[SEEDSIDE]) as process:
        yield process


@pytest.fixture(scope="session")
def shared_seed():
    """One seed worker for the whole session (starting one costs ~20 s), for modules whose
    calls leave nothing behind in it that another call would see."""
    with SeedProcess(paths=[SEEDSIDE]) as process:
        yield process

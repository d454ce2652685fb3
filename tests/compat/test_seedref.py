"""The seed-commit harness runs the archive's own code, apart from megatron-core 0.16.1."""

from __future__ import annotations

import pytest
from seedref import SeedRaised

pytestmark = pytest.mark.compat


def test_worker_imports_the_seed_source_not_megatron_core(seed):
    import megatron.core

    found = seed.call("seed_probe:where")
    assert found["core"].startswith(str(seed.root))
    assert found["helpers"].startswith(str(seed.root))
    assert not megatron.core.__file__.startswith(str(seed.root))


def test_seed_exceptions_come_back_with_their_classes(seed):
    with pytest.raises(SeedRaised) as raised:
        seed.call("seed_probe:fail", "no samples")
    assert raised.value.is_a("AssertionError")
    assert raised.value.message == "no samples"
    assert seed.call("seed_probe:where")  # the worker lives on after a raise

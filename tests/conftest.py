"""Cross-package tests: compatibility with megatron-core, and behaviour across packages."""

import os

import pytest
from seedref import REQUIRE_SEED_VARIABLE, seed_unavailable

#: the tokenizer backend's self-check runs in every test that asks for it: a verdict remembered
#: on disk by an earlier run (of other code, in a working tree) would stand in for it
os.environ.setdefault("MEGAFMT_BACKEND_CHECKS", "off")

#: fixtures that run the seed commit's code or read its source: a test using one needs the
#: seed's source archive, as does a test marked ``seed``
SEED_FIXTURES = frozenset(
    {"seed", "shared_seed", "seed_process", "seed_ranks", "seed_tok", "checkouts"}
)

#: why the tests that need the seed were left out, and how many (for the summary line)
_left_out: dict[str, int] = {}


def pytest_collection_modifyitems(config, items):
    unavailable = seed_unavailable()
    kept, needing_seed = [], []
    for item in items:
        if "/compat/" in str(item.path):
            item.add_marker(pytest.mark.compat)
        if SEED_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.seed)
        (needing_seed if unavailable and item.get_closest_marker("seed") else kept).append(item)
    if needing_seed:
        config.hook.pytest_deselected(items=needing_seed)
        items[:] = kept
        _left_out[unavailable] = len(needing_seed)


def pytest_terminal_summary(terminalreporter):
    for reason, count in _left_out.items():
        terminalreporter.write_line(
            f"not run: {count} tests that compare with the seed commit ({reason}; "
            f"{REQUIRE_SEED_VARIABLE}=1 makes its absence an error, as in CI)",
            yellow=True,
        )


@pytest.fixture(scope="module")
def single_process_group(tmp_path_factory):
    """A one-process gloo group for the module's tests: megatron-core 0.16.1's BlendedDataset
    asks torch.distributed for the rank unguarded."""
    import torch

    store = tmp_path_factory.mktemp("pg") / "store"
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{store}", rank=0, world_size=1
    )
    yield
    torch.distributed.destroy_process_group()

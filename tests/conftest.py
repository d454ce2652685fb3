"""Cross-package tests: compatibility with megatron-core, and behaviour across packages."""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/compat/" in str(item.path):
            item.add_marker(pytest.mark.compat)


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

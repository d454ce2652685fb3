"""Cross-package tests: compatibility with megatron-core, and behaviour across packages."""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/compat/" in str(item.path):
            item.add_marker(pytest.mark.compat)

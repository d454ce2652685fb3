"""``megaindex.utils.compile_helpers``: megatron-core's call before building datasets, which
compiles nothing here but loads the builders ``MEGAINDEX_BACKEND`` chooses, failing early."""

import pytest

from megaindex import backends
from megaindex.utils import compile_helpers


@pytest.fixture(autouse=True)
def fresh_choice():
    backends.implementation.cache_clear()
    yield
    backends.implementation.cache_clear()


def test_compile_helpers_fails_early_on_a_backend_that_is_not_there(monkeypatch):
    monkeypatch.setenv("MEGAINDEX_BACKEND", "fortran")
    with pytest.raises(backends.BackendError, match="fortran"):
        compile_helpers()


@pytest.mark.parametrize("choice", ["cpp", "numpy"])
def test_compile_helpers_loads_the_chosen_builders(monkeypatch, choice):
    monkeypatch.setenv("MEGAINDEX_BACKEND", choice)
    assert compile_helpers() is None
    assert backends.implementation.cache_info().currsize == 1
    assert backends.backend() == choice

"""Runs inside the seed worker (testing/seedref.py): what the harness itself is checked with."""

from __future__ import annotations


def where() -> dict:
    import megatron.core
    from megatron.core.datasets import helpers

    return {"core": megatron.core.__file__, "helpers": helpers.__file__}


def fail(message: str) -> None:
    raise AssertionError(message)

"""Checking counts given to megaload and the loader states handed back to it, before either is
used: a count that is not a whole number, or a saved state that lacks a key or holds a value of
the wrong type, is an error naming the argument or key, what was found and what is allowed,
never a ``KeyError``, a ``TypeError`` deep in a sampler, or a silently truncated count.

Megatron-LM's samplers take ``consumed_samples`` as an integer (``range`` and list slices
refuse a float there, an integral one such as ``12.0`` included), so megaload takes integers
only, numpy's included.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

from megaload.errors import LoaderStateError, SamplerError, SamplerTypeError


def is_integer(value: Any) -> bool:
    """An ``int`` or numpy integer, not a ``bool`` and not a float of integral value."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_count(name: str, value: Any) -> int:
    """``value`` as an ``int`` if it is a whole count >= 0; else an error naming ``name``."""
    if not is_integer(value):
        raise SamplerTypeError(
            f"{name} must be an integer >= 0 (samples consumed by all ranks together), got "
            f"{value!r} ({type(value).__name__}); a fractional count is not rounded"
        )
    if value < 0:
        raise SamplerError(f"{name} must be an integer >= 0, got {value}")
    return int(value)


#: what a value of a saved state must be: (what is allowed, in words; the test)
Kind = tuple[str, Callable[[Any], bool]]

INTEGER: Kind = ("an integer", is_integer)
COUNT: Kind = ("an integer >= 0", lambda v: is_integer(v) and v >= 0)
POSITIVE: Kind = ("an integer >= 1", lambda v: is_integer(v) and v >= 1)
OPTIONAL_POSITIVE: Kind = ("an integer >= 1 or None", lambda v: v is None or POSITIVE[1](v))
OPTIONAL_INTEGER: Kind = ("an integer or None", lambda v: v is None or is_integer(v))
FLAG: Kind = ("True or False", lambda v: isinstance(v, bool))
TEXT: Kind = ("a string", lambda v: isinstance(v, str))
OPTIONAL_TEXT: Kind = ("a string or None", lambda v: v is None or isinstance(v, str))
MAPPING: Kind = ("a mapping", lambda v: isinstance(v, Mapping))
OPTIONAL_MAPPING: Kind = ("a mapping or None", lambda v: v is None or isinstance(v, Mapping))
COUNTS: Kind = (
    "a list of integers >= 0",
    lambda v: isinstance(v, (list, tuple)) and all(COUNT[1](item) for item in v),
)


def check_state(state: Any, schema: Mapping[str, Kind], where: str, exact: bool = False) -> None:
    """Raise :class:`~megaload.errors.LoaderStateError` unless ``state`` is a mapping holding
    every key of ``schema``, each value of its kind, and with ``exact`` no other key (a key this
    loader does not know may be a setting of the order it would ignore). ``where`` names the
    state in the message (``"loader state"``, ``"loader state['layout']"``)."""
    if not isinstance(state, Mapping):
        raise LoaderStateError(
            f"{where} is a {type(state).__name__}; expected a mapping as state_dict() returns"
        )
    missing = [key for key in schema if key not in state]
    if missing:
        raise LoaderStateError(
            f"{where} lacks {', '.join(missing)}: it was not saved by this loader's state_dict()"
        )
    unknown = [repr(key) for key in state if key not in schema] if exact else []
    if unknown:
        raise LoaderStateError(
            f"{where} holds {', '.join(unknown)}, which this loader's state_dict() does not "
            f"write (it writes {', '.join(map(repr, schema))}): a state of another program or "
            "version, or one edited; a setting this loader does not know could change the order"
        )
    for key, (allowed, test) in schema.items():
        if not test(state[key]):
            value = state[key]
            raise LoaderStateError(
                f"{where}[{key!r}] is {value!r} ({type(value).__name__}); expected {allowed}"
            )

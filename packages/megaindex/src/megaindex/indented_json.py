"""``json.dumps(value, indent=4, default=default)``, the same text in about 60 % of the time.

A dataset's description is that text (megatron-core's, whose md5 names the cache files), made
once per corpus of a blend and once more for the blend, which lists every corpus's. With an
indent, the json module encodes item by item in Python (14 us for a GPTDataset's description,
8.6 us here, of a blend's cold build of about 600 us per small corpus); here the containers are
walked in Python and every scalar encoded by the functions the json module's own encoders call.
Anything else (a dict with keys that are not strings, a value past ``DEEPEST`` levels, NaN and
the infinities) is left to the json module, its text indented to where it sits. The walk takes
more stack than json's own encoder: a value nested within a few dozen levels of Python's
recursion limit, which json encodes, is a RecursionError here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

INDENT = "    "
INFINITY = float("inf")
#: how many containers (and objects handed to ``default``) deep the walk goes before the rest is
#: left to the json module (which also names a circular reference)
DEEPEST = 32


def indented_json(value: Any, default: Callable[[Any], Any]) -> str:
    """The text ``json.dumps(value, indent=4, default=default)`` gives."""
    return _encoded(value, default, "", 0)


def _item(value: Any, default: Callable[[Any], Any], here: str, depth: int) -> str:
    """An item of a container ``depth`` deep: a string or an integer (most of a description)
    at once, anything else through :func:`_encoded`."""
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is int:
        return int.__repr__(value)
    return _encoded(value, default, here, depth + 1)


def _encoded(value: Any, default: Callable[[Any], Any], here: str, depth: int) -> str:
    """``value`` as the json module encodes it at the indentation ``here``, ``depth`` deep."""
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float) and not (value != value or value == INFINITY or value == -INFINITY):
        return float.__repr__(value)  # NaN and the infinities (json's own tests): json's words
    if depth < DEEPEST:
        inner = here + INDENT
        if isinstance(value, (list, tuple)):
            if not value:
                return "[]"
            items = [_item(v, default, inner, depth) for v in value]
            return f"[\n{inner}" + (",\n" + inner).join(items) + f"\n{here}]"
        if isinstance(value, dict):
            if not value:
                return "{}"
            pairs = list(value.items())
            if all(isinstance(key, str) for key, _ in pairs):  # else json turns keys into text
                items = [
                    f"{encode_basestring_ascii(key)}: {_item(v, default, inner, depth)}"
                    for key, v in pairs
                ]
                return f"{{\n{inner}" + (",\n" + inner).join(items) + f"\n{here}}}"
        elif not isinstance(value, float):  # an object of the caller's: encoded as its default
            return _encoded(default(value), default, here, depth + 1)
    return json.dumps(value, indent=len(INDENT), default=default).replace("\n", "\n" + here)

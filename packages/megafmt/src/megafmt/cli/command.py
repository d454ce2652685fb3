"""What a ``mega.commands`` plugin is, and the helpers the commands share."""

from __future__ import annotations

import argparse
import importlib
import json
import math
from collections.abc import Callable
from typing import Any, Protocol

from megafmt.redaction import redact


class Command(Protocol):
    """A ``mega`` subcommand. The entry point names a class; ``mega`` instantiates it."""

    help: str
    """One line for ``mega --help``."""

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add the subcommand's arguments to ``parser``."""
        ...

    def run(self, args: argparse.Namespace) -> int:
        """Do the work; the return value is the exit status."""
        ...


class DeferredCommand:
    """A command declared by its help line alone; the class ``implementation`` names
    (``module:Class``, a ``Command`` without the help line) is imported when the command is
    chosen. ``mega --help`` lists every command without importing what they need to run (torch,
    for most): a package's ``mega.commands`` entry point names a subclass that sets both."""

    help: str
    implementation: str

    def configure(self, parser: argparse.ArgumentParser) -> None:
        module, _, name = self.implementation.partition(":")
        self._command = getattr(importlib.import_module(module), name)()
        self._command.configure(parser)

    def run(self, args: argparse.Namespace) -> int:
        return self._command.run(args)


#: ``--multimodal`` choices: require the modes section, forbid it, or follow the file
MULTIMODAL_CHOICES = {"auto": None, "yes": True, "no": False}


def add_multimodal_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """``--multimodal [{auto,no,yes}]``, parsed to None, False or True; bare ``--multimodal``
    is ``yes``, as Megatron-LM's tools take the flag."""
    parser.add_argument(
        "--multimodal",
        nargs="?",
        const="yes",
        choices=sorted(MULTIMODAL_CHOICES),
        default="auto",
        help=help,
    )


def multimodal_choice(args: argparse.Namespace) -> bool | None:
    """The parsed value of ``--multimodal``."""
    return MULTIMODAL_CHOICES[args.multimodal]


def bounded_int(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for integers of at least ``minimum``: a bad value is an error
    naming the argument (argparse adds it), the value and what is allowed, before any work."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # what argparse names in its own messages
    return parse


#: argparse types for sizes and counts
positive_int = bounded_int(1)
non_negative_int = bounded_int(0)


def positive_float(text: str) -> float:
    """An argparse ``type`` for a finite number above 0 (a size in MB): ``nan``, ``inf``, 0,
    negatives and words are errors naming the value, before any work."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON (for ``--json`` outputs), credentials masked."""
    print(redact(json.dumps(value, indent=2, default=str)))


def table(rows: list[tuple[str, str]]) -> str:
    """Two aligned columns."""
    width = max((len(key) for key, _ in rows), default=0)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)

"""``mega``: one console script whose subcommands come from every installed package."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version

from megafmt.cli.command import Command
from megafmt.errors import MegafmtError, PluginError
from megafmt.limits import limit_hint
from megafmt.redaction import redact
from megafmt.registry import Registry
from megafmt.termination import Terminated, terminated_as_interrupted

COMMANDS: Registry[type[Command]] = Registry(
    "mega.commands",
    "mega command",
    required=("configure", "run"),
    providers={
        "index": "it is provided by megaindex: pip install ./packages/megaindex",
        "load": "it is provided by megaload: pip install ./packages/megaload",
        "dist": "it is provided by megadist: pip install ./packages/megadist",
    },
)


#: the project's packages, released together under one version
PACKAGES = ("megafmt", "megaindex", "megaload", "megadist")


def versions() -> str:
    """``mega --version``: each of the project's packages and its installed version."""
    lines = []
    for package in PACKAGES:
        try:
            lines.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            lines.append(f"{package} (not installed)")
    return "\n".join(lines)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``mega`` parser: with ``only``, that command's subparser, configured (its plugin
    imports what it needs, torch for some); without, every installed command by its help line
    alone, which is all ``mega --help`` shows, so it waits for no command's imports."""
    parser = argparse.ArgumentParser(
        prog="mega",
        description="Megatron-compatible data pipeline tools. Commands come from the installed\n"
        "packages (megafmt, megaindex, megaload, megadist).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=versions())
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS.available() if only is None else [only]:
        try:
            command = COMMANDS.get(name)()
        except PluginError as error:  # one broken plugin must not take the others down
            sub = commands.add_parser(name, help=f"(unavailable: {error})")
            sub.set_defaults(handler=None, unavailable=str(error))
            continue
        sub = commands.add_parser(name, help=command.help, description=command.help)
        if name == only:
            command.configure(sub)
        sub.set_defaults(handler=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``mega`` with ``argv`` (default: the process arguments); returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    if first is not None and first not in COMMANDS:
        print(f"mega: error: {COMMANDS.unknown_message(first)}", file=sys.stderr)
        return 2
    args = build_parser(first).parse_args(argv)
    if args.handler is None:
        print(f"mega {args.command}: error: {args.unavailable}", file=sys.stderr)
        return 2
    try:
        with terminated_as_interrupted():  # a time limit's SIGTERM cleans up as Ctrl-C does
            return args.handler(args)
    except (MegafmtError, OSError, ValueError, LookupError, MemoryError) as error:
        hint = limit_hint(error)
        message = redact(str(error)) or type(error).__name__
        print(
            f"mega {args.command}: error: {message}" + (f" ({hint})" if hint else ""),
            file=sys.stderr,
        )
        return 1
    except Terminated:
        print(f"mega {args.command}: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"mega {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``mega verify PREFIX...``: check every structural invariant; exit 1 naming the first broken."""

from __future__ import annotations

import argparse
import sys

from megafmt.cli.command import add_multimodal_argument, multimodal_choice
from megafmt.redaction import redact
from megafmt.verification import verify


class VerifyCommand:
    help = "check that corpora are well formed (exit status 1 at the first violation)"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("prefixes", nargs="+", metavar="PREFIX", help="corpus path prefix")
        add_multimodal_argument(
            parser, "require (yes) or forbid (no) the sequence modes section; auto accepts either"
        )
        parser.add_argument(
            "--all", action="store_true", help="report every violation, not only the first"
        )
        parser.add_argument(
            "--remote",
            action="store_true",
            help="check the header and both file sizes only, reading 46 bytes of the .idx in "
            "place: nothing is downloaded or cached (quick on object storage)",
        )

    def run(self, args: argparse.Namespace) -> int:
        status = 0
        for prefix in args.prefixes:
            violations = verify(
                prefix,
                multimodal_choice(args),
                stop_at_first=not args.all,
                progress=not args.remote,
                sizes_only=args.remote,
            )
            for violation in violations:
                print(f"FAIL [{violation.check}] {redact(str(violation))}", file=sys.stderr)
            if violations:
                status = 1
            else:
                print(f"OK {redact(prefix)}" + (" (sizes)" if args.remote else ""))
        return status

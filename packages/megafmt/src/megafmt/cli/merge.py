"""``mega merge OUT IN...``: concatenate corpora, byte-identical to megatron-core's add_index."""

from __future__ import annotations

import argparse

from megafmt.cli.command import add_multimodal_argument, multimodal_choice
from megafmt.merging import expand_inputs, merge


class MergeCommand:
    help = "merge corpora (prefixes or directories of them) into one"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("output", metavar="OUT", help="output path prefix")
        parser.add_argument(
            "inputs",
            nargs="+",
            metavar="IN",
            help="input prefix, or a directory whose corpora are merged in sorted order",
        )
        add_multimodal_argument(
            parser, "merge sequence modes too (auto: when the first input has them)"
        )
        parser.add_argument("--force", action="store_true", help="replace an existing output")

    def run(self, args: argparse.Namespace) -> int:
        merge(
            args.output,
            expand_inputs(args.inputs),
            multimodal=multimodal_choice(args),
            overwrite=args.force,
            progress=True,
        )
        return 0

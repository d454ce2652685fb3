"""``mega merge OUT IN...``: concatenate corpora, byte-identical to megatron-core's add_index.

Megatron-LM's ``tools/merge_datasets.py`` flags work too: ``--input DIR`` (its corpora, in
sorted order; repeatable) and ``--output-prefix OUT``, and a bare ``--multimodal``.
"""

from __future__ import annotations

import argparse

from megafmt.cli.command import add_multimodal_argument, multimodal_choice
from megafmt.merging import expand_inputs, merge


class MergeCommand:
    help = "merge corpora (prefixes or directories of them) into one"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("output", nargs="?", metavar="OUT", help="output path prefix")
        parser.add_argument(
            "inputs",
            nargs="*",
            metavar="IN",
            help="input prefix, or a directory whose corpora are merged in sorted order",
        )
        parser.add_argument(
            "--output-prefix", help="the output prefix (merge_datasets.py's flag; or OUT)"
        )
        parser.add_argument(
            "--input",
            action="append",
            default=[],
            metavar="DIR",
            help="a directory of corpora, or a prefix (merge_datasets.py's flag; or IN)",
        )
        add_multimodal_argument(
            parser, "merge sequence modes too (auto: when the first input has them)"
        )
        parser.add_argument("--force", action="store_true", help="replace an existing output")

    def run(self, args: argparse.Namespace) -> int:
        output, inputs = args.output, list(args.inputs)
        if args.output_prefix is not None:
            if output is not None:  # OUT was the first input
                inputs.insert(0, output)
            output = args.output_prefix
        inputs += args.input
        if output is None or not inputs:
            raise ValueError(
                "mega merge needs an output and inputs: OUT IN... or --output-prefix OUT "
                "--input DIR"
            )
        merge(
            output,
            expand_inputs(inputs),
            multimodal=multimodal_choice(args),
            overwrite=args.force,
            progress=True,
        )
        return 0

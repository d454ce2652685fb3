"""``mega index``: build a GPTDataset index cache offline, inspect a cache, explain a sample.

``mega index build`` takes the arguments a Megatron job gives its dataset (data path, split,
sequence length, seed, sample counts, tokenizer identity) and builds the cache before the job
starts, reporting each phase; the job then finds every table cached.

One module per command (:mod:`megaindex.cli.build`, :mod:`megaindex.cli.inspect`,
:mod:`megaindex.cli.explain`); the dataset flags they share are :mod:`megaindex.dataset_flags`.
"""

from __future__ import annotations

import argparse

from megaindex.cli.build import run_build
from megaindex.cli.explain import run_explain
from megaindex.cli.inspect import run_inspect
from megaindex.dataset_flags import dataset_arguments
from megaindex.megatron_flags import add_ignored_megatron_flags
from megaindex.utils import Split


class IndexCommand:
    """``mega index``: its subcommands, each in its own module."""

    def configure(self, parser: argparse.ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="index_command", metavar="SUBCOMMAND", required=True)
        build = commands.add_parser("build", help="build the index cache before a job starts")
        dataset_arguments(build)
        add_ignored_megatron_flags(build)  # last: it skips the flags read above
        inspect = commands.add_parser("inspect", help="what a cache directory holds")
        inspect.add_argument("cache_dir", metavar="CACHE_DIR")
        inspect.add_argument(
            "--first",
            type=int,
            default=10000,
            help="blend shares are also shown over the first N samples",
        )
        inspect.add_argument("--plot", metavar="PNG", help="plot blend shares (needs matplotlib)")
        inspect.add_argument("--json", action="store_true", help="print JSON")
        inspect.add_argument(
            "--phases",
            nargs="+",
            metavar="START:DATA_PATH",
            help="show this schedule's phases (as mega index build --phases built them): "
            "per phase its blend, samples, tokens and each corpus's epochs",
        )
        explain = commands.add_parser("explain", help="which documents a sample is cut from")
        dataset_arguments(explain)
        explain.add_argument("--sample", type=int, required=True, help="sample number")
        explain.add_argument(
            "--split-name",
            choices=[s.name for s in Split],
            default="train",
            help="the split the sample belongs to",
        )
        explain.add_argument("--tokens", action="store_true", help="print the token ids too")

    def run(self, args: argparse.Namespace) -> int:
        return {"build": run_build, "inspect": run_inspect, "explain": run_explain}[
            args.index_command
        ](args)

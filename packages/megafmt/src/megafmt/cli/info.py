"""``mega info PREFIX...``: dtype, counts, sizes and length distributions of corpora."""

from __future__ import annotations

import argparse

from megafmt.cli.command import print_json, table
from megafmt.stats import CorpusStats, LengthSummary, corpus_stats


def _lengths(summary: LengthSummary) -> str:
    points = "  ".join(f"p{p} {v:,}" for p, v in summary.percentiles.items())
    return f"min {summary.min:,}  {points}  max {summary.max:,}  mean {summary.mean:,.1f}"


def render(stats: CorpusStats) -> str:
    """The human-readable report of one corpus."""
    return table(
        [
            ("corpus", stats.path_prefix),
            ("dtype", f"{stats.dtype} (code {stats.dtype_code})"),
            ("documents", f"{stats.documents:,}"),
            ("sequences", f"{stats.sequences:,}"),
            ("tokens", f"{stats.tokens:,}"),
            ("files", f".idx {stats.idx_bytes:,} bytes, .bin {stats.bin_bytes:,} bytes"),
            ("multimodal", "yes" if stats.multimodal else "no"),
            ("sequence length", _lengths(stats.sequence_lengths)),
            ("document length", _lengths(stats.document_lengths)),
        ]
    )


class InfoCommand:
    help = "show dtype, counts, total tokens and length percentiles of corpora"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("prefixes", nargs="+", metavar="PREFIX", help="corpus path prefix")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def run(self, args: argparse.Namespace) -> int:
        all_stats = [corpus_stats(prefix) for prefix in args.prefixes]
        if args.json:
            print_json([stats.to_dict() for stats in all_stats])
        else:
            print("\n\n".join(render(stats) for stats in all_stats))
        return 0

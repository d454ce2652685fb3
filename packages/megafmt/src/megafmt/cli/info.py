"""``mega info PREFIX...``: dtype, counts, sizes and length distributions of corpora."""

from __future__ import annotations

import argparse
from typing import Any

from megafmt.cli.command import print_json, table
from megafmt.manifest import read_manifest
from megafmt.redaction import redact
from megafmt.stats import CorpusStats, LengthSummary, corpus_stats


def _lengths(summary: LengthSummary) -> str:
    points = "  ".join(f"p{p} {v:,}" for p, v in summary.percentiles.items())
    return f"min {summary.min:,}  {points}  max {summary.max:,}  mean {summary.mean:,.1f}"


def _manifest_rows(manifest: dict[str, Any] | None) -> list[tuple[str, str]]:
    if manifest is None:
        return []
    tokenizer = manifest.get("tokenizer", {})
    inputs = manifest.get("inputs", [])
    return [
        (
            "tokenizer",
            f"{tokenizer.get('type')}, eod {tokenizer.get('eod')}, vocab "
            f"{tokenizer.get('vocab_size')}, {tokenizer.get('fingerprint', '')[:19]}",
        ),
        (
            "made by",
            f"mega preprocess (megafmt {manifest.get('megafmt')}) at {manifest.get('created')} "
            f"from {len(inputs)} input file(s), {manifest.get('skipped_lines', 0)} lines skipped",
        ),
    ]


def render(stats: CorpusStats, manifest: dict[str, Any] | None = None) -> str:
    """The human-readable report of one corpus (and of its manifest, when it has one)."""
    return table(
        [
            ("corpus", stats.path_prefix),
            ("dtype", f"{stats.dtype} (code {stats.dtype_code})"),
            ("documents", f"{stats.documents:,}"),
            ("sequences", f"{stats.sequences:,}"),
            ("tokens", f"{stats.tokens:,}"),
            ("files", f".idx {stats.idx_bytes:,} bytes, .bin {stats.bin_bytes:,} bytes"),
            ("multimodal", "yes" if stats.multimodal else "no"),
            ("consistency", stats.consistency),
            ("sequence length", _lengths(stats.sequence_lengths)),
            ("document length", _lengths(stats.document_lengths)),
            *_manifest_rows(manifest),
        ]
    )


class InfoCommand:
    help = (
        "check corpora for consistency, then show dtype, counts, total tokens and length "
        "percentiles"
    )

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("prefixes", nargs="+", metavar="PREFIX", help="corpus path prefix")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def run(self, args: argparse.Namespace) -> int:
        all_stats = [corpus_stats(prefix) for prefix in args.prefixes]
        manifests = [read_manifest(prefix) for prefix in args.prefixes]
        if args.json:
            print_json(
                [
                    {**stats.to_dict(), "manifest": manifest}
                    for stats, manifest in zip(all_stats, manifests, strict=True)
                ]
            )
        else:
            reports = map(render, all_stats, manifests)
            print(redact("\n\n".join(reports)))
        return 0

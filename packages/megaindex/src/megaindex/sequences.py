"""``mega sequences``: the ``--per-dataset-sequences-path`` JSON of a blend, as Megatron-LM's
``tools/build_sequences_per_dataset.py`` writes it.

For every corpus of the blend (``--data-path`` and the per-split paths, each once, in order
of appearance) its sequence and document counts, read from the ``.idx`` header: the counts
``sequences_per_dataset`` hands GPTDataset so that it need not parse every index at start-up.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from megafmt import IndexedDataset
from megafmt.atomic import atomic_write
from megaindex.dataset_flags import blends_of, data_path_arguments


def blend_prefixes(blend: Any, blend_per_split: Sequence[Any] | None) -> list[str]:
    """Every prefix of ``blend`` and ``blend_per_split``, once each, in order of appearance."""
    prefixes: list[str] = []
    for part in [blend, *(blend_per_split or [])]:
        if part is not None:
            prefixes += [prefix for prefix in part[0] if prefix not in prefixes]
    return prefixes


def sequences_per_dataset(prefixes: Sequence[str]) -> dict[str, tuple[int, int]]:
    """``{prefix: (sequence count, document count)}``, the counts of each ``.idx`` header
    (the document count is the header's, one more than the documents)."""
    counts = {}
    for prefix in prefixes:
        index = IndexedDataset(prefix).index
        counts[prefix] = (index.sequence_count, index.document_count)
    return counts


class SequencesCommand:
    def configure(self, parser: argparse.ArgumentParser) -> None:
        data_path_arguments(parser)
        parser.add_argument(
            "--per-dataset-sequences-path",
            required=True,
            metavar="JSON",
            help="where the JSON goes (Megatron-LM's --per-dataset-sequences-path)",
        )

    def run(self, args: argparse.Namespace) -> int:
        prefixes = blend_prefixes(*blends_of(args))
        if not prefixes:
            raise ValueError("give the data: --data-path, --data-args-path or per-split paths")
        counts = sequences_per_dataset(prefixes)
        with atomic_write(args.per_dataset_sequences_path) as stream:
            stream.write(json.dumps(counts).encode())
        print(f"{len(counts)} corpora: wrote {args.per_dataset_sequences_path}")
        return 0

"""megaindex's ``mega`` commands, declared by their help lines; ``mega index`` and
``mega sequences`` import their implementations (and torch) only when chosen."""

from megafmt.cli.command import DeferredCommand


class IndexCommand(DeferredCommand):
    help = "build, inspect and explain GPTDataset index caches"
    implementation = "megaindex.cli:IndexCommand"


class SequencesCommand(DeferredCommand):
    help = "write the per-dataset sequences JSON of a blend (build_sequences_per_dataset.py)"
    implementation = "megaindex.sequences:SequencesCommand"

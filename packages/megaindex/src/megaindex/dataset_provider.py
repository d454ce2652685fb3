"""megaindex's ``megaload.datasets`` plugin: the datasets ``mega load simulate`` loads, from
Megatron-LM's flags (:mod:`megaindex.dataset_flags`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from megaindex.dataset_flags import build_datasets, build_phases, dataset_arguments
from megaindex.mix_resume import MixState
from megaindex.utils import Split


class DatasetProvider:
    """megaindex's provider for ``mega load simulate``: the datasets of any
    ``megaindex.datasets`` plugin (``--dataset``), from Megatron-LM's flags."""

    def configure(self, parser: argparse.ArgumentParser) -> None:
        dataset_arguments(parser, layout=False)

    def build(self, args: argparse.Namespace) -> list[Any]:
        return build_datasets(args)

    def build_resumed(self, args: argparse.Namespace, state: Mapping[str, Any]) -> list[Any]:
        """The datasets, the training blend continuing the corpora of a loader's saved
        ``state`` (megaload's ``MixResumingProvider``)."""
        return build_datasets(args, MixState.from_loader_state(state))

    def build_phases(self, args: argparse.Namespace) -> list[tuple[int, Any]] | None:
        """``(first iteration, training dataset)`` of each phase of ``--phases``, or None
        without it (megaload's ``PhasedProvider``)."""
        return self.build_continuing_phases(args, continue_corpora=False)

    def build_continuing_phases(
        self, args: argparse.Namespace, continue_corpora: bool = True
    ) -> list[tuple[int, Any]] | None:
        """As :meth:`build_phases`, each phase continuing the corpora where the one before
        left them (megaload's ``MixResumingProvider``)."""
        if not args.phases:
            return None
        phases = build_phases(args, continue_corpora)
        return [(first, datasets[Split.train.value]) for first, datasets in phases]

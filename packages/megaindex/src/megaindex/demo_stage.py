"""megaindex's stage of ``mega demo``: the tour's corpora blended into a GPTDataset split three
ways (Megatron's ``--split``), its tables built into (or found in) the tour's cache."""

from __future__ import annotations

from collections.abc import Sequence

from megafmt.demo import DemoRun
from megaindex.blended_dataset import BlendedDataset
from megaindex.builder import BlendedMegatronDatasetBuilder
from megaindex.config import GPTDatasetConfig
from megaindex.gpt_dataset import GPTDataset
from megaindex.tokenizer import IdentifiedTokenizer


class IndexStage:
    """The blend of the tour's corpora, split train / valid / test, cached."""

    title = "megaindex: a blended GPTDataset, split three ways, cached"
    order = 40
    needs: Sequence[str] = ("preprocess",)

    def check(self, run: DemoRun) -> None:
        parts = run.settings.split.replace("/", ",").split(",")
        try:
            train = float(parts[0])
        except ValueError:
            raise ValueError(
                f"--split {run.settings.split}: expected numbers such as 90,8,2"
            ) from None
        if not train > 0:
            raise ValueError(
                f"--split {run.settings.split}: the tour reads the training split, so its part "
                f"(the first) must be above 0, found {parts[0]}"
            )

    def run(self, run: DemoRun) -> None:
        settings = run.settings
        weights = [corpus.weight for corpus in run.corpora]
        if run.tokenizer is None:
            raise ValueError("the index stage needs the tokenizer the tokenizer stage loads")
        tokenizer = IdentifiedTokenizer.of(run.tokenizer, *run.tokenizer_flags())
        config = GPTDatasetConfig(
            random_seed=settings.seed,
            sequence_length=settings.seq_length,
            blend=(
                [corpus.prefix for corpus in run.corpora],
                None if None in weights else weights,
            ),
            split=settings.split,
            tokenizer=tokenizer,
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            path_to_cache=str(settings.folder / "cache"),
        )
        splits = BlendedMegatronDatasetBuilder(
            GPTDataset, list(settings.samples), lambda: True, config
        ).build()
        run.datasets = list(splits)
        train = splits[0]
        members = train.datasets if isinstance(train, BlendedDataset) else [train]
        run.weights = (
            [float(w) for w in train.weights]
            if isinstance(train, BlendedDataset) and train.weights is not None
            else None
        )
        for corpus, member in zip(run.corpora, members, strict=True):
            corpus.tokens_per_epoch = member.epoch_plan.tokens_per_epoch
            corpus.epochs_indexed = member.epoch_plan.num_epochs
        for name, split in zip(("train", "valid", "test"), splits, strict=True):
            found = "none" if split is None else f"{len(split)} samples"
            source = "" if split is None else f", tables {split.index_source.kind}"
            print(f"   {name}: {found} of {settings.seq_length} tokens{source}")
        run.facts["samples (train / valid / test)"] = [
            0 if split is None else len(split) for split in splits
        ]
        run.facts["index tables (train / valid / test)"] = [
            "-" if split is None else split.index_source.kind for split in splits
        ]
        if run.weights is not None:
            run.facts["blend weights asked"] = run.weights

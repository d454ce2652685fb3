"""megaload's stage of ``mega demo``: the training split read on two data-parallel ranks with
worker processes, one rank's loader dropped half-way and resumed from its ``state_dict``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from megafmt.demo import DemoRun, dataset_ids
from megaload.config import DataLoaderConfig
from megaload.loader import build_pretraining_data_loader


def _take(
    loader: Iterable[Mapping[str, torch.Tensor]], count: int
) -> list[dict[str, torch.Tensor]]:
    """The next ``count`` micro-batches, copied out of the loader's shared memory."""
    taken = []
    for batch in loader:
        taken.append({key: value.clone() for key, value in batch.items()})
        if len(taken) == count:
            break
    return taken


def _same(first: Sequence[Mapping[str, Any]], second: Sequence[Mapping[str, Any]]) -> bool:
    return len(first) == len(second) and all(
        a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
        for a, b in zip(first, second, strict=True)
    )


class LoaderStage:
    """Micro-batches of the training split on each data-parallel rank, and an exact resume."""

    title = "megaload: 2 data-parallel ranks with workers, stopped and resumed"
    order = 50
    needs: Sequence[str] = ("index",)

    def check(self, run: DemoRun) -> None:
        if run.settings.steps < 2:
            raise ValueError(
                f"--steps {run.settings.steps}: the tour stops a loader half-way and resumes it, "
                "so it needs at least 2 micro-batches per rank"
            )

    def run(self, run: DemoRun) -> None:
        settings = run.settings
        train = run.datasets[0]
        if train is None:
            raise ValueError(f"--split {settings.split}: the training split has no samples")
        ranks = settings.data_parallel_size

        def loader(rank: int) -> Any:
            config = DataLoaderConfig(
                micro_batch_size=settings.micro_batch_size,
                global_batch_size=settings.micro_batch_size * ranks,
                data_parallel_rank=rank,
                data_parallel_size=ranks,
                num_workers=settings.num_workers,
            )
            return build_pretraining_data_loader(train, 0, config)

        start = time.perf_counter()
        run.batches = [_take(loader(rank), settings.steps) for rank in range(ranks)]
        run.loader_seconds = time.perf_counter() - start
        half = settings.steps // 2
        stopped = loader(0)
        before = _take(stopped, half)
        state = stopped.state_dict()
        del stopped  # its workers are gone; a new loader continues from the state alone
        resumed = loader(0)
        resumed.load_state_dict(state)
        after = _take(resumed, settings.steps - half)
        read = [len(batches) for batches in run.batches]
        same = _same(run.batches[0], before + after)
        print(
            f"   {ranks} ranks read {' and '.join(map(str, read))} micro-batches of "
            f"{settings.micro_batch_size} ({settings.steps} asked), {settings.num_workers} "
            f"workers each; rank 0 stopped after {len(before)} and resumed from its state_dict: "
            f"identical batches: {same}"
        )
        run.checks["every rank read the micro-batches asked"] = read == [settings.steps] * ranks
        run.checks["resume gave the same samples"] = same and len(before) == half
        self._report(run)

    def _report(self, run: DemoRun) -> None:
        ids = dataset_ids(run)
        for source, corpus in enumerate(run.corpora):
            corpus.samples_read = int((ids == source).sum())
        if len(run.corpora) > 1 and len(ids):
            shares = [corpus.samples_read / len(ids) for corpus in run.corpora]
            run.facts["blend weights realised"] = shares
        run.facts["samples read (all ranks)"] = len(ids)
        seq_length = run.settings.seq_length
        for corpus in run.corpora:
            if corpus.tokens_per_epoch:
                read_epochs = corpus.samples_read * seq_length / corpus.tokens_per_epoch
                run.facts[f"epochs of {corpus.name} (indexed / read)"] = [
                    corpus.epochs_indexed,
                    round(read_epochs, 4),
                ]
        if run.loader_seconds and len(ids):
            rate = len(ids) / run.loader_seconds
            run.facts["loader samples/s, start-up included"] = round(rate, 1)

"""Telling the dataset which samples come next, so remote storage is read ahead of use.

The batch sampler knows the order; a dataset over object storage (megaindex's GPTDataset over
an ``s3://`` corpus) can fetch a batch's bytes while the one before is being read, if it is
told. ``PlannedBatchSampler`` wraps a batch sampler and hands each batch with the batch that
the same DataLoader worker reads next (``lookahead`` batches later, the worker count); the
dataset's ``__getitems__`` passes both to its ``prefetch``. The batches and their order are
those of the wrapped sampler, so resume state is unaffected.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import Any


class PlannedBatch(list):
    """The sample indices of one batch, and in ``upcoming`` those its worker reads next."""

    def __init__(self, indices: Iterable[Any], upcoming: Iterable[Any] = ()) -> None:
        super().__init__(indices)
        self.upcoming = list(upcoming)


class PlannedBatchSampler:
    """``batch_sampler``'s batches as :class:`PlannedBatch` es, ``lookahead`` batches ahead."""

    def __init__(self, batch_sampler: Any, lookahead: int) -> None:
        if lookahead < 1:
            raise ValueError(f"lookahead must be at least 1, found {lookahead}")
        self.batch_sampler = batch_sampler
        self.lookahead = lookahead

    def __iter__(self) -> Iterator[PlannedBatch]:
        window: collections.deque[Any] = collections.deque()
        for batch in self.batch_sampler:
            window.append(batch)
            if len(window) > self.lookahead:
                current = window.popleft()
                yield PlannedBatch(current, window[self.lookahead - 1])
        while window:
            current = window.popleft()
            ahead = window[self.lookahead - 1] if len(window) >= self.lookahead else ()
            yield PlannedBatch(current, ahead)

    def __len__(self) -> int:
        return len(self.batch_sampler)

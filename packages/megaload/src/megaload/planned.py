"""Telling the dataset which samples come next, so remote storage is read ahead of use.

The batch sampler knows the order; a dataset over object storage (megaindex's GPTDataset over
an ``s3://`` corpus) can fetch a batch's bytes while the one before is being read, if it is
told. ``PlannedBatchSampler`` wraps a batch sampler and hands each batch as a
``megafmt.protocols.PlannedBatch`` that also names the batch the same DataLoader worker reads
next (``lookahead`` batches later, the worker count); the dataset's ``__getitems__`` passes
both to its ``prefetch_samples``. The loader wraps its sampler so for a dataset that
implements ``megafmt.protocols.PlannedPrefetch`` and says it ``prefetches_samples``. The batches
and their order are those of the wrapped sampler, so resume state is unaffected.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterator
from typing import Any

from megafmt.protocols import PlannedBatch
from megaload.errors import SamplerError


class PlannedBatchSampler:
    """``batch_sampler``'s batches as :class:`~megafmt.protocols.PlannedBatch` es,
    ``lookahead`` batches ahead."""

    def __init__(self, batch_sampler: Collection[Any], lookahead: int) -> None:
        if lookahead < 1:
            raise SamplerError(f"lookahead must be at least 1, found {lookahead}")
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

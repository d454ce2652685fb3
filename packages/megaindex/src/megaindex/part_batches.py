"""A blend's batch read from its tables: whole, by the parts' class where it can
(:class:`~megaindex.batch_merge.BlendGathering`: GPT datasets of one configuration), else part
by part, the rows that come from each part read by that part and merged in the batch's order by
the parts' class.

Shared by :class:`~megaindex.BlendedDataset` and the blend of a run resumed with a new mix
(:class:`~megaindex.mix_resume.MixResumedBlend`), so both get the same fast path. Parts of a
class that is no :class:`~megafmt.protocols.BatchAssembly` (megatron-core's own dataset
classes) are read as :class:`~megaindex.MegatronDataset`'s defaults read: their samples one by
one, collated, merged row by row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy
import torch

from megafmt.protocols import BatchAssembly, CollatedBatch
from megaindex.batch_merge import BlendGatherer, BlendGathering, merge_rows
from megaindex.megatron_dataset import samples_one_by_one


class BlendReader:
    """Reads the batches of the blend of ``datasets`` (all of one class). What the parts' class
    declares is asked once here, not per batch (a runtime-checkable Protocol's ``isinstance``
    inspects the object's members each time); the gatherer is made on first use, from the
    tables the first read passes."""

    def __init__(self, datasets: Sequence[Any]) -> None:
        self.datasets = datasets
        first = datasets[0]
        self._assembles = isinstance(first, BatchAssembly)
        self._gathers = isinstance(first, BlendGathering)
        self._gatherer: BlendGatherer | None = None
        self._gatherer_asked = False

    def gatherer(
        self, dataset_index: numpy.ndarray, dataset_sample_index: numpy.ndarray
    ) -> BlendGatherer | None:
        """What reads the blend's batches whole, made by the parts' class on first use; None
        where the parts are read one by one and merged."""
        if not self._gatherer_asked:
            if self._gathers:
                self._gatherer = self.datasets[0].blend_gatherer(
                    self.datasets, dataset_index, dataset_sample_index
                )
            self._gatherer_asked = True
        return self._gatherer

    def read(
        self,
        positions: list[int],
        padding: list[bool],
        dataset_index: numpy.ndarray,
        dataset_sample_index: numpy.ndarray,
    ) -> dict[str, Any]:
        """The collated values of blend samples ``positions`` of the tables ``dataset_index``
        and ``dataset_sample_index``; a ``padding`` row gets no loss."""
        gatherer = self.gatherer(dataset_index, dataset_sample_index)
        if gatherer is not None:
            return gatherer.gather(positions, padding)
        ids = dataset_index[positions]
        batch = self._by_part(ids, dataset_sample_index[positions])
        return _without_loss(dict(batch.collated), padding)

    def _by_part(self, ids: numpy.ndarray, samples: numpy.ndarray) -> CollatedBatch:
        """Row ``i`` is sample ``samples[i]`` of part ``datasets[ids[i]]``; each part is asked
        once, for all its rows, in order of first use."""
        batches, rows = [], []
        for dataset_id in dict.fromkeys(ids.tolist()):
            where = numpy.flatnonzero(ids == dataset_id)
            part, wanted = self.datasets[dataset_id], samples[where].tolist()
            if self._assembles:
                batches.append(part.__getitems__(wanted))
            else:
                batches.append(samples_one_by_one(part, wanted))
            rows.append(where.tolist())
        merge = self.datasets[0].merge_batches if self._assembles else merge_rows
        return merge(batches, rows)


def _without_loss(batch: dict[str, Any], padding: list[bool]) -> dict[str, Any]:
    """``batch`` with no loss on its padding rows (a copy of its ``loss_mask`` where any)."""
    if not any(padding):
        return batch
    loss_mask = batch["loss_mask"].clone()
    loss_mask[torch.tensor(padding)] = 0
    return {**batch, "loss_mask": loss_mask}

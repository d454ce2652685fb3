"""A blend's batch read part by part: the rows that come from each part read by that part,
merged in the batch's order by the parts' class.

Shared by :class:`~megaindex.BlendedDataset` and the blend of a run resumed with a new mix
(:class:`~megaindex.mix_resume.MixResumedBlend`). Parts of a class that is no
:class:`~megafmt.protocols.BatchAssembly` (megatron-core's own dataset classes) are read as
:class:`~megaindex.MegatronDataset`'s defaults read: their samples one by one, collated, merged
row by row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy

from megafmt.protocols import BatchAssembly, CollatedBatch
from megaindex.batch_merge import merge_rows
from megaindex.megatron_dataset import samples_one_by_one


def read_by_part(
    datasets: Sequence[Any], ids: numpy.ndarray, samples: numpy.ndarray
) -> CollatedBatch:
    """Row ``i`` is sample ``samples[i]`` of part ``datasets[ids[i]]``; each part is asked
    once, for all its rows, in order of first use."""
    first = datasets[0]
    assembles = isinstance(first, BatchAssembly)
    batches, rows = [], []
    for dataset_id in dict.fromkeys(ids.tolist()):
        where = numpy.flatnonzero(ids == dataset_id)
        part, wanted = datasets[dataset_id], samples[where].tolist()
        if assembles:
            batches.append(part.__getitems__(wanted))
        else:
            batches.append(samples_one_by_one(part, wanted))
        rows.append(where.tolist())
    merge = first.merge_batches if assembles else merge_rows
    return merge(batches, rows)

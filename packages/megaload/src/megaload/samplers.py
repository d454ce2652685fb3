"""Megatron-LM's batch samplers: which sample indices each data-parallel rank reads, batch by
batch. With their default arguments each yields exactly the index lists Megatron-LM's
``data_samplers.py`` yields, in the same order, for every rank and resume point.

``consumed_samples`` is global (all ranks together), as in Megatron-LM. The fixes for the known
quirks are options, off by default:

* ``single``: with ``drop_last=False`` the last global batch is short and higher ranks get an
  empty list; ``pad_last_batch=True`` fills it with None (GPTDataset's padding sample, whose loss
  mask is zero) so every rank gets a full micro-batch.
* ``cyclic``: without data sharding the ranks can get unequal numbers of batches per epoch;
  ``balanced=True`` trims the epoch to whole global batches. The permutation of each epoch is
  seeded by the epoch number alone; ``seed`` adds a seed of your own.

A dataset smaller than one global batch, a resume point past the data, or a rank outside the
data-parallel group are errors that say so, where Megatron-LM asserts or divides by zero.
``consumed_samples == total_samples`` is a clean, empty end of data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch

from megafmt import Registry

logger = logging.getLogger(__name__)


class SamplerError(ValueError):
    """A sampler cannot be built with these arguments."""


def check_batch_layout(
    micro_batch_size: int, data_parallel_rank: int, data_parallel_size: int
) -> None:
    """Refuse a micro-batch size or data-parallel rank and size no sampler can work with."""
    if micro_batch_size <= 0:
        raise SamplerError(f"micro_batch_size must be positive, got {micro_batch_size}")
    if data_parallel_size <= 0:
        raise SamplerError(f"data_parallel_size must be positive, got {data_parallel_size}")
    if not 0 <= data_parallel_rank < data_parallel_size:
        raise SamplerError(
            f"data_parallel_rank {data_parallel_rank} is outside the data-parallel group of "
            f"{data_parallel_size}"
        )


def _check_layout(
    total_samples: int, micro_batch_size: int, data_parallel_rank: int, data_parallel_size: int
) -> None:
    if total_samples <= 0:
        raise SamplerError(f"no sample to consume: the dataset holds {total_samples}")
    check_batch_layout(micro_batch_size, data_parallel_rank, data_parallel_size)


class MegatronPretrainingSampler:
    """Sequential: every global batch of ``micro_batch_size * data_parallel_size`` consecutive
    indices from ``consumed_samples`` on, each rank taking its contiguous share."""

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
        *,
        pad_last_batch: bool = False,
    ) -> None:
        _check_layout(total_samples, micro_batch_size, data_parallel_rank, data_parallel_size)
        if not 0 <= consumed_samples <= total_samples:
            raise SamplerError(
                f"consumed_samples {consumed_samples} is outside the dataset's 0..{total_samples}"
            )
        if consumed_samples == total_samples:
            logger.info("all %d samples are consumed: the sampler yields nothing", total_samples)
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.drop_last = drop_last
        self.pad_last_batch = pad_last_batch

    def __len__(self) -> int:
        # megatron-core's value: the number of samples, not of batches
        return self.total_samples

    def get_start_end_idx(self) -> tuple[int, int]:
        """Where this rank's share starts and ends inside a global batch."""
        start = self.data_parallel_rank * self.micro_batch_size
        return start, start + self.micro_batch_size

    def __iter__(self) -> Iterator[list[Any]]:
        start, end = self.get_start_end_idx()
        width = self.micro_batch_times_data_parallel_size
        first = self.consumed_samples
        whole = first + (self.total_samples - first) // width * width
        for batch_start in range(first, whole, width):
            yield list(range(batch_start + start, batch_start + end))
        if whole < self.total_samples and not self.drop_last:
            share = list(range(whole, self.total_samples))[start:end]
            if self.pad_last_batch:
                share += [None] * (self.micro_batch_size - len(share))
            yield share


class MegatronPretrainingRandomSampler:
    """Random, epoch after epoch: each epoch a new permutation (seeded by the epoch), either
    within each rank's bucket of the data (``data_sharding``) or over all of it."""

    def __init__(
        self,
        dataset: Any,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        data_sharding: bool,
        *,
        balanced: bool = False,
        seed: int | None = None,
    ) -> None:
        _check_layout(total_samples, micro_batch_size, data_parallel_rank, data_parallel_size)
        width = micro_batch_size * data_parallel_size
        if total_samples < width:
            raise SamplerError(
                f"the dataset holds {total_samples} samples, fewer than one global batch of "
                f"micro_batch_size {micro_batch_size} x data_parallel_size {data_parallel_size}"
                f" = {width}"
            )
        if consumed_samples < 0:
            raise SamplerError(f"consumed_samples must be >= 0, got {consumed_samples}")
        self.dataset = dataset
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.data_sharding = data_sharding
        self.micro_batch_times_data_parallel_size = width
        self.last_batch_size = total_samples % width
        self.balanced = balanced
        self.seed = seed

    def __len__(self) -> int:
        return self.total_samples

    def _permutation(self, size: int, epoch: int) -> list[int]:
        generator = torch.Generator()
        generator.manual_seed(epoch if self.seed is None else self.seed + epoch)
        return torch.randperm(size, generator=generator).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        width = self.micro_batch_times_data_parallel_size
        active_total = self.total_samples - self.last_batch_size
        self.epoch = self.consumed_samples // active_total
        done_this_epoch = self.consumed_samples % active_total
        if done_this_epoch % width:
            raise SamplerError(
                f"consumed_samples {self.consumed_samples} does not end a global batch of {width}"
                f" ({done_this_epoch} into the epoch)"
            )
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(self.epoch)
        if self.data_sharding:
            bucket = (self.total_samples // width) * self.micro_batch_size
            first = self.data_parallel_rank * bucket
            order = self._permutation(bucket, self.epoch)[
                done_this_epoch // self.data_parallel_size :
            ]
            indices = [first + i for i in order]
        else:
            step = width if self.balanced else self.micro_batch_size
            bucket = (self.total_samples // step) * step
            order = self._permutation(bucket, self.epoch)[done_this_epoch:]
            indices = order[self.data_parallel_rank :: self.data_parallel_size]
        for start in range(0, len(indices) - self.micro_batch_size + 1, self.micro_batch_size):
            self.consumed_samples += width
            yield indices[start : start + self.micro_batch_size]


class MegatronFullValidationSampler:
    """One sample per rank per batch, over the whole dataset (validation sets smaller than a
    global batch included): rank r reads r, r + dp, r + 2 dp, ..."""

    def __init__(self, total_samples: int, data_parallel_rank: int, data_parallel_size: int):
        _check_layout(total_samples, 1, data_parallel_rank, data_parallel_size)
        self.total_samples = total_samples
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.micro_batch_size = 1

    def __len__(self) -> int:
        return len(range(self.data_parallel_rank, self.total_samples, self.data_parallel_size))

    def __iter__(self) -> Iterator[list[int]]:
        for index in range(self.data_parallel_rank, self.total_samples, self.data_parallel_size):
            yield [index]


#: the batch samplers, by ``dataloader_type`` name (``megaload.samplers`` entry points); the
#: name ``external`` is not a sampler: the dataset is then a loader of its own
SAMPLERS: Registry[Any] = Registry(
    "megaload.samplers", "megaload sampler", required=("__iter__",), home="megaload"
)

"""Megatron-LM's batch samplers: which sample indices each data-parallel rank reads, batch by
batch. With their default arguments each yields exactly the index lists Megatron-LM's
``data_samplers.py`` yields, in the same order, for every rank and resume point.

Each is built as Megatron-LM builds it (same constructor), or as the ``megaload.samplers``
plugin it is (``single``, ``cyclic``, ``full_validation``) through its ``from_config`` factory,
and implements :class:`~megaload.batch_sampler.BatchSampler`: the sequential and full-validation
samplers resume at any micro-batch and data-parallel size, the random one only where its epochs
are shuffled and cut the same way (see :meth:`MegatronPretrainingRandomSampler.check_resume`).

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
from collections.abc import Iterator, Mapping, Sized
from typing import TYPE_CHECKING, Any

import torch

from megafmt.protocols import EpochAware
from megaload.checks import COUNT, FLAG, OPTIONAL_INTEGER, POSITIVE, check_count, check_state
from megaload.errors import ResumeError, SamplerError

if TYPE_CHECKING:
    from megaload.config import DataLoaderConfig

logger = logging.getLogger(__name__)


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


def _check_consumed(consumed_samples: int, total_samples: int) -> None:
    if check_count("consumed_samples", consumed_samples) > total_samples:
        raise SamplerError(
            f"consumed_samples {consumed_samples} is outside the dataset's 0..{total_samples}"
        )
    if consumed_samples == total_samples:
        logger.info("all %d samples are consumed: the sampler yields nothing", total_samples)


class _ResumesAnywhere:
    """The resume rules of a sampler that reads the dataset in its own order: a run continues
    at any micro-batch and data-parallel size, so there is nothing to agree on, and a re-shard
    continues at the same count."""

    def resume_state(self) -> dict[str, Any]:
        return {}

    def check_resume(self, saved: Mapping[str, Any]) -> None:
        return None

    def reshard(self, saved: Mapping[str, Any], consumed_samples: int) -> int:
        return consumed_samples


class MegatronPretrainingSampler(_ResumesAnywhere):
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
        _check_consumed(consumed_samples, total_samples)
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.drop_last = drop_last
        self.pad_last_batch = pad_last_batch

    @classmethod
    def from_config(
        cls, dataset: Sized, consumed_samples: int, config: DataLoaderConfig
    ) -> MegatronPretrainingSampler:
        """The ``single`` plugin's factory."""
        return cls(
            len(dataset),
            consumed_samples,
            config.micro_batch_size,
            config.data_parallel_rank,
            config.data_parallel_size,
            config.drop_last,
            pad_last_batch=config.pad_last_batch,
        )

    def __len__(self) -> int:
        # megatron-core's value: the number of samples, not of batches
        return self.total_samples

    def get_start_end_idx(self) -> tuple[int, int]:
        """Where this rank's share starts and ends inside a global batch."""
        start = self.data_parallel_rank * self.micro_batch_size
        return start, start + self.micro_batch_size

    def next_consumed(self, consumed_samples: int) -> int:
        # the last global batch may be short
        return min(consumed_samples + self.micro_batch_times_data_parallel_size, self.total_samples)

    def batches_from(self, consumed_samples: int) -> int:
        """The batches :meth:`__iter__` yields from ``consumed_samples`` on: every whole global
        batch, and the short last one unless ``drop_last``."""
        whole, rest = divmod(
            self.total_samples - consumed_samples, self.micro_batch_times_data_parallel_size
        )
        return whole + int(bool(rest) and not self.drop_last)

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


#: the kinds of the values of ``MegatronPretrainingRandomSampler.resume_state()``
RANDOM_SAMPLER_STATE = {
    "data_sharding": FLAG,
    "seed": OPTIONAL_INTEGER,
    "balanced": FLAG,
    "micro_batch_size": POSITIVE,
    "data_parallel_size": POSITIVE,
    "epoch_samples": POSITIVE,
    "permutation_size": COUNT,
}


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
        check_count("consumed_samples", consumed_samples)
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

    @classmethod
    def from_config(
        cls, dataset: Sized, consumed_samples: int, config: DataLoaderConfig
    ) -> MegatronPretrainingRandomSampler:
        """The ``cyclic`` plugin's factory."""
        return cls(
            dataset,
            len(dataset),
            consumed_samples,
            config.micro_batch_size,
            config.data_parallel_rank,
            config.data_parallel_size,
            config.data_sharding,
            balanced=config.balanced,
            seed=config.seed,
        )

    def __len__(self) -> int:
        return self.total_samples

    def next_consumed(self, consumed_samples: int) -> int:
        return consumed_samples + self.micro_batch_times_data_parallel_size

    def _epoch_layout(self) -> tuple[int, int]:
        """The samples one epoch consumes, and the size of each epoch's permutation (of a
        rank's bucket with data sharding, else of all the samples an epoch deals out)."""
        width = self.micro_batch_times_data_parallel_size
        epoch_samples = self.total_samples - self.last_batch_size
        if self.data_sharding:
            return epoch_samples, (self.total_samples // width) * self.micro_batch_size
        step = width if self.balanced else self.micro_batch_size
        return epoch_samples, (self.total_samples // step) * step

    def resume_state(self) -> dict[str, Any]:
        epoch_samples, permutation_size = self._epoch_layout()
        return {
            "data_sharding": self.data_sharding,
            "seed": self.seed,
            "balanced": self.balanced,
            "micro_batch_size": self.micro_batch_size,
            "data_parallel_size": self.data_parallel_size,
            "epoch_samples": epoch_samples,
            "permutation_size": permutation_size,
        }

    def check_resume(self, saved: Mapping[str, Any]) -> None:
        """A run continues exactly only in the same order (``data_sharding``, ``seed``,
        ``balanced``), over epochs of the same length shuffled by permutations of the same size;
        with data sharding also at the same data-parallel size, as each rank shuffles its own
        bucket. Without sharding another size resumes where those agree."""
        mine = self._check_order(saved)
        if self.data_sharding and saved["data_parallel_size"] != self.data_parallel_size:
            raise ResumeError(
                f"the cyclic sampler with data sharding cannot resume at data_parallel_size "
                f"{self.data_parallel_size} a run saved at {saved['data_parallel_size']}: each "
                "rank shuffles its own bucket of the data, and the buckets depend on the size. "
                "Resume at the saved size, or run without data_sharding (one global shuffle)"
            )
        for field in ("epoch_samples", "permutation_size"):
            if saved[field] != mine[field]:
                raise ResumeError(
                    f"the cyclic sampler cannot resume at micro_batch_size "
                    f"{self.micro_batch_size} x data_parallel_size {self.data_parallel_size} a "
                    f"run saved at {saved['micro_batch_size']} x {saved['data_parallel_size']}: "
                    f"its {field} was {saved[field]}, here it is {mine[field]}, so the epochs "
                    "would be cut or shuffled differently"
                )

    def _check_order(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        """This sampler's ``resume_state()``, after refusing a ``saved`` one of another sampler
        or another order (``data_sharding``, ``seed``, ``balanced``)."""
        mine = self.resume_state()
        check_state(saved, RANDOM_SAMPLER_STATE, "the saved cyclic sampler state")
        for field in ("data_sharding", "seed", "balanced"):
            if saved[field] != mine[field]:
                raise ResumeError(
                    f"the state was saved by the cyclic sampler with {field}={saved[field]!r}, "
                    f"this one has {field}={mine[field]!r}: the samples would come in another "
                    "order"
                )
        return mine

    def reshard(self, saved: Mapping[str, Any], consumed_samples: int) -> int:
        """Exact in two cases. Where the epochs hold the same samples in the same permutation
        (no data sharding, equal ``epoch_samples`` and ``permutation_size``) and the run stopped
        on a whole global batch of this layout: at the same count. At the end of an epoch,
        whatever the layout: the next epoch starts whole, at its first sample in this layout's
        count. Anywhere else the samples read so far in the epoch depend on the saved layout:
        refused, naming where the run stopped."""
        mine = self._check_order(saved)
        epoch, done = divmod(consumed_samples, saved["epoch_samples"])
        if done == 0:
            return epoch * mine["epoch_samples"]
        same_epochs = all(saved[f] == mine[f] for f in ("epoch_samples", "permutation_size"))
        whole_batches = done % self.micro_batch_times_data_parallel_size == 0
        if same_epochs and not self.data_sharding and whole_batches:
            return consumed_samples
        raise ResumeError(
            f"the cyclic sampler cannot re-shard exactly a run that stopped {done} samples into "
            f"epoch {epoch} at micro_batch_size {saved['micro_batch_size']} x "
            f"data_parallel_size {saved['data_parallel_size']} (epoch_samples "
            f"{saved['epoch_samples']}, permutation_size {saved['permutation_size']}, "
            f"data_sharding {saved['data_sharding']}) into micro_batch_size "
            f"{self.micro_batch_size} x data_parallel_size {self.data_parallel_size} (epoch_samples"
            f" {mine['epoch_samples']}, permutation_size {mine['permutation_size']}): re-shard at "
            f"the end of an epoch (consumed_samples {(epoch + 1) * saved['epoch_samples']}), or "
            "between layouts whose unsharded epochs agree"
        )

    def _permutation(self, size: int, epoch: int) -> list[int]:
        generator = torch.Generator()
        generator.manual_seed(epoch if self.seed is None else self.seed + epoch)
        return torch.randperm(size, generator=generator).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        width = self.micro_batch_times_data_parallel_size
        epoch_samples, permutation_size = self._epoch_layout()
        self.epoch = self.consumed_samples // epoch_samples
        done_this_epoch = self.consumed_samples % epoch_samples
        if done_this_epoch % width:
            raise SamplerError(
                f"consumed_samples {self.consumed_samples} does not end a global batch of {width}"
                f" ({done_this_epoch} into the epoch)"
            )
        if isinstance(self.dataset, EpochAware):
            self.dataset.set_epoch(self.epoch)
        order = self._permutation(permutation_size, self.epoch)
        if self.data_sharding:
            first = self.data_parallel_rank * permutation_size
            indices = [first + i for i in order[done_this_epoch // self.data_parallel_size :]]
        else:
            indices = order[done_this_epoch:][self.data_parallel_rank :: self.data_parallel_size]
        for start in range(0, len(indices) - self.micro_batch_size + 1, self.micro_batch_size):
            self.consumed_samples += width
            yield indices[start : start + self.micro_batch_size]


class MegatronFullValidationSampler(_ResumesAnywhere):
    """One sample per rank per batch, over the whole dataset (validation sets smaller than a
    global batch included): rank r reads r, r + dp, r + 2 dp, ... (from ``consumed_samples``
    on, which Megatron-LM's constructor does not take: it always starts at 0)."""

    def __init__(
        self,
        total_samples: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        *,
        consumed_samples: int = 0,
    ) -> None:
        _check_layout(total_samples, 1, data_parallel_rank, data_parallel_size)
        _check_consumed(consumed_samples, total_samples)
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.micro_batch_size = 1

    @classmethod
    def from_config(
        cls, dataset: Sized, consumed_samples: int, config: DataLoaderConfig
    ) -> MegatronFullValidationSampler:
        """The ``full_validation`` plugin's factory (``config.micro_batch_size`` is not read:
        a batch is always one sample)."""
        return cls(
            len(dataset),
            config.data_parallel_rank,
            config.data_parallel_size,
            consumed_samples=consumed_samples,
        )

    def _indices(self) -> range:
        first = self.consumed_samples + self.data_parallel_rank
        return range(first, self.total_samples, self.data_parallel_size)

    def __len__(self) -> int:
        return len(self._indices())

    def next_consumed(self, consumed_samples: int) -> int:
        return min(consumed_samples + self.data_parallel_size, self.total_samples)

    def __iter__(self) -> Iterator[list[int]]:
        for index in self._indices():
            yield [index]

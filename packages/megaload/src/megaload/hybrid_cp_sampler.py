"""The hybrid-context-parallel sampler: each data-parallel rank's share of a whole global batch
at once (the seed commit's ``HybridCPMegatronPretrainingSampler``), so that the sub-sequences of
all its micro-batches can be balanced over the DPxCP ranks together
(:mod:`megaload.hybrid_cp_schedule`; megadist's ``HybridCPDataLoaderWrapper`` moves them).

A global batch of ``global_batch_size`` consecutive indices is ``num_micro_batches`` blocks of
``micro_batch_size x data_parallel_size``; a rank takes its slice of every block, in block
order: exactly what the ``single`` sampler gives it over those micro-batches, in one list. The
loader hands such a batch over as a list of sample dicts, uncollated (Megatron-LM's loader uses
``collate_fn=lambda x: x`` with hybrid context parallelism).
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import TYPE_CHECKING, Any

from megaload.accounting import num_micro_batches
from megaload.errors import SamplerError
from megaload.samplers import MegatronPretrainingSampler

if TYPE_CHECKING:
    from megaload.config import DataLoaderConfig


#: the name the sampler is registered under (``megaload.samplers``)
HYBRID_CP_SAMPLER = "hybrid_cp"


class HybridCPMegatronPretrainingSampler(MegatronPretrainingSampler):
    """Sequential, a global batch per step: this rank's micro-batch slices of it, together."""

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        global_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ) -> None:
        super().__init__(
            total_samples,
            consumed_samples,
            micro_batch_size,
            data_parallel_rank,
            data_parallel_size,
            drop_last,
        )
        self.global_batch_size = global_batch_size
        self.num_micro_batches = num_micro_batches(
            global_batch_size, micro_batch_size, data_parallel_size
        )

    @classmethod
    def from_config(
        cls, dataset: Sized, consumed_samples: int, config: DataLoaderConfig
    ) -> HybridCPMegatronPretrainingSampler:
        """The ``hybrid_cp`` plugin's factory; it needs ``config.global_batch_size`` (for a
        validation or test loader, the configuration's ``eval_global_batch_size``)."""
        if config.global_batch_size is None:
            raise SamplerError(
                "the hybrid_cp sampler reads a whole global batch per step and needs "
                "global_batch_size (Megatron's --global-batch-size), or for a validation or "
                "test loader whose micro-batch differs from training's, eval_global_batch_size "
                "(--eval-global-batch-size)"
            )
        return cls(
            len(dataset),
            consumed_samples,
            config.micro_batch_size,
            config.global_batch_size,
            config.data_parallel_rank,
            config.data_parallel_size,
            config.drop_last,
        )

    def next_consumed(self, consumed_samples: int) -> int:
        width = self.micro_batch_times_data_parallel_size * self.num_micro_batches
        return min(consumed_samples + width, self.total_samples)

    def _share(self, block: list[int]) -> list[int]:
        """This rank's slices of the micro-batch blocks of ``block`` (a global batch)."""
        start, end = self.get_start_end_idx()
        width = self.micro_batch_times_data_parallel_size
        return [
            index
            for first in range(0, width * self.num_micro_batches, width)
            for index in block[first + start : first + end]
        ]

    def __iter__(self) -> Iterator[list[Any]]:
        width = self.micro_batch_times_data_parallel_size * self.num_micro_batches
        first = self.consumed_samples
        whole = first + (self.total_samples - first) // width * width
        for batch_start in range(first, whole, width):
            yield self._share(list(range(batch_start, batch_start + width)))
        if whole < self.total_samples and not self.drop_last:
            yield self._share(list(range(whole, self.total_samples)))

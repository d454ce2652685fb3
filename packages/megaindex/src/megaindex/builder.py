"""``BlendedMegatronDatasetBuilder``: every split of a dataset, built once on global rank 0.

Drop-in for megatron-core's builder, with the same distributed discipline: all ranks call
``build()``; global rank 0 builds (and caches) each dataset first, the others wait at a barrier
and then load the cache. Ranks for which ``is_built_on_rank()`` is False get None but still take
part in the barriers.

Supported here: mock data, and a blend of a single prefix (with ``split``, or one prefix per
split through ``blend_per_split``). Blends of several prefixes are refused with a clear error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy

from megaindex import distributed
from megaindex.config import BlendedMegatronDatasetConfig
from megaindex.errors import CacheError, ConfigError, IndexBuildError
from megaindex.megatron_dataset import MegatronDataset
from megaindex.utils import Split

logger = logging.getLogger(__name__)


class BlendedMegatronDatasetBuilder:
    """Builds the train, valid and test datasets of ``config`` with ``cls``.

    ``sizes`` is the number of samples per split (None: one epoch). ``is_built_on_rank`` says
    whether this rank holds datasets (megatron-core: TP rank 0 on the first or last pipeline
    stage).
    """

    def __init__(
        self,
        cls: type[MegatronDataset],
        sizes: list[int | None],
        is_built_on_rank: Callable[[], bool],
        config: BlendedMegatronDatasetConfig,
    ) -> None:
        if len(sizes) != len(Split):
            raise ConfigError(
                f"sizes must hold one entry per split (train, valid, test), got {sizes}"
            )
        self.cls = cls
        self.sizes = sizes
        self.is_built_on_rank = is_built_on_rank
        self.config = config
        logger.info("building %s splits with sizes=%s", cls.__name__, sizes)
        if not config.mock:
            for split in Split:
                blend = (
                    config.blend
                    if config.blend_per_split is None
                    else config.blend_per_split[split.value]
                )
                if blend is not None and sizes[split.value] is None and blend[1] is not None:
                    raise ConfigError(
                        f"the {split.name} split has weights but no size: weighted blends need "
                        "a sample count (multiple validation sets cannot have weights)"
                    )

    def build(self) -> list[Any]:
        """The dataset of each split (None for an empty split or a rank that builds none)."""
        datasets = self._build_splits()
        for split, dataset in zip(Split, datasets, strict=True):
            if (
                isinstance(dataset, MegatronDataset)
                and dataset.num_samples is not None
                and len(dataset) < dataset.num_samples
            ):
                raise IndexBuildError(
                    f"the {split.name} dataset holds {len(dataset)} samples, fewer than the "
                    f"{dataset.num_samples} requested"
                )
        return datasets

    def _build_splits(self) -> list[Any]:
        if self.config.mock:
            return self._build_megatron_dataset_splits(None, self.config.split_matrix, self.sizes)
        if self.config.blend:
            prefixes, weights = self.config.blend
            if len(prefixes) == 1 and weights is None:
                return self._build_megatron_dataset_splits(
                    prefixes[0], self.config.split_matrix, self.sizes
                )
            raise ConfigError(
                f"blends of several datasets ({len(prefixes)} prefixes) are not supported by "
                "this version of megaindex; give a single prefix"
            )
        datasets: list[Any] = [None] * len(Split)
        for split in Split:
            blend = self.config.blend_per_split[split.value]
            if blend is None:
                continue
            prefixes, _ = blend
            if len(prefixes) != 1:
                raise ConfigError(
                    f"the {split.name} blend has {len(prefixes)} prefixes; this version of "
                    "megaindex builds one prefix per split"
                )
            only_this = [None] * len(Split)
            only_this[split.value] = (0.0, 1.0)
            sizes = [0] * len(Split)
            sizes[split.value] = self.sizes[split.value]
            datasets[split.value] = self._build_megatron_dataset_splits(
                prefixes[0], only_this, sizes
            )[split.value]
        return datasets

    def _build_megatron_dataset_splits(
        self,
        dataset_path: str | None,
        split: list[tuple[float, float] | None],
        sizes: list[int | None],
        synchronize_ranks: bool = True,
    ) -> list[Any]:
        """Each split's dataset over one low-level dataset (one corpus, or the mock data)."""
        if distributed.global_rank() is not None and not self.is_built_on_rank():
            for bookends in split:
                if bookends is not None and synchronize_ranks:
                    distributed.barrier()
            return [None] * len(Split)
        low_level_dataset = self.cls.build_low_level_dataset(dataset_path, self.config)
        num_elements = self.cls.numel_low_level_dataset(low_level_dataset)
        datasets: list[Any] = []
        for index_split in Split:
            bookends = split[index_split.value]
            if bookends is None:
                datasets.append(None)
                continue
            indices = None
            if not getattr(self.config, "fast_cache_load", False):
                begin = round(bookends[0] * float(num_elements))
                end = round(bookends[1] * float(num_elements))
                indices = numpy.arange(begin, end, dtype=numpy.int32)
            datasets.append(
                self.build_generic_dataset(
                    self.cls,
                    self.is_built_on_rank,
                    synchronize_ranks,
                    low_level_dataset,
                    dataset_path,
                    indices,
                    sizes[index_split.value],
                    index_split,
                    self.config,
                )
            )
        return datasets

    @staticmethod
    def build_generic_dataset(
        cls: type | Callable[..., Any],
        is_built_on_rank: Callable[[], bool],
        synchronize_ranks: bool,
        *args: Any,
    ) -> Any:
        """``cls(*args)``: first on global rank 0, then (after a barrier) on the other ranks
        that build datasets; None on ranks that build none."""
        rank = distributed.global_rank()
        if rank is None:
            return cls(*args)
        dataset = None
        if rank == 0 and is_built_on_rank():
            try:
                dataset = cls(*args)
            except CacheError:
                raise
            except OSError as error:
                raise CacheError(
                    f"rank 0 failed to build {getattr(cls, '__name__', cls)}: {error}. If the "
                    "index cache cannot be written, set path_to_cache to a writable directory"
                ) from error
        if synchronize_ranks:
            distributed.barrier()
        if rank != 0 and is_built_on_rank():
            dataset = cls(*args)
        return dataset

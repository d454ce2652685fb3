"""``BlendedDataset``: several mid-level datasets interleaved by weight.

Drop-in for megatron-core's: ``dataset_index`` (int16: which dataset) and
``dataset_sample_index`` (int64: which of its samples) are built by the same greedy
max-error rule (or the exhaustive rule when ``size`` is None), cached under megatron-core's
names (``<md5>-BlendedDataset-<split>-...``), and every sample carries its ``dataset_id``.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from typing import Any

import numpy
import torch

from megaindex.cache import CacheEntry, IndexCache, TableSpec, cached_tables, load_table
from megaindex.config import BlendedMegatronDatasetConfig
from megaindex.errors import ConfigError, IndexBuildError
from megaindex.helpers import (
    MAX_DATASETS,
    build_blending_indices,
    build_exhaustive_blending_indices,
)
from megaindex.megatron_dataset import describe
from megaindex.utils import normalize

logger = logging.getLogger(__name__)

TABLES = ("dataset_index", "dataset_sample_index")


class BlendedDataset(torch.utils.data.Dataset):
    """``size`` samples drawn from ``datasets`` in proportion to ``weights``; with ``size``
    None, exactly ``weights[i]`` (integers) samples of each dataset."""

    def __init__(
        self,
        datasets: list[Any],
        weights: list[int | float],
        size: int | None,
        config: BlendedMegatronDatasetConfig,
    ) -> None:
        _check_blend(datasets, weights, size)
        if len(datasets) == 1:
            logger.warning("building a BlendedDataset of a single dataset")
        if size is not None:
            weights = normalize(weights)
        self.datasets = datasets
        self.split = datasets[0].index_split
        self.weights = weights
        self.size = size
        self.config = config
        identifiers: OrderedDict = OrderedDict()
        identifiers["class"] = type(self).__name__
        identifiers["datasets"] = [dataset.unique_identifiers for dataset in datasets]
        identifiers["split"] = self.split.name
        identifiers["weights"] = self.weights
        identifiers["size"] = self.size
        self.unique_description, self.unique_description_hash = describe(identifiers)
        self.build_seconds: dict[str, float] = {}
        self.index_source = "memory"
        self.dataset_index, self.dataset_sample_index = self._build_indices()

    def __len__(self) -> int:
        if self.dataset_index is None:
            return self._length()
        return self.dataset_index.shape[0]

    def _length(self) -> int:
        return self.size if self.size is not None else int(sum(self.weights))

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if self.dataset_index is None:
            self.dataset_index = load_table(self.path_to_dataset_index, None)
            self.dataset_sample_index = load_table(self.path_to_dataset_sample_index, None)
        dataset_id = self.dataset_index[idx]
        return {
            "dataset_id": dataset_id,
            **self.datasets[dataset_id][self.dataset_sample_index[idx]],
        }

    # ---- the two tables ------------------------------------------------------------------------

    def _cache_entry(self) -> CacheEntry | None:
        if self.config.path_to_cache is None:
            return None
        return CacheEntry.for_dataset(
            self.config.path_to_cache,
            self.unique_description_hash,
            type(self).__name__,
            self.split.name,
            TABLES,
        )

    def _build_indices(self) -> tuple[numpy.ndarray | None, numpy.ndarray | None]:
        entry = self._cache_entry()
        if self.config.defer_npy_index_mmap:
            self.path_to_dataset_index = entry.table_path("dataset_index")
            self.path_to_dataset_sample_index = entry.table_path("dataset_sample_index")
            self.index_source = "deferred"
            return None, None
        if entry is None:
            logger.warning("%s indices are not cached: path_to_cache is None", type(self).__name__)
            tables = self._build_tables()
        else:
            cache = IndexCache(entry, self.unique_description)
            if self.config.fast_cache_load:
                tables, self.index_source = cache.load(None, check=False), "cache"
            else:
                specs = {
                    "dataset_index": TableSpec(("int16",), (self._length(),)),
                    "dataset_sample_index": TableSpec(("int64",), (self._length(),)),
                }
                tables, self.index_source = cached_tables(
                    cache,
                    lambda: cache.load(specs),
                    self._build_tables,
                    lambda _: None,
                    self.build_seconds,
                )
        return tables["dataset_index"], tables["dataset_sample_index"]

    def _build_tables(self) -> dict[str, numpy.ndarray]:
        size = self._length()
        dataset_index = numpy.zeros(size, dtype=numpy.int16)
        dataset_sample_index = numpy.zeros(size, dtype=numpy.int64)
        if self.size is not None:
            build_blending_indices(
                dataset_index, dataset_sample_index, self.weights, len(self.datasets), size, False
            )
        else:
            counts = [int(weight) for weight in self.weights]  # whole, checked at construction
            build_exhaustive_blending_indices(
                dataset_index, dataset_sample_index, counts, len(self.datasets)
            )
        self._check_not_oversampled(dataset_index)
        return {"dataset_index": dataset_index, "dataset_sample_index": dataset_sample_index}

    def _check_not_oversampled(self, dataset_index: numpy.ndarray) -> None:
        drawn = numpy.bincount(dataset_index, minlength=len(self.datasets))
        for number, (dataset, count) in enumerate(zip(self.datasets, drawn, strict=True)):
            if count <= len(dataset):
                continue
            hint = ""
            if self.size is not None:
                share = math.ceil(self.size * self.weights[number])
                expected = math.ceil(share * (1 + self.config.mid_level_dataset_surplus))
                hint = (
                    f"; its share of the blend is {share}, and with mid_level_dataset_surplus="
                    f"{self.config.mid_level_dataset_surplus} it should hold at least {expected} "
                    "(greedy blending never draws more than the share: a dataset this small "
                    "comes from a stale or foreign cache, or was built for another blend)"
                )
            raise IndexBuildError(
                f"the {self.split.name} blend draws {count} samples from dataset {number} "
                f"({getattr(dataset, 'dataset_path', None)}), {count - len(dataset)} more than "
                f"the {len(dataset)} it holds{hint}"
            )


def _check_blend(datasets: list[Any], weights: list[int | float], size: int | None) -> None:
    if len(datasets) != len(weights):
        raise ConfigError(f"{len(datasets)} datasets but {len(weights)} weights")
    if not 0 < len(datasets) <= MAX_DATASETS - 1:
        raise ConfigError(f"a blend holds 1..{MAX_DATASETS - 1} datasets, got {len(datasets)}")
    classes = sorted({type(d).__name__ for d in datasets})
    if len(classes) > 1:
        raise ConfigError(f"the datasets of a blend must all be of one class, found {classes}")
    splits = sorted({d.index_split.name for d in datasets})
    if len(splits) > 1:
        raise ConfigError(f"the datasets of a blend must all belong to one split, found {splits}")
    if any(not w > 0 for w in weights):
        raise ConfigError(f"blend weights must be positive, got {weights}")
    if any(type(w) is not type(weights[0]) for w in weights):
        raise ConfigError(f"blend weights must all be of one type, got {weights}")
    if size is None and isinstance(weights[0], float) and any(w != int(w) for w in weights):
        raise ConfigError(f"without a size, weights count samples and must be whole: {weights}")

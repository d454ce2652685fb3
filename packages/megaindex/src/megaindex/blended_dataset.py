"""``BlendedDataset``: several mid-level datasets interleaved by weight.

Drop-in for megatron-core's: ``dataset_index`` (int16: which dataset) and
``dataset_sample_index`` (int64: which of its samples) are built by the same greedy
max-error rule (or the exhaustive rule when ``size`` is None), held and cached by
:class:`megaindex.tables.CachedTables` under megatron-core's names
(``<md5>-BlendedDataset-<split>-...``), and every sample carries its ``dataset_id``.

A blend implements the data path's Protocols by delegating to its parts: ``__getitems__``
groups the batch's rows by part, asks each part for its rows and has the parts' class merge
them in order (:mod:`megaindex.part_batches`, which also reads parts of a class that is no
:class:`~megafmt.protocols.BatchAssembly`, megatron-core's own dataset classes), or, where the
parts' class reads a blend whole
(:class:`~megaindex.batch_merge.BlendGathering`: GPT datasets), lets it; and
``prefetch_samples`` hands each part its own samples.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from megafmt.protocols import (
    CollatedBatch,
    PlannedPrefetch,
    announced,
    conforms,
)
from megaindex.batch_merge import BlendGatherer, merge_rows
from megaindex.blend_draw import BlendDraw
from megaindex.cache import CacheEntry, TableSpec
from megaindex.config import BlendedMegatronDatasetConfig, GPTDatasetConfig, own_field
from megaindex.errors import ConfigError, IndexBuildError
from megaindex.gpt_dataset import GPTDataset
from megaindex.helpers import (
    MAX_DATASETS,
    build_blending_indices,
    build_exhaustive_blending_indices,
)
from megaindex.megatron_dataset import (
    MegatronDataset,
    describe,
    one_sample_at_a_time,
    resolve_indices,
)
from megaindex.megatron_log import log_blended_tables, log_single_dataset_blend
from megaindex.memory import reserving, table_bytes
from megaindex.mix_resume import blend_mix_state, sample_origin
from megaindex.part_batches import BlendReader
from megaindex.shared_cache import cache_location
from megaindex.tables import BuiltTables, CachedTables, TableSource
from megaindex.utils import Split, normalize

#: blending indices drawn ahead of their blend (:func:`blend_in_advance`), by the blend's
#: weights and size
_in_advance: dict[tuple[tuple[float, ...], int], BlendDraw] = {}
_in_advance_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A child forked during a draw has none of its threads: its blends draw their own."""
    global _in_advance, _in_advance_lock
    _in_advance, _in_advance_lock = {}, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def blend_table_specs(size: int) -> dict[str, TableSpec]:
    """The dtype and shape of a blend's two tables of ``size`` samples."""
    return {
        "dataset_index": TableSpec(("int16",), (size,)),
        "dataset_sample_index": TableSpec(("int64",), (size,)),
    }


def blend_in_advance(weights: Sequence[float], size: int) -> Callable[[], None]:
    """Start drawing the blending indices of a blend of ``size`` samples with ``weights`` (as
    given to :class:`BlendedDataset`) on a thread of their own, while the builder builds the
    blend's parts: the helper releases the GIL, and a blend of thousands of corpora spent a
    quarter of a second on them after its parts (20M samples: 4 s). Their memory is checked and
    held (:func:`~megaindex.memory.reserving`: the parts' checks count it) from the start until
    the builder forgets them; where it does not fit, nothing is drawn in advance, and the blend
    refuses its size in its own terms. The blend built with the same weights and size takes
    them instead of drawing them; returns what forgets them (the builder calls it once the
    blend is built, or failed: a draw still under way then keeps its memory held until it
    ends)."""
    key = (tuple(normalize(list(weights))), int(size))
    tables = table_bytes(blend_table_specs(max(size, 0)))
    what = f"the blending indices of {len(key[0])} datasets, drawn while they build"
    with _in_advance_lock:
        if key in _in_advance:  # another split of the same size: its draw serves both
            return lambda: None
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(reserving(what, tables, f"the blend's size: {size} samples"))
            drawn = _draw_blending_indices(list(key[0]), key[1], "megaindex-blending-in-advance")
        except Exception:  # no room, or a size no table can have: the blend says so itself
            return lambda: None
        held = stack.pop_all()  # released by forget() from here on
    with _in_advance_lock:
        _in_advance[key] = drawn

    def forget() -> None:
        with _in_advance_lock:
            if _in_advance.get(key) is drawn:
                del _in_advance[key]
        # a draw no blend took (a part failed, or the blend was cached) may still be filling
        # its tables: held until it ends
        drawn.when_ended(held.close)

    return forget


def _draw_blending_indices(
    weights: list[float], size: int, thread: str = "megaindex-blending"
) -> BlendDraw:
    """The greedy draw of ``size`` samples by ``weights``, started on a thread named
    ``thread``."""
    return BlendDraw(
        lambda index, sample_index: build_blending_indices(
            index, sample_index, weights, len(weights), size, False
        ),
        size,
        f"{len(weights)} datasets",
        thread,
    )


def _is_drawn_in_advance(weights: Sequence[float], size: int) -> bool:
    """Whether :func:`blend_in_advance` draws the indices of these weights and size."""
    with _in_advance_lock:
        return (tuple(weights), size) in _in_advance


def _drawn_in_advance(
    weights: Sequence[float], size: int
) -> tuple[numpy.ndarray, numpy.ndarray] | None:
    """The blending indices :func:`blend_in_advance` drew for these weights and size (waiting
    for them), or None: none were, or drawing them failed (the blend draws them itself, and
    raises the error in its own terms). Each blend of these weights and size takes them (a
    validation and a test split of the same size): the builder forgets them once its blends
    are built."""
    with _in_advance_lock:
        drawn = _in_advance.get((tuple(weights), size))
    if drawn is None:
        return None
    try:
        return drawn.wait()
    except Exception:
        return None


@dataclass
class BlendTableRecipe:
    """A blend's two tables: which dataset each sample comes from, and which of its samples."""

    datasets: list[Any]
    weights: list[int | float]
    size: int | None
    surplus: float
    split: Split

    names = ("dataset_index", "dataset_sample_index")
    corpus = None
    opened_stat = None
    opened_versions = None

    @property
    def where(self) -> str:
        return f"the blend of {len(self.datasets)} datasets ({self.split.name} split)"

    def sizing(self) -> str:
        if self.size is None:
            return f"every sample of its datasets: {self.length()} samples"
        return f"the blend's size: {self.size} samples"

    def length(self) -> int:
        """The number of samples: ``size``, or every sample of every part."""
        return self.size if self.size is not None else int(sum(self.weights))

    def build(self) -> BuiltTables:
        size = self.length()
        drawn = None if self.size is None else _drawn_in_advance(self.weights, size)
        if drawn is not None:
            dataset_index, dataset_sample_index = drawn
        elif self.size is not None:
            dataset_index, dataset_sample_index = _draw_blending_indices(self.weights, size).wait()
        else:
            counts = [int(weight) for weight in self.weights]  # whole, checked at construction
            dataset_index, dataset_sample_index = BlendDraw(
                lambda index, sample_index: build_exhaustive_blending_indices(
                    index, sample_index, counts, len(counts)
                ),
                size,
                f"{len(counts)} datasets, every sample once",
            ).wait()
        self._check_not_oversampled(dataset_index)
        return BuiltTables(
            {"dataset_index": dataset_index, "dataset_sample_index": dataset_sample_index}
        )

    def bytes_to_hold(self) -> dict[str, int]:
        """Nothing for indices drawn in advance: allocated already, and held by the draw."""
        if self.size is not None and _is_drawn_in_advance(self.weights, self.size):
            return {}
        return table_bytes(self.expected_specs())

    def expected_specs(self) -> dict[str, TableSpec]:
        return blend_table_specs(self.length())

    def settings(self) -> None:
        """Nothing beyond the key: the parts fingerprint their corpora themselves."""
        return None

    def _check_not_oversampled(self, dataset_index: numpy.ndarray) -> None:
        drawn = numpy.bincount(dataset_index, minlength=len(self.datasets))
        for number, (dataset, count) in enumerate(zip(self.datasets, drawn, strict=True)):
            if count <= len(dataset):
                continue
            hint = ""
            if self.size is not None:
                share = math.ceil(self.size * self.weights[number])
                expected = math.ceil(share * (1 + self.surplus))
                hint = (
                    f"; its share of the blend is {share}, and with mid_level_dataset_surplus="
                    f"{self.surplus} it should hold at least {expected} (greedy blending never "
                    "draws more than the share: a dataset this small comes from a stale or "
                    "foreign cache, or was built for another blend)"
                )
            raise IndexBuildError(
                f"the {self.split.name} blend draws {count} samples from dataset {number} "
                f"({_where(dataset)}), {count - len(dataset)} more than the {len(dataset)} it "
                f"holds{hint}"
            )


class BlendedDataset(torch.utils.data.Dataset):
    """``size`` samples drawn from ``datasets`` in proportion to ``weights``; with ``size``
    None, exactly ``weights[i]`` (integers) samples of each dataset."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        one_sample_at_a_time(cls)

    def __init__(
        self,
        datasets: list[Any],
        weights: list[int | float],
        size: int | None,
        config: BlendedMegatronDatasetConfig,
    ) -> None:
        _check_blend(datasets, weights, size)
        if len(datasets) == 1:
            log_single_dataset_blend()
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
        self.recipe = BlendTableRecipe(
            datasets, self.weights, size, config.mid_level_dataset_surplus, self.split
        )
        self.tables = CachedTables(
            self.recipe,
            self._cache_entry(),
            self.unique_description,
            defer=config.defer_npy_index_mmap,
            fast_load=config.fast_cache_load,
        )
        log_blended_tables(type(self).__name__, self.tables.source, config.path_to_cache)
        # which parts take announcements, asked once: a runtime-checkable Protocol's
        # isinstance inspects the object's members each time, too slow for every batch
        self._planned = [conforms(dataset, PlannedPrefetch) for dataset in datasets]
        self._prefetches = any(
            planned and dataset.prefetches_samples
            for planned, dataset in zip(self._planned, datasets, strict=True)
        )
        self._reader = BlendReader(datasets)

    @property
    def index_split(self) -> Split:
        """The split of the blend (megatron-core's mid-level name for ``split``)."""
        return self.split

    @property
    def dataset_index(self) -> numpy.ndarray | None:
        """Which dataset each sample comes from (None while deferred and unused)."""
        return self.tables.get("dataset_index")

    @property
    def dataset_sample_index(self) -> numpy.ndarray | None:
        """Which sample of its dataset each sample is."""
        return self.tables.get("dataset_sample_index")

    @property
    def index_source(self) -> TableSource:
        """Where the tables came from (cache, built, memory, deferred), with timings."""
        return self.tables.source

    def __len__(self) -> int:
        if self.tables.deferred:
            return self.recipe.length()
        return self.tables.shape("dataset_index")[0]

    def __getitem__(self, idx: int | None) -> dict[str, Any]:
        """The sample at ``idx``, with its ``dataset_id``; None gives a padding sample (sample
        0's, with no loss), as a GPT dataset's is."""
        (position,), (padding,) = resolve_indices([idx], self.__len__)
        dataset_id = self.tables["dataset_index"][position]
        sample = self.datasets[dataset_id][self.tables["dataset_sample_index"][position]]
        if padding:
            sample["loss_mask"] = torch.zeros_like(sample["loss_mask"])
        return {"dataset_id": dataset_id, **sample}

    def __getitems__(self, indices: Sequence[int | None]) -> CollatedBatch:
        """The samples at ``indices``, collated: read whole by the parts' class where it can
        (GPT datasets of one configuration), else each part reads its rows of the batch and
        the parts' class merges them in order. A padding row (None) is sample 0's, no loss."""
        if self._prefetches:
            self.prefetch_samples(announced(indices))
        positions, padding = resolve_indices(indices, self.__len__)
        dataset_index = self.tables["dataset_index"]
        batch = self._reader.read(
            positions, padding, dataset_index, self.tables["dataset_sample_index"]
        )
        return CollatedBatch({"dataset_id": torch.from_numpy(dataset_index[positions]), **batch})

    def blend_gatherer(self) -> BlendGatherer | None:
        """What reads this blend's batches whole, made by the parts' class on first use (GPT
        datasets of one configuration: every window in one array, in one native call where
        every ``.bin`` is mapped); None where the parts are read one by one and merged."""
        return self._reader.gatherer(
            self.tables["dataset_index"], self.tables["dataset_sample_index"]
        )

    def merge_batches(
        self, batches: Sequence[CollatedBatch], rows: Sequence[Sequence[int]]
    ) -> CollatedBatch:
        """One batch with row ``j`` of ``batches[i]`` at row ``rows[i][j]`` (a blend of
        blends' batch)."""
        return merge_rows(batches, rows)

    @property
    def prefetches_samples(self) -> bool:
        """Whether announcing samples pays: a part reads its corpus over a network."""
        return self._prefetches

    def prefetch_samples(self, indices: Iterable[int | None]) -> None:
        """Announce the samples read next: each part is told its own."""
        wanted = [idx for idx in indices if idx is not None]
        if not self._prefetches or not wanted:
            return
        positions = numpy.asarray(wanted, dtype=numpy.int64)
        ids = self.tables["dataset_index"][positions]
        samples = self.tables["dataset_sample_index"][positions]
        for dataset_id in dict.fromkeys(ids.tolist()):  # in order of first use
            if self._planned[dataset_id]:
                self.datasets[dataset_id].prefetch_samples(samples[ids == dataset_id].tolist())

    def mix_state(self, consumed_samples: int) -> dict[str, Any] | None:
        """Each corpus's consumed samples and order once the run consumed ``consumed_samples``,
        from ``dataset_index`` (megafmt's ``CorpusAccounting``; :mod:`megaindex.mix_resume`);
        None for an exhaustive blend, or parts that are not GPT corpora."""
        corpora = all(isinstance(d, GPTDataset) and d.dataset_path for d in self.datasets)
        if self.size is None or not corpora:
            return None
        return blend_mix_state(
            self.datasets, self.weights, self.tables["dataset_index"], consumed_samples
        )

    def sample_origin(self, idx: int) -> dict[str, Any]:
        """Which corpus sample ``idx`` comes from, its index there and its documents."""
        dataset = self.datasets[self.tables["dataset_index"][idx]]
        return sample_origin(dataset, int(self.tables["dataset_sample_index"][idx]))

    def _cache_entry(self) -> CacheEntry | None:
        directory, remote = cache_location(
            self.config.path_to_cache,
            own_field(self.config, GPTDatasetConfig, "object_storage_cache_path"),
        )
        if directory is None:
            return None
        return CacheEntry.for_dataset(
            directory,
            self.unique_description_hash,
            type(self).__name__,
            self.split.name,
            self.recipe.names,
            remote,
        )


def _where(dataset: Any) -> str:
    path = dataset.dataset_path if isinstance(dataset, MegatronDataset) else None
    return path or type(dataset).__name__


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
    if size is not None and size < 0:
        raise ConfigError(
            f"a blend of {len(datasets)} datasets cannot draw {size} samples (its split's size, "
            "or the sum of its parts' shares of it): give the split a size >= 0, or None"
        )
    if size is None and isinstance(weights[0], float) and any(w != int(w) for w in weights):
        raise ConfigError(f"without a size, weights count samples and must be whole: {weights}")

"""``BlendedMegatronDatasetBuilder``: every split of a dataset, built once on global rank 0.

Drop-in for megatron-core's builder. All ranks call ``build()``; global rank 0 builds (and
caches) each dataset first, the others wait at a barrier and then load the cache. Ranks for
which ``is_built_on_rank()`` is False get None but take part in every barrier. Unlike
megatron-core's, the barriers have a timeout (``config.barrier_timeout``): a rank that waits too
long fails naming the ranks that did not arrive and what each was doing (opening a corpus,
building or loading an index), instead of hanging. And before any rank opens a corpus or uses a
cache, the ranks compare their configs (every field that shapes the datasets, the sizes and the
dataset class; not the rank-local ones in ``RANK_LOCAL_FIELDS``): a difference raises
:class:`~megaindex.distributed.ConfigMismatchError` on every rank, naming the fields.

Forms: mock data; ``blend`` with ``split`` (one prefix, weighted prefixes, or prefixes weighted
by their sizes); ``blend_per_split`` (a blend per split, with optionally several validation
sets kept apart).

The config may be megatron-core's or Megatron-LM's own (a ``GPTFIMDatasetConfig`` of
``megatron.training``): the fields only megaindex's configs have are read with their defaults
(:func:`megaindex.config.own_field`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import os
import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy

from megafmt import get_idx_path
from megafmt.progress import Progress
from megafmt.protocols import conforms
from megafmt.readers import is_url
from megaindex import distributed, file_writes
from megaindex.blend import check_mappings_fit, check_prefixes_exist, check_tokenizers_agree
from megaindex.blended_dataset import BlendedDataset, blend_in_advance
from megaindex.collector import collector_paused
from megaindex.config import BlendedMegatronDatasetConfig, UniquelyIdentified, own_field
from megaindex.errors import CacheError, ConfigError, IndexBuildError
from megaindex.megatron_dataset import MegatronDataset
from megaindex.mix_resume import MixResumedBlend, resumed_part_sizes
from megaindex.plugins import DATASETS
from megaindex.tables import IndexSourced
from megaindex.utils import Split, normalize

logger = logging.getLogger(__name__)
#: a blend's corpora whose indices take longer than this show progress with an ETA
PROGRESS_SECONDS = 5.0

Bookends = list[tuple[float, float] | None]
#: a blend's corpus asked for fewer samples than this in each split, whose ``.idx`` is local
#: and under SMALL_CORPUS_IDX_BYTES, is built on the builder's own thread, one after another:
#: its build is Python work of a few ms, and threads building such corpora side by side spend
#: more handing the interpreter lock over than they gain (2,400 of them took 6.7 s on 2
#: threads, 4.5 s on 1; 4.7 s handed to one thread, 3.9 s on the builder's); larger corpora
#: build on the builder threads meanwhile, while this one redraws the progress
SMALL_CORPUS_SAMPLES = 1 << 16
SMALL_CORPUS_IDX_BYTES = 1 << 20
#: how often a blend's build looks for a failed write of its cache files (in the background,
#: :mod:`megaindex.file_writes`): a cache that takes no file stops the build within this time
WRITE_CHECK_SECONDS = 0.25
#: config fields that may differ between ranks: where each keeps files, how it reads and waits
RANK_LOCAL_FIELDS = frozenset(
    {
        "path_to_cache",
        "object_storage_cache_path",
        "num_dataset_builder_threads",
        "mmap_bin_files",
        "fast_cache_load",
        "defer_npy_index_mmap",
        "barrier_timeout",
    }
)


def _identity(value: Any) -> Any:
    """How a config value that JSON cannot hold is compared: by its ``unique_identifiers``
    (tokenizers), else by its type (never by its address, which differs between ranks)."""
    if isinstance(value, UniquelyIdentified):
        return value.unique_identifiers
    return type(value).__qualname__


def _get_size_per_split_per_dataset(
    normalized_weights: Sequence[float], target_size_per_split: Sequence[int], surplus: float = 0.0
) -> list[list[int]]:
    """Samples each dataset must provide to each split: ceil(ceil(size * weight) * (1 +
    surplus)), the surplus covering the blend's rounding."""
    if not numpy.isclose(sum(normalized_weights), 1.0):
        raise ConfigError(f"blend weights must be normalised, got {list(normalized_weights)}")
    return [
        [math.ceil(math.ceil(size * weight) * (1 + surplus)) for size in target_size_per_split]
        for weight in normalized_weights
    ]


def check_blend_weights(
    name: str, prefixes: Sequence[str], weights: Sequence[float] | None
) -> None:
    """Refuse, naming the field ``name``, a blend of no prefix, or weights that are not finite
    numbers above 0 (megatron-core's builder fails an assert there, after normalising them to
    NaN or a negative share; a weight of 0 only once every corpus was built, in
    BlendedDataset), before any corpus is opened."""
    if not prefixes:
        raise ConfigError(f"{name} holds no prefix: give at least one dataset prefix")
    if weights is None:
        return
    if weights and all(_is_number(weight) and weight == 0 for weight in weights):
        raise ConfigError(
            f"{name}: the weights {list(weights)} are all zero; at least one must be above 0"
        )
    for prefix, weight in zip(prefixes, weights, strict=True):
        if not (_is_number(weight) and math.isfinite(weight) and weight >= 0):
            raise ConfigError(
                f"{name}: the weight of {prefix!r} is {weight!r}; weights must be finite "
                "numbers >= 0"
            )
        if weight == 0:
            raise ConfigError(
                f"{name}: the weight of {prefix!r} is 0; a blend draws from every corpus it "
                "holds (megatron-core's BlendedDataset refuses a weight of 0): leave the "
                "corpus out of the blend instead"
            )


def _is_number(weight: object) -> bool:
    return isinstance(weight, numbers.Real) and not isinstance(weight, bool)


class BlendedMegatronDatasetBuilder:
    """Builds the train, valid and test datasets of ``config`` with ``cls``.

    ``cls`` may be a ``megaindex.datasets`` plugin's name (``"gpt"``, ``"mock"``, ...).
    ``sizes`` is the number of samples per split (None: one epoch, or every sample of a blend).
    ``is_built_on_rank`` says whether this rank holds datasets (megatron-core: TP rank 0 on the
    first or last pipeline stage).
    """

    def __init__(
        self,
        cls: type[MegatronDataset] | str,
        sizes: list[int | None],
        is_built_on_rank: Callable[[], bool],
        config: BlendedMegatronDatasetConfig,
    ) -> None:
        if isinstance(cls, str):  # a megaindex.datasets plugin, by name
            cls = DATASETS.get(cls)
        if len(sizes) != len(Split):
            raise ConfigError(
                f"sizes must hold one entry per split (train, valid, test), got {sizes}"
            )
        for split, size in zip(Split, sizes, strict=True):
            # a negative count asks nothing of a corpus (one epoch, as megatron-core builds it);
            # a blend cannot draw it (BlendedDataset refuses it there)
            if size is not None and not isinstance(size, int | numpy.integer):
                raise ConfigError(
                    f"sizes[{split.value}] (the {split.name} split's sample count) is {size!r}; "
                    "expected an integer, or None for one epoch"
                )
        self.cls = cls
        self.sizes = sizes
        self.is_built_on_rank = is_built_on_rank
        self.config = config
        logger.info("building %s splits with sizes=%s", cls.__name__, sizes)
        if not config.mock:
            for split in Split:
                blend = self._blend_of(split)
                if blend is not None and sizes[split.value] is None and blend[1] is not None:
                    raise ConfigError(
                        f"the {split.name} split has weights but no size: weighted blends need "
                        "a sample count (multiple validation sets cannot have weights)"
                    )

    def _blend_of(self, split: Split) -> tuple[list[str], list[float] | None] | None:
        """The blend that builds ``split``: ``blend`` where there is one (as the build decides),
        else the split's own."""
        if self.config.blend or self.config.blend_per_split is None:
            return self.config.blend
        return self.config.blend_per_split[split.value]

    def _mapped_files(self, blends: list[Any]) -> tuple[int, int, int]:
        """What the build over ``blends`` (each split's) maps once its datasets are read: the
        corpora it opens (each prefix listed, once for a blend of every split, once per split
        for a blend of its own), the datasets over them (one per split that is read: a share of
        the split matrix, a size other than 0) and the blends of more than one corpus."""
        read = [size != 0 for size in self.sizes]
        if not self.config.blend:
            served = [blend[0] for blend, r in zip(blends, read, strict=True) if blend and r]
            corpora = sum(len(prefixes) for prefixes in served)
            return corpora, corpora, sum(len(prefixes) > 1 for prefixes in served)
        prefixes = self.config.blend[0]
        matrix = self.config.split_matrix
        splits = sum(matrix[split.value] is not None and read[split.value] for split in Split)
        return (
            len(prefixes) if splits else 0,
            len(prefixes) * splits,
            splits if len(prefixes) > 1 else 0,
        )

    @property
    def _synchronize(self) -> bool:
        """Rank 0 first, the others after a barrier (off with fast_cache_load, as in Megatron)."""
        return not self.config.fast_cache_load

    def _opens_prefixes(self) -> bool:
        """Whether the blend's paths are ``.bin``/``.idx`` prefixes to check before building:
        only for a megaindex dataset class that declares it; any other class opens its own
        paths (megatron-core's builder leaves that to ``build_low_level_dataset``)."""
        if self.config.mock or not issubclass(self.cls, MegatronDataset):
            return False
        return self.cls.reads_indexed_corpora

    @property
    def _barrier_timeout(self) -> float | None:
        """The config's ``barrier_timeout``; its default for a megatron-core config."""
        return own_field(self.config, BlendedMegatronDatasetConfig, "barrier_timeout")

    def _builds_here(self) -> bool:
        """Whether this process builds datasets: a process on its own always does (as in
        megatron-core), a rank of a process group where ``is_built_on_rank()`` says so. A rank
        that builds none never touches the corpus files."""
        return distributed.global_rank() is None or self.is_built_on_rank()

    def _barrier(self) -> None:
        distributed.barrier(self._barrier_timeout)

    def config_description(self) -> dict[str, str]:
        """What every rank must agree on, field by field: the dataset class, the sizes and the
        config's fields except ``RANK_LOCAL_FIELDS``, each as JSON text."""
        fields: dict[str, Any] = {"class": self.cls.__name__, "sizes": self.sizes}
        for field in dataclasses.fields(self.config):
            if field.name not in RANK_LOCAL_FIELDS:
                fields[field.name] = getattr(self.config, field.name)
        return {
            name: json.dumps(value, sort_keys=True, default=_identity)
            for name, value in fields.items()
        }

    def build(self) -> list[Any]:
        """The dataset of each split: None for a split without a share of the data or a rank
        that builds none; an empty dataset (or blend) for a share that holds no tokens when no
        samples are asked of it (asked for samples, it is an
        :class:`~megaindex.errors.EmptySplitError`), as megatron-core's builder returns.
        Python's cyclic garbage collector is paused meanwhile (:mod:`megaindex.collector`)."""
        with collector_paused():
            return self._build()

    def _build(self) -> list[Any]:
        distributed.agree(self.config_description(), self._barrier_timeout)
        if self._opens_prefixes() and distributed.builds_shared_files() and self._builds_here():
            blends = [self._blend_of(split) for split in Split]
            check_prefixes_exist(blends)
            check_tokenizers_agree(blends)
            check_mappings_fit(*self._mapped_files(blends))
        datasets = self._build_blended_dataset_splits()
        for split, dataset in zip(Split, datasets, strict=True):
            if dataset is None or len(dataset) == 0:  # an empty split: nothing to check
                continue
            if isinstance(dataset, BlendedDataset) and dataset.size is not None:
                if len(dataset) != dataset.size:
                    raise IndexBuildError(
                        f"the {split.name} blend holds {len(dataset)} samples, not {dataset.size}"
                    )
            elif (
                isinstance(dataset, MegatronDataset)
                and dataset.num_samples is not None
                and len(dataset) < dataset.num_samples
            ):
                raise IndexBuildError(
                    f"the {split.name} dataset holds {len(dataset)} samples, fewer than the "
                    f"{dataset.num_samples} requested"
                )
        return datasets

    def _build_blended_dataset_splits(self) -> list[Any]:
        if self.config.mock:
            return self._build_megatron_dataset_splits(None, self.config.split_matrix, self.sizes)
        if self.config.blend:
            prefixes, weights = self.config.blend
            return self._build_blend(
                prefixes, weights, self.config.split_matrix, self.sizes, list(Split), "blend"
            )
        datasets: list[Any] = [None] * len(Split)
        for split in Split:
            blend = self.config.blend_per_split[split.value]
            if blend is None:
                continue
            prefixes, weights = blend
            only_this: Bookends = [None] * len(Split)
            only_this[split.value] = (0.0, 1.0)
            sizes: list[int | None] = [0] * len(Split)
            sizes[split.value] = self.sizes[split.value]
            if split is Split.valid and len(prefixes) > 1 and self.config.multiple_validation_sets:
                if self.config.full_validation and sizes[split.value] is not None:
                    raise ConfigError(
                        "full_validation with multiple validation sets needs no validation size"
                    )
                datasets[split.value] = [
                    self._build_megatron_dataset_splits(prefix, only_this, sizes)[split.value]
                    for prefix in prefixes
                ]
                continue
            name = f"blend_per_split[{split.name}]"
            built = self._build_blend(prefixes, weights, only_this, sizes, [split], name)
            datasets[split.value] = built[split.value]
        return datasets

    def _build_blend(
        self,
        prefixes: list[str],
        weights: list[float] | None,
        split: Bookends,
        sizes: list[int | None],
        splits: list[Split],
        name: str,
    ) -> list[Any]:
        """The datasets of ``splits`` for one blend: a mid-level dataset per prefix, and a
        BlendedDataset over them unless the blend is a single unweighted prefix. ``name`` is
        the config field the blend comes from, for the errors."""
        if len(prefixes) == 1 and (weights is None or self.config.blend_per_split is not None):
            # a split's own single corpus: its weight is not read (as in megatron-core)
            return self._build_megatron_dataset_splits(prefixes[0], split, sizes)
        check_blend_weights(name, prefixes, weights)
        mix = own_field(self.config, BlendedMegatronDatasetConfig, "resume_with_new_mix")
        if weights is not None:
            weights = normalize(weights)
        if weights is None:
            targets = None
            buffers: list[list[int | None]] = [[None] * len(Split) for _ in prefixes]
        else:
            targets = _get_size_per_split_per_dataset(weights, sizes)
            buffers = _get_size_per_split_per_dataset(
                weights, sizes, surplus=self.config.mid_level_dataset_surplus
            )
            if mix is not None and sizes[Split.train.value] is not None:
                train = Split.train.value
                needed = resumed_part_sizes(
                    prefixes,
                    weights,
                    sum(target[train] for target in targets),
                    mix,
                    self.config.mid_level_dataset_surplus,
                )
                for buffer, count in zip(buffers, needed, strict=True):
                    buffer[train] = count
        in_advance = []  # the blends' indices, drawn while their parts build (when they build)
        if weights is not None:
            in_advance = [
                (weights, sum(target[i.value] for target in targets))
                for i in splits
                if split[i.value] is not None
                and sizes[i.value] is not None
                and not (mix is not None and i is Split.train)
            ]
        forget: list[Callable[[], None]] = []

        def blend_ahead() -> None:
            forget.extend(blend_in_advance(*blend) for blend in in_advance)

        try:
            mid_level = self._build_megatron_datasets_parallel(
                prefixes, split, buffers, blend_ahead if in_advance else None
            )
            return self._blends_over(
                mid_level, prefixes, weights, targets, split, sizes, splits, mix
            )
        finally:
            for each in forget:
                each()

    def _blends_over(
        self,
        mid_level: list[list[Any]],
        prefixes: list[str],
        weights: list[float] | None,
        targets: list[list[int]] | None,
        split: Bookends,
        sizes: list[int | None],
        splits: list[Split],
        mix: Any,
    ) -> list[Any]:
        """The blend of each split of ``splits`` over its datasets ``mid_level``."""
        blended: list[Any] = [None] * len(Split)
        for index_split in splits:
            i = index_split.value
            if split[i] is None:
                continue
            if weights is not None and sizes[i] is not None:
                split_weights = weights
                size = sum(target[i] for target in targets)
            elif weights is None:
                try:
                    split_weights = [len(dataset) for dataset in mid_level[i]]
                except TypeError:  # this rank holds no datasets
                    split_weights = [0 for _ in prefixes]
                size = None if sizes[i] is None else min(sizes[i], sum(split_weights))
            else:
                raise ConfigError("client-specified weights need a client-specified size")
            if mix is not None and index_split is Split.train:
                # nothing to cache: the resumed tables are built from the state on every rank
                parts = mid_level[i]
                built = size is not None and parts[0] is not None
                blended[i] = MixResumedBlend(parts, split_weights, size, mix) if built else None
                continue
            blended[i] = self.build_generic_dataset(
                BlendedDataset,
                self.is_built_on_rank,
                self._synchronize,
                mid_level[i],
                split_weights,
                size,
                self.config,
                barrier=self._barrier,
                what=f"the {index_split.name} blend's index",
            )
        return blended

    def _build_megatron_datasets_parallel(
        self,
        prefixes: list[str],
        split: Bookends,
        sizes_per_dataset: list[list[int | None]],
        on_first_built: Callable[[], None] | None = None,
    ) -> list[list[Any]]:
        """For each split, the mid-level dataset of every prefix, built on a thread pool (rank 0
        first, then the others after a barrier). ``on_first_built`` is called once the first
        corpus built on the builder's thread had its tables built, not loaded (the blend's are
        then likely to be built too)."""

        def build_all(workers: int) -> list[list[Any]]:
            progress = Progress(
                f"indices of {len(prefixes)} corpora",
                total=len(prefixes),
                unit="corpora",
                log_interval=PROGRESS_SECONDS,
            )
            corpora = list(zip(prefixes, sizes_per_dataset, strict=True))
            here = [_python_bound(p, s, split) for p, s in corpora]
            per_prefix: list[Any] = [None] * len(corpora)
            # the cache files are written in the background, all in place before the barrier
            with (
                file_writes.background_writes() as writes,
                ThreadPoolExecutor(
                    workers, initializer=file_writes.adopt, initargs=(writes,)
                ) as pool,
            ):
                futures = {
                    pool.submit(self._build_megatron_dataset_splits, prefix, split, sizes, False): n
                    for n, (prefix, sizes) in enumerate(corpora)
                    if not here[n]
                }
                # the pool's corpora are counted as they finish, between this thread's too:
                # counted only after them, the progress and its estimate lagged behind
                finished: queue.SimpleQueue = queue.SimpleQueue()
                for future in futures:
                    future.add_done_callback(finished.put)
                counted = 0
                errors: dict[int, Exception] = {}

                def failed(n: int, error: Exception) -> None:
                    """Keep corpus ``n``'s error; the pool's corpora after the first that
                    failed, not started yet, are not built (the blend fails with its error)."""
                    errors[n] = error
                    first = min(errors)
                    for future, m in futures.items():
                        if m > first:
                            future.cancel()

                def count_finished(block: bool) -> None:
                    """Count the pool's corpora finished, keeping their errors (with ``block``:
                    all of them, the progress line redrawn when due while a long one builds)."""
                    nonlocal counted
                    while counted < len(futures):
                        try:
                            future = finished.get(
                                block=block, timeout=PROGRESS_SECONDS if block else None
                            )
                        except queue.Empty:
                            if not block:
                                return
                            progress.update(0)
                            continue
                        counted += 1
                        progress.update()
                        if not future.cancelled() and future.exception() is not None:
                            failed(futures[future], future.exception())

                first_built = on_first_built  # asked after the first corpus built here
                next_write_check = 0.0  # after the first corpus, then every WRITE_CHECK_SECONDS
                for n, (prefix, sizes) in enumerate(corpora):
                    if errors and n > min(errors):  # the blend fails with an earlier corpus's
                        break  # error: those after it need not build
                    if here[n]:
                        try:
                            per_prefix[n] = self._build_megatron_dataset_splits(
                                prefix, split, sizes, False
                            )
                        except Exception as error:  # raised below, in the blend's order
                            failed(n, error)
                            break
                        if first_built is not None and _tables_built(per_prefix[n]):
                            first_built()
                        first_built = None
                        progress.update()
                    count_finished(block=False)
                    if time.monotonic() >= next_write_check:  # a look costs 40 us in a build
                        next_write_check = time.monotonic() + WRITE_CHECK_SECONDS
                        try:  # a cache that takes no file: the corpora after need not build
                            writes.raise_failure()
                        except CacheError as error:
                            failed(n, error)
                            break
                count_finished(block=True)
                for future, n in futures.items():
                    if not future.cancelled() and future.exception() is None:
                        per_prefix[n] = future.result()
                if errors:  # the first corpus of the blend that failed, as on one thread (and
                    # before a failed write of the background's, which waits for its end)
                    raise errors[min(errors)]
            # a summary for builds long enough to have shown progress; nothing for short ones
            progress.close(None if progress.elapsed >= PROGRESS_SECONDS else "")
            return [list(per_split) for per_split in zip(*per_prefix, strict=True)]

        threads = max(1, self.config.num_dataset_builder_threads)
        return self.build_generic_dataset(
            build_all,
            lambda: True,
            self._synchronize,
            threads,
            barrier=self._barrier,
            what=f"the indices of {len(prefixes)} corpora",
        )

    def _build_megatron_dataset_splits(
        self,
        dataset_path: str | None,
        split: Bookends,
        sizes: list[int | None],
        synchronize_ranks: bool = True,
    ) -> list[Any]:
        """Each split's mid-level dataset over one low-level dataset (a corpus, or mock data)."""
        synchronize_ranks = synchronize_ranks and self._synchronize
        if not self._builds_here():
            for bookends in split:
                if bookends is not None and synchronize_ranks:
                    self._barrier()
            return [None] * len(Split)
        if synchronize_ranks:  # a blend's corpora: its builder reports for all of them
            distributed.report(f"opening the corpus {dataset_path}")
        low_level_dataset = self.cls.build_low_level_dataset(dataset_path, self.config)
        num_elements = self.cls.numel_low_level_dataset(low_level_dataset)
        datasets: list[Any] = []
        for index_split in Split:
            bookends = split[index_split.value]
            if bookends is None:
                datasets.append(None)
                continue
            indices = None
            if not self.config.fast_cache_load:
                begin = round(bookends[0] * float(num_elements))
                end = round(bookends[1] * float(num_elements))
                if end - 1 > numpy.iinfo(numpy.int32).max:
                    raise IndexBuildError(
                        f"{dataset_path} holds {num_elements} sequences; document ids are int32 "
                        "in the index tables (as in megatron-core), so at most 2**31 - 1 fit"
                    )
                # a dataset of ours makes the array when it uses it (a cache hit does not)
                indices = (
                    range(begin, end)
                    if issubclass(self.cls, MegatronDataset)
                    else numpy.arange(begin, end, dtype=numpy.int32)
                )
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
                    barrier=self._barrier,
                    what=f"the {index_split.name} index of {dataset_path}",
                )
            )
        return datasets

    @staticmethod
    def build_generic_dataset(
        cls: type | Callable[..., Any],
        is_built_on_rank: Callable[[], bool],
        synchronize_ranks: bool,
        *args: Any,
        barrier: Callable[[], None] = distributed.barrier,
        what: str = "a dataset",
    ) -> Any:
        """``cls(*args)``: first on global rank 0, then (after ``barrier``) on the other ranks
        that build datasets; None on ranks that build none. ``what`` names the work in the
        error of a rank that times out waiting for this one; it is reported (a write to the
        process group's store) only where ranks wait for it: a blend's corpora, built without a
        barrier each, are reported once for the whole blend."""
        rank = distributed.global_rank()
        if rank is None:
            return cls(*args)
        dataset = None
        if rank == 0 and is_built_on_rank():  # an unwritable cache is IndexCache.save's error
            if synchronize_ranks:
                distributed.report(f"building (or loading from the cache) {what}")
            dataset = cls(*args)
        if synchronize_ranks:
            barrier()
        if rank != 0 and is_built_on_rank():
            if synchronize_ranks:
                distributed.report(f"loading {what}")
            dataset = cls(*args)
        return dataset


def _tables_built(datasets: Sequence[Any]) -> bool:
    """Whether the tables of these datasets (a corpus's splits) were built, not loaded."""
    return any(
        conforms(dataset, IndexSourced) and dataset.index_source.kind == "built"
        for dataset in datasets
    )


def _python_bound(prefix: str | None, sizes: Sequence[int | None], split: Bookends) -> bool:
    """Whether a blend's corpus is small enough that its build is mostly Python work (see
    :data:`SMALL_CORPUS_SAMPLES`): a local corpus asked for a known, small number of samples in
    each of its splits, with a small ``.idx``."""
    if prefix is None or is_url(prefix):
        return False
    asked = [size for size, bookends in zip(sizes, split, strict=True) if bookends is not None]
    if any(size is None or size >= SMALL_CORPUS_SAMPLES for size in asked):
        return False
    try:
        return os.stat(get_idx_path(prefix)).st_size < SMALL_CORPUS_IDX_BYTES
    except OSError:  # the build reports what is wrong with it
        return False

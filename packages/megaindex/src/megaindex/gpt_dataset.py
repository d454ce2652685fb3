"""``GPTDataset``: fixed-length samples cut from a shuffled stream of documents.

Drop-in for megatron-core's ``GPTDataset``: the same constructor, the same three tables (see
:mod:`megaindex.gpt_index`), the same cache files (see :mod:`megaindex.cache`) and the same
samples (see :mod:`megaindex.sample`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy

from megafmt import IndexedDataset, corpus_fingerprint, corpus_stat, fingerprint_changes
from megafmt.readers import is_url
from megafmt.remote import default_cache_dir
from megaindex.cache import (
    CacheEntry,
    DamagedCacheError,
    IndexCache,
    TableSpec,
    cached_tables,
    load_table,
    specs_from_sidecar,
    table_specs,
)
from megaindex.config import GPTDatasetConfig
from megaindex.errors import IndexBuildError, StaleCacheError
from megaindex.gpt_index import (
    EpochPlan,
    build_gpt_index_tables,
    expected_sample_count,
    plan_epochs,
    shuffle_index_dtype,
    tokens_per_epoch,
)
from megaindex.helpers import gather_windows, sample_index_dtype
from megaindex.megatron_dataset import MegatronDataset
from megaindex.sample import CollatedSamples, SampleMaker
from megaindex.utils import Split

logger = logging.getLogger(__name__)

TABLES = ("document_index", "sample_index", "shuffle_index")


@dataclass
class IndexSource:
    """Where a dataset's tables came from, for reports: ``"cache"``, ``"built"`` (and cached),
    ``"memory"`` (built, not cached) or ``"deferred"``; with timings in seconds."""

    kind: str
    cache_entry: CacheEntry | None
    seconds: dict[str, float] = field(default_factory=dict)


@functools.cache
def can_hold(dtype: numpy.dtype, value: int) -> bool:
    """Whether integers of ``dtype`` can take ``value`` (a pad id of -1 never appears in a
    corpus of unsigned tokens)."""
    limits = numpy.iinfo(dtype)
    return limits.min <= value <= limits.max


class GPTDataset(MegatronDataset):
    """Samples of ``config.sequence_length`` tokens from the documents at ``indexed_indices``.

    ``num_samples`` is how many samples to draw (the corpus repeats as many epochs as that
    takes); None draws one epoch.
    """

    def __init__(
        self,
        indexed_dataset: Any,
        dataset_path: str | None,
        indexed_indices: numpy.ndarray,
        num_samples: int | None,
        index_split: Split,
        config: GPTDatasetConfig,
    ) -> None:
        super().__init__(
            indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config
        )
        # megatron-core's attribute, kept for code that reads it (SampleMaker decides itself)
        self.masks_and_position_ids_are_cacheable = not any(
            [config.reset_position_ids, config.reset_attention_mask, config.eod_mask_loss]
        )
        self._make_sample = SampleMaker(config, self._pad_token_id)
        self.document_index, self.sample_index, self.shuffle_index = (
            self._build_document_sample_shuffle_indices()
        )

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: IndexedDataset) -> int:
        """GPT splits a corpus by sequence."""
        return low_level_dataset.sequence_lengths.shape[0]

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: GPTDatasetConfig) -> IndexedDataset:
        """Open the corpus at ``dataset_path`` with megafmt."""
        counts = None
        if config.sequences_per_dataset:
            counts = config.sequences_per_dataset[dataset_path]
        remote_options = None
        if is_url(dataset_path) and config.object_storage_cache_path is not None:
            remote_options = {"idx_cache_dir": config.object_storage_cache_path}
        return IndexedDataset(
            dataset_path,
            multimodal=False,
            mmap=config.mmap_bin_files,
            fast_cache_load=config.fast_cache_load,
            sequences_per_dataset=counts,
            dtype_code=config.token_dtype_code,
            reader_options=remote_options,
        )

    @property
    def _drop_last_partial_sequence(self) -> bool:
        if self.index_split == Split.valid:
            return self.config.drop_last_partial_validation_sequence
        return True

    def __len__(self) -> int:
        if self.sample_index is None:  # deferred: count without mapping the tables
            # megatron-core's __len__ formula, in double precision; the table itself counts in
            # single precision (see helpers.sample_count), which can differ by one past 2**24
            # tokens when the last partial sequence is kept
            plan = self._epoch_plan()
            usable = plan.num_epochs * plan.tokens_per_epoch - int(
                self.config.add_extra_token_to_sequence
            )
            if self._drop_last_partial_sequence:
                return usable // self.config.sequence_length
            return math.ceil(float(usable) / self.config.sequence_length)
        return self.sample_index.shape[0] - 1

    def __getitem__(self, idx: int | None) -> dict[str, Any]:
        """The sample at ``idx``; None gives a padding sample whose loss mask is all zero."""
        extra = int(self.config.add_extra_token_to_sequence)
        text = numpy.empty(self.config.sequence_length + extra, dtype=numpy.int64)
        may_hold_pad = self._fill_sample(0 if idx is None else idx, text)
        return self._make_sample(text, idx is None, may_hold_pad)

    def __getitems__(self, indices: list[int | None]) -> CollatedSamples:
        """The samples at ``indices`` (DataLoader calls this): equal to
        ``[self[i] for i in indices]`` for any collate function, and in ``.collated`` already
        collated, as torch's default collation would, built in one pass."""
        extra = int(self.config.add_extra_token_to_sequence)
        texts = numpy.empty((len(indices), self.config.sequence_length + extra), numpy.int64)
        # the batch, and the one this worker reads next when the loader says (megaload)
        upcoming = getattr(indices, "upcoming", ())
        self.prefetch(0 if idx is None else idx for idx in [*indices, *upcoming])
        may_hold_pad = False
        for row, idx in enumerate(indices):
            may_hold_pad |= self._fill_sample(0 if idx is None else idx, texts[row])
        padding = [idx is None for idx in indices]
        return CollatedSamples(self._make_sample.batch(texts, padding, may_hold_pad))

    def prefetch(self, indices: Iterable[int]) -> None:
        """Announce the samples read next: over object storage their bytes are fetched now,
        concurrently (megafmt's ``IndexedDataset.prefetch``); local corpora ignore it."""
        prefetch = getattr(self.dataset, "prefetch", None)
        if prefetch is None or getattr(self.dataset.bin_reader, "prefetch", None) is None:
            return
        reads: list[tuple[int, int, int | None]] = []
        for idx in indices:
            reads.extend(zip(*self._sample_spans(idx), strict=True))
        prefetch(reads)

    def _query_document_sample_shuffle_indices(
        self, idx: int
    ) -> tuple[numpy.ndarray, numpy.ndarray]:
        """The token ids of sample ``idx`` (int64, padded to the window) and its document ids."""
        extra = int(self.config.add_extra_token_to_sequence)
        text = numpy.empty(self.config.sequence_length + extra, dtype=numpy.int64)
        documents = self._read_sample(idx, text)
        return text, numpy.array(documents, dtype=numpy.int64)

    def _sample_spans(self, idx: int) -> tuple[list[int], list[int], list[int | None]]:
        """Sample ``idx`` as spans of documents: their ids, the first token taken from each, and
        how many tokens (None: to the document's end)."""
        if self.shuffle_index is None:
            self._map_deferred_tables()
        sample = int(self.shuffle_index[idx])
        (begin, begin_offset), (end, end_offset) = self.sample_index[sample : sample + 2].tolist()
        extra = int(self.config.add_extra_token_to_sequence)
        documents = self.document_index[begin : end + 1].tolist()
        # the first document from begin_offset, the last up to end_offset (and the extra token)
        offsets = [begin_offset] + [0] * (len(documents) - 1)
        lengths: list[int | None] = [None] * (len(documents) - 1) + [end_offset + extra]
        if begin == end:
            lengths[0] = end_offset - begin_offset + extra
        return documents, offsets, lengths

    def _fill_sample(self, idx: int, out: numpy.ndarray) -> bool:
        """Fill ``out`` (int64, one window) with sample ``idx``'s tokens, padded: gathered in one
        call from the whole ``.bin`` when the corpus is mapped, else read document by document.
        Returns whether ``out`` may hold the pad id (False: it was not padded, and the corpus's
        tokens cannot take that value)."""
        if (
            type(self)._query_document_sample_shuffle_indices
            is not GPTDataset._query_document_sample_shuffle_indices
        ):  # a subclass shapes its samples there (Megatron-LM's FIM dataset does)
            out[:] = self._query_document_sample_shuffle_indices(idx)[0]
            return True
        if self.shuffle_index is None:
            self._map_deferred_tables()
        tokens = getattr(self.dataset, "tokens_view", None)
        if (
            tokens is None
            or tokens.dtype.kind not in "iu"
            or self.document_index.dtype != numpy.int32
        ):
            self._read_sample(idx, out)
            return True
        filled = gather_windows(
            tokens,
            self.dataset.sequence_pointers,
            self.dataset.sequence_lengths,
            self.document_index,
            self.sample_index,
            self.shuffle_index,
            numpy.array([idx], dtype=numpy.int64),
            int(self.config.add_extra_token_to_sequence),
            out[None, :],
        )[0]
        out[filled:] = self._pad_token_id
        return filled < len(out) or can_hold(tokens.dtype, self._pad_token_id)

    def _read_sample(self, idx: int, out: numpy.ndarray) -> list[int]:
        """Fill ``out`` (int64, one window) with sample ``idx``'s tokens, padded; returns the ids
        of the documents they come from."""
        documents, offsets, lengths = self._sample_spans(idx)
        read_spans = getattr(self.dataset, "read_spans", None)
        if read_spans is not None:
            filled = read_spans(documents, offsets, lengths, out)
        else:  # a low-level dataset with only megatron-core's get()
            filled = 0
            for document, offset, length in zip(documents, offsets, lengths, strict=True):
                part = self.dataset.get(document, offset=offset, length=length)
                out[filled : filled + len(part)] = part
                filled += len(part)
        out[filled:] = self._pad_token_id
        return documents

    def _get_num_tokens_per_epoch(self) -> int:
        return tokens_per_epoch(self.dataset.sequence_lengths, self.indices)

    def _epoch_plan(self, num_tokens_per_epoch: int | None = None) -> EpochPlan:
        if num_tokens_per_epoch is None:
            num_tokens_per_epoch = self._get_num_tokens_per_epoch()
        return plan_epochs(
            num_tokens_per_epoch,
            self.num_samples,
            self.config.sequence_length,
            self.config.add_extra_token_to_sequence,
        )

    # megatron-core's name, kept for subclasses written against it
    def _get_num_epochs(self, num_tokens_per_epoch: int) -> int:
        return self._epoch_plan(num_tokens_per_epoch).num_epochs

    # ---- the tables and their cache ----------------------------------------------------------

    def _cache_entry(self) -> CacheEntry | None:
        directory = self.config.path_to_cache
        if directory is None and not self.config.mock:
            # beside the corpus, as in megatron-core; a remote corpus keeps its tables on local
            # disk, under object_storage_cache_path (or megafmt's cache folder)
            base = self.dataset.path_prefix
            if is_url(base):
                local_root = self.config.object_storage_cache_path or default_cache_dir()
                base = os.path.join(local_root, base.replace("://", "/", 1))
            directory = os.path.join(base, "cache", f"{type(self).__name__}_indices")
        if directory is None:
            return None
        return CacheEntry.for_dataset(
            directory,
            self.unique_description_hash,
            type(self).__name__,
            self.index_split.name,
            TABLES,
        )

    def _map_deferred_tables(self) -> None:
        self.document_index, self.sample_index, self.shuffle_index = (
            load_table(self.path_to_document_index, None),
            load_table(self.path_to_sample_index, None),
            load_table(self.path_to_shuffle_index, None),
        )

    def _fingerprint(self, with_contents: bool = True) -> dict[str, Any]:
        """What the tables depend on beyond megatron-core's key: the corpus (its files' stats,
        and with ``with_contents`` a sampled hash of them) and the configuration fields
        megatron-core leaves out of the key."""
        path_prefix = getattr(self.dataset, "path_prefix", None)
        on_disk = not self.config.mock and path_prefix is not None
        return {
            "corpus": corpus_fingerprint(path_prefix) if on_disk and with_contents else None,
            "corpus_stat": corpus_stat(path_prefix) if on_disk else None,
            "config": {
                "add_extra_token_to_sequence": bool(self.config.add_extra_token_to_sequence),
                "drop_last_partial_sequence": bool(self._drop_last_partial_sequence),
            },
        }

    def _expected_specs(self) -> dict[str, TableSpec]:
        """The dtype and shape every table must have, computed from the corpus and config."""
        plan = self._epoch_plan()
        count = expected_sample_count(
            plan,
            self.config.sequence_length,
            self._drop_last_partial_sequence,
            self.config.add_extra_token_to_sequence,
        )
        lengths = self.dataset.sequence_lengths
        documents = plan.num_epochs * len(lengths if self.indices is None else self.indices)
        sample_dtype = sample_index_dtype(self.dataset.sequence_lengths, documents)
        shuffle_dtype = numpy.dtype(shuffle_index_dtype(count)).name
        return {
            "document_index": TableSpec(("int32",), (documents,)),
            "sample_index": TableSpec((numpy.dtype(sample_dtype).name,), (count + 1, 2)),
            "shuffle_index": TableSpec((shuffle_dtype,), (count,)),
        }

    def _load_cached(self, cache: IndexCache) -> dict[str, numpy.ndarray]:
        sidecar = cache.read_sidecar()
        if sidecar is None:  # built by megatron-core: check the shapes the corpus implies
            return cache.load(self._expected_specs())
        current = self._fingerprint(with_contents=False)
        unchanged = (
            sidecar.get("corpus_stat") == current["corpus_stat"]
            and sidecar.get("config") == current["config"]
        )
        # the same stats mean the same files; otherwise hash the contents (a copy is fine)
        changes = (
            []
            if unchanged
            else fingerprint_changes(_flatten(sidecar), _flatten(self._fingerprint()))
        )
        if changes:
            what = f"{cache.entry.sidecar_path}: the cache was built from other data: " + "; ".join(
                changes
            )
            if self.config.stale_cache == "error":
                raise StaleCacheError(
                    f"{what}. Delete the cache, or set stale_cache='rebuild' to rebuild it"
                )
            raise DamagedCacheError(what)
        return cache.load(specs_from_sidecar(sidecar))

    def _build_tables(self) -> dict[str, numpy.ndarray]:
        try:
            tables = build_gpt_index_tables(
                self.dataset.sequence_lengths,
                self.indices,
                self.num_samples,
                self.config.sequence_length,
                self.config.random_seed,
                self._drop_last_partial_sequence,
                self.config.add_extra_token_to_sequence,
            )
        except IndexBuildError as error:
            raise IndexBuildError(
                f"{self.dataset_path or 'mock data'} ({self.index_split.name} split): {error}"
            ) from None
        self.index_source.seconds.update(tables.seconds)
        self.epoch_plan = tables.plan
        return {
            "document_index": tables.document_index,
            "sample_index": tables.sample_index,
            "shuffle_index": tables.shuffle_index,
        }

    def _build_document_sample_shuffle_indices(
        self,
    ) -> tuple[numpy.ndarray | None, numpy.ndarray | None, numpy.ndarray | None]:
        entry = self._cache_entry()
        self.index_source = IndexSource("memory" if entry is None else "cache", entry)
        self.epoch_plan = None
        if self.config.defer_npy_index_mmap:
            self.index_source.kind = "deferred"
            self.path_to_document_index = entry.table_path("document_index")
            self.path_to_sample_index = entry.table_path("sample_index")
            self.path_to_shuffle_index = entry.table_path("shuffle_index")
            return None, None, None
        if entry is None:
            logger.warning("%s indices are not cached: path_to_cache is None", type(self).__name__)
            tables = self._build_tables()
            return tuple(tables[name] for name in TABLES)
        cache = IndexCache(entry, self.unique_description)
        if self.config.fast_cache_load:
            tables = cache.load(None, check=False)
            return tuple(tables[name] for name in TABLES)
        tables, self.index_source.kind = cached_tables(
            cache,
            lambda: self._load_cached(cache),
            self._build_tables,
            self._sidecar,
            self.index_source.seconds,
        )
        return tuple(tables[name] for name in TABLES)

    def _sidecar(self, tables: dict[str, numpy.ndarray]) -> dict[str, Any]:
        plan = {
            "num_epochs": self.epoch_plan.num_epochs,
            "separate_final_epoch": self.epoch_plan.separate_final_epoch,
            "tokens_per_epoch": self.epoch_plan.tokens_per_epoch,
        }
        return {**self._fingerprint(), "plan": plan, "tables": table_specs(tables)}


def _flatten(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """``{"corpus": {...}, "config": {...}}`` as ``{"corpus.x": ..., "config.y": ...}``."""
    return {
        f"{section}.{key}": value
        for section in ("corpus", "config")
        for key, value in (fingerprint.get(section) or {}).items()
    }

"""``GPTDataset``: fixed-length samples cut from a shuffled stream of documents.

Drop-in for megatron-core's ``GPTDataset``: the same constructor, the same three tables
(built by :class:`megaindex.gpt_index.GPTTableRecipe`, held and cached by
:class:`megaindex.tables.CachedTables` under megatron-core's names), and the same samples: each
window of tokens is read by :mod:`megaindex.windows` and turned into tensors by
:mod:`megaindex.sample`.

Beyond megatron-core's API it implements the data path's Protocols (:mod:`megafmt.protocols`):
``__getitems__`` assembles a whole batch in one pass and ``merge_batches`` merges batches of GPT
datasets (``BatchAssembly``); ``blend_gatherer`` reads a blend of GPT datasets whole
(:class:`megaindex.batch_merge.BlendGathering`, :mod:`megaindex.gpt_blend`); and
``prefetch_samples`` fetches announced samples of a corpus in object storage ahead of their use
(``PlannedPrefetch``). A subclass that rearranges a sample's tokens (fill-in-the-middle) sets
``shapes_samples`` and overrides :meth:`GPTDataset.shape_sample`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy

from megafmt import IndexedDataset, MegafmtError, read_manifest
from megafmt.confinement import confined_path, url_components
from megafmt.protocols import (
    CollatedBatch,
    PrefetchingSource,
    StoredTokenSource,
    TokenSource,
    announced,
    conforms,
)
from megafmt.readers import is_url
from megafmt.remote import default_cache_dir
from megaindex.cache import CacheEntry
from megaindex.config import EndOfDocument, GPTDatasetConfig, own_field, tokenizer_vocab_size
from megaindex.corpus_header import check_counts, check_token_dtype, expected_counts
from megaindex.errors import (
    CacheError,
    ConfigError,
    SampleReadError,
    TokenDtypeError,
    TokenRangeError,
)
from megaindex.gpt_blend import GPTBlendGatherer
from megaindex.gpt_index import EpochPlan, GPTTableRecipe, plan_epochs, tokens_per_epoch
from megaindex.megatron_args import megatron_padded_vocab_size
from megaindex.megatron_dataset import MegatronDataset, one_sample_at_a_time, resolve_indices
from megaindex.megatron_log import log_gpt_tables
from megaindex.sample import SampleMaker
from megaindex.shared_cache import cache_location
from megaindex.tables import CachedTables, TableSource
from megaindex.utils import Split
from megaindex.windows import QueriedWindowReader, Spans, window_reader


class GPTDataset(MegatronDataset):
    """Samples of ``config.sequence_length`` tokens from the documents at ``indexed_indices``.

    ``num_samples`` is how many samples to draw (the corpus repeats as many epochs as that
    takes); None draws one epoch.
    """

    reads_indexed_corpora = True
    shapes_samples: ClassVar[bool] = False
    """Set by a subclass whose :meth:`shape_sample` rearranges the tokens of each sample."""

    assembles_batches: ClassVar[bool] = True
    """False for a subclass that makes its own samples in ``__getitem__``: its batches are
    those samples, one by one."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        one_sample_at_a_time(cls)

    def __init__(
        self,
        indexed_dataset: TokenSource,
        dataset_path: str | None,
        indexed_indices: numpy.ndarray | range | None,
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
        #: turns windows of token ids into samples and batches
        self.sample_maker = SampleMaker.shared(config, self._pad_token_id)
        #: the tokens a sample's window holds: the sequence length, and the extra last label
        self.window_length = config.sequence_length + int(config.add_extra_token_to_sequence)
        self._corpus_prefix = _path_prefix(indexed_dataset)
        entry = self._cache_entry()
        self.recipe = GPTTableRecipe(
            indexed_dataset,
            indexed_indices,
            num_samples,
            config.sequence_length,
            config.random_seed,
            self._drop_last_partial_sequence,
            config.add_extra_token_to_sequence,
            None if config.mock else self._corpus_prefix,
            f"{dataset_path or 'mock data'} ({index_split.name} split)",
            None if entry is None else entry.directory,
        )
        self.tables = CachedTables(
            self.recipe,
            entry,
            self.unique_description,
            defer=config.defer_npy_index_mmap,
            fast_load=config.fast_cache_load,
            stale_cache=own_field(config, GPTDatasetConfig, "stale_cache"),
        )
        if not self.tables.deferred:
            log_gpt_tables(
                type(self).__name__,
                index_split.name,
                self.tables.source,
                self.tables.shape("sample_index")[0] - 1,
                self.recipe.plan.num_epochs if self.tables.source.kind != "cache" else None,
            )
        self._token_windows = window_reader(
            indexed_dataset,
            self.tables,
            int(config.add_extra_token_to_sequence),
            self._pad_token_id,
        )
        self.windows = self._token_windows
        if not self.shapes_samples and "_query_document_sample_shuffle_indices" in _defined_below(
            type(self), GPTDataset
        ):
            # a subclass written against megatron-core shapes its samples there (as
            # Megatron-LM's FIM dataset does): read every window through it (ours, which
            # shapes them in shape_sample, keeps that method for megatron-core's callers only)
            self.windows = QueriedWindowReader(
                self._token_windows, self._query_document_sample_shuffle_indices
            )
        self._prefetches = (
            conforms(indexed_dataset, PrefetchingSource) and indexed_dataset.prefetches
        )
        self._token_dtype = (
            numpy.dtype(indexed_dataset.index.dtype)
            if isinstance(indexed_dataset, IndexedDataset)
            else None
        )
        #: the model's vocabulary size: its padded size, else the tokenizer's (None: neither
        #: is known)
        self.embedding_rows = _embedding_rows(config)
        #: the ids each read sample must stay below (None: unchecked)
        self._vocab_limit = self._checked_limit()

    # ---- megatron-core's API -----------------------------------------------------------------

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: IndexedDataset) -> int:
        """GPT splits a corpus by sequence."""
        return low_level_dataset.sequence_lengths.shape[0]

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: GPTDatasetConfig) -> IndexedDataset:
        """Open the corpus at ``dataset_path`` with megafmt, its header read on every path:
        the counts ``sequences_per_dataset`` gives are checked against it, and the tokens are
        read in its dtype (:mod:`megaindex.corpus_header`)."""
        if dataset_path is None:  # megatron-core fails here too ("failed to build as a mock")
            raise ConfigError(
                f"{GPTDataset.__name__} reads a corpus, but this configuration is mock data: "
                "neither blend nor blend_per_split names a corpus (a blend_per_split of only "
                "None counts as none); give the data, or build MockGPTDataset ('mock')"
            )
        counts = expected_counts(config.sequences_per_dataset, dataset_path)
        remote_options = None
        if is_url(dataset_path) and config.object_storage_cache_path is not None:
            remote_options = {"idx_cache_dir": config.object_storage_cache_path}
        dataset = IndexedDataset(
            dataset_path,
            multimodal=False,
            mmap=config.mmap_bin_files,
            fast_cache_load=config.fast_cache_load,
            reader_options=remote_options,
        )
        if counts is not None:
            check_counts(dataset, dataset_path, counts)
            check_token_dtype(dataset, dataset_path, config.token_dtype_code)
        return dataset

    @property
    def document_index(self) -> numpy.ndarray | None:
        """The shuffled document ids of every epoch (None while deferred and unused)."""
        return self.tables.get("document_index")

    @property
    def sample_index(self) -> numpy.ndarray | None:
        """Where each sample starts: (position in document_index, token offset)."""
        return self.tables.get("sample_index")

    @property
    def shuffle_index(self) -> numpy.ndarray | None:
        """The order samples are served in."""
        return self.tables.get("shuffle_index")

    @property
    def index_source(self) -> TableSource:
        """Where the tables came from (cache, built, memory, deferred), with timings."""
        return self.tables.source

    @property
    def epoch_plan(self) -> EpochPlan:
        """The epochs the samples take, and whether the last is shuffled apart."""
        return self.recipe.plan

    @property
    def _drop_last_partial_sequence(self) -> bool:
        if self.index_split == Split.valid:
            return self.config.drop_last_partial_validation_sequence
        return True

    def __len__(self) -> int:
        if self.tables.deferred:  # deferred: count without mapping the tables
            return self.recipe.length()
        return self.tables.shape("sample_index")[0] - 1

    def __getitem__(self, idx: int | None) -> dict[str, Any]:
        """The sample at ``idx``; None gives a padding sample whose loss mask is all zero."""
        samples, padding = resolve_indices([idx], self.__len__)
        text = numpy.empty((1, self.window_length), dtype=numpy.int64)
        may_hold_pad = self.read_windows(samples, text)
        return self.sample_maker(text[0], padding[0], may_hold_pad)

    def __getitems__(self, indices: Sequence[int | None]) -> CollatedBatch:
        """The samples at ``indices`` (the DataLoader calls this for a batch): equal to
        ``[self[i] for i in indices]`` for any collate function, and in ``.collated`` already
        collated, as torch's default collation would, built in one pass."""
        if self._prefetches:  # the batch, and the one this worker reads next
            self.prefetch_samples(announced(indices))
        samples, padding = resolve_indices(indices, self.__len__)
        texts = numpy.empty((len(samples), self.window_length), numpy.int64)
        may_hold_pad = self.read_windows(samples, texts)
        return CollatedBatch(self.sample_maker.batch(texts, padding, may_hold_pad))

    def blend_gatherer(
        self,
        parts: Sequence[Any],
        dataset_index: numpy.ndarray,
        dataset_sample_index: numpy.ndarray,
    ) -> GPTBlendGatherer | None:
        """A reader of the whole batches of the blend of ``parts`` (its tables
        ``dataset_index`` and ``dataset_sample_index``): every window in one array, made into
        the batch in one pass. None unless every part is a GPT dataset that assembles batches
        with this one's sample configuration (the blend then merges the parts' own batches)."""
        settings = self.sample_maker.settings
        if not all(
            isinstance(part, GPTDataset)
            and part.assembles_batches
            and part.sample_maker.settings == settings
            for part in parts
        ):
            return None
        return GPTBlendGatherer(parts, dataset_index, dataset_sample_index)

    def read_windows(self, samples: list[int], out: numpy.ndarray) -> bool:
        """Fill the rows of ``out`` with the windows of ``samples``, shaped by the subclass if
        it shapes them. Returns whether a row may hold the pad id."""
        self._check_token_dtype()
        try:
            may_hold_pad = self.windows.fill(samples, out)
        except CacheError:  # the tables' own error names their file; reading again maps again
            raise
        except (IndexError, ValueError, OSError) as error:
            if isinstance(error, IndexError) and any(idx >= len(self) for idx in samples):
                raise  # a sample the dataset does not have: the caller's index, as numpy's
            raise self._read_error(samples, error) from error
        if self._vocab_limit is not None and len(samples) and out.max() >= self._vocab_limit:
            self._refuse_out_of_vocabulary(samples, out)
        if self.shapes_samples:
            for row, idx in enumerate(samples):
                out[row] = self.shape_sample(idx, out[row])
            may_hold_pad = True
        return may_hold_pad

    def _read_error(self, samples: list[int], error: Exception) -> SampleReadError:
        """``error``, raised while reading ``samples``, as an error naming the corpus, the first
        sample that fails on its own, and its documents."""
        row = numpy.empty((1, self.window_length), numpy.int64)
        failing, documents = (samples[0] if samples else None), "unknown"
        for idx in samples:
            try:
                spans = str(self.windows.spans(idx)[0])
            except (IndexError, ValueError):
                failing, documents = idx, "unknown: its tables do not say"
                break
            try:
                self.windows.fill([idx], row)
            except (IndexError, ValueError, OSError):
                failing, documents = idx, spans
                break
        corpus = _path_prefix(self.dataset) or self.dataset_path or type(self.dataset).__name__
        return SampleReadError(
            f"{corpus}: reading sample {failing} of the {self.index_split.name} split "
            f"(documents {documents}) failed: {error}"
        )

    def _checked_limit(self) -> int | None:
        """The ids samples must stay below: the model's vocabulary size, or past the EOD id
        where that lies above. None where nothing is checked: ``check_token_ids`` is off, no
        size is known, the corpus's dtype holds no id past it, or ``mega preprocess`` made the
        corpus with a vocabulary no larger."""
        rows = self.embedding_rows
        if rows is None or not own_field(self.config, GPTDatasetConfig, "check_token_ids"):
            return None
        tokenizer = self.config.tokenizer
        eod = tokenizer.eod if conforms(tokenizer, EndOfDocument) else None
        limit = max(rows, eod + 1 if eod else 0)
        dtype = self._token_dtype
        if dtype is None or dtype.kind not in "iu" or numpy.iinfo(dtype).max < limit:
            return None
        return None if _made_within(self._corpus_prefix, limit) else limit

    def _refuse_out_of_vocabulary(self, samples: list[int], out: numpy.ndarray) -> None:
        """Raise naming the corpus, the first sample of ``out`` holding an id the model's
        vocabulary does not have, that id and the vocabulary size: the embedding has no row for
        it (a device-side assert on a GPU, or silently wrong rows past a padded one)."""
        row = int(numpy.argmax(out.max(axis=1) >= self._vocab_limit))
        top = int(out[row].max())
        corpus = _path_prefix(self.dataset) or self.dataset_path
        vocab_size = tokenizer_vocab_size(self.config)
        size = f"the tokenizer's vocab_size is {vocab_size}"
        if self.embedding_rows != vocab_size:
            size = f"the model's padded vocabulary is {self.embedding_rows} ({size})"
        raise TokenRangeError(
            f"{corpus}.bin: sample {samples[row]} of the {self.index_split.name} split holds "
            f"token id {top}, but {size} (ids 0 to {self._vocab_limit - 1}, its EOD id "
            "included): the corpus was tokenized with another, larger vocabulary. If the "
            "model's vocabulary is padded past that id, give "
            "padded_vocab_size (mega index: --make-vocab-size-divisible-by and "
            "--tensor-model-parallel-size); to read every id as megatron-core does, set "
            "check_token_ids=False (mega index: --no-check-token-ids)"
        )

    def _check_token_dtype(self) -> None:
        """Refuse to read samples of a corpus of float tokens: token ids are integers, and
        megatron-core's samples fail there too (its cast to int64 raises a TypeError); the
        tables build, as there."""
        if self._token_dtype is not None and self._token_dtype.kind == "f":
            raise TokenDtypeError(
                f"{self.dataset_path}: the corpus holds {self._token_dtype.name} tokens, but "
                "samples are integer token ids; re-tokenize it with an integer dtype"
            )

    def shape_sample(self, idx: int, text: numpy.ndarray) -> numpy.ndarray:
        """Sample ``idx``'s window (int64, padded) as the dataset serves it: the identity here.
        A subclass that sets ``shapes_samples`` returns a window of the same length."""
        return text

    @property
    def prefetches_samples(self) -> bool:
        """Whether announcing samples pays: the corpus is read over a network."""
        return self._prefetches

    def prefetch_samples(self, indices: Iterable[int | None]) -> None:
        """Announce the samples read next: over object storage their bytes are fetched now,
        concurrently (megafmt's ``IndexedDataset.prefetch``); local corpora ignore it."""
        if self._prefetches:
            self.dataset.prefetch(self.windows.reads(list(indices)))

    def sample_spans(self, idx: int) -> Spans:
        """Sample ``idx`` as spans of documents: their ids, the first token taken from each,
        and how many tokens (None: to the document's end)."""
        return self.windows.spans(idx)

    def _query_document_sample_shuffle_indices(
        self, idx: int
    ) -> tuple[numpy.ndarray, numpy.ndarray]:
        """The token ids of sample ``idx`` (int64, padded to the window) and its document ids
        (megatron-core's method)."""
        self._check_token_dtype()
        text = numpy.empty((1, self.window_length), dtype=numpy.int64)
        self._token_windows.fill([idx], text)
        return text[0], numpy.array(self.sample_spans(idx)[0], dtype=numpy.int64)

    def _get_num_tokens_per_epoch(self) -> int:
        return tokens_per_epoch(self.dataset.sequence_lengths, self._indices)

    def _get_num_epochs(self, num_tokens_per_epoch: int) -> int:
        return plan_epochs(
            num_tokens_per_epoch,
            self.num_samples,
            self.config.sequence_length,
            self.config.add_extra_token_to_sequence,
        ).num_epochs

    def _cache_entry(self) -> CacheEntry | None:
        directory, remote = cache_location(
            self.config.path_to_cache, self.config.object_storage_cache_path
        )
        base = None if self.config.mock else self._corpus_prefix
        if directory is None and base is not None:
            # beside the corpus, as in megatron-core; a remote corpus keeps its tables on local
            # disk, under object_storage_cache_path (or megafmt's cache folder), at a path made
            # of the URL's host and key (no user info; a '..' in the key is refused)
            if is_url(base):
                local_root = self.config.object_storage_cache_path or default_cache_dir()
                base = confined_path(local_root, *url_components(base))
            directory = os.path.join(base, "cache", f"{type(self).__name__}_indices")
        if directory is None:
            return None
        return CacheEntry.for_dataset(
            directory,
            self.unique_description_hash,
            type(self).__name__,
            self.index_split.name,
            GPTTableRecipe.names,
            remote,
        )


def _embedding_rows(config: GPTDatasetConfig) -> int | None:
    """The model's vocabulary size: the config's ``padded_vocab_size``, else the one in
    Megatron-LM's arguments (a switched Megatron-LM's config leaves it out), else the
    tokenizer's ``vocab_size`` (None where the tokenizer states none)."""
    padded = own_field(config, GPTDatasetConfig, "padded_vocab_size")
    if padded is None:
        padded = megatron_padded_vocab_size()
    return tokenizer_vocab_size(config) if padded is None else padded


def _made_within(prefix: str | None, limit: int) -> bool:
    """Whether ``mega preprocess`` made the corpus at ``prefix`` (its manifest says so) with a
    tokenizer of at most ``limit`` ids: then no id of it reaches ``limit``, and samples need no
    check (a local corpus without a manifest, or one in object storage, is checked)."""
    if prefix is None or is_url(prefix):
        return False
    try:
        made = (read_manifest(prefix) or {}).get("tokenizer", {}).get("vocab_size")
    except MegafmtError:
        return False
    return isinstance(made, int) and made <= limit


def _path_prefix(source: TokenSource) -> str | None:
    """The corpus's path, when the source is stored as a ``.bin``/``.idx`` pair."""
    return source.path_prefix if conforms(source, StoredTokenSource) else None


def _defined_below(cls: type, base: type) -> set[str]:
    """The attribute names ``cls`` or a class between it and ``base`` defines."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is base:
            break
        names.update(vars(klass))
    return names

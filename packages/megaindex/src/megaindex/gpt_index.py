"""GPTDataset's three index tables, built exactly as megatron-core builds them.

* ``document_index`` (int32): the split's document ids repeated once per epoch and shuffled;
  when the last epoch is only partly used it is shuffled on its own and appended, so its
  documents are not spread over the whole run.
* ``sample_index`` (int32 or int64, ``[num_samples + 1, 2]``): where each sample starts in the
  stream of documents, as (position in document_index, token offset).
* ``shuffle_index`` (uint32, or int64 past 2**32 - 2 samples): the order samples are served in.

The draws come from ``numpy.random.RandomState(seed)`` in megatron-core's order: the document
index shuffles first, then the shuffle index. A small split's three tables are built in one call
of the backend (:func:`megaindex.helpers.build_gpt_tables`), a large one's step by step. The
arrays are filled in place (no 2-D grid of int64 epochs as megatron-core makes), which is what
keeps peak memory low.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy

from megafmt.mapping import map_file, release_pages
from megafmt.protocols import OpenedCorpus, OpenedRemoteCorpus, TokenSource, conforms
from megaindex.backends import backend
from megaindex.build_progress import BuildProgress
from megaindex.cache import TableSpec, dtype_name
from megaindex.errors import EmptySplitError, IndexBuildError
from megaindex.file_writes import TablesJob
from megaindex.helpers import (
    SEED_MAX,
    build_gpt_tables,
    build_sample_idx,
    sample_count,
    sample_index_dtype,
    shuffle,
    shuffle_index_dtype,
)
from megaindex.memory import table_bytes
from megaindex.tables import BuiltTables, WriterTables
from megaindex.utils import index_array

logger = logging.getLogger(__name__)

#: the last epoch is shuffled separately when it yields fewer than this share of an epoch
SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80
#: the smallest document index written to a file before the walk (below, it stays in memory)
SPILL_MIN_BYTES = 64 << 20
#: shuffle indices of fewer samples are shuffled on the calling thread, after the walk: for a
#: blend of thousands of small corpora, starting a thread costs more than the shuffle
THREADED_SHUFFLE_MIN_SAMPLES = 1 << 20
#: splits of fewer samples and document-index entries than this are built in one call of the
#: backend (a blend's small corpora); larger ones step by step, a large shuffle index on a
#: second thread, a large document index spilled to a file
ONE_CALL_BELOW = 1 << 20
#: entries of a split's indices checked at a time (a few MB: the temporaries stay in cache)
CONSECUTIVE_CHUNK = 1 << 20


_thread_random_states = threading.local()


def seeded_random_state(seed: int) -> numpy.random.RandomState:
    """This thread's ``RandomState``, seeded with ``seed``: the state ``RandomState(seed)``
    starts in, without the entropy a new one draws from the system and mixes first (90 us, a
    tenth of a small corpus's build in a blend of thousands). Valid until this thread asks
    again."""
    state = getattr(_thread_random_states, "state", None)
    if state is None:
        state = _thread_random_states.state = numpy.random.RandomState()
    state.seed(seed)
    return state


@dataclass(frozen=True)
class EpochPlan:
    """How many epochs of the split the requested samples need, and how the last is treated."""

    tokens_per_epoch: int
    num_epochs: int
    separate_final_epoch: bool
    samples_before_final_epoch: int | None
    """Samples the epochs before the last yield; set only when the last is separate."""


@dataclass
class GPTIndexTables:
    """The three tables, the plan they follow and how long each took to build."""

    document_index: numpy.ndarray
    sample_index: numpy.ndarray
    shuffle_index: numpy.ndarray
    plan: EpochPlan
    seconds: dict[str, float] = field(default_factory=dict)


def tokens_per_epoch(sequence_lengths: numpy.ndarray, indices: numpy.ndarray | range | None) -> int:
    """Tokens in one pass over the sequences at ``indices`` (None: all of them, as with
    fast_cache_load, where the builder skips computing the split)."""
    if indices is None:
        return int(sequence_lengths.sum(dtype=numpy.int64))
    if isinstance(indices, range):  # a split as the builder gives it
        return int(sequence_lengths[indices.start : indices.stop].sum(dtype=numpy.int64))
    if consecutive(indices):  # a split: sum a slice, no copy
        return int(sequence_lengths[indices[0] : indices[-1] + 1].sum(dtype=numpy.int64))
    return int(numpy.sum(sequence_lengths[indices], dtype=numpy.int64))


def consecutive(indices: numpy.ndarray) -> bool:
    """Whether ``indices`` are ``first, first + 1, ...`` (a split's, as the builder makes them):
    the ends first, then in chunks, so no temporary the size of a 142M-entry split is made."""
    if not len(indices) or int(indices[-1]) - int(indices[0]) != len(indices) - 1:
        return False
    return all(
        numpy.all(numpy.diff(indices[start : start + CONSECUTIVE_CHUNK + 1]) == 1)
        for start in range(0, len(indices), CONSECUTIVE_CHUNK)
    )


def plan_epochs(
    num_tokens: int, num_samples: int | None, sequence_length: int, add_extra_token: bool
) -> EpochPlan:
    """The epochs needed for ``num_samples`` samples (one epoch when None)."""
    extra = int(add_extra_token)
    if num_samples is None:
        return EpochPlan(num_tokens, 1, False, None)
    needed = num_samples * sequence_length + extra
    if num_tokens <= 0:
        if needed <= 0:  # nothing asked of an empty split: one empty epoch, as megatron-core
            return EpochPlan(num_tokens, 1, False, None)
        raise EmptySplitError(
            f"{num_samples} samples need {needed} tokens (sequence_length {sequence_length}, "
            f"add_extra_token_to_sequence {bool(extra)}), but the split holds none (megatron-core "
            "loops forever here); give the split a share of the corpus that holds tokens, or "
            "ask nothing of it (size None, or 0 without add_extra_token_to_sequence)"
        )
    num_epochs = max(1, -(-needed // num_tokens))
    if num_epochs == 1:
        return EpochPlan(num_tokens, 1, False, None)
    before_final = ((num_epochs - 1) * num_tokens - extra) // sequence_length
    from_final = num_samples - before_final
    per_epoch = (num_tokens - extra) // sequence_length
    if not 0 <= from_final <= per_epoch + 1:
        raise IndexBuildError(
            f"inconsistent epoch plan: {from_final} samples from the last of {num_epochs} "
            f"epochs, which yield {per_epoch} each"
        )
    separate = from_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)
    return EpochPlan(num_tokens, num_epochs, separate, before_final if separate else None)


def build_document_index(
    documents: numpy.ndarray,
    num_epochs: int,
    random_state: numpy.random.RandomState,
    separate_final_epoch: bool,
) -> numpy.ndarray:
    """``documents`` repeated ``num_epochs`` times and shuffled (the last epoch apart if asked)."""
    document_index = numpy.empty(num_epochs * len(documents), dtype=numpy.int32)
    document_index.reshape(num_epochs, len(documents))[:] = documents
    if separate_final_epoch and num_epochs > 1:
        shuffle(random_state, document_index[: (num_epochs - 1) * len(documents)])
        shuffle(random_state, document_index[(num_epochs - 1) * len(documents) :])
    else:
        shuffle(random_state, document_index)
    return document_index


def build_shuffle_index(
    num_samples: int, total_size: int, random_state: numpy.random.RandomState
) -> numpy.ndarray:
    """A permutation of ``range(total_size)`` that keeps ``[0, num_samples)`` before the rest,
    each part shuffled on its own."""
    shuffle_index = numpy.arange(total_size, dtype=shuffle_index_dtype(total_size))
    shuffle(random_state, shuffle_index[:num_samples])
    if num_samples != total_size:
        shuffle(random_state, shuffle_index[num_samples:])
    return shuffle_index


def build_gpt_index_tables(
    sequence_lengths: numpy.ndarray,
    indices: numpy.ndarray,
    num_samples: int | None,
    sequence_length: int,
    random_seed: int,
    drop_last_partial_sequence: bool,
    add_extra_token: bool,
    spill_directory: str | None = None,
    spill_min_bytes: int | None = None,
    plan: EpochPlan | None = None,
    what: str = "a GPT split",
) -> GPTIndexTables:
    """All three tables for the split made of the sequences at ``indices`` (``what``, in the
    progress line of a build that takes over
    :data:`~megaindex.build_progress.PROGRESS_SECONDS`).

    A split of fewer than :data:`ONE_CALL_BELOW` samples and document-index entries, its
    document index not spilled, is built in one call of the backend. A shuffle index of
    :data:`THREADED_SHUFFLE_MIN_SAMPLES` or more is shuffled on a second thread while the
    document index is walked.
    With ``spill_directory``, a document index of at least ``spill_min_bytes`` (None:
    :data:`SPILL_MIN_BYTES`) is written to an unnamed file there once shuffled and walked
    through a read-only mapping whose pages are released behind the walk, so that it is not
    resident while the sample index is built. ``plan``: the epochs, if already planned for
    these inputs (planning sums the split's lengths)."""
    if sequence_length < 1:
        raise IndexBuildError(f"sequence_length must be at least 1, got {sequence_length}")
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    if plan is None:
        plan = plan_epochs(
            tokens_per_epoch(sequence_lengths, indices),
            num_samples,
            sequence_length,
            add_extra_token,
        )
    total = expected_sample_count(
        plan, sequence_length, drop_last_partial_sequence, add_extra_token
    )
    first = plan.samples_before_final_epoch if plan.separate_final_epoch else total
    entries = plan.num_epochs * len(indices)
    spills = _spills(entries, spill_directory, spill_min_bytes)
    if _in_one_call(plan, total, entries, spills, random_seed):
        return _tables_in_one_call(
            sequence_lengths,
            indices,
            sequence_length,
            random_seed,
            drop_last_partial_sequence,
            add_extra_token,
            plan,
            total,
            start,
        )
    random_state = seeded_random_state(random_seed)
    with contextlib.ExitStack() as stack:
        # each entry of the document index counts twice: shuffled, then walked
        progress = stack.enter_context(
            BuildProgress(
                f"index tables of {what} ({entries:,} document-index entries shuffled, then "
                "walked)",
                2 * entries,
                "entries",
            )
        )
        document_index = build_document_index(
            indices, plan.num_epochs, random_state, plan.separate_final_epoch
        )
        progress.reach(entries)
        # its draws follow the document index's (the walk draws none); the C++ shuffle
        # releases the GIL, so a large one runs beside the walk
        shuffle_job = None
        if total >= THREADED_SHUFFLE_MIN_SAMPLES:
            pool = stack.enter_context(
                ThreadPoolExecutor(1, thread_name_prefix="megaindex-shuffle-index")
            )
            shuffle_job = pool.submit(timed_shuffle_index, first, total, random_state)
        if spills:
            document_index = spill(document_index, spill_directory)
        seconds["document_index"] = time.perf_counter() - start

        start = time.perf_counter()
        sample_index = build_sample_idx(
            sequence_lengths,  # read in place (the walk prefetches): a copy would double memory
            document_index,
            sequence_length,
            plan.num_epochs,
            plan.tokens_per_epoch,
            drop_last_partial_sequence,
            add_extra_token,
            walked=lambda position: _walked(document_index, position, progress, entries),
        )
        release_pages(sequence_lengths)  # read: a mapped corpus's pages need not stay resident
        release_pages(document_index)  # saved from the file, later: no need to keep it resident
        progress.reach(2 * entries)  # walked (the last sample may end before the last entry)
        seconds["sample_index"] = time.perf_counter() - start
        if sample_index.shape[0] - 1 != total:
            raise IndexBuildError(
                f"the sample index holds {sample_index.shape[0] - 1} samples, but the epoch plan "
                f"counts {total}"
            )
        shuffle_index, seconds["shuffle_index"] = (
            timed_shuffle_index(first, total, random_state)
            if shuffle_job is None
            else shuffle_job.result()
        )
    _log_built(total, plan, seconds)
    return GPTIndexTables(document_index, sample_index, shuffle_index, plan, seconds)


def _walked(
    document_index: numpy.ndarray, position: int, progress: BuildProgress, entries: int
) -> None:
    """The sample index's walk has read ``document_index`` up to ``position``: its pages are
    given back, and the build's progress counts them."""
    release_pages(document_index[:position])
    progress.reach(entries + position)


def _spills(entries: int, spill_directory: str | None, spill_min_bytes: int | None) -> bool:
    """Whether a document index of ``entries`` is written to a file in ``spill_directory``
    before the walk: from ``spill_min_bytes`` (None: :data:`SPILL_MIN_BYTES`)."""
    smallest = SPILL_MIN_BYTES if spill_min_bytes is None else spill_min_bytes
    return spill_directory is not None and 4 * entries >= smallest


def _in_one_call(
    plan: EpochPlan, total: int, entries: int, spills: bool, random_seed: object
) -> bool:
    """Whether a split of ``total`` samples and ``entries`` document-index entries is built in
    one call of the backend (:func:`_tables_in_one_call`, or a writer thread's
    :class:`~megaindex.file_writes.TablesJob`, the same draws): fewer than
    :data:`ONE_CALL_BELOW` of each, its document index not ``spills``, tokens to cut, a seed
    taken as it is."""
    small = max(total, entries) < ONE_CALL_BELOW and not spills
    return small and plan.tokens_per_epoch > 0 and _seed(random_seed)


def _seed(value: object) -> bool:
    """Whether ``value`` is a seed numpy's RandomState takes as it is (an integer in 0..2**32 -
    1); anything else goes to RandomState, for its own error or conversion."""
    return isinstance(value, int | numpy.integer) and 0 <= value <= SEED_MAX


def _tables_in_one_call(
    sequence_lengths: numpy.ndarray,
    indices: numpy.ndarray,
    sequence_length: int,
    random_seed: int,
    drop_last_partial_sequence: bool,
    add_extra_token: bool,
    plan: EpochPlan,
    total: int,
    start: float,
) -> GPTIndexTables:
    """The tables of a small split (its document index not spilled), in one call of the
    backend (:func:`megaindex.helpers.build_gpt_tables`): the same draws, without the Python
    steps between the tables that were most of a small corpus's build."""
    document_index, sample_index, shuffle_index = build_gpt_tables(
        sequence_lengths,
        indices,
        plan.num_epochs,
        plan.separate_final_epoch,
        random_seed,
        sequence_length,
        plan.tokens_per_epoch,
        drop_last_partial_sequence,
        add_extra_token,
        plan.samples_before_final_epoch,
    )
    release_pages(sequence_lengths)  # read: a mapped corpus's pages need not stay resident
    if sample_index.shape[0] - 1 != total:
        raise IndexBuildError(
            f"the sample index holds {sample_index.shape[0] - 1} samples, but the epoch plan "
            f"counts {total}"
        )
    seconds = {"tables": time.perf_counter() - start}
    _log_built(total, plan, seconds)
    return GPTIndexTables(document_index, sample_index, shuffle_index, plan, seconds)


def _log_built(total: int, plan: EpochPlan, seconds: dict[str, float]) -> None:
    logger.info(
        "built GPT index tables: %d samples, %d epochs (separate final epoch: %s) in %.2f s",
        total,
        plan.num_epochs,
        plan.separate_final_epoch,
        sum(seconds.values()),
    )


def timed_shuffle_index(
    num_samples: int, total_size: int, random_state: numpy.random.RandomState
) -> tuple[numpy.ndarray, float]:
    """:func:`build_shuffle_index` and the seconds it took."""
    start = time.perf_counter()
    shuffle_index = build_shuffle_index(num_samples, total_size, random_state)
    return shuffle_index, time.perf_counter() - start


def spill(array: numpy.ndarray, directory: str) -> numpy.ndarray:
    """``array`` written to an unnamed file in ``directory`` (made if missing), or else in the
    system's temporary folder, and mapped back read-only: its pages belong to the page cache,
    which the walk can release behind it (:func:`megafmt.mapping.release_pages`); the file goes
    when the last view does. Where neither can hold it (a read-only cache folder, a full disk,
    a file system without mappings), ``array`` itself: the spill saves memory, it is no
    condition of the build."""
    for folder in dict.fromkeys([directory, tempfile.gettempdir()]):
        try:
            os.makedirs(folder, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder) as stream:
                array.tofile(stream)
                stream.flush()
                where = os.path.join(folder, "(an unnamed file of the document index)")
                data = map_file(where, stream.fileno(), array.nbytes)
            return data.view(array.dtype).reshape(array.shape)
        except OSError as error:
            logger.warning(
                "the document index (%d bytes) cannot be spilled to %s (%s): trying elsewhere "
                "or keeping it in memory",
                array.nbytes,
                folder,
                error,
            )
    return array


def expected_sample_count(
    plan: EpochPlan, sequence_length: int, drop_last_partial_sequence: bool, add_extra_token: bool
) -> int:
    """The number of samples the tables of ``plan`` hold (without building them): the sample
    index's rows minus one, none for an empty split (whose sample index is one row)."""
    if plan.tokens_per_epoch == 0:
        return 0
    return sample_count(
        plan.num_epochs,
        plan.tokens_per_epoch,
        sequence_length,
        drop_last_partial_sequence,
        add_extra_token,
    )


@dataclass
class GPTTableRecipe:
    """GPTDataset's three tables for one split of a corpus: what :class:`~megaindex.tables.
    CachedTables` builds, checks and fingerprints."""

    source: TokenSource
    """The corpus (its ``sequence_lengths``)."""
    indices: numpy.ndarray | range | None
    """The split's sequences (None: all, as with fast_cache_load; a range is made an array
    only to build)."""
    num_samples: int | None
    sequence_length: int
    random_seed: int
    drop_last_partial_sequence: bool
    add_extra_token: bool
    corpus: str | None
    """The corpus's path prefix, fingerprinted in the sidecar (None for mock data)."""
    where: str
    """The corpus and split, for errors."""
    spill_directory: str | None = None
    """Where a large document index is written while the sample index is built (the cache's
    folder: the same disk the tables go to); None keeps it in memory."""

    names = ("document_index", "sample_index", "shuffle_index")

    @property
    def opened_stat(self) -> dict[str, list[int]] | None:
        """The corpus's files as the source opened them (where it says)."""
        if self.corpus is None or not conforms(self.source, OpenedCorpus):
            return None
        return self.source.opened_stat

    @property
    def opened_versions(self) -> dict[str, int | str] | None:
        """The corpus's objects as the source opened them, for one in object storage (where it
        says)."""
        if self.corpus is None or not conforms(self.source, OpenedRemoteCorpus):
            return None
        return self.source.opened_versions

    @functools.cached_property
    def plan(self) -> EpochPlan:
        """The epochs the requested samples take."""
        try:
            return plan_epochs(
                tokens_per_epoch(self.source.sequence_lengths, self.indices),
                self.num_samples,
                self.sequence_length,
                self.add_extra_token,
            )
        except IndexBuildError as error:
            raise self._located(error) from None

    def _located(self, error: IndexBuildError) -> IndexBuildError:
        """``error`` (of the same class) naming the corpus and split."""
        return type(error)(f"{self.where}: {error}")

    def build(self) -> BuiltTables:
        plan = self.plan  # located errors of its own
        try:
            tables = build_gpt_index_tables(
                self.source.sequence_lengths,
                index_array(self.indices),
                self.num_samples,
                self.sequence_length,
                self.random_seed,
                self.drop_last_partial_sequence,
                self.add_extra_token,
                self.spill_directory,
                plan=plan,
                what=self.where,
            )
        except IndexBuildError as error:
            raise self._located(error) from None
        self.plan = tables.plan
        notes = self._notes(tables.plan)
        arrays = {
            "document_index": tables.document_index,
            "sample_index": tables.sample_index,
            "shuffle_index": tables.shuffle_index,
        }
        return BuiltTables(arrays, tables.seconds, notes)

    def writer_job(self) -> WriterTables | None:
        """The tables as a job for the build's background writes, built by a writer thread
        beside this one (:class:`~megaindex.file_writes.TablesJob`), where they are small
        enough to be built in one call (as :func:`build_gpt_index_tables` builds them), of a
        split given as a range of the documents of a corpus of fewer than
        :data:`ONE_CALL_BELOW` (their lengths are copied; none below 0 in the split), by the
        C++ backend, with the last partial sequence dropped (a build refused otherwise is this
        one's, with its message); else None."""
        sizes = self.source.sequence_lengths
        if not isinstance(self.indices, range) or not self.drop_last_partial_sequence:
            return None
        if len(sizes) >= ONE_CALL_BELOW:  # the job copies them: a small split of a vast corpus
            return None
        if sizes.dtype != numpy.int32 or not sizes.flags.c_contiguous:  # what the job takes
            return None
        read = sizes[self.indices.start : self.indices.stop]
        if len(read) and read.min() < 0:  # refused by the builder's thread, with its message
            return None
        if backend() != "cpp":
            return None
        plan = self.plan
        total = expected_sample_count(
            plan, self.sequence_length, self.drop_last_partial_sequence, self.add_extra_token
        )
        entries = plan.num_epochs * len(self.indices)
        spills = _spills(entries, self.spill_directory, None)
        if not _in_one_call(plan, total, entries, spills, self.random_seed):
            return None
        specs = self.expected_specs()
        job = TablesJob(
            sizes=sizes,
            documents=index_array(self.indices),
            num_epochs=plan.num_epochs,
            separate_final_epoch=plan.separate_final_epoch,
            seed=int(self.random_seed),
            sequence_length=self.sequence_length,
            add_extra_token=int(self.add_extra_token),
            num_samples=total,
            samples_first=(
                plan.samples_before_final_epoch
                if plan.separate_final_epoch and plan.num_epochs > 1
                else total
            ),
            int64_sample_index=specs["sample_index"].dtypes[0] == "int64",
            int64_shuffle_index=specs["shuffle_index"].dtypes[0] == "int64",
            table_bytes=sum(table_bytes(specs).values()) + sizes.nbytes,
        )
        return WriterTables(job, self._notes(plan), specs)

    @staticmethod
    def _notes(plan: EpochPlan) -> dict[str, Any]:
        """What the sidecar keeps of the build: the epoch plan."""
        return {
            "plan": {
                "num_epochs": plan.num_epochs,
                "separate_final_epoch": plan.separate_final_epoch,
                "tokens_per_epoch": plan.tokens_per_epoch,
            }
        }

    def bytes_to_hold(self) -> dict[str, int]:
        return table_bytes(self.expected_specs())

    def expected_specs(self) -> dict[str, TableSpec]:
        plan = self.plan
        count = expected_sample_count(
            plan, self.sequence_length, self.drop_last_partial_sequence, self.add_extra_token
        )
        lengths = self.source.sequence_lengths
        documents = plan.num_epochs * len(lengths if self.indices is None else self.indices)
        sample_dtype = dtype_name(sample_index_dtype(lengths, documents))
        return {
            "document_index": TableSpec(("int32",), (documents,)),
            "sample_index": TableSpec((sample_dtype,), (count + 1, 2)),
            "shuffle_index": TableSpec((dtype_name(shuffle_index_dtype(count)),), (count,)),
        }

    def sizing(self) -> str:
        plan = self.plan
        documents = len(self.source.sequence_lengths if self.indices is None else self.indices)
        return (
            f"num_samples {self.num_samples} of sequence_length {self.sequence_length} tokens "
            f"over {plan.tokens_per_epoch} tokens per epoch: {plan.num_epochs} epochs of "
            f"{documents} documents"
        )

    def settings(self) -> dict[str, bool]:
        """What the tables depend on that megatron-core leaves out of the cache key."""
        return {
            "add_extra_token_to_sequence": bool(self.add_extra_token),
            "drop_last_partial_sequence": bool(self.drop_last_partial_sequence),
        }

    def length(self) -> int:
        """The number of samples, without the tables (megatron-core's formula in double
        precision; the table counts in single precision, which can differ by one past 2**24
        tokens when the last partial sequence is kept)."""
        usable = self.plan.num_epochs * self.plan.tokens_per_epoch - int(self.add_extra_token)
        if usable < 0:  # an empty split (megatron-core's formula gives -1, which len() refuses)
            return 0
        if self.drop_last_partial_sequence:
            return usable // self.sequence_length
        return math.ceil(float(usable) / self.sequence_length)

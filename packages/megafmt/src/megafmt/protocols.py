"""The data path's declared capabilities: what one package asks of another package's objects.

A fast path that crosses a package boundary is one of the Protocols below. The object that
offers it implements it; the caller dispatches with ``isinstance`` (once, where it can: a
runtime check of a Protocol costs up to a tenth of a millisecond), or with :func:`conforms`
(the same answer, remembered per class) where it checks per corpus or per read, and never
reads an undeclared attribute.
They live in megafmt because every other package depends on it: megaload, which never imports
megaindex, and megaindex agree on them here. Nothing in this module needs torch.

Token sources, the low-level datasets a mid-level dataset reads (megafmt's ``IndexedDataset``
implements all of them; megatron-core's, or a user's, may implement only the first):

``TokenSource``
    megatron-core's minimum: ``sequence_lengths`` and ``get(idx, offset, length)``.
``StoredTokenSource``
    ``path_prefix``: the ``.bin``/``.idx`` pair it reads (caches sit beside it and
    fingerprint it).
``OpenedCorpus``
    ``opened_stat``: that pair's sizes, modification times and inodes as it was opened, which
    a cache of tables cut from it records (a corpus replaced while they build is noticed).
``SpanSource``
    ``read_spans``: several spans of several sequences copied into one array in one call.
``MappedTokenSource``
    ``tokens_view`` and ``sequence_pointers``: the whole ``.bin`` as one array when it is
    mapped, so a caller gathers a sample's (or a batch's) spans in one native call.
``PrefetchingSource``
    ``prefetches`` and ``prefetch(reads)``: a source whose reads are slow to start (object
    storage) fetches announced reads ahead, concurrently.
``ConversationSource``
    ``tokenized_conversations(idx, tokenizer)``: an SFT line's conversations as ids and targets
    (megafmt's jsonl line index and pre-tokenized SFT corpus).

Datasets, the mid-level and blended datasets a loader reads (megaindex's ``GPTDataset``,
``MockGPTDataset`` and ``BlendedDataset`` implement the first two and declare their split; a
blend by delegating to its parts):

``BatchAssembly``
    ``__getitems__(indices)`` (what torch's DataLoader calls for a batch) returns a
    :class:`CollatedBatch`: the samples, and their collation built in one pass; and
    ``merge_batches(batches, rows)`` merges batches of datasets of its class into one, row by
    row: what a blend does with the rows each of its parts read.
``PlannedPrefetch``
    ``prefetches_samples`` and ``prefetch_samples(indices)``: told which samples come next, the
    dataset starts fetching their bytes. The loader hands each batch with the next one its
    worker reads as a :class:`PlannedBatch`. (Its names differ from ``PrefetchingSource``'s,
    which take reads of a token source, so that neither kind passes for the other.)
``EpochAware``
    ``set_epoch(epoch)``: the random sampler announces each new epoch.
``SplitMember`` and ``BlendSplitMember``
    the split a dataset serves, under megatron-core's two names for it (``index_split`` on its
    mid-level datasets, ``split`` on its blends); :func:`split_name` reads either.
``DescribedDataset``
    ``unique_description_hash``: the digest of what defines the dataset's samples (its cache
    description's md5, in megatron-core's and megaindex's datasets), which a loader records in
    its resume state so that a state is never restored over other data.
``CorpusAccounting``
    ``mix_state(consumed_samples)``: how many samples of each corpus (by path prefix) a run
    consumed, which the loader records so that a run can resume under a new mix
    (megaindex's blends; :mod:`megaindex.mix_resume`).
``SampleOrigins``
    ``sample_origin(idx)``: the corpus, its sample index and the documents of a sample, for a
    log of what a run read.

Tokenizers:

``TextTokenizer``
    ``tokens_to_ids``, ``text_to_ids`` and ``ids_to_text``: ids to text and back, with the
    method names of Megatron's library tokenizers (what fill-in-the-middle and decoding ask;
    megafmt's huggingface tokenizer implements it).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import Enum
from typing import Any, Generic, Protocol, runtime_checkable

import numpy

#: One read of a token source: (sequence, first token, token count or None for the rest).
Read = tuple[int, int, int | None]


@runtime_checkable
class TokenSource(Protocol):
    """Sequences of token ids, by number (megatron-core's ``IndexedDataset`` API)."""

    @property
    def sequence_lengths(self) -> numpy.ndarray:
        """The number of tokens of every sequence."""
        ...

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> Any:
        """Tokens ``offset`` to ``offset + length`` of sequence ``idx`` (to its end for None)."""
        ...


@runtime_checkable
class StoredTokenSource(TokenSource, Protocol):
    """A token source stored as a ``.bin``/``.idx`` pair, local or at a URL."""

    path_prefix: str
    """The pair's path without its suffix."""


@runtime_checkable
class OpenedCorpus(StoredTokenSource, Protocol):
    """A stored token source that recorded its files as it opened them."""

    opened_stat: dict[str, list[int]] | None
    """:func:`megafmt.fingerprint.corpus_stat` of the pair when it was opened (None: in object
    storage): tables cut from the source describe these files, whatever the path holds later."""


@runtime_checkable
class OpenedRemoteCorpus(StoredTokenSource, Protocol):
    """A stored token source in object storage that recorded the versions it opened."""

    opened_versions: dict[str, int | str] | None
    """The sizes and ETags of the pair's objects as opened, keyed as
    :func:`megafmt.fingerprint.corpus_fingerprint` keys a URL's (None: a local corpus, or a
    reader that does not say): tables cut from the source describe these versions, whatever
    the store holds later."""


@runtime_checkable
class SpanSource(TokenSource, Protocol):
    """A token source that copies many spans into one array in one call."""

    def read_spans(
        self,
        sequences: Sequence[int],
        offsets: Sequence[int],
        lengths: Sequence[int | None],
        out: numpy.ndarray,
    ) -> int:
        """Tokens ``offsets[i]`` to ``offsets[i] + lengths[i]`` of each sequence (to its end for
        None) back to back into ``out``; returns how many were written."""
        ...


@runtime_checkable
class MappedTokenSource(TokenSource, Protocol):
    """A token source whose whole token file can be one array (a memory map)."""

    @property
    def tokens_view(self) -> numpy.ndarray | None:
        """Every token of the source as one read-only array, or None when the file is not
        mapped (reads then go through ``get`` or ``read_spans``)."""
        ...

    @property
    def sequence_pointers(self) -> numpy.ndarray:
        """The byte offset of every sequence in the token file (int64)."""
        ...


@runtime_checkable
class PrefetchingSource(TokenSource, Protocol):
    """A token source that can fetch announced reads ahead of their use."""

    @property
    def prefetches(self) -> bool:
        """Whether announcing reads pays (the bytes come over a network); False makes
        ``prefetch`` a no-op that callers may skip."""
        ...

    def prefetch(self, reads: Iterable[Read]) -> None:
        """Start fetching the bytes of ``reads`` (each as ``get`` takes it), in order of use."""
        ...


@runtime_checkable
class ConversationSource(Protocol):
    """An SFT low-level dataset (one element per jsonl line) that gives a line's conversations
    already tokenized: megafmt's jsonl line index (tokenizing on demand) and its pre-tokenized
    corpus (reading them). A plain low-level dataset (Megatron's: ``messages`` per line) is
    tokenized by the dataset instead."""

    def __len__(self) -> int: ...

    def tokenized_conversations(
        self, idx: int, tokenizer: Any
    ) -> list[tuple[numpy.ndarray, numpy.ndarray]]:
        """The ids and targets (prompt positions -100) of each conversation of line ``idx``."""
        ...


class CollatedBatch(Sequence):
    """The samples of one batch, and in ``collated`` the batch as torch's default collation
    would make it, built in one pass.

    As a sequence of sample dicts it is what torch's ``__getitems__`` protocol wants, so any
    ``collate_fn`` (torch's default one, Megatron-LM's loader) takes it as it takes
    ``[dataset[i] for i in indices]``; a loader that knows the type (megaload) uses
    ``collated`` as it is. Each sample is made from its row when asked for.
    """

    def __init__(self, collated: Mapping[str, Any]) -> None:
        self.collated = collated
        first = next(iter(collated.values()), ())
        self._rows = len(first)

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, row: Any) -> Any:
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(self._rows))]
        if not -self._rows <= row < self._rows:
            raise IndexError(f"sample {row} of a batch of {self._rows}")
        return {key: value[row] for key, value in self.collated.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in range(self._rows):
            yield self[row]


class PlannedBatch(list):
    """The sample indices of one batch and, in ``upcoming``, those its worker reads next."""

    def __init__(self, indices: Iterable[Any], upcoming: Iterable[Any] = ()) -> None:
        super().__init__(indices)
        self.upcoming = list(upcoming)


def announced(indices: Sequence[Any]) -> list[Any]:
    """The indices of a batch and, when it is a :class:`PlannedBatch`, those its worker reads
    next: what a dataset that prefetches fetches before reading the batch."""
    if isinstance(indices, PlannedBatch):
        return [*indices, *indices.upcoming]
    return list(indices)


@runtime_checkable
class BatchAssembly(Protocol):
    """A dataset that assembles a whole batch in one call, and merges batches of its kind."""

    def __getitems__(self, indices: Sequence[int | None]) -> CollatedBatch:
        """The samples at ``indices`` (None: a padding sample) as a :class:`CollatedBatch`;
        a :class:`PlannedBatch` also names the samples read next."""
        ...

    def merge_batches(
        self, batches: Sequence[CollatedBatch], rows: Sequence[Sequence[int]]
    ) -> CollatedBatch:
        """One batch of ``sum(len(r) for r in rows)`` rows whose row ``rows[i][j]`` is row ``j``
        of ``batches[i]``; the batches come from ``__getitems__`` of datasets of this class and
        sample configuration (the parts of a blend)."""
        ...


@runtime_checkable
class PlannedPrefetch(Protocol):
    """A dataset that fetches the samples it is told come next."""

    @property
    def prefetches_samples(self) -> bool:
        """Whether telling it pays (some of its data is fetched over a network)."""
        ...

    def prefetch_samples(self, indices: Iterable[int | None]) -> None:
        """Start fetching the samples at ``indices`` (None: a padding sample, skipped)."""
        ...


@runtime_checkable
class EpochAware(Protocol):
    """A dataset that wants to know which epoch a sampler is in."""

    def set_epoch(self, epoch: int) -> None: ...


@runtime_checkable
class SplitMember(Protocol):
    """A dataset of one split, named as megatron-core's mid-level datasets name it."""

    index_split: Any


@runtime_checkable
class BlendSplitMember(Protocol):
    """A dataset of one split, named as megatron-core's ``BlendedDataset`` names it."""

    split: Any


@runtime_checkable
class DescribedDataset(Protocol):
    """A dataset that names its samples by a digest (megatron-core's datasets: the md5 of their
    cache description); equal digests mean the same samples in the same order."""

    unique_description_hash: str


def protocol_members(protocol: type) -> list[str]:
    """The methods and properties ``protocol`` asks for (its own and its bases'), sorted: what
    an object that claims it must have, all of them."""
    members: set[str] = set()
    for klass in protocol.__mro__:
        if klass in (Protocol, Generic, object):
            continue
        for name, value in vars(klass).items():
            if name not in _NOT_MEMBERS and (callable(value) or isinstance(value, property)):
                members.add(name)
    return sorted(members)


#: what typing puts on every Protocol class: no part of what it asks
_NOT_MEMBERS = frozenset({"__init__", "__subclasshook__", "__class_getitem__", "__init_subclass__"})


# ---- conforms: isinstance for these Protocols, remembered per class --------------------------
#
# Python (3.10, 3.11) answers ``isinstance(obj, SomeProtocol)`` by collecting the Protocol's
# members again on every call, walking its classes: 70 to 200 microseconds each. A dataset
# checks a dozen capabilities while it opens (its corpus, its ``.bin`` reader, its windows), so
# a blend of thousands of corpora spent seconds on them. ``conforms`` gives the same answer,
# working out once per (class, Protocol) which of the Protocol's members the class defines.


def conforms(obj: object, protocol: type) -> bool:
    """Whether ``obj`` implements the runtime-checkable ``protocol``: what
    ``isinstance(obj, protocol)`` says, at the cost of a dictionary lookup.

    A method or property a Protocol asks for is looked for on the object's class (as every
    implementation here defines them); a data member (an annotation of the Protocol,
    ``path_prefix: str``) may be on either, and is looked up on the object each time when its
    class does not define it. A class attribute set to None does not count (as in
    ``isinstance``: a class opts out of a method that way). Where the class lacks a method, the
    answer is the class's (``isinstance`` of its first object, remembered: only a registration
    with the Protocol's ABC can make it true) unless this object may supply the method itself,
    in its ``__dict__`` or from a ``__getattr__`` of its class: then ``isinstance`` answers.
    Answers are remembered per class as the class was when first asked: register a class with
    a Protocol, or give it a method, before its objects are asked about."""
    cls = type(obj)
    facts = _CLASS_FACTS.get(cls)
    if facts is None:
        facts = _CLASS_FACTS[cls] = _ClassFacts(_serves_members(cls))
    members = facts.protocols.get(protocol)
    if members is None:
        members = facts.protocols[protocol] = _members_of(cls, protocol)
    on_class, per_object, missing = members
    if on_class:
        return all(hasattr(obj, name) for name in per_object)
    if facts.serves_members or not missing.isdisjoint(getattr(obj, "__dict__", ())):
        return isinstance(obj, protocol)
    answer = facts.answers.get(protocol)
    if answer is None:
        answer = facts.answers[protocol] = isinstance(obj, protocol)
    return answer


class _ClassFacts:
    """What :func:`conforms` worked out about one class."""

    __slots__ = ("answers", "protocols", "serves_members")

    def __init__(self, serves_members: bool) -> None:
        #: whether its objects may have members the class does not define
        self.serves_members = serves_members
        #: Protocol -> (:func:`_members_of`'s answer for the class)
        self.protocols: dict[type, tuple[bool, tuple[str, ...], frozenset[str]]] = {}
        #: Protocol -> isinstance's answer, where the class lacks one of its methods and its
        #: objects supply none themselves
        self.answers: dict[type, bool] = {}


#: each class's facts, for as long as the class lives: a class made at run time (a test's, a
#: factory's) is not kept alive by having been asked about
_CLASS_FACTS: weakref.WeakKeyDictionary[type, _ClassFacts] = weakref.WeakKeyDictionary()


def _serves_members(cls: type) -> bool:
    """Whether ``cls`` answers attribute lookups itself (``__getattr__``, or a
    ``__getattribute__`` of its own): its objects may have members the class does not define."""
    return any(
        "__getattr__" in vars(klass) or "__getattribute__" in vars(klass)
        for klass in cls.__mro__
        if klass is not object
    )


def _members_of(cls: type, protocol: type) -> tuple[bool, tuple[str, ...], frozenset[str]]:
    """Whether ``cls`` defines each method and property ``protocol`` asks for (with a value
    other than None), the data members it leaves to its instances, and the methods it lacks."""
    methods = protocol_members(protocol)
    missing = frozenset(name for name in methods if not _defined(cls, name))
    if missing:
        return False, (), missing
    data = sorted(_data_members(protocol) - set(methods))
    return True, tuple(name for name in data if not _defined(cls, name)), missing


def _defined(cls: type, name: str) -> bool:
    """Whether a class of ``cls``'s MRO defines ``name`` as something other than None."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name] is not None
    return False


def _data_members(protocol: type) -> set[str]:
    """The names ``protocol`` (and its Protocol bases) annotate."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass not in (Protocol, Generic, object):
            names.update(vars(klass).get("__annotations__", {}))
    return names


def split_name(dataset: object) -> str | None:
    """The name of the split ``dataset`` serves (``"train"``, ``"valid"``, ``"test"``), read
    from megatron-core's ``split`` (blends) or ``index_split``; None when it declares none."""
    if isinstance(dataset, BlendSplitMember):
        split = dataset.split
    elif isinstance(dataset, SplitMember):
        split = dataset.index_split
    else:
        return None
    return split.name if isinstance(split, Enum) else split


@runtime_checkable
class TextTokenizer(Protocol):
    """A tokenizer that also maps between text and ids both ways, with the method names of
    Megatron's library tokenizers (``config.tokenizer._tokenizer`` there): what fill-in-the-middle
    (which cuts a sample's text at random characters and re-encodes the pieces) and decoding
    for display ask of it."""

    def tokens_to_ids(self, tokens: Sequence[str]) -> list[int | None]:
        """The id of each token string (None for one not in the vocabulary)."""
        ...

    def text_to_ids(self, text: str) -> list[int]:
        """The ids of ``text``."""
        ...

    def ids_to_text(self, ids: Sequence[int], remove_special_tokens: bool = True) -> str:
        """The text of ``ids``, special tokens left out if asked."""
        ...


@runtime_checkable
class CorpusAccounting(Protocol):
    """A dataset that says how many samples of each corpus a run has consumed."""

    def mix_state(self, consumed_samples: int) -> dict[str, Any] | None:
        """Where the run stands once it consumed its first ``consumed_samples`` samples, as
        plain values: ``corpora`` (per corpus prefix, ``{"consumed": samples it gave, "order":
        what defines their order}``) and ``segment`` (the blend the run is under, from which
        sample, and each corpus's count there); None where the dataset's parts are not corpora
        that can be accounted for (mock data)."""
        ...


def changed_order_setting(saved: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """The first setting in which two ``order`` records of a corpus (a
    :class:`CorpusAccounting` record's) differ, the saved one's first; None where they agree:
    the corpus then serves its samples in the same order."""
    for setting in dict.fromkeys([*saved, *now]):
        if saved.get(setting) != now.get(setting):
            return setting
    return None


@runtime_checkable
class SampleOrigins(Protocol):
    """A dataset that says where each of its samples comes from."""

    def sample_origin(self, idx: int) -> dict[str, Any]:
        """Sample ``idx``'s ``corpus`` (path prefix), its ``sample`` index in that corpus's own
        order and the ``documents`` it spans."""
        ...


__all__ = [
    "BatchAssembly",
    "BlendSplitMember",
    "CollatedBatch",
    "ConversationSource",
    "CorpusAccounting",
    "DescribedDataset",
    "EpochAware",
    "MappedTokenSource",
    "OpenedCorpus",
    "PlannedBatch",
    "PlannedPrefetch",
    "PrefetchingSource",
    "Read",
    "SampleOrigins",
    "SpanSource",
    "SplitMember",
    "StoredTokenSource",
    "TextTokenizer",
    "TokenSource",
    "announced",
    "changed_order_setting",
    "protocol_members",
    "split_name",
]

"""Turning chunks of input lines into token arrays: the work each worker process does.

The rules are those of Megatron's preprocess_data.py, document by document: each json key is
tokenized on its own; a list value is a list of sentences (a string is one sentence, or is split
by punkt with ``--split-sentences``); sentences that tokenize to nothing are dropped; with
``--append-eod`` a document that has tokens gets the EOD id at the end of its last sentence; a
document without tokens is still a document (with no sequences). What differs is the speed: a
chunk's texts go to the tokenizer in one batch and come back as flat numpy arrays; where the
block path applies (:mod:`megafmt.preprocess.blocks`) the chunk is parsed and encoded whole,
without a Python object per line.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import inspect
import itertools
import json
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import numpy

from megafmt.errors import MegafmtError
from megafmt.preprocess.blocks import BlockEncoder
from megafmt.preprocess.encoded import (
    MAX_SEQUENCE_TOKENS,
    EncodedChunk,
    EncodedKey,
    sequence_lengths,
    too_long,
)
from megafmt.preprocess.inputs import Chunk
from megafmt.preprocess.sentences import load_splitter
from megafmt.tokenizers import Tokenizer, TokenizerOptions, load_tokenizer
from megafmt.tokenizers.base import ArrayTokenizer


class BadLine(MegafmtError, ValueError):
    """A line that cannot become a document; the message says why."""


@dataclass(frozen=True)
class EncodeSettings:
    """What a worker needs to encode: built into each worker, never pickled as objects."""

    tokenizer_type: str
    tokenizer_options: TokenizerOptions
    json_keys: tuple[str, ...]
    append_eod: bool
    dtype: str
    split_sentences: bool = False
    keep_newlines: bool = False
    lang: str = "english"
    threads_per_worker: int = 1
    """Threads a tokenizer library may use inside one worker (cores / workers): the worker
    processes already keep the cores busy, and more threads would only contend."""


def _with_parallel(encode: Callable[..., Any], parallel: bool | None) -> Callable[..., Any]:
    """``encode`` (a tokenizer's ``encode_batch_arrays``) told ``parallel`` where it takes it:
    a plugin written before the argument was added is called as before."""
    if parallel is None:
        return encode
    try:
        parameters = inspect.signature(encode).parameters
    except (TypeError, ValueError):  # no signature to read: call it as before
        return encode
    takes = "parallel" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
    return functools.partial(encode, parallel=parallel) if takes else encode


class Encoder:
    """Encodes chunks with one tokenizer (and splitter), built once per process (or once in a
    run's main process, for the workers it forks: :func:`prebuilt_for_fork`)."""

    def __init__(
        self,
        settings: EncodeSettings,
        tokenizer: Tokenizer | None = None,
        parallel: bool | None = None,
    ) -> None:
        """``tokenizer``: the run's own, already loaded and checked (else loaded from
        ``settings``); ``parallel``: whether gigatoken may use its thread pool (None: it
        decides; False in a run's main process, which encodes for its one worker on one core,
        on the block path and for the chunks that path refuses alike)."""
        self.settings = settings
        self.tokenizer = (
            load_tokenizer(settings.tokenizer_type, settings.tokenizer_options)
            if tokenizer is None
            else tokenizer
        )
        self._encode_batch: Callable[[list[str]], Sequence[Sequence[int]]] = (
            _with_parallel(self.tokenizer.encode_batch_arrays, parallel)
            if isinstance(self.tokenizer, ArrayTokenizer)
            else self.tokenizer.encode_batch
        )
        self.dtype = numpy.dtype(settings.dtype)
        self._limits = (int(numpy.iinfo(self.dtype).min), int(numpy.iinfo(self.dtype).max))
        self._split = (
            load_splitter(settings.lang, settings.keep_newlines)
            if settings.split_sentences
            else None
        )
        self._blocks = BlockEncoder.for_tokenizer(
            self.tokenizer,
            settings.split_sentences,
            settings.json_keys,
            self.tokenizer.eod if settings.append_eod else None,
            parallel,
        )

    @property
    def encodes_blocks(self) -> bool:
        """Whether this encoder parses and encodes whole chunks (the block path)."""
        return self._blocks is not None

    def _sentences(self, raw: object) -> dict[str, list[str]]:
        if isinstance(raw, bytes):
            try:
                raw = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise BadLine(f"invalid UTF-8 at byte {error.start}") from None
            except ValueError as error:
                raise BadLine(f"not JSON ({error})") from None
            except RecursionError:
                raise BadLine("JSON nested deeper than Python's json reads") from None
        if not isinstance(raw, dict):
            raise BadLine(f"expected a JSON object, found {type(raw).__name__}")
        sentences = {}
        for key in self.settings.json_keys:
            if key not in raw:
                raise BadLine(f"missing key {key!r}")
            value = raw[key]
            if isinstance(value, str):
                sentences[key] = self._split(value) if self._split else [value]
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                sentences[key] = value
            else:
                raise BadLine(
                    f"key {key!r} holds {type(value).__name__}, expected a string "
                    "(or a list of strings)"
                )
        return sentences

    def _tokenize(
        self, documents: list[dict[str, list[str]]]
    ) -> dict[str, list[list[Sequence[int]]]]:
        """For each key, each document's sentences as ids, in one tokenizer call per key."""
        result = {}
        for key in self.settings.json_keys:
            flat = self._encode_batch([s for d in documents for s in d[key]])
            bounds = itertools.accumulate((len(d[key]) for d in documents), initial=0)
            result[key] = [flat[a:b] for a, b in itertools.pairwise(bounds)]
        return result

    def _out_of_range(self, ids: list[Sequence[int]]) -> str | None:
        """Why a document's sentences (``ids``) cannot be written: an id the dtype does not
        hold, or a sentence longer than a sequence may be (its EOD counted); None: they can."""
        low, high = self._limits
        last = max((n for n, sentence in enumerate(ids) if len(sentence)), default=None)
        eod = int(self.settings.append_eod)
        for number, sentence in enumerate(ids):
            if len(sentence) and (min(sentence) < low or max(sentence) > high):
                bad = next(i for i in sentence if not low <= i <= high)
                return f"token id {bad} does not fit the output dtype {self.dtype.name}"
            tokens = len(sentence) + (eod if number == last else 0)
            if tokens > MAX_SEQUENCE_TOKENS:
                return too_long("a sentence", tokens)
        return None

    def encode(self, chunk: Chunk) -> EncodedChunk:
        """The documents of ``chunk``, and the lines that are not documents and why."""
        keys = None
        if self._blocks is not None:
            with contextlib.suppress(OverflowError):  # too long a text: the lines say which
                keys = self._blocks.encode(chunk)
        if keys is not None and all(self._fits(encoded.tokens) for encoded in keys.values()):
            for encoded in keys.values():
                encoded.tokens = encoded.tokens.astype(self.dtype)
            every_line = numpy.arange(chunk.count, dtype=numpy.int64)
            return EncodedChunk(chunk.file, chunk.start, every_line, keys, [], chunk.nbytes)
        bad: list[tuple[int, str]] = []
        offsets: list[int] = []
        documents: list[dict[str, list[str]]] = []
        for offset, raw in enumerate(chunk.lines):
            try:
                documents.append(self._sentences(raw))
                offsets.append(offset)
            except BadLine as error:
                bad.append((chunk.first_line + offset, str(error)))
        try:
            ids = self._tokenize(documents)
        except REFUSALS:  # some text the tokenizer refuses: find which, one document at a time
            kept = []  # (offset, the document's ids per key)
            for offset, document in zip(offsets, documents, strict=True):
                try:
                    kept.append((offset, self._tokenize([document])))
                except REFUSALS as error:
                    why = _refusal(document, error)
                    if why is None:  # a TypeError, and no text the tokenizer could refuse
                        raise
                    bad.append((chunk.first_line + offset, why))
            offsets = [offset for offset, _ in kept]
            ids = {key: [alone[key][0] for _, alone in kept] for key in self.settings.json_keys}
        try:
            keys = {key: self._assemble(ids[key]) for key in self.settings.json_keys}
            fit = all(self._fits(encoded.tokens) for encoded in keys.values())
        except OverflowError:  # an id beyond 64 bits, a sentence longer than a sequence holds
            fit = False
        if not fit:
            wrong = {}  # the documents holding an id the dtype cannot, and the first such id
            for key in self.settings.json_keys:
                for position, document_ids in enumerate(ids[key]):
                    reason = self._out_of_range(document_ids) if position not in wrong else None
                    if reason:
                        wrong[position] = reason
            bad += [(chunk.first_line + offsets[p], reason) for p, reason in wrong.items()]
            offsets = [o for p, o in enumerate(offsets) if p not in wrong]
            ids = {k: [d for p, d in enumerate(v) if p not in wrong] for k, v in ids.items()}
            keys = {key: self._assemble(ids[key]) for key in self.settings.json_keys}
        bad.sort()
        for encoded in keys.values():
            encoded.tokens = encoded.tokens.astype(self.dtype)
        return EncodedChunk(
            chunk.file, chunk.start, numpy.array(offsets, numpy.int64), keys, bad, chunk.nbytes
        )

    def _fits(self, tokens: numpy.ndarray) -> bool:
        """Whether every id of ``tokens`` fits the output dtype."""
        low, high = self._limits
        return tokens.size == 0 or (int(tokens.min()) >= low and int(tokens.max()) <= high)

    def _assemble(self, documents: list[list[Sequence[int]]]) -> EncodedKey:
        eod = self.tokenizer.eod if self.settings.append_eod else None
        pieces: list[Sequence[int]] = []
        lengths: list[int] = []
        per_document: list[int] = []
        for sentences in documents:
            before = len(lengths)
            for sentence in sentences:
                if len(sentence):
                    pieces.append(sentence)
                    lengths.append(len(sentence))
            if eod is not None and len(lengths) > before:
                pieces.append([eod])
                lengths[-1] += 1
            per_document.append(len(lengths) - before)
        tokens = (
            numpy.concatenate([_as_int64(piece) for piece in pieces])
            if pieces
            else numpy.empty(0, dtype=numpy.int64)
        )
        return EncodedKey(
            tokens,
            sequence_lengths(lengths),
            numpy.array(per_document, dtype=numpy.int64),
        )


#: What a tokenizer raises for a text it cannot take: ValueError (some text it refuses), or
#: TypeError (the tokenizers library, for a text that is not UTF-8)
REFUSALS = (ValueError, TypeError)


def _refusal(document: dict[str, list[str]], error: Exception) -> str | None:
    """Why the tokenizer refused ``document``: the first lone surrogate it holds (the
    libraries' own messages do not say), else the library's message for a ValueError, else
    None (a TypeError without one is a fault, not a bad line)."""
    for key, sentences in document.items():
        for sentence in sentences:
            try:
                sentence.encode("utf-8")
            except UnicodeEncodeError as bad:
                character = ord(sentence[bad.start])
                return (
                    f"key {key!r} holds a lone surrogate U+{character:04X} at character "
                    f"{bad.start}, which is not UTF-8"
                )
    return str(error) if isinstance(error, ValueError) else None


def _as_int64(ids: Sequence[int]) -> numpy.ndarray:
    """``ids`` as int64; OverflowError for an id beyond it (not a silent wrap)."""
    if not isinstance(ids, numpy.ndarray):
        return numpy.asarray(ids, dtype=numpy.int64)  # OverflowError by itself
    if ids.dtype.kind == "u" and ids.size and int(ids.max()) > numpy.iinfo(numpy.int64).max:
        raise OverflowError(f"token id {int(ids.max())} is beyond 64 bits")
    return ids.astype(numpy.int64, copy=False)


_ENCODER: Encoder | None = None
#: the encoder a run built in its main process just before its pool forks: each forked worker
#: takes it as it is (the tokenizer loaded, gigatoken's encoder built, awkward and pyarrow
#: imported) instead of building its own; a forkserver or spawn worker cannot see it
_PREBUILT: Encoder | None = None
PR_SET_PDEATHSIG = 1
#: what a fork server imports once, for every worker it then forks: the modules a worker needs
#: (their imports start only threads that handle fork: numpy's BLAS pool, pyarrow's allocator
#: thread; a module missing here is skipped by multiprocessing without a word)
FORKSERVER_PRELOAD = ["megafmt.preprocess.encoding", "awkward", "pyarrow.json", "gigatoken"]


@contextlib.contextmanager
def prebuilt_for_fork(encoder: Encoder) -> Iterator[None]:
    """Offer ``encoder`` to the workers forked inside this block (:func:`start_worker` takes it
    where its settings are theirs); withdrawn at the end, so a later pool builds its own."""
    global _PREBUILT
    _PREBUILT = encoder
    try:
        yield
    finally:
        _PREBUILT = None


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when the parent dies, even by SIGKILL: a worker blocked on
    the task queue would otherwise wait forever."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pool's own checks have to do
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def start_worker(settings: EncodeSettings) -> None:
    """The worker initializer: take the encoder the parent built before forking, else build
    the tokenizer once; interrupts are the parent's to handle."""
    global _ENCODER
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads = str(settings.threads_per_worker)
    os.environ["RAYON_NUM_THREADS"] = threads  # tokenizers' batch encoding (Rust)
    os.environ["OMP_NUM_THREADS"] = threads
    inherited = _PREBUILT is not None and _PREBUILT.settings == settings
    _ENCODER = _PREBUILT if inherited else Encoder(settings)


def encode_in_worker(chunk: Chunk) -> EncodedChunk:
    """Encode ``chunk`` with this worker's encoder."""
    if _ENCODER is None:
        raise RuntimeError("encode_in_worker called in a process where start_worker did not run")
    return _ENCODER.encode(chunk)


class InProcessEncoder(Executor):
    """The pool's interface, run in the calling process: ``submit(encode_in_worker, chunk)``
    encodes at once with ``encoder`` and returns the finished future."""

    def __init__(self, encoder: Encoder) -> None:
        self._encoder = encoder

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if fn is not encode_in_worker:
            raise TypeError(f"InProcessEncoder runs encode_in_worker only, not {fn!r}")
        future: Future = Future()
        future.set_result(self._encoder.encode(*args, **kwargs))
        return future

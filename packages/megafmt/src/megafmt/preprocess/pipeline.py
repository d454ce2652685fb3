"""``preprocess``: tokenize an input corpus into Megatron ``.bin``/``.idx`` pairs.

The main process reads the input in chunks of whole lines and keeps a bounded number of them in
flight on a pool of worker processes, which tokenize a chunk per call; results come back in
input order and are appended with bulk writes. The worker count changes only the speed, never
the bytes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import multiprocessing
import os
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Protocol, TextIO

import numpy

from megafmt.dtypes import DType
from megafmt.errors import BadInputError, PluginError
from megafmt.format import get_bin_path
from megafmt.limits import FULL
from megafmt.manifest import write_manifest
from megafmt.preprocess.encoding import (
    FORKSERVER_PRELOAD,
    EncodedChunk,
    Encoder,
    EncodeSettings,
    InProcessEncoder,
    encode_in_worker,
    prebuilt_for_fork,
    start_worker,
)
from megafmt.preprocess.inputs import InputFile, expand_input, read_chunks, record_word
from megafmt.preprocess.pool import PoolWatch, adopt_run_threads, worker_context
from megafmt.preprocess.sentences import load_splitter
from megafmt.preprocess.writer import PartitionedOutput
from megafmt.progress import Progress, format_count
from megafmt.tokenizers import (
    Tokenizer,
    TokenizerOptions,
    checked_backend,
    load_tokenizer,
    plugin_name,
)

#: bad lines named in the summary (all are counted)
SHOWN_BAD_LINES = 5
#: errno values of a failed write that names no file: a full disk or quota, the file-size limit
WRITE_LIMITS = FULL | {errno.EFBIG}
#: seconds a terminated worker is given to exit
WORKER_EXIT_SECONDS = 10.0

#: where --append-eod looks for the end-of-document token, per tokenizer plugin that may lack one
EOD_SOURCES = {
    "huggingface": "the eos_token (else sep_token) that tokenizer_config.json or "
    "special_tokens_map.json beside the tokenizer.json names; a bare tokenizer.json names none: "
    'add a tokenizer_config.json with "eos_token" to its folder',
    "sentencepiece": "the model's eos piece (none in this model, or none read with "
    "--tokenizer-sentencepiece-legacy)",
}


@dataclass
class PreprocessConfig:
    """The settings of one run, with the meanings of Megatron's preprocess_data.py flags."""

    input: str
    output_prefix: str
    tokenizer_type: str = "bytes"
    tokenizer_options: TokenizerOptions = field(default_factory=TokenizerOptions)
    json_keys: tuple[str, ...] = ("text",)
    append_eod: bool = False
    workers: int = 1
    partitions: int = 1
    keep_sequential_samples: bool = False
    split_sentences: bool = False
    keep_newlines: bool = False
    lang: str = "english"
    skip_bad_lines: bool = False
    log_interval: int = 1000
    """Documents between progress lines (off a terminal)."""
    chunk_bytes: int = 1 << 20
    """About this much input goes to a worker per call."""
    start_method: str | None = None
    """How the worker processes start (``fork``, ``forkserver``, ``spawn``); None: ``fork``
    while the process has started no thread since megafmt was imported, else ``forkserver``
    (:mod:`megafmt.preprocess.pool` says why)."""
    trial_documents: int | None = None
    """A timing trial (``--find-optimal-num-workers``): stop reading input once this many
    documents are written (whole chunks: the last may take it somewhat past)."""


@dataclass
class PreprocessSummary:
    outputs: dict[str, str]
    """json key -> the output prefix of its pair."""
    documents: int = 0
    tokens: int = 0
    input_bytes: int = 0
    elapsed: float = 0.0
    skipped_lines: int = 0
    first_skipped: list[str] = field(default_factory=list)
    key_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """json key -> its ``sequences`` and ``tokens`` (documents are the same for every key)."""

    def describe(self) -> str:
        rate = self.tokens / self.elapsed if self.elapsed else 0.0
        lines = [
            f"preprocessed {self.documents:,} documents, {self.tokens:,} tokens from "
            f"{self.input_bytes / 1e6:,.1f} MB in {self.elapsed:.1f} s "
            f"({format_count(rate)} tokens/s)",
            *(f"  {key}: {prefix}.bin / .idx" for key, prefix in self.outputs.items()),
        ]
        if self.skipped_lines:
            lines.append(
                f"skipped {self.skipped_lines:,} bad lines, first: " + "; ".join(self.first_skipped)
            )
        return "\n".join(lines)


class ProgressSink(Protocol):
    """What the pipeline reports its progress to: a ``Progress`` line, or what a Ray task
    posts its shard's totals through."""

    def update(self, amount: float = 1, **also: float) -> None: ...

    def close(self, summary: str | None = None) -> None: ...


def check_config(config: PreprocessConfig) -> None:
    """Refuse settings no run can use, before anything is read."""
    if config.workers < 1 or config.partitions < 1:
        raise ValueError(
            f"--workers and --partitions must be at least 1, found {config.workers} and "
            f"{config.partitions}"
        )
    if not config.json_keys or len(set(config.json_keys)) != len(config.json_keys):
        raise ValueError(f"--json-keys must name distinct keys, found {list(config.json_keys)}")
    if config.log_interval < 1:
        raise ValueError(f"--log-interval must be at least 1, found {config.log_interval}")
    methods = multiprocessing.get_all_start_methods()
    if config.start_method is not None and config.start_method not in methods:
        raise ValueError(
            f"start_method must be one of {', '.join(methods)} here, found {config.start_method!r}"
        )


def _manifest(config: PreprocessConfig, tokenizer, dtype, key: str, counts: dict, inputs) -> dict:
    return {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "megafmt": version("megafmt"),
        "tokenizer": {
            "type": plugin_name(config.tokenizer_type),
            "fingerprint": tokenizer.fingerprint,
            "eod": tokenizer.eod,
            "vocab_size": tokenizer.vocab_size,
        },
        "dtype": numpy.dtype(dtype).name,
        "json_key": key,
        **counts,
        "inputs": [{"path": f.path, "size": f.size} for f in inputs],
        "flags": {
            "tokenizer_type": config.tokenizer_type,
            "tokenizer_options": asdict(config.tokenizer_options),
            "json_keys": list(config.json_keys),
            "append_eod": config.append_eod,
            "split_sentences": config.split_sentences,
            "keep_newlines": config.keep_newlines,
            "partitions": config.partitions,
            "keep_sequential_samples": config.keep_sequential_samples,
            "skip_bad_lines": config.skip_bad_lines,
        },
    }


def _stop_pool(pool: Executor, children: set[multiprocessing.process.BaseProcess]) -> None:
    """Stop the pool after an error, so that the error raised is the run's own: pending chunks
    are cancelled and the running ones waited for (a pool dropped without waiting races its
    queue threads, which then fail on closed pipes: "Bad file descriptor" tracebacks under
    load), and workers beyond ``children`` that the pool never handed to its manager (a launch
    cut short by the open-files limit) are terminated, or the interpreter would wait for them
    at exit."""
    with contextlib.suppress(Exception):  # a pool that failed to start may fail to stop
        pool.shutdown(wait=True, cancel_futures=True)
    for child in set(multiprocessing.active_children()) - children:
        child.terminate()
        child.join(timeout=WORKER_EXIT_SECONDS)


def load_checked_tokenizer(config: PreprocessConfig) -> Tokenizer:
    """The run's tokenizer, after the checks that fail before any input is tokenized."""
    tokenizer = load_tokenizer(config.tokenizer_type, config.tokenizer_options)
    if config.append_eod and tokenizer.eod is None:
        source = EOD_SOURCES.get(plugin_name(config.tokenizer_type))
        raise PluginError(
            f"--append-eod: the {config.tokenizer_type} tokenizer "
            f"({config.tokenizer_options.model}) has no end-of-document token"
            + (f"; it is looked for as {source}" if source else "")
        )
    dtype = numpy.dtype(DType.optimal_dtype(tokenizer.vocab_size))
    limits = numpy.iinfo(dtype)
    if config.append_eod and not limits.min <= tokenizer.eod <= limits.max:
        raise PluginError(
            f"--append-eod: the {config.tokenizer_type} tokenizer's end-of-document id "
            f"{tokenizer.eod} does not fit {dtype.name}, the dtype of its vocabulary size "
            f"{tokenizer.vocab_size}"
        )
    if config.split_sentences:
        load_splitter(config.lang, config.keep_newlines)  # fail here, not in every worker
    checked_backend(tokenizer)  # here once, before the workers fork: not in every worker
    return tokenizer


def output_level(config: PreprocessConfig) -> str:
    """The last part of each output's name: ``sentence`` with ``--split-sentences``, else
    ``document``."""
    return "sentence" if config.split_sentences else "document"


def new_progress(config: PreprocessConfig, stream: TextIO | None = None) -> Progress:
    """The progress line of a run: documents, with MB and tokens beside them."""
    return Progress(
        f"preprocess {config.output_prefix}",
        unit="docs",
        stream=stream,
        also=("MB", "tokens"),
        every=config.log_interval,
    )


def _encoding_pool(
    config: PreprocessConfig, settings: EncodeSettings, tokenizer: Tokenizer, in_process: bool
) -> tuple[Executor, contextlib.AbstractContextManager]:
    """Where a run's chunks are encoded, and the block to submit them in. The encoder is built
    here, from the run's own ``tokenizer``, wherever that saves work: for this process to
    encode (``in_process``, or one worker on the block path: no fork, no chunk or ids pickled,
    no worker's start), or for forked workers to inherit (:func:`prebuilt_for_fork`). Workers
    from a fork server or spawn build their own (the fork server preloads their imports)."""
    context = (
        multiprocessing.get_context(config.start_method)
        if config.start_method
        else worker_context()
    )
    alone = config.workers == 1 and not in_process
    forks = context.get_start_method() == "fork"
    encoder = (
        Encoder(settings, tokenizer, parallel=False if alone else None)
        if in_process or alone or forks
        else None
    )
    if encoder is not None and (in_process or (alone and encoder.encodes_blocks)):
        return InProcessEncoder(encoder), contextlib.nullcontext()
    if isinstance(context, multiprocessing.context.ForkServerContext):
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
    pool = ProcessPoolExecutor(
        config.workers, mp_context=context, initializer=start_worker, initargs=(settings,)
    )
    if encoder is not None and forks:
        return pool, prebuilt_for_fork(encoder)  # the workers take it as it is
    return pool, contextlib.nullcontext()


def tokenize_into(
    config: PreprocessConfig,
    inputs: list[InputFile],
    tokenizer: Tokenizer,
    progress: ProgressSink,
    in_process: bool = False,
) -> PreprocessSummary:
    """Tokenize ``inputs`` into one pair per json key at ``config.output_prefix`` (no
    manifest); the worker pool, the order and the bytes of every run, local or one shard's.
    ``in_process`` encodes here instead of on a pool: for a caller that is itself one worker of
    many (a Ray task on one CPU), where a pool would add a process and nothing else; a run of
    one worker on the block path encodes here too.

    Raises ``BadInputError`` naming the file and line of the first bad line unless
    ``skip_bad_lines``; on any error or interrupt nothing is left at the output names.
    """
    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    level = output_level(config)
    settings = EncodeSettings(
        config.tokenizer_type,
        config.tokenizer_options,
        tuple(config.json_keys),
        config.append_eod,
        numpy.dtype(dtype).name,
        config.split_sentences,
        config.keep_newlines,
        config.lang,
        threads_per_worker=max(1, (os.cpu_count() or 1) // config.workers),
    )
    # contiguous blocks merge back into input order: one partition writes the same bytes
    partitions = 1 if config.keep_sequential_samples else config.partitions
    output = PartitionedOutput(
        config.output_prefix, settings.json_keys, level, numpy.dtype(dtype), partitions
    )
    summary = PreprocessSummary(dict(output.prefixes))
    # every key has one document per good line (summary.documents); these differ per key
    summary.key_counts = {key: {"sequences": 0, "tokens": 0} for key in settings.json_keys}
    start = time.perf_counter()
    watch = PoolWatch()  # the caller's children now; the pool's workers as they start
    pool, offered = _encoding_pool(config, settings, tokenizer, in_process)
    # each chunk in flight, with where it starts (what a dead worker's error names)
    window: collections.deque[tuple[Future[EncodedChunk], str]] = collections.deque()
    try:
        chunks = read_chunks(inputs, config.chunk_bytes, settings.json_keys)

        def take(result: EncodedChunk) -> None:
            if result.bad_lines:
                if not config.skip_bad_lines:
                    line, why = result.bad_lines[0]
                    raise BadInputError(f"{result.file}, {record_word(result.file)} {line}: {why}")
                summary.skipped_lines += len(result.bad_lines)
                room = SHOWN_BAD_LINES - len(summary.first_skipped)
                summary.first_skipped += [
                    f"{result.file}:{line} ({why})" for line, why in result.bad_lines[:room]
                ]
            output.add(result)
            for key, encoded in result.keys.items():
                summary.key_counts[key]["sequences"] += encoded.sequence_lengths.size
                summary.key_counts[key]["tokens"] += encoded.tokens.size
            summary.documents += int(result.documents.size)
            summary.tokens += result.tokens
            summary.input_bytes += result.nbytes
            progress.update(result.documents.size, MB=result.nbytes / 1e6, tokens=result.tokens)

        with offered:
            for chunk in chunks:
                if (
                    config.trial_documents is not None
                    and summary.documents >= config.trial_documents
                ):
                    break
                where = f"{chunk.file} from {record_word(chunk.file)} {chunk.first_line}"
                window.append((pool.submit(encode_in_worker, chunk), where))
                watch.note_workers(pool)
                if len(window) >= 2 * config.workers + 2:
                    take(window[0][0].result())
                    window.popleft()
            while window:
                take(window[0][0].result())
                window.popleft()
        pool.shutdown()
        output.finalize()
    except BaseException as error:
        _stop_pool(pool, watch.before)
        output.abort()
        progress.close("")
        if isinstance(error, BrokenProcessPool) and window:
            raise watch.error(_in_flight(window)) from error
        if isinstance(error, OSError) and error.errno in WRITE_LIMITS and error.filename is None:
            # the OS says the disk is full, not which file was being written: name the outputs
            outputs_named = ", ".join(get_bin_path(prefix) for prefix in output.prefixes.values())
            raise OSError(error.errno, f"{error.strerror} (writing {outputs_named})") from error
        raise
    summary.elapsed = time.perf_counter() - start
    return summary


def write_manifests(
    config: PreprocessConfig,
    tokenizer: Tokenizer,
    summary: PreprocessSummary,
    inputs: list[InputFile],
    **extra: object,
) -> None:
    """The manifest beside each key's pair; ``extra`` adds fields (a Ray run's shards)."""
    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    for key, prefix in summary.outputs.items():
        counts = {
            "documents": summary.documents,
            **summary.key_counts[key],
            "skipped_lines": summary.skipped_lines,
        }
        write_manifest(
            prefix, {**_manifest(config, tokenizer, dtype, key, counts, inputs), **extra}
        )


def _in_flight(window: collections.deque[tuple[Future[EncodedChunk], str]]) -> str:
    """The input a broken pool's workers held, in words: the chunks it had not encoded (the
    worker that died held one of them, any of them)."""
    unfinished = [
        where
        for future, where in window
        if future.cancelled() or not future.done() or future.exception() is not None
    ] or [where for _, where in window]
    if len(unfinished) == 1:
        return unfinished[0]
    return f"one of {len(unfinished)} chunks ({unfinished[0]} to {unfinished[-1]})"


def preprocess(config: PreprocessConfig, stream: TextIO | None = None) -> PreprocessSummary:
    """Tokenize ``config.input`` into one pair per json key; returns what was done.

    Raises ``BadInputError`` naming the file and line of the first bad line unless
    ``skip_bad_lines``; on any error or interrupt nothing is left at the output names.
    """
    check_config(config)
    chosen = config.start_method is None
    if chosen:
        # chosen before the tokenizer loads: the threads its library starts (its self-check's)
        # are the run's own, which handle fork, not a caller's
        config = dataclasses.replace(config, start_method=worker_context().get_start_method())
    try:
        inputs = expand_input(config.input)
        tokenizer = load_checked_tokenizer(config)
        progress = new_progress(config, stream)
        summary = tokenize_into(config, inputs, tokenizer, progress)
        write_manifests(config, tokenizer, summary, inputs)
        progress.close(summary.describe())
        return summary
    finally:
        if chosen and config.start_method == "fork":
            adopt_run_threads()

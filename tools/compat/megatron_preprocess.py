"""Megatron-LM's tools/preprocess_data.py, step by step, built from megatron-core's own pieces.

megatron-core's wheel does not ship the tool, so this harness does what the tool documents with
what the wheel does ship: ``build_tokenizer`` (the tokenizer the tool builds from the same
flags), the rules of the tool's ``Encoder.encode``, and ``IndexedDatasetBuilder``. The compat
tests compare ``mega preprocess`` with it byte for byte; the preprocess benchmark times
``megatron_tool_pool``, the tool's own way of working (``multiprocessing.Pool.imap`` over
lines, one ``add_document`` per document), as the baseline.

One deliberate difference: the tool finalizes only the last json key of each partition (a bug
that leaves the other keys without an ``.idx``); this harness finalizes them all.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import types
from collections.abc import Iterable, Iterator
from typing import Any

from megatron.core.datasets import indexed_dataset
from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer


def tokenizer_args(tokenizer_type: str, options: Any) -> types.SimpleNamespace:
    """megatron-core 0.16.1's parsed tokenizer flags, from megafmt ``TokenizerOptions`` (give
    them ``compat="0.16.1"`` for that release's defaults)."""
    return types.SimpleNamespace(
        tokenizer_type=tokenizer_type,
        tokenizer_model=options.model,
        vocab_file=options.vocab_file,
        merge_file=options.merge_file,
        vocab_size=options.vocab_size,
        tokenizer_special_tokens=list(options.special_tokens or ()) or None,
        tokenizer_hf_use_fast=options.uses_fast,
        trust_remote_code=options.trust_remote_code,
        tokenizer_hf_include_special_tokens=options.adds_special_tokens,
        tokenizer_metadata=options.metadata_path,
        tokenizer_sentencepiece_legacy=options.sentencepiece_legacy,
        tiktoken_pattern=options.tiktoken_pattern,
        tiktoken_num_special_tokens=options.tiktoken_num_special_tokens,
    )


def encode(tokenizer: Any, line: str, json_keys: Iterable[str], append_eod: bool) -> dict:
    """The tool's Encoder.encode: per key, the ids and sentence lengths of one jsonl line."""
    data = json.loads(line)
    result = {}
    for key in json_keys:
        text = data[key]
        sentences = text if isinstance(text, list) else [text]
        ids, lengths = [], []
        for sentence in sentences:
            sentence_ids = tokenizer.tokenize(sentence)
            if len(sentence_ids) > 0:
                ids.extend(sentence_ids)
                lengths.append(len(sentence_ids))
        if len(ids) > 0 and append_eod:
            ids.append(tokenizer.eod)
            lengths[-1] += 1
        result[key] = (ids, lengths)
    return result


def output_prefix(prefix: str, key: str) -> str:
    return f"{prefix}_{key}_document"


def write(encoded: Iterator[dict], prefix: str, json_keys: Iterable[str], vocab_size: int) -> None:
    """One document per encoded line into each key's builder, then every key finalized."""
    dtype = indexed_dataset.DType.optimal_dtype(vocab_size)
    builders = {
        key: indexed_dataset.IndexedDatasetBuilder(output_prefix(prefix, key) + ".bin", dtype=dtype)
        for key in json_keys
    }
    for document in encoded:
        for key, (ids, lengths) in document.items():
            builders[key].add_document(ids, lengths)
    for key, builder in builders.items():
        builder.finalize(output_prefix(prefix, key) + ".idx")


def deal(lines: list[str], partitions: int, keep_sequential_samples: bool) -> list[list[str]]:
    """The tool's partition files: lines round-robin, or in blocks of ceil(lines / partitions)."""
    dealt: list[list[str]] = [[] for _ in range(partitions)]
    index, size = 0, math.ceil(len(lines) / partitions)
    for count, line in enumerate(lines, start=1):
        dealt[index].append(line)
        if keep_sequential_samples:
            index += count % size == 0
        else:
            index = (index + 1) % partitions
    return dealt


def megatron_tool(
    tokenizer: Any,
    lines: list[str],
    prefix: str,
    json_keys: Iterable[str],
    append_eod: bool,
    partitions: int = 1,
    keep_sequential_samples: bool = False,
) -> dict[str, str]:
    """What the tool writes for ``lines``, in this process; returns key -> output prefix."""
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    json_keys = list(json_keys)
    if partitions == 1:
        write(
            (encode(tokenizer, line, json_keys, append_eod) for line in lines),
            prefix,
            json_keys,
            tokenizer.vocab_size,
        )
    else:
        parts = deal(lines, partitions, keep_sequential_samples)
        for number, part in enumerate(parts):
            write(
                (encode(tokenizer, line, json_keys, append_eod) for line in part),
                f"{prefix}_{number}",
                json_keys,
                tokenizer.vocab_size,
            )
        dtype = indexed_dataset.DType.optimal_dtype(tokenizer.vocab_size)
        for key in json_keys:
            merged = indexed_dataset.IndexedDatasetBuilder(
                output_prefix(prefix, key) + ".bin", dtype=dtype
            )
            for number in range(partitions):
                merged.add_index(output_prefix(f"{prefix}_{number}", key))
            merged.finalize(output_prefix(prefix, key) + ".idx")
    return {key: output_prefix(prefix, key) for key in json_keys}


_WORKER: dict[str, Any] = {}


def _start(args: types.SimpleNamespace, json_keys: list[str], append_eod: bool) -> None:
    _WORKER.update(tokenizer=build_tokenizer(args), keys=json_keys, eod=append_eod)


def _encode_line(line: str) -> dict:
    return encode(_WORKER["tokenizer"], line, _WORKER["keys"], _WORKER["eod"])


def megatron_tool_pool(
    args: types.SimpleNamespace,
    input_path: str,
    prefix: str,
    json_keys: Iterable[str],
    append_eod: bool,
    workers: int,
) -> dict[str, str]:
    """The tool's single-partition run: ``Pool(workers).imap(encode, lines, 32)`` with the
    tokenizer built in each worker, one ``add_document`` per document in the parent."""
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    json_keys = list(json_keys)
    vocab_size = build_tokenizer(args).vocab_size
    context = multiprocessing.get_context("fork")
    with (
        open(input_path, encoding="utf-8") as lines,
        context.Pool(workers, initializer=_start, initargs=(args, json_keys, append_eod)) as pool,
    ):
        write(pool.imap(_encode_line, lines, 32), prefix, json_keys, vocab_size)
    return {key: output_prefix(prefix, key) for key in json_keys}

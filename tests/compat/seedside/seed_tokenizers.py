"""Runs inside the seed worker (testing/seedref.py): the seed commit's tokenizers built from
command-line flags by its own parser and ``build_tokenizer``, and its tools/preprocess_data.py
and tools/prepare_cache.py."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def _tokenizer_args(flags: list[str], sft_prompt_format: str | None = None) -> Any:
    """The flags parsed by the seed's ``_add_tokenizer_args``, with the dummy values
    tools/preprocess_data.py sets before building its tokenizer."""
    from megatron.training.arguments import _add_tokenizer_args

    args = _add_tokenizer_args(argparse.ArgumentParser()).parse_args(flags)
    args.rank = 1
    args.make_vocab_size_divisible_by = 128
    args.tensor_model_parallel_size = 1
    args.vocab_extra_ids = 0
    args.sft_tokenizer_prompt_format = sft_prompt_format
    return args


def _build(flags: list[str], sft_prompt_format: str | None = None) -> Any:
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    return build_tokenizer(_tokenizer_args(flags, sft_prompt_format))


def identity(flags: list[str], sft_prompt_format: str | None = None) -> dict:
    """What GPTDataset asks of the tokenizer these flags build: identifiers (as ordered pairs),
    EOD, vocabulary size and pad (None where the tokenizer has none)."""
    tokenizer = _build(flags, sft_prompt_format)
    return {
        "identifiers": list(tokenizer.unique_identifiers.items()),
        "eod": _or_none(lambda: tokenizer.eod),
        "vocab_size": tokenizer.vocab_size,
        "pad": _or_none(lambda: tokenizer.pad),
    }


def _or_none(read: Any) -> Any:
    """``read()``, or None where the tokenizer raises (it has no such token: GPTDataset falls
    back to its default pad the same way; the legacy sentencepiece wrapper has no EOD)."""
    try:
        return read()
    except Exception:
        return None


def tokenize(flags: list[str], texts: list[str]) -> list[list[int]]:
    """The ids the tokenizer these flags build gives each text."""
    tokenizer = _build(flags)
    return [list(tokenizer.tokenize(text)) for text in texts]


def preprocess_data(argv: list[str]) -> None:
    """tools/preprocess_data.py run with these command-line arguments."""
    from tools.preprocess_data import main

    sys.argv = ["preprocess_data.py", *argv]
    main()


def prepare_cache(argv: list[str]) -> dict:
    """tools/prepare_cache.py run with these command-line arguments; its summary. The tool runs
    ``make`` for its C++ helpers, whose output would land in the worker's answer pipe (file
    descriptor 1): descriptor 1 points at stderr meanwhile."""
    from tools.prepare_cache import main

    sys.argv = ["prepare_cache.py", *argv]
    answers = os.dup(1)
    os.dup2(2, 1)
    try:
        return main()
    finally:
        os.dup2(answers, 1)
        os.close(answers)
